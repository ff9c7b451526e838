//! The verbs as traits: a [`Backend`] names one associated type per verbs object, so code
//! generic over `B: Backend` is statically dispatched and pays nothing for being generic.
//! Choosing a backend at run time is one `match` in the binary.
//!
//! Objects own their parents: a PD keeps its context alive, an MR and a QP their PD, a QP
//! its CQs, a CQ its completion channel. Dropping handles in any order is therefore safe:
//! each verbs object is destroyed after everything that depends on it, as libibverbs
//! requires (`ibv_dealloc_pd` fails with EBUSY while MRs exist; here it simply waits for
//! the last of them).
//!
//! # Safety model
//!
//! Registered memory can be written by the HCA or by a remote peer at any moment, so this
//! API never hands out `&[u8]`/`&mut [u8]` into it. [`MemoryRegion`] offers copy-in and
//! copy-out accessors (and raw pointers); the accessors copy with raw pointers, like a CPU
//! racing a DMA engine: a read concurrent with an incoming transfer may see a mix of old
//! and new bytes, but never touches memory outside the region. Aligned 64-bit accessors
//! use atomic loads and stores, so they never tear against remote atomics.
//!
//! Because every buffer a work request names must lie in a registered region (checked by
//! the HCA through the lkey) and a region's memory outlives its registration,
//! `post_send` and `post_recv` are safe: a bad SGE completes with `IBV_WC_LOC_PROT_ERR`;
//! it cannot corrupt memory. Memory registered from caller-owned buffers is the one
//! `unsafe` entry point ([`ProtectionDomain::reg_mr_raw`]).

use std::os::fd::RawFd;
use std::time::Duration;

use crate::device::{Capabilities, DeviceAttr, DeviceInfo, Gid, PortAttr};
use crate::error::{Error, PostError, Result};
use crate::event::AsyncEvent;
use crate::flags::{AccessFlags, QpAttrMask};
use crate::qp::{AhAttr, QpAttr, QpInitAttr, QpState, QpType};
use crate::srq::{SrqAttr, SrqAttrMask};
use crate::wc::WorkCompletion;
use crate::window::{inc_rkey, MwBind, MwType};
use crate::wr::{RecvWr, SendWr};

// The verbs objects a work request names by reference sit below the work requests; they
// are verbs traits all the same, and are named here.
pub use crate::ah::AddressHandle;
pub use crate::mr::MemoryRegion;
pub use crate::window::MemoryWindow;

/// The context type of backend `B`.
pub type ContextOf<B> = <B as Backend>::Context;
/// The protection-domain type of backend `B`.
pub type PdOf<B> = <B as Backend>::Pd;
/// The memory-region type of backend `B`.
pub type MrOf<B> = <B as Backend>::Mr;
/// The completion-queue type of backend `B`.
pub type CqOf<B> = <B as Backend>::Cq;
/// The completion-channel type of backend `B`.
pub type ChannelOf<B> = <B as Backend>::Channel;
/// The queue-pair type of backend `B`.
pub type QpOf<B> = <B as Backend>::Qp;
/// The shared-receive-queue type of backend `B`.
pub type SrqOf<B> = <B as Backend>::Srq;
/// The address-handle type of backend `B`.
pub type AhOf<B> = <B as Backend>::Ah;
/// The memory-window type of backend `B`.
pub type MwOf<B> = <B as Backend>::Mw;

