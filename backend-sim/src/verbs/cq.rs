//! Completion queues and channels (`ibv_create_cq`, `ibv_poll_cq`, `ibv_req_notify_cq`,
//! `ibv_create_comp_channel`): a poll that finds nothing drives the device's progress.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use verbs_api::{AsyncElement, CompletionChannel, CompletionQueue, Result, WorkCompletion};

use crate::comp_channel::ChannelShared;
use crate::cq::CqShared;
use crate::device::DeviceShared;

/// A completion queue of the sim.
pub struct SimCq {
    pub(crate) cq: Arc<CqShared>,
    pub(crate) dev: Arc<DeviceShared>,
}

impl SimCq {
    /// [`CompletionQueue::poll`] for a caller that takes the completions one by one
    /// (the C ABI writes each as a `struct ibv_wc` into the program's array): hands up
    /// to `max` of them to `take`, oldest first, and returns how many.
    pub fn poll_each(&self, max: usize, mut take: impl FnMut(&WorkCompletion)) -> Result<usize> {
        // ACKs deferred by this thread's previous poll leave now (delayed ACK).
        self.dev.progress.flush_acks();
        let n = self.cq.poll_each(max, &mut take)?;
        if n > 0 {
            self.dev.progress.user_polled();
            return Ok(n);
        }
        if max == 0 {
            return Ok(0);
        }
        // Empty: drive the device's receive progress on this thread, then look again.
        self.dev.progress.user_drive();
        self.cq.poll_each(max, take)
    }
}

impl CompletionQueue for SimCq {
    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let mut slots = wc.iter_mut();
        self.poll_each(slots.len(), |w| {
            if let Some(slot) = slots.next() {
                *slot = *w;
            }
        })
    }
    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.cq.req_notify(solicited_only)?;
        // The caller will wait on the channel, not poll: hand progress to the device. A
        // thread that waits in `ibv_get_cq_event` watches the connections itself (see
        // `Progress::wait_for_event`): the progress thread is not woken for that.
        if crate::progress::waits_on_channels() {
            self.dev.progress.user_idle_quietly();
        } else {
            self.dev.progress.user_idle();
        }
        Ok(())
    }
    fn ack_events(&self, n: u32) {
        self.cq.ack_events(n)
    }
    fn capacity(&self) -> u32 {
        self.cq.capacity()
    }
    fn resize(&self, cqe: u32) -> Result<()> {
        let max = self.dev.attr.max_cqe;
        if cqe == 0 || cqe > max {
            return Err(verbs_api::Error::invalid(
                "ibv_resize_cq",
                format!("cqe {cqe} is outside 1..={max}"),
            ));
        }
        self.cq.resize(cqe, self.dev.profile.switches().queue_sizing)
    }
    fn handle(&self) -> u32 {
        self.cq.handle
    }
    fn channel_fd(&self) -> Option<RawFd> {
        self.cq.channel_fd()
    }
}

/// `ibv_destroy_cq`: the CQ raises no more events, and the drop waits until every event
/// taken for it is acknowledged. (QPs that report to it keep its queue alive.)
impl Drop for SimCq {
    fn drop(&mut self) {
        self.cq.close();
        self.dev.events.forget(AsyncElement::Cq(self.cq.handle));
    }
}

/// Whether `fd` is in blocking mode (no `O_NONBLOCK`).
fn blocking(fd: RawFd) -> bool {
    // SAFETY: F_GETFL on a descriptor the channel owns touches no memory.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK == 0
}

/// A completion channel of the sim.
pub struct SimChannel {
    pub(crate) ch: Arc<ChannelShared>,
    /// The data path of its device: a thread that blocks here tells it.
    pub(crate) progress: std::sync::Weak<crate::progress::Progress>,
}

impl SimChannel {
    /// `ibv_get_cq_event` as libibverbs does it, a `read(2)` of the channel's descriptor
    /// in the calling thread (see [`ChannelShared::read_event`]): what a C program's
    /// signals and `O_NONBLOCK` expect. The handle of the CQ that raised the event.
    /// On a blocking descriptor with no event queued, the thread waits on the device's
    /// connections too and services them itself ([`Progress::wait_for_event`]): one
    /// thread wakes per event where the progress thread and this one would.
    ///
    /// [`Progress::wait_for_event`]: crate::progress::Progress::wait_for_event
    pub fn read_cq_event(&self) -> Result<u32> {
        if self.ch.has_event() || !blocking(self.ch.fd()) {
            return self.ch.read_event();
        }
        let Some(p) = self.progress.upgrade() else {
            return self.ch.read_event();
        };
        crate::progress::Progress::thread_blocks_on(Some(&p));
        p.waiter_blocks(|| self.ch.has_event());
        p.wait_for_event(&self.ch)
    }

    /// The calling thread may block on the channel: the device it polled last must not
    /// count on it to drive progress, and ACKs held for its answer leave.
    fn about_to_block(&self) {
        if !self.ch.has_event() {
            crate::progress::Progress::thread_blocks_on(None);
            if let Some(p) = self.progress.upgrade() {
                p.waiter_blocks(|| self.ch.has_event());
            }
        }
    }
}

impl CompletionChannel for SimChannel {
    fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
        self.about_to_block();
        self.ch.get_event(timeout)
    }
    fn fd(&self) -> RawFd {
        self.ch.fd()
    }
}
