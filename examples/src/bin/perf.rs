//! perf: perftest-style latency and bandwidth over any verbs backend, so that the sim's
//! (or your HCA's) numbers sit beside `ib_send_lat`, `ib_write_bw` and friends.
//!
//! Tests: `send_lat`, `write_lat`, `read_lat`, `atomic_lat`, `send_bw`, `write_bw`,
//! `read_bw`, `atomic_bw`, with perftest's flags (`-s` size, `-n` iterations, `-a` all
//! sizes 2 B .. 8 MiB, `-t` TX depth, `-d` device, `-x` GID index, `-p` port, `-F`
//! accepted and ignored, `-A` atomic type, `-I` inline size, `-r` RX depth).
//!
//! Roles: `perf TEST --server` waits for one client on `-p` (what perftest does without an
//! address); `perf TEST HOST` is the client. Unlike perftest, `perf TEST` with neither
//! starts its own server as a child process on loopback and runs the client against it,
//! so one command is a complete run. The client sends its parameters to the server
//! (connection private data); the server must run the same test.
//!
//! How it measures (as perftest does):
//! - `send_lat`, `write_lat`: ping-pong; each side sends and waits for the other's
//!   message (`write_lat` polls the last byte of its receive buffer, like ib_write_lat);
//!   the reported latency is half the round trip.
//! - `read_lat`, `atomic_lat`: one operation outstanding; the time to its completion.
//! - `*_bw`: `-t` work requests kept outstanding, every `t/2`-th signaled (the send queue
//!   holds `t`), one post per batch; the clock is read once per polled batch of
//!   completions, never per message. BW average = bytes / elapsed; BW peak = the best
//!   rate over any window of at least a tenth of the run; MB = 2^20 bytes as in perftest.
//!   In `--json`, a BW test's `t_*` fields are the per-message times of those completion
//!   batches.
//!
//! Without `-n`, iterations are perftest's defaults (1000 for latency, 5000 for
//! bandwidth) reduced for large messages so that one size moves at most 512 MiB.

use std::io::Write as _;
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Parser, ValueEnum};
use examples::backend::open_device;
use examples::child::{announce_listening, ChildProc, Echo};
use examples::cli::CommonArgs;
use examples::conn::{self, QpOpts};
use examples::stats::Latencies;
use examples::wait::{check_wc, Waiter};
use examples::{with_backend, Res};
use serde::{Deserialize, Serialize};
use verbs_api::cm::Offer;
use verbs_api::{
    modify_to_init, AccessFlags, Backend, CompletionQueue, Context, MemoryRegion, ProtectionDomain,
    QueuePair, RecvWr, RemoteMr, SendFlags, SendWr, WcOpcode, WorkCompletion,
};

