//! The launcher, `rdma-sim`: it runs unmodified programs on the sim and passes their exit
//! status through, prints settings a shell can `eval`, finds the library wherever it is
//! installed, `rdma-sim status` lists the devices of running programs, `rdma-sim port`
//! takes a running program's port down and back, and `rdma-sim trace` shows a capture as
//! ladders; `--seed` makes a run's choices repeat.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

const LIMIT: Duration = Duration::from_secs(30);

fn launcher() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rdma-sim"))
}

/// `rdma-sim args...` with a clean sim environment, the library named as a user's own
/// build would leave it.
fn rdma_sim(args: &[&str]) -> Command {
    let mut c = Command::new(launcher());
    c.args(args)
        .env("RDMA_SIM_LIB", common::lib())
        .env_remove("RDMA_SIM_DEVICES")
        .env_remove("RDMA_SIM_LISTEN")
        .env_remove("RDMA_SIM_PROFILE")
        .env_remove("RDMA_SIM_SEED")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn run(c: &mut Command) -> Output {
    common::wait(c.spawn().expect("rdma-sim"), LIMIT)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_program_runs_on_the_sim_and_its_exit_status_is_its_own() {
    let out = run(&mut rdma_sim(&["ibv_devices"]));
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).contains("sim0"), "{}", text(&out.stdout));
    assert!(
        !text(&out.stdout).contains("sim1"),
        "one device unless asked: {}",
        text(&out.stdout)
    );

    let out = run(&mut rdma_sim(&[
        "--devices",
        "3",
        "--profile",
        "rxe",
        "--",
        "ibv_devinfo",
        "-d",
        "sim2",
    ]));
    assert!(out.status.success(), "{out:?}");
    assert!(
        text(&out.stdout).contains("Ethernet"),
        "the rxe profile's port: {}",
        text(&out.stdout)
    );

    // env with arguments is env(1), as any program; alone it prints the settings.
    let out = run(&mut rdma_sim(&["env", "RDMA_SIM_PROFILE=mlx5", "ibv_devinfo"]));
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).contains("0x02c9"), "{}", text(&out.stdout));

    let out = run(&mut rdma_sim(&["--", "sh", "-c", "exit 7"]));
    assert_eq!(out.status.code(), Some(7));
    let out = run(&mut rdma_sim(&["sh", "-c", "echo $LD_PRELOAD"]));
    assert_eq!(
        text(&out.stdout).trim(),
        common::lib().canonicalize().unwrap().to_str().unwrap()
    );

    let out = run(&mut rdma_sim(&["no-such-program-anywhere"]));
    assert_eq!(out.status.code(), Some(127));
    assert!(
        text(&out.stderr).contains("command not found"),
        "{}",
        text(&out.stderr)
    );

    let out = run(&mut rdma_sim(&["--listen", "nowhere", "true"]));
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("RDMA_SIM_LISTEN"),
        "{}",
        text(&out.stderr)
    );
}

/// The LID `ibv_devinfo` reports for sim0 under `rdma-sim ARGS -- ibv_devinfo`.
fn lid_under(args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--", "ibv_devinfo"]);
    let out = run(&mut rdma_sim(&all));
    assert!(out.status.success(), "{out:?}");
    let stdout = text(&out.stdout);
    let lid = stdout.lines().find_map(|l| l.trim().strip_prefix("port_lid:"));
    lid.unwrap_or_else(|| panic!("no port_lid in {stdout}"))
        .trim()
        .to_string()
}

