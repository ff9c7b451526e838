//! Where things are in the memory regions of one device ([`Layout`]).

/// Where things are in the memory regions of one device.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    /// QPs per device.
    pub(super) n: usize,
    pub(super) depth: usize,
    pub(super) slots: usize,
    pub(super) counters: usize,
    /// Bytes per buffer slot (largest size, rounded up to 8).
    pub(super) max: usize,
}

impl Layout {
    /// Target MR: slot `k` of the peer's QP `j`.
    pub(super) fn target(&self, j: usize, k: usize) -> usize {
        (j * self.slots + k) * self.max
    }
    pub(super) fn target_len(&self) -> usize {
        self.n * self.slots * self.max
    }
    /// Local MR: the buffer of the WR with `seq` of QP `j` (unique among its outstanding WRs).
    pub(super) fn local(&self, j: usize, seq: u64) -> usize {
        (j * self.depth + (seq % self.depth as u64) as usize) * self.max
    }
    pub(super) fn local_len(&self) -> usize {
        self.n * self.depth * self.max
    }
    /// Receive MR: receive slot `r` of QP `j`.
    pub(super) fn recv(&self, j: usize, r: usize) -> usize {
        (j * self.depth + r) * self.max
    }
    /// Atomics MR: the chain word of the peer's QP `j`.
    pub(super) fn chain(&self, j: usize) -> usize {
        j * 8
    }
    /// Atomics MR: shared counter `c`.
    pub(super) fn counter(&self, c: usize) -> usize {
        (self.n + c) * 8
    }
    /// Atomics MR: the shared CAS word.
    pub(super) fn shared(&self) -> usize {
        (self.n + self.counters) * 8
    }
    pub(super) fn atomics_len(&self) -> usize {
        (self.n + self.counters + 1) * 8
    }
}
