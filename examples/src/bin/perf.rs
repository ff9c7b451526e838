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
//!
//! `-c UC|UD` runs over another transport (perftest's connection types: UC for the
//! SEND and WRITE tests, UD for the SEND tests, datagrams of at most the port's MTU, the
//! 40-byte GRH in front of each receive), and `--use_srq` takes the SEND tests' receives
//! from a shared receive queue; both ends need the same. UC and UD retransmit nothing,
//! so a SEND bandwidth row over them is counted at the receiver: it takes what arrives
//! until the sender says it is done, and the row's rates are the receiver's (from its
//! first message to its last), with the messages sent and never received reported
//! apart.
//!
//! `--mw` (on both ends; READ, WRITE and atomic tests over RC) reaches each side's memory
//! through a type 2 memory window bound over it instead of its region's rkey, and then
//! reports how fast the client binds (and invalidates) a type 2 window through its send
//! queue (`examples::perftest::mw`).
//!
//! `--perftest` (on both ends) swaps these loops for perftest's own
//! (`examples::perftest::loops`), stamped with the cycle counter and reduced with
//! perftest's arithmetic, for side-by-side runs with `ib_*` on one device.
//!
//! This file holds the connection setup and the measurement loops of both ends; the
//! command line, the run's parameters, a side's ping-pong primitives and perftest's
//! output are in `examples::perftest`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use examples::backend::open_device;
use examples::child::{announce_listening, ChildProc, Echo};
use examples::conn::{self, QpOpts};
use examples::demo::ChildArgs;
use examples::perftest::opts::{AtomicType, Connection, PerfCli, Test};
use examples::perftest::params::{perftest_inline, perftest_rc_params, Cfg, Ready};
use examples::perftest::report::{
    bw_row, bw_row_perftest, bw_row_received, lat_row, lat_row_perftest, print_header, print_row, Received,
    Row, LINE,
};
use examples::perftest::side::{post_recvs_on, to_peer, Side, UdPeer};
use examples::perftest::{clock, cycle_stats, loops, mw};
use examples::stats::Latencies;
use examples::stats::{per_sec, si};
use examples::transport::Typed;
use examples::wait::{check_wc, Waiter};
use examples::{side_channel, with_backend, Res};
use verbs_api::cm::Offer;
use verbs_api::{
    ah_attr_for, modify_to_init, Backend, CompletionQueue, Context, MemoryRegion, ProtectionDomain,
    QueuePair, RcParams, RemoteMr, SendFlags, SendWr, SrqAttr, WorkCompletion,
};

fn main() -> ExitCode {
    examples::program::main("perf", |cli: PerfCli| run(&cli))
}

fn run(cli: &PerfCli) -> Res<()> {
    let common = &cli.common;
    if cli.server {
        return with_backend!(common, |b| server(b, cli));
    }
    let cfg = Cfg::from_cli(cli)?;
    match &cli.address {
        Some(a) => {
            let addr = if a.contains(':') && a.parse::<std::net::Ipv6Addr>().is_err() {
                a.clone()
            } else {
                format!("{a}:{}", cli.port)
            };
            with_backend!(common, |b| client(b, cli, &cfg, &addr))
        }
        None => loopback(cli, &cfg),
    }
}

