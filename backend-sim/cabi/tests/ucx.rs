//! UCX (Debian's ucx-utils, UCX 1.13) on the sim, unmodified: `ucx_info -d` lists the
//! sim's device with the `rc_verbs` and `ud_verbs` transports, and `ucx_perftest` runs
//! between a server and a client on loopback over each, under the default profile
//! (InfiniBand) and the rxe profile (RoCE v2), with nothing made by hand (src/vfs answers
//! for the device node and the sysfs files UCX looks at).
//!
//! Under the rxe profile the runs pick GID 0 (`UCX_IB_GID_INDEX=0`, the port's
//! link-local IPv6 GID), as they must on rxe: UCX 1.13's UD transport, which also carries
//! RC's connection setup, drops every RoCE-over-IPv4 datagram on rxe, because it reads
//! the IP version from `wc.sl`, which mlx5 fills with the RoCE packet type and rxe (and
//! so the sim's rxe profile) leaves 0 (`uct_ud_iface_check_grh()`; later UCX reads it
//! from the GRH instead). Over the IPv6 GID the check holds.

mod common;

use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(180);

fn ucx_info(profile: &str) -> String {
    let out = common::wait(
        common::preloaded("ucx_info", &["-d"])
            .env("RDMA_SIM_PROFILE", profile)
            .spawn()
            .expect("ucx_info (ucx-utils)"),
        LIMIT,
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The transports `ucx_info -d` lists under the sim's memory domain.
fn sim_transports(info: &str) -> Vec<String> {
    info.split("# Memory domain: ")
        .find(|md| md.starts_with("sim0\n"))
        .map(|md| {
            md.lines()
                .filter_map(|l| {
                    l.trim()
                        .strip_prefix("#      Transport: ")
                        .or_else(|| l.trim().strip_prefix("# Transport: "))
                })
                .map(|t| t.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn ucx_info_lists_the_sim_device_under_both_profiles() {
    for profile in ["portable", "rxe"] {
        let info = ucx_info(profile);
        let t = sim_transports(&info);
        assert!(
            t.contains(&"rc_verbs".to_string()) && t.contains(&"ud_verbs".to_string()),
            "{profile}: transports {t:?} in\n{info}"
        );
        assert!(info.contains("Device: sim0:1"), "{profile}:\n{info}");
    }
}

/// As a user without root: the device node and sysfs files are the user's own tree.
#[test]
fn ucx_info_as_a_user_without_root() {
    let out = common::wait(
        common::unprivileged("ucx_info", &["-d"])
            .env("LD_PRELOAD", common::lib())
            .env("RDMA_SIM_DEVICES", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
        LIMIT,
    );
    let info = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{info}", out.status);
    let t = sim_transports(&info);
    assert!(
        t.contains(&"rc_verbs".to_string()) && t.contains(&"ud_verbs".to_string()),
        "{t:?}\n{info}"
    );
}

/// A `ucx_perftest` pair over `tls` (and `self`) under `profile`: a tag-matching
/// ping-pong; the client reports its figures.
fn perftest(profile: &str, tls: &str) {
    let mut env = vec![
        ("RDMA_SIM_PROFILE", profile),
        ("UCX_TLS", tls),
        ("UCX_NET_DEVICES", "sim0:1"),
    ];
    if profile == "rxe" {
        env.push(("UCX_IB_GID_INDEX", "0"));
    }
    let (_, client) =
        common::run_pair_with("ucx_perftest", &[], &["-t", "tag_lat", "-n", "1000"], &env, LIMIT);
    assert!(client.contains("Final:"), "{profile} {tls}:\n{client}");
}

#[test]
fn ucx_perftest_rc_verbs() {
    perftest("portable", "rc_v,self");
}

#[test]
fn ucx_perftest_ud_verbs() {
    perftest("portable", "ud_v,self");
}

#[test]
fn ucx_perftest_rc_verbs_rxe() {
    perftest("rxe", "rc_v,self");
}

#[test]
fn ucx_perftest_ud_verbs_rxe() {
    perftest("rxe", "ud_v,self");
}