/// perftest-style RDMA latency and bandwidth tests.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "perf",
    version,
    after_help = "Examples:\n  perf write_bw -s 1048576          (starts its own server on loopback)\n  perf send_lat -a -n 200\n  perf read_lat --json\n  perf write_bw --server -p 18515   /   perf write_bw HOST -p 18515"
)]
struct Cli {
    /// The test.
    #[arg(value_enum)]
    test: Test,
    /// Server to connect to (host or host:port). Without it (and without --server), a
    /// server is started as a child process on loopback.
    address: Option<String>,
    /// Run as the server: wait for one client on -p (perftest's role without an address).
    #[arg(long)]
    server: bool,
    /// IP the server binds (with --server; loopback by default, 0.0.0.0 accepts other
    /// hosts).
    #[arg(long, default_value = "127.0.0.1")]
    bind: String,
    /// Connection-setup TCP port.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Message size in bytes (default: 2 for latency, 65536 for bandwidth; atomics: 8).
    #[arg(short = 's', long)]
    size: Option<u64>,
    /// Iterations per size (default: 1000 latency / 5000 bandwidth, fewer for big sizes).
    #[arg(short = 'n', long)]
    iters: Option<u64>,
    /// Run all sizes from 2 B to 8 MiB (powers of two).
    #[arg(short = 'a', long)]
    all: bool,
    /// Send-queue depth: work requests outstanding (default 128 for bandwidth, 1 for latency).
    #[arg(short = 't', long)]
    tx_depth: Option<u32>,
    /// Receive-queue depth for the send tests.
    #[arg(short = 'r', long, default_value_t = 512)]
    rx_depth: u32,
    /// Largest message sent inline (default 220 for latency, 0 for bandwidth; capped by
    /// the device).
    #[arg(short = 'I', long)]
    inline_size: Option<u32>,
    /// Atomic operation of atomic_lat / atomic_bw.
    #[arg(short = 'A', long, value_enum, default_value = "FETCH_AND_ADD")]
    atomic_type: AtomicType,
    /// Accepted for perftest compatibility and ignored (no CPU-frequency check needed:
    /// times come from the monotonic clock).
    #[arg(short = 'F', long)]
    cpu_freq: bool,
    /// One JSON object per size on stdout instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
enum Test {
    /// SEND ping-pong latency (ib_send_lat).
    SendLat,
    /// RDMA WRITE ping-pong latency (ib_write_lat).
    WriteLat,
    /// RDMA READ latency (ib_read_lat).
    ReadLat,
    /// Atomic latency (ib_atomic_lat).
    AtomicLat,
    /// SEND bandwidth (ib_send_bw).
    SendBw,
    /// RDMA WRITE bandwidth (ib_write_bw).
    WriteBw,
    /// RDMA READ bandwidth (ib_read_bw).
    ReadBw,
    /// Atomic bandwidth (ib_atomic_bw).
    AtomicBw,
}

impl Test {
    fn name(self) -> &'static str {
        match self {
            Test::SendLat => "send_lat",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::AtomicLat => "atomic_lat",
            Test::SendBw => "send_bw",
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::AtomicBw => "atomic_bw",
        }
    }
    fn is_lat(self) -> bool {
        matches!(
            self,
            Test::SendLat | Test::WriteLat | Test::ReadLat | Test::AtomicLat
        )
    }
    fn is_atomic(self) -> bool {
        matches!(self, Test::AtomicLat | Test::AtomicBw)
    }
    fn is_send(self) -> bool {
        matches!(self, Test::SendLat | Test::SendBw)
    }
    fn title(self, atomic: AtomicType) -> String {
        let verb = match self {
            Test::SendLat | Test::SendBw => "Send".to_string(),
            Test::WriteLat | Test::WriteBw => "RDMA_Write".to_string(),
            Test::ReadLat | Test::ReadBw => "RDMA_Read".to_string(),
            Test::AtomicLat | Test::AtomicBw => format!("Atomic {}", atomic.name()),
        };
        format!("{verb} {} Test", if self.is_lat() { "Latency" } else { "BW" })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
enum AtomicType {
    /// IBV_WR_ATOMIC_CMP_AND_SWP.
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
    /// IBV_WR_ATOMIC_FETCH_AND_ADD.
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
}

impl AtomicType {
    fn name(self) -> &'static str {
        match self {
            AtomicType::CmpAndSwap => "CMP_AND_SWAP",
            AtomicType::FetchAndAdd => "FETCH_AND_ADD",
        }
    }
}

/// The run's parameters, sent by the client to the server as connection private data.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Cfg {
    test: Test,
    /// (size, iterations) per row.
    rows: Vec<(u64, u64)>,
    tx_depth: u32,
    rx_depth: u32,
    inline: u32,
    atomic: AtomicType,
}

impl Cfg {
    fn max_size(&self) -> u64 {
        self.rows.iter().map(|r| r.0).max().unwrap_or(8).max(8)
    }
}

/// What the server answers on the side channel once it is ready.
#[derive(Serialize, Deserialize, Debug)]
enum Ready {
    Ok { addr: u64, rkey: u32, len: u64 },
    Err(String),
}

/// One result row (also the `--json` object).
#[derive(Serialize, Debug, Clone)]
#[allow(non_snake_case)]
struct Row {
    test: &'static str,
    backend: &'static str,
    device: String,
    size: u64,
    iters: u64,
    t_min_us: f64,
    t_max_us: f64,
    t_typical_us: f64,
    t_avg_us: f64,
    t_stdev_us: f64,
    t_p99_us: f64,
    t_p999_us: f64,
    bw_peak_MBps: f64,
    bw_avg_MBps: f64,
    msg_rate_Mpps: f64,
}

const MB: f64 = 1048576.0;
const LINE: &str = "---------------------------------------------------------------------------------------";

fn main() -> ExitCode {
    let cli = Cli::parse();
    examples::init_tracing();
    examples::report("perf", run(&cli))
}

fn run(cli: &Cli) -> Res<()> {
    let common = &cli.common;
    if cli.server {
        return with_backend!(common.backend, |b| server(b, cli));
    }
    let cfg = build_cfg(cli)?;
    match &cli.address {
        Some(a) => {
            let addr = if a.contains(':') && a.parse::<std::net::Ipv6Addr>().is_err() {
                a.clone()
            } else {
                format!("{a}:{}", cli.port)
            };
            with_backend!(common.backend, |b| client(b, cli, &cfg, &addr))
        }
        None => loopback(cli, &cfg),
    }
}

