//! Async completions on tokio (feature `tokio`, on by default), for every backend.
//!
//! [`AsyncCq`] owns a CQ and its own completion channel and turns the channel's file
//! descriptor into tokio readiness (`AsyncFd`). Waiting follows the loop that loses no
//! event (`man ibv_get_cq_event`): drain the CQ; arm it (`req_notify`); drain again, since
//! a completion may have slipped in before arming; only then sleep on the channel, and on
//! wake-up take and acknowledge the events and start over. One wake-up hands over every
//! completion queued by then.
//!
//! Any number of tasks may wait on one `AsyncCq` at once: [`AsyncCq::next`] takes the
//! next completion nobody waits for specifically, [`AsyncCq::completion`] the one of a
//! given `wr_id` (whichever task drains the CQ routes it), [`AsyncCq::stream`] is a
//! stream of the former, and [`AsyncCq::post_send`] / [`AsyncCq::post_recv`] post one WR
//! and await its completion.
//!
//! [`AsyncEvents`] does the same for a device's asynchronous events (`async_fd`).
//!
//! A backend whose channel has no descriptor (the deterministic one, whose events come
//! from its virtual clock) hands out its own wait instead
//! ([`CompletionChannel::event_wait`]), which the loop above awaits where it would
//! await the descriptor; nothing else changes.
//!
//! # Cancellation
//!
//! Dropping one of these futures only stops the waiting. The work request stays posted
//! and its completion is still produced: it is then delivered by [`AsyncCq::next`] /
//! [`AsyncCq::stream`] instead, so no completion is lost or reported twice. The HCA may
//! still read or write the WR's buffers until that completion arrives, so:
//!
//! - **Buffers named by a WR must not be reused until its completion has been seen.**
//!   Dropping the memory region itself is always memory-safe (both backends take the
//!   HCA's access away first); reusing its bytes races with the HCA.
//! - [`AsyncCq::owned`] enforces the rule for you: it holds a value (typically the memory
//!   region the WR uses) while it waits and hands it back with the completion; if the
//!   future is dropped first, the value is *parked* inside the `AsyncCq` and dropped only
//!   when the WR's completion arrives ([`AsyncCq::parked`] counts them).

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use futures_util::Stream;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::event::AsyncEvent;
use crate::traits::{Backend, ChannelOf, CompletionChannel, CompletionQueue, Context, CqOf, QueuePair};
use crate::wc::WorkCompletion;
use crate::wr::{RecvWr, SendWr};

struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

#[derive(Default)]
struct State {
    /// Completions nobody waits for by `wr_id`, in CQ order.
    unclaimed: VecDeque<WorkCompletion>,
    /// `wr_id`s awaited by [`AsyncCq::completion`], with the completion once routed.
    waiting: HashMap<u64, Option<WorkCompletion>>,
    /// Values of dropped [`AsyncCq::owned`] futures, released by their completion.
    parked: HashMap<u64, Box<dyn Any + Send>>,
}

impl State {
    fn route(&mut self, wc: WorkCompletion) {
        if let Some(slot @ None) = self.waiting.get_mut(&wc.wr_id) {
            *slot = Some(wc);
            return;
        }
        // The HCA is done with the WR: whatever a cancelled future parked may go now.
        self.parked.remove(&wc.wr_id);
        self.unclaimed.push_back(wc);
    }
}

/// A completion queue with its own channel, awaited on tokio.
pub struct AsyncCq<B: Backend> {
    // Field order is drop order: deregister the fd before the CQ and channel go.
    // `None`: the channel waits without a descriptor (`CompletionChannel::event_wait`).
    fd: Option<AsyncFd<ChannelFd>>,
    cq: CqOf<B>,
    channel: ChannelOf<B>,
    state: Mutex<State>,
    routed: Notify,
    wakeups: AtomicU64,
    next_id: AtomicU64,
}

