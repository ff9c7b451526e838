//! One connection of a QP pair, as the protocol sees it: its incoming bytes, its outgoing
//! frames, and the policy that composes the QP's two halves over them: when an owed ACK
//! leaves (IBA 9.7.5.1.2 lets a responder coalesce them), how many WQEs one pass turns
//! into frames, how far a peer that stops reading may push this side, and how much of
//! the peer's bytes are read before this side writes more of its own.
//!
//! The driver fills the reader from its socket, calls the QP's
//! [`handle_frames`](crate::qp::Qp::handle_frames) and
//! [`poll_transmit`](crate::qp::Qp::poll_transmit) with the connection (under the QP's
//! lock) and the time, which compose the halves over it here, and writes the queue to
//! its socket; nothing here touches a socket or a clock.

use std::io;
use std::time::Instant;

use crate::engine::{drive, DriveState, Sides, Stop};
use crate::io::{Recv, Transmit};
use crate::memory::MrTable;
use crate::requester::{Fatal, Requester};
use crate::responder::Responder;
use crate::rx::Reader;
use crate::tx::{TxQueue, WRITE_BUDGET};
use verbs_api::WorkCompletion;

/// WQEs turned into frames per pass.
pub const BUDGET: usize = 128;
/// Stop building new requests while this many bytes wait to be written.
pub const TX_HIGH: usize = 4 << 20;
/// Payload bytes a deferred ACK may cover while more requests stream in without asking
/// for one ([`AckPolicy::Stream`]).
pub const ACK_EVERY: usize = 1 << 20;
/// READ/atomic responses (and ACKs, NAKs) a peer may leave unread before it is cut off
/// (generous: the requesters of this project never have more than `max_rd_atomic` <= 16
/// outstanding).
pub const MAX_UNSENT_READS: usize = 1024;

/// Who processes a connection's frames, which decides when the ACK the responder owes
/// for executed requests leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckPolicy {
    /// An application thread polling in a tight loop: the ACK is left for its next poll
    /// or post (delayed ACK), so that it leaves with the next request, off the path to
    /// the completion the thread waits for. Once it covers more than one request (the
    /// peer streams rather than waits for each answer), as by `Stream` while requests
    /// keep coming: the thread stays in the connection until the stream pauses, which
    /// with a peer's send queue of large WRITEs takes seconds, and the peer's requester
    /// must not wait for its ACKs until then.
    Delay,
    /// The progress thread: at once when the stream is drained; while requests keep
    /// streaming in (the last read got all it asked for), when one asks for it (AckReq)
    /// or [`ACK_EVERY`] bytes of payload went unacknowledged. WRITEs of 16 KiB arrive
    /// one per pass (a header read, then the payload straight into the region), and an
    /// ACK each would cost a write each, and the requester a segment to take in.
    Stream,
    /// A thread that just posted: what it happens to read is acknowledged as by
    /// `Stream`, and whatever is owed at the end of its round leaves with its frames.
    Post,
}

impl AckPolicy {
    /// The `ack_after` of [`drive`] for a reader that is (or is not) `drained`.
    pub fn ack_after(self, drained: bool) -> usize {
        match self {
            AckPolicy::Delay => usize::MAX,
            _ if drained => 0,
            _ => ACK_EVERY,
        }
    }
}

/// A connection's bytes and the state kept between calls.
#[derive(Default)]
pub struct Connection {
    /// Incoming bytes.
    pub reader: Reader,
    /// Outgoing bytes.
    pub tx: TxQueue,
    /// Whose payload the reader is filling.
    pub(crate) drive: DriveState,
    /// Bytes read since bytes were last written ([`Connection::write_due`]).
    read_since_write: usize,
}

impl Connection {
    /// A fresh connection whose first bytes are in `reader` (or to come).
    pub fn new(reader: Reader) -> Connection {
        Connection {
            reader,
            tx: TxQueue::new(),
            drive: DriveState::default(),
            read_since_write: 0,
        }
    }

