//! One device of the soak and what it holds ([`Device`]).

use verbs_api::{AccessFlags, Backend, Context, MemoryRegion, ProtectionDomain, QpCap, QpInitAttr};

use super::config::SoakConfig;
use super::layout::Layout;
use super::report::SoakFailure;

/// One device of the soak: its context, CQs and QPs, and four regions: the target of
/// the peer's WRITEs and READs, the atomic words, this side's send buffers and its
/// receive buffers.
pub(super) struct Device<B: Backend> {
    pub(super) name: String,
    pub(super) ctx: B::Context,
    pub(super) _pd: B::Pd,
    pub(super) cqs: Vec<B::Cq>,
    pub(super) qps: Vec<B::Qp>,
    pub(super) target: B::Mr,
    pub(super) atomics: B::Mr,
    pub(super) local: B::Mr,
    pub(super) recv: B::Mr,
}

impl<B: Backend> Device<B> {
    /// Opens device `name` and creates what `lay` lays out (every buffer touched now).
    pub(super) fn open(backend: &B, name: &str, cfg: &SoakConfig, lay: &Layout) -> Result<Self, SoakFailure> {
        let ctx = backend.open(name)?;
        let attr = ctx.query_device()?;
        if lay.n > attr.max_qp as usize {
            return Err(SoakFailure::setup(format!(
                "{name}: {} QPs exceed max_qp {}",
                lay.n, attr.max_qp
            )));
        }
        let pd = ctx.alloc_pd()?;
        let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let target = pd.reg_mr(lay.target_len(), remote)?;
        let atomics = pd.reg_mr(
            lay.atomics_len(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
        )?;
        let local = pd.reg_mr(lay.local_len(), AccessFlags::LOCAL_WRITE)?;
        let recv = pd.reg_mr(lay.local_len(), AccessFlags::LOCAL_WRITE)?;
        // Every page resident before the run (the RSS baseline must not include them).
        local.fill(0x5a);
        recv.fill(0xa5);
        let per_cq = cfg.qps_per_cq.max(1).min(lay.n);
        let cqe = (per_cq * 2 * lay.depth) as u32;
        if cqe > attr.max_cqe {
            return Err(SoakFailure::setup(format!(
                "{name}: a CQ for {per_cq} QPs needs {cqe} entries, max_cqe is {} (lower qps_per_cq)",
                attr.max_cqe
            )));
        }
        let cqs = (0..lay.n.div_ceil(per_cq))
            .map(|_| ctx.create_cq(cqe, None))
            .collect::<Result<Vec<_>, _>>()?;
        let cap = QpCap::new(lay.depth as u32, lay.depth as u32);
        let qps = (0..lay.n)
            .map(|j| {
                let cq = &cqs[j / per_cq];
                pd.create_qp(&QpInitAttr::rc(cq, cq, cap))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Device {
            name: name.to_string(),
            ctx,
            _pd: pd,
            cqs,
            qps,
            target,
            atomics,
            local,
            recv,
        })
    }
}
