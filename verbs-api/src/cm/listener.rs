//! The server's side: a [`CmListener`], which hands out the clients that connect to it
//! ([`Incoming`]) and their connection requests ([`ConnectRequest`]), one at a time or
//! bounded as [`super::SETUP_BOUND`] says.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::accept::{accept_within, Backoff, FdEpisode};
use super::hello::{Offer, DEFAULT_TIMEOUT};
use super::io::deadline_after;
use super::request::{ConnectRequest, Incoming};
use super::requests::Pending;
use super::setup::Peer;
use crate::connect::RcParams;
use crate::error::{Error, Result};
use crate::traits::{Context, QueuePair};

/// A server waiting for [`connect`](super::connect)s.
#[derive(Debug)]
pub struct CmListener {
    pub(super) listener: TcpListener,
    pub(super) fds: FdEpisode,
    /// The connections of [`CmListener::request`] in setup.
    pub(super) pending: Mutex<Pending>,
}

impl CmListener {
    /// Listens on `addr` (port 0 picks a free port; see [`CmListener::local_addr`]).
    pub fn bind(addr: impl ToSocketAddrs) -> Result<Self> {
        let listener = TcpListener::bind(addr).map_err(|e| Error::from_io("bind", e))?;
        Ok(CmListener {
            listener,
            fds: FdEpisode::default(),
            pending: Mutex::default(),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(|source| Error::Os {
            call: "getsockname",
            source,
        })
    }

    /// Waits for one client whose connection request arrives ([`CmListener::request`]:
    /// clients that send garbage or nothing are dropped meanwhile, with a warning),
    /// exchanges endpoints and offers, and brings `qp` to RTS towards it. The offer's
    /// timeout bounds the wait for a request, and again the exchange with its client,
    /// which fails this call if it goes wrong.
    pub fn accept<C: Context, Q: QueuePair>(
        &self,
        ctx: &C,
        qp: &Q,
        params: &RcParams,
        offer: &Offer,
    ) -> Result<Peer> {
        let timeout = offer.timeout.unwrap_or(DEFAULT_TIMEOUT);
        let request = self.request(timeout)?;
        request.accept_by(deadline_after(timeout), ctx, qp, params, offer)
    }

    /// Waits up to `timeout` for a client to connect; the setup exchange has not started
    /// (see [`Incoming::request`]).
    ///
    /// While the process is out of file descriptors (`EMFILE`, or `ENFILE` system-wide)
    /// clients wait in the listen backlog: this call retries with a back-off (1 ms
    /// doubling to 100 ms), logs one `tracing` warning naming the open-file limit per
    /// such episode, and, if the timeout passes before a descriptor is free, fails with
    /// [`Error::OutOfFiles`].
    pub fn incoming(&self, timeout: Duration) -> Result<Incoming> {
        let (stream, peer) = accept_within(&self.listener, &self.fds, timeout)?;
        Ok(Incoming { stream, peer })
    }
}

impl CmListener {
    /// Waits up to `timeout` for the next client whose connection request (its hello)
    /// arrives whole and well-formed, reading every client connected meanwhile at once,
    /// on this thread: a client that sends garbage, hangs up or sends nothing within the
    /// request timeout ([`REQUEST_TIMEOUT`] by default) is dropped with a warning naming
    /// its address, and a flood of connections is bounded ([`SETUP_BOUND`]: a client
    /// whose request arrives is served while strangers connect and say nothing).
    /// Connections in setup stay with the listener from one call to the next. Answer the
    /// request with [`ConnectRequest::accept`].
    ///
    /// Fails with [`Error::Timeout`] when no request arrived within `timeout`, and with
    /// [`Error::OutOfFiles`] when the process was out of descriptors at the end of it.
    ///
    /// [`REQUEST_TIMEOUT`]: super::REQUEST_TIMEOUT
    /// [`SETUP_BOUND`]: super::SETUP_BOUND
    pub fn request(&self, timeout: Duration) -> Result<ConnectRequest> {
        let deadline = deadline_after(timeout);
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let l = &self.listener;
        l.set_nonblocking(true).map_err(|e| Error::from_io("fcntl", e))?;
        let mut backoff = Backoff::default();
        let r = loop {
            let pause = match p.accept_waiting(l, &self.fds, &mut backoff) {
                Ok(pause) => pause,
                Err(e) => break Err(e),
            };
            if let Some(r) = p.take_arrived() {
                break Ok(r);
            }
            if Instant::now() >= deadline {
                break Err(match pause {
                    Some(_) => Error::from_io("accept", std::io::Error::from_raw_os_error(libc::EMFILE)),
                    None => Error::timeout(timeout, "no client sent a connection request"),
                });
            }
            p.wait(l, deadline, pause);
        };
        let _ = l.set_nonblocking(false);
        r
    }

    /// The same listener, giving each client `timeout` to send its whole connection
    /// request ([`CmListener::request`]; [`REQUEST_TIMEOUT`] by default).
    ///
    /// [`REQUEST_TIMEOUT`]: super::REQUEST_TIMEOUT
    pub fn with_request_timeout(self, timeout: Duration) -> Self {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .request_timeout = timeout;
        self
    }
}
