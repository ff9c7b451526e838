//! The connection manager of the simulated HCA (`man rdma_cm`; `verbs_api::rdmacm`):
//! connections set up by IP address and rdma_cm port between sim devices, in one
//! process, across processes and across hosts, with rdma_cm's events, statuses and
//! private data as the kernel's rdma_cm gives them on rxe (docs/rdmacm.md).
//!
//! - [`manager`]: the process's ids, their states and the calls (`rdma_bind_addr`,
//!   `rdma_resolve_addr`, `rdma_listen`, ...), as the kernel's rdma_cm keeps them.
//! - [`cm`]: the messages between two devices (REQ, REP, RTU, REJ, DREQ, DREP, SIDR),
//!   their timers, and what a peer that misbehaves or goes away leaves behind (nothing
//!   past the timeouts).
//! - [`rendezvous`]: how a client finds the device behind an IP and a port.
//! - [`route`]: source addresses, which device has an IP, path records.
//! - [`channel`]: event channels and their descriptors.
//! - [`timers`]: the connections' timers, one task per device.
//!
//! The messages travel between devices on their links (`datagram::gsi`), so their
//! sender is the device the link's check proved; the rendezvous port of a listener is
//! served through the sim's bounded accept loop. docs/wire.md has the formats.

pub mod channel;
pub mod cm;
pub mod manager;
pub mod mcast;
pub mod rendezvous;
pub mod route;
pub mod timers;

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use verbs_api::rdmacm::{
    CmAddr, CmBackend, CmEvent, CmEventChannel, CmEventType, CmId, CmIdRef, CmOption, ConnParam, PathRecord,
    PortSpace,
};
use verbs_api::{AsyncEventType, Backend, Gid, QpAttr, QpAttrMask, QpState, QpType, Result};

use self::channel::{Channel, Queued};
use self::manager::{Core, DeviceSource};
use crate::progress::Progress;
use crate::verbs::backend::SimBackend;
use crate::verbs::context::SimContext;

/// The backend's own devices for its connection manager: opened on first use and shared
/// by its ids while any holds them (a device `SimBackend::open` opens is another).
struct OwnDevices {
    backend: SimBackend,
    open: Mutex<Vec<Weak<SimContext>>>,
}

impl DeviceSource for OwnDevices {
    fn count(&self) -> u32 {
        self.backend.config.devices
    }

    fn open(&self, index: u32) -> Result<Arc<SimContext>> {
        let mut open = self.open.lock();
        if let Some(c) = open.get(index as usize).and_then(Weak::upgrade) {
            return Ok(c);
        }
        let c = Arc::new(self.backend.open(&format!("sim{index}"))?);
        if open.len() <= index as usize {
            open.resize(index as usize + 1, Weak::new());
        }
        open[index as usize] = Arc::downgrade(&c);
        Ok(c)
    }

    fn opened(&self, index: u32) -> Option<Arc<SimContext>> {
        self.open.lock().get(index as usize).and_then(Weak::upgrade)
    }
}

/// A backend's connection manager, made on first use.
#[derive(Clone, Default)]
pub struct CmCell(Arc<OnceLock<Arc<Core>>>);

impl std::fmt::Debug for CmCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CmCell")
    }
}

impl SimBackend {
    /// The connection manager of this backend (and its clones).
    fn cm(&self) -> Arc<Core> {
        self.cm
            .0
            .get_or_init(|| {
                let own = SimBackend {
                    config: self.config.clone(),
                    advice: self.advice.clone(),
                    cm: CmCell::default(),
                    pid: self.pid,
                    capture: self.capture.clone(),
                };
                Core::new(
                    Arc::new(OwnDevices {
                        backend: own,
                        open: Mutex::new(Vec::new()),
                    }),
                    self.config.seed,
                )
            })
            .clone()
    }

    /// How many ids this backend's connection manager holds: the program's, and those it
    /// made for connection requests the program has not taken yet. What a peer that
    /// misbehaves (exits mid-handshake, never answers, destroys its ids with events
    /// pending) leaves behind shows here, and must be gone once the program destroyed
    /// its own ids and the timeouts passed.
    pub fn cm_ids(&self) -> usize {
        self.cm.0.get().map_or(0, |c| c.st.lock().ids.len())
    }

    /// Makes the connection manager of this backend take its devices from `devices`
    /// (the C ABI's, which its programs open too) instead of opening its own; `false`
    /// if it was made already.
    pub fn set_cm_devices(&self, devices: Arc<dyn DeviceSource>) -> bool {
        self.cm.0.set(Core::new(devices, self.config.seed)).is_ok()
    }
}

/// The calling thread turns to the connection manager: it stops driving the data path
/// of the device it polled last, whose progress thread takes over at once, and the ACKs
/// it owes there leave ([`Progress::thread_leaves`]). A thread that spun on a CQ until a peer's message came, then
/// connects (perftest's `-R`: its last handshake, then `rdma_resolve_addr`), would else
/// leave that message's ACK owed for the progress thread's nap after the driving
/// window (up to the grace period, 2 ms): the peer's SEND completes that much later
/// than on an HCA, and the peer, which listens for the connection only once it has,
/// is not listening yet when the request comes.
fn leave_data_path() {
    Progress::thread_leaves();
}

/// An event channel of the sim (`struct rdma_event_channel`).
pub struct SimCmChannel {
    core: Arc<Core>,
    ch: Arc<Channel>,
}

