//! The sim's connection manager: what the kernel's rdma_cm and IB CM keep for a process
//! (`drivers/infiniband/core/cma.c`, `cm.c`): its ids and their states, the ports they
//! hold, the devices they are bound to, and the calls of `man rdma_cm` that change them.
//! The messages between devices and their timers are [`super::cm`]'s; the rendezvous
//! that finds a device by IP and port is [`super::rendezvous`]'s.
//!
//! Every call checks the id's state as rdma_cm does (EINVAL otherwise) and queues the
//! events rdma_cm gives, with the statuses it gives them. One lock covers the state;
//! what a call sends, arms or looks up is done after the lock is let go
//! ([`Outbox`]), so that a message to a QP of this very device, delivered at once,
//! finds the state unlocked.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use verbs_api::rdmacm::{
    CmAddr, CmEventParam, CmEventType, CmOption, ConnParam, PathRecord, PortSpace, UDP_QKEY,
};
use verbs_api::{AccessFlags, Error, Gid, Mtu, QpAttr, QpAttrMask, QpState, QpType, Result};

use super::channel::{Channel, Queued};
use super::cm::Conn;
use super::rendezvous::{self, Found, Rendezvous};
use super::route::{self, Peer};
use crate::choices::{Choice, Choices};
use crate::datagram::gsi::Gsi;
use crate::device::DeviceShared;
use crate::verbs::context::SimContext;
use backend_sim_proto::cm_msg::CmMsg;
use backend_sim_proto::qp::DatagramSource;

mod addresses;
mod calls;
mod ids;

pub use ids::new_conn_id;

/// The most connection requests a listener keeps waiting to be taken (rdma_cm's
/// `max_backlog`, and its default).
pub const MAX_BACKLOG: u32 = 1024;
/// The ports an id is given when it binds port 0 without listening (the kernel's
/// `ip_local_port_range`).
const EPHEMERAL: std::ops::Range<u16> = 32768..61000;
/// How long a connect waits for the rendezvous of a listener it did not find while it
/// resolved the address.
const CONNECT_LOOKUP: Duration = Duration::from_secs(2);

/// Where the connection manager's devices come from: the backend's own (opened on
/// demand and shared by its ids), or the C ABI's, which its programs open too.
pub trait DeviceSource: Send + Sync {
    /// How many devices there are (`sim0`, `sim1`, ...).
    fn count(&self) -> u32;
    /// Device `index`, opened if it is not.
    fn open(&self, index: u32) -> Result<Arc<SimContext>>;
    /// Device `index` if it is open.
    fn opened(&self, index: u32) -> Option<Arc<SimContext>>;
}

/// A device an id is bound to.
#[derive(Clone)]
pub struct Dev {
    /// Its index in the device list.
    pub index: u32,
    /// The open device.
    pub ctx: Arc<SimContext>,
}

impl Dev {
    /// The device.
    pub fn shared(&self) -> &Arc<DeviceShared> {
        &self.ctx.dev
    }
}

/// rdma_cm's states of an id (`enum rdma_cm_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Just created.
    Idle,
    /// Resolving its address.
    AddrQuery,
    /// Address resolved.
    AddrResolved,
    /// Route resolved.
    RouteResolved,
    /// Connecting, connected, or a connection request's new id.
    Connect,
    /// Disconnected.
    Disconnect,
    /// Bound to an address.
    AddrBound,
    /// Listening.
    Listen,
}

/// A listening id's state.
pub struct Listen {
    /// Most requests waiting to be taken.
    pub backlog: u32,
    /// Requests waiting to be taken.
    pub queued: u32,
    /// Its rendezvous port's address.
    rendezvous: SocketAddr,
    /// The device its rendezvous runs on, which takes the requests of a wildcard
    /// listener for the addresses no other open device has (held open while it
    /// listens).
    dev: Dev,
}

