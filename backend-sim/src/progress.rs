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
//!   itself (then one spinner per process is enough), and then blocks.
//! - **Application threads**: `post_send` on an idle connection builds and writes the
//!   frames itself (one `sendmsg`); with requests already in flight it queues the QP for
//!   the progress thread, which batches many WQEs per `sendmsg`. `poll_cq` on an empty CQ
//!   polls the epoll set once (`epoll_wait` with no timeout) and services what is ready.
//! - A connection is serviced by whichever thread holds its I/O lock; others skip it, and
//!   level-triggered readiness makes sure nothing is left behind.
//! - Lock order: a connection's I/O lock, then its QP's lock. No lock is held while a
//!   thread sleeps; syscalls under the I/O lock never block (non-blocking sockets).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use verbs_api::QpState;

use crate::engine::{drive_requester, drive_responder, Stop};
use crate::faults::{BreakPoint, FaultCounters};
use crate::qp::{QpInner, QpShared};
use crate::rx::Reader;
use crate::tx::TxQueue;

/// Stop reading requests while this many reply bytes wait to be written.
const TX_HIGH: usize = 4 << 20;
/// WQEs turned into frames per pass.
const BUDGET: usize = 128;
/// Token of the doorbell in the epoll set.
const BELL: u64 = u64::MAX;
/// Default spin window.
const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// Which half of a QP a connection serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// This side's requester: sends requests, reads responses.
    Requester,
    /// This side's responder: reads requests, sends responses.
    Responder,
}

struct ConnIo {
    reader: Reader,
    tx: TxQueue,
    read_psn: Option<u32>,
    /// The epoll interest currently registered.
    interest: u32,
}

/// One established TCP connection of a QP.
pub struct Conn {
    token: u64,
    /// Which half of the QP it serves.
    pub dir: Dir,
    qp: Arc<QpShared>,
    epoch: u64,
    gen: u64,
    sock: TcpStream,
    io: Mutex<ConnIo>,
    closed: AtomicBool,
}

impl Conn {
    /// Whether the connection has been closed.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
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

/// What [`Progress::process`] did.
enum Processed {
    Ok,
    /// The connection was closed.
    Closed,
    /// Fault injection: break the connection at this point of the request just built.
    Break(BreakPoint),
}

/// The progress engine of one device.
pub struct Progress {
    epfd: OwnedFd,
    bell: OwnedFd,
    /// Set while the progress thread blocks (or is about to): posters ring the bell.
    sleeping: AtomicBool,
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_token: AtomicU64,
    ready: Mutex<VecDeque<Arc<QpShared>>>,
    timers: Mutex<BinaryHeap<Reverse<TimerEntry>>>,
    base: Instant,
    /// Nanoseconds since `base` until which an application thread counts as driving.
    user_until: AtomicU64,
    spin: Duration,
    /// Consecutive empty polls by application threads (rate limiting).
    idle_polls: AtomicU32,
    /// Faults that fired on this device.
    pub counters: FaultCounters,
}

fn os(call: &'static str) -> impl FnOnce(io::Error) -> verbs_api::Error {
    move |source| verbs_api::Error::Os { call, source }
}

impl Progress {
    /// A new engine (no thread yet; see [`Progress::run`]).
    pub fn new() -> verbs_api::Result<Progress> {
        // SAFETY: plain syscalls; results checked before use.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(os("epoll_create1")(io::Error::last_os_error()));
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let epfd = unsafe { OwnedFd::from_raw_fd(epfd) };
        // SAFETY: as above.
        let bell = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if bell < 0 {
            return Err(os("eventfd")(io::Error::last_os_error()));
        }
        // SAFETY: as above.
        let bell = unsafe { OwnedFd::from_raw_fd(bell) };
        let spin = std::env::var("RDMA_SIM_SPIN_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_micros)
            .unwrap_or(DEFAULT_SPIN);
        let p = Progress {
            epfd,
            bell,
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            ready: Mutex::new(VecDeque::new()),
            timers: Mutex::new(BinaryHeap::new()),
            base: Instant::now(),
            user_until: AtomicU64::new(0),
            spin,
            idle_polls: AtomicU32::new(0),
            counters: FaultCounters::default(),
        };
        p.ctl(
            libc::EPOLL_CTL_ADD,
            p.bell.as_raw_fd(),
            libc::EPOLLIN as u32,
            BELL,
        )
        .map_err(os("epoll_ctl"))?;
        Ok(p)
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a valid epoll_event; both descriptors are open.
        let r = unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, fd, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
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

    /// Takes over an established connection of `qp` (set up by the transport).
    pub fn register(
        &self,
        qp: &Arc<QpShared>,
        dir: Dir,
        epoch: u64,
        gen: u64,
        sock: TcpStream,
        reader: Reader,
    ) -> io::Result<Arc<Conn>> {
        sock.set_nonblocking(true)?;
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            token,
            dir,
            qp: qp.clone(),
            epoch,
            gen,
            sock,
            io: Mutex::new(ConnIo {
                reader,
                tx: TxQueue::new(),
                read_psn: None,
                interest: libc::EPOLLIN as u32,
            }),
            closed: AtomicBool::new(false),
        });
        self.conns.lock().insert(token, conn.clone());
        if let Err(e) = self.ctl(
            libc::EPOLL_CTL_ADD,
            conn.sock.as_raw_fd(),
            libc::EPOLLIN as u32,
            token,
        ) {
            self.conns.lock().remove(&token);
            return Err(e);
        }
        Ok(conn)
    }

