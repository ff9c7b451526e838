//! The harness's bounds: on what the engine may queue for a peer that never reads (as the
//! transport's), and on the size of one input.

/// Same bound as `progress.rs` passes to `drive` (`MAX_UNSENT_READS`).
pub const MAX_UNSENT_READS: usize = 1024;
/// Bytes the QP may queue for the peer beyond its unread READ/atomic responses (ACKs,
/// NAKs): 4096 frames. A peer that never reads must not grow this side's memory beyond
/// a constant, however many requests it sends.
pub const NON_REPLY_SLACK: usize = 64 * 1024;
/// Stop an input after this many bytes have been sent by the peer.
pub const MAX_STREAM: usize = 1 << 20;
/// Most bytes one `Repeat` step sends.
pub const MAX_REPEAT_BYTES: usize = 256 << 10;
/// Most steps of one input.
pub const MAX_STEPS: usize = 256;