#[test]
fn a_seed_repeats_the_devices_choices() {
    // The portable profile's port is InfiniBand: its LID is the port the device drew.
    let a = lid_under(&["--seed", "7"]);
    assert_eq!(a, lid_under(&["--seed", "7"]), "seed 7 twice");
    assert_ne!(a, lid_under(&["--seed", "0x8"]), "seeds 7 and 8");
    let out = run(&mut rdma_sim(&["--seed", "seven", "true"]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        text(&out.stderr).contains("not a number"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn env_puts_a_shell_on_the_sim() {
    let out = run(&mut rdma_sim(&["--profile", "mlx5", "env"]));
    assert!(out.status.success(), "{out:?}");
    let exports = text(&out.stdout);
    assert!(exports.contains("export RDMA_SIM_PROFILE='mlx5'"), "{exports}");
    let out = run(Command::new("sh")
        .arg("-c")
        .arg(format!("{exports}\nibv_devinfo"))
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped()));
    assert!(out.status.success(), "{out:?}");
    // The mlx5 profile's vendor: Mellanox.
    assert!(text(&out.stdout).contains("0x02c9"), "{}", text(&out.stdout));
}

#[test]
fn the_library_is_found_beside_the_launcher() {
    let dir = tempdir("beside");
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    let exe = dir.join("bin/rdma-sim");
    std::fs::copy(launcher(), &exe).unwrap();
    std::fs::copy(common::lib(), dir.join("lib/libibverbs_sim.so")).unwrap();
    let out = run(Command::new(&exe)
        .arg("lib")
        .env_remove("RDMA_SIM_LIB")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped()));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        Path::new(text(&out.stdout).trim()),
        dir.join("lib/libibverbs_sim.so").canonicalize().unwrap()
    );

    // Alone, it uses the copy it carries (a release build), or says why it has none.
    std::fs::remove_file(dir.join("lib/libibverbs_sim.so")).unwrap();
    let cache = dir.join("cache");
    let out = run(Command::new(&exe)
        .arg("lib")
        .env_remove("RDMA_SIM_LIB")
        .env("XDG_CACHE_HOME", &cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped()));
    if out.status.success() {
        let so = PathBuf::from(text(&out.stdout).trim());
        assert!(so.starts_with(&cache), "{}", so.display());
        assert_eq!(&std::fs::read(&so).unwrap()[..4], b"\x7fELF");
    } else {
        assert!(
            text(&out.stderr).contains("carries none"),
            "{}",
            text(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn status_lists_the_device_and_qp_of_a_running_program() {
    let port = common::free_port().to_string();
    let mut server = rdma_sim(&["ibv_rc_pingpong", "-p", &port])
        .spawn()
        .expect("server");
    // The server has its QP (in INIT) while it waits for a client.
    let deadline = Instant::now() + LIMIT;
    let listed = loop {
        let out = run(&mut rdma_sim(&["status", "--json"]));
        assert!(out.status.success(), "{out:?}");
        let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let ours = all
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["pid"] == server.id() && d["qps"].as_array().is_some_and(|q| !q.is_empty()))
            .cloned();
        if let Some(d) = ours {
            break d;
        }
        assert!(Instant::now() < deadline, "the server never showed: {all:#}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(listed["device"], "sim0");
    assert_eq!(listed["program"], "ibv_rc_pingpong");
    assert_eq!(listed["qps"][0]["qp_type"], "RC");
    assert_eq!(listed["qps"][0]["state"], "INIT");
    let table = text(&run(&mut rdma_sim(&["status"])).stdout);
    let line = format!("pid {} ibv_rc_pingpong", server.id());
    assert!(table.contains(&line), "{table}");
    let _ = server.kill();
    let _ = server.wait();
}

/// Runs tests/c/`name`.c under rdma-sim with `args`, and waits until its device shows a
/// QP in RTS (set up, its address vector given).
fn spawn_with_a_qp(name: &str, args: &[&str]) -> std::process::Child {
    let exe = common::compile_c(name);
    let argv: Vec<&str> = std::iter::once(exe.to_str().unwrap())
        .chain(args.iter().copied())
        .collect();
    let prog = rdma_sim(&argv).spawn().expect(name);
    let deadline = Instant::now() + LIMIT;
    loop {
        let out = run(&mut rdma_sim(&["status", "--json"]));
        let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let ours = |d: &&serde_json::Value| {
            d["pid"] == prog.id()
                && d["qps"]
                    .as_array()
                    .is_some_and(|q| q.iter().any(|q| q["state"] == "RTS"))
        };
        if all.as_array().unwrap().iter().any(|d| ours(&d)) {
            break;
        }
        assert!(Instant::now() < deadline, "the program never showed: {all:#}");
        std::thread::sleep(Duration::from_millis(20));
    }
    prog
}

#[test]
fn port_takes_a_running_programs_port_down_and_back() {
    // tests/c/port.c waits for PORT_ERR, posts a SEND, waits for PORT_ACTIVE, and checks
    // that the SEND completed and was received once.
    let prog = spawn_with_a_qp("port", &[]);
    let pid = prog.id().to_string();
    for (state, want) in [("down", "port DOWN"), ("up", "port ACTIVE")] {
        let out = run(&mut rdma_sim(&["port", "sim0", state, "--pid", &pid]));
        assert!(out.status.success(), "{out:?}");
        assert!(text(&out.stdout).contains(want), "{out:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = common::wait(prog, LIMIT);
    assert!(
        out.status.success() && text(&out.stdout).contains("\n0 failed"),
        "{out:?}\n{}",
        text(&out.stdout)
    );
    let out = run(&mut rdma_sim(&["port", "sim9", "down", "--pid", &pid]));
    assert_eq!(out.status.code(), Some(125), "no such device: {out:?}");
    assert!(text(&out.stderr).contains("no live sim device sim9"), "{out:?}");
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rdma-sim-launcher-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `rdma-sim trace` as a user runs it on a capture file: a RoCE v2 conversation with a
/// remote access NAK (pcapng, as the sim writes) and the same packets in a classic pcap
/// (as `tcpdump -w` writes), both shown as one connection's ladder, and an SVG drawn.
#[test]
fn trace_shows_a_capture_as_a_ladder() {
    use backend_sim_proto::capture::opcode::Transport;
    use backend_sim_proto::capture::packet::{self, udp_source_port, Route};
    use backend_sim_proto::capture::pcapng;
    use backend_sim_proto::capture::segment::{segments, Context};
    use backend_sim_proto::wire::{Frame, NakCode};

    let gid = |last: u8| {
        let mut g = [0u8; 16];
        g[10..].copy_from_slice(&[0xff, 0xff, 192, 168, 7, last]);
        g
    };
    let there = Route {
        src_gid: gid(1),
        dst_gid: gid(2),
        src_port: udp_source_port(0, 0x20, 0x21),
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
    };
    let back = Route {
        src_gid: gid(2),
        dst_gid: gid(1),
        ..there
    };
    let frames = [
        (
            there,
            0x21,
            Frame::Read {
                psn: 5,
                len: 64,
                addr: 0x7000,
                rkey: 0xbad,
                inflight: 1,
            },
        ),
        (
            back,
            0x20,
            Frame::Nak {
                psn: 5,
                code: NakCode::RemoteAccess,
                reason: None,
            },
        ),
    ];
    let mut packets = Vec::new();
    for (route, dst_qpn, f) in frames {
        let cx = Context {
            transport: Transport::Rc,
            dst_qpn,
            mtu: 1024,
            msn: 0,
        };
        for s in segments(&f, &cx) {
            let mut p = Vec::new();
            packet::write(&route, &s.headers, &[], &mut p).unwrap();
            packets.push(p);
        }
    }
    let dir = tempdir("trace");
    let mut ng = Vec::new();
    pcapng::header(&mut ng, "test", "sim0", 0);
    // Classic pcap, little-endian, microseconds, Ethernet.
    let mut classic = Vec::new();
    for v in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 65535, 1] {
        classic.extend_from_slice(&v.to_le_bytes());
    }
    for (i, p) in packets.iter().enumerate() {
        pcapng::packet(&mut ng, 1_000_000_000 + i as u64 * 1000, p, p.len(), None);
        for v in [1u32, i as u32, p.len() as u32, p.len() as u32] {
            classic.extend_from_slice(&v.to_le_bytes());
        }
        classic.extend_from_slice(p);
    }
    for (name, bytes) in [("sim.pcapng", ng), ("tcpdump.pcap", classic)] {
        let file = dir.join(name);
        std::fs::write(&file, bytes).unwrap();
        let svg = dir.join(format!("{name}.svg"));
        let out = run(&mut rdma_sim(&[
            "trace",
            file.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ]));
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{name}: {out:?}");
        assert!(
            stdout.contains("RC connection 192.168.7.1 QP 0x000020 <-> 192.168.7.2 QP 0x000021: 2 packets"),
            "{stdout}"
        );
        assert!(
            stdout.contains("RDMA_READ_REQUEST psn 5 va 0x7000 rkey 0xbad len 64"),
            "{stdout}"
        );
        assert!(stdout.contains("NAK remote access error psn 5"), "{stdout}");
        assert!(stdout.contains("1 NAK remote access error"), "{stdout}");
        assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    }
    // Not a capture: a clear error, not a panic.
    let bogus = dir.join("bogus");
    std::fs::write(&bogus, b"hello").unwrap();
    let out = run(&mut rdma_sim(&["trace", bogus.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("not a capture this can read"),
        "{out:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rdma-sim --pcap`: an unmodified C program's traffic as RoCE v2 packets. Both ends
/// of `ibv_rc_pingpong -s 4096` (path MTU 1024) write their own file; each holds the
/// program's SENDs as First/Middle/Middle/Last packets and `rdma-sim trace` reads them;
/// with `--snaplen all` each packet is whole, its ICRC the one rxe computes.
#[test]
fn pcap_captures_a_c_programs_packets() {
    let dir = tempdir("pcap");
    let pattern = dir.join("pp-%p.pcapng");
    let pattern = pattern.to_str().unwrap();
    let port = common::free_port().to_string();
    let args = [
        "--pcap",
        pattern,
        "--snaplen",
        "all",
        "--",
        "ibv_rc_pingpong",
        "-p",
        &port,
        "-s",
        "4096",
        "-n",
        "5",
        "-m",
        "1024",
    ];
    let server = rdma_sim(&args).spawn().expect("server");
    let client_args: Vec<&str> = args.iter().copied().chain(["127.0.0.1"]).collect();
    // The client retries while the server is not listening yet (its refused attempt
    // made no QP traffic, and its process's capture holds no packet).
    let deadline = Instant::now() + LIMIT;
    let client = loop {
        let out = run(&mut rdma_sim(&client_args));
        if out.status.success()
            || !text(&out.stderr).contains("Couldn't connect")
            || Instant::now() > deadline
        {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(client.status.success(), "{client:?}");
    let server = common::wait(server, LIMIT);
    assert!(server.status.success(), "{server:?}");
    // Refused clients' files hold no packet: the two with packets are the ends'.
    use backend_sim_proto::capture::{parse::parse, read::packets};
    let roce = |f: &PathBuf| -> Vec<Option<bool>> {
        let bytes = std::fs::read(f).unwrap();
        let caps = packets(&bytes).unwrap();
        caps.iter()
            .filter_map(|c| Some(parse(c.data, c.ip?, c.orig_len).unwrap().icrc_ok))
            .collect()
    };
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|f| !roce(f).is_empty())
        .collect();
    assert_eq!(files.len(), 2, "one capture per process: {files:?}");
    for f in files {
        assert!(
            roce(&f).iter().all(|ok| *ok == Some(true)),
            "whole packets, their ICRCs right"
        );
        let out = run(&mut rdma_sim(&["trace", "--limit", "0", f.to_str().unwrap()]));
        let t = text(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        for op in ["SEND_FIRST", "SEND_MIDDLE", "SEND_LAST"] {
            assert!(t.contains(op), "{op} missing in {}: {t}", f.display());
        }
        assert!(
            t.contains("1 connection(s); 0 packet(s) not RoCE v2, 0 malformed"),
            "{t}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn port_addr_gives_a_running_programs_port_a_new_lid() {
    // tests/c/addr_change.c waits for LID_CHANGE and a new LID, sees a SEND to the old
    // LID fail, then waits for another LID_CHANGE.
    let prog = spawn_with_a_qp("addr_change", &["ib"]);
    let pid = prog.id().to_string();
    let mut lids = Vec::new();
    for _ in 0..2 {
        let out = run(&mut rdma_sim(&["port", "sim0", "addr", "--pid", &pid]));
        assert!(out.status.success(), "{out:?}");
        let line = text(&out.stdout);
        let lid = line
            .split("LID ")
            .nth(1)
            .and_then(|l| l.split(',').next())
            .map(str::to_string);
        lids.push(lid.unwrap_or_else(|| panic!("no LID in {line:?}")));
        // The program's SEND fails within its retries (about two seconds) before the
        // second change.
        std::thread::sleep(Duration::from_millis(3000));
    }
    assert_ne!(lids[0], lids[1]);
    let out = common::wait(prog, LIMIT);
    assert!(
        out.status.success() && text(&out.stdout).contains("\n0 failed"),
        "{out:?}\n{}",
        text(&out.stdout)
    );
}
