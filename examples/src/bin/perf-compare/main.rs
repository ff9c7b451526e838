//! perf-compare: the simulated HCA against the physical limit of the transport it runs on.
//!
//! In one run it measures raw TCP over loopback (an 8-byte ping-pong, busy-polling and
//! blocking, and one stream of 1 MiB writes) and the sim with the `perf` tool (two
//! processes, as a user would run it), and prints every target of the performance issue
//! with the measured ratio. Each sim figure is paired with a baseline measured right
//! before it (the speed of a shared VM drifts by tens of percent from minute to minute);
//! a ratio is the median over the rounds of those pairs' ratios, and the table shows the
//! lowest and highest of them too. The baseline's sockets
//! get the same options as the sim's data connections (`TCP_NODELAY`, and the congestion
//! control of `backend_sim::sockopt`: CUBIC unless `RDMA_SIM_TCP_CC` says otherwise):
//!
//! | test | target |
//! |---|---|
//! | send_lat / write_lat 8 B, typical one-way | <= 1.3 x raw TCP ping-pong one-way (same polling mode) |
//! | read_lat / atomic_lat 8 B | <= 1.3 x one raw TCP round trip |
//! | write_bw / read_bw / send_bw 1 MiB | >= 0.8 x one raw TCP stream (the streams right before and after, averaged) |
//! | write_bw 64 B, tx depth 128 | >= 1 M msgs/s |
//! | 64 QPs on one device, write_bw 64 KiB aggregate | >= 0.8 x one QP (same harness, 16 WRs outstanding per QP; the one QP measured before and after, averaged) |
//! | send_lat p99 with a third thread spinning | < 4 ms (no scheduler-tick stalls) |
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
//! `--curves` adds latency and bandwidth against message size (8 B .. 4 MiB) and against
//! the number of QPs (1 .. 1024; 16 WRITEs outstanding per QP up to 64 QPs, then 1024 in
//! all), written as CSV and, with `--plot FILE.svg`, as a plot.
//!
//! ```text
//! cargo run --release -p examples --bin perf-compare                 # the target table
//! cargo run --release -p examples --bin perf-compare -- --curves --plot docs/perf.svg
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use clap::{Parser, Subcommand};
use examples::peers::Reference;
use examples::stats::{median, Figures};
use examples::streams;
use examples::Res;

mod cost;
use serde::Serialize;
use verbs_api::*;

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
    /// mostly that start (2 GiB did until 2026-11-30).
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
    /// The CPU cost of one message in one thread, and of an empty poll, sim against TCP
    /// (no target).
    Cost,
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

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    examples::init_tracing();
    let r = match &cli.cmd {
        Some(Cmd::TcpServer) => tcp_server(),
        Some(Cmd::Spin { secs }) => {
            let end = Instant::now() + Duration::from_secs_f64(*secs);
            while Instant::now() < end {
                std::hint::spin_loop();
            }
            Ok(())
        }
        None => run(&cli),
    };
    examples::report("perf-compare", r)
}

// ------------------------------------------------------------------------- raw TCP

const MODE_PINGPONG: u8 = 1;
const MODE_STREAM: u8 = 2;

/// The peer of the baselines: answers 8-byte pings, or swallows a stream.
fn tcp_server() -> Res<()> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    println!("listening on {}", l.local_addr()?);
    std::io::stdout().flush()?;
    loop {
        let (mut s, _) = l.accept()?;
        backend_sim::sockopt::tune(&s)?;
        let mut mode = [0u8; 2];
        if s.read_exact(&mut mode).is_err() {
            return Ok(());
        }
        match mode[0] {
            MODE_PINGPONG => {
                let busy = mode[1] == 1;
                s.set_nonblocking(busy)?;
                let mut b = [0u8; 8];
                while read_full(&mut s, &mut b, busy).is_ok() {
                    if write_full(&mut s, &b).is_err() {
                        break;
                    }
                }
            }
            MODE_STREAM => {
                let busy = mode[1] == 1;
                s.set_nonblocking(busy)?;
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                        Err(_) => break,
                    }
                }
                s.set_nonblocking(false)?;
                let _ = s.write_all(b"k");
            }
            _ => return Ok(()),
        }
    }
}

