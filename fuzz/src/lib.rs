//! The harness behind the `responder` fuzz target: a hostile peer on one connection of a
//! simulated HCA, driven sans-IO through the same [`engine::drive`] the TCP transport
//! (`progress.rs`) uses, with the clock passed in by hand.
//!
//! The QP under attack has both halves, as in the real transport: its responder answers
//! the peer's requests (SEND, WRITE, READ, atomics, with fuzzed PSNs, keys, addresses and
//! lengths) and its requester has WQEs of its own outstanding, so the peer's forged ACKs,
//! NAKs, READ and atomic responses reach it too. Five regions live in one buffer, each
//! surrounded by canary bytes:
//!
//! | region | PD | rights | what may change it |
//! |---|---|---|---|
//! | `TARGET` | 1 | all | the peer's WRITEs and atomics (if the QP grants them) |
//! | `READONLY` | 1 | REMOTE_READ only | nothing |
//! | `LOCAL` | 1 | LOCAL_WRITE | receives, our READ/atomic results |
//! | `FOREIGN` | 2 | all | nothing (another PD) |
//! | `DEAD` | 1 | all, deregistered before the input | nothing |
//!
//! After every step the harness asserts:
//!
//! - the canaries around every region are intact;
//! - `READONLY`, `FOREIGN`, `DEAD` and every region deregistered during the input are
//!   unchanged; `TARGET` is unchanged if the QP grants neither REMOTE_WRITE nor
//!   REMOTE_ATOMIC;
//! - once the QP is in ERR (and the payload in flight at that moment, if any, has
//!   landed) no byte of any region changes and nothing more is queued for the peer;
//! - the bytes queued for a peer that never reads stay bounded, however many frames it
//!   sends: at most the unread responses (each at most one READ of a region, and the
//!   engine cuts off a peer that leaves more than 1024 unread) plus a constant;
//! - receive completions are exactly the posted receives, in order, each once; send
//!   completions come in order, each at most once, none after the flush;
//! - whatever the QP sends is a sequence of well-formed frames with their payloads.
//!
//! With `Setup::ud` the QP under attack is a UD QP, and the peer a device at the other end
//! of a link (docs/wire.md "Links"): its bytes go through a link's reader
//! ([`backend_sim_proto::link_rx`]) and each datagram for the QP to its responder, as the
//! sim's link task does; anything that is not a well-formed datagram closes the link (the
//! QP stays up). The same invariants hold; `TARGET` never changes (UD has no remote
//! writes), and whatever the QP sends is well-formed datagrams of at most the MTU. On an
//! RC QP's connection a datagram or a link's setup frame is a protocol error.
//!
//! The parts: the input ([`input`]), the regions and the bounds ([`regions`], [`limits`]),
//! the harness ([`harness`]) with what the peer sends ([`frames`]), what the application
//! posts ([`app`]), the connection ([`link`]) and the invariants ([`checks`]).

pub mod app;
pub mod checks;
pub mod frames;
pub mod harness;
pub mod input;
pub mod limits;
pub mod link;
pub mod regions;
#[cfg(test)]
mod tests;

pub use harness::Harness;
pub use input::*;
pub use limits::*;
pub use regions::{DEAD, FOREIGN, LOCAL, MR_MAX, PD, READONLY, TARGET};

/// The Q_Key of the QP under attack when it is a UD QP.
pub const QKEY: u32 = 0x1111_1111;
