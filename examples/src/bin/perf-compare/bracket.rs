//! Pairing a sim figure with its baseline: each sim run is measured between two runs of
//! the baseline ([`bracketed`]), and taken again while those two disagree (the host
//! changed speed meanwhile, [`STEADY`]). A TCP stream baseline has two halves, blocking
//! and busy-polling ([`Stream`]).

use examples::Res;

/// Two baseline runs around a sim run that differ by more than this factor (the larger
/// over the smaller) mean the host changed speed meanwhile (this VM has slow phases in
/// which everything, TCP too, runs at a third of its speed, for seconds to minutes): the
/// sim run fell into one phase or the other, or both, and its ratio to their mean says
/// nothing about the sim. Such a measurement is taken again ([`bracketed`]).
pub const STEADY: f64 = 1.25;
/// How often a bracketed measurement is taken at most; the last is kept either way.
pub const BRACKET_TRIES: u32 = 3;

/// One run of a baseline: its figure, and whether the host kept its speed between it
/// and another run.
pub trait Baseline: Copy {
    /// The figure the sim is held against.
    fn figure(&self) -> f64;
    /// Whether `self` and `other` agree within [`STEADY`].
    fn steady_with(&self, other: &Self) -> bool;
}

/// Whether two figures agree within [`STEADY`] (the larger over the smaller).
pub fn agree(a: f64, b: f64) -> bool {
    a.max(b) <= STEADY * a.min(b)
}

impl Baseline for f64 {
    fn figure(&self) -> f64 {
        *self
    }
    fn steady_with(&self, other: &Self) -> bool {
        agree(*self, *other)
    }
}

/// A TCP stream baseline: a blocking and a busy-polling half, 1.5 s each; its figure is
/// the better one. Two of them agree when each half agrees with the same half of the
/// other (the two modes differ by 13-23% on this VM, so they are not compared with each
/// other). Comparing the better halves alone would hide a slow phase that covered only
/// one half of a stream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stream {
    /// MB/s with blocking sockets.
    pub blocking: f64,
    /// MB/s with busy-polled non-blocking sockets.
    pub busy: f64,
}

impl Baseline for Stream {
    fn figure(&self) -> f64 {
        self.blocking.max(self.busy)
    }
    fn steady_with(&self, other: &Self) -> bool {
        agree(self.blocking, other.blocking) && agree(self.busy, other.busy)
    }
}

/// A sim figure and the mean of the baselines measured right before and after it.
pub struct Bracketed<B> {
    /// The sim's figure.
    pub sim: f64,
    /// The mean of the baselines before and after it.
    pub base: f64,
    /// The baseline measured last (the next measurement's "before").
    pub last: B,
    /// How many times it was measured.
    pub tries: u32,
}

/// Measures `sim` between `before` (a baseline just measured) and a new run of `base`,
/// and again, each time between the last baseline and a new one, while the two disagree
/// by more than [`STEADY`] (at most [`BRACKET_TRIES`] times). Whether to measure again
/// depends on the baselines alone, never on the sim's figure.
pub fn bracketed<B: Baseline>(
    mut before: B,
    mut sim: impl FnMut() -> Res<f64>,
    mut base: impl FnMut() -> Res<B>,
) -> Res<Bracketed<B>> {
    let mut tries = 1;
    loop {
        let s = sim()?;
        let after = base()?;
        if before.steady_with(&after) || tries == BRACKET_TRIES {
            return Ok(Bracketed {
                sim: s,
                base: (before.figure() + after.figure()) / 2.0,
                last: after,
                tries,
            });
        }
        before = after;
        tries += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figures handed out in order, as the runs of a measurement would give them.
    fn runs(v: &[f64]) -> impl FnMut() -> Res<f64> + '_ {
        let mut it = v.iter();
        move || Ok(*it.next().expect("one run too many"))
    }

    #[test]
    fn a_bracketed_measurement_is_taken_again_only_while_its_baselines_disagree() {
        // Steady (7000 and 6000 are within 25%): one try, the mean of the two.
        let b = bracketed(7000.0, runs(&[6500.0]), runs(&[6000.0])).unwrap();
        assert_eq!((b.sim, b.base, b.last, b.tries), (6500.0, 6500.0, 6000.0, 1));
        // The host slows down during the first try (7000, then 2000): again, between 2000
        // and the next baseline; the sim's figures play no part in the decision.
        let b = bracketed(7000.0, runs(&[7000.0, 1900.0]), runs(&[2000.0, 2100.0])).unwrap();
        assert_eq!((b.sim, b.base, b.last, b.tries), (1900.0, 2050.0, 2100.0, 2));
        let b = bracketed(7000.0, runs(&[100.0, 1900.0]), runs(&[2000.0, 2100.0])).unwrap();
        assert_eq!((b.sim, b.tries), (1900.0, 2));
        // Never steady: the third try is kept.
        let b = bracketed(7000.0, runs(&[1.0, 2.0, 3.0]), runs(&[2000.0, 7000.0, 2000.0])).unwrap();
        assert_eq!((b.sim, b.base, b.tries), (3.0, 4500.0, 3));
    }

    #[test]
    fn a_stream_that_slowed_down_in_one_half_is_not_steady() {
        let s = |blocking, busy| Stream { blocking, busy };
        // Each half like its counterpart: steady, though the modes differ by 20%.
        assert!(s(7200.0, 6000.0).steady_with(&s(7000.0, 6100.0)));
        // A slow phase began during the sim run and ended during the next stream's first
        // (blocking) half. That stream's better half (busy) still agrees with the first
        // stream's figure, which alone would pass.
        let (before, after) = (s(7200.0, 6000.0), s(2000.0, 6100.0));
        assert!(agree(before.figure(), after.figure()));
        assert!(!before.steady_with(&after));
        // So the sim run (2100) is not kept. The half-slow stream is the next try's
        // "before" too, so the test runs a third time, between two whole streams.
        let mut streams = [after, s(7000.0, 6200.0), s(7100.0, 6150.0)].into_iter();
        let next = || Ok(streams.next().expect("one stream too many"));
        let b = bracketed(before, runs(&[2100.0, 6900.0, 7000.0]), next).unwrap();
        assert_eq!(
            (b.sim, b.base, b.last, b.tries),
            (7000.0, 7050.0, s(7100.0, 6150.0), 3)
        );
    }
}
