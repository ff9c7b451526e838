//! param-pool: a shared parameter pool read with RDMA READ (the one-sided pattern of the
//! RDMA communication model).
//!
//! An owner (`server`) registers its parameter vectors with REMOTE_READ, publishes
//! (addr, rkey, len) through the connection setup, and keeps rewriting the vectors with
//! its CPU. Readers (`client`) pull whole vectors with RDMA READ, without the owner's CPU
//! taking part. Each slot carries a version at both ends (a seqlock: odd while being
//! written) and a checksum (see `examples::pool`): a reader that fetched a slot mid-update
//! sees the versions disagree (or, when the READ did not copy front to back, the
//! checksum fail), counts a torn read and reads again; every vector it *uses* is then
//! compared with its contents regenerated from id and version. The demo fails if a
//! single used vector does not match.
//!
//! `--no-version-check` makes the readers use whatever they fetched, skipping versions
//! and checksum (the negative control): torn vectors then reach the application and the
//! demo fails.
//!
//! ```text
//! param-pool demo                                   # 1 owner child, 2 reader threads, 2 s
//! param-pool demo --owners 2 --readers 4 --dim 4096
//! param-pool server --listen 0.0.0.0:18516 --readers 1
//! param-pool client --server 10.0.0.1:18516 --server 10.0.0.2:18516
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand};
use examples::backend::open_device;
use examples::child::{announce_listening, ChildProc, Echo};
use examples::cli::CommonArgs;
use examples::conn::{self, QpOpts};
use examples::pool::{self, SlotCheck};
use examples::stats::si;
use examples::wait::{check_wc, Waiter};
use examples::{with_backend, Res};
use serde::{Deserialize, Serialize};
use verbs_api::cm::Offer;
use verbs_api::{
    AccessFlags, Backend, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair, RemoteMr,
    SendWr, WorkCompletion,
};

/// Parameter vectors pulled with RDMA READ while their owner rewrites them.
#[derive(Parser, Debug)]
#[command(
    name = "param-pool",
    version,
    after_help = "Examples:\n  param-pool demo\n  param-pool demo --no-version-check     (negative control: fails)\n  param-pool server --listen 0.0.0.0:18516 --readers 2\n  param-pool client --server HOST:18516 --readers 2"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Own a pool of vectors: publish them and keep rewriting them until the readers are done.
    Server(ServerArgs),
    /// Read vectors from one or more owners with RDMA READ and verify every one used.
    Client(ClientArgs),
    /// Start owner child process(es), run the readers, fail if a used vector is torn.
    Demo(DemoArgs),
}

#[derive(Args, Debug, Clone)]
struct OwnerTuning {
    /// Vectors per owner.
    #[arg(long, default_value_t = 16)]
    vectors: u32,
    /// Parameters (f32) per vector.
    #[arg(long, default_value_t = 1024)]
    dim: u32,
    /// Pause between two vector updates, in microseconds (0: rewrite continuously).
    #[arg(long, default_value_t = 0)]
    update_pause_us: u64,
}

#[derive(Args, Debug, Clone)]
struct ServerArgs {
    /// Address to listen on for connection setup (port 0: any free port; loopback by
    /// default, 0.0.0.0:PORT accepts other hosts).
    #[arg(long, default_value = "127.0.0.1:18516")]
    listen: String,
    /// Reader connections to accept (one per reader thread).
    #[arg(long, default_value_t = 1)]
    readers: u32,
    #[command(flatten)]
    tuning: OwnerTuning,
}

#[derive(Args, Debug, Clone)]
struct ReaderTuning {
    /// Reader threads (each with its own QP to every owner).
    #[arg(long, default_value_t = 2)]
    readers: u32,
    /// How long to read, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    duration_ms: u64,
    /// RDMA READs in flight per reader.
    #[arg(long, default_value_t = 4)]
    depth: u32,
    /// Use vectors without checking versions or checksum (negative control: torn vectors
    /// get used).
    #[arg(long)]
    no_version_check: bool,
}

