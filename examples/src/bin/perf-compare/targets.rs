//! The target table from the rounds' pairs: a row per target with the median of the
//! sim's figures and of their baselines, the median and range of the ratios, and whether
//! the target is met ([`add_targets`]).

use examples::peers::Reference;
use examples::stats::{median, Figures};

use crate::multi_qp::Posting;
use crate::report::{Pair, Target};
use crate::rounds::Rounds;
use crate::rows::{
    map_key, peer_key, MAP_MODE, PEER_ROWS, QP_ROWS, RATE_MSGS, SHM_RATE_MPPS, SHM_RATE_ROW, SHM_ROWS,
    SHORT_ROW, SHORT_RUNS, SRQ_BW_ROW, SRQ_BW_TCP_ROW, SRQ_RATE_ROW, TCP_QP_ROW, UD_ROW,
};
use crate::Group;

/// What a row's ratio must be.
#[derive(Clone, Copy, Debug)]
enum Goal {
    AtMost(f64),
    AtLeast(f64),
    /// Shown, without a target.
    None,
}

/// The table being built from the rounds.
struct Table<'a> {
    rounds: &'a Rounds,
    targets: &'a mut Vec<Target>,
}

impl Table<'_> {
    fn get(&self, k: &str) -> &[Pair] {
        self.rounds.pairs.get(k).map_or(&[], Vec::as_slice)
    }

    /// The median of the sim's figures of row `k`.
    fn sim(&self, k: &str) -> f64 {
        median(self.get(k).iter().map(|p| p.sim))
    }

    /// The median of their baselines.
    fn base(&self, k: &str) -> f64 {
        median(self.get(k).iter().map(|p| p.base))
    }

    /// Adds the row `test` for the pairs of `key`: the sim's median in `unit`, the
    /// baseline described by `baseline`, the ratios' median and range against `goal`.
    fn row(&mut self, test: &str, key: &str, unit: &str, baseline: String, goal: Goal) {
        let r: Figures = self.get(key).iter().map(|p| p.sim / p.base).collect();
        let ratio = r.median();
        let (pass, target) = match goal {
            Goal::AtMost(x) => (ratio <= x, format!("<= {x} x")),
            Goal::AtLeast(x) => (ratio >= x, format!(">= {x} x")),
            Goal::None => (true, String::new()),
        };
        let pairs = match self.get(key).iter().map(|p| p.tries - 1).sum::<u32>() {
            0 => format!("{:.2}-{:.2}", r.min(), r.max()),
            again => format!("{:.2}-{:.2} ({again} again)", r.min(), r.max()),
        };
        let measured = format!("{:.2} {unit}", self.sim(key));
        self.targets.push(Target {
            test: test.into(),
            measured,
            baseline,
            ratio,
            pairs,
            target,
            pass,
            not_measured: None,
        });
    }

    /// Adds row `test` as not measured, saying why, with its baseline and target.
    fn not_measured(&mut self, test: &str, why: &str, baseline: &str, goal: Goal) {
        let target = match goal {
            Goal::AtMost(x) => format!("<= {x} x"),
            Goal::AtLeast(x) => format!(">= {x} x"),
            Goal::None => String::new(),
        };
        self.targets.push(Target {
            test: test.into(),
            measured: why.into(),
            baseline: baseline.into(),
            ratio: f64::NAN,
            pairs: String::new(),
            target,
            pass: false,
            not_measured: Some(why.into()),
        });
    }
}

/// Adds the rows of every group `want` selects to `targets`, in the table's order.
pub fn add_targets(targets: &mut Vec<Target>, rounds: &Rounds, want: &dyn Fn(Group) -> bool) {
    let mut t = Table { rounds, targets };
    if want(Group::Lat) {
        lat(&mut t);
    }
    if want(Group::Bw) {
        for k in ["write_bw", "read_bw", "send_bw"] {
            let base = format!("TCP stream {:.0} MB/s", t.base(k));
            t.row(&format!("{k} 1 MiB"), k, "MB/s", base, Goal::AtLeast(0.9));
        }
    }
    if want(Group::Rate) {
        rate(&mut t);
    }
    if want(Group::Peers) {
        peers(&mut t);
    }
    if want(Group::SameHost) {
        same_host(&mut t);
    }
    if want(Group::Cost) {
        cost(&mut t);
    }
    if want(Group::Qps) {
        qps(&mut t);
    }
    if want(Group::Srq) {
        srq(&mut t);
    }
    if want(Group::Ud) {
        ud(&mut t);
    }
}

fn srq(t: &mut Table<'_>) {
    let base = format!("no SRQ {:.2} M msgs/s", t.base(SRQ_RATE_ROW));
    t.row(
        "send_bw 64 B over an SRQ, tx depth 128",
        SRQ_RATE_ROW,
        "M msgs/s",
        base,
        Goal::AtLeast(0.9),
    );
    let base = format!("no SRQ {:.0} MB/s", t.base(SRQ_BW_ROW));
    t.row(
        "send_bw 1 MiB over an SRQ",
        SRQ_BW_ROW,
        "MB/s",
        base,
        Goal::AtLeast(0.9),
    );
    let base = format!("TCP stream {:.0} MB/s", t.base(SRQ_BW_TCP_ROW));
    t.row(
        "send_bw 1 MiB over an SRQ against TCP",
        SRQ_BW_TCP_ROW,
        "MB/s",
        base,
        Goal::AtLeast(0.8),
    );
}

