//! The example servers keep serving when a client misbehaves on their setup port: a
//! client that sends garbage and one that connects and says nothing are dropped with a
//! warning naming their address and what was wrong, and the real clients that come after
//! them are served and checked as in the demos. Each server runs as its own process on
//! loopback, through the built binaries; every wait is bounded.

#[path = "support/flood.rs"]
mod flood;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flood::Flood;

const KV: &str = env!("CARGO_BIN_EXE_kv-rpc");
const POOL: &str = env!("CARGO_BIN_EXE_param-pool");
const LOCK: &str = env!("CARGO_BIN_EXE_dist-lock");
const ECHO: &str = env!("CARGO_BIN_EXE_async-echo");
const PERF: &str = env!("CARGO_BIN_EXE_perf");
const UD_ECHO: &str = env!("CARGO_BIN_EXE_ud-echo");

const LIMIT: Duration = Duration::from_secs(60);

/// A running server process whose output is collected as it comes.
struct Server {
    child: Child,
    addr: SocketAddr,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

fn collect(r: impl Read + Send + 'static, into: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            let mut s = into.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
}

impl Server {
    /// Starts `bin args` and waits for its `listening on ADDR` line.
    fn start(bin: &str, args: &[&str]) -> Server {
        Server::spawn(Command::new(bin).args(args))
    }

    /// As [`Server::start`], with the process's open-file limit at `nofile` (the usual
    /// default, 1024, whatever this test process's is).
    fn start_limited(bin: &str, args: &[&str], nofile: u32) -> Server {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
            .arg(bin)
            .args(args);
        Server::spawn(&mut c)
    }

    fn spawn(command: &mut Command) -> Server {
        let mut child = command
            .env_remove("RUST_LOG")
            .env_remove("RDMA_SIM_LISTEN")
            .env_remove("RDMA_SIM_DEVICES")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
        let (stdout, stderr) = (Arc::default(), Arc::default());
        collect(child.stdout.take().unwrap(), Arc::clone(&stdout));
        collect(child.stderr.take().unwrap(), Arc::clone(&stderr));
        let mut s = Server {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            stdout,
            stderr,
        };
        let line = s.wait_for(&s.stdout.clone(), "listening on ", Duration::from_secs(20));
        s.addr = line["listening on ".len()..].trim().parse().unwrap();
        assert!(
            s.addr.ip().is_loopback(),
            "the server should listen on loopback: {line}"
        );
        s
    }

