//! The simulated device: its attributes (`ibv_query_device`, `ibv_query_port`,
//! `ibv_query_gid`), its tables (MRs by key, QPs by number, handles of PDs and CQs), its
//! TCP listener and the progress thread that runs its transport.
//!
//! Addressing: a sim device is reachable at the TCP address it listens on. Its port's
//! LID is that TCP port, and the first two entries of its GID table (index 0 and 1, so
//! that programs written for InfiniBand (index 0) and for RoCE v2 (index 1) both work)
//! hold the address it advertises as a GID (IPv4-mapped for IPv4): the listen IP, or for
//! a wildcard listen (`0.0.0.0`, `::`) the configured advertised address or else the
//! host's first non-loopback address ([`host_addrs`](crate::host_addrs)); a wildcard
//! listen also lists the host's other addresses after those two, as a RoCE port lists
//! its netdev's. The usual out-of-band exchange of (GID, LID, QPN, PSN) therefore tells
//! the peer where to connect, on one host or across hosts.
//!
//! QP numbers are drawn at random from the whole 24-bit space (never 0, 1 or 0xffffff,
//! which IBA reserves), so that a stranger cannot find a device's QPs by counting.
//!
//! Threads: each device has a setup thread running a current-thread tokio runtime (the
//! listener, connection setup and reconnection) and a progress thread for the data path
//! ([`progress`](crate::progress)). RDMA READ, WRITE and atomics complete without the
//! target application doing anything.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use verbs_api::{
    AsyncElement, AsyncEvent, AsyncEventType, Capabilities, DeviceAttr, Error, LinkLayer, PortAttr, Result,
};

use verbs_api::event_queue::EventQueue;

use crate::addressing::Addressing;
use crate::choices::{Choice, Choices};
use crate::counters::DeviceCounters;
use crate::datagram::Datagrams;
use crate::mcast::Multicast;
use crate::port::Port;
use crate::profile::attrs::{IBV_DEVICE_MEM_WINDOW, IBV_DEVICE_MEM_WINDOW_TYPE_2B, IBV_DEVICE_SRQ_RESIZE};
use crate::profile::warnings::Advice;
use crate::profile::{Attrs, Profile};
use crate::progress::Progress;
use crate::qp::{Conn, DataPath, QpDevice, QpInner, QpShared, QpTable};
use crate::transport::Setup;
use backend_sim_proto::memory::MrTable;

/// One simulated HCA.
pub struct DeviceShared {
    /// Device name (`sim0`, ...).
    pub name: String,
    /// Where it is reached: listen and advertised address, GID table.
    pub addr: Arc<Addressing>,
    /// Device attributes.
    pub attr: Arc<DeviceAttr>,
    /// The kind of HCA it plays.
    pub profile: Profile,
    /// That profile's attributes (what `attr` and the port report, and more).
    pub limits: Attrs,
    /// The portability advice of its backend (`profile::warnings`).
    pub advice: Arc<Advice>,
    /// Where its QP numbers, keys and address come from ([`crate::choices`]).
    pub choices: Arc<Choices>,
    /// Registered memory.
    pub mrs: Arc<MrTable>,
    /// QPs by number.
    pub qps: Arc<QpTable>,
    next_handle: AtomicU32,
    /// The data path: established connections, timers, transmit scheduling.
    pub progress: Arc<Progress>,
    /// Connection setup: the listener's and the connectors' view of the device.
    pub setup: Arc<Setup>,
    /// Asynchronous events (`ibv_get_async_event`).
    pub events: Arc<EventQueue>,
    /// What its responders dropped silently.
    pub counters: Arc<DeviceCounters>,
    /// Its UD side: links to other devices, datagrams to its own QPs.
    pub datagrams: Arc<Datagrams>,
    /// Its multicast groups.
    pub mcast: Arc<Multicast>,
    /// Its port's state (up, or down by fault injection).
    pub port: Arc<Port>,
    /// Its capture, if on ([`crate::capture`]).
    pub capture: crate::capture::Slot,
    /// Its table for same-host peers' one-sided fast path (none over TCP only, or with
    /// the fast path off: `RDMA_SIM_ONESIDED` unset or `off`).
    pub onesided: Option<Arc<crate::onesided::owner::Owner>>,
    shutdown: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    /// Its listeners, by address: the one peers reach it at, and on an Ethernet (RoCE)
    /// port one per address added to its GID table ([`crate::port_addr`]); each with
    /// its same-host socket, closed and unpublished with it.
    pub(crate) listeners: Mutex<Vec<(SocketAddr, crate::transport::Listening)>>,
    /// Its control socket (`rdma-sim status`), removed with the device.
    control: Mutex<Option<crate::control::Endpoint>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    progress_thread: Mutex<Option<JoinHandle<()>>>,
}

