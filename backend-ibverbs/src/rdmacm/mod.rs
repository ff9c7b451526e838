//! The connection manager over librdmacm (`man rdma_cm`): [`verbs_api::rdmacm`]'s
//! traits as thin wrappers of `rdma_create_event_channel`, `rdma_create_id` and the calls
//! on an id, so that a program written against those traits runs on a real HCA with
//! librdmacm's and the kernel's exact behaviour.
//!
//! Where the wrapper does more than forward a call:
//!
//! - **Ids have no QP.** Ids are made without `rdma_create_qp`, as the traits' model
//!   says: the caller's QP, named by its number in [`ConnParam::qp_num`], goes through
//!   the transitions `rdma_init_qp_attr` gives ([`verbs_api::rdmacm::qp`]), and the
//!   active side completes a connection with `rdma_establish`.
//! - **The id's device.** [`CmId::verbs`] is a context this backend opens on the device
//!   librdmacm bound the id to (one per device and channel), not librdmacm's own
//!   `id->verbs`: the connection manager needs only the QP's number, and objects made on
//!   this backend's context have its ownership and checks.
//! - **Events are values.** [`CmEventChannel::get_event`] copies an event (its private
//!   data too) and acknowledges it at once (`rdma_ack_cm_event`), so destroying an id
//!   never waits for an event the caller holds. An id's `context` pointer names a small
//!   record of the id's handle and context value; a connection request's new id gets its
//!   own before the event is returned.

mod convert;

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rdma_sys::*;
use verbs_api::rdmacm::{
    reject, CmAddr, CmBackend, CmEvent, CmEventChannel, CmEventType, CmId, CmIdRef, CmOption, ConnParam,
    PathRecord, PortSpace,
};
use verbs_api::{AsyncEventType, Error, Gid, QpAttr, QpAttrMask, QpState, QpType, Result};

use crate::context::IbvContext;
use crate::device::{device_name, IbvBackend};
use crate::errno::last_errno;

use self::convert::{conn_param_to_raw, event_param, from_sockaddr, is_any, path_from_raw, to_sockaddr};

/// The error of a librdmacm call that failed with `errno` set, saying why where the
/// errno alone does not.
fn cm_err(call: &'static str) -> Error {
    let errno = last_errno();
    let reason = match (call, errno) {
        ("rdma_create_event_channel", libc::ENOENT | libc::ENODEV) => {
            "librdmacm cannot open /dev/infiniband/rdma_cm (is the rdma_ucm module loaded?)"
        }
        (_, libc::EINVAL) => "the id is not in a state that allows this call, or an argument is out of range",
        (_, libc::EADDRINUSE) => "another id holds this address and port",
        (_, libc::EADDRNOTAVAIL) => "no RDMA device has this address",
        _ => "librdmacm refused the call",
    };
    Error::cm(call, errno, reason)
}

/// `rc == 0`, or the call's error.
fn check(call: &'static str, rc: i32) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(cm_err(call))
    }
}

/// A timeout in milliseconds as librdmacm takes it (at least 1, at most `i32::MAX`).
fn millis(d: Duration) -> i32 {
    d.as_millis().clamp(1, i32::MAX as u128) as i32
}

/// What an id's `context` pointer names: its handle and the caller's context value.
struct Tag {
    handle: u32,
    context: AtomicU64,
}

impl Tag {
    fn new(context: u64) -> Box<Tag> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        Box::new(Tag {
            handle: NEXT.fetch_add(1, Ordering::Relaxed),
            context: AtomicU64::new(context),
        })
    }

    /// The record of a librdmacm id made by this backend.
    ///
    /// # Safety
    ///
    /// `id` is a live id whose `context` is a [`Tag`] of a live [`IbvCmId`] (or the
    /// listener's, for a request's id not yet wrapped).
    unsafe fn of(id: *mut rdma_cm_id) -> CmIdRef {
        // SAFETY: the caller's promise.
        let tag = unsafe { &*((*id).context as *const Tag) };
        CmIdRef {
            handle: tag.handle,
            context: tag.context.load(Ordering::Relaxed),
        }
    }
}

/// An event channel's shared part: ids hold it, so it is destroyed after them.
struct ChanInner {
    raw: *mut rdma_event_channel,
    /// This backend's contexts on the devices the channel's ids are bound to.
    devices: Mutex<Vec<(usize, Arc<IbvContext>)>>,
}