impl<B: Backend> AsyncCq<B> {
    /// Wraps `cq`, which must have been created with `channel`, and no other CQ may use
    /// that channel. Must be called inside a tokio runtime with I/O enabled.
    ///
    /// Fails with EINVAL, before anything waits, when `cq` was created without a channel
    /// or with another one (its events would never wake this `AsyncCq`).
    pub fn new(cq: CqOf<B>, channel: ChannelOf<B>) -> Result<Self> {
        match cq.channel_fd() {
            None => {
                return Err(Error::invalid(
                    "AsyncCq::new",
                    "the CQ was created without a completion channel, so nothing could wake a \
                     wait on it: create it with `ctx.create_cq(cqe, Some(&channel))` and pass that channel",
                ))
            }
            Some(fd) if fd != channel.fd() => {
                return Err(Error::invalid(
                    "AsyncCq::new",
                    format!(
                        "the CQ reports to another completion channel (fd {fd}) than the one given (fd {}): \
                         pass the channel the CQ was created with",
                        channel.fd()
                    ),
                ))
            }
            Some(_) => {}
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::invalid(
                "AsyncCq::new",
                "must be called inside a tokio runtime",
            ));
        }
        let fd = match channel.event_wait() {
            Some(_) => None,
            // SAFETY: the descriptor belongs to `channel`, which this AsyncCq owns and
            // drops only after `fd` (field order), so it stays open and the same file for
            // the whole life of the registration; `channel.fd()` always returns the same
            // descriptor.
            None => Some(
                unsafe {
                    AsyncFd::register_with_interest(ChannelFd(channel.fd()), tokio::io::Interest::READABLE)
                }
                .map_err(|e| Error::Os {
                    call: "register the completion channel with tokio",
                    source: std::io::Error::other(e.to_string()),
                })?,
            ),
        };
        Ok(AsyncCq {
            fd,
            cq,
            channel,
            state: Mutex::new(State::default()),
            routed: Notify::new(),
            wakeups: AtomicU64::new(0),
            next_id: AtomicU64::new(1 << 63),
        })
    }

    /// The CQ (to create QPs on it).
    pub fn cq(&self) -> &CqOf<B> {
        &self.cq
    }

    /// How often a waiter slept on the channel and was woken by it.
    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    /// Values parked by dropped [`AsyncCq::owned`] futures whose WR has not completed yet.
    pub fn parked(&self) -> usize {
        self.lock().parked.len()
    }

    /// A fresh `wr_id` (from the upper half of the range, so it does not collide with
    /// small application ids).
    pub fn wr_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves everything in the CQ into the routing state; returns how many.
    fn drain(&self) -> Result<usize> {
        let mut buf = [WorkCompletion::default(); 32];
        let mut total = 0;
        {
            // Polling under the lock keeps CQ order when several tasks drain at once.
            let mut st = self.lock();
            loop {
                let n = self.cq.poll(&mut buf)?;
                for wc in &buf[..n] {
                    st.route(*wc);
                }
                total += n;
                if n < buf.len() {
                    break;
                }
            }
        }
        if total > 0 {
            self.routed.notify_waiters();
        }
        Ok(total)
    }

    fn take_events(&self) -> Result<()> {
        while self.channel.get_cq_event(Some(Duration::ZERO))?.is_some() {
            self.cq.ack_events(1);
        }
        Ok(())
    }

    /// Waits until `check` finds what it wants in the routing state.
    async fn wait_until<T>(&self, mut check: impl FnMut(&mut State) -> Option<T>) -> Result<T> {
        loop {
            let notified = self.routed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            self.drain()?;
            if let Some(t) = check(&mut self.lock()) {
                return Ok(t);
            }
            self.cq.req_notify(false)?;
            if self.drain()? > 0 {
                continue;
            }
            match &self.fd {
                Some(fd) => tokio::select! {
                    r = fd.readable() => {
                        let mut guard = r.map_err(|source| Error::Os { call: "poll the completion channel", source })?;
                        self.take_events()?;
                        guard.clear_ready();
                        self.wakeups.fetch_add(1, Ordering::Relaxed);
                    }
                    _ = &mut notified => {}
                },
                None => {
                    let wait = self.channel.event_wait().ok_or_else(|| {
                        Error::invalid("AsyncCq", "the channel stopped offering its own wait")
                    })?;
                    tokio::select! {
                        r = wait => {
                            r?;
                            self.take_events()?;
                            self.wakeups.fetch_add(1, Ordering::Relaxed);
                        }
                        _ = &mut notified => {}
                    }
                }
            }
        }
    }

    /// The next completion that no [`AsyncCq::completion`] waits for.
    pub async fn next(&self) -> Result<WorkCompletion> {
        self.wait_until(|st| st.unclaimed.pop_front()).await
    }

    /// Waits for at least one completion, then moves up to `max` (everything queued by
    /// then, after one wake-up) into `out`; returns how many.
    pub async fn next_batch(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize> {
        self.wait_until(|st| {
            if st.unclaimed.is_empty() || max == 0 {
                return None;
            }
            let n = st.unclaimed.len().min(max);
            out.extend(st.unclaimed.drain(..n));
            Some(n)
        })
        .await
    }

    /// The completions that no [`AsyncCq::completion`] waits for, as a stream.
    pub fn stream(&self) -> impl Stream<Item = Result<WorkCompletion>> + '_ {
        futures_util::stream::unfold(self, |acq| async move { Some((acq.next().await, acq)) })
    }

    /// The completion of the WR with `wr_id` (which must be signaled, and unique among
    /// the WRs in flight on this CQ).
    pub async fn completion(&self, wr_id: u64) -> Result<WorkCompletion> {
        {
            let mut st = self.lock();
            if let Some(i) = st.unclaimed.iter().position(|w| w.wr_id == wr_id) {
                return Ok(st.unclaimed.remove(i).expect("index from position"));
            }
            st.waiting.insert(wr_id, None);
        }
        let _slot = Unwait { acq: self, wr_id };
        self.wait_until(|st| st.waiting.get_mut(&wr_id).and_then(Option::take))
            .await
    }

    /// Posts `wr` (made signaled) on `qp`, whose send CQ must be this one, and awaits its
    /// completion. See the module docs on cancellation.
    pub async fn post_send<Q: QueuePair>(&self, qp: &Q, wr: SendWr<'_>) -> Result<WorkCompletion> {
        let wr = wr.signaled();
        qp.post_send(&[wr]).map_err(|e| e.error)?;
        self.completion(wr.wr_id).await
    }

    /// Posts `wr` on `qp`, whose receive CQ must be this one, and awaits its completion.
    pub async fn post_recv<Q: QueuePair>(&self, qp: &Q, wr: RecvWr<'_>) -> Result<WorkCompletion> {
        qp.post_recv(&[wr]).map_err(|e| e.error)?;
        self.completion(wr.wr_id).await
    }

    /// Awaits the completion of `wr_id` while holding `value` (typically the memory region
    /// the WR reads or writes), and hands it back with the completion. If this future is
    /// dropped first, `value` is kept until the WR completes, then dropped.
    pub async fn owned<T: Send + 'static>(&self, wr_id: u64, value: T) -> (Result<WorkCompletion>, T) {
        let mut hold = Park {
            acq: self,
            wr_id,
            value: Some(value),
        };
        let r = self.completion(wr_id).await;
        let value = hold.value.take().expect("taken only here or in drop");
        (r, value)
    }
}

