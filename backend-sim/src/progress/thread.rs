//! The progress thread: its loop (spin after work, then block on the connections, the
//! doorbell and the next timer), and what it runs each turn: ready connections, queued
//! transmits, due timers, and keeping the epoll set in line with how it waits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bell::BELL;
use super::clock::Stamp;
use super::poller::DIRECT_MAX;
use super::window::{ON_PROGRESS_THREAD, USER_WINDOW};
use super::{Mode, Progress, MAX_SPIN};

use crate::cpu_share::{self, ShareWatch};
use crate::epoll::wait_on;
use crate::qp::Conn;

/// The count of doorbell sleeps in a row that [`Progress::nap`] doubles its nap for (a
/// window times 2^15 is far beyond any grace period).
const MAX_NAPS: u32 = 16;

/// How long the progress thread sleeps on the doorbell alone when the connections that
/// woke it were all held by another thread (an application thread servicing them). The
/// epoll set reports a readable socket until it is read, so blocking on it again returns
/// at once: the progress thread would spin on a lock it cannot take, and on a machine
/// with no idle CPU it takes the CPU from the very thread that holds the lock (often one
/// preempted inside the connection), which then finishes only when the scheduler
/// preempts the spinner, milliseconds later. The holder sees the `pending` flag the
/// failed attempt set and goes around again, reading what arrived (a post that only
/// transmits leaves it for its thread's next poll, or for this thread after the nap); a
/// short sleep lets it run, and frees the CPU for the kernel to move it there.
pub(crate) const HELD_NAP: Duration = super::window::DRIVE_GAP;

thread_local! {
    /// The connections over rings with news that [`Progress::peek_rings`] services.
    static RING_NEWS: std::cell::Cell<Vec<Arc<Conn>>> = const { std::cell::Cell::new(Vec::new()) };
}

/// What [`Progress::settle`] last arranged (progress thread state).
#[derive(Default)]
pub(super) struct Settled {
    direct: Option<bool>,
    generation: u64,
}

