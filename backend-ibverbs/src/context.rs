//! An open device: `ibv_open_device` / `ibv_close_device`, `ibv_query_device`,
//! `ibv_query_port`, `ibv_query_gid` (`man ibv_open_device`, `man ibv_query_device`,
//! `man ibv_query_port`, `man ibv_query_gid`), the [`Capabilities`] summary, the
//! factories for PDs, completion channels and CQs, and the asynchronous events
//! (`man ibv_get_async_event`), which the context's thread in `async_events.rs` queues.

use std::os::raw::c_int;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use rdma_sys::ibv_device_cap_flags;
use rdma_sys::{ibv_close_device, ibv_context, ibv_device, ibv_device_attr, ibv_gid, ibv_open_device};
use rdma_sys::{ibv_port_attr, ibv_query_device, ibv_query_gid, ibv_transport_type};
use verbs_api::{
    AsyncEvent, AtomicCap, Capabilities, Context, DeviceAttr, Error, Gid, LinkLayer, Mtu, PortAttr,
    PortState, ProtectionDomain, QpCap, QpInitAttr, Result,
};

use crate::async_events::{AsyncThread, Registry};
use crate::cq::{IbvChannel, IbvCq};
use crate::device::IbvBackend;
use crate::errno::{last_errno, rc_errno};
use crate::pd::IbvPd;

/// The shared part of an open device; PDs, CQs and channels hold an `Arc` of it.
pub(crate) struct CtxInner {
    pub(crate) raw: *mut ibv_context,
    pub(crate) name: String,
    pub(crate) registry: Arc<Registry>,
    /// Stopped (and joined) in Drop before the device is closed.
    events: Option<AsyncThread>,
    caps: OnceLock<Capabilities>,
}

// SAFETY: `ibv_context` is safe for multi-threaded access (crate docs, `man ibv_alloc_td`);
// the pointer is closed only in Drop, when no other reference exists. The other fields
// are Send + Sync.
unsafe impl Send for CtxInner {}
// SAFETY: as above.
unsafe impl Sync for CtxInner {}

impl Drop for CtxInner {
    fn drop(&mut self) {
        // Stop the async-event thread first: it uses the context.
        drop(self.events.take());
        // SAFETY: every object created from this context holds an Arc of it, so none is
        // left; the context is closed exactly once.
        unsafe { ibv_close_device(self.raw) };
    }
}

/// An open RDMA device (`struct ibv_context`), from [`IbvBackend`]'s `open`.
///
/// Cloning is cheap and yields another handle to the same open device.
#[derive(Clone)]
pub struct IbvContext {
    pub(crate) inner: Arc<CtxInner>,
}

impl std::fmt::Debug for IbvContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvContext")
            .field("name", &self.inner.name)
            .finish()
    }
}

impl IbvContext {
    /// `ibv_open_device`, then starts the async-event thread.
    pub(crate) fn open(dev: *mut ibv_device, name: String) -> Result<IbvContext> {
        // SAFETY: `dev` comes from a device list that the caller keeps alive.
        let raw = unsafe { ibv_open_device(dev) };
        if raw.is_null() {
            return Err(Error::from_errno("ibv_open_device", last_errno()));
        }
        let registry = match Registry::new() {
            Ok(r) => Arc::new(r),
            Err(e) => {
                // SAFETY: nothing was created from the context yet.
                unsafe { ibv_close_device(raw) };
                return Err(e);
            }
        };
        // SAFETY: `raw` is open and is closed only after the thread is stopped (CtxInner::drop).
        let events = match unsafe { AsyncThread::start(raw, &name, registry.clone()) } {
            Ok(t) => t,
            Err(e) => {
                // SAFETY: nothing was created from the context yet.
                unsafe { ibv_close_device(raw) };
                return Err(e);
            }
        };
        Ok(IbvContext {
            inner: Arc::new(CtxInner {
                raw,
                name,
                registry,
                events: Some(events),
                caps: OnceLock::new(),
            }),
        })
    }

    /// The `struct ibv_context *`, for verbs this crate does not wrap. It stays valid
    /// while this context (or any object created from it) lives.
    pub fn as_raw(&self) -> *mut ibv_context {
        self.inner.raw
    }

