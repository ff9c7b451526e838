//! The byte stream of a QP pair's connection, whichever way it runs: TCP (`tcp(7)`), or
//! for two devices on the same host a unix stream socket (`unix(7)`, see
//! [`same_host`](crate::same_host)). Both are reliable, ordered byte streams read and
//! written through the same system calls (`recv`, `send`, `sendmsg`, `FIONREAD`,
//! epoll, ppoll), so the data path carries the same frames over either, byte for byte.
//!
//! [`Stream`] is the stream on the setup runtime: a connection while it is set up (the
//! hello and its check), and a UD link for its life; [`DataSock`] is the descriptor the
//! data path takes over from a QP pair's connection, with the addresses the connection
//! stands for (what a capture writes into its packets).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// A connection on the setup runtime.
pub enum Stream {
    /// Over TCP.
    Tcp(TcpStream),
    /// Over a unix stream socket, to a device on the same host, with the addresses the
    /// connection stands for (this device's, the peer device's).
    Unix(UnixStream, SocketAddr, SocketAddr),
}

impl Stream {
    /// Waits until the socket may be readable (`tokio`'s readiness).
    pub async fn readable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.readable().await,
            Stream::Unix(s, ..) => s.readable().await,
        }
    }

    /// Waits until the socket may be writable.
    pub async fn writable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.writable().await,
            Stream::Unix(s, ..) => s.writable().await,
        }
    }

    /// Runs `f` on the socket, clearing its readiness if `f` would block.
    pub fn try_io<R>(
        &self,
        interest: tokio::io::Interest,
        f: impl FnOnce() -> io::Result<R>,
    ) -> io::Result<R> {
        match self {
            Stream::Tcp(s) => s.try_io(interest, f),
            Stream::Unix(s, ..) => s.try_io(interest, f),
        }
    }

    /// The descriptor the data path takes over (out of the setup runtime's hands).
    pub fn into_data(self) -> io::Result<DataSock> {
        match self {
            Stream::Tcp(s) => {
                let s = s.into_std()?;
                Ok(DataSock {
                    local: s.local_addr().ok(),
                    peer: s.peer_addr().ok(),
                    same_host: false,
                    fd: s.into(),
                })
            }
            Stream::Unix(s, local, peer) => {
                let s = s.into_std()?;
                crate::same_host::tune(&s)?;
                Ok(DataSock {
                    fd: s.into(),
                    local: Some(local),
                    peer: Some(peer),
                    same_host: true,
                })
            }
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s, ..) => s.as_raw_fd(),
        }
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Stream::Tcp($s) => $e,
            Stream::Unix($s, ..) => $e,
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_shutdown(cx))
    }
}

/// An established connection's socket, as the data path uses it.
pub struct DataSock {
    fd: OwnedFd,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    same_host: bool,
}

impl DataSock {
    /// Switches `O_NONBLOCK`.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        socket2::SockRef::from(&self.fd).set_nonblocking(on)
    }

    /// Shuts both directions down (`man 2 shutdown`): the peer reads the end of the
    /// stream, and any thread still using the descriptor finds it closed.
    pub fn shutdown(&self) -> io::Result<()> {
        socket2::SockRef::from(&self.fd).shutdown(std::net::Shutdown::Both)
    }

    /// This end's address (for a same-host connection: its device's).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// The peer's address (for a same-host connection: its device's).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Whether the connection runs over a unix socket to a device on the same host.
    pub fn is_same_host(&self) -> bool {
        self.same_host
    }
}

impl AsFd for DataSock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for DataSock {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