// SAFETY: librdmacm's channel is a descriptor and a few fields librdmacm locks; it is
// destroyed only in Drop, when no id refers to it.
unsafe impl Send for ChanInner {}
// SAFETY: as above.
unsafe impl Sync for ChanInner {}

impl Drop for ChanInner {
    fn drop(&mut self) {
        // SAFETY: every id made on the channel holds an Arc of it, so none is left.
        unsafe { rdma_destroy_event_channel(self.raw) };
    }
}

impl ChanInner {
    /// This backend's context on the device `verbs` is a context of.
    fn context_of(&self, verbs: *mut ibv_context) -> Result<Arc<IbvContext>> {
        // SAFETY: `verbs` is librdmacm's open context of a device it keeps open.
        let dev = unsafe { (*verbs).device };
        let mut devices = self.devices.lock();
        if let Some((_, c)) = devices.iter().find(|(d, _)| *d == dev as usize) {
            return Ok(c.clone());
        }
        let c = Arc::new(IbvContext::open(dev, device_name(dev))?);
        devices.push((dev as usize, c.clone()));
        Ok(c)
    }
}

/// An event channel (`struct rdma_event_channel`) of [`IbvBackend`].
pub struct IbvCmChannel {
    inner: Arc<ChanInner>,
}

impl std::fmt::Debug for IbvCmChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvCmChannel").field("fd", &self.fd()).finish()
    }
}

impl CmBackend for IbvBackend {
    type EventChannel = IbvCmChannel;
    type CmId = IbvCmId;

    fn create_event_channel(&self) -> Result<IbvCmChannel> {
        // SAFETY: no arguments; NULL with errno on failure.
        let raw = unsafe { rdma_create_event_channel() };
        if raw.is_null() {
            return Err(cm_err("rdma_create_event_channel"));
        }
        Ok(IbvCmChannel {
            inner: Arc::new(ChanInner {
                raw,
                devices: Mutex::new(Vec::new()),
            }),
        })
    }
}

/// Waits up to `timeout` (`None`: for ever) for `fd` to be readable; `false` on timeout.
fn wait_readable(fd: RawFd, timeout: Option<Duration>) -> Result<bool> {
    let ms = timeout.map_or(-1, |d| d.as_millis().min(i32::MAX as u128) as i32);
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one pollfd that lives across the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let errno = last_errno();
        if errno != libc::EINTR {
            return Err(Error::from_errno("poll(event channel)", errno));
        }
    }
}

impl CmEventChannel for IbvCmChannel {
    type Backend = IbvBackend;

