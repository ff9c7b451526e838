//! The data path of a simulated device: established connections, timers and transmit
//! scheduling, driven by one progress thread per device *and* by the application's own
//! threads (`post_send` transmits in place, an empty `poll_cq` drives receive progress).
//!
//! Why not tokio here: connection setup runs on tokio ([`transport`](crate::transport)),
//! but the data path must (a) spin briefly before blocking, because on these machines a
//! thread wake-up costs about as much as a loopback round trip, and pure busy-polling
//! collapses once a third thread runs; (b) let the calling thread transmit and receive
//! without handing work to another thread; and (c) let one-sided operations complete
//! without the target application doing anything (the UCX lesson). tokio's reactor is
//! owned by its runtime thread and cannot be polled from other threads, so the data path
//! uses one level-triggered `epoll` set per device, which any thread may poll.
//!
//! - **Progress thread**: `epoll_wait`s on every connection, the doorbell and the next
//!   timer. After it did work it keeps polling without blocking for the spin window
//!   (`RDMA_SIM_SPIN_US`, default 50 µs), unless an application thread is driving progress
//!   itself (then one spinner per process is enough), and then blocks; at once after a
//!   turn that woke a thread waiting on a completion channel, which needs a CPU to run
//!   (see `thread.rs`). An application
//!   thread drives while its polls (empty or not) come less than `DRIVE_GAP` apart; the
//!   time it spends reading or writing a connection on the way (up to a
//!   [`WRITE_BUDGET`](crate::tx::WRITE_BUDGET) per write, a millisecond or more on
//!   loopback) does not count as a pause. While it drives, the progress thread sleeps on
//!   the doorbell alone and leaves queued transmits and ACKs to the driving thread; it
//!   looks again when the driving window is over plus a nap that starts at zero and
//!   doubles each time it finds the thread still driving, up to a grace period
//!   (`RDMA_SIM_GRACE_US`, default 2 ms): a thread that drives for long costs a wake-up
//!   only every grace period, one that stops polling to wait on memory has its
//!   connections watched soon after its last poll. It looks at once when the thread arms
//!   a CQ or polls a CQ of another device (it then drives that one:
//!   `Progress::user_here`). A driving thread that read the head of a message finishes
//!   it before it leaves the connection ([`rest_wait`]). A driving thread
//!   that stays inside one connection for longer than the grace period (its stream does
//!   not drain) still drives, but the progress thread gives the device's other
//!   connections a round every window plus grace period meanwhile (`Progress::long_stay`).
//!   Work a driving thread leaves for later (an owed ACK, a queued transmit) wakes a
//!   progress thread that sleeps without a bound (it saw no window open), so that the
//!   hand-over at the window's end holds however the two threads' clock reads interleave.
//!   A progress thread that spun a whole window for nothing and was then woken by a
//!   connection almost at once had been starving the sender on a shared CPU; it moves to
//!   another CPU ([`cpu_share`](crate::cpu_share)).
//! - **Application threads**: `post_send` on an idle connection builds and writes the
//!   frames itself (one `sendmsg`); with requests already in flight it queues the QP for
//!   the driving thread's next poll or the progress thread, which batch many WQEs per
//!   `sendmsg`. So does a lone WR on an idle connection that is not the thread's first
//!   post since its last poll, while a thread drives and other QPs of the device have
//!   work outstanding (a loop refilling many QPs one WR per `post_send`: the WRs it
//!   posts to the QP next leave with it; `Progress::kick`).
//!   `poll_cq` on an empty CQ polls the epoll set once (`epoll_wait` with no timeout)
//!   and services what is ready.
//! - While spinning (an application in `poll_cq`, or the progress thread in its spin
//!   window) over a device with at most `DIRECT_MAX` connections, the spinner reads each
//!   socket directly instead of asking epoll first: the same number of syscalls per spin,
//!   but one instead of two once bytes have arrived.
//! - A socket in an epoll set makes every packet delivered to it run epoll's wake-up
//!   callback in the sender's softirq. So the connections of such a device are in the
//!   epoll set only while the progress thread may block on it: while it spins, or sleeps
//!   on the doorbell alone because application threads drive, they are read directly
//!   and left out (`Progress::settle`); before it blocks on the set they go back in
//!   (level-triggered: bytes that came meanwhile wake it at once).
//! - While a QP of the device waits for its connection (RTR or later, the sim's TCP
//!   connection and hello not done yet), an application thread's empty poll yields the
//!   CPU once ([`setup_yield`]): a program that spins from RTS on would otherwise keep
//!   the setup threads waiting for a core for milliseconds on a machine whose cores
//!   all run spinners.
//! - ACKs (IBA 9.7.5.1.2: a responder may coalesce them): the poll of an application
//!   thread that drives progress leaves the ACK it owes, once its stream is drained, for
//!   its next poll or post (delayed ACK, so it leaves with the next request; while
//!   requests keep streaming in, it acknowledges as the progress thread does), or for the progress thread once
//!   the driving window and grace period are over; a thread that polls now and then
//!   sends it at once, as nothing says when it calls again. A round of the progress
//!   thread that wakes a thread sleeping on a completion channel holds its ACK for
//!   that thread's answer ([`answer`]). The progress thread, while
//!   requests keep streaming in, sends one when
//!   a request asked for it (the AckReq bit, which requesters set on one in every half of
//!   their outstanding WQEs) or `ACK_EVERY` (1 MiB) of payload went unacknowledged, and
//!   at once when the socket is drained.
//! - A connection is serviced by whichever thread holds its I/O lock; others skip it, and
//!   level-triggered readiness makes sure nothing is left behind.
//! - Lock order: a connection's I/O lock, then its QP's lock or its epoll registration.
//!   No lock is held while a thread sleeps; syscalls under the I/O lock never block
//!   (non-blocking sockets), and one write sends at most a
//!   [`WRITE_BUDGET`](crate::tx::WRITE_BUDGET), so ACKs are read in between; while the
//!   peer's bytes keep coming, as much of them is read between two writes
//!   (`Connection::write_due`), so that neither side's unread bytes pile up in the
//!   kernel ahead of the ACKs.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_sim_proto::connection::{AckPolicy, Connection};
use parking_lot::Mutex;

