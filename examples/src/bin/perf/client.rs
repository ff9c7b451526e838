//! perf's client: connects, runs each row (latency: one message at a time, timed
//! per round trip; bandwidth: a window of `-t` in flight), and prints the figures as
//! perftest does (or perftest's own loops under `--perftest`).

use crate::setup::{create_qp, rc_params, recv_cq_of, ud_peer, Made};
use anyhow::{bail, Context as _};
use examples::backend::open_device;
use examples::conn::{self, QpOpts};
use examples::perftest::opts::{AtomicType, Connection, PerfCli, Test};
use examples::perftest::params::{perftest_inline, Cfg, Ready};
use examples::perftest::report::{
    bw_row, bw_row_perftest, bw_row_received, lat_row, lat_row_perftest, print_header, print_row, Received,
    Row, LINE,
};
use examples::perftest::side::{post_recvs_on, to_peer, Side};
use examples::perftest::{clock, cycle_stats, loops, mw};
use examples::stats::Latencies;
use examples::stats::{per_sec, si};
use examples::transport::Typed;
use examples::wait::{check_wc, Waiter};
use examples::Res;
use std::time::{Duration, Instant};
use verbs_api::cm::Offer;
use verbs_api::{
    modify_to_init, Backend, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair, RemoteMr,
    SendFlags, SendWr, WorkCompletion,
};

/// The binds `--mw` times.
const MW_BINDS: u64 = 100_000;

pub(crate) fn client<B: Backend>(b: &B, cli: &PerfCli, cfg: &Cfg, addr: &str) -> Res<()> {
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
        .reg_mr(cfg.region_size(), mw::region_access(cfg.mw))
        .with_context(|| format!("registering {} bytes", cfg.region_size()))?;
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
