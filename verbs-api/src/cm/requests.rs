//! Clients' connection requests, read from every client connected at once on the
//! caller's thread ([`CmListener::request`]), bounded as [`admission`] says: at most
//! [`SETUP_BOUND`]`.max` connections in setup (beyond that a newcomer sheds one that has
//! sent nothing, or the oldest once it has waited), none past its request timeout
//! ([`REQUEST_TIMEOUT`] unless set otherwise), descriptors kept in reserve for the
//! clients being served, and no thread per connection. Clients speak first (the hello),
//! so a flood's silent connections give way to a client whose request arrives.
//!
//! [`CmListener::request`]: super::CmListener::request

use std::collections::VecDeque;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::accept::FdEpisode;
use super::accept::{accept_retryable, fd_errno, Backoff};
use super::hello::{bad_hello, parse_hello, Hello, HelloParse};
use super::io::setup_io_err;
use super::request::ConnectRequest;
use crate::admission::{self, held_back_note, Admitted, Bound, InSetup, WarnBudget};
use crate::error::{Error, Result};

/// The bound on a [`CmListener`](super::CmListener)'s connections in setup: 64 at once, one shed for a
/// newcomer once it has waited 200 ms (at any age if it has sent nothing), and 64
/// descriptors kept free.
pub const SETUP_BOUND: Bound = Bound {
    max: 64,
    min_shed_age: Duration::from_millis(200),
    fd_reserve: 64,
};

/// How long a client may take, once connected, to send its whole connection request
/// ([`CmListener::with_request_timeout`](super::CmListener::with_request_timeout) sets another).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Warnings about dropped clients: the first 8 in each 10 s, then a count.
pub(super) const WARNINGS: (Duration, u32) = (Duration::from_secs(10), 8);

/// The connections of a [`CmListener`](super::CmListener) whose request has not arrived yet, and those whose
/// request arrived while room was made (taken first).
#[derive(Debug)]
pub(super) struct Pending {
    set: InSetup<Conn>,
    arrived: VecDeque<ConnectRequest>,
    pub(super) request_timeout: Duration,
    warn: WarnBudget,
}

impl Default for Pending {
    fn default() -> Self {
        Pending {
            set: InSetup::new(SETUP_BOUND),
            arrived: VecDeque::new(),
            request_timeout: REQUEST_TIMEOUT,
            warn: WarnBudget::new(WARNINGS.0, WARNINGS.1),
        }
    }
}

/// How far a connection's request got.
#[derive(Debug)]
enum Progress {
    /// Bytes are still missing.
    Reading,
    /// All of it arrived.
    Done(Hello),
    /// The client is dropped, for this reason.
    Failed(Error),
}

/// A client connected, its request not yet whole.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    buf: Vec<u8>,
    progress: Progress,
}

impl Conn {
    /// Reads what has arrived, as far as the request goes (not a byte past it).
    fn advance(&mut self) {
        while matches!(self.progress, Progress::Reading) {
            let need = match parse_hello(&self.buf) {
                Err(msg) => {
                    self.progress = Progress::Failed(bad_hello(msg));
                    return;
                }
                Ok(HelloParse::Done(e, m, p)) => {
                    self.progress = Progress::Done((e, m, p));
                    return;
                }
                Ok(HelloParse::Need(n)) => n,
            };
            let at = self.buf.len();
            self.buf.resize(need, 0);
            let r = (&self.stream).read(&mut self.buf[at..]);
            self.buf.truncate(at + *r.as_ref().unwrap_or(&0));
            match r {
                Ok(0) => {
                    let eof = std::io::ErrorKind::UnexpectedEof.into();
                    self.progress = Progress::Failed(setup_io_err(eof, |e| Error::from_io("read", e)));
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => self.progress = Progress::Failed(setup_io_err(e, |e| Error::from_io("read", e))),
            }
        }
    }

    /// Whether nothing has arrived from the client (after a last look).
    fn silent(&mut self) -> bool {
        self.advance();
        self.buf.is_empty() && matches!(self.progress, Progress::Reading)
    }
}

impl Pending {
    /// A client whose request arrived, if one did: reads every connection, drops those
    /// that failed or ran out of time (with a warning naming them).
    pub(super) fn take_arrived(&mut self) -> Option<ConnectRequest> {
        let timeout = self.request_timeout;
        for (at, c) in self.set.iter_mut() {
            c.advance();
            if matches!(c.progress, Progress::Reading) && at.elapsed() >= timeout {
                c.progress =
                    Progress::Failed(Error::timeout(timeout, "the client sent no connection request"));
            }
        }
        self.settle();
        self.arrived.pop_front()
    }

