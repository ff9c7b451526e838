//! The counter behind an event queue's descriptor (a completion channel's `fd`, a
//! context's `async_fd`): an eventfd in semaphore mode holding one count per queued event,
//! so that it polls readable exactly while an event is pending. A building block for
//! backends.
//!
//! Two kinds of reader take counts off it. A reader that takes an event as libibverbs
//! does (`man ibv_get_cq_event`, `man ibv_get_async_event`: a `read(2)` of the descriptor
//! in the calling thread) takes the count first ([`take`]) and then the event it stands
//! for; that read blocks or not as the descriptor's `O_NONBLOCK` says, and a signal
//! interrupts it exactly as it interrupts the kernel's read of a uverbs event file (EINTR,
//! or a restart when the handler was installed with `SA_RESTART`: both reads answer
//! `-ERESTARTSYS`). The queue itself takes a count off when an event leaves it otherwise
//! (taken with a timeout, dropped with its object, dropped from a full queue); that take
//! must never wait ([`take_nowait`]), whatever mode a program set on the descriptor,
//! since a reader of the first kind may have taken that count already. It then finds the
//! queue without the event, and reads again.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::error::{Error, Result};

/// A new counter: an eventfd in semaphore mode, non-blocking and close-on-exec. `what`
/// names it in the error.
pub fn new(what: &'static str) -> Result<OwnedFd> {
    // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::Os {
            call: what,
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One count on (an event was queued).
pub fn signal(fd: BorrowedFd<'_>) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd; the counter cannot reach its
    // maximum (one count per queued event), so the write never blocks.
    let _ = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// One count off, as `read(2)` of the descriptor in its own mode: waits for one unless
/// the descriptor is `O_NONBLOCK` (then EAGAIN), and a signal interrupts the wait as it
/// interrupts any read (EINTR, unless `SA_RESTART` restarts it). `call` names the verb in
/// the error.
pub fn take(fd: BorrowedFd<'_>, call: &'static str) -> Result<()> {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64; in semaphore mode this takes one count.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    if n == 8 {
        Ok(())
    } else {
        Err(Error::Os {
            call,
            source: std::io::Error::last_os_error(),
        })
    }
}

/// One count off if there is one, never waiting, whatever `O_NONBLOCK` a program set on
/// the descriptor (`RWF_NOWAIT` makes this one read non-blocking). Whether a count was
/// taken.
pub fn take_nowait(fd: BorrowedFd<'_>) -> bool {
    let mut v: u64 = 0;
    let iov = libc::iovec {
        iov_base: (&mut v as *mut u64).cast(),
        iov_len: 8,
    };
    // SAFETY: one iovec over a live u64; offset -1 reads at the current position, which
    // an eventfd ignores.
    let n = unsafe {
        libc::preadv2(
            fd.as_raw_fd(),
            &iov as *const libc::iovec,
            1,
            -1,
            libc::RWF_NOWAIT,
        )
    };
    if n == 8 {
        return true;
    }
    if std::io::Error::last_os_error().raw_os_error() != Some(libc::EOPNOTSUPP) {
        return false;
    }
    // A kernel whose eventfd does not take RWF_NOWAIT: a plain read where the descriptor
    // is non-blocking. On a blocking one the count stays: a read could wait (with the
    // queue's lock held) for a count a reader took meanwhile, and a count left over only
    // makes the descriptor poll readable once too often (its reader finds no event and
    // reads again).
    // SAFETY: F_GETFL touches no memory; then a read of 8 bytes into a live u64.
    unsafe {
        libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) & libc::O_NONBLOCK != 0
            && libc::read(fd.as_raw_fd(), iov.iov_base, iov.iov_len) == 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn set_blocking(fd: BorrowedFd<'_>) {
        // SAFETY: fcntl on a live descriptor touches no memory.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }

    #[test]
    fn take_nowait_never_waits_on_a_blocking_descriptor() {
        let fd = new("test").unwrap();
        set_blocking(fd.as_fd());
        assert!(!take_nowait(fd.as_fd()));
        signal(fd.as_fd());
        signal(fd.as_fd());
        assert!(take_nowait(fd.as_fd()));
        take(fd.as_fd(), "read").unwrap();
        assert!(!take_nowait(fd.as_fd()), "each count is taken once");
    }

    #[test]
    fn take_on_a_non_blocking_descriptor_is_eagain() {
        let fd = new("test").unwrap();
        let e = take(fd.as_fd(), "read").unwrap_err();
        assert_eq!(e.errno(), libc::EAGAIN);
    }
}