/// No address: a server child on loopback, the client here.
fn loopback(cli: &PerfCli, cfg: &Cfg) -> Res<()> {
    let args = ChildArgs::new(&cli.common, cli.test.name())
        .flag("--server", true)
        .flag("--perftest", cli.perftest)
        .opt("-c", cli.connection.name())
        .flag("--use_srq", cli.use_srq)
        .flag("--mw", cli.mw)
        .opt("-u", cli.qp_timeout)
        .opt("--bind", "127.0.0.1")
        .opt("-p", 0)
        .opt("-r", cfg.rx_depth);
    let echo = if cli.json { Echo::Stderr } else { Echo::Quiet };
    let mut child = ChildProc::spawn("perf-server", args.as_slice(), echo)?;
    let addr = child.listen_addr(Duration::from_secs(20))?;
    let r = with_backend!(cli.common, |b| client(b, cli, cfg, &addr.to_string()));
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
// server

fn server<B: Backend>(b: &B, cli: &PerfCli) -> Res<()> {
    let common = &cli.common;
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    let rx = cli.rx_depth.max(2);
    if let Some(why) = cli.connection.refuses(cli.test) {
        bail!("{why}");
    }
    let made = create_qp::<B>(&ctx, &pd, &QpOpts::new(16, rx).inline(236), cli)?;
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
    let params = rc_params::<B>(&ctx, cli)?;
    let mut peer = acceptor.accept(
        &ctx,
        &Typed::new(&made.rc.qp),
        |_| Ok(()),
        &params,
        Offer::new(),
        Duration::from_secs(120),
    )?;
    // A refusal is told to the client too.
    let mut refuse = |msg: String| -> Res<()> {
        let _ = side_channel::send_msg(&mut peer.stream, &serde_json::to_vec(&Ready::Err(msg.clone()))?);
        bail!("{msg}")
    };
    let cfg: Cfg = match serde_json::from_slice(&peer.private_data) {
        Ok(c) => c,
        Err(e) => return refuse(format!("the client sent unreadable parameters: {e}")),
    };
    if cfg.test != cli.test {
        return refuse(format!(
            "the client runs {} but this server runs {}: start both with the same test",
            cfg.test.name(),
            cli.test.name()
        ));
    }
    if (cfg.connection, cfg.use_srq) != (cli.connection, cli.use_srq) {
        let srq = |on| if on { " --use_srq" } else { "" };
        return refuse(format!(
            "the client runs -c {}{} but this server -c {}{}: start both alike",
            cfg.connection.name(),
            srq(cfg.use_srq),
            cli.connection.name(),
            srq(cli.use_srq)
        ));
    }
    if cfg.perftest != cli.perftest {
        return refuse(
            if cfg.perftest {
                "the client runs with --perftest but this server without it: start both alike"
            } else {
                "the client runs without --perftest but this server with it: start both alike"
            }
            .to_string(),
        );
    }
    let Some(&client_mr) = peer.mrs.first() else {
        bail!("the client published no memory region")
    };
    if cfg.mw != cli.mw {
        return refuse("one side runs with --mw and the other without: start both alike".to_string());
    }
    let max = cfg.area_size();
    let mr = pd
        .reg_mr(2 * max, mw::region_access(cfg.mw))
        .with_context(|| format!("registering {} bytes", 2 * max))?;
    let ud = ud_peer::<B>(&pd, cli, &params, &peer.endpoint)?;
    let Made { rc, recv_cq, srq } = made;
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
        mhz: 0.0,
        spin_limit: 0,
        srq,
        ud,
    };
    if cfg.perftest {
        side.mhz = clock::cpu_mhz();
        side.spin_limit = (side.timeout.as_secs_f64() * 1e6 * side.mhz) as u64;
    }
    if cfg.test.is_send() {
        let n = if cfg.test == Test::SendBw { rx } else { rx.min(16) };
        side.post_recvs(n)?;
    }
    let window = match cfg.mw {
        true => {
            let w = mw::Window::<B>::alloc(&pd)?;
            w.bind(&side.rc.qp, &side.rc.cq, &side.mr, side.timeout)?;
            Some(w)
        }
        false => None,
    };
    let r = match &window {
        Some(w) => w.remote(side.mr.remote()),
        None => side.mr.remote(),
    };
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
        if cfg.counts_at_receiver() {
            // Nothing to wait for but the sender's word: what was dropped never comes.
            let got = receive_counting(&mut side, recv_cq.as_ref())?;
            side.send_json(&got)?;
            continue;
        }
        if cfg.perftest {
            serve_row_perftest(&mut side, recv_cq.as_ref(), size as usize, iters)?;
        } else {
            serve_row(&mut side, size as usize, iters)?;
        }
        // The client says when its row is done (one-sided tests need nothing from here).
        side.expect("done")?;
        side.send_json(&"ok")?;
    }
    println!("perf server: done ({} rows)", cfg.rows.len());
    Ok(())
}

/// The connection's attributes: the common ones, or under `--perftest` perftest's.
fn rc_params<B: Backend>(ctx: &B::Context, cli: &PerfCli) -> Res<RcParams> {
    let base = RcParams {
        timeout: cli.qp_timeout,
        ..cli.common.rc_params()
    };
    Ok(if cli.perftest {
        perftest_rc_params(base, cli.test, &ctx.capabilities()?)
    } else {
        base
    })
}

/// A side's QP (of `-c`'s type), its CQ, its receive CQ where it has one, its SRQ.
struct Made<B: Backend> {
    rc: conn::RcQp<B>,
    recv_cq: Option<B::Cq>,
    srq: Option<B::Srq>,
}

