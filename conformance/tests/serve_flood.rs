//! `conformance --serve` under a flood of connections that say nothing at its port (in a
//! process whose open-file limit is the usual 1024): a runner with `--peer` still gets
//! its remote case served, and the serving process holds no thread per connection and
//! a bounded number of descriptors.

#[path = "../../examples/tests/support/flood.rs"]
mod flood;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use flood::Flood;

const RUNNER: &str = env!("CARGO_BIN_EXE_conformance");

#[test]
fn a_peer_is_served_through_a_flood_of_silent_connections() {
    let mut server = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 1024 && exec \"$0\" \"$@\"")
        .arg(RUNNER)
        .args(["--backend", "sim", "--serve", "127.0.0.1:0", "--serve-cases", "1"])
        .env_remove("RDMA_SIM_LISTEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, said) = mpsc::channel();
    let err = BufReader::new(server.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in err.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let addr: SocketAddr = loop {
        let line = said
            .recv_timeout(Duration::from_secs(30))
            .expect("the server says where it listens");
        if let Some(a) = line.strip_prefix("serving remote cases on ") {
            break a.trim().parse().unwrap();
        }
    };
    let pid = server.id();
    let (threads, fds) = flood::usage(pid);
    let f = Flood::start(addr, 3000);
    f.wait_for(1000);
    let (out, peak_threads, peak_fds) = flood::peak_while(pid, || {
        Command::new(RUNNER)
            .args([
                "--backend",
                "sim",
                "--peer",
                &addr.to_string(),
                "-f",
                "remote.send",
            ])
            .env_remove("RDMA_SIM_LISTEN")
            .output()
            .unwrap()
    });
    drop(f);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("the server went from {threads} to at most {peak_threads} threads, {fds} to at most {peak_fds} descriptors");
    assert!(
        peak_threads <= threads + 8,
        "{peak_threads} threads (from {threads})"
    );
    let setup = verbs_api::cm::SETUP_BOUND.max;
    assert!(
        peak_fds <= fds + setup + 32,
        "{peak_fds} descriptors (from {fds}; {setup} in setup)"
    );
    let served = server.wait_with_output().unwrap();
    assert!(
        served.status.success() && String::from_utf8_lossy(&served.stdout).contains("remote.send: ok"),
        "{}",
        String::from_utf8_lossy(&served.stdout)
    );
}
