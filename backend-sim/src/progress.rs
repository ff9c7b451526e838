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
//!   itself (then one spinner per process is enough), and then blocks. An application
//!   thread drives while its polls (empty or not) come less than `DRIVE_GAP` apart; the
//!   time it spends reading or writing a connection on the way (up to a
//!   [`WRITE_BUDGET`](crate::tx::WRITE_BUDGET) per write, a millisecond or more on
//!   loopback) does not count as a pause. While it drives, the progress thread sleeps on
//!   the doorbell alone and leaves queued transmits and ACKs to the driving thread; it
//!   looks again when the driving window plus a grace period (`RDMA_SIM_GRACE_US`,
//!   default 2 ms) are over, or at once when the thread arms a CQ or polls a CQ of
//!   another device (it then drives that one: `Progress::user_here`). A driving thread
//!   that stays inside one connection for longer than the grace period (its stream does
//!   not drain) still drives, but the progress thread gives the device's other
//!   connections a round every window plus grace period meanwhile (`Progress::long_stay`).
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
//! - ACKs (IBA 9.7.5.1.2: a responder may coalesce them): the poll of an application
//!   thread that drives progress leaves the ACK it owes for its next poll or post
//!   (delayed ACK, so it leaves with the next request), or for the progress thread once
//!   the driving window and grace period are over; a thread that polls now and then
//!   sends it at once, as nothing says when it calls again. The progress thread, while
//!   requests keep streaming in, sends one when
//!   a request asked for it (the AckReq bit, which requesters set on one in every half of
//!   their outstanding WQEs) or `ACK_EVERY` (1 MiB) of payload went unacknowledged, and
//!   at once when the socket is drained.
//! - A connection is serviced by whichever thread holds its I/O lock; others skip it, and
//!   level-triggered readiness makes sure nothing is left behind.
//! - Lock order: a connection's I/O lock, then its QP's lock or its epoll registration.
//!   No lock is held while a thread sleeps; syscalls under the I/O lock never block
//!   (non-blocking sockets), and one write sends at most a
//!   [`WRITE_BUDGET`](crate::tx::WRITE_BUDGET), so ACKs are read in between.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use verbs_api::QpState;

use crate::cpu_share::{self, ShareWatch};
use crate::engine::{drive, DriveState, Sides, Stop};
use crate::epoll::{add_to, wait_on};
use crate::fault_state::{BreakPoint, FaultCounters};
use crate::link::{ConnIo, EpReg};
use crate::qp::{QpInner, QpShared};
use crate::rx::Reader;
use crate::sys;
use crate::tx::TxQueue;

/// An established connection of one of this device's QPs.
pub type Conn = crate::link::Conn<QpShared>;

/// WQEs turned into frames per pass.
const BUDGET: usize = 128;
/// Stop building new requests while this many bytes wait to be written.
const TX_HIGH: usize = 4 << 20;
/// A write this large can take long enough (up to a millisecond on loopback) that the
/// clock is read again after it: the ACK timer counts from when bytes last left. A read
/// this large makes a clock the caller read before it too old to use (see
/// `service_locked`).
const LARGE_IO: usize = 64 << 10;
/// Payload bytes a deferred ACK may cover while more requests stream in without asking
/// for one (see `process`).
const ACK_EVERY: usize = 1 << 20;
/// READ/atomic responses a peer may leave unread before it is cut off (generous: the
/// requesters of this project never have more than `max_rd_atomic` <= 16 outstanding).
const MAX_UNSENT_READS: usize = 1024;
/// Up to this many connections on a device, a spinning application thread reads them
/// directly instead of asking epoll which are ready.
const DIRECT_MAX: usize = 4;
/// Token of the doorbell in the epoll sets.
const BELL: u64 = u64::MAX;
/// Shortest spin window.
const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// Longest spin window (the adaptive window never exceeds it).
const MAX_SPIN: Duration = Duration::from_micros(200);
/// Polls closer together than this count as an application thread driving progress.
const DRIVE_GAP: Duration = Duration::from_micros(50);
/// How long an application-driven poll keeps the progress thread off the connections.
const USER_WINDOW: Duration = Duration::from_micros(100);
/// How long after that the progress thread looks again (`RDMA_SIM_GRACE_US`).
const USER_GRACE: Duration = Duration::from_millis(2);

thread_local! {
    /// Set on progress threads: their writes are not an application driving progress.
    static ON_PROGRESS_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The device this application thread polled last ([`Progress::user_here`]).
    static POLLED: std::cell::RefCell<Weak<Progress>> = const { std::cell::RefCell::new(Weak::new()) };
    /// Its address, for the comparison on every poll: a plain thread-local read, where
    /// `POLLED` (it has a destructor) is first checked for being initialized.
    static POLLED_AT: std::cell::Cell<*const Progress> = const { std::cell::Cell::new(std::ptr::null()) };
    /// `post_send` calls of this application thread since its last poll of a CQ
    /// ([`Progress::kick`]: only a post that follows another one may wait for more).
    static POSTS_SINCE_POLL: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

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

struct TimerEntry {
    at: Instant,
    qp: Weak<QpShared>,
}

impl PartialEq for TimerEntry {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at
    }
}
impl Eq for TimerEntry {}
impl PartialOrd for TimerEntry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for TimerEntry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.at.cmp(&o.at)
    }
}

/// What [`Progress::settle`] last arranged (progress thread state).
#[derive(Default)]
struct Settled {
    direct: Option<bool>,
    generation: u64,
}

/// A clock reading in nanoseconds since the engine's `base`, read once per round: one
/// message's round uses the same reading for the driving window, the requester's timers
/// and when its bytes left. Read from `CLOCK_MONOTONIC` as nanoseconds
/// ([`Progress::now_ns`]) rather than as an [`Instant`] converted to nanoseconds (about
/// 50 instructions per conversion); the [`Instant`] that the protocol's timers take is
/// made from it only when a round processes frames ([`Progress::instant`]).
#[derive(Clone, Copy, Debug)]
struct Stamp {
    ns: u64,
}

/// What [`Progress::process`] did.
enum Processed {
    /// Go on; `ack_later`: an ACK is owed and left for later (delayed ACK).
    Ok { ack_later: bool },
    /// The connection was closed.
    Closed,
    /// Fault injection: break the connection at this point of the request just built.
    Break(BreakPoint),
}

