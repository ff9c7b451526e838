//! The InfiniBand timer encodings used by QP attributes.
//!
//! - `min_rnr_timer` (IBA 1.x, section 9.7.5.2.8, table "Encoding for RNR NAK Timer
//!   Field"): a 5-bit code for how long a requester waits after an RNR NAK, from
//!   0.01 ms (code 1) to 491.52 ms (code 31); code 0 means 655.36 ms.
//! - `timeout` (section 9.7.6.1.3, `man ibv_modify_qp`): the local ACK timeout,
//!   4.096 µs × 2^timeout; 0 means wait forever.

use std::time::Duration;

/// Microseconds of each RNR NAK timer code 0..=31 (hundredths of a millisecond × 10).
const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840, 5_120,
    7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680,
    491_520,
];

/// The delay that RNR NAK timer code `code` stands for (codes above 31 use their low 5 bits).
pub fn rnr_timer(code: u8) -> Duration {
    Duration::from_micros(RNR_TIMER_US[(code & 31) as usize] as u64)
}

/// The local ACK timeout for `code`: 4.096 µs × 2^code, or `None` (infinite) for 0.
/// Codes above 31 are treated as 31.
pub fn local_ack_timeout(code: u8) -> Option<Duration> {
    if code == 0 {
        return None;
    }
    let nanos = 4096u64 << code.min(31);
    Some(Duration::from_nanos(nanos))
}

/// `rnr_retry` 7 means "retry forever".
pub const RNR_RETRY_INFINITE: u8 = 7;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rnr_table_endpoints() {
        assert_eq!(rnr_timer(1), Duration::from_micros(10));
        assert_eq!(rnr_timer(12), Duration::from_micros(640));
        assert_eq!(rnr_timer(31), Duration::from_micros(491_520));
        assert_eq!(rnr_timer(0), Duration::from_micros(655_360));
        // strictly increasing from code 1 to 31
        for c in 1..31u8 {
            assert!(rnr_timer(c) < rnr_timer(c + 1));
        }
    }

    #[test]
    fn ack_timeout() {
        assert_eq!(local_ack_timeout(0), None);
        assert_eq!(local_ack_timeout(1), Some(Duration::from_nanos(8192)));
        // 14 -> ~67 ms, the value most programs use
        let t = local_ack_timeout(14).unwrap();
        assert!(t > Duration::from_millis(67) && t < Duration::from_millis(68));
    }
}
