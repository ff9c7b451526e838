//! # backend-sim: a simulated RDMA HCA over TCP
//!
//! A verbs device that behaves like a real one, including what hurts: a SEND that meets
//! an empty receive queue gets an RNR NAK and is retried per `rnr_retry` /
//! `min_rnr_timer` until it fails with `IBV_WC_RNR_RETRY_EXC_ERR`; every remote access is
//! checked against the rkey, PD, access flags and bounds; atomics are truly atomic, 64-bit
//! and 8-byte aligned, and return the old value; errors move the QP to ERR and flush what
//! is outstanding.
//!
//! ```no_run
//! use verbs_api::*;
//! let sim = backend_sim::SimBackend::default();
//! let ctx = sim.open("sim0")?;
//! let pd = ctx.alloc_pd()?;
//! let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
//! # Ok::<(), verbs_api::Error>(())
//! ```
//!
//! ## Architecture
//!
//! The protocol core is sans-IO (like quinn-proto): [`wire`] encodes and decodes frames,
//! [`requester`] and [`responder`] are the two halves of an RC QP as pure state machines
//! that take time as an argument, [`memory`] holds registered regions and the one access
//! check, [`cq`] the completion queues and channels, [`qp`] the QP state machine. The
//! [`transport`] (tokio + socket2) is a thin layer that moves bytes between TCP streams,
//! registered memory and those state machines. Each device runs one progress thread, so
//! one-sided operations complete without the target application polling.
//!
//! ## Addressing and configuration
//!
//! Each opened device listens on its own TCP address (loopback and an ephemeral port by
//! default). Its LID is that port and its GID the listen IP (see [`device`]), so the usual
//! out-of-band exchange of (GID, LID, QPN, PSN) is all a peer needs, in the same process,
//! another process or another host. [`SimConfig`] (or the environment, see
//! [`SimBackend::from_env`]) chooses the listen address and the number of devices. The
//! data connections use CUBIC congestion control whatever the host's default
//! (`RDMA_SIM_TCP_CC` chooses another, or `system`; see [`sockopt`] for why).

#![warn(missing_docs)]

pub mod addressing;
pub mod cpu_share;
pub mod cq;
pub mod device;
pub mod epoll;
pub mod fault_state;
pub mod faults;
pub mod host_addrs;
pub mod link;
pub mod listener;
pub mod progress;
pub mod qp;
pub mod sockopt;
pub mod sys;
pub mod transport;
pub mod verify;

pub use backend_sim_proto::NakReason;
// The protocol core's modules under their old names, for the driver's own paths.
use backend_sim_proto::{memory, requester, responder, rx, tx, wire};

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use verbs_api::{
    AccessFlags, Backend, Capabilities, CompletionChannel, CompletionQueue, Context, DeviceAttr, DeviceInfo,
    Error, Gid, MemoryRegion, PortAttr, PostError, ProtectionDomain, QpAttr, QpAttrMask, QpCap, QpInitAttr,
    QpType, QueuePair, RecvWr, Result, SendWr, WorkCompletion,
};

use crate::cq::{ChannelShared, CqShared};
use crate::device::{DeviceShared, PdShared, MAX_INLINE};
use crate::memory::MrShared;
use crate::qp::QpShared;

/// Configuration of the simulated devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Address the devices listen on. Port 0 gives each device an ephemeral port; a fixed
    /// port `p` gives device `i` the port `p + i`.
    pub listen: SocketAddr,
    /// How many devices (`sim0`, `sim1`, ...) the backend lists.
    pub devices: u32,
    /// With a wildcard `listen` (`0.0.0.0`, `::`): the IP the devices advertise as their
    /// GID, where peers connect. `None`: the host's first non-loopback address of the
    /// listen address's family. Ignored for a specific listen IP, which is advertised.
    pub advertise: Option<IpAddr>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            devices: 2,
            advertise: None,
        }
    }
}

