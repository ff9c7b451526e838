//! A client that connected to a listener, before its hello ([`Incoming`]) and after it
//! ([`ConnectRequest`]), and the server's answer: this side's hello, RTS, the ready bytes.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::hello::{check_offer, encode_hello, Offer, DEFAULT_TIMEOUT};
use super::io::{deadline_after, read_hello, write_all};
use super::setup::{finish, rand_psn, Peer};
use crate::connect::{local_endpoint, RcParams};
use crate::endpoint::{Endpoint, RemoteMr};
use crate::error::Result;
use crate::traits::{Context, QueuePair};

/// A client that connected to a listener, before the setup exchange: read its
/// connection request with [`Incoming::request`] (no QP is needed for that), or drop it.
#[derive(Debug)]
pub struct Incoming<S = TcpStream> {
    pub(super) stream: S,
    pub(super) peer: SocketAddr,
}

impl<S> Incoming<S> {
    /// The client's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
}

impl Incoming<TcpStream> {
    /// Reads the client's connection request (its hello) within `timeout`. A client that
    /// sends something else, hangs up or stays silent fails here, before any QP takes
    /// part, with an error that says which.
    pub fn request(self, timeout: Duration) -> Result<ConnectRequest> {
        self.request_by(deadline_after(timeout))
    }

    fn request_by(mut self, deadline: Instant) -> Result<ConnectRequest> {
        let _ = self.stream.set_nodelay(true);
        let (endpoint, mrs, private_data) = read_hello(&mut self.stream, deadline)?;
        Ok(ConnectRequest {
            stream: self.stream,
            peer: self.peer,
            endpoint,
            mrs,
            private_data,
        })
    }
}

/// A client's connection request, read and checked: its QP endpoint, memory descriptors
/// and private data. [`ConnectRequest::accept`] it with a QP, or drop it to refuse (the
/// server closed the connection unanswered: the client connects again until its timeout,
/// then fails).
#[derive(Debug)]
pub struct ConnectRequest<S = TcpStream> {
    pub(super) stream: S,
    pub(super) peer: SocketAddr,
    pub(super) endpoint: Endpoint,
    pub(super) mrs: Vec<RemoteMr>,
    pub(super) private_data: Vec<u8>,
}

impl<S> ConnectRequest<S> {
    /// The client's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The client QP's endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The client's remote-memory descriptors.
    pub fn mrs(&self) -> &[RemoteMr] {
        &self.mrs
    }

    /// The client's private data.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The connection, to answer in a protocol of the server's own (e.g. a UD server
    /// that answers with its endpoint and brings no QP up towards the client).
    pub fn into_stream(self) -> S {
        self.stream
    }
}

impl ConnectRequest<TcpStream> {
    /// Answers with this side's endpoint and offer, brings `qp` to RTS towards the client
    /// and exchanges the ready bytes, bounded by the offer's timeout.
    pub fn accept<C: Context, Q: QueuePair>(
        self,
        ctx: &C,
        qp: &Q,
        params: &RcParams,
        offer: &Offer,
    ) -> Result<Peer> {
        let deadline = deadline_after(offer.timeout.unwrap_or(DEFAULT_TIMEOUT));
        self.accept_by(deadline, ctx, qp, params, offer)
    }

    pub(super) fn accept_by<C: Context, Q: QueuePair>(
        mut self,
        deadline: Instant,
        ctx: &C,
        qp: &Q,
        params: &RcParams,
        offer: &Offer,
    ) -> Result<Peer> {
        check_offer(offer)?;
        let me = local_endpoint(ctx, qp, params, rand_psn())?;
        write_all(&mut self.stream, &encode_hello(&me, offer), deadline)?;
        let hello = (self.endpoint, self.mrs, self.private_data);
        finish(self.stream, deadline, qp, params, me, hello)
    }
}

#[cfg(feature = "tokio")]
/// A client connected to an [`AsyncCmListener`](super::AsyncCmListener), before the setup exchange.
pub type AsyncIncoming = Incoming<tokio::net::TcpStream>;

#[cfg(feature = "tokio")]
/// A client's connection request read by [`Incoming::<tokio::net::TcpStream>::request`].
pub type AsyncConnectRequest = ConnectRequest<tokio::net::TcpStream>;
