//! The connection manager as traits (`man rdma_cm`), at the level of the kernel interface
//! librdmacm talks to: what a backend over librdmacm and the simulated HCA both
//! implement. Each method names the librdmacm call it is.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use super::types::{CmAddr, CmEvent, CmOption, ConnParam, PathRecord, PortSpace};
use crate::device::Gid;
use crate::error::Result;
use crate::event::AsyncEventType;
use crate::flags::QpAttrMask;
use crate::qp::{QpAttr, QpState, QpType};
use crate::traits::{Backend, ContextOf};

/// The id type of backend `B`.
pub type CmIdOf<B> = <B as CmBackend>::CmId;
/// The event-channel type of backend `B`.
pub type EventChannelOf<B> = <B as CmBackend>::EventChannel;

/// A backend with a connection manager.
pub trait CmBackend: Backend {
    /// An event channel (`struct rdma_event_channel`).
    type EventChannel: CmEventChannel<Backend = Self>;
    /// An id (`struct rdma_cm_id`).
    type CmId: CmId<Backend = Self>;

    /// `rdma_create_event_channel`.
    fn create_event_channel(&self) -> Result<Self::EventChannel>;
}

/// An event channel (`struct rdma_event_channel`): the ids made on it report here.
pub trait CmEventChannel: Send + Sync + Sized {
    /// The backend.
    type Backend: CmBackend<EventChannel = Self>;

    /// `rdma_create_id`: a new id in port space `ps` with QP type `qp_type` (librdmacm's
    /// `rdma_create_id` passes [`PortSpace::qp_type`]) whose events carry `context`.
    fn create_id(&self, context: u64, ps: PortSpace, qp_type: QpType) -> Result<CmIdOf<Self::Backend>>;

    /// `rdma_get_cm_event`: waits up to `timeout` (for ever with `None`) for the next
    /// event of the channel's ids and takes it, or `None` on timeout.
    fn get_event(&self, timeout: Option<Duration>) -> Result<Option<CmEvent<CmIdOf<Self::Backend>>>>;

    /// The channel's file descriptor (`channel->fd`): polls readable while an event is
    /// pending (for `poll(2)`, epoll or tokio's `AsyncFd`).
    fn fd(&self) -> RawFd;
}

/// An id (`struct rdma_cm_id`). Dropping it is `rdma_destroy_id`: it rejects a request
/// it holds, disconnects a connection, stops listening, and its pending events go.
pub trait CmId: Send + Sync + Sized {
    /// The backend.
    type Backend: CmBackend<CmId = Self>;

    /// The id's handle, unique among the backend's ids (what events name).
    fn handle(&self) -> u32;

    /// The context value its events carry.
    fn context(&self) -> u64;

    /// Changes the context value its events carry (the new id of a connection request
    /// has its listener's until this).
    fn set_context(&self, context: u64);

    /// Its port space.
    fn port_space(&self) -> PortSpace;

    /// Its QP type.
    fn qp_type(&self) -> QpType;

    /// The device it is bound to (`id->verbs`), once bound to an address of one or
    /// resolved: make the QP's PD and CQs from it.
    fn verbs(&self) -> Option<Arc<ContextOf<Self::Backend>>>;

    /// The port of that device (`id->port_num`), 0 before.
    fn port_num(&self) -> u8;

    /// `rdma_bind_addr`: binds the id to a local address and port (port 0: one is
    /// chosen). A specific IP binds the id to the device that has it.
    fn bind_addr(&self, addr: SocketAddr) -> Result<()>;

    /// `rdma_resolve_addr`: resolves `dst` (from `src`, or an address the route to `dst`
    /// picks) within `timeout`; [`super::CmEventType::AddrResolved`] or `AddrError`
    /// follows.
    fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, timeout: Duration) -> Result<()>;

    /// `rdma_resolve_route`: [`super::CmEventType::RouteResolved`] or `RouteError`
    /// follows.
    fn resolve_route(&self, timeout: Duration) -> Result<()>;

    /// `rdma_listen`: takes connection requests, at most `backlog` waiting to be taken
    /// from the channel (0: a default).
    fn listen(&self, backlog: u32) -> Result<()>;

    /// `rdma_connect` with `param` (whose `qp_num` names this side's QP, in INIT); for a
    /// UD id, resolves the service's QP.
    fn connect(&self, param: &ConnParam) -> Result<()>;

    /// `rdma_accept` of a connection request with `param` (this side's QP, in RTS for RC;
    /// see [`super::qp::accept`]). With `None` on the active side after
    /// [`super::CmEventType::ConnectResponse`]: [`CmId::establish`].
    fn accept(&self, param: Option<&ConnParam>) -> Result<()>;

    /// `rdma_establish`: the active side's QP is in RTS; completes the connection.
    fn establish(&self) -> Result<()> {
        self.accept(None)
    }

    /// `rdma_reject` of a connection request, with private data for the peer. `reason`
    /// 0 is the consumer's reject ([`super::reject::CONSUMER_DEFINED`]); 35 is
    /// librdmacm's `rdma_reject_ece`
    /// ([`super::reject::VENDOR_OPTION_NOT_SUPPORTED`]); another is EINVAL
    /// ([`super::reject::checked`]).
    fn reject(&self, private_data: &[u8], reason: u8) -> Result<()>;

    /// `rdma_disconnect`: both sides get [`super::CmEventType::Disconnected`].
    fn disconnect(&self) -> Result<()>;

    /// `rdma_init_qp_attr`: the attributes (and their mask) that move the id's QP to
    /// `state` (INIT, RTR or RTS).
    fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)>;

    /// `rdma_notify`: tells the connection manager of an event on the id's QP
    /// (`IBV_EVENT_COMM_EST`: data arrived before the connection was established).
    fn notify(&self, event: AsyncEventType) -> Result<()>;

    /// `rdma_set_option`.
    fn set_option(&self, option: &CmOption) -> Result<()>;

    /// The id's addresses and device (librdmacm's query of them, which fills
    /// `id->route.addr`, `id->verbs` and `id->port_num`).
    fn query_addr(&self) -> Result<CmAddr>;

    /// The id's route: its path records, once resolved (`id->route.path_rec`).
    fn query_path(&self) -> Result<Vec<PathRecord>>;

    /// The id's source and destination GIDs (`id->route.addr.addr.ibaddr`).
    fn query_gid(&self) -> Result<(Gid, Gid)>;

    /// `rdma_join_multicast_ex` of a UD id bound to an address or resolved: joins the
    /// group of the multicast IP `addr` (`send_only`: as a send-only full member).
    /// [`super::CmEventType::MulticastJoin`] follows, whose [`super::CmEvent::mcast`]
    /// is `context` and whose [`super::UdParam`] names the group: the address vector
    /// (the MGID as `grh.dgid`, the MLID as `dlid`), QP 0xFFFFFF and the Q_Key. Attaching
    /// the QP is the caller's (`ibv_attach_mcast` with that MGID and MLID, as librdmacm
    /// does for an id that has its QP), and so is detaching it before the leave.
    fn join_multicast(&self, addr: SocketAddr, context: u64, send_only: bool) -> Result<()>;

    /// `rdma_leave_multicast`: leaves the group of `addr` that [`CmId::join_multicast`]
    /// joined; its events not taken yet go.
    fn leave_multicast(&self, addr: SocketAddr) -> Result<()>;

    /// `rdma_migrate_id`: the id reports to `channel` from now on, with the events it has
    /// pending.
    fn migrate(&self, channel: &<Self::Backend as CmBackend>::EventChannel) -> Result<()>;
}