/// The simulated-HCA backend.
#[derive(Clone, Debug, Default)]
pub struct SimBackend {
    config: SimConfig,
}

impl SimBackend {
    /// A backend with the given configuration.
    pub fn new(config: SimConfig) -> Self {
        SimBackend { config }
    }

    /// The default configuration, overridden by `RDMA_SIM_LISTEN` (an `ip` or `ip:port`
    /// to listen on, e.g. `0.0.0.0:18515` to accept other hosts), `RDMA_SIM_ADVERTISE`
    /// (with a wildcard listen: the IP to advertise) and `RDMA_SIM_DEVICES` (how many
    /// devices to list).
    pub fn from_env() -> Result<Self> {
        let mut c = SimConfig::default();
        if let Ok(v) = std::env::var("RDMA_SIM_LISTEN") {
            c.listen = v
                .parse::<SocketAddr>()
                .or_else(|_| v.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 0)))
                .map_err(|_| Error::invalid("RDMA_SIM_LISTEN", format!("{v:?} is not an ip or ip:port")))?;
        }
        if let Ok(v) = std::env::var("RDMA_SIM_ADVERTISE") {
            let ip = v
                .parse::<IpAddr>()
                .map_err(|_| Error::invalid("RDMA_SIM_ADVERTISE", format!("{v:?} is not an IP address")))?;
            if ip.is_unspecified() {
                return Err(Error::invalid(
                    "RDMA_SIM_ADVERTISE",
                    format!("{v:?} is a wildcard: name an address peers can reach"),
                ));
            }
            c.advertise = Some(ip);
        }
        if let Ok(v) = std::env::var("RDMA_SIM_DEVICES") {
            c.devices = v
                .parse()
                .map_err(|_| Error::invalid("RDMA_SIM_DEVICES", format!("{v:?} is not a number")))?;
        }
        Ok(SimBackend { config: c })
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    fn index_of(&self, name: &str) -> Option<u32> {
        let i: u32 = name.strip_prefix("sim")?.parse().ok()?;
        (i < self.config.devices).then_some(i)
    }
}

impl Backend for SimBackend {
    type Context = SimContext;
    type Pd = SimPd;
    type Mr = SimMr;
    type Cq = SimCq;
    type Channel = SimChannel;
    type Qp = SimQp;

    fn name(&self) -> &'static str {
        "sim"
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        Ok((0..self.config.devices)
            .map(|i| DeviceInfo {
                name: format!("sim{i}"),
                guid: 0x5349_4d00_0000_0000 | ((std::process::id() as u64) << 16) | i as u64,
                transport: "simulated (TCP)".into(),
            })
            .collect())
    }

    fn open(&self, name: &str) -> Result<SimContext> {
        let Some(index) = self.index_of(name) else {
            return Err(Error::DeviceNotFound {
                name: name.to_string(),
                available: self.devices()?.into_iter().map(|d| d.name).collect(),
            });
        };
        let mut listen = self.config.listen;
        if listen.port() != 0 {
            listen.set_port(listen.port() + index as u16);
        }
        Ok(SimContext {
            dev: DeviceShared::open(name, index, listen, self.config.advertise)?,
        })
    }
}

/// An open simulated device.
pub struct SimContext {
    dev: Arc<DeviceShared>,
}

impl SimContext {
    /// The TCP address this device listens on.
    pub fn listen_addr(&self) -> SocketAddr {
        self.dev.addr.listen
    }

    /// The TCP address peers reach this device at: [`listen_addr`](Self::listen_addr),
    /// with a wildcard IP replaced by the advertised one (GID index 0).
    pub fn advertised_addr(&self) -> SocketAddr {
        self.dev.addr.advertise
    }

    /// Fault injection on this device (see [`faults`]).
    pub fn faults(&self) -> faults::Faults {
        faults::Faults::new(&self.dev)
    }
}

impl Context for SimContext {
    type Backend = SimBackend;

