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
}

impl Plant {
    /// Every planted bug.
    #[cfg(any(all(test, feature = "planted-bugs"), feature = "internals"))]
    pub const ALL: [Plant; 4] = [
        Plant::NoDuplicateCheck,
        Plant::NoAtomicReplay,
        Plant::AckOffByOne,
        Plant::ResendFromMessageStart,
    ];
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

/// Runs `f` with `p` planted on this thread.
#[cfg(all(feature = "planted-bugs", any(test, feature = "internals")))]
pub fn with<R>(p: Plant, f: impl FnOnce() -> R) -> R {
    ACTIVE.with(|a| a.set(p as u32));
    let r = f();
    ACTIVE.with(|a| a.set(0));
    r
}