    /// Waits until a line of `out` contains `text`; returns that line.
    fn wait_for(&mut self, out: &Arc<Mutex<String>>, text: &str, limit: Duration) -> String {
        let start = Instant::now();
        loop {
            if let Some(l) = out.lock().unwrap().lines().find(|l| l.contains(text)) {
                return l.to_string();
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(50));
                if let Some(l) = out.lock().unwrap().lines().find(|l| l.contains(text)) {
                    return l.to_string();
                }
                panic!(
                    "the server exited ({st}) before printing {text:?}:\n{}",
                    self.output()
                );
            }
            assert!(
                start.elapsed() < limit,
                "no {text:?} within {limit:?}:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stderr_line(&mut self, text: &str) -> String {
        let e = self.stderr.clone();
        self.wait_for(&e, text, Duration::from_secs(20))
    }

    fn still_running(&mut self) {
        if let Some(st) = self.child.try_wait().unwrap() {
            panic!("the server exited ({st}):\n{}", self.output());
        }
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(50)); // the rest of its output
                return st;
            }
            assert!(
                start.elapsed() < LIMIT,
                "the server did not exit:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn output(&self) -> String {
        format!(
            "--- server stdout ---\n{}--- server stderr ---\n{}",
            self.stdout.lock().unwrap(),
            self.stderr.lock().unwrap()
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client that sends an HTTP request to the setup port (and keeps the connection).
fn garbage(addr: SocketAddr) -> (TcpStream, SocketAddr) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let me = s.local_addr().unwrap();
    (s, me)
}

/// A client that connects and says nothing.
fn silent(addr: SocketAddr) -> (TcpStream, SocketAddr) {
    let s = TcpStream::connect(addr).unwrap();
    let me = s.local_addr().unwrap();
    (s, me)
}

/// Runs a client to completion; returns its stdout, asserting success.
fn client(bin: &str, args: &[&str]) -> String {
    let mut child = Command::new(bin)
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("RDMA_SIM_LISTEN")
        .env_remove("RDMA_SIM_DEVICES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (so, se) = (Arc::default(), Arc::default());
    collect(child.stdout.take().unwrap(), Arc::clone(&so));
    collect(child.stderr.take().unwrap(), Arc::clone(&se));
    let start = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            panic!("{bin} {args:?} did not finish within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    std::thread::sleep(Duration::from_millis(50));
    let (so, se) = (so.lock().unwrap().clone(), se.lock().unwrap().clone());
    assert!(st.success(), "{bin} {args:?} failed ({st}):\n{so}\n{se}");
    so
}

/// The warning a dropped client gets: its address and, in `why`, what was wrong.
fn assert_dropped(server: &mut Server, who: SocketAddr, why: &str) {
    let line = server.stderr_line(&format!("dropped the client at {who}"));
    assert!(
        line.contains("WARN") && line.contains(why),
        "{line}\n{}",
        server.output()
    );
}

/// Two kv-rpc clients of 100 keys each against `srv`, whose server (of 2 clients) then
/// exits: every answer checked.
fn kv_clients(srv: &mut Server) {
    let addr = srv.addr.to_string();
    let out = client(
        KV,
        &["client", "--server", &addr, "--clients", "2", "--keys", "100"],
    );
    let checked = "checked: 100 PUT ok, 150 GET returned the PUT value";
    assert_eq!(out.matches(checked).count(), 2, "{out}");
    assert_eq!(out.matches("wrong answers: 0").count(), 2, "{out}");
    let st = srv.wait_exit();
    assert!(st.success(), "{}", srv.output());
    assert!(srv.output().contains("served 700 requests"), "{}", srv.output());
}

/// Two param-pool readers against `srv`, whose server (of 2 readers) then exits: no torn
/// vector used.
fn pool_readers(srv: &mut Server) {
    let addr = srv.addr.to_string();
    let out = client(
        POOL,
        &[
            "client",
            "--server",
            &addr,
            "--readers",
            "2",
            "--duration-ms",
            "300",
        ],
    );
    assert!(
        out.contains("torn vectors used: 0") && out.contains("OK: every one of the"),
        "{out}"
    );
    let st = srv.wait_exit();
    assert!(st.success(), "{}", srv.output());
}

const NOT_OURS: &str = "not a verbs-api connection setup";
const SILENT: &str = "timed out";

#[test]
fn kv_rpc_server_drops_a_garbage_and_a_silent_client_and_serves_the_rest() {
    let mut srv = Server::start(
        KV,
        &[
            "--timeout",
            "2",
            "server",
            "--listen",
            "127.0.0.1:0",
            "--clients",
            "2",
        ],
    );
    let (_g, g_addr) = garbage(srv.addr);
    let (_s, s_addr) = silent(srv.addr);
    assert_dropped(&mut srv, g_addr, NOT_OURS);
    kv_clients(&mut srv);
    // The silent client held up nobody: the clients were served while it was connected
    // (and the server had all its clients before its 2 s setup bound dropped it).
    let _ = s_addr;
}

#[test]
fn dist_lock_server_drops_a_garbage_and_a_silent_client_and_serves_the_rest() {
    let mut srv = Server::start(
        LOCK,
        &[
            "server",
            "--listen",
            "127.0.0.1:0",
            "--clients",
            "2",
            "--expect-counter",
            "100",
        ],
    );
    let (_s, _) = silent(srv.addr);
    let (_g, g_addr) = garbage(srv.addr);
    assert_dropped(&mut srv, g_addr, NOT_OURS);
    let addr = srv.addr.to_string();
    let out = client(
        LOCK,
        &[
            "client",
            "--server",
            &addr,
            "--threads",
            "2",
            "--iters",
            "50",
            "--mode",
            "cas",
        ],
    );
    assert!(out.contains("100 acquisitions"), "{out}");
    let st = srv.wait_exit();
    assert!(st.success(), "the counter must be 100:\n{}", srv.output());
    assert!(
        srv.output().contains("server: 100 increments"),
        "{}",
        srv.output()
    );
}

#[test]
fn param_pool_server_drops_a_garbage_and_a_silent_client_and_serves_the_rest() {
    let mut srv = Server::start(
        POOL,
        &[
            "server",
            "--listen",
            "127.0.0.1:0",
            "--readers",
            "2",
            "--vectors",
            "4",
            "--dim",
            "256",
        ],
    );
    let (_g, g_addr) = garbage(srv.addr);
    let (_s, _) = silent(srv.addr);
    assert_dropped(&mut srv, g_addr, NOT_OURS);
    pool_readers(&mut srv);
}

#[test]
fn async_echo_server_drops_a_garbage_and_a_silent_client_and_serves_the_rest() {
    let mut srv = Server::start(ECHO, &["--timeout", "2", "server", "--listen", "127.0.0.1:0"]);
    let (_s, s_addr) = silent(srv.addr);
    let (_g, g_addr) = garbage(srv.addr);
    let addr = srv.addr.to_string();
    for _ in 0..2 {
        let out = client(ECHO, &["client", "--server", &addr, "-n", "200"]);
        assert!(out.contains("200 echoes"), "{out}");
    }
    assert_dropped(&mut srv, g_addr, NOT_OURS);
    // The silent client is dropped after --timeout, while the server goes on.
    assert_dropped(&mut srv, s_addr, SILENT);
    let out = client(ECHO, &["client", "--server", &addr, "-n", "10"]);
    assert!(out.contains("10 echoes"), "{out}");
    assert_eq!(
        srv.output().matches("server: echoed ").count(),
        3,
        "{}",
        srv.output()
    );
    srv.still_running();
}

#[test]
fn perf_server_drops_a_garbage_and_a_silent_client_and_serves_the_next() {
    let mut srv = Server::start(
        PERF,
        &["--timeout", "2", "write_lat", "--server", "-p", "0", "-n", "100"],
    );
    let (_g, g_addr) = garbage(srv.addr);
    let (_s, _) = silent(srv.addr);
    assert_dropped(&mut srv, g_addr, NOT_OURS);
    let addr = srv.addr.to_string();
    let out = client(PERF, &["write_lat", &addr, "-n", "100"]);
    assert!(out.contains("#bytes"), "{out}");
    let st = srv.wait_exit();
    assert!(st.success(), "{}", srv.output());
}

/// Without `--listen` (`--bind` for perf) the servers listen on loopback only.
#[test]
fn servers_listen_on_loopback_unless_told_otherwise() {
    for (bin, args, default) in [
        (KV, &["server", "--help"][..], "[default: 127.0.0.1:18515]"),
        (POOL, &["server", "--help"][..], "[default: 127.0.0.1:18516]"),
        (LOCK, &["server", "--help"][..], "[default: 127.0.0.1:18517]"),
        (ECHO, &["server", "--help"][..], "[default: 127.0.0.1:18520]"),
        (PERF, &["--help"][..], "[default: 127.0.0.1]"),
    ] {
        let out = client(bin, args);
        assert!(out.contains(default), "{bin} {args:?}: no {default:?} in:\n{out}");
    }
}

// ---------------------------------------------------------------- a flood at the setup port

/// Silent connections a flood opens at a setup port (far more than the connections in
/// setup a server holds, and than its open-file limit).
const FLOOD: usize = 3000;
/// The open-file limit the flooded servers run under.
const NOFILE: u32 = 1024;

/// Runs `clients` while [`FLOOD`] connections that say nothing come in at `srv`'s setup
/// port (the clients start once a third of them were made) and checks that the server
/// held no more threads and descriptors than its clients need and the bound on
/// connections in setup allows ([`verbs_api::cm::SETUP_BOUND`], at most
/// [`examples::conn::QUEUED`] requests waiting).
fn through_a_flood<T>(srv: &mut Server, clients: impl FnOnce(&mut Server) -> T) -> T {
    let (pid, addr) = (srv.pid(), srv.addr);
    let (threads, fds) = flood::usage(pid);
    let f = Flood::start(addr, FLOOD);
    f.wait_for(FLOOD / 3);
    let (out, peak_threads, peak_fds) = flood::peak_while(pid, || clients(srv));
    let made = f.made();
    drop(f);
    let (more_threads, more_fds) = (peak_threads.saturating_sub(threads), peak_fds.saturating_sub(fds));
    eprintln!(
        "flood of {made}: the server went from {threads} to at most {peak_threads} threads, \
         {fds} to at most {peak_fds} descriptors"
    );
    assert!(
        more_threads <= 8,
        "{more_threads} threads more under the flood:\n{}",
        srv.output()
    );
    let setup = verbs_api::cm::SETUP_BOUND.max + examples::conn::QUEUED;
    assert!(
        more_fds <= setup + 32,
        "{more_fds} descriptors more under the flood (room for {setup} in setup):\n{}",
        srv.output()
    );
    out
}

/// The arguments of a server on loopback with a setup bound of 5 s: `args` after them.
fn server_args<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--timeout", "5", "server", "--listen", "127.0.0.1:0"];
    v.extend_from_slice(args);
    v
}

#[test]
fn kv_rpc_serves_its_clients_through_a_flood_of_silent_connections() {
    let mut srv = Server::start_limited(KV, &server_args(&["--clients", "2"]), NOFILE);
    through_a_flood(&mut srv, kv_clients);
}

#[test]
fn param_pool_serves_its_readers_through_a_flood_of_silent_connections() {
    let args = server_args(&["--readers", "2", "--vectors", "4", "--dim", "256"]);
    let mut srv = Server::start_limited(POOL, &args, NOFILE);
    through_a_flood(&mut srv, pool_readers);
}

#[test]
fn ud_echo_registers_its_clients_through_a_flood_of_silent_connections() {
    let mut srv = Server::start_limited(UD_ECHO, &server_args(&["--clients", "2"]), NOFILE);
    through_a_flood(&mut srv, |srv| {
        let addr = srv.addr.to_string();
        client(
            UD_ECHO,
            &["client", "--server", &addr, "--clients", "2", "-n", "200"],
        );
        let st = srv.wait_exit();
        assert!(st.success(), "{}", srv.output());
    });
}

#[test]
fn async_echo_serves_its_clients_through_a_flood_of_silent_connections() {
    let mut srv = Server::start_limited(ECHO, &server_args(&[]), NOFILE);
    through_a_flood(&mut srv, |srv| {
        let out = client(ECHO, &["client", "--server", &srv.addr.to_string(), "-n", "200"]);
        assert!(out.contains("200 echoes"), "{out}");
        srv.still_running();
    });
}
