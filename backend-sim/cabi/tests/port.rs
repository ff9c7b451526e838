//! A port fault for C programs (tests/c/port.c): `RDMA_SIM_PORT_DOWN=AFTER:FOR` takes the
//! device's port down after AFTER ms and back FOR ms later; the program sees the events,
//! the port's state, and a SEND posted meanwhile complete (fail, under rxe). The second
//! it has to set its QP up and the 600 ms the port stays down leave room for a loaded
//! machine; the SEND's retries (timeout 16, retry_cnt 7) outlast the 600 ms.

mod common;

use std::time::Duration;

#[test]
fn a_port_goes_down_and_comes_back_for_a_c_program() {
    for (profile, args) in [("portable", &[][..]), ("mlx5", &[]), ("rxe", &["fails"])] {
        let env = [("RDMA_SIM_PROFILE", profile), ("RDMA_SIM_PORT_DOWN", "1000:600")];
        common::run_c_check("port", &env, args, Duration::from_secs(60));
    }
}
