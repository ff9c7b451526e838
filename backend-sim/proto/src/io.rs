//! The seam between the protocol and the driver's sockets: this crate decides *where*
//! bytes go and come from (its staging buffer, registered memory, its queue of frames),
//! the driver moves them with its system calls. Payloads therefore still move straight
//! between a socket and registered memory, with no copy in between, and this crate makes
//! no system call.
//!
//! Both traits take raw pointers: the memory they name may be registered memory that the
//! application (or a peer's RDMA WRITE) touches at any time, so no `&[u8]` to it may
//! exist (see [`memory`](crate::memory)).

use std::io;

/// One run of bytes to send, laid out as `struct iovec` (`man 2 readv`): a driver may
/// pass a slice of these to `sendmsg(2)` as its `msg_iov`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawSlice {
    /// First byte.
    pub base: *const u8,
    /// Bytes.
    pub len: usize,
}

/// Where a connection's incoming bytes come from (the driver's socket; a buffer in
/// tests).
pub trait Recv {
    /// Reads at most `len` bytes into `dst` without blocking, as `recv(2)` with
    /// `MSG_DONTWAIT`: `Ok(0)` is the end of the stream, `WouldBlock` means nothing is
    /// there now.
    ///
    /// # Safety
    ///
    /// The caller guarantees that `dst` is valid for writes of `len` bytes for the
    /// duration of the call and that nothing reads those bytes meanwhile through a Rust
    /// reference.
    unsafe fn recv(&mut self, dst: *mut u8, len: usize) -> io::Result<usize>;
}

/// Where a connection's outgoing bytes go.
pub trait Transmit {
    /// Writes the runs of `iov` in order, as far as possible without blocking, as
    /// `sendmsg(2)` with `MSG_DONTWAIT` and `MSG_NOSIGNAL`: the number of bytes written,
    /// `WouldBlock` if none could be.
    ///
    /// # Safety
    ///
    /// The caller guarantees that every run is valid for reads of its length for the
    /// duration of the call.
    unsafe fn transmit(&mut self, iov: &[RawSlice]) -> io::Result<usize>;
}

/// A [`Recv`] over any [`std::io::Read`], for tests (a blocking reader blocks).
#[cfg(test)]
pub(crate) struct FromRead<R>(pub R);

#[cfg(test)]
impl<R: std::io::Read> Recv for FromRead<R> {
    unsafe fn recv(&mut self, dst: *mut u8, len: usize) -> io::Result<usize> {
        // SAFETY: the caller guarantees `dst` is valid for `len` bytes of writes and not
        // otherwise borrowed for the call.
        let buf = unsafe { std::slice::from_raw_parts_mut(dst, len) };
        self.0.read(buf)
    }
}

/// A [`Transmit`] over any [`std::io::Write`], for tests (a blocking writer blocks).
#[cfg(test)]
pub(crate) struct ToWrite<W>(pub W);

#[cfg(test)]
impl<W: std::io::Write> Transmit for ToWrite<W> {
    unsafe fn transmit(&mut self, iov: &[RawSlice]) -> io::Result<usize> {
        let slices: Vec<std::io::IoSlice<'_>> = iov
            .iter()
            // SAFETY: the caller guarantees each run is valid for reads for the call; the
            // test buffers behind them are not written meanwhile.
            .map(|r| std::io::IoSlice::new(unsafe { std::slice::from_raw_parts(r.base, r.len) }))
            .collect();
        self.0.write_vectored(&slices)
    }
}
