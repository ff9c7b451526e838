//! # backend-sim-proto: the protocol core of the simulated HCA
//!
//! The firmware of `backend-sim`'s simulated RDMA HCA, as pure state machines with no
//! I/O (in the manner of quinn-proto): the driver hands in bytes it read, the time and
//! the work requests posted; the core hands back frames to send, the completions, and
//! where payload bytes go and come from, so that the driver moves them straight between
//! its sockets and registered memory. This crate does no I/O, reads no clock and draws no
//! entropy of its own (time, randomness and the sockets are the driver's); the one lock
//! it holds, the MR table's (shared with the threads that register memory), may wait in
//! the kernel under contention, as any lock does. Its tests drive two QPs against each
//! other in memory.
//!
//! ## The public surface
//!
//! - [`qp`]: the whole QP, as quinn-proto's `Connection` is a whole connection: its
//!   state machine (`ibv_modify_qp`'s transitions, attribute checks and their effects on
//!   both halves; ERR and SQE and their flushes), its requester and responder (IBA 9.7
//!   for RC, 9.8.3 for UC, 9.8.4 for UD), and the completions and events they owe. The
//!   driver holds [`qp::Qp`]s and calls only these:
//!   - made with `create` ([`qp::QpConfig`]);
//!   - `handle_*` for what happens to it: `handle_modify` (returning a
//!     [`qp::Transition`] whose [`qp::Effect`] says what is left to the driver),
//!     `handle_post_send`, `handle_post_datagram`, `handle_post_bind`,
//!     `handle_post_recv` (then `flush_posted_sends` / `flush_posted_recvs`),
//!     `handle_frames` (a connection's buffered frames), `handle_timeout`,
//!     `handle_datagram`, `handle_connecting`, `handle_connection_up`,
//!     `handle_connection_set_up`, `handle_connection_lost`,
//!     `handle_self_connection_lost`, `handle_connection_failed`, `handle_link_wait`,
//!     `handle_destroy`; and the error rules `enter_error`, `enter_sqe`, `fail_oldest`;
//!   - `poll_*` for what it owes: `poll_transmit` (frames into a connection),
//!     `transmit_unconnected`, `poll_datagram` with `emit_datagram` / `datagram_waits` /
//!     `datagram_lost` / `take_done` (a UD send queue), `poll_timeout` (the next
//!     deadline), `poll_completions` ([`qp::Completions`]), `poll_events` with
//!     `take_uc_counts`, `check_drained`, `handle_protocol_error`, `take_ack_timeouts`, and the ACK owed
//!     (`owes_ack`, `flush_ack`, `end_round`);
//!   - what it reports: `state`, `attr`, `qp_type`, `query`, `sq_psn`, `rq_psn`,
//!     `sq_outstanding`, `rq_posted`, `has_srq`, `has_unsent`, `nothing_in_flight`,
//!     `held_unpolled`, `is_unreliable`, `has_news`, `has_completions`.
//!
//!   With it the types those name: [`qp::QpLimits`] and [`qp::AvCheck`] (what a modify
//!   takes from the device), [`qp::receives_in`], [`qp::PostCheck`], [`qp::UdRoute`],
//!   [`qp::Emitted`], [`qp::DatagramSource`], [`qp::UdOutcome`], [`qp::Fatal`],
//!   [`qp::Stop`], [`qp::SqSlots`], [`qp::LINK_WAIT`], [`qp::LINK_SETUP_GRACE`].
//! - [`connection`]: a connection's bytes ([`connection::Connection`]) and the policy
//!   that composes the QP's halves over them ([`connection::AckPolicy`]: when an owed
//!   ACK leaves, how much one pass builds, how far a peer that does not read may push);
//!   [`rx`] and [`tx`]: its incoming and outgoing bytes, and [`io`] the two traits
//!   through which the driver's sockets fill and drain them.
//! - [`wire`]: the frame format (IBA's BTH/RETH/AtomicETH/AETH at message granularity);
//!   [`cm_msg`]: the connection manager's messages; [`gid`]: GIDs and their addresses.
//! - [`memory`]: registered regions and the one access check every remote request goes
//!   through (rkey, PD, access flags, bounds, alignment); [`window`]: memory windows,
//!   their binds and invalidations, which that check follows for a window's rkey;
//!   [`recv_queue`]: shared receive queues and their limit.
//! - [`link_rx`]: a link's incoming datagrams (UD).
//! - [`switches`]: the behavioural switches of a device profile, where HCAs differ.
//! - [`capture`]: the traffic as RoCE v2 packets in pcapng blocks, for Wireshark.
//! - [`fabric`]: two QPs over a seeded, deterministic, faulty network in memory.
//!
//! ## Inside
//!
//! `requester` and `responder` (the two halves), `engine` (one connection's frames
//! through both halves), `psn` (24-bit PSN arithmetic) and `plant` (bugs planted for the
//! fabric's mutation check) are the crate's own; the `internals` feature makes them
//! public for the fuzz harness, which drives a requester and a responder without a QP
//! (the `planted-bugs` feature makes `plant` public, for conformance's `--plant`).
//! `region` (one registered region and a range of it, below both `window` and
//! `memory`) is private too; its types are public as [`memory::MrShared`] and
//! [`memory::Seg`].
//!
//! ```
//! use std::sync::Arc;
//! use backend_sim_proto::memory::{MrShared, MrTable, RemoteAccessError, Target};
//! use verbs_api::AccessFlags;
//!
//! // A region of PD 1 that peers may read but not write.
//! let table = MrTable::default();
//! let key = table.fresh_key(|| 0x1234_5678);
//! let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
//! let mr = Arc::new(MrShared::new_owned(1, key, 4096, access).unwrap());
//! table.insert(mr.clone());
//! let all = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
//! // QP 7 of PD 1, and of PD 2, accepting reads and writes.
//! let qp = Target { pd: 1, qpn: 7, access: all, region_bounds: false };
//! let other = Target { pd: 2, ..qp };
//! // The one access check every incoming READ, WRITE and atomic goes through.
//! assert!(table.resolve_remote(&qp, key, mr.addr(), 64, AccessFlags::REMOTE_READ).is_ok());
//! let write = table.resolve_remote(&qp, key, mr.addr(), 64, AccessFlags::REMOTE_WRITE);
//! assert_eq!(write.unwrap_err(), RemoteAccessError::MrAccess);
//! let other_pd = table.resolve_remote(&other, key, mr.addr(), 64, AccessFlags::REMOTE_READ);
//! assert_eq!(other_pd.unwrap_err(), RemoteAccessError::WrongPd);
//! ```

