//! The progress thread's doorbell (`man 2 eventfd`): rung by threads that leave it work
//! while it sleeps, and whether it sleeps.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::event::epoll::EventFlags;
use rustix::event::{eventfd, EventfdFlags};

use crate::epoll::{add_to, create};

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
        let only = create().map_err(os("epoll_create1"))?;
        let fd = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
            .map_err(|e| os("eventfd")(e.into()))?;
        add_to(epfd, fd.as_fd(), EventFlags::IN, BELL).map_err(os("epoll_ctl"))?;
        add_to(&only, fd.as_fd(), EventFlags::IN, BELL).map_err(os("epoll_ctl"))?;
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

    /// Whether the progress thread sleeps (or is about to) without a bound: it saw no
    /// application thread driving, and nothing but a ring, a connection's readiness or
    /// its next timer wakes it.
    pub fn asleep_unbounded(&self) -> bool {
        // (`bounded` is written before `sleeping`, whose SeqCst load orders this one.)
        self.sleeping.load(Ordering::SeqCst) && !self.bounded.load(Ordering::Relaxed)
    }

    /// Empties the doorbell: how often it was rung since it was last emptied.
    pub fn take_rings(&self) -> u64 {
        let mut v = [0u8; 8];
        match rustix::io::read(&self.fd, &mut v) {
            Ok(8) => u64::from_ne_bytes(v),
            _ => 0,
        }
    }

    pub fn ring(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
}