    /// Closes a connection: no thread services it afterwards.
    pub fn close(&self, conn: &Conn) {
        if conn.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.ctl(libc::EPOLL_CTL_DEL, conn.sock.as_raw_fd(), 0, conn.token);
        let _ = conn.sock.shutdown(std::net::Shutdown::Both);
        self.conns.lock().remove(&conn.token);
    }

    /// Schedules a timer check of `qp` at `at` (its requester's next deadline).
    pub fn arm_timer(&self, qp: &Arc<QpShared>, at: Instant) {
        let earliest = {
            let mut t = self.timers.lock();
            t.push(Reverse(TimerEntry {
                at,
                qp: Arc::downgrade(qp),
            }));
            t.peek().map(|e| e.0.at) == Some(at)
        };
        if earliest && self.sleeping.load(Ordering::Acquire) {
            self.ring();
        }
    }

    /// Queues `qp` for the progress thread to transmit its send queue.
    pub fn schedule(&self, qp: &Arc<QpShared>) {
        if !qp.tx_queued.swap(true, Ordering::AcqRel) {
            self.ready.lock().push_back(qp.clone());
            if self.sleeping.load(Ordering::Acquire) {
                self.ring();
            }
        }
    }

    /// After `post_send`: transmit now on this thread if the connection is idle (the
    /// latency path), else leave it to the progress thread (which batches).
    pub fn kick(&self, qp: &Arc<QpShared>, conn: &Arc<Conn>, idle: bool) {
        if idle && self.service(conn) {
            return;
        }
        self.schedule(qp);
    }

    /// Receive progress from an application thread whose CQ was empty: one
    /// non-blocking look at the epoll set.
    pub fn user_drive(&self) {
        self.user_until
            .store(self.nanos(Instant::now() + self.spin), Ordering::Relaxed);
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 16];
        let n = self.wait(&mut events, 0);
        if n == 0 {
            self.idle_polls.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.idle_polls.store(0, Ordering::Relaxed);
        for ev in &events[..n] {
            if ev.u64 != BELL {
                if let Some(c) = self.conn(ev.u64) {
                    self.service(&c);
                }
            }
        }
    }

    fn conn(&self, token: u64) -> Option<Arc<Conn>> {
        self.conns.lock().get(&token).cloned()
    }

    fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> usize {
        // SAFETY: `events` is a writable array of `events.len()` epoll_events.
        let n = unsafe {
            libc::epoll_wait(
                self.epfd.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout_ms,
            )
        };
        n.max(0) as usize
    }

