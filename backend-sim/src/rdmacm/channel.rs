//! An event channel (`rdma_create_event_channel`): the events of its ids in order, and a
//! descriptor that polls readable while one is pending (an eventfd in semaphore mode,
//! one count per queued event: [`verbs_api::event_fd`]).
//!
//! Events are taken two ways: with a timeout ([`Channel::get`], the verbs-api call), or
//! as the kernel's rdma_cm hands them to librdmacm ([`Channel::read`]): a wait in the
//! calling thread on the descriptor, in the descriptor's own mode (`O_NONBLOCK`: EAGAIN)
//! and interrupted by signals as a read is. An id that is destroyed or moves to another
//! channel takes its pending events with it ([`Channel::take_for`]).

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use verbs_api::rdmacm::{CmEventParam, CmEventType};
use verbs_api::Result;

/// A queued event: what `rdma_get_cm_event` returns, the ids by handle.
#[derive(Clone, Debug)]
pub struct Queued {
    /// The id it is for (a connection request's: the new id).
    pub handle: u32,
    /// That id's context when the event was queued.
    pub context: u64,
    /// A connection request's listener.
    pub listen: Option<u32>,
    /// The event.
    pub event: CmEventType,
    /// Its status.
    pub status: i32,
    /// The peer's parameters.
    pub param: CmEventParam,
    /// A multicast event's join (its context).
    pub mcast: Option<u64>,
}

/// One event channel.
pub struct Channel {
    queue: Mutex<VecDeque<Queued>>,
    cv: Condvar,
    efd: OwnedFd,
}

impl Channel {
    /// An empty channel.
    pub fn new() -> Result<Channel> {
        Ok(Channel {
            queue: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            efd: verbs_api::event_fd::new("eventfd (rdma_cm event channel)")?,
        })
    }

    /// The descriptor.
    pub fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }

    /// Queues `ev`.
    pub fn push(&self, ev: Queued) {
        tracing::debug!(handle = ev.handle, event = %ev.event, status = ev.status, "rdma_cm event");
        let mut q = self.queue.lock();
        q.push_back(ev);
        verbs_api::event_fd::signal(self.efd.as_fd());
        drop(q);
        self.cv.notify_all();
    }

    /// The next event, waiting up to `timeout` (for ever with `None`).
    pub fn get(&self, timeout: Option<Duration>) -> Option<Queued> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut q = self.queue.lock();
        loop {
            if let Some(ev) = q.pop_front() {
                verbs_api::event_fd::take_nowait(self.efd.as_fd());
                return Some(ev);
            }
            match deadline {
                None => self.cv.wait(&mut q),
                Some(d) => {
                    if Instant::now() >= d {
                        return None;
                    }
                    self.cv.wait_until(&mut q, d);
                }
            }
        }
    }

    /// The next event as the kernel's rdma_cm hands it over: a wait on the descriptor in
    /// its own mode (`O_NONBLOCK`: EAGAIN; a signal: EINTR unless `SA_RESTART`).
    pub fn read(&self) -> Result<Queued> {
        loop {
            verbs_api::event_fd::take(self.efd.as_fd(), "rdma_get_cm_event")?;
            // The count stands for an event, unless that event left meanwhile (its id
            // was destroyed): then wait for the next.
            if let Some(ev) = self.queue.lock().pop_front() {
                return Ok(ev);
            }
        }
    }

    /// Takes the pending events `pick` selects out of the queue, in order.
    pub fn take_for(&self, mut pick: impl FnMut(&Queued) -> bool) -> Vec<Queued> {
        let mut q = self.queue.lock();
        let mut taken = Vec::new();
        q.retain(|e| {
            if pick(e) {
                taken.push(e.clone());
                false
            } else {
                true
            }
        });
        for _ in &taken {
            verbs_api::event_fd::take_nowait(self.efd.as_fd());
        }
        taken
    }
}