impl SimCmChannel {
    fn event(&self, q: Queued) -> CmEvent<SimCmId> {
        self.core.taken(&q);
        let new_id = (q.event == CmEventType::ConnectRequest).then(|| SimCmId {
            core: self.core.clone(),
            handle: q.handle,
        });
        CmEvent {
            event: q.event,
            status: q.status,
            id: CmIdRef {
                handle: q.handle,
                context: q.context,
            },
            listen_id: q.listen.map(|l| CmIdRef {
                handle: l,
                context: q.context,
            }),
            new_id,
            param: q.param,
            mcast: q.mcast,
        }
    }

    /// `rdma_get_cm_event` as the kernel's rdma_cm serves librdmacm: a wait on the
    /// channel's descriptor in the calling thread, in the descriptor's mode
    /// (`O_NONBLOCK`: EAGAIN) and interrupted by signals as a read is.
    pub fn read_event(&self) -> Result<CmEvent<SimCmId>> {
        leave_data_path();
        let q = self.ch.read()?;
        Ok(self.event(q))
    }
}

impl CmEventChannel for SimCmChannel {
    type Backend = SimBackend;

    fn create_id(&self, context: u64, ps: PortSpace, qp_type: QpType) -> Result<SimCmId> {
        Ok(SimCmId {
            core: self.core.clone(),
            handle: self.core.create_id(self.ch.clone(), context, ps, qp_type),
        })
    }

    fn get_event(&self, timeout: Option<Duration>) -> Result<Option<CmEvent<SimCmId>>> {
        leave_data_path();
        Ok(self.ch.get(timeout).map(|q| self.event(q)))
    }

    fn fd(&self) -> RawFd {
        self.ch.fd()
    }
}

/// An id of the sim (`struct rdma_cm_id`); dropping it is `rdma_destroy_id`.
pub struct SimCmId {
    core: Arc<Core>,
    handle: u32,
}

impl Drop for SimCmId {
    fn drop(&mut self) {
        self.core.destroy(self.handle);
    }
}

impl SimCmId {
    /// `rdma_leave_multicast` of the join made with `context` (the C ABI's handle of
    /// it): its address, ENOENT (the kernel's answer) if there is none.
    pub fn leave_multicast_joined(&self, context: u64) -> Result<SocketAddr> {
        leave_data_path();
        self.core
            .leave_multicast(self.handle, |j| j.context == context)?
            .ok_or_else(|| verbs_api::Error::cm("rdma_leave_multicast", libc::ENOENT, "no such join"))
    }
}

impl CmId for SimCmId {
    type Backend = SimBackend;

    fn handle(&self) -> u32 {
        self.handle
    }

    fn context(&self) -> u64 {
        self.core.context(self.handle)
    }

    fn set_context(&self, context: u64) {
        self.core.set_context(self.handle, context)
    }

    fn port_space(&self) -> PortSpace {
        self.core
            .st
            .lock()
            .ids
            .get(&self.handle)
            .map_or(PortSpace::Tcp, |i| i.ps)
    }

    fn qp_type(&self) -> QpType {
        self.core
            .st
            .lock()
            .ids
            .get(&self.handle)
            .map_or(QpType::Rc, |i| i.qp_type)
    }

    fn verbs(&self) -> Option<Arc<SimContext>> {
        self.core.verbs(self.handle)
    }

    fn port_num(&self) -> u8 {
        u8::from(self.verbs().is_some())
    }

    fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        leave_data_path();
        self.core.bind(self.handle, addr)
    }

    fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, timeout: Duration) -> Result<()> {
        leave_data_path();
        self.core.resolve_addr(self.handle, src, dst, timeout)
    }

    fn resolve_route(&self, _timeout: Duration) -> Result<()> {
        leave_data_path();
        self.core.resolve_route(self.handle)
    }

    fn listen(&self, backlog: u32) -> Result<()> {
        leave_data_path();
        self.core.listen(self.handle, backlog)
    }

    fn connect(&self, param: &ConnParam) -> Result<()> {
        leave_data_path();
        self.core.connect(self.handle, param)
    }

    fn accept(&self, param: Option<&ConnParam>) -> Result<()> {
        leave_data_path();
        self.core.accept(self.handle, param)
    }

    fn reject(&self, private_data: &[u8], reason: u8) -> Result<()> {
        leave_data_path();
        self.core.reject(self.handle, private_data, reason)
    }

    fn disconnect(&self) -> Result<()> {
        leave_data_path();
        self.core.disconnect(self.handle)
    }

    fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        self.core.init_qp_attr(self.handle, state)
    }

    fn notify(&self, event: AsyncEventType) -> Result<()> {
        self.core.notify(self.handle, event)
    }

    fn set_option(&self, option: &CmOption) -> Result<()> {
        self.core.set_option(self.handle, option)
    }

    fn query_addr(&self) -> Result<CmAddr> {
        self.core.query_addr(self.handle)
    }

    fn query_path(&self) -> Result<Vec<PathRecord>> {
        self.core.query_path(self.handle)
    }

    fn query_gid(&self) -> Result<(Gid, Gid)> {
        self.core.query_gid(self.handle)
    }

    fn join_multicast(&self, addr: SocketAddr, context: u64, send_only: bool) -> Result<()> {
        leave_data_path();
        self.core.join_multicast(self.handle, addr, context, send_only)
    }

    fn leave_multicast(&self, addr: SocketAddr) -> Result<()> {
        leave_data_path();
        self.core
            .leave_multicast(self.handle, |j| j.addr == addr)
            .map(|_| ())
    }

    fn migrate(&self, channel: &SimCmChannel) -> Result<()> {
        self.core.migrate(self.handle, channel.ch.clone())
    }
}

impl CmBackend for SimBackend {
    type EventChannel = SimCmChannel;
    type CmId = SimCmId;

    fn create_event_channel(&self) -> Result<SimCmChannel> {
        Ok(SimCmChannel {
            core: self.cm(),
            ch: Arc::new(Channel::new()?),
        })
    }
}
