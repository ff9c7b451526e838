//! A thread blocked in `ibv_get_cq_event` (`man ibv_get_cq_event`) waits on its
//! device's connections itself, and services what arrives.
//!
//! Left to the progress thread, each message that ends such a wait wakes two threads:
//! the progress thread, which reads the socket and signals the channel, and then the
//! waiting thread. A pipe wakes one. So the waiting thread sleeps in `poll(2)` on the
//! channel's descriptor *and* the sockets of the device's connections; a readable (or,
//! with bytes queued for it, writable) socket it services as the progress thread would
//! (a `Full` round: read, process, ACK, complete, signal), and the event the round
//! signals it then takes without sleeping again. The progress thread meanwhile stands
//! aside: it sleeps on its doorbell alone (the sockets are the waiters' to watch), woken
//! by the work other threads leave it (queued transmits, ACKs left for later) and by its
//! timers (ACK timeouts and retries run as ever, and service the connection they concern,
//! which a waiter holds only while it services it), and it looks at the connections
//! again once no thread waits ([`Waiters::count`] is read at every turn; a sleep beside
//! waiters is bounded as one beside a driving thread is). A connection's bytes are taken
//! by whichever thread holds its I/O lock, the others skip it and the `pending` flag
//! sends the holder around again, as between any two threads of the data path: nothing
//! is processed twice, and `poll(2)` is level-triggered, so nothing that arrives while
//! threads change roles is left unread.
//!
//! The descriptor's semantics stay libibverbs': a wait only happens on a blocking
//! descriptor (one made `O_NONBLOCK` answers EAGAIN as before, see `SimChannel`), and a
//! signal ends it with EINTR, or not when the handler restarts, as it would end the
//! `read(2)` libibverbs makes ([`crate::signal_restart`]). Connections that come or go
//! during a wait ring [`Waiters`]' own doorbell, and the waiters look at the device's
//! connections again.

use std::cell::Cell;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rustix::event::{eventfd, EventfdFlags};

use super::thread::HELD_NAP;
use super::Progress;
use crate::cq::ChannelShared;
use crate::qp::Conn;

thread_local! {
    /// Set on a thread while it waits in [`Progress::wait_for_event`].
    static IN_WAIT: Cell<bool> = const { Cell::new(false) };
    /// Set on a thread once it waited on a channel this way: the way it sleeps.
    static WAITS_ON_CHANNELS: Cell<bool> = const { Cell::new(false) };
}

/// The threads that wait on a device's connections in `ibv_get_cq_event`.
pub(super) struct Waiters {
    /// How many wait now: while any does, the progress thread leaves the connections'
    /// readiness to them.
    pub count: AtomicUsize,
    /// Rung when the device's connections change while threads wait.
    bell: OwnedFd,
}

impl Waiters {
    pub fn new() -> verbs_api::Result<Waiters> {
        let bell =
            eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).map_err(|e| verbs_api::Error::Os {
                call: "eventfd",
                source: e.into(),
            })?;
        Ok(Waiters {
            count: AtomicUsize::new(0),
            bell,
        })
    }

    /// Whether threads wait on the connections.
    #[inline]
    pub fn any(&self) -> bool {
        self.count.load(Ordering::SeqCst) != 0
    }

    /// The device's connections changed: threads waiting look at them again.
    pub fn connections_changed(&self) {
        if self.any() {
            let _ = rustix::io::write(&self.bell, &1u64.to_ne_bytes());
        }
    }

    fn take_rings(&self) {
        let mut v = [0u8; 8];
        let _ = rustix::io::read(&self.bell, &mut v);
    }
}

/// Whether the calling thread is waiting in [`Progress::wait_for_event`] (its rounds
/// hold ACKs for its own answer and need not wake the progress thread for them).
#[inline]
pub(super) fn in_wait() -> bool {
    IN_WAIT.get()
}

/// Whether the calling thread waited on a completion channel this way before: arming a
/// CQ then does not wake the progress thread (see `SimCq::req_notify`).
pub fn waits_on_channels() -> bool {
    WAITS_ON_CHANNELS.get()
}

