//! perf-compare: the simulated HCA against the physical limit of the transport it runs on.
//!
//! In one run it measures raw TCP over loopback (an 8-byte ping-pong, busy-polling and
//! blocking, and one stream of 1 MiB writes) and the sim with the `perf` tool (two
//! processes, as a user would run it), and prints every target of the performance issue
//! with the measured ratio. Each sim figure is paired with a baseline measured right
//! before it (the speed of a shared VM drifts by tens of percent from minute to minute);
//! a ratio is the median over the rounds of those pairs' ratios, and the table shows the
//! lowest and highest of them too. Each row runs the sim over the path of its baseline:
//! the rows against TCP over TCP, the same-host rows over the same-host path
//! ([`perf_runs`]). The baseline's sockets
//! get the same options as the sim's data connections (`TCP_NODELAY`, and the congestion
//! control of `backend_sim::sockopt`: CUBIC unless `RDMA_SIM_TCP_CC` says otherwise):
//!
//! | test | target |
//! |---|---|
//! | send_lat / write_lat 8 B, typical one-way | <= 1.3 x raw TCP ping-pong one-way (same polling mode) |
//! | read_lat / atomic_lat 8 B | <= 1.3 x one raw TCP round trip |
//! | write_bw / read_bw / send_bw 1 MiB | >= 0.9 x one raw TCP stream (the streams right before and after, averaged) |
//! | write_bw 64 B, tx depth 128 | >= 1 M msgs/s |
//! | 64 QPs on one device, write_bw 64 KiB aggregate | >= 0.8 x one QP (same harness, 16 WRs outstanding per QP; the one QP measured before and after, averaged) |
//! | send_lat p99 with a third thread spinning | < 4 ms (no scheduler-tick stalls) |
//! | send_bw 64 B and 1 MiB over an SRQ | >= 0.9 x the same without an SRQ (runs before and after, averaged) |
//! | send_bw 1 MiB over an SRQ | >= 0.8 x one raw TCP stream |
//! | UD send_bw 64 B, received at the receiver | >= 1 M msgs/s (datagrams dropped reported apart; "not measured" on a device without UD) |
//! | same host: send_lat 8 B | <= 2 x UCX `tag_lat` over shared memory (`posix`) |
//! | same host: atomic_lat 8 B | <= 2 x UCX `ucp_fadd` over shared memory |
//! | same host: write_bw / read_bw 1 MiB | >= 0.8 x UCX `ucp_put_bw` / `ucp_get` over `posix` and `cma` |
//! | same host: write_bw 64 B, tx depth 128 | >= 20 M msgs/s |
//!
//! The QP target compares like with like, as perftest's `-q` does: each of the 64 QPs
//! keeps as many WRITEs outstanding as the single QP (16). A second row, without a
//! target, does the same with 4 per QP (256 in all): it shows what a shallow pipeline
//! per QP costs, at any QP count. A third, without a target, is raw TCP with the same
//! traffic over 64 connections against one ([`streams`]): what many connections cost
//! the kernel, so that the sim's ratio can be read against it. A fourth, without a
//! target, is the first row with each QP's refill posted as one list instead of one WR
//! per `post_send`: what the posting pattern costs. Each run of these rows moves
//! `--qp-gib` GiB (8): fresh connections start slowly, and a short run measures the start.
//!
//! The `rate` group also runs ten short runs of small WRITEs with a shallow send queue
//! (`perf write_bw -s 64 -t 16 -n 2000`) and shows the slowest against their median, no
//! target: a run that stalls (as some did while the progress thread could starve its
//! sender on a shared CPU, `backend_sim::cpu_share`) shows there.
//!
//! Two groups have no target of their own: `peers` measures UCX (`ucx_perftest`) and
//! libfabric (`fi_pingpong`) and pairs the sim's latency with each (the issue asks for
//! the sim at or below their figures: the rows' target is 1.0 x), and `cost` measures the
//! CPU time of one message with both ends in one thread against raw TCP doing the same
//! system calls ([`cost`]): a figure free of scheduling noise, for comparing changes.
//!
//! `--curves` adds latency and bandwidth against message size (2 B .. 8 MiB) and against
//! the number of QPs (1 .. 1024; 16 WRITEs outstanding per QP up to 64 QPs, then 1024 in
//! all), written as CSV and, with `--plot FILE.svg`, as a plot.
//!
//! ```text
//! cargo run --release -p examples --bin perf-compare                 # the target table
//! cargo run --release -p examples --bin perf-compare -- --curves --plot docs/bench/perf.svg --json docs/bench/perf.json
//! ```
//!
//! Its parts: the raw TCP baselines ([`tcp`]), the sim's runs of `perf` ([`perf_runs`])
//! and of many QPs in process ([`multi_qp`]), the one-thread cost ([`cost`]), the rows
//! measured alike ([`rows`]), pairing a sim figure with the baselines around it
//! ([`bracket`]), a round of every group ([`rounds`]), the target table ([`targets`]),
//! the loaded latency ([`load`]), the curves ([`curves`]), the report, its JSON and SVG
//! ([`report`], [`plot`]) and the machine ([`machine`]).

