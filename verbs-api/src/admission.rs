//! Admission of connections at a port anyone may reach (a device's listener, a [`cm`]
//! listener, an example server's setup port): what a server holds for connections it has
//! not set up yet, bounded, so that whoever connects as often as they like and then says
//! nothing cannot take its descriptors, its threads, or the clients it serves.
//!
//! - [`InSetup`]: at most [`Bound::max`] connections in setup at once. A newcomer beyond
//!   that sheds the oldest if that one has been in setup for [`Bound::min_shed_age`]
//!   (longer than a legitimate setup takes), and is refused (closed at once) if not, so
//!   that the silent connections of a flood are shed once they have waited, and a burst
//!   of legitimate ones is let in as fast as setups finish instead of shedding one
//!   another. Where clients speak first, a connection that has sent nothing may be shed
//!   at any age ([`InSetup::admit_shedding`]): a legitimate client's request arrives
//!   with its connection, so a flood's silent connections give way to it at once.
//! - Running out of descriptors (`accept(2)` failing with `EMFILE` or `ENFILE`) sheds the
//!   oldest half of the connections in setup.
//! - [`Bound::fd_reserve`]: a connection whose descriptor leaves fewer than this many
//!   free is refused ([`short_of_descriptors`]), so that the clients being served find
//!   descriptors for their QPs' connections.
//! - [`accept_loop`] (with the `tokio` feature) does all of it on tokio, a setup task per
//!   connection; the blocking [`CmListener::request`](crate::cm::CmListener::request)
//!   reads every connection in setup on the caller's thread.
//!
//! [`cm`]: crate::cm

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::error::open_file_limit;

/// The bounds of a port's connections in setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// Most connections in setup at once.
    pub max: usize,
    /// How long a connection is in setup before a newcomer may shed it.
    pub min_shed_age: Duration,
    /// Descriptors kept free: a connection that leaves fewer is refused (0: none kept;
    /// at most an eighth of the open-file limit is kept, so that a process with a low
    /// limit still serves).
    pub fd_reserve: usize,
}

/// What became of a newcomer offered to [`InSetup::admit`].
#[derive(Debug, PartialEq, Eq)]
pub enum Admitted<T> {
    /// In setup, with room to spare.
    Yes,
    /// In setup, in the place of the oldest, which the caller closes.
    Shedding(T),
    /// Refused: the oldest has not been in setup long enough to be shed; the caller
    /// closes the newcomer.
    Refused(T),
}

/// Connections in setup (with when each was admitted), oldest first, bounded as the
/// module docs say.
#[derive(Debug)]
pub struct InSetup<T> {
    bound: Bound,
    q: VecDeque<(Instant, T)>,
}

impl<T> InSetup<T> {
    /// None yet.
    pub fn new(bound: Bound) -> Self {
        InSetup {
            bound,
            q: VecDeque::new(),
        }
    }

    /// The bounds.
    pub fn bound(&self) -> Bound {
        self.bound
    }

    /// Admits `item`, now, unless the bound refuses it: beyond the bound it sheds the
    /// oldest if that one has been in setup for [`Bound::min_shed_age`].
    pub fn admit(&mut self, item: T) -> Admitted<T> {
        self.admit_shedding(item, |_| false)
    }

    /// As [`InSetup::admit`], but beyond the bound it sheds the oldest that has been in
    /// setup for [`Bound::min_shed_age`] or of which `silent` says it has sent nothing
    /// (a port whose clients speak first: a connection that has said nothing when a
    /// newcomer needs its place is a flood's, whatever its age; `silent` may look at the
    /// connection once more first).
    pub fn admit_shedding(&mut self, item: T, silent: impl FnMut(&mut T) -> bool) -> Admitted<T> {
        let mut shed = None;
        if self.q.len() >= self.bound.max {
            shed = self.shed_one(silent);
            if shed.is_none() {
                return Admitted::Refused(item);
            }
        }
        self.q.push_back((Instant::now(), item));
        shed.map_or(Admitted::Yes, Admitted::Shedding)
    }

    /// Takes out the oldest that may be shed: in setup for [`Bound::min_shed_age`], or
    /// `silent`.
    pub fn shed_one(&mut self, mut silent: impl FnMut(&mut T) -> bool) -> Option<T> {
        let min_age = self.bound.min_shed_age;
        let i = self
            .q
            .iter_mut()
            .position(|(at, t)| at.elapsed() >= min_age || silent(t))?;
        self.q.remove(i).map(|(_, t)| t)
    }

