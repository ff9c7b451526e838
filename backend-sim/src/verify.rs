//! Who may become a QP's peer: the check that makes connection setup as strong as the
//! address vector is on a fabric.
//!
//! On InfiniBand or RoCE a responder sends its ACKs and READ/atomic responses to the
//! address in its QP's address vector, whoever sent the request, so a stranger cannot take
//! a connection over. On the sim anyone who reaches a device's listener can send a hello
//! that *claims* to come from a QP's peer (its GID, LID and QPN are no secret). So the
//! passive side checks the claim with the claimed device itself:
//!
//! 1. The active QP's device draws a random token for each connection attempt, records
//!    `(token, its QPN, the passive QPN)` in its [`Claims`], and sends the token in its
//!    hello.
//! 2. The passive device connects to the listener at the address *its own QP's address
//!    vector* names (never an address the hello names; on this host, the unix socket
//!    published for that address) and asks with a
//!    [`Frame::Verify`]: is your QP `src_qpn` saying hello to my QP `dst_qpn` with this
//!    token? The claimed device answers yes only for an attempt it is making right now.
//! 3. Only a confirmed hello may replace a QP's connection; an unconfirmed one is refused
//!    with the same bytes as every other refusal and disturbs nothing.
//!
//! The token travels only to the address the active QP's own address vector names, so a
//! third process learns it only by reading another connection's bytes, which needs the
//! privileges (root, `CAP_NET_RAW`) that the sim does not defend against, as plain RoCE
//! does not defend against a tap on the wire.
//!
//! A link between two devices for UD datagrams ([`datagram`](crate::datagram)) is checked
//! the same way, with what a link claims instead of a QP pair: the connecting device
//! records `(token, the address it connected to)` and says [`Frame::LinkHello`] with its
//! GID and LID; the accepting device asks the listener at the address that GID and LID
//! name ([`ask_link`]): is your link, with this token, the one that arrived at my address
//! `at`? The address it arrived at ties the token to the device it was sent to: a device
//! that received a link hello cannot pass it on to a third device as its own. (A link
//! over a same-host socket arrives at no TCP address: there `at` is the accepting
//! device's listen address, the one its socket is published under and the connecting
//! device looked up; see [`same_host`](crate::same_host).)

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::addressing::canonical;
use backend_sim_proto::wire::{
    setup_header_len, Frame, HelloReject, WireError, BASE_LEN, MAX_HDR_LEN, TOKEN_LEN, VERSION,
};

/// Bound on one check: connecting to the claimed device and reading its answer.
pub const VERIFY_TIMEOUT: Duration = Duration::from_secs(2);

/// What a hello claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Claimed {
    /// QP `.0` of this device says hello to QP `.1` of its peer.
    Qp(u32, u32),
    /// This device opens a link to the device listening at this address.
    Link(SocketAddr),
}

/// The hellos this device's QPs (and links) are sending right now, by token.
#[derive(Default)]
pub struct Claims {
    pending: Mutex<HashMap<[u8; TOKEN_LEN], Claimed>>,
}

/// A recorded attempt; dropping it withdraws the claim.
pub struct Claim {
    claims: Arc<Claims>,
    token: [u8; TOKEN_LEN],
}

impl Claim {
    /// The token to send in the hello.
    pub fn token(&self) -> [u8; TOKEN_LEN] {
        self.token
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.claims.pending.lock().remove(&self.token);
    }
}

impl Claims {
    /// Records that QP `src_qpn` of this device is saying hello to QP `dst_qpn` of its
    /// peer, under a fresh random token (128 bits from the thread's CSPRNG).
    pub fn begin(self: &Arc<Self>, src_qpn: u32, dst_qpn: u32) -> Claim {
        self.record(Claimed::Qp(src_qpn, dst_qpn))
    }

    /// Records that this device opens a link to the device listening at `to`, under a
    /// fresh random token.
    pub fn begin_link(self: &Arc<Self>, to: SocketAddr) -> Claim {
        self.record(Claimed::Link(canonical(to)))
    }

