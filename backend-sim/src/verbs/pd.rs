//! Protection domains and the objects made in one (`ibv_alloc_pd`): memory regions
//! (`ibv_reg_mr`, owned or over caller memory, and `ibv_rereg_mr` where the profile has
//! it), memory windows (`ibv_alloc_mw`), shared receive queues (`ibv_create_srq`),
//! address handles (`ibv_create_ah`) and QPs (`ibv_create_qp`: RC, UC and UD).

use std::sync::Arc;

use verbs_api::{AccessFlags, AhAttr, Error, MwType, ProtectionDomain, QpCap, QpInitAttr, Result, SrqAttr};

use super::ah::SimAh;
use super::backend::SimBackend;
use super::cq::SimCq;
use super::mw::SimMw;
use super::qp::SimQp;
use super::srq::SimSrq;
use crate::choices::Choice;
use crate::device::PdShared;
use crate::onesided::swap::Swapped;
use crate::onesided::table::MrSlot;
use crate::qp::QpShared;
use backend_sim_proto::memory::MrShared;
use backend_sim_proto::recv_queue::SharedRecvQueue;

/// A protection domain of the sim.
pub struct SimPd {
    pub(crate) pd: Arc<PdShared>,
}

impl ProtectionDomain for SimPd {
    type Backend = SimBackend;

    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<SimMr> {
        check_mr_access(access)?;
        let dev = &self.pd.dev;
        let key = dev.mrs.fresh_key(dev.choices.draw(Choice::MrKey));
        let mr = MrShared::new_owned(self.pd.handle, key, len, access).ok_or_else(|| Error::NoMemory {
            call: "ibv_reg_mr",
            reason: format!("cannot allocate {len} bytes"),
        })?;
        Ok(SimMr::register(self, mr))
    }

    unsafe fn reg_mr_raw(&self, addr: *mut u8, len: usize, access: AccessFlags) -> Result<SimMr> {
        check_mr_access(access)?;
        if addr.is_null() && len > 0 {
            return Err(Error::invalid("ibv_reg_mr", "null address"));
        }
        // The caller's contract says the memory is valid; a caller's bug still gets the
        // kernel's EFAULT rather than a region over memory it does not own.
        crate::mapping::check(addr as usize, len, access)?;
        let key = self.pd.dev.mrs.fresh_key(self.pd.dev.choices.draw(Choice::MrKey));
        // SAFETY: the caller guarantees the memory stays valid until the MR is dropped,
        // and `SimMr::drop` calls `kill` before returning.
        let mr = unsafe { MrShared::new_borrowed(self.pd.handle, key, addr, len, access) };
        Ok(SimMr::register(self, mr))
    }

    fn create_srq(&self, attr: &SrqAttr) -> Result<SimSrq> {
        let a = &self.pd.dev.attr;
        let min = self.pd.dev.limits.min_srq_wr;
        if attr.max_wr < min || attr.max_wr > a.max_srq_wr {
            return Err(Error::InvalidAttr {
                name: "max_wr",
                reason: format!("{} is outside {min}..={} (max_srq_wr)", attr.max_wr, a.max_srq_wr),
            });
        }
        if attr.max_sge > a.max_srq_sge {
            return Err(Error::InvalidAttr {
                name: "max_sge",
                reason: format!(
                    "{} exceeds the device limit {} (max_srq_sge)",
                    attr.max_sge, a.max_srq_sge
                ),
            });
        }
        // As rxe: max_sge 0 is granted as 1. A limit given here is armed only where the
        // profile says so (`Switches::srq_limit_at_create`: rxe arms it, mlx5 and the man
        // page ignore it).
        let dev = &self.pd.dev;
        let limit = if dev.profile.switches().srq_limit_at_create {
            attr.srq_limit
        } else {
            if attr.srq_limit > 0 && dev.profile.warns() {
                dev.advice.srq_limit_at_create(attr.srq_limit);
            }
            0
        };
        // The SRQ may hold more than asked (`Switches::queue_sizing`: rxe rounds it up to
        // a power of two minus one); the limit is on what was asked.
        let entries = dev.profile.switches().queue_sizing.srq_entries(attr.max_wr);
        let srq = SharedRecvQueue::new(dev.next_handle(), entries, attr.max_sge.max(1), limit);
        Ok(SimSrq {
            srq: Arc::new(srq),
            pd: self.pd.clone(),
        })
    }

    fn create_ah(&self, attr: &AhAttr) -> Result<SimAh> {
        SimAh::create(&self.pd, attr)
    }

