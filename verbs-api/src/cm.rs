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

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::connect::{local_endpoint, modify_to_init, modify_to_rtr, modify_to_rts, RcParams};
use crate::endpoint::{Endpoint, RemoteMr};
use crate::error::{open_file_limit, Error, Result};
use crate::qp::{QpState, PSN_MASK};
use crate::traits::{Context, QueuePair};

mod client;
mod requests;
#[cfg(feature = "tokio")]
mod requests_async;

pub use client::exchange;

#[cfg(feature = "tokio")]
use requests::WARNINGS;
pub use requests::{REQUEST_TIMEOUT, SETUP_BOUND};

const MAGIC: &[u8; 4] = b"VAPI";
const VERSION: u16 = 1;
/// Most MR descriptors a hello may carry.
pub const MAX_MRS: usize = 1024;
/// Most private data a hello may carry.
pub const MAX_PRIVATE: usize = 64 * 1024;
/// Default bound on the whole exchange.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// What this side tells the peer besides its endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Offer {
    /// Memory the peer may access one-sidedly.
    pub mrs: Vec<RemoteMr>,
    /// Application bytes (at most [`MAX_PRIVATE`]).
    pub private_data: Vec<u8>,
    /// Bound on the exchange (default [`DEFAULT_TIMEOUT`]).
    pub timeout: Option<Duration>,
}

impl Offer {
    /// Nothing but the endpoint.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a remote-memory descriptor.
    pub fn mr(mut self, mr: RemoteMr) -> Self {
        self.mrs.push(mr);
        self
    }

    /// Sets the private data.
    pub fn private_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.private_data = data.into();
        self
    }

    /// Sets the bound on the exchange.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }
}

/// What the peer sent; the TCP side channel stays open in `stream` (drop it to close):
/// a std stream from [`connect`]/[`CmListener::accept`], a tokio one (`AsyncPeer`) from
/// the async forms.
#[derive(Debug)]
pub struct Peer<S = TcpStream> {
    /// This side's endpoint as sent to the peer (its `psn` is the QP's first send PSN).
    pub local: Endpoint,
    /// The peer QP's endpoint.
    pub endpoint: Endpoint,
    /// The peer's remote-memory descriptors.
    pub mrs: Vec<RemoteMr>,
    /// The peer's private data.
    pub private_data: Vec<u8>,
    /// The side channel (for the application's own barriers or shutdown).
    pub stream: S,
}

/// A server waiting for [`connect`]s.
#[derive(Debug)]
pub struct CmListener {
    listener: TcpListener,
    fds: FdEpisode,
    /// The connections of [`CmListener::request`] in setup.
    pending: Mutex<requests::Pending>,
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
        let (stream, peer) = accept_within(self, timeout)?;
        Ok(Incoming { stream, peer })
    }
}

/// A client that connected to a listener, before the setup exchange: read its
/// connection request with [`Incoming::request`] (no QP is needed for that), or drop it.
#[derive(Debug)]
pub struct Incoming<S = TcpStream> {
    stream: S,
    peer: SocketAddr,
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
    stream: S,
    peer: SocketAddr,
    endpoint: Endpoint,
    mrs: Vec<RemoteMr>,
    private_data: Vec<u8>,
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

