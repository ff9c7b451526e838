//! Where a device's arbitrary choices come from: QP numbers, MR and memory-window keys,
//! the LID (IB profiles) or loopback IP (RoCE profiles) it takes.
//!
//! An HCA picks these as it likes, and programs must not depend on them; the sim draws
//! them from the operating system's generator unless a seed is given
//! ([`SimConfig::seed`](crate::SimConfig::seed), `RDMA_SIM_SEED`, the launcher's
//! `--seed`). With a seed every choice is a hash of the seed, the device's name, what is
//! being chosen and how many of that kind the device chose before: the same program run
//! twice with the same seed sees the same QP numbers, keys and addresses (so its logs and
//! captures compare line for line), and a choice of one kind does not move those of
//! another (a test that registers one more MR keeps its QP numbers).
//!
//! A backend's connection manager draws rdma_cm's own choices (communication IDs,
//! ephemeral ports, starting PSNs) the same way, in the scope `rdma_cm`.
//!
//! What a seed does not fix: which of two racing threads goes first, and the timing of
//! the traffic (the seeded in-memory fabric of the deterministic runs is a separate
//! piece). Nor does it touch what guards a connection: the setup tokens that let only
//! the configured peer in stay drawn from the operating system (`verify`), since a
//! predictable token would let any local process take over a QP.
//!
//! A seeded key is predictable by whoever knows the seed: rkeys guessed from it pass the
//! rkey check as on a real HCA whose keys were guessed. Seeds are for tests.
//!
//! The operating system's generator is `rand`'s thread generator, whose state a forked
//! child inherits: without a new seed, two children forked from one process would draw
//! the same QP numbers, keys, loopback IPs, rdma_cm communication IDs and setup tokens,
//! each the other's. [`reseed_in_forked_children`] gives every child a new seed.

use std::hash::Hasher;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use backend_sim_proto::faults::network::mix;

/// The setting that seeds the choices of every device of the process.
pub const SETTING: &str = "RDMA_SIM_SEED";

/// What is being chosen: each kind counts its draws on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// A QP number.
    Qpn,
    /// An MR's lkey/rkey.
    MrKey,
    /// A memory window's rkey.
    MwKey,
    /// The device's address: its LID (listening port) or loopback IP.
    Address,
    /// An rdma_cm connection's local communication ID.
    CommId,
    /// An rdma_cm id's ephemeral port (bound to port 0).
    CmPort,
    /// An rdma_cm id's starting PSN (`seq_num`).
    CmPsn,
}

const KINDS: usize = 7;

impl Choice {
    fn index(self) -> usize {
        self as usize
    }
}

/// The choices of one scope (a device, or a backend's connection manager).
#[derive(Debug)]
pub struct Choices {
    /// The seed mixed with the scope's name; `None`: the operating system's generator.
    key: Option<u64>,
    drawn: [AtomicU64; KINDS],
}

/// Choices from the operating system's generator.
impl Default for Choices {
    fn default() -> Self {
        Choices::new(None, "")
    }
}

impl Choices {
    /// The choices of the scope `scope` (a device's name) under `seed`.
    pub fn new(seed: Option<u64>, scope: &str) -> Self {
        Choices {
            key: seed.map(|s| {
                let mut h = Fnv(mix(s));
                h.write(scope.as_bytes());
                h.finish()
            }),
            drawn: Default::default(),
        }
    }

    /// Whether the choices come from a seed.
    pub fn seeded(&self) -> bool {
        self.key.is_some()
    }

    /// The next 32-bit choice of kind `what`.
    pub fn u32(&self, what: Choice) -> u32 {
        match self.key {
            None => rand::random(),
            Some(k) => {
                let n = self.drawn[what.index()].fetch_add(1, Ordering::Relaxed);
                (mix(k ^ mix(((what.index() as u64) << 56) ^ n)) >> 32) as u32
            }
        }
    }

    /// The next choice of kind `what` in `range` (which must not be empty).
    pub fn in_range<T: Into<u64> + TryFrom<u64>>(&self, what: Choice, range: Range<T>) -> T {
        let (lo, hi) = (range.start.into(), range.end.into());
        debug_assert!(lo < hi, "empty range");
        let span = hi - lo;
        let v = match self.key {
            None => lo + rand::random_range(0..span),
            // (The bias of a modulus over 2^32 draws is below 2^-8 for any span here.)
            Some(_) => lo + u64::from(self.u32(what)) % span,
        };
        T::try_from(v).unwrap_or_else(|_| unreachable!("a value in the range converts back"))
    }