    fn name(&self) -> &str {
        &self.dev.name
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        Ok(DeviceAttr::clone(&self.dev.attr))
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        if port_num != 1 {
            return Err(Error::invalid(
                "ibv_query_port",
                format!("port {port_num} does not exist (ports: 1)"),
            ));
        }
        Ok(self.dev.port_attr())
    }

    fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid> {
        if port_num != 1 {
            return Err(Error::invalid(
                "ibv_query_gid",
                format!("port {port_num} does not exist (ports: 1)"),
            ));
        }
        match self.dev.addr.gids.get(index as usize) {
            Some(gid) => Ok(*gid),
            None => Err(Error::invalid(
                "ibv_query_gid",
                format!(
                    "index {index} is outside the GID table of {} entries",
                    self.dev.addr.gids.len()
                ),
            )),
        }
    }

    fn capabilities(&self) -> Result<Capabilities> {
        Ok(self.dev.capabilities())
    }

    fn alloc_pd(&self) -> Result<SimPd> {
        Ok(SimPd {
            pd: Arc::new(PdShared {
                handle: self.dev.next_handle(),
                dev: self.dev.clone(),
            }),
        })
    }

    fn create_comp_channel(&self) -> Result<SimChannel> {
        Ok(SimChannel {
            ch: Arc::new(ChannelShared::new()?),
        })
    }

    fn create_cq(&self, cqe: u32, channel: Option<&SimChannel>) -> Result<SimCq> {
        if cqe == 0 || cqe > self.dev.attr.max_cqe {
            return Err(Error::invalid(
                "ibv_create_cq",
                format!("cqe {cqe} is outside 1..={}", self.dev.attr.max_cqe),
            ));
        }
        Ok(SimCq {
            cq: Arc::new(CqShared::new(
                self.dev.next_handle(),
                cqe,
                channel.map(|c| c.ch.clone()),
            )),
            dev: self.dev.clone(),
        })
    }
}

/// A protection domain of the sim.
pub struct SimPd {
    pd: Arc<PdShared>,
}

impl ProtectionDomain for SimPd {
    type Backend = SimBackend;

    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<SimMr> {
        check_mr_access(access)?;
        let dev = &self.pd.dev;
        let key = dev.mrs.fresh_key(rand::random);
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
        let key = self.pd.dev.mrs.fresh_key(rand::random);
        // SAFETY: the caller guarantees the memory stays valid until the MR is dropped,
        // and `SimMr::drop` calls `kill` before returning.
        let mr = unsafe { MrShared::new_borrowed(self.pd.handle, key, addr, len, access) };
        Ok(SimMr::register(self, mr))
    }

