//! A device of the deterministic world as the verbs see it (`man ibv_open_device`,
//! `ibv_query_device`, `ibv_query_port`, `ibv_query_gid`, `ibv_alloc_pd`,
//! `ibv_reg_mr`): one InfiniBand port, LID `n + 1` and GID `fe80::n+1` for the world's
//! `n`-th device, regions whose keys the seed draws.

use std::sync::Arc;
use std::time::Duration;

use backend_sim_proto::memory::MrShared;
use verbs_api::{
    AccessFlags, AsyncEvent, AtomicCap, Capabilities, Context, DeviceAttr, Error, Gid, LinkLayer, Mtu,
    PortAttr, PortState, ProtectionDomain, QpInitAttr, Result, SrqAttr,
};

use crate::cq::{DetChannel, DetCq};
use crate::det::Det;
use crate::handles::{DetContext, DetPd};
use crate::limits::{
    gid, guid, MAX_CQE, MAX_INLINE, MAX_MSG, MAX_QP_WR, MAX_RD_ATOM, MAX_SGE, MAX_SRQ, MAX_SRQ_SGE,
    MAX_SRQ_WR,
};
use crate::qp::DetQp;
use crate::refuse::{refused, DetAh, DetMw};
use crate::shared::Shared;
use crate::srq::DetSrq;
use crate::world::CqState;

impl DetContext {
    fn check_port(&self, port_num: u8) -> Result<()> {
        if port_num == 1 {
            Ok(())
        } else {
            Err(Error::invalid(
                "ibv_query_port",
                format!("port {port_num} does not exist (the device has port 1)"),
            ))
        }
    }
}

impl Context for DetContext {
    type Backend = Det;

    fn name(&self) -> &str {
        &self.name
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        self.shared.check("ibv_query_device")?;
        Ok(DeviceAttr {
            fw_ver: "det".into(),
            node_guid: guid(self.dev),
            sys_image_guid: guid(self.dev),
            max_mr_size: u64::from(u32::MAX),
            page_size_cap: 4096,
            max_qp: 1 << 16,
            max_qp_wr: MAX_QP_WR,
            max_sge: MAX_SGE,
            max_sge_rd: MAX_SGE,
            max_cq: 1 << 16,
            max_cqe: MAX_CQE,
            max_mr: 1 << 16,
            max_pd: 1 << 16,
            max_qp_rd_atom: MAX_RD_ATOM,
            max_qp_init_rd_atom: MAX_RD_ATOM,
            atomic_cap: AtomicCap::Hca,
            max_pkeys: 1,
            phys_port_cnt: 1,
            max_srq: MAX_SRQ,
            max_srq_wr: MAX_SRQ_WR,
            max_srq_sge: MAX_SRQ_SGE,
            ..Default::default()
        })
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        self.shared.check("ibv_query_port")?;
        self.check_port(port_num)?;
        Ok(PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu4096,
            gid_tbl_len: 1,
            max_msg_sz: MAX_MSG,
            pkey_tbl_len: 1,
            lid: self.dev as u16 + 1,
            link_layer: LinkLayer::InfiniBand,
            ..Default::default()
        })
    }

    fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid> {
        self.shared.check("ibv_query_gid")?;
        self.check_port(port_num)?;
        if index != 0 {
            return Err(Error::invalid(
                "ibv_query_gid",
                format!("GID index {index}: the table has 1"),
            ));
        }
        Ok(gid(self.dev))
    }

    fn capabilities(&self) -> Result<Capabilities> {
        self.shared.check("ibv_query_device")?;
        let mut c = Capabilities::default();
        c.atomic_cap = AtomicCap::Hca;
        c.imm_data = true;
        c.uc = true;
        c.srq = true;
        c.max_srq = MAX_SRQ;
        c.max_srq_wr = MAX_SRQ_WR;
        c.max_srq_sge = MAX_SRQ_SGE;
        c.srq_resize = true;
        c.max_inline_data = MAX_INLINE;
        c.max_send_sge = MAX_SGE;
        c.max_recv_sge = MAX_SGE;
        c.max_sge_rd = MAX_SGE;
        c.max_qp_wr = MAX_QP_WR;
        c.max_cqe = MAX_CQE;
        c.max_qp_init_rd_atom = MAX_RD_ATOM;
        c.max_qp_rd_atom = MAX_RD_ATOM;
        c.max_msg_sz = MAX_MSG;
        c.max_mr_size = u64::from(u32::MAX);
        c.link_layer = LinkLayer::InfiniBand;
        Ok(c)
    }

    fn alloc_pd(&self) -> Result<DetPd> {
        let handle = self.shared.enter("ibv_alloc_pd")?.fresh_pd();
        Ok(DetPd {
            ctx: self.clone(),
            handle,
        })
    }

    fn create_comp_channel(&self) -> Result<DetChannel> {
        let mut w = self.shared.enter("ibv_create_comp_channel")?;
        w.channels.push(Default::default());
        Ok(DetChannel {
            shared: self.shared.clone(),
            handle: w.channels.len() as u32 - 1,
        })
    }

    fn create_cq(&self, cqe: u32, channel: Option<&DetChannel>) -> Result<DetCq> {
        let mut w = self.shared.enter("ibv_create_cq")?;
        if cqe == 0 || cqe > MAX_CQE {
            return Err(Error::invalid(
                "ibv_create_cq",
                format!("cqe {cqe} is not in 1..={MAX_CQE}"),
            ));
        }
        if channel.is_some_and(|c| !Arc::ptr_eq(&c.shared, &self.shared)) {
            return Err(Error::invalid("ibv_create_cq", "the channel is of another world"));
        }
        w.cqs.push(CqState {
            entries: Default::default(),
            cap: cqe,
            lost: 0,
            armed: None,
            channel: channel.map(|c| c.handle),
        });
        Ok(DetCq {
            shared: self.shared.clone(),
            handle: w.cqs.len() as u32 - 1,
            has_channel: channel.is_some(),
        })
    }

    fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
        let mut w = self.shared.enter("ibv_get_async_event")?;
        let until = timeout.map(|t| w.net.now() + t);
        loop {
            if let Some(e) = w.contexts[self.id].pop_front() {
                w.progressed();
                return Ok(Some(e));
            }
            if !w.wait_step(|| "ibv_get_async_event".into(), until)? {
                return match timeout {
                    Some(_) => Ok(None),
                    None => Err(refused(
                        "ibv_get_async_event without a timeout, with no event pending and \
                         nothing left to happen in the deterministic world: it would wait \
                         forever; pass a timeout (virtual time) or check for events after the \
                         operation that raises them",
                    )),
                };
            }
        }
    }

    fn ack_async_event(&self, _event: AsyncEvent) {}

    fn async_fd(&self) -> std::os::fd::RawFd {
        -1
    }
}