use crate::fault_state::FaultCounters;
use crate::link::{ConnIo, EpReg};
use crate::qp::{Conn, QpShared};
use backend_sim_proto::rx::Reader;
use verbs_api::QpState;

mod acks;
mod answer;
mod bell;
mod clock;
mod drive;
mod fault_layer;
mod poller;
mod ready;
mod rest_wait;
pub mod ring_wire;
mod service;
mod setup_yield;
mod thread;
#[cfg(test)]
pub(crate) use thread::HELD_NAP;
mod timers;
mod waiter;
mod window;

pub use waiter::waits_on_channels;

#[cfg(test)]
mod tests;

use acks::DelayedAcks;
use answer::HeldAcks;
use bell::Bell;
use clock::Clock;
use poller::{Poller, DIRECT_MAX};
use ready::ReadyQueue;
use timers::Timers;
use window::{Window, USER_GRACE};

/// A write this large can take long enough (up to a millisecond on loopback) that the
/// clock is read again after it: the ACK timer counts from when bytes last left. A read
/// this large makes a clock the caller read before it too old to use (see
/// `Progress::service_locked`).
const LARGE_IO: usize = 64 << 10;
/// Shortest spin window.
const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// Longest spin window (the adaptive window never exceeds it).
const MAX_SPIN: Duration = Duration::from_micros(200);

/// Who services a connection, and for what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The progress thread: read, process, write until nothing moves.
    Full,
    /// An application thread polling for completions in a tight loop (it drives
    /// progress): like `Full`, but ACKs alone are left for its next call (delayed ACK),
    /// off the path to the completion it waits for.
    User,
    /// An application thread that just posted: build and write frames, read nothing.
    Transmit,
}

impl Mode {
    /// When the ACKs of a round in this mode leave.
    fn ack_policy(self) -> AckPolicy {
        match self {
            Mode::Full => AckPolicy::Stream,
            Mode::User => AckPolicy::Delay,
            Mode::Transmit => AckPolicy::Post,
        }
    }
}

