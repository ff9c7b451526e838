//! The epoll calls of the data path (`man epoll_ctl`, `man epoll_wait`): creating a set
//! and registering descriptors (through rustix), and waiting with a timeout.
//!
//! The wait is this module's own: rustix's `epoll::wait` either rounds its timeout to
//! milliseconds (`epoll_pwait`) or, built for Linux 5.11, calls `epoll_pwait2` with no
//! way back when the kernel (or valgrind, which the cost measurements run under) lacks it.
//!
//! A wait takes a nanosecond timeout (`epoll_pwait2`, Linux 5.11 and later): the progress
//! thread sleeps until the next timer or the end of a driving window, which are
//! microseconds apart. Where the kernel lacks `epoll_pwait2` (it fails with `ENOSYS`:
//! kernels before 5.11, or valgrind 3.19, which does not know the call), every wait from
//! then on is an `epoll_wait` with the timeout in milliseconds, rounded up: a timer then
//! fires up to a millisecond late, never early. Without the fallback such a system saw
//! no event at all, and the progress thread never serviced a connection.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use rustix::event::epoll::{self, EventFlags};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Set once `epoll_pwait2` failed with `ENOSYS`.
static NO_PWAIT2: AtomicBool = AtomicBool::new(false);

/// Waits for events on `ep` for at most `timeout` (`None`: for ever; zero: a poll) and
/// returns how many were written to `events` (0 on timeout or when interrupted).
pub fn wait_on(ep: &OwnedFd, events: &mut [libc::epoll_event], timeout: Option<Duration>) -> usize {
    if !NO_PWAIT2.load(Ordering::Relaxed) {
        match pwait2(ep, events, timeout) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                tracing::debug!("epoll_pwait2 is not available: waiting with epoll_wait");
                NO_PWAIT2.store(true, Ordering::Relaxed);
            }
            r => return r.unwrap_or(0),
        }
    }
    wait_millis(ep, events, timeout).unwrap_or(0)
}

/// `epoll_pwait2` with a nanosecond timeout.
fn pwait2(ep: &OwnedFd, events: &mut [libc::epoll_event], timeout: Option<Duration>) -> io::Result<usize> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `events` is a writable array of `events.len()` epoll_events; `tsp` is null or
    // points to a live timespec; a null sigmask leaves the signal mask alone.
    let n = unsafe {
        libc::epoll_pwait2(
            ep.as_raw_fd(),
            events.as_mut_ptr(),
            events.len().min(i32::MAX as usize) as i32,
            tsp,
            std::ptr::null(),
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `epoll_wait` with the timeout rounded up to milliseconds.
fn wait_millis(
    ep: &OwnedFd,
    events: &mut [libc::epoll_event],
    timeout: Option<Duration>,
) -> io::Result<usize> {
    // SAFETY: `events` is a writable array of `events.len()` epoll_events.
    let n = unsafe {
        libc::epoll_wait(
            ep.as_raw_fd(),
            events.as_mut_ptr(),
            events.len().min(i32::MAX as usize) as i32,
            millis_up(timeout),
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// A timeout as `epoll_wait` takes it: milliseconds, rounded up (so that a wait never ends
/// before the time asked for), at most `i32::MAX`; -1 for none.
fn millis_up(timeout: Option<Duration>) -> i32 {
    timeout.map_or(-1, |t| {
        let ms = t.as_nanos().div_ceil(1_000_000);
        ms.min(i32::MAX as u128) as i32
    })
}

/// A new epoll set (close-on-exec).
pub fn create() -> io::Result<OwnedFd> {
    Ok(epoll::create(epoll::CreateFlags::CLOEXEC)?)
}

/// Adds `fd` to `ep` for `events`, reported with `token`.
pub fn add_to(ep: &OwnedFd, fd: BorrowedFd<'_>, events: EventFlags, token: u64) -> io::Result<()> {
    Ok(epoll::add(ep, fd, epoll::EventData::new_u64(token), events)?)
}

/// Changes the events `fd` is watched for in `ep`.
pub fn modify(ep: &OwnedFd, fd: BorrowedFd<'_>, events: EventFlags, token: u64) -> io::Result<()> {
    Ok(epoll::modify(ep, fd, epoll::EventData::new_u64(token), events)?)
}

/// Takes `fd` out of `ep`.
pub fn delete(ep: &OwnedFd, fd: BorrowedFd<'_>) -> io::Result<()> {
    Ok(epoll::delete(ep, fd)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::time::Instant;

    #[test]
    fn timeouts_round_up_to_milliseconds() {
        assert_eq!(millis_up(None), -1);
        assert_eq!(millis_up(Some(Duration::ZERO)), 0);
        assert_eq!(millis_up(Some(Duration::from_nanos(1))), 1);
        assert_eq!(millis_up(Some(Duration::from_millis(1))), 1);
        assert_eq!(millis_up(Some(Duration::from_nanos(1_000_001))), 2);
        assert_eq!(millis_up(Some(Duration::from_secs(u64::MAX))), i32::MAX);
    }

    /// Both ways of waiting report a ready descriptor with its token, and wait at least
    /// the time asked for when nothing is ready (the fallback cannot be reached through
    /// `wait_on` on a kernel that has `epoll_pwait2`, so it is called directly).
    #[test]
    fn both_waits_report_readiness_and_honour_the_timeout() {
        type Wait = fn(&OwnedFd, &mut [libc::epoll_event], Option<Duration>) -> io::Result<usize>;
        let waits: [(&str, Wait); 2] = [("epoll_pwait2", pwait2), ("epoll_wait", wait_millis)];
        for (name, wait) in waits {
            let ep = create().unwrap();
            let flags = rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC;
            let efd = rustix::event::eventfd(0, flags).unwrap();
            add_to(&ep, efd.as_fd(), EventFlags::IN, 77).unwrap();
            let mut events = [libc::epoll_event { events: 0, u64: 0 }; 4];
            let t0 = Instant::now();
            assert_eq!(
                wait(&ep, &mut events, Some(Duration::from_micros(2500))).unwrap(),
                0,
                "{name}"
            );
            assert!(t0.elapsed() >= Duration::from_micros(2500), "{name} woke early");
            assert_eq!(rustix::io::write(&efd, &1u64.to_ne_bytes()).unwrap(), 8);
            assert_eq!(wait(&ep, &mut events, None).unwrap(), 1, "{name}");
            let token = events[0].u64;
            assert_eq!(token, 77, "{name}");
        }
    }
}
