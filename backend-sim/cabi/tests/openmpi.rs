//! Open MPI 4.1 (Debian's openmpi-bin) on the sim, unmodified: two ranks of
//! tests/c/mpi_pingpong.c (a checked ping-pong up to 1 MiB and an Allreduce) over the
//! UCX PML (`rc_verbs`, under the default and the rxe profiles) and over the openib BTL
//! (`--mca pml ob1 --mca btl openib,self`), with nothing made by hand.
//!
//! The openib BTL runs under the default profile only: on an Ethernet (RoCE) port it
//! connects only through its `rdmacm` CPC (its `udcm` CPC is InfiniBand-only:
//! `udcm_component_query()`), and librdmacm asks the kernel's RDMA CM, which knows no
//! sim devices ("no cpcs for port").

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(180);

/// `mpirun -np 2` of the program with the library preloaded in the ranks, `mca` and
/// `env` (exported to the ranks); both ranks must report "ok".
fn mpirun(mca: &[&str], env: &[(&str, &str)]) {
    let prog = common::compile("mpicc", "mpi_pingpong", &[]);
    let lib = common::lib();
    let mut args: Vec<String> = vec!["--oversubscribe".into(), "-np".into(), "2".into()];
    if common::is_root() {
        args.push("--allow-run-as-root".into());
    }
    let mut exported = vec![
        format!("LD_PRELOAD={}", lib.display()),
        "RDMA_SIM_DEVICES=1".to_string(),
    ];
    exported.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    // The sim's log level reaches the ranks (`RUST_LOG=backend_sim=debug cargo test`).
    if let Ok(level) = std::env::var("RUST_LOG") {
        exported.push(format!("RUST_LOG={level}"));
    }
    for e in &exported {
        args.extend(["-x".into(), e.clone()]);
    }
    args.extend(mca.iter().map(|s| s.to_string()));
    args.push(prog.exe.display().to_string());
    let child = Command::new("mpirun")
        .args(&args)
        .env_remove("RDMA_SIM_LISTEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun (openmpi-bin)");
    let out = common::wait(child, LIMIT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("rank 0 of 2: ok") && stdout.contains("rank 1 of 2: ok"),
        "mpirun {args:?}: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn ucx_pml_over_rc_verbs() {
    mpirun(
        &["--mca", "pml", "ucx"],
        &[("UCX_TLS", "rc_v,self"), ("UCX_NET_DEVICES", "sim0:1")],
    );
}

/// Under the rxe profile over GID 0: see tests/ucx.rs for why UCX 1.13 needs it on rxe.
#[test]
fn ucx_pml_over_rc_verbs_rxe() {
    mpirun(
        &["--mca", "pml", "ucx"],
        &[
            ("UCX_TLS", "rc_v,self"),
            ("UCX_NET_DEVICES", "sim0:1"),
            ("RDMA_SIM_PROFILE", "rxe"),
            ("UCX_IB_GID_INDEX", "0"),
        ],
    );
}

#[test]
fn openib_btl() {
    mpirun(
        &[
            "--mca",
            "pml",
            "ob1",
            "--mca",
            "btl",
            "openib,self",
            "--mca",
            "btl_openib_allow_ib",
            "true",
        ],
        &[],
    );
}
