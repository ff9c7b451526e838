//! What the network does to each frame, decided by a hash of the seed and the frame's
//! identity (link, opcode, PSN, attempt), so that a decision does not depend on how
//! many were made before it.

use std::time::Duration;

/// The faults of a run: rates in parts per million, delays as ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultMix {
    /// Frames lost.
    pub loss_ppm: u32,
    /// Frames delivered twice (the copy later by up to `dup_gap`).
    pub dup_ppm: u32,
    /// The shortest one-way delay.
    pub latency: Duration,
    /// Extra delay up to this, drawn per frame: frames overtake each other when it
    /// exceeds the gap between them.
    pub jitter: Duration,
    /// The longest gap between a frame and its duplicate.
    pub dup_gap: Duration,
    /// Frames at which the connection breaks (parts per million): that frame, those in
    /// flight and those queued are lost, both ends start new byte streams, and the
    /// requester resends what was not acknowledged (as after a reconnection).
    pub reset_ppm: u32,
    /// Frames of a message of more than one packet that the network cuts into its
    /// packets (parts per million), each then lost, duplicated and delayed on its own.
    pub split_ppm: u32,
}

impl FaultMix {
    /// A perfect network: every frame once, in order, after `latency`.
    pub const fn clean(latency: Duration) -> FaultMix {
        FaultMix {
            loss_ppm: 0,
            dup_ppm: 0,
            latency,
            jitter: Duration::ZERO,
            dup_gap: Duration::ZERO,
            reset_ppm: 0,
            split_ppm: 0,
        }
    }

    /// Loss, duplication and reordering at the given rates (percent), on a 2 us link
    /// whose frames vary by up to 20 us; half of the frames of more than one packet are
    /// cut into their packets.
    pub const fn lossy(loss_pct: u32, dup_pct: u32) -> FaultMix {
        FaultMix {
            loss_ppm: loss_pct * 10_000,
            dup_ppm: dup_pct * 10_000,
            latency: Duration::from_micros(2),
            jitter: Duration::from_micros(20),
            dup_gap: Duration::from_micros(50),
            reset_ppm: 0,
            split_ppm: 500_000,
        }
    }
}

/// What happens to one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Never delivered.
    pub lost: bool,
    /// Delivered after this.
    pub delay: Duration,
    /// Delivered a second time, this long after the first.
    pub duplicate_after: Option<Duration>,
    /// The connection breaks as this frame is sent.
    pub reset: bool,
    /// The frame is cut into its packets ([`split`](crate::fabric)), if it has several.
    pub split: bool,
}

/// The seed's decisions.
#[derive(Clone, Copy, Debug)]
pub struct Decider {
    seed: u64,
}

/// What a draw decides (each draws apart from the others).
#[derive(Clone, Copy)]
enum Purpose {
    Loss = 1,
    Delay,
    Dup,
    DupGap,
    Key,
    Reset,
    Split,
}

impl Decider {
    /// The decisions of `seed`.
    pub fn new(seed: u64) -> Decider {
        Decider { seed: mix(seed) }
    }

    fn draw(&self, purpose: Purpose, parts: [u64; 3]) -> u64 {
        let mut h = mix(self.seed ^ purpose as u64);
        for p in parts {
            h = mix(h ^ p);
        }
        h
    }

    /// What happens to the `attempt`-th sending of the frame `opcode`/`psn` on `link`
    /// (one direction of one connection, see [`net`](crate::fabric::net)).
    pub fn frame(&self, m: &FaultMix, link: u64, opcode: u8, psn: u32, attempt: u32) -> Decision {
        let id = [
            link,
            (u64::from(opcode) << 32) | u64::from(psn),
            u64::from(attempt),
        ];
        let ppm = |purpose| (self.draw(purpose, id) % 1_000_000) as u32;
        let within = |purpose, max: Duration| {
            let n = max.as_nanos() as u64;
            if n == 0 {
                Duration::ZERO
            } else {
                Duration::from_nanos(self.draw(purpose, id) % (n + 1))
            }
        };
        Decision {
            lost: ppm(Purpose::Loss) < m.loss_ppm,
            delay: m.latency + within(Purpose::Delay, m.jitter),
            duplicate_after: (ppm(Purpose::Dup) < m.dup_ppm).then(|| within(Purpose::DupGap, m.dup_gap)),
            reset: ppm(Purpose::Reset) < m.reset_ppm,
            split: ppm(Purpose::Split) < m.split_ppm,
        }
    }

    /// The `n`-th key drawn for a region of end B (`of_b`) or A.
    pub fn key(&self, of_b: bool, n: u32) -> u32 {
        self.choice(u64::from(of_b), u64::from(n))
    }

    /// The `n`-th choice of kind `what` (a key of device 1, a QPN, ...): 32 bits of the
    /// seed's, apart from every other kind's and from the frames' decisions.
    pub fn choice(&self, what: u64, n: u64) -> u32 {
        (self.draw(Purpose::Key, [what, n, 0]) >> 32) as u32
    }
}

/// SplitMix64's finalizer: every input bit moves every output bit. The one copy: the
/// fabric's fault decisions and the sim's seeded choices (QPNs, keys) both hash with it.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a's starting value.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// A hash of `bytes`, continuing from `h`: eight bytes at a time through [`mix`], the
/// rest byte by byte as FNV-1a (a trace hashes every payload, so speed matters more
/// than FNV's byte-wise purity).
pub fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        h = mix(h ^ u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    for &b in chunks.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_depend_on_the_frame_not_on_the_order_asked() {
        let d = Decider::new(5);
        let m = FaultMix::lossy(30, 30);
        let first = d.frame(&m, 0, 4, 17, 0);
        for psn in 0..100 {
            d.frame(&m, 1, 17, psn, 1);
        }
        assert_eq!(d.frame(&m, 0, 4, 17, 0), first);
        assert_ne!(
            (0..64).map(|a| d.frame(&m, 0, 4, 17, a)).collect::<Vec<_>>(),
            (0..64)
                .map(|a| Decider::new(6).frame(&m, 0, 4, 17, a))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn rates_come_out_near_what_was_asked() {
        let d = Decider::new(1);
        let m = FaultMix::lossy(10, 5);
        let n = 100_000u32;
        let lost = (0..n).filter(|&p| d.frame(&m, 0, 4, p, 0).lost).count();
        let dup = (0..n)
            .filter(|&p| d.frame(&m, 0, 4, p, 0).duplicate_after.is_some())
            .count();
        assert!((9_000..11_000).contains(&lost), "{lost} lost of {n}");
        assert!((4_300..5_700).contains(&dup), "{dup} duplicated of {n}");
        assert!((0..n).all(
            |p| d.frame(&FaultMix::clean(Duration::from_micros(1)), 0, 4, p, 0)
                == Decision {
                    lost: false,
                    delay: Duration::from_micros(1),
                    duplicate_after: None,
                    reset: false,
                    split: false,
                }
        ));
    }
}
