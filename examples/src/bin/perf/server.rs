//! perf's server: accepts the client's connection, sets up the same QP, and serves each
//! row the client runs (answers a latency test's messages, receives a SEND bandwidth
//! test's, counting what arrives over UC and UD).

use crate::setup::{create_qp, rc_params, recv_cq_of, ud_peer, Made};
use anyhow::{bail, Context as _};
use examples::backend::open_device;
use examples::child::announce_listening;
use examples::conn::{self, QpOpts};
use examples::perftest::opts::{PerfCli, Test};
use examples::perftest::params::{Cfg, Ready};
use examples::perftest::report::Received;
use examples::perftest::side::Side;
use examples::perftest::{clock, loops, mw};
use examples::transport::Typed;
use examples::wait::{check_wc, Waiter};
use examples::{side_channel, Res};
use std::time::{Duration, Instant};
use verbs_api::cm::Offer;
use verbs_api::{Backend, CompletionQueue, Context, MemoryRegion, ProtectionDomain, WorkCompletion};

pub(crate) fn server<B: Backend>(b: &B, cli: &PerfCli) -> Res<()> {
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
        .reg_mr(cfg.region_size(), mw::region_access(cfg.mw))
        .with_context(|| format!("registering {} bytes", cfg.region_size()))?;
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