impl ProtectionDomain for DetPd {
    type Backend = Det;

    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<DetMr> {
        self.register(len, access, |key| {
            MrShared::new_owned(self.handle, key, len, access)
        })
    }

    unsafe fn reg_mr_raw(&self, addr: *mut u8, len: usize, access: AccessFlags) -> Result<DetMr> {
        self.register(len, access, |key| {
            // SAFETY: the caller keeps `addr..addr + len` valid until the MR is dropped
            // (this function's contract), and DetMr's drop kills the region first.
            Some(unsafe { MrShared::new_borrowed(self.handle, key, addr, len, access) })
        })
    }

    fn create_qp(&self, attr: &QpInitAttr<'_, DetCq, DetSrq>) -> Result<DetQp> {
        DetQp::create(self, attr)
    }

    fn create_srq(&self, attr: &SrqAttr) -> Result<DetSrq> {
        DetSrq::create(self, attr)
    }

    fn create_ah(&self, _: &verbs_api::AhAttr) -> Result<DetAh> {
        Err(refused(
            "ibv_create_ah: UD is not in the deterministic world yet (RC and UC are)",
        ))
    }

    fn alloc_mw(&self, _: verbs_api::MwType) -> Result<DetMw> {
        Err(refused(
            "ibv_alloc_mw: memory windows are not in the deterministic world yet",
        ))
    }

    fn rereg_mr(&self, _: &mut DetMr, _: Option<AccessFlags>) -> Result<()> {
        Err(refused(
            "ibv_rereg_mr: not in the deterministic world (as on rxe)",
        ))
    }

    unsafe fn rereg_mr_raw(&self, _: &mut DetMr, _: *mut u8, _: usize, _: Option<AccessFlags>) -> Result<()> {
        Err(refused(
            "ibv_rereg_mr: not in the deterministic world (as on rxe)",
        ))
    }
}

impl DetPd {
    /// Registers the region `make` builds with a key the seed draws.
    fn register(
        &self,
        len: usize,
        access: AccessFlags,
        make: impl FnOnce(u32) -> Option<MrShared>,
    ) -> Result<DetMr> {
        if !access.is_valid_for_mr() {
            return Err(Error::invalid(
                "ibv_reg_mr",
                format!("{access:?}: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE"),
            ));
        }
        let mut w = self.ctx.shared.enter("ibv_reg_mr")?;
        let key = w.fresh_key(self.ctx.dev);
        let mr = Arc::new(make(key).ok_or_else(|| Error::NoMemory {
            call: "ibv_reg_mr",
            reason: format!("{len} bytes"),
        })?);
        w.devices[self.ctx.dev].mrs.insert(mr.clone());
        Ok(DetMr {
            shared: self.ctx.shared.clone(),
            dev: self.ctx.dev,
            mr,
        })
    }
}

/// A registered region of the deterministic world.
pub struct DetMr {
    shared: Arc<Shared>,
    dev: usize,
    mr: Arc<MrShared>,
}

impl Drop for DetMr {
    fn drop(&mut self) {
        self.shared.lock_any().devices[self.dev].mrs.deregister(&self.mr);
    }
}

backend_sim_proto::impl_memory_region!(DetMr, mr);