/// Removes a `completion` waiter's slot; a completion routed to it but not taken goes
/// back to the unclaimed queue (it is never lost).
struct Unwait<'a, B: Backend> {
    acq: &'a AsyncCq<B>,
    wr_id: u64,
}

impl<B: Backend> Drop for Unwait<'_, B> {
    fn drop(&mut self) {
        let mut st = self.acq.lock();
        if let Some(Some(wc)) = st.waiting.remove(&self.wr_id) {
            st.route(wc);
            drop(st);
            self.acq.routed.notify_waiters();
        }
    }
}

/// Parks the value of a dropped [`AsyncCq::owned`] future until its WR completes.
struct Park<'a, B: Backend, T: Send + 'static> {
    acq: &'a AsyncCq<B>,
    wr_id: u64,
    value: Option<T>,
}

impl<B: Backend, T: Send + 'static> Drop for Park<'_, B, T> {
    fn drop(&mut self) {
        let Some(v) = self.value.take() else { return };
        let mut st = self.acq.lock();
        let done = st.unclaimed.iter().any(|w| w.wr_id == self.wr_id)
            || matches!(st.waiting.get(&self.wr_id), Some(Some(_)));
        if !done {
            st.parked.insert(self.wr_id, Box::new(v));
        }
        // else: the HCA has finished with the WR; `v` is dropped here.
    }
}

/// A device's asynchronous events on tokio (`man ibv_get_async_event`): the context's
/// `async_fd` as tokio readiness. [`AsyncEvents::next`] waits for the next event; the
/// caller acknowledges it with [`Context::ack_async_event`] as with the blocking call.
pub struct AsyncEvents<'a, C: Context> {
    ctx: &'a C,
    fd: AsyncFd<ChannelFd>,
}

impl<'a, C: Context> AsyncEvents<'a, C> {
    /// Watches `ctx`'s events (needs a tokio runtime with I/O enabled).
    pub fn new(ctx: &'a C) -> Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::invalid(
                "AsyncEvents::new",
                "must be called inside a tokio runtime",
            ));
        }
        // SAFETY: the descriptor is the context's async fd, open for the context's whole
        // life; the registration lives in `self`, which borrows the context, so it ends
        // before the context (and the fd) can go.
        let fd = unsafe {
            AsyncFd::register_with_interest(ChannelFd(ctx.async_fd()), tokio::io::Interest::READABLE)
        }
        .map_err(|e| Error::Os {
            call: "register the async fd with tokio",
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok(AsyncEvents { ctx, fd })
    }

    /// The next event.
    pub async fn next(&self) -> Result<AsyncEvent> {
        loop {
            if let Some(ev) = self.ctx.get_async_event(Some(Duration::ZERO))? {
                return Ok(ev);
            }
            let mut guard = self.fd.readable().await.map_err(|e| Error::Os {
                call: "poll(async_fd)",
                source: e,
            })?;
            // Readiness is cleared only when no event is left, so a wake-up between
            // the check above and this one is not lost (the fd stays readable).
            match self.ctx.get_async_event(Some(Duration::ZERO))? {
                Some(ev) => return Ok(ev),
                None => guard.clear_ready(),
            }
        }
    }

    /// The events as a stream.
    pub fn stream(&self) -> impl Stream<Item = Result<AsyncEvent>> + '_ {
        futures_util::stream::unfold(self, |s| async move { Some((s.next().await, s)) })
    }
}
