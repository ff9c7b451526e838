//! The client's side of the hello exchange ([`connect`],
//! [`exchange`]): connect, send this side's hello, read the server's.
//!
//! A server under a flood of connections sheds those that have said nothing yet
//! ([`admission`](crate::admission)), and a client descheduled between its connect and
//! its hello may be one of them; so may one the server refuses for lack of room. Such a
//! client finds its connection closed before any byte of an answer, and connects again
//! (after 1 ms, doubling to 100 ms) until the call's timeout, as the sim's QP connector
//! does when a device's listener refuses it. Its QP is untouched until the server has
//! answered. A connection that cannot be made again ends the call with the first
//! attempt's error.

use std::io::Write;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Instant;

use super::accept::Backoff;
use super::hello::{check_offer, encode_hello, Hello, Offer, DEFAULT_TIMEOUT};
use super::io::{arm, deadline_after, io_err, read_hello, setup_io_err};
use super::setup::{finish, rand_psn, Peer};
use crate::connect::{local_endpoint, RcParams};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::traits::{Context, QueuePair};

/// How one attempt ended, when it did not get the server's hello.
enum Attempt {
    /// The server closed the connection before answering: try again.
    Unanswered(Error),
    /// Anything else: the call fails.
    Failed(Error),
}

/// Whether `e` (of a write or a read before any byte came back) means the server closed
/// the connection.
fn closed(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::UnexpectedEof
    )
}

/// The error of a connection the server closed without answering.
fn unanswered() -> Error {
    setup_io_err(std::io::ErrorKind::UnexpectedEof.into(), |e| {
        Error::from_io("read", e)
    })
}

/// The peer of a finished exchange.
fn peer<S>(me: &Endpoint, stream: S, (endpoint, mrs, private_data): Hello) -> Peer<S> {
    Peer {
        local: *me,
        endpoint,
        mrs,
        private_data,
        stream,
    }
}

/// The error of a name that does not resolve.
fn unresolved(source: std::io::Error) -> Error {
    Error::Os {
        call: "resolve",
        source,
    }
}

/// Sends this side's hello on `stream` and reads the server's.
fn attempt(mut stream: TcpStream, hello: &[u8], deadline: Instant) -> Result<(TcpStream, Hello), Attempt> {
    let _ = stream.set_nodelay(true);
    arm(&stream, deadline).map_err(Attempt::Failed)?;
    if let Err(e) = stream.write_all(hello) {
        return Err(match closed(&e) {
            true => Attempt::Unanswered(unanswered()),
            false => Attempt::Failed(io_err(e, deadline)),
        });
    }
    match stream.peek(&mut [0u8; 1]) {
        Ok(0) => return Err(Attempt::Unanswered(unanswered())),
        Ok(_) => {}
        Err(e) if closed(&e) => return Err(Attempt::Unanswered(unanswered())),
        Err(e) => return Err(Attempt::Failed(io_err(e, deadline))),
    }
    let peer = read_hello(&mut stream, deadline).map_err(Attempt::Failed)?;
    Ok((stream, peer))
}

/// A TCP connection to the first of `addrs` that takes one before `deadline`.
fn connect_any(addrs: &[SocketAddr], deadline: Instant) -> Result<TcpStream> {
    let mut last = None;
    for a in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(a, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(source) => Error::from_io("connect", source),
        None if addrs.is_empty() => Error::invalid("cm::connect", "the address resolved to nothing"),
        None => Error::timeout(std::time::Duration::ZERO, "no time left to connect"),
    })
}

/// The client's side of the exchange before `deadline`: this side's hello (`me` and the
/// offer) to the server at `addr`, the server's back; connected again while the server
/// closes the connection without answering.
pub(super) fn exchange_by(
    addr: impl ToSocketAddrs,
    me: &Endpoint,
    offer: &Offer,
    deadline: Instant,
) -> Result<Peer> {
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs().map_err(unresolved)?.collect();
    let hello = encode_hello(me, offer);
    let mut backoff = Backoff::default();
    let mut first: Option<Error> = None;
    loop {
        let stream = match connect_any(&addrs, deadline) {
            Ok(s) => s,
            Err(e) => return Err(first.unwrap_or(e)),
        };
        match attempt(stream, &hello, deadline) {
            Ok((stream, hello)) => return Ok(peer(me, stream, hello)),
            Err(Attempt::Failed(e)) => return Err(e),
            Err(Attempt::Unanswered(e)) => {
                let pause = backoff.next();
                if Instant::now() + pause >= deadline {
                    return Err(first.unwrap_or(e));
                }
                tracing::debug!("cm: the server closed the connection without answering; connecting again");
                first.get_or_insert(e);
                std::thread::sleep(pause);
            }
        }
    }
}

