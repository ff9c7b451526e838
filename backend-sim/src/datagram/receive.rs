//! Datagrams arriving at a device (IBA 9.8.4 and 10.2.5's UD receive rules; docs/wire.md
//! "Links"): each one to the UD QP its destination QPN names, to the connection manager
//! (QP 1) or to a multicast group's QPs, dropped and counted when there is no such QP or
//! the port is down; and the device's own queue of datagrams between its own QPs.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use arrayvec::ArrayVec;
use verbs_api::{Gid, QpType, MULTICAST_QPN};

use super::link::Link;
use super::{Datagrams, POLLED_LINKS};
use crate::progress::SidePaths;
use crate::qp::QpShared;
use backend_sim_proto::qp::DatagramSource;
use backend_sim_proto::wire::Frame;

impl Datagrams {
    /// Delivers the datagrams queued for this device's own QPs (any thread may; one
    /// does at a time, and goes around again for what was queued meanwhile); the QPs
    /// that waited for room in the queue go to `woken`.
    pub(super) fn drain_local(&self, woken: &mut Vec<Weak<QpShared>>) {
        let src = self.own_source();
        loop {
            let Some(mut buf) = self.local.draining.try_lock() else {
                return;
            };
            self.local.dirty.store(false, Ordering::SeqCst);
            loop {
                {
                    let mut q = self.local.queue.lock();
                    if q.is_empty() {
                        self.local.waiters.take_into(woken);
                        break;
                    }
                    std::mem::swap(&mut *q, &mut *buf);
                    self.local.waiters.take_into(woken);
                }
                let mut at = 0;
                let mut inbox = Inbox::default();
                // Frames this device encoded itself: they decode (a failure would end
                // the batch, not the process).
                while let Ok(Some((f, n))) = Frame::decode(&buf[at..]) {
                    let len = f.payload_len() as usize;
                    let Some(payload) = buf.get(at + n..at + n + len) else {
                        break;
                    };
                    self.deliver(&mut inbox, &f, payload, &src);
                    at += n + len;
                }
                drop(inbox);
                buf.clear();
            }
            drop(buf);
            if !self.local.dirty.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    /// Datagram `frame` (with `payload`) from `src` to the QP it names, in `inbox`'s run.
    pub fn deliver(&self, inbox: &mut Inbox, frame: &Frame, payload: &[u8], src: &DatagramSource) {
        let Frame::Datagram {
            dst_qpn,
            src_qpn,
            qkey,
            grh,
            ..
        } = *frame
        else {
            return;
        };
        if !self.port.is_up() {
            // Arrived at a port that went down meanwhile: lost, as on the wire.
            tracing::trace!(device = %self.name, dst_qpn, "UD: datagram dropped: the port is down");
            return self.counters.ud_dropped();
        }
        if dst_qpn == backend_sim_proto::cm_msg::CM_QPN {
            return self.to_gsi(qkey, payload, src);
        }
        if dst_qpn == MULTICAST_QPN {
            return match grh.map(|h| Gid(h.dgid)).filter(|g| g.is_multicast()) {
                Some(mgid) => self.deliver_to_group(inbox, frame, payload, src, mgid, src_qpn),
                None => self.no_such_qp(dst_qpn),
            };
        }
        if inbox.last.as_ref().is_none_or(|(n, _)| *n != dst_qpn) || inbox.group.is_some() {
            inbox.finish();
            match self.qps.lock().get(&dst_qpn).and_then(Weak::upgrade) {
                Some(qp) if qp.qp_type == QpType::Ud => inbox.last = Some((dst_qpn, qp)),
                _ => return self.no_such_qp(dst_qpn),
            }
        }
        match &inbox.last {
            Some((_, qp)) if !qp.destroyed.load(Ordering::Acquire) => {
                qp.receive_datagram(frame, payload, src)
            }
            _ => self.no_such_qp(dst_qpn),
        }
    }

    pub(super) fn no_such_qp(&self, dst_qpn: u32) {
        tracing::debug!(device = %self.name, dst_qpn, "UD: datagram dropped: no UD QP of that number");
        self.counters.ud_dropped();
    }
}

/// A run of datagrams handed to their QPs one after another (the datagrams of one read
/// from a link, or of one drain of the device's own queue): the QP of consecutive
/// datagrams is looked up once, and its completions become visible once, when the run
/// moves to another QP or ends (dropped), as the progress engine delivers a
/// connection's after each batch of frames.
#[derive(Default)]
pub struct Inbox {
    pub(super) last: Option<(u32, Arc<QpShared>)>,
    /// The multicast group of the run, and its QPs on this device.
    pub(super) group: Option<(Gid, Vec<Arc<QpShared>>)>,
    /// The list of a group's QPs that ended, for the next group.
    pub(super) spare: Option<Vec<Arc<QpShared>>>,
}

impl Inbox {
    pub(super) fn finish(&mut self) {
        if let Some((_, qp)) = self.last.take() {
            qp.datagrams_done();
        }
        if let Some((_, mut members)) = self.group.take() {
            for qp in members.drain(..) {
                qp.datagrams_done();
            }
            self.spare = Some(members);
        }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.finish();
    }
}

impl SidePaths for Datagrams {
    fn read_now(&self) -> bool {
        // Taken out of the table's lock: delivering takes QP locks, which come before
        // the table's in the lock order.
        let polled: ArrayVec<Arc<Link>, POLLED_LINKS> = self.links.lock().polled.clone();
        let mut any = false;
        for link in &polled {
            any |= link.read_now(self);
        }
        any
    }
}
