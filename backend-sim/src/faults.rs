//! Fault injection for tests (the sim's own, and users'): break a QP's connection at a
//! chosen point of a transfer, stall a responder, delay its responses, make it answer
//! RNR although receives are posted, lose a UD QP's datagrams, delay a QP's connection
//! setups, stall the device's setup thread, take the device's port down and up, or change
//! its address (a new LID, a GID added or removed). Get a handle with
//! [`SimContext::faults`](crate::SimContext::faults) and name the QP by its number.
//!
//! The sim then behaves as an HCA does when the fabric misbehaves: lost requests and
//! responses are resent after the local ACK `timeout`, `retry_cnt` times, then the WR
//! completes with `IBV_WC_RETRY_EXC_ERR`, the QP goes to ERR and the rest is flushed;
//! resent requests are recognised as duplicates (a SEND is delivered once, an atomic runs
//! once); RNR is retried per `rnr_retry`. Other QPs are not affected, every wait is
//! bounded, and every signaled WR gets exactly one completion. A lost datagram is what
//! UD allows: its WR completes successfully and nothing arrives.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use backend_sim_proto::faults::ForcedRnr;
use verbs_api::{Error, Result};

use crate::device::DeviceShared;
pub use crate::fault_state::BreakPoint;
use crate::fault_state::QpFaults;
use crate::progress::Progress;
use crate::qp::QpShared;

/// Where connection setup takes a connection of `qp` over: waits as
/// [`Faults::delay_setup`] asked.
pub(crate) async fn setup_pause(qp: &QpShared) {
    if !qp.fault_armed.load(Ordering::Acquire) {
        return;
    }
    let d = qp.inner.lock().faults.setup_delay;
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// How many faults fired on a device (a snapshot of its counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Connections broken.
    pub breaks: u64,
    /// Responder stalls started.
    pub stalls: u64,
    /// Response batches held back.
    pub delayed: u64,
    /// RNR NAKs forced (armed).
    pub forced_rnr: u64,
    /// UD datagrams lost.
    pub datagrams_dropped: u64,
}

/// Fault injection on one simulated device.
#[derive(Clone)]
pub struct Faults {
    dev: Weak<DeviceShared>,
}

impl Faults {
    pub(crate) fn new(dev: &Arc<DeviceShared>) -> Self {
        Faults {
            dev: Arc::downgrade(dev),
        }
    }

    /// The device, unless it is closed.
    fn dev(&self) -> Result<Arc<DeviceShared>> {
        self.dev
            .upgrade()
            .ok_or_else(|| Error::invalid("faults", "the device is closed"))
    }

    /// QP `qpn` (now marked as having faults armed) and its device's data path.
    fn qp(&self, qpn: u32) -> Result<(Arc<QpShared>, Arc<Progress>)> {
        let dev = self.dev()?;
        let qp = dev.qps.lock().get(&qpn).and_then(Weak::upgrade);
        let qp =
            qp.ok_or_else(|| Error::invalid("faults", format!("no QP {qpn:#x} on device {}", dev.name)))?;
        qp.fault_armed.store(true, Ordering::Release);
        Ok((qp, dev.progress.clone()))
    }

    /// Writes `what` to QP `qp`'s capture, if its device captures, as a fault injected.
    fn note(qp: &QpShared, what: std::fmt::Arguments<'_>) {
        if let Some(cap) = qp.dev.capture.get() {
            crate::capture::notes::qp(cap, qp.qpn, format_args!("fault injection: {what}"));
        }
    }

    /// Breaks the connection of QP `qpn`'s requester at `point` of its next request.
    pub fn break_connection(&self, qpn: u32, point: BreakPoint) -> Result<()> {
        let (qp, progress) = self.qp(qpn)?;
        qp.inner.lock().faults.break_at = Some(point);
        progress.schedule(&qp);
        Ok(())
    }

