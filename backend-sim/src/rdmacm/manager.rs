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
use crate::cm_msg::CmMsg;
use crate::datagram::gsi::Gsi;
use crate::device::DeviceShared;
use crate::responder::DatagramSource;
use crate::verbs::context::SimContext;

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
    /// Itself, for the tasks it starts.
    pub me: Weak<Core>,
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
            let core = self.me.clone();
            dev.setup.rt.spawn(async move {
                tokio::time::sleep(after).await;
                if let Some(c) = core.upgrade() {
                    c.on_timer(handle, gen);
                }
            });
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

    // ------------------------------------------------------------- ids and channels

    /// `rdma_create_id`.
    pub fn create_id(&self, channel: Arc<Channel>, context: u64, ps: PortSpace, qp_type: QpType) -> u32 {
        let mut st = self.st.lock();
        let handle = st.handle();
        let seq_num = st.fresh_psn();
        st.ids
            .insert(handle, new_id(handle, channel, context, ps, qp_type, seq_num));
        handle
    }

    /// `rdma_destroy_id`: rejects or disconnects what the id was doing, stops its
    /// listening (destroying the requests nobody took), and drops its pending events.
    pub fn destroy(&self, handle: u32) {
        let mut out = Outbox::default();
        let mut orphans = Vec::new();
        // The id leaves the table under the lock but is dropped after it: it may hold the
        // last reference to a device, whose closing joins the device's threads, and one
        // of them may be waiting for this lock (telling of a link that closed).
        let gone;
        {
            let mut st = self.st.lock();
            let Some(id) = st.ids.remove(&handle) else {
                return;
            };
            super::cm::on_destroy(&mut st, &id, &mut out);
            if id.holds_port {
                if let Some(src) = id.src {
                    if let Some(v) = st.ports.get_mut(&(id.ps, src.port())) {
                        v.retain(|h| *h != handle);
                        if v.is_empty() {
                            st.ports.remove(&(id.ps, src.port()));
                        }
                    }
                }
            }
            if let Some(l) = &id.listen {
                if let Some((_, users)) = st.rendezvous.get_mut(&l.rendezvous) {
                    *users -= 1;
                    if *users == 0 {
                        st.rendezvous.remove(&l.rendezvous);
                    }
                }
            }
            // Its events, and the requests it listened for that nobody took (their
            // new ids go too: the peer is rejected).
            for ev in id
                .channel
                .take_for(|e| e.handle == handle || e.listen == Some(handle))
            {
                if ev.listen == Some(handle) && ev.event == CmEventType::ConnectRequest {
                    orphans.push(ev.handle);
                }
            }
            gone = id;
        }
        self.run(out);
        drop(gone);
        for h in orphans {
            self.destroy(h);
        }
    }

    /// Takes an event from `ch` for a caller: a connection request's taking frees a
    /// place in its listener's backlog.
    pub fn taken(&self, ev: &Queued) {
        if let Some(l) = ev.listen {
            if let Some(lid) = self.st.lock().ids.get_mut(&l).and_then(|i| i.listen.as_mut()) {
                lid.queued = lid.queued.saturating_sub(1);
            }
        }
    }

    // ------------------------------------------------------------------ multicast

    /// `rdma_join_multicast_ex` (the kernel's `rdma_join_multicast()`): a UD id bound
    /// to an address or resolved joins the group of multicast IP `addr`; the
    /// `MULTICAST_JOIN` event follows at once ([`super::mcast::join_param`]).
    pub fn join_multicast(
        &self,
        handle: u32,
        addr: SocketAddr,
        context: u64,
        _send_only: bool,
    ) -> Result<()> {
        const CALL: &str = "rdma_join_multicast";
        self.with(CALL, handle, |_, st, _| {
            let id = st.ids.get_mut(&handle).expect("checked");
            id.need(CALL, &[State::AddrBound, State::AddrResolved])?;
            if id.qp_type != QpType::Ud {
                return Err(cm_err(CALL, libc::EINVAL, "only UD ids join multicast groups"));
            }
            let addr = canon(addr);
            if !addr.ip().is_multicast() {
                return Err(cm_err(
                    CALL,
                    libc::EINVAL,
                    format!("{} is not a multicast address", addr.ip()),
                ));
            }
            let dev = id.dev(CALL)?.shared().clone();
            let param = super::mcast::join_param(addr, id.ps, dev.limits.link_layer, id.opts.tos);
            dev.datagrams.prepare_group(&param.ah_attr.grh.dgid);
            id.joins.push(Join { addr, context });
            if !id.unclaimed {
                id.channel.push(Queued {
                    handle,
                    context: id.context,
                    listen: None,
                    event: CmEventType::MulticastJoin,
                    status: 0,
                    param: CmEventParam::Ud(param),
                    mcast: Some(context),
                });
            }
            Ok(())
        })
    }

    /// `rdma_leave_multicast`: the id's first join that `which` picks ends, and its
    /// events not taken yet go (the kernel's `ucma_leave_multicast()`). Returns the
    /// group's address, `None` if no join matches.
    pub fn leave_multicast(&self, handle: u32, which: impl Fn(&Join) -> bool) -> Result<Option<SocketAddr>> {
        const CALL: &str = "rdma_leave_multicast";
        self.with(CALL, handle, |_, st, _| {
            let id = st.ids.get_mut(&handle).expect("checked");
            let Some(i) = id.joins.iter().position(&which) else {
                return Ok(None);
            };
            let j = id.joins.remove(i);
            id.channel
                .take_for(|e| e.handle == handle && e.mcast == Some(j.context));
            Ok(Some(j.addr))
        })
    }

    // ------------------------------------------------------------------ addresses

    /// Holds port `port` (0: a free one) of `ps` at `ip` for id `handle`.
    fn hold_port(st: &mut Ids, call: &'static str, handle: u32, ip: IpAddr, port: u16) -> Result<u16> {
        let (ps, reuse) = {
            let id = &st.ids[&handle];
            (id.ps, id.opts.reuseaddr)
        };
        let port = if port == 0 {
            loop {
                let p = st.choices.in_range(Choice::CmPort, EPHEMERAL);
                if !st.ports.contains_key(&(ps, p)) {
                    break p;
                }
            }
        } else {
            if port < 1024 && rustix::process::geteuid().as_raw() != 0 {
                return Err(cm_err(call, libc::EACCES, format!("port {port} is privileged")));
            }
            let clash = st.ports.get(&(ps, port)).into_iter().flatten().any(|h| {
                let o = &st.ids[h];
                let oip = o.src.map(|s| s.ip());
                let overlap = oip.is_none_or(|o| o.is_unspecified() || ip.is_unspecified() || o == ip);
                overlap && !(reuse && o.opts.reuseaddr && o.state != State::Listen)
            });
            if clash {
                return Err(cm_err(call, libc::EADDRINUSE, format!("port {port} is taken")));
            }
            port
        };
        st.ports.entry((ps, port)).or_default().push(handle);
        let id = st.ids.get_mut(&handle).expect("checked");
        id.holds_port = true;
        Ok(port)
    }

    /// `rdma_bind_addr`.
    pub fn bind(&self, handle: u32, addr: SocketAddr) -> Result<()> {
        const CALL: &str = "rdma_bind_addr";
        let addr = canon(addr);
        self.with(CALL, handle, |core, st, _| {
            st.ids[&handle].need(CALL, &[State::Idle])?;
            let dev = match addr.ip().is_unspecified() {
                true => None,
                false => Some(core.device_for(st, CALL, addr.ip())?),
            };
            // A port-0 bind takes a TCP port the id may listen on later.
            let (port, reserved) = if addr.port() == 0 {
                let s = bind_ephemeral(&st.choices, addr).map_err(|e| Error::from_io(CALL, e))?;
                let p = s
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_socket())
                    .map_or(0, |a| a.port());
                (p, Some(s))
            } else {
                (addr.port(), None)
            };
            let port = Core::hold_port(st, CALL, handle, addr.ip(), port)?;
            let id = st.ids.get_mut(&handle).expect("checked");
            id.dev = dev;
            id.src = Some(SocketAddr::new(addr.ip(), port));
            id.reserved = reserved;
            id.state = State::AddrBound;
            Ok(())
        })
    }

    /// `rdma_resolve_addr`.
    pub fn resolve_addr(
        &self,
        handle: u32,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        const CALL: &str = "rdma_resolve_addr";
        let mut dst = canon(dst);
        if dst.ip().is_unspecified() {
            // The kernel resolves a wildcard destination to this host.
            dst.set_ip(match dst.ip() {
                IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        self.with(CALL, handle, |core, st, out| {
            let id = &st.ids[&handle];
            id.need(CALL, &[State::Idle, State::AddrBound])?;
            let bound_ip = id.src.map(|s| s.ip()).filter(|ip| !ip.is_unspecified());
            let src_ip = match (bound_ip, src.map(canon).filter(|s| !s.ip().is_unspecified())) {
                (Some(ip), _) => ip,
                (None, Some(s)) => s.ip(),
                (None, None) => route::source_for(dst.ip()).map_err(|e| Error::from_io(CALL, e))?,
            };
            let dev = match &id.dev {
                Some(d) => d.clone(),
                None => core.device_for(st, CALL, src_ip)?,
            };
            if st.ids[&handle].state == State::Idle {
                let want = src.map_or(0, |s| s.port());
                let port = Core::hold_port(st, CALL, handle, src_ip, want)?;
                st.ids.get_mut(&handle).expect("checked").src = Some(SocketAddr::new(src_ip, port));
            }
            let id = st.ids.get_mut(&handle).expect("checked");
            let port = id.src.map_or(0, |s| s.port());
            id.src = Some(SocketAddr::new(src_ip, port));
            id.dev = Some(dev.clone());
            id.dst = Some(dst);
            id.gen += 1;
            if dst.ip().is_multicast() {
                // A group's address needs no neighbour: the kernel maps it (ARP's
                // multicast mapping) at once.
                id.peer = None;
                id.state = State::AddrResolved;
                id.event(CmEventType::AddrResolved, 0, CmEventParam::None);
                return Ok(());
            }
            id.state = State::AddrQuery;
            out.lookups.push(Lookup {
                dev: dev.shared().clone(),
                handle,
                gen: id.gen,
                dst,
                ps: id.ps as u16,
                timeout,
                connect: false,
            });
            Ok(())
        })
    }

    /// A lookup ended: for an address query, the address resolved (or not); for a
    /// connect, the request goes (or the connect fails as rdma_cm's would).
    fn on_lookup(&self, handle: u32, gen: u64, found: Found, connect: bool) {
        let mut out = Outbox::default();
        {
            let mut st = self.st.lock();
            let Some(id) = st.ids.get_mut(&handle) else {
                return;
            };
            if id.gen != gen {
                return;
            }
            if connect {
                super::cm::after_lookup(&mut st, handle, found, &mut out);
            } else if id.state == State::AddrQuery {
                match found {
                    Found::Unreachable(errno) => {
                        id.state = State::AddrBound;
                        id.event(CmEventType::AddrError, -errno, CmEventParam::None);
                    }
                    Found::Device(p) => {
                        id.peer = Some(p);
                        id.state = State::AddrResolved;
                        id.event(CmEventType::AddrResolved, 0, CmEventParam::None);
                    }
                    Found::NoListener => {
                        id.peer = None;
                        id.state = State::AddrResolved;
                        id.event(CmEventType::AddrResolved, 0, CmEventParam::None);
                    }
                }
            }
        }
        self.run(out);
    }

    /// `rdma_resolve_route`: the path to the device the address resolved to.
    pub fn resolve_route(&self, handle: u32) -> Result<()> {
        const CALL: &str = "rdma_resolve_route";
        self.with(CALL, handle, |_, st, _| {
            let id = st.ids.get_mut(&handle).expect("checked");
            id.need(CALL, &[State::AddrResolved])?;
            let dev = id.dev(CALL)?.clone();
            let dst = id.dst.expect("a resolved id has a destination");
            id.path = Some(route::path(dev.shared(), id.peer.as_ref(), dst.ip(), id.opts.tos));
            id.state = State::RouteResolved;
            id.event(CmEventType::RouteResolved, 0, CmEventParam::None);
            Ok(())
        })
    }

    /// `rdma_listen`: takes requests for the id's address and port, which a client finds
    /// through the rendezvous port opened here.
    pub fn listen(&self, handle: u32, backlog: u32) -> Result<()> {
        const CALL: &str = "rdma_listen";
        let backlog = if backlog > 0 && backlog < MAX_BACKLOG {
            backlog
        } else {
            MAX_BACKLOG
        };
        if self
            .st
            .lock()
            .ids
            .get(&handle)
            .is_some_and(|i| i.state == State::Idle)
        {
            self.bind(handle, SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0))?;
        }
        self.with(CALL, handle, |core, st, _| {
            let id = &st.ids[&handle];
            id.need(CALL, &[State::AddrBound])?;
            let src = id.src.expect("a bound id has an address");
            let dev = match &id.dev {
                Some(d) => d.clone(),
                None => core.device(st, 0)?,
            };
            let id = st.ids.get_mut(&handle).expect("checked");
            let reserved = id.reserved.take();
            let at = match st.rendezvous.get_mut(&src) {
                Some((r, users)) => {
                    *users += 1;
                    r.addr
                }
                None => {
                    let sock = match reserved {
                        Some(s) => s,
                        None => rendezvous::bind(src).map_err(|e| match e.kind() {
                            std::io::ErrorKind::AddrInUse => {
                                cm_err(CALL, libc::EADDRINUSE, format!("{src} is taken"))
                            }
                            _ => Error::from_io(CALL, e),
                        })?,
                    };
                    let r = rendezvous::open(sock, &dev.shared().setup.rt, core.me.clone())
                        .map_err(|e| Error::from_io(CALL, e))?;
                    st.rendezvous.insert(src, (r, 1));
                    src
                }
            };
            let id = st.ids.get_mut(&handle).expect("checked");
            id.listen = Some(Listen {
                backlog,
                queued: 0,
                rendezvous: at,
                dev,
            });
            id.state = State::Listen;
            tracing::debug!(handle, %src, ps = ?id.ps, "rdma_cm: listening");
            Ok(())
        })
    }

    /// The rendezvous: the device that takes requests for `(ps, port)` at `at` (the
    /// address a client reached), if an id listens there.
    pub fn lookup(&self, at: SocketAddr, ps: u16, port: u16) -> Option<Peer> {
        let at = canon(at);
        let mut st = self.st.lock();
        let (bound, held) = st
            .ids
            .values()
            .find(|i| {
                i.state == State::Listen
                    && i.ps as u16 == ps
                    && i.src
                        .is_some_and(|s| s.port() == port && (s.ip().is_unspecified() || s.ip() == at.ip()))
            })
            .map(|i| (i.dev.clone(), i.listen.as_ref().map(|l| l.dev.clone())))?;
        // A wildcard listener's device for this address: an open one that has it, else
        // the one it holds.
        let open = || {
            (0..self.devices.count())
                .filter_map(|i| self.devices.opened(i).map(|c| (i, c)))
                .find(|(_, c)| route::has_ip(&c.dev, at.ip()))
        };
        let dev = match (bound, open()) {
            (Some(d), _) => d,
            (None, Some((i, _))) => self.device(&mut st, i).ok()?,
            (None, None) => held?,
        };
        let d = dev.shared();
        Some(Peer::new(d.addr.ip_gid().0, d.addr.lid()))
    }

    // ------------------------------------------------------------------ queries

    /// What librdmacm's address query reports.
    pub fn query_addr(&self, handle: u32) -> Result<CmAddr> {
        self.with("rdma_query_addr", handle, |_, st, _| {
            let id = &st.ids[&handle];
            Ok(CmAddr {
                src: id.src,
                dst: id.dst,
                node_guid: id.dev.as_ref().map_or(0, |d| d.shared().attr.node_guid),
                port_num: u8::from(id.dev.is_some()),
                pkey: 0xffff,
                ibdev_index: id.dev.as_ref().map(|d| d.index),
            })
        })
    }

    /// The id's path records.
    pub fn query_path(&self, handle: u32) -> Result<Vec<PathRecord>> {
        self.with("rdma_query_path", handle, |_, st, _| {
            Ok(st.ids[&handle].path.into_iter().collect())
        })
    }

    /// The id's source and destination GIDs.
    pub fn query_gid(&self, handle: u32) -> Result<(Gid, Gid)> {
        self.with("rdma_query_gid", handle, |_, st, _| {
            let id = &st.ids[&handle];
            let sgid = id.dev.as_ref().map_or(Gid::ZERO, |d| d.shared().addr.ip_gid());
            let dgid = match (&id.path, id.dst) {
                (Some(p), _) => p.dgid,
                (None, Some(d)) => Gid(route::ip16(d.ip())),
                (None, None) => Gid::ZERO,
            };
            Ok((sgid, dgid))
        })
    }

    /// The id's device.
    pub fn verbs(&self, handle: u32) -> Option<Arc<SimContext>> {
        self.st
            .lock()
            .ids
            .get(&handle)?
            .dev
            .as_ref()
            .map(|d| d.ctx.clone())
    }

    /// The id's context value.
    pub fn context(&self, handle: u32) -> u64 {
        self.st.lock().ids.get(&handle).map_or(0, |i| i.context)
    }

    /// Sets the id's context value.
    pub fn set_context(&self, handle: u32, context: u64) {
        if let Some(i) = self.st.lock().ids.get_mut(&handle) {
            i.context = context;
        }
    }

    /// `rdma_migrate_id`: the id and its pending events move to `to`.
    pub fn migrate(&self, handle: u32, to: Arc<Channel>) -> Result<()> {
        self.with("rdma_migrate_id", handle, |_, st, _| {
            let id = st.ids.get_mut(&handle).expect("checked");
            if Arc::ptr_eq(&id.channel, &to) {
                return Ok(());
            }
            for ev in id.channel.take_for(|e| e.handle == handle) {
                to.push(ev);
            }
            id.channel = to;
            Ok(())
        })
    }

    /// `rdma_set_option`.
    pub fn set_option(&self, handle: u32, opt: &CmOption) -> Result<()> {
        const CALL: &str = "rdma_set_option";
        self.with(CALL, handle, |_, st, _| {
            let id = st.ids.get_mut(&handle).expect("checked");
            match opt {
                CmOption::Tos(t) => id.opts.tos = *t,
                CmOption::ReuseAddr(r) => {
                    if !(id.state == State::Idle || (!*r && id.state != State::Listen)) {
                        return Err(cm_err(CALL, libc::EINVAL, "REUSEADDR is set before the id binds"));
                    }
                    id.opts.reuseaddr = *r;
                }
                CmOption::AfOnly(a) => {
                    id.need(CALL, &[State::Idle])?;
                    id.opts.afonly = *a;
                }
                CmOption::AckTimeout(t) => {
                    if id.qp_type != QpType::Rc {
                        return Err(cm_err(CALL, libc::EINVAL, "ACK_TIMEOUT is an RC id's"));
                    }
                    id.opts.ack_timeout = Some(*t);
                }
                CmOption::IbPath(recs) => {
                    id.need(CALL, &[State::AddrResolved])?;
                    let Some(p) = recs.first() else {
                        return Err(cm_err(CALL, libc::EINVAL, "no path record"));
                    };
                    id.path = Some(*p);
                    id.state = State::RouteResolved;
                    id.event(CmEventType::RouteResolved, 0, CmEventParam::None);
                }
            }
            Ok(())
        })
    }

    /// `rdma_init_qp_attr`: what moves the id's QP to `state` (the IB CM's attributes
    /// once a connection exists, `cma_ib_init_qp_attr`'s before and for UD).
    pub fn init_qp_attr(&self, handle: u32, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        const CALL: &str = "rdma_init_qp_attr";
        self.with(CALL, handle, |_, st, _| {
            let id = &st.ids[&handle];
            let dev = id.dev(CALL)?;
            let mut a = QpAttr {
                qp_state: state,
                port_num: 1,
                pkey_index: 0,
                ..Default::default()
            };
            let conn = id
                .conn
                .as_ref()
                .filter(|c| id.qp_type != QpType::Ud && c.phase.has_cm_id());
            let Some(c) = conn else {
                let mut m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
                if id.qp_type == QpType::Ud {
                    a.qkey = UDP_QKEY;
                    m |= QpAttrMask::QKEY;
                } else {
                    m |= QpAttrMask::ACCESS_FLAGS;
                }
                if state == QpState::Rtr {
                    a.rq_psn = id.seq_num;
                }
                return Ok((a, m));
            };
            let wrong = || {
                cm_err(
                    CALL,
                    libc::EINVAL,
                    format!(
                        "the connection is in {:?}, which has no {state:?} attributes",
                        c.phase
                    ),
                )
            };
            match state {
                QpState::Init => {
                    if !c.phase.allows_init() {
                        return Err(wrong());
                    }
                    a.qp_access_flags = AccessFlags::REMOTE_WRITE;
                    if c.responder_resources > 0 {
                        a.qp_access_flags |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
                    }
                    Ok((
                        a,
                        QpAttrMask::STATE
                            | QpAttrMask::ACCESS_FLAGS
                            | QpAttrMask::PKEY_INDEX
                            | QpAttrMask::PORT,
                    ))
                }
                QpState::Rtr => {
                    if !c.phase.allows_rtr() {
                        return Err(wrong());
                    }
                    let p = id.path.unwrap_or_else(|| {
                        route::path(dev.shared(), Some(&c.peer), c.peer.addr.ip(), id.opts.tos)
                    });
                    a.ah_attr = route::ah_attr(&p);
                    a.path_mtu = c.path_mtu;
                    a.dest_qp_num = c.remote_qpn;
                    a.rq_psn = id.seq_num;
                    a.max_dest_rd_atomic = c.responder_resources;
                    a.min_rnr_timer = 0;
                    let mut m = QpAttrMask::STATE
                        | QpAttrMask::AV
                        | QpAttrMask::PATH_MTU
                        | QpAttrMask::DEST_QPN
                        | QpAttrMask::RQ_PSN;
                    if id.qp_type == QpType::Rc {
                        m |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
                    }
                    Ok((a, m))
                }
                QpState::Rts => {
                    if !c.phase.allows_rtr() {
                        return Err(wrong());
                    }
                    a.sq_psn = c.remote_psn;
                    let mut m = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
                    if id.qp_type == QpType::Rc {
                        a.retry_cnt = c.retry_count;
                        a.rnr_retry = c.rnr_retry_count;
                        a.max_rd_atomic = c.initiator_depth;
                        a.timeout = id.opts.ack_timeout.unwrap_or(route::PACKET_LIFE_TIME + 1);
                        m |= QpAttrMask::RETRY_CNT
                            | QpAttrMask::RNR_RETRY
                            | QpAttrMask::MAX_QP_RD_ATOMIC
                            | QpAttrMask::TIMEOUT;
                    }
                    Ok((a, m))
                }
                _ => Err(wrong()),
            }
        })
    }

    /// The path MTU of a connection from device `d` whose peer offered `offered`.
    pub fn path_mtu(d: &DeviceShared, offered: u8) -> Mtu {
        route::min_mtu(d.limits.active_mtu, offered)
    }

    /// `rdma_connect`.
    pub fn connect(&self, handle: u32, param: &ConnParam) -> Result<()> {
        self.with("rdma_connect", handle, |_, st, out| {
            super::cm::connect(st, handle, param, out)
        })
    }

    /// `rdma_accept` (with `None`: `rdma_establish`).
    pub fn accept(&self, handle: u32, param: Option<&ConnParam>) -> Result<()> {
        self.with("rdma_accept", handle, |_, st, out| {
            super::cm::accept(st, handle, param, out)
        })
    }

    /// `rdma_reject`.
    pub fn reject(&self, handle: u32, private_data: &[u8], reason: u8) -> Result<()> {
        let reason = verbs_api::rdmacm::reject::checked(reason)?;
        self.with("rdma_reject", handle, |_, st, out| {
            super::cm::reject(st, handle, private_data, reason, out)
        })
    }

    /// `rdma_disconnect`.
    pub fn disconnect(&self, handle: u32) -> Result<()> {
        self.with("rdma_disconnect", handle, |_, st, out| {
            super::cm::disconnect(st, handle, out)
        })
    }

    /// `rdma_notify`.
    pub fn notify(&self, handle: u32, event: verbs_api::AsyncEventType) -> Result<()> {
        self.with("rdma_notify", handle, |_, st, _| {
            super::cm::notify(st, handle, event)
        })
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

/// How many seeded ports a port-0 bind tries before it gives up.
const SEEDED_PORT_TRIES: usize = 64;

/// A TCP socket bound to `addr`'s IP on a port of rdma_cm's choosing: the kernel's
/// ephemeral port, or under a seed the first port drawn from it that binds, so that a
/// seeded run's listeners take the same ports again ([`crate::choices`]).
fn bind_ephemeral(choices: &Choices, addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    if !choices.seeded() {
        return rendezvous::bind(addr);
    }
    let mut last = None;
    for _ in 0..SEEDED_PORT_TRIES {
        let mut a = addr;
        a.set_port(choices.in_range(Choice::CmPort, EPHEMERAL));
        match rendezvous::bind(a) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::ErrorKind::AddrInUse.into()))
}

fn new_id(
    handle: u32,
    channel: Arc<Channel>,
    context: u64,
    ps: PortSpace,
    qp_type: QpType,
    seq_num: u32,
) -> Id {
    Id {
        handle,
        context,
        ps,
        qp_type,
        channel,
        state: State::Idle,
        dev: None,
        src: None,
        dst: None,
        holds_port: false,
        reserved: None,
        peer: None,
        path: None,
        seq_num,
        listen: None,
        conn: None,
        opts: Opts::default(),
        unclaimed: false,
        gen: 0,
        joins: Vec::new(),
    }
}

/// A connection request's new id (`cma_new_conn_id`): on `dev`, reporting to the
/// listener's channel with its context, its addresses the request's.
pub fn new_conn_id(
    st: &mut Ids,
    listener: u32,
    dev: &Dev,
    src: SocketAddr,
    dst: SocketAddr,
    qp_type: QpType,
) -> u32 {
    let handle = st.handle();
    let (channel, context, ps, tos) = {
        let l = &st.ids[&listener];
        (l.channel.clone(), l.context, l.ps, l.opts.tos)
    };
    let seq_num = st.fresh_psn();
    let mut id = new_id(handle, channel, context, ps, qp_type, seq_num);
    id.dev = Some(dev.clone());
    id.src = Some(src);
    id.dst = Some(dst);
    id.state = State::Connect;
    id.opts.tos = tos;
    id.unclaimed = true;
    st.ids.insert(handle, id);
    handle
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