    fn accept_by<C: Context, Q: QueuePair>(
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

/// Connects to a [`CmListener`] at `addr`, exchanges endpoints and offers, and brings
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
    let p = client::exchange_by(addr, &me, offer, deadline)?;
    finish(
        p.stream,
        deadline,
        qp,
        params,
        me,
        (p.endpoint, p.mrs, p.private_data),
    )
}

/// `now + timeout`, or a time decades away for a timeout too large to add.
fn deadline_after(timeout: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(50 * 365 * 24 * 3600);
    let now = Instant::now();
    now.checked_add(timeout.min(FAR)).unwrap_or(now)
}

/// The back-off of an accept loop while the process is out of descriptors.
const FD_BACKOFF_FIRST: Duration = Duration::from_millis(1);
/// Its longest pause.
const FD_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The pause before the next attempt: 1 ms, doubling to [`FD_BACKOFF_MAX`].
#[derive(Debug, Default)]
struct Backoff(Option<Duration>);

impl Backoff {
    fn next(&mut self) -> Duration {
        let d = self.0.map_or(FD_BACKOFF_FIRST, |d| (d * 2).min(FD_BACKOFF_MAX));
        self.0 = Some(d);
        d
    }
}

/// Errors of accept(2) that mean the process or system is out of file descriptors.
fn fd_errno(e: &std::io::Error) -> Option<i32> {
    e.raw_os_error()
        .filter(|&n| n == libc::EMFILE || n == libc::ENFILE)
}

/// Errors of accept(2) about one connection, not the listener (accept(2): "treat them
/// like EAGAIN by retrying"): a client that reset before it was accepted, a signal.
fn accept_retryable(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Interrupted
        || matches!(
            e.raw_os_error(),
            Some(
                libc::ECONNABORTED
                    | libc::EPROTO
                    | libc::ENETDOWN
                    | libc::ENOPROTOOPT
                    | libc::EHOSTDOWN
                    | libc::ENONET
                    | libc::EHOSTUNREACH
                    | libc::EOPNOTSUPP
                    | libc::ENETUNREACH
            )
        )
}

/// One listener's running out of descriptors: a warning when an episode starts, once,
/// and a note when accept works again.
#[derive(Debug, Default)]
struct FdEpisode(AtomicBool);

impl FdEpisode {
    fn starved(&self, listener: Option<SocketAddr>, errno: i32) {
        if !self.0.swap(true, Ordering::Relaxed) {
            let e = Error::OutOfFiles {
                call: "accept",
                errno,
                limit: open_file_limit(),
            };
            let on = listener.map_or_else(String::new, |a| format!(" on {a}"));
            tracing::warn!(
                "cm listener{on}: {e}; clients wait in the listen backlog, retrying every {FD_BACKOFF_FIRST:?} \
                 backing off to {FD_BACKOFF_MAX:?} until descriptors are freed"
            );
        }
    }

    fn recovered(&self, listener: Option<SocketAddr>) {
        if self.0.swap(false, Ordering::Relaxed) {
            let on = listener.map_or_else(String::new, |a| format!(" on {a}"));
            tracing::info!("cm listener{on}: descriptors are free again, accepting clients");
        }
    }
}

fn accept_within(cl: &CmListener, timeout: Duration) -> Result<(TcpStream, SocketAddr)> {
    let os = |call| move |source| Error::Os { call, source };
    let l = &cl.listener;
    l.set_nonblocking(true).map_err(os("fcntl"))?;
    let deadline = deadline_after(timeout);
    let mut backoff = Backoff::default();
    let r = loop {
        let pause = match l.accept() {
            Ok(x) => {
                cl.fds.recovered(l.local_addr().ok());
                break Ok(x);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                backoff = Backoff::default();
                Duration::from_millis(2)
            }
            // Again at once, but not past the deadline.
            Err(e) if accept_retryable(&e) => Duration::ZERO,
            Err(e) => match fd_errno(&e) {
                Some(errno) => {
                    cl.fds.starved(l.local_addr().ok(), errno);
                    if Instant::now() >= deadline {
                        break Err(Error::from_io("accept", e));
                    }
                    backoff.next()
                }
                None => break Err(Error::from_io("accept", e)),
            },
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Err(Error::timeout(timeout, "no client connected"));
        }
        std::thread::sleep(pause.min(left));
    };
    l.set_nonblocking(false).map_err(os("fcntl"))?;
    let (s, a) = r?;
    s.set_nonblocking(false).map_err(os("fcntl"))?;
    Ok((s, a))
}

/// Both sides, once the hellos are exchanged: RTS towards the peer, then the ready bytes.
fn finish<Q: QueuePair>(
    mut stream: TcpStream,
    deadline: Instant,
    qp: &Q,
    params: &RcParams,
    me: Endpoint,
    peer: Hello,
) -> Result<Peer> {
    bring_up(qp, params, &peer.0, me.psn)?;
    write_all(&mut stream, b"R", deadline)?;
    let mut r = [0u8; 1];
    read_exact(&mut stream, &mut r, deadline)?;
    check_ready(r[0])?;
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    Ok(Peer {
        local: me,
        endpoint: peer.0,
        mrs: peer.1,
        private_data: peer.2,
        stream,
    })
}

/// INIT (if still in RESET) → RTR towards `peer` → RTS sending from `psn`.
fn bring_up<Q: QueuePair>(qp: &Q, params: &RcParams, peer: &Endpoint, psn: u32) -> Result<()> {
    if qp.state()? == QpState::Reset {
        modify_to_init(qp, params)?;
    }
    modify_to_rtr(qp, params, peer)?;
    modify_to_rts(qp, params, psn)
}

fn check_offer(offer: &Offer) -> Result<()> {
    if offer.mrs.len() > MAX_MRS || offer.private_data.len() > MAX_PRIVATE {
        return Err(Error::invalid(
            "cm",
            format!("at most {MAX_MRS} MRs and {MAX_PRIVATE} bytes of private data"),
        ));
    }
    Ok(())
}

fn rand_psn() -> u32 {
    // Any value works; vary it so that stale packets of an earlier connection do not
    // look like the next ones. std's RandomState is seeded from the OS.
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    (h.finish() as u32) & PSN_MASK
}

/// Encodes a hello.
pub fn encode_hello(me: &Endpoint, offer: &Offer) -> Vec<u8> {
    let mut b = Vec::with_capacity(38 + offer.mrs.len() * RemoteMr::WIRE_LEN + offer.private_data.len());
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_be_bytes());
    b.extend_from_slice(&me.to_bytes());
    b.extend_from_slice(&(offer.mrs.len() as u16).to_be_bytes());
    for m in &offer.mrs {
        b.extend_from_slice(&m.to_bytes());
    }
    b.extend_from_slice(&(offer.private_data.len() as u32).to_be_bytes());
    b.extend_from_slice(&offer.private_data);
    b
}

