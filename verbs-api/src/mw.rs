//! Memory windows (`man ibv_alloc_mw`, `man ibv_bind_mw`, `man ibv_inc_rkey`; IBA 10.6.7):
//! `enum ibv_mw_type`, `struct ibv_mw_bind_info`, `struct ibv_mw_bind` and the
//! `bind_mw` member of `struct ibv_send_wr`.
//!
//! A window grants remote access to part of a memory region under an rkey of its own and
//! with rights of its own. The region must have been registered with
//! [`AccessFlags::MW_BIND`](crate::AccessFlags::MW_BIND) (and `LOCAL_WRITE` for a window
//! that grants remote writes or atomics). A type 1 window is bound with
//! [`QueuePair::bind_mw`](crate::QueuePair::bind_mw) and stays bound until it is bound
//! again (a zero-length bind unbinds it) or deallocated; a type 2 window is bound by an
//! `IBV_WR_BIND_MW` work request ([`SendWr::bind_mw`](crate::SendWr::bind_mw)) and is
//! tied to the QP that posted it: only requests arriving on that QP may use it, and it
//! stays bound until a `IBV_WR_LOCAL_INV` on any QP of its PD or a peer's
//! `IBV_WR_SEND_WITH_INV` invalidates it. The low byte of a window's rkey is a tag the
//! consumer chooses at each bind ([`inc_rkey`]), so an rkey handed out before a rebind
//! stops working.
//!
//! Binds and local invalidations are executed by the send queue in order with the other
//! work requests, and complete as `IBV_WC_BIND_MW` / `IBV_WC_LOCAL_INV` (a failed bind as
//! `IBV_WC_MW_BIND_ERR`, and the QP goes to ERR).

pub use crate::traits::post_type1_bind;
pub use crate::window::{inc_rkey, BindMw, MwBind, MwBindInfo, MwType};
