//! # verbs-api
//!
//! One verbs API for Rust with libibverbs' semantics and names: protection domains,
//! memory regions with access flags, completion queues with completion channels, RC queue
//! pairs with their state machine, SEND/RECV (with immediate), RDMA WRITE (with
//! immediate), RDMA READ and the atomics CMP_AND_SWP and FETCH_AND_ADD.
//!
//! The crate is only vocabulary: traits ([`Backend`] and one trait per verbs object) and
//! plain data types. Two backends implement it: `backend-sim`, a simulated HCA over TCP,
//! and `backend-ibverbs`, libibverbs through `rdma-sys`. Code written against these traits
//! runs unchanged on either; choose the backend with one line.
//!
//! A reader who knows `man ibv_post_send` finds every field under its libibverbs name;
//! the enums keep libibverbs' numbering ([`WcStatus`], [`WcOpcode`], [`WrOpcode`],
//! [`QpState`], ...). See the README for a table from libibverbs calls and constants to
//! this API.

#![warn(missing_docs)]

#[cfg(feature = "tokio")]
pub mod aio;
pub mod cm;
pub mod connect;
pub mod device;
pub mod endpoint;
pub mod error;
pub mod flags;
pub mod poll;
pub mod qp;
pub mod timers;
pub mod traits;
pub mod transitions;
pub mod wc;
pub mod wr;

pub use connect::{
    ah_attr_for, connect_rc, local_endpoint, modify_to_init, modify_to_rtr, modify_to_rts, RcParams,
};
pub use device::{AtomicCap, Capabilities, DeviceAttr, DeviceInfo, Gid, LinkLayer, Mtu, PortAttr, PortState};
pub use endpoint::{Endpoint, RemoteMr};
pub use error::{open_file_limit, Error, PostError, QueueKind, Result};
pub use flags::{AccessFlags, QpAttrMask, SendFlags, WcFlags};
pub use poll::{poll_n, poll_quiet};
pub use qp::{AhAttr, GlobalRoute, QpAttr, QpCap, QpInitAttr, QpState, QpType, PSN_MASK};
pub use traits::{
    Backend, ChannelOf, CompletionChannel, CompletionQueue, Context, ContextOf, CqOf, MemoryRegion, MrOf,
    PdOf, ProtectionDomain, QpOf, QueuePair,
};
pub use wc::{WcOpcode, WcStatus, WorkCompletion};
pub use wr::{RecvWr, RemoteAddr, SendWr, Sge, WrOp, WrOpcode};
