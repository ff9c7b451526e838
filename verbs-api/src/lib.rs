//! # verbs-api
//!
//! One verbs API for Rust with libibverbs' semantics and names: protection domains,
//! memory regions with access flags, completion queues with completion channels, queue
//! pairs (RC, UC, UD) with their state machine, shared receive queues, address handles,
//! asynchronous events, SEND/RECV (with immediate), RDMA WRITE (with immediate), RDMA
//! READ and the atomics CMP_AND_SWP and FETCH_AND_ADD.
//!
//! The crate is only vocabulary: traits ([`Backend`] and one trait per verbs object) and
//! plain data types. Two backends implement it: `backend-sim`, a simulated HCA over TCP,
//! and `backend-ibverbs`, libibverbs through `rdma-sys`. Code written against these traits
//! runs unchanged on either; choose the backend with one line.
//!
//! A reader who knows `man ibv_post_send` finds every field under its libibverbs name;
//! the enums keep libibverbs' numbering ([`WcStatus`], [`WcOpcode`], [`WrOpcode`],
//! [`QpState`], ...). See docs/api.md for a table from libibverbs calls and constants to
//! this API.
//!
//! ```
//! use verbs_api::transitions::check_modify;
//! use verbs_api::*;
//!
//! // A signaled SEND_WITH_IMM over one SGE: the fields of `struct ibv_send_wr`.
//! let sge = [Sge::new(0x1000, 64, 0x1234)];
//! let wr = SendWr::send_with_imm(7, &sge, 42).signaled();
//! assert_eq!((wr.wr_id, wr.total_len()), (7, 64));
//!
//! // The state machine of `ibv_modify_qp`: RESET -> INIT needs the port, the P_Key index
//! // and the access flags, and the error names what is missing.
//! let attr = QpAttr { qp_state: QpState::Init, ..Default::default() };
//! let mask = QpAttrMask::STATE | QpAttrMask::PORT;
//! match check_modify(QpState::Reset, QpType::Rc, &attr, mask) {
//!     Err(Error::InvalidAttrMask { missing, .. }) => {
//!         assert_eq!(missing, QpAttrMask::PKEY_INDEX | QpAttrMask::ACCESS_FLAGS)
//!     }
//!     other => panic!("{other:?}"),
//! }
//! ```

#![warn(missing_docs)]

pub mod admission;
mod ah;
#[cfg(feature = "tokio")]
pub mod aio;
pub mod cm;
pub mod connect;
pub mod device;
pub mod endpoint;
pub mod error;
pub mod event;
pub mod event_fd;
pub mod event_queue;
pub mod flags;
pub mod mcast;
mod mr;
pub mod mw;
pub mod poll;
pub mod qp;
pub mod rdmacm;
mod sge;
pub mod srq;
pub mod timers;
pub mod traits;
pub mod transitions;
pub mod wc;
mod window;
pub mod wr;

pub use connect::{
    ah_attr_for, connect_rc, local_endpoint, modify_to_init, modify_to_rtr, modify_to_rts, RcParams,
};
pub use device::{
    guid_text, AtomicCap, Capabilities, DeviceAttr, DeviceInfo, Gid, LinkLayer, Mtu, PortAttr, PortState,
};
pub use endpoint::{Endpoint, RemoteMr};
pub use error::{open_file_limit, Error, PostError, QueueKind, Result};
pub use event::{AsyncElement, AsyncEvent, AsyncEventType, ElementKind};
pub use flags::{AccessFlags, QpAttrMask, SendFlags, WcFlags};
pub use mcast::{MULTICAST_LID_BASE, MULTICAST_QPN};
pub use mw::{inc_rkey, BindMw, MwBind, MwBindInfo, MwType};
pub use poll::{poll_n, poll_quiet};
pub use qp::{
    AhAttr, GlobalRoute, QpAttr, QpCap, QpInitAttr, QpState, QpType, PSN_MASK, QP_CREATE_BLOCK_SELF_MCAST_LB,
};
pub use srq::{SrqAttr, SrqAttrMask};
pub use traits::{
    AddressHandle, AhOf, Backend, ChannelOf, CompletionChannel, CompletionQueue, Context, ContextOf, CqOf,
    EventWait, MemoryRegion, MemoryWindow, MrOf, MwOf, PdOf, ProtectionDomain, QpOf, QueuePair,
    SharedReceiveQueue, SrqOf,
};
pub use wc::{WcOpcode, WcStatus, WorkCompletion};
pub use wr::{RecvWr, RemoteAddr, SendWr, Sge, UdDest, WrOp, WrOpcode};