    /// Probes the largest `max_inline_data` an RC QP can be created with: tries 1024 and
    /// then bisects, creating throw-away QPs on a throw-away PD and CQ. Returns what the
    /// device granted (which may exceed what was asked), or 0.
    fn probe_max_inline(&self) -> Result<u32> {
        let pd = self.alloc_pd()?;
        let cq = self.create_cq(1, None)?;
        let try_inline = |n: u32| -> Option<u32> {
            let cap = QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: n,
            };
            let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).ok()?;
            Some(qp.granted_cap().max_inline_data.max(n))
        };
        if let Some(granted) = try_inline(1024) {
            return Ok(granted);
        }
        // Invariant: `lo` succeeded (0 always does, or inline is simply unsupported) and
        // `hi` failed.
        let (mut lo, mut hi, mut best) = (0u32, 1024u32, 0u32);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match try_inline(mid) {
                Some(granted) => {
                    lo = mid;
                    best = best.max(granted);
                }
                None => hi = mid,
            }
        }
        Ok(best)
    }
}

/// Maps `struct ibv_device_attr`.
pub(crate) fn device_attr_from_raw(a: &ibv_device_attr) -> DeviceAttr {
    let n = |v: c_int| u32::try_from(v).unwrap_or(0);
    // fw_ver is a NUL-terminated char[64]; take the bytes up to the first NUL.
    let fw: Vec<u8> = a
        .fw_ver
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    DeviceAttr {
        fw_ver: String::from_utf8_lossy(&fw).into_owned(),
        node_guid: u64::from_be(a.node_guid),
        sys_image_guid: u64::from_be(a.sys_image_guid),
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        max_qp: n(a.max_qp),
        max_qp_wr: n(a.max_qp_wr),
        device_cap_flags: a.device_cap_flags,
        max_sge: n(a.max_sge),
        max_sge_rd: n(a.max_sge_rd),
        max_cq: n(a.max_cq),
        max_cqe: n(a.max_cqe),
        max_mr: n(a.max_mr),
        max_mw: n(a.max_mw),
        max_pd: n(a.max_pd),
        max_qp_rd_atom: n(a.max_qp_rd_atom),
        max_qp_init_rd_atom: n(a.max_qp_init_rd_atom),
        atomic_cap: AtomicCap::from_raw(a.atomic_cap),
        max_srq: n(a.max_srq),
        max_srq_wr: n(a.max_srq_wr),
        max_srq_sge: n(a.max_srq_sge),
        max_pkeys: a.max_pkeys,
        phys_port_cnt: a.phys_port_cnt,
        max_mcast_grp: n(a.max_mcast_grp),
        max_mcast_qp_attach: n(a.max_mcast_qp_attach),
        max_total_mcast_qp_attach: n(a.max_total_mcast_qp_attach),
    }
}

/// Maps `struct ibv_port_attr`.
pub(crate) fn port_attr_from_raw(a: &ibv_port_attr) -> PortAttr {
    PortAttr {
        state: PortState::from_raw(a.state),
        max_mtu: Mtu::from_raw(a.max_mtu).unwrap_or_default(),
        active_mtu: Mtu::from_raw(a.active_mtu).unwrap_or_default(),
        gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
        max_msg_sz: a.max_msg_sz,
        pkey_tbl_len: a.pkey_tbl_len,
        lid: a.lid,
        sm_lid: a.sm_lid,
        lmc: a.lmc,
        active_width: a.active_width,
        active_speed: a.active_speed,
        phys_state: a.phys_state,
        link_layer: match a.link_layer {
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            _ => LinkLayer::Unspecified,
        },
        qkey_viol_cntr: a.qkey_viol_cntr,
        bad_pkey_cntr: a.bad_pkey_cntr,
    }
}

