//! The messages that set a same-host connection's fast path up, on its unix socket right
//! after the rings' segment ([`crate::ring_setup`]), each one byte with descriptors
//! (`SCM_RIGHTS`, `man 7 unix`):
//!
//! - the connector's offer: its owner table and the connection's use counts, or a byte
//!   saying it offers none (the fast path is off, or a segment could not be made);
//! - the acceptor's answer to an offer: its owner table, or a byte saying it has none.
//!
//! A side that sends its table has registered the use counts with it first, so that its
//! revocations wait for the peer's copies from the start. Anything but the expected byte
//! with exactly its descriptors is refused (`InvalidData`), and every descriptor that came
//! with it closed; each segment is checked before it is mapped ([`super::table`],
//! [`super::usage`]).

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer};
use rustix::net::{SendAncillaryMessage, SendFlags};

/// The byte of an offer (with two descriptors) or an answer (with one).
const OFFER_TAG: u8 = b'O';
/// The byte of a side that offers or answers nothing.
const NONE_TAG: u8 = b'o';

/// Sends `fds` with the offer's byte, or with none the "nothing" byte, without blocking
/// (the socket is fresh and holds at most the rings' byte: there is room).
pub fn send(sock: BorrowedFd<'_>, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other(
            "no room for the descriptors in the control buffer",
        ));
    }
    let byte = [if fds.is_empty() { NONE_TAG } else { OFFER_TAG }];
    let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
    match rustix::net::sendmsg(sock, &[io::IoSlice::new(&byte)], &mut control, flags)? {
        1 => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "the fast path's byte was not sent",
        )),
    }
}

/// Receives what [`send`] sent, expecting `want` descriptors with an offer's byte:
/// `Ok(None)` for the "nothing" byte, `WouldBlock` if it is not there yet.
pub fn recv(sock: BorrowedFd<'_>, want: usize) -> io::Result<Option<Vec<OwnedFd>>> {
    // Room for one more than expected: a surplus is seen (and closed), not cut off.
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let flags = RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC;
    let got = rustix::net::recvmsg(sock, &mut [io::IoSliceMut::new(&mut byte)], &mut control, flags)?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = msg {
            fds.extend(rights);
        }
    }
    if got.bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed during the fast path's setup",
        ));
    }
    if got.flags.contains(ReturnFlags::CTRUNC) {
        return Err(invalid("more descriptors than expected"));
    }
    match byte[0] {
        NONE_TAG if fds.is_empty() => Ok(None),
        OFFER_TAG if fds.len() == want => Ok(Some(fds)),
        OFFER_TAG => Err(invalid(format!(
            "{} descriptors where {want} were expected",
            fds.len()
        ))),
        _ => Err(invalid("not the fast path's byte")),
    }
}

fn invalid(why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the peer's fast path setup: {why}"),
    )
}