/// A protection domain.
pub struct PdShared {
    /// Handle, unique on the device.
    pub handle: u32,
    /// The device.
    pub dev: Arc<DeviceShared>,
}

/// What a device is opened as, beside its name and addresses: the pieces its backend
/// decides.
pub struct DeviceOptions {
    /// The kind of HCA it plays.
    pub profile: Profile,
    /// Its backend's portability advice.
    pub advice: Arc<Advice>,
    /// Where its QP numbers, keys and address come from.
    pub choices: Choices,
    /// The capture it writes to, if its backend has one.
    pub capture: Option<Arc<crate::capture::Capture>>,
    /// How its connections run.
    pub transport: crate::same_host::Transport,
}

impl DeviceShared {
    /// Opens a device with node GUID `guid` as `opts` say: binds its listener on
    /// `listen` and starts its progress thread. A wildcard `listen` advertises `advertise`, or else the host's
    /// first non-loopback address of its family.
    pub fn open(
        name: &str,
        guid: u64,
        listen: SocketAddr,
        advertise: Option<IpAddr>,
        opts: DeviceOptions,
    ) -> Result<Arc<DeviceShared>> {
        let DeviceOptions {
            profile,
            advice,
            choices,
            capture,
            transport,
        } = opts;
        let os = |call: &'static str| move |source: std::io::Error| Error::Os { call, source };
        let roce = profile.attrs().link_layer == LinkLayer::Ethernet;
        let sock = if roce {
            bind_roce(listen, &choices)?
        } else {
            crate::lid_port::bind(listen, &choices).map_err(|source| Error::Os {
                call: "bind (sim device listener)",
                source,
            })?
        };
        sock.listen(1024).map_err(os("listen"))?;
        sock.set_nonblocking(true).map_err(os("fcntl(O_NONBLOCK)"))?;
        let std_listener: std::net::TcpListener = sock.into();
        let bound = std_listener.local_addr().map_err(os("getsockname"))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(os("tokio runtime"))?;
        let handle = rt.handle().clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("{name}-setup"))
            .spawn(move || {
                rt.block_on(async {
                    let _ = rx.await;
                });
                // Dropped here, outside any runtime context: cancels every task.
                drop(rt);
            })
            .map_err(os("spawn progress thread"))?;
        let progress = Arc::new(Progress::new()?);
        let p = progress.clone();
        let progress_thread = std::thread::Builder::new()
            .name(format!("{name}-progress"))
            .spawn(move || p.run())
            .map_err(os("spawn progress thread"))?;
        let l = profile.attrs();
        let attr = DeviceAttr {
            fw_ver: concat!("sim-", env!("CARGO_PKG_VERSION")).to_string(),
            node_guid: guid,
            sys_image_guid: guid,
            max_mr_size: l.max_mr_size,
            page_size_cap: l.page_size_cap,
            vendor_id: l.vendor_id,
            vendor_part_id: l.vendor_part_id,
            hw_ver: 1,
            max_qp: l.max_qp,
            max_qp_wr: l.max_qp_wr,
            device_cap_flags: IBV_DEVICE_SRQ_RESIZE | l.mw_flags,
            max_sge: l.max_sge,
            max_sge_rd: l.max_sge_rd,
            max_cq: l.max_cq,
            max_cqe: l.max_cqe,
            max_mr: l.max_mr,
            max_mw: l.max_mw,
            max_pd: l.max_pd,
            max_qp_rd_atom: l.max_qp_rd_atom,
            max_qp_init_rd_atom: l.max_qp_init_rd_atom,
            atomic_cap: l.atomic_cap,
            max_srq: l.max_srq,
            max_srq_wr: l.max_srq_wr,
            max_srq_sge: l.max_srq_sge,
            // One P_Key, the default (see `profile::attrs`).
            max_pkeys: 1,
            phys_port_cnt: 1,
            max_mcast_grp: l.max_mcast_grp,
            max_mcast_qp_attach: l.max_mcast_qp_attach,
            max_total_mcast_qp_attach: l.max_total_mcast_qp_attach,
        };
        let addr = Addressing::new(bound, advertise);
        let addr = Arc::new(if roce { addr.roce() } else { addr });
        let qps: Arc<QpTable> = Arc::default();
        let claims: Arc<crate::verify::Claims> = Arc::default();
        let counters: Arc<DeviceCounters> = Arc::default();
        let mcast = Arc::new(Multicast::new(addr.advertise, l.link_layer, &l));
        let port: Arc<Port> = Arc::default();
        let datagrams = Arc::new(Datagrams::new(
            name,
            handle.clone(),
            addr.clone(),
            claims.clone(),
            qps.clone(),
            counters.clone(),
            progress.clone(),
            mcast.clone(),
            port.clone(),
            transport,
        ));
        let capture: crate::capture::Slot =
            Arc::new(capture.map(std::sync::OnceLock::from).unwrap_or_default());
        let onesided = match transport {
            crate::same_host::Transport::Auto => crate::onesided::owner::Owner::open(capture.clone()),
            crate::same_host::Transport::Tcp => None,
        };
        let setup = Arc::new(Setup {
            onesided: onesided.clone(),
            name: name.to_string(),
            rt: handle,
            addr: addr.clone(),
            claims,
            qps: qps.clone(),
            progress: progress.clone(),
            datagrams: datagrams.clone(),
            port: port.clone(),
            transport,
            counters: counters.clone(),
        });
        let dev = Arc::new(DeviceShared {
            name: name.to_string(),
            addr: addr.clone(),
            attr: Arc::new(attr),
            profile,
            limits: l,
            advice,
            choices: Arc::new(choices),
            mrs: Arc::default(),
            qps,
            next_handle: AtomicU32::new(1),
            progress,
            setup,
            events: Arc::new(EventQueue::new()?),
            counters,
            datagrams,
            mcast,
            port,
            capture,
            onesided,
            shutdown: Mutex::new(Some(tx)),
            control: Mutex::new(None),
            listeners: Mutex::default(),
            thread: Mutex::new(Some(thread)),
            progress_thread: Mutex::new(Some(progress_thread)),
        });
        let listener = crate::transport::spawn_listener(&dev.setup, std_listener)?;
        dev.listeners.lock().push((bound, listener));
        let weak: std::sync::Weak<DeviceShared> = Arc::downgrade(&dev);
        *dev.control.lock() = crate::control::open(name, &dev.setup.rt, weak);
        if let Some(s) = crate::port::schedule_from_env()? {
            dev.schedule_port_fault(s);
        }
        if let Some(after) = crate::port_addr::schedule_from_env()? {
            dev.schedule_address_change(after);
        }
        tracing::debug!(device = name, %bound, advertise = %addr.advertise, %profile, "sim device open");
        Ok(dev)
    }

    /// A fresh handle for a PD or CQ.
    pub fn next_handle(&self) -> u32 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// A fresh QP number: in 2..0xffffff ([`crate::choices`]), not in use.
    pub fn alloc_qpn(&self) -> u32 {
        let qps = self.qps.lock();
        loop {
            let n = self.choices.in_range(Choice::Qpn, 2..0xff_ffff);
            if !qps.contains_key(&n) {
                return n;
            }
        }
    }

    /// `ibv_query_port`.
    pub fn port_attr(&self) -> PortAttr {
        let (state, phys_state) = self.port.states();
        PortAttr {
            state,
            max_mtu: self.limits.max_mtu,
            active_mtu: self.limits.active_mtu,
            gid_tbl_len: self.addr.gid_tbl_len,
            max_msg_sz: self.limits.max_msg_sz,
            pkey_tbl_len: 1,
            lid: self.addr.lid(),
            sm_lid: 0,
            lmc: 0,
            active_width: 1,
            active_speed: 1,
            phys_state,
            link_layer: self.limits.link_layer,
            qkey_viol_cntr: self.counters.qkey_violations(),
            bad_pkey_cntr: 0,
        }
    }

    /// What the sim can do.
    pub fn capabilities(&self) -> Capabilities {
        let a = &self.attr;
        let mut c = Capabilities::default();
        c.atomic_cap = a.atomic_cap;
        c.imm_data = true;
        c.srq = true;
        c.max_srq = a.max_srq;
        c.max_srq_wr = a.max_srq_wr;
        c.max_srq_sge = a.max_srq_sge;
        c.srq_resize = a.device_cap_flags & IBV_DEVICE_SRQ_RESIZE != 0;
        c.mw_type1 = a.max_mw > 0 && a.device_cap_flags & IBV_DEVICE_MEM_WINDOW != 0;
        c.mw_type2 = a.max_mw > 0 && a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B != 0;
        c.ud = true;
        c.uc = true;
        c.max_inline_data = self.limits.max_inline;
        c.max_send_sge = a.max_sge;
        c.max_recv_sge = a.max_sge;
        c.max_sge_rd = a.max_sge_rd;
        c.max_qp_wr = a.max_qp_wr;
        c.max_cqe = a.max_cqe;
        c.max_qp_init_rd_atom = a.max_qp_init_rd_atom;
        c.max_qp_rd_atom = a.max_qp_rd_atom;
        c.max_msg_sz = self.limits.max_msg_sz;
        c.max_mr_size = a.max_mr_size;
        c.link_layer = self.limits.link_layer;
        c.qp_create_flags = self.limits.qp_create_flags;
        c
    }
}