    /// Takes the oldest `n` (fewer if there are not as many), for the caller to close.
    pub fn shed_oldest(&mut self, n: usize) -> Vec<T> {
        let n = n.min(self.q.len());
        self.q.drain(..n).map(|(_, t)| t).collect()
    }

    /// Takes the oldest half (out of descriptors: room for the rest and for those served).
    pub fn shed_half(&mut self) -> Vec<T> {
        self.shed_oldest(self.q.len().div_ceil(2))
    }

    /// How long the oldest has been in setup.
    pub fn oldest_age(&self) -> Duration {
        self.q.front().map_or(Duration::ZERO, |(at, _)| at.elapsed())
    }

    /// How many are in setup.
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Each, with when it was admitted, oldest first.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (Instant, &mut T)> {
        self.q.iter_mut().map(|(at, t)| (*at, t))
    }

    /// Keeps those for which `keep` (given when each was admitted) says so.
    pub fn retain(&mut self, mut keep: impl FnMut(Instant, &mut T) -> bool) {
        self.q.retain_mut(|(at, t)| keep(*at, t));
    }

    /// Takes out those for which `take` says so, oldest first.
    pub fn take_if(&mut self, mut take: impl FnMut(&mut T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.q.len() {
            if take(&mut self.q[i].1) {
                out.extend(self.q.remove(i).map(|(_, t)| t));
            } else {
                i += 1;
            }
        }
        out
    }

    /// Takes the one at `index` (0: the oldest).
    pub fn remove(&mut self, index: usize) -> Option<T> {
        self.q.remove(index).map(|(_, t)| t)
    }
}

/// Whether a connection on descriptor `fd` leaves fewer than `reserve` descriptors (at
/// most an eighth of the open-file limit) free: the process's open descriptors are
/// counted (/proc/self/fd; a process that cannot open it is short). Without /proc, what
/// the descriptor's number says: the kernel hands out the lowest free one, so at most
/// `limit - 1 - fd` are free.
pub fn short_of_descriptors(fd: RawFd, reserve: usize) -> bool {
    let Some(limit) = open_file_limit() else {
        return false;
    };
    let reserve = (reserve as u64).min(limit / 8);
    if reserve == 0 {
        return false;
    }
    let open = match std::fs::read_dir("/proc/self/fd") {
        // Less the directory's own descriptor.
        Ok(d) => d.count().saturating_sub(1) as u64,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => return true,
        Err(_) => fd as u64 + 1,
    };
    open.saturating_add(reserve) > limit
}

/// How often a flood's warnings are logged: the first few in each window, then how many
/// more there were (a flood of thousands would otherwise write thousands of lines).
#[derive(Debug)]
pub struct WarnBudget {
    window: Duration,
    per_window: u32,
    start: Option<Instant>,
    used: u32,
    held_back: u64,
}

impl WarnBudget {
    /// At most `per_window` warnings per `window`.
    pub const fn new(window: Duration, per_window: u32) -> Self {
        WarnBudget {
            window,
            per_window,
            start: None,
            used: 0,
            held_back: 0,
        }
    }

    /// Whether to log a warning now: `Some(n)` with how many were held back since the
    /// last one logged, `None` to hold this one back.
    pub fn take(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.start.is_none_or(|s| now.duration_since(s) >= self.window) {
            self.start = Some(now);
            self.used = 0;
        }
        if self.used < self.per_window {
            self.used += 1;
            Some(std::mem::take(&mut self.held_back))
        } else {
            self.held_back += 1;
            None
        }
    }
}

/// ", and N more since" for a warning after `held_back` were held back.
pub fn held_back_note(held_back: u64) -> String {
    match held_back {
        0 => String::new(),
        n => format!(" ({n} more like it since the last warning)"),
    }
}

#[cfg(feature = "tokio")]
pub use nonblocking::{accept_loop, Spoke};

#[cfg(feature = "tokio")]
mod nonblocking {
    use std::future::Future;
    use std::net::SocketAddr;
    use std::os::fd::{AsRawFd, RawFd};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::net::{TcpListener, TcpStream};
    use tokio::task::AbortHandle;

    use super::{held_back_note, short_of_descriptors, Admitted, Bound, InSetup, WarnBudget};

    /// At most one warning about descriptors per this long (a flood makes accept fail
    /// thousands of times).
    const WARN_EVERY: Duration = Duration::from_secs(10);