mod bracket;
mod cost;
mod curves;
mod load;
mod machine;
mod multi_qp;
mod perf_runs;
mod plot;
mod report;
mod rounds;
mod rows;
mod targets;
mod tcp;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use examples::stats::median;
use examples::Res;

use crate::report::Report;
use crate::rounds::Rounds;

/// Measure the simulated HCA against raw TCP on this machine.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Rounds of every measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Iterations of each latency test.
    #[arg(long, default_value_t = 20_000)]
    lat_iters: u64,
    /// Also measure the curves (size and QP count).
    #[arg(long)]
    curves: bool,
    /// Write the curves as an SVG plot to this file (implies --curves).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write all figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Largest QP count of the QP curve.
    #[arg(long, default_value_t = 1024)]
    max_qps: usize,
    /// GiB moved by each run of the QP rows (1 and 64 QPs alike, and raw TCP's 1 and 64
    /// connections). 64 fresh connections carry their first few hundred MiB at a half to a
    /// third of their steady rate, raw TCP's as well as the sim's, so a short run measures
    /// mostly that start.
    #[arg(long, default_value_t = 8)]
    qp_gib: u64,
    /// Measure only these groups of targets (comma-separated; default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Group>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

/// A group of targets (`--only`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    /// send_lat, write_lat, read_lat, atomic_lat against the TCP ping-pong.
    Lat,
    /// write_bw, read_bw, send_bw 1 MiB against one TCP stream.
    Bw,
    /// write_bw 64 B with tx depth 128 (message rate), and the slowest of ten short runs
    /// with tx depth 16 against their median (no target).
    Rate,
    /// 64 QPs against one QP (16 and 4 WRITEs outstanding per QP), and raw TCP with the same traffic over 64 connections against one
    Qps,
    /// send_lat p99 with a third spinning thread.
    Load,
    /// send_lat, write_lat, atomic_lat against UCX and libfabric on this machine (needs
    /// `apt-get install ucx-utils libfabric-bin`; left out of a full run without them).
    Peers,
    /// The sim's same-host path against UCX over shared memory (`posix`, `cma`) and
    /// libfabric's `shm` (send_lat, atomic_lat, write_bw and read_bw 1 MiB), and its
    /// message rate against 20 M msgs/s (needs the same packages as `peers`).
    SameHost,
    /// The CPU cost of one message in one thread, and of an empty poll, sim against TCP
    /// (no target).
    Cost,
    /// SEND over a shared receive queue: 64 B and 1 MiB against the same without one,
    /// 1 MiB against one TCP stream.
    Srq,
    /// UD send_bw 64 B: datagrams received per second at the receiver, drops apart (not
    /// measured on a device without UD).
    Ud,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// (internal) the TCP peer of the baselines.
    TcpServer,
    /// (internal) a thread that only spins, for the third-thread test.
    Spin {
        /// How long.
        #[arg(long)]
        secs: f64,
    },
}

fn main() -> ExitCode {
    examples::program::main("perf-compare", |cli: Cli| match &cli.cmd {
        Some(Cmd::TcpServer) => tcp::tcp_server(),
        Some(Cmd::Spin { secs }) => load::spin(*secs),
        None => run(&cli),
    })
}

/// The whole comparison: the rounds, the target table, the loaded latency, the curves;
/// then the report (and its JSON and plot).
fn run(cli: &Cli) -> Res<()> {
    machine::raise_fd_limit();
    let rounds = cli.rounds.max(1);
    let mut rep = Report {
        machine: machine::machine(),
        date: machine::date(),
        rounds,
        ..Default::default()
    };
    eprintln!("perf-compare: {} rounds on {}", rounds, rep.machine);
    let peer = tcp::spawn_tcp_server()?;
    let want = rounds::wanted(cli)?;
    let mut m = Rounds::default();
    for r in 0..rounds {
        eprintln!("round {}/{rounds}", r + 1);
        m.round(cli, &peer, &want)?;
    }
    rep.tcp_busy_one_way_us = median(m.tcp_busy.iter().copied());
    rep.tcp_block_one_way_us = median(m.tcp_block.iter().copied());
    rep.tcp_stream_mbps = median(m.tcp_bw.iter().copied());
    rep.tcp_stream_blocking_mbps = median(m.tcp_bw_modes.iter().map(|m| m.0));
    rep.tcp_stream_busy_mbps = median(m.tcp_bw_modes.iter().map(|m| m.1));
    targets::add_targets(&mut rep.targets, &m, &want);
    rep.pairs = m.pairs;
    if want(Group::Load) {
        rep.targets.push(load::loaded_send_lat(cli, &peer)?);
    }
    if cli.curves || cli.plot.is_some() {
        curves::measure(cli, &mut rep)?;
    }
    report::print_report(&rep);
    if let Some(p) = &cli.json {
        std::fs::write(p, serde_json::to_string_pretty(&rep)?)?;
    }
    if let Some(p) = &cli.plot {
        plot::plot(&rep, p)?;
        eprintln!("plot written to {}", p.display());
    }
    if rep.targets.iter().any(|t| !t.pass && t.not_measured.is_none()) {
        println!("\nsome targets are not met (see above)");
    }
    for t in rep.targets.iter().filter(|t| t.not_measured.is_some()) {
        println!("\n{}: {}", t.test, t.not_measured.as_deref().unwrap_or_default());
    }
    Ok(())
}
