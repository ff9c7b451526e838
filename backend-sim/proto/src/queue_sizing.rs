//! How a device sizes the queues it is asked for: completion queues (`ibv_create_cq`,
//! `ibv_resize_cq`), a QP's send and receive queues (`ibv_create_qp`'s `cap`) and shared
//! receive queues (`ibv_create_srq`, `ibv_modify_srq`).
//!
//! The verbs promise at least what was asked (`man ibv_create_cq`: "at least cqe
//! entries"; `man ibv_create_qp`: the values granted "may be greater"); what a device
//! gives beyond that is its own. rxe and mlx5 build their queues as rings of a power of
//! two slots, one of which stays empty, so that a queue asked for `n` holds
//! 2^ceil(log2(n + 1)) - 1: a CQ asked for 4 holds 7, and its fifth completion is not an
//! overflow. The choice is [`QueueSizing`], one field of
//! [`Switches`](crate::switches::Switches); the limits (`max_cqe`, `max_qp_wr`,
//! `max_srq_wr`) are checked against the value asked, before rounding, as both devices
//! check them.

use verbs_api::QpCap;

/// Which queues a device rounds up to a power of two minus one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueSizing {
    /// Every queue holds exactly what was asked: what the verbs promise, and no more.
    AsAsked,
    /// CQs round (mlx5: rdma-core providers/mlx5/verbs.c `create_cq()` allocates
    /// `align_queue_size(cqe + 1)` entries and reports one fewer, `mlx5_resize_cq()`
    /// likewise); its send, receive and shared receive queues hold as asked here (a
    /// ConnectX sizes them by WQE bytes, `mlx5_calc_sq_size()`, which the sim does not
    /// model).
    CqOnly,
    /// Every queue rounds, as rxe's `rxe_queue_init()` (rxe_queue.c) does for each: it
    /// allocates `roundup_pow_of_two(n + 1)` slots and hands back one fewer. A CQ's
    /// `cqe` is the rounded count at create and resize (rxe_cq.c). A QP's send and
    /// receive queues round, as `ibv_query_qp` reports, while the `cap` that
    /// `ibv_create_qp` hands back keeps the WR counts asked for (rxe_qp.c rounds
    /// `qp->sq.max_wr` and `qp->rq.max_wr` only); its send WQE holds
    /// max(`max_send_sge` x 16, `max_inline_data`) bytes, and both are reported as what
    /// that many bytes hold (`rxe_qp_init_req()`). An SRQ rounds as `ibv_query_srq`
    /// reports, while `ibv_create_srq` hands back the `max_wr` asked (rxe_srq.c).
    /// Observed on rxe0 (Linux 6.1): CQ 1 -> 1, 4 -> 7, 8 -> 15; send queue 16 -> 31,
    /// receive queue 32 -> 63; SRQ 100 -> 127; SGE 2 with inline 64 -> SGE 4.
    All,
}

/// The bytes of one scatter/gather element in rxe's send WQE (`struct ib_sge`).
const RXE_SGE_BYTES: u32 = 16;

/// 2^ceil(log2(n + 1)) - 1: the entries a ring of a power of two slots, one kept empty,
/// holds when asked for `n`. 0 stays 0; a count whose ring would not fit in a `u32`
/// is left as it is (the device limits keep real values far below).
pub fn ring_entries(n: u32) -> u32 {
    n.checked_add(1)
        .and_then(u32::checked_next_power_of_two)
        .map_or(n, |slots| slots - 1)
}

impl QueueSizing {
    /// The entries of a CQ asked for `cqe` (its `ibv_cq::cqe`, after create or resize).
    pub fn cq_entries(self, cqe: u32) -> u32 {
        match self {
            QueueSizing::AsAsked => cqe,
            QueueSizing::CqOnly | QueueSizing::All => ring_entries(cqe),
        }
    }

    /// The receives an SRQ asked for `max_wr` holds (what `ibv_query_srq` reports).
    pub fn srq_entries(self, max_wr: u32) -> u32 {
        match self {
            QueueSizing::All => ring_entries(max_wr),
            QueueSizing::AsAsked | QueueSizing::CqOnly => max_wr,
        }
    }

