//! The report: every target row ([`Target`]) with the (sim, baseline) pairs behind it
//! ([`Pair`]), the raw TCP figures, the curves; printed as a markdown table and CSV
//! ([`print_report`]) and written as JSON (`--json`, the [`Report`]'s fields).

use serde::Serialize;

use crate::bracket::STEADY;

/// One row of the target table.
#[derive(Serialize, Debug, Clone)]
pub struct Target {
    /// What was measured.
    pub test: String,
    /// The sim's figure, with its unit.
    pub measured: String,
    /// What it is held against, with its figure.
    pub baseline: String,
    /// The median of the rounds' sim / baseline.
    pub ratio: f64,
    /// The lowest and highest of the rounds' ratios ("" for a row without pairs).
    pub pairs: String,
    /// The target (`<= 1.3 x`, ...; "" for a row without one).
    pub target: String,
    /// Whether the target is met (true without one; false when not measured).
    pub pass: bool,
    /// Why the row was not measured (the device lacks what it needs), if it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_measured: Option<String>,
}

/// One sim figure and its baseline (measured right before it, or the mean of the ones
/// right before and after it).
#[derive(Serialize, Debug, Clone, Copy)]
pub struct Pair {
    /// The sim's figure.
    pub sim: f64,
    /// Its baseline's.
    pub base: f64,
    /// How many times a bracketed measurement was taken before its two baselines agreed
    /// (1: at once; see [`bracketed`](crate::bracket::bracketed)); 1 for the others.
    pub tries: u32,
}

/// Everything perf-compare measured (also the `--json` file).
#[derive(Serialize, Debug, Default)]
pub struct Report {
    /// Where ([`machine`](crate::machine::machine)).
    pub machine: String,
    /// When.
    pub date: String,
    /// Rounds of every measurement.
    pub rounds: usize,
    /// The 8-byte TCP ping-pong's one-way time, busy-polling (median of the rounds).
    pub tcp_busy_one_way_us: f64,
    /// The same, blocking.
    pub tcp_block_one_way_us: f64,
    /// The bandwidth baseline: the better of the two modes, per round.
    #[serde(rename = "tcp_stream_MBps")]
    pub tcp_stream_mbps: f64,
    /// One TCP stream, blocking.
    #[serde(rename = "tcp_stream_blocking_MBps")]
    pub tcp_stream_blocking_mbps: f64,
    /// One TCP stream, busy-polling.
    #[serde(rename = "tcp_stream_busy_MBps")]
    pub tcp_stream_busy_mbps: f64,
    /// The target table.
    pub targets: Vec<Target>,
    /// Every round's (sim, baseline) pairs, by test.
    pub pairs: std::collections::BTreeMap<String, Vec<Pair>>,
    /// Latency and bandwidth against message size (`--curves`).
    pub size_curve: Vec<SizePoint>,
    /// Latency and bandwidth against the number of QPs (`--curves`).
    pub qp_curve: Vec<QpPoint>,
}

/// A point of the size curve.
#[derive(Serialize, Debug, Clone)]
pub struct SizePoint {
    /// Message size.
    pub size: u64,
    /// `write_lat`'s typical latency.
    pub write_lat_us: f64,
    /// `write_bw`'s average bandwidth.
    #[serde(rename = "write_bw_MBps")]
    pub write_bw_mbps: f64,
}

/// A point of the QP curve.
#[derive(Serialize, Debug, Clone)]
pub struct QpPoint {
    /// QPs.
    pub qps: usize,
    /// WRITEs outstanding per QP in the bandwidth test.
    pub depth: usize,
    /// An 8-byte WRITE's typical latency, taking the QPs in turn.
    pub write_lat_us: f64,
    /// 64 KiB WRITEs' aggregate bandwidth.
    #[serde(rename = "write_bw_64k_MBps")]
    pub write_bw_64k_mbps: f64,
}

/// Prints the machine, the raw TCP figures, the target table (markdown) and the curves
/// (CSV).
pub fn print_report(rep: &Report) {
    println!(
        "\nmachine: {}; {}; median of {} rounds (ratio: median of each round's sim / the baseline measured next to it; pairs: the lowest and highest of those; \"N again\": bracketed measurements taken again because the baselines before and after them differed by more than {:.0}%)",
        rep.machine,
        rep.date,
        rep.rounds,
        (STEADY - 1.0) * 100.0
    );
    let mut base = Vec::new();
    if rep.tcp_busy_one_way_us > 0.0 {
        base.push(format!(
            "8 B ping-pong one-way {:.2} us busy-polling, {:.2} us blocking",
            rep.tcp_busy_one_way_us, rep.tcp_block_one_way_us
        ));
    }
    if rep.tcp_stream_mbps > 0.0 {
        base.push(format!(
            "one stream of 1 MiB writes {:.0} MB/s blocking, {:.0} MB/s busy-polling",
            rep.tcp_stream_blocking_mbps, rep.tcp_stream_busy_mbps
        ));
    }
    if !base.is_empty() {
        println!("raw TCP over 127.0.0.1: {}\n", base.join("; "));
    }
    println!("| test | sim | baseline | ratio | pairs | target | met |");
    println!("|---|---|---|---|---|---|---|");
    for t in &rep.targets {
        if let Some(why) = &t.not_measured {
            println!(
                "| {} | {why} | {} | - | - | {} | not measured |",
                t.test, t.baseline, t.target
            );
            continue;
        }
        println!(
            "| {} | {} | {} | {:.2} | {} | {} | {} |",
            t.test,
            t.measured,
            t.baseline,
            t.ratio,
            t.pairs,
            t.target,
            if t.target.is_empty() {
                "-"
            } else if t.pass {
                "yes"
            } else {
                "**no**"
            }
        );
    }
    if !rep.size_curve.is_empty() {
        println!("\nsize,write_lat_us,write_bw_MBps");
        for p in &rep.size_curve {
            println!("{},{:.2},{:.0}", p.size, p.write_lat_us, p.write_bw_mbps);
        }
    }
    if !rep.qp_curve.is_empty() {
        println!("\nqps,depth_per_qp,write_lat_us,write_bw_64k_MBps");
        for p in &rep.qp_curve {
            println!(
                "{},{},{:.2},{:.0}",
                p.qps, p.depth, p.write_lat_us, p.write_bw_64k_mbps
            );
        }
    }
}