/// The progress engine of one device: its parts each keep their own state; the methods
/// that compose them are in the submodules by who calls them (application threads in
/// `drive`, the progress thread in `thread`, both in `service`).
pub struct Progress {
    clock: Clock,
    bell: Bell,
    poller: Poller,
    window: Window,
    timers: Timers,
    acks: DelayedAcks,
    /// ACKs that wait for the answer of the thread their round woke.
    held: HeldAcks,
    /// Threads blocked in `ibv_get_cq_event` that watch the connections themselves.
    waiters: waiter::Waiters,
    ready: ReadyQueue,
    stop: AtomicBool,
    spin: Duration,
    /// Faults that fired on this device.
    pub counters: FaultCounters,
    /// How many of the device's QPs have WQEs in their send queues ([`Progress::kick`]).
    busy_sqs: AtomicUsize,
    /// The QPs that wait for their connection ([`setup_yield`]).
    links: setup_yield::AwaitedLinks,
    /// Lone WRs that waited for the ones posted after them ([`Progress::kick`]; read by
    /// tests).
    pub(crate) joined: AtomicU64,
    /// The device's receive paths beside its QPs' connections (its UD links), once it
    /// has any: an application thread's empty poll reads them too.
    side: std::sync::OnceLock<std::sync::Weak<dyn SidePaths>>,
    /// Times the progress thread found a connection with news held by another thread
    /// (tests).
    #[cfg(test)]
    held_seen: AtomicU64,
    /// Turns the progress thread spun right after a turn that signalled a completion
    /// channel (tests).
    #[cfg(test)]
    spun_after_signal: AtomicU64,
}

/// Receive paths of a device that are not QP connections (its UD links, which tasks on
/// the setup runtime otherwise read): a thread that polls a CQ in a loop reads them as
/// it reads the connections, so that what arrives does not wait for a thread wake-up.
pub trait SidePaths: Send + Sync {
    /// Reads and delivers what has arrived, without blocking; whether anything had.
    fn read_now(&self) -> bool;
}

impl Progress {
    /// A new engine (no thread yet; see [`Progress::run`]).
    pub fn new() -> verbs_api::Result<Progress> {
        let poller = Poller::new()?;
        let bell = Bell::new(&poller.epfd)?;
        let micros = |var: &str, default: Duration| {
            std::env::var(var)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(default, Duration::from_micros)
        };
        let spin = micros("RDMA_SIM_SPIN_US", DEFAULT_SPIN);
        let grace = micros("RDMA_SIM_GRACE_US", USER_GRACE);
        Ok(Progress {
            clock: Clock::new(),
            bell,
            poller,
            window: Window::new(grace),
            timers: Timers::new(),
            acks: DelayedAcks::new(),
            held: HeldAcks::new(),
            waiters: waiter::Waiters::new()?,
            ready: ReadyQueue::new(),
            stop: AtomicBool::new(false),
            spin,
            counters: FaultCounters::default(),
            busy_sqs: AtomicUsize::new(0),
            links: setup_yield::AwaitedLinks::new(),
            joined: AtomicU64::new(0),
            side: std::sync::OnceLock::new(),
            #[cfg(test)]
            held_seen: AtomicU64::new(0),
            #[cfg(test)]
            spun_after_signal: AtomicU64::new(0),
        })
    }

    /// Has application threads' polls read `side` too (the first call counts).
    pub fn add_side_paths(&self, side: std::sync::Weak<dyn SidePaths>) {
        let _ = self.side.set(side);
    }