/// The [`Capabilities`] a device and its port 1 describe (without the inline probe).
pub(crate) fn capabilities_from(dev: &DeviceAttr, port: &PortAttr, transport_ib: bool) -> Capabilities {
    let mut c = Capabilities::default();
    c.atomic_cap = dev.atomic_cap;
    // Immediate data is part of the IB transport (InfiniBand and RoCE); iWARP has none.
    c.imm_data = transport_ib;
    c.srq = dev.max_srq > 0;
    c.max_srq = dev.max_srq;
    c.max_srq_wr = dev.max_srq_wr;
    c.max_srq_sge = dev.max_srq_sge;
    c.srq_resize = c.srq && dev.device_cap_flags & ibv_device_cap_flags::IBV_DEVICE_SRQ_RESIZE.0 != 0;
    let mw = |f: ibv_device_cap_flags| dev.max_mw > 0 && dev.device_cap_flags & f.0 != 0;
    c.mw_type1 = mw(ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW);
    c.mw_type2 = mw(ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A)
        || mw(ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B);
    // UD and UC are part of the IB transport (InfiniBand and RoCE); iWARP is RC only.
    c.ud = transport_ib;
    c.uc = transport_ib;
    c.max_send_sge = dev.max_sge;
    c.max_recv_sge = dev.max_sge;
    c.max_sge_rd = dev.max_sge_rd;
    c.max_qp_wr = dev.max_qp_wr;
    c.max_cqe = dev.max_cqe;
    c.max_qp_init_rd_atom = dev.max_qp_init_rd_atom;
    c.max_qp_rd_atom = dev.max_qp_rd_atom;
    c.max_msg_sz = port.max_msg_sz;
    c.max_mr_size = dev.max_mr_size;
    c.link_layer = port.link_layer;
    c
}

impl CtxInner {
    /// The link layer of port 1 (InfiniBand when it cannot be queried).
    pub(crate) fn link_layer(&self) -> verbs_api::LinkLayer {
        if let Some(c) = self.caps.get() {
            return c.link_layer;
        }
        // SAFETY: all-zero is a valid `ibv_port_attr`; the context is open (see
        // `query_port`).
        let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as in `query_port`.
        match unsafe { rdma_sys::___ibv_query_port(self.raw, 1, &mut a) } {
            0 => port_attr_from_raw(&a).link_layer,
            _ => verbs_api::LinkLayer::InfiniBand,
        }
    }
}

impl Context for IbvContext {
    type Backend = IbvBackend;

    fn name(&self) -> &str {
        &self.inner.name
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        // SAFETY: all-zero is a valid `ibv_device_attr` (integers and a char array).
        let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `a` is a writable out-parameter.
        let rc = unsafe { ibv_query_device(self.inner.raw, &mut a) };
        if rc != 0 {
            return Err(Error::from_errno("ibv_query_device", rc_errno(rc)));
        }
        Ok(device_attr_from_raw(&a))
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        // SAFETY: all-zero is a valid `ibv_port_attr` (integers only).
        let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `a` is a writable out-parameter of the full,
        // current `struct ibv_port_attr`. `___ibv_query_port` is rdma-sys' version of
        // verbs.h's inline `ibv_query_port` (the exported symbol takes the old, shorter
        // struct).
        let rc = unsafe { rdma_sys::___ibv_query_port(self.inner.raw, port_num, &mut a) };
        if rc != 0 {
            let e = rc_errno(rc);
            if e == libc::EINVAL {
                return Err(Error::InvalidAttr {
                    name: "port_num",
                    reason: format!("port {port_num} does not exist on {}", self.inner.name),
                });
            }
            return Err(Error::from_errno("ibv_query_port", e));
        }
        Ok(port_attr_from_raw(&a))
    }

    fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid> {
        let idx = c_int::try_from(index)
            .map_err(|_| Error::invalid("ibv_query_gid", format!("GID index {index} is out of range")))?;
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: the context is open; `gid` is a writable 16-byte out-parameter.
        let rc = unsafe { ibv_query_gid(self.inner.raw, port_num, idx, &mut gid) };
        if rc != 0 {
            let e = rc_errno(rc);
            if e == libc::EINVAL {
                return Err(Error::invalid(
                    "ibv_query_gid",
                    format!(
                        "no GID at index {index} of port {port_num} on {}",
                        self.inner.name
                    ),
                ));
            }
            return Err(Error::from_errno("ibv_query_gid", e));
        }
        // SAFETY: both union variants are plain bytes covering all 16 bytes.
        Ok(Gid(unsafe { gid.raw }))
    }

    fn capabilities(&self) -> Result<Capabilities> {
        if let Some(c) = self.inner.caps.get() {
            return Ok(c.clone());
        }
        let dev = self.query_device()?;
        let port = self.query_port(1)?;
        // SAFETY: `device` of an open context is valid; `transport_type` is a plain field.
        let transport = unsafe { (*(*self.inner.raw).device).transport_type };
        let mut c = capabilities_from(&dev, &port, transport == ibv_transport_type::IBV_TRANSPORT_IB);
        c.max_inline_data = self.probe_max_inline()?;
        let _ = self.inner.caps.set(c.clone());
        Ok(c)
    }

