//! param-pool: a shared parameter pool read with RDMA READ (the one-sided pattern of the
//! RDMA communication model).
//!
//! An owner (`server`) registers its parameter vectors with MW_BIND (no remote right of
//! their own), hands each reader a type 2 memory window of its own over them, bound to
//! that reader's QP with REMOTE_READ only, publishes (addr, window rkey, len) through the
//! connection setup, and keeps rewriting the vectors with its CPU. A reader's rkey works
//! on its own connection only, and the owner revokes a reader by invalidating its window
//! (`IBV_WR_LOCAL_INV`, `--revoke`): that reader's next READ fails with
//! REM_ACCESS_ERR, the others read on (the way a real server limits what each client may
//! read, and takes it back). Readers (`client`) pull whole vectors with RDMA READ, without the owner's CPU
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
//! This file holds the verbs calls, the readers' checks and the demo's invariant; the
//! slot format, the reports and the options are in `examples::pool`.
//!
//! ```text
//! param-pool demo                                   # 1 owner child, 2 reader threads, 2 s,
//!                                                   # the last reader revoked after 0.5 s
//! param-pool demo --owners 2 --readers 4 --dim 4096
//! param-pool server --listen 0.0.0.0:18516 --readers 1
//! param-pool client --server 10.0.0.1:18516 --server 10.0.0.2:18516
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use examples::backend::open_device;
use examples::child::announce_listening;
use examples::cli::CommonArgs;
use examples::conn::{self, QpOpts};
use examples::demo::{start_server, ChildArgs};
use examples::pool::opts::{ClientArgs, DemoArgs, ReaderTuning, ServerArgs};
use examples::pool::report::{print_readers, ReaderReport};
use examples::pool::{self, PoolInfo, SlotCheck};
use examples::stats::{per_sec, si};
use examples::wait::{check_wc, poll_one_ok, Waiter};
use examples::{side_channel, threads, with_backend, Res};
use verbs_api::cm::{Offer, Peer};
use verbs_api::{
    inc_rkey, AccessFlags, Backend, CompletionQueue, Context, MemoryRegion, MemoryWindow, MwBindInfo, MwType,
    ProtectionDomain, QueuePair, RemoteMr, SendWr, WcStatus, WorkCompletion,
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

fn main() -> ExitCode {
    examples::program::main("param-pool", |cli: Cli| run(&cli))
}

fn run(cli: &Cli) -> Res<()> {
    let common = &cli.common;
    match &cli.cmd {
        Cmd::Server(a) => with_backend!(common, |b| owner(b, common, a)),
        Cmd::Client(a) => {
            let addrs = a
                .server
                .iter()
                .map(|s| conn::parse_addr(s))
                .collect::<Res<Vec<_>>>()?;
            let reps = with_backend!(common, |b| readers(b, common, &a.tuning, &addrs))?;
            verdict(&reps, &a.tuning, None)
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
    // No remote right on the region itself: every reader reads through its own window.
    let mr = pd
        .reg_mr(nvec * slot, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
        .context("registering the parameter pool")?;
    for v in 0..nvec {
        pool::init_slot(&mr, v * slot, v as u64, dim)?;
    }
    let cq = ctx.create_cq(16, None)?;
    let acceptor = conn::Acceptor::start(conn::listen(&a.listen)?, common.wait())?;
    announce_listening(acceptor.local_addr());
    println!(
        "owner: device {}, {nvec} vectors x {dim} f32 ({slot} B slots, {} KiB) registered with MW_BIND at {:#x}; one READ-only window per reader",
        ctx.name(),
        nvec * slot / 1024,
        mr.addr(),
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
            let mut grants = Vec::new();
            for r in 0..a.readers.max(1) {
                let (qp, _) = conn::create_qp_on::<B>(&ctx, &pd, &cq, &QpOpts::new(1, 1))?;
                let mw = pd
                    .alloc_mw(MwType::Type2)
                    .context("allocating a reader's window")?;
                // The rkey the bind will give the window, published before it is bound: a
                // type 2 window is bound through the QP it serves, once that is connected.
                let rkey = inc_rkey(mw.rkey());
                let offer = Offer::new()
                    .mr(RemoteMr { rkey, ..mr.remote() })
                    .private_data(private.clone());
                let mut peer = acceptor.accept(&ctx, &qp, |_| Ok(()), &params, offer, timeout)?;
                let grant = Grant::<B>::bind(&cq, qp, mw, rkey, &mr, timeout)?;
                // The reader waits for this before its first READ.
                side_channel::send_msg(&mut peer.stream, b"bound")?;
                println!(
                    "owner: reader {r} connected (QP {:#x}), window rkey {rkey:#x}",
                    grant.qp.qp_num()
                );
                peers.push(peer);
                grants.push(grant);
            }
            let start = Instant::now();
            let u0 = updates.load(Ordering::Relaxed);
            if a.revoke.revoke > 0 {
                std::thread::sleep(Duration::from_millis(a.revoke.revoke_after_ms));
                // The last readers to connect: their reading began when the timer did.
                let n = grants.len();
                let first = n.saturating_sub(a.revoke.revoke as usize);
                for (r, g) in grants.iter().enumerate().skip(first) {
                    g.revoke(&cq, timeout)?;
                    println!(
                        "owner: revoked reader {r}: invalidated its window (rkey {:#x})",
                        g.rkey
                    );
                }
            }
            // Nothing to do for the readers: RDMA READ needs no CPU here. Wait until
            // every reader says it is done (bounded by the timeout after the last news).
            let wait = timeout.max(Duration::from_secs(60));
            side_channel::wait_all_done(&mut peers, Duration::from_millis(2), wait, "the readers")?;
            let el = start.elapsed();
            let n = updates.load(Ordering::Relaxed) - u0;
            println!(
                "owner: rewrote vectors {n} times while readers were connected ({}updates/s, {}B/s of parameters)",
                si(per_sec(n as f64, el)),
                si(per_sec(n as f64 * (dim * 4) as f64, el))
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

/// What one reader was granted: its QP and the type 2 window bound to it.
struct Grant<B: Backend> {
    qp: B::Qp,
    _mw: B::Mw,
    rkey: u32,
}

impl<B: Backend> Grant<B> {
    /// Binds `mw` over the whole of `mr`, READ-only, to the connected `qp` with `rkey`
    /// (`IBV_WR_BIND_MW`), and waits for the bind on `cq`.
    fn bind(cq: &B::Cq, qp: B::Qp, mw: B::Mw, rkey: u32, mr: &B::Mr, timeout: Duration) -> Res<Self> {
        let info = MwBindInfo::whole(mr, AccessFlags::REMOTE_READ);
        qp.post_send(&[SendWr::bind_mw(1, &mw, rkey, info).signaled()])
            .context("posting a reader's window bind")?;
        poll_one_ok(cq, timeout, &|| "the window bind".to_string())?;
        Ok(Grant { qp, _mw: mw, rkey })
    }

    /// Invalidates the reader's window (`IBV_WR_LOCAL_INV`): its rkey stops working.
    fn revoke(&self, cq: &B::Cq, timeout: Duration) -> Res<()> {
        self.qp
            .post_send(&[SendWr::local_inv(2, self.rkey).signaled()])
            .context("posting a window invalidation")?;
        poll_one_ok(cq, timeout, &|| "the window invalidation".to_string())?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// readers

/// A reader's connection to one owner, and what the owner published.
struct OwnerConn<B: Backend> {
    rc: conn::RcQp<B>,
    remote: RemoteMr,
    info: PoolInfo,
    peer: Peer,
    /// The owner invalidated this reader's window: a READ came back REM_ACCESS_ERR.
    revoked: bool,
}

fn readers<B: Backend>(
    b: &B,
    common: &CommonArgs,
    t: &ReaderTuning,
    owners: &[SocketAddr],
) -> Res<Vec<ReaderReport>> {
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    threads::on_threads(t.readers.max(1), "reader", |i| {
        reader::<B>(&ctx, &pd, common, t, owners, i)
    })
}

/// Connects to every owner and checks what it published.
fn connect_owners<B: Backend>(
    ctx: &B::Context,
    pd: &B::Pd,
    common: &CommonArgs,
    depth: usize,
    owners: &[SocketAddr],
) -> Res<Vec<OwnerConn<B>>> {
    let params = common.rc_params();
    let mut conns = Vec::new();
    for addr in owners {
        let rc = conn::create_rc::<B>(ctx, pd, &QpOpts::new(depth as u32, 1))?;
        let mut peer = conn::connect(addr, ctx, &rc.qp, &params, Offer::new(), common.wait())?;
        // The owner binds this reader's window once the QPs are connected.
        let msg = side_channel::recv_msg(&mut peer.stream, common.wait().max(Duration::from_secs(30)))?;
        if msg != b"bound" {
            bail!(
                "the owner at {addr} sent {:?} instead of \"bound\"",
                String::from_utf8_lossy(&msg)
            );
        }
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
            revoked: false,
        });
    }
    Ok(conns)
}

fn reader<B: Backend>(
    ctx: &B::Context,
    pd: &B::Pd,
    common: &CommonArgs,
    t: &ReaderTuning,
    owners: &[SocketAddr],
    id: u32,
) -> Res<ReaderReport> {
    let depth = t.depth.clamp(1, 16) as usize;
    let mut conns = connect_owners::<B>(ctx, pd, common, depth, owners)?;
    let max_slot = conns.iter().map(|c| c.info.slot_size as usize).max().unwrap_or(0);
    let local = pd
        .reg_mr(depth * max_slot, AccessFlags::LOCAL_WRITE)
        .context("registering the read buffers")?;
    let mut check = Checker {
        rep: ReaderReport {
            id,
            ..Default::default()
        },
        last_version: conns
            .iter()
            .map(|c| vec![0u64; c.info.vectors as usize])
            .collect(),
        bytes: vec![0u8; max_slot],
        scratch: vec![0u8; max_slot],
        use_torn: t.no_version_check,
    };
    // What each local buffer is reading: (owner, vector).
    let mut inflight: Vec<Option<(usize, u32)>> = vec![None; depth];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ ((id as u64 + 1) << 32);
    let mut wcs = [WorkCompletion::default(); 16];
    let mut waiter = Waiter::new(common.wait());
    let start = Instant::now();
    let end = start + Duration::from_millis(t.duration_ms);
    let mut retry: Vec<(usize, u32)> = Vec::new();
    let mut pick = 0usize;
    loop {
        // Torn reads of an owner that revoked this reader are not read again.
        retry.retain(|&(o, _)| !conns[o].revoked);
        let running = Instant::now() < end && conns.iter().any(|c| !c.revoked);
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
                    while conns[pick].revoked {
                        pick = (pick + 1) % conns.len();
                    }
                    (pick, (rng % conns[pick].info.vectors as u64) as u32)
                }
            };
            let c = &conns[o];
            let sge = [local.sge(buf * max_slot, c.info.slot_size as usize)?];
            let wr = SendWr::read(buf as u64, &sge, c.remote.at(v as u64 * c.info.slot_size)).signaled();
            c.rc.qp.post_send(&[wr]).context("posting an RDMA READ")?;
            *slot = Some((o, v));
        }
        if inflight.iter().all(Option::is_none) {
            break;
        }
        let mut got = 0;
        for ci in 0..conns.len() {
            let n = conns[ci].rc.cq.poll(&mut wcs)?;
            got += n;
            for wc in &wcs[..n] {
                let buf = wc.wr_id as usize;
                let Some((o, v)) = inflight.get_mut(buf).and_then(Option::take) else {
                    bail!("reader {id}: completion for an idle buffer {buf}")
                };
                if revoked(&mut conns[o], wc, id, o, &mut check.rep) {
                    continue;
                }
                check_wc(wc, &|| format!("reader {id}: RDMA READ"))?;
                let info = &conns[o].info;
                local.read(buf * max_slot, &mut check.bytes[..info.slot_size as usize])?;
                if !check.read(o, v, info)? {
                    retry.push((o, v));
                }
            }
        }
        if got == 0 {
            waiter.idle(&|| format!("reader {id}: RDMA READ completions"))?;
        } else {
            waiter.progress();
        }
    }
    check.rep.elapsed = start.elapsed();
    for c in &mut conns {
        let _ = side_channel::send_msg(&mut c.peer.stream, b"done");
    }
    Ok(check.rep)
}

/// Whether `wc` is the end of reading from an owner that revoked this reader: the first
/// READ through the invalidated window fails with REM_ACCESS_ERR (counted, and the
/// connection marked revoked), the ones behind it are flushed.
fn revoked<B: Backend>(
    c: &mut OwnerConn<B>,
    wc: &WorkCompletion,
    id: u32,
    o: usize,
    rep: &mut ReaderReport,
) -> bool {
    match wc.status {
        WcStatus::RemAccessErr if !c.revoked => {
            c.revoked = true;
            rep.revoked += 1;
            println!(
                "reader {id}: owner {o} revoked my window (RDMA READ: REM_ACCESS_ERR); no more reads from it"
            );
            true
        }
        WcStatus::WrFlushErr => c.revoked,
        _ => false,
    }
}

/// A reader's checks of the slots it fetched, and its counts.
struct Checker {
    rep: ReaderReport,
    /// The newest version seen per (owner, vector).
    last_version: Vec<Vec<u64>>,
    /// The slot fetched, and room to regenerate its payload.
    bytes: Vec<u8>,
    scratch: Vec<u8>,
    /// `--no-version-check`: use torn slots anyway (the negative control).
    use_torn: bool,
}

impl Checker {
    /// Checks the slot of vector `v` of owner `o` in `self.bytes`: a torn one is counted
    /// and, unless torn slots are used anyway, not used (returns false: read it again).
    /// A used vector is compared with its contents regenerated from id and version.
    fn read(&mut self, o: usize, v: u32, info: &PoolInfo) -> Res<bool> {
        let (dim, len) = (info.dim as usize, info.slot_size as usize);
        let id = self.rep.id;
        let rep = &mut self.rep;
        rep.reads += 1;
        rep.bytes += len as u64;
        let version = match pool::check(&self.bytes[..len], dim) {
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
                if !self.use_torn {
                    return Ok(false);
                }
                // Negative control: use it anyway, as if head were right.
                head & !1
            }
        };
        // The vector is used: prove it is whole.
        rep.used += 1;
        let scratch = &mut self.scratch[..pool::payload_len(dim)];
        if !pool::matches_generated(&self.bytes[..len], v as u64, version, dim, scratch) {
            rep.used_bad += 1;
            if rep.bad_example.is_none() {
                rep.bad_example = Some(format!(
                    "owner {o} vector {v} (head version {version}) is not that version's contents"
                ));
            }
        }
        let lv = &mut self.last_version[o][v as usize];
        if version > *lv {
            rep.fresh += 1;
            *lv = version;
        }
        Ok(true)
    }
}

/// Prints the reader reports; fails if any used vector was torn (the demo's invariant), or
/// if not exactly `revocations` (owner, reader) windows were found revoked, when given.
fn verdict(reps: &[ReaderReport], t: &ReaderTuning, revocations: Option<u64>) -> Res<()> {
    let tot = print_readers(reps, t.no_version_check);
    if let Some(want) = revocations {
        if tot.revoked != want {
            bail!(
                "{} reader window(s) were found revoked, {want} were revoked by the owners",
                tot.revoked
            );
        }
        println!("revoked: {want} reader window(s) invalidated; each revoked reader's next READ failed with REM_ACCESS_ERR");
    }
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
        // A quarter into the reading: the revoked readers have read, and will read again.
        let args = ChildArgs::server(common)
            .opt("--readers", a.reader.readers.max(1))
            .opt("--revoke", a.revoke.min(a.reader.readers.max(1)))
            .opt("--revoke-after-ms", a.reader.duration_ms / 4)
            .opt("--vectors", a.owner.vectors)
            .opt("--dim", a.owner.dim)
            .opt("--update-pause-us", a.owner.update_pause_us);
        let (child, addr) = start_server(&format!("owner{o}"), &args)?;
        owners.push(child);
        addrs.push(addr);
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
    let reps = with_backend!(common, |b| readers(b, common, &a.reader, &addrs))?;
    for o in &mut owners {
        o.wait_success(common.wait() + Duration::from_secs(10))
            .with_context(|| format!("owner process {}", o.name()))?;
    }
    let revoked = a.owners.max(1) as u64 * a.revoke.min(a.reader.readers.max(1)) as u64;
    verdict(&reps, &a.reader, Some(revoked))
}
