//! Fault injection as a layer of the data path: a round of service asks its [`Gate`]
//! whether the responder is stalled, whether queued frames must wait, and whether the
//! connection breaks at a point of the request just built. A connection of a QP without
//! faults goes through [`Open`], whose stall and delay answers are constants the
//! compiler folds away; one with faults armed ([`crate::faults`]) through [`Armed`],
//! which reads and updates the QP's armed faults (`QpFaults`). Both read a break point
//! under the QP's lock: the gate is chosen when a round begins, and a break armed
//! meanwhile belongs to the next request the QP builds, which may be built in that
//! round (a request posted after the break was armed went out whole otherwise).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Progress;
use crate::fault_state::BreakPoint;
use crate::link::ConnIo;
use crate::qp::{Conn, QpInner};

/// What fault injection decides in a round of service.
pub(super) trait Gate {
    /// Whether the responder processes nothing now (requests wait in the socket).
    fn stalled(&mut self) -> bool;
    /// Whether the frames queued must wait before they are written (delayed responses).
    fn hold(&mut self, tx_empty: bool) -> bool;
    /// Whether the connection breaks now, before the next request is built (the QP's
    /// lock is held in `g`).
    fn break_before(&mut self, g: &mut QpInner, has_unsent: bool) -> bool;
    /// Where the connection breaks in the request just built, if it does (`built`: bytes
    /// just queued).
    fn break_after(&mut self, g: &mut QpInner, built: usize) -> Option<BreakPoint>;
}

/// No faults armed.
pub(super) struct Open;

impl Gate for Open {
    #[inline(always)]
    fn stalled(&mut self) -> bool {
        false
    }
    #[inline(always)]
    fn hold(&mut self, _: bool) -> bool {
        false
    }
    #[inline(always)]
    fn break_before(&mut self, g: &mut QpInner, has_unsent: bool) -> bool {
        take_break_before(g, has_unsent)
    }
    #[inline(always)]
    fn break_after(&mut self, g: &mut QpInner, built: usize) -> Option<BreakPoint> {
        take_break_after(g, built)
    }
}

/// Whether the QP's connection breaks before the next request (and the break is spent).
#[inline(always)]
fn take_break_before(g: &mut QpInner, has_unsent: bool) -> bool {
    if g.faults.break_at == Some(BreakPoint::BeforeRequest) && has_unsent {
        g.faults.break_at = None;
        return true;
    }
    false
}

/// Where the QP's connection breaks in the `built` bytes of request just built, if it
/// does (and the break is spent).
#[inline(always)]
fn take_break_after(g: &mut QpInner, built: usize) -> Option<BreakPoint> {
    if built > 0 && g.faults.break_at.is_some() {
        g.faults.break_at.take()
    } else {
        None
    }
}

/// Faults armed on the connection's QP.
pub(super) struct Armed<'a> {
    pub progress: &'a Progress,
    pub conn: &'a Arc<Conn>,
}

impl Gate for Armed<'_> {
    fn stalled(&mut self) -> bool {
        let now = Instant::now();
        let mut g = self.conn.qp.inner.lock();
        let stalled = g.faults.stall_until.is_some_and(|t| now < t);
        if !stalled {
            g.faults.stall_until = None;
        }
        stalled
    }

    fn hold(&mut self, tx_empty: bool) -> bool {
        let qp = &self.conn.qp;
        let now = Instant::now();
        let mut g = qp.inner.lock();
        let f = &mut g.faults;
        if f.delay.is_zero() {
            return false;
        }
        match f.hold_until {
            Some(t) if now < t => true,
            Some(_) => {
                f.hold_until = None;
                false
            }
            None if !tx_empty => {
                let t = now + f.delay;
                let delay = f.delay;
                f.hold_until = Some(t);
                drop(g);
                if let Some(cap) = qp.dev.capture.get() {
                    crate::capture::notes::qp(
                        cap,
                        qp.qpn,
                        format_args!("fault injection: responses delayed {delay:?}"),
                    );
                }
                self.progress.counters.delayed.fetch_add(1, Ordering::Relaxed);
                self.progress.arm_timer(qp, t);
                true
            }
            None => false,
        }
    }

    fn break_before(&mut self, g: &mut QpInner, has_unsent: bool) -> bool {
        take_break_before(g, has_unsent)
    }

    fn break_after(&mut self, g: &mut QpInner, built: usize) -> Option<BreakPoint> {
        take_break_after(g, built)
    }
}

impl Progress {
    /// Breaks a connection at `point` of the request just built (fault injection).
    pub(super) fn break_now(&self, conn: &Arc<Conn>, io: &mut ConnIo, point: BreakPoint) {
        let mut bytes = Vec::new();
        io.wire.tx.drain_into(&mut bytes);
        let n = match point {
            BreakPoint::BeforeRequest => 0,
            BreakPoint::MidRequest => bytes.len() / 2,
            BreakPoint::AfterRequest => bytes.len(),
        };
        let mut off = 0;
        let deadline = Instant::now() + Duration::from_secs(1);
        while off < n && Instant::now() < deadline {
            match super::ring_wire::send_bytes(io, conn, &bytes[off..n]) {
                0 => std::thread::yield_now(),
                r => off += r,
            }
        }
        // The packets those bytes carry are in the capture already, as queued: say how
        // much of them left (a break in the middle cuts the rest).
        if let Some(cap) = conn.qp.dev.capture.get() {
            let what = format!(
                "connection broken {point:?}: {off} of the {} bytes of the packets above written before the break",
                bytes.len()
            );
            crate::capture::notes::qp(cap, conn.qp.qpn, format_args!("fault injection: {what}"));
        }
        self.fault_break(conn);
    }

    /// Breaks a connection now (fault injection).
    pub fn fault_break(&self, conn: &Arc<Conn>) {
        self.counters.breaks.fetch_add(1, Ordering::Relaxed);
        if let Some(cap) = conn.qp.dev.capture.get() {
            crate::capture::notes::qp(
                cap,
                conn.qp.qpn,
                format_args!("fault injection: connection broken"),
            );
        }
        self.lost(conn, "fault injection");
    }
}
