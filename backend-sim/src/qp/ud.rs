//! What is particular to a UD QP (`man ibv_post_send`'s `wr.ud`, `man ibv_post_recv`,
//! IBA 9.8.4): its sends name a destination through an address handle, resolved before
//! they are queued ([`AhRoute`]), and leave through the device's links
//! ([`DataPath::send_datagrams`](super::DataPath::send_datagrams)) instead of a
//! connection of its own; a datagram for it arrives through a link, is handed to its
//! responder whole ([`QpShared::receive_datagram`]) and counted where it is dropped.
//!
//! A UD QP receives in RTR, RTS, SQD and SQE: IBA's SQD and SQE stop the send queue only
//! (rxe's responder likewise runs from RTR on). In any other state a datagram is dropped.

use std::net::SocketAddr;

use verbs_api::{AddressHandle, Error, SendWr};

use super::{QpInner, QpShared};
use backend_sim_proto::qp::{DatagramSource, PostCheck, UdOutcome, UdRoute};
use backend_sim_proto::wire::{Frame, Grh};

/// Where an address handle of this device leads (`ibv_create_ah` resolves it once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AhRoute {
    /// Where the destination device listens (GID → IP, LID → TCP port).
    pub peer: SocketAddr,
    /// The GRH fields of a global address handle.
    pub grh: Option<Grh>,
}

/// Why a UD send was not queued.
pub enum UdPostError {
    /// A check of the requester's.
    Check(PostCheck),
    /// The address handle is not one of this device's.
    ForeignAh,
}

impl QpShared {
    /// Queues `wr` on this UD QP (with the lock held): its destination's address handle
    /// resolved by `route_of` (`None`: not an address handle of this device), its inline
    /// data from `pieces` when given.
    pub(super) fn post_ud(
        &self,
        g: &mut QpInner,
        wr: &SendWr<'_>,
        pieces: Option<&[&[u8]]>,
        route_of: &dyn Fn(&dyn AddressHandle) -> Option<AhRoute>,
    ) -> Result<(), UdPostError> {
        let Some(dest) = wr.ud else {
            return g
                .qp
                .handle_post_send(wr, &self.dev.mrs, pieces)
                .map_err(UdPostError::Check);
        };
        let ah = route_of(dest.ah).ok_or(UdPostError::ForeignAh)?;
        let route = UdRoute {
            peer: ah.peer,
            grh: ah.grh,
            remote_qpn: dest.remote_qpn,
            remote_qkey: dest.remote_qkey,
        };
        g.qp.handle_post_datagram(wr, route, &self.dev.mrs, pieces)
            .map_err(UdPostError::Check)
    }

    /// The error of an address handle that is not this device's.
    pub(super) fn foreign_ah(&self) -> Error {
        Error::invalid(
            "ibv_post_send",
            format!(
                "wr.ud.ah of a send on UD QP {:#x} is not an address handle of this device",
                self.qpn
            ),
        )
    }

    /// The WRs whose datagrams were handed on (or lost) complete, in posting order;
    /// with `fatal` one failed locally and the QP goes to SQE or ERR (flushing the rest of
    /// the send queue, see [`QpShared::send_failed`]).
    pub fn complete_datagrams(&self, g: &mut QpInner, fatal: bool) {
        g.qp.take_done();
        if fatal {
            self.send_failed(g);
        } else {
            self.deliver(g);
        }
    }

    /// Datagram `frame` with `payload` arrived from `src` for this QP: taken into a
    /// receive, or dropped (and counted). Its completion becomes visible at
    /// [`QpShared::datagrams_done`], once for a run of datagrams (an error or an event
    /// at once).
    pub fn receive_datagram(&self, frame: &Frame, payload: &[u8], src: &DatagramSource) {
        let mut g = self.inner.lock();
        if !super::receives_in(g.qp.state()) {
            tracing::debug!(qpn = self.qpn, state = ?g.qp.state(), "UD: datagram dropped: the QP does not receive in this state");
            self.dev.counters.ud_dropped();
            return;
        }
        match g.qp.handle_datagram(frame, payload, src, &self.dev.mrs) {
            Ok(UdOutcome::Received | UdOutcome::TooLong) => {}
            Ok(UdOutcome::QkeyViolation) => self.dev.counters.qkey_violation(),
            Ok(UdOutcome::NoReceive | UdOutcome::Malformed) => self.dev.counters.ud_dropped(),
            Err(_) => self.enter_error(&mut g),
        }
        if g.qp.has_news() {
            // An SRQ's limit event, raised by the take.
            self.deliver(&mut g);
        }
    }

    /// The completions of the datagrams received since the last call become visible.
    pub fn datagrams_done(&self) {
        let mut g = self.inner.lock();
        if g.qp.has_recv_completions() {
            self.deliver(&mut g);
        }
    }
}
