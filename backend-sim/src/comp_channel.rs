//! A completion channel (`man ibv_create_comp_channel`, `man ibv_get_cq_event`): a queue
//! of the handles of the CQs whose events are pending, plus an `eventfd` in semaphore
//! mode, so that its fd polls readable exactly while events are pending.
//!
//! The bottom of the completion path: a CQ ([`crate::cq`]) puts its events here through
//! [`crate::channel_signal`], which decides when; neither is named here.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use verbs_api::event_fd;
use verbs_api::Result;

/// A completion channel.
pub struct ChannelShared {
    events: Mutex<VecDeque<u32>>,
    cv: Condvar,
    efd: OwnedFd,
    /// Runs on the signalling thread as each event is posted (tests).
    #[cfg(test)]
    pub on_post: Mutex<Option<Box<dyn Fn() + Send>>>,
}

impl ChannelShared {
    /// A channel with its eventfd.
    pub fn new() -> Result<Self> {
        Ok(ChannelShared {
            events: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            efd: event_fd::new("eventfd (completion channel)")?,
            #[cfg(test)]
            on_post: Mutex::new(None),
        })
    }

    /// Queues an event of CQ `cq` and wakes the channel's waiters (callers go through
    /// [`crate::channel_signal::signal`], which decides when).
    pub(crate) fn post(&self, cq: u32) {
        #[cfg(test)]
        if let Some(f) = &*self.on_post.lock() {
            f();
        }
        self.events.lock().push_back(cq);
        event_fd::signal(self.efd.as_fd());
        self.cv.notify_all();
    }

    /// Whether an event waits (`ibv_get_cq_event` would not block).
    pub fn has_event(&self) -> bool {
        !self.events.lock().is_empty()
    }

    /// `ibv_get_cq_event` with a timeout.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut q = self.events.lock();
        loop {
            if let Some(cq) = q.pop_front() {
                event_fd::take_nowait(self.efd.as_fd());
                return Ok(Some(cq));
            }
            match deadline {
                None => self.cv.wait(&mut q),
                Some(d) => {
                    if self.cv.wait_until(&mut q, d).timed_out() && q.is_empty() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// `ibv_get_cq_event` as libibverbs does it: a `read(2)` of [`fd`](Self::fd) in the
    /// calling thread, then the event: it waits unless the descriptor is `O_NONBLOCK`
    /// (EAGAIN), and a signal interrupts the wait (EINTR) unless its handler was installed
    /// with `SA_RESTART` (see [`verbs_api::event_fd`]).
    pub fn read_event(&self) -> Result<u32> {
        loop {
            event_fd::take(self.efd.as_fd(), "ibv_get_cq_event (read of the channel's fd)")?;
            // The count taken stands for a queued event (one taken with a timeout
            // meanwhile leaves this reader without one: it waits for the next).
            if let Some(cq) = self.events.lock().pop_front() {
                return Ok(cq);
            }
        }
    }

    /// The next event if one is queued, its count taken off the descriptor without
    /// waiting whatever its mode (a reader of [`ChannelShared::read_event`]'s kind).
    pub fn try_take(&self) -> Option<u32> {
        loop {
            if !event_fd::take_nowait(self.efd.as_fd()) {
                return None;
            }
            // (A count whose event a reader with a timeout took: look again.)
            if let Some(cq) = self.events.lock().pop_front() {
                return Some(cq);
            }
        }
    }

    /// The eventfd.
    pub fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }
}