impl Progress {
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
        let mut due = Vec::new();
        let mut share = ShareWatch::default();
        // The rings armed for a wait (see `ring_wire::arm_before_sleep`).
        let mut armed = Vec::new();
        // Whether the last turn was a spinning one (so a block now ends a spin window).
        let mut spun_last = false;
        // Doorbell sleeps in a row that ended with an application thread still driving.
        let mut naps = 0u32;
        // The last turn found connections with news held by another thread, and did
        // nothing (see `HELD_NAP`).
        let mut held = false;
        // The last turn signalled a completion channel (see below; tests count the spins
        // after one).
        #[cfg(test)]
        let mut signalled_last = false;
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            // (Converted once: the loop compares it with the driving window up to three
            // times.)
            let now_ns = self.clock.nanos(now);
            let user_until = self.window.until.load(Ordering::Relaxed);
            let user_driving = user_until > now_ns;
            // Threads blocked in `ibv_get_cq_event` watch the connections themselves
            // (see `waiter`): this one stands aside as it does for a driving thread,
            // but runs the work left for it at once (nobody polls).
            let waited_on = self.waiters.any();
            let aside = user_driving || waited_on;
            // Spin (poll without blocking) for a while after doing work, unless an
            // application thread is driving progress itself: one spinner is enough.
            let spinning = now < spin_until && !aside;
            #[cfg(test)]
            if spinning && signalled_last {
                self.spun_after_signal.fetch_add(1, Ordering::Relaxed);
            }
            let timeout = if spinning {
                Some(Duration::ZERO)
            } else {
                self.bell.bounded.store(aside, Ordering::Relaxed);
                self.bell.sleeping.store(true, Ordering::SeqCst);
                // An application thread that stopped driving (armed a CQ or moved to
                // another device: `user_idle`) after `user_until` was read above found
                // `sleeping` still false and did not ring: without this second look the
                // thread would sleep through the window and grace period it computed
                // from the stale value. (Both sides: a SeqCst write, then a SeqCst read
                // of the other's flag, so at least one of them sees the other.)
                // Likewise a thread that started driving meanwhile (`user_active`).
                let until = self.window.until.load(Ordering::SeqCst);
                let stopped = user_driving && until == 0;
                let started = !user_driving && until > now_ns;
                // Work queued between the last check and now must not wait for a bell,
                // unless an application thread drives: its next poll runs it (posters
                // do not ring while it does, see `schedule`).
                if stopped || started || !user_driving && (self.ready.pending() || self.acks.any()) {
                    Some(Duration::ZERO)
                } else {
                    let mut left = self.timers.left(now);
                    if let Some(h) = self.held.due_in(now_ns) {
                        left = Some(left.map_or(h, |l| l.min(h)));
                    }
                    if aside {
                        // Take over when the application stops driving, plus a nap
                        // that doubles each time the thread wakes to find it still
                        // driving, up to the grace period: a thread that drives for
                        // long costs a wake-up (tens of µs on small VMs) only every
                        // grace period, and one that drives in short bursts and then
                        // waits elsewhere (spinning on memory for a peer's WRITE) has
                        // its connections watched soon after its last poll.
                        // (At most one window ahead while a driving thread writes.)
                        // Beside waiters alone, a window's time: when the last one
                        // leaves, the thread looks at the connections within it.
                        let ahead = if user_driving {
                            Duration::from_nanos(user_until - now_ns)
                        } else {
                            USER_WINDOW
                        };
                        let window = ahead.min(USER_WINDOW) + self.nap(naps);
                        left = Some(left.map_or(window, |l| l.min(window)));
                    }
                    left
                }
            };
            // While applications drive, sleep on the doorbell alone: waking for every
            // packet they handle themselves would only take CPU from them.
            let bell_only = aside && !spinning;
            // Likewise, for a while, when the connections with news were all held.
            let held_nap = held && !spinning && !bell_only;
            let timeout = if held_nap {
                Some(timeout.map_or(HELD_NAP, |t| t.min(HELD_NAP)))
            } else {
                timeout
            };
            let mut held_now = false;
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
                    let set = if bell_only || held_nap {
                        &self.bell.only
                    } else {
                        &self.poller.epfd
                    };
                    // About to block on the connections: their rings say so first, and
                    // one that has news already ends the wait at once.
                    let timeout = if !bell_only
                        && !held_nap
                        && timeout != Some(Duration::ZERO)
                        && self.poller.arm_rings(&mut armed)
                    {
                        Some(Duration::ZERO)
                    } else {
                        timeout
                    };
                    let m = wait_on(set, &mut events, timeout);
                    // (Taken off the rings' counts.)
                    armed.clear();
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
            self.bell.sleeping.store(false, Ordering::SeqCst);
            for ev in &events[..n] {
                if ev.u64 == BELL {
                    self.bell.take_rings();
                } else if let Some(c) = self.poller.get(ev.u64) {
                    super::ring_wire::note_readable(&c);
                    work |= self.service_noting_held(&c, &mut held_now);
                }
            }
            if peeked.is_none() && !bell_only && !held_nap {
                work |= self.peek_rings(Mode::Full, &mut held_now);
            }
            // Woken from the doorbell while an application thread still drives (it polled
            // again since this thread went to sleep): what it left is for its next poll,
            // which comes within the window; taking it here would only make this a third
            // busy thread beside the application's. Due timers still run. Unless it has
            // been inside one connection since before the grace period: then the others
            // get a round here (the one it is in is skipped, its I/O lock being held).
            let still_driving =
                bell_only && self.user_driving() && !self.window.long_stay(self.clock.now_ns());
            // The connections are still the waiters' (the work left for this thread is
            // not: it runs below unless a thread drives).
            let still_aside = still_driving || bell_only && self.waiters.any();
            if bell_only {
                naps = if still_aside { (naps + 1).min(MAX_NAPS) } else { 0 };
            }
            if bell_only && !still_aside {
                // Woken by the bell or the end of the window: connections may have data
                // that no application thread picked up.
                match self.peek_few(Mode::Full, None) {
                    Some(w) => work |= w,
                    None => {
                        let m = wait_on(&self.poller.epfd, &mut events, Some(Duration::ZERO));
                        for ev in &events[..m] {
                            if ev.u64 != BELL {
                                if let Some(c) = self.poller.get(ev.u64) {
                                    super::ring_wire::note_readable(&c);
                                    work |= self.service_noting_held(&c, &mut held_now);
                                }
                            }
                        }
                        work |= self.peek_rings(Mode::Full, &mut held_now);
                    }
                }
            }
            if !still_driving {
                work |= self.flush_acks();
                work |= self.run_ready();
            }
            // A spinning turn's clock is fresh enough for its timers (a timer that came
            // due during the turn runs in the next, which follows at once); a turn that
            // may have slept reads it again.
            work |= self.run_timers_at(if spinning { now } else { Instant::now() });
            work |= self.release_held(&mut due);
            if work {
                let t = Instant::now();
                let gap = t.saturating_duration_since(last_work);
                last_work = t;
                gap_ewma = (gap_ewma * 3 + gap) / 4;
                spin_until = t + (gap_ewma * 2).clamp(self.spin, MAX_SPIN.max(self.spin));
            } else if spinning && n == 0 {
                std::hint::spin_loop();
            }
            // The turn woke a thread waiting on a completion channel (it blocks in
            // `ibv_get_cq_event`, or polls the descriptor): block now instead of
            // spinning. That thread needs a CPU to take the event and post what comes
            // next, and on a host without an idle one a spinning progress thread holds
            // the CPU it would run on (the scheduler places a woken thread beside its
            // waker) until the spin window ends: each event then costs a spin window
            // where a blocking wake-up costs microseconds. What the woken thread causes
            // (the peer's answer) wakes this thread through the epoll set.
            let signalled = crate::channel_signal::take_signalled();
            if signalled {
                spin_until = now;
            }
            #[cfg(test)]
            {
                signalled_last = signalled;
            }
            spun_last = spinning;
            held = held_now && !work;
        }
    }

    /// [`Progress::service`] on the progress thread, noting in `held` a connection it
    /// could not service because another thread held it.
    fn service_noting_held(&self, conn: &Arc<Conn>, held: &mut bool) -> bool {
        let did = self.service(conn);
        if !did && conn.io.is_locked() {
            *held = true;
            #[cfg(test)]
            self.held_seen.fetch_add(1, Ordering::Relaxed);
        }
        did
    }

    /// Sends the ACKs whose wait for an answer ended (see `answer`), and forgets the
    /// entries of those that left; whether any was sent. `due`: an empty list to use.
    fn release_held(&self, due: &mut Vec<Arc<Conn>>) -> bool {
        if self.held.next() == u64::MAX {
            return false;
        }
        // (A clock of its own: the turn's was read before its sleep, which a deadline
        // may have ended.)
        self.held.take_due(self.clock.now_ns(), due);
        let any = !due.is_empty();
        for c in due.drain(..) {
            self.service(&c);
        }
        any
    }

    /// How long past the driving window's end a progress thread sleeps on the doorbell
    /// after `naps` sleeps in a row found an application thread still driving: none at
    /// first, then a window, doubling up to the grace period.
    pub(super) fn nap(&self, naps: u32) -> Duration {
        match naps {
            0 => Duration::ZERO,
            n => (USER_WINDOW * (1 << (n - 1).min(MAX_NAPS))).min(self.window.grace),
        }
    }

    pub(super) fn run_ready(&self) -> bool {
        // A plain look first, as a poll's: a spinning turn usually finds nothing queued,
        // and the queue's lock is taken only when something may be. (A push that the look
        // misses is seen by the next turn; a thread about to sleep looks once more.)
        if !self.ready.pending() {
            return false;
        }
        let mut work = false;
        while let Some(qp) = self.ready.pop() {
            let conn = qp.inner.lock().conn.clone();
            match conn {
                Some(c) => work |= self.service(&c),
                None => qp.req_wake.notify_one(),
            }
        }
        work
    }

    pub(super) fn run_timers(&self) -> bool {
        self.run_timers_at(Instant::now())
    }

    /// [`Progress::run_timers`] with the clock `now` the caller has just read.
    fn run_timers_at(&self, now: Instant) -> bool {
        if !self.timers.due(self.clock.nanos(now)) {
            return false;
        }
        let mut work = false;
        loop {
            let Some((at, qp)) = self.timers.pop_due(now, &self.clock) else {
                break;
            };
            let Some(qp) = qp.upgrade() else { continue };
            work = true;
            let (fired, conns) = {
                let mut g = qp.inner.lock();
                if g.timer_at == Some(at) {
                    g.timer_at = None;
                }
                let at = |t: &AtomicU64| match t.load(Ordering::Relaxed) {
                    0 => None,
                    ns => Some(self.clock.instant(ns)),
                };
                let last_tx = g.conn.as_ref().and_then(|c| at(&c.last_tx));
                // The peer's bytes that wait on this side may hold the answer: an HCA
                // takes packets in as they arrive, so for the ACK timer they arrive now.
                // (Looked at only when a timeout is due: a system call.)
                let last_rx = match g.conn.as_ref() {
                    Some(c) if g.qp.ack_deadline_passed(now) && c.peer_bytes_waiting() => Some(now),
                    Some(c) => at(&c.last_rx),
                    None => None,
                };
                let fired = g.qp.handle_timeout(now, last_tx, last_rx).unwrap_or_else(|_| {
                    qp.enter_error(&mut g);
                    true
                });
                // A resend through a port that is down, where that fails (rxe).
                let fired = fired && !qp.fails_for_port(&mut g);
                qp.dev.counters.add_ack_timeouts(g.qp.take_ack_timeouts());
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

    /// Brings every connection's registration in line with what the progress thread is
    /// about to do: `direct` (spin over them, or sleep on the doorbell while application
    /// threads drive) takes them out of the epoll set when there are at most
    /// [`DIRECT_MAX`]; anything else (blocking on the set, or too many to read
    /// directly) puts them in. Does nothing when neither the wish nor the set of
    /// connections changed since the last call.
    pub(super) fn settle(&self, direct: bool, st: &mut Settled, scratch: &mut Vec<Arc<Conn>>) {
        // SeqCst: `activate` bumps it, then reads `sleeping`; this thread stored
        // `sleeping` before, so one of the two sees the other.
        let generation = self.poller.generation.load(Ordering::SeqCst);
        if st.direct == Some(direct) && st.generation == generation {
            return;
        }
        scratch.clear();
        self.poller.all_into(scratch);
        let armed = !direct || scratch.len() > DIRECT_MAX;
        for c in scratch.iter() {
            if armed {
                if let Err(e) = self.poller.arm(c) {
                    tracing::warn!(qpn = c.qp.qpn, "cannot watch the connection: {e}");
                    self.lost(c, "epoll_ctl failed");
                }
            } else {
                self.poller.disarm(c);
            }
        }
        scratch.clear();
        *st = Settled {
            direct: Some(direct),
            generation,
        };
    }

    /// Services the connections over rings that have news, which a look at the epoll
    /// set does not report while their readers do not sleep (see `ring_wire`); notes in
    /// `held` one another thread held. Whether any did work.
    pub(super) fn peek_rings(&self, mode: Mode, held: &mut bool) -> bool {
        // The thread's list, kept with its capacity: the data path allocates nothing
        // once warm (a nested call, if any, starts from an empty one).
        let mut news = RING_NEWS.take();
        self.poller.rings_with_news(&mut news);
        let mut work = false;
        for c in news.drain(..) {
            let did = self.service_inner(&c, mode, true, None);
            if !did && c.io.is_locked() {
                *held = true;
            }
            work |= did;
        }
        RING_NEWS.set(news);
        work
    }

    /// With at most [`DIRECT_MAX`] connections, reads each of them directly (and
    /// services those that had news); `None` with more. Reading a socket is one syscall
    /// per connection and spin, like asking epoll, but when bytes have arrived it saves
    /// the second one (epoll, then read): a read that finds nothing returns at once.
    /// `clock`: the caller's, read just before, for the first connection's round (the
    /// others may follow a long write, and read their own).
    pub(super) fn peek_few(&self, mode: Mode, mut clock: Option<Stamp>) -> Option<bool> {
        let mut direct: [Option<Arc<Conn>>; DIRECT_MAX] = Default::default();
        // (Connections over rings with nothing new are passed over under the table's
        // lock: see `quiet_look`.)
        if !self.poller.few_into(&mut direct, |c| self.quiet_look(c)) {
            return None;
        }
        let mut work = false;
        for c in direct.iter().flatten() {
            work |= self.service_inner(c, mode, true, clock.take());
        }
        Some(work)
    }
}