    /// Stops the progress thread.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        self.bell.ring();
    }

    /// Takes over an established connection of `qp` (set up by the transport). It is not
    /// among the device's connections, and no thread services it, before
    /// [`Progress::activate`]: install it in the QP first.
    pub fn register(
        &self,
        qp: &Arc<QpShared>,
        epoch: u64,
        sock: crate::stream::DataSock,
        reader: Reader,
    ) -> io::Result<Arc<Conn>> {
        sock.set_nonblocking(true)?;
        let mut wire = Connection::new(reader);
        if let Some(cap) = qp.dev.capture.get() {
            if let Some(tap) = crate::capture::ConnTap::new(cap.clone(), qp, &sock) {
                let peer = sock.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                let via = if sock.is_same_host() {
                    " (same host, unix socket)"
                } else {
                    ""
                };
                crate::capture::notes::qp(cap, qp.qpn, format_args!("connection set up with {peer}{via}"));
                wire.tx.tap = Some(Box::new(tap));
            }
        }
        let conn = Arc::new(Conn {
            token: self.poller.next_token(),
            qp: qp.clone(),
            epoch,
            sock,
            io: Mutex::new(ConnIo {
                wire,
                interest: libc::EPOLLIN as u32,
                rings: None,
            }),
            ring_peek: std::sync::OnceLock::new(),
            closed: AtomicBool::new(false),
            ack_owed: AtomicBool::new(false),
            ack_listed: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            last_tx: AtomicU64::new(0),
            last_rx: AtomicU64::new(0),
            answers: AtomicBool::new(false),
            ack_held_until: AtomicU64::new(0),
            ep: Mutex::new(EpReg {
                registered: false,
                interest: libc::EPOLLIN as u32,
            }),
        });
        Ok(conn)
    }

    /// Starts servicing a registered connection (now installed in its QP).
    pub fn activate(&self, conn: &Arc<Conn>) {
        // Only now among the device's connections: a thread that services one it finds
        // there before its QP holds it (`settle` puts every listed connection in the
        // epoll set, and the peer may be sending already) would take it for one its QP
        // left, and close it; the setup would then install a closed connection, which
        // no thread reads and which nothing replaces.
        self.poller.insert(conn.clone());
        if conn.is_closed() {
            // Closed since it was installed (its QP reset, say): `close` may have
            // looked for it in the table before it was there.
            self.poller.remove(conn.token);
            return;
        }
        // Registered at first, whatever the progress thread does; it takes the
        // connection out of the set again if it reads connections directly.
        if let Err(e) = self.poller.arm(conn) {
            tracing::warn!(qpn = conn.qp.qpn, "cannot watch the connection: {e}");
            self.lost(conn, "epoll_ctl failed");
            return;
        }
        self.poller.generation.fetch_add(1, Ordering::SeqCst);
        self.waiters.connections_changed();
        // One connection too many to read directly: application threads now look at the
        // epoll set, where the others may be missing (the progress thread took them out
        // while it slept on the doorbell). Wake it to put them back (`settle`).
        if self.bell.asleep() && self.poller.len() > DIRECT_MAX {
            self.bell.ring();
        }
        self.service(conn);
    }

    /// Writes what a connection owes (ACKs left for later) before its QP goes away.
    /// Blocks briefly for the connection's I/O lock; the QP lock must not be held.
    pub fn flush_final(&self, conn: &Arc<Conn>) {
        let mut io = conn.io.lock();
        if conn.is_closed() {
            return;
        }
        conn.qp.inner.lock().qp.flush_ack(&mut io.wire.tx);
        let deadline = Instant::now() + Duration::from_millis(100);
        while !io.wire.tx.is_empty() && Instant::now() < deadline {
            match ring_wire::write(&mut io, conn) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(_) => break,
            }
        }
    }

    /// Closes a connection: no thread services it afterwards.
    pub fn close(&self, conn: &Conn) {
        // SeqCst: paired with the second look at `closed` after a round sets `ack_owed`.
        if conn.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // `arm` checks `closed` under the same lock: the socket does not come back.
        self.poller.disarm(conn);
        let _ = conn.sock.shutdown();
        self.poller.remove(conn.token);
        self.acks.forget(conn);
        self.poller.generation.fetch_add(1, Ordering::AcqRel);
        self.waiters.connections_changed();
    }

    /// A QP's send queue became busy (`true`) or empty (`false`): see
    /// [`QpShared::note_busy`](crate::qp::QpShared::note_busy).
    pub fn count_busy(&self, busy: bool) {
        if busy {
            self.busy_sqs.fetch_add(1, Ordering::Relaxed);
        } else {
            self.busy_sqs.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A QP started (`true`) or stopped waiting for its connection: see
    /// [`QpShared::note_link`](crate::qp::QpShared::note_link) and [`setup_yield`].
    pub fn count_awaiting_link(&self, awaits: bool) {
        self.links.note(awaits, self.clock.now_ns());
    }

    /// How many of the device's QPs wait for their connection (tests).
    #[cfg(test)]
    pub fn links_awaited(&self) -> usize {
        self.links.count()
    }

    /// How many of the device's QPs have WQEs in their send queues.
    pub fn busy_send_queues(&self) -> usize {
        self.busy_sqs.load(Ordering::Relaxed)
    }

    /// How many connections the delayed-ACK list holds (tests).
    #[cfg(test)]
    pub fn acks_listed(&self) -> usize {
        self.acks.listed()
    }

    /// How many connections owe an ACK (tests).
    #[cfg(test)]
    pub fn acks_owed(&self) -> usize {
        self.acks.owed()
    }

    /// Whether QPs wait in the transmit queue (tests).
    #[cfg(test)]
    pub fn transmits_queued(&self) -> bool {
        self.ready.pending()
    }

    /// How many times the progress thread found a connection held by another thread
    /// (tests).
    #[cfg(test)]
    pub fn held_seen(&self) -> u64 {
        self.held_seen.load(Ordering::Relaxed)
    }

    /// How many turns the progress thread spun right after one that signalled a
    /// completion channel (tests).
    #[cfg(test)]
    pub fn spun_after_signal(&self) -> u64 {
        self.spun_after_signal.load(Ordering::Relaxed)
    }

    /// How many threads wait on the connections in `ibv_get_cq_event` now (tests).
    #[cfg(test)]
    pub fn waiters_now(&self) -> usize {
        self.waiters.count.load(Ordering::SeqCst)
    }

    /// How many ACKs waited for an answer so far (tests).
    #[cfg(test)]
    pub fn acks_held(&self) -> u64 {
        self.held.held.load(Ordering::Relaxed)
    }

    /// Whether `conn`'s ACK waits for an answer (tests).
    #[cfg(test)]
    pub fn ack_waits(&self, conn: &Conn) -> bool {
        HeldAcks::waits(conn)
    }

    /// How long until the progress thread must wake for an ACK held for an answer
    /// (tests).
    #[cfg(test)]
    pub fn answer_deadline(&self) -> Option<Duration> {
        self.held.due_in(self.clock.now_ns())
    }

    /// Makes an ACK wait up to `d` for an answer (tests).
    #[cfg(test)]
    pub fn set_answer_wait(&self, d: Duration) {
        self.held.set_wait(d);
    }

    /// Whether the progress thread sleeps without a bound (tests).
    #[cfg(test)]
    pub fn asleep_unbounded(&self) -> bool {
        self.bell.asleep_unbounded()
    }

    /// Opens the driving window for `d` from now as a driving thread extends it when it
    /// finds it open by a clock read earlier: without ringing (tests).
    #[cfg(test)]
    pub fn extend_window_unseen(&self, d: Duration) {
        let now = self.clock.now_ns();
        self.window.last_poll.store(now, Ordering::Relaxed);
        self.window
            .until
            .store(now + d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The device's port went down: `conn` is lost as a link is (not counted as a fault
    /// of the QP's, see [`FaultStats`](crate::faults::FaultStats)).
    pub fn port_went_down(&self, conn: &Arc<Conn>) {
        self.lost(conn, "the port went down");
    }

    /// The connection lost (closed by the peer, an error, fault injection): the QP's
    /// requests are resent over the next one, half-received ones forgotten.
    fn lost(&self, conn: &Arc<Conn>, why: &str) {
        self.close(conn);
        let qp = &conn.qp;
        let mut g = qp.inner.lock();
        tracing::debug!(
            qpn = qp.qpn,
            dest_qpn = g.qp.attr().dest_qp_num,
            outstanding = g.qp.sq_outstanding(),
            "connection lost: {why}"
        );
        if let Some(cap) = qp.dev.capture.get() {
            let to = g.qp.attr().dest_qp_num;
            crate::capture::notes::qp(cap, qp.qpn, format_args!("connection to QP {to:#x} lost: {why}"));
        }
        if g.self_conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            g.self_conn = None;
            g.qp.handle_self_connection_lost();
            qp.deliver(&mut g);
            return;
        }
        if g.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            g.conn = None;
            qp.note_link(&mut g);
            // Whatever was in flight is gone: requests are resent (UC: lost),
            // half-received ones are forgotten (see Responder::connection_lost).
            qp.link_lost(&mut g);
            g.qp.handle_link_wait(QpShared::now());
            if !g.qp.is_unreliable()
                && g.qp.has_unsent()
                && matches!(g.qp.state(), QpState::Rts | QpState::Sqd)
            {
                // WQEs that waited behind the connection (queued for a poll or the
                // progress thread, not yet written) start as a post without one starts
                // them; else, on the side that does not set connections up and with a
                // peer that will not, nothing would carry them or run their timer.
                qp.send_unconnected(&mut g);
                qp.deliver(&mut g);
            }
            self.rearm(qp, &mut g);
            drop(g);
            qp.req_wake.notify_one();
        }
    }

    /// Closes every connection (device shutdown).
    pub fn close_all(&self) {
        let mut all = Vec::new();
        self.poller.all_into(&mut all);
        for c in all {
            self.close(&c);
        }
    }
}