/// A family of RDMA devices: the simulated HCA or libibverbs.
pub trait Backend: Send + Sync + Sized + 'static {
    /// An open device (`struct ibv_context`).
    type Context: Context<Backend = Self> + 'static;
    /// A protection domain (`struct ibv_pd`).
    type Pd: ProtectionDomain<Backend = Self>;
    /// A memory region (`struct ibv_mr`).
    type Mr: MemoryRegion;
    /// A completion queue (`struct ibv_cq`).
    type Cq: CompletionQueue;
    /// A completion channel (`struct ibv_comp_channel`).
    type Channel: CompletionChannel;
    /// A queue pair (`struct ibv_qp`).
    type Qp: QueuePair;
    /// A shared receive queue (`struct ibv_srq`).
    type Srq: SharedReceiveQueue;
    /// An address handle (`struct ibv_ah`), the destination of UD sends.
    type Ah: AddressHandle;
    /// A memory window (`struct ibv_mw`).
    type Mw: MemoryWindow;

    /// Short name: `sim`, `ibverbs`.
    fn name(&self) -> &'static str;

    /// `ibv_get_device_list`: the devices this backend can open (possibly none).
    fn devices(&self) -> Result<Vec<DeviceInfo>>;

    /// `ibv_open_device` by name.
    fn open(&self, name: &str) -> Result<Self::Context>;

    /// Opens the first device, or fails with [`Error::NoDevice`] when there is none.
    fn open_first(&self) -> Result<Self::Context> {
        let devs = self.devices()?;
        match devs.first() {
            Some(d) => self.open(&d.name),
            None => Err(Error::NoDevice {
                hint: format!("the {} backend lists no devices", self.name()),
            }),
        }
    }

    /// Lets `d` of the devices' time pass: what a program does when it waits for
    /// something that no completion announces (a message that should *not* arrive, a
    /// peer's timer). On hardware and on devices on real time (the default) the calling
    /// thread sleeps `d`. A simulated device on a virtual clock (the deterministic
    /// backend's) does not move while a thread sleeps: it runs its world through `d` of
    /// virtual time instead (or until nothing is left to happen in it), at no wall-clock
    /// cost. Fails only where the backend refuses the calling thread.
    fn settle(&self, d: Duration) -> Result<()> {
        std::thread::sleep(d);
        Ok(())
    }

    /// Whether the devices' clock is virtual (the deterministic backend's): then time
    /// moves only as the program's verbs and waits move it, in the one thread that owns
    /// the devices, so work of another thread (a server half on a thread of its own, a
    /// peer behind a socket) cannot take part, and a wall-clock measure means nothing.
    /// `false` (the default) for hardware and for devices on real time.
    fn clock_is_virtual(&self) -> bool {
        false
    }
}

/// An open device (`struct ibv_context`).
pub trait Context: Send + Sync + Sized {
    /// The backend this context belongs to.
    type Backend: Backend<Context = Self>;

    /// The device name (`ibv_get_device_name`).
    fn name(&self) -> &str;

    /// `ibv_query_device`.
    fn query_device(&self) -> Result<DeviceAttr>;

    /// `ibv_query_port` (ports are numbered from 1).
    fn query_port(&self, port_num: u8) -> Result<PortAttr>;

    /// `ibv_query_gid`.
    fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid>;

    /// What the device can do (see [`Capabilities`]).
    fn capabilities(&self) -> Result<Capabilities>;

    /// `ibv_alloc_pd`.
    fn alloc_pd(&self) -> Result<PdOf<Self::Backend>>;

    /// `ibv_create_comp_channel`.
    fn create_comp_channel(&self) -> Result<ChannelOf<Self::Backend>>;

    /// `ibv_create_cq` with at least `cqe` entries, optionally reporting to `channel`.
    fn create_cq(&self, cqe: u32, channel: Option<&ChannelOf<Self::Backend>>) -> Result<CqOf<Self::Backend>>;

    /// `ibv_get_async_event`: waits up to `timeout` (forever with `None`) for the next
    /// asynchronous event of this device and returns it, or `None` on timeout. Each event
    /// must be acknowledged with [`Context::ack_async_event`]; see [`crate::event`].
    fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>>;

    /// `ibv_ack_async_event`: acknowledges an event taken with
    /// [`Context::get_async_event`]. Destroying the QP, CQ or SRQ an event names waits
    /// until every event taken for it is acknowledged.
    fn ack_async_event(&self, event: AsyncEvent);

    /// The context's `async_fd`: polls readable while an event is pending (for `poll(2)`,
    /// epoll or tokio's `AsyncFd`); [`Context::get_async_event`] takes the event.
    fn async_fd(&self) -> RawFd;
}

/// A protection domain (`struct ibv_pd`): MRs and QPs of one PD can reach each other,
/// nothing of another PD can.
pub trait ProtectionDomain: Send + Sync + Sized {
    /// The backend this PD belongs to.
    type Backend: Backend<Pd = Self>;

