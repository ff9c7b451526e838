//! Multicast through the C ABI (tests/c/mcast.c) under each profile: the device's limits,
//! the kernel's answers to attach and detach, EBUSY for destroying an attached QP, and a
//! group's datagram at the attached QPs of two devices.

mod common;

use std::time::Duration;

#[test]
fn multicast_answers_as_the_kernel_and_reaches_every_member() {
    for profile in ["portable", "rxe", "mlx5"] {
        let env = [("RDMA_SIM_PROFILE", profile), ("RDMA_SIM_DEVICES", "2")];
        common::run_c_check("mcast", &env, &[], Duration::from_secs(60));
    }
}