    fn create_id(&self, context: u64, ps: PortSpace, qp_type: QpType) -> Result<IbvCmId> {
        if qp_type != ps.qp_type() {
            // librdmacm's rdma_create_id gives every port space one QP type.
            return Err(Error::cm(
                "rdma_create_id",
                libc::EINVAL,
                format!("port space {ps:?} takes {:?} QPs, not {qp_type:?}", ps.qp_type()),
            ));
        }
        let tag = Tag::new(context);
        let mut raw: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: the channel is live; the tag outlives the id (IbvCmId drops it after
        // rdma_destroy_id).
        let rc = unsafe {
            rdma_create_id(
                self.inner.raw,
                &mut raw,
                &*tag as *const Tag as *mut c_void,
                ps as u32,
            )
        };
        check("rdma_create_id", rc)?;
        Ok(IbvCmId {
            raw,
            tag,
            ps,
            chan: Mutex::new(self.inner.clone()),
        })
    }

    fn get_event(&self, timeout: Option<Duration>) -> Result<Option<CmEvent<IbvCmId>>> {
        if !wait_readable(self.fd(), timeout)? {
            return Ok(None);
        }
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the channel is live; the descriptor is readable, so this does not block
        // (unless another thread took the event, which is the caller's race).
        check("rdma_get_cm_event", unsafe {
            rdma_get_cm_event(self.inner.raw, &mut ev)
        })?;
        // SAFETY: librdmacm's event, valid until acknowledged below.
        let out = unsafe { self.take(&*ev) };
        // SAFETY: the event is acknowledged once, after everything was copied out of it.
        unsafe { rdma_ack_cm_event(ev) };
        out.map(Some)
    }

    fn fd(&self) -> RawFd {
        // SAFETY: the channel is live.
        unsafe { (*self.inner.raw).fd }
    }
}

impl IbvCmChannel {
    /// The event as a value; a connection request's new id wrapped with its own record.
    ///
    /// # Safety
    ///
    /// `ev` is an event of this channel not yet acknowledged.
    unsafe fn take(&self, ev: &rdma_cm_event) -> Result<CmEvent<IbvCmId>> {
        let Some(kind) = CmEventType::from_raw(ev.event) else {
            return Err(Error::cm(
                "rdma_get_cm_event",
                libc::EPROTO,
                format!("an event of unknown type {}", ev.event),
            ));
        };
        // SAFETY: the event's id is live until the event is acknowledged.
        let ps = PortSpace::from_raw(unsafe { (*ev.id).ps }).unwrap_or_default();
        let ud = ps.qp_type() == QpType::Ud;
        // SAFETY: the caller's promise.
        let param = unsafe { event_param(ev, kind, ud) };
        let mut out;
        if kind == CmEventType::ConnectRequest && !ev.listen_id.is_null() {
            // SAFETY: a request's listener is one of this backend's ids.
            let listener = unsafe { Tag::of(ev.listen_id) };
            let tag = Tag::new(listener.context);
            // SAFETY: the new id is the caller's from now on; its context names its own
            // record, which lives as long as the wrapper.
            unsafe { (*ev.id).context = &*tag as *const Tag as *mut c_void };
            let id = IbvCmId {
                raw: ev.id,
                tag,
                ps,
                chan: Mutex::new(self.inner.clone()),
            };
            out = CmEvent::new(kind, ev.status, id.id_ref());
            out.listen_id = Some(listener);
            out.new_id = Some(id);
        } else {
            // SAFETY: the event's id is one of this backend's ids.
            out = CmEvent::new(kind, ev.status, unsafe { Tag::of(ev.id) });
        }
        if matches!(kind, CmEventType::MulticastJoin | CmEventType::MulticastError) {
            // SAFETY: librdmacm sets a join's events' `param.ud.private_data` to the
            // context the join was made with.
            out.mcast = Some(unsafe { ev.param.ud.private_data } as usize as u64);
        }
        out.param = param;
        Ok(out)
    }
}

/// An id (`struct rdma_cm_id`) of [`IbvBackend`]; dropping it is `rdma_destroy_id`.
pub struct IbvCmId {
    raw: *mut rdma_cm_id,
    tag: Box<Tag>,
    ps: PortSpace,
    /// The channel it reports to (another after [`CmId::migrate`]).
    chan: Mutex<Arc<ChanInner>>,
}

// SAFETY: librdmacm's calls on an id lock what they share; the id is destroyed only in
// Drop, when no other reference exists.
unsafe impl Send for IbvCmId {}
// SAFETY: as above.
unsafe impl Sync for IbvCmId {}

impl std::fmt::Debug for IbvCmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvCmId")
            .field("handle", &self.tag.handle)
            .field("ps", &self.ps)
            .finish()
    }
}

impl Drop for IbvCmId {
    fn drop(&mut self) {
        // SAFETY: the id is live and destroyed once; its events were all acknowledged
        // when they were taken, so this does not wait. The tag is dropped after.
        unsafe { rdma_destroy_id(self.raw) };
    }
}

impl IbvCmId {
    fn id_ref(&self) -> CmIdRef {
        CmIdRef {
            handle: self.tag.handle,
            context: self.tag.context.load(Ordering::Relaxed),
        }
    }

    /// The `struct rdma_cm_id *`, for librdmacm calls this crate does not wrap. It stays
    /// valid while this id lives.
    pub fn as_raw(&self) -> *mut rdma_cm_id {
        self.raw
    }

    fn id(&self) -> &rdma_cm_id {
        // SAFETY: the id lives as long as self; librdmacm writes its fields only within
        // calls on it.
        unsafe { &*self.raw }
    }
}

impl CmId for IbvCmId {
    type Backend = IbvBackend;

    fn handle(&self) -> u32 {
        self.tag.handle
    }

    fn context(&self) -> u64 {
        self.tag.context.load(Ordering::Relaxed)
    }

    fn set_context(&self, context: u64) {
        self.tag.context.store(context, Ordering::Relaxed);
    }

    fn port_space(&self) -> PortSpace {
        self.ps
    }

    fn qp_type(&self) -> QpType {
        self.ps.qp_type()
    }

    fn verbs(&self) -> Option<Arc<IbvContext>> {
        let verbs = self.id().verbs;
        if verbs.is_null() {
            return None;
        }
        // A device librdmacm opened and this backend cannot (out of resources): the
        // id is as good as bound to none.
        self.chan.lock().context_of(verbs).ok()
    }

