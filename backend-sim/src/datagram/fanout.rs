//! A multicast datagram on its way out (IBA 10.5; rxe's `rxe_mcast.c`, `rxe_recv.c`):
//! one copy to each device with members of its group ([`crate::mcast::registry`]), on
//! the link to it or into this device's own queue, never one per member QP (the devices
//! at the other end hand it to their attached QPs); and on the way in, a datagram to QP
//! 0xFFFFFF handed to each QP of this device attached to the group its DGID names.
//!
//! Sending is all or nothing per datagram, so that a resumed send queue never sends a
//! copy twice: while a link to a member device is being set up the WQE waits for it (as
//! a unicast one does); while any queue it goes into is full, it waits for room there;
//! then it is encoded once and its bytes copied into every queue (written by the links'
//! tasks when there are several, see [`Datagrams::send_to_group`]). A member device that
//! cannot be reached loses its copy (counted as unsent), the others get theirs. A group
//! with no member devices sends nothing, and the WR completes, as on a fabric.

use std::cell::RefCell;
use std::sync::Arc;

use verbs_api::Gid;

use super::link::Link;
use super::{Datagrams, Inbox, Queued, Target, WRITE_NOW};
use crate::qp::QpShared;
use backend_sim_proto::qp::DatagramSource;
use backend_sim_proto::qp::Qp;
use backend_sim_proto::qp::{Emitted, Fatal};
use backend_sim_proto::wire::{Frame, DATAGRAM_HDR_LEN, MAX_DATAGRAM};

/// What became of a multicast datagram.
pub enum Sent {
    /// Handed on (or refused by the requester): as for a unicast datagram.
    Queued(Queued<Result<Emitted, Fatal>>),
    /// A link to a member device is being set up: the WQE waits for it.
    Wait,
    /// No device has members of the group.
    Nowhere,
}

thread_local! {
    /// A datagram's bytes between encoding and copying, and the links it goes to: kept by
    /// each sending thread, so that the steady state allocates nothing.
    static SCRATCH: RefCell<(Vec<u8>, Vec<Arc<Link>>)> =
        RefCell::new((Vec::with_capacity(DATAGRAM_HDR_LEN + MAX_DATAGRAM as usize), Vec::new()));
}

impl Datagrams {
    /// Sends WQE `idx` of `qp` (its core `core`, under the QP's lock) to the group
    /// `mgid`; the links written go to `written` (past its room the link's task is woken
    /// instead), and `local` is set when this device's own queue took a copy.
    pub(super) fn send_to_group(
        self: &Arc<Self>,
        qp: &Arc<QpShared>,
        core: &mut Qp,
        idx: usize,
        mgid: &Gid,
        written: &mut arrayvec::ArrayVec<Arc<Link>, WRITE_NOW>,
        local: &mut bool,
    ) -> Sent {
        SCRATCH.with(|s| {
            let (bytes, links) = &mut *s.borrow_mut();
            links.clear();
            let (mut to_self, mut wait) = (false, false);
            for &member in crate::mcast::registry().members(mgid).iter() {
                if self.addr.reaches_self(member) {
                    to_self = true;
                    continue;
                }
                match self.link_to(member, qp) {
                    Target::Link(l) => links.push(l),
                    Target::Wait => wait = true,
                    Target::Lost | Target::Local => {
                        tracing::debug!(qpn = qp.qpn, %member, "UD: multicast copy lost: no link to a member device");
                        self.counters.ud_unsent();
                    }
                }
            }
            if wait {
                return Sent::Wait;
            }
            if !to_self && links.is_empty() {
                return Sent::Nowhere;
            }
            // Room everywhere first: a copy appended is never taken back.
            if to_self {
                let q = self.local.queue.lock();
                if q.len() >= super::QUEUE_MAX {
                    self.local.waiters.add(qp);
                    return Sent::Queued(Queued::Full);
                }
            }
            for l in links.iter() {
                if let Queued::Full = l.room(qp) {
                    return Sent::Queued(Queued::Full);
                }
            }
            bytes.clear();
            match core.emit_datagram(idx, &qp.dev.mrs, bytes) {
                Ok(Emitted::Sent) => {}
                other => return Sent::Queued(Queued::Appended(other)),
            }
            if let Some(cap) = qp.dev.capture.get() {
                // One packet to the group, as a fabric carries it: the copies are the
                // switches' and the member ports', not the sender's.
                crate::capture::datagram(cap, bytes, self.addr.ip_gid().0, mgid.0);
            }
            if to_self {
                self.local.queue.lock().extend_from_slice(bytes);
                *local = true;
            }
            // To several member devices the links' tasks write the copies, not the
            // posting thread: a fabric's switch makes the copies, and a poster that wrote
            // each copy itself (a send, and on loopback the receiver's side of TCP, per
            // member) would pay for every member before its next WR, while the tasks
            // write in parallel with it and carry in one write what was queued
            // meanwhile. One copy is written at once, as a unicast datagram is.
            let handed = links.len() > 1;
            for l in links.drain(..) {
                l.append_room_found(bytes);
                if written.iter().any(|w| Arc::ptr_eq(w, &l)) {
                    continue;
                }
                if handed || written.is_full() {
                    l.wake();
                } else {
                    written.push(l);
                }
            }
            Sent::Queued(Queued::Appended(Ok(Emitted::Sent)))
        })
    }

    /// Hands multicast datagram `frame` (to QP 0xFFFFFF, its DGID `mgid`) from `src` to
    /// each QP of this device attached to the group, in `inbox`'s run; the sending QP
    /// itself too, unless it blocks its own multicast.
    pub(super) fn deliver_to_group(
        &self,
        inbox: &mut Inbox,
        frame: &Frame,
        payload: &[u8],
        src: &DatagramSource,
        mgid: Gid,
        src_qpn: u32,
    ) {
        if inbox.group.as_ref().is_none_or(|(g, _)| *g != mgid) {
            inbox.finish();
            let mut members = inbox.spare.take().unwrap_or_default();
            self.mcast.members(&mgid, &mut members);
            inbox.group = Some((mgid, members));
        }
        let Some((_, members)) = &inbox.group else {
            return;
        };
        if members.is_empty() {
            tracing::debug!(device = %self.name, group = %mgid, "UD: multicast datagram dropped: no QP of this device is attached to its group");
            self.counters.ud_dropped();
            return;
        }
        let from_self = *src == self.own_source();
        for qp in members {
            if qp.destroyed.load(std::sync::atomic::Ordering::Acquire) {
                continue;
            }
            if from_self && qp.qpn == src_qpn && qp.block_self_mcast {
                continue;
            }
            qp.receive_datagram(frame, payload, src);
        }
    }
}