    /// The `max_wr` that `ibv_create_srq` hands back for an SRQ asked for `asked` that
    /// holds `granted`: rxe's kernel does not write its rounding back.
    pub fn srq_created_max_wr(self, asked: u32, granted: u32) -> u32 {
        match self {
            QueueSizing::All => asked,
            QueueSizing::AsAsked | QueueSizing::CqOnly => granted,
        }
    }

    /// The capacities a QP asked for `asked` gets (what `ibv_query_qp` reports, and
    /// what posting is checked against). `asked` has passed the device's limits.
    pub fn qp_cap(self, asked: QpCap) -> QpCap {
        match self {
            QueueSizing::AsAsked | QueueSizing::CqOnly => asked,
            QueueSizing::All => {
                let wqe = asked
                    .max_send_sge
                    .saturating_mul(RXE_SGE_BYTES)
                    .max(asked.max_inline_data);
                QpCap {
                    max_send_wr: ring_entries(asked.max_send_wr),
                    max_recv_wr: ring_entries(asked.max_recv_wr),
                    max_send_sge: wqe / RXE_SGE_BYTES,
                    max_recv_sge: asked.max_recv_sge,
                    max_inline_data: wqe,
                }
            }
        }
    }

    /// The `cap` that `ibv_create_qp` hands back for a QP asked for `asked` that got
    /// `granted`: rxe's kernel writes back the send SGEs and inline size it computed but
    /// not the rounded WR counts, and leaves the receive side of a QP on an SRQ as asked.
    pub fn qp_created_cap(self, asked: QpCap, granted: QpCap) -> QpCap {
        match self {
            QueueSizing::AsAsked | QueueSizing::CqOnly => granted,
            QueueSizing::All => QpCap {
                max_send_wr: asked.max_send_wr,
                max_recv_wr: asked.max_recv_wr,
                max_recv_sge: asked.max_recv_sge,
                ..granted
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_holds_a_power_of_two_minus_one() {
        let seen: Vec<(u32, u32)> = [0, 1, 2, 3, 4, 7, 8, 16, 32767, 1 << 20]
            .iter()
            .map(|&n| (n, ring_entries(n)))
            .collect();
        assert_eq!(
            seen,
            [
                (0, 0),
                (1, 1),
                (2, 3),
                (3, 3),
                (4, 7),
                (7, 7),
                (8, 15),
                (16, 31),
                (32767, 32767),
                (1 << 20, (1 << 21) - 1)
            ]
        );
        assert_eq!(ring_entries(u32::MAX), u32::MAX);
    }

    #[test]
    fn rxe_rounds_every_queue_and_hands_back_the_counts_asked() {
        let asked = QpCap {
            max_send_wr: 16,
            max_recv_wr: 32,
            max_send_sge: 2,
            max_recv_sge: 3,
            max_inline_data: 64,
        };
        let granted = QueueSizing::All.qp_cap(asked);
        assert_eq!(
            granted,
            QpCap {
                max_send_wr: 31,
                max_recv_wr: 63,
                max_send_sge: 4,
                max_recv_sge: 3,
                max_inline_data: 64,
            }
        );
        assert_eq!(
            QueueSizing::All.qp_created_cap(asked, granted),
            QpCap {
                max_send_wr: 16,
                max_recv_wr: 32,
                ..granted
            }
        );
        assert_eq!(QueueSizing::All.cq_entries(4), 7);
        assert_eq!(QueueSizing::All.srq_entries(100), 127);
        assert_eq!(QueueSizing::All.srq_created_max_wr(100, 127), 100);
    }

    #[test]
    fn portable_gives_what_was_asked_and_mlx5_rounds_cqs_only() {
        let asked = QpCap {
            max_send_wr: 16,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        for s in [QueueSizing::AsAsked, QueueSizing::CqOnly] {
            assert_eq!(s.qp_cap(asked), asked);
            assert_eq!(s.qp_created_cap(asked, asked), asked);
            assert_eq!(s.srq_entries(100), 100);
        }
        assert_eq!(QueueSizing::AsAsked.cq_entries(4), 4);
        assert_eq!(QueueSizing::CqOnly.cq_entries(4), 7);
    }
}