/// A QP of `-c`'s type with a CQ for both queues, or under `--perftest` for a SEND test
/// (as perftest does) a send CQ and a receive CQ; with `--use_srq`, on an SRQ of
/// `opts.recv_wr` receives.
fn create_qp<B: Backend>(ctx: &B::Context, pd: &B::Pd, opts: &QpOpts, cli: &PerfCli) -> Res<Made<B>> {
    let srq = if cli.use_srq {
        let attr = SrqAttr::new(opts.recv_wr, 1);
        Some(
            pd.create_srq(&attr)
                .context("creating the shared receive queue")?,
        )
    } else {
        None
    };
    let qp_type = cli.connection.qp_type();
    let split = cli.perftest && cli.test.is_send();
    let cqe = if split { opts.send_wr } else { opts.cqe() };
    let cq = ctx
        .create_cq(cqe, None)
        .with_context(|| format!("creating a CQ of {cqe} entries"))?;
    let recv_cq = if split {
        Some(
            ctx.create_cq(opts.recv_wr, None)
                .with_context(|| format!("creating a receive CQ of {} entries", opts.recv_wr))?,
        )
    } else {
        None
    };
    let cqs = (&cq, recv_cq.as_ref().unwrap_or(&cq));
    let (qp, cap) = conn::create_qp_of::<B>(ctx, pd, cqs, opts, qp_type, srq.as_ref())?;
    Ok(Made {
        rc: conn::RcQp { cq, qp, cap },
        recv_cq,
        srq,
    })
}

/// On UD, the peer's address: an address handle from its endpoint, and its QP.
fn ud_peer<B: Backend>(
    pd: &B::Pd,
    cli: &PerfCli,
    params: &RcParams,
    peer: &verbs_api::Endpoint,
) -> Res<Option<UdPeer<B>>> {
    if cli.connection != Connection::Ud {
        return Ok(None);
    }
    let ah = pd
        .create_ah(&ah_attr_for(peer, params))
        .context("creating an address handle for the peer")?;
    Ok(Some(UdPeer {
        ah: Arc::new(ah),
        qpn: peer.qpn,
    }))
}

/// How long the receiver of a row over UC or UD goes on taking messages after the
/// sender said it is done (those still on their way).
const STRAGGLERS: Duration = Duration::from_millis(100);

/// The receiver of a SEND bandwidth row over UC or UD: takes what arrives (from
/// `recv_cq`, or the QP's one CQ), re-posting a receive for each, until the sender says
/// it is done and nothing has come for [`STRAGGLERS`]; counts them, and times the first
/// to the last (one clock reading per batch polled). The side channel is looked at only
/// when a poll found nothing, at most once a millisecond.
fn receive_counting<B: Backend>(side: &mut Side<B>, recv_cq: Option<&B::Cq>) -> Res<Received> {
    let mut wcs = [WorkCompletion::default(); 64];
    let (mut got, mut first, mut last) = (0u64, None::<Instant>, Instant::now());
    let (mut done_at, mut looked) = (None::<Instant>, Instant::now());
    let mut w = Waiter::new(side.timeout);
    loop {
        let cq = recv_cq.unwrap_or(&side.rc.cq);
        let k = cq.poll(&mut wcs)?;
        if k > 0 {
            last = Instant::now();
            first.get_or_insert(last);
            for wc in &wcs[..k] {
                check_wc(wc, &|| "a receive".to_string())?;
            }
            got += k as u64;
            side.posted -= k as u32;
            side.post_recvs(k as u32)?;
            w.progress();
            continue;
        }
        let now = Instant::now();
        match done_at {
            Some(t) if now - t >= STRAGGLERS => break,
            Some(_) => {}
            None if now - looked >= Duration::from_millis(1) => {
                looked = now;
                if side_channel::readable(&side.stream)? {
                    side.expect("done")?;
                    done_at = Some(now);
                    w.progress();
                }
            }
            None => {}
        }
        w.idle(&|| format!("SENDs ({got} received so far)"))?;
    }
    let span = first.map_or(Duration::ZERO, |f| last - f);
    Ok(Received {
        received: got,
        span_ns: span.as_nanos() as u64,
    })
}

/// The receive CQ of a `--perftest` SEND test.
fn recv_cq_of<B: Backend>(recv_cq: Option<&B::Cq>) -> Res<&B::Cq> {
    recv_cq.context("a --perftest SEND test has a receive CQ of its own")
}

