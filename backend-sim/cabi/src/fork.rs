//! fork() support (`man ibv_fork_init`, `man ibv_is_fork_initialized`).
//!
//! An HCA writes registered pages by physical address, so libibverbs marks them
//! `MADV_DONTFORK` lest a child's copy-on-write move them. The sim writes registered
//! memory through the parent's own address space, which fork does not change, so there
//! is nothing to prepare: the answers are those of a kernel where fork is safe.

use std::ffi::{c_int, c_void};

/// `IBV_FORK_UNNEEDED`
const IBV_FORK_UNNEEDED: c_int = 2;

/// `ibv_fork_init`: 0.
pub(crate) extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`.
pub(crate) extern "C" fn ibv_is_fork_initialized() -> c_int {
    IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: 0.
pub(crate) extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`: 0.
pub(crate) extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
