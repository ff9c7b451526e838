//! The launcher, `rdma-sim`: it runs unmodified programs on the sim and passes their exit
//! status through, prints settings a shell can `eval`, finds the library wherever it is
//! installed, `rdma-sim status` lists the devices of running programs, and `rdma-sim
//! port` takes a running program's port down and back.

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

#[test]
fn port_takes_a_running_programs_port_down_and_back() {
    // tests/c/port.c waits for PORT_ERR, posts a SEND, waits for PORT_ACTIVE, and checks
    // that the SEND completed and was received once.
    let exe = common::compile_c("port");
    let prog = rdma_sim(&[exe.to_str().unwrap()]).spawn().expect("port.c");
    let pid = prog.id().to_string();
    let deadline = Instant::now() + LIMIT;
    loop {
        let out = run(&mut rdma_sim(&["status", "--json"]));
        let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let ours = |d: &&serde_json::Value| {
            d["pid"] == prog.id() && d["qps"].as_array().is_some_and(|q| !q.is_empty())
        };
        if all.as_array().unwrap().iter().any(|d| ours(&d)) {
            break;
        }
        assert!(Instant::now() < deadline, "the program never showed: {all:#}");
        std::thread::sleep(Duration::from_millis(20));
    }
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