    fn record(self: &Arc<Self>, what: Claimed) -> Claim {
        let mut pending = self.pending.lock();
        let token = loop {
            let t: [u8; TOKEN_LEN] = rand::random();
            if !pending.contains_key(&t) {
                break t;
            }
        };
        pending.insert(token, what);
        Claim {
            claims: self.clone(),
            token,
        }
    }

    /// Whether QP `src_qpn` of this device is saying hello to QP `dst_qpn` with `token`.
    pub fn confirms(&self, src_qpn: u32, dst_qpn: u32, token: &[u8; TOKEN_LEN]) -> bool {
        self.pending.lock().get(token) == Some(&Claimed::Qp(src_qpn, dst_qpn))
    }

    /// Whether this device is opening, with `token`, a link that arrived at `at`.
    pub fn confirms_link(&self, at: SocketAddr, token: &[u8; TOKEN_LEN]) -> bool {
        self.pending.lock().get(token) == Some(&Claimed::Link(canonical(at)))
    }

    /// How many attempts are recorded (for tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pending.lock().len()
    }

    /// Whether no attempt is recorded.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Asks the device listening at `at` (the passive QP's configured peer address) whether
/// its QP `src_qpn` is saying hello to QP `dst_qpn` with `token`. Any failure to get a
/// yes (no listener, a timeout, garbage, a no) is a no.
///
/// With `same_host`, a device at `at` on this host (in this network namespace) is asked
/// on the unix socket it publishes for that address ([`crate::same_host`]), which names
/// it as exactly as its TCP listener does and costs no TCP handshake; over TCP otherwise.
pub async fn ask(
    at: SocketAddr,
    same_host: bool,
    src_qpn: u32,
    dst_qpn: u32,
    token: [u8; TOKEN_LEN],
) -> io::Result<bool> {
    let mut b = [0u8; MAX_HDR_LEN];
    let n = Frame::Verify {
        src_qpn,
        dst_qpn,
        token,
    }
    .encode(&mut b);
    tokio::time::timeout(VERIFY_TIMEOUT, async {
        let local = match same_host {
            true => crate::same_host::connect(at).await,
            false => None,
        };
        let answer = match local {
            Some((mut s, _)) => exchange(&mut s, &b[..n]).await?,
            None => {
                let mut s = TcpStream::connect(at).await?;
                s.set_nodelay(true)?;
                exchange(&mut s, &b[..n]).await?
            }
        };
        Ok(matches!(answer, Frame::HelloAck))
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer to the claim check"))?
}

/// Writes the question `q` (a whole setup frame) and reads the one frame that answers it.
async fn exchange(s: &mut (impl AsyncRead + AsyncWrite + Unpin), q: &[u8]) -> io::Result<Frame> {
    s.write_all(q).await?;
    read_one(s).await
}

/// Asks the device listening at `claimed` (the address a link hello's GID and LID name)
/// whether it is opening, with `token`, the link that arrived at this device's address
/// `at`. Any failure to get a yes is a no.
pub async fn ask_link(claimed: SocketAddr, at: SocketAddr, token: [u8; TOKEN_LEN]) -> io::Result<bool> {
    let at = canonical(at);
    let at_ip = match at.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    tokio::time::timeout(VERIFY_TIMEOUT, async {
        let mut s = TcpStream::connect(claimed).await?;
        s.set_nodelay(true)?;
        let mut b = [0u8; MAX_HDR_LEN];
        let n = Frame::LinkVerify {
            at_ip,
            at_port: at.port(),
            token,
        }
        .encode(&mut b);
        Ok(matches!(exchange(&mut s, &b[..n]).await?, Frame::HelloAck))
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer to the link check"))?
}

/// Writes one frame's header (a setup frame or its answer).
pub async fn send_frame(stream: &mut (impl AsyncWrite + Unpin), f: &Frame) -> io::Result<()> {
    let mut b = [0u8; MAX_HDR_LEN];
    let n = f.encode(&mut b);
    stream.write_all(&b[..n]).await
}

/// Reads exactly one setup frame (a hello, a check or an answer to either) into a buffer
/// on the stack: nothing is allocated for a connection before it proves itself. Frames of
/// the data path are refused here, before their extension is read.
pub async fn read_one(s: &mut (impl AsyncRead + Unpin)) -> io::Result<Frame> {
    let mut b = [0u8; MAX_HDR_LEN];
    let mut base = [0u8; BASE_LEN];
    s.read_exact(&mut base).await?;
    let n = setup_header_len(&base).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    b[..BASE_LEN].copy_from_slice(&base);
    s.read_exact(&mut b[BASE_LEN..n]).await?;
    match Frame::decode(&b[..n]) {
        Ok(Some((f, _))) => Ok(f),
        Ok(None) => unreachable!("a whole header was read"),
        Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e)),
    }
}

/// Reads the first setup frame a listener's connection sends, within
/// [`HELLO_TIMEOUT`](crate::listener::HELLO_TIMEOUT); one of another protocol version is
/// answered with [`HelloReject::Version`] (so that the other build reports the mismatch
/// instead of retrying), and anything else malformed ends the connection unanswered, the
/// same at every listener of the sim.
pub async fn read_first(stream: &mut (impl AsyncRead + AsyncWrite + Unpin)) -> io::Result<Frame> {
    let first = tokio::time::timeout(crate::listener::HELLO_TIMEOUT, read_one(stream))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "nothing said within the setup timeout",
            )
        })?;
    match first {
        Ok(f) => Ok(f),
        Err(e) => {
            if let Some(v) = version_of(&e) {
                tracing::warn!("refused a connection from a peer that speaks sim protocol version {v} (this build: {VERSION})");
                send_frame(
                    stream,
                    &Frame::HelloNak {
                        reason: HelloReject::Version,
                    },
                )
                .await?;
            }
            Err(e)
        }
    }
}

