//! Devices opened after fork (tests/c/fork.c) under each profile: two children forked
//! from a process that has the device open each open it and get a device of their own,
//! at an address of their own, and a datagram one sends to a multicast group reaches the
//! other; the parent's device still works after them.

mod common;

use std::time::Duration;

#[test]
fn children_forked_after_an_open_get_devices_of_their_own() {
    for profile in ["portable", "rxe", "mlx5"] {
        let env = [("RDMA_SIM_PROFILE", profile)];
        common::run_c_check("fork", &env, &[], Duration::from_secs(90));
    }
}