    /// Allocates a zeroed, page-aligned buffer of `len` bytes and registers it
    /// (`ibv_reg_mr`). `REMOTE_WRITE` or `REMOTE_ATOMIC` without `LOCAL_WRITE` is EINVAL.
    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<MrOf<Self::Backend>>;

    /// Registers caller memory (`ibv_reg_mr` on an existing buffer). Both backends refuse
    /// a range the kernel would not pin: EFAULT for a page that is not mapped, not
    /// readable, or not writable where the access asks for writes; EINVAL for a range
    /// that wraps past the top of the address space.
    ///
    /// # Safety
    ///
    /// `addr..addr + len` must be valid for reads and writes until the returned MR is
    /// dropped, and while it is registered it must be accessed only through raw pointers
    /// (never through `&`/`&mut` references), because the HCA and remote peers may read
    /// and write it at any time.
    unsafe fn reg_mr_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MrOf<Self::Backend>>;

    /// `ibv_create_qp`. The QP starts in RESET; the granted capacities (which may be
    /// larger than asked) are in [`QueuePair::query`]'s `cap`. A QP created with an SRQ
    /// takes its receives from it (`max_recv_wr` and `max_recv_sge` are ignored).
    fn create_qp(
        &self,
        attr: &QpInitAttr<'_, CqOf<Self::Backend>, SrqOf<Self::Backend>>,
    ) -> Result<QpOf<Self::Backend>>;

    /// `ibv_create_srq`: a shared receive queue of at least `attr.max_wr` receives of
    /// `attr.max_sge` SGEs (see [`crate::srq`] for the limit).
    fn create_srq(&self, attr: &SrqAttr) -> Result<SrqOf<Self::Backend>>;

    /// `ibv_create_ah`: an address handle for UD sends to the port `attr` describes. On
    /// an Ethernet (RoCE) port the GRH is required (`is_global`), as libibverbs says.
    fn create_ah(&self, attr: &AhAttr) -> Result<AhOf<Self::Backend>>;

    /// `ibv_alloc_mw`: a memory window of this PD (see [`crate::mw`]), not bound to
    /// anything yet. A device without windows of that type refuses with EOPNOTSUPP.
    /// Dropping it is `ibv_dealloc_mw`, bound or not: its rkey stops working.
    fn alloc_mw(&self, mw_type: MwType) -> Result<MwOf<Self::Backend>>;

    /// `ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_PD` when `mr` belongs to another PD than
    /// this one (it moves here) and `IBV_REREG_MR_CHANGE_ACCESS` with `access`; the
    /// region's memory stays. A device without `ibv_rereg_mr` (rxe) refuses with
    /// EOPNOTSUPP and the region stays as it was.
    fn rereg_mr(&self, mr: &mut MrOf<Self::Backend>, access: Option<AccessFlags>) -> Result<()>;

    /// [`ProtectionDomain::rereg_mr`] with `IBV_REREG_MR_CHANGE_TRANSLATION` too: the
    /// region covers `addr..addr + len` from now on (its keys may stay).
    ///
    /// # Safety
    ///
    /// As for [`ProtectionDomain::reg_mr_raw`]: the new memory must stay valid until the
    /// region is dropped (or re-registered again) and be accessed through raw pointers
    /// only while registered.
    unsafe fn rereg_mr_raw(
        &self,
        mr: &mut MrOf<Self::Backend>,
        addr: *mut u8,
        len: usize,
        access: Option<AccessFlags>,
    ) -> Result<()>;
}

/// A completion queue (`struct ibv_cq`).
pub trait CompletionQueue: Send + Sync {
    /// `ibv_poll_cq`: moves up to `wc.len()` completions into `wc`, oldest first, and
    /// returns how many. An overflowed CQ returns [`Error::CqOverflow`].
    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize>;

    /// `ibv_req_notify_cq`: arms the CQ so that the next completion (or, with
    /// `solicited_only`, the next solicited or unsuccessful one) raises one event on its
    /// channel.
    fn req_notify(&self, solicited_only: bool) -> Result<()>;