/// Sizes and iterations, perftest's defaults.
fn build_cfg(cli: &Cli) -> Res<Cfg> {
    let t = cli.test;
    let sizes: Vec<u64> = if t.is_atomic() {
        if cli.size.is_some_and(|s| s != 8) {
            eprintln!("perf: atomics are 8 bytes; ignoring -s");
        }
        vec![8]
    } else if cli.all {
        (1..=23).map(|e| 1u64 << e).collect()
    } else {
        vec![cli.size.unwrap_or(if t.is_lat() { 2 } else { 65536 })]
    };
    if sizes.iter().any(|&s| s == 0 || s > (1 << 30)) {
        bail!("-s must be between 1 and 1 GiB");
    }
    let rows = sizes
        .into_iter()
        .map(|s| {
            let n = match cli.iters {
                Some(n) => n.max(1),
                None => {
                    let base = if t.is_lat() { 1000 } else { 5000 };
                    base.min(((512u64 << 20) / s).max(16))
                }
            };
            (s, n)
        })
        .collect();
    let tx_depth = cli.tx_depth.unwrap_or(if t.is_lat() { 1 } else { 128 }).max(1);
    Ok(Cfg {
        test: t,
        rows,
        tx_depth,
        rx_depth: cli.rx_depth.max(2),
        inline: cli.inline_size.unwrap_or(if t.is_lat() { 220 } else { 0 }),
        atomic: cli.atomic_type,
    })
}

/// No address: a server child on loopback, the client here.
fn loopback(cli: &Cli, cfg: &Cfg) -> Res<()> {
    let mut args = cli.common.to_args();
    args.extend([cli.test.name().to_string(), "--server".into()]);
    args.extend(["--bind".into(), "127.0.0.1".into(), "-p".into(), "0".into()]);
    args.extend(["-r".into(), cfg.rx_depth.to_string()]);
    let echo = if cli.json { Echo::Stderr } else { Echo::Quiet };
    let mut child = ChildProc::spawn("perf-server", &args, echo)?;
    let addr = child.listen_addr(Duration::from_secs(20))?;
    let r = with_backend!(cli.common.backend, |b| client(b, cli, cfg, &addr.to_string()));
    match r {
        Ok(()) => child
            .wait_success(cli.common.wait() + Duration::from_secs(10))
            .context("the loopback server"),
        Err(e) => {
            let _ = child.wait(Duration::from_secs(2));
            for l in child.output() {
                eprintln!("[perf-server] {l}");
            }
            Err(e)
        }
    }
}

// ---------------------------------------------------------------------------------------
// shared by both sides

/// Everything one side of a test holds.
struct Side<B: Backend> {
    rc: conn::RcQp<B>,
    /// [receive area | send area], each `max` bytes.
    mr: B::Mr,
    max: usize,
    remote: RemoteMr,
    stream: TcpStream,
    timeout: Duration,
    cfg: Cfg,
    /// Receives posted (send tests).
    posted: u32,
    /// Sends posted but not yet completed (latency tests signal every send).
    sends_out: u32,
    inline: u32,
}

const RECV_ID: u64 = u64::MAX;

/// Posts `n` receives of `max` bytes, all into the start of `mr` (they may share it: the
/// contents do not matter).
fn post_recvs_on<Q: QueuePair, M: MemoryRegion>(qp: &Q, mr: &M, max: usize, n: u32) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    let sge = [mr.sge(0, max)?];
    // The latency loop posts one per message, between a completion and the next send:
    // build no more than that (the tool's own time is measured along with the device).
    if n == 1 {
        qp.post_recv(&[RecvWr::new(RECV_ID, &sge)])
            .context("posting receives")?;
        return Ok(());
    }
    // More in batches from a stack array (no heap allocation in a measured loop).
    let batch = [RecvWr::new(RECV_ID, &sge); 32];
    let mut left = n as usize;
    while left > 0 {
        let k = left.min(batch.len());
        qp.post_recv(&batch[..k]).context("posting receives")?;
        left -= k;
    }
    Ok(())
}

impl<B: Backend> Side<B> {
    fn send_json<T: Serialize>(&mut self, v: &T) -> Res<()> {
        examples::side_channel::send_msg(&mut self.stream, &serde_json::to_vec(v)?)
    }

