//! A flood of connections that say nothing at a server's setup port, and the threads and
//! descriptors the server process holds meanwhile: shared by the tests of the project's
//! ports (examples/tests/servers.rs, conformance/tests/serve_flood.rs include this file).

#![allow(dead_code)]

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connections that say nothing, opened by a thread of this process as fast as the
/// server's backlog takes them, and held (even those the server closed) until dropped.
pub struct Flood {
    made: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Flood {
    /// Opens up to `n` connections to `addr` (this process's open-file limit raised to
    /// its hard limit for them).
    pub fn start(addr: SocketAddr, n: usize) -> Flood {
        raise_nofile();
        let (made, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (m, st) = (made.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut held = Vec::with_capacity(n);
            while held.len() < n && !st.load(Ordering::Relaxed) {
                if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                    held.push(s);
                    m.fetch_add(1, Ordering::Relaxed);
                }
            }
            while !st.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Flood {
            made,
            stop,
            thread: Some(thread),
        }
    }

    /// Waits (at most 60 s) until `k` connections were made.
    pub fn wait_for(&self, k: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.made.load(Ordering::Relaxed) < k {
            assert!(
                Instant::now() < deadline,
                "the flood made {} connections in 60 s",
                self.made.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Connections made so far.
    pub fn made(&self) -> usize {
        self.made.load(Ordering::Relaxed)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one rlimit struct on this stack frame.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// Threads and open descriptors of process `pid` (0 each if it is gone).
pub fn usage(pid: u32) -> (usize, usize) {
    let n = |what: &str| std::fs::read_dir(format!("/proc/{pid}/{what}")).map_or(0, |d| d.count());
    (n("task"), n("fd"))
}

/// Runs `f` while sampling `pid`'s [`usage`] every 2 ms: `f`'s result and the most
/// threads and descriptors seen.
pub fn peak_while<T>(pid: u32, f: impl FnOnce() -> T) -> (T, usize, usize) {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let sampler = std::thread::spawn(move || {
        let mut peak = usage(pid);
        while !d.load(Ordering::Relaxed) {
            let (t, f) = usage(pid);
            peak = (peak.0.max(t), peak.1.max(f));
            std::thread::sleep(Duration::from_millis(2));
        }
        peak
    });
    let out = f();
    done.store(true, Ordering::Relaxed);
    let (threads, fds) = sampler.join().unwrap();
    (out, threads, fds)
}
