//! The behavioural switches of a device profile: each place where real HCAs (or the
//! InfiniBand Architecture Specification and one HCA) disagree, as one named field with
//! its choices and where each choice comes from.
//!
//! The protocol core reads them (the requester and the responder each hold a copy); the
//! driver's `profile` module picks their values for each profile (`portable`, `rxe`,
//! `mlx5`) and documents them in one table. A switch is never an unexplained `if`: the
//! code that branches on one names it, and the field's documentation here says what each
//! choice does and who does it.
//!
//! Sources are named by file: the kernel's rxe (`drivers/infiniband/sw/rxe/`, Linux 6.1,
//! the kernel of Debian bookworm that CI boots), rdma-core's providers (v44, bookworm's)
//! and the man pages of libibverbs.

use verbs_api::WcStatus;

/// When a send queue slot becomes free again for `ibv_post_send`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotRelease {
    /// When the WR completes in the device: rxe's completer advances the send queue's
    /// consumer index as it completes each WQE, signaled or not (rxe_comp.c
    /// `do_complete()`, `queue_advance_consumer()`), so a loop that never polls
    /// unsignaled WRs can post for ever.
    AtCompletion,
    /// When the application polls a completion of that WR or of a later one: mlx5's
    /// send queue tail moves only in `ibv_poll_cq`, to the WQE a polled CQE names
    /// (rdma-core providers/mlx5/cq.c, `wq->tail = wq->wqe_head[idx] + 1`); unsignaled
    /// WRs keep their slots until a later signaled one's CQE is polled, so a queue of
    /// only unsignaled WRs fills up and `ibv_post_send` fails with ENOMEM.
    AtPoll,
}

/// What the responder reports when it cannot place a message in the receive it took
/// (the receive's buffers are too short, or their lkey is bad).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecvError {
    /// IBA's statuses: a too-short receive completes with `IBV_WC_LOC_LEN_ERR`, a bad
    /// receive lkey with `IBV_WC_LOC_PROT_ERR`; on RC the requester gets
    /// `IBV_WC_REM_INV_REQ_ERR` (too short: an invalid-request NAK, IBA 9.7.5.2.3) or
    /// `IBV_WC_REM_OP_ERR` (bad lkey: a remote operational error NAK) and both QPs go to
    /// ERR; a UC or UD receive fails alone and its QP stays where it is.
    Iba,
    /// rxe's: `copy_data()` (rxe_mr.c) returns -EINVAL for either, `send_data_in()`
    /// turns that into `RESPST_ERR_MALFORMED_WQE`, completed as `IBV_WC_LOC_QP_OP_ERR`
    /// and the QP moves to ERR whatever its transport; an RC requester gets a remote
    /// operational error NAK, `IBV_WC_REM_OP_ERR` (rxe_resp.c).
    MalformedWqe,
}

