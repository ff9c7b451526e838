//! A QP attached to an in-memory network: the QP, its connection's byte streams, and the
//! calls of the QP's public surface a driver makes (`handle_frames`, `poll_transmit`,
//! `handle_timeout`, `handle_connection_lost`), in the order the TCP driver makes them,
//! but one whole frame at a time and on a virtual clock.
//!
//! Every frame is handed in as the progress thread's round would take it
//! ([`AckPolicy::Stream`]), and the ACK the responder owes for it leaves at once, as
//! that thread sends it when its socket is drained: on a network that loses frames an
//! ACK held back is an ACK that may never leave.

use std::time::Instant;

use verbs_api::QpState;

use crate::connection::{AckPolicy, Connection};
use crate::faults::ForcedRnr;
use crate::memory::MrTable;
use crate::qp::{Qp, Stop};
use crate::tx::FrameTap;

/// A QP and its connection on an in-memory network.
pub struct Port {
    /// The QP: state machine, both halves, their completions.
    pub qp: Qp,
    conn: Connection,
    forced_rnr: ForcedRnr,
    last_tx: Option<Instant>,
    last_rx: Option<Instant>,
}

impl Port {
    /// `qp` on a connection that is up from the start (an in-memory network has no
    /// setup to wait for).
    pub fn new(mut qp: Qp) -> Port {
        qp.handle_connection_up();
        Port {
            qp,
            conn: Connection::default(),
            forced_rnr: ForcedRnr::NONE,
            last_tx: None,
            last_rx: None,
        }
    }

    /// The QP's path MTU in bytes, at which the network may cut its frames into packets.
    pub fn path_mtu(&self) -> u32 {
        self.qp.attr().path_mtu.bytes()
    }

    /// Shows every frame the QP queues to `tap` (a capture), across lost connections.
    pub fn tap(&mut self, tap: Box<dyn FrameTap>) {
        self.conn.tx.tap = Some(tap);
    }

    /// Whether the QP is in ERR.
    pub fn in_error(&self) -> bool {
        self.qp.state() == QpState::Err
    }

    /// A fatal completion: the QP goes to SQE where its transport and the device do
    /// so, to ERR otherwise (both halves flush).
    fn fail(&mut self) {
        if self.qp.enter_sqe().is_none() {
            self.qp.enter_error();
        }
    }

    /// Turns what the send queue may send now into frames (in RTS or SQD).
    pub fn transmit(&mut self, mrs: &MrTable, now: Instant) {
        if matches!(self.qp.state(), QpState::Rts | QpState::Sqd)
            && self.qp.poll_transmit(&mut self.conn, mrs, now).is_err()
        {
            self.fail();
        }
    }

    /// Moves the frames queued for the peer to `out` (whole frames); whether there were any.
    pub fn take_frames(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        self.conn.tx.drain_into(out);
        if out.is_empty() {
            return false;
        }
        self.last_tx = Some(now);
        true
    }

    /// One whole frame from the peer, through both halves; the ACK owed for it is
    /// queued at once. `Err`: the peer broke the protocol (the caller decides).
    pub fn receive(&mut self, bytes: &[u8], mrs: &MrTable, now: Instant) -> Result<(), String> {
        self.last_rx = Some(now);
        let mut off = 0;
        // A frame is at most a header and an MTU of payload, which the reader's buffer
        // holds: one or two feeds. Each pass decodes what is buffered; a fatal
        // completion moves the QP to ERR and the next pass keeps the stream in sync.
        let mut passes = 0;
        loop {
            off += self.conn.reader.feed(&bytes[off..]);
            match self
                .qp
                .handle_frames(&mut self.conn, mrs, now, AckPolicy::Stream, &mut self.forced_rnr)
            {
                Ok(()) if off >= bytes.len() => break,
                Ok(()) => {}
                Err(Stop::Fatal(_)) => self.fail(),
                Err(Stop::Protocol(m)) => return Err(m),
            }
            passes += 1;
            if passes > 64 {
                return Err(format!(
                    "a frame of {} bytes was not taken in 64 passes",
                    bytes.len()
                ));
            }
        }
        // Nothing is buffered now: this pass only sends the ACK owed (AckPolicy::Stream).
        match self
            .qp
            .handle_frames(&mut self.conn, mrs, now, AckPolicy::Stream, &mut self.forced_rnr)
        {
            Ok(()) => Ok(()),
            Err(Stop::Fatal(_)) => {
                self.fail();
                Ok(())
            }
            Err(Stop::Protocol(m)) => Err(m),
        }
    }

    /// The connection broke: new byte streams (at once: the network is in memory), each
    /// half recovering as after a lost connection.
    pub fn lose_connection(&mut self) {
        let tap = self.conn.tx.tap.take();
        self.conn = Connection::default();
        self.conn.tx.tap = tap;
        self.qp.handle_connection_lost();
        self.qp.handle_connection_up();
    }

    /// The QP went back to RESET: its connection's streams are forgotten (a new one
    /// starts when it is connected again).
    pub fn forget_connection(&mut self) {
        self.conn = Connection::default();
        self.last_tx = None;
        self.last_rx = None;
    }

    /// The requester's timers at `now`, if due; the local ACK timeouts that fired.
    pub fn on_timer(&mut self, now: Instant) -> u64 {
        if self.in_error() {
            return 0;
        }
        let r = self.qp.handle_timeout(now, self.last_tx, self.last_rx);
        let timeouts = self.qp.take_ack_timeouts();
        if r.is_err() {
            self.fail();
        }
        timeouts
    }

    /// When the requester's next timer is due.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.in_error() {
            None
        } else {
            self.qp.poll_timeout()
        }
    }
}
