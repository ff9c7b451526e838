//! What fault injection has armed and counted: the data the fault layer of the data path
//! reads (a QP's armed faults, under its lock; the device's counters). The API that arms
//! them is [`faults`](crate::faults), which stands above the device, its progress and its
//! QPs; this module is below them all (a QP holds its [`QpFaults`]), so that the data
//! path and the API that arms it do not import each other.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use backend_sim_proto::faults::ForcedRnr;

/// Where, in the next request a QP sends, its connection breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakPoint {
    /// Before any byte of the request is written.
    BeforeRequest,
    /// After the request header and part of its payload were written.
    MidRequest,
    /// After the whole request was written, before its response arrives.
    AfterRequest,
}

/// Faults armed on one QP (kept under its lock).
#[derive(Clone, Debug, Default)]
pub struct QpFaults {
    /// Break the requester's connection at this point of the next request.
    pub break_at: Option<BreakPoint>,
    /// The responder processes nothing before this instant.
    pub stall_until: Option<Instant>,
    /// Every response waits this long before it is written.
    pub delay: Duration,
    /// Responses are held until this instant (set when a delayed response is queued).
    pub hold_until: Option<Instant>,
    /// Answer RNR to the next SEND / RDMA_WRITE_WITH_IMM requests, whether or not
    /// receives are posted (the responder fires it, one request at a time).
    pub forced_rnr: ForcedRnr,
    /// Lose this many more of the QP's UD datagrams on the way (each WR completes
    /// successfully; nothing arrives).
    pub drop_datagrams: u32,
    /// Every connection of the QP, once its hello is answered, waits this long before
    /// it carries the QP's traffic.
    pub setup_delay: Duration,
}

/// How many faults fired.
#[derive(Debug, Default)]
pub struct FaultCounters {
    /// Connections broken.
    pub breaks: AtomicU64,
    /// Responder stalls started.
    pub stalls: AtomicU64,
    /// Response batches held back.
    pub delayed: AtomicU64,
    /// RNR NAKs forced.
    pub forced_rnr: AtomicU64,
    /// UD datagrams lost on purpose.
    pub datagrams_dropped: AtomicU64,
}
