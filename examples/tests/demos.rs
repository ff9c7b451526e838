//! Runs every example's demo (and perf, devinfo) on the sim through the built binaries,
//! with small sizes, and checks the exit status and the key lines of the output. Each run
//! is bounded: a hung demo fails its test instead of hanging `cargo test`.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Out {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn run(bin: &str, args: &[&str]) -> Out {
    run_env(bin, args, &[])
}

/// `run` with these environment variables set.
fn run_env(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Out {
    let limit = Duration::from_secs(60);
    let mut child = Command::new(bin)
        .args(args)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .env_remove("RDMA_SIM_LISTEN")
        .env_remove("RDMA_SIM_DEVICES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin}: {e}"));
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t1 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t2 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{bin} {args:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Out {
        ok: status.success(),
        code: status.code(),
        stdout: t1.join().unwrap(),
        stderr: t2.join().unwrap(),
    }
}

fn ok(bin: &str, args: &[&str]) -> Out {
    let o = run(bin, args);
    assert!(o.ok, "{bin} {args:?} failed:\n{o:?}");
    o
}

fn has(o: &Out, text: &str) {
    assert!(o.stdout.contains(text), "missing {text:?} in:\n{o:?}");
}

/// The line of a markdown table row that starts with `start`, and its trimmed cells
/// (the first and last empty, outside the pipes).
fn table_row<'a>(o: &'a Out, start: &str) -> (&'a str, Vec<&'a str>) {
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no row {start:?}:\n{o:?}"));
    (line, line.split('|').map(str::trim).collect())
}

const KV: &str = env!("CARGO_BIN_EXE_kv-rpc");
const POOL: &str = env!("CARGO_BIN_EXE_param-pool");
const LOCK: &str = env!("CARGO_BIN_EXE_dist-lock");
const PERF: &str = env!("CARGO_BIN_EXE_perf");
const DEVINFO: &str = env!("CARGO_BIN_EXE_devinfo");
const ECHO: &str = env!("CARGO_BIN_EXE_async-echo");
const COMPARE: &str = env!("CARGO_BIN_EXE_perf-compare");

#[test]
fn kv_rpc_demo_checks_every_answer() {
    let o = ok(KV, &["demo", "--keys", "200", "--clients", "2"]);
    has(&o, "demo: OK: all 1400 answers checked");
    has(&o, "wrong answers: 0");
    has(&o, "ops/s");
    has(&o, "p99.9");
    has(&o, "receive queue ran dry 0 times");
}

#[test]
fn kv_rpc_no_refill_rnr_retry_0_shows_rnr_retry_exc_err() {
    let o = ok(KV, &["demo", "--no-refill", "--rnr-retry", "0", "--keys", "200"]);
    has(&o, "IBV_WC_RNR_RETRY_EXC_ERR");
    has(&o, "IBV_WC_WR_FLUSH_ERR");
    has(&o, "demo: OK: expected outcome observed");
}

#[test]
fn kv_rpc_no_refill_with_retries_completes_slowly() {
    let o = ok(
        KV,
        &[
            "demo",
            "--no-refill",
            "--tick-ms",
            "20",
            "--keys",
            "100",
            "--clients",
            "1",
        ],
    );
    has(&o, "demo: OK: all 350 answers checked");
    assert!(
        o.stdout.contains("SENDs arriving meanwhile got RNR NAKs"),
        "the receive queue should have run dry:\n{o:?}"
    );
}

/// One SRQ for both clients' QPs: every answer right, the limit event fired (the server
/// refilled on it), and with `--rnr-retry 0` any SEND that met an empty SRQ would have
/// failed the run with RNR_RETRY_EXC_ERR.
#[test]
fn kv_rpc_srq_demo_refills_on_the_limit_event() {
    let o = ok(
        KV,
        &[
            "demo",
            "--srq",
            "--keys",
            "200",
            "--clients",
            "2",
            "--window",
            "8",
            "--rnr-retry",
            "0",
        ],
    );
    has(
        &o,
        "demo: OK: all 1400 answers checked over one shared receive queue",
    );
    has(&o, "no IBV_WC_RNR_RETRY_EXC_ERR");
    has(&o, "wrong answers: 0");
    let line = o
        .stdout
        .lines()
        .find(|l| l.contains("server: SRQ limit event fired "))
        .unwrap_or_else(|| panic!("no SRQ line:\n{o:?}"));
    let number_after = |text: &str| -> u64 {
        line.split(text)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number after {text:?} in {line}"))
    };
    assert!(number_after("fired ") >= 1, "{line}");
    // 1400 requests through 128 receives: all but 128 of them were received into
    // receives that a refill posted.
    assert!(number_after("refills posted ") >= 1400 - 128, "{line}");
    has(&o, "server: SRQ: fewest receives left");
    has(&o, "ran dry 0 times");
}