    /// Breaks every connection of QP `qpn` now (both directions).
    pub fn drop_connections(&self, qpn: u32) -> Result<()> {
        let (qp, progress) = self.qp(qpn)?;
        let conns = {
            let g = qp.inner.lock();
            [g.conn.clone(), g.self_conn.clone()]
        };
        for c in conns.into_iter().flatten() {
            progress.fault_break(&c);
        }
        Ok(())
    }

    /// QP `qpn`'s responder processes nothing for `d` (requests wait in the socket).
    pub fn stall_responder(&self, qpn: u32, d: Duration) -> Result<()> {
        let (qp, progress) = self.qp(qpn)?;
        let until = Instant::now() + d;
        qp.inner.lock().faults.stall_until = Some(until);
        Self::note(
            &qp,
            format_args!("responder stalled for {d:?} (requests wait in the socket)"),
        );
        progress.counters.stalls.fetch_add(1, Ordering::Relaxed);
        progress.arm_timer(&qp, until);
        Ok(())
    }

    /// Every response of QP `qpn`'s responder is written `d` after it was produced
    /// (`Duration::ZERO` turns this off).
    pub fn delay_responses(&self, qpn: u32, d: Duration) -> Result<()> {
        let (qp, _) = self.qp(qpn)?;
        let mut g = qp.inner.lock();
        g.faults.delay = d;
        if d.is_zero() {
            g.faults.hold_until = None;
        }
        Ok(())
    }

