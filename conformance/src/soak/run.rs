//! The run ([`run`]): check the configuration and lay out the memory, open the two
//! devices, write the initial contents, connect QP `j` of A with QP `j` of B and post
//! every QP's receives, run the two workers while sampling RSS, then the final checks
//! and the report.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use verbs_api::{
    connect_rc, local_endpoint, AtomicCap, Backend, Context, MemoryRegion, QueuePair, RcParams, RecvWr, Sge,
};

use super::bits::Bits;
use super::config::{Mix, SoakConfig};
use super::device::Device;
use super::final_checks::final_checks;
use super::layout::Layout;
use super::plan::{chain_init, counter_init, fill_payload, init_key, mix64, tally, Tally, SHARED_INIT};
use super::report::{OpCounts, SoakFailure, SoakReport};
use super::rss::rss_bytes;
use super::worker::{Pending, QpTrack, Worker, INIT, RECV_BIT};

/// Runs a soak on two contexts of `backend`: `devices.0` and `devices.1` (the same name
/// twice opens one device twice).
pub fn run<B: Backend>(
    backend: &B,
    devices: (&str, &str),
    cfg: &SoakConfig,
) -> Result<SoakReport, SoakFailure> {
    let lay = layout_of(cfg)?;
    let setup_start = Instant::now();
    let devs = [
        Device::<B>::open(backend, devices.0, cfg, &lay)?,
        Device::<B>::open(backend, devices.1, cfg, &lay)?,
    ];
    let (atomics, mix) = mix_for(&devs, cfg)?;
    write_initial(&devs, cfg, &lay)?;
    connect(&devs, cfg, &lay)?;
    let tallies = [tally(cfg, &mix, 0, lay.n), tally(cfg, &mix, 1, lay.n)];
    let progress = AtomicU64::new(0);
    let abort = AtomicBool::new(false);
    let shared = Shared {
        cfg,
        mix,
        lay,
        devs: &devs,
        progress: &progress,
        abort: &abort,
    };
    let mut workers: Vec<Worker<'_, B>> = (0..2).map(|side| shared.worker(side, &tallies)).collect();
    let setup_secs = setup_start.elapsed().as_secs_f64();
    let traffic = traffic(&mut workers, &progress, &abort, cfg);

    let mut problems: Vec<String> = workers.iter().flat_map(|w| w.problems.iter().cloned()).collect();
    if problems.is_empty() && !abort.load(Ordering::Acquire) {
        final_checks(cfg, &lay, &devs, &workers, &mut problems);
    } else if problems.is_empty() {
        problems.push("a worker thread panicked".into());
    }
    let report = report_of(backend, cfg, &devs, &workers, atomics, setup_secs, &traffic);
    if problems.is_empty() && report.rss_growth() > cfg.max_rss_growth as i64 {
        problems.push(format!(
            "RSS grew by {} KiB after the warm-up ({} KiB -> {} KiB), more than the {} KiB allowed",
            report.rss_growth() / 1024,
            report.rss_before / 1024,
            report.rss_after / 1024,
            cfg.max_rss_growth / 1024
        ));
    }
    drop(workers);
    drop(devs);
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(SoakFailure {
            problems,
            report: Some(Box::new(report)),
        })
    }
}

/// Checks the configuration and lays out one device's memory.
fn layout_of(cfg: &SoakConfig) -> Result<Layout, SoakFailure> {
    if cfg.qps < 2 || cfg.qps % 2 != 0 {
        return Err(SoakFailure::setup(format!(
            "qps must be even and at least 2, not {}",
            cfg.qps
        )));
    }
    if cfg.depth == 0 || cfg.ops_per_qp == 0 || cfg.slots == 0 || cfg.counters == 0 {
        return Err(SoakFailure::setup(
            "depth, ops, slots and counters must be positive",
        ));
    }
    if cfg.ops_per_qp > u32::MAX as u64 {
        return Err(SoakFailure::setup("ops per QP must fit the 32-bit immediate"));
    }
    if cfg.sizes.is_empty() || cfg.sizes.contains(&0) {
        return Err(SoakFailure::setup(
            "sizes must be a non-empty list of positive sizes",
        ));
    }
    let max = (*cfg.sizes.iter().max().expect("non-empty") as usize)
        .max(8)
        .next_multiple_of(8);
    Ok(Layout {
        n: cfg.qps / 2,
        depth: cfg.depth,
        slots: cfg.slots,
        counters: cfg.counters,
        max,
    })
}