#[derive(Args, Debug, Clone)]
struct ClientArgs {
    /// An owner's connection-setup address (repeat for several owners).
    #[arg(long, default_value = "127.0.0.1:18516")]
    server: Vec<String>,
    #[command(flatten)]
    tuning: ReaderTuning,
}

#[derive(Args, Debug, Clone)]
struct DemoArgs {
    /// Owner processes.
    #[arg(long, default_value_t = 1)]
    owners: u32,
    #[command(flatten)]
    owner: OwnerTuning,
    #[command(flatten)]
    reader: ReaderTuning,
}

/// What an owner tells its readers besides the MR descriptor (the cm private data).
#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
struct PoolInfo {
    vectors: u32,
    dim: u32,
    slot_size: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    examples::init_tracing();
    examples::report("param-pool", run(cli))
}

fn run(cli: Cli) -> Res<()> {
    let common = &cli.common;
    match &cli.cmd {
        Cmd::Server(a) => with_backend!(common.backend, |b| owner(b, common, a)),
        Cmd::Client(a) => {
            let addrs = a
                .server
                .iter()
                .map(|s| conn::parse_addr(s))
                .collect::<Res<Vec<_>>>()?;
            let reps = with_backend!(common.backend, |b| readers(b, common, &a.tuning, &addrs))?;
            verdict(&reps, &a.tuning)
        }
        Cmd::Demo(a) => demo(common, a),
    }
}

// ---------------------------------------------------------------------------------------
// owner

