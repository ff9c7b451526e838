//! A device's listener: accepts TCP connections and gives each its setup task, bounded so
//! that strangers cannot take the process down.
//!
//! Anyone who reaches the listener may connect, as often as they like, and then say
//! nothing. So:
//! - at most [`MAX_UNPROVEN`] connections may be in setup at once (reading a hello,
//!   checking it, answering a check); a new one beyond that sheds the oldest if that one
//!   has been in setup for [`MIN_SHED_AGE`], and is refused (closed at once) if not. A
//!   connection leaves setup within [`HELLO_TIMEOUT`], plus one check (see
//!   [`verify`](crate::verify)), plus [`NOT_READY_WAIT`](crate::transport::NOT_READY_WAIT)
//!   if its QP is not yet past INIT; a legitimate one within milliseconds, so the silent
//!   connections of a flood are shed once they have waited, and a burst of legitimate
//!   ones (a thousand QPs connecting at once) is let in as fast as setups finish, the
//!   refused retrying, instead of each newcomer shedding one that was about to finish
//!   (which on a slow machine kept some QPs from ever connecting);
//! - `accept(2)` failing for lack of descriptors (`EMFILE`, `ENFILE`: the connection
//!   stays in the kernel's backlog) sheds the oldest half of the connections in setup,
//!   warns (at most every 10 s) naming the open-file limit, and backs off (1 ms doubling to
//!   100 ms) instead of spinning; established QPs keep their sockets and keep running;
//! - nothing per connection is allocated before its hello is proven but its setup task
//!   and a header-sized buffer on that task's stack.
//!
//! The bound is [`verbs_api::admission`]'s, which the `cm` listeners share.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{getrlimit, Resource};
use tokio::net::{TcpListener, TcpStream};
use verbs_api::admission::{self, Bound};

/// Most connections in setup at once.
pub const MAX_UNPROVEN: usize = 256;
/// How long a connection may take to send its first frame.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a connection is in setup before a newcomer may shed it: far longer than a
/// legitimate setup takes (a hello and a check on loopback or a LAN), far shorter than
/// [`HELLO_TIMEOUT`], which a silent one would otherwise hold its place for.
pub const MIN_SHED_AGE: Duration = Duration::from_millis(200);
/// The bound on the listener's connections in setup (no descriptors are kept in reserve:
/// its connections are the QPs' own).
const BOUND: Bound = Bound {
    max: MAX_UNPROVEN,
    min_shed_age: MIN_SHED_AGE,
    fd_reserve: 0,
};

/// Accepts connections on `listener` forever, running `serve` for each on the current
/// runtime, bounded as the module docs say ([`verbs_api::admission::accept_loop`]).
/// Returns only if the listener itself fails for good.
pub async fn accept_loop<F, Fut>(name: String, listener: TcpListener, serve: F)
where
    F: Fn(TcpStream, std::net::SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    accept_loop_bounded(name, listener, BOUND, serve).await
}

/// [`accept_loop`] under `bound` (a test's, whose shed age outlasts a loaded machine's
/// accepting of a few hundred connections).
async fn accept_loop_bounded<F, Fut>(name: String, listener: TcpListener, bound: Bound, serve: F)
where
    F: Fn(TcpStream, std::net::SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let serve = move |stream, peer, _spoke| serve(stream, peer);
    admission::accept_loop(name, Arc::new(listener), bound, false, fd_limit_hint, serve).await
}

