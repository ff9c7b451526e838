//! Connection setup over a TCP side channel, the same for every backend: what `rdma_cm`
//! (or the hand-written exchange in `ibv_rc_pingpong` and perftest) does, made small.
//!
//! The server [`CmListener::accept`]s and the client [`connect`]s; each side sends a
//! hello with its QP [`Endpoint`], optional remote-memory descriptors and private data,
//! drives its QP to RTS towards the peer's endpoint, and then both confirm with a ready
//! byte. When either call returns, *both* QPs are in RTS: the peer may send at once.
//! To have receives in place before the peer can send, move the QP to INIT
//! ([`modify_to_init`]) and post them before calling; a QP in RESET
//! is moved to INIT here.
//!
//! ```no_run
//! # use verbs_api::*;
//! # fn server<B: Backend>(ctx: &B::Context, qp: &B::Qp, mr: &B::Mr) -> Result<()> {
//! let listener = cm::CmListener::bind("0.0.0.0:18515")?;
//! let peer = listener.accept(ctx, qp, &RcParams::default(), &cm::Offer::new().mr(mr.remote()))?;
//! println!("connected to QP {:#x}", peer.endpoint.qpn);
//! # Ok(()) }
//! ```
//!
//! With the `tokio` feature, [`AsyncCmListener`] and [`connect_async`] do the same on
//! tokio; the two forms interoperate.
//!
//! A server's port is open to anyone, who may connect as often as they like and say
//! nothing. [`CmListener::request`] (and `AsyncCmListener::request`) takes the next
//! client whose hello arrives whole and checked, reading every connecting client at once
//! (no thread per connection), each within a request timeout ([`REQUEST_TIMEOUT`]), with
//! the connections in setup bounded and descriptors kept in reserve for the clients being
//! served ([`SETUP_BOUND`], [`crate::admission`]); a client that sends garbage or nothing
//! is dropped with a warning naming its address. [`ConnectRequest::accept`] then answers
//! (this side's hello, RTS, the ready bytes). `accept` is the two in one call.
//! [`CmListener::incoming`] and [`Incoming::request`] take the steps for one raw
//! connection at a time, without those bounds. A client whose connection the server
//! closes without answering (shed or refused for lack of room) connects again within its
//! timeout; its QP is untouched until the server answers. [`exchange`] is the client's
//! half without a QP.
//!
//! Out of file descriptors, errors say so and name the limit ([`Error::OutOfFiles`]:
//! "out of file descriptors (EMFILE): the open-file limit is 1024 (ulimit -n)"). The
//! accept paths do not fail on it: clients wait in the listen backlog while accept(2)
//! is retried with a back-off (1 ms doubling to 100 ms) within the call's timeout, and
//! a `tracing` warning naming the limit is logged once per episode.
//!
//! Wire format (big-endian): magic `VAPI` (4) | version (2) | endpoint (26, see
//! [`Endpoint::to_bytes`]) | MR count (2) | MRs (20 each, [`RemoteMr::to_bytes`]) | private
//! data length (4) | private data; then one byte `R` each way. A peer that hangs up, stays
//! silent past the timeout or sends anything else gets a clear [`Error`].
//!
//! [`Endpoint`]: crate::endpoint::Endpoint
//! [`Endpoint::to_bytes`]: crate::endpoint::Endpoint::to_bytes
//! [`RemoteMr::to_bytes`]: crate::endpoint::RemoteMr::to_bytes
//! [`modify_to_init`]: crate::connect::modify_to_init
//! [`Error`]: crate::error::Error
//! [`Error::OutOfFiles`]: crate::error::Error::OutOfFiles

mod accept;
mod client;
mod hello;
mod io;
mod listener;
#[cfg(feature = "tokio")]
mod nonblocking;
mod request;
mod requests;
#[cfg(feature = "tokio")]
mod requests_async;
mod setup;

pub use client::{connect, exchange};
pub use hello::{
    decode_hello, encode_hello, parse_hello, HelloParse, Offer, DEFAULT_TIMEOUT, MAX_MRS, MAX_PRIVATE,
};
pub use listener::CmListener;
#[cfg(feature = "tokio")]
pub use nonblocking::{connect_async, AsyncCmListener};
#[cfg(feature = "tokio")]
pub use request::{AsyncConnectRequest, AsyncIncoming};
pub use request::{ConnectRequest, Incoming};
pub use requests::{REQUEST_TIMEOUT, SETUP_BOUND};
#[cfg(feature = "tokio")]
pub use setup::AsyncPeer;
pub use setup::Peer;
