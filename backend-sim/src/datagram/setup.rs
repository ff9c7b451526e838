//! Setting a link up (docs/wire.md "Links"), checked as a QP pair's hello is
//! ([`verify`](crate::verify)), so that a device knows which device is at the other end
//! of each of its links:
//!
//! 1. The device that needs a link connects to the address the address handle names
//!    and says [`Frame::LinkHello`]: its GID (table entry 0), its LID, and a token drawn
//!    for this attempt and recorded with the address it connected to.
//! 2. The accepting device checks the claim with the device the claimed GID and LID
//!    name, at the address they name (never at an address the connection came from):
//!    [`Frame::LinkVerify`] with the token and the address the link arrived at. That
//!    device says yes only for a link it is opening at that moment, with that token, to
//!    that address. A claimed address that names no listener (unspecified, multicast,
//!    port 0) or this device itself is refused without asking.
//! 3. Only then does it answer [`Frame::HelloAck`] and take the link: every datagram on
//!    it comes from the device the hello named. Any refusal is the same
//!    [`HelloReject::Refused`] (a version mismatch excepted, as for QPs).
//!
//! The connecting device knows whom it reached: the device listening where it connected
//! (its GID is that IP, its LID that port). Setting up takes at most
//! [`LINK_SETUP_TIMEOUT`]; a failure is remembered for [`FAILED_HOLD`](super::FAILED_HOLD).
//! A stranger's hello costs the accepting device one bounded check, to an address of
//! the stranger's choosing, among the listener's bounded connections in setup; the links
//! it may hold are bounded as [`table`](super::table) says (one per device it proves
//! to be).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use verbs_api::Gid;

use super::link::{self, Link};
use super::Datagrams;
use crate::addressing::{canonical, gid_addr};
use crate::same_host::Transport;
use crate::stream::Stream;
use crate::verify::{self, send_frame};
use backend_sim_proto::qp::DatagramSource;
use backend_sim_proto::wire::{Frame, HelloReject, TOKEN_LEN, VERSION};

/// Bound on opening a link: connecting, the hello, and the other device's check of it.
pub const LINK_SETUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens the link to the device listening at `peer` for `dg`'s device, and settles its
/// slot either way.
pub async fn open(dg: Arc<Datagrams>, peer: SocketAddr) {
    let epoch = dg.port.epoch();
    let link = match tokio::time::timeout(LINK_SETUP_TIMEOUT, connect(&dg, peer)).await {
        Ok(Ok(stream)) => {
            pause(&dg).await;
            dg.counters.link_set_up(matches!(stream, Stream::Unix(..)));
            let src = DatagramSource {
                gid: match peer.ip() {
                    IpAddr::V4(v4) => Gid::from(v4).0,
                    IpAddr::V6(v6) => Gid::from(v6).0,
                },
                lid: peer.port(),
            };
            Some(Link::new(stream, peer, src))
        }
        Ok(Err(e)) if e.kind() == io::ErrorKind::Unsupported => {
            tracing::warn!(device = %dg.name, %peer, "UD link refused: {e}");
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(device = %dg.name, %peer, "UD link not opened: {e}");
            None
        }
        Err(_) => {
            tracing::debug!(device = %dg.name, %peer, "UD link not opened within {LINK_SETUP_TIMEOUT:?}");
            None
        }
    };
    // Counted in the table before its task can end and leave it.
    let installed = dg.settle(peer, link.as_ref(), epoch);
    if let Some(l) = link.filter(|_| installed) {
        tracing::debug!(device = %dg.name, %peer, "UD link up (opened)");
        dg.rt.spawn(link::run(dg.clone(), l));
    }
}

