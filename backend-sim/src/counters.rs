//! A device's counters of what it dropped without a completion or a NAK to say so:
//! messages an unreliable (UC) QP dropped, and the PSN gaps it met (IBA 9.8.3: a UC
//! responder drops what it cannot execute and tells nobody); UD datagrams that arrived
//! and were dropped, and those its UD QPs never sent (IBA 9.8.4: UD is unreliable). Like
//! an HCA's hardware counters (rxe's `hw_counters`, `rdma statistic`), they are the one
//! place such a loss shows; each drop is also a debug event naming the QP and why. And
//! the local ACK timeouts of its RC requesters (mlx5's `local_ack_timeout_err`), which a
//! completion shows only once the retries are used up.
//!
//! Datagrams dropped for a wrong Q_Key are counted where IBA counts them, in the port's
//! `qkey_viol_cntr` (`ibv_query_port`; PortInfo's 16-bit Q_KeyViolations, which
//! saturates), as rxe's `check_keys()` does.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The live counters, updated by the QPs and the links.
#[derive(Debug, Default)]
pub struct DeviceCounters {
    uc_dropped: AtomicU64,
    uc_psn_gaps: AtomicU64,
    ud_dropped: AtomicU64,
    ud_unsent: AtomicU64,
    local_ack_timeouts: AtomicU64,
    qkey_violations: AtomicU32,
    same_host_connections: AtomicU64,
    shm_ring_connections: AtomicU64,
    tcp_connections: AtomicU64,
}

impl DeviceCounters {
    /// Adds what one QP's responder counted.
    pub fn add_uc(&self, dropped: u64, gaps: u64) {
        if dropped > 0 {
            self.uc_dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        if gaps > 0 {
            self.uc_psn_gaps.fetch_add(gaps, Ordering::Relaxed);
        }
    }

    /// A datagram arrived and was dropped (no such UD QP, not in a state that receives,
    /// no receive posted).
    pub fn ud_dropped(&self) {
        self.ud_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// A UD QP's datagram was never sent (above the MTU, no link to its device, a full
    /// link).
    pub fn ud_unsent(&self) {
        self.ud_unsent.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` local ACK timeouts of a QP's requester (each spent a retry or ended in
    /// `IBV_WC_RETRY_EXC_ERR`).
    pub fn add_ack_timeouts(&self, n: u64) {
        if n > 0 {
            self.local_ack_timeouts.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// A datagram was dropped for its Q_Key (saturating at 0xffff, the width of IBA's
    /// counter).
    pub fn qkey_violation(&self) {
        let _ = self
            .qkey_violations
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                (v < 0xffff).then_some(v + 1)
            });
    }

    /// A QP pair's connection or a UD link was set up, over a unix socket to a device on
    /// the same host or over TCP.
    pub fn link_set_up(&self, same_host: bool) {
        let c = match same_host {
            true => &self.same_host_connections,
            false => &self.tcp_connections,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A same-host QP pair's connection was set up to carry its frames over
    /// shared-memory rings.
    pub fn rings_set_up(&self) {
        self.shm_ring_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// The port's `qkey_viol_cntr`.
    pub fn qkey_violations(&self) -> u32 {
        self.qkey_violations.load(Ordering::Relaxed)
    }

    /// A snapshot.
    pub fn snapshot(&self) -> Counters {
        Counters {
            uc_dropped: self.uc_dropped.load(Ordering::Relaxed),
            uc_psn_gaps: self.uc_psn_gaps.load(Ordering::Relaxed),
            ud_dropped: self.ud_dropped.load(Ordering::Relaxed),
            ud_unsent: self.ud_unsent.load(Ordering::Relaxed),
            local_ack_timeout_err: self.local_ack_timeouts.load(Ordering::Relaxed),
            same_host_connections: self.same_host_connections.load(Ordering::Relaxed),
            shm_ring_connections: self.shm_ring_connections.load(Ordering::Relaxed),
            tcp_connections: self.tcp_connections.load(Ordering::Relaxed),
        }
    }
}

/// What a device's responders dropped silently, and its requesters' local ACK timeouts
/// (a snapshot, from [`SimContext::counters`](crate::SimContext::counters)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counters {
    /// Messages a UC QP dropped: no receive posted, a failed remote access check (rkey,
    /// PD, access flags, bounds), a receive too short (which also completes it with
    /// `IBV_WC_LOC_LEN_ERR`), an operation UC does not have, fault injection's forced
    /// RNR, or a connection that broke in the middle of the payload.
    pub uc_dropped: u64,
    /// Times a UC QP received a message whose PSN was not the one it expected: messages
    /// before it were lost on the way (the one that came is received).
    pub uc_psn_gaps: u64,
    /// UD datagrams that arrived and were dropped: no UD QP of the number they name, the
    /// QP not in RTR, RTS, SQD or SQE, or no receive posted (its own queue or its SRQ).
    /// (Those with a wrong Q_Key are in the port's `qkey_viol_cntr` instead.)
    pub ud_dropped: u64,
    /// UD sends that completed without their datagram leaving: longer than the MTU
    /// (IBA C10-93.1.1), no link to the destination device (it could not be reached or
    /// refused), or the link's queue full (a peer that does not read). Fault injection's
    /// drops are in [`FaultStats`](crate::faults::FaultStats) instead.
    pub ud_unsent: u64,
    /// Times an RC QP's local ACK timer expired with requests outstanding and no answer
    /// (mlx5's `local_ack_timeout_err`): each resent them and spent one of `retry_cnt`,
    /// or ended in `IBV_WC_RETRY_EXC_ERR`. The timer does not count while the peer's
    /// bytes arrive or wait to be read, or while this side is still writing, so a
    /// connection that keeps moving data counts none.
    pub local_ack_timeout_err: u64,
    /// Connections this device set up (either end; a QP pair's, or a link for UD
    /// datagrams) over a unix socket to a device on the same host
    /// ([`same_host`](crate::same_host)).
    pub same_host_connections: u64,
    /// Of those, QP pairs' connections whose frames go over shared-memory rings
    /// ([`shm_ring`](crate::shm_ring)) rather than the unix socket.
    pub shm_ring_connections: u64,
    /// Connections this device set up (either end; a QP pair's, or a UD link) over TCP.
    pub tcp_connections: u64,
}

impl Counters {
    /// Every counter with its name, in the order above (what `rdma-sim status` lists).
    pub fn named(&self) -> [(&'static str, u64); 8] {
        [
            ("uc_dropped", self.uc_dropped),
            ("uc_psn_gaps", self.uc_psn_gaps),
            ("ud_dropped", self.ud_dropped),
            ("ud_unsent", self.ud_unsent),
            ("local_ack_timeout_err", self.local_ack_timeout_err),
            ("same_host_connections", self.same_host_connections),
            ("shm_ring_connections", self.shm_ring_connections),
            ("tcp_connections", self.tcp_connections),
        ]
    }
}