#[test]
fn param_pool_demo_uses_no_torn_vector() {
    let o = ok(
        POOL,
        &["demo", "--duration-ms", "500", "--vectors", "4", "--dim", "512"],
    );
    has(&o, "torn vectors used: 0");
    has(&o, "OK: every one of the");
    has(&o, "reads/s");
    // Each reader reads through its own window; the owner revokes the last one by
    // invalidating it, and only that reader's READs are then refused.
    has(&o, "one READ-only window per reader");
    // (The owner numbers readers in the order they connected, the readers themselves
    // by thread: the two need not agree, so the revoked reader is counted, not named.)
    has(&o, "owner: revoked reader 1: invalidated its window");
    let revoked = o
        .stdout
        .lines()
        .filter(|l| {
            l.ends_with("owner 0 revoked my window (RDMA READ: REM_ACCESS_ERR); no more reads from it")
        })
        .count();
    assert_eq!(revoked, 1, "one reader revoked:\n{o:?}");
    has(&o, "revoked: 1 reader window(s) invalidated");
}

#[test]
fn dist_lock_cas_two_processes_two_threads() {
    let o = ok(
        LOCK,
        &[
            "demo",
            "--mode",
            "cas",
            "--procs",
            "2",
            "--threads",
            "2",
            "--iters",
            "50",
        ],
    );
    has(&o, "demo: OK: cas lock: counter = 200 = 2 x 2 x 50");
    has(&o, "acq/s");
}

#[test]
fn dist_lock_ticket_two_processes_two_threads() {
    let o = ok(
        LOCK,
        &[
            "demo",
            "--mode",
            "ticket",
            "--procs",
            "2",
            "--threads",
            "2",
            "--iters",
            "50",
        ],
    );
    has(&o, "demo: OK: ticket lock: counter = 200 = 2 x 2 x 50");
    has(&o, "next_ticket=200 now_serving=200");
}

#[test]
fn perf_send_lat() {
    let o = ok(PERF, &["send_lat", "-n", "200"]);
    has(&o, "Send Latency Test");
    has(&o, "t_typical[usec]");
    let row = o
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("2 "))
        .unwrap_or_else(|| panic!("no row for 2 bytes:\n{o:?}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols.len(), 9, "{row}");
    assert_eq!(cols[1], "200");
    let typical: f64 = cols[4].parse().unwrap();
    assert!(typical > 0.0, "{row}");
}

#[test]
fn perf_write_bw() {
    let o = ok(PERF, &["write_bw", "-n", "200", "-s", "65536", "-F"]);
    has(&o, "RDMA_Write BW Test");
    has(&o, "BW average[MB/sec]");
    let row = o
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("65536 "))
        .unwrap_or_else(|| panic!("no row for 65536 bytes:\n{o:?}"));
    let cols: Vec<f64> = row.split_whitespace().map(|c| c.parse().unwrap()).collect();
    assert_eq!(cols[1], 200.0);
    assert!(cols[3] > 0.0 && cols[2] >= cols[3], "peak >= average > 0: {row}");
}

/// `--mw`: the one-sided rows go through the server's (and, for write_lat, the client's)
/// type 2 window, and the client reports its bind rate; a test without remote memory
/// refuses the flag.
#[test]
fn perf_through_memory_windows() {
    for test in ["write_lat", "read_bw", "atomic_lat"] {
        let o = ok(PERF, &[test, "--mw", "-n", "200"]);
        has(&o, "binds of a type 2 window through the send queue");
        has(&o, "binds/s");
    }
    let o = run(PERF, &["send_bw", "--mw", "-n", "200"]);
    assert!(!o.ok, "{o:?}");
    assert!(
        o.stderr.contains("--mw is for the READ, WRITE and atomic tests"),
        "{o:?}"
    );
}

