//! Accepting a client while the process may be out of file descriptors: accept(2)
//! retried with a back-off within the call's timeout, errors about one connection
//! retried at once, and one warning per episode naming the open-file limit.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::io::deadline_after;
use crate::error::{open_file_limit, Error, Result};

/// The back-off of an accept loop while the process is out of descriptors.
const FD_BACKOFF_FIRST: Duration = Duration::from_millis(1);
/// Its longest pause.
const FD_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The pause before the next attempt: 1 ms, doubling to [`FD_BACKOFF_MAX`].
#[derive(Debug, Default)]
pub(super) struct Backoff(Option<Duration>);

impl Backoff {
    pub(super) fn next(&mut self) -> Duration {
        let d = self.0.map_or(FD_BACKOFF_FIRST, |d| (d * 2).min(FD_BACKOFF_MAX));
        self.0 = Some(d);
        d
    }
}

/// Errors of accept(2) that mean the process or system is out of file descriptors.
pub(super) fn fd_errno(e: &std::io::Error) -> Option<i32> {
    e.raw_os_error()
        .filter(|&n| n == libc::EMFILE || n == libc::ENFILE)
}

/// Errors of accept(2) about one connection, not the listener (accept(2): "treat them
/// like EAGAIN by retrying"): a client that reset before it was accepted, a signal.
pub(super) fn accept_retryable(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Interrupted
        || matches!(
            e.raw_os_error(),
            Some(
                libc::ECONNABORTED
                    | libc::EPROTO
                    | libc::ENETDOWN
                    | libc::ENOPROTOOPT
                    | libc::EHOSTDOWN
                    | libc::ENONET
                    | libc::EHOSTUNREACH
                    | libc::EOPNOTSUPP
                    | libc::ENETUNREACH
            )
        )
}

/// One listener's running out of descriptors: a warning when an episode starts, once,
/// and a note when accept works again.
#[derive(Debug, Default)]
pub(super) struct FdEpisode(AtomicBool);

impl FdEpisode {
    pub(super) fn starved(&self, listener: Option<SocketAddr>, errno: i32) {
        if !self.0.swap(true, Ordering::Relaxed) {
            let e = Error::OutOfFiles {
                call: "accept",
                errno,
                limit: open_file_limit(),
            };
            let on = listener.map_or_else(String::new, |a| format!(" on {a}"));
            tracing::warn!(
                "cm listener{on}: {e}; clients wait in the listen backlog, retrying every {FD_BACKOFF_FIRST:?} \
                 backing off to {FD_BACKOFF_MAX:?} until descriptors are freed"
            );
        }
    }

    pub(super) fn recovered(&self, listener: Option<SocketAddr>) {
        if self.0.swap(false, Ordering::Relaxed) {
            let on = listener.map_or_else(String::new, |a| format!(" on {a}"));
            tracing::info!("cm listener{on}: descriptors are free again, accepting clients");
        }
    }
}

/// The next client of `l` within `timeout`, waiting out a shortage of descriptors.
pub(super) fn accept_within(
    l: &TcpListener,
    fds: &FdEpisode,
    timeout: Duration,
) -> Result<(TcpStream, SocketAddr)> {
    let os = |call| move |source| Error::Os { call, source };
    l.set_nonblocking(true).map_err(os("fcntl"))?;
    let deadline = deadline_after(timeout);
    let mut backoff = Backoff::default();
    let r = loop {
        let pause = match l.accept() {
            Ok(x) => {
                fds.recovered(l.local_addr().ok());
                break Ok(x);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                backoff = Backoff::default();
                Duration::from_millis(2)
            }
            // Again at once, but not past the deadline.
            Err(e) if accept_retryable(&e) => Duration::ZERO,
            Err(e) => match fd_errno(&e) {
                Some(errno) => {
                    fds.starved(l.local_addr().ok(), errno);
                    if Instant::now() >= deadline {
                        break Err(Error::from_io("accept", e));
                    }
                    backoff.next()
                }
                None => break Err(Error::from_io("accept", e)),
            },
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Err(Error::timeout(timeout, "no client connected"));
        }
        std::thread::sleep(pause.min(left));
    };
    l.set_nonblocking(false).map_err(os("fcntl"))?;
    let (s, a) = r?;
    s.set_nonblocking(false).map_err(os("fcntl"))?;
    Ok((s, a))
}
