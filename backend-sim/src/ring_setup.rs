//! Setting a same-host QP pair's connection up over shared-memory rings
//! ([`shm_ring`](crate::shm_ring)): right after the hello's answer, the one moment at
//! which neither side has unread bytes on the unix socket, the connector sends one
//! message, the rings' segment (`SCM_RIGHTS`, `man 7 unix`) or a byte saying the frames
//! stay on the socket (`RDMA_SIM_SHM_RINGS=off`, or no segment could be made), and the
//! acceptor reads exactly that message before anything else goes on the socket. The
//! connector decides; both sides then agree. TCP connections and UD links carry no such
//! message.

use std::io;
use std::os::fd::AsFd;

use tokio::io::Interest;

use crate::shm_ring::{self, Rings, Side};
use crate::stream::Stream;

/// The connector's half, after it read the hello's answer: the rings it offered, if any.
pub(crate) fn offer(stream: &Stream) -> io::Result<Option<Rings>> {
    let Stream::Unix(s, ..) = stream else {
        return Ok(None);
    };
    let made = match shm_ring::enabled() {
        true => shm_ring::create().and_then(|seg| Ok((Rings::map(seg.as_fd(), Side::Connector)?, seg))),
        false => return shm_ring::send_no_segment(s.as_fd()).map(|()| None),
    };
    match made {
        Ok((rings, seg)) => {
            // The socket is fresh and empty: the one byte does not wait for room.
            shm_ring::send_segment(s.as_fd(), seg.as_fd())?;
            Ok(Some(rings))
        }
        Err(e) => {
            tracing::warn!(
                "no shared-memory rings for a same-host connection ({e}): its frames go over the unix socket"
            );
            shm_ring::send_no_segment(s.as_fd()).map(|()| None)
        }
    }
}

/// The acceptor's half, after it sent the hello's answer: the rings the connector sent
/// (checked before they are mapped), or `None` if its frames stay on the socket.
pub(crate) async fn accept(stream: &Stream) -> io::Result<Option<Rings>> {
    let Stream::Unix(s, ..) = stream else {
        return Ok(None);
    };
    loop {
        s.readable().await?;
        match s.try_io(Interest::READABLE, || shm_ring::recv_segment(s.as_fd())) {
            Ok(Some(seg)) => return Rings::map(seg.as_fd(), Side::Acceptor).map(Some),
            Ok(None) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}
