//! How a client finds the device behind an IP and an rdma_cm port (docs/wire.md
//! "Connection manager", docs/rdmacm.md "Addressing").
//!
//! On RoCE an IP names a netdev and so an HCA. On the sim an IP names a host, and every
//! process on it has devices of its own (under the default InfiniBand-like profile a
//! device is its TCP port, under the rxe profile an IP of its own). The rendezvous is the
//! rdma_cm port itself: a listener on `IP:PORT` holds the TCP port `PORT` at `IP` (at
//! every address for a wildcard listener), and a client resolving `IP:PORT` connects
//! there and asks which device takes requests for it ([`Frame::CmLookup`]); the answer
//! names that device by its GID and LID ([`Frame::CmAddress`]). It works on one host
//! and across hosts and network namespaces wherever TCP does, needs no daemon and no
//! shared directory, and a port taken by another listener is refused as rdma_cm
//! refuses it (EADDRINUSE). Everything after the answer travels between the two devices
//! on their link, checked as every link is.
//!
//! The rendezvous port serves only lookups, through the same bounded accept loop as a
//! device's listener ([`crate::listener`]): a stranger's hello gets the same refusal
//! as at any of the sim's listeners, anything else ends the connection unanswered.

use std::io;
use std::net::SocketAddr;
use std::sync::Weak;
use std::time::Duration;

use tokio::net::TcpStream;

use super::manager::Core;
use super::route::Peer;
use crate::verify::{read_first, read_one, send_frame};
use backend_sim_proto::wire::{Frame, HelloReject};

/// A listening TCP port of the rendezvous, served while it lives.
pub struct Rendezvous {
    /// The address it is bound to.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        // The task owns the socket: aborted, it closes the port.
        self.task.abort();
    }
}

/// A socket bound to `addr` for a listener's rendezvous (not yet listening), with
/// `SO_REUSEADDR` so that a restarted server gets its port back despite TIME_WAIT.
pub fn bind(addr: SocketAddr) -> io::Result<socket2::Socket> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        // A wildcard IPv6 listener takes IPv4 too, as rdma_cm's does unless AFONLY.
        let _ = s.set_only_v6(false);
    }
    s.bind(&addr.into())?;
    Ok(s)
}

/// Starts serving lookups on `sock` (bound) on runtime `rt`, for `core`.
pub fn open(sock: socket2::Socket, rt: &tokio::runtime::Handle, core: Weak<Core>) -> io::Result<Rendezvous> {
    sock.listen(1024)?;
    sock.set_nonblocking(true)?;
    let std: std::net::TcpListener = sock.into();
    let addr = std.local_addr()?;
    let _guard = rt.enter();
    let listener = tokio::net::TcpListener::from_std(std)?;
    let task = rt.spawn(crate::listener::accept_loop(
        format!("rdma_cm rendezvous {addr}"),
        listener,
        move |stream, peer| {
            let core = core.clone();
            async move {
                if let Err(e) = serve(core, stream).await {
                    tracing::debug!(%peer, "rdma_cm rendezvous connection ended: {e}");
                }
            }
        },
    ));
    Ok(Rendezvous { addr, task })
}

async fn serve(core: Weak<Core>, mut stream: TcpStream) -> io::Result<()> {
    let at = stream.local_addr()?;
    let answer = match read_first(&mut stream).await? {
        Frame::CmLookup { port_space, port } => {
            match core.upgrade().and_then(|c| c.lookup(at, port_space, port)) {
                Some(p) => Frame::CmAddress {
                    gid: p.gid,
                    lid: p.lid,
                },
                None => Frame::HelloNak {
                    reason: HelloReject::Refused,
                },
            }
        }
        Frame::Hello { .. } | Frame::Verify { .. } | Frame::LinkHello { .. } | Frame::LinkVerify { .. } => {
            Frame::HelloNak {
                reason: HelloReject::Refused,
            }
        }
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("expected a lookup, got {other}"),
            ))
        }
    };
    send_frame(&mut stream, &answer).await
}

/// What a lookup found at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// The device that takes requests there.
    Device(Peer),
    /// A host, but no listener of that port space at that port.
    NoListener,
    /// Nothing in time, or no route: this errno (ETIMEDOUT, ENETUNREACH, ...).
    Unreachable(i32),
}

/// Asks `dst` which device takes requests for port space `ps` there, within `timeout`.
///
/// A rendezvous that ends the connection unanswered is one whose listener turned the
/// connection away while a flood filled its setup places (the bound every listener of
/// the sim shares, [`crate::listener`]): asked again, after a pause that doubles from
/// [`RETRY_FIRST`] to [`RETRY_MAX`], until the timeout, as a device's connector retries.
/// A flood at the port so delays a real client, and does not turn it away.
pub async fn lookup(dst: SocketAddr, ps: u16, timeout: Duration) -> Found {
    let ask = async {
        let mut pause = RETRY_FIRST;
        loop {
            match ask_once(dst, ps).await {
                Some(found) => return found,
                None => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    };
    tokio::time::timeout(timeout, ask)
        .await
        .unwrap_or(Found::Unreachable(libc::ETIMEDOUT))
}

/// The first pause before a lookup is asked again.
const RETRY_FIRST: Duration = Duration::from_millis(5);
/// The longest pause between two asks of a lookup.
const RETRY_MAX: Duration = Duration::from_millis(200);

/// One ask: what `dst` answered, or `None` if it ended the connection unanswered or no
/// neighbour answered for its address.
async fn ask_once(dst: SocketAddr, ps: u16) -> Option<Found> {
    let mut s = match TcpStream::connect(dst).await {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Some(Found::NoListener),
        // No neighbour answered for the address: the kernel's address query asks again
        // until its timeout (rdma_resolve_ip, -ENODATA) and then reports -ETIMEDOUT, so a
        // failed neighbour is no answer yet here too.
        Err(e) if e.raw_os_error() == Some(libc::EHOSTUNREACH) => return None,
        Err(e) => return Some(Found::Unreachable(e.raw_os_error().unwrap_or(libc::EHOSTUNREACH))),
    };
    let _ = s.set_nodelay(true);
    let q = Frame::CmLookup {
        port_space: ps,
        port: dst.port(),
    };
    if send_frame(&mut s, &q).await.is_err() {
        return None;
    }
    match read_one(&mut s).await {
        Ok(Frame::CmAddress { gid, lid }) => Some(Found::Device(Peer::new(gid, lid))),
        Ok(Frame::HelloNak {
            reason: HelloReject::Version,
        }) => {
            tracing::warn!(%dst, "rdma_cm: the listener runs a sim of another protocol version");
            Some(Found::NoListener)
        }
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            ) =>
        {
            None
        }
        _ => Some(Found::NoListener),
    }
}
