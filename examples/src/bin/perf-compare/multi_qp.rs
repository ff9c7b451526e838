//! Many QPs on one device, in this process (their peers on a second device): the
//! aggregate bandwidth of RDMA WRITEs over `qps` QPs ([`multi_qp_write_bw`], the QP rows
//! and the QP curve) and the latency of one WRITE taking the QPs in turn
//! ([`multi_qp_write_lat`]).

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use examples::stats::median;
use examples::Res;
use verbs_api::*;

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
pub enum Posting {
    /// One WR per `post_send` (perftest's default, `--post_list 1`).
    Single,
    /// Each QP's refill as one list (as `perf write_bw` posts).
    List,
}

/// WRITEs each QP keeps outstanding in the QP curve: 16, and at most 1024 in all.
pub fn curve_depth(qps: usize) -> usize {
    (1024 / qps).clamp(1, 16)
}

type Sim = backend_sim::SimBackend;

/// Two sim devices in this process and `qps` RC QPs connected across them: QP `i` of
/// device A (all on one CQ) with QP `i` of device B.
struct Rig {
    pairs: Vec<(QpOf<Sim>, QpOf<Sim>)>,
    _cq_b: CqOf<Sim>,
    cq_a: CqOf<Sim>,
    pd_b: PdOf<Sim>,
    pd_a: PdOf<Sim>,
    _b: ContextOf<Sim>,
    _a: ContextOf<Sim>,
    _sim: Sim,
}

impl Rig {
    /// The devices, a CQ of `cqe_a` entries on A (at most the device's `max_cqe`: the
    /// default profile takes rxe's 32767), and the QPs with `cap`.
    fn new(qps: usize, cqe_a: u32, cap: QpCap) -> Res<Rig> {
        let sim = backend_sim::SimBackend::default();
        let a = sim.open("sim0")?;
        let b = sim.open("sim1")?;
        let pd_a = a.alloc_pd()?;
        let pd_b = b.alloc_pd()?;
        let cq_a = a.create_cq(cqe_a.min(a.query_device()?.max_cqe), None)?;
        let cq_b = b.create_cq(64, None)?;
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
        Ok(Rig {
            pairs,
            _cq_b: cq_b,
            cq_a,
            pd_b,
            pd_a,
            _b: b,
            _a: a,
            _sim: sim,
        })
    }

    /// A source region of `size` bytes on A and a remotely writable target on B.
    fn regions(&self, size: usize) -> Res<(MrOf<Sim>, MrOf<Sim>)> {
        let src = self.pd_a.reg_mr(size, AccessFlags::LOCAL_WRITE)?;
        let dst = self
            .pd_b
            .reg_mr(size, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
        Ok((src, dst))
    }
}

/// Aggregate MB/s of RDMA WRITEs of `size` bytes over `qps` QPs on one device (their
/// peers on a second device in this process), `depth` WRs outstanding per QP, posted as
/// `posting` says.
pub fn multi_qp_write_bw(qps: usize, depth: usize, size: usize, total: u64, posting: Posting) -> Res<f64> {
    let rig = Rig::new(qps, 65536, QpCap::new(depth as u32, 1))?;
    let (src, dst) = rig.regions(size)?;
    let (cq_a, pairs) = (&rig.cq_a, &rig.pairs);
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
    all_ok(&poll_n(cq_a, qps, Duration::from_secs(60))?, qps)?;
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
pub fn multi_qp_write_lat(qps: usize, iters: u64) -> Res<f64> {
    let rig = Rig::new(qps, 4096, QpCap::new(4, 1).with_inline(64))?;
    let (src, dst) = rig.regions(64)?;
    let (cq_a, qs) = (&rig.cq_a, &rig.pairs);
    let sge = [src.sge(0, 8)?];
    let mut lat = Vec::with_capacity(iters as usize);
    let total = iters + qps as u64;
    for i in 0..total {
        let (qa, _) = &qs[(i as usize) % qps];
        let t0 = Instant::now();
        qa.post_send(&[SendWr::write(i, &sge, dst.remote().at(0)).signaled().inline()])
            .map_err(|e| anyhow!("{e}"))?;
        all_ok(&poll_n(cq_a, 1, Duration::from_secs(10))?, qps)?;
        // The first round sets the connections up: not counted.
        if i >= qps as u64 {
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(median(lat))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The many-QP rows run on the sim's default profile, whose CQs are at most rxe's
    /// 32767 entries: the rig asked for 65536, and every run of the harness stopped at
    /// its 64-QP row with EINVAL from `ibv_create_cq`.
    #[test]
    fn the_many_qp_rows_run_on_the_default_profile() {
        for posting in [Posting::Single, Posting::List] {
            let mbps = multi_qp_write_bw(2, 4, 4096, 1 << 20, posting).unwrap();
            assert!(mbps > 0.0, "{mbps} MB/s");
        }
    }
}