async fn connect(dg: &Datagrams, peer: SocketAddr) -> io::Result<Stream> {
    if !dg.port.is_up() {
        return Err(io::Error::from_raw_os_error(libc::ENETDOWN));
    }
    let same_host = match dg.transport {
        Transport::Auto => crate::same_host::connect(peer).await,
        Transport::Tcp => None,
    };
    // The address the link arrives at, which the other device names in its check: over
    // TCP the one connected to, over a unix socket its listener's (see `check`).
    let (mut stream, at) = match same_host {
        Some((s, listen)) => (Stream::Unix(s, dg.addr.advertise, peer), listen),
        None => {
            let s = TcpStream::connect(peer).await?;
            crate::sockopt::tune(&s)?;
            (Stream::Tcp(s), peer)
        }
    };
    // Held until the answer: the other device checks the token with this one meanwhile.
    let claim = dg.claims.begin_link(at);
    let hello = Frame::LinkHello {
        src_gid: dg.addr.ip_gid().0,
        src_lid: dg.addr.lid(),
        token: claim.token(),
    };
    send_frame(&mut stream, &hello).await?;
    // Exactly the answer's header: what follows is the link's datagrams.
    let answer = verify::read_one(&mut stream).await?;
    drop(claim);
    match answer {
        Frame::HelloAck => Ok(stream),
        Frame::HelloNak {
            reason: HelloReject::Version,
        } => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("the device speaks another sim protocol version (this build: {VERSION})"),
        )),
        Frame::HelloNak { .. } => Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "the device refused the link",
        )),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("expected a link hello's answer, got {other}"),
        )),
    }
}

/// Serves a [`Frame::LinkHello`] that arrived on `stream`: checks the claim, answers, and
/// on success makes the link one of the device's.
pub async fn serve(
    dg: Arc<Datagrams>,
    mut stream: Stream,
    src_gid: [u8; 16],
    src_lid: u16,
    token: [u8; TOKEN_LEN],
) -> io::Result<()> {
    let epoch = dg.port.epoch();
    let claimed = gid_addr(&src_gid, src_lid);
    if let Err(why) = check(&dg, &stream, claimed, token).await {
        tracing::debug!(device = %dg.name, %claimed, "refused a UD link: {why}");
        send_frame(
            &mut stream,
            &Frame::HelloNak {
                reason: HelloReject::Refused,
            },
        )
        .await?;
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("refused a UD link claiming {claimed}: {why}"),
        ));
    }
    if let Err(e) = send_frame(&mut stream, &Frame::HelloAck).await {
        dg.unreserve();
        return Err(e);
    }
    pause(&dg).await;
    let src = DatagramSource {
        gid: src_gid,
        lid: src_lid,
    };
    dg.counters.link_set_up(matches!(stream, Stream::Unix(..)));
    let link = Link::new(stream, claimed, src);
    if !dg.adopt(claimed, &link, epoch) {
        // Dropped, it closes: the other device's end ends too.
        return Ok(());
    }
    tracing::debug!(device = %dg.name, peer = %claimed, "UD link up (accepted)");
    dg.rt.spawn(link::run(dg.clone(), link));
    Ok(())
}

/// Where a link's setup hands it over: waits as
/// [`Faults::delay_link_setup`](crate::faults::Faults::delay_link_setup) asked.
async fn pause(dg: &Datagrams) {
    let ns = dg.setup_delay_ns.load(std::sync::atomic::Ordering::Relaxed);
    if ns > 0 {
        tokio::time::sleep(Duration::from_nanos(ns)).await;
    }
}

/// Whether the link hello on `stream` claiming the device at `claimed` holds and the
/// link has a place in the device's table (taken for it: `Ok`); `Err` names why not (for
/// the log only).
async fn check(
    dg: &Datagrams,
    stream: &Stream,
    claimed: SocketAddr,
    token: [u8; TOKEN_LEN],
) -> Result<(), &'static str> {
    let ip = claimed.ip();
    let names_no_listener = claimed.port() == 0
        || ip.is_unspecified()
        || ip.is_multicast()
        || matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    if names_no_listener {
        return Err("the GID and LID name no device's listener");
    }
    if dg.addr.reaches_self(claimed) {
        return Err("it claims to come from this device");
    }
    if !dg.port.is_up() {
        return Err("the port is down");
    }
    if !dg.has_room_for(claimed) {
        return Err("the device holds as many links as it may, all in use");
    }
    // Where the link arrived: the address connected to over TCP, over a same-host socket
    // the address of the listener it belongs to (which its connector looked up).
    let at = match stream {
        Stream::Tcp(s) => canonical(s.local_addr().map_err(|_| "no local address")?),
        Stream::Unix(_, listener, _) => canonical(*listener),
    };
    match verify::ask_link(claimed, at, token).await {
        Ok(true) if dg.reserve_for(claimed) => Ok(()),
        Ok(true) => Err("the device holds as many links as it may, all in use"),
        Ok(false) => Err("the claimed device did not confirm the link"),
        Err(_) => Err("the claimed device could not be asked"),
    }
}
