//! One byte with descriptors over a connected unix socket (`SCM_RIGHTS`, `man 7 unix`),
//! without blocking: how a same-host connection's setup passes its shared-memory
//! segments ([`shm_ring`](crate::shm_ring)'s rings, the one-sided fast path's tables and
//! use counts). Each reader decides which bytes and how many descriptors it accepts.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer};
use rustix::net::{SendAncillaryMessage, SendFlags};

/// The most descriptors a message carries.
pub const MAX_FDS: usize = 2;

/// Sends `byte` with `fds` (at most [`MAX_FDS`]; none: the byte alone): `WouldBlock` if
/// the socket's buffer is full.
pub fn send(sock: BorrowedFd<'_>, byte: u8, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other(
            "no room for the descriptors in the control buffer",
        ));
    }
    let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
    match rustix::net::sendmsg(sock, &[io::IoSlice::new(&[byte])], &mut control, flags)? {
        1 => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "the setup message's byte was not sent",
        )),
    }
}

/// Receives one byte and the descriptors that came with it (closed on drop, so a
/// refused message leaves none open): `WouldBlock` if nothing is there yet,
/// `UnexpectedEof` if the peer closed, `InvalidData` with more than [`MAX_FDS`]
/// descriptors or other control data than those.
pub fn recv(sock: BorrowedFd<'_>) -> io::Result<(u8, Vec<OwnedFd>)> {
    // Room for one more than a message carries: a surplus is seen (and closed) rather
    // than cut off.
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS + 1))];
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
            "the peer closed during the connection's setup",
        ));
    }
    if got.flags.contains(ReturnFlags::CTRUNC) || fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "more control data than the setup's descriptors",
        ));
    }
    Ok((byte[0], fds))
}