    /// The progress thread's loop; returns when [`Progress::shutdown`] is called.
    pub fn run(&self) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut spin_until = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let user_driving = self.user_until.load(Ordering::Relaxed) > self.nanos(now);
            let timeout_ms = if now < spin_until && !user_driving {
                0
            } else {
                self.sleeping.store(true, Ordering::SeqCst);
                // Work queued between the last check and now must not wait for a bell.
                if !self.ready.lock().is_empty() {
                    0
                } else {
                    match self.timers.lock().peek() {
                        None => -1,
                        Some(e) => {
                            let left = e.0.at.saturating_duration_since(now);
                            // Round up: waking early only costs another loop.
                            left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
                        }
                    }
                }
            };
            let n = self.wait(&mut events, timeout_ms);
            self.sleeping.store(false, Ordering::SeqCst);
            let mut work = false;
            for ev in &events[..n] {
                if ev.u64 == BELL {
                    let mut v: u64 = 0;
                    // SAFETY: reads 8 bytes into a live u64 from our own eventfd.
                    let _ = unsafe { libc::read(self.bell.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
                } else if let Some(c) = self.conn(ev.u64) {
                    work |= self.service(&c);
                }
            }
            work |= self.run_ready();
            work |= self.run_timers();
            if work {
                spin_until = Instant::now() + self.spin;
            } else if timeout_ms == 0 && n == 0 {
                std::hint::spin_loop();
            }
        }
    }

    fn run_ready(&self) -> bool {
        let mut work = false;
        loop {
            let Some(qp) = self.ready.lock().pop_front() else {
                break;
            };
            qp.tx_queued.store(false, Ordering::Release);
            let conn = qp.inner.lock().out_conn.clone();
            match conn {
                Some(c) => work |= self.service(&c),
                None => qp.req_wake.notify_one(),
            }
        }
        work
    }

