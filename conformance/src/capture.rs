//! `--pcap DIR`: each case's traffic, one capture file per case, so that a case's packets
//! can be checked against what the case implies (the opcodes, PSNs and AETH syndromes;
//! `tests/capture.rs`), looked at in Wireshark, and held against another device's
//! (`capture-compare`).
//!
//! On the sim, the traffic of the case's device as the RoCE v2 packets an HCA would send,
//! with the verbs context as comments ([`backend_sim::capture`]), in
//! `DIR/<case id>.pcapng`. The context a case runs in ([`Env::ctx`](crate::Env)) is
//! captured: the QPs of a [`Pair`](crate::Pair) are both on it, so both directions are in
//! the file; a second device a case opens itself is not.
//!
//! On a RoCE device (`--backend ibverbs`), `tcpdump -i NETDEV -Q out udp port 4791` on the
//! device's netdev (tcpdump(8); root), in `DIR/<case id>.pcap`, started before the case
//! and stopped after it. The packets the device sends are all of a case's: both ends of
//! its QPs are on the device. Only what leaves through the netdev is there: Soft-RoCE
//! hands a packet addressed to its own netdev's MAC to its receive path without the
//! netdev (`rxe_net.c`), which ci/capture-compare.sh's guest avoids by routing the
//! device's own address to a mirror that sends the frames back.

use std::any::Any;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Failure;

/// A case's capture, finished when the case is done (dropped after its context).
pub enum CaseCapture {
    /// The sim's own, flushed at the end.
    Sim(Arc<backend_sim::capture::Capture>),
    /// A tcpdump process, stopped at the end.
    Tcpdump {
        /// The process.
        child: Child,
        /// The file it writes, packet by packet.
        file: PathBuf,
    },
}

/// Once a case is done, tcpdump is left to write the packets the kernel still holds for
/// it (it stops reading at once when told to stop) until its file has not grown for
/// this long, which covers a slow machine's lag behind a burst.
const DRAIN: Duration = Duration::from_millis(300);

/// The longest tcpdump is left to catch up.
const DRAIN_MAX: Duration = Duration::from_secs(30);

/// How long tcpdump has to say it listens.
const LISTEN_WITHIN: Duration = Duration::from_secs(10);

impl Drop for CaseCapture {
    fn drop(&mut self) {
        match self {
            CaseCapture::Sim(cap) => cap.flush(),
            CaseCapture::Tcpdump { child, file } => {
                drain(file);
                let pid = child.id() as libc::pid_t;
                // SAFETY: kill(2) on the pid of a child this process spawned and has not
                // waited for, so the pid is still that child's.
                if unsafe { libc::kill(pid, libc::SIGINT) } != 0 {
                    let _ = child.kill();
                }
                let _ = child.wait();
            }
        }
    }
}

/// Waits until `file` has not grown for [`DRAIN`] (at most [`DRAIN_MAX`]).
fn drain(file: &Path) {
    let size = || std::fs::metadata(file).map_or(0, |m| m.len());
    let until = Instant::now() + DRAIN_MAX;
    let mut last = size();
    loop {
        std::thread::sleep(DRAIN);
        let now = size();
        if now == last || Instant::now() >= until {
            return;
        }
        last = now;
    }
}

/// The file case `id` is captured to in `dir` on the sim.
pub fn path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.pcapng"))
}

/// The file case `id` is captured to in `dir` by tcpdump on a RoCE device.
pub fn tcpdump_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.pcap"))
}

/// Captures `ctx`'s traffic: to [`path`]`(dir, id)` if `ctx` is a sim device (each packet
/// kept as `RDMA_SIM_PCAP_SNAPLEN` says, its headers by default), else with tcpdump on
/// `device`'s netdev to [`tcpdump_path`]`(dir, id)` (whole packets), returning once
/// tcpdump listens.
pub fn start<C: Any>(ctx: &C, device: &str, dir: &Path, id: &str) -> Result<Option<CaseCapture>, Failure> {
    let Some(sim) = (ctx as &dyn Any).downcast_ref::<backend_sim::SimContext>() else {
        return tcpdump(device, dir, id).map(Some);
    };
    let file = path(dir, id);
    let w = std::fs::File::create(&file)
        .map_err(|e| Failure(format!("--pcap: cannot create {}: {e}", file.display())))?;
    let cap = sim
        .capture_to(w, backend_sim::capture::Snaplen::from_env())
        .map_err(|e| Failure(format!("--pcap: {e} (RDMA_SIM_PCAP set as well?)")))?;
    Ok(Some(CaseCapture::Sim(cap)))
}

/// `tcpdump -i NETDEV -Q out --immediate-mode -w FILE udp port 4791` (and the
/// sizes below), once it listens.
fn tcpdump(device: &str, dir: &Path, id: &str) -> Result<CaseCapture, Failure> {
    let netdev = crate::env::netdev_of(device).map_err(|e| Failure(format!("--pcap: {e}")))?;
    let file = tcpdump_path(dir, id);
    let mut cmd = Command::new("tcpdump");
    // --immediate-mode: each packet handed to tcpdump as it comes, not in blocks that
    // the kernel hands over when full or after a timeout (a second), which would leave
    // the last block of a case unread when tcpdump is stopped. The ring then has a slot
    // of the snap length per packet: a snap length that holds a packet of the largest
    // path MTU (4096) whole, ICRC included, and a ring of 64 MiB hold the bursts of a
    // slow machine's tcpdump (the default 256 KiB slots in 2 MiB lost most of a 1 MiB
    // WRITE under the VM's emulated CPUs).
    cmd.args([
        "-i",
        &netdev,
        "-Q",
        "out",
        "--immediate-mode",
        "-s",
        "8192",
        "-B",
        "65536",
    ])
    .args(["-U", "-n", "-w"])
    .arg(&file);
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        // Stay root to write FILE: Debian's tcpdump otherwise changes to a user of its
        // own, which a minimal system (the rxe VM's guest) does not have.
        cmd.args(["-Z", "root"]);
    }
    cmd.args(["udp", "port", "4791"]);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Failure(format!("--pcap: cannot run tcpdump (tcpdump(8), root): {e}")))?;
    // tcpdump says "listening on NETDEV" on stderr once its filter is in place; the rest
    // of its stderr (the counts at exit) is read by a thread so that it never blocks.
    let stderr = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut said = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("listening on") {
                let _ = tx.send(Ok(()));
            } else {
                said.push(line);
            }
        }
        let _ = tx.send(Err(said.join("; ")));
    });
    match rx.recv_timeout(LISTEN_WITHIN) {
        Ok(Ok(())) => Ok(CaseCapture::Tcpdump { child, file }),
        Ok(Err(said)) => {
            let _ = child.wait();
            Err(Failure(format!("--pcap: tcpdump on {netdev} stopped: {said}")))
        }
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(Failure(format!(
                "--pcap: tcpdump on {netdev} did not listen within {LISTEN_WITHIN:?}"
            )))
        }
    }
}