/// The server's part of one `--perftest` row: perftest's loops.
fn serve_row_perftest<B: Backend>(
    side: &mut Side<B>,
    recv_cq: Option<&B::Cq>,
    size: usize,
    iters: u64,
) -> Res<()> {
    match side.cfg.test {
        Test::SendLat => {
            loops::send_lat(side, recv_cq_of::<B>(recv_cq)?, size, iters, false)?;
        }
        Test::WriteLat => {
            loops::write_lat(side, size, iters, false)?;
        }
        Test::SendBw => loops::send_bw_server(side, recv_cq_of::<B>(recv_cq)?, iters)?,
        Test::ReadLat | Test::AtomicLat | Test::WriteBw | Test::ReadBw | Test::AtomicBw => {}
    }
    Ok(())
}

/// The server's part of one row: answer the ping-pongs, or keep receives posted for
/// SENDs (the one-sided tests need nothing from it).
fn serve_row<B: Backend>(side: &mut Side<B>, size: usize, iters: u64) -> Res<()> {
    let max = side.max;
    match side.cfg.test {
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
    Ok(())
}

// ---------------------------------------------------------------------------------------
// client

/// The binds `--mw` times.
const MW_BINDS: u64 = 100_000;

fn client<B: Backend>(b: &B, cli: &PerfCli, cfg: &Cfg, addr: &str) -> Res<()> {
    let common = &cli.common;
    let ctx = open_device(b, common.device.as_deref())?;
    let mut cfg = cfg.clone();
    if cfg.perftest && cli.inline_size.is_none() {
        cfg.inline = perftest_inline(cfg.test, ctx.query_device()?.vendor_id);
    }
    if cfg.connection == Connection::Ud {
        cfg.limit_to_mtu(ctx.query_port(1)?.active_mtu.bytes() as u64);
    }
    let cfg = &cfg;
    let pd = ctx.alloc_pd()?;
    let max = cfg.area_size();
    let mr = pd
        .reg_mr(2 * max, mw::region_access(cfg.mw))
        .with_context(|| format!("registering {} bytes", 2 * max))?;
    let window = cfg.mw.then(|| mw::Window::<B>::alloc(&pd)).transpose()?;
    let test = cfg.test;
    let send_wr = if test.is_lat() { 16 } else { cfg.tx_depth };
    let recv_wr = if test.is_send() { 16 } else { 1 };
    let Made { rc, recv_cq, srq } =
        create_qp::<B>(&ctx, &pd, &QpOpts::new(send_wr, recv_wr).inline(cfg.inline), cli)?;
    if rc.cap.max_send_wr < cfg.tx_depth {
        bail!(
            "the device grants {} send WRs, less than -t {}",
            rc.cap.max_send_wr,
            cfg.tx_depth
        );
    }
    let params = rc_params::<B>(&ctx, cli)?;
    let mut posted = 0;
    if test == Test::SendLat {
        // Receives first: the server's first reply may come right after the connection.
        modify_to_init(&Typed::new(&rc.qp), &params)?;
        post_recvs_on(&rc.qp, srq.as_ref(), &mr, max, 16)?;
        posted = 16;
    }
    let published = match &window {
        Some(w) => w.remote(mr.remote()),
        None => mr.remote(),
    };
    let offer = Offer::new().mr(published).private_data(serde_json::to_vec(cfg)?);
    let peer = conn::connect(
        addr,
        &ctx,
        &Typed::new(&rc.qp),
        &params,
        offer,
        common.wait().max(Duration::from_secs(10)),
    )?;
    let inline = cfg.inline.min(rc.cap.max_inline_data);
    let ud = ud_peer::<B>(&pd, cli, &params, &peer.endpoint)?;
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
        mhz: 0.0,
        spin_limit: 0,
        srq,
        ud,
    };
    if cfg.perftest {
        side.mhz = clock::cpu_mhz();
        side.spin_limit = (side.timeout.as_secs_f64() * 1e6 * side.mhz) as u64;
    }
    if let Some(w) = &window {
        // Before the first message: the server writes here only after it.
        w.bind(&side.rc.qp, &side.rc.cq, &side.mr, side.timeout)?;
    }
    match side.recv_json::<Ready>()? {
        Ready::Ok { addr, rkey, len } => side.remote = RemoteMr { addr, rkey, len },
        Ready::Err(e) => bail!("the server refused: {e}"),
    }
    // Before the rows, while nothing else is in the send queue (a LOCAL_INV waits for the
    // WRs before it) and the server waits for the first row.
    let bind_time = match cfg.mw {
        true => Some(mw::bind_rate::<B>(
            &pd,
            &side.rc.qp,
            &side.rc.cq,
            &side.mr,
            MW_BINDS,
            side.rc.cap.max_send_wr,
            side.timeout,
        )?),
        false => None,
    };
    if !cli.json {
        let long = cfg
            .rows
            .iter()
            .any(|&(_, iters)| iters > cycle_stats::NO_PEAK_ABOVE);
        if cfg.perftest && !cfg.test.is_lat() && long {
            // perftest's words, before its header.
            println!(" WARNING: BW peak won't be measured in this run.");
        }
        print_header::<B>(cli, cfg, &ctx, &side, &peer.endpoint)?;
    }
    for &(size, iters) in &cfg.rows {
        side.mr.fill(0);
        side.send_json(&(size, iters))?;
        side.expect("go")?;
        let row = if cfg.counts_at_receiver() {
            // The sender's loop, whichever; the figures are the receiver's.
            if cfg.perftest {
                loops::bw(&mut side, size as usize, iters)?;
            } else {
                run_bw(&mut side, size as usize, iters)?;
            }
            side.send_json(&"done")?;
            let got: Received = side.recv_json()?;
            bw_row_received(cli, &ctx, size, iters, got)
        } else {
            let row = if cfg.perftest {
                run_row_perftest(&mut side, recv_cq.as_ref(), cli, &ctx, size, iters)?
            } else if test.is_lat() {
                let lat = run_lat(&mut side, size as usize, iters)?;
                lat_row(cli, &ctx, size, iters, &lat)
            } else {
                let (elapsed, samples) = run_bw(&mut side, size as usize, iters)?;
                bw_row(cli, &ctx, size, iters, elapsed, &samples)
            };
            side.send_json(&"done")?;
            side.expect("ok")?;
            row
        };
        print_row(cli, &row)?;
    }
    if !cli.json {
        println!("{LINE}");
    }
    if let Some(el) = bind_time {
        let line = format!(
            "mw: {MW_BINDS} binds of a type 2 window through the send queue (each followed by a LOCAL_INV) in {:.3} s: {}binds/s",
            el.as_secs_f64(),
            si(per_sec(MW_BINDS as f64, el))
        );
        if cli.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
    Ok(())
}

/// One `--perftest` row of the client: perftest's loops and arithmetic.
fn run_row_perftest<B: Backend>(
    side: &mut Side<B>,
    recv_cq: Option<&B::Cq>,
    cli: &PerfCli,
    ctx: &B::Context,
    size: u64,
    iters: u64,
) -> Res<Row> {
    let s = size as usize;
    let test = side.cfg.test;
    if test.is_lat() {
        let stamps = match test {
            Test::SendLat => loops::send_lat(side, recv_cq_of::<B>(recv_cq)?, s, iters, true)?,
            Test::WriteLat => loops::write_lat(side, s, iters, true)?,
            _ => loops::read_atomic_lat(side, s, iters)?,
        };
        let halve = matches!(test, Test::SendLat | Test::WriteLat);
        let stats = cycle_stats::latency(&stamps, halve, side.mhz).with_context(|| {
            format!("{iters} iterations are too few for perftest's statistics (at least 4)")
        })?;
        Ok(lat_row_perftest(cli, ctx, size, iters, &stats))
    } else {
        let (tposted, tcompleted) = loops::bw(side, s, iters)?;
        let cq_mod = side.cfg.cq_mod_for(size) as usize;
        let stats = cycle_stats::bandwidth(size, iters, &tposted, &tcompleted, cq_mod, side.mhz)
            .context("no bandwidth figures for an empty run")?;
        Ok(bw_row_perftest(cli, ctx, size, iters, &stats))
    }
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

/// One row of a bandwidth test: elapsed time and (time, messages completed) samples, one
/// per polled batch of completions.
fn run_bw<B: Backend>(side: &mut Side<B>, size: usize, iters: u64) -> Res<(Duration, Vec<(Duration, u64)>)> {
    let cfg = &side.cfg;
    let depth = cfg.tx_depth as u64;
    let sig = cfg.cq_mod_for(size as u64) as u64;
    let sge = [side.mr.sge(side.max, size)?];
    let sge8 = [side.mr.sge(side.max, 8)?];
    let remote = side.remote.at(0);
    let ud = side.ud.clone();
    let mut template = match (cfg.test, cfg.atomic) {
        (Test::SendBw, _) => to_peer(SendWr::send(0, &sge), ud.as_ref()),
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