    /// Reads what `src` has (see [`Reader::fill`]).
    pub fn fill(&mut self, src: &mut impl Recv) -> io::Result<usize> {
        let n = self.reader.fill(src)?;
        self.read_since_write += n;
        Ok(n)
    }

    /// Writes what is queued to `out` (see [`TxQueue::write_to`]).
    pub fn write_to(&mut self, out: &mut impl Transmit) -> io::Result<usize> {
        let n = self.tx.write_to(out)?;
        if n > 0 {
            self.read_since_write = 0;
        }
        Ok(n)
    }

    /// Whether what is queued should be written now, after a round that `read` (or did
    /// not read) the peer's bytes: yes unless they keep coming, and then once a
    /// [`WRITE_BUDGET`]'s worth of them has been read since the last write. A round
    /// reads one frame header or one payload segment but may write a whole budget, so
    /// with traffic both ways each side would write several times faster than it
    /// reads; the unread bytes would pile up in the kernel's receive queue (20-30 MB
    /// once it is autotuned), and the ACKs among them with them.
    pub fn write_due(&self, read: bool) -> bool {
        !read || self.reader.drained() || self.read_since_write >= WRITE_BUDGET
    }

    /// Hands the buffered frames to the QP's halves (`sides`) and queues their answers,
    /// ACKs as `policy` says. With nothing buffered and no payload underway (a thread
    /// that just posted) there is nothing to decode: only the progress thread's ACK owed
    /// leaves. A [`Stop::Fatal`] moves the QP to ERR: call again with `accepting` false
    /// to keep the stream in sync.
    pub(crate) fn receive(
        &mut self,
        sides: &mut Sides<'_>,
        mrs: &MrTable,
        now: Instant,
        policy: AckPolicy,
    ) -> Result<(), Stop> {
        if !self.reader.has_buffered() && !self.reader.in_payload() {
            if let Some(resp) = sides.resp.as_deref_mut() {
                if policy == AckPolicy::Stream && (sides.accepting || resp.is_unreliable()) {
                    resp.flush_ack(&mut self.tx);
                }
            }
            return Ok(());
        }
        let drained = self.reader.drained();
        drive(
            sides,
            &mut self.reader,
            mrs,
            &mut self.tx,
            now,
            &mut self.drive,
            MAX_UNSENT_READS,
            policy.ack_after(drained),
        )?;
        if let (AckPolicy::Delay, false, Some(resp)) = (policy, drained, sides.resp.as_deref_mut()) {
            let due = resp.owed_bytes() >= ACK_EVERY || resp.ack_asked();
            if resp.owed_requests() > 1 && due && (sides.accepting || resp.is_unreliable()) {
                resp.flush_ack(&mut self.tx);
            }
        }
        Ok(())
    }

    /// Turns the send queue's WQEs into frames (at most [`BUDGET`] per pass, none while
    /// [`TX_HIGH`] bytes wait to be written), after the ACK still owed, which goes in the
    /// same write. Call for a QP in RTS. A [`Fatal`] moves the QP to ERR (a UC QP to SQE
    /// where the profile says so).
    pub(crate) fn transmit(
        &mut self,
        req: &mut Requester,
        resp: &mut Responder,
        mrs: &MrTable,
        now: Instant,
        send_wc: &mut Vec<WorkCompletion>,
    ) -> Result<(), Fatal> {
        if self.tx.pending() >= TX_HIGH {
            return Ok(());
        }
        if req.has_unsent() {
            resp.flush_ack(&mut self.tx);
        }
        req.poll_transmit(mrs, now, &mut self.tx, BUDGET, send_wc)
            .map(|_| ())
    }

    /// The end of a round: a thread that just posted ([`AckPolicy::Post`]) takes the ACK
    /// owed along with its frames.
    pub(crate) fn end_round(&mut self, resp: &mut Responder, policy: AckPolicy) {
        if policy == AckPolicy::Post {
            resp.flush_ack(&mut self.tx);
        }
    }
}
