//! The system calls of the data path: the socket calls (`man 2 recv`, `man 2 send`,
//! `man 2 sendmsg`), made with `syscall(2)` rather than through glibc's `recv`, `send`
//! and `sendmsg`, and the clock (`man 2 clock_gettime`, through rustix's vDSO call) read
//! as nanoseconds.
//!
//! glibc's wrappers of these calls are cancellation points (`man 7 pthreads`): in a
//! process with more than one thread each call first switches the thread to
//! asynchronous cancellation and afterwards back, two compare-and-swap loops on the
//! thread's cancellation state around the system call. The sim never cancels a thread,
//! and a spinning poller makes one of these calls per connection and turn, so it skips
//! them: callgrind counts about 40 instructions and two locked instructions per call in
//! the wrappers. Same arguments, same results and same `errno` as the wrappers.
//!
//! Why not rustix here, as for epoll, eventfd, the affinity mask and the clock: its
//! socket calls take their buffers as Rust references (`&mut [u8]`, `IoSlice`), and
//! these buffers are registered memory, which the application (or a peer's RDMA WRITE)
//! may read or write while the call runs. A reference to such memory would be undefined
//! behaviour; these wrappers take raw pointers, as the kernel does.

use std::io;
use std::os::fd::RawFd;

use backend_sim_proto::io::RawSlice;

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of [`std::time::Instant`] on Linux, read
/// through the vDSO as `Instant::now` reads it, without the conversion of an `Instant`
/// to a `Duration` (a checked subtraction of two `timespec`s and a normalization).
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Converts a raw system call result (`-1` with `errno` set on failure).
fn result(r: libc::c_long) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `recv(fd, buf, len, flags)`, as `recvfrom` with no address (what glibc's `recv`
/// calls too).
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes for the duration of the call.
pub unsafe fn recv(fd: RawFd, buf: *mut u8, len: usize, flags: libc::c_int) -> io::Result<usize> {
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: the caller guarantees `buf..buf + len` is writable; no address is asked
    // for (null pointers, which the kernel accepts).
    result(unsafe { libc::syscall(libc::SYS_recvfrom, fd, buf, len, flags, null, null) })
}

/// `send(fd, buf, len, flags)`, as `sendto` with no address (what glibc's `send` calls).
///
/// # Safety
/// `buf` must be valid for reads of `len` bytes for the duration of the call.
pub unsafe fn send(fd: RawFd, buf: *const u8, len: usize, flags: libc::c_int) -> io::Result<usize> {
    let null = std::ptr::null::<libc::c_void>();
    // SAFETY: the caller guarantees `buf..buf + len` is readable; no address is given.
    result(unsafe { libc::syscall(libc::SYS_sendto, fd, buf, len, flags, null, 0 as libc::socklen_t) })
}

/// `sendmsg(fd, msg, flags)`.
///
/// # Safety
/// `msg` and every buffer its iovecs point to must be valid for reads for the duration
/// of the call.
pub unsafe fn sendmsg(fd: RawFd, msg: &libc::msghdr, flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: the caller guarantees the message and its buffers are readable.
    result(unsafe { libc::syscall(libc::SYS_sendmsg, fd, msg as *const libc::msghdr, flags) })
}

/// A connection's socket as the protocol core's byte source and sink
/// ([`backend_sim_proto::io`]): `recv` with `MSG_DONTWAIT`; one run by `send`, a gather
/// list by `sendmsg`, both with `MSG_DONTWAIT | MSG_NOSIGNAL` (so a closed peer is
/// `EPIPE`, not `SIGPIPE`).
#[derive(Clone, Copy, Debug)]
pub struct Sock(pub RawFd);

impl backend_sim_proto::io::Recv for Sock {
    unsafe fn recv(&mut self, dst: *mut u8, len: usize) -> io::Result<usize> {
        // SAFETY: the caller (the protocol core) guarantees `dst..dst + len` is writable.
        unsafe { recv(self.0, dst, len, libc::MSG_DONTWAIT) }
    }
}

// `RawSlice` is laid out as `struct iovec`: a gather list goes to the kernel as it is.
const _: () = {
    assert!(std::mem::size_of::<RawSlice>() == std::mem::size_of::<libc::iovec>());
    assert!(std::mem::align_of::<RawSlice>() == std::mem::align_of::<libc::iovec>());
};

impl backend_sim_proto::io::Transmit for Sock {
    unsafe fn transmit(&mut self, iov: &[RawSlice]) -> io::Result<usize> {
        let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
        if let [one] = iov {
            // One run (a small message: header and inline payload are contiguous) by
            // `send`, which spares the kernel copying in a `msghdr` and walking an iovec:
            // on loopback ~170 ns less per message.
            // SAFETY: the caller guarantees the run is readable for the call.
            return unsafe { send(self.0, one.base, one.len, flags) };
        }
        let msg = libc::msghdr {
            msg_name: std::ptr::null_mut(),
            msg_namelen: 0,
            // The kernel only reads the iovecs (a `*mut` by the C declaration).
            msg_iov: iov.as_ptr() as *mut libc::iovec,
            msg_iovlen: iov.len(),
            msg_control: std::ptr::null_mut(),
            msg_controllen: 0,
            msg_flags: 0,
        };
        // SAFETY: `RawSlice` has the layout of `iovec` (checked above); the caller
        // guarantees every run is readable for the call; `msg` lives across it.
        unsafe { sendmsg(self.0, &msg, flags) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    /// The raw reading is the clock of `Instant`: between two `Instant`s it moves as far
    /// as they are apart, within the time the reads themselves take.
    #[test]
    fn monotonic_ns_runs_with_instant() {
        let (i0, n0) = (Instant::now(), monotonic_ns());
        std::thread::sleep(Duration::from_millis(20));
        let (n1, i1) = (monotonic_ns(), Instant::now());
        let raw = n1 - n0;
        let std = i1.duration_since(i0).as_nanos() as u64;
        assert!(raw <= std, "{raw} ns read inside {std} ns");
        assert!(std - raw < 5_000_000, "{raw} ns against {std} ns");
        assert!(raw >= 20_000_000, "slept 20 ms, the clock moved {raw} ns");
    }

    #[test]
    fn the_calls_move_bytes_and_report_errno_as_the_wrappers_do() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let mut buf = [0u8; 16];
        let dontwait = libc::MSG_DONTWAIT;
        // Nothing to read yet: EAGAIN, as `recv` reports it.
        // SAFETY: `buf` is ours and 16 bytes long.
        let e = unsafe { recv(b.as_raw_fd(), buf.as_mut_ptr(), buf.len(), dontwait) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        // SAFETY: a static 5-byte string.
        let n = unsafe { send(a.as_raw_fd(), b"hello".as_ptr(), 5, libc::MSG_NOSIGNAL) }.unwrap();
        assert_eq!(n, 5);
        let parts = [b"to".as_slice(), b"gether".as_slice()];
        let mut iov = parts.map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        });
        // SAFETY: all-zero is a valid empty `msghdr`.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        // SAFETY: the iovecs point to static strings; `iov` outlives the call.
        let n = unsafe { sendmsg(a.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) }.unwrap();
        assert_eq!(n, 8);
        let mut got = Vec::new();
        while got.len() < 13 {
            // SAFETY: as above.
            let n = unsafe { recv(b.as_raw_fd(), buf.as_mut_ptr(), buf.len(), 0) }.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"hellotogether");
        // A bad descriptor: EBADF, from errno.
        // SAFETY: as above; the call fails before touching the buffer.
        let e = unsafe { recv(-1, buf.as_mut_ptr(), buf.len(), dontwait) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        // The peer gone: the end of the stream reads as 0 bytes.
        drop(a);
        // SAFETY: as above.
        let n = unsafe { recv(b.as_raw_fd(), buf.as_mut_ptr(), buf.len(), 0) }.unwrap();
        assert_eq!(n, 0);
    }
}