    fn port_num(&self) -> u8 {
        self.id().port_num
    }

    fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut sa = to_sockaddr(addr);
        // SAFETY: the id is live; the address lives across the call.
        check("rdma_bind_addr", unsafe {
            rdma_bind_addr(self.raw, (&mut sa as *mut libc::sockaddr_storage).cast())
        })
    }

    fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, timeout: Duration) -> Result<()> {
        let mut s = src.map(to_sockaddr);
        let mut d = to_sockaddr(dst);
        let sp = s.as_mut().map_or(std::ptr::null_mut(), |s| {
            (s as *mut libc::sockaddr_storage).cast()
        });
        // SAFETY: the id is live; the addresses live across the call.
        check("rdma_resolve_addr", unsafe {
            rdma_resolve_addr(
                self.raw,
                sp,
                (&mut d as *mut libc::sockaddr_storage).cast(),
                millis(timeout),
            )
        })
    }

    fn resolve_route(&self, timeout: Duration) -> Result<()> {
        // SAFETY: the id is live.
        check("rdma_resolve_route", unsafe {
            rdma_resolve_route(self.raw, millis(timeout))
        })
    }

    fn listen(&self, backlog: u32) -> Result<()> {
        // SAFETY: the id is live.
        check("rdma_listen", unsafe {
            rdma_listen(self.raw, backlog.min(i32::MAX as u32) as i32)
        })
    }

    fn connect(&self, param: &ConnParam) -> Result<()> {
        let mut raw = conn_param_to_raw(param);
        // SAFETY: the id is live; `raw` and the private data it points to live across
        // the call.
        check("rdma_connect", unsafe { rdma_connect(self.raw, &mut raw) })
    }

    fn accept(&self, param: Option<&ConnParam>) -> Result<()> {
        match param {
            Some(p) => {
                if self.ps.qp_type() == QpType::Ud {
                    // librdmacm's conn_param has no Q_Key: refuse one it would drop.
                    p.ud_qkey()?;
                }
                let mut raw = conn_param_to_raw(p);
                // SAFETY: as in connect.
                check("rdma_accept", unsafe { rdma_accept(self.raw, &mut raw) })
            }
            // SAFETY: the id is live and has no QP, which rdma_establish requires.
            None => check("rdma_establish", unsafe { rdma_establish(self.raw) }),
        }
    }

    fn reject(&self, private_data: &[u8], reason: u8) -> Result<()> {
        let len = u8::try_from(private_data.len()).map_err(|_| {
            Error::cm(
                "rdma_reject",
                libc::EINVAL,
                format!("{} bytes of private data (at most 255)", private_data.len()),
            )
        })?;
        let p = if private_data.is_empty() {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        if i32::from(reject::checked(reason)?) == reject::VENDOR_OPTION_NOT_SUPPORTED {
            // SAFETY: the id is live; the data lives across the call.
            return check("rdma_reject_ece", unsafe { rdma_reject_ece(self.raw, p, len) });
        }
        // SAFETY: as above.
        check("rdma_reject", unsafe { rdma_reject(self.raw, p, len) })
    }

    fn disconnect(&self) -> Result<()> {
        // SAFETY: the id is live.
        check("rdma_disconnect", unsafe { rdma_disconnect(self.raw) })
    }

    fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        let mut attr = crate::qp::qp_attr_to_raw(&QpAttr {
            qp_state: state,
            ..Default::default()
        });
        let mut mask = 0;
        // SAFETY: the id is live; attr and mask live across the call.
        check("rdma_init_qp_attr", unsafe {
            rdma_init_qp_attr(self.raw, &mut attr, &mut mask)
        })?;
        Ok((
            crate::qp::qp_attr_from_raw(&attr),
            QpAttrMask::from_bits_truncate(mask as u32),
        ))
    }

    fn notify(&self, event: AsyncEventType) -> Result<()> {
        // The kernel's rdma_notify acts on these two and refuses the others.
        let raw = match event {
            AsyncEventType::CommEst => ibv_event_type::IBV_EVENT_COMM_EST,
            AsyncEventType::PathMig => ibv_event_type::IBV_EVENT_PATH_MIG,
            other => {
                return Err(Error::cm(
                    "rdma_notify",
                    libc::EINVAL,
                    format!("{other:?} is no event the connection manager acts on"),
                ))
            }
        };
        // SAFETY: the id is live.
        check("rdma_notify", unsafe { rdma_notify(self.raw, raw) })
    }

    fn set_option(&self, option: &CmOption) -> Result<()> {
        // RDMA_OPTION_ID, RDMA_OPTION_IB (rdma_cma.h's levels).
        const ID: i32 = 0;
        const IB: i32 = 1;
        let (level, name, mut v): (i32, i32, Vec<u8>) = match option {
            CmOption::Tos(t) => (ID, 0, vec![*t]),
            CmOption::ReuseAddr(b) => (ID, 1, (*b as i32).to_ne_bytes().to_vec()),
            CmOption::AfOnly(b) => (ID, 2, (*b as i32).to_ne_bytes().to_vec()),
            CmOption::AckTimeout(t) => (ID, 3, vec![*t]),
            // RDMA_OPTION_IB_PATH: `struct ibv_path_data` per record.
            CmOption::IbPath(recs) => (IB, 1, convert::path_data(recs)),
        };
        // SAFETY: the id is live; the value lives across the call, its length is given.
        check("rdma_set_option", unsafe {
            rdma_set_option(self.raw, level, name, v.as_mut_ptr().cast(), v.len())
        })
    }

    fn query_addr(&self) -> Result<CmAddr> {
        let id = self.id();
        // SAFETY: the route's address unions hold socket addresses librdmacm filled (or
        // zeroes: family 0, None).
        let (src, dst) = unsafe {
            (
                from_sockaddr(&id.route.addr.src_addr_union.src_addr),
                from_sockaddr(&id.route.addr.dst_addr_union.dst_addr),
            )
        };
        let node_guid = if id.verbs.is_null() {
            0
        } else {
            // SAFETY: librdmacm's context of a device it keeps open.
            u64::from_be(unsafe { ibv_get_device_guid((*id.verbs).device) })
        };
        Ok(CmAddr {
            src,
            dst: dst.filter(|d| !(is_any(d) && d.port() == 0)),
            node_guid,
            port_num: id.port_num,
            // SAFETY: the IB address union's only variant.
            pkey: u16::from_be(unsafe { id.route.addr.addr.ibaddr.pkey }),
            ibdev_index: None,
        })
    }

    fn query_path(&self) -> Result<Vec<PathRecord>> {
        let r = &self.id().route;
        if r.path_rec.is_null() || r.num_paths <= 0 {
            return Ok(Vec::new());
        }
        // SAFETY: librdmacm's array of `num_paths` records, valid while the id lives.
        let paths = unsafe { std::slice::from_raw_parts(r.path_rec, r.num_paths as usize) };
        Ok(paths.iter().map(path_from_raw).collect())
    }

    fn query_gid(&self) -> Result<(Gid, Gid)> {
        // SAFETY: the IB address union's only variant; GIDs are plain bytes.
        let ib = unsafe { self.id().route.addr.addr.ibaddr };
        // SAFETY: as above.
        Ok(unsafe { (Gid(ib.sgid.raw), Gid(ib.dgid.raw)) })
    }

    fn join_multicast(&self, addr: SocketAddr, context: u64, send_only: bool) -> Result<()> {
        let mut sa = to_sockaddr(addr);
        let mut attr = rdma_sys::rdma_cm_join_mc_attr_ex {
            // RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS
            comp_mask: 1 | 2,
            // RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER or _FULLMEMBER
            join_flags: u32::from(send_only),
            addr: (&mut sa as *mut libc::sockaddr_storage).cast(),
        };
        // SAFETY: the id is live; the attributes and the address live across the call
        // (librdmacm copies the address); the context is an opaque value librdmacm
        // hands back in the join's events.
        check("rdma_join_multicast_ex", unsafe {
            rdma_sys::rdma_join_multicast_ex(self.raw, &mut attr, context as usize as *mut c_void)
        })
    }

    fn leave_multicast(&self, addr: SocketAddr) -> Result<()> {
        let mut sa = to_sockaddr(addr);
        // SAFETY: the id is live; the address lives across the call.
        check("rdma_leave_multicast", unsafe {
            rdma_sys::rdma_leave_multicast(self.raw, (&mut sa as *mut libc::sockaddr_storage).cast())
        })
    }

    fn migrate(&self, channel: &IbvCmChannel) -> Result<()> {
        let mut chan = self.chan.lock();
        // SAFETY: the id and the channel are live.
        check("rdma_migrate_id", unsafe {
            rdma_migrate_id(self.raw, channel.inner.raw)
        })?;
        *chan = channel.inner.clone();
        Ok(())
    }
}
