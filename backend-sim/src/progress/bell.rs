//! The progress thread's doorbell (`man 2 eventfd`): rung by threads that leave it work
//! while it sleeps, and whether it sleeps.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::epoll::add_to;

/// Token of the doorbell in the epoll sets.
pub(super) const BELL: u64 = u64::MAX;

pub(super) struct Bell {
    fd: OwnedFd,
    /// An epoll set with only the doorbell: where the progress thread sleeps while
    /// application threads drive progress themselves.
    pub only: OwnedFd,
    /// Set while the progress thread blocks (or is about to): posters ring the bell.
    pub sleeping: AtomicBool,
    /// Whether that sleep ends by itself when the application threads' driving window
    /// and grace period are over (it slept on the doorbell alone because one drove).
    /// Written before `sleeping`; a thread that starts driving while the progress thread
    /// sleeps without that bound rings it (`Window::active`).
    pub bounded: AtomicBool,
}

impl Bell {
    /// A doorbell, also registered in `epfd` (the set of the device's connections).
    pub fn new(epfd: &OwnedFd) -> verbs_api::Result<Bell> {
        let os = |call: &'static str| move |source| verbs_api::Error::Os { call, source };
        // SAFETY (both): plain syscalls without pointers; results are checked.
        let only = super::new_fd(
            unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
            "epoll_create1",
        )?;
        let fd = super::new_fd(
            unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) },
            "eventfd",
        )?;
        add_to(epfd, fd.as_raw_fd(), libc::EPOLLIN as u32, BELL).map_err(os("epoll_ctl"))?;
        add_to(&only, fd.as_raw_fd(), libc::EPOLLIN as u32, BELL).map_err(os("epoll_ctl"))?;
        Ok(Bell {
            fd,
            only,
            sleeping: AtomicBool::new(false),
            bounded: AtomicBool::new(false),
        })
    }

    /// Whether the progress thread sleeps (or is about to).
    pub fn asleep(&self) -> bool {
        self.sleeping.load(Ordering::SeqCst)
    }

    /// Empties the doorbell: how often it was rung since it was last emptied.
    pub fn take_rings(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own (non-blocking) eventfd.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if r == 8 {
            v
        } else {
            0
        }
    }

    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}