/// Whether both devices have atomics, and the mix to run: without them, the mix less its
/// atomics.
fn mix_for<B: Backend>(devs: &[Device<B>; 2], cfg: &SoakConfig) -> Result<(bool, Mix), SoakFailure> {
    let atomics = devs
        .iter()
        .map(|d| d.ctx.query_device().map(|a| a.atomic_cap != AtomicCap::None))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .all(|a| a);
    let mut mix = cfg.mix;
    if !atomics {
        mix.fetch_add = 0;
        mix.cmp_swap = 0;
        if mix.total() == 0 {
            return Err(SoakFailure::setup(
                "the device has no atomics and the mix has nothing else",
            ));
        }
    }
    Ok((atomics, mix))
}

/// Initial contents: the peer's slot patterns, atomic words.
fn write_initial<B: Backend>(
    devs: &[Device<B>; 2],
    cfg: &SoakConfig,
    lay: &Layout,
) -> Result<(), SoakFailure> {
    for (side, d) in devs.iter().enumerate() {
        let peer = 1 - side;
        let mut buf = vec![0u8; lay.max];
        for j in 0..lay.n {
            for k in 0..cfg.slots {
                fill_payload(&mut buf, init_key(cfg.seed, peer, j, k));
                d.target.write(lay.target(j, k), &buf)?;
            }
            d.atomics.write_u64(lay.chain(j), chain_init(cfg.seed, peer, j))?;
        }
        for c in 0..cfg.counters {
            d.atomics.write_u64(lay.counter(c), counter_init(c))?;
        }
        d.atomics.write_u64(lay.shared(), SHARED_INIT)?;
    }
    Ok(())
}

/// Connects QP `j` of A with QP `j` of B, and posts `depth` receives on every QP.
fn connect<B: Backend>(devs: &[Device<B>; 2], cfg: &SoakConfig, lay: &Layout) -> Result<(), SoakFailure> {
    let max_rd = |d: &Device<B>| -> Result<(u8, u8), SoakFailure> {
        let a = d.ctx.query_device()?;
        Ok((
            a.max_qp_init_rd_atom.clamp(1, 16) as u8,
            a.max_qp_rd_atom.clamp(1, 16) as u8,
        ))
    };
    let (init_a, dest_a) = max_rd(&devs[0])?;
    let (init_b, dest_b) = max_rd(&devs[1])?;
    let params = |init: u8, dest: u8| RcParams {
        gid_index: cfg.gid_index,
        min_rnr_timer: 1,
        max_rd_atomic: init.min(dest_a).min(dest_b),
        max_dest_rd_atomic: dest,
        ..RcParams::default()
    };
    let pa = params(init_a, dest_a);
    let pb = params(init_b, dest_b);
    for j in 0..lay.n {
        let psn_a = (mix64(cfg.seed ^ 0xa000 ^ j as u64) & 0xff_ffff) as u32;
        let psn_b = (mix64(cfg.seed ^ 0xb000 ^ j as u64) & 0xff_ffff) as u32;
        let ea = local_endpoint(&devs[0].ctx, &devs[0].qps[j], &pa, psn_a)?;
        let eb = local_endpoint(&devs[1].ctx, &devs[1].qps[j], &pb, psn_b)?;
        connect_rc(&devs[0].qps[j], &pa, ea.psn, &eb)?;
        connect_rc(&devs[1].qps[j], &pb, eb.psn, &ea)?;
    }
    // Every QP keeps `depth` receives posted.
    for d in devs {
        for (j, qp) in d.qps.iter().enumerate() {
            let sges: Vec<[Sge; 1]> = (0..lay.depth)
                .map(|r| d.recv.sge(lay.recv(j, r), lay.max).map(|s| [s]))
                .collect::<Result<_, _>>()?;
            let wrs: Vec<RecvWr<'_>> = sges
                .iter()
                .enumerate()
                .map(|(r, s)| RecvWr::new(RECV_BIT | ((j as u64) << 40) | r as u64, s))
                .collect();
            qp.post_recv(&wrs)
                .map_err(|e| SoakFailure::setup(format!("{}: QP {j}: post_recv: {e}", d.name)))?;
        }
    }
    Ok(())
}

/// What both workers share.
struct Shared<'a, B: Backend> {
    cfg: &'a SoakConfig,
    mix: Mix,
    lay: Layout,
    devs: &'a [Device<B>; 2],
    progress: &'a AtomicU64,
    abort: &'a AtomicBool,
}