    fn alloc_pd(&self) -> Result<IbvPd> {
        IbvPd::alloc(self.inner.clone())
    }

    fn create_comp_channel(&self) -> Result<IbvChannel> {
        IbvChannel::create(self.inner.clone())
    }

    fn create_cq(&self, cqe: u32, channel: Option<&IbvChannel>) -> Result<IbvCq> {
        let handle = self.inner.registry.next_cq_handle.fetch_add(1, Ordering::Relaxed);
        IbvCq::create(self.inner.clone(), cqe, channel, handle)
    }

    fn get_async_event(&self, timeout: Option<std::time::Duration>) -> Result<Option<AsyncEvent>> {
        self.inner.registry.events.get(timeout)
    }

    fn ack_async_event(&self, event: AsyncEvent) {
        self.inner.registry.events.ack(event)
    }

    fn async_fd(&self) -> std::os::fd::RawFd {
        self.inner.registry.events.fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_attr_mapping() {
        // SAFETY: all-zero is a valid ibv_device_attr.
        let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
        for (i, b) in b"2.42.5000".iter().enumerate() {
            a.fw_ver[i] = *b as _;
        }
        a.node_guid = 0x0102_0304_0506_0708u64.to_be();
        a.max_qp = 1 << 16;
        a.max_qp_wr = -5; // a provider bug must not wrap around
        a.atomic_cap = rdma_sys::ibv_atomic_cap::IBV_ATOMIC_HCA;
        a.phys_port_cnt = 2;
        let d = device_attr_from_raw(&a);
        assert_eq!(d.fw_ver, "2.42.5000");
        assert_eq!(d.node_guid, 0x0102_0304_0506_0708);
        assert_eq!(d.max_qp, 65536);
        assert_eq!(d.max_qp_wr, 0);
        assert_eq!(d.atomic_cap, AtomicCap::Hca);
        assert_eq!(d.phys_port_cnt, 2);
    }

    #[test]
    fn port_attr_mapping_and_capabilities() {
        // SAFETY: all-zero is a valid ibv_port_attr.
        let mut p: ibv_port_attr = unsafe { std::mem::zeroed() };
        p.state = rdma_sys::ibv_port_state::IBV_PORT_ACTIVE;
        p.max_mtu = rdma_sys::ibv_mtu::IBV_MTU_4096;
        p.active_mtu = rdma_sys::ibv_mtu::IBV_MTU_1024;
        p.link_layer = 2;
        p.max_msg_sz = 1 << 31;
        let port = port_attr_from_raw(&p);
        assert_eq!(port.state, PortState::Active);
        assert_eq!(port.max_mtu, Mtu::Mtu4096);
        assert_eq!(port.active_mtu, Mtu::Mtu1024);
        assert_eq!(port.link_layer, LinkLayer::Ethernet);
        let dev = DeviceAttr {
            max_sge: 32,
            max_srq: 0,
            atomic_cap: AtomicCap::Hca,
            device_cap_flags: ibv_device_cap_flags::IBV_DEVICE_SRQ_RESIZE.0,
            ..Default::default()
        };
        let c = capabilities_from(&dev, &port, true);
        assert!(c.imm_data && c.ud && c.uc && !c.srq && !c.srq_resize);
        let with_srq = DeviceAttr {
            max_srq: 1024,
            max_srq_wr: 4096,
            max_srq_sge: 27,
            ..dev.clone()
        };
        let c = capabilities_from(&with_srq, &port, true);
        assert!(c.srq && c.srq_resize);
        assert_eq!((c.max_srq, c.max_srq_wr, c.max_srq_sge), (1024, 4096, 27));
        let no_resize = DeviceAttr {
            device_cap_flags: 0,
            ..with_srq
        };
        assert!(!capabilities_from(&no_resize, &port, true).srq_resize);
        assert!(!capabilities_from(&dev, &port, false).uc);
        assert_eq!(c.max_send_sge, 32);
        assert_eq!(c.max_msg_sz, 1 << 31);
        assert_eq!(c.link_layer, LinkLayer::Ethernet);
        assert!(!capabilities_from(&dev, &port, false).imm_data);
    }
}