    /// `ibv_ack_cq_events`: acknowledges `n` events taken from the channel.
    fn ack_events(&self, n: u32);

    /// The number of entries the CQ holds (`ibv_cq::cqe`; may exceed what was asked).
    fn capacity(&self) -> u32;

    /// An identifier of this CQ, unique within its context, as returned by
    /// [`CompletionChannel::get_cq_event`].
    fn handle(&self) -> u32;

    /// The file descriptor ([`CompletionChannel::fd`]) of the completion channel the CQ
    /// was created with, or `None` for a CQ created without one (`ibv_cq::channel`).
    fn channel_fd(&self) -> Option<RawFd>;

    /// `ibv_resize_cq`: the CQ holds at least `cqe` entries from now on
    /// ([`capacity`](CompletionQueue::capacity) says how many); the completions it
    /// holds stay, in order. Fewer entries than it holds now, 0, or more than the
    /// device's `max_cqe` is EINVAL, and the CQ stays as it was.
    fn resize(&self, cqe: u32) -> Result<()>;

    /// Whether a poll that finds nothing moves the device's clock on (a simulated device
    /// on a virtual clock, such as the deterministic backend's): a waiting loop then
    /// polls again at once, since sleeping between polls would move nothing and only
    /// cost wall time. `false` (the default) for hardware and for devices on real time.
    fn empty_poll_moves_time(&self) -> bool {
        false
    }
}

/// A completion channel (`struct ibv_comp_channel`).
pub trait CompletionChannel: Send + Sync {
    /// `ibv_get_cq_event`: waits up to `timeout` (forever with `None`) for an event and
    /// returns the [`handle`](CompletionQueue::handle) of the CQ that raised it, or
    /// `None` on timeout. Each event must later be acknowledged with
    /// [`CompletionQueue::ack_events`].
    fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>>;

    /// A file descriptor that polls readable while an event is pending (for `poll(2)`,
    /// epoll or tokio's `AsyncFd`).
    fn fd(&self) -> RawFd;

    /// For a channel that has no descriptor to wait on (a backend whose events come from
    /// something other than the kernel, as a simulated clock): a future that resolves when
    /// an event may be pending, which async waits (`aio::AsyncCq`) await instead
    /// of the descriptor's readiness. It fails when this context cannot wait (the error
    /// says what to change). `None`, the default: wait on [`CompletionChannel::fd`].
    fn event_wait(&self) -> Option<EventWait<'_>> {
        None
    }
}

/// The future of [`CompletionChannel::event_wait`].
pub type EventWait<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + 'a>>;

/// A shared receive queue (`struct ibv_srq`, see [`crate::srq`]).
pub trait SharedReceiveQueue: Send + Sync {
    /// `ibv_post_srq_recv`: queues receive WRs. On failure the error names the first WR
    /// not posted; those before it were posted. Past the SRQ's capacity it fails with
    /// ENOMEM, with too many SGEs with EINVAL.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;

    /// `ibv_modify_srq`: arms or disarms the limit (`LIMIT`) or resizes the SRQ
    /// (`MAX_WR`, where the device can). A value out of range is EINVAL, and then nothing
    /// is modified.
    fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()>;

    /// `ibv_query_srq`: the granted size and the limit (0 when not armed).
    fn query(&self) -> Result<SrqAttr>;

    /// An identifier of this SRQ, unique within its context, as asynchronous events name
    /// it ([`AsyncElement::Srq`](crate::AsyncElement::Srq)).
    fn handle(&self) -> u32;
}

/// A queue pair (`struct ibv_qp`).
pub trait QueuePair: Send + Sync {
    /// The QP number.
    fn qp_num(&self) -> u32;

    /// The transport type.
    fn qp_type(&self) -> QpType;

    /// `ibv_modify_qp`: applies the attributes selected by `mask`. A transition the state
    /// machine lacks, or a mask that lacks required attributes or has extra ones, fails
    /// with an error naming the current and requested state.
    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()>;

    /// `ibv_query_qp`: every attribute, including the granted `cap`.
    fn query(&self) -> Result<QpAttr>;

