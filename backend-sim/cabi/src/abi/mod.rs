//! libibverbs' public structures, as `<infiniband/verbs.h>` of rdma-core v44 lays them
//! out on Linux (x86_64 and other LP64 targets), under their C names so that a reader can
//! hold them against the header. `tests/layout.rs` compiles a C file against the
//! installed header and checks every size and field offset declared here.
//!
//! Only what the library reads or writes is typed; unions are Rust unions of plain data
//! (every bit pattern is a valid value of each member), so reading one is sound whatever
//! member the program wrote.

#![allow(non_camel_case_types)]

pub mod attr;
pub mod context;
pub mod device;
pub mod kern;
pub mod objects;
pub mod ucma;
pub mod wr;

pub use attr::*;
pub use context::*;
pub use device::*;
pub use kern::*;
pub use objects::*;
pub use wr::*;

#[cfg(test)]
mod layout_tests;