    fn recv_json<T: for<'de> Deserialize<'de>>(&mut self) -> Res<T> {
        let m =
            examples::side_channel::recv_msg(&mut self.stream, self.timeout.max(Duration::from_secs(30)))?;
        serde_json::from_slice(&m)
            .with_context(|| format!("bad control message {:?}", String::from_utf8_lossy(&m)))
    }

    /// Posts `n` receives into the receive area.
    fn post_recvs(&mut self, n: u32) -> Res<()> {
        post_recvs_on(&self.rc.qp, &self.mr, self.max, n)?;
        self.posted += n;
        Ok(())
    }

    /// One signaled send-side WR of a ping-pong from the send area (inline when small).
    fn post_pingpong(&mut self, size: usize, write: bool) -> Res<()> {
        // Keep the send queue from filling with completions not yet reaped.
        if self.sends_out >= self.rc.cap.max_send_wr {
            self.wait_recv_or_send(false)?;
        }
        let sge = [self.mr.sge(self.max, size)?];
        let mut wr = if write {
            SendWr::write(1, &sge, self.remote.at(0))
        } else {
            SendWr::send(1, &sge)
        }
        .signaled();
        if size as u32 <= self.inline {
            wr.send_flags |= SendFlags::INLINE;
        }
        self.rc.qp.post_send(&[wr]).context("posting")?;
        self.sends_out += 1;
        Ok(())
    }

    /// Polls until a receive completes (`want_recv`) or a send completes; reaps send
    /// completions along the way.
    fn wait_recv_or_send(&mut self, want_recv: bool) -> Res<()> {
        let mut wcs = [WorkCompletion::default(); 8];
        let mut w = Waiter::new(self.timeout);
        loop {
            let n = self.rc.cq.poll(&mut wcs)?;
            let mut hit = false;
            for wc in &wcs[..n] {
                check_wc(wc, &|| format!("{} message", self.cfg.test.name()))?;
                if wc.opcode == WcOpcode::Recv {
                    self.posted -= 1;
                    hit |= want_recv;
                } else {
                    self.sends_out -= 1;
                    hit |= !want_recv;
                }
            }
            if hit {
                return Ok(());
            }
            if n == 0 {
                w.idle(&|| format!("the peer's {} message", self.cfg.test.name()))?;
            }
        }
    }