    fn create_qp(&self, attr: &QpInitAttr<'_, SimCq>) -> Result<SimQp> {
        let dev = &self.pd.dev;
        if attr.qp_type != QpType::Rc {
            return Err(Error::Unsupported {
                backend: "sim",
                what: format!("QP type {:?} (the sim implements RC)", attr.qp_type),
            });
        }
        if !Arc::ptr_eq(&attr.send_cq.dev, dev) || !Arc::ptr_eq(&attr.recv_cq.dev, dev) {
            return Err(Error::invalid("ibv_create_qp", "a CQ belongs to another device"));
        }
        let c = attr.cap;
        let a = &dev.attr;
        let checks = [
            ("max_send_wr", c.max_send_wr, a.max_qp_wr),
            ("max_recv_wr", c.max_recv_wr, a.max_qp_wr),
            ("max_send_sge", c.max_send_sge, a.max_sge),
            ("max_recv_sge", c.max_recv_sge, a.max_sge),
            ("max_inline_data", c.max_inline_data, MAX_INLINE),
        ];
        for (name, asked, max) in checks {
            if asked > max {
                return Err(Error::InvalidAttr {
                    name,
                    reason: format!("{asked} exceeds the device limit {max}"),
                });
            }
        }
        let granted = QpCap {
            max_send_sge: c.max_send_sge.max(1),
            max_recv_sge: c.max_recv_sge.max(1),
            ..c
        };
        let qpn = dev.alloc_qpn();
        let qp = Arc::new(QpShared::new(
            qpn,
            dev.for_qp(),
            self.pd.handle,
            attr.send_cq.cq.clone(),
            attr.recv_cq.cq.clone(),
            granted,
            attr.sq_sig_all,
        ));
        dev.qps.lock().insert(qpn, Arc::downgrade(&qp));
        Ok(SimQp {
            qp,
            pd: self.pd.clone(),
        })
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
    mr: Arc<MrShared>,
    _pd: Arc<PdShared>,
}

impl SimMr {
    fn register(pd: &SimPd, mr: MrShared) -> SimMr {
        let mr = Arc::new(mr);
        pd.pd.dev.mrs.insert(mr.clone());
        SimMr {
            mr,
            _pd: pd.pd.clone(),
        }
    }
}

impl Drop for SimMr {
    fn drop(&mut self) {
        self._pd.dev.mrs.remove(self.mr.key);
        // Waits for copies in progress; later ones find the region dead.
        self.mr.kill();
    }
}

// SAFETY: `as_ptr()..as_ptr() + len()` is the region's memory, valid while the MR lives
// (owned: freed only after the last Arc; caller memory: the caller's contract).
unsafe impl MemoryRegion for SimMr {
    fn as_ptr(&self) -> *mut u8 {
        self.mr.base()
    }
    fn len(&self) -> usize {
        self.mr.len()
    }
    fn lkey(&self) -> u32 {
        self.mr.key
    }
    fn rkey(&self) -> u32 {
        self.mr.key
    }
    fn access(&self) -> AccessFlags {
        self.mr.access
    }
}

/// A completion queue of the sim.
pub struct SimCq {
    cq: Arc<CqShared>,
    dev: Arc<DeviceShared>,
}

impl CompletionQueue for SimCq {
    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        // ACKs deferred by this thread's previous poll leave now (delayed ACK).
        self.dev.progress.flush_acks();
        let n = self.cq.poll(wc)?;
        if n > 0 {
            self.dev.progress.user_polled();
            return Ok(n);
        }
        if wc.is_empty() {
            return Ok(0);
        }
        // Empty: drive the device's receive progress on this thread, then look again.
        self.dev.progress.user_drive();
        self.cq.poll(wc)
    }
    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.cq.req_notify(solicited_only)?;
        // The caller will wait on the channel, not poll: hand progress to the device.
        self.dev.progress.user_idle();
        Ok(())
    }
    fn ack_events(&self, n: u32) {
        self.cq.ack_events(n)
    }
    fn capacity(&self) -> u32 {
        self.cq.cap
    }
    fn handle(&self) -> u32 {
        self.cq.handle
    }
    fn channel_fd(&self) -> Option<RawFd> {
        self.cq.channel_fd()
    }
}

/// A completion channel of the sim.
pub struct SimChannel {
    ch: Arc<ChannelShared>,
}

impl CompletionChannel for SimChannel {
    fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
        self.ch.get_event(timeout)
    }
    fn fd(&self) -> RawFd {
        self.ch.fd()
    }
}

/// A queue pair of the sim.
pub struct SimQp {
    qp: Arc<QpShared>,
    /// Keeps the PD (and through it the device) alive as long as the QP.
    pd: Arc<PdShared>,
}

impl QueuePair for SimQp {
    fn qp_num(&self) -> u32 {
        self.qp.qpn
    }
    fn qp_type(&self) -> QpType {
        QpType::Rc
    }
    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.qp.modify(attr, mask)
    }
    fn query(&self) -> Result<QpAttr> {
        Ok(self.qp.query())
    }
    fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        self.qp.post_send(wrs)
    }
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        self.qp.post_recv(wrs)
    }
}

impl Drop for SimQp {
    fn drop(&mut self) {
        self.pd.dev.qps.lock().remove(&self.qp.qpn);
        self.qp.destroy();
    }
}
