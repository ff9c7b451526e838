//! An event channel on tokio (feature `tokio`): the channel's descriptor as tokio
//! readiness, as [`crate::aio::AsyncEvents`] does for a device's asynchronous events.

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use futures_util::Stream;
use tokio::io::unix::AsyncFd;

use super::traits::{CmEventChannel, CmIdOf};
use super::types::CmEvent;
use crate::error::{Error, Result};

struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A connection manager's event channel on tokio: [`AsyncCmEvents::next`] waits for the
/// next event without blocking a thread.
pub struct AsyncCmEvents<'a, C: CmEventChannel> {
    ch: &'a C,
    fd: AsyncFd<ChannelFd>,
}

impl<'a, C: CmEventChannel> AsyncCmEvents<'a, C> {
    /// Watches `ch`'s events (needs a tokio runtime with I/O enabled).
    pub fn new(ch: &'a C) -> Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::invalid(
                "AsyncCmEvents::new",
                "must be called inside a tokio runtime",
            ));
        }
        // SAFETY: the descriptor is the channel's, open for the channel's whole life; the
        // registration lives in `self`, which borrows the channel, so it ends first.
        let fd =
            unsafe { AsyncFd::register_with_interest(ChannelFd(ch.fd()), tokio::io::Interest::READABLE) }
                .map_err(|e| Error::Os {
                    call: "register the event channel's fd with tokio",
                    source: std::io::Error::other(e.to_string()),
                })?;
        Ok(AsyncCmEvents { ch, fd })
    }

    /// The next event.
    pub async fn next(&self) -> Result<CmEvent<CmIdOf<C::Backend>>> {
        loop {
            if let Some(ev) = self.ch.get_event(Some(Duration::ZERO))? {
                return Ok(ev);
            }
            let mut guard = self.fd.readable().await.map_err(|e| Error::Os {
                call: "poll(event channel)",
                source: e,
            })?;
            // Readiness is cleared only when no event is left, so one that arrived
            // between the look above and the wait is not lost.
            match self.ch.get_event(Some(Duration::ZERO))? {
                Some(ev) => return Ok(ev),
                None => guard.clear_ready(),
            }
        }
    }

    /// The events as a stream.
    pub fn stream(&self) -> impl Stream<Item = Result<CmEvent<CmIdOf<C::Backend>>>> + '_ {
        futures_util::stream::unfold(self, |s| async move { Some((s.next().await, s)) })
    }
}
