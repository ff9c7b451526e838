//! What the tests share: where the library is, and running programs with it preloaded.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The library cargo built for this test run: `target/<profile>/deps/libibverbs_sim.so`,
/// beside the test executable (the crate's rlib makes the library a dependency of the
/// tests, so cargo builds it first; `target/<profile>/libibverbs_sim.so` is only what the
/// last `cargo build` left, possibly older).
pub fn lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let deps = exe.parent().expect("target/<profile>/deps");
    let so = deps.join("libibverbs_sim.so");
    assert!(so.exists(), "{} was not built", so.display());
    so
}

/// `program args...` with the library preloaded and the sim's settings.
pub fn preloaded(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args)
        .env("LD_PRELOAD", lib())
        .env("RDMA_SIM_DEVICES", "1")
        .env_remove("RDMA_SIM_LISTEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Waits for `child` at most `limit`, killing it after; its output.
pub fn wait(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "timed out after {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a preloaded program to its end (at most `limit`), asserting exit status 0; its
/// standard output.
pub fn run_ok(program: &str, args: &[&str], limit: Duration) -> String {
    let out = wait(preloaded(program, args).spawn().expect(program), limit);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A TCP port nobody listens on now (for a program's out-of-band exchange).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Whether something listens on TCP `port` (read from /proc: a probe connection would be
/// the one connection a server such as `ibv_rc_pingpong` accepts).
pub fn listening(port: u16) -> bool {
    let hex = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[3] == "0A" && cols[1].ends_with(&hex)
            })
    })
}

/// Waits until something listens on `port`, or `child` exits, or `limit` passes.
pub fn wait_listening(port: u16, child: &mut Child, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !listening(port) {
        assert!(
            Instant::now() < deadline,
            "nothing listened on {port} within {limit:?}"
        );
        if child.try_wait().expect("try_wait").is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a preloaded server (its arguments plus `-p port`) and, once it listens, a
/// preloaded client (its arguments plus `-p port 127.0.0.1`); both must exit 0 within
/// `limit`. Their standard outputs.
pub fn run_pair(program: &str, server: &[&str], client: &[&str], limit: Duration) -> (String, String) {
    let port = free_port().to_string();
    let mut srv_args: Vec<&str> = server.to_vec();
    srv_args.extend(["-p", &port]);
    let mut cli_args: Vec<&str> = client.to_vec();
    cli_args.extend(["-p", &port, "127.0.0.1"]);
    let mut srv = preloaded(program, &srv_args).spawn().expect(program);
    wait_listening(port.parse().unwrap(), &mut srv, limit);
    let cli = preloaded(program, &cli_args).spawn().expect(program);
    let c = wait(cli, limit);
    let s = wait(srv, limit);
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        s.status.success() && c.status.success(),
        "{program}: server {} client {}\nserver stdout:\n{}\nserver stderr:\n{}\nclient stdout:\n{}\nclient stderr:\n{}",
        s.status,
        c.status,
        text(&s),
        String::from_utf8_lossy(&s.stderr),
        text(&c),
        String::from_utf8_lossy(&c.stderr)
    );
    (text(&s), text(&c))
}

/// A C program of tests/c compiled against the installed `<infiniband/verbs.h>` (needs
/// libibverbs-dev), in a directory of its own that goes with it.
pub struct CProgram {
    dir: PathBuf,
    /// The executable.
    pub exe: String,
}

impl CProgram {
    /// Compiles tests/c/`name`.c.
    pub fn compile(name: &str) -> CProgram {
        let src = format!("{}/tests/c/{name}.c", env!("CARGO_MANIFEST_DIR"));
        let dir = std::env::temp_dir().join(format!("ibverbs-sim-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join(name);
        let cc = Command::new("cc")
            .args(["-std=gnu11", "-Wall", "-o"])
            .arg(&exe)
            .arg(&src)
            .arg("-libverbs")
            .output()
            .expect("run cc");
        assert!(
            cc.status.success(),
            "cc failed (needs libibverbs-dev): {}",
            String::from_utf8_lossy(&cc.stderr)
        );
        CProgram {
            exe: exe.to_str().expect("a UTF-8 path").to_string(),
            dir,
        }
    }
}

impl Drop for CProgram {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