/// `rdma_set_option`'s settings.
#[derive(Clone, Copy, Debug, Default)]
pub struct Opts {
    /// Type of service (the path's traffic class).
    pub tos: u8,
    /// `RDMA_OPTION_ID_REUSEADDR`.
    pub reuseaddr: bool,
    /// `RDMA_OPTION_ID_AFONLY`.
    pub afonly: bool,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`.
    pub ack_timeout: Option<u8>,
}

/// One id.
pub struct Id {
    /// Its handle.
    pub handle: u32,
    /// The context its events carry.
    pub context: u64,
    /// Port space.
    pub ps: PortSpace,
    /// QP type.
    pub qp_type: QpType,
    /// The channel it reports to.
    pub channel: Arc<Channel>,
    /// rdma_cm state.
    pub state: State,
    /// The device it is bound to.
    pub dev: Option<Dev>,
    /// Its source address (bound or resolved).
    pub src: Option<SocketAddr>,
    /// Its destination.
    pub dst: Option<SocketAddr>,
    /// Whether its port is held in the port table.
    pub holds_port: bool,
    /// The TCP port a port-0 bind holds for a listen to come.
    pub reserved: Option<socket2::Socket>,
    /// The device at the other end, once known.
    pub peer: Option<Peer>,
    /// Its route.
    pub path: Option<PathRecord>,
    /// The receive PSN it starts at (rdma_cm's `seq_num`, drawn at creation).
    pub seq_num: u32,
    /// Listening.
    pub listen: Option<Listen>,
    /// The connection (the IB CM's id), from `rdma_connect` or a request.
    pub conn: Option<Conn>,
    /// Options.
    pub opts: Opts,
    /// A connection request's new id whose consumer has not accepted it yet: its events
    /// are dropped, as rdma_ucm drops them until userspace sets its context.
    pub unclaimed: bool,
    /// Which address or timer task may still act on the id (older ones find it changed).
    pub gen: u64,
    /// Its multicast joins, in the order made.
    pub joins: Vec<Join>,
}

/// A multicast join of an id (`rdma_join_multicast`).
#[derive(Clone, Copy, Debug)]
pub struct Join {
    /// The group's IP address.
    pub addr: SocketAddr,
    /// The context its events carry.
    pub context: u64,
}

impl Id {
    /// rdma_cm's `cma_comp`-style check: the call `call` needs `want`.
    pub fn need(&self, call: &'static str, want: &[State]) -> Result<()> {
        if want.contains(&self.state) {
            return Ok(());
        }
        Err(Error::cm(
            call,
            libc::EINVAL,
            format!("the id is in state {:?}; the call needs {want:?}", self.state),
        ))
    }

    /// The device, or EINVAL naming `call`.
    pub fn dev(&self, call: &'static str) -> Result<&Dev> {
        self.dev
            .as_ref()
            .ok_or_else(|| Error::cm(call, libc::EINVAL, "the id is bound to no device yet"))
    }

    /// An event for this id on its channel.
    pub fn event(&self, event: CmEventType, status: i32, param: CmEventParam) {
        if self.unclaimed {
            tracing::debug!(handle = self.handle, %event, "rdma_cm: event of an unaccepted request dropped");
            return;
        }
        self.channel.push(Queued {
            handle: self.handle,
            context: self.context,
            listen: None,
            event,
            status,
            param,
            mcast: None,
        });
    }
}

/// A rendezvous lookup to run: for id `handle` at generation `gen`, from `dev`'s runtime,
/// of `dst` in port space `ps` within `timeout`, for a connect (`connect`) or an address
/// query.
pub struct Lookup {
    dev: Arc<DeviceShared>,
    handle: u32,
    gen: u64,
    dst: SocketAddr,
    ps: u16,
    timeout: Duration,
    connect: bool,
}

/// A lookup under way: the asking device (its address), destination, port space,
/// timeout.
type AskKey = (usize, SocketAddr, u16, Duration);

/// An id waiting for a lookup: its handle, generation, and whether for a connect.
type Waiter = (u32, u64, bool);

/// Forgets a lookup under way when its task ends, answered or not (a device's runtime
/// that closes drops its tasks), so that a later one is asked anew.
struct Asked {
    core: Weak<Core>,
    key: AskKey,
    serial: u64,
}

impl Asked {
    /// The ids waiting for this lookup, which is no longer under way.
    fn take(&self, c: &Core) -> Vec<Waiter> {
        let mut asking = c.asking.lock();
        match asking.get(&self.key) {
            Some((serial, _)) if *serial == self.serial => {
                asking.remove(&self.key).map(|(_, w)| w).unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }
}

impl Drop for Asked {
    fn drop(&mut self) {
        if let Some(c) = self.core.upgrade() {
            self.take(&c);
        }
    }
}

/// What a call does once the state's lock is let go.
#[derive(Default)]
pub struct Outbox {
    /// Messages: from a device to a peer device.
    pub sends: Vec<(Arc<DeviceShared>, SocketAddr, CmMsg)>,
    /// Timers: (device whose runtime runs it, id, generation, after).
    pub timers: Vec<(Arc<DeviceShared>, u32, u64, Duration)>,
    /// Lookups.
    pub lookups: Vec<Lookup>,
    /// Links to probe: (device, peer).
    pub probes: Vec<(Arc<DeviceShared>, SocketAddr)>,
}

/// The state under the lock.
#[derive(Default)]
pub struct Ids {
    /// Every id by handle.
    pub ids: HashMap<u32, Id>,
    next_handle: u32,
    /// Ports held, by port space and port: the ids holding them.
    ports: HashMap<(PortSpace, u16), Vec<u32>>,
    /// Connections by this side's communication ID.
    pub by_comm: HashMap<u32, u32>,
    /// Connections set up by a peer, by its device and communication ID.
    pub by_remote: HashMap<(SocketAddr, u32), u32>,
    /// The rendezvous ports open, with how many listeners use each.
    rendezvous: HashMap<SocketAddr, (Rendezvous, usize)>,
    /// Each device's agent (its GSI), by device index.
    agents: HashMap<u32, Arc<Agent>>,
    /// Where communication IDs, ephemeral ports and starting PSNs come from: the
    /// backend's seed, if it has one ([`crate::choices`]).
    choices: Choices,
}

impl Ids {
    /// The state of a connection manager whose choices follow `seed`.
    fn new(seed: Option<u64>) -> Ids {
        Ids {
            choices: Choices::new(seed, "rdma_cm"),
            ..Ids::default()
        }
    }

    /// A communication ID no connection of this side uses.
    pub fn fresh_comm(&self) -> u32 {
        loop {
            let c = self.choices.u32(Choice::CommId);
            if c != 0 && !self.by_comm.contains_key(&c) {
                return c;
            }
        }
    }

    /// A starting PSN for a new id (rdma_cm's `seq_num`: 24 bits).
    fn fresh_psn(&self) -> u32 {
        self.choices.u32(Choice::CmPsn) & 0xff_ffff
    }

    /// A fresh handle.
    fn handle(&mut self) -> u32 {
        loop {
            self.next_handle = self.next_handle.wrapping_add(1);
            if self.next_handle != 0 && !self.ids.contains_key(&self.next_handle) {
                return self.next_handle;
            }
        }
    }
}

/// A device's receiver of CM messages, and of news of its links.
struct Agent {
    core: Weak<Core>,
    index: u32,
    dev: Weak<DeviceShared>,
}

impl Gsi for Agent {
    fn receive(&self, from: SocketAddr, src: &DatagramSource, payload: &[u8]) {
        if let Some(c) = self.core.upgrade() {
            c.on_message(self.index, from, src, payload);
        }
    }

    fn unreachable(&self, peer: SocketAddr) {
        if let Some(c) = self.core.upgrade() {
            c.on_unreachable(self.index, peer);
        }
    }

    fn link_closed(&self, peer: SocketAddr) {
        if let Some(c) = self.core.upgrade() {
            c.on_link_closed(self.index, peer);
        }
    }
}

/// A process's (a backend's) connection manager.
pub struct Core {
    /// The state.
    pub st: Mutex<Ids>,
    devices: Arc<dyn DeviceSource>,
    /// The lookups under way, by the device that asks, destination, port space and
    /// timeout, with the ids that wait for each: ids that resolve one address at once
    /// share one question to its rendezvous, as the kernel's address queries of one
    /// destination share one neighbour resolution.
    asking: Mutex<HashMap<AskKey, (u64, Vec<Waiter>)>>,
    /// The serial number of the last lookup asked (which entry of `asking` is whose).
    asked: std::sync::atomic::AtomicU64,
    /// The timers of its connections.
    timers: super::timers::Timers,
    /// Itself, for the tasks it starts.
    pub me: Weak<Core>,
}

impl super::timers::Fire for Core {
    fn fire(&self, handle: u32, gen: u64) {
        self.on_timer(handle, gen);
    }
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("ids", &self.st.lock().ids.len())
            .finish()
    }
}

fn cm_err(call: &'static str, errno: i32, why: impl Into<String>) -> Error {
    Error::cm(call, errno, why)
}

/// An address as rdma_cm keeps it: IPv4-mapped IPv6 as IPv4.
fn canon(a: SocketAddr) -> SocketAddr {
    crate::addressing::canonical(a)
}

impl Core {
    /// A connection manager over `devices`, its choices following `seed`.
    pub fn new(devices: Arc<dyn DeviceSource>, seed: Option<u64>) -> Arc<Core> {
        Arc::new_cyclic(|me| Core {
            st: Mutex::new(Ids::new(seed)),
            devices,
            asking: Mutex::new(HashMap::new()),
            asked: std::sync::atomic::AtomicU64::new(0),
            timers: super::timers::Timers::default(),
            me: me.clone(),
        })
    }

    /// Device `index`, opened, with its agent registered.
    fn device(&self, st: &mut Ids, index: u32) -> Result<Dev> {
        let ctx = self.devices.open(index)?;
        let same = st
            .agents
            .get(&index)
            .is_some_and(|a| a.dev.upgrade().is_some_and(|d| Arc::ptr_eq(&d, &ctx.dev)));
        if !same {
            let agent = Arc::new(Agent {
                core: self.me.clone(),
                index,
                dev: Arc::downgrade(&ctx.dev),
            });
            let hook: Weak<dyn Gsi> = Arc::downgrade(&agent) as Weak<dyn Gsi>;
            ctx.dev.datagrams.set_gsi(hook);
            st.agents.insert(index, agent);
        }
        Ok(Dev { index, ctx })
    }

    /// The device that has `ip` (see [`route`]): one whose GID table lists it, else the
    /// first for a loopback address or another address of this host; EADDRNOTAVAIL for
    /// an address that is not this host's.
    fn device_for(&self, st: &mut Ids, call: &'static str, ip: IpAddr) -> Result<Dev> {
        let n = self.devices.count();
        if n == 0 {
            return Err(cm_err(call, libc::ENODEV, "the sim lists no devices"));
        }
        // The devices open first, then the others.
        for i in 0..n {
            if let Some(c) = self.devices.opened(i) {
                if route::has_ip(&c.dev, ip) {
                    return self.device(st, i);
                }
            }
        }
        for i in 0..n {
            if self.devices.opened(i).is_none() {
                let d = self.device(st, i)?;
                if route::has_ip(d.shared(), ip) {
                    return Ok(d);
                }
            }
        }
        if route::is_local(ip) {
            return self.device(st, 0);
        }
        Err(cm_err(
            call,
            libc::EADDRNOTAVAIL,
            format!("{ip} is not an address of this host"),
        ))
    }

    /// Runs what a call left to do.
    pub fn run(&self, out: Outbox) {
        for (dev, peer, msg) in out.sends {
            tracing::debug!(device = %dev.name, %peer, %msg, "rdma_cm: send");
            let mut b = Vec::new();
            msg.encode(&mut b);
            dev.datagrams.send_gsi(peer, &b);
        }
        for (dev, handle, gen, after) in out.timers {
            let to: Weak<dyn super::timers::Fire> = self.me.clone();
            self.timers.arm(&dev, handle, gen, after, to);
        }
        for l in out.lookups {
            let key = (Arc::as_ptr(&l.dev) as usize, l.dst, l.ps, l.timeout);
            let waiter = (l.handle, l.gen, l.connect);
            let serial = {
                let mut asking = self.asking.lock();
                if let Some((_, waiting)) = asking.get_mut(&key) {
                    waiting.push(waiter);
                    continue;
                }
                let serial = self.asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                asking.insert(key, (serial, vec![waiter]));
                serial
            };
            let core = self.me.clone();
            let asked = Asked {
                core: core.clone(),
                key,
                serial,
            };
            l.dev.setup.rt.spawn(async move {
                let found = rendezvous::lookup(l.dst, l.ps, l.timeout).await;
                if let Some(c) = core.upgrade() {
                    for (handle, gen, connect) in asked.take(&c) {
                        c.on_lookup(handle, gen, found, connect);
                    }
                }
            });
        }
        for (dev, peer) in out.probes {
            dev.datagrams.probe(peer);
        }
    }

    /// Runs `f` on id `handle` under the lock, then what it left to do.
    pub fn with<T>(
        &self,
        call: &'static str,
        handle: u32,
        f: impl FnOnce(&Core, &mut Ids, &mut Outbox) -> Result<T>,
    ) -> Result<T> {
        let mut out = Outbox::default();
        let r = {
            let mut st = self.st.lock();
            if !st.ids.contains_key(&handle) {
                return Err(cm_err(call, libc::EINVAL, "no such id"));
            }
            f(self, &mut st, &mut out)
        };
        self.run(out);
        r
    }

    // ------------------------------------------------------------ from the devices

    fn on_message(&self, index: u32, from: SocketAddr, src: &DatagramSource, payload: &[u8]) {
        let msg = match CmMsg::decode(payload) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(%from, "rdma_cm: malformed CM message dropped: {e}");
                return;
            }
        };
        tracing::debug!(%from, %msg, "rdma_cm: received");
        let mut out = Outbox::default();
        {
            let mut st = self.st.lock();
            let Some(ctx) = self.devices.opened(index) else {
                return;
            };
            let dev = Dev { index, ctx };
            let peer = Peer {
                addr: canon(from),
                gid: src.gid,
                lid: src.lid,
            };
            super::cm::on_message(&mut st, &dev, peer, msg, &mut out);
        }
        self.run(out);
    }

    fn on_timer(&self, handle: u32, gen: u64) {
        let mut out = Outbox::default();
        {
            let mut st = self.st.lock();
            if st.ids.get(&handle).is_some_and(|i| i.gen == gen) {
                super::cm::on_timer(&mut st, handle, &mut out);
            }
        }
        self.run(out);
    }

    fn on_unreachable(&self, index: u32, peer: SocketAddr) {
        let mut out = Outbox::default();
        {
            let mut st = self.st.lock();
            super::cm::on_peer_gone(&mut st, index, canon(peer), &mut out);
        }
        self.run(out);
    }

    fn on_link_closed(&self, index: u32, peer: SocketAddr) {
        let peer = canon(peer);
        let dev = {
            let st = self.st.lock();
            let cares = st.ids.values().any(|i| {
                i.dev.as_ref().is_some_and(|d| d.index == index)
                    && i.conn
                        .as_ref()
                        .is_some_and(|c| c.peer.addr == peer && c.phase.is_live())
            });
            if !cares {
                return;
            }
            self.devices.opened(index)
        };
        if let Some(d) = dev {
            // A device whose process is gone no longer listens: the probe fails, and the
            // connections with it end as the kernel's would when the process exits.
            d.dev.datagrams.probe(peer);
        }
    }

    /// A lookup for a connect whose address query found no listener.
    pub fn lookup_for_connect(
        out: &mut Outbox,
        dev: &Dev,
        handle: u32,
        gen: u64,
        dst: SocketAddr,
        ps: PortSpace,
    ) {
        out.lookups.push(Lookup {
            dev: dev.shared().clone(),
            handle,
            gen,
            dst,
            ps: ps as u16,
            timeout: CONNECT_LOOKUP,
            connect: true,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::Ids;

    /// The first communication IDs and starting PSNs a connection manager draws.
    fn drawn(seed: Option<u64>) -> Vec<(u32, u32)> {
        let st = Ids::new(seed);
        (0..4).map(|_| (st.fresh_comm(), st.fresh_psn())).collect()
    }

    #[test]
    fn a_seed_repeats_the_communication_ids_and_psns() {
        assert_eq!(drawn(Some(7)), drawn(Some(7)));
        assert_ne!(drawn(Some(7)), drawn(Some(8)));
    }
}
