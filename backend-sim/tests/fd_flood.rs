//! A flood of connections to a device's listener, from another process, in a process
//! whose open-file limit is low: `accept(2)` runs out of descriptors, and the device
//! survives it. The established pair keeps running through the flood, a new pair can be
//! set up after it, and the warning names the limit.
//!
//! `harness = false` (see Cargo.toml): `main` is the test, so it can lower its own
//! open-file limit without touching other tests, and run itself again as the flooder.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backend_sim::SimBackend;
use common::{open_fds, set_nofile};
use verbs_api::*;

const FLOOD: usize = 3000;
const WAIT: Duration = Duration::from_secs(10);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        println!("fd_flood: test");
        return;
    }
    if let Ok(to) = std::env::var("FLOOD_TO") {
        flooder(to.parse().unwrap());
        return;
    }
    a_flood_of_connections_does_not_take_the_device_down();
    println!("test fd_flood::a_flood_of_connections_does_not_take_the_device_down ... ok");
}

/// Connects `FLOOD` times as fast as it can and holds every connection for 5 s.
fn flooder(to: SocketAddr) {
    common::set_nofile(u64::MAX);
    let t0 = Instant::now();
    let mut held = Vec::new();
    for _ in 0..FLOOD {
        match TcpStream::connect_timeout(&to, Duration::from_millis(200)) {
            Ok(s) => held.push(s),
            Err(_) => continue,
        }
    }
    println!("flooded {} in {:?}", held.len(), t0.elapsed());
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(5));
}

/// Everything the sim logs, for the assertions.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A connected pair: `a` on `ca` (in `pda`), `b` on `cb` (in `pdb`), each with its CQ.
fn pair(
    ca: &backend_sim::SimContext,
    pda: &backend_sim::SimPd,
    cb: &backend_sim::SimContext,
    pdb: &backend_sim::SimPd,
) -> (
    backend_sim::SimQp,
    backend_sim::SimCq,
    backend_sim::SimQp,
    backend_sim::SimCq,
) {
    let cqa = ca.create_cq(64, None).unwrap();
    let cqb = cb.create_cq(64, None).unwrap();
    let a = pda
        .create_qp(&QpInitAttr::rc(&cqa, &cqa, QpCap::new(16, 16)))
        .unwrap();
    let b = pdb
        .create_qp(&QpInitAttr::rc(&cqb, &cqb, QpCap::new(16, 16)))
        .unwrap();
    // A generous ACK timeout (0.5 s, 8 tries): the pair set up during the flood must
    // connect while the flooded device sheds connections, and on a loaded machine that
    // can take longer than the default's half a second in all.
    let p = RcParams {
        timeout: 17,
        ..RcParams::default()
    };
    let ea = local_endpoint(ca, &a, &p, 1).unwrap();
    let eb = local_endpoint(cb, &b, &p, 2).unwrap();
    connect_rc(&a, &p, ea.psn, &eb).unwrap();
    connect_rc(&b, &p, eb.psn, &ea).unwrap();
    (a, cqa, b, cqb)
}

/// One WRITE and one READ back over `a`, from a region of A's own PD.
fn ops<Q: QueuePair, C: CompletionQueue, M: MemoryRegion>(a: &Q, cq: &C, local: &M, remote: &M, i: u64) {
    local.write_u64(0, i).unwrap();
    a.post_send(&[
        SendWr::write(2 * i, &[local.sge(0, 8).unwrap()], remote.remote().at(8)).signaled(),
        SendWr::read(2 * i + 1, &[local.sge(8, 8).unwrap()], remote.remote().at(8)).signaled(),
    ])
    .unwrap();
    let wc = poll_n(cq, 2, WAIT).unwrap_or_else(|e| panic!("op {i}: {e}"));
    assert!(wc.iter().all(|w| w.status == WcStatus::Success), "{wc:?}");
    assert_eq!(local.read_u64(8).unwrap(), i);
}

fn a_flood_of_connections_does_not_take_the_device_down() {
    let log = Log::default();
    let w = log.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || w.clone())
        .init();
    let sim = SimBackend::default();
    let (ca, cb) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pda, pdb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let local = pda.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let target = pdb.reg_mr(4096, AccessFlags::ALL).unwrap();
    let (a, cqa, _b, _cqb) = pair(&ca, &pda, &cb, &pdb);
    ops(&a, &cqa, &local, &target, 0);

    // Room for the device's own needs and a little more, not for the flood.
    let limit = open_fds() as u64 + 48;
    set_nofile(limit);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("FLOOD_TO", cb.listen_addr().to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The established pair keeps working through the flood.
    let t0 = Instant::now();
    let mut i = 1;
    while t0.elapsed() < Duration::from_millis(1500) {
        ops(&a, &cqa, &local, &target, i);
        i += 1;
    }
    let mut said = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut said,
    )
    .unwrap();
    eprintln!("{}; the pair ran {i} WRITE+READ pairs meanwhile", said.trim());
    // While the flooder still holds its connections, a new pair can be set up.
    let (a3, cq3, _b3, _cqb3) = pair(&ca, &pda, &cb, &pdb);
    ops(&a3, &cq3, &local, &target, 7);
    assert!(child.wait().unwrap().success());
    // And after it.
    let (a4, cq4, _b4, _cqb4) = pair(&ca, &pda, &cb, &pdb);
    ops(&a4, &cq4, &local, &target, 8);
    let logged = String::from_utf8_lossy(&log.0.lock().unwrap()).to_string();
    assert!(
        logged.contains("accept failed") && logged.contains(&format!("the open-file limit is {limit}")),
        "no warning naming the limit: {logged}"
    );
    // The flooded device warns once, not per failed accept. The open-file limit is the
    // process's, so the other device may meet it too while the flood holds descriptors
    // (accepting the hello of a pair set up meanwhile): once at most, likewise.
    let warnings = |dev: &str| {
        logged
            .lines()
            .filter(|l| l.contains("accept failed") && l.contains(&format!("listener={dev}")))
            .count()
    };
    assert_eq!(warnings("sim1"), 1, "the flooded device warned once: {logged}");
    assert!(
        warnings("sim0") <= 1,
        "the other device warned at most once: {logged}"
    );
}
