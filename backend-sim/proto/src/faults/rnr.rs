//! Forced RNR: fault injection makes a responder answer the next requests that consume a
//! receive (SEND, RDMA WRITE with immediate) as if none were posted. On RC each gets an
//! RNR NAK, which the requester retries per `rnr_retry` (IBA 9.7.5.2.8); on UC, which has
//! no NAK, each is dropped, as a UC responder drops a message it has no receive for.

/// How many more receive-consuming requests a responder answers with RNR whatever its
/// receive queue holds. The driver arms it per QP; the responder fires it, one request at
/// a time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForcedRnr(u32);

impl ForcedRnr {
    /// None forced.
    pub const NONE: ForcedRnr = ForcedRnr(0);

    /// The next `n` requests that consume a receive are refused.
    pub const fn next(n: u32) -> ForcedRnr {
        ForcedRnr(n)
    }

    /// How many are still to be refused.
    pub const fn remaining(self) -> u32 {
        self.0
    }

    /// Whether this request is refused: true (and one fewer remains) while any remain.
    pub fn fire(&mut self) -> bool {
        if self.0 > 0 {
            self.0 -= 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_as_many_times_as_armed() {
        let mut f = ForcedRnr::next(2);
        assert_eq!([f.fire(), f.fire(), f.fire()], [true, true, false]);
        assert_eq!(f, ForcedRnr::NONE);
        assert!(!ForcedRnr::default().fire());
    }
}
