//! 24-bit packet sequence number arithmetic (IBA 9.7.1: PSNs wrap modulo 2^24; a PSN is
//! "ahead" when it lies in the half window after another).

use verbs_api::PSN_MASK;

/// `a + n` modulo 2^24.
pub fn add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// Signed distance `a - b` in the 24-bit ring, in `-2^23..2^23`.
pub fn diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

/// The packets of a message of `len` bytes at path MTU `mtu`: the PSNs it takes (IBA
/// 9.7.1: every packet takes one, a message of no payload one).
pub fn packets(len: u64, mtu: u32) -> u32 {
    // At most half the PSN space, the most a requester may have outstanding.
    len.div_ceil(mtu.max(1) as u64).clamp(1, 1 << 23) as u32
}

/// The path MTU of a QP that was never given one: a message is one packet.
pub const NO_MTU: u32 = u32::MAX;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps() {
        assert_eq!(add(PSN_MASK, 1), 0);
        assert_eq!(diff(0, PSN_MASK), 1);
        assert_eq!(diff(PSN_MASK, 0), -1);
        assert_eq!(diff(5, 5), 0);
    }

    #[test]
    fn packets_of_a_message() {
        assert_eq!(packets(0, 1024), 1);
        assert_eq!(packets(1, 1024), 1);
        assert_eq!(packets(1024, 1024), 1);
        assert_eq!(packets(1025, 1024), 2);
        assert_eq!(packets(1 << 31, 256), 1 << 23);
        assert_eq!(packets(1 << 31, NO_MTU), 1);
    }

    proptest! {
        #[test]
        fn diff_inverts_add(a in 0u32..=PSN_MASK, n in 0u32..(1 << 23)) {
            prop_assert_eq!(diff(add(a, n), a), n as i32);
            prop_assert_eq!(diff(a, add(a, n)), -(n as i32));
        }
    }
}