    /// QP `qpn`'s responder answers RNR to the next `n` SEND / RDMA_WRITE_WITH_IMM
    /// requests, whether or not receives are posted (a UC QP, which has no RNR, drops
    /// them as if no receive were posted; a QP on an SRQ takes nothing from it).
    pub fn force_rnr(&self, qpn: u32, n: u32) -> Result<()> {
        let (qp, progress) = self.qp(qpn)?;
        qp.inner.lock().faults.forced_rnr = ForcedRnr::next(n);
        progress
            .counters
            .forced_rnr
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The next `n` datagrams UD QP `qpn` sends are lost on the way: each WR completes
    /// successfully (as a UD send does, whether its datagram arrives or not) and nothing
    /// reaches the destination.
    pub fn drop_datagrams(&self, qpn: u32, n: u32) -> Result<()> {
        let (qp, _) = self.qp(qpn)?;
        if qp.qp_type != verbs_api::QpType::Ud {
            return Err(Error::invalid(
                "faults",
                format!("QP {qpn:#x} is {:?}: only UD QPs send datagrams", qp.qp_type),
            ));
        }
        qp.inner.lock().faults.drop_datagrams = n;
        Ok(())
    }

    /// Every connection QP `qpn` sets up or accepts from now on waits `d` once the hello
    /// is answered, before it carries the QP's traffic, as when a loaded machine preempts
    /// the setup there: the peer's end of the same connection may already be sending
    /// (`Duration::ZERO` turns this off; it outlasts RESET).
    pub fn delay_setup(&self, qpn: u32, d: Duration) -> Result<()> {
        let (qp, _) = self.qp(qpn)?;
        qp.inner.lock().faults.setup_delay = d;
        Self::note(
            &qp,
            format_args!("connections set up from now on wait {d:?} before carrying traffic"),
        );
        Ok(())
    }

    /// Every UD link the device opens or accepts from now on waits `d` once its hello is
    /// answered, before it carries datagrams, as when a loaded machine preempts the setup
    /// there: the other device may already be sending on it (`Duration::ZERO` turns this
    /// off).
    pub fn delay_link_setup(&self, d: Duration) -> Result<()> {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.dev()?.datagrams.setup_delay_ns.store(ns, Ordering::Relaxed);
        Ok(())
    }

    /// The device's setup thread (connection setup, UD links' tasks) runs nothing for
    /// `d`, as on a machine whose cores are all taken: what only that thread does waits.
    /// Returns at once.
    pub fn stall_setup_thread(&self, d: Duration) -> Result<()> {
        let dev = self.dev()?;
        // A blocking sleep on the thread's one-thread runtime holds every task back.
        dev.datagrams.rt.spawn(async move { std::thread::sleep(d) });
        Ok(())
    }

    /// Takes the device's port down, as a cable pulled or a netdev taken down:
    /// `IBV_EVENT_PORT_ERR`, `ibv_query_port` reports `IBV_PORT_DOWN`, every connection and
    /// UD link of the device closes and none is set up until [`Faults::port_up`]. What
    /// the QPs send meanwhile is lost: RC requests are resent per `retry_cnt` (the WR
    /// completes with `IBV_WC_RETRY_EXC_ERR` if the port stays down longer; back in time,
    /// nothing is lost), UD datagrams are lost and their WRs complete successfully; under
    /// the rxe profile the send fails instead (`IBV_WC_LOC_QP_OP_ERR`, the QP to ERR), as
    /// rxe's does. Nothing if the port is down already.
    pub fn port_down(&self) -> Result<()> {
        self.dev()?.set_port(false);
        Ok(())
    }

    /// Brings the device's port back: `IBV_EVENT_PORT_ACTIVE`, `IBV_PORT_ACTIVE`, and the
    /// QPs set their connections up again at once. Nothing if the port is up.
    pub fn port_up(&self) -> Result<()> {
        self.dev()?.set_port(true);
        Ok(())
    }

    /// The InfiniBand port gets a new LID, as the subnet manager may give it:
    /// `IBV_EVENT_LID_CHANGE`, `ibv_query_port` reads the LID returned, and what names
    /// the old one reaches nothing: the device's connected QPs end in
    /// `IBV_WC_RETRY_EXC_ERR` on both sides, datagrams to the old LID are lost (see
    /// `docs/multicast-and-ports.md`). Refused on an Ethernet (RoCE) port, whose LID is 0.
    pub fn change_lid(&self) -> Result<u16> {
        self.dev()?.change_lid()
    }

    /// The RoCE port gains an address, as `ip addr add` on an rxe netdev: the GID of
    /// `ip` (with `None` or an IPv4 loopback `ip`, of an address drawn in 127.0.0.0/8)
    /// fills the first empty entry after the port's own, whose index is returned,
    /// `IBV_EVENT_GID_CHANGE`, and the device is reached at that GID too. Nothing
    /// connected changes. Refused on an InfiniBand port.
    pub fn add_gid(&self, ip: Option<std::net::IpAddr>) -> Result<u32> {
        self.dev()?.add_gid(ip)
    }

    /// The RoCE port loses the address [`add_gid`](Self::add_gid) added at `index`, as
    /// `ip addr del`: the entry reads as the zero GID, `IBV_EVENT_GID_CHANGE`, and what
    /// names that GID reaches nothing (QPs connected through it end in
    /// `IBV_WC_RETRY_EXC_ERR`).
    pub fn remove_gid(&self, index: u32) -> Result<()> {
        self.dev()?.remove_gid(index)
    }

    /// Disarms every fault of QP `qpn`.
    pub fn clear(&self, qpn: u32) -> Result<()> {
        let (qp, progress) = self.qp(qpn)?;
        let mut g = qp.inner.lock();
        g.faults = QpFaults::default();
        drop(g);
        progress.schedule(&qp);
        Ok(())
    }

    /// How many faults fired on this device.
    pub fn stats(&self) -> FaultStats {
        let Some(dev) = self.dev.upgrade() else {
            return FaultStats::default();
        };
        let c = &dev.progress.counters;
        FaultStats {
            breaks: c.breaks.load(Ordering::Relaxed),
            stalls: c.stalls.load(Ordering::Relaxed),
            delayed: c.delayed.load(Ordering::Relaxed),
            forced_rnr: c.forced_rnr.load(Ordering::Relaxed),
            datagrams_dropped: c.datagrams_dropped.load(Ordering::Relaxed),
        }
    }
}