/// Connects to a [`CmListener`](super::CmListener) at `addr`, exchanges endpoints and offers, and brings
/// `qp` to RTS towards the server's QP. A server that closes the connection without
/// answering (one under a flood sheds connections that have said nothing yet) is
/// connected to again within the offer's timeout; `qp` is untouched until it answers.
pub fn connect<C: Context, Q: QueuePair>(
    addr: impl ToSocketAddrs,
    ctx: &C,
    qp: &Q,
    params: &RcParams,
    offer: &Offer,
) -> Result<Peer> {
    let deadline = deadline_after(offer.timeout.unwrap_or(DEFAULT_TIMEOUT));
    check_offer(offer)?;
    let me = local_endpoint(ctx, qp, params, rand_psn())?;
    // The client speaks first; the server answers after reading, so a stray connection
    // that sends nothing learns nothing.
    let p = exchange_by(addr, &me, offer, deadline)?;
    finish(
        p.stream,
        deadline,
        qp,
        params,
        me,
        (p.endpoint, p.mrs, p.private_data),
    )
}

/// The client's side of the exchange without a QP: sends `me` and `offer` to the
/// [`CmListener`](super::CmListener) at `addr` and returns the server's endpoint, offer
/// and the connection, within the offer's timeout (connecting again while the server
/// closes the connection without answering). For a client that needs the server's
/// endpoint but no RC connection (a UD client registering with its server); the
/// server answers with [`ConnectRequest::into_stream`](super::ConnectRequest::into_stream)
/// and a hello of its own.
pub fn exchange(addr: impl ToSocketAddrs, me: &Endpoint, offer: &Offer) -> Result<Peer> {
    check_offer(offer)?;
    exchange_by(
        addr,
        me,
        offer,
        deadline_after(offer.timeout.unwrap_or(DEFAULT_TIMEOUT)),
    )
}

#[cfg(feature = "tokio")]
pub(super) use nonblocking::exchange_async;

#[cfg(feature = "tokio")]
mod nonblocking {
    use tokio::io::AsyncWriteExt;
    use tokio::net::{lookup_host, TcpStream, ToSocketAddrs};

    use super::*;
    use crate::cm::io::read_hello_async;
    use crate::cm::setup::AsyncPeer;

    /// One attempt: the server's hello, or how it went.
    async fn attempt(mut stream: TcpStream, hello: &[u8]) -> Result<(TcpStream, Hello), Attempt> {
        let _ = stream.set_nodelay(true);
        if let Err(e) = stream.write_all(hello).await {
            return Err(match closed(&e) {
                true => Attempt::Unanswered(unanswered()),
                false => Attempt::Failed(Error::from_io("connection setup", e)),
            });
        }
        match stream.peek(&mut [0u8; 1]).await {
            Ok(0) => return Err(Attempt::Unanswered(unanswered())),
            Ok(_) => {}
            Err(e) if closed(&e) => return Err(Attempt::Unanswered(unanswered())),
            Err(e) => return Err(Attempt::Failed(Error::from_io("connection setup", e))),
        }
        let peer = read_hello_async(&mut stream).await.map_err(Attempt::Failed)?;
        Ok((stream, peer))
    }

    /// [`exchange_by`] on tokio (the caller bounds it in time).
    pub(in crate::cm) async fn exchange_async(
        addr: impl ToSocketAddrs,
        me: &Endpoint,
        offer: &Offer,
    ) -> Result<AsyncPeer> {
        let addrs: Vec<SocketAddr> = lookup_host(addr).await.map_err(unresolved)?.collect();
        let hello = encode_hello(me, offer);
        let mut backoff = Backoff::default();
        let mut first: Option<Error> = None;
        loop {
            let stream = match TcpStream::connect(&addrs[..]).await {
                Ok(s) => s,
                Err(e) => return Err(first.unwrap_or_else(|| Error::from_io("connect", e))),
            };
            match attempt(stream, &hello).await {
                Ok((stream, hello)) => return Ok(peer(me, stream, hello)),
                Err(Attempt::Failed(e)) => return Err(e),
                Err(Attempt::Unanswered(e)) => {
                    tracing::debug!(
                        "cm: the server closed the connection without answering; connecting again"
                    );
                    first.get_or_insert(e);
                    tokio::time::sleep(backoff.next()).await;
                }
            }
        }
    }
}