/// Ends a wait: the count and the thread's mark, however the wait ends.
struct Leave<'a>(&'a Progress);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        IN_WAIT.set(false);
        self.0.waiters.count.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Progress {
    /// `ibv_get_cq_event` on a blocking descriptor of `ch`, a channel of this device, that
    /// has no event now: waits for one on the channel and the device's connections,
    /// servicing those that have news (see the module docs). The event's CQ handle, or
    /// EINTR as the `read(2)` of the descriptor would fail.
    pub fn wait_for_event(&self, ch: &ChannelShared) -> verbs_api::Result<u32> {
        WAITS_ON_CHANNELS.set(true);
        IN_WAIT.set(true);
        self.waiters.count.fetch_add(1, Ordering::SeqCst);
        let _leave = Leave(self);
        // The thread drives nothing now: no window of its keeps the progress thread off
        // the work others leave, which it is not there to run.
        self.window.close_quietly();
        let mut conns: Vec<Arc<Conn>> = Vec::new();
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut generation = None;
        let mut held = false;
        // The rings armed for a wait (see `ring_wire::arm_before_sleep`).
        let mut armed = Vec::new();
        // Signals only inside the wait below, so that none is lost between waits.
        let signals = crate::signal_restart::Deferred::new();
        loop {
            if let Some(cq) = ch.try_take() {
                return Ok(cq);
            }
            if ch.has_event() {
                // A count `try_take` cannot take without waiting (a kernel whose eventfd
                // lacks RWF_NOWAIT), or one about to be written: the plain read, with
                // the thread's own signal mask.
                drop(signals);
                return ch.read_event();
            }
            // Work a driving thread left for its next poll: this thread polls no more.
            self.flush_acks();
            if self.ready.pending() {
                self.run_ready();
            }
            let now_gen = self.poller.generation.load(Ordering::SeqCst);
            if generation != Some(now_gen) {
                generation = Some(now_gen);
                conns.clear();
                self.poller.all_into(&mut conns);
            }
            fds.clear();
            fds.push(pollfd(ch.fd(), libc::POLLIN));
            fds.push(pollfd(self.waiters.bell.as_raw_fd(), libc::POLLIN));
            // Right after a round found a connection held by another thread, wait on the
            // channel alone for a while: the holder goes around again for what arrived
            // (see `HELD_NAP`), and the socket would only report the same bytes again.
            if !held {
                for c in &conns {
                    // The events the progress thread would wait for (none while fault
                    // injection stalls the connection: its timer ends the stall).
                    let want = c.ep.lock().interest;
                    let events = if want & libc::EPOLLIN as u32 != 0 {
                        libc::POLLIN
                    } else {
                        0
                    } | if want & libc::EPOLLOUT as u32 != 0 {
                        libc::POLLOUT
                    } else {
                        0
                    };
                    fds.push(pollfd(c.sock.as_raw_fd(), events));
                }
            }
            let nap = libc::timespec {
                tv_sec: 0,
                tv_nsec: HELD_NAP.as_nanos() as libc::c_long,
            };
            let now = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // The connections over rings are armed before the thread sleeps on their
            // sockets (see `ring_wire`): one with news already ends the wait at once.
            let timeout = if held {
                &nap as *const libc::timespec
            } else if super::ring_wire::arm_before_sleep(conns.iter(), &mut armed) {
                &now as *const libc::timespec
            } else {
                std::ptr::null()
            };
            held = false;
            let mask = signals
                .as_ref()
                .map_or(std::ptr::null(), |s| s.mask() as *const libc::sigset_t);
            // SAFETY: `fds` is a live array of `fds.len()` pollfds, `timeout` null or a
            // live timespec, `mask` null (the thread's mask left alone) or the thread's
            // own mask, live in `signals`, which the wait puts in place atomically.
            let n = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout, mask) };
            // (Taken off the rings' counts.)
            armed.clear();
            if n < 0 {
                let e = std::io::Error::last_os_error();
                let restart = match &signals {
                    Some(s) => crate::signal_restart::read_would_restart_under(s.mask()),
                    None => crate::signal_restart::read_would_restart(),
                };
                if e.raw_os_error() == Some(libc::EINTR) && restart {
                    continue;
                }
                return Err(verbs_api::Error::Os {
                    call: "ibv_get_cq_event (wait on the channel's fd)",
                    source: e,
                });
            }
            if fds[1].revents != 0 {
                self.waiters.take_rings();
                generation = None;
            }
            for (c, fd) in conns.iter().zip(&fds[2..]) {
                if fd.revents != 0 {
                    super::ring_wire::note_readable(c);
                } else if !super::ring_wire::has_news(c) {
                    continue;
                }
                if !self.service(c) {
                    if c.is_closed() {
                        generation = None;
                    } else if c.io.is_locked() {
                        held = true;
                    }
                }
            }
        }
    }
}

fn pollfd(fd: std::os::fd::RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}
