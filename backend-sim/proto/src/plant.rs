//! Bugs planted on purpose, for the mutation check of the deterministic fabric
//! ([`fabric`](crate::fabric)): with the `planted-bugs` feature a test turns one on for
//! its thread and the seeded runs must find it. Without the feature [`active`] is a
//! constant `false` and the checks compile away.

/// A planted bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plant {
    /// The responder executes a request whose PSN it already executed, instead of
    /// answering it as a duplicate (IBA 9.9.3).
    NoDuplicateCheck = 1,
    /// The responder executes a repeated atomic again instead of answering it from its
    /// replay state (IBA 9.9.3.1.4): the atomic is done twice.
    NoAtomicReplay = 2,
    /// An ACK completes the WQE after the one its PSN names as well.
    AckOffByOne = 4,
    /// A SEND or WRITE resent from a packet inside the message carries the message's
    /// bytes from its start instead of from that packet's.
    ResendFromMessageStart = 8,
    /// The requester takes `rnr_retry` as the number of attempts instead of retries after
    /// the first (IBA 9.7.5.2.8): a SEND to an empty receive queue fails with
    /// RNR_RETRY_EXC_ERR one RNR NAK early (a finite `rnr_retry` of 1 to 6).
    RnrOffByOne = 16,
}

impl Plant {
    /// Every planted bug.
    #[cfg(any(feature = "planted-bugs", feature = "internals"))]
    pub const ALL: [Plant; 5] = [
        Plant::NoDuplicateCheck,
        Plant::NoAtomicReplay,
        Plant::AckOffByOne,
        Plant::ResendFromMessageStart,
        Plant::RnrOffByOne,
    ];

    /// The plant of this name (its variant's name, e.g. `NoAtomicReplay`), for a runner's
    /// command line.
    #[cfg(feature = "planted-bugs")]
    pub fn from_name(name: &str) -> Option<Plant> {
        Plant::ALL.into_iter().find(|p| format!("{p:?}") == name)
    }
}

#[cfg(feature = "planted-bugs")]
thread_local! {
    static ACTIVE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether `p` is planted on this thread.
#[inline(always)]
pub fn active(p: Plant) -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        ACTIVE.with(|a| a.get() & p as u32 != 0)
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        let _ = p;
        false
    }
}

/// Plants `p` on this thread (none: `None`) until it is changed: what a runner that
/// drives a deterministic world in its own thread (conformance's `--plant`) calls once.
#[cfg(feature = "planted-bugs")]
pub fn set(p: Option<Plant>) {
    ACTIVE.with(|a| a.set(p.map_or(0, |p| p as u32)));
}

/// Runs `f` with `p` planted on this thread.
#[cfg(all(feature = "planted-bugs", any(test, feature = "internals")))]
pub fn with<R>(p: Plant, f: impl FnOnce() -> R) -> R {
    ACTIVE.with(|a| a.set(p as u32));
    let r = f();
    ACTIVE.with(|a| a.set(0));
    r
}
