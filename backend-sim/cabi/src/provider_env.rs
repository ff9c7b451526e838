//! The settings of the provider libibverbs would have loaded for the device, where a
//! program meets them: a device with Mellanox's vendor id (the mlx5 profile) is served
//! by rdma-core's mlx5 provider on a real host, and programs and rdma-core's own tests
//! set that provider's environment variables.
//!
//! - `MLX_CQ_ALLOC_TYPE`, `MLX_QP_ALLOC_TYPE`, `MLX_SRQ_ALLOC_TYPE` (rdma-core's
//!   `providers/mlx5/buf.c`, `mlx5_get_alloc_type()` and `mlx5_alloc_prefered_buf()`):
//!   `HUGE` puts the object's buffer in huge pages and fails its creation when none can be
//!   had (`PREFER_HUGE` falls back to ordinary memory). The sim keeps no such buffer, so
//!   it asks the kernel for what the provider would (a System V segment of huge pages,
//!   `SHM_HUGETLB`), gives it back at once, and fails the creation with ENOMEM where the
//!   provider's allocation would have failed. The other values change nothing the program
//!   can see.

use crate::context::Context;
use crate::ffi::Errno;

/// Mellanox's IEEE OUI, the `vendor_id` of the devices the mlx5 provider serves.
const MELLANOX: u32 = 0x02c9;

/// The huge-page segment the provider asks for first (`MLX5_SHM_LENGTH`, the length it
/// rounds every huge allocation up to).
const SHM_LENGTH: usize = 1 << 21;

/// Whether creating an object of `component` (`"MLX_CQ"`, `"MLX_QP"`, `"MLX_SRQ"`) on
/// `ctx`'s device may go on; ENOMEM where the mlx5 provider's allocation would fail.
pub fn mlx5_alloc(ctx: &Context, component: &str) -> Result<(), Errno> {
    let Ok(value) = std::env::var(format!("{component}_ALLOC_TYPE")) else {
        return Ok(());
    };
    if !value.eq_ignore_ascii_case("HUGE") || !is_mlx5(ctx) {
        return Ok(());
    }
    if huge_pages_available() {
        Ok(())
    } else {
        tracing::debug!(
            "{component}_ALLOC_TYPE=HUGE and no huge pages to be had: the mlx5 provider's \
             allocation fails (ENOMEM)"
        );
        Err(libc::ENOMEM)
    }
}

fn is_mlx5(ctx: &Context) -> bool {
    use verbs_api::Context as _;
    ctx.sim.query_device().is_ok_and(|a| a.vendor_id == MELLANOX)
}

/// Whether the kernel hands out a segment of huge pages, as the provider's
/// `alloc_huge_mem()` asks for one.
fn huge_pages_available() -> bool {
    // SAFETY: shmget has no memory-safety preconditions; the result is checked.
    let id = unsafe {
        libc::shmget(
            libc::IPC_PRIVATE,
            SHM_LENGTH,
            libc::SHM_HUGETLB | libc::SHM_R | libc::SHM_W,
        )
    };
    if id == -1 {
        return false;
    }
    // SAFETY: removes the segment just made, which nothing has attached.
    unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    true
}
