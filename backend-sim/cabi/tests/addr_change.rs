//! An address change for C programs (tests/c/addr_change.c): `RDMA_SIM_ADDR_CHANGE=AFTER:FOR`
//! gives an InfiniBand port a new LID after AFTER ms and another FOR ms later, or adds a
//! GID to a RoCE port and removes it again; the program reads the events and the new
//! addresses, and a QP whose address vector names the old LID fails where one through an
//! address that stays goes on. The second the program has to set its QP up leaves room
//! for a loaded machine; the SEND's retries (about two seconds) end before the events'
//! 10 s wait.

mod common;

use std::time::Duration;

#[test]
fn a_ports_address_changes_for_a_c_program() {
    for (profile, arg) in [("portable", "ib"), ("mlx5", "ib"), ("rxe", "roce")] {
        let env = [
            ("RDMA_SIM_PROFILE", profile),
            ("RDMA_SIM_ADDR_CHANGE", "1000:1000"),
        ];
        common::run_c_check("addr_change", &env, &[arg], Duration::from_secs(60));
    }
}
