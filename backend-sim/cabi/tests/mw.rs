//! A C program (tests/c/mw.c) uses memory windows, `ibv_resize_cq` and `ibv_rereg_mr`
//! with this library preloaded, under each profile: type 1 and type 2 windows bound,
//! used, invalidated locally and by a SEND_WITH_INV (whose receive carries
//! `IBV_WC_WITH_INV` and the rkey), through `ibv_post_send` and the `ibv_wr_*` API; a
//! resize that keeps the completions held; `ibv_rereg_mr` served under mlx5 and refused
//! with EOPNOTSUPP under rxe and portable (rxe's provider has no `rereg_mr`); under rxe the
//! invalidated rkey marked as rxe0 marks it (`IBV_WC_IP_CSUM_OK`).

mod common;

use std::time::Duration;

#[test]
fn windows_resize_and_rereg_under_each_profile() {
    for profile in ["portable", "rxe", "mlx5"] {
        let (stdout, _) = common::run_c_check(
            "mw",
            &[("RDMA_SIM_PROFILE", profile)],
            &[profile],
            Duration::from_secs(60),
        );
        assert!(!stdout.contains("FAIL"), "{profile}: {stdout}");
    }
}