    fn run_timers(&self) -> bool {
        let now = Instant::now();
        let mut work = false;
        loop {
            let entry = {
                let mut t = self.timers.lock();
                match t.peek() {
                    Some(e) if e.0.at <= now => t.pop().map(|e| e.0),
                    _ => None,
                }
            };
            let Some(e) = entry else { break };
            let Some(qp) = e.qp.upgrade() else { continue };
            work = true;
            let conn = {
                let mut g = qp.inner.lock();
                if g.timer_at == Some(e.at) {
                    g.timer_at = None;
                }
                let (req, _, swc, _) = QpShared::scratch(&mut g);
                if req.on_timer(now, swc).is_err() {
                    qp.enter_error(&mut g);
                }
                qp.deliver(&mut g);
                self.rearm(&qp, &mut g);
                (g.out_conn.clone(), g.in_conn.clone())
            };
            match conn.0 {
                Some(c) => {
                    self.service(&c);
                }
                None => qp.req_wake.notify_one(),
            }
            // A stalled responder or held responses may be due now.
            if let Some(c) = conn.1 {
                self.service(&c);
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
        let Some(mut io) = conn.io.try_lock() else {
            return false;
        };
        if conn.is_closed() {
            return false;
        }
        let fd = conn.sock.as_raw_fd();
        let mut did = false;
        loop {
            let mut progressed = false;
            let faulty = conn.qp.fault_armed.load(Ordering::Acquire) && conn.dir == Dir::Responder;
            let stalled = faulty && self.responder_stalled(conn);
            let reading = !stalled && (conn.dir == Dir::Requester || io.tx.pending() <= TX_HIGH);
            if reading {
                match io.reader.fill(fd) {
                    Ok(0) => {
                        self.lost(conn, "peer closed the connection");
                        return true;
                    }
                    Ok(_) => progressed = true,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => progressed = true,
                    Err(e) => {
                        self.lost(conn, &e.to_string());
                        return true;
                    }
                }
            }
            let mut brk = None;
            if !stalled {
                let ConnIo {
                    reader, tx, read_psn, ..
                } = &mut *io;
                match self.process(conn, reader, tx, read_psn) {
                    Processed::Closed => return true,
                    Processed::Break(p) => brk = Some(p),
                    Processed::Ok => {}
                }
            }
            if let Some(point) = brk {
                self.break_now(conn, &mut io, point);
                return true;
            }
            let hold = faulty && self.responder_hold(conn, io.tx.is_empty());
            if !io.tx.is_empty() && !hold {
                match io.tx.write_to(fd) {
                    Ok(n) => progressed |= n > 0,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => {
                        self.lost(conn, &e.to_string());
                        return true;
                    }
                }
            }
            let want = (if reading { libc::EPOLLIN as u32 } else { 0 })
                | (if io.tx.is_empty() || hold {
                    0
                } else {
                    libc::EPOLLOUT as u32
                });
            if want != io.interest {
                io.interest = want;
                let _ = self.ctl(libc::EPOLL_CTL_MOD, fd, want, conn.token);
            }
            did |= progressed;
            if !progressed {
                break;
            }
        }
        did
    }

    /// Fault injection: whether the responder of `conn` is stalled now.
    fn responder_stalled(&self, conn: &Arc<Conn>) -> bool {
        let now = Instant::now();
        let mut g = conn.qp.inner.lock();
        let stalled = g.faults.stall_until.is_some_and(|t| now < t);
        if !stalled {
            g.faults.stall_until = None;
        }
        stalled
    }

    /// Fault injection: whether the responses queued on `conn` must wait (delay).
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

    /// Hands buffered frames to the QP's state machines and collects what to send.
    /// Returns false if the connection was closed.
    fn process(
        &self,
        conn: &Arc<Conn>,
        reader: &mut Reader,
        tx: &mut TxQueue,
        read_psn: &mut Option<u32>,
    ) -> Processed {
        let qp = &conn.qp;
        let mut g = qp.inner.lock();
        let stale = qp.is_stale(&g, conn.epoch)
            || match conn.dir {
                Dir::Responder => g.inbound_gen != conn.gen,
                Dir::Requester => !g.out_conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)),
            };
        if stale {
            drop(g);
            self.close(conn);
            return Processed::Closed;
        }
        match conn.dir {
            Dir::Responder => loop {
                let accepting = matches!(g.state, QpState::Rtr | QpState::Rts | QpState::Sqd);
                let (_, resp, _, rwc) = QpShared::scratch(&mut g);
                match drive_responder(resp, accepting, reader, &qp.dev.mrs, tx, rwc, TX_HIGH) {
                    Ok(()) => {
                        qp.deliver(&mut g);
                        break;
                    }
                    Err(Stop::Fatal(status)) => {
                        tracing::debug!(qpn = qp.qpn, ?status, "responder error: QP to ERR");
                        qp.enter_error(&mut g);
                    }
                    Err(Stop::Protocol(msg)) => {
                        tracing::warn!(qpn = qp.qpn, "closing connection: {msg}");
                        qp.enter_error(&mut g);
                        drop(g);
                        self.close(conn);
                        return Processed::Closed;
                    }
                }
            },
            Dir::Requester => {
                let now = Instant::now();
                let (req, _, swc, _) = QpShared::scratch(&mut g);
                match drive_requester(req, reader, now, swc, read_psn) {
                    Ok(()) => {}
                    Err(Stop::Fatal(_)) => qp.enter_error(&mut g),
                    Err(Stop::Protocol(msg)) => {
                        tracing::warn!(qpn = qp.qpn, "closing connection: {msg}");
                        qp.enter_error(&mut g);
                    }
                }
                let armed = qp.fault_armed.load(Ordering::Acquire);
                if armed && g.faults.break_at == Some(BreakPoint::BeforeRequest) && g.req.has_unsent() {
                    g.faults.break_at = None;
                    return Processed::Break(BreakPoint::BeforeRequest);
                }
                if g.state == QpState::Rts && tx.pending() < TX_HIGH {
                    let before = tx.pending();
                    let (req, _, swc, _) = QpShared::scratch(&mut g);
                    if req.poll_transmit(&qp.dev.mrs, now, tx, BUDGET, swc).is_err() {
                        qp.enter_error(&mut g);
                    }
                    if armed && tx.pending() > before {
                        if let Some(p) = g.faults.break_at.take() {
                            qp.deliver(&mut g);
                            return Processed::Break(p);
                        }
                    }
                }
                qp.deliver(&mut g);
                self.rearm(qp, &mut g);
                if g.state == QpState::Err && tx.is_empty() {
                    g.out_conn = None;
                    drop(g);
                    self.close(conn);
                    return Processed::Closed;
                }
            }
        }
        Processed::Ok
    }

    fn lost(&self, conn: &Arc<Conn>, why: &str) {
        tracing::debug!(qpn = conn.qp.qpn, dir = ?conn.dir, "connection lost: {why}");
        self.close(conn);
        let qp = &conn.qp;
        let mut g = qp.inner.lock();
        match conn.dir {
            Dir::Requester => {
                if g.out_conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
                    g.out_conn = None;
                    g.req.on_connection_lost();
                    self.rearm(qp, &mut g);
                    drop(g);
                    qp.req_wake.notify_one();
                }
            }
            Dir::Responder => {
                if g.in_conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
                    g.in_conn = None;
                    g.resp.connection_lost();
                }
            }
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
