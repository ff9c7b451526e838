//! The setup exchange of [`super`] on tokio: [`AsyncCmListener`] and [`connect_async`],
//! interoperating with the blocking forms (the same hello, the same ready bytes).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener as TokioListener, TcpStream as TokioStream, ToSocketAddrs as TokioAddrs};

use super::accept::{accept_retryable, fd_errno, Backoff, FdEpisode};
use super::hello::{check_offer, check_ready, encode_hello, Hello, Offer, DEFAULT_TIMEOUT};
use super::io::{aio_err, read_hello_async};
use super::request::{AsyncConnectRequest, AsyncIncoming, ConnectRequest, Incoming};
use super::requests::REQUEST_TIMEOUT;
use super::requests_async;
use super::setup::{bring_up, rand_psn, AsyncPeer};
use crate::connect::{local_endpoint, RcParams};
use crate::endpoint::Endpoint;
use crate::error::{open_file_limit, Error, Result};
use crate::traits::{Context, QueuePair};

/// A server waiting for [`connect_async`]s (or blocking [`connect`](super::connect)s).
#[derive(Debug)]
pub struct AsyncCmListener {
    listener: std::sync::Arc<TokioListener>,
    fds: FdEpisode,
    /// The task of [`AsyncCmListener::request`], once started, and its requests.
    requests: tokio::sync::Mutex<Option<requests_async::Requests>>,
    request_timeout: Duration,
}

impl AsyncCmListener {
    /// Listens on `addr`.
    pub async fn bind(addr: impl TokioAddrs) -> Result<Self> {
        let listener = TokioListener::bind(addr)
            .await
            .map_err(|e| Error::from_io("bind", e))?;
        Ok(AsyncCmListener {
            listener: std::sync::Arc::new(listener),
            fds: FdEpisode::default(),
            requests: tokio::sync::Mutex::new(None),
            request_timeout: REQUEST_TIMEOUT,
        })
    }

    /// The same listener, giving each client `timeout` to send its whole connection
    /// request ([`AsyncCmListener::request`]; [`REQUEST_TIMEOUT`] by default).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Waits up to `timeout` for the next client whose connection request (its hello)
    /// arrives whole and well-formed, as [`CmListener::request`] does: a task of the
    /// current runtime accepts clients and reads each one's request on a task of its
    /// own, within the request timeout, with a flood of connections bounded
    /// ([`SETUP_BOUND`]; a client that sends garbage or nothing in time is dropped
    /// with a warning naming its address). Answer the request with
    /// [`ConnectRequest::<TokioStream>::accept`], on a task of its own to serve
    /// clients side by side. Use this or [`AsyncCmListener::incoming`] on a listener,
    /// not both.
    ///
    /// [`CmListener::request`]: super::CmListener::request
    /// [`SETUP_BOUND`]: super::SETUP_BOUND
    pub async fn request(&self, timeout: Duration) -> Result<AsyncConnectRequest> {
        let mut r = self.requests.lock().await;
        let r = r.get_or_insert_with(|| requests_async::start(self.listener.clone(), self.request_timeout));
        match tokio::time::timeout(timeout, r.arrived.recv()).await {
            Ok(Some(request)) => Ok(request),
            Ok(None) => Err(Error::Transport("the listener's accepting task ended".into())),
            Err(_) => Err(Error::timeout(timeout, "no client sent a connection request")),
        }
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(|source| Error::Os {
            call: "getsockname",
            source,
        })
    }

    /// Waits for one client whose connection request arrives
    /// ([`AsyncCmListener::request`]: clients that send garbage or nothing are dropped
    /// meanwhile, with a warning) and brings `qp` to RTS towards it. The offer's
    /// timeout bounds the wait for a request, and again the exchange with its client,
    /// which fails this call if it goes wrong.
    pub async fn accept<C: Context, Q: QueuePair>(
        &self,
        ctx: &C,
        qp: &Q,
        params: &RcParams,
        offer: &Offer,
    ) -> Result<AsyncPeer> {
        let timeout = offer.timeout.unwrap_or(DEFAULT_TIMEOUT);
        self.request(timeout).await?.accept(ctx, qp, params, offer).await
    }

    /// Waits up to `timeout` for a client to connect; the setup exchange has not
    /// started ([`Incoming::<TokioStream>::request`]). Out of file descriptors, it
    /// backs off, warns and fails as [`CmListener::incoming`](super::CmListener::incoming) does.
    pub async fn incoming(&self, timeout: Duration) -> Result<AsyncIncoming> {
        let mut starved = None;
        let r = tokio::time::timeout(timeout, self.accept_tcp(&mut starved)).await;
        r.unwrap_or_else(|_| Err(timed_out(timeout, starved, "no client connected")))
    }

