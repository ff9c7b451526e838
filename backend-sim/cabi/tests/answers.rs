//! C programs (tests/c/) run with this library preloaded, for answers that must be
//! libibverbs' (and rxe's or mlx5's, per profile) to the letter, as rdma-core's pyverbs
//! tests check them: a valid `cmd_fd`, a vendor id that is not 0, settings set empty
//! counted as unset, the QP create flag and `ibv_wr_complete` errno of each profile, and
//! the portability advice kept out of a C program's output unless asked for.

mod common;

use std::time::Duration;

use common::run_c_check;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn cmd_fd_is_a_descriptor() {
    run_c_check("cmd_fd", &[], &[], LIMIT);
}

/// The first device's line `key value` of identity.c's output.
fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key).map(str::trim))
        .unwrap_or_else(|| panic!("no {key} in\n{out}"))
}

#[test]
fn the_vendor_id_is_never_zero() {
    for (profile, vendor) in [("portable", "0xffffff"), ("rxe", "0xffffff"), ("mlx5", "0x2c9")] {
        let (out, _) = run_c_check("identity", &[("RDMA_SIM_PROFILE", profile)], &[], LIMIT);
        assert_eq!(line(&out, "vendor_id"), vendor, "{profile}");
    }
}

/// `RDMA_SIM_PROFILE=` and `RDMA_SIM_DEVICES=` (as a script writes `VAR=$UNSET`) are the
/// defaults: the portable profile, two devices.
#[test]
fn settings_set_empty_are_unset() {
    let empty = [
        ("RDMA_SIM_PROFILE", ""),
        ("RDMA_SIM_DEVICES", ""),
        ("RDMA_SIM_PORTABILITY_WARNINGS", ""),
    ];
    let (out, _) = run_c_check("identity", &empty, &[], LIMIT);
    assert_eq!(line(&out, "devices"), "2");
    assert_eq!(line(&out, "vendor_id"), "0xffffff");
}

/// (Not under rxe, whose Ethernet port the program's connection by LID does not reach.)
#[test]
fn qp_answers_follow_the_profile() {
    for profile in ["portable", "mlx5"] {
        run_c_check("profile_qp", &[("RDMA_SIM_PROFILE", profile)], &[], LIMIT);
    }
}

/// Three QPs destroyed with a completion nobody polled: no advice under the C ABI by
/// default, one line (not three) with `RDMA_SIM_PORTABILITY_WARNINGS=warn`.
#[test]
fn the_unpolled_completions_advice_is_quiet_and_said_once() {
    let advice = "completions that were never polled";
    let (_, quiet) = run_c_check("unpolled", &[], &[], LIMIT);
    assert!(!quiet.contains(advice), "{quiet}");
    let (_, asked) = run_c_check(
        "unpolled",
        &[("RDMA_SIM_PORTABILITY_WARNINGS", "warn")],
        &[],
        LIMIT,
    );
    assert_eq!(asked.matches(advice).count(), 1, "{asked}");
}

/// The mlx5 provider's `MLX_<OBJ>_ALLOC_TYPE=HUGE` (rdma-core's pyverbs test
/// `test_mlx5_huge_page` sets it): on the mlx5 profile's device the object is refused with
/// ENOMEM where the kernel has no huge pages to give, made where it has; elsewhere the
/// setting changes nothing.
#[test]
fn the_mlx5_providers_huge_page_setting() {
    for profile in ["mlx5", "portable"] {
        for var in ["MLX_CQ_ALLOC_TYPE", "MLX_QP_ALLOC_TYPE", "MLX_SRQ_ALLOC_TYPE"] {
            run_c_check(
                "provider_env",
                &[("RDMA_SIM_PROFILE", profile), (var, "HUGE")],
                &[],
                LIMIT,
            );
        }
    }
}

/// The address handle made from a received datagram answers its sender, from an IB GRH
/// (portable, GID index 0) and from the IPv4 header a RoCE v2 device puts in the GRH's
/// place (rxe, GID index 1): udaddy's server replies so.
#[test]
fn the_reply_address_of_a_datagram() {
    for (profile, index) in [("portable", "0"), ("rxe", "1"), ("rxe", "0")] {
        run_c_check("ah_from_wc", &[("RDMA_SIM_PROFILE", profile)], &[index], LIMIT);
    }
}

/// The sizes a program is given for its CQs, QPs and SRQs (queue_sizes.c): the lines
/// rxe0 printed in CI's VM (Linux 6.1, rdma-core v44) under the rxe profile, where every
/// queue is a ring of 2^k - 1 entries and `ibv_create_qp` / `ibv_create_srq` hand back
/// the WR counts asked while the queries report the rounded ones; mlx5 rounds its CQs
/// (rdma-core providers/mlx5/verbs.c); portable gives what was asked.
#[test]
fn queue_sizes_follow_the_profile() {
    let sizes = |profile: &str| -> Vec<String> {
        let (out, _) = run_c_check("queue_sizes", &[("RDMA_SIM_PROFILE", profile)], &[], LIMIT);
        out.lines()
            .filter(|l| l.starts_with("cq ") || l.starts_with("qp ") || l.starts_with("srq "))
            .map(str::to_string)
            .collect()
    };
    let rxe0 = [
        "cq 1 cqe 1 resize 3 cqe 3",
        "cq 2 cqe 3 resize 5 cqe 7",
        "cq 4 cqe 7 resize 9 cqe 15",
        "cq 8 cqe 15 resize 17 cqe 31",
        "cq 100 cqe 127 resize 201 cqe 255",
        "qp asked 16/4/1/1/0 created 16/4/1/1/16 queried 31/7/1/1/16",
        "qp asked 1/1/1/1/0 created 1/1/1/1/16 queried 1/1/1/1/16",
        "qp asked 31/32/2/3/64 created 31/32/4/3/64 queried 31/63/4/3/64",
        "qp asked 5/6/5/1/100 created 5/6/6/1/100 queried 7/7/6/1/100",
        "srq 1 created 1 queried 1 modify 3 queried 3",
        "srq 100 created 100 queried 127 modify 201 queried 255",
        "qp srq asked 3/5/1/1/0 created 3/5/1/1/16 queried 3/0/1/0/16",
    ];
    assert_eq!(sizes("rxe"), rxe0);
    let as_asked_qps_and_srqs = [
        "qp asked 16/4/1/1/0 created 16/4/1/1/0 queried 16/4/1/1/0",
        "qp asked 1/1/1/1/0 created 1/1/1/1/0 queried 1/1/1/1/0",
        "qp asked 31/32/2/3/64 created 31/32/2/3/64 queried 31/32/2/3/64",
        "qp asked 5/6/5/1/100 created 5/6/5/1/100 queried 5/6/5/1/100",
        "srq 1 created 1 queried 1 modify 3 queried 3",
        "srq 100 created 100 queried 100 modify 201 queried 201",
        "qp srq asked 3/5/1/1/0 created 3/0/1/0/0 queried 3/0/1/0/0",
    ];
    let portable_cqs = [
        "cq 1 cqe 1 resize 3 cqe 3",
        "cq 2 cqe 2 resize 5 cqe 5",
        "cq 4 cqe 4 resize 9 cqe 9",
        "cq 8 cqe 8 resize 17 cqe 17",
        "cq 100 cqe 100 resize 201 cqe 201",
    ];
    assert_eq!(
        sizes("portable"),
        [&portable_cqs[..], &as_asked_qps_and_srqs[..]].concat()
    );
    assert_eq!(sizes("mlx5"), [&rxe0[..5], &as_asked_qps_and_srqs[..]].concat());
}