/// The listener of a device with an Ethernet (RoCE) port: at [`ROCE_PORT`] on an IP of
/// its own (see [`addressing`](crate::addressing)): on loopback without a configured
/// port, an address drawn in 127.0.0.0/8 that no other device holds; otherwise the
/// listen IP, which one device alone may hold.
pub(crate) fn bind_roce(listen: SocketAddr, choices: &Choices) -> Result<socket2::Socket> {
    use crate::addressing::ROCE_PORT;
    let os = |source| Error::Os {
        call: "bind (sim device listener, RoCE)",
        source,
    };
    if listen.port() != 0 && listen.port() != ROCE_PORT {
        return Err(Error::invalid(
            "RDMA_SIM_LISTEN",
            format!(
                "{listen}: a device with an Ethernet (RoCE) port is reached by its GID alone, at port \
                 {ROCE_PORT}; give an IP without a port (or port {ROCE_PORT})"
            ),
        ));
    }
    if listen.ip().is_loopback() && listen.port() == 0 && listen.is_ipv4() {
        let mut last = None;
        for _ in 0..256 {
            let ip = std::net::Ipv4Addr::new(
                127,
                choices.in_range(Choice::Address, 1u16..255) as u8,
                choices.in_range(Choice::Address, 0u16..256) as u8,
                choices.in_range(Choice::Address, 1u16..255) as u8,
            );
            match crate::lid_port::bind(SocketAddr::new(ip.into(), ROCE_PORT), choices) {
                Ok(s) => return Ok(s),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
                Err(e) => return Err(os(e)),
            }
        }
        return Err(os(
            last.unwrap_or_else(|| std::io::Error::from(std::io::ErrorKind::AddrInUse))
        ));
    }
    crate::lid_port::bind(SocketAddr::new(listen.ip(), ROCE_PORT), choices).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            Error::invalid(
                "RDMA_SIM_LISTEN",
                format!(
                    "{}:{ROCE_PORT} is taken: with an Ethernet (RoCE) port each device needs an IP of \
                     its own (one device per process here, or a loopback listen address)",
                    listen.ip()
                ),
            )
        } else {
            os(e)
        }
    })
}

