//! A device's asynchronous events (`man ibv_get_async_event`) as a backend keeps them: the
//! queue that `ibv_get_async_event` reads, its file descriptor, and the acknowledgements
//! that destroying an object waits for. A building block for backends; applications use
//! [`Context::get_async_event`](crate::Context::get_async_event).
//!
//! The device raises an event ([`EventQueue::raise`]) where the condition arises (an SRQ
//! drained below its limit, a QP on an SRQ went to ERR, a CQ overflowed, ...). The fd is
//! an eventfd in semaphore mode holding one count per queued event, so it polls readable
//! exactly while an event is pending (see [`crate::event_fd`] for who takes the counts).
//! An event taken ([`EventQueue::get`], or [`EventQueue::read`] as libibverbs reads the
//! descriptor) counts against
//! its element until it is acknowledged ([`EventQueue::ack`]); destroying a QP, CQ or SRQ
//! first waits for those acknowledgements ([`EventQueue::forget`]), as libibverbs'
//! `ibv_destroy_*` do, and drops the element's events nobody took. A wait that lasts warns
//! once, naming the element, since the usual cause is an event the application took and
//! never acknowledged.
//!
//! The queue is bounded ([`CAPACITY`]): a device that raises events nobody reads drops
//! the oldest (with a warning) instead of growing without end.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use std::sync::{Condvar, Mutex, MutexGuard};

use crate::error::Result;
use crate::event::{AsyncElement, AsyncEvent};

/// Events kept for a reader at most.
pub const CAPACITY: usize = 4096;

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // The queue's state stays consistent across a panic of another holder (every
    // update is one step), so a poisoned lock is taken over.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long a destroy waits for acknowledgements before it warns.
const WARN_AFTER: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Inner {
    queue: VecDeque<AsyncEvent>,
    /// Events taken and not yet acknowledged, by element.
    unacked: HashMap<AsyncElement, u32>,
    /// Events dropped because the queue was full (warned about once per run of them).
    dropped: u64,
}

/// The asynchronous events of one device.
pub struct EventQueue {
    inner: Mutex<Inner>,
    cv: Condvar,
    efd: OwnedFd,
}

impl EventQueue {
    /// An empty queue with its eventfd.
    pub fn new() -> Result<Self> {
        Ok(EventQueue {
            inner: Mutex::new(Inner::default()),
            cv: Condvar::new(),
            efd: crate::event_fd::new("eventfd (async events)")?,
        })
    }

    /// One count on the eventfd (an event is queued).
    fn signal(&self) {
        crate::event_fd::signal(self.efd.as_fd());
    }

    /// One count off the eventfd (an event left the queue), unless a reader took it.
    fn unsignal(&self) {
        crate::event_fd::take_nowait(self.efd.as_fd());
    }

    /// Queues `ev` for the application.
    pub fn raise(&self, ev: AsyncEvent) {
        tracing::debug!(event = %ev, "asynchronous event");
        let mut g = lock(&self.inner);
        if g.queue.len() >= CAPACITY {
            g.queue.pop_front();
            self.unsignal();
            if g.dropped == 0 {
                tracing::warn!(
                    capacity = CAPACITY,
                    "asynchronous events are not being read (ibv_get_async_event): dropping the oldest"
                );
            }
            g.dropped += 1;
        } else {
            g.dropped = 0;
        }
        g.queue.push_back(ev);
        self.signal();
        drop(g);
        self.cv.notify_all();
    }

