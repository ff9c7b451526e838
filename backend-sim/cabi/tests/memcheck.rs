//! A C program on the sim under valgrind's memcheck, as its author would check it for
//! memory errors without hardware: `ibv_rc_pingpong -c` as the client, run by valgrind
//! with the library preloaded, against a server run natively. It must exit 0, validate
//! its data and report no error. (The sim found the vDSO through the kernel's auxv,
//! which valgrind's loader does not map: the first clock read crashed the program.)

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{free_port, lib, preloaded, wait, wait_listening};

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn ibv_rc_pingpong_runs_clean_under_memcheck() {
    let port = free_port().to_string();
    let args = ["-c", "-n", "50", "-p", &port];
    let mut srv = preloaded("ibv_rc_pingpong", &args)
        .spawn()
        .expect("ibv_rc_pingpong");
    wait_listening(port.parse().unwrap(), &mut srv, LIMIT);
    // The library is preloaded into the program, not into valgrind's launcher: `env`
    // sets it for the exec that valgrind follows.
    let preload = format!("LD_PRELOAD={}", lib().display());
    let cli = Command::new("valgrind")
        .args([
            "--trace-children=yes",
            "--error-exitcode=9",
            "--leak-check=no",
            "env",
            &preload,
        ])
        .arg("ibv_rc_pingpong")
        .args(args)
        .arg("127.0.0.1")
        .env("RDMA_SIM_DEVICES", "1")
        .env_remove("RDMA_SIM_LISTEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("valgrind (apt-get install valgrind)");
    let c = wait(cli, LIMIT);
    if !c.status.success() {
        // Its peer is gone: the server would wait for it until the limit.
        let _ = srv.kill();
    }
    let s = wait(srv, LIMIT);
    let (out, err) = (
        String::from_utf8_lossy(&c.stdout),
        String::from_utf8_lossy(&c.stderr),
    );
    assert!(
        c.status.success() && s.status.success(),
        "client under valgrind: {}, server: {}\nstdout:\n{out}\nstderr:\n{err}",
        c.status,
        s.status
    );
    assert!(
        out.contains("50 iters in") && !out.contains("invalid data"),
        "{out}"
    );
    assert!(err.contains("ERROR SUMMARY: 0 errors"), "{err}");
}