impl<'a, B: Backend> Shared<'a, B> {
    /// The worker of device `side`, with everything its checks need allocated now.
    fn worker(&self, side: usize, tallies: &[Tally; 2]) -> Worker<'a, B> {
        let (cfg, lay) = (self.cfg, self.lay);
        let peer = 1 - side;
        let t = &tallies[side];
        Worker {
            side,
            cfg,
            mix: self.mix,
            lay,
            dev: &self.devs[side],
            peer_target: self.devs[peer].target.remote(),
            peer_atomics: self.devs[peer].atomics.remote(),
            qs: (0..lay.n)
                .map(|j| QpTrack {
                    next_post: 0,
                    next_done: 0,
                    pending: vec![Pending::Free; lay.depth],
                    slot_last: vec![(INIT, 0); cfg.slots],
                    slot_dirty: vec![false; cfg.slots],
                    slot_read: vec![None; cfg.slots],
                    chain_value: chain_init(cfg.seed, side, j),
                    shared_guess: SHARED_INIT,
                    last_imm: None,
                    recvs: 0,
                })
                .collect(),
            recv_expect: tallies[peer].sends.clone(),
            adds_planned: t.adds.clone(),
            adds_done: vec![0; cfg.counters],
            add_bits: t.adds.iter().map(|&a| Bits::new(a)).collect(),
            shared_bits: Bits::new(t.shared),
            counts: OpCounts::default(),
            recv_done: 0,
            bytes: 0,
            progress: self.progress,
            abort: self.abort,
            problems: Vec::new(),
            scratch: vec![0u8; lay.max],
        }
    }
}

/// The traffic's time and memory.
struct Traffic {
    elapsed: Duration,
    end: Instant,
    /// When the warm-up ended, and the WRs completed by then.
    warm: Option<(Instant, u64)>,
    rss_before: u64,
    rss_after: u64,
    rss_peak: u64,
}

/// Runs both workers on threads of their own, sampling RSS after the warm-up and every
/// 50 ms.
fn traffic<B: Backend>(
    workers: &mut [Worker<'_, B>],
    progress: &AtomicU64,
    abort: &AtomicBool,
    cfg: &SoakConfig,
) -> Traffic {
    let total_ops = cfg.qps as u64 * cfg.ops_per_qp;
    let warm_target = ((total_ops as f64 * cfg.warmup.clamp(0.0, 0.9)) as u64).max(1);
    let start = Instant::now();
    let mut rss_before = 0;
    let mut rss_peak = rss_bytes();
    let mut warm: Option<(Instant, u64)> = None;
    std::thread::scope(|s| {
        let handles: Vec<_> = workers.iter_mut().map(|w| s.spawn(move || w.run())).collect();
        let mut last_sample = Instant::now();
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(2));
            let done = progress.load(Ordering::Relaxed);
            if warm.is_none() && done >= warm_target {
                rss_before = rss_bytes();
                rss_peak = rss_peak.max(rss_before);
                warm = Some((Instant::now(), done));
            }
            if last_sample.elapsed() >= Duration::from_millis(50) {
                rss_peak = rss_peak.max(rss_bytes());
                last_sample = Instant::now();
            }
        }
        for h in handles {
            if h.join().is_err() {
                abort.store(true, Ordering::Release);
            }
        }
    });
    let elapsed = start.elapsed();
    let end = Instant::now();
    let rss_after = rss_bytes();
    rss_peak = rss_peak.max(rss_after);
    if warm.is_none() {
        // Finished before the first sample (tiny runs): the baseline is the end.
        rss_before = rss_after;
    }
    Traffic {
        elapsed,
        end,
        warm,
        rss_before,
        rss_after,
        rss_peak,
    }
}

/// The figures of the run.
fn report_of<B: Backend>(
    backend: &B,
    cfg: &SoakConfig,
    devs: &[Device<B>; 2],
    workers: &[Worker<'_, B>],
    atomics: bool,
    setup_secs: f64,
    t: &Traffic,
) -> SoakReport {
    let mut by_op = OpCounts::default();
    let mut ops = 0;
    let mut recvs = 0;
    let mut bytes = 0;
    for w in workers {
        by_op.add(&w.counts);
        ops += w.qs.iter().map(|q| q.next_done).sum::<u64>();
        recvs += w.recv_done;
        bytes += w.bytes;
    }
    let secs = t.elapsed.as_secs_f64().max(1e-9);
    SoakReport {
        backend: backend.name().to_string(),
        devices: [devs[0].name.clone(), devs[1].name.clone()],
        qps: cfg.qps,
        ops_per_qp: cfg.ops_per_qp,
        depth: cfg.depth,
        sizes: cfg.sizes.clone(),
        seed: cfg.seed,
        atomics,
        ops,
        recv_completions: recvs,
        by_op,
        bytes,
        setup_secs,
        elapsed_secs: secs,
        ops_per_sec: ops as f64 / secs,
        steady_ops_per_sec: match t.warm {
            Some((w, done)) if t.end > w => (ops.saturating_sub(done)) as f64 / (t.end - w).as_secs_f64(),
            _ => ops as f64 / secs,
        },
        mib_per_sec: bytes as f64 / (1 << 20) as f64 / secs,
        rss_before: t.rss_before,
        rss_after: t.rss_after,
        rss_peak: t.rss_peak,
        max_rss_growth: cfg.max_rss_growth,
    }
}
