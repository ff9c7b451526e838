//! # backend-sim-det: verbs code on a deterministic, seeded, virtual-clock fabric
//!
//! A [`verbs_api::Backend`] whose devices all live in one process and one thread, on a
//! virtual clock, over a network that loses, duplicates, delays and reorders frames as a
//! seed decides. Code written generically over `B: Backend` (the client and server of an
//! application, their sync polling loops) runs on it unchanged, and a run is a function
//! of its seed: the same seed gives the same run, and a failing seed replays exactly.
//!
//! ## Design
//!
//! - **One world.** [`Det`] (the backend) holds a `World`: its devices (named by the
//!   builder, each with one port, LID `n + 1`, GID `fe80::n+1`, its own MR table), every
//!   QP's protocol core (`backend_sim_proto::qp::Qp`, the same state machine, requester
//!   and responder the TCP sim runs), the CQs and completion channels, and the network.
//!   Verbs objects are handles into it; every verb locks it for its whole length.
//! - **One thread.** The world belongs to the thread that built it; a verb called from
//!   another thread is refused (EOPNOTSUPP, "…single-threaded…"): a second thread's
//!   timing is exactly what the seed cannot decide. Client and server run in the same
//!   thread, interleaving their steps (post here, poll there).
//! - **The network is the protocol crate's** (`backend_sim_proto::fabric::net`): a
//!   frame's fate is drawn from the seed keyed by what is decided (its link, opcode,
//!   PSN and attempt), not by the order of draws; a link is one direction of one
//!   connection, `(sending QPN << 32) | receiving QPN`. A frame of several packets may
//!   be cut into its packets at the sending QP's path MTU (`FaultMix::split_ppm`), each
//!   then lost, duplicated or delayed on its own. Each QP is attached through
//!   `fabric::port::Port`, which drives it through its public surface (`handle_frames`,
//!   `poll_transmit`, `handle_timeout`, `handle_connection_lost`) as the two-QP fabric
//!   does. QPNs and MR keys are drawn from the seed too (`Decider::choice`), so a run
//!   never depends on the allocator or on the order objects were made in.
//! - **Time moves when the program waits.** A verb that posts or modifies runs at the
//!   current virtual time and puts the frames it causes on the network. Polling a CQ
//!   that holds nothing advances the world to its next point in time (the next frame's
//!   arrival or the next timer of a requester) and runs what is due then; so a sync
//!   polling loop (`while cq.poll(..)? == 0 {}`) walks the run event by event, with no
//!   thread and no wall-clock wait. `get_cq_event` and `get_async_event` advance it
//!   the same way until their event comes (within their timeout, in virtual time).
//! - **A budget of virtual time.** A world can stay busy for ever on its own: a
//!   requester behind a lost fatal NAK resends to a responder in ERR, which answers
//!   nothing, and rxe's `retry_cnt` 7 (like any `rnr_retry` 7) never gives up. A wait
//!   (a CQ poll that finds nothing, `get_cq_event`, `get_async_event`) runs the world at
//!   most [`DetBuilder::budget`] (default [`DEFAULT_BUDGET`]) past the program's last
//!   step (a post, a modify, a completion or an event taken), then fails with
//!   `Error::Timeout` naming each QP that keeps retrying and why: the same virtual time
//!   and the same error on every run of the seed, where a wall-clock bound would not be.
//! - **Profiles.** The devices behave as one of the sim's profiles where HCAs differ
//!   ([`DetBuilder::profile`]: `Switches::RXE`, the default, `PORTABLE` or `MLX5`),
//!   including what a driver decides: when a send queue slot is free again (at
//!   completion, or when its completion is polled) and whether RESET and destroy remove
//!   the QP's completions from its CQs.
//! - **No hang.** When nothing can happen any more (no frame in flight, no timer armed)
//!   the program waits for something nothing will produce: a blocking wait says so at
//!   once; a polling loop is told after [`IDLE_POLLS`] empty polls in a row of an idle
//!   world (a program may look at an empty CQ a few times by design). Both errors say
//!   what to change (post the peer's work first, interleave the two sides).
//! - **The trace.** Every delivery and every completion is folded into one hash
//!   ([`Det::trace`]): two runs of the same seed compare in one number. It holds while
//!   the program reads no wall clock (a wait bounded by `Instant::now()`, as
//!   `verbs_api::poll_n`'s, ends after as many polls as the machine made meanwhile,
//!   which nothing here can see or refuse; the budget ends a wait for what never comes
//!   before that bound does).
//!
//! - **The schedule.** Every fault the network applies is recorded ([`Det::schedule`]),
//!   keyed as the seed's decisions are (link, opcode, PSN, attempt); a world built with
//!   [`DetBuilder::schedule`] takes each frame's fate from a schedule instead of the
//!   seed (the faults it lists, every other frame clean), so a failing run replays from
//!   its schedule, and from any part of it. [`harness::check_seeds`] runs a test under
//!   many seeds and, on a failure, has [`shrink`] reduce the failing run's schedule while
//!   the test still fails, and prints it with the commands that replay the seed and the
//!   reduced schedule (`DET_SEED`, `DET_SCHEDULE`).
//! - **The name.** The backend is `Det` (`Backend::name` "det"), not `Sim`: the workspace
//!   already names the TCP-backed simulator's types so (`SimBackend`, `SimQp`).
//!
//! ## What it does not do
//!
//! RC QPs, and UC ones (the protocol core's UC; not exercised by this crate's tests), with
//! their own receive queues or a shared one (SRQ, with its limit event).
//! Refused with EOPNOTSUPP, saying so: UD QPs and address handles, memory windows,
//! `rereg_mr`, multicast; file descriptors (`async_fd`, a channel's `fd`) are -1,
//! because waiting on one would wait outside the virtual world: use `get_cq_event` and
//! `get_async_event`, which advance it, or `AsyncCq`, whose wait the channel provides
//! (below). Its queues hold what was asked (rxe's rounding, `Switches::queue_sizing`,
//! is the driver's). No rdma_cm: the [`rendezvous`] is its in-memory counterpart.
//!
//! ## Tokio tasks
//!
//! Async code (`verbs_api::aio::AsyncCq`, the [`rendezvous`]) runs as tokio tasks of a
//! current_thread runtime with paused time in the world's thread. The first async wait
//! attaches the world to the runtime; from then on the world's clock is tokio's: a
//! completion channel's [`event_wait`](verbs_api::CompletionChannel::event_wait) sleeps
//! on a tokio timer at the world's next event (tokio's paused clock jumps to it when
//! every task waits), every verb first runs the world up to tokio's now, and a verb that
//! may make an earlier event wakes the waits. An empty poll then no longer moves the
//! clock. The world is bound to that runtime: a verb or a wait from inside another one
//! is refused, naming both. Refused too, saying what to use: a multi-thread or unpaused
//! runtime, a wait nothing will end ([`IDLE_WAIT`]), a polling loop that never awaits.
//! Programs see
//! completions at tokio's timer granularity (1 ms).
//!
//! ```
//! use std::time::Duration;
//!
//! use backend_sim_det::Det;
//! use verbs_api::{Backend, Context};
//!
//! let det = Det::builder()
//!     .seed(7)
//!     .hosts(["client", "server"])
//!     .loss(5)
//!     .dup(5)
//!     .latency(Duration::from_micros(2))
//!     .jitter(Duration::from_micros(20))
//!     .build();
//! let client = det.open("client").unwrap();
//! assert_eq!(client.query_port(1).unwrap().lid, 1);
//! ```

#![warn(missing_docs)]

// The modules, each using only those before it in this order (nothing calls back up):
// refuse, limits; world; budget, clock, listeners; shared; paused; det; handles; cq;
// qp; objects; backend; rendezvous; run; shrink; harness.
mod backend;
mod budget;
mod clock;
mod cq;
mod det;
mod handles;
pub mod harness;
mod limits;
mod listeners;
mod objects;
mod paused;
mod qp;
mod refuse;
pub mod rendezvous;
mod run;
mod shared;
pub mod shrink;
mod srq;
mod world;

pub use budget::DEFAULT_BUDGET;
pub use cq::{DetChannel, DetCq};
pub use det::{Det, DetBuilder};
pub use handles::{DetContext, DetPd};
pub use objects::DetMr;
pub use paused::IDLE_WAIT;
pub use qp::DetQp;
pub use refuse::{DetAh, DetMw};
pub use rendezvous::{DetConnecting, DetListener};
pub use srq::DetSrq;
pub use world::IDLE_POLLS;

pub use backend_sim_proto::fabric::{Fault, FaultMix, FrameKey, Schedule, What};
