//! # examples: the RDMA communication model, runnable
//!
//! Binaries (each a `src/bin/*.rs`), all generic over `verbs_api::Backend` and run on
//! the simulated HCA (`--backend sim`, the default) or on libibverbs
//! (`--backend ibverbs`, built with `--features ibverbs`):
//!
//! - `kv-rpc`: a key-value store over SEND/RECV with pre-posted, batch-refilled receives,
//!   and what happens when the receive queue runs dry (RNR NAK retries,
//!   `IBV_WC_RNR_RETRY_EXC_ERR`).
//! - `param-pool`: parameter vectors pulled with RDMA READ while their owner rewrites them;
//!   a seqlock-style version word plus a checksum keeps torn vectors from being used.
//! - `dist-lock`: a CMP_AND_SWP spinlock and a FETCH_AND_ADD ticket lock guarding a shared
//!   counter that proves mutual exclusion.
//! - `async-echo`: an echo service on tokio (`verbs_api::aio`, `cm::AsyncCmListener`).
//! - `ud-echo`: one UD QP serving several clients, told apart by the source QP of their
//!   datagrams; every datagram carries a sequence number and a checksum, and what the
//!   server's empty receive queue dropped is counted.
//! - `perf`: perftest-style latency and bandwidth (`send_lat`, `write_bw`, ...), and
//!   `perf-compare`, its harness against raw TCP on the same machine.
//! - `devinfo`: `ibv_devinfo -v` for any backend.
//!
//! Each of the first three runs as `server` and `client` subcommands (separate processes,
//! possibly on separate hosts) and as `demo`, which starts the server as a child process,
//! runs the clients, checks the example's invariant and exits non-zero if it fails.
//!
//! A binary holds its scenario: the verbs calls, the protocol and the invariant its demo
//! checks. This library holds the rest, in modules of one job each:
//!
//! - what every binary shares: `main` ([`program`]), the common options ([`cli`]),
//!   backend selection ([`backend`], [`with_backend!`]), logging ([`logging`]);
//! - connections: connected QPs ([`conn`]), UC and UD QPs brought up alike
//!   ([`transport`]), the side channel ([`side_channel`]), posting many WRs at once
//!   ([`lists`]), bounded waits ([`wait`]), a thread per connection ([`threads`]);
//! - demos: child processes ([`child`]) and their command lines ([`demo`]);
//! - statistics ([`stats`]) and the names of attribute values ([`ibv_names`]);
//! - each scenario's formats, bookkeeping, reports and options: [`kv`], [`pool`],
//!   [`lock`], [`echo`], [`datagram`], [`perftest`];
//! - perf-compare's references: UCX and libfabric runs ([`peers`]) and raw TCP with the
//!   QP rows' traffic ([`streams`]).

pub mod backend;
pub mod child;
pub mod cli;
pub mod conn;
pub mod datagram;
pub mod demo;
pub mod echo;
pub mod ibv_names;
pub mod kv;
pub mod lists;
pub mod lock;
pub mod logging;
pub mod peers;
pub mod perftest;
pub mod pool;
pub mod program;
pub mod rping;
pub mod side_channel;
pub mod stats;
pub mod streams;
pub mod threads;
pub mod transport;
pub mod wait;

pub use logging::init_tracing;
pub use program::report;

/// The examples' result: [`anyhow`]'s error, with the context each step adds on its way
/// up (`anyhow::Context`), printed whole by [`report`].
pub type Res<T> = anyhow::Result<T>;

#[cfg(feature = "ibverbs")]
pub use backend_ibverbs::IbvBackend;

/// The README's Rust snippets, compiled and run as this crate's doctests
/// (`cargo test -p examples --doc`), so that `cargo test` fails when one stops compiling.
/// Snippets condensed from an example binary are `ignore`d here and kept identical to
/// marked regions of that binary by `tests/readme.rs` instead.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