    /// The current state (`ibv_query_qp` with `IBV_QP_STATE`).
    fn state(&self) -> Result<QpState> {
        Ok(self.query()?.qp_state)
    }

    /// `ibv_post_send`: queues the WRs in order. On failure the error names the first WR
    /// not posted; those before it were posted. Posting past `max_send_wr` outstanding
    /// WRs fails with ENOMEM; a QP before RTS refuses sends with EINVAL; in ERR every
    /// posted WR completes with `IBV_WC_WR_FLUSH_ERR`.
    ///
    /// Buffers are read when the WR executes, after this call returns (except with
    /// `IBV_SEND_INLINE`, where they are copied now; inline SGEs must still lie in a
    /// registered region of this context, or the post fails with EINVAL).
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError>;

    /// `ibv_post_recv`: queues receive WRs (from INIT on). Past `max_recv_wr` outstanding
    /// it fails with ENOMEM; on a QP created with an SRQ it fails with EINVAL (post to
    /// the SRQ instead).
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;

    /// `ibv_bind_mw`: binds the type 1 window `mw` to `bind.bind_info` (or unbinds it, with
    /// no region) through this QP's send queue, as an `IBV_WR_BIND_MW` with the rkey
    /// [`inc_rkey`]`(mw.rkey())`, which the window's handle takes
    /// and the call returns. The bind completes as `IBV_WC_BIND_MW` (if signaled), or as
    /// `IBV_WC_MW_BIND_ERR` when the region, range or rights do not allow it. A type 2
    /// window is EINVAL (bind it with [`SendWr::bind_mw`](crate::SendWr::bind_mw)), a
    /// region of another PD than the window's EPERM (the backends check it; this
    /// default, for QPs that wrap another, posts the bind without that check).
    fn bind_mw(&self, mw: &dyn MemoryWindow, bind: &MwBind<'_>) -> Result<u32> {
        post_type1_bind(self, mw, bind)
    }

    /// `ibv_attach_mcast`: attaches this UD QP to the multicast group of MGID `gid` and
    /// MLID `lid` (ignored on an Ethernet port), in any state; from RTR on it receives
    /// what is sent to the group, checking its own Q_Key. Attaching again is a no-op; a
    /// GID that is not multicast, a QP that is not UD or (InfiniBand) a LID below 0xC000
    /// is EINVAL; past the device's `max_mcast_grp`, `max_mcast_qp_attach` or
    /// `max_total_mcast_qp_attach`, ENOMEM (see [`crate::mcast`]). Dropping the QP
    /// detaches it.
    fn attach_mcast(&self, gid: &Gid, lid: u16) -> Result<()>;

    /// `ibv_detach_mcast`: detaches this QP from the group it was attached to with the
    /// same `gid` and `lid`; EINVAL if it was not.
    fn detach_mcast(&self, gid: &Gid, lid: u16) -> Result<()>;
}

/// `ibv_bind_mw` as rxe's and mlx5's providers do it, after libibverbs' own checks: a
/// `IBV_WR_BIND_MW` of the type 1 window `mw` on `qp` with the rkey [`inc_rkey`] of its
/// current one, which it returns (see [`QueuePair::bind_mw`]; the check that the region
/// belongs to the window's PD is the backend's).
pub fn post_type1_bind<Q: QueuePair + ?Sized>(
    qp: &Q,
    mw: &dyn MemoryWindow,
    bind: &MwBind<'_>,
) -> Result<u32> {
    if mw.mw_type() != MwType::Type1 {
        return Err(Error::invalid(
            "ibv_bind_mw",
            "the window is of type 2: bind it with an IBV_WR_BIND_MW work request",
        ));
    }
    let info = &bind.bind_info;
    if info.mr.is_none() && (info.addr != 0 || info.length != 0) {
        return Err(Error::invalid(
            "ibv_bind_mw",
            "a bind without a memory region must have address and length 0",
        ));
    }
    let rkey = inc_rkey(mw.rkey());
    let wr = SendWr::bind_mw(bind.wr_id, mw, rkey, *info).with_flags(bind.send_flags);
    qp.post_send(&[wr]).map_err(|e| e.error)?;
    Ok(rkey)
}
