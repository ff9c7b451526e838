//! Soak: many RC QPs across two devices, mixed traffic with many work requests
//! outstanding on every QP, and exact accounting of everything that happened.
//!
//! Two contexts are opened (two devices, or the same device twice) and `qps` QPs are
//! created, half on each, connected pairwise across the two: QP `j` of device A talks to
//! QP `j` of device B. Every QP is a requester *and* a responder. Each posts
//! `ops_per_qp` signaled send WRs, keeping up to `depth` outstanding, drawn from a mix
//! of SEND_WITH_IMM, RDMA WRITE, RDMA READ, FETCH_AND_ADD and CMP_AND_SWP. What each WR
//! does is a pure function of `(seed, device, qp, seq)`, so both ends know it without
//! talking, and what it must produce is checked exactly:
//!
//! - **completions**: every send WR has exactly one completion, in posting order, with
//!   its QP number and opcode and `IBV_WC_SUCCESS` (a missing, duplicated or reordered
//!   `wr_id` fails); every receive completes once, with the right `byte_len` and
//!   immediate, and the immediates of a QP (the sender's sequence numbers) strictly
//!   increase and are exactly the sender's SENDs;
//! - **data**: payloads are derived from `(device, qp, seq)`; the receiver checks every
//!   SEND; every READ is checked against what the remote slot must hold at that point of
//!   the QP's request stream (the initial pattern, or the last WRITE posted before it on
//!   the same QP, which the responder executes first); a WRITE goes to a slot whose
//!   previous WRITE has been read back, so every WRITE is verified by a READ through the
//!   fabric or, for the last one per slot, by the final check of the target memory. A
//!   WRITE to a slot with a READ still outstanding carries `IBV_SEND_FENCE`: without it
//!   the responder may execute the WRITE before it has read out the READ's data (IBA's
//!   relaxed ordering of RDMA READ responses; the sim does this too, as it gathers large
//!   READ responses from memory only when it sends them);
//! - **atomics**: every QP of one device adds 1 to shared counters on the other device:
//!   the final value of each counter is its initial value plus the number of adds, and
//!   the old values returned are exactly `initial..final`, each once (a bitmap). Every QP
//!   runs a CMP_AND_SWP chain on a word of its own (each CAS must hit and return the
//!   previous link), and all QPs of a device race CMP_AND_SWP(guess, guess + 1) on one
//!   shared word: the hits must be exactly the values `initial..final`, each once;
//! - **memory**: RSS (`/proc/self/statm`) is sampled after a warm-up and at the end; the
//!   run fails if it grew by more than `max_rss_growth`. Every buffer the soak itself
//!   uses is allocated and touched before the first sample.
//!
//! The code is generic over [`Backend`](verbs_api::Backend), so the same soak runs on the
//! sim (`cargo test`, `soak --backend sim`) and on a real HCA (`soak --backend ibverbs`).
//!
//! Its parts: what to run ([`config`]) and what it reports ([`report`]); the plan of
//! every WR and its payload (`plan`), the memory layout (`layout`), a device (`device`),
//! the bitmaps that prove "each value once" (`bits`); a worker per device (`worker`),
//! which posts (`post`) and checks every completion (`check`); the run itself (`run`),
//! the checks after the traffic (`final_checks`) and the RSS samples (`rss`).

mod bits;
mod check;
pub mod config;
mod device;
mod final_checks;
mod layout;
mod plan;
mod post;
pub mod report;
mod rss;
mod run;
mod worker;

pub use config::{Mix, SoakConfig};
pub use report::{OpCounts, SoakFailure, SoakReport};
pub use rss::rss_bytes;
pub use run::run;