/// Reads exactly `b.len()` bytes; when busy, spins on a non-blocking socket (yielding
/// every 64 tries, as the `perf` tool's waits do).
fn read_full(s: &mut TcpStream, b: &mut [u8], busy: bool) -> std::io::Result<()> {
    let mut got = 0;
    let mut tries = 0u32;
    while got < b.len() {
        match s.read(&mut b[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if busy && e.kind() == std::io::ErrorKind::WouldBlock => {
                tries += 1;
                if tries % 64 == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn write_full(s: &mut TcpStream, b: &[u8]) -> std::io::Result<()> {
    let mut off = 0;
    while off < b.len() {
        match s.write(&b[off..]) {
            Ok(n) => off += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

struct Peer {
    child: Child,
    addr: String,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_tcp_server() -> Res<Peer> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("tcp-server")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the TCP peer")?;
    let out = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout from the TCP peer"))?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| anyhow!("the TCP peer did not say where it listens"))?
        .to_string();
    Ok(Peer { child, addr })
}

/// One-way latencies (µs) of an 8-byte TCP ping-pong.
fn tcp_pingpong(peer: &Peer, iters: u64, busy: bool) -> Res<Vec<f64>> {
    let mut s = TcpStream::connect(&peer.addr)?;
    backend_sim::sockopt::tune(&s)?;
    s.write_all(&[MODE_PINGPONG, busy as u8])?;
    s.set_nonblocking(busy)?;
    let mut b = [7u8; 8];
    let mut lat = Vec::with_capacity(iters as usize);
    for i in 0..iters + 100 {
        let t0 = Instant::now();
        write_full(&mut s, &b)?;
        read_full(&mut s, &mut b, busy)?;
        if i >= 100 {
            lat.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    Ok(lat)
}

/// MB/s of one TCP stream of 1 MiB writes: 0.5 s of warm-up (the window opens), then
/// `secs` measured, as iperf3 does. `busy`: both ends poll non-blocking sockets instead
/// of sleeping in the kernel (as the sim's progress threads do).
fn tcp_stream(peer: &Peer, secs: f64, busy: bool) -> Res<f64> {
    let mut s = TcpStream::connect(&peer.addr)?;
    backend_sim::sockopt::tune(&s)?;
    s.write_all(&[MODE_STREAM, busy as u8])?;
    s.set_nonblocking(busy)?;
    let buf = vec![1u8; 1 << 20];
    let warm = Instant::now() + Duration::from_millis(500);
    while Instant::now() < warm {
        write_full(&mut s, &buf)?;
    }
    let t0 = Instant::now();
    let mut sent = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        write_full(&mut s, &buf)?;
        sent += buf.len() as u64;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    s.set_nonblocking(false)?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut k = [0u8; 1];
    s.read_exact(&mut k)?;
    Ok(sent as f64 / elapsed / 1e6)
}

// ------------------------------------------------------------------------- the sim via perf

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct PerfRow {
    size: u64,
    #[serde(default)]
    t_typical_us: f64,
    #[serde(default)]
    t_p99_us: f64,
    #[serde(default)]
    t_max_us: f64,
    #[serde(default)]
    #[serde(rename = "bw_avg_MBps")]
    bw_avg_mbps: f64,
    #[serde(default)]
    #[serde(rename = "msg_rate_Mpps")]
    msg_rate_mpps: f64,
}

fn perf_exe() -> Res<PathBuf> {
    let p = std::env::current_exe()?.with_file_name("perf");
    if !p.exists() {
        bail!(
            "{} not found: build it with `cargo build --release -p examples`",
            p.display()
        );
    }
    Ok(p)
}

fn perf(args: &[String]) -> Res<Vec<PerfRow>> {
    let out = Command::new(perf_exe()?)
        .args(args)
        .arg("--json")
        .output()
        .context("running perf")?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(10).collect();
        bail!(
            "perf {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(|l| serde_json::from_str(l).map_err(|e| anyhow!("perf output {l:?}: {e}")))
        .collect()
}

fn perf1(args: &[&str]) -> Res<PerfRow> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    perf(&args)?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("perf printed no result"))
}

// ------------------------------------------------------------------------- many QPs, in process

/// Fails on the first unsuccessful completion of a test with `qps` QPs (whose WRITEs
/// carry their QP's index or their sequence number as `wr_id`).
fn all_ok(wcs: &[WorkCompletion], qps: usize) -> Res<()> {
    match wcs.iter().find(|wc| !wc.is_ok()) {
        None => Ok(()),
        Some(wc) => bail!(
            "{qps} QPs: WRITE {} failed ({:?}, vendor_err {}: why the QP had no connection, as an errno); \
             a QP whose connection cannot be set up ends so, e.g. when the process runs out \
             of file descriptors (each QP holds a socket: `ulimit -n`)",
            wc.wr_id,
            wc.status,
            wc.vendor_err
        ),
    }
}

/// How the QP rows' application posts its WRITEs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Posting {
    /// One WR per `post_send` (perftest's default, `--post_list 1`).
    Single,
    /// Each QP's refill as one list (as `perf write_bw` posts).
    List,
}

/// The QP rows: key, WRITEs outstanding per QP (on both sides), posting, minimum ratio.
/// The target compares at 16 per QP, one WR per call; 4 per QP, and 16 per QP posted as
/// lists, are shown without one.
const QP_ROWS: [(&str, usize, Posting, Option<f64>); 3] = [
    ("qp64", 16, Posting::Single, Some(0.8)),
    ("qp64_depth4", 4, Posting::Single, None),
    ("qp64_lists", 16, Posting::List, None),
];
/// Key of the QP rows' raw TCP reference ([`streams`]: 64 connections against one, 16
/// messages of 64 KiB outstanding on each, no target).
const TCP_QP_ROW: &str = "tcp_conns64";

/// Key of the short-runs row: `perf write_bw -s 64 -t 16 -n 2000`, the slowest of
/// [`SHORT_RUNS`] runs against their median (no target). Such a run takes a few
/// milliseconds; one in ten stalled at a twentieth of the median before the sim's progress
/// thread learnt to leave a CPU it shared with its sender (`backend_sim::cpu_share`).
const SHORT_ROW: &str = "write_bw_64_short";
/// Runs of the short-runs row per round.
const SHORT_RUNS: usize = 10;

/// Messages of each one-thread cost measurement per latency iteration (200 000 by
/// default: a second of each side).
const COST_MESSAGES_PER_LAT_ITER: u64 = 10;

/// The UCX and libfabric references and the sim's tests paired with each (8 B).
const PEER_ROWS: [(Reference, &[&str]); 3] = [
    (Reference::UcxTagLat, &["send_lat", "write_lat"]),
    (Reference::FabricPingpong, &["send_lat"]),
    (Reference::UcxFetchAdd, &["atomic_lat"]),
];

/// Iterations of each UCX and libfabric run per sim latency iteration (100 000 by
/// default, as `bench/ucx-libfabric.sh`: they need more to settle).
const PEER_ITERS_PER_LAT_ITER: u64 = 5;

/// The key of a sim test paired with a reference in the report's pairs.
fn peer_key(test: &str, peer: Reference) -> String {
    format!("{test}/{}", peer.name())
}

/// WRITEs each QP keeps outstanding in the QP curve: 16, and at most 1024 in all.
fn curve_depth(qps: usize) -> usize {
    (1024 / qps).clamp(1, 16)
}

/// Aggregate MB/s of RDMA WRITEs of `size` bytes over `qps` QPs on one device (their
/// peers on a second device in this process), `depth` WRs outstanding per QP, posted as
/// `posting` says.
fn multi_qp_write_bw(qps: usize, depth: usize, size: usize, total: u64, posting: Posting) -> Res<f64> {
    let sim = backend_sim::SimBackend::default();
    let a = sim.open("sim0")?;
    let b = sim.open("sim1")?;
    let pd_a = a.alloc_pd()?;
    let pd_b = b.alloc_pd()?;
    let cq_a = a.create_cq(65536, None)?;
    let cq_b = b.create_cq(64, None)?;
    let cap = QpCap::new(depth as u32, 1);
    let src = pd_a.reg_mr(size, AccessFlags::LOCAL_WRITE)?;
    let dst = pd_b.reg_mr(size, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let p = RcParams::default();
    let mut pairs = Vec::with_capacity(qps);
    for _ in 0..qps {
        let qa = pd_a.create_qp(&QpInitAttr::rc(&cq_a, &cq_a, cap))?;
        let qb = pd_b.create_qp(&QpInitAttr::rc(&cq_b, &cq_b, cap))?;
        let ea = local_endpoint(&a, &qa, &p, 1)?;
        let eb = local_endpoint(&b, &qb, &p, 2)?;
        connect_rc(&qa, &p, 1, &eb)?;
        connect_rc(&qb, &p, 2, &ea)?;
        pairs.push((qa, qb));
    }
    let sge = [src.sge_all()];
    let remote = dst.remote().at(0);
    let mut outstanding = vec![0usize; qps];
    let mut wcs = vec![WorkCompletion::default(); 256];
    let mut list = Vec::with_capacity(depth);
    // Warm up: one WRITE per QP sets the connections up.
    for (i, (qa, _)) in pairs.iter().enumerate() {
        qa.post_send(&[SendWr::write(i as u64, &sge, remote).signaled()])
            .map_err(|e| anyhow!("{e}"))?;
    }
    all_ok(&poll_n(&cq_a, qps, Duration::from_secs(60))?, qps)?;
    let msgs = (total / size as u64).max(qps as u64);
    let t0 = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while done < msgs {
        for (i, (qa, _)) in pairs.iter().enumerate() {
            let room = (depth - outstanding[i]).min((msgs - posted) as usize);
            if room == 0 {
                continue;
            }
            let wr = SendWr::write(i as u64, &sge, remote).signaled();
            match posting {
                Posting::Single => {
                    for _ in 0..room {
                        qa.post_send(std::slice::from_ref(&wr))
                            .map_err(|e| anyhow!("{e}"))?;
                    }
                }
                Posting::List => {
                    list.clear();
                    list.resize(room, wr);
                    qa.post_send(&list).map_err(|e| anyhow!("{e}"))?;
                }
            }
            outstanding[i] += room;
            posted += room as u64;
        }
        let n = cq_a.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                bail!("WRITE on QP {} failed: {:?}", wc.wr_id, wc.status);
            }
            outstanding[wc.wr_id as usize] -= 1;
        }
        done += n as u64;
        if n == 0 {
            std::thread::yield_now();
        }
        if t0.elapsed() > Duration::from_secs(120) {
            bail!("{qps} QPs: {done} of {msgs} WRITEs after 120 s");
        }
    }
    Ok(done as f64 * size as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

/// Typical latency (µs) of an 8-byte RDMA WRITE (to completion), taking `qps` QPs in turn.
fn multi_qp_write_lat(qps: usize, iters: u64) -> Res<f64> {
    let sim = backend_sim::SimBackend::default();
    let a = sim.open("sim0")?;
    let b = sim.open("sim1")?;
    let pd_a = a.alloc_pd()?;
    let pd_b = b.alloc_pd()?;
    let cq_a = a.create_cq(4096, None)?;
    let cq_b = b.create_cq(64, None)?;
    let cap = QpCap::new(4, 1).with_inline(64);
    let src = pd_a.reg_mr(64, AccessFlags::LOCAL_WRITE)?;
    let dst = pd_b.reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let p = RcParams::default();
    let mut qs = Vec::with_capacity(qps);
    for _ in 0..qps {
        let qa = pd_a.create_qp(&QpInitAttr::rc(&cq_a, &cq_a, cap))?;
        let qb = pd_b.create_qp(&QpInitAttr::rc(&cq_b, &cq_b, cap))?;
        let ea = local_endpoint(&a, &qa, &p, 1)?;
        let eb = local_endpoint(&b, &qb, &p, 2)?;
        connect_rc(&qa, &p, 1, &eb)?;
        connect_rc(&qb, &p, 2, &ea)?;
        qs.push((qa, qb));
    }
    let sge = [src.sge(0, 8)?];
    let mut lat = Vec::with_capacity(iters as usize);
    let total = iters + qps as u64;
    for i in 0..total {
        let (qa, _) = &qs[(i as usize) % qps];
        let t0 = Instant::now();
        qa.post_send(&[SendWr::write(i, &sge, dst.remote().at(0)).signaled().inline()])
            .map_err(|e| anyhow!("{e}"))?;
        all_ok(&poll_n(&cq_a, 1, Duration::from_secs(10))?, qps)?;
        // The first round sets the connections up: not counted.
        if i >= qps as u64 {
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(median(lat))
}

// ------------------------------------------------------------------------- the run

/// Two baseline runs around a sim run that differ by more than this factor (the larger
/// over the smaller) mean the host changed speed meanwhile (this VM has slow phases in
/// which everything, TCP too, runs at a third of its speed, for seconds to minutes): the
/// sim run fell into one phase or the other, or both, and its ratio to their mean says
/// nothing about the sim. Such a measurement is taken again ([`bracketed`]).
const STEADY: f64 = 1.25;
/// How often a bracketed measurement is taken at most; the last is kept either way.
const BRACKET_TRIES: u32 = 3;

/// One run of a baseline: its figure, and whether the host kept its speed between it
/// and another run.
trait Baseline: Copy {
    /// The figure the sim is held against.
    fn figure(&self) -> f64;
    /// Whether `self` and `other` agree within [`STEADY`].
    fn steady_with(&self, other: &Self) -> bool;
}

/// Whether two figures agree within [`STEADY`] (the larger over the smaller).
fn agree(a: f64, b: f64) -> bool {
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
struct Stream {
    blocking: f64,
    busy: f64,
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
struct Bracketed<B> {
    sim: f64,
    base: f64,
    /// The baseline measured last (the next measurement's "before").
    last: B,
    tries: u32,
}

/// Measures `sim` between `before` (a baseline just measured) and a new run of `base`,
/// and again, each time between the last baseline and a new one, while the two disagree
/// by more than [`STEADY`] (at most [`BRACKET_TRIES`] times). Whether to measure again
/// depends on the baselines alone, never on the sim's figure.
fn bracketed<B: Baseline>(
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

#[derive(Serialize, Debug, Clone)]
struct Target {
    test: String,
    measured: String,
    baseline: String,
    ratio: f64,
    /// The lowest and highest of the rounds' ratios ("" for a row without pairs).
    pairs: String,
    target: String,
    pass: bool,
}

/// One sim figure and its baseline (measured right before it, or the mean of the ones
/// right before and after it).
#[derive(Serialize, Debug, Clone, Copy)]
struct Pair {
    sim: f64,
    base: f64,
    /// How many times a bracketed measurement was taken before its two baselines agreed
    /// (1: at once; see [`bracketed`]); 1 for the others.
    tries: u32,
}

#[derive(Serialize, Debug, Default)]
struct Report {
    machine: String,
    date: String,
    rounds: usize,
    tcp_busy_one_way_us: f64,
    tcp_block_one_way_us: f64,
    /// The bandwidth baseline: the better of the two modes, per round.
    #[serde(rename = "tcp_stream_MBps")]
    tcp_stream_mbps: f64,
    #[serde(rename = "tcp_stream_blocking_MBps")]
    tcp_stream_blocking_mbps: f64,
    #[serde(rename = "tcp_stream_busy_MBps")]
    tcp_stream_busy_mbps: f64,
    targets: Vec<Target>,
    /// Every round's (sim, baseline) pairs, by test.
    pairs: std::collections::BTreeMap<String, Vec<Pair>>,
    size_curve: Vec<SizePoint>,
    qp_curve: Vec<QpPoint>,
}

#[derive(Serialize, Debug, Clone)]
struct SizePoint {
    size: u64,
    write_lat_us: f64,
    #[serde(rename = "write_bw_MBps")]
    write_bw_mbps: f64,
}

#[derive(Serialize, Debug, Clone)]
struct QpPoint {
    qps: usize,
    /// WRITEs outstanding per QP in the bandwidth test.
    depth: usize,
    write_lat_us: f64,
    #[serde(rename = "write_bw_64k_MBps")]
    write_bw_64k_mbps: f64,
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let host_cc = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap_or_default();
    // What a data connection really gets (the host may not offer what the sim asks for).
    let cc = loopback_congestion().unwrap_or_else(|e| format!("unknown ({e})"));
    format!(
        "{cpus} x {model}, Linux {}; TCP congestion control {cc} (host default {})",
        kernel.trim(),
        host_cc.trim()
    )
}

/// The congestion control of a loopback connection with the sim's socket options.
fn loopback_congestion() -> std::io::Result<String> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let c = TcpStream::connect(l.local_addr()?)?;
    backend_sim::sockopt::tune(&c)?;
    backend_sim::sockopt::congestion_of(&c)
}

fn raise_fd_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read a live rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn run(cli: &Cli) -> Res<()> {
    raise_fd_limit();
    let rounds = cli.rounds.max(1);
    let n = cli.lat_iters.to_string();
    let mut rep = Report {
        machine: machine(),
        date: date(),
        rounds,
        ..Default::default()
    };
    eprintln!("perf-compare: {} rounds on {}", rounds, rep.machine);
    let peer = spawn_tcp_server()?;

    let mut tcp_busy = Vec::new();
    let mut tcp_block = Vec::new();
    let mut tcp_bw = Vec::new();
    let mut tcp_bw_modes = Vec::new();
    // Every sim figure is paired with its baseline measured right before and after it
    // (`bracketed`; the one-thread cost row: a TCP run right before it; the message rate
    // row: its fixed target): the host's speed drifts by tens of percent from one minute
    // to the next, so a ratio is only taken between neighbours, and the median of those
    // ratios is reported.
    let mut pairs: std::collections::BTreeMap<String, Vec<Pair>> = Default::default();
    let mut pair = |k: &str, sim: f64, base: f64, tries: u32| {
        pairs
            .entry(k.to_string())
            .or_default()
            .push(Pair { sim, base, tries });
    };
    let lat_tests = ["send_lat", "write_lat", "read_lat", "atomic_lat"];
    let missing = examples::peers::missing();
    if !missing.is_empty() {
        if cli.only.contains(&Group::Peers) {
            bail!(
                "--only peers needs {} ({})",
                missing.join(" and "),
                examples::peers::INSTALL
            );
        }
        eprintln!(
            "perf-compare: {} not installed, so the UCX and libfabric rows are left out ({})",
            missing.join(" and "),
            examples::peers::INSTALL
        );
    }
    let want = |g: Group| {
        (cli.only.is_empty() || cli.only.contains(&g)) && (g != Group::Peers || missing.is_empty())
    };
    for r in 0..rounds {
        eprintln!("round {}/{rounds}", r + 1);
        if want(Group::Lat) {
            tcp_block.push(median(tcp_pingpong(&peer, cli.lat_iters / 4, false)?));
            // Each sim test between two ping-pongs, as the bandwidth tests: this VM's
            // latency flips between two levels (TCP one way about 3.9 or 5.7 us) for
            // seconds at a time, and a test in one level is no match for a baseline
            // from the other.
            let mut one_way = || -> Res<f64> {
                let v = median(tcp_pingpong(&peer, cli.lat_iters, true)?);
                tcp_busy.push(v);
                Ok(v)
            };
            let mut before = one_way()?;
            for t in lat_tests {
                let sim = || Ok(perf1(&[t, "-s", "8", "-n", &n])?.t_typical_us);
                let b = bracketed(before, sim, &mut one_way)?;
                before = b.last;
                // READ and atomics take a round trip.
                let trips = if t.starts_with("send") || t.starts_with("write") {
                    1.0
                } else {
                    2.0
                };
                pair(t, b.sim, trips * b.base, b.tries);
            }
        }
        if want(Group::Bw) {
            // The stronger of the two polling modes is a stream's figure. Each sim test
            // runs between two streams and their mean is its baseline, as for the QP rows:
            // with a stream before it only, a sim run that fell into one of this VM's slow
            // phases was held against a stream from before the phase began. When the two
            // streams disagree by more than `STEADY`, blocking half with blocking half or
            // busy half with busy half, the host changed speed meanwhile and the test runs
            // again (`bracketed`, `Stream`).
            let mut stream = || -> Res<Stream> {
                let s = Stream {
                    blocking: tcp_stream(&peer, 1.5, false)?,
                    busy: tcp_stream(&peer, 1.5, true)?,
                };
                tcp_bw_modes.push((s.blocking, s.busy));
                tcp_bw.push(s.figure());
                Ok(s)
            };
            let mut before = stream()?;
            for t in ["write_bw", "read_bw", "send_bw"] {
                let sim = || Ok(perf1(&[t, "-s", "1048576", "-n", "8000"])?.bw_avg_mbps);
                let b = bracketed(before, sim, &mut stream)?;
                pair(t, b.sim, b.base, b.tries);
                before = b.last;
            }
        }
        if want(Group::Rate) {
            let row = perf1(&["write_bw", "-s", "64", "-t", "128", "-n", "1000000"])?;
            pair("write_bw_64", row.msg_rate_mpps, 1.0, 1);
            // Short runs of small WRITEs with a shallow send queue: the slowest of several
            // against their median shows runs that stall (a few milliseconds each, so
            // cheap to repeat).
            let mut rates = Vec::with_capacity(SHORT_RUNS);
            for _ in 0..SHORT_RUNS {
                rates.push(perf1(&["write_bw", "-s", "64", "-t", "16", "-n", "2000"])?.msg_rate_mpps);
            }
            let rates: Figures = rates.into_iter().collect();
            pair(SHORT_ROW, rates.min(), rates.median(), 1);
        }
        if want(Group::Peers) {
            // Each of the sim's counterparts between two runs of the reference.
            for (peer, tests) in PEER_ROWS {
                let reference = || peer.measure(cli.lat_iters * PEER_ITERS_PER_LAT_ITER);
                let mut before = reference()?;
                for t in tests {
                    let sim = || Ok(perf1(&[t, "-s", "8", "-n", &n])?.t_typical_us);
                    let b = bracketed(before, sim, reference)?;
                    before = b.last;
                    pair(&peer_key(t, peer), b.sim, b.base, b.tries);
                }
            }
        }
        if want(Group::Cost) {
            let msgs = cli.lat_iters * COST_MESSAGES_PER_LAT_ITER;
            let base = cost::tcp_ns_per_message(msgs)?;
            let sim = cost::sim_ns_per_message(msgs)?;
            pair("cost", sim.message, base.message, 1);
            pair("empty_look", sim.empty_look, base.empty_look, 1);
        }
        if want(Group::Qps) {
            for (t, depth, posting, _) in QP_ROWS {
                // One QP before and after the 64 (their mean is the baseline): the host's
                // speed can change between two runs, and a baseline from one side only
                // put some pairs at 0.8 and others at 1.8 of each other. Taken again when the
                // two single-QP runs disagree (`bracketed`).
                let one = || multi_qp_write_bw(1, depth, 65536, cli.qp_gib << 30, posting);
                let many = || multi_qp_write_bw(64, depth, 65536, cli.qp_gib << 30, posting);
                let b = bracketed(one()?, many, one)?;
                pair(t, b.sim, b.base, b.tries);
            }
            // The same comparison for raw TCP with the same traffic: what 64 connections
            // cost the kernel, as against what they cost the sim.
            let one = || streams::write_bw(1, 16, 65536, cli.qp_gib << 30);
            let many = || streams::write_bw(64, 16, 65536, cli.qp_gib << 30);
            let b = bracketed(one()?, many, one)?;
            pair(TCP_QP_ROW, b.sim, b.base, b.tries);
        }
    }
    let busy = median(tcp_busy);
    let block = median(tcp_block);
    let bw = median(tcp_bw);
    rep.tcp_busy_one_way_us = busy;
    rep.tcp_block_one_way_us = block;
    rep.tcp_stream_mbps = bw;
    rep.tcp_stream_blocking_mbps = median(tcp_bw_modes.iter().map(|m| m.0));
    rep.tcp_stream_busy_mbps = median(tcp_bw_modes.iter().map(|m| m.1));
    rep.pairs = pairs.clone();
    let get = |k: &str| pairs.get(k).cloned().unwrap_or_default();
    // Median of the sim's figures, median of their baselines, median of the ratios.
    let m = |k: &str| median(get(k).iter().map(|p| p.sim));
    let mb = |k: &str| median(get(k).iter().map(|p| p.base));
    let ratios = |k: &str| get(k).iter().map(|p| p.sim / p.base).collect::<Figures>();
    let mut push = |test: &str,
                    measured: f64,
                    unit: &str,
                    key: &str,
                    base_desc: String,
                    max: Option<f64>,
                    min: Option<f64>| {
        let r = ratios(key);
        let ratio = r.median();
        let spread = (r.min(), r.max());
        let (pass, target) = match (max, min) {
            (Some(x), _) => (ratio <= x, format!("<= {x} x")),
            (_, Some(x)) => (ratio >= x, format!(">= {x} x")),
            _ => (true, String::new()),
        };
        rep.targets.push(Target {
            test: test.into(),
            measured: format!("{measured:.2} {unit}"),
            baseline: base_desc,
            ratio,
            pairs: match get(key).iter().map(|p| p.tries - 1).sum::<u32>() {
                0 => format!("{:.2}-{:.2}", spread.0, spread.1),
                again => format!("{:.2}-{:.2} ({again} again)", spread.0, spread.1),
            },
            target,
            pass,
        });
    };
    if want(Group::Lat) {
        for t in ["send_lat", "write_lat"] {
            let base = format!("TCP one-way {:.2} us", mb(t));
            push(t, m(t), "us", t, base, Some(1.3), None);
        }
        for t in ["read_lat", "atomic_lat"] {
            let base = format!("TCP round trip {:.2} us", mb(t));
            push(t, m(t), "us", t, base, Some(1.3), None);
        }
    }
    if want(Group::Bw) {
        for t in ["write_bw", "read_bw", "send_bw"] {
            let base = format!("TCP stream {:.0} MB/s", mb(t));
            push(&format!("{t} 1 MiB"), m(t), "MB/s", t, base, None, Some(0.8));
        }
    }
    if want(Group::Rate) {
        let t = "write_bw_64";
        push(
            "write_bw 64 B, tx depth 128",
            m(t),
            "M msgs/s",
            t,
            "1 M msgs/s".into(),
            None,
            Some(1.0),
        );
    }
    if want(Group::Rate) {
        push(
            &format!("write_bw 64 B, tx depth 16, 2000 WRITEs: slowest of {SHORT_RUNS} runs (no target)"),
            m(SHORT_ROW),
            "M msgs/s",
            SHORT_ROW,
            format!("their median {:.2} M msgs/s", mb(SHORT_ROW)),
            None,
            None,
        );
    }
    if want(Group::Peers) {
        for (peer, tests) in PEER_ROWS {
            for t in tests {
                let k = peer_key(t, peer);
                // The issue's target: one-way latency at or below UCX's and libfabric's.
                let max = (peer != Reference::UcxFetchAdd).then_some(1.0);
                let base = format!("{} {:.2} us", peer.name(), mb(&k));
                push(
                    &format!("{t} vs {}", peer.name()),
                    m(&k),
                    "us",
                    &k,
                    base,
                    max,
                    None,
                );
            }
        }
    }
    if want(Group::Cost) {
        let k = "cost";
        let own = median(get(k).iter().map(|p| p.sim - p.base));
        push(
            "CPU per message, one thread (post + poll)",
            m(k),
            &format!("ns (sim's own work {own:.0} ns)"),
            k,
            format!("TCP send + recv {:.0} ns", mb(k)),
            None,
            None,
        );
        let k = "empty_look";
        push(
            "Empty poll of a device with two connections, one thread",
            m(k),
            "ns",
            k,
            format!("two TCP recv finding nothing {:.0} ns", mb(k)),
            None,
            None,
        );
    }
    if want(Group::Qps) {
        for (t, depth, posting, min) in QP_ROWS {
            let how = match posting {
                Posting::Single => "",
                Posting::List => ", posted as lists",
            };
            push(
                &format!("64 QPs write_bw 64 KiB aggregate, {depth} outstanding per QP{how}"),
                m(t),
                "MB/s",
                t,
                format!("1 QP {:.0} MB/s, {depth} outstanding{how}", mb(t)),
                None,
                min,
            );
        }
        push(
            "raw TCP, 64 connections with the 64-QP row's traffic, aggregate",
            m(TCP_QP_ROW),
            "MB/s",
            TCP_QP_ROW,
            format!("1 connection {:.0} MB/s", mb(TCP_QP_ROW)),
            None,
            None,
        );
    }

    if want(Group::Load) {
        // A third thread that only spins, on these two cores.
        let spin_secs = 20.0;
        let mut spinner = Command::new(std::env::current_exe()?)
            .args(["spin", "--secs", &spin_secs.to_string()])
            .spawn()?;
        std::thread::sleep(Duration::from_millis(100));
        let loaded = perf1(&["send_lat", "-s", "8", "-n", &n]);
        let tcp_loaded: Figures = tcp_pingpong(&peer, cli.lat_iters, true)?.into_iter().collect();
        let _ = spinner.kill();
        let _ = spinner.wait();
        let loaded = loaded?;
        let tcp_p99 = tcp_loaded.percentile(99.0);
        rep.targets.push(Target {
            test: "send_lat p99 with a third spinning thread".into(),
            measured: format!("p99 {:.1} us (max {:.0} us)", loaded.t_p99_us, loaded.t_max_us),
            baseline: format!("TCP busy p99 {tcp_p99:.1} us"),
            ratio: loaded.t_p99_us / tcp_p99,
            pairs: String::new(),
            target: "p99 < 4000 us".into(),
            pass: loaded.t_p99_us < 4000.0,
        });
    }

    if cli.curves || cli.plot.is_some() {
        eprintln!("size curve");
        let lat = perf(&["write_lat".into(), "-a".into(), "-n".into(), "2000".into()])?;
        let bwr = perf(&["write_bw".into(), "-a".into(), "-n".into(), "2000".into()])?;
        for l in &lat {
            if let Some(b) = bwr.iter().find(|b| b.size == l.size) {
                rep.size_curve.push(SizePoint {
                    size: l.size,
                    write_lat_us: l.t_typical_us,
                    write_bw_mbps: b.bw_avg_mbps,
                });
            }
        }
        let mut q = 1;
        while q <= cli.max_qps {
            eprintln!("QP curve: {q} QPs");
            rep.qp_curve.push(QpPoint {
                qps: q,
                depth: curve_depth(q),
                write_lat_us: multi_qp_write_lat(q, 2000.max(q as u64 * 2))?,
                write_bw_64k_mbps: multi_qp_write_bw(q, curve_depth(q), 65536, 1 << 30, Posting::Single)?,
            });
            q *= 4;
        }
    }

    print_report(&rep);
    if let Some(p) = &cli.json {
        std::fs::write(p, serde_json::to_string_pretty(&rep)?)?;
    }
    if let Some(p) = &cli.plot {
        plot(&rep, p)?;
        eprintln!("plot written to {}", p.display());
    }
    if rep.targets.iter().any(|t| !t.pass) {
        println!("\nsome targets are not met (see above)");
    }
    Ok(())
}

fn date() -> String {
    Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn print_report(rep: &Report) {
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

/// A legend entry's sample: a short line in the series' colour.
fn swatch(
    color: plotters::style::RGBColor,
) -> impl Fn((i32, i32)) -> plotters::element::PathElement<(i32, i32)> {
    move |(x, y)| plotters::element::PathElement::new(vec![(x, y), (x + 20, y)], color)
}

fn plot(rep: &Report, path: &std::path::Path) -> Res<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1100, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let (left, right) = root.split_horizontally(550);
    let e = |e: DrawingAreaErrorKind<_>| anyhow!("plot: {e}");
    // Left: latency and bandwidth against message size.
    if !rep.size_curve.is_empty() {
        let max_lat = rep.size_curve.iter().map(|p| p.write_lat_us).fold(1.0, f64::max) * 1.2;
        let max_bw = rep.size_curve.iter().map(|p| p.write_bw_mbps).fold(1.0, f64::max) * 1.2;
        let sizes = (
            rep.size_curve[0].size,
            rep.size_curve.last().map_or(2, |p| p.size),
        );
        let mut c = ChartBuilder::on(&left)
            .caption("sim write_lat / write_bw vs message size", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .right_y_label_area_size(55)
            .build_cartesian_2d((sizes.0..sizes.1).log_scale(), (0.5..max_lat).log_scale())
            .map_err(e)?
            .set_secondary_coord((sizes.0..sizes.1).log_scale(), 0.0..max_bw);
        c.configure_mesh()
            .x_desc("bytes")
            .y_desc("write_lat typical (us)")
            .draw()
            .map_err(e)?;
        c.configure_secondary_axes()
            .y_desc("write_bw (MB/s)")
            .draw()
            .map_err(e)?;
        c.draw_series(LineSeries::new(
            rep.size_curve.iter().map(|p| (p.size, p.write_lat_us)),
            &BLUE,
        ))
        .map_err(e)?
        .label("write_lat (us, left)")
        .legend(swatch(BLUE));
        c.draw_secondary_series(LineSeries::new(
            rep.size_curve.iter().map(|p| (p.size, p.write_bw_mbps)),
            &RED,
        ))
        .map_err(e)?
        .label("write_bw (MB/s, right)")
        .legend(swatch(RED));
        c.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(e)?;
    }
    // Right: latency and aggregate bandwidth against the number of QPs.
    if !rep.qp_curve.is_empty() {
        let max_lat = rep.qp_curve.iter().map(|p| p.write_lat_us).fold(1.0, f64::max) * 1.3;
        let max_bw = rep
            .qp_curve
            .iter()
            .map(|p| p.write_bw_64k_mbps)
            .fold(1.0, f64::max)
            * 1.3;
        let qmax = rep.qp_curve.last().map_or(2, |p| p.qps as u32).max(2);
        let mut c = ChartBuilder::on(&right)
            .caption("sim vs number of QPs (one device)", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .right_y_label_area_size(55)
            .build_cartesian_2d((1u32..qmax).log_scale(), 0.0..max_lat)
            .map_err(e)?
            .set_secondary_coord((1u32..qmax).log_scale(), 0.0..max_bw);
        c.configure_mesh()
            .x_desc("QPs")
            .y_desc("8 B write latency (us)")
            .draw()
            .map_err(e)?;
        c.configure_secondary_axes()
            .y_desc("64 KiB write_bw aggregate (MB/s)")
            .draw()
            .map_err(e)?;
        c.draw_series(LineSeries::new(
            rep.qp_curve.iter().map(|p| (p.qps as u32, p.write_lat_us)),
            &BLUE,
        ))
        .map_err(e)?
        .label("latency (us, left)")
        .legend(swatch(BLUE));
        c.draw_secondary_series(LineSeries::new(
            rep.qp_curve.iter().map(|p| (p.qps as u32, p.write_bw_64k_mbps)),
            &RED,
        ))
        .map_err(e)?
        .label("bandwidth (MB/s, right)")
        .legend(swatch(RED));
        c.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerLeft)
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
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
