//! What the tests share: where the library is, and running programs with it preloaded.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
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

/// A C program of tests/c compiled for one test, in a directory of its own that is
/// removed with it.
pub struct CProgram {
    dir: PathBuf,
    /// The executable.
    pub exe: PathBuf,
}

impl Drop for CProgram {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Compiles tests/c/`name`.c with `compiler` (`cc`, `mpicc`) and `libs`, asserting that
/// it compiles. The directory is readable by every user (a test runs the program as
/// another user too).
pub fn compile(compiler: &str, name: &str, libs: &[&str]) -> CProgram {
    use std::os::unix::fs::PermissionsExt;
    let src = format!("{}/tests/c/{name}.c", env!("CARGO_MANIFEST_DIR"));
    static SERIAL: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ibverbs-sim-{name}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.join(name);
    let program = CProgram { dir, exe };
    build(compiler, Path::new(&src), &program.exe, libs);
    program
}

/// Runs `compiler` on `src` into `exe` with `libs`, warnings as errors, asserting that it
/// compiles.
fn build(compiler: &str, src: &Path, exe: &Path, libs: &[&str]) {
    let out = Command::new(compiler)
        .args(["-std=gnu11", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(exe)
        .arg(src)
        .args(libs)
        .output()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {} failed (needs libibverbs-dev): {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this process runs as root (whose tests drop to another user to check what a
/// user without root gets).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `program args...` run as a user without root: as `nobody` through `setpriv` when this
/// process is root, else as this process's own user.
pub fn unprivileged(program: &str, args: &[&str]) -> Command {
    if !is_root() {
        let mut c = Command::new(program);
        c.args(args);
        return c;
    }
    let mut c = Command::new("setpriv");
    c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(program)
        .args(args)
        .env("HOME", "/tmp");
    c
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
    run_pair_with(program, server, client, &[], limit)
}

/// [`run_pair`] with more environment variables for both programs.
pub fn run_pair_with(
    program: &str,
    server: &[&str],
    client: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (String, String) {
    let (s, c) = run_pair_outputs(program, server, client, env, limit);
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    (text(&s), text(&c))
}

/// [`run_pair_with`], with both programs' whole outputs (standard error too).
pub fn run_pair_outputs(
    program: &str,
    server: &[&str],
    client: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (Output, Output) {
    let port = free_port().to_string();
    let mut srv_args: Vec<&str> = server.to_vec();
    srv_args.extend(["-p", &port]);
    let mut cli_args: Vec<&str> = client.to_vec();
    cli_args.extend(["-p", &port, "127.0.0.1"]);
    let mut srv = preloaded(program, &srv_args)
        .envs(env.iter().copied())
        .spawn()
        .expect(program);
    wait_listening(port.parse().unwrap(), &mut srv, limit);
    let cli = preloaded(program, &cli_args)
        .envs(env.iter().copied())
        .spawn()
        .expect(program);
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
    (s, c)
}

/// Compiles tests/c/`name`.c against the installed `<infiniband/verbs.h>` (once per test
/// process and program) and runs it with the library preloaded, `env` set (an empty value
/// sets the variable empty) and `args`, to its end, at most `limit`: it must exit 0 and
/// report no failed check ("0 failed"). Its standard output and standard error.
pub fn run_c_check(name: &str, env: &[(&str, &str)], args: &[&str], limit: Duration) -> (String, String) {
    let exe = compile_c(name);
    let mut cmd = preloaded(exe.to_str().unwrap(), args);
    cmd.envs(env.iter().copied());
    let out = wait(cmd.spawn().unwrap(), limit);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && stdout.contains("\n0 failed"),
        "{name} {env:?} {args:?}: {}\n{stdout}\nstderr:\n{stderr}",
        out.status,
    );
    (stdout, stderr)
}

/// tests/c/`name`.c compiled (once per test process) beside the library.
pub fn compile_c(name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let deps = lib().parent().expect("deps").to_path_buf();
    let exe = deps.join(format!("c-{name}"));
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if built.iter().any(|n| n == name) {
        return exe;
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    // Built under a name of this process, then renamed: another test process building
    // the same program meanwhile replaces it whole.
    let tmp = deps.join(format!("c-{name}.{}", std::process::id()));
    build("cc", &src, &tmp, &["-libverbs"]);
    std::fs::rename(&tmp, &exe).expect("rename the compiled program");
    built.push(name.to_string());
    exe
}
