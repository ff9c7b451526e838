//! The messages that set a same-host connection's fast path up, on its unix socket right
//! after the rings' segment (`ring_setup.rs`), each one byte with descriptors
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
use std::os::fd::{BorrowedFd, OwnedFd};

/// The byte of an offer (with two descriptors) or an answer (with one).
const OFFER_TAG: u8 = b'O';
/// The byte of a side that offers or answers nothing.
const NONE_TAG: u8 = b'o';

/// Sends `fds` with the offer's byte, or with none the "nothing" byte, without blocking
/// (the socket is fresh and holds at most the rings' byte: there is room).
pub fn send(sock: BorrowedFd<'_>, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let byte = if fds.is_empty() { NONE_TAG } else { OFFER_TAG };
    crate::fd_pass::send(sock, byte, fds)
}

/// Receives what [`send`] sent, expecting `want` descriptors with an offer's byte:
/// `Ok(None)` for the "nothing" byte, `WouldBlock` if it is not there yet.
pub fn recv(sock: BorrowedFd<'_>, want: usize) -> io::Result<Option<Vec<OwnedFd>>> {
    let (byte, fds) = crate::fd_pass::recv(sock)?;
    match byte {
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
