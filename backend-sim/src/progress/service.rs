//! Servicing one connection: whichever thread holds its I/O lock reads the socket, has
//! the protocol core process the frames under the QP's lock, and writes what it built,
//! until nothing moves. Fault injection is asked through the round's [`Gate`].

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use backend_sim_proto::connection::{AckPolicy, Connection};
use backend_sim_proto::qp::Stop;
use verbs_api::QpState;

use super::answer::HeldAcks;
use super::clock::Stamp;
use super::fault_layer::{Armed, Gate, Open};
use super::rest_wait::{Rest, RestWait};
use super::{Mode, Progress, LARGE_IO};
use crate::channel_signal::Deferral;
use crate::fault_state::BreakPoint;
use crate::link::ConnIo;
use crate::qp::{Conn, QpInner};

#[cfg(test)]
thread_local! {
    /// Looks of this thread that [`Progress::quiet_look`] ended (tests).
    static QUIET_LOOKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// What [`Progress::process`] did.
enum Processed {
    /// Go on; `ack_later`: an ACK is owed and left for later (delayed ACK); `held`: it
    /// waits for the answer of the thread the round woke (see `answer`).
    Ok { ack_later: bool, held: bool },
    /// The connection was closed.
    Closed,
    /// Fault injection: break the connection at this point of the request just built.
    Break(BreakPoint),
}

impl Progress {
    /// Reads, processes and writes what a connection has, until it has nothing more.
    /// Returns false if another thread is servicing it (or it is closed).
    pub fn service(&self, conn: &Arc<Conn>) -> bool {
        self.service_as(conn, Mode::Full)
    }

    pub(super) fn service_as(&self, conn: &Arc<Conn>, mode: Mode) -> bool {
        self.service_inner(conn, mode, false, None)
    }

    /// `peek`: the caller does not know whether the socket has news; if it has none and
    /// nothing waits to be decoded or written, return without processing. A peek asks
    /// for nothing: it does not set `pending` (a busy connection is being serviced
    /// anyway), and a request another thread left in `pending` makes its round a full
    /// one, so no post waits behind a peek. `clock`: the time as the caller read it just
    /// before (its first round uses it instead of reading the clock again: on a VM a
    /// read costs ~40 ns, and a ping-pong's message would pay it twice more).
    pub(super) fn service_inner(
        &self,
        conn: &Arc<Conn>,
        mode: Mode,
        peek: bool,
        clock: Option<Stamp>,
    ) -> bool {
        if !peek {
            conn.pending.store(true, Ordering::SeqCst);
        } else if self.quiet_look(conn) {
            return false;
        }
        // The rounds' completion events are signalled once they have let go of the
        // connection (see `channel_signal`)...
        let signals = Deferral::begin();
        let did = self.service_rounds(conn, mode, peek, clock);
        drop(signals);
        // ...and an ACK they left for the answer of a thread they woke waits from then
        // on (see `answer`: a thread that blocks on a channel after that has taken its
        // event, or has another one to take).
        if HeldAcks::marked(conn) {
            self.hold_ack(conn);
        }
        did
    }

    /// Whether a look for news at `conn` ends without a round because a round would find
    /// nothing: the connection goes over rings that hold nothing new (no bytes, no bell,
    /// no room for a write that waited: [`ring_wire::nothing_new`](super::ring_wire)),
    /// no fault is armed on it, and nothing waits to be decoded or written nor has a
    /// round been asked for (looked at under its I/O lock, taken without waiting; held by
    /// another thread, the look ends as a round's would). A round would read the ring,
    /// find it empty and return; this costs a tenth of that. A spinning poller looks at
    /// every connection of its device each turn, and a message that arrives during a
    /// turn waits for the rest of it. A socket has no such look: reading it is how its
    /// news is found.
    /// Takes no lock but the connection's, without waiting: callers may hold the
    /// poller's table.
    #[inline]
    pub(super) fn quiet_look(&self, conn: &Conn) -> bool {
        if !super::ring_wire::nothing_new(conn)
            || conn.qp.fault_armed.load(Ordering::Acquire)
            || conn.pending.load(Ordering::Relaxed)
        {
            return false;
        }
        let idle = match conn.io.try_lock() {
            Some(io) => !io.wire.reader.has_buffered() && io.wire.tx.is_empty(),
            None => true,
        };
        // A round asked for while the lock was held here is this thread's to run (the
        // asker's try failed), as at the end of a round.
        let quiet = idle && !conn.pending.load(Ordering::SeqCst);
        #[cfg(test)]
        if quiet {
            QUIET_LOOKS.set(QUIET_LOOKS.get() + 1);
        }
        quiet
    }

    /// How many looks of the calling thread at a connection over rings ended without a
    /// round (tests).
    #[cfg(test)]
    pub(super) fn quiet_looks_here() -> u64 {
        QUIET_LOOKS.get()
    }

    /// The rounds of [`Progress::service_inner`], until nothing moves or another thread
    /// holds the connection.
    #[inline(always)]
    fn service_rounds(&self, conn: &Arc<Conn>, mode: Mode, mut peek: bool, mut clock: Option<Stamp>) -> bool {
        let mut did = false;
        loop {
            let Some(io) = conn.io.try_lock() else {
                // The holder sees `pending` after it lets go and goes around again.
                return did;
            };
            // (A plain look first: a peek usually finds it clear, and a swap is a locked
            // instruction. One set after the look is seen by the look after the round.)
            if conn.pending.load(Ordering::Relaxed) && conn.pending.swap(false, Ordering::SeqCst) {
                peek = false;
            }
            if conn.is_closed() {
                return did;
            }
            let entered = self.window.entered();
            // An application thread that does not drive progress (it polled once, not in
            // a tight loop) may not poll or post again for a long time, and the progress
            // thread may be asleep: an ACK left for its next call could wait for the
            // requester's resend (forever with an infinite local ACK timeout). Its ACKs
            // leave as the progress thread's do.
            let mode = if mode == Mode::User && entered.is_none() {
                Mode::Full
            } else {
                mode
            };
            let (done, closed, end) = if conn.qp.fault_armed.load(Ordering::Acquire) {
                let mut gate = Armed { progress: self, conn };
                self.service_locked(conn, io, mode, peek, clock.take(), &mut gate)
            } else {
                self.service_locked(conn, io, mode, peek, clock.take(), &mut Open)
            };
            self.window
                .left(entered, done, || end.unwrap_or_else(|| self.clock.stamp()).ns);
            did |= done;
            if closed || !conn.pending.load(Ordering::SeqCst) {
                return did;
            }
        }
    }

    /// One round of service with the I/O lock held (released on return). Returns (did
    /// work, connection closed, the clock as of the end of its I/O if it read it: one
    /// read per round, taken after the round's read; a large write, which can take a
    /// millisecond, reads it again). `given`: the caller's clock, read just before; the
    /// first round takes it as its own unless that round read a large payload (which
    /// can take as long as a large write).
    fn service_locked(
        &self,
        conn: &Arc<Conn>,
        mut io: parking_lot::MutexGuard<'_, ConnIo>,
        mode: Mode,
        peek: bool,
        mut given: Option<Stamp>,
        gate: &mut impl Gate,
    ) -> (bool, bool, Option<Stamp>) {
        let mut did = false;
        let mut clock: Option<Stamp>;
        let mut rest = RestWait::default();
        loop {
            let mut progressed = false;
            let mut read_large = false;
            let mut read_any = false;
            let stalled = gate.stalled();
            let reading = !stalled && mode != Mode::Transmit;
            if reading {
                match super::ring_wire::fill(&mut io, conn) {
                    Ok(0) => {
                        drop(io);
                        self.lost(conn, "peer closed the connection");
                        return (true, true, None);
                    }
                    Ok(n) => {
                        progressed = true;
                        read_any = true;
                        read_large = n >= LARGE_IO;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        // A thread looking for news found none: nothing to decode,
                        // nothing to write, so nothing to do.
                        if peek && !did && !io.wire.reader.has_buffered() && io.wire.tx.is_empty() {
                            return (false, false, None);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => progressed = true,
                    Err(e) => {
                        drop(io);
                        self.lost(conn, &e.to_string());
                        return (true, true, None);
                    }
                }
            }
            // The round's one clock read: the timers' `now`, and when its bytes left.
            let now = match given.take() {
                Some(t) if !read_large => t,
                _ => self.clock.stamp(),
            };
            clock = Some(now);
            if read_any {
                conn.last_rx.store(now.ns.max(1), Ordering::Relaxed);
            }
            let (ack_later, held) = if stalled {
                (false, false)
            } else {
                match self.process(conn, &mut io.wire, mode, self.clock.instant(now.ns), gate) {
                    Processed::Closed => return (true, true, None),
                    Processed::Break(p) => {
                        self.break_now(conn, &mut io, p);
                        return (true, true, None);
                    }
                    Processed::Ok { ack_later, held } => (ack_later, held),
                }
            };
            if held {
                HeldAcks::mark(conn);
            } else {
                self.held.left(conn);
                if ack_later {
                    self.owe_ack(conn);
                } else if conn.ack_owed.load(Ordering::Relaxed) {
                    // Nothing owed (any ACK left with this round's frames). (A stale look
                    // that misses the flag costs a visit of `flush_acks`, nothing more.)
                    self.acks.disown(conn);
                }
            }
            let hold = gate.hold(io.wire.tx.is_empty());
            // (While the peer's bytes keep coming, a budget's worth of them is read
            // between two writes: `Connection::write_due`.)
            if !io.wire.tx.is_empty() && !hold && io.wire.write_due(read_any) {
                match super::ring_wire::write(&mut io, conn) {
                    Ok(n) => {
                        if n > 0 {
                            progressed = true;
                            let at = if n >= LARGE_IO {
                                let t = self.clock.stamp();
                                clock = Some(t);
                                t
                            } else {
                                now
                            };
                            conn.last_tx.store(at.ns.max(1), Ordering::Relaxed);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => {
                        drop(io);
                        self.lost(conn, &e.to_string());
                        return (true, true, None);
                    }
                }
            }
            let want = (if stalled { 0 } else { libc::EPOLLIN as u32 })
                | (if io.wire.tx.is_empty() || hold || !super::ring_wire::wants_out(&io) {
                    0
                } else {
                    libc::EPOLLOUT as u32
                });
            if want != io.interest {
                io.interest = want;
                self.poller.set_interest(conn, want);
            }
            did |= progressed;
            // One pass when transmitting after a post; otherwise go on while bytes move
            // and the last read did not find the socket drained.
            if !progressed || mode == Mode::Transmit || (io.wire.reader.drained() && io.wire.tx.is_empty()) {
                // A driving thread finishes the message it started to receive (see
                // `rest_wait`).
                if mode == Mode::User && did && reading {
                    match rest.next(io.wire.reader.payload_left(), progressed, || self.clock.now_ns()) {
                        Rest::Stay => {
                            std::hint::spin_loop();
                            continue;
                        }
                        // The thread stops driving: the progress thread watches the
                        // connection from now on; the thread's next polls open a new
                        // window.
                        Rest::GiveUp => self.window.idle(&self.clock, &self.bell),
                        Rest::Leave => {}
                    }
                }
                break;
            }
        }
        (did, false, clock)
    }

    /// Hands buffered frames to the QP's state machines and builds what to send: the
    /// QP's lock held, its halves composed over the connection by the protocol core
    /// ([`Connection`]), with the ACK policy of `mode`.
    fn process(
        &self,
        conn: &Arc<Conn>,
        wire: &mut Connection,
        mode: Mode,
        now: Instant,
        gate: &mut impl Gate,
    ) -> Processed {
        let qp = &conn.qp;
        let mut g = qp.inner.lock();
        let current = g.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn))
            || g.self_conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn));
        if qp.is_stale(&g, conn.epoch) || !current {
            drop(g);
            self.close(conn);
            return Processed::Closed;
        }
        // A round of the progress thread that may wake a thread sleeping on the receive
        // CQ's channel, of an application that answers: its ACK may wait for the answer
        // (see `answer`). Built at the end of the round if nobody was woken.
        // So may the next round of a service that did (another thread asked for one while
        // it ran: a waiter on the channel whose socket reported the same bytes), its
        // ACK marked already and its CQ no longer armed: that ACK still waits.
        let marked = mode == Mode::Full && conn.ack_held_until.load(Ordering::Relaxed) != 0;
        let hold =
            mode == Mode::Full && conn.answers.load(Ordering::Relaxed) && (marked || qp.recv_cq.armed());
        let policy = if hold { AckPolicy::Delay } else { mode.ack_policy() };
        let raised = if hold { crate::channel_signal::raised() } else { 0 };
        loop {
            let QpInner { qp: core, faults, .. } = &mut *g;
            match core.handle_frames(wire, &qp.dev.mrs, now, policy, &mut faults.forced_rnr) {
                Ok(()) => break,
                Err(Stop::Fatal(status)) => {
                    tracing::debug!(qpn = qp.qpn, ?status, "QP to ERR");
                    qp.enter_error(&mut g);
                }
                Err(Stop::Protocol(msg)) => {
                    tracing::warn!(qpn = qp.qpn, "closing connection: {msg}");
                    // The QP goes to ERR for what its peer sent, and no completion says
                    // so: the affiliated error that IBA 11.6.3.1 defines for it.
                    g.qp.handle_protocol_error();
                    qp.enter_error(&mut g);
                    if g.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
                        g.conn = None;
                    }
                    drop(g);
                    self.close(conn);
                    return Processed::Closed;
                }
            }
        }
        let has_unsent = g.qp.has_unsent();
        if gate.break_before(&mut g, has_unsent) {
            qp.deliver(&mut g);
            return Processed::Break(BreakPoint::BeforeRequest);
        }
        // In SQD the requester starts nothing new, but WQEs already started are resent
        // (after RNR, a timeout or a lost connection) until they complete: SQD drains.
        if matches!(g.qp.state(), QpState::Rts | QpState::Sqd) {
            let before = wire.tx.pending();
            if g.qp.poll_transmit(wire, &qp.dev.mrs, now).is_err() {
                qp.send_failed(&mut g);
            }
            let built = wire.tx.pending() - before;
            if let Some(p) = gate.break_after(&mut g, built) {
                qp.deliver(&mut g);
                return Processed::Break(p);
            }
        }
        g.qp.end_round(wire, policy);
        qp.deliver(&mut g);
        self.rearm(qp, &mut g);
        let mut held = false;
        if hold && g.qp.owes_ack() {
            if marked || crate::channel_signal::raised() != raised {
                held = true;
            } else if wire.reader.drained()
                && matches!(g.qp.state(), QpState::Rtr | QpState::Rts | QpState::Sqd)
            {
                // Nobody woken: the ACK leaves as the progress thread's always does.
                g.qp.flush_ack(&mut wire.tx);
            }
        }
        Processed::Ok {
            ack_later: g.qp.owes_ack(),
            held,
        }
    }

    /// `conn`'s ACK, marked in a round that woke a thread, waits for that thread's answer
    /// from now on (see `answer`); a progress thread asleep is woken to heed the deadline.
    fn hold_ack(&self, conn: &Arc<Conn>) {
        // (A thread waiting on a channel that holds one answers it itself, or blocks
        // again and sends it then: a progress thread that stands aside meanwhile, its
        // sleep bounded, heeds the deadline when it next looks.)
        let asleep = if super::waiter::in_wait() {
            self.bell.asleep_unbounded()
        } else {
            self.bell.asleep()
        };
        if self.held.hold(conn, self.clock.now_ns()) && asleep {
            self.bell.ring();
        }
    }
}