/// The protocol version a malformed setup frame claimed, if that is what was wrong.
pub fn version_of(e: &io::Error) -> Option<u16> {
    match e.get_ref().and_then(|i| i.downcast_ref::<WireError>()) {
        Some(WireError::Version(v)) => Some(*v),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_confirms_only_its_own_pair_and_token_and_ends_with_its_guard() {
        let claims = Arc::new(Claims::default());
        let c = claims.begin(0x10, 0x20);
        let t = c.token();
        assert!(claims.confirms(0x10, 0x20, &t));
        assert!(!claims.confirms(0x11, 0x20, &t), "another QP of this device");
        assert!(!claims.confirms(0x10, 0x21, &t), "another passive QP");
        let mut other = t;
        other[0] ^= 1;
        assert!(!claims.confirms(0x10, 0x20, &other), "a guessed token");
        let c2 = claims.begin(0x10, 0x20);
        assert_ne!(c2.token(), t, "every attempt draws its own token");
        drop(c);
        assert!(!claims.confirms(0x10, 0x20, &t), "withdrawn with its guard");
        assert!(claims.confirms(0x10, 0x20, &c2.token()));
        drop(c2);
        assert!(claims.is_empty());
    }

    /// A link's claim confirms only its token and the address it was opened to (in
    /// either spelling of an IPv4 address), never a QP pair's check, and ends with its
    /// guard.
    #[test]
    fn a_link_claim_confirms_only_its_token_and_address() {
        let claims = Arc::new(Claims::default());
        let to: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let c = claims.begin_link(to);
        let t = c.token();
        assert!(claims.confirms_link(to, &t));
        assert!(claims.confirms_link("[::ffff:127.0.0.1]:4000".parse().unwrap(), &t));
        assert!(
            !claims.confirms_link("127.0.0.1:4001".parse().unwrap(), &t),
            "another device"
        );
        assert!(
            !claims.confirms_link("127.0.0.2:4000".parse().unwrap(), &t),
            "another host"
        );
        let mut other = t;
        other[15] ^= 1;
        assert!(!claims.confirms_link(to, &other), "a guessed token");
        assert!(!claims.confirms(0, 0, &t), "a link's token is no QP's");
        let q = claims.begin(0x10, 0x20);
        assert!(!claims.confirms_link(to, &q.token()), "a QP's token is no link's");
        drop(c);
        assert!(!claims.confirms_link(to, &t));
    }
}
