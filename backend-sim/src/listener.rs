//! A device's listener: accepts TCP connections and gives each its setup task, bounded so
//! that strangers cannot take the process down.
//!
//! Anyone who reaches the listener may connect, as often as they like, and then say
//! nothing. So:
//! - at most [`MAX_UNPROVEN`] connections may be in setup at once (reading a hello,
//!   checking it, answering a check); a new one beyond that sheds the oldest. A connection
//!   leaves setup within [`HELLO_TIMEOUT`] plus one check (see [`verify`](crate::verify)),
//!   so a legitimate one is only shed under a flood, and then its QP retries;
//! - `accept(2)` failing for lack of descriptors (`EMFILE`, `ENFILE`: the connection
//!   stays in the kernel's backlog) sheds the oldest half of the connections in setup,
//!   warns (at most every 10 s) naming the open-file limit, and backs off (1 ms doubling to
//!   100 ms) instead of spinning; established QPs keep their sockets and keep running;
//! - nothing per connection is allocated before its hello is proven but its setup task
//!   and a header-sized buffer on that task's stack.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rustix::process::{getrlimit, Resource};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// Most connections in setup at once.
pub const MAX_UNPROVEN: usize = 256;
/// How long a connection may take to send its first frame.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// At most one warning about running out of descriptors per this long (a flood makes
/// accept fail thousands of times).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The setup tasks of accepted connections, oldest first.
#[derive(Default)]
struct InSetup {
    next_id: u64,
    tasks: VecDeque<(u64, AbortHandle)>,
}

impl InSetup {
    fn shed_oldest(&mut self, n: usize) -> usize {
        let n = n.min(self.tasks.len());
        for (_, t) in self.tasks.drain(..n) {
            t.abort();
        }
        n
    }
}

/// Accepts connections on `listener` forever, running `serve` for each on the current
/// runtime. Returns only if the listener itself fails for good.
pub async fn accept_loop<F, Fut>(name: String, listener: TcpListener, serve: F)
where
    F: Fn(TcpStream, std::net::SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let in_setup = Arc::new(Mutex::new(InSetup::default()));
    let mut backoff = Duration::from_millis(1);
    let mut warned: Option<tokio::time::Instant> = None;
    let mut unwarned = 0u64;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                backoff = Duration::from_millis(1);
                let fut = serve(stream, peer);
                let mut set = in_setup.lock();
                if set.tasks.len() >= MAX_UNPROVEN {
                    set.shed_oldest(1);
                    tracing::debug!(device = %name, "{MAX_UNPROVEN} connections in setup: shed the oldest");
                }
                let id = set.next_id;
                set.next_id += 1;
                let mine = in_setup.clone();
                // The task cannot run before the lock is released (it takes it to leave),
                // so it is listed before it can remove itself.
                let task = tokio::spawn(async move {
                    fut.await;
                    mine.lock().tasks.retain(|(i, _)| *i != id);
                });
                set.tasks.push_back((id, task.abort_handle()));
            }
            Err(e) if is_out_of_fds(&e) => {
                let shed = {
                    let mut set = in_setup.lock();
                    let half = set.tasks.len().div_ceil(2);
                    set.shed_oldest(half)
                };
                if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                    let more = match unwarned {
                        0 => String::new(),
                        n => format!(" ({n} more times since the last warning)"),
                    };
                    tracing::warn!(
                        device = %name,
                        "accept failed: {e}{more}: {}; shed {shed} connection(s) still in setup, \
                         established QPs keep running; retrying",
                        fd_limit_hint()
                    );
                    warned = Some(tokio::time::Instant::now());
                    unwarned = 0;
                } else {
                    unwarned += 1;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
            Err(e) => {
                // ECONNABORTED and the like: one connection failed, not the listener.
                tracing::debug!(device = %name, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
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

    /// More silent connections than may be in setup: the oldest are shed, the listener
    /// keeps accepting, and no more than the bound is ever held.
    #[test]
    fn silent_connections_beyond_the_bound_shed_the_oldest() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let (l2, p2) = (live.clone(), peak.clone());
            tokio::spawn(accept_loop("t".into(), l, move |s, _| {
                let (live, peak) = (l2.clone(), p2.clone());
                async move {
                    use std::sync::atomic::Ordering::SeqCst;
                    struct Dec(Arc<std::sync::atomic::AtomicUsize>);
                    impl Drop for Dec {
                        fn drop(&mut self) {
                            self.0.fetch_sub(1, SeqCst);
                        }
                    }
                    let n = live.fetch_add(1, SeqCst) + 1;
                    peak.fetch_max(n, SeqCst);
                    let _d = Dec(live.clone());
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
            while tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let mut sheds = 0;
                for s in &held {
                    let mut b = [0u8; 1];
                    if let Ok(0) = s.try_read(&mut b) {
                        sheds += 1;
                    }
                }
                if sheds >= 50 {
                    break;
                }
            }
            use std::sync::atomic::Ordering::SeqCst;
            assert!(peak.load(SeqCst) <= MAX_UNPROVEN, "peak {}", peak.load(SeqCst));
            assert_eq!(live.load(SeqCst), MAX_UNPROVEN);
            // The oldest were closed.
            let mut b = [0u8; 1];
            assert!(matches!(held[0].try_read(&mut b), Ok(0)), "the oldest was shed");
            let last = held.last().unwrap();
            assert!(
                matches!(last.try_read(&mut b), Err(ref e) if e.kind() == io::ErrorKind::WouldBlock),
                "the newest is still open"
            );
        });
    }
}