/// Whether `e` means the process or the system ran out of file descriptors.
pub fn is_out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// "the open-file limit is N (ulimit -n)": what to raise when descriptors run out.
pub fn fd_limit_hint() -> String {
    let r = getrlimit(Resource::Nofile);
    match r.current {
        Some(soft) => format!(
            "the open-file limit is {soft} (hard limit {}): every connected QP holds a socket; raise it with `ulimit -n`",
            r.maximum.map_or("unlimited".to_string(), |h| h.to_string())
        ),
        None => "every connected QP holds a socket: raise the open-file limit (`ulimit -n`)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_names_the_limit() {
        let hint = fd_limit_hint();
        assert!(hint.contains("ulimit -n"), "{hint}");
        let soft = getrlimit(Resource::Nofile)
            .current
            .expect("a finite open-file limit");
        assert!(hint.contains(&soft.to_string()), "{hint}");
        assert!(is_out_of_fds(&io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(is_out_of_fds(&io::Error::from_raw_os_error(libc::ENFILE)));
        assert!(!is_out_of_fds(&io::Error::from_raw_os_error(libc::ECONNABORTED)));
    }

    /// Counts the setup tasks alive and the most ever alive at once.
    #[derive(Clone, Default)]
    struct Live {
        now: Arc<std::sync::atomic::AtomicUsize>,
        peak: Arc<std::sync::atomic::AtomicUsize>,
    }

    /// One setup task alive while it is held.
    struct Alive(Live);

    impl Live {
        fn enter(&self) -> Alive {
            use std::sync::atomic::Ordering::SeqCst;
            let n = self.now.fetch_add(1, SeqCst) + 1;
            self.peak.fetch_max(n, SeqCst);
            Alive(self.clone())
        }
    }

    impl Drop for Alive {
        fn drop(&mut self) {
            self.0.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn closed(s: &TcpStream) -> bool {
        let mut b = [0u8; 1];
        matches!(s.try_read(&mut b), Ok(0))
            || matches!(s.try_read(&mut b), Err(ref e) if e.kind() != io::ErrorKind::WouldBlock)
    }

    /// More silent connections than may be in setup: while the oldest are young the
    /// newcomers are refused; once the oldest has waited the shed age a newcomer sheds
    /// it; the listener keeps accepting, and never holds more than the bound. The shed
    /// age is a second here, not [`MIN_SHED_AGE`]: "the oldest are young" must hold
    /// while the listener accepts the whole flood, which on a loaded machine can take
    /// longer than 200 ms.
    #[test]
    fn silent_connections_beyond_the_bound_are_refused_then_shed() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use std::sync::atomic::Ordering::SeqCst;
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let live = Live::default();
            let l2 = live.clone();
            let shed_age = Duration::from_secs(1);
            let bound = Bound {
                min_shed_age: shed_age,
                ..BOUND
            };
            tokio::spawn(accept_loop_bounded("t".into(), l, bound, move |s, _| {
                let live = l2.clone();
                async move {
                    let _alive = live.enter();
                    let _s = s;
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
            }));
            let mut held = Vec::new();
            for _ in 0..MAX_UNPROVEN + 50 {
                held.push(TcpStream::connect(addr).await.unwrap());
            }
            // Let the loop accept everything.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while tokio::time::Instant::now() < deadline && held.iter().filter(|s| closed(s)).count() < 50 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(
                live.peak.load(SeqCst) <= MAX_UNPROVEN,
                "peak {}",
                live.peak.load(SeqCst)
            );
            assert_eq!(live.now.load(SeqCst), MAX_UNPROVEN);
            assert!(!closed(&held[0]), "the oldest is still in setup");
            assert!(closed(held.last().unwrap()), "the newest was refused");
            assert_eq!(held.iter().filter(|s| closed(s)).count(), 50);
            // Once the oldest has waited, a newcomer takes its place.
            tokio::time::sleep(shed_age + Duration::from_millis(50)).await;
            let late = TcpStream::connect(addr).await.unwrap();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while tokio::time::Instant::now() < deadline && !closed(&held[0]) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(closed(&held[0]), "the oldest was shed");
            assert!(!closed(&late), "the newcomer is in setup");
            assert!(
                live.peak.load(SeqCst) <= MAX_UNPROVEN,
                "peak {}",
                live.peak.load(SeqCst)
            );
        });
    }

    /// Half again as many connections as may be in setup, each of which speaks at once
    /// and whose setup takes 100 ms; a refused or shed one tries again 30-50 ms later, at
    /// most 8 times in all, as a QP's connector would (retry_cnt 7): all of them get
    /// through. When every newcomer shed the oldest, the retries kept arriving faster
    /// than setups finished, none stayed long enough to finish, and all ran out of
    /// attempts.
    #[test]
    fn a_burst_of_legitimate_connections_beyond_the_bound_gets_through() {
        // The listener on a runtime of its own, as a device's is: on one thread with the
        // clients, it would accept no faster than they connect, one budget at a time.
        let lrt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = lrt.block_on(async { TcpListener::bind("127.0.0.1:0").await.unwrap() });
        let addr = l.local_addr().unwrap();
        lrt.spawn(accept_loop("t".into(), l, |mut s: TcpStream, _| async move {
            let mut hello = [0u8; 1];
            if s.read_exact(&mut hello).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = s.write_all(&[2]).await;
            }
        }));
        rt.block_on(async {
            let clients = MAX_UNPROVEN + MAX_UNPROVEN / 2;
            let mut tasks = Vec::new();
            for n in 0..clients {
                tasks.push(tokio::spawn(async move {
                    for attempt in 0..8u64 {
                        if let Ok(mut s) = TcpStream::connect(addr).await {
                            let mut answer = [0u8; 1];
                            let done = s.write_all(&[1]).await.is_ok()
                                && matches!(
                                    tokio::time::timeout(Duration::from_millis(500), s.read(&mut answer))
                                        .await,
                                    Ok(Ok(1))
                                );
                            if done {
                                return Some(attempt);
                            }
                        }
                        let jitter = 30 + (n as u64 * 7 + attempt * 3) % 21;
                        tokio::time::sleep(Duration::from_millis(jitter)).await;
                    }
                    None
                }));
            }
            let mut failed = 0;
            for t in tasks {
                if t.await.unwrap().is_none() {
                    failed += 1;
                }
            }
            assert_eq!(failed, 0, "{failed} of {clients} connections never got through");
        });
    }
}