fn ud(t: &mut Table<'_>) {
    let test = "UD send_bw 64 B, tx depth 128, received at the receiver";
    let base = "1 M msgs/s";
    if let Some(why) = t.rounds.unmeasured.get(UD_ROW) {
        t.not_measured(test, why, base, Goal::AtLeast(1.0));
        return;
    }
    t.row(test, UD_ROW, "M msgs/s received", base.into(), Goal::AtLeast(1.0));
    // The drops beside the rate: what the receiver never saw, per run.
    let runs = t.rounds.drops.get(UD_ROW).map_or(&[][..], Vec::as_slice);
    let (least, most) = runs
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), &(d, _)| (lo.min(d), hi.max(d)));
    if let Some(row) = t.targets.last_mut() {
        row.measured = format!(
            "{}; dropped {} of {RATE_MSGS} per run",
            row.measured,
            if least == most {
                least.to_string()
            } else {
                format!("{least}-{most}")
            }
        );
    }
}

fn lat(t: &mut Table<'_>) {
    for k in ["send_lat", "write_lat"] {
        let base = format!("TCP one-way {:.2} us", t.base(k));
        t.row(k, k, "us", base, Goal::AtMost(1.3));
    }
    for k in ["read_lat", "atomic_lat"] {
        let base = format!("TCP round trip {:.2} us", t.base(k));
        t.row(k, k, "us", base, Goal::AtMost(1.3));
    }
}

fn rate(t: &mut Table<'_>) {
    t.row(
        "write_bw 64 B, tx depth 128",
        "write_bw_64",
        "M msgs/s",
        "1 M msgs/s".into(),
        Goal::AtLeast(1.0),
    );
    let base = format!("their median {:.2} M msgs/s", t.base(SHORT_ROW));
    t.row(
        &format!("write_bw 64 B, tx depth 16, 2000 WRITEs: slowest of {SHORT_RUNS} runs (no target)"),
        SHORT_ROW,
        "M msgs/s",
        base,
        Goal::None,
    );
}

fn peers(t: &mut Table<'_>) {
    for (peer, tests) in PEER_ROWS {
        for test in tests {
            let k = peer_key(test, peer);
            // The target: one-way latency at or below UCX's and libfabric's.
            let goal = if peer != Reference::UcxFetchAdd {
                Goal::AtMost(1.0)
            } else {
                Goal::None
            };
            let base = format!("{} {:.2} us", peer.name(), t.base(&k));
            t.row(&format!("{test} vs {}", peer.name()), &k, "us", base, goal);
        }
    }
}

/// The same-host rows: the default path's, then those in the opt-in map mode, labelled
/// as such (`RDMA_SIM_ONESIDED=map`), against the same references and targets.
fn same_host(t: &mut Table<'_>) {
    let map_label = format!("same host, RDMA_SIM_ONESIDED={MAP_MODE} (opt-in)");
    for (label, in_map) in [("same host", false), (map_label.as_str(), true)] {
        for (peer, test, target, map) in SHM_ROWS {
            if in_map && !map {
                continue;
            }
            let k = match in_map {
                false => peer_key(test, peer),
                true => map_key(&peer_key(test, peer)),
            };
            let (unit, goal) = match peer.is_bandwidth() {
                true => ("MB/s", target.map_or(Goal::None, Goal::AtLeast)),
                false => ("us", target.map_or(Goal::None, Goal::AtMost)),
            };
            let base = format!("{} {:.2} {unit}", peer.name(), t.base(&k));
            t.row(
                &format!("{label}: {test} vs {}", peer.name()),
                &k,
                unit,
                base,
                goal,
            );
        }
        let k = match in_map {
            false => SHM_RATE_ROW.to_string(),
            true => map_key(SHM_RATE_ROW),
        };
        t.row(
            &format!("{label}: write_bw 64 B, tx depth 128"),
            &k,
            "M msgs/s",
            format!("{SHM_RATE_MPPS} M msgs/s"),
            Goal::AtLeast(1.0),
        );
    }
}

fn cost(t: &mut Table<'_>) {
    let k = "cost";
    let own = median(t.get(k).iter().map(|p| p.sim - p.base));
    let base = format!("TCP send + recv {:.0} ns", t.base(k));
    t.row(
        "CPU per message, one thread (post + poll)",
        k,
        &format!("ns (sim's own work {own:.0} ns)"),
        base,
        Goal::None,
    );
    let k = "empty_look";
    let base = format!("two TCP recv finding nothing {:.0} ns", t.base(k));
    t.row(
        "Empty poll of a device with two connections, one thread",
        k,
        "ns",
        base,
        Goal::None,
    );
}

fn qps(t: &mut Table<'_>) {
    for (k, depth, posting, min) in QP_ROWS {
        let how = match posting {
            Posting::Single => "",
            Posting::List => ", posted as lists",
        };
        let base = format!("1 QP {:.0} MB/s, {depth} outstanding{how}", t.base(k));
        let goal = min.map_or(Goal::None, Goal::AtLeast);
        t.row(
            &format!("64 QPs write_bw 64 KiB aggregate, {depth} outstanding per QP{how}"),
            k,
            "MB/s",
            base,
            goal,
        );
    }
    let base = format!("1 connection {:.0} MB/s", t.base(TCP_QP_ROW));
    t.row(
        "raw TCP, 64 connections with the 64-QP row's traffic, aggregate",
        TCP_QP_ROW,
        "MB/s",
        base,
        Goal::None,
    );
}