    fn alloc_mw(&self, mw_type: MwType) -> Result<SimMw> {
        let dev = &self.pd.dev;
        let caps = dev.capabilities();
        let served = match mw_type {
            MwType::Type1 => caps.mw_type1,
            MwType::Type2 => caps.mw_type2,
        };
        if !served {
            return Err(Error::Unsupported {
                backend: "sim",
                what: format!("ibv_alloc_mw of a {mw_type:?} window on a {} device", dev.profile),
            });
        }
        let mw = dev
            .mrs
            .alloc_window(self.pd.handle, mw_type, dev.choices.draw(Choice::MwKey));
        Ok(SimMw::new(mw, self.pd.clone()))
    }

    fn rereg_mr(&self, mr: &mut SimMr, access: Option<AccessFlags>) -> Result<()> {
        // SAFETY: the region keeps its memory, which it keeps valid (owned: its backing;
        // caller memory: the contract it was registered under).
        unsafe { self.rereg(mr, None, access) }
    }

    unsafe fn rereg_mr_raw(
        &self,
        mr: &mut SimMr,
        addr: *mut u8,
        len: usize,
        access: Option<AccessFlags>,
    ) -> Result<()> {
        // SAFETY: the caller's contract (as `reg_mr_raw`'s) covers the new memory.
        unsafe { self.rereg(mr, Some((addr, len)), access) }
    }

    fn create_qp(&self, attr: &QpInitAttr<'_, SimCq, SimSrq>) -> Result<SimQp> {
        let dev = &self.pd.dev;
        if !Arc::ptr_eq(&attr.send_cq.dev, dev) || !Arc::ptr_eq(&attr.recv_cq.dev, dev) {
            return Err(Error::invalid("ibv_create_qp", "a CQ belongs to another device"));
        }
        if attr.srq.is_some_and(|s| !Arc::ptr_eq(&s.pd.dev, dev)) {
            return Err(Error::invalid(
                "ibv_create_qp",
                "the SRQ belongs to another device",
            ));
        }
        // With an SRQ the receive capacities are ignored (`man ibv_create_qp`), and
        // granted as 0, as rxe reports them.
        let c = match attr.srq {
            Some(_) => QpCap {
                max_recv_wr: 0,
                max_recv_sge: 0,
                ..attr.cap
            },
            None => attr.cap,
        };
        let a = &dev.attr;
        let checks = [
            ("max_send_wr", c.max_send_wr, a.max_qp_wr),
            ("max_recv_wr", c.max_recv_wr, a.max_qp_wr),
            ("max_send_sge", c.max_send_sge, a.max_sge),
            ("max_recv_sge", c.max_recv_sge, a.max_sge),
            ("max_inline_data", c.max_inline_data, dev.limits.max_inline),
        ];
        for (name, asked, max) in checks {
            if asked > max {
                return Err(Error::InvalidAttr {
                    name,
                    reason: format!("{asked} exceeds the device limit {max}"),
                });
            }
        }
        // The device may give more than asked (`Switches::queue_sizing`: rxe rounds its
        // queues up to a power of two minus one and its SGEs to its WQE's size).
        let c = dev.profile.switches().queue_sizing.qp_cap(c);
        let granted = QpCap {
            max_send_sge: c.max_send_sge.max(1),
            max_recv_sge: if attr.srq.is_some() {
                0
            } else {
                c.max_recv_sge.max(1)
            },
            ..c
        };
        // Flags the profile's device takes (mlx5's block of self multicast loopback);
        // others are EOPNOTSUPP, as rxe's and mlx5's kernels answer.
        let unknown = attr.create_flags & !dev.limits.qp_create_flags;
        if unknown != 0 {
            return Err(Error::Unsupported {
                backend: "sim",
                what: format!(
                    "ibv_create_qp_ex create_flags {unknown:#x} (this {} device takes {:#x})",
                    dev.profile, dev.limits.qp_create_flags
                ),
            });
        }
        let block_self = attr.create_flags & verbs_api::QP_CREATE_BLOCK_SELF_MCAST_LB != 0;
        let qpn = dev.alloc_qpn();
        let qp = Arc::new(
            QpShared::new(
                qpn,
                attr.qp_type,
                dev.for_qp(),
                self.pd.handle,
                attr.send_cq.cq.clone(),
                attr.recv_cq.cq.clone(),
                attr.srq.map(|s| s.srq.clone()),
                granted,
                attr.sq_sig_all,
            )
            .blocking_self_mcast(block_self),
        );
        dev.qps.lock().insert(qpn, Arc::downgrade(&qp));
        Ok(SimQp {
            qp,
            pd: self.pd.clone(),
        })
    }
}