    /// accept(2) until it gives a connection; `starved` holds the errno while the
    /// process is out of descriptors.
    async fn accept_tcp(&self, starved: &mut Option<i32>) -> Result<AsyncIncoming> {
        let mut backoff = Backoff::default();
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    *starved = None;
                    self.fds.recovered(self.listener.local_addr().ok());
                    return Ok(Incoming { stream, peer });
                }
                Err(e) if accept_retryable(&e) => tokio::task::yield_now().await,
                Err(e) => match fd_errno(&e) {
                    Some(errno) => {
                        *starved = Some(errno);
                        self.fds.starved(self.listener.local_addr().ok(), errno);
                        tokio::time::sleep(backoff.next()).await;
                    }
                    None => return Err(Error::from_io("accept", e)),
                },
            }
        }
    }
}

/// The error of an accept that ran out of time: out of descriptors if it still was.
fn timed_out(timeout: Duration, starved: Option<i32>, what: &str) -> Error {
    match starved {
        Some(errno) => Error::OutOfFiles {
            call: "accept",
            errno,
            limit: open_file_limit(),
        },
        None => Error::timeout(timeout, what),
    }
}

impl Incoming<TokioStream> {
    /// Reads the client's connection request (its hello) within `timeout`; a client
    /// that sends something else, hangs up or stays silent fails here, before any QP
    /// takes part, with an error that says which.
    pub async fn request(self, timeout: Duration) -> Result<AsyncConnectRequest> {
        tokio::time::timeout(timeout, self.read_request())
            .await
            .map_err(|_| Error::timeout(timeout, "the client sent no connection request"))?
    }

    pub(super) async fn read_request(mut self) -> Result<AsyncConnectRequest> {
        let _ = self.stream.set_nodelay(true);
        let (endpoint, mrs, private_data) = read_hello_async(&mut self.stream).await?;
        Ok(ConnectRequest {
            stream: self.stream,
            peer: self.peer,
            endpoint,
            mrs,
            private_data,
        })
    }
}

impl ConnectRequest<TokioStream> {
    /// Answers with this side's endpoint and offer, brings `qp` to RTS towards the
    /// client and exchanges the ready bytes, bounded by the offer's timeout.
    pub async fn accept<C: Context, Q: QueuePair>(
        self,
        ctx: &C,
        qp: &Q,
        params: &RcParams,
        offer: &Offer,
    ) -> Result<AsyncPeer> {
        let timeout = offer.timeout.unwrap_or(DEFAULT_TIMEOUT);
        tokio::time::timeout(timeout, self.answer(ctx, qp, params, offer))
            .await
            .map_err(|_| Error::timeout(timeout, "the client did not finish the connection setup"))?
    }

    async fn answer<C: Context, Q: QueuePair>(
        mut self,
        ctx: &C,
        qp: &Q,
        params: &RcParams,
        offer: &Offer,
    ) -> Result<AsyncPeer> {
        check_offer(offer)?;
        let me = local_endpoint(ctx, qp, params, rand_psn())?;
        self.stream
            .write_all(&encode_hello(&me, offer))
            .await
            .map_err(aio_err)?;
        let hello = (self.endpoint, self.mrs, self.private_data);
        finish_async(self.stream, qp, params, me, hello).await
    }
}

/// Connects to a listener at `addr` and brings `qp` to RTS towards the server's QP.
pub async fn connect_async<C: Context, Q: QueuePair>(
    addr: impl TokioAddrs,
    ctx: &C,
    qp: &Q,
    params: &RcParams,
    offer: &Offer,
) -> Result<AsyncPeer> {
    let timeout = offer.timeout.unwrap_or(DEFAULT_TIMEOUT);
    tokio::time::timeout(timeout, async {
        check_offer(offer)?;
        let me = local_endpoint(ctx, qp, params, rand_psn())?;
        let p = super::client::exchange_async(addr, &me, offer).await?;
        finish_async(p.stream, qp, params, me, (p.endpoint, p.mrs, p.private_data)).await
    })
    .await
    .map_err(|_| Error::timeout(timeout, "the connection setup with the server did not finish"))?
}

/// Both sides, once the hellos are exchanged: RTS towards the peer, the ready bytes.
async fn finish_async<Q: QueuePair>(
    mut stream: TokioStream,
    qp: &Q,
    params: &RcParams,
    me: Endpoint,
    peer: Hello,
) -> Result<AsyncPeer> {
    bring_up(qp, params, &peer.0, me.psn)?;
    stream.write_all(b"R").await.map_err(aio_err)?;
    check_ready(stream.read_u8().await.map_err(aio_err)?)?;
    Ok(AsyncPeer {
        local: me,
        endpoint: peer.0,
        mrs: peer.1,
        private_data: peer.2,
        stream,
    })
}
