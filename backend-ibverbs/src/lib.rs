//! # backend-ibverbs
//!
//! The [`verbs_api`] traits over the real libibverbs (rdma-core), through the `rdma-sys`
//! bindings. Every verbs object is a thin RAII wrapper around its `struct ibv_*` pointer;
//! the backend converts types and calls libibverbs, and leaves every semantic decision
//! (state machine, access checks, queue limits) to the provider library and the kernel.
//!
//! ```
//! use verbs_api::{Backend, Context};
//! match backend_ibverbs::IbvBackend.open_first() {
//!     Ok(ctx) => println!("{}: {:?}", ctx.name(), ctx.capabilities()?),
//!     // No RDMA device on this machine: the error says how to get one.
//!     Err(e) => println!("{e}"),
//! }
//! # Ok::<(), verbs_api::Error>(())
//! ```
//!
//! Without an RDMA device the device list is empty and [`verbs_api::Backend::open_first`] fails with
//! [`verbs_api::Error::NoDevice`], saying how to get one (Soft-RoCE: `rdma link add rxe0
//! type rxe netdev eth0`). `ci/rxe-vm.sh` in this repository boots a small VM with
//! Soft-RoCE to run programs against a real libibverbs device.
//!
//! ## Where the backend does more than forward a call
//!
//! Only where soundness or an honest error needs it:
//!
//! - **Ownership.** Each object keeps its parents alive (MR, QP, SRQ and AH: their PD;
//!   PD: the context; QP: its CQs and SRQ; CQ: its channel and the context), so any drop
//!   order destroys objects in the order libibverbs requires.
//! - **Inline sends.** Providers `memcpy` the gather list of an `IBV_SEND_INLINE` WR at
//!   post time without looking at the lkey, so [`IbvQp`]'s `post_send` first checks that
//!   every inline SGE lies inside the region its lkey names (a per-context table of
//!   registered regions); otherwise the post fails with EINVAL.
//! - **UD sends** must carry a destination and only UD sends may: a provider reads
//!   `wr.ud.ah` of every WR of a UD QP as its own structure, so a WR without one, or with
//!   an address handle of another backend or device context, fails with EINVAL before the
//!   provider sees it. A QP on an SRQ refuses `post_recv` with EINVAL the same way.
//! - **Asynchronous events.** A per-context thread reads every event
//!   (`ibv_get_async_event`), acknowledges it to libibverbs at once and queues it for
//!   [`verbs_api::Context::get_async_event`] in a [`verbs_api::event_queue::EventQueue`],
//!   where the application acknowledges it; destroying a QP, CQ or SRQ waits for those
//!   acknowledgements, as `ibv_destroy_*` do. A CQ overflow arrives only this way
//!   (`IBV_EVENT_CQ_ERR`, not through `ibv_poll_cq`): the thread marks the CQ, and from
//!   then on [`verbs_api::CompletionQueue::poll`] returns [`verbs_api::Error::CqOverflow`].
//!   QP fatal events are recorded on the QP too ([`IbvQp::fatal_event`]).
//! - **Completion events** are counted per CQ so that dropping a CQ acknowledges events
//!   that were taken but not acknowledged (`ibv_destroy_cq` would otherwise wait forever).
//! - **Errors.** An `EINVAL` from `ibv_modify_qp` is explained with
//!   [`verbs_api::transitions::check_modify`]; `ENOMEM` from a post becomes
//!   [`verbs_api::Error::QueueFull`].
//!
//! ## The connection manager
//!
//! [`IbvCmChannel`] and [`IbvCmId`] implement [`verbs_api::rdmacm`]'s traits over
//! librdmacm (`rdma_create_event_channel`, `rdma_create_id`, ...): see the module's docs
//! and docs/rdmacm.md.
//!
//! ## Thread safety
//!
//! The wrappers are `Send + Sync` because libibverbs objects are: "By default all verbs
//! objects are safe for multi-threaded access" (`man ibv_alloc_td`); libibverbs and the
//! providers lock internally (mutexes on the control path, spinlocks on QPs and CQs). The
//! wrappers never create a thread domain, so that default holds. The only non-thread-safe
//! act, destroying an object, happens once, in `Drop`, when no other reference exists.

#![warn(missing_docs)]

mod ah;
mod async_events;
mod context;
mod cq;
mod device;
mod errno;
mod mr;
mod mw;
mod pd;
mod post;
mod qp;
mod rdmacm;
mod srq;

pub use ah::IbvAh;
pub use context::IbvContext;
pub use cq::{IbvChannel, IbvCq};
pub use device::IbvBackend;
pub use mr::IbvMr;
pub use mw::IbvMw;
pub use pd::IbvPd;
pub use qp::IbvQp;
pub use rdmacm::{IbvCmChannel, IbvCmId};
pub use srq::IbvSrq;

/// The raw bindings this crate is built on, for callers that need a verb the
/// [`verbs_api`] traits do not offer (see the `as_raw` methods).
pub use rdma_sys;