    /// `ibv_get_async_event`: the next event, waiting up to `timeout` (forever with
    /// `None`); it counts as taken until acknowledged.
    pub fn get(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut g = lock(&self.inner);
        loop {
            if let Some(ev) = g.queue.pop_front() {
                self.unsignal();
                *g.unacked.entry(ev.element).or_default() += 1;
                return Ok(Some(ev));
            }
            g = match deadline {
                None => self.cv.wait(g).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    self.cv.wait_timeout(g, left).unwrap_or_else(|p| p.into_inner()).0
                }
            };
        }
    }

    /// `ibv_get_async_event` as libibverbs does it: a `read(2)` of [`fd`](Self::fd) in
    /// the calling thread, then the event. It waits unless the descriptor is
    /// `O_NONBLOCK` (then the error is EAGAIN), and a signal interrupts the wait (EINTR)
    /// unless its handler was installed with `SA_RESTART` (see [`crate::event_fd`]). The
    /// event counts as taken until acknowledged.
    pub fn read(&self) -> Result<AsyncEvent> {
        loop {
            crate::event_fd::take(self.efd.as_fd(), "ibv_get_async_event (read of async_fd)")?;
            let mut g = lock(&self.inner);
            // The count taken stands for an event in the queue, unless that event left
            // it meanwhile (dropped with its object): then wait for the next.
            if let Some(ev) = g.queue.pop_front() {
                *g.unacked.entry(ev.element).or_default() += 1;
                return Ok(ev);
            }
        }
    }

    /// `ibv_ack_async_event`.
    pub fn ack(&self, ev: AsyncEvent) {
        let mut g = lock(&self.inner);
        if let Some(n) = g.unacked.get_mut(&ev.element) {
            *n -= 1;
            if *n == 0 {
                g.unacked.remove(&ev.element);
            }
        }
        drop(g);
        self.cv.notify_all();
    }

    /// The object `element` names is being destroyed: waits until every event taken for
    /// it is acknowledged, then drops its events nobody took.
    pub fn forget(&self, element: AsyncElement) {
        let start = Instant::now();
        let mut warned = false;
        let mut g = lock(&self.inner);
        while g.unacked.get(&element).is_some_and(|n| *n > 0) {
            if !warned && start.elapsed() >= WARN_AFTER {
                warned = true;
                tracing::warn!(
                    element = ?element,
                    unacked = g.unacked.get(&element).copied().unwrap_or(0),
                    "destroying an object waits for its asynchronous events to be acknowledged \
                     (ack_async_event)"
                );
            }
            g = self
                .cv
                .wait_timeout(g, WARN_AFTER)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let before = g.queue.len();
        g.queue.retain(|e| e.element != element);
        for _ in g.queue.len()..before {
            self.unsignal();
        }
    }

    /// The fd: readable while an event is queued.
    pub fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::AsyncEventType;
    use std::sync::Arc;

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    fn ev(t: AsyncEventType, e: AsyncElement) -> AsyncEvent {
        AsyncEvent {
            event_type: t,
            element: e,
        }
    }

    #[test]
    fn the_fd_is_readable_exactly_while_an_event_waits() {
        let q = EventQueue::new().unwrap();
        assert!(!readable(q.fd()));
        assert_eq!(q.get(Some(Duration::ZERO)).unwrap(), None);
        q.raise(ev(AsyncEventType::SrqLimitReached, AsyncElement::Srq(3)));
        q.raise(ev(AsyncEventType::CqErr, AsyncElement::Cq(4)));
        assert!(readable(q.fd()));
        let a = q.get(None).unwrap().unwrap();
        assert_eq!(a.element, AsyncElement::Srq(3), "in order");
        assert!(readable(q.fd()));
        let b = q.get(Some(Duration::ZERO)).unwrap().unwrap();
        assert!(!readable(q.fd()));
        q.ack(a);
        q.ack(b);
    }

    #[test]
    fn destroy_waits_for_the_acknowledgement_and_drops_untaken_events() {
        let q = Arc::new(EventQueue::new().unwrap());
        let qp = AsyncElement::Qp(0x42);
        q.raise(ev(AsyncEventType::QpLastWqeReached, qp));
        q.raise(ev(AsyncEventType::QpFatal, qp));
        let taken = q.get(None).unwrap().unwrap();
        let q2 = q.clone();
        let t0 = Instant::now();
        let acker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            q2.ack(taken);
        });
        q.forget(qp);
        assert!(
            t0.elapsed() >= Duration::from_millis(50),
            "forget returned before the ack"
        );
        acker.join().unwrap();
        assert_eq!(
            q.get(Some(Duration::ZERO)).unwrap(),
            None,
            "the untaken event went with the QP"
        );
        assert!(!readable(q.fd()));
    }

    fn set_blocking(fd: RawFd) {
        // SAFETY: fcntl on a live descriptor touches no memory.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }

    #[test]
    fn read_takes_events_in_order_and_answers_eagain_when_non_blocking() {
        let q = EventQueue::new().unwrap();
        assert_eq!(q.read().unwrap_err().errno(), libc::EAGAIN);
        q.raise(ev(AsyncEventType::CqErr, AsyncElement::Cq(1)));
        q.raise(ev(AsyncEventType::CqErr, AsyncElement::Cq(2)));
        let a = q.read().unwrap();
        assert_eq!(a.element, AsyncElement::Cq(1));
        assert_eq!(q.get(None).unwrap().unwrap().element, AsyncElement::Cq(2));
        assert!(!readable(q.fd()));
        assert_eq!(q.read().unwrap_err().errno(), libc::EAGAIN);
        q.ack(a);
    }

    #[test]
    fn an_event_dropped_after_a_reader_took_its_count_blocks_nobody() {
        // A libibverbs-style reader has taken the count of the QP's event (the first half
        // of `read`) when the QP is destroyed: the destroy drops the event without waiting
        // for a count on the blocking descriptor, and the next event is read as usual.
        let q = EventQueue::new().unwrap();
        set_blocking(q.fd());
        let qp = AsyncElement::Qp(7);
        q.raise(ev(AsyncEventType::QpFatal, qp));
        // SAFETY: the queue's descriptor, open for the borrow.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(q.fd()) };
        crate::event_fd::take(fd, "read").unwrap();
        q.forget(qp);
        assert!(!readable(q.fd()));
        q.raise(ev(AsyncEventType::PortActive, AsyncElement::Port(1)));
        assert_eq!(q.read().unwrap().element, AsyncElement::Port(1));
        assert!(!readable(q.fd()));
    }

    #[test]
    fn a_full_queue_drops_the_oldest() {
        let q = EventQueue::new().unwrap();
        for i in 0..CAPACITY as u32 + 3 {
            q.raise(ev(AsyncEventType::CqErr, AsyncElement::Cq(i)));
        }
        assert_eq!(q.get(None).unwrap().unwrap().element, AsyncElement::Cq(3));
    }

    #[test]
    fn a_waiting_reader_wakes_for_an_event() {
        let q = Arc::new(EventQueue::new().unwrap());
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.get(Some(Duration::from_secs(10))).unwrap());
        std::thread::sleep(Duration::from_millis(20));
        q.raise(ev(AsyncEventType::PortErr, AsyncElement::Port(1)));
        assert_eq!(t.join().unwrap().unwrap().element, AsyncElement::Port(1));
    }
}