    /// Waits until the last byte of a `size`-byte message in the receive area is `v`,
    /// reaping send completions meanwhile (polling the CQ is also what drives a
    /// software HCA's progress on this thread).
    fn wait_byte(&mut self, size: usize, v: u8) -> Res<()> {
        let at = size - 1;
        let word = at & !7;
        let shift = at - word;
        let mut w = Waiter::new(self.timeout);
        let mut wcs = [WorkCompletion::default(); 8];
        loop {
            let x = self.mr.read_u64(word)?.to_ne_bytes()[shift];
            if x == v {
                return Ok(());
            }
            let n = self.rc.cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                check_wc(wc, &|| format!("{} message", self.cfg.test.name()))?;
                self.sends_out -= 1;
            }
            if self.mr.read_u64(word)?.to_ne_bytes()[shift] == v {
                return Ok(());
            }
            w.idle(&|| format!("the peer's RDMA WRITE (byte {at} to become {v})"))?;
        }
    }

    /// Reaps the remaining send completions (end of a latency row).
    fn drain_sends(&mut self) -> Res<()> {
        while self.sends_out > 0 {
            self.wait_recv_or_send(false)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// server

fn server<B: Backend>(b: &B, cli: &Cli) -> Res<()> {
    let common = &cli.common;
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    let rx = cli.rx_depth.max(2);
    let rc = conn::create_rc::<B>(&ctx, &pd, &QpOpts::new(16, rx).inline(220))?;
    let acceptor = conn::Acceptor::start(
        conn::listen(&format!("{}:{}", cli.bind, cli.port))?,
        common.wait(),
    )?;
    announce_listening(acceptor.local_addr());
    println!(
        "perf server: {} on {} ({}), waiting for a client",
        cli.test.name(),
        ctx.name(),
        b.name()
    );
    let params = common.rc_params();
    let mut peer = acceptor.accept(
        &ctx,
        &rc.qp,
        |_| Ok(()),
        &params,
        Offer::new(),
        Duration::from_secs(120),
    )?;
    let cfg: Cfg = match serde_json::from_slice(&peer.private_data) {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("the client sent unreadable parameters: {e}");
            let _ = examples::side_channel::send_msg(
                &mut peer.stream,
                &serde_json::to_vec(&Ready::Err(msg.clone()))?,
            );
            bail!("{msg}");
        }
    };
    if cfg.test != cli.test {
        let msg = format!(
            "the client runs {} but this server runs {}: start both with the same test",
            cfg.test.name(),
            cli.test.name()
        );
        let _ = examples::side_channel::send_msg(
            &mut peer.stream,
            &serde_json::to_vec(&Ready::Err(msg.clone()))?,
        );
        bail!("{msg}");
    }
    let Some(&client_mr) = peer.mrs.first() else {
        bail!("the client published no memory region")
    };
    let max = cfg.max_size() as usize;
    let mr = pd
        .reg_mr(2 * max, AccessFlags::ALL)
        .with_context(|| format!("registering {} bytes", 2 * max))?;
    let inline = cfg.inline.min(rc.cap.max_inline_data);
    let mut side = Side::<B> {
        rc,
        mr,
        max,
        remote: client_mr,
        stream: peer.stream,
        timeout: common.wait(),
        cfg: cfg.clone(),
        posted: 0,
        sends_out: 0,
        inline,
    };
    if cfg.test.is_send() {
        let n = if cfg.test == Test::SendBw { rx } else { rx.min(16) };
        side.post_recvs(n)?;
    }
    let r = side.mr.remote();
    side.send_json(&Ready::Ok {
        addr: r.addr,
        rkey: r.rkey,
        len: r.len,
    })?;
    for &(size, iters) in &cfg.rows {
        let (s, n): (u64, u64) = side.recv_json()?;
        if (s, n) != (size, iters) {
            bail!("the client asked for size {s} x {n}, expected {size} x {iters}");
        }
        side.mr.fill(0);
        side.send_json(&"go")?;
        let size = size as usize;
        match cfg.test {
            Test::SendLat => {
                for _ in 0..iters {
                    side.wait_recv_or_send(true)?;
                    side.post_recvs(1)?;
                    side.post_pingpong(size, false)?;
                }
                side.drain_sends()?;
            }
            Test::WriteLat => {
                for i in 0..iters {
                    let v = (i % 255) as u8 + 1;
                    side.wait_byte(size, v)?;
                    side.mr.write(max + size - 1, &[v])?;
                    side.post_pingpong(size, true)?;
                }
                side.drain_sends()?;
            }
            Test::SendBw => {
                // Keep receives posted: re-post what each poll consumed.
                let mut got = 0u64;
                let mut wcs = [WorkCompletion::default(); 64];
                let mut w = Waiter::new(side.timeout);
                while got < iters {
                    let k = side.rc.cq.poll(&mut wcs)?;
                    if k == 0 {
                        w.idle(&|| format!("SENDs ({got} of {iters} received)"))?;
                        continue;
                    }
                    w.progress();
                    for wc in &wcs[..k] {
                        check_wc(wc, &|| "a receive".to_string())?;
                    }
                    got += k as u64;
                    side.posted -= k as u32;
                    side.post_recvs(k as u32)?;
                }
            }
            Test::ReadLat | Test::AtomicLat | Test::WriteBw | Test::ReadBw | Test::AtomicBw => {}
        }
        // The client says when its row is done (one-sided tests need nothing from here).
        let done: String = side.recv_json()?;
        if done != "done" {
            bail!("unexpected control message {done:?}");
        }
        side.send_json(&"ok")?;
    }
    println!("perf server: done ({} rows)", cfg.rows.len());
    Ok(())
}

// ---------------------------------------------------------------------------------------
// client

fn client<B: Backend>(b: &B, cli: &Cli, cfg: &Cfg, addr: &str) -> Res<()> {
    let common = &cli.common;
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    let max = cfg.max_size() as usize;
    let mr = pd
        .reg_mr(2 * max, AccessFlags::ALL)
        .with_context(|| format!("registering {} bytes", 2 * max))?;
    let test = cfg.test;
    let send_wr = if test.is_lat() { 16 } else { cfg.tx_depth };
    let recv_wr = if test.is_send() { 16 } else { 1 };
    let rc = conn::create_rc::<B>(&ctx, &pd, &QpOpts::new(send_wr, recv_wr).inline(cfg.inline))?;
    if rc.cap.max_send_wr < cfg.tx_depth {
        bail!(
            "the device grants {} send WRs, less than -t {}",
            rc.cap.max_send_wr,
            cfg.tx_depth
        );
    }
    let params = common.rc_params();
    let mut posted = 0;
    if test == Test::SendLat {
        // Receives first: the server's first reply may come right after the connection.
        modify_to_init(&rc.qp, &params)?;
        post_recvs_on(&rc.qp, &mr, max, 16)?;
        posted = 16;
    }
    let offer = Offer::new()
        .mr(mr.remote())
        .private_data(serde_json::to_vec(cfg)?);
    let peer = conn::connect(
        addr,
        &ctx,
        &rc.qp,
        &params,
        offer,
        common.wait().max(Duration::from_secs(10)),
    )?;
    let inline = cfg.inline.min(rc.cap.max_inline_data);
    let mut side = Side::<B> {
        rc,
        mr,
        max,
        remote: RemoteMr::default(),
        stream: peer.stream,
        timeout: common.wait(),
        cfg: cfg.clone(),
        posted,
        sends_out: 0,
        inline,
    };
    match side.recv_json::<Ready>()? {
        Ready::Ok { addr, rkey, len } => side.remote = RemoteMr { addr, rkey, len },
        Ready::Err(e) => bail!("the server refused: {e}"),
    }
    if !cli.json {
        header::<B>(cli, cfg, &ctx, &side, &peer.endpoint)?;
    }
    let mut rows = Vec::new();
    for &(size, iters) in &cfg.rows {
        side.mr.fill(0);
        side.send_json(&(size, iters))?;
        let go: String = side.recv_json()?;
        if go != "go" {
            bail!("unexpected control message {go:?}");
        }
        let row = if test.is_lat() {
            let lat = run_lat(&mut side, size as usize, iters)?;
            lat_row(cli, &ctx, size, iters, &lat)
        } else {
            let (elapsed, samples) = run_bw(&mut side, size as usize, iters)?;
            bw_row(cli, &ctx, size, iters, elapsed, &samples)
        };
        side.send_json(&"done")?;
        let ok: String = side.recv_json()?;
        if ok != "ok" {
            bail!("unexpected control message {ok:?}");
        }
        print_row(cli, &row)?;
        rows.push(row);
    }
    if !cli.json {
        println!("{LINE}");
    }
    Ok(())
}

/// One row of a latency test; samples in the units perftest reports.
fn run_lat<B: Backend>(side: &mut Side<B>, size: usize, iters: u64) -> Res<Latencies> {
    let mut lat = Latencies::with_capacity(iters as usize);
    let max = side.max;
    match side.cfg.test {
        Test::SendLat => {
            for _ in 0..iters {
                let t0 = Instant::now();
                side.post_pingpong(size, false)?;
                side.wait_recv_or_send(true)?;
                lat.record(t0.elapsed());
                side.post_recvs(1)?;
            }
            side.drain_sends()?;
            Ok(lat.scaled(2))
        }
        Test::WriteLat => {
            for i in 0..iters {
                let v = (i % 255) as u8 + 1;
                let t0 = Instant::now();
                side.mr.write(max + size - 1, &[v])?;
                side.post_pingpong(size, true)?;
                side.wait_byte(size, v)?;
                lat.record(t0.elapsed());
            }
            side.drain_sends()?;
            Ok(lat.scaled(2))
        }
        Test::ReadLat | Test::AtomicLat => {
            let sge_read = [side.mr.sge(0, size)?];
            let sge_atomic = [side.mr.sge(0, 8)?];
            let mut wc = [WorkCompletion::default()];
            for i in 0..iters {
                let wr = match (side.cfg.test, side.cfg.atomic) {
                    (Test::ReadLat, _) => SendWr::read(i, &sge_read, side.remote.at(0)),
                    (_, AtomicType::FetchAndAdd) => {
                        SendWr::fetch_and_add(i, &sge_atomic, side.remote.at(0), 1)
                    }
                    (_, AtomicType::CmpAndSwap) => {
                        SendWr::cmp_and_swp(i, &sge_atomic, side.remote.at(0), i, i + 1)
                    }
                }
                .signaled();
                let t0 = Instant::now();
                side.rc.qp.post_send(&[wr]).context("posting")?;
                let mut w = Waiter::new(side.timeout);
                while side.rc.cq.poll(&mut wc)? == 0 {
                    w.idle(&|| format!("{} completion {i}", side.cfg.test.name()))?;
                }
                lat.record(t0.elapsed());
                check_wc(&wc[0], &|| format!("{} {i}", side.cfg.test.name()))?;
            }
            Ok(lat)
        }
        t => bail!("{} is not a latency test", t.name()),
    }
}

/// Every how many WRs a bandwidth test asks for a completion: half the send queue, but
/// at least every 16 MiB, so that a slow device still reports progress within the
/// timeout.
fn signal_every(depth: u64, size: u64) -> u64 {
    (depth / 2).min((16u64 << 20) / size.max(1)).max(1)
}

/// One row of a bandwidth test: elapsed time and (time, messages completed) samples, one
/// per polled batch of completions.
fn run_bw<B: Backend>(side: &mut Side<B>, size: usize, iters: u64) -> Res<(Duration, Vec<(Duration, u64)>)> {
    let cfg = &side.cfg;
    let depth = cfg.tx_depth as u64;
    let sig = signal_every(depth, size as u64);
    let sge = [side.mr.sge(side.max, size)?];
    let sge8 = [side.mr.sge(side.max, 8)?];
    let remote = side.remote.at(0);
    let mut template = match (cfg.test, cfg.atomic) {
        (Test::SendBw, _) => SendWr::send(0, &sge),
        (Test::WriteBw, _) => SendWr::write(0, &sge, remote),
        (Test::ReadBw, _) => SendWr::read(0, &sge, remote),
        (_, AtomicType::FetchAndAdd) => SendWr::fetch_and_add(0, &sge8, remote, 1),
        (_, AtomicType::CmpAndSwap) => SendWr::cmp_and_swp(0, &sge8, remote, 0, 0),
    };
    if size as u32 <= side.inline && matches!(cfg.test, Test::SendBw | Test::WriteBw) {
        template.send_flags |= SendFlags::INLINE;
    }
    let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(depth as usize);
    let mut wcs = [WorkCompletion::default(); 32];
    let mut samples: Vec<(Duration, u64)> = Vec::with_capacity((iters / sig + 2) as usize);
    let (mut posted, mut completed) = (0u64, 0u64);
    let mut w = Waiter::busy(side.timeout);
    let start = Instant::now();
    while completed < iters {
        let room = depth - (posted - completed);
        let k = room.min(iters - posted);
        if k > 0 {
            wrs.clear();
            for i in posted..posted + k {
                let mut wr = template;
                wr.wr_id = i;
                if (i + 1) % sig == 0 || i + 1 == iters {
                    wr.send_flags |= SendFlags::SIGNALED;
                }
                wrs.push(wr);
            }
            side.rc.qp.post_send(&wrs).context("posting")?;
            posted += k;
        }
        let n = side.rc.cq.poll(&mut wcs)?;
        if n == 0 {
            w.idle(&|| format!("completions ({completed} of {iters} done, {} posted)", posted))?;
            continue;
        }
        w.progress();
        for wc in &wcs[..n] {
            check_wc(wc, &|| format!("{} message", cfg.test.name()))?;
            completed = completed.max(wc.wr_id + 1);
        }
        samples.push((start.elapsed(), completed));
    }
    Ok((start.elapsed(), samples))
}

// ---------------------------------------------------------------------------------------
// output

fn header<B: Backend>(
    cli: &Cli,
    cfg: &Cfg,
    ctx: &B::Context,
    side: &Side<B>,
    remote: &verbs_api::Endpoint,
) -> Res<()> {
    let port = ctx.query_port(1)?;
    let caps = ctx.capabilities()?;
    let link = match caps.link_layer {
        verbs_api::LinkLayer::Ethernet => "Ethernet",
        _ => "IB",
    };
    let qa = side.rc.qp.query()?;
    println!("{LINE}");
    println!("{:^87}", cfg.test.title(cfg.atomic));
    println!(" Dual-port       : OFF\t\tDevice         : {}", ctx.name());
    println!(" Number of qps   : 1\t\tTransport type : IB");
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    println!(" Backend         : {}", cli.common.backend.as_str());
    if cfg.test.is_lat() {
        println!(" TX depth        : 1");
    } else {
        println!(" TX depth        : {}", cfg.tx_depth);
        println!(
            " CQ Moderation   : {}",
            signal_every(cfg.tx_depth as u64, cfg.rows.first().map_or(8, |r| r.0))
        );
    }
    match cfg.test {
        Test::SendLat => println!(" RX depth        : 16"),
        Test::SendBw => println!(" RX depth        : {}", cfg.rx_depth),
        _ => {}
    }
    println!(" Mtu             : {}[B]", qa.path_mtu.bytes());
    println!(" Link type       : {link}");
    if cfg.test.is_send() || matches!(cfg.test, Test::WriteLat | Test::WriteBw) {
        println!(" Max inline data : {}[B]", side.inline);
    }
    println!(" rdma_cm QPs\t : OFF");
    println!(" Data ex. method : Ethernet");
    println!("{LINE}");
    println!(
        " local address: LID 0x{:04x} QPN 0x{:04x} PSN 0x{:06x} RKey 0x{:06x} VAddr 0x{:016x}",
        port.lid,
        side.rc.qp.qp_num(),
        qa.sq_psn,
        side.mr.rkey(),
        side.mr.addr()
    );
    println!(
        " remote address: LID 0x{:04x} QPN 0x{:04x} PSN 0x{:06x} RKey 0x{:06x} VAddr 0x{:016x}",
        remote.lid, remote.qpn, remote.psn, side.remote.rkey, side.remote.addr
    );
    println!("{LINE}");
    if cfg.test.is_lat() {
        println!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
        );
    } else {
        println!(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]");
    }
    Ok(())
}