impl DeviceShared {
    /// What a QP of this device takes from it.
    pub fn for_qp(self: &Arc<Self>) -> QpDevice {
        QpDevice {
            path: self.clone(),
            mrs: self.mrs.clone(),
            addr: self.addr.clone(),
            attr: self.attr.clone(),
            events: self.events.clone(),
            counters: self.counters.clone(),
            profile: self.profile,
            advice: self.advice.clone(),
            port: self.port.clone(),
            capture: self.capture.clone(),
            onesided: self.onesided.clone(),
        }
    }

    /// Takes the port down and up again as `s` says, on the setup runtime.
    fn schedule_port_fault(self: &Arc<Self>, s: crate::port::Schedule) {
        let weak = Arc::downgrade(self);
        self.setup.rt.spawn(async move {
            tokio::time::sleep(s.after).await;
            let Some(d) = weak.upgrade() else { return };
            d.set_port(false);
            drop(d);
            if let Some(f) = s.down_for {
                tokio::time::sleep(f).await;
                if let Some(d) = weak.upgrade() {
                    d.set_port(true);
                }
            }
        });
    }

    /// Takes the port down (`up` false) or brings it back, as a cable pulled and plugged
    /// in again (fault injection): `IBV_EVENT_PORT_ERR` or `IBV_EVENT_PORT_ACTIVE`, and
    /// `ibv_query_port` says so. Down, every connection and UD link of the device closes
    /// and none is set up or accepted until the port is back: what the QPs send is lost
    /// (their requesters retry per `retry_cnt`, and a port back in time loses nothing),
    /// or fails where the profile says so (`Switches::port_down_fails_sends`, rxe). Up,
    /// the QPs that lost their connections set them up again at once.
    pub fn set_port(&self, up: bool) {
        if !self.port.set_up(up) {
            return;
        }
        let (event, what) = match up {
            true => (AsyncEventType::PortActive, "active"),
            false => (AsyncEventType::PortErr, "down"),
        };
        tracing::debug!(device = %self.name, "port 1 {what}");
        if !up {
            self.drop_connections();
        } else {
            let qps: Vec<Arc<QpShared>> = self.qps.lock().values().filter_map(|q| q.upgrade()).collect();
            for qp in &qps {
                qp.req_wake.notify_one();
            }
        }
        self.events.raise(AsyncEvent {
            event_type: event,
            element: AsyncElement::Port(1),
        });
    }

