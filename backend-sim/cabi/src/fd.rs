//! The descriptors programs get for completion channels and asynchronous events, in the
//! mode libibverbs gives them (`man ibv_get_cq_event`, `man ibv_get_async_event`).
//!
//! libibverbs hands out blocking descriptors, and a program that wants to poll sets
//! `O_NONBLOCK` on one itself; `ibv_get_cq_event` and `ibv_get_async_event` are a
//! `read(2)` of the descriptor, so they then fail with EAGAIN instead of waiting, and a
//! signal interrupts a wait as it interrupts any read. The sim's event queues make their
//! eventfds non-blocking, so this library clears the flag when it hands a descriptor out,
//! and the get verbs read the descriptor in the calling thread as libibverbs does
//! (`verbs_api::event_fd` says how the sim's own reads of it never wait).

use std::os::fd::RawFd;

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
