//! Seeded runs of the workload: clean, lossy, duplicating and reordering networks all
//! match the model; the same seed gives the same trace.

use std::time::Duration;

use super::workload::{run, Spec};
use super::FaultMix;

/// Seeds each mix runs in `cargo test` (the mutation check and longer sittings run more).
const SEEDS: u64 = 24;

fn all_pass(spec: &Spec, seeds: std::ops::Range<u64>) -> super::Stats {
    let mut total = super::Stats::default();
    for seed in seeds {
        match run(seed, spec) {
            Ok(o) => {
                total.delivered += o.stats.delivered;
                total.lost += o.stats.lost;
                total.duplicated += o.stats.duplicated;
                total.timeouts += o.stats.timeouts;
                total.resets += o.stats.resets;
                total.split += o.stats.split;
            }
            Err(v) => panic!("{v} (replay: the same seed and spec)"),
        }
    }
    total
}

#[test]
fn a_clean_network_matches_the_model() {
    let s = all_pass(
        &Spec::new(200, FaultMix::clean(Duration::from_micros(2))),
        0..SEEDS,
    );
    assert_eq!((s.lost, s.duplicated, s.timeouts), (0, 0, 0));
}

#[test]
fn loss_duplication_and_reordering_still_match_the_model() {
    let s = all_pass(&Spec::new(200, FaultMix::lossy(5, 5)), 0..SEEDS);
    // The recovery paths ran: frames were lost and duplicated, and A timed out.
    assert!(s.lost > 0 && s.duplicated > 0 && s.timeouts > 0, "{s:?}");
}

/// Frames cut into their packets, each lost, duplicated and reordered on its own: a
/// packet lost inside a SEND, a WRITE or a READ response is recovered from that packet
/// (a PSN sequence error NAK or a timeout, a resend of the rest), and the data, the
/// exactly-once execution and the statuses still match the model.
#[test]
fn packets_lost_inside_messages_still_match_the_model() {
    let mut mix = FaultMix::lossy(5, 5);
    mix.split_ppm = 1_000_000;
    let s = all_pass(&Spec::new(200, mix), 0..SEEDS);
    assert!(s.split > 0 && s.lost > 0 && s.duplicated > 0, "{s:?}");
}

#[test]
fn broken_connections_still_match_the_model() {
    let mut mix = FaultMix::lossy(2, 2);
    mix.reset_ppm = 2000;
    let s = all_pass(&Spec::new(200, mix), 0..SEEDS);
    assert!(s.resets > 0, "{s:?}");
}

#[test]
fn both_ends_posting_still_match_the_model() {
    let mut mix = FaultMix::lossy(5, 5);
    mix.reset_ppm = 500;
    let mut spec = Spec::new(150, mix);
    spec.duplex = true;
    all_pass(&spec, 0..SEEDS);
}

#[test]
fn reordering_alone_matches_the_model() {
    let mut mix = FaultMix::clean(Duration::from_micros(1));
    mix.jitter = Duration::from_micros(200);
    all_pass(&Spec::new(200, mix), 0..SEEDS);
}

/// Seeds that found bugs in the protocol core, each with the bug it found: they must
/// keep matching the model.
#[test]
fn seeds_that_found_bugs_still_match_the_model() {
    let lossy = Spec::new(200, FaultMix::lossy(5, 5));
    let mut reordering = FaultMix::clean(Duration::from_micros(1));
    reordering.jitter = Duration::from_micros(200);
    let reordering = Spec::new(200, reordering);
    let found = [
        (
            227,
            lossy,
            "a READ or atomic answered out of order stopped counting against max_rd_atomic, so more \
             atomics were in flight than the responder's replay state holds, and a resend met a \
             NAK (invalid request)",
        ),
        (
            25,
            reordering,
            "a NAK beyond a READ whose response was lost failed the WQE it named, and a flush \
             completion came before successful ones",
        ),
        (
            92,
            lossy,
            "each stale copy of a sequence error NAK started a resend and spent a retry",
        ),
        (
            453,
            lossy,
            "the acknowledgement a NAK carries for the PSNs before it did not count as progress: \
             retry_cnt ran out while the connection moved",
        ),
    ];
    for (seed, spec, bug) in found {
        if let Err(v) = run(seed, &spec) {
            panic!("{bug}: {v}");
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    let spec = Spec::new(150, FaultMix::lossy(5, 5));
    for seed in 0..4 {
        let (a, b) = (run(seed, &spec).unwrap(), run(seed, &spec).unwrap());
        assert_eq!(a, b, "seed {seed} twice");
    }
    assert_ne!(run(0, &spec).unwrap().trace, run(1, &spec).unwrap().trace);
}

/// Seeds the mutation check may take to find each planted bug (the lossy mix).
#[cfg(feature = "planted-bugs")]
const FIND_WITHIN: u64 = 40;

/// The mutation check: each bug planted on purpose (`crate::plant`) makes some seed's
/// run differ from the model within [`FIND_WITHIN`] seeds.
#[cfg(feature = "planted-bugs")]
#[test]
fn every_planted_bug_is_found() {
    use crate::plant::{with, Plant};
    let spec = Spec::new(200, FaultMix::lossy(5, 5));
    for p in Plant::ALL {
        // The workload retries RNR for ever (rnr_retry 7), where no count is kept: the
        // RNR count is checked on its own.
        let check = |seed| match p {
            Plant::RnrOffByOne => super::rnr_count::rnr_retries_counted(seed, super::rnr_count::mix()),
            _ => run(seed, &spec).map(|_| ()).map_err(|v| v.to_string()),
        };
        let found = with(p, || (0..FIND_WITHIN).find_map(|seed| check(seed).err()));
        match found {
            Some(v) => println!("{p:?}: found by {v}"),
            None => panic!("{p:?} planted, yet seeds 0..{FIND_WITHIN} all match the model"),
        }
    }
}

/// A network that loses every frame: each end's retries run out, its QP goes to ERR
/// with RETRY_EXC_ERR on the WR the peer never acknowledged and flushes the rest (and
/// WRs posted in ERR complete flushed at once), as the model says; the same seed gives
/// the same trace.
#[test]
fn exhausted_retries_end_both_qps_in_error_with_flushes() {
    let mut spec = Spec::new(40, FaultMix::lossy(100, 0));
    spec.duplex = true;
    spec.retries_exhausted = true;
    spec.attrs.retry_cnt = 2;
    // ~8 us ACK timeouts: the QPs reach ERR while WRs are still being posted.
    spec.attrs.timeout = 1;
    for seed in 0..SEEDS {
        let one = run(seed, &spec).unwrap_or_else(|v| panic!("{v}"));
        let two = run(seed, &spec).unwrap_or_else(|v| panic!("{v}"));
        assert_eq!(one.trace, two.trace, "seed {seed}: the same seed, another trace");
        assert!(
            one.stats.timeouts > 0 && one.stats.delivered == 0,
            "{:?}",
            one.stats
        );
    }
    // The clean network does not pass as one whose retries ran out.
    let mut clean = Spec::new(40, FaultMix::clean(Duration::from_micros(2)));
    clean.duplex = true;
    clean.retries_exhausted = true;
    assert!(run(0, &clean).is_err());
}