fn owner<B: Backend>(b: &B, common: &CommonArgs, a: &ServerArgs) -> Res<()> {
    let t = &a.tuning;
    let (nvec, dim) = (t.vectors.max(1) as usize, t.dim.max(1) as usize);
    let slot = pool::slot_size(dim);
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    let mr = pd
        .reg_mr(nvec * slot, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .context("registering the parameter pool")?;
    for v in 0..nvec {
        pool::init_slot(&mr, v * slot, v as u64, dim)?;
    }
    let cq = ctx.create_cq(16, None)?;
    let acceptor = conn::Acceptor::start(conn::listen(&a.listen)?, common.wait())?;
    announce_listening(acceptor.local_addr());
    println!(
        "owner: device {}, {nvec} vectors x {dim} f32 ({slot} B slots, {} KiB) registered with REMOTE_READ at {:#x} rkey {:#x}",
        ctx.name(),
        nvec * slot / 1024,
        mr.addr(),
        mr.rkey()
    );
    let info = PoolInfo {
        vectors: nvec as u32,
        dim: dim as u32,
        slot_size: slot as u64,
    };
    let private = serde_json::to_vec(&info)?;
    let stop = AtomicBool::new(false);
    let updates = AtomicU64::new(0);
    let params = common.rc_params();
    let timeout = common.wait().max(Duration::from_secs(30));
    std::thread::scope(|s| -> Res<()> {
        // The owner's CPU rewrites the vectors from the start, readers or not.
        let writer = s.spawn(|| -> Res<()> {
            let mut scratch = vec![0u8; pool::payload_len(dim)];
            let mut versions = vec![0u64; nvec];
            let pause = Duration::from_micros(t.update_pause_us);
            while !stop.load(Ordering::Relaxed) {
                for (v, ver) in versions.iter_mut().enumerate() {
                    *ver = pool::update_slot(&mr, v * slot, v as u64, *ver, dim, &mut scratch)?;
                    updates.fetch_add(1, Ordering::Relaxed);
                    if !pause.is_zero() {
                        std::thread::sleep(pause);
                    }
                }
                // Leave the other core to the readers' and the HCA's threads now and then.
                std::thread::yield_now();
            }
            Ok(())
        });
        let result = (|| -> Res<()> {
            let mut peers = Vec::new();
            let mut qps = Vec::new();
            for r in 0..a.readers.max(1) {
                let (qp, _) = conn::create_qp_on::<B>(&ctx, &pd, &cq, &QpOpts::new(1, 1))?;
                let offer = Offer::new().mr(mr.remote()).private_data(private.clone());
                let peer = acceptor.accept(&ctx, &qp, |_| Ok(()), &params, offer, timeout)?;
                println!("owner: reader {r} connected (QP {:#x})", qp.qp_num());
                peers.push(peer);
                qps.push(qp);
            }
            let start = Instant::now();
            let u0 = updates.load(Ordering::Relaxed);
            // Nothing to do for the readers: RDMA READ needs no CPU here. Wait until
            // every reader says it is done (bounded by the timeout after the last news).
            let mut w = Waiter::new(timeout.max(Duration::from_secs(60)));
            let mut done = vec![false; peers.len()];
            while !done.iter().all(|&d| d) {
                for (d, p) in done.iter_mut().zip(peers.iter_mut()) {
                    if !*d && examples::side_channel::peer_done(&mut p.stream)? {
                        *d = true;
                        w.progress();
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
                w.idle(&|| "the readers to finish".to_string())?;
            }
            let el = start.elapsed().as_secs_f64();
            let n = updates.load(Ordering::Relaxed) - u0;
            println!(
                "owner: rewrote vectors {n} times while readers were connected ({}updates/s, {}B/s of parameters)",
                si(n as f64 / el),
                si(n as f64 * (dim * 4) as f64 / el)
            );
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        let w = writer
            .join()
            .map_err(|_| anyhow::anyhow!("the writer thread panicked"))?;
        result.and(w)
    })
}

// ---------------------------------------------------------------------------------------
// readers

/// One reader thread's counts.
#[derive(Debug, Default, Clone)]
struct ReaderReport {
    id: u32,
    reads: u64,
    bytes: u64,
    torn_detected: u64,
    /// Torn reads whose versions agreed but whose checksum did not.
    torn_by_checksum: u64,
    used: u64,
    used_bad: u64,
    bad_example: Option<String>,
    /// Distinct versions seen per (owner, vector) summed: how many updates readers observed.
    fresh: u64,
    elapsed: Duration,
}

struct OwnerConn<B: Backend> {
    rc: conn::RcQp<B>,
    remote: RemoteMr,
    info: PoolInfo,
    peer: verbs_api::cm::Peer,
}

fn readers<B: Backend>(
    b: &B,
    common: &CommonArgs,
    t: &ReaderTuning,
    owners: &[SocketAddr],
) -> Res<Vec<ReaderReport>> {
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    let results: Vec<Res<ReaderReport>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..t.readers.max(1))
            .map(|i| {
                let (ctx, pd) = (&ctx, &pd);
                s.spawn(move || reader::<B>(ctx, pd, common, t, owners, i))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("reader thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect()
}

fn reader<B: Backend>(
    ctx: &B::Context,
    pd: &B::Pd,
    common: &CommonArgs,
    t: &ReaderTuning,
    owners: &[SocketAddr],
    id: u32,
) -> Res<ReaderReport> {
    let timeout = common.wait();
    let depth = t.depth.clamp(1, 16) as usize;
    let params = common.rc_params();
    let mut conns: Vec<OwnerConn<B>> = Vec::new();
    for addr in owners {
        let rc = conn::create_rc::<B>(ctx, pd, &QpOpts::new(depth as u32, 1))?;
        let peer = conn::connect(addr, ctx, &rc.qp, &params, Offer::new(), timeout)?;
        let Some(&remote) = peer.mrs.first() else {
            bail!("the owner at {addr} published no memory region")
        };
        let info: PoolInfo = serde_json::from_slice(&peer.private_data)
            .with_context(|| format!("the owner at {addr} sent unreadable pool info"))?;
        if info.slot_size != pool::slot_size(info.dim as usize) as u64
            || remote.len < info.slot_size * info.vectors as u64
        {
            bail!("the owner at {addr} published an inconsistent pool: {info:?}, {remote:?}");
        }
        conns.push(OwnerConn {
            rc,
            remote,
            info,
            peer,
        });
    }
    let max_slot = conns.iter().map(|c| c.info.slot_size as usize).max().unwrap_or(0);
    let local = pd
        .reg_mr(depth * max_slot, AccessFlags::LOCAL_WRITE)
        .context("registering the read buffers")?;
    let mut rep = ReaderReport {
        id,
        ..Default::default()
    };
    // What each local buffer is reading: (owner, vector).
    let mut inflight: Vec<Option<(usize, u32)>> = vec![None; depth];
    let mut last_version: Vec<Vec<u64>> = conns
        .iter()
        .map(|c| vec![0u64; c.info.vectors as usize])
        .collect();
    let mut bytes = vec![0u8; max_slot];
    let mut scratch = vec![0u8; max_slot];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ ((id as u64 + 1) << 32);
    let mut wcs = [WorkCompletion::default(); 16];
    let mut waiter = Waiter::new(timeout);
    let start = Instant::now();
    let end = start + Duration::from_millis(t.duration_ms);
    let mut retry: Vec<(usize, u32)> = Vec::new();
    let mut pick = 0usize;
    loop {
        let running = Instant::now() < end;
        // Keep `depth` READs in flight: torn ones first (re-read), then random vectors.
        for (buf, slot) in inflight.iter_mut().enumerate() {
            if slot.is_some() || (!running && retry.is_empty()) {
                continue;
            }
            let (o, v) = match retry.pop() {
                Some(x) => x,
                None => {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    pick = (pick + 1) % conns.len();
                    (pick, (rng % conns[pick].info.vectors as u64) as u32)
                }
            };
            let c = &conns[o];
            let len = c.info.slot_size as usize;
            let sge = [local.sge(buf * max_slot, len)?];
            let wr = SendWr::read(buf as u64, &sge, c.remote.at(v as u64 * c.info.slot_size)).signaled();
            c.rc.qp.post_send(&[wr]).context("posting an RDMA READ")?;
            *slot = Some((o, v));
        }
        if inflight.iter().all(Option::is_none) {
            break;
        }
        let mut got = 0;
        for c in &conns {
            let n = c.rc.cq.poll(&mut wcs)?;
            got += n;
            for wc in &wcs[..n] {
                check_wc(wc, &|| format!("reader {id}: RDMA READ"))?;
                let buf = wc.wr_id as usize;
                let Some((o, v)) = inflight.get_mut(buf).and_then(Option::take) else {
                    bail!("reader {id}: completion for an idle buffer {buf}")
                };
                let dim = conns[o].info.dim as usize;
                let len = conns[o].info.slot_size as usize;
                local.read(buf * max_slot, &mut bytes[..len])?;
                rep.reads += 1;
                rep.bytes += len as u64;
                let version = match pool::check(&bytes[..len], dim) {
                    SlotCheck::Stable { id: vid, version } if vid == v as u64 => version,
                    SlotCheck::Stable { id: vid, .. } => {
                        bail!("reader {id}: slot {v} of owner {o} holds vector {vid}")
                    }
                    torn => {
                        rep.torn_detected += 1;
                        let head = match torn {
                            SlotCheck::BadChecksum { version } => {
                                rep.torn_by_checksum += 1;
                                version
                            }
                            SlotCheck::Torn { head, .. } => head,
                            SlotCheck::Stable { version, .. } => version,
                        };
                        if !t.no_version_check {
                            retry.push((o, v));
                            continue;
                        }
                        // Negative control: use it anyway, as if head were right.
                        head & !1
                    }
                };
                // The vector is used: prove it is whole.
                rep.used += 1;
                if !pool::matches_generated(
                    &bytes[..len],
                    v as u64,
                    version,
                    dim,
                    &mut scratch[..pool::payload_len(dim)],
                ) {
                    rep.used_bad += 1;
                    if rep.bad_example.is_none() {
                        rep.bad_example = Some(format!(
                            "owner {o} vector {v} (head version {version}) is not that version's contents"
                        ));
                    }
                }
                let lv = &mut last_version[o][v as usize];
                if version > *lv {
                    rep.fresh += 1;
                    *lv = version;
                }
            }
        }
        if got == 0 {
            waiter.idle(&|| format!("reader {id}: RDMA READ completions"))?;
        } else {
            waiter.progress();
        }
    }
    rep.elapsed = start.elapsed();
    for c in &mut conns {
        let _ = examples::side_channel::send_msg(&mut c.peer.stream, b"done");
    }
    Ok(rep)
}

/// Prints the reader reports; fails if any used vector was torn.
fn verdict(reps: &[ReaderReport], t: &ReaderTuning) -> Res<()> {
    let mut tot = ReaderReport::default();
    for r in reps {
        let el = r.elapsed.as_secs_f64().max(1e-9);
        println!(
            "reader {}: {} READs in {:.2} s ({}reads/s, {}B/s); torn detected{}: {} ({} by checksum); used: {}; used but torn: {}; updates observed: {}",
            r.id,
            r.reads,
            el,
            si(r.reads as f64 / el),
            si(r.bytes as f64 / el),
            if t.no_version_check { " (and used anyway)" } else { " and re-read" },
            r.torn_detected,
            r.torn_by_checksum,
            r.used,
            r.used_bad,
            r.fresh
        );
        if let Some(e) = &r.bad_example {
            println!("reader {}:   e.g. {e}", r.id);
        }
        tot.reads += r.reads;
        tot.bytes += r.bytes;
        tot.torn_detected += r.torn_detected;
        tot.torn_by_checksum += r.torn_by_checksum;
        tot.used += r.used;
        tot.used_bad += r.used_bad;
        tot.elapsed = tot.elapsed.max(r.elapsed);
    }
    let el = tot.elapsed.as_secs_f64().max(1e-9);
    println!(
        "total: {} READs, {}reads/s, {}B/s; torn detected: {} ({:.2}% of reads, {} by checksum, {}); vectors used: {}; torn vectors used: {}",
        tot.reads,
        si(tot.reads as f64 / el),
        si(tot.bytes as f64 / el),
        tot.torn_detected,
        100.0 * tot.torn_detected as f64 / tot.reads.max(1) as f64,
        tot.torn_by_checksum,
        if t.no_version_check { "used anyway" } else { "all re-read" },
        tot.used,
        tot.used_bad
    );
    if tot.used_bad > 0 {
        bail!(
            "{} torn vector(s) were used{}",
            tot.used_bad,
            if t.no_version_check {
                " (expected with --no-version-check: this is what versions and checksum prevent)"
            } else {
                ""
            }
        )
    }
    if tot.used == 0 {
        bail!("no vector was used: nothing was proven");
    }
    println!(
        "OK: every one of the {} vectors used matched its regenerated contents ({} torn reads were caught: {} by the versions, {} by the checksum)",
        tot.used,
        tot.torn_detected,
        tot.torn_detected - tot.torn_by_checksum,
        tot.torn_by_checksum
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// demo

fn demo(common: &CommonArgs, a: &DemoArgs) -> Res<()> {
    let mut owners = Vec::new();
    let mut addrs = Vec::new();
    for o in 0..a.owners.max(1) {
        let mut args = common.to_args();
        args.extend(
            [
                "server",
                "--listen",
                "127.0.0.1:0",
                "--readers",
                &a.reader.readers.max(1).to_string(),
                "--vectors",
                &a.owner.vectors.to_string(),
                "--dim",
                &a.owner.dim.to_string(),
                "--update-pause-us",
                &a.owner.update_pause_us.to_string(),
            ]
            .map(String::from),
        );
        let mut child = ChildProc::spawn(&format!("owner{o}"), &args, Echo::Stdout)?;
        addrs.push(child.listen_addr(Duration::from_secs(20))?);
        owners.push(child);
    }
    println!(
        "demo: {} owner(s) rewrite {} vectors of {} f32 each; {} reader thread(s) READ them for {} ms{}",
        owners.len(),
        a.owner.vectors,
        a.owner.dim,
        a.reader.readers,
        a.reader.duration_ms,
        if a.reader.no_version_check {
            " WITHOUT checking versions (negative control: expect torn vectors to be used)"
        } else {
            ""
        }
    );
    let reps = with_backend!(common.backend, |b| readers(b, common, &a.reader, &addrs))?;
    for o in &mut owners {
        o.wait_success(common.wait() + Duration::from_secs(10))
            .with_context(|| format!("owner process {}", o.name()))?;
    }
    verdict(&reps, &a.reader)
}
