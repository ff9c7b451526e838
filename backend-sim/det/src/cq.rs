//! CQs and completion channels of the deterministic world (`man ibv_poll_cq`,
//! `ibv_req_notify_cq`, `ibv_get_cq_event`, `ibv_resize_cq`), where waiting is what moves
//! the virtual clock: a poll that finds nothing runs the world to its next point in
//! time, and `get_cq_event` runs it until the event comes.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use verbs_api::{CompletionChannel, CompletionQueue, Error, EventWait, Result, WorkCompletion};

use crate::limits::MAX_CQE;
use crate::refuse::refused;
use crate::shared::Shared;
use crate::world::{overflow, World};

/// A completion queue of the deterministic world.
pub struct DetCq {
    pub(crate) shared: Arc<Shared>,
    pub(crate) handle: u32,
    pub(crate) has_channel: bool,
}

impl DetCq {
    /// Moves what CQ `h` holds into `wc`: how many, or its overflow.
    fn take(w: &mut World, h: u32, wc: &mut [WorkCompletion]) -> Result<usize> {
        let cq = &mut w.cqs[h as usize];
        if cq.lost > 0 {
            return Err(overflow(h, cq.lost));
        }
        let n = wc.len().min(cq.entries.len());
        for (slot, e) in wc.iter_mut().zip(cq.entries.drain(..n)) {
            *slot = e.wc;
            if let Some((slots, upto)) = e.mark {
                slots.release_through(upto);
            }
        }
        if n > 0 {
            w.progressed();
        }
        Ok(n)
    }
}

impl CompletionQueue for DetCq {
    /// An empty poll runs the world to its next event (outside a tokio runtime, whose
    /// timers move the clock instead).
    fn empty_poll_moves_time(&self) -> bool {
        !self.shared.rt.attached_here()
    }

    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let mut w = self.shared.enter("ibv_poll_cq")?;
        w.pump();
        let n = Self::take(&mut w, self.handle, wc)?;
        if n > 0 || wc.is_empty() {
            self.shared.rt.progressed();
            return Ok(n);
        }
        if self.shared.rt.attached_here() {
            // On a paused tokio runtime its timers move the clock, not a poll.
            self.shared.rt.empty_poll(&w, self.handle)?;
            return Ok(0);
        }
        if !w.wait_step(|| format!("ibv_poll_cq on CQ {}", self.handle), None)? {
            w.idle_poll(&format!("CQ {}", self.handle))?;
        }
        Self::take(&mut w, self.handle, wc)
    }

    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let mut w = self.shared.enter("ibv_req_notify_cq")?;
        w.cqs[self.handle as usize].armed = Some(solicited_only);
        Ok(())
    }

    fn ack_events(&self, _n: u32) {}

    fn capacity(&self) -> u32 {
        self.shared.lock_any().cqs[self.handle as usize].cap
    }

    fn handle(&self) -> u32 {
        self.handle
    }

    fn channel_fd(&self) -> Option<RawFd> {
        // No descriptor: waiting on one would wait outside the virtual world.
        self.has_channel.then_some(-1)
    }

    fn resize(&self, cqe: u32) -> Result<()> {
        let mut w = self.shared.enter("ibv_resize_cq")?;
        let cq = &mut w.cqs[self.handle as usize];
        if cqe == 0 || cqe > MAX_CQE || (cqe as usize) < cq.entries.len() {
            return Err(Error::invalid(
                "ibv_resize_cq",
                format!(
                    "{cqe} entries: must be in 1..={MAX_CQE} and hold the {} there",
                    cq.entries.len()
                ),
            ));
        }
        cq.cap = cqe;
        Ok(())
    }
}

/// A completion channel of the deterministic world.
pub struct DetChannel {
    pub(crate) shared: Arc<Shared>,
    pub(crate) handle: u32,
}

impl CompletionChannel for DetChannel {
    fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
        let mut w = self.shared.enter("ibv_get_cq_event")?;
        let until = timeout.map(|t| w.net.now() + t);
        loop {
            if let Some(cq) = w.channels[self.handle as usize].pop_front() {
                w.progressed();
                return Ok(Some(cq));
            }
            if !w.wait_step(|| "ibv_get_cq_event".into(), until)? {
                return match timeout {
                    Some(_) => Ok(None),
                    None => Err(refused(
                        "ibv_get_cq_event without a timeout, with no event pending and nothing \
                         left to happen in the deterministic world: it would wait forever; arm \
                         the CQ (req_notify) and post the work that completes on it first, or \
                         pass a timeout (virtual time)",
                    )),
                };
            }
        }
    }

    fn fd(&self) -> RawFd {
        // No descriptor: waiting on one would wait outside the virtual world.
        -1
    }

    fn event_wait(&self) -> Option<EventWait<'_>> {
        // The wait of an async CQ: a tokio timer at the world's next event.
        Some(Box::pin(crate::paused::channel_event(&self.shared, self.handle)))
    }
}