type Hello = (Endpoint, Vec<RemoteMr>, Vec<u8>);

/// Result of [`parse_hello`] on the bytes received so far.
#[derive(Debug, PartialEq, Eq)]
pub enum HelloParse {
    /// At least this many bytes are needed in all (not more: the hello may be followed by
    /// the ready byte).
    Need(usize),
    /// A complete hello: endpoint, MR descriptors, private data.
    Done(Endpoint, Vec<RemoteMr>, Vec<u8>),
}

/// Parses a hello from the front of `b` without I/O, refusing anything malformed or
/// oversized (the error says what is wrong).
pub fn parse_hello(b: &[u8]) -> std::result::Result<HelloParse, String> {
    const HEAD: usize = 6 + Endpoint::WIRE_LEN + 2;
    if b.len() < 4 {
        return Ok(HelloParse::Need(4));
    }
    if &b[..4] != MAGIC {
        return Err(format!(
            "not a verbs-api connection setup (got {:02x?}); is the peer a server of this kind?",
            &b[..4]
        ));
    }
    if b.len() < HEAD {
        return Ok(HelloParse::Need(HEAD));
    }
    let v = u16::from_be_bytes([b[4], b[5]]);
    if v != VERSION {
        return Err(format!("protocol version {v}, this side speaks {VERSION}"));
    }
    let endpoint = Endpoint::from_bytes(&b[6..6 + Endpoint::WIRE_LEN]).map_err(|e| e.to_string())?;
    let n = u16::from_be_bytes([b[HEAD - 2], b[HEAD - 1]]) as usize;
    if n > MAX_MRS {
        return Err(format!("{n} MR descriptors exceed the limit of {MAX_MRS}"));
    }
    let mrs_end = HEAD + n * RemoteMr::WIRE_LEN;
    if b.len() < mrs_end + 4 {
        return Ok(HelloParse::Need(mrs_end + 4));
    }
    let l = u32::from_be_bytes([b[mrs_end], b[mrs_end + 1], b[mrs_end + 2], b[mrs_end + 3]]) as usize;
    if l > MAX_PRIVATE {
        return Err(format!(
            "{l} bytes of private data exceed the limit of {MAX_PRIVATE}"
        ));
    }
    let end = mrs_end + 4 + l;
    if b.len() < end {
        return Ok(HelloParse::Need(end));
    }
    let mrs = b[HEAD..mrs_end]
        .chunks(RemoteMr::WIRE_LEN)
        .map(|c| RemoteMr::from_bytes(c).expect("fixed length"))
        .collect();
    Ok(HelloParse::Done(endpoint, mrs, b[mrs_end + 4..end].to_vec()))
}