    /// A generator of choices of kind `what`, for the tables that draw until a free one
    /// comes up.
    pub fn draw(&self, what: Choice) -> impl FnMut() -> u32 + '_ {
        move || self.u32(what)
    }
}

/// Makes every child forked from this process (after this call) reseed the generator
/// of the thread that forked, the one thread a child has, from the operating system.
/// Registered once per process.
pub fn reseed_in_forked_children() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `reseed` is an `extern "C" fn()` that lives for the process.
        let r = unsafe { libc::pthread_atfork(None, None, Some(reseed)) };
        if r != 0 {
            tracing::warn!(
                errno = r,
                "pthread_atfork failed: children forked from this process repeat its random choices"
            );
        }
    });
}

/// `pthread_atfork`'s child handler: a new seed for the forking thread's generator. The
/// thread is in `fork`, not in the generator, so nothing else uses it meanwhile.
extern "C" fn reseed() {
    // A generator that cannot reach the operating system's keeps its state: the child's
    // draws then repeat its parent's, which the tables' "draw until free" tolerates.
    let _ = rand::rng().reseed();
}

/// The seed [`SETTING`] gives, if any.
pub fn seed_from_env() -> verbs_api::Result<Option<u64>> {
    match std::env::var(SETTING) {
        Ok(v) if !v.trim().is_empty() => parse_seed(v.trim()).map(Some).ok_or_else(|| {
            verbs_api::Error::invalid(SETTING, format!("{v:?} is not a number (decimal or 0x hex)"))
        }),
        _ => Ok(None),
    }
}

/// A seed as a user writes it: decimal or `0x` hexadecimal.
pub fn parse_seed(v: &str) -> Option<u64> {
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

/// FNV-1a over the scope's name, started from the mixed seed (stable across builds and
/// platforms, unlike the standard library's hasher).
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        mix(self.0)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn firsts(c: &Choices, what: Choice, n: usize) -> Vec<u32> {
        (0..n).map(|_| c.u32(what)).collect()
    }

    #[test]
    fn a_seed_repeats_its_choices_per_scope_and_kind() {
        let a = Choices::new(Some(7), "sim0");
        let b = Choices::new(Some(7), "sim0");
        assert_eq!(firsts(&a, Choice::Qpn, 8), firsts(&b, Choice::Qpn, 8));
        // Draws of another kind in between do not move a kind's sequence.
        let c = Choices::new(Some(7), "sim0");
        let mut seq = Vec::new();
        for _ in 0..8 {
            c.u32(Choice::MrKey);
            seq.push(c.u32(Choice::Qpn));
        }
        assert_eq!(seq, firsts(&Choices::new(Some(7), "sim0"), Choice::Qpn, 8));
    }

    #[test]
    fn seeds_scopes_and_kinds_choose_differently() {
        let base = firsts(&Choices::new(Some(7), "sim0"), Choice::Qpn, 4);
        assert_ne!(base, firsts(&Choices::new(Some(8), "sim0"), Choice::Qpn, 4));
        assert_ne!(base, firsts(&Choices::new(Some(7), "sim1"), Choice::Qpn, 4));
        assert_ne!(base, firsts(&Choices::new(Some(7), "sim0"), Choice::MrKey, 4));
        // Without a seed, two scopes of the same name choose independently.
        let (x, y) = (Choices::new(None, "sim0"), Choices::new(None, "sim0"));
        assert_ne!(firsts(&x, Choice::Qpn, 4), firsts(&y, Choice::Qpn, 4));
    }

    #[test]
    fn ranges_hold() {
        let c = Choices::new(Some(1), "sim0");
        for _ in 0..10_000 {
            let v: u32 = c.in_range(Choice::Qpn, 2..0xff_ffff);
            assert!((2..0xff_ffff).contains(&v));
            let p: u16 = c.in_range(Choice::Address, 1024..1030);
            assert!((1024..1030).contains(&p));
        }
    }

    #[test]
    fn seeds_parse_as_users_write_them() {
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed("0x2a"), Some(42));
        assert_eq!(parse_seed("forty-two"), None);
    }
}
