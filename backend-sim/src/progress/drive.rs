//! What application threads do to the data path: a post transmits (or queues) its WRs, a
//! poll of an empty CQ drives receive progress, arming a CQ hands progress back to the
//! progress thread; and the timer and transmit queues they feed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bell::BELL;
use super::window::{
    ON_PROGRESS_THREAD, POLLED, POLLED_AT, POSTS_SINCE_POLL, QUEUED_SINCE_POLL, STREAM_FLUSH,
};
use super::{Mode, Progress};
use crate::epoll::wait_on;
use crate::qp::{Conn, QpInner, QpShared};

impl Progress {
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
    ///
    /// WRs posted to a busy connection leave at once too when the thread has left
    /// [`STREAM_FLUSH`] bytes (`bytes`: this post's payload) queued since its last poll
    /// or transmit, as an HCA starts on a WQE when its doorbell rings: a thread that
    /// copies each message into a ring before it posts it (rsockets) polls only when its
    /// ring is full, and the peer would otherwise get nothing until then, and then the
    /// whole ring at once, while this thread waits for the credits the peer returns only
    /// once it has taken the data: the two ends would take turns instead of overlapping.
    pub fn kick(&self, qp: &Arc<QpShared>, conn: &Arc<Conn>, idle: bool, wrs: usize, bytes: u64) {
        // The application answers on this connection: an ACK may wait for its next
        // post (see `answer`).
        if !conn.answers.load(Ordering::Relaxed) {
            conn.answers.store(true, Ordering::Relaxed);
        }
        let now = self.clock.stamp();
        let driving = self.window.posted(now.ns, &self.bell);
        let burst = POSTS_SINCE_POLL.replace(POSTS_SINCE_POLL.get().saturating_add(1)) > 0;
        let join = idle && wrs == 1 && burst && driving && self.busy_send_queues() > 1;
        if join {
            self.joined.fetch_add(1, Ordering::Relaxed);
        }
        let queued = QUEUED_SINCE_POLL.get().saturating_add(bytes);
        let stream = !idle && queued >= STREAM_FLUSH;
        if ((idle && !join) || stream) && self.service_inner(conn, Mode::Transmit, false, Some(now)) {
            if stream {
                QUEUED_SINCE_POLL.set(0);
            }
            self.flush_acks();
            return;
        }
        QUEUED_SINCE_POLL.set(queued);
        self.schedule(qp);
    }

    /// Queues `qp` to transmit its send queue: for the next poll of an application
    /// thread that drives progress, else for the progress thread (woken if asleep).
    pub fn schedule(&self, qp: &Arc<QpShared>) {
        // While an application thread drives, its next poll (within DRIVE_GAP) runs the
        // queue; waking the progress thread too would only have two threads fight over
        // the connections. If it stops polling without arming a CQ, the progress thread
        // takes over when the window and grace period end.
        if self.ready.push(qp) {
            if !self.user_driving() && self.bell.asleep() {
                self.bell.ring();
            } else {
                self.wake_for_left_work();
            }
        }
    }

    /// Whether an application thread drives progress now.
    pub(super) fn user_driving(&self) -> bool {
        self.window.driving(self.clock.now_ns())
    }

    /// Schedules a timer check of `qp` at `at`.
    pub fn arm_timer(&self, qp: &Arc<QpShared>, at: Instant) {
        if self.timers.push(qp, at, &self.clock) && self.bell.asleep() {
            self.bell.ring();
        }
    }

    /// Pushes the requester's next deadline to the timer heap if it is new.
    pub fn rearm(&self, qp: &Arc<QpShared>, g: &mut QpInner) {
        if let Some(at) = g.qp.poll_timeout() {
            if g.timer_at.is_none_or(|t| at < t) {
                g.timer_at = Some(at);
                self.arm_timer(qp, at);
            }
        }
    }

    /// Writes the ACKs left for later (an application thread's next poll or post, or
    /// the progress thread when no application drives). Returns whether any was owed.
    #[inline]
    pub fn flush_acks(&self) -> bool {
        // A plain load, inlined in the callers: this runs on every poll and post, and
        // usually finds nothing owed (a ping-pong's ACK leaves with its next request).
        self.acks.any() && self.flush_owed_acks()
    }

    /// [`Progress::flush_acks`] when some connection owes an ACK: the connections that
    /// owe one are serviced once the list's lock is released.
    #[inline(never)]
    fn flush_owed_acks(&self) -> bool {
        let Some(owed) = self.acks.take_owed() else {
            return false;
        };
        for c in &owed {
            self.service_as(c, Mode::Transmit);
        }
        self.acks.give_back(owed);
        true
    }

    /// Receive progress from an application thread whose CQ was empty: one
    /// non-blocking look at the epoll set, plus due timers and queued transmits.
    pub fn user_drive(self: &Arc<Self>) {
        self.user_here();
        // Only a thread that polls in a tight loop counts as driving (and lets the
        // progress thread sleep); an occasional poll between naps does not.
        let clock = self.clock.stamp();
        let now = clock.ns;
        if self.links.should_yield(now) {
            // The device's setup thread may need this CPU (see `setup_yield`).
            std::thread::yield_now();
        }
        self.window.active(now, &self.bell);
        self.flush_acks();
        if self.peek_few(Mode::User, Some(clock)).is_none() {
            let mut events = [libc::epoll_event { events: 0, u64: 0 }; 16];
            let n = wait_on(&self.poller.epfd, &mut events, Some(Duration::ZERO));
            let mut given = Some(clock);
            for ev in &events[..n] {
                if ev.u64 != BELL {
                    if let Some(c) = self.poller.get(ev.u64) {
                        super::ring_wire::note_readable(&c);
                        self.service_inner(&c, Mode::User, false, given.take());
                    }
                }
            }
            self.peek_rings(Mode::User, &mut false);
        }
        if let Some(side) = self.side.get().and_then(std::sync::Weak::upgrade) {
            side.read_now();
        }
        // A timer is checked against the clock read above: at most one poll late.
        if self.timers.due(now) {
            self.run_timers();
        }
        if self.ready.pending() {
            self.run_ready();
        }
    }