#[test]
fn perf_json_rows_parse() {
    for (args, test, size) in [
        (
            &["write_bw", "-n", "200", "-s", "65536", "--json"][..],
            "write_bw",
            65536,
        ),
        (&["read_lat", "-n", "100", "--json"][..], "read_lat", 2),
        (&["atomic_bw", "-n", "200", "--json"][..], "atomic_bw", 8),
    ] {
        let o = ok(PERF, args);
        let rows: Vec<serde_json::Value> = o
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}\n{o:?}")))
            .collect();
        assert_eq!(rows.len(), 1, "{o:?}");
        let r = &rows[0];
        assert_eq!(r["test"], test);
        assert_eq!(r["size"], size);
        assert_eq!(r["iters"], args[2].parse::<u64>().unwrap());
        for k in [
            "t_typical_us",
            "t_avg_us",
            "t_p99_us",
            "bw_avg_MBps",
            "msg_rate_Mpps",
        ] {
            assert!(r[k].as_f64().is_some_and(|v| v > 0.0), "{k} in {r}");
        }
    }
}

/// `perf --perftest`: perftest's loops and arithmetic run every kind of test (SEND with
/// its own receive CQ on both ends, WRITE ping-pong, READ, atomics, bandwidth with CQ
/// moderation) and give positive figures; the header says how it measured.
#[test]
fn perf_perftest_mode_runs_each_loop() {
    for args in [
        &["send_lat", "-n", "100"][..],
        &["write_lat", "-n", "100"][..],
        &["read_lat", "-n", "100"][..],
        &["atomic_lat", "-n", "100"][..],
        &["send_bw", "-n", "300", "-s", "64"][..],
        &["write_bw", "-n", "300", "-s", "65536"][..],
    ] {
        let mut a = args.to_vec();
        a.push("--perftest");
        let o = ok(PERF, &a);
        has(&o, "Measured as     : perftest (busy polling, cycle counter at");
        let mut j = a.clone();
        j.push("--json");
        let o = ok(PERF, &j);
        let r: serde_json::Value =
            serde_json::from_str(o.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {o:?}"));
        let k = if args[0].ends_with("_lat") {
            "t_typical_us"
        } else {
            "bw_avg_MBps"
        };
        assert!(r[k].as_f64().is_some_and(|v| v > 0.0), "{k} in {r}");
        assert_eq!(r["iters"], args[2].parse::<u64>().unwrap(), "{r}");
    }
}

/// `perf -c UC` and `--use_srq`, with perf's loops and perftest's: the header names the
/// connection type and the SRQ; a SEND bandwidth row over UC is counted at the receiver,
/// every message either received or dropped; a latency row over either has positive
/// figures.
const UD_ECHO: &str = env!("CARGO_BIN_EXE_ud-echo");

/// ud-echo: one UD QP serves several clients, told apart by src_qp; while its receive
/// queue is left empty, datagrams are dropped and counted lost, every other one comes
/// back intact.
#[test]
fn ud_echo_demo_counts_the_drops_of_an_empty_receive_queue() {
    let o = ok(UD_ECHO, &["demo", "--clients", "3", "-n", "500"]);
    has(&o, "demo: OK: 3 client(s) sent 1500 datagrams to one UD QP");
    has(&o, "dropped while the server's receive queue was empty");
    has(&o, " 0 damaged, 0 unexpected");
}

const MCAST_PUB: &str = env!("CARGO_BIN_EXE_mcast-pub");

/// mcast-pub: one publisher's datagrams reach every subscriber through the group; the
/// subscriber that stops posting receives drops some, counted, and the others none.
#[test]
fn mcast_pub_demo_counts_the_drops_of_a_starved_subscriber() {
    for profile in ["portable", "rxe"] {
        let o = ok(
            MCAST_PUB,
            &[
                "--profile",
                profile,
                "demo",
                "--subscribers",
                "3",
                "--messages",
                "600",
            ],
        );
        has(&o, "demo: OK: 3 subscriber(s)");
        has(&o, "subscriber 1: received 600 intact, dropped 0, damaged 0");
        has(&o, "subscriber 2: received 600 intact, dropped 0, damaged 0");
        assert!(!o.stdout.contains("subscriber 0: received 600 intact"), "{o:?}");
    }
}

#[test]
fn perf_connection_types_and_srq() {
    for (args, conn, srq) in [
        (&["send_lat", "-n", "200", "-c", "UC"][..], "UC", "OFF"),
        (&["write_lat", "-n", "200", "-c", "UC"][..], "UC", "OFF"),
        (&["send_lat", "-n", "200", "--use_srq"][..], "RC", "ON"),
        (
            &["send_bw", "-n", "2000", "-s", "64", "--use_srq"][..],
            "RC",
            "ON",
        ),
        (
            &["send_bw", "-n", "2000", "-s", "64", "-c", "UC"][..],
            "UC",
            "OFF",
        ),
        (&["send_lat", "-n", "200", "-c", "UD"][..], "UD", "OFF"),
        (
            &["send_bw", "-n", "2000", "-s", "64", "-c", "UD"][..],
            "UD",
            "OFF",
        ),
    ] {
        for perftest in [false, true] {
            let mut a = args.to_vec();
            if perftest {
                a.push("--perftest");
            }
            let o = ok(PERF, &a);
            has(
                &o,
                &format!(" Connection type : {conn}\t\tUsing SRQ      : {srq}"),
            );
            a.push("--json");
            let o = ok(PERF, &a);
            let r: serde_json::Value =
                serde_json::from_str(o.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {o:?}"));
            let k = if args[0].ends_with("_lat") {
                "t_typical_us"
            } else {
                "msg_rate_Mpps"
            };
            assert!(r[k].as_f64().is_some_and(|v| v > 0.0), "{k} in {r}");
            if conn != "RC" && args[0] == "send_bw" {
                let (got, lost) = (r["received"].as_u64().unwrap(), r["dropped"].as_u64().unwrap());
                assert!(got > 0 && got + lost == 2000, "{r}");
            } else {
                assert!(
                    r.get("received").is_none(),
                    "only unreliable SEND bandwidth rows: {r}"
                );
            }
        }
    }
    let o = run(PERF, &["read_bw", "-c", "UC"]);
    assert!(
        !o.ok && o.stderr.contains("UC has no RDMA READ and no atomics"),
        "{o:?}"
    );
    let o = run(PERF, &["write_bw", "-c", "UD"]);
    assert!(!o.ok && o.stderr.contains("UD has SEND only"), "{o:?}");
    let o = run(PERF, &["write_bw", "--use_srq"]);
    assert!(
        !o.ok && o.stderr.contains("--use_srq is for the SEND tests"),
        "{o:?}"
    );
}

/// A server started with --perftest refuses a client that runs without it (both ends
/// must measure alike), and says so to the client.
#[test]
fn perf_perftest_mode_must_match_on_both_ends() {
    use examples::child::{ChildProc, Echo};
    let args: Vec<String> = ["read_lat", "--server", "--perftest", "-p", "0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut server =
        ChildProc::spawn_program("perf-server", Command::new(PERF).args(&args), Echo::Quiet).unwrap();
    let addr = server.listen_addr(Duration::from_secs(20)).unwrap();
    let o = run(PERF, &["read_lat", &addr.to_string(), "-n", "10"]);
    assert!(!o.ok, "{o:?}");
    assert!(
        o.stderr
            .contains("the server refused: the client runs without --perftest"),
        "{o:?}"
    );
    let status = server.wait(Duration::from_secs(20)).unwrap();
    assert!(!status.success(), "the server ends with the refusal too");
}

/// perf-compare's UCX and libfabric rows: each reference program runs, and every row
/// pairs a positive figure of the sim with one of the reference. Needs `ucx-utils` and
/// `libfabric-bin`, which a fresh machine lacks, so `cargo test` leaves it out; `.ci/run`
/// installs them and runs it (`cargo test -p examples --test demos -- --ignored`).
#[test]
#[ignore = "needs ucx-utils and libfabric-bin; .ci/run installs them and runs it"]
fn perf_compare_pairs_the_sim_with_ucx_and_libfabric() {
    let o = ok(
        COMPARE,
        &["--rounds", "1", "--lat-iters", "1000", "--only", "peers"],
    );
    for row in [
        "send_lat vs UCX tag_lat",
        "write_lat vs UCX tag_lat",
        "send_lat vs libfabric fi_pingpong",
        "atomic_lat vs UCX ucp_fadd",
    ] {
        let (line, cols) = table_row(&o, &format!("| {row} |"));
        let us = |c: &str| -> f64 {
            let v = c
                .split_whitespace()
                .rev()
                .nth(1)
                .unwrap_or_else(|| panic!("{line}"));
            v.parse().unwrap_or_else(|_| panic!("{c:?} in {line}"))
        };
        assert!(us(cols[2]) > 0.0 && us(cols[3]) > 0.0, "{line}");
        let ratio: f64 = cols[4].parse().unwrap_or_else(|_| panic!("{line}"));
        assert!(
            (ratio - us(cols[2]) / us(cols[3])).abs() < 0.02,
            "one round: ratio = sim / reference: {line}"
        );
    }
}

/// perf-compare's one-thread cost rows: the sim's and TCP's nanoseconds per message, and
/// the sim's own work as their difference; an empty poll against the `recv`s it makes.
#[test]
fn perf_compare_cost_row() {
    let o = ok(
        COMPARE,
        &["--rounds", "1", "--lat-iters", "200", "--only", "cost"],
    );
    // A row's line, its columns, and the sim's and the baseline's figures (the first
    // number in each, after the baseline's label).
    let row = |name: &str, label: &str| {
        let (line, cols) = table_row(&o, &format!("| {name}"));
        let first = |c: &str| -> f64 {
            let v = c.split_whitespace().find_map(|w| w.parse::<f64>().ok());
            v.unwrap_or_else(|| panic!("{c:?} in {line}"))
        };
        let (sim, base) = (first(cols[2]), first(cols[3].trim_start_matches(label)));
        assert!(sim > 0.0 && base > 0.0, "{line}");
        (line, cols, sim, base)
    };
    let (line, cols, sim, tcp) = row("CPU per message, one thread", "TCP send + recv");
    let own: f64 = cols[2]
        .split("own work ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!((own - (sim - tcp)).abs() < 2.0, "own work = sim - TCP: {line}");
    let (line, cols, sim, tcp) = row(
        "Empty poll of a device with two connections",
        "two TCP recv finding nothing",
    );
    let ratio: f64 = cols[4].parse().unwrap_or_else(|_| panic!("{line}"));
    assert!(
        (ratio - sim / tcp).abs() < 0.02,
        "one round: ratio = sim / TCP: {line}"
    );
}

/// perf-compare's UD row measures the sim's UD: messages received per second at the
/// receiver, and the datagrams dropped on the way reported beside them (the figures are a
/// benchmark's, not asserted here).
#[test]
fn perf_compare_ud_row_measures_received_datagrams() {
    let o = run(COMPARE, &["--rounds", "1", "--only", "ud"]);
    let (line, cols) = table_row(&o, "| UD send_bw 64 B");
    assert!(
        cols[2].contains("M msgs/s received") && cols[2].contains("dropped"),
        "{line}"
    );
    assert!(cols[4].parse::<f64>().is_ok(), "a ratio: {line}");
}

/// Without the reference programs, asking for their rows is a clear error.
#[test]
fn perf_compare_names_the_missing_reference_programs() {
    let o = run_env(
        COMPARE,
        &["--rounds", "1", "--only", "peers"],
        &[("PATH", "/nonexistent")],
    );
    assert!(!o.ok, "{o:?}");
    assert!(
        o.stderr.contains("ucx_perftest and fi_pingpong")
            && o.stderr.contains("apt-get install ucx-utils libfabric-bin"),
        "{o:?}"
    );
}

#[test]
fn devinfo_lists_sim_devices() {
    let o = ok(DEVINFO, &[]);
    has(&o, "hca_id:\tsim0");
    has(&o, "hca_id:\tsim1");
    has(&o, "atomic_cap:\t\t\tATOMIC_HCA (1)");
    has(&o, "GID[  0]:");
    has(&o, "verbs-api capabilities:");
    // The sim's SRQs and UC QPs, with the SRQ limits (UD is shown either way).
    has(&o, "\t\tSRQ:\t\t\tyes");
    // The limits of the default profile (portable: the smaller of rxe's and mlx5's).
    let limits = backend_sim::Profile::Portable.attrs();
    has(&o, &format!("\t\t  max_srq_wr:\t\t{}", limits.max_srq_wr));
    has(&o, "\t\tUC QPs:\t\t\tyes");
    has(&o, "\t\tUD QPs:\t\t\t");
    has(&o, &format!("\tmax_srq_sge:\t\t\t{}", limits.max_srq_sge));
    // The profile and its switches.
    has(&o, "sim profile:\tportable");
    for s in backend_sim::profile::switches::table() {
        has(
            &o,
            &format!("\t\t{}:\t{}", s.name, s.value(backend_sim::Profile::Portable)),
        );
    }
}

/// `--profile` picks the kind of HCA the sim plays: devinfo shows its identity and
/// switches, demos pass it on to their server processes and still check their invariants,
/// and an unknown profile is refused naming the known ones.
#[test]
fn the_examples_take_the_sim_profile() {
    let o = ok(DEVINFO, &["--profile", "rxe", "-d", "sim0"]);
    has(&o, "sim profile:\trxe");
    has(&o, "\tvendor_id:\t\t\t0xffffff");
    has(&o, "\t\tsq_slot_release:\tat completion");
    let o = ok(
        KV,
        &["demo", "--profile", "mlx5", "--keys", "200", "--clients", "2"],
    );
    has(&o, "demo: OK");
    // rxe's Ethernet port: the server and client processes find each other by GID alone
    // (LID 0), over RC and over UD.
    let o = ok(
        KV,
        &["demo", "--profile", "rxe", "--keys", "200", "--clients", "2"],
    );
    has(&o, "demo: OK");
    let o = ok(UD_ECHO, &["demo", "--profile", "rxe"]);
    has(&o, "demo: OK");
    let o = run(DEVINFO, &["--profile", "cx9"]);
    assert!(
        !o.ok && o.stderr.contains("portable") && o.stderr.contains("mlx5"),
        "{o:?}"
    );
}

#[cfg(not(feature = "ibverbs"))]
#[test]
fn ibverbs_without_the_feature_is_a_clear_error() {
    let o = run(DEVINFO, &["--backend", "ibverbs"]);
    assert!(!o.ok);
    assert!(o.stderr.contains("built without the ibverbs backend"), "{o:?}");
    assert!(o.stderr.contains("--features ibverbs"), "{o:?}");
}

#[test]
fn async_echo_demo_checks_every_echo() {
    let o = ok(ECHO, &["demo", "--clients", "3", "-n", "300"]);
    has(
        &o,
        "demo: OK: 3 client(s) x 300 messages, every echo matched what was sent",
    );
    assert_eq!(
        o.stdout.matches("server: echoed 300 messages").count(),
        3,
        "{o:?}"
    );
}

#[test]
fn async_echo_server_and_client_processes() {
    use std::io::BufRead;
    let mut server = Command::new(ECHO)
        .args(["server", "--listen", "127.0.0.1:0"])
        .env_remove("RDMA_SIM_LISTEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(server.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr = first.strip_prefix("listening on ").expect(&first).to_string();
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || run(ECHO, &["client", "--server", &addr, "-n", "200"]))
        })
        .collect();
    for c in clients {
        let o = c.join().unwrap();
        assert!(o.ok, "{o:?}");
        has(&o, "client 0: 200 echoes in");
    }
    // The server saw both clients say goodbye.
    let echoed: Vec<String> = lines.by_ref().take(2).map(|l| l.unwrap()).collect();
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        echoed
            .iter()
            .all(|l| l.starts_with("server: echoed 200 messages")),
        "{echoed:?}"
    );
}

/// The binaries log through a `tracing` subscriber on stderr that honours `RUST_LOG`
/// (here: the sim's debug line for each device it opens) and shows only warnings and
/// errors without it.
#[test]
fn binaries_log_to_stderr_as_rust_log_says() {
    let o = run_env(DEVINFO, &[], &[("RUST_LOG", "backend_sim=debug")]);
    assert!(o.ok, "{o:?}");
    assert!(
        o.stderr.contains("DEBUG") && o.stderr.contains("sim device open"),
        "RUST_LOG=backend_sim=debug should show the sim's debug lines on stderr:\n{o:?}"
    );
    assert!(
        !o.stdout.contains("sim device open"),
        "logs go to stderr, not stdout:\n{o:?}"
    );
    let o = ok(DEVINFO, &[]);
    assert!(
        !o.stderr.contains("sim device open"),
        "without RUST_LOG only warnings and errors are logged:\n{o:?}"
    );
}
