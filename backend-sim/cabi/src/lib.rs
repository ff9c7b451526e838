//! # backend-sim-cabi: libibverbs' C ABI over the simulated HCA
//!
//! `libibverbs_sim.so` defines every public symbol of libibverbs (rdma-core v44, as
//! Debian bookworm ships it) with its symbol version. Loaded with `LD_PRELOAD`, it takes
//! the place of libibverbs for an unmodified program, whose devices are then the sim's
//! (`sim0`, `sim1`, ... as `RDMA_SIM_DEVICES`, `RDMA_SIM_LISTEN` and
//! `RDMA_SIM_ADVERTISE` configure them), talking over the sim's TCP wire to other such
//! programs and to Rust programs on `backend-sim`:
//!
//! ```sh
//! cargo build --release -p backend-sim-cabi
//! LD_PRELOAD=target/release/libibverbs_sim.so ibv_devinfo -v
//! ```
//!
//! Objects are built in libibverbs' own layouts ([`abi`]): a context is a
//! `verbs_context` whose extended operations the header's inline functions find, CQs and
//! QPs are `ibv_cq_ex` and `ibv_qp_ex`, and the `ops` tables point into this library, so
//! the inline `ibv_post_send`, `ibv_poll_cq` and friends run the sim. Behind each C object
//! is a Rust object that owns the sim's handle (through the verbs-api traits) and is
//! freed by the destroy verb.
//!
//! What the sim cannot serve fails as libibverbs documents for a device without the
//! feature (NULL with errno EOPNOTSUPP, or the error number), and misuse (NULL pointers,
//! objects of the wrong kind or already destroyed, objects still in use) gets the error a
//! real device gives; nothing aborts the program. A program that looks libibverbs'
//! symbols up on a handle of its own (`dlopen("libibverbs.so.1")` then `dlsym`, as NCCL
//! does) bypasses `LD_PRELOAD` and is not served.
//!
//! Programs that also look at a device's files (`/dev/infiniband/uverbsN`, its sysfs
//! directories: UCX, Open MPI) find the sim's devices there: the library answers libc's
//! look-ups of those places from a tree of its own (modules `vfs` and `interpose`) and passes
//! every other path to libc.
//!
//! One module per verb family, each naming the man pages it implements.

#![cfg(target_os = "linux")]

mod abi;
mod abi_1_0;
mod ah;
mod channel;
mod context;
mod cq;
mod device;
mod events;
mod exports;
mod fd;
mod ffi;
mod fork;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod interpose;
mod kern;
mod live;
mod mcast;
mod mr;
mod mw;
mod ops;
mod pd;
mod poll;
mod post;
mod private;
mod provider_env;
mod qp;
mod qp_ex;
mod query;
mod runtime;
mod srq;
mod strings;
mod sysfs;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod ucma;
mod unserved;
mod vfs;
