//! The plan: what QP `j` of a device does at each sequence number, a pure function of
//! `(seed, device, qp, seq)` ([`plan`]), so that both ends know it without talking; the
//! payloads derived from it ([`fill_payload`], [`payload_mismatch`]), what a device's
//! plan adds up to ([`tally`]) and the atomic words' initial values and chain.

use super::config::{Mix, SoakConfig};

/// splitmix64's finalizer: a bijective 64-bit mix.
pub(super) fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of what QP `j` of device `side` does at `seq` (also its payload's seed).
pub(super) fn key(seed: u64, side: usize, j: usize, seq: u64) -> u64 {
    mix64(mix64(seed ^ ((side as u64) << 62) ^ ((j as u64) << 40)) ^ seq)
}

/// Key of the initial pattern of slot `k` of QP `j` of `side` (on the peer's target).
pub(super) fn init_key(seed: u64, side: usize, j: usize, k: usize) -> u64 {
    key(seed ^ 0x1a17, side, j, k as u64)
}

/// Word `i` of the payload with `key`.
fn word(key: u64, i: usize) -> [u8; 8] {
    mix64(key ^ (i as u64).wrapping_mul(0xd6e8_feb8_6659_fd93)).to_le_bytes()
}

pub(super) fn fill_payload(buf: &mut [u8], key: u64) {
    for (i, c) in buf.chunks_mut(8).enumerate() {
        let w = word(key, i);
        c.copy_from_slice(&w[..c.len()]);
    }
}

/// The first byte of `got` that differs from the payload with `key`.
pub(super) fn payload_mismatch(got: &[u8], key: u64) -> Option<usize> {
    for (i, c) in got.chunks(8).enumerate() {
        let w = word(key, i);
        if c != &w[..c.len()] {
            let b = c.iter().zip(w.iter()).position(|(a, b)| a != b).unwrap_or(0);
            return Some(i * 8 + b);
        }
    }
    None
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Send,
    Write,
    Read,
    FetchAdd,
    CasChain,
    CasShared,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Plan {
    /// The operation.
    pub(super) kind: Kind,
    /// Payload length (SEND, WRITE, READ).
    pub(super) len: u32,
    /// The remote slot (WRITE, READ).
    pub(super) slot: usize,
    /// The shared counter (FETCH_AND_ADD).
    pub(super) counter: usize,
}

pub(super) fn plan(cfg: &SoakConfig, mix: &Mix, side: usize, j: usize, seq: u64) -> Plan {
    let h = key(cfg.seed, side, j, seq);
    let h2 = mix64(h);
    let mut r = h % mix.total();
    let mut kind = Kind::Send;
    for (w, k) in [
        (mix.send, Kind::Send),
        (mix.write, Kind::Write),
        (mix.read, Kind::Read),
        (mix.fetch_add, Kind::FetchAdd),
        (mix.cmp_swap, Kind::CasChain),
    ] {
        if r < w as u64 {
            kind = k;
            break;
        }
        r -= w as u64;
    }
    if kind == Kind::CasChain && h2 & (1 << 63) != 0 {
        kind = Kind::CasShared;
    }
    Plan {
        kind,
        len: cfg.sizes[(h2 % cfg.sizes.len() as u64) as usize],
        slot: ((h2 >> 20) % cfg.slots as u64) as usize,
        counter: ((h2 >> 40) % cfg.counters as u64) as usize,
    }
}

/// What the plan of one device adds up to (computed before the run, so every buffer the
/// checks need is allocated up front).
#[derive(Default)]
pub(super) struct Tally {
    /// SENDs per QP (the receives its peer must see).
    pub(super) sends: Vec<u64>,
    /// FETCH_AND_ADDs per counter.
    pub(super) adds: Vec<u64>,
    /// CMP_AND_SWPs on the shared word.
    pub(super) shared: u64,
}

pub(super) fn tally(cfg: &SoakConfig, mix: &Mix, side: usize, n: usize) -> Tally {
    let mut t = Tally {
        sends: vec![0; n],
        adds: vec![0; cfg.counters],
        shared: 0,
    };
    for j in 0..n {
        for seq in 0..cfg.ops_per_qp {
            let p = plan(cfg, mix, side, j, seq);
            match p.kind {
                Kind::Send => t.sends[j] += 1,
                Kind::FetchAdd => t.adds[p.counter] += 1,
                Kind::CasShared => t.shared += 1,
                _ => {}
            }
        }
    }
    t
}

pub(super) fn chain_init(seed: u64, side: usize, j: usize) -> u64 {
    key(seed ^ 0xc4a1, side, j, 0)
}
pub(super) fn chain_next(v: u64) -> u64 {
    mix64(v ^ 0xc4a1_c4a1)
}
pub(super) fn counter_init(c: usize) -> u64 {
    ((c as u64 + 1) << 40) + 17
}
pub(super) const SHARED_INIT: u64 = 5000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_prefixes_and_mismatches_are_found() {
        let mut a = vec![0u8; 100];
        let mut b = vec![0u8; 37];
        fill_payload(&mut a, 42);
        fill_payload(&mut b, 42);
        assert_eq!(&a[..37], &b[..]);
        assert_eq!(payload_mismatch(&a, 42), None);
        a[50] ^= 1;
        assert_eq!(payload_mismatch(&a, 42), Some(50));
        assert!(payload_mismatch(&b, 43).is_some());
    }

    #[test]
    fn plan_follows_the_mix() {
        let cfg = SoakConfig::default();
        let only_reads = Mix {
            send: 0,
            write: 0,
            read: 1,
            fetch_add: 0,
            cmp_swap: 0,
        };
        assert!((0..1000).all(|s| plan(&cfg, &only_reads, 0, 3, s).kind == Kind::Read));
        let t = tally(&cfg, &cfg.mix, 0, 4);
        let sends: u64 = t.sends.iter().sum();
        let total = 4 * cfg.ops_per_qp;
        // 3 of 10 are SENDs; allow a wide margin.
        assert!(sends > total / 5 && sends < total * 2 / 5, "{sends} of {total}");
    }
}