    /// Closes every connection and UD link of the device, as a link that went down loses
    /// them: the QPs set theirs up again when they can (their requesters retry meanwhile).
    pub(crate) fn drop_connections(&self) {
        let qps: Vec<Arc<QpShared>> = self.qps.lock().values().filter_map(|q| q.upgrade()).collect();
        for qp in &qps {
            let conns = {
                let g = qp.inner.lock();
                [g.conn.clone(), g.self_conn.clone()]
            };
            for c in conns.into_iter().flatten() {
                self.progress.port_went_down(&c);
            }
        }
        self.datagrams.close_links();
    }
}

/// What the device's control endpoint shows ([`control`](crate::control)).
impl crate::control::Source for DeviceShared {
    fn set_port(&self, up: bool) {
        DeviceShared::set_port(self, up)
    }

    fn change_address(&self) {
        if let Err(e) = DeviceShared::change_address(self) {
            tracing::warn!(device = %self.name, "control: the address did not change: {e}");
        }
    }

    fn status(&self) -> crate::control::DeviceStatus {
        // The table's lock is let go before any QP's is taken.
        let live: Vec<_> = self.qps.lock().values().filter_map(|q| q.upgrade()).collect();
        let mut qps: Vec<_> = live.iter().map(|q| q.status()).collect();
        qps.sort_by_key(|q| q.qpn);
        let c = self.counters.snapshot();
        let counters = c
            .named()
            .into_iter()
            .chain([
                ("qkey_violations", u64::from(self.counters.qkey_violations())),
                // WRITEs, READs and atomics its requesters executed on same-host peers'
                // memory themselves (the one-sided fast path).
                (
                    "onesided_placed",
                    self.onesided.as_ref().map_or(0, |o| o.placed()),
                ),
            ])
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let program = std::fs::read_to_string("/proc/self/comm")
            .map(|s| s.trim_end().to_string())
            .unwrap_or_default();
        crate::control::DeviceStatus {
            pid: std::process::id(),
            program,
            device: self.name.clone(),
            profile: self.profile.name().to_string(),
            node_guid: self.attr.node_guid,
            link_layer: format!("{:?}", self.limits.link_layer),
            lid: self.addr.lid(),
            listen: self.addr.listen_addr().to_string(),
            gids: self
                .addr
                .populated()
                .iter()
                .map(|g| std::net::Ipv6Addr::from(g.0).to_string())
                .collect(),
            mrs: self.mrs.len(),
            port: match self.port.is_up() {
                true => "ACTIVE".into(),
                false => "DOWN".into(),
            },
            counters,
            qps,
        }
    }
}

/// The device is its QPs' way to the data path and to connection setup.
impl DataPath for DeviceShared {
    fn close(&self, conn: &Conn) {
        self.progress.close(conn);
    }

    fn flush_final(&self, conn: &Arc<Conn>) {
        self.progress.flush_final(conn);
    }

    fn count_busy(&self, busy: bool) {
        self.progress.count_busy(busy);
    }

    fn count_awaiting_link(&self, awaits: bool) {
        self.progress.count_awaiting_link(awaits);
    }

    fn rearm(&self, qp: &Arc<QpShared>, g: &mut QpInner) {
        self.progress.rearm(qp, g);
    }

    fn kick(&self, qp: &Arc<QpShared>, conn: &Arc<Conn>, idle: bool, wrs: usize, bytes: u64) {
        self.progress.kick(qp, conn, idle, wrs, bytes);
    }

    fn schedule(&self, qp: &Arc<QpShared>) {
        self.progress.schedule(qp);
    }

    fn connect(&self, qp: Arc<QpShared>, epoch: u64) {
        crate::transport::spawn_connector(&self.setup, qp, epoch);
    }

    fn send_datagrams(&self, qp: &Arc<QpShared>) {
        self.datagrams.transmit(qp);
    }
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        self.mcast.close();
        if let Some(tx) = self.shutdown.lock().take() {
            let _ = tx.send(());
        }
        self.progress.shutdown();
        // The last reference may go away on one of the device's own threads (a task or
        // the progress loop held it); such a thread exits by itself.
        for t in [self.thread.lock().take(), self.progress_thread.lock().take()]
            .into_iter()
            .flatten()
        {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        self.progress.close_all();
    }
}