/// The progress engine of one device.
pub struct Progress {
    epfd: OwnedFd,
    /// An epoll set with only the doorbell: where the progress thread sleeps while
    /// application threads drive progress themselves.
    bell_ep: OwnedFd,
    bell: OwnedFd,
    /// Set while the progress thread blocks (or is about to): posters ring the bell.
    sleeping: AtomicBool,
    /// Whether that sleep ends by itself when the application threads' driving window
    /// and grace period are over (it slept on the doorbell alone because one drove).
    /// Written before `sleeping`; a thread that starts driving while the progress thread
    /// sleeps without that bound rings it (`Progress::user_active`).
    sleep_bounded: AtomicBool,
    stop: AtomicBool,
    conns: Mutex<FxHashMap<u64, Arc<Conn>>>,
    /// Bumped whenever a connection comes or goes (see [`Progress::settle`]).
    conns_gen: AtomicU64,
    next_token: AtomicU64,
    ready: Mutex<VecDeque<Arc<QpShared>>>,
    /// Whether `ready` may be non-empty (set and cleared under its lock; read without it
    /// on every poll).
    ready_pending: AtomicBool,
    timers: Mutex<BinaryHeap<Reverse<TimerEntry>>>,
    /// When the earliest timer is due (nanoseconds since `base`; `u64::MAX`: none), kept
    /// under the `timers` lock and read without it on every poll.
    next_timer: AtomicU64,
    base: Instant,
    /// `CLOCK_MONOTONIC` (the clock of [`Instant`]) in nanoseconds, read just after
    /// `base`: a reading less this is at most the time since `base`, never more, so a
    /// timer never fires early (see [`Progress::now_ns`]).
    base_ns: u64,
    /// Nanoseconds since `base` until which an application thread counts as driving
    /// (`u64::MAX` while a driving thread services a connection, see
    /// [`Progress::user_entered`]).
    user_until: AtomicU64,
    /// When an application thread last polled (nanoseconds since `base`).
    last_user_poll: AtomicU64,
    spin: Duration,
    /// How long the progress thread stays off the connections after an application
    /// thread's driving window ends ([`USER_GRACE`] unless `RDMA_SIM_GRACE_US` says).
    grace: Duration,
    /// Connections with an ACK left for later (delayed ACK).
    acks: Mutex<Vec<Arc<Conn>>>,
    /// How many connections owe an ACK (`Conn::ack_owed` set), checked without the lock
    /// on every poll and post. Exact: each flag's change from false to true adds one and
    /// each change back subtracts one, and `close` clears a closed connection's flag (a
    /// count kept above zero would never let the progress thread sleep). Briefly off by
    /// one between a flag's swap and the count's update, as the flag and a boolean were.
    acks_owed: AtomicUsize,
    acks_spare: Mutex<Vec<Arc<Conn>>>,
    /// Faults that fired on this device.
    pub counters: FaultCounters,
    /// How many of the device's QPs have WQEs in their send queues ([`Progress::kick`]).
    busy_sqs: AtomicUsize,
    /// Lone WRs that waited for the ones posted after them ([`Progress::kick`]; read by
    /// tests).
    pub(crate) joined: AtomicU64,
}

fn os(call: &'static str) -> impl FnOnce(io::Error) -> verbs_api::Error {
    move |source| verbs_api::Error::Os { call, source }
}

