//! The side channel's reads and writes within the exchange's deadline, and the errors
//! they end in (the peer hanging up, the time running out).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::hello::{bad_hello, decode_hello, Hello};
#[cfg(feature = "tokio")]
use super::hello::{parse_hello, HelloParse};
use crate::error::{Error, Result};

/// `now + timeout`, or a time decades away for a timeout too large to add.
pub(super) fn deadline_after(timeout: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(50 * 365 * 24 * 3600);
    let now = Instant::now();
    now.checked_add(timeout.min(FAR)).unwrap_or(now)
}

/// An I/O error of the setup exchange, for both forms: the peer hanging up, or `other`.
pub(super) fn setup_io_err(e: std::io::Error, other: impl FnOnce(std::io::Error) -> Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => {
            Error::Transport("the peer closed the connection during the setup exchange".into())
        }
        _ => other(e),
    }
}

/// A setup I/O error on the blocking form, where timeouts show as WouldBlock/TimedOut.
pub(super) fn io_err(e: std::io::Error, deadline: Instant) -> Error {
    setup_io_err(e, |e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::timeout(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
            "the peer did not answer during the setup exchange",
        ),
        _ => Error::from_io("connection setup", e),
    })
}

pub(super) fn arm(stream: &TcpStream, deadline: Instant) -> Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::timeout(
            Duration::ZERO,
            "the setup exchange ran out of time",
        ));
    }
    stream
        .set_read_timeout(Some(left))
        .and_then(|_| stream.set_write_timeout(Some(left)))
        .map_err(|source| Error::Os {
            call: "setsockopt",
            source,
        })
}

pub(super) fn write_all(s: &mut TcpStream, b: &[u8], deadline: Instant) -> Result<()> {
    arm(s, deadline)?;
    s.write_all(b).map_err(|e| io_err(e, deadline))
}

pub(super) fn read_exact(s: &mut TcpStream, b: &mut [u8], deadline: Instant) -> Result<()> {
    arm(s, deadline)?;
    s.read_exact(b).map_err(|e| io_err(e, deadline))
}

pub(super) fn read_hello(s: &mut TcpStream, deadline: Instant) -> Result<Hello> {
    arm(s, deadline)?;
    match decode_hello(s) {
        Ok(Ok(h)) => Ok(h),
        Ok(Err(msg)) => Err(bad_hello(msg)),
        Err(e) => Err(io_err(e, deadline)),
    }
}

#[cfg(feature = "tokio")]
/// A setup I/O error on the async form (timeouts come from `tokio::time::timeout`).
pub(super) fn aio_err(e: std::io::Error) -> Error {
    setup_io_err(e, |source| Error::from_io("connection setup", source))
}

#[cfg(feature = "tokio")]
/// A hello read from a tokio stream (the caller bounds it in time).
pub(super) async fn read_hello_async(s: &mut tokio::net::TcpStream) -> Result<Hello> {
    let mut buf = Vec::new();
    loop {
        match parse_hello(&buf) {
            Err(msg) => return Err(bad_hello(msg)),
            Ok(HelloParse::Done(e, m, p)) => return Ok((e, m, p)),
            Ok(HelloParse::Need(n)) => {
                let at = buf.len();
                buf.resize(n, 0);
                tokio::io::AsyncReadExt::read_exact(s, &mut buf[at..])
                    .await
                    .map_err(aio_err)?;
            }
        }
    }
}
