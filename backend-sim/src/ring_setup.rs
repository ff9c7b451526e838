//! Setting a same-host QP pair's connection up over shared-memory rings
//! ([`shm_ring`](crate::shm_ring)): right after the hello's answer, the one moment at
//! which neither side has unread bytes on the unix socket, the connector sends one
//! message, the rings' segment (`SCM_RIGHTS`, `man 7 unix`) or a byte saying the frames
//! stay on the socket (`RDMA_SIM_SHM_RINGS=off`, or no segment could be made), and the
//! acceptor reads exactly that message before anything else goes on the socket. The
//! connector decides; both sides then agree. TCP connections and UD links carry no such
//! message.
//!
//! A connection on rings then sets its one-sided fast path up
//! ([`onesided::exchange`](crate::onesided::exchange)): the connector offers its owner
//! table and the connection's use counts (or nothing), and the acceptor answers an offer
//! with its own table (or nothing), before the rings carry anything. Each side's
//! requester gets a way into the peer's memory if the peer sent its table and the copy
//! gate opens ([`onesided::link`](crate::onesided::link)); a side without one carries
//! every WRITE on the rings, and everything else is as without the fast path.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use rustix::process::Pid;
use tokio::io::Interest;
use tokio::net::UnixStream;

use crate::onesided::exchange;
use crate::onesided::link::Link;
use crate::onesided::owner::Owner;
use crate::shm_ring::{self, Rings, Side};
use crate::stream::Stream;

/// What a same-host connection's setup gave: its rings, if any, and its fast path, if any.
pub(crate) type SetUp = (Option<Rings>, Option<Arc<Link>>);

/// The connector's half, after it read the hello's answer: the rings it offered, if any,
/// and the fast path the acceptor agreed to.
pub(crate) async fn offer(stream: &Stream, owner: Option<&Arc<Owner>>) -> io::Result<SetUp> {
    let Stream::Unix(s, ..) = stream else {
        return Ok((None, None));
    };
    let made = match shm_ring::enabled() {
        true => shm_ring::create().and_then(|seg| Ok((Rings::map(seg.as_fd(), Side::Connector)?, seg))),
        false => return shm_ring::send_no_segment(s.as_fd()).map(|()| (None, None)),
    };
    let rings = match made {
        Ok((rings, seg)) => {
            // The socket is fresh and empty: the one byte does not wait for room.
            shm_ring::send_segment(s.as_fd(), seg.as_fd())?;
            rings
        }
        Err(e) => {
            tracing::warn!(
                "no shared-memory rings for a same-host connection ({e}): its frames go over the unix socket"
            );
            return shm_ring::send_no_segment(s.as_fd()).map(|()| (None, None));
        }
    };
    let offered = owner.and_then(|o| {
        let usage = crate::onesided::usage::Usage::create()
            .map(|(_, fd)| fd)
            .inspect_err(|e| tracing::debug!("no one-sided fast path: {e}"))
            .ok()?;
        let registered = Link::register(o, usage.as_fd()).ok()?;
        Some((o, usage, registered))
    });
    let Some((o, usage, registered)) = offered else {
        exchange::send(s.as_fd(), &[])?;
        return Ok((Some(rings), None));
    };
    exchange::send(s.as_fd(), &[o.table().fd(), usage.as_fd()])?;
    let answer = read(s, 1).await?;
    let theirs = answer.as_ref().map(|fds| fds[0].as_fd());
    let link = Link::new(o, theirs, usage.as_fd(), peer_pid(s), Some(registered));
    Ok((Some(rings), Some(Arc::new(link))))
}

/// The acceptor's half, after it sent the hello's answer: the rings the connector sent
/// (checked before they are mapped), or `None` if its frames stay on the socket; and the
/// fast path, if the connector offered one.
pub(crate) async fn accept(stream: &Stream, owner: Option<&Arc<Owner>>) -> io::Result<SetUp> {
    let Stream::Unix(s, ..) = stream else {
        return Ok((None, None));
    };
    let rings = loop {
        s.readable().await?;
        match s.try_io(Interest::READABLE, || shm_ring::recv_segment(s.as_fd())) {
            Ok(Some(seg)) => break Rings::map(seg.as_fd(), Side::Acceptor)?,
            Ok(None) => return Ok((None, None)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    let Some(offer) = read(s, 2).await? else {
        return Ok((Some(rings), None));
    };
    let (table, usage) = (offer[0].as_fd(), offer[1].as_fd());
    // With the fast path off here (no table), this side neither answers with a table nor
    // uses the peer's.
    let Some(o) = owner else {
        exchange::send(s.as_fd(), &[])?;
        return Ok((Some(rings), None));
    };
    let registered = Link::register(o, usage)
        .inspect_err(|e| tracing::debug!("no one-sided fast path into this side: {e}"))
        .ok();
    match registered {
        Some(_) => exchange::send(s.as_fd(), &[o.table().fd()])?,
        None => exchange::send(s.as_fd(), &[])?,
    }
    let link = Link::new(o, Some(table), usage, peer_pid(s), registered);
    Ok((Some(rings), Some(Arc::new(link))))
}

/// Reads one fast path message with `want` descriptors (`None`: the peer sends none).
async fn read(s: &UnixStream, want: usize) -> io::Result<Option<Vec<OwnedFd>>> {
    loop {
        s.readable().await?;
        match s.try_io(Interest::READABLE, || exchange::recv(s.as_fd(), want)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// The peer's process, as `SO_PEERCRED` names it (`None`: unknown, e.g. in another PID
/// namespace).
fn peer_pid(s: &UnixStream) -> Option<Pid> {
    s.peer_cred().ok()?.pid().and_then(Pid::from_raw)
}
