//! The soak on the simulated HCA at the size CI runs: 256 QPs (128 on each of two
//! devices, connected pairwise across them), SEND/RECV, RDMA WRITE, RDMA READ,
//! FETCH_AND_ADD and CMP_AND_SWP with 16 WRs outstanding per QP; every completion,
//! payload byte and atomic result checked, RSS flat after the warm-up.
//!
//! Larger sizes are the `soak` binary's flags, e.g.
//! `cargo run --release -p conformance --bin soak -- --qps 512 --ops 4000`.

use conformance::soak::{self, SoakConfig};

#[test]
fn soak_256_qps_on_the_sim() {
    let backend = backend_sim::SimBackend::default();
    let cfg = SoakConfig::default();
    assert!(cfg.qps >= 256);
    match soak::run(&backend, ("sim0", "sim1"), &cfg) {
        Ok(report) => {
            eprintln!("{report}");
            assert_eq!(report.ops, cfg.qps as u64 * cfg.ops_per_qp);
            let o = &report.by_op;
            assert!(
                o.send > 0 && o.write > 0 && o.read > 0 && o.fetch_add > 0 && o.cmp_swap_chain > 0,
                "every operation ran: {o:?}"
            );
            assert!(o.cmp_swap_shared_hits > 0, "the shared CAS word moved: {o:?}");
            assert_eq!(report.recv_completions, o.send);
        }
        Err(f) => {
            if let Some(r) = &f.report {
                eprintln!("{r}");
            }
            panic!("{f}");
        }
    }
}