/// Reads a hello from a blocking reader (exactly its bytes, nothing after it).
pub fn decode_hello(r: &mut impl Read) -> std::io::Result<std::result::Result<Hello, String>> {
    let mut buf = Vec::new();
    loop {
        match parse_hello(&buf) {
            Err(e) => return Ok(Err(e)),
            Ok(HelloParse::Done(e, m, p)) => return Ok(Ok((e, m, p))),
            Ok(HelloParse::Need(n)) => {
                let at = buf.len();
                buf.resize(n, 0);
                r.read_exact(&mut buf[at..])?;
            }
        }
    }
}

/// An I/O error of the setup exchange, for both forms: the peer hanging up, or `other`.
fn setup_io_err(e: std::io::Error, other: impl FnOnce(std::io::Error) -> Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => {
            Error::Transport("the peer closed the connection during the setup exchange".into())
        }
        _ => other(e),
    }
}

/// A hello that does not parse.
fn bad_hello(msg: String) -> Error {
    Error::Transport(format!("bad connection setup from the peer: {msg}"))
}

/// The last byte of the exchange must be the peer's ready byte.
fn check_ready(r: u8) -> Result<()> {
    if r != b'R' {
        return Err(Error::Transport(format!(
            "peer sent {r:#04x} instead of the ready byte"
        )));
    }
    Ok(())
}

/// A setup I/O error on the blocking form, where timeouts show as WouldBlock/TimedOut.
fn io_err(e: std::io::Error, deadline: Instant) -> Error {
    setup_io_err(e, |e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::timeout(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
            "the peer did not answer during the setup exchange",
        ),
        _ => Error::from_io("connection setup", e),
    })
}

fn arm(stream: &TcpStream, deadline: Instant) -> Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::timeout(
            Duration::ZERO,
            "the setup exchange ran out of time",
        ));
    }
    stream
        .set_read_timeout(Some(left))
        .and_then(|_| stream.set_write_timeout(Some(left)))
        .map_err(|source| Error::Os {
            call: "setsockopt",
            source,
        })
}

fn write_all(s: &mut TcpStream, b: &[u8], deadline: Instant) -> Result<()> {
    arm(s, deadline)?;
    s.write_all(b).map_err(|e| io_err(e, deadline))
}

fn read_exact(s: &mut TcpStream, b: &mut [u8], deadline: Instant) -> Result<()> {
    arm(s, deadline)?;
    s.read_exact(b).map_err(|e| io_err(e, deadline))
}

fn read_hello(s: &mut TcpStream, deadline: Instant) -> Result<Hello> {
    arm(s, deadline)?;
    match decode_hello(s) {
        Ok(Ok(h)) => Ok(h),
        Ok(Err(msg)) => Err(bad_hello(msg)),
        Err(e) => Err(io_err(e, deadline)),
    }
}

#[cfg(feature = "tokio")]
mod nonblocking;

#[cfg(feature = "tokio")]
pub use nonblocking::{connect_async, AsyncCmListener, AsyncConnectRequest, AsyncIncoming, AsyncPeer};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Gid;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hello_roundtrip(qpn in 0u32..1 << 24, psn in 0u32..1 << 24, n in 0usize..5, private in proptest::collection::vec(any::<u8>(), 0..100)) {
            let me = Endpoint { gid: Gid([7; 16]), lid: 3, qpn, psn };
            let offer = Offer { mrs: (0..n as u64).map(|i| RemoteMr { addr: i, rkey: i as u32, len: 8 }).collect(), private_data: private.clone(), timeout: None };
            let b = encode_hello(&me, &offer);
            let (e, m, p) = decode_hello(&mut &b[..]).unwrap().unwrap();
            prop_assert_eq!(e, me);
            prop_assert_eq!(m, offer.mrs);
            prop_assert_eq!(p, private);
        }

        /// Garbage never panics the decoder and never makes it allocate past the limits.
        #[test]
        fn garbage(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_hello(&mut &b[..]);
        }
    }

    #[test]
    fn refuses_oversized_private_data() {
        let mut b = encode_hello(&Endpoint::default(), &Offer::new());
        let n = b.len();
        b[n - 4..].copy_from_slice(&(MAX_PRIVATE as u32 + 1).to_be_bytes());
        assert!(decode_hello(&mut &b[..]).unwrap().is_err());
    }
}