    /// Given to a connection's setup task: whether the client has sent something (the
    /// task may say so, [`Spoke::mark`]; the accepting loop also peeks at the socket,
    /// since the task may not have run yet). Until then the connection may be shed at
    /// any age on a port whose clients speak first.
    #[derive(Clone, Debug)]
    pub struct Spoke {
        marked: Arc<AtomicBool>,
        fd: RawFd,
    }

    impl Spoke {
        /// The client has sent something.
        pub fn mark(&self) {
            self.marked.store(true, Ordering::Relaxed);
        }

        fn silent(&self) -> bool {
            if self.marked.load(Ordering::Relaxed) {
                return false;
            }
            let mut b = [0u8; 1];
            // SAFETY: a one-byte peek into a local buffer. The descriptor is the
            // connection's while its task holds it; one its task has just closed may
            // name another socket for a moment, whose bytes a peek leaves in place.
            let n = unsafe {
                libc::recv(
                    self.fd,
                    b.as_mut_ptr().cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            n <= 0
        }
    }

    /// A connection's setup task: its number, its handle (set once the task is spawned,
    /// under the same lock) and whether its client has spoken.
    struct Task {
        id: u64,
        handle: Option<AbortHandle>,
        spoke: Spoke,
    }

    impl Task {
        fn abort(&self) {
            if let Some(t) = &self.handle {
                t.abort();
            }
        }
    }

    /// What a port's accepting loop knows besides its connections in setup.
    struct Gate {
        name: String,
        bound: Bound,
        speaks_first: bool,
        hint: fn() -> String,
        warned: WarnBudget,
    }

    impl Gate {
        /// Takes `task`'s connection (on `fd`, from `peer`) into setup: `None` if refused,
        /// else whether one in setup was shed for it.
        fn admit(
            &mut self,
            set: &Mutex<InSetup<Task>>,
            task: Task,
            fd: RawFd,
            peer: SocketAddr,
        ) -> Option<bool> {
            let mut set = set.lock().unwrap();
            let silent = |t: &mut Task| self.speaks_first && t.spoke.silent();
            let mut shed = false;
            if short_of_descriptors(fd, self.bound.fd_reserve) {
                // Room for this one only in the place of one in setup: the descriptors
                // in reserve are the served clients'.
                match set.shed_one(silent) {
                    Some(t) => {
                        t.abort();
                        shed = true;
                    }
                    None => {
                        if let Some(n) = self.warned.take() {
                            tracing::warn!(
                                listener = %self.name, %peer,
                                "refused a connection: fewer than {} descriptors would be left for the \
                                 clients being served{}; {}",
                                self.bound.fd_reserve, held_back_note(n), (self.hint)()
                            );
                        }
                        return None;
                    }
                }
            }
            let age = set.oldest_age();
            let admitted = match self.speaks_first {
                true => set.admit_shedding(task, silent),
                false => set.admit(task),
            };
            match admitted {
                Admitted::Refused(_) => {
                    tracing::debug!(
                        listener = %self.name, %peer,
                        "{} connections in setup, the oldest for {age:?}: refused this one",
                        self.bound.max
                    );
                    None
                }
                Admitted::Shedding(t) => {
                    t.abort();
                    tracing::debug!(
                        listener = %self.name,
                        "{} connections in setup: shed one (the oldest in setup for {age:?})",
                        self.bound.max
                    );
                    Some(true)
                }
                Admitted::Yes => Some(shed),
            }
        }
    }

    /// Accepts connections on `listener` forever, running `serve` for each on a task of
    /// the current runtime, bounded by `bound` (see the module docs): a newcomer beyond
    /// it sheds the oldest (with `speaks_first`, the oldest whose client has sent nothing
    /// yet, at any age; see [`Spoke`]) or is refused; out of descriptors the oldest half
    /// is shed and a warning names `name` and, through `hint`, what to raise. A
    /// connection leaves setup when its `serve` future ends (which must bound how long it
    /// waits). Returns only if the listener itself fails for good.
    pub async fn accept_loop<F, Fut>(
        name: String,
        listener: Arc<TcpListener>,
        bound: Bound,
        speaks_first: bool,
        hint: fn() -> String,
        serve: F,
    ) where
        F: Fn(TcpStream, SocketAddr, Spoke) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let in_setup: Arc<Mutex<InSetup<Task>>> = Arc::new(Mutex::new(InSetup::new(bound)));
        let mut gate = Gate {
            name,
            bound,
            speaks_first,
            hint,
            warned: WarnBudget::new(WARN_EVERY, 1),
        };
        let mut next_id = 0u64;
        let mut backoff = Duration::from_millis(1);
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    backoff = Duration::from_millis(1);
                    let (id, fd) = (next_id, stream.as_raw_fd());
                    next_id += 1;
                    let spoke = Spoke {
                        marked: Arc::default(),
                        fd,
                    };
                    let task = Task {
                        id,
                        handle: None,
                        spoke: spoke.clone(),
                    };
                    let Some(shed) = gate.admit(&in_setup, task, fd, peer) else {
                        continue;
                    };
                    let fut = serve(stream, peer, spoke);
                    let mine = in_setup.clone();
                    let task = tokio::spawn(async move {
                        fut.await;
                        mine.lock().unwrap().retain(|_, t| t.id != id);
                    });
                    // Unless it has ended already. Only this loop sheds, so nothing can
                    // need the handle before it is set.
                    if let Some((_, t)) = in_setup.lock().unwrap().iter_mut().find(|(_, t)| t.id == id) {
                        t.handle = Some(task.abort_handle());
                    }
                    if shed {
                        // The shed task closes its connection when it next runs: on a
                        // runtime of one thread, not before this loop lets it.
                        tokio::task::yield_now().await;
                    }
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    let shed = in_setup.lock().unwrap().shed_half();
                    shed.iter().for_each(Task::abort);
                    if let Some(n) = gate.warned.take() {
                        tracing::warn!(
                            listener = %gate.name,
                            "{}{}; {}; shed {} connection(s) still in setup, established connections \
                             keep running; retrying",
                            crate::error::Error::from_io("accept failed", e),
                            held_back_note(n),
                            hint(),
                            shed.len()
                        );
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(100));
                }
                Err(e) => {
                    // ECONNABORTED and the like: one connection failed, not the listener.
                    tracing::debug!(listener = %gate.name, "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(max: usize, min_shed_age: Duration) -> Bound {
        Bound {
            max,
            min_shed_age,
            fd_reserve: 0,
        }
    }

    #[test]
    fn beyond_the_bound_the_newcomer_is_refused_until_the_oldest_has_waited() {
        let mut s = InSetup::new(bound(2, Duration::from_millis(50)));
        assert_eq!(s.admit(1), Admitted::Yes);
        assert_eq!(s.admit(2), Admitted::Yes);
        assert_eq!(s.admit(3), Admitted::Refused(3));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(s.admit(4), Admitted::Shedding(1));
        assert_eq!(s.len(), 2);
        assert_eq!(s.shed_half(), vec![2]);
        s.retain(|_, t| *t != 4);
        assert!(s.is_empty());
    }

    #[test]
    fn beyond_the_bound_a_silent_one_is_shed_at_any_age() {
        let mut s = InSetup::new(bound(3, Duration::from_secs(60)));
        for t in [(1, "spoke"), (2, ""), (3, "")] {
            assert_eq!(s.admit(t), Admitted::Yes);
        }
        let silent = |t: &mut (i32, &str)| t.1.is_empty();
        assert_eq!(
            s.admit_shedding((4, "spoke"), silent),
            Admitted::Shedding((2, ""))
        );
        assert_eq!(s.admit_shedding((5, ""), silent), Admitted::Shedding((3, "")));
        assert_eq!(s.admit_shedding((6, ""), silent), Admitted::Shedding((5, "")));
        s.retain(|_, t| t.1.is_empty());
        assert_eq!(s.len(), 1);
        assert_eq!(s.remove(0), Some((6, "")));
    }

    #[test]
    fn the_reserve_is_capped_and_counted() {
        let limit = open_file_limit().expect("a finite open-file limit") as usize;
        let open = std::fs::read_dir("/proc/self/fd").unwrap().count() - 1;
        // (Other tests of this process open descriptors meanwhile: a wide margin.)
        assert!(open + 200 < limit / 2, "{open} open of {limit}");
        assert!(
            !short_of_descriptors(0, limit),
            "the reserve is capped at an eighth of the limit"
        );
        assert!(!short_of_descriptors(0, 0), "no reserve kept");
        assert!(
            !short_of_descriptors((limit - 2) as RawFd, 64),
            "counted, not guessed from the descriptor's number"
        );
    }

    #[test]
    fn the_budget_holds_back_warnings_past_the_first_in_a_window() {
        let mut b = WarnBudget::new(Duration::from_millis(50), 2);
        assert_eq!(
            (b.take(), b.take(), b.take(), b.take()),
            (Some(0), Some(0), None, None)
        );
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(b.take(), Some(2));
        assert_eq!(held_back_note(2), " (2 more like it since the last warning)");
    }
}
