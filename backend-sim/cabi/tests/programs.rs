//! Debian's ibverbs-utils and perftest, unmodified, on the sim: each program with this
//! library preloaded, as server and client on loopback, must exit 0 and report its
//! figures. (ci/real-programs.sh runs them, and more, through the launcher on the release
//! build, with perftest's default iteration counts.)

mod common;

use std::time::Duration;

use common::{run_ok, run_pair};

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn ibv_devices_lists_the_sim() {
    let out = run_ok("ibv_devices", &[], LIMIT);
    assert!(out.contains("sim0"), "{out}");
}

#[test]
fn ibv_devinfo_verbose() {
    let out = run_ok("ibv_devinfo", &["-v"], LIMIT);
    for want in [
        "hca_id:\tsim0",
        "PORT_ACTIVE",
        "link_layer:\t\tInfiniBand",
        "board_id:\t\t\tVERBS-RS-SIM",
        "GID[  0]",
    ] {
        assert!(out.contains(want), "{want:?} in\n{out}");
    }
    let lid = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("port_lid:"))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .expect("port_lid");
    assert!(lid > 0 && lid < 0xc000, "port_lid {lid} is a unicast LID");
}

fn pingpong(extra: &[&str]) {
    let mut args = vec!["-c", "-n", "200"];
    args.extend(extra);
    let (s, c) = run_pair("ibv_rc_pingpong", &args, &args, LIMIT);
    for out in [&s, &c] {
        assert!(out.contains("200 iters in"), "{out}");
        assert!(!out.contains("invalid data"), "{out}");
    }
}

#[test]
fn ibv_rc_pingpong_by_lid() {
    pingpong(&[]);
}

#[test]
fn ibv_rc_pingpong_by_gid() {
    pingpong(&["-g", "0"]);
}

#[test]
fn ibv_rc_pingpong_with_events() {
    pingpong(&["-e"]);
}

#[test]
fn ibv_rc_pingpong_with_the_wr_api() {
    pingpong(&["-N"]);
}

#[test]
fn ibv_rc_pingpong_large_messages() {
    pingpong(&["-s", "1048576", "-m", "4096"]);
}

/// Two processes of one host under the preload connect their QPs over the same-host
/// socket, and over TCP with `RDMA_SIM_TRANSPORT=tcp` (the sim's debug log says which).
#[test]
fn ibv_rc_pingpong_takes_the_same_host_path_unless_told_tcp() {
    for (transport, via) in [("auto", "a same-host unix socket"), ("tcp", "TCP")] {
        let args = ["-c", "-n", "200"];
        let env = [
            ("RDMA_SIM_TRANSPORT", transport),
            ("RUST_LOG", "backend_sim=debug"),
        ];
        let (s, c) = common::run_pair_outputs("ibv_rc_pingpong", &args, &args, &env, LIMIT);
        for out in [&s, &c] {
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            assert!(stdout.contains("200 iters in"), "{stdout}");
            let said = format!("connection set up over {via}");
            assert!(stderr.contains(&said), "{transport}: no {said:?} in\n{stderr}");
        }
    }
}

fn perftest(program: &str, figure: &str) {
    let args = ["-n", "200"];
    let (_, c) = run_pair(program, &args, &args, LIMIT);
    assert!(c.contains(figure), "{program}: {figure:?} in\n{c}");
}

#[test]
fn ib_send_lat() {
    perftest("ib_send_lat", "t_typical");
}

#[test]
fn ib_send_bw() {
    perftest("ib_send_bw", "BW average");
}

#[test]
fn ib_write_lat() {
    perftest("ib_write_lat", "t_typical");
}

#[test]
fn ib_write_bw() {
    perftest("ib_write_bw", "BW average");
}

#[test]
fn ib_read_lat() {
    perftest("ib_read_lat", "t_typical");
}

#[test]
fn ib_read_bw() {
    perftest("ib_read_bw", "BW average");
}

#[test]
fn ib_atomic_lat() {
    perftest("ib_atomic_lat", "t_typical");
}

#[test]
fn ib_atomic_bw() {
    perftest("ib_atomic_bw", "BW average");
}

/// A bad setting fails the device list (NULL, errno EINVAL) with the sim's reason on
/// stderr, and the program reports it as it would a machine without RDMA.
#[test]
fn a_bad_setting_is_named() {
    let out = common::wait(
        common::preloaded("ibv_devices", &[])
            .env("RDMA_SIM_LISTEN", "not-an-address")
            .spawn()
            .unwrap(),
        LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("RDMA_SIM_LISTEN"), "{err}");
    assert!(err.contains("Failed to get IB devices list"), "{err}");
}

/// No devices: an empty list, as on a machine without RDMA hardware.
#[test]
fn no_devices() {
    let out = common::wait(
        common::preloaded("ibv_devinfo", &[])
            .env("RDMA_SIM_DEVICES", "0")
            .spawn()
            .unwrap(),
        LIMIT,
    );
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("No IB devices found"), "{text}");
}
