//! The schedule of a run: every fault the network applied, keyed by frame, and a run
//! replayed from a schedule alone. Replaying the schedule a seed's run recorded gives
//! that run again (the same trace); an empty schedule gives the clean network; a
//! schedule of one fault gives that fault and nothing else.

mod common;

use std::time::Duration;

use backend_sim_det::harness::{check_seeds, check_seeds_with};
use backend_sim_det::{Det, DetBuilder, FaultMix, Schedule, What};

const SEEDS: u64 = 12;

fn hosts() -> DetBuilder {
    Det::builder().hosts(["client", "server"])
}

/// Every kind of fault: loss, duplicates (apart), reordering, cut messages, resets.
fn stormy() -> DetBuilder {
    hosts()
        .loss(5)
        .dup(5)
        .dup_gap(Duration::from_micros(50))
        .jitter(Duration::from_micros(20))
        .split(50)
        .reset(0.5)
}

/// The run of `builder` (the client and server of `common`): its result, trace and
/// schedule.
fn run(builder: DetBuilder) -> (Result<(), String>, u64, Schedule) {
    let det = builder.build();
    let r = common::client_server(&det);
    (r, det.trace(), det.schedule())
}

#[test]
fn replaying_the_recorded_schedule_gives_the_same_run() {
    let mut kinds = [0usize; 5];
    for seed in 0..SEEDS {
        let (r, trace, schedule) = run(stormy().seed(seed));
        assert_eq!(r, Ok(()), "seed {seed}");
        assert!(
            !schedule.is_empty(),
            "seed {seed}: a stormy network applied no fault"
        );
        for f in &schedule.faults {
            kinds[match f.what {
                What::Drop => 0,
                What::Delay(_) => 1,
                What::Duplicate(_) => 2,
                What::Split => 3,
                What::Reset => 4,
            }] += 1;
        }
        let (again, replayed, recorded) = run(stormy().seed(seed).schedule(schedule.clone()));
        assert_eq!(again, Ok(()), "seed {seed}");
        assert_eq!(replayed, trace, "seed {seed}: the replay went another way");
        assert_eq!(recorded, schedule, "seed {seed}: the replay applied other faults");
    }
    assert!(
        kinds.iter().all(|&n| n > 0),
        "not every kind of fault ran: {kinds:?}"
    );
}

#[test]
fn a_printed_schedule_read_back_replays_the_run() {
    let (_, trace, schedule) = run(stormy().seed(3));
    let printed: Schedule = schedule.to_string().parse().expect("reads back");
    assert_eq!(printed, schedule);
    assert_eq!(run(hosts().seed(3).schedule(printed)).1, trace);
}

#[test]
fn an_empty_schedule_is_the_clean_network() {
    for seed in 0..4 {
        let clean = run(hosts().seed(seed));
        let forced = run(stormy().seed(seed).schedule(Schedule::default()));
        assert_eq!(forced.0, Ok(()));
        assert_eq!(forced.1, clean.1, "seed {seed}");
        assert!(clean.2.is_empty() && forced.2.is_empty());
    }
}

#[test]
fn a_schedule_of_one_fault_applies_that_fault_alone() {
    let (_, _, schedule) = run(stormy().seed(1));
    let drop = schedule
        .faults
        .iter()
        .find(|f| f.what == What::Drop)
        .expect("seed 1 loses a frame")
        .clone();
    let one = Schedule::from(vec![drop.clone()]);
    let det = stormy().seed(1).schedule(one).build();
    assert_eq!(common::client_server(&det), Ok(()));
    let stats = det.stats();
    assert_eq!(
        (stats.lost, stats.duplicated, stats.split, stats.resets),
        (1, 0, 0, 0)
    );
    assert_eq!(det.schedule().faults.len(), 1);
    assert_eq!(det.schedule().faults[0].key, drop.key);
}

#[test]
fn the_builder_knobs_are_the_fault_mix() {
    let b = hosts()
        .loss(10)
        .dup(0)
        .latency(Duration::from_micros(2))
        .jitter(Duration::from_micros(20))
        .dup_gap(Duration::from_micros(50))
        .split(50);
    assert_eq!(b.fault_mix(), FaultMix::lossy(10, 0));
    for seed in 0..4 {
        assert_eq!(
            run(b.clone().seed(seed)).1,
            run(hosts().mix(FaultMix::lossy(10, 0)).seed(seed)).1
        );
    }
    let m = hosts().loss(250).dup(f64::NAN).split(0.25).reset(-3).fault_mix();
    assert_eq!(
        (m.loss_ppm, m.dup_ppm, m.split_ppm, m.reset_ppm),
        (1_000_000, 0, 2_500, 0)
    );
}

#[test]
fn a_panicking_test_fails_with_its_seed_and_shrinks_to_the_one_fault_it_needs() {
    let lossy = hosts().loss(5).jitter(Duration::from_micros(20)).split(50);
    let test = |det: &Det| {
        common::client_server(det)?;
        assert_eq!(det.stats().lost, 0, "a frame was lost");
        Ok::<(), String>(())
    };
    let found = check_seeds(&lossy, 0..50, test).expect_err("5% loss loses a frame within 50 seeds");
    assert!(
        found.what.starts_with("panicked: ") && found.what.contains("a frame was lost"),
        "{found}"
    );
    assert!(found.schedule.len() > 10, "{found}");
    let shrunk = found.shrunk.expect("the failure repeats from its schedule");
    eprintln!("{shrunk}");
    assert_eq!(shrunk.schedule.len(), 1, "{shrunk}");
    assert_eq!(shrunk.schedule.faults[0].what, What::Drop, "{shrunk}");
    // Asked not to shrink, the search finds the same seed and leaves its schedule whole.
    let unshrunk = check_seeds_with(&lossy, 0..50, 0, test).expect_err("the same seed fails");
    assert_eq!(
        (unshrunk.seed, &unshrunk.schedule, unshrunk.shrunk),
        (found.seed, &found.schedule, None)
    );
}