impl SimPd {
    /// `ibv_rereg_mr` on a device whose profile has it: `mr` moves to this PD, covers
    /// `translation` (or its memory as it was) with `access` (or its access as it was),
    /// and keeps its keys. The region that was is fenced (`MrShared::kill`) before this
    /// returns; memory windows bound to it stay bound to it, and refuse accesses.
    ///
    /// # Safety
    ///
    /// A `translation` must stay valid as `reg_mr_raw` requires.
    unsafe fn rereg(
        &self,
        mr: &mut SimMr,
        translation: Option<(*mut u8, usize)>,
        access: Option<AccessFlags>,
    ) -> Result<()> {
        let dev = &self.pd.dev;
        if !dev.limits.rereg_mr {
            return Err(Error::Unsupported {
                backend: "sim",
                what: format!(
                    "ibv_rereg_mr on a {} device (rxe has no rereg_user_mr)",
                    dev.profile
                ),
            });
        }
        if !Arc::ptr_eq(&mr._pd.dev, dev) {
            return Err(Error::invalid(
                "ibv_rereg_mr",
                "the PD belongs to another device than the region",
            ));
        }
        let access = access.unwrap_or(mr.mr.access);
        check_mr_access(access)?;
        let (base, len) = translation.unwrap_or((mr.mr.base(), mr.mr.len()));
        if base.is_null() && len > 0 {
            return Err(Error::invalid("ibv_rereg_mr", "null address"));
        }
        crate::mapping::check(base as usize, len, access)?;
        // SAFETY: the memory is the region's own (kept by `backing` below) or the
        // caller's new memory, valid by the contract of this function.
        let new = unsafe { MrShared::new_borrowed(self.pd.handle, mr.mr.key, base, len, access) };
        // Same-host peers stop reaching the region as it was before it changes.
        mr.revoke();
        let old = std::mem::replace(&mut mr.mr, Arc::new(new));
        dev.mrs.insert(mr.mr.clone());
        old.kill();
        // The old range's pages go back to private memory before the new range's move
        // (they may be the same pages).
        mr.mapped = None;
        if let Some(o) = &dev.onesided {
            mr.mapped = o.map_region(&mr.mr);
            mr.published = o.publish_mr(&mr.mr, mr.mapped.as_ref());
        }
        if translation.is_none() {
            // The region's memory, if it owns it, lives as long as the region.
            mr.backing.get_or_insert(old);
        } else {
            mr.backing = None;
        }
        mr._pd = self.pd.clone();
        Ok(())
    }
}

fn check_mr_access(access: AccessFlags) -> Result<()> {
    if !access.is_valid_for_mr() {
        return Err(Error::invalid(
            "ibv_reg_mr",
            format!("{access:?}: remote write and remote atomic access require LOCAL_WRITE"),
        ));
    }
    Ok(())
}

/// A registered memory region of the sim.
pub struct SimMr {
    pub(crate) mr: Arc<MrShared>,
    pub(crate) _pd: Arc<PdShared>,
    /// After `ibv_rereg_mr` without a new translation: the region it was registered as
    /// first, which owns the memory (an owned buffer) the region now borrows.
    backing: Option<Arc<MrShared>>,
    /// Its place in the device's table for same-host peers' one-sided fast path, if
    /// published there.
    published: Option<MrSlot>,
    /// In map mode, the memfd its pages were moved into (moved back when this drops,
    /// which `drop` does after the region is revoked and dead).
    mapped: Option<Swapped>,
}

impl SimMr {
    fn register(pd: &SimPd, mr: MrShared) -> SimMr {
        let mr = Arc::new(mr);
        let o = pd.pd.dev.onesided.as_ref();
        // Moved before the region is in the device's table, so that no WRITE over the
        // connection lands in it while its bytes are copied.
        let mapped = o.and_then(|o| o.map_region(&mr));
        pd.pd.dev.mrs.insert(mr.clone());
        let published = o.and_then(|o| o.publish_mr(&mr, mapped.as_ref()));
        SimMr {
            mr,
            _pd: pd.pd.clone(),
            backing: None,
            published,
            mapped,
        }
    }

    /// Takes the region out of the fast path's table, waiting for same-host peers'
    /// copies into it to end.
    fn revoke(&mut self) {
        if let (Some(slot), Some(o)) = (self.published.take(), &self._pd.dev.onesided) {
            o.revoke_mr(slot);
        }
    }

    /// How many memory windows are bound to the region (`ibv_dereg_mr` of a region with
    /// windows bound is EINVAL, IBA 10.6.7.2.6, as rxe's `rxe_dereg_mr()` refuses it).
    pub fn windows_bound(&self) -> usize {
        self._pd.dev.mrs.windows_bound_to(self.mr.key)
    }

    /// The handle of the PD the region belongs to now.
    pub fn pd_handle(&self) -> u32 {
        self._pd.handle
    }
}

impl Drop for SimMr {
    fn drop(&mut self) {
        // Same-host peers' direct copies first (waited for), then the device's own:
        // it waits for copies in progress; later ones find the region dead.
        self.revoke();
        self._pd.dev.mrs.deregister(&self.mr);
        // The pages back in private memory while the region's memory is still there
        // (an owned buffer goes with the last reference, `self.mr` perhaps).
        self.mapped = None;
    }
}

backend_sim_proto::impl_memory_region!(SimMr, mr);
