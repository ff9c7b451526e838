//! The connection manager's datagrams on a device's links (docs/wire.md "Connection
//! manager"): CM messages travel as datagrams to QP 1 (the GSI, where an HCA's CM MADs
//! go), with QP 1's Q_Key, on the link to the other device, so that their sender is the
//! device the link's setup proved ([`setup`](super::setup)), never one a message names.
//!
//! A device's connection manager registers a [`Gsi`] here: it receives the messages,
//! and hears when a device cannot be reached (a link to it could not be opened) and when
//! a link ends, which is how it learns that a peer process is gone (the device at the
//! other end no longer listens) without waiting for its timeouts.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;

use super::link::Link;
use super::table::Slot;
use super::{setup, Datagrams, GSI_QUEUE_MAX};
use crate::addressing::gid_addr;
use backend_sim_proto::cm_msg::{CM_QKEY, CM_QPN};
use backend_sim_proto::qp::DatagramSource;
use backend_sim_proto::wire::{Frame, MAX_HDR_LEN};

/// What takes a device's CM datagrams: its connection manager.
pub trait Gsi: Send + Sync {
    /// A CM message (`payload`) from the device at `from` (listening there), as the link
    /// it came on proved it (`src`).
    fn receive(&self, from: SocketAddr, src: &DatagramSource, payload: &[u8]);
    /// The device at `peer` cannot be reached: a link to it could not be opened.
    fn unreachable(&self, peer: SocketAddr);
    /// A link to or from the device at `peer` ended.
    fn link_closed(&self, peer: SocketAddr);
}

/// A device's GSI: its connection manager, and the CM datagrams that wait for links
/// being set up.
#[derive(Default)]
pub struct GsiPort {
    hook: Mutex<Option<Weak<dyn Gsi>>>,
    /// Frames (header and payload) waiting for the link to each device.
    pending: Mutex<HashMap<SocketAddr, Vec<Vec<u8>>>>,
}

impl GsiPort {
    /// The frames that waited for the link to `peer`.
    pub fn take_pending(&self, peer: SocketAddr) -> Vec<Vec<u8>> {
        self.pending.lock().remove(&peer).unwrap_or_default()
    }

    fn hook(&self) -> Option<Arc<dyn Gsi>> {
        self.hook.lock().as_ref().and_then(Weak::upgrade)
    }
}

/// A CM message as a datagram frame to QP 1.
fn frame(payload: &[u8]) -> Vec<u8> {
    let f = Frame::Datagram {
        psn: 0,
        len: payload.len() as u32,
        dst_qpn: CM_QPN,
        src_qpn: CM_QPN,
        qkey: CM_QKEY,
        imm: None,
        solicited: false,
        grh: None,
    };
    let mut hdr = [0u8; MAX_HDR_LEN];
    let n = f.encode(&mut hdr);
    let mut out = Vec::with_capacity(n + payload.len());
    out.extend_from_slice(&hdr[..n]);
    out.extend_from_slice(payload);
    out
}

impl Datagrams {
    /// Makes `hook` the receiver of this device's CM datagrams.
    pub fn set_gsi(&self, hook: Weak<dyn Gsi>) {
        *self.gsi.hook.lock() = Some(hook);
    }