    /// Moves the requests that arrived out of setup, and drops the connections that failed.
    fn settle(&mut self) {
        for c in self.set.take_if(|c| !matches!(c.progress, Progress::Reading)) {
            match c.progress {
                Progress::Done(hello) => self.arrived.push_back(request(c.stream, c.peer, hello)),
                Progress::Failed(e) => {
                    if let Some(n) = self.warn.take() {
                        tracing::warn!("dropped the client at {}: {e}{}", c.peer, held_back_note(n));
                    }
                }
                Progress::Reading => {}
            }
        }
    }

    /// Takes `stream` into setup (or refuses it, or sheds another for it).
    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) {
        let reserve = self.set.bound().fd_reserve;
        // Short of descriptors, this one comes in only in the place of one in setup: the
        // descriptors in reserve are the served clients'.
        if admission::short_of_descriptors(stream.as_raw_fd(), reserve)
            && self.set.shed_one(Conn::silent).is_none()
        {
            if let Some(n) = self.warn.take() {
                tracing::warn!(
                    "refused the client at {peer}: fewer than {reserve} descriptors would be left for the \
                     clients being served (the open-file limit is {}){}",
                    crate::error::open_file_limit().map_or("unknown".into(), |l| l.to_string()),
                    held_back_note(n)
                );
            }
            return;
        }
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        let _ = stream.set_nodelay(true);
        let mut conn = Conn {
            stream,
            peer,
            buf: Vec::new(),
            progress: Progress::Reading,
        };
        conn.advance();
        let max = self.set.bound().max;
        match self.set.admit_shedding(conn, Conn::silent) {
            Admitted::Yes => {}
            Admitted::Shedding(old) => {
                if let Some(n) = self.warn.take() {
                    tracing::warn!(
                        "dropped the client at {}: {max} clients were connecting and it had sent {} \
                         bytes of its connection request{}",
                        old.peer,
                        old.buf.len(),
                        held_back_note(n)
                    );
                }
            }
            Admitted::Refused(new) => tracing::debug!(
                "refused the client at {}: {max} clients are connecting, none yet for {:?}",
                new.peer,
                self.set.bound().min_shed_age
            ),
        }
        self.settle();
    }

    /// Accepts every connection waiting; `Err` with the pause to take when out of
    /// descriptors (after shedding the oldest half in setup), or the listener's failure.
    pub(super) fn accept_waiting(
        &mut self,
        l: &TcpListener,
        fds: &FdEpisode,
        backoff: &mut Backoff,
    ) -> Result<Option<Duration>> {
        loop {
            if self.arrived.len() >= self.set.bound().max {
                // Requests wait to be taken: newcomers wait in the listen backlog.
                return Ok(None);
            }
            match l.accept() {
                Ok((stream, peer)) => {
                    fds.recovered(l.local_addr().ok());
                    *backoff = Backoff::default();
                    self.admit(stream, peer);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if accept_retryable(&e) => {}
                Err(e) => match fd_errno(&e) {
                    Some(errno) => {
                        fds.starved(l.local_addr().ok(), errno);
                        drop(self.set.shed_half());
                        return Ok(Some(backoff.next()));
                    }
                    None => return Err(Error::from_io("accept", e)),
                },
            }
        }
    }

    /// Waits until the listener or a connection in setup is readable, a request runs out
    /// of time, `pause` passes or `deadline` comes.
    pub(super) fn wait(&mut self, l: &TcpListener, deadline: Instant, pause: Option<Duration>) {
        let now = Instant::now();
        let mut until = deadline;
        if let Some(p) = pause {
            until = until.min(now + p);
        }
        let mut fds = Vec::with_capacity(self.set.len() + 1);
        if pause.is_none() {
            fds.push(pollfd(l.as_raw_fd()));
        }
        for (at, c) in self.set.iter_mut() {
            fds.push(pollfd(c.stream.as_raw_fd()));
            until = until.min(at + self.request_timeout);
        }
        let ms = until
            .saturating_duration_since(now)
            .as_millis()
            .min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structs, which poll writes
        // the `revents` of.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms.max(1)) };
    }
}

fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// The request read from `stream` (set back to blocking for the rest of the exchange).
fn request(stream: TcpStream, peer: SocketAddr, (endpoint, mrs, private_data): Hello) -> ConnectRequest {
    let _ = stream.set_nonblocking(false);
    ConnectRequest {
        stream,
        peer,
        endpoint,
        mrs,
        private_data,
    }
}
