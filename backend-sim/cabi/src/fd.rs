//! The descriptors programs get for completion channels and asynchronous events, in the
//! mode libibverbs gives them (`man ibv_get_cq_event`, `man ibv_get_async_event`).
//!
//! libibverbs hands out blocking descriptors, and a program that wants to poll sets
//! `O_NONBLOCK` on one itself; `ibv_get_cq_event` and `ibv_get_async_event` then fail
//! with EAGAIN instead of waiting. The sim's event queues make their eventfds
//! non-blocking, so this library clears the flag when it hands a descriptor out, and the
//! get verbs read the flag to choose between waiting and returning at once. Blocking
//! mode costs the sim nothing: it reads an eventfd only after taking an event off its
//! queue, so the count it reads is there (or about to be written by the thread that
//! queued the event), and the counter never fills.

use std::os::fd::RawFd;
use std::time::Duration;

/// Clears `O_NONBLOCK` on `fd`.
pub fn make_blocking(fd: RawFd) {
    // SAFETY: fcntl on a descriptor the sim owns and keeps open; F_GETFL and F_SETFL
    // touch no memory.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
}

/// How long a get verb may wait on `fd`: for ever, or not at all when the program set
/// `O_NONBLOCK`.
pub fn wait_for(fd: RawFd) -> Option<Duration> {
    // SAFETY: F_GETFL touches no memory.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    (flags >= 0 && flags & libc::O_NONBLOCK != 0).then_some(Duration::ZERO)
}