#![warn(missing_docs)]

pub mod capture;
pub mod cm_msg;
pub mod connection;
#[cfg(feature = "internals")]
pub mod engine;
#[cfg(not(feature = "internals"))]
mod engine;
pub mod fabric;
pub mod faults;
pub mod gid;
pub mod io;
pub mod link_rx;
pub mod memory;
pub mod opcode_table;
#[cfg(any(feature = "internals", feature = "planted-bugs"))]
pub mod plant;
#[cfg(not(any(feature = "internals", feature = "planted-bugs")))]
mod plant;
#[cfg(feature = "internals")]
pub mod psn;
#[cfg(not(feature = "internals"))]
mod psn;
pub mod qp;
pub mod queue_sizing;
pub mod recv_queue;
mod region;
#[cfg(feature = "internals")]
pub mod requester;
#[cfg(not(feature = "internals"))]
mod requester;
#[cfg(feature = "internals")]
pub mod responder;
#[cfg(not(feature = "internals"))]
mod responder;
pub mod rx;
pub mod switches;
pub mod tx;
pub mod window;
pub mod wire;

#[cfg(any(test, feature = "test-util"))]
pub mod trace_capture;

#[cfg(test)]
mod duplex_tests;
#[cfg(test)]
mod link_tests;
#[cfg(test)]
mod srq_tests;
#[cfg(test)]
mod uc_tests;
#[cfg(test)]
mod ud_tests;

pub use wire::NakReason;

/// For [`impl_memory_region!`]: the verbs-api this crate is built with.
#[doc(hidden)]
pub use verbs_api as __verbs_api;