/// The behavioural switches of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Switches {
    /// When a send queue slot is freed ([`SlotRelease`]).
    pub sq_slot_release: SlotRelease,
    /// Whether moving a QP to RESET or destroying it removes its completions from its
    /// CQs. mlx5 does (rdma-core providers/mlx5/verbs.c: `mlx5_modify_qp()` to RESET
    /// calls `mlx5_cq_clean()`, `mlx5_destroy_qp()` `__mlx5_cq_clean()`); rxe does not (neither the
    /// kernel's rxe_qp.c reset path nor rdma-core providers/rxe touch the CQ), so the
    /// application still polls them, naming a QP that may be gone.
    pub cq_clean_on_reset: bool,
    /// Whether `retry_cnt` 7 means "retry for ever". IBA defines only `rnr_retry` 7 as
    /// infinite (9.7.5.2.8); `retry_cnt` 7 is seven retries on mlx5. rxe's completer
    /// does not count down a `retry_cnt` of 7 (rxe_comp.c, `COMPST_ERROR_RETRY`: `if
    /// (qp->comp.retry_cnt != 7) qp->comp.retry_cnt--`), so a dead peer is retried for ever.
    pub retry_cnt_7_infinite: bool,
    /// The requester's status for a SEND or WRITE whose local SGE has a bad lkey:
    /// `IBV_WC_LOC_PROT_ERR` (IBA, mlx5's local protection error syndrome) or rxe's
    /// `IBV_WC_LOC_QP_OP_ERR` (rxe_req.c: `finish_packet()` fails with -EINVAL from
    /// `copy_data()`, and every error but -EFAULT completes as LOC_QP_OP_ERR).
    pub send_bad_lkey: WcStatus,
    /// A message longer than the receive's buffers ([`RecvError`]).
    pub recv_too_small: RecvError,
    /// A receive whose SGE has a bad lkey ([`RecvError`]).
    pub recv_bad_lkey: RecvError,
    /// Whether a request the responder QP's `qp_access_flags` do not allow is refused
    /// as an invalid request (`IBV_WC_REM_INV_REQ_ERR` at the requester: rxe_resp.c
    /// `check_op_valid()` NAKs with `AETH_NAK_INVALID_REQ`) rather than as a remote
    /// access error (`IBV_WC_REM_ACCESS_ERR`, IBA 9.7.5.2.3 and mlx5).
    pub qp_access_invalid_request: bool,
    /// Whether `ibv_post_send` refuses an atomic whose remote address is not 8-byte
    /// aligned with EINVAL (rdma-core providers/rxe/rxe.c `validate_send_wr()` checks
    /// `remote_addr & 7`) instead of sending it and completing it with
    /// `IBV_WC_REM_INV_REQ_ERR` from the responder's check (IBA 9.4.5; mlx5 does not
    /// check alignment at post).
    pub misaligned_atomic_einval: bool,
    /// Whether `ibv_post_send` refuses an opcode the QP's transport lacks (READ or an
    /// atomic on UC, anything but SEND on UD) with EINVAL. rxe accepts it (rdma-core
    /// providers/rxe/rxe.c `validate_send_wr()` does not look at the QP type) and fails
    /// it when it executes: `IBV_WC_LOC_QP_OP_ERR` and the QP to ERR (rxe_req.c
    /// `next_opcode()`, rxe_comp.c `rxe_qp_error()`).
    pub opcode_checked_at_post: bool,
    /// Whether a QP on an SRQ that goes to ERR raises `IBV_EVENT_QP_LAST_WQE_REACHED`
    /// (IBA 11.6.3.1, `man ibv_get_async_event`; mlx5 does). rxe never raises it (no
    /// `IB_EVENT_QP_LAST_WQE_REACHED` in drivers/infiniband/sw/rxe/).
    pub last_wqe_reached: bool,
    /// Whether SQD -> RTS starts the WRs posted while the QP was in SQD (IBA 10.3.1:
    /// the send queue resumes). rxe's `rxe_qp_from_attr()` moves the QP to RTS without
    /// scheduling its requester, so they wait for the next `ibv_post_send` (rxe_qp.c).
    pub sqd_rts_resumes: bool,
    /// Whether a receive posted to a QP in ERR is flushed at once
    /// (`IBV_WC_WR_FLUSH_ERR`, IBA 10.8.3.1, mlx5). rxe's `post_recv` only writes the
    /// WQE into the queue shared with the kernel (rdma-core providers/rxe/rxe.c), and
    /// the kernel flushes the receive queue only when its responder runs (rxe_resp.c
    /// `check_resource()`), which nothing triggers on a QP in ERR.
    pub recv_in_err_flushed: bool,
}

impl Switches {
    /// IBA's choice for every status switch and the most restrictive choice for every
    /// resource and timing switch: what code that must run on any HCA can rely on.
    pub const PORTABLE: Switches = Switches {
        sq_slot_release: SlotRelease::AtPoll,
        cq_clean_on_reset: true,
        retry_cnt_7_infinite: false,
        send_bad_lkey: WcStatus::LocProtErr,
        recv_too_small: RecvError::Iba,
        recv_bad_lkey: RecvError::Iba,
        qp_access_invalid_request: false,
        misaligned_atomic_einval: false,
        opcode_checked_at_post: true,
        last_wqe_reached: true,
        sqd_rts_resumes: true,
        recv_in_err_flushed: true,
    };

    /// Soft-RoCE as Linux 6.1 and rdma-core v44 implement it.
    pub const RXE: Switches = Switches {
        sq_slot_release: SlotRelease::AtCompletion,
        cq_clean_on_reset: false,
        retry_cnt_7_infinite: true,
        send_bad_lkey: WcStatus::LocQpOpErr,
        recv_too_small: RecvError::MalformedWqe,
        recv_bad_lkey: RecvError::MalformedWqe,
        qp_access_invalid_request: true,
        misaligned_atomic_einval: true,
        opcode_checked_at_post: false,
        last_wqe_reached: false,
        sqd_rts_resumes: false,
        recv_in_err_flushed: false,
    };

    /// A ConnectX (mlx5) as rdma-core's mlx5 provider and the IBA it follows describe it.
    pub const MLX5: Switches = Switches {
        sq_slot_release: SlotRelease::AtPoll,
        cq_clean_on_reset: true,
        retry_cnt_7_infinite: false,
        send_bad_lkey: WcStatus::LocProtErr,
        recv_too_small: RecvError::Iba,
        recv_bad_lkey: RecvError::Iba,
        qp_access_invalid_request: false,
        misaligned_atomic_einval: false,
        opcode_checked_at_post: true,
        last_wqe_reached: true,
        sqd_rts_resumes: true,
        recv_in_err_flushed: true,
    };
}

impl Default for Switches {
    fn default() -> Self {
        Switches::PORTABLE
    }
}