fn lat_row<C: Context>(cli: &Cli, ctx: &C, size: u64, iters: u64, lat: &Latencies) -> Row {
    let s = lat.summary();
    let bw = if s.avg_us > 0.0 {
        size as f64 / (s.avg_us * 1e-6) / MB
    } else {
        0.0
    };
    Row {
        test: cli.test.name(),
        backend: cli.common.backend.as_str(),
        device: ctx.name().to_string(),
        size,
        iters,
        t_min_us: s.min_us,
        t_max_us: s.max_us,
        t_typical_us: s.p50_us,
        t_avg_us: s.avg_us,
        t_stdev_us: s.stdev_us,
        t_p99_us: s.p99_us,
        t_p999_us: s.p999_us,
        bw_peak_MBps: bw,
        bw_avg_MBps: bw,
        msg_rate_Mpps: if s.avg_us > 0.0 { 1.0 / s.avg_us } else { 0.0 },
    }
}

fn bw_row<C: Context>(
    cli: &Cli,
    ctx: &C,
    size: u64,
    iters: u64,
    elapsed: Duration,
    samples: &[(Duration, u64)],
) -> Row {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let avg = (size * iters) as f64 / secs / MB;
    // Peak: the best rate over any window of at least a tenth of the messages.
    let min_msgs = (iters / 10).max(1);
    let pts: Vec<(f64, u64)> = std::iter::once((0.0, 0))
        .chain(samples.iter().map(|&(t, c)| (t.as_secs_f64(), c)))
        .collect();
    let mut peak = avg;
    let mut i = 0;
    for j in 1..pts.len() {
        while i + 1 < j && pts[j].1 - pts[i + 1].1 >= min_msgs {
            i += 1;
        }
        let (dt, dm) = (pts[j].0 - pts[i].0, pts[j].1 - pts[i].1);
        if dm >= min_msgs && dt > 0.0 {
            peak = peak.max((dm * size) as f64 / dt / MB);
        }
    }
    // Per-message time of each completion batch (ns), for the t_* fields.
    let mut lat = Latencies::default();
    for w in pts.windows(2).filter(|w| w[1].1 > w[0].1) {
        lat.record_ns(((w[1].0 - w[0].0) * 1e9 / (w[1].1 - w[0].1) as f64) as u64);
    }
    let s = lat.summary();
    Row {
        test: cli.test.name(),
        backend: cli.common.backend.as_str(),
        device: ctx.name().to_string(),
        size,
        iters,
        t_min_us: s.min_us,
        t_max_us: s.max_us,
        t_typical_us: s.p50_us,
        t_avg_us: secs * 1e6 / iters as f64,
        t_stdev_us: s.stdev_us,
        t_p99_us: s.p99_us,
        t_p999_us: s.p999_us,
        bw_peak_MBps: peak,
        bw_avg_MBps: avg,
        msg_rate_Mpps: iters as f64 / secs / 1e6,
    }
}

fn print_row(cli: &Cli, r: &Row) -> Res<()> {
    let mut out = std::io::stdout().lock();
    if cli.json {
        writeln!(out, "{}", serde_json::to_string(r)?)?;
    } else if cli.test.is_lat() {
        writeln!(
            out,
            " {:<6} {:<14} {:<14.2} {:<12.2} {:<18.2} {:<14.2} {:<15.2} {:<22.2} {:<.2}",
            r.size,
            r.iters,
            r.t_min_us,
            r.t_max_us,
            r.t_typical_us,
            r.t_avg_us,
            r.t_stdev_us,
            r.t_p99_us,
            r.t_p999_us
        )?;
    } else {
        writeln!(
            out,
            " {:<10} {:<14} {:<18.2} {:<20.2} {:.6}",
            r.size, r.iters, r.bw_peak_MBps, r.bw_avg_MBps, r.msg_rate_Mpps
        )?;
    }
    out.flush()?;
    Ok(())
}