fn new_fd(r: libc::c_int, call: &'static str) -> verbs_api::Result<OwnedFd> {
    if r < 0 {
        return Err(os(call)(io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

impl Progress {
    /// A new engine (no thread yet; see [`Progress::run`]).
    pub fn new() -> verbs_api::Result<Progress> {
        // SAFETY (all three): plain syscalls without pointers; results are checked.
        let epfd = new_fd(
            unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
            "epoll_create1",
        )?;
        let bell_ep = new_fd(
            unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
            "epoll_create1",
        )?;
        let bell = new_fd(
            unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) },
            "eventfd",
        )?;
        add_to(&epfd, bell.as_raw_fd(), libc::EPOLLIN as u32, BELL).map_err(os("epoll_ctl"))?;
        add_to(&bell_ep, bell.as_raw_fd(), libc::EPOLLIN as u32, BELL).map_err(os("epoll_ctl"))?;
        let micros = |var: &str, default: Duration| {
            std::env::var(var)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(default, Duration::from_micros)
        };
        let spin = micros("RDMA_SIM_SPIN_US", DEFAULT_SPIN);
        let grace = micros("RDMA_SIM_GRACE_US", USER_GRACE);
        // `base_ns` right after `base` (see the field).
        let base = Instant::now();
        Ok(Progress {
            epfd,
            bell_ep,
            bell,
            sleeping: AtomicBool::new(false),
            sleep_bounded: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            conns: Mutex::new(FxHashMap::default()),
            conns_gen: AtomicU64::new(0),
            next_token: AtomicU64::new(1),
            // Room for the QPs of a typical device: no allocation on the data path later.
            ready: Mutex::new(VecDeque::with_capacity(64)),
            ready_pending: AtomicBool::new(false),
            next_timer: AtomicU64::new(u64::MAX),
            timers: Mutex::new(BinaryHeap::new()),
            base,
            base_ns: sys::monotonic_ns(),
            user_until: AtomicU64::new(0),
            last_user_poll: AtomicU64::new(0),
            spin,
            grace,
            acks: Mutex::new(Vec::new()),
            acks_owed: AtomicUsize::new(0),
            acks_spare: Mutex::new(Vec::new()),
            counters: FaultCounters::default(),
            busy_sqs: AtomicUsize::new(0),
            joined: AtomicU64::new(0),
        })
    }

    fn ctl(&self, op: libc::c_int, conn: &Conn, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: conn.token,
        };
        // SAFETY: `ev` is a valid epoll_event (ignored for DEL); both descriptors are open
        // (the socket is owned by `conn`).
        if unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, conn.sock.as_raw_fd(), &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Records the events a connection wants, and tells epoll if it is registered.
    fn set_interest(&self, conn: &Conn, want: u32) {
        let mut ep = conn.ep.lock();
        ep.interest = want;
        if ep.registered {
            let _ = self.ctl(libc::EPOLL_CTL_MOD, conn, want);
        }
    }

    /// Puts a connection in the epoll set (if it is open and not there yet).
    fn arm(&self, conn: &Conn) -> io::Result<()> {
        let mut ep = conn.ep.lock();
        if !ep.registered && !conn.is_closed() {
            self.ctl(libc::EPOLL_CTL_ADD, conn, ep.interest)?;
            ep.registered = true;
        }
        Ok(())
    }

    /// Takes a connection out of the epoll set (threads read it directly meanwhile).
    fn disarm(&self, conn: &Conn) {
        let mut ep = conn.ep.lock();
        if ep.registered {
            let _ = self.ctl(libc::EPOLL_CTL_DEL, conn, 0);
            ep.registered = false;
        }
    }

    /// Brings every connection's registration in line with what the progress thread is
    /// about to do: `direct` (spin over them, or sleep on the doorbell while application
    /// threads drive) takes them out of the epoll set when there are at most
    /// [`DIRECT_MAX`]; anything else (blocking on the set, or too many to read
    /// directly) puts them in. Does nothing when neither the wish nor the set of
    /// connections changed since the last call.
    fn settle(&self, direct: bool, st: &mut Settled, scratch: &mut Vec<Arc<Conn>>) {
        // SeqCst: `activate` bumps it, then reads `sleeping`; this thread stored
        // `sleeping` before, so one of the two sees the other.
        let generation = self.conns_gen.load(Ordering::SeqCst);
        if st.direct == Some(direct) && st.generation == generation {
            return;
        }
        scratch.clear();
        scratch.extend(self.conns.lock().values().cloned());
        let armed = !direct || scratch.len() > DIRECT_MAX;
        for c in scratch.iter() {
            if armed {
                if let Err(e) = self.arm(c) {
                    tracing::warn!(qpn = c.qp.qpn, "cannot watch the connection: {e}");
                    self.lost(c, "epoll_ctl failed");
                }
            } else {
                self.disarm(c);
            }
        }
        scratch.clear();
        *st = Settled {
            direct: Some(direct),
            generation,
        };
    }

    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Nanoseconds since `base`, read without an [`Instant`]. `base_ns` was read just
    /// after `base`, so this lags [`Progress::nanos`] of the same moment by the time
    /// between those two reads (tens of nanoseconds): a clock read that much earlier.
    fn now_ns(&self) -> u64 {
        sys::monotonic_ns().saturating_sub(self.base_ns)
    }

    /// The [`Instant`] of a reading of [`Progress::now_ns`] (not later than the moment it
    /// was read).
    fn instant(&self, ns: u64) -> Instant {
        self.base + Duration::from_nanos(ns)
    }

    /// Reads the clock (see [`Stamp`]).
    fn stamp_now(&self) -> Stamp {
        Stamp { ns: self.now_ns() }
    }

    /// Empties the doorbell: how often it was rung since it was last emptied.
    fn take_rings(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own (non-blocking) eventfd.
        let r = unsafe { libc::read(self.bell.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if r == 8 {
            v
        } else {
            0
        }
    }

    fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
        let _ = unsafe { libc::write(self.bell.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Stops the progress thread.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        self.ring();
    }

    /// Takes over an established connection of `qp` (set up by the transport). It is not
    /// serviced before [`Progress::activate`]: install it in the QP first.
    pub fn register(
        &self,
        qp: &Arc<QpShared>,
        epoch: u64,
        sock: TcpStream,
        reader: Reader,
    ) -> io::Result<Arc<Conn>> {
        sock.set_nonblocking(true)?;
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            token,
            qp: qp.clone(),
            epoch,
            sock,
            io: Mutex::new(ConnIo {
                reader,
                tx: TxQueue::new(),
                drive: DriveState::default(),
                interest: libc::EPOLLIN as u32,
            }),
            closed: AtomicBool::new(false),
            ack_owed: AtomicBool::new(false),
            ack_listed: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            last_tx: AtomicU64::new(0),
            last_rx: AtomicU64::new(0),
            active: AtomicBool::new(false),
            ep: Mutex::new(EpReg {
                registered: false,
                interest: libc::EPOLLIN as u32,
            }),
        });
        self.conns.lock().insert(token, conn.clone());
        Ok(conn)
    }

    /// Starts servicing a registered connection (now installed in its QP).
    pub fn activate(&self, conn: &Arc<Conn>) {
        // Registered at first, whatever the progress thread does; it takes the
        // connection out of the set again if it reads connections directly.
        if let Err(e) = self.arm(conn) {
            tracing::warn!(qpn = conn.qp.qpn, "cannot watch the connection: {e}");
            self.lost(conn, "epoll_ctl failed");
            return;
        }
        self.conns_gen.fetch_add(1, Ordering::SeqCst);
        conn.active.store(true, Ordering::Release);
        // One connection too many to read directly: application threads now look at the
        // epoll set, where the others may be missing (the progress thread took them out
        // while it slept on the doorbell). Wake it to put them back (`settle`).
        if self.sleeping.load(Ordering::SeqCst) && self.conns.lock().len() > DIRECT_MAX {
            self.ring();
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
        conn.qp.inner.lock().resp.flush_ack(&mut io.tx);
        let fd = conn.sock.as_raw_fd();
        let deadline = Instant::now() + Duration::from_millis(100);
        while !io.tx.is_empty() && Instant::now() < deadline {
            match io.tx.write_to(&mut sys::Sock(fd)) {
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
        self.disarm(conn);
        let _ = conn.sock.shutdown(std::net::Shutdown::Both);
        self.conns.lock().remove(&conn.token);
        self.forget_acks(conn);
        self.conns_gen.fetch_add(1, Ordering::AcqRel);
    }

    /// Schedules a timer check of `qp` at `at`.
    pub fn arm_timer(&self, qp: &Arc<QpShared>, at: Instant) {
        let earliest = {
            let mut t = self.timers.lock();
            t.push(Reverse(TimerEntry {
                at,
                qp: Arc::downgrade(qp),
            }));
            let first = t.peek().map(|e| e.0.at);
            self.note_next_timer(first);
            first == Some(at)
        };
        if earliest && self.sleeping.load(Ordering::SeqCst) {
            self.ring();
        }
    }

    /// Queues `qp` to transmit its send queue: for the next poll of an application
    /// thread that drives progress, else for the progress thread (woken if asleep).
    pub fn schedule(&self, qp: &Arc<QpShared>) {
        if !qp.tx_queued.swap(true, Ordering::AcqRel) {
            let mut r = self.ready.lock();
            r.push_back(qp.clone());
            self.ready_pending.store(true, Ordering::Release);
            drop(r);
            // While an application thread drives, its next poll (within DRIVE_GAP) runs
            // the queue; waking the progress thread too would only have two threads
            // fight over the connections. If it stops polling without arming a CQ,
            // the progress thread takes over when the window and grace period end.
            if self.sleeping.load(Ordering::SeqCst) && !self.user_driving() {
                self.ring();
            }
        }
    }

    /// Whether an application thread drives progress now.
    fn user_driving(&self) -> bool {
        self.user_until.load(Ordering::Relaxed) > self.now_ns()
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

    /// How many connections the delayed-ACK list holds (tests).
    #[cfg(test)]
    pub fn acks_listed(&self) -> usize {
        self.acks.lock().len()
    }

    /// How many connections owe an ACK (tests).
    #[cfg(test)]
    pub fn acks_owed(&self) -> usize {
        self.acks_owed.load(Ordering::SeqCst)
    }

    /// `conn` owes an ACK left for later: counts it and lists it once.
    pub(crate) fn owe_ack(&self, conn: &Arc<Conn>) {
        if conn.ack_owed.load(Ordering::Relaxed) || conn.ack_owed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.acks_owed.fetch_add(1, Ordering::SeqCst);
        if !conn.ack_listed.load(Ordering::Acquire) && !conn.ack_listed.swap(true, Ordering::SeqCst) {
            self.acks.lock().push(conn.clone());
        }
        // A `close` that cleared the flag (and the list) before this round set it has
        // gone by: do its part here. Either this look sees `closed`, or `close`'s swap
        // and its `forget_acks` come later and find the flag set and the connection
        // listed (the swaps and looks are SeqCst), or its removal from the list took the
        // list's lock before the push above, and this look sees `closed` after all.
        if conn.closed.load(Ordering::SeqCst) {
            self.forget_acks(conn);
        }
    }

    /// A closed `conn` leaves the delayed-ACK count and list.
    fn forget_acks(&self, conn: &Conn) {
        self.disown_ack(conn);
        if conn.ack_listed.load(Ordering::SeqCst) {
            self.acks.lock().retain(|c| !std::ptr::eq(Arc::as_ptr(c), conn));
        }
    }

    /// `conn` owes no ACK (any it owed left, or it is closed): uncounts it. Always a
    /// swap, never a plain look first: a closed connection's flag must be found set if
    /// it is.
    fn disown_ack(&self, conn: &Conn) {
        if conn.ack_owed.swap(false, Ordering::SeqCst) {
            self.acks_owed.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// How many of the device's QPs have WQEs in their send queues.
    pub fn busy_send_queues(&self) -> usize {
        self.busy_sqs.load(Ordering::Relaxed)
    }

    /// After `post_send` (of `wrs` work requests): transmit now on this thread if the
    /// connection is idle (the latency path), else leave it to the driving thread's next
    /// poll or the progress thread (which batch). A lone WR on an idle connection waits
    /// too if this thread already posted since its last poll, an application thread
    /// drives, and other QPs of the device have work outstanding: the poster is then in
    /// a loop that refills many QPs one `post_send` at a time, and the WRs it posts to
    /// this QP next leave with it in one `sendmsg` at its next poll instead of two (the
    /// first alone). A thread that posts and then computes without polling has it sent
    /// when the driving window and grace period end, as any WR queued behind others
    /// while it drives. The first post after a poll never waits (a ping-pong, also one
    /// between two QPs of this device, each of which looks busy while it owes the other
    /// an ACK), nor does a list (the poster's own batch).
    pub fn kick(&self, qp: &Arc<QpShared>, conn: &Arc<Conn>, idle: bool, wrs: usize) {
        let now = self.stamp_now();
        let driving = self.user_posted(now.ns);
        let burst = POSTS_SINCE_POLL.replace(POSTS_SINCE_POLL.get().saturating_add(1)) > 0;
        let join = idle && wrs == 1 && burst && driving && self.busy_send_queues() > 1;
        if join {
            self.joined.fetch_add(1, Ordering::Relaxed);
        }
        if idle && !join && self.service_inner(conn, Mode::Transmit, false, Some(now)) {
            self.flush_acks();
            return;
        }
        self.schedule(qp);
    }

    /// An application thread posted at `now` (nanoseconds since `base`): whether an
    /// application thread drives progress. If one does, the post counts as a poll
    /// towards its window: a loop that refills many QPs can take longer than the window
    /// between two polls, and the progress thread, finding the window over, would take
    /// the transmits it is queueing (a third busy thread on the connections). A post
    /// opens no window of its own: a thread that posts and waits on a completion channel
    /// does not drive.
    fn user_posted(&self, now: u64) -> bool {
        let until = self.user_until.load(Ordering::Relaxed);
        // (`u64::MAX`: a driving thread is inside a connection; its exit sets the window.)
        if until > now && until != u64::MAX {
            self.user_active(now);
        }
        until > now
    }

    /// Writes the ACKs left for later (an application thread's next poll or post, or
    /// the progress thread when no application drives). Returns whether any was owed.
    #[inline]
    pub fn flush_acks(&self) -> bool {
        // A plain load, inlined in the callers: this runs on every poll and post, and
        // usually finds nothing owed (a ping-pong's ACK leaves with its next request).
        self.acks_owed.load(Ordering::Acquire) != 0 && self.flush_owed_acks()
    }

    /// [`Progress::flush_acks`] when some connection owes an ACK.
    #[inline(never)]
    fn flush_owed_acks(&self) -> bool {
        // The connections that owe one, collected in a spare list (the steady state
        // allocates nothing) and serviced once the list's lock is released. A closed one
        // found here leaves the list (`close` and `owe_ack` remove them; this is the
        // backstop).
        let mut owed: Option<Vec<Arc<Conn>>> = None;
        self.acks.lock().retain(|c| {
            if c.is_closed() {
                c.ack_listed.store(false, Ordering::Release);
                self.disown_ack(c);
                return false;
            }
            if c.ack_owed.load(Ordering::Acquire) && c.ack_owed.swap(false, Ordering::SeqCst) {
                self.acks_owed.fetch_sub(1, Ordering::SeqCst);
                owed.get_or_insert_with(|| std::mem::take(&mut *self.acks_spare.lock()))
                    .push(c.clone());
            }
            true
        });
        let Some(mut owed) = owed else { return false };
        for c in &owed {
            self.service_as(c, Mode::Transmit);
        }
        owed.clear();
        *self.acks_spare.lock() = owed;
        true
    }

    /// Receive progress from an application thread whose CQ was empty: one
    /// non-blocking look at the epoll set, plus due timers and queued transmits.
    pub fn user_drive(self: &Arc<Self>) {
        self.user_here();
        // Only a thread that polls in a tight loop counts as driving (and lets the
        // progress thread sleep); an occasional poll between naps does not.
        let clock = self.stamp_now();
        let now = clock.ns;
        self.user_active(now);
        self.flush_acks();
        if self.peek_few(Mode::User, Some(clock)).is_none() {
            let mut events = [libc::epoll_event { events: 0, u64: 0 }; 16];
            let n = wait_on(&self.epfd, &mut events, Some(Duration::ZERO));
            let mut given = Some(clock);
            for ev in &events[..n] {
                if ev.u64 != BELL {
                    if let Some(c) = self.conn(ev.u64) {
                        self.service_inner(&c, Mode::User, false, given.take());
                    }
                }
            }
        }
        // A timer is checked against the clock read above: at most one poll late.
        if self.timer_due(now) {
            self.run_timers();
        }
        if self.ready_pending.load(Ordering::Acquire) {
            self.run_ready();
        }
    }

    /// An application thread's poll found completions: it counts towards driving as an
    /// empty one does (a loop whose polls always find some still polls in a tight loop).
    pub fn user_polled(self: &Arc<Self>) {
        self.user_here();
        self.user_active(self.now_ns());
    }

    /// An application thread polls a CQ of this device. If the last device it polled
    /// was another one, it no longer drives that one: tell it now, as if the thread had
    /// armed a CQ there ([`Progress::user_idle`]), so its progress thread takes over at
    /// once instead of after the driving window and the grace period. A thread that
    /// alternates between the CQs of two devices (a test with both ends in one
    /// process) would otherwise leave each device's incoming requests waiting for that
    /// grace period, about 2 ms, while it polls the other one. One thread-local
    /// comparison per poll while it stays on one device.
    fn user_here(self: &Arc<Self>) {
        POSTS_SINCE_POLL.set(0);
        if std::ptr::eq(POLLED_AT.get(), Arc::as_ptr(self)) {
            return;
        }
        POLLED_AT.set(Arc::as_ptr(self));
        let left =
            POLLED.with(|last| std::mem::replace(&mut *last.borrow_mut(), Arc::downgrade(self)).upgrade());
        if let Some(other) = left {
            other.user_idle();
        }
    }

    /// An application thread polls at `now` (nanoseconds since `base`): if its
    /// previous poll was less than [`DRIVE_GAP`] before, it drives progress for the next
    /// [`USER_WINDOW`].
    ///
    /// A thread that starts driving (no window was open) while the progress thread
    /// sleeps on the whole epoll set, with no end to its sleep, rings it: that thread
    /// must learn that a window opened, to sleep on the doorbell alone and take over
    /// when the window and grace period end. Else what the driving thread leaves behind
    /// when it stops polling (an ACK it owes, a transmit queued behind others) would wait
    /// for the next packet or timer, for ever if none comes: the packets of the window
    /// only woke it for readiness that the driving thread had already taken.
    fn user_active(&self, now: u64) {
        // A load and a store, not a swap (a locked instruction on every poll): two threads
        // polling at once may each see the other's time, which is as good as their own.
        let last = self.last_user_poll.load(Ordering::Relaxed);
        self.last_user_poll.store(now, Ordering::Relaxed);
        if now.saturating_sub(last) < DRIVE_GAP.as_nanos() as u64 {
            let until = now + USER_WINDOW.as_nanos() as u64;
            if self.user_until.load(Ordering::Relaxed) > now {
                // A window is open (or a driving thread is inside a connection).
                self.user_until.store(until, Ordering::Relaxed);
                return;
            }
            // SeqCst: paired with the progress thread's `sleeping` store and second look.
            self.user_until.store(until, Ordering::SeqCst);
            if self.sleeping.load(Ordering::SeqCst) && !self.sleep_bounded.load(Ordering::Relaxed) {
                self.ring();
            }
        }
    }

    /// An application thread starts servicing a connection: if it drives progress (its
    /// last poll opened or extended the window), it goes on driving for as long as it is
    /// there, however short the window: reading or writing a large payload (up to a
    /// [`WRITE_BUDGET`](crate::tx::WRITE_BUDGET)) takes a millisecond or more on
    /// loopback. Without this, a progress thread waking meanwhile finds the window over,
    /// watches the connections itself and fights the application for them. Returns the
    /// window to hand to [`Progress::user_left`]; `None` on a progress thread, or when the
    /// thread was not driving (zero: never, or it armed a CQ to sleep, see `user_idle`).
    fn user_entered(&self) -> Option<u64> {
        if ON_PROGRESS_THREAD.get() {
            return None;
        }
        let until = self.user_until.load(Ordering::Relaxed);
        if until != 0 && until >= self.last_user_poll.load(Ordering::Relaxed) {
            self.user_until.store(u64::MAX, Ordering::Relaxed);
            Some(until)
        } else {
            None
        }
    }

    /// The thread of [`Progress::user_entered`] lets go of the connection: if it moved
    /// bytes, the time spent was not a pause between polls and the window runs on from
    /// `now()`; else the window is as it was. Only undoes its own mark: a CQ armed
    /// meanwhile (`user_idle`) or a newer poll's window stands.
    fn user_left(&self, entered: Option<u64>, moved: bool, now: impl FnOnce() -> u64) {
        let Some(until) = entered else { return };
        // (`u64::MAX`: another thread was in a connection too; it counts as moved.)
        let (until, at) = if moved || until == u64::MAX {
            let t = now();
            (t + USER_WINDOW.as_nanos() as u64, Some(t))
        } else {
            (until, None)
        };
        let swapped = self
            .user_until
            .compare_exchange(u64::MAX, until, Ordering::Relaxed, Ordering::Relaxed);
        if let (Ok(_), Some(t)) = (swapped, at) {
            self.last_user_poll.store(t, Ordering::Relaxed);
        }
    }

    /// Whether an application thread has been inside one connection for about the grace
    /// period or longer (`now_ns`: nanoseconds since `base`). It entered within a window
    /// of its last poll and has not polled since, so while its stream does not drain the
    /// device's other connections have nobody to read them: the progress thread gives
    /// them a round every window plus grace period, as it would if nobody drove.
    fn long_stay(&self, now_ns: u64) -> bool {
        self.user_until.load(Ordering::Relaxed) == u64::MAX
            && now_ns.saturating_sub(self.last_user_poll.load(Ordering::Relaxed))
                >= self.grace.as_nanos() as u64
    }

    /// With at most [`DIRECT_MAX`] connections, reads each of them directly (and
    /// services those that had news); `None` with more. Reading a socket is one syscall
    /// per connection and spin, like asking epoll, but when bytes have arrived it saves
    /// the second one (epoll, then read): a read that finds nothing returns at once.
    /// `clock`: the caller's, read just before, for the first connection's round (the
    /// others may follow a long write, and read their own).
    fn peek_few(&self, mode: Mode, mut clock: Option<Stamp>) -> Option<bool> {
        let mut direct: [Option<Arc<Conn>>; DIRECT_MAX] = Default::default();
        {
            let conns = self.conns.lock();
            if conns.len() > DIRECT_MAX {
                return None;
            }
            for (slot, c) in direct.iter_mut().zip(conns.values()) {
                *slot = Some(c.clone());
            }
        }
        let mut work = false;
        for c in direct.iter().flatten() {
            if c.active.load(Ordering::Acquire) {
                work |= self.service_inner(c, mode, true, clock.take());
            }
        }
        Some(work)
    }

    /// An application thread is about to sleep on a completion channel (it armed a CQ):
    /// it no longer drives progress, so the progress thread must take over at once
    /// rather than after the grace period, and the thread's next poll does not start a
    /// new driving window.
    pub fn user_idle(&self) {
        self.last_user_poll.store(0, Ordering::Relaxed);
        // SeqCst: paired with the progress thread's `sleeping` store and second look.
        let until = self.user_until.swap(0, Ordering::SeqCst);
        // While the window and the grace period after it last, the progress thread may
        // be asleep on the doorbell alone: wake it to watch the connections.
        let off_until = until.saturating_add(self.grace.as_nanos() as u64);
        if until != 0 && off_until > self.now_ns() && self.sleeping.load(Ordering::SeqCst) {
            self.ring();
        }
    }

    /// Whether the earliest timer is due at `now_ns` (nanoseconds since `base`).
    fn timer_due(&self, now_ns: u64) -> bool {
        self.next_timer.load(Ordering::Acquire) <= now_ns
    }

    /// Records when the earliest timer is due; call with the `timers` lock held.
    fn note_next_timer(&self, first: Option<Instant>) {
        let ns = first.map_or(u64::MAX, |at| self.nanos(at));
        self.next_timer.store(ns, Ordering::Release);
    }

    fn conn(&self, token: u64) -> Option<Arc<Conn>> {
        self.conns.lock().get(&token).cloned()
    }

    /// The progress thread's loop; returns when [`Progress::shutdown`] is called.
    pub fn run(&self) {
        ON_PROGRESS_THREAD.set(true);
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut spin_until = Instant::now();
        let mut last_work = Instant::now();
        // Average gap between bursts of work: the spin window follows it (bounded), so a
        // steady stream of requests never falls into "each one pays a wake-up".
        let mut gap_ewma = self.spin;
        let mut settled = Settled::default();
        let mut scratch = Vec::new();
        let mut share = ShareWatch::default();
        // Whether the last turn was a spinning one (so a block now ends a spin window).
        let mut spun_last = false;
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            // (Converted once: the loop compares it with the driving window up to three
            // times.)
            let now_ns = self.nanos(now);
            let user_until = self.user_until.load(Ordering::Relaxed);
            let user_driving = user_until > now_ns;
            // Spin (poll without blocking) for a while after doing work, unless an
            // application thread is driving progress itself: one spinner is enough.
            let spinning = now < spin_until && !user_driving;
            let timeout = if spinning {
                Some(Duration::ZERO)
            } else {
                self.sleep_bounded.store(user_driving, Ordering::Relaxed);
                self.sleeping.store(true, Ordering::SeqCst);
                // An application thread that stopped driving (armed a CQ or moved to
                // another device: `user_idle`) after `user_until` was read above found
                // `sleeping` still false and did not ring: without this second look the
                // thread would sleep through the window and grace period it computed
                // from the stale value. (Both sides: a SeqCst write, then a SeqCst read
                // of the other's flag, so at least one of them sees the other.)
                // Likewise a thread that started driving meanwhile (`user_active`).
                let until = self.user_until.load(Ordering::SeqCst);
                let stopped = user_driving && until == 0;
                let started = !user_driving && until > now_ns;
                // Work queued between the last check and now must not wait for a bell,
                // unless an application thread drives: its next poll runs it (posters
                // do not ring while it does, see `schedule`).
                if stopped
                    || started
                    || !user_driving
                        && (self.ready_pending.load(Ordering::Acquire)
                            || self.acks_owed.load(Ordering::Acquire) != 0)
                {
                    Some(Duration::ZERO)
                } else {
                    let mut left = self
                        .timers
                        .lock()
                        .peek()
                        .map(|e| e.0.at.saturating_duration_since(now));
                    if user_driving {
                        // Take over when the application stops driving, plus a grace
                        // period: checking more often would cost the driving threads a
                        // core (a wake-up costs tens of µs on small VMs).
                        // (At most one window ahead while a driving thread writes.)
                        let ahead = Duration::from_nanos(user_until - now_ns);
                        let window = ahead.min(USER_WINDOW) + self.grace;
                        left = Some(left.map_or(window, |l| l.min(window)));
                    }
                    left
                }
            };
            // While applications drive, sleep on the doorbell alone: waking for every
            // packet they handle themselves would only take CPU from them.
            let bell_only = user_driving && !spinning;
            let mut work = false;
            // Spinning, or asleep on the doorbell while applications drive: connections
            // are read directly (see `peek_few`) and, if few enough, kept out of the
            // epoll set; blocking on the set needs them all in it.
            self.settle(spinning || bell_only, &mut settled, &mut scratch);
            let peeked = if spinning {
                self.peek_few(Mode::Full, None)
            } else {
                None
            };
            let n = match peeked {
                Some(w) => {
                    work = w;
                    0
                }
                None => {
                    let set = if bell_only { &self.bell_ep } else { &self.epfd };
                    let m = wait_on(set, &mut events, timeout);
                    // Blocked on the connections right after a spin window, and woken by one: see
                    // `cpu_share`.
                    if spun_last
                        && !bell_only
                        && timeout != Some(Duration::ZERO)
                        && events[..m].iter().any(|e| e.u64 != BELL)
                    {
                        let woke = Instant::now();
                        let idle = now.saturating_duration_since(last_work);
                        let window = MAX_SPIN.max(self.spin);
                        if share.after_wake(idle, window, woke.saturating_duration_since(now), woke) {
                            cpu_share::move_off_this_cpu();
                        }
                    }
                    m
                }
            };
            self.sleeping.store(false, Ordering::SeqCst);
            for ev in &events[..n] {
                if ev.u64 == BELL {
                    self.take_rings();
                } else if let Some(c) = self.conn(ev.u64) {
                    work |= self.service(&c);
                }
            }
            // Woken from the doorbell while an application thread still drives (it polled
            // again since this thread went to sleep): what it left is for its next poll,
            // which comes within the window; taking it here would only make this a third
            // busy thread beside the application's. Due timers still run. Unless it has
            // been inside one connection since before the grace period: then the others
            // get a round here (the one it is in is skipped, its I/O lock being held).
            let still_driving = bell_only && self.user_driving() && !self.long_stay(self.now_ns());
            if bell_only && !still_driving {
                // Woken by the bell or the end of the window: connections may have data
                // that no application thread picked up.
                match self.peek_few(Mode::Full, None) {
                    Some(w) => work |= w,
                    None => {
                        let m = wait_on(&self.epfd, &mut events, Some(Duration::ZERO));
                        for ev in &events[..m] {
                            if ev.u64 != BELL {
                                if let Some(c) = self.conn(ev.u64) {
                                    work |= self.service(&c);
                                }
                            }
                        }
                    }
                }
            }
            if !still_driving {
                work |= self.flush_acks();
                work |= self.run_ready();
            }
            work |= self.run_timers();
            if work {
                let t = Instant::now();
                let gap = t.saturating_duration_since(last_work);
                last_work = t;
                gap_ewma = (gap_ewma * 3 + gap) / 4;
                spin_until = t + (gap_ewma * 2).clamp(self.spin, MAX_SPIN.max(self.spin));
            } else if spinning && n == 0 {
                std::hint::spin_loop();
            }
            spun_last = spinning;
        }
    }

    fn run_ready(&self) -> bool {
        let mut work = false;
        loop {
            let next = {
                let mut r = self.ready.lock();
                let next = r.pop_front();
                if next.is_none() {
                    self.ready_pending.store(false, Ordering::Release);
                }
                next
            };
            let Some(qp) = next else {
                break;
            };
            qp.tx_queued.store(false, Ordering::Release);
            let conn = qp.inner.lock().conn.clone();
            match conn {
                Some(c) => work |= self.service(&c),
                None => qp.req_wake.notify_one(),
            }
        }
        work
    }

    fn run_timers(&self) -> bool {
        let now = Instant::now();
        if !self.timer_due(self.nanos(now)) {
            return false;
        }
        let mut work = false;
        loop {
            let entry = {
                let mut t = self.timers.lock();
                let due = match t.peek() {
                    Some(e) if e.0.at <= now => t.pop().map(|e| e.0),
                    _ => None,
                };
                if due.is_some() {
                    self.note_next_timer(t.peek().map(|e| e.0.at));
                }
                due
            };
            let Some(e) = entry else { break };
            let Some(qp) = e.qp.upgrade() else { continue };
            work = true;
            let (fired, conns) = {
                let mut g = qp.inner.lock();
                if g.timer_at == Some(e.at) {
                    g.timer_at = None;
                }
                let at = |t: &AtomicU64| match t.load(Ordering::Relaxed) {
                    0 => None,
                    ns => Some(self.base + Duration::from_nanos(ns)),
                };
                let last_tx = g.conn.as_ref().and_then(|c| at(&c.last_tx));
                let last_rx = g.conn.as_ref().and_then(|c| at(&c.last_rx));
                let parts = QpShared::scratch(&mut g);
                let fired = parts
                    .req
                    .on_timer(now, last_tx, last_rx, parts.send_wc)
                    .unwrap_or_else(|_| {
                        qp.enter_error(&mut g);
                        true
                    });
                qp.deliver(&mut g);
                self.rearm(&qp, &mut g);
                (fired, [g.conn.clone(), g.self_conn.clone()])
            };
            if conns[0].is_none() {
                qp.req_wake.notify_one();
            }
            // A resend, or the end of an RNR wait, may be due now; on a QP with faults
            // armed, the end of a stall or of held responses too. An ACK deadline that
            // only moved (the stream is flowing: it moves with every write) leaves
            // nothing to do: servicing the connection here would only take its frames
            // from the thread that drives it, on a third thread. With 64 QPs streaming,
            // each QP's deadline comes due (and moves) once per timeout: about 950
            // services a second at the default 67 ms, before this check.
            if fired || qp.fault_armed.load(Ordering::Acquire) {
                for c in conns.into_iter().flatten() {
                    self.service(&c);
                }
            }
        }
        work
    }

    /// Pushes the requester's next deadline to the timer heap if it is new.
    pub fn rearm(&self, qp: &Arc<QpShared>, g: &mut QpInner) {
        if let Some(at) = g.req.next_deadline() {
            if g.timer_at.is_none_or(|t| at < t) {
                g.timer_at = Some(at);
                self.arm_timer(qp, at);
            }
        }
    }

    /// Reads, processes and writes what a connection has, until it has nothing more.
    /// Returns false if another thread is servicing it (or it is closed).
    pub fn service(&self, conn: &Arc<Conn>) -> bool {
        self.service_as(conn, Mode::Full)
    }

    fn service_as(&self, conn: &Arc<Conn>, mode: Mode) -> bool {
        self.service_inner(conn, mode, false, None)
    }

    /// `peek`: the caller does not know whether the socket has news; if it has none and
    /// nothing waits to be decoded or written, return without processing. A peek asks
    /// for nothing: it does not set `pending` (a busy connection is being serviced
    /// anyway), and a request another thread left in `pending` makes its round a full
    /// one, so no post waits behind a peek. `clock`: the time as the caller read it just
    /// before (its first round uses it instead of reading the clock again: on a VM a
    /// read costs ~40 ns, and a ping-pong's message would pay it twice more).
    fn service_inner(&self, conn: &Arc<Conn>, mode: Mode, mut peek: bool, mut clock: Option<Stamp>) -> bool {
        if !peek {
            conn.pending.store(true, Ordering::SeqCst);
        }
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
            let entered = self.user_entered();
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
            let (done, closed, end) = self.service_locked(conn, io, mode, peek, clock.take());
            self.user_left(entered, done, || end.unwrap_or_else(|| self.stamp_now()).ns);
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
    ) -> (bool, bool, Option<Stamp>) {
        let fd = conn.sock.as_raw_fd();
        let mut did = false;
        let mut clock: Option<Stamp>;
        loop {
            let mut progressed = false;
            let mut read_large = false;
            let mut read_any = false;
            let faulty = conn.qp.fault_armed.load(Ordering::Acquire);
            let stalled = faulty && self.responder_stalled(conn);
            let reading = !stalled && mode != Mode::Transmit;
            if reading {
                match io.reader.fill(&mut sys::Sock(fd)) {
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
                        if peek && !did && !io.reader.has_buffered() && io.tx.is_empty() {
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
                _ => self.stamp_now(),
            };
            clock = Some(now);
            if read_any {
                conn.last_rx.store(now.ns.max(1), Ordering::Relaxed);
            }
            let ack_later = if stalled {
                false
            } else {
                let ConnIo {
                    reader, tx, drive, ..
                } = &mut *io;
                match self.process(conn, reader, tx, drive, mode, self.instant(now.ns)) {
                    Processed::Closed => return (true, true, None),
                    Processed::Break(p) => {
                        self.break_now(conn, &mut io, p);
                        return (true, true, None);
                    }
                    Processed::Ok { ack_later } => ack_later,
                }
            };
            if ack_later {
                self.owe_ack(conn);
            } else if conn.ack_owed.load(Ordering::Relaxed) {
                // Nothing owed (any ACK left with this round's frames). (A stale look
                // that misses the flag costs a visit of `flush_acks`, nothing more.)
                self.disown_ack(conn);
            }
            let hold = faulty && self.responder_hold(conn, io.tx.is_empty());
            if !io.tx.is_empty() && !hold {
                match io.tx.write_to(&mut sys::Sock(fd)) {
                    Ok(n) => {
                        if n > 0 {
                            progressed = true;
                            let at = if n >= LARGE_IO {
                                let t = self.stamp_now();
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
                | (if io.tx.is_empty() || hold {
                    0
                } else {
                    libc::EPOLLOUT as u32
                });
            if want != io.interest {
                io.interest = want;
                self.set_interest(conn, want);
            }
            did |= progressed;
            // One pass when transmitting after a post; otherwise go on while bytes move
            // and the last read did not find the socket drained.
            if !progressed || mode == Mode::Transmit || (io.reader.drained() && io.tx.is_empty()) {
                break;
            }
        }
        (did, false, clock)
    }

    /// Fault injection: whether the responder side of `conn` is stalled now.
    fn responder_stalled(&self, conn: &Arc<Conn>) -> bool {
        let now = Instant::now();
        let mut g = conn.qp.inner.lock();
        let stalled = g.faults.stall_until.is_some_and(|t| now < t);
        if !stalled {
            g.faults.stall_until = None;
        }
        stalled
    }

    /// Fault injection: whether the frames queued on `conn` must wait (delayed responses).
    fn responder_hold(&self, conn: &Arc<Conn>, tx_empty: bool) -> bool {
        let qp = &conn.qp;
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
                f.hold_until = Some(t);
                drop(g);
                self.counters.delayed.fetch_add(1, Ordering::Relaxed);
                self.arm_timer(qp, t);
                true
            }
            None => false,
        }
    }

    /// Breaks a connection at `point` of the request just built (fault injection).
    fn break_now(&self, conn: &Arc<Conn>, io: &mut ConnIo, point: BreakPoint) {
        let fd = conn.sock.as_raw_fd();
        let mut bytes = Vec::new();
        io.tx.drain_into(&mut bytes);
        let n = match point {
            BreakPoint::BeforeRequest => 0,
            BreakPoint::MidRequest => bytes.len() / 2,
            BreakPoint::AfterRequest => bytes.len(),
        };
        let mut off = 0;
        let deadline = Instant::now() + Duration::from_secs(1);
        while off < n && Instant::now() < deadline {
            // SAFETY: sends bytes from a live Vec on our own socket.
            let r = unsafe {
                libc::send(
                    fd,
                    bytes[off..n].as_ptr().cast(),
                    n - off,
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                off += r as usize;
            } else {
                std::thread::yield_now();
            }
        }
        self.fault_break(conn);
    }

    /// Breaks a connection now (fault injection).
    pub fn fault_break(&self, conn: &Arc<Conn>) {
        self.counters.breaks.fetch_add(1, Ordering::Relaxed);
        self.lost(conn, "fault injection");
    }

    /// Hands buffered frames to the QP's state machines and builds what to send.
    fn process(
        &self,
        conn: &Arc<Conn>,
        reader: &mut Reader,
        tx: &mut TxQueue,
        st: &mut DriveState,
        mode: Mode,
        now: Instant,
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
        // An application thread's poll leaves the ACK for its next call (delayed ACK). On
        // the progress thread, while the stream keeps coming (the last read got all it
        // asked for), the ACK waits for the next pass until a request asks for it
        // (AckReq) or it covers `ACK_EVERY` bytes of payload: WRITEs of 16 KiB arrive one
        // per pass (a header read, then the payload straight into the region), and an
        // ACK each cost a `sendmsg` each (and the requester a segment to take in). Once
        // the socket is drained the ACK leaves at once.
        let ack_after = match mode {
            Mode::User => usize::MAX,
            _ if reader.drained() => 0,
            _ => ACK_EVERY,
        };
        // Nothing buffered and no payload underway (a thread that just posted): nothing
        // to decode; only the ACK that `drive` would end with.
        if !reader.has_buffered() && !reader.in_payload() {
            if mode == Mode::Full && matches!(g.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                g.resp.flush_ack(tx);
            }
        } else {
            loop {
                let accepting = matches!(g.state, QpState::Rtr | QpState::Rts | QpState::Sqd);
                let parts = QpShared::scratch(&mut g);
                let mut sides = Sides {
                    req: Some(parts.req),
                    resp: Some(parts.resp),
                    accepting,
                    send_wc: parts.send_wc,
                    recv_wc: parts.recv_wc,
                    force_rnr: parts.force_rnr,
                };
                match drive(
                    &mut sides,
                    reader,
                    &qp.dev.mrs,
                    tx,
                    now,
                    st,
                    MAX_UNSENT_READS,
                    ack_after,
                ) {
                    Ok(()) => break,
                    Err(Stop::Fatal(status)) => {
                        tracing::debug!(qpn = qp.qpn, ?status, "QP to ERR");
                        qp.enter_error(&mut g);
                    }
                    Err(Stop::Protocol(msg)) => {
                        tracing::warn!(qpn = qp.qpn, "closing connection: {msg}");
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
        }
        let armed = qp.fault_armed.load(Ordering::Acquire);
        if armed && g.faults.break_at == Some(BreakPoint::BeforeRequest) && g.req.has_unsent() {
            g.faults.break_at = None;
            qp.deliver(&mut g);
            return Processed::Break(BreakPoint::BeforeRequest);
        }
        if g.state == QpState::Rts && tx.pending() < TX_HIGH {
            // An ACK still owed goes first, in the same write as the new requests.
            if g.req.has_unsent() {
                g.resp.flush_ack(tx);
            }
            let before = tx.pending();
            let parts = QpShared::scratch(&mut g);
            if parts
                .req
                .poll_transmit(&qp.dev.mrs, now, tx, BUDGET, parts.send_wc)
                .is_err()
            {
                qp.enter_error(&mut g);
            }
            if armed && tx.pending() > before {
                if let Some(p) = g.faults.break_at.take() {
                    qp.deliver(&mut g);
                    return Processed::Break(p);
                }
            }
        }
        if mode == Mode::Transmit {
            g.resp.flush_ack(tx);
        }
        qp.deliver(&mut g);
        self.rearm(qp, &mut g);
        Processed::Ok {
            ack_later: g.resp.owes_ack(),
        }
    }

    fn lost(&self, conn: &Arc<Conn>, why: &str) {
        self.close(conn);
        let qp = &conn.qp;
        let mut g = qp.inner.lock();
        tracing::debug!(
            qpn = qp.qpn,
            dest_qpn = g.attr.dest_qp_num,
            outstanding = g.req.outstanding(),
            "connection lost: {why}"
        );
        if g.self_conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            g.self_conn = None;
            g.resp.connection_lost();
            return;
        }
        if g.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            g.conn = None;
            g.req.link_error = libc::ENOTCONN as u32;
            // Whatever was in flight is gone: requests are resent, half-received ones
            // are forgotten (see Responder::connection_lost).
            g.resp.connection_lost();
            g.req.on_connection_lost();
            self.rearm(qp, &mut g);
            drop(g);
            qp.req_wake.notify_one();
        }
    }

    /// Closes every connection (device shutdown).
    pub fn close_all(&self) {
        let all: Vec<Arc<Conn>> = self.conns.lock().values().cloned().collect();
        for c in all {
            self.close(&c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread that polls in a tight loop and then spends a few milliseconds writing a
    /// large payload still drives progress afterwards (the progress thread stays off the
    /// connection); a thread that was not driving, or armed a CQ to sleep, does not
    /// start driving by writing.
    #[test]
    fn a_driving_thread_busy_in_a_connection_keeps_driving() {
        let window = USER_WINDOW.as_nanos() as u64;
        let until = |p: &Progress| p.user_until.load(Ordering::Relaxed);
        let p = Progress::new().unwrap();
        let t0 = p.nanos(Instant::now()) + 1_000_000_000;
        // One isolated poll, then a write: not driving.
        p.user_active(t0);
        let e = p.user_entered();
        assert_eq!(e, None);
        p.user_left(e, true, || t0 + 1_000);
        assert_eq!(until(&p), 0);
        // Polls 10 us apart: driving, and it stays so while in a connection, however
        // long (the progress thread sees "driving" all along)...
        p.user_active(t0 + 10_000);
        assert_eq!(until(&p), t0 + 10_000 + window);
        let e = p.user_entered();
        assert_eq!(e, Some(t0 + 10_000 + window));
        assert_eq!(until(&p), u64::MAX);
        // ...a write that ends 3 ms later opens the window from there...
        p.user_left(e, true, || t0 + 3_000_000);
        assert_eq!(until(&p), t0 + 3_000_000 + window);
        // ...and the next poll right after counts as a tight loop.
        p.user_active(t0 + 3_010_000);
        assert_eq!(until(&p), t0 + 3_010_000 + window);
        // A visit that moved nothing leaves the window as it was (and reads no clock).
        let e = p.user_entered();
        p.user_left(e, false, || unreachable!("no clock read for an empty visit"));
        assert_eq!(until(&p), t0 + 3_010_000 + window);
        // Armed a CQ to sleep on its channel while inside: that stands.
        let e = p.user_entered();
        p.user_idle();
        p.user_left(e, true, || t0 + 3_020_000);
        assert_eq!(until(&p), 0);
        // ...and a write (a post) after that opens no window.
        let e = p.user_entered();
        assert_eq!(e, None);
        p.user_left(e, true, || t0 + 3_030_000);
        assert_eq!(until(&p), 0);
    }

    /// Posts from a driving thread keep its window open (a loop refilling many QPs between
    /// two polls), and the poll after them still counts as a tight loop; posts from a
    /// thread that does not drive open no window.
    #[test]
    fn posts_extend_a_driving_window_but_open_none() {
        let window = USER_WINDOW.as_nanos() as u64;
        let until = |p: &Progress| p.user_until.load(Ordering::Relaxed);
        let p = Progress::new().unwrap();
        let t0 = p.nanos(Instant::now()) + 1_000_000_000;
        // Posts alone, however close together: nobody drives.
        for i in 0..4 {
            assert!(!p.user_posted(t0 + i * 10_000));
        }
        assert_eq!(until(&p), 0);
        // Two polls 10 us apart: driving. A refill loop of 300 us posts every 40 us; each
        // post sees a driving thread and moves the window on.
        p.user_active(t0 + 100_000);
        p.user_active(t0 + 110_000);
        for i in 1..=7 {
            let t = t0 + 110_000 + i * 40_000;
            assert!(p.user_posted(t), "post {i}");
            assert_eq!(until(&p), t + window);
        }
        // The poll right after the loop (20 us after its last post) is a tight loop.
        p.user_active(t0 + 410_000);
        assert_eq!(until(&p), t0 + 410_000 + window);
        // A driving thread inside a connection: its window stays its own.
        let e = p.user_entered();
        assert!(p.user_posted(t0 + 420_000));
        assert_eq!(until(&p), u64::MAX);
        p.user_left(e, true, || t0 + 430_000);
        // A post after the window is over: not driving, and it does not start again.
        assert!(!p.user_posted(t0 + 430_000 + window + 1));
        assert!(!p.user_posted(t0 + 430_000 + window + 10_000));
        assert_eq!(until(&p), t0 + 430_000 + window);
    }

    /// A driving thread inside one connection for the grace period or longer is a long
    /// stay (the progress thread then serves the other connections); a shorter one, a
    /// thread that left, or one that polls again in between are not.
    #[test]
    fn a_stay_longer_than_the_grace_period_is_a_long_stay() {
        let p = Progress::new().unwrap();
        let g = p.grace.as_nanos() as u64;
        let t0 = p.nanos(Instant::now()) + 1_000_000_000;
        p.user_active(t0);
        p.user_active(t0 + 10_000);
        // Driving, not inside a connection: nothing to serve beside it.
        assert!(!p.long_stay(t0 + 10_000 + 2 * g));
        let e = p.user_entered();
        assert!(e.is_some());
        assert!(!p.long_stay(t0 + 10_000 + g / 2));
        assert!(p.long_stay(t0 + 10_000 + g));
        // It polls again from another thread meanwhile: that one visits the others.
        p.user_active(t0 + 20_000 + g);
        assert!(!p.long_stay(t0 + 30_000 + g));
        // It leaves: no stay at all.
        p.user_left(e, true, || t0 + 40_000 + g);
        assert!(!p.long_stay(t0 + 40_000 + 3 * g));
    }

    /// A thread drives the first device (polls in a tight loop while its progress thread
    /// sleeps), then polls the second: the first is told at once, its window closed and
    /// its progress thread woken; staying on the second tells nobody anything.
    #[test]
    fn polling_another_device_hands_the_first_back() {
        let (p0, p1) = (
            Arc::new(Progress::new().unwrap()),
            Arc::new(Progress::new().unwrap()),
        );
        p0.user_polled();
        p0.user_polled();
        assert!(p0.user_driving());
        p0.sleeping.store(true, Ordering::SeqCst);
        p1.user_polled();
        assert_eq!(p0.user_until.load(Ordering::Relaxed), 0);
        assert_eq!(p0.last_user_poll.load(Ordering::Relaxed), 0);
        assert_eq!(p0.take_rings(), 1);
        p1.sleeping.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            p1.user_polled();
        }
        assert!(p1.user_driving());
        assert_eq!(p1.take_rings(), 0);
        assert_eq!(p0.take_rings(), 0);
        // Back to the first: the second is handed back the same way.
        p0.user_polled();
        assert_eq!(p1.user_until.load(Ordering::Relaxed), 0);
        assert_eq!(p1.take_rings(), 1);
    }

    #[test]
    fn arming_a_cq_hands_progress_to_the_progress_thread() {
        let p = Arc::new(Progress::new().unwrap());
        std::thread::sleep(DRIVE_GAP * 4);
        // An application polls in a tight loop: it drives progress for a while.
        let now = p.nanos(Instant::now());
        p.last_user_poll.store(now, Ordering::Relaxed);
        p.user_until.store(now + 1_000_000_000, Ordering::Relaxed);
        // It arms a CQ to sleep on the channel: the window ends at once...
        p.user_idle();
        assert_eq!(p.user_until.load(Ordering::Relaxed), 0);
        assert_eq!(p.last_user_poll.load(Ordering::Relaxed), 0);
        // ...and the poll that drains the CQ once more after arming opens no new one
        // (a poll counts as driving only if the previous one was < DRIVE_GAP before).
        p.user_drive();
        assert_eq!(p.user_until.load(Ordering::Relaxed), 0);
        // The progress thread sleeps on the doorbell for the grace period after a window
        // ends: a CQ armed meanwhile wakes it; one armed after that has nobody to wake.
        p.sleeping.store(true, Ordering::SeqCst);
        p.take_rings();
        // (The engine's clock starts at its creation: let it pass two grace periods.)
        std::thread::sleep(p.grace * 3);
        let now = p.nanos(Instant::now());
        p.user_until
            .store(now - p.grace.as_nanos() as u64 / 2, Ordering::Relaxed);
        p.user_idle();
        assert_eq!(p.take_rings(), 1);
        p.user_until
            .store(now - 2 * p.grace.as_nanos() as u64, Ordering::Relaxed);
        p.user_idle();
        assert_eq!(p.take_rings(), 0);
    }
}