    /// An application thread's poll found completions: it counts towards driving as an
    /// empty one does (a loop whose polls always find some still polls in a tight loop).
    pub fn user_polled(self: &Arc<Self>) {
        self.user_here();
        self.window.active(self.clock.now_ns(), &self.bell);
    }

    /// An application thread polls a CQ of this device. If the last device it polled
    /// was another one, it no longer drives that one: tell it now, as if the thread had
    /// armed a CQ there ([`Progress::user_idle`]), so its progress thread takes over at
    /// once instead of after the driving window and the grace period. A thread that
    /// alternates between the CQs of two devices (a test with both ends in one
    /// process) would otherwise leave each device's incoming requests waiting for that
    /// grace period, about 2 ms, while it polls the other one. One thread-local
    /// comparison per poll while it stays on one device.
    pub(super) fn user_here(self: &Arc<Self>) {
        POSTS_SINCE_POLL.set(0);
        QUEUED_SINCE_POLL.set(0);
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

    /// An application thread is about to sleep on a completion channel (it armed a CQ):
    /// it no longer drives progress, so the progress thread must take over at once
    /// rather than after the grace period, and the thread's next poll does not start a
    /// new driving window.
    pub fn user_idle(&self) {
        self.window.idle(&self.clock, &self.bell);
    }

    /// The calling application thread is about to block until a completion channel
    /// has an event: the device it polled last must not count on it to drive progress.
    /// A program that arms its receive CQ, then busy-polls its send CQ (perftest's
    /// `-e` does), then blocks on the channel, would else leave the answer it waits for
    /// unread for the driving window and the grace period after it (about 2 ms), since
    /// those polls opened a window after the arming closed one.
    /// `waits_here`: the device whose connections the thread watches while it waits
    /// (see `waiter`), which is not woken for that.
    pub fn thread_blocks_on(waits_here: Option<&Arc<Progress>>) {
        if ON_PROGRESS_THREAD.get() {
            return;
        }
        if let Some(dev) = POLLED.with(|last| last.borrow().upgrade()) {
            if waits_here.is_some_and(|w| Arc::ptr_eq(w, &dev)) {
                dev.user_idle_quietly();
            } else {
                dev.user_idle();
            }
        }
    }

    /// [`Progress::user_idle`] for a thread about to watch the device's connections
    /// itself while it waits on a channel (see `waiter`): the progress thread is not
    /// woken to take over.
    pub fn user_idle_quietly(&self) {
        self.window.close_quietly();
    }

    /// The calling application thread turns to the connection manager: it has left the
    /// data path of the device it polled last. As [`Progress::thread_blocks`], and the
    /// ACKs it left for its next poll or post leave now, from this thread: the message
    /// they acknowledge is what the peer waited for before its own next step, and the
    /// thread's next step is a connection's (see `rdmacm::leave_data_path`). An ACK
    /// handed to the progress thread would leave only once that thread runs, which on a
    /// loaded host can be well after this thread's request reached the peer.
    pub fn thread_leaves() {
        if ON_PROGRESS_THREAD.get() {
            return;
        }
        if let Some(dev) = POLLED.with(|last| last.borrow().upgrade()) {
            dev.user_idle();
            dev.flush_acks();
        }
    }

    /// A thread is about to block on a completion channel of this device, which has no
    /// event for it (`has_event`, asked after a hold was seen): the ACKs held for an
    /// answer (see `answer`) leave now, each on its own. Their events were signalled
    /// before their holds started, and taken, by this thread or another: whichever
    /// would have answered sleeps instead, or has answered elsewhere.
    pub fn waiter_blocks(&self, has_event: impl FnOnce() -> bool) {
        if !self.held.any() || has_event() {
            return;
        }
        let due = self.held.take_all();
        for c in &due {
            self.service_as(c, Mode::Transmit);
        }
        self.held.give_back(due);
    }

    /// `conn` owes an ACK left for later: for this thread's next poll or post, else for
    /// the progress thread once the driving window and grace period end. That hand-over
    /// holds while the progress thread sleeps with a bound (it saw the window open); one
    /// asleep without a bound is woken here (see [`Progress::wake_for_left_work`]).
    pub(crate) fn owe_ack(&self, conn: &Arc<Conn>) {
        if self.acks.owe(conn) {
            self.wake_for_left_work();
        }
    }

    /// Work was left for later (an ACK owed, a transmit queued) by a thread that drives,
    /// or believes it does: wakes the progress thread if it sleeps without a bound. A
    /// driving thread extends the window without ringing when it finds it open, by the
    /// clock it read at the start of its poll; preempted between that read and the
    /// extension, it can find open a window that the progress thread, meanwhile, saw
    /// closed before it went to sleep on the connections with no end to its sleep. The
    /// driving thread's service then takes the connection's bytes (the packets' wake-up
    /// finds nothing to read), and what it leaves would wait for the next packet or
    /// timer, for ever if none comes (a last ACK owed to a peer that waits for it). The
    /// work's SeqCst store, then this SeqCst look, pair with the progress thread's
    /// `sleeping` store and its look at the work before it sleeps.
    fn wake_for_left_work(&self) {
        if self.bell.asleep_unbounded() {
            self.bell.ring();
        }
    }
}
