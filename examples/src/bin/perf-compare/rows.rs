//! The rows of the target table that are measured the same way several times over:
//! their keys, their parameters and their targets, and how many runs of each go into a
//! round.

use examples::peers::Reference;

use crate::multi_qp::Posting;

/// The QP rows: key, WRITEs outstanding per QP (on both sides), posting, minimum ratio.
/// The target compares at 16 per QP, one WR per call; 4 per QP, and 16 per QP posted as
/// lists, are shown without one.
pub const QP_ROWS: [(&str, usize, Posting, Option<f64>); 3] = [
    ("qp64", 16, Posting::Single, Some(0.8)),
    ("qp64_depth4", 4, Posting::Single, None),
    ("qp64_lists", 16, Posting::List, None),
];
/// Key of the QP rows' raw TCP reference ([`streams`]: 64 connections against one, 16
/// messages of 64 KiB outstanding on each, no target).
pub const TCP_QP_ROW: &str = "tcp_conns64";

/// Key of the short-runs row: `perf write_bw -s 64 -t 16 -n 2000`, the slowest of
/// [`SHORT_RUNS`] runs against their median (no target). Such a run takes a few
/// milliseconds; one in ten stalled at a twentieth of the median before the sim's progress
/// thread learnt to leave a CPU it shared with its sender (`backend_sim::cpu_share`).
pub const SHORT_ROW: &str = "write_bw_64_short";
/// Runs of the short-runs row per round.
pub const SHORT_RUNS: usize = 10;

/// Messages of each 64-byte run of the SRQ and UD rows (`perf send_bw -s 64 -t 128`).
pub const RATE_MSGS: u64 = 1_000_000;

/// Key of the SRQ message-rate row: `perf send_bw -s 64 --use_srq` between two runs
/// without an SRQ (target: at least 0.9 of them).
pub const SRQ_RATE_ROW: &str = "srq_send_bw_64";
/// Key of the SRQ bandwidth row: `perf send_bw -s 1048576 --use_srq` between two runs
/// without an SRQ (target: at least 0.9 of them).
pub const SRQ_BW_ROW: &str = "srq_send_bw";
/// Key of the same against TCP: `perf send_bw -s 1048576 --use_srq` between two TCP
/// streams (the target of send_bw 1 MiB).
pub const SRQ_BW_TCP_ROW: &str = "srq_send_bw_tcp";
/// Key of the UD row: `perf send_bw -c UD -s 64`, the messages received per second at the
/// receiver against 1 M msgs/s; the datagrams dropped are kept apart.
pub const UD_ROW: &str = "ud_send_bw_64";

/// Messages of each one-thread cost measurement per latency iteration (200 000 by
/// default: a second of each side).
pub const COST_MESSAGES_PER_LAT_ITER: u64 = 10;

/// The UCX and libfabric references and the sim's tests paired with each (8 B).
pub const PEER_ROWS: [(Reference, &[&str]); 3] = [
    (Reference::UcxTagLat, &["send_lat", "write_lat"]),
    (Reference::FabricPingpong, &["send_lat"]),
    (Reference::UcxFetchAdd, &["atomic_lat"]),
];

/// Iterations of each UCX and libfabric run per sim latency iteration (100 000 by
/// default, as `bench/ucx-libfabric.sh`: they need more to settle).
pub const PEER_ITERS_PER_LAT_ITER: u64 = 5;

/// The key of a sim test paired with a reference in the report's pairs.
pub fn peer_key(test: &str, peer: Reference) -> String {
    format!("{test}/{}", peer.name())
}

/// The same-host references and the sim's test paired with each (over its default path,
/// the same-host one), with the target: at most this many times the reference's latency,
/// or at least this fraction of its bandwidth (none: shown only); and whether the test is
/// measured in map mode too ([`MAP_MODE`], against the same reference, with the same
/// target: the one-sided tests, which that mode serves).
pub const SHM_ROWS: [(Reference, &str, Option<f64>, bool); 5] = [
    (Reference::UcxTagLatShm, "send_lat", Some(2.0), false),
    (Reference::FabricPingpongShm, "send_lat", None, false),
    (Reference::UcxFetchAddShm, "atomic_lat", Some(2.0), true),
    (Reference::UcxPutBwShm, "write_bw", Some(0.8), true),
    (Reference::UcxGetShm, "read_bw", Some(0.8), true),
];

/// The value of `RDMA_SIM_ONESIDED` of the same-host rows measured in the opt-in map
/// mode (docs/sim.md, "Map mode"): the default rows run without the variable.
pub const MAP_MODE: &str = "map";

/// The key of a same-host row measured in map mode.
pub fn map_key(key: &str) -> String {
    format!("{key}/{MAP_MODE}")
}

/// Transfers of 1 MiB in each bandwidth run of the same-host rows, the sim's and UCX's.
pub const SHM_BW_ITERS: u64 = 8000;

/// Key of the same-host message-rate row: `perf write_bw -s 64 -t 128` against
/// [`SHM_RATE_MPPS`].
pub const SHM_RATE_ROW: &str = "same_host_write_bw_64";
/// The same-host message-rate target, in M msgs/s.
pub const SHM_RATE_MPPS: f64 = 20.0;