    /// Sends CM message `payload` to the device at `peer`: at once on its link, after
    /// the link's setup if it is being set up (one is opened if there is none), or not at
    /// all if it cannot be reached (the connection manager hears so). A link queue that
    /// holds [`GSI_QUEUE_MAX`] drops it: CM messages are resent on timeouts.
    pub fn send_gsi(self: &Arc<Self>, peer: SocketAddr, payload: &[u8]) {
        let bytes = frame(payload);
        if self.addr.reaches_self(peer) {
            {
                let mut q = self.local.queue.lock();
                if q.len() >= GSI_QUEUE_MAX {
                    return;
                }
                q.extend_from_slice(&bytes);
            }
            self.local.dirty.store(true, std::sync::atomic::Ordering::SeqCst);
            let mut woken = Vec::new();
            self.drain_local(&mut woken);
            self.transmit_woken(woken);
            return;
        }
        let link = {
            let mut t = self.links.lock();
            match t.by_peer.get(&peer) {
                Some(Slot::Up(l)) if !l.is_closed() => l.clone(),
                Some(Slot::Pending(_)) => {
                    self.gsi.pending.lock().entry(peer).or_default().push(bytes);
                    return;
                }
                Some(Slot::Failed(until)) if Instant::now() < *until => {
                    drop(t);
                    return self.notify_unreachable(peer);
                }
                _ => {
                    if !t.reserve(None, self.bound) {
                        drop(t);
                        return self.notify_unreachable(peer);
                    }
                    t.by_peer.insert(peer, Slot::Pending(Vec::new()));
                    self.gsi.pending.lock().entry(peer).or_default().push(bytes);
                    drop(t);
                    tracing::debug!(device = %self.name, %peer, "CM: opening a link");
                    self.rt.spawn(setup::open(self.clone(), peer));
                    return;
                }
            }
        };
        let mut woken = Vec::new();
        link.send_now(&bytes, &mut woken);
        self.transmit_woken(woken);
    }

    /// Makes sure the device at `peer` can be reached: opens a link to it if there is
    /// none; the connection manager hears if it cannot ([`Gsi::unreachable`]).
    pub fn probe(self: &Arc<Self>, peer: SocketAddr) {
        if self.addr.reaches_self(peer) {
            return;
        }
        let mut t = self.links.lock();
        match t.by_peer.get(&peer) {
            Some(Slot::Up(l)) if !l.is_closed() => {}
            Some(Slot::Pending(_)) => {}
            Some(Slot::Failed(until)) if Instant::now() < *until => {
                drop(t);
                self.notify_unreachable(peer);
            }
            _ => {
                if !t.reserve(None, self.bound) {
                    return;
                }
                t.by_peer.insert(peer, Slot::Pending(Vec::new()));
                drop(t);
                self.rt.spawn(setup::open(self.clone(), peer));
            }
        }
    }

    /// A CM message that arrived from `src`.
    pub(super) fn to_gsi(&self, qkey: u32, payload: &[u8], src: &DatagramSource) {
        if qkey != CM_QKEY {
            tracing::debug!(device = %self.name, qkey, "CM: datagram to QP 1 with another Q_Key dropped");
            self.counters.qkey_violation();
            return;
        }
        match self.gsi.hook() {
            Some(h) => h.receive(gid_addr(&src.gid, src.lid), src, payload),
            None => {
                tracing::debug!(device = %self.name, "CM: message dropped: no connection manager on this device")
            }
        }
    }

    /// The link to `peer` this device opened is up (`Some`) or not: the CM messages that
    /// waited for it go, or the connection manager hears that `peer` cannot be reached.
    pub(super) fn settle_gsi(
        self: &Arc<Self>,
        peer: SocketAddr,
        link: Option<&Arc<Link>>,
        waiting: Vec<Vec<u8>>,
        accepted: bool,
    ) {
        match link {
            Some(l) => {
                if waiting.is_empty() {
                    return;
                }
                for b in &waiting {
                    l.append_bytes(b);
                }
                let mut woken = Vec::new();
                l.flush(&mut woken);
                self.transmit_woken(woken);
            }
            None if !accepted => self.notify_unreachable(peer),
            None => {}
        }
    }

    /// The connection manager hears that the link of `peer` ended.
    pub(super) fn gsi_link_closed(&self, peer: SocketAddr) {
        if let Some(h) = self.gsi.hook() {
            h.link_closed(peer);
        }
    }

    fn notify_unreachable(&self, peer: SocketAddr) {
        if let Some(h) = self.gsi.hook() {
            // On the setup runtime: the caller may be inside the connection manager.
            self.rt.spawn(async move { h.unreachable(peer) });
        }
    }
}
