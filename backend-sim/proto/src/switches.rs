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

pub use crate::queue_sizing::QueueSizing;

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
    /// The requester's status for a SEND or WRITE (RC, UC or UD) whose local SGE's lkey
    /// names no region, or a region of another PD than the QP's:
    /// `IBV_WC_LOC_PROT_ERR` (IBA, mlx5's local protection error syndrome) or rxe's
    /// `IBV_WC_LOC_QP_OP_ERR` (rxe_mr.c: `lookup_mr()` refuses an unknown key and a PD
    /// mismatch alike, `copy_data()` returns -EINVAL; rxe_req.c: `finish_packet()` passes
    /// it on, and every error but -EFAULT completes as LOC_QP_OP_ERR). An SGE that leaves
    /// its region is `IBV_WC_LOC_PROT_ERR` everywhere (rxe: `mr_check_range()` -EFAULT).
    /// The local side of an RDMA READ or atomic is `IBV_WC_LOC_PROT_ERR` everywhere too
    /// (rxe_comp.c `do_read()`, `do_atomic()`: any `copy_data()` failure).
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
    /// Whether `ibv_post_send` refuses a send WR posted before RTS, with more SGEs than
    /// `max_send_sge` or with more inline data than `max_inline_data` with ENOMEM rather
    /// than EINVAL. rdma-core's mlx5 provider answers ENOMEM to all three
    /// (providers/mlx5/qp.c `_mlx5_post_send()`: `wr->num_sge > qp->sq.qp_state_max_gs`,
    /// where `qp_state_max_gs` is -1 until the QP reaches RTS, and `set_data_inl_seg()`:
    /// `inl > qp->max_inline_data`); rxe answers EINVAL (providers/rxe/rxe.c
    /// `validate_send_wr()`; the kernel's `rxe_post_send()` for a QP before RTS), as
    /// `man ibv_post_send` lists for an invalid WR.
    pub post_send_enomem: bool,
    /// Whether send WRs refused because the QP is in INIT or RTR are queued all the same
    /// and sent once the QP is in RTS (at the next post). rxe's provider writes each WR
    /// into the send queue it shares with the kernel, then rings the doorbell, which the
    /// kernel refuses with EINVAL before RTS (rdma-core providers/rxe/rxe.c
    /// `rxe_post_send()`: `post_one_send()` then `post_send_db()`; kernel rxe_verbs.c
    /// `rxe_post_send()`: `qp->req.state < QP_STATE_READY`), leaving `bad_wr` NULL and the
    /// WQEs in the queue; the next doorbell in RTS runs them. IBA (10.8.2: a send WR
    /// needs RTS) and mlx5 queue nothing (`_mlx5_post_send()` refuses before writing).
    pub pre_rts_send_kept: bool,
    /// The status of the receive that an RC RDMA WRITE_WITH_IMM consumed when the
    /// responder then finds its R_Key bad (the receive is taken before the R_Key check,
    /// as IBA and rxe order them; the QP then goes to ERR and flushes the other
    /// receives). IBA's completion status for "a protection error on a local data buffer
    /// during the processing of an RDMA Write with Immediate Data operation sent from the
    /// remote node" is `IBV_WC_LOC_ACCESS_ERR` (IBA 11.6.2; mlx5 maps its local access
    /// syndrome to it, providers/mlx5/cq.c). rxe completes it with the status it NAKs with,
    /// `IBV_WC_REM_ACCESS_ERR` (rxe_resp.c: `RESPST_ERR_RKEY_VIOLATION` ->
    /// `do_class_ac_error(qp, AETH_NAK_REM_ACC_ERR, IB_WC_REM_ACCESS_ERR)` -> `do_complete()`).
    pub write_imm_bad_rkey: WcStatus,
    /// Whether an RC responder that refuses a request raises the affiliated asynchronous
    /// error on its QP: `IBV_EVENT_QP_ACCESS_ERR` for a remote access error,
    /// `IBV_EVENT_QP_REQ_ERR` for an invalid request (IBA 11.6.3.1, `man
    /// ibv_get_async_event`; mlx5 maps its firmware's WQ access and invalid-request errors
    /// to them, kernel hw/mlx5/qp.c `mlx5_ib_handle_qp_event()`). rxe raises neither: its
    /// only events are SRQ_LIMIT_REACHED, CQ_ERR, SQ_DRAINED and the port events (no
    /// other `IB_EVENT_` in drivers/infiniband/sw/rxe/).
    pub responder_error_events: bool,
    /// Whether a non-zero `srq_limit` given to `ibv_create_srq` arms the limit. `man
    /// ibv_create_srq` calls it irrelevant there and mlx5 ignores it (kernel
    /// hw/mlx5/srq.c `mlx5_ib_create_srq()` never sets the low watermark; only
    /// `ibv_modify_srq` arms it); rxe arms it (rxe_srq.c `rxe_srq_from_init()`:
    /// `srq->limit = init->attr.srq_limit`).
    pub srq_limit_at_create: bool,
    /// Whether a UD send WR whose `remote_qkey` has the high bit set sends the QP's own
    /// Q_Key (IBA 10.2.5; mlx4, mthca, hfi1 and qib do it in software, a ConnectX in
    /// hardware). rxe sends the WR's value as it is (rxe_req.c `init_req_packet()`:
    /// `deth_set_qkey(pkt, ibwr->wr.ud.remote_qkey)`), so the receiver drops it unless its
    /// Q_Key is that very value.
    pub qkey_high_bit_own: bool,
    /// Whether RTS -> SQD raises `IBV_EVENT_SQ_DRAINED` when the send queue has drained
    /// even though `en_sqd_async_notify` was not set. IBA 11.6.3.1 and `man
    /// ibv_modify_qp` raise it only when asked for (mlx5 passes the flag to its firmware);
    /// rxe raises it whatever the flag says (rxe_req.c `req_next_wqe()` and rxe_comp.c
    /// raise it on QP_STATE_DRAIN -> DRAINED; `en_sqd_async_notify` is only stored,
    /// rxe_qp.c `rxe_qp_from_attr()`).
    pub sq_drained_unasked: bool,
    /// Whether a non-zero `max_rd_atomic` or `max_dest_rd_atomic` is rounded up to a power
    /// of two (what the QP then allows, and what `ibv_query_qp` reports). rxe does
    /// (rxe_qp.c `rxe_qp_from_attr()`: `roundup_pow_of_two()`), and so does mlx5 (kernel
    /// hw/mlx5/qp.c stores `log_sra_max`/`log_rra_max` = `fls(n - 1)` and reports `1 <<`
    /// them). IBA grants the value asked for; `portable` grants exactly that, never more.
    pub rd_atomic_pow2: bool,
    /// Whether an RC responder serves an RDMA READ or atomic that arrives while the
    /// requester has more of them outstanding than the responder's non-zero
    /// `max_dest_rd_atomic`. IBA makes it an invalid request (the requester's WQE
    /// completes `IBV_WC_REM_INV_REQ_ERR`; a ConnectX NAKs it when its responder resources
    /// run out); rxe serves it and recycles its oldest resource (rxe_resp.c
    /// `check_resource()`: "it is the requesters job to not send too many read/atomic
    /// ops, we just recycle the responder resource queue").
    pub rd_atomic_over_limit_served: bool,
    /// Whether a UC or UD QP whose send WR completes in error (a bad lkey, a message
    /// longer than `max_msg_sz`) moves to SQE rather than ERR. IBA 10.3.1: on the
    /// unreliable transports a send error takes the QP to the Send Queue Error state,
    /// where the send queue's other WRs, and those posted later, complete with
    /// `IBV_WC_WR_FLUSH_ERR` while the receive queue keeps working; the consumer moves
    /// it back to RTS (SQE -> RTS). mlx5 does (kernel hw/mlx5/qp.c: `to_ib_qp_state()`
    /// reports `MLX5_QP_STATE_SQER` as `IB_QPS_SQE`, SQER -> RTS is
    /// `MLX5_CMD_OP_SQERR2RTS_QP`; IPoIB's `ipoib_qp_state_validate_work()`,
    /// ulp/ipoib/ipoib_ib.c, moves its UD QP from SQE back to RTS after a failed send).
    /// rxe moves any QP to ERR (rxe_req.c: the `err:` path sets `QP_STATE_ERROR`,
    /// rxe_comp.c `COMPST_ERROR` calls `rxe_qp_error()`), flushing its receives too.
    pub send_error_sqe: bool,
    /// Whether a remote access through a memory window is checked against the bounds of
    /// the window's region rather than the window's own. IBA (10.6.7.2, C9-?) and mlx5
    /// check the window's: an access outside it is a remote access error. rxe checks the
    /// region's (rxe_resp.c `check_rkey()`: after `rxe_lookup_mw()` it calls
    /// `mr_check_range(mr, va + qp->resp.offset, resid)` on the window's region), so a
    /// peer reaches the whole region through any window on it.
    pub mw_region_bounds: bool,
    /// Whether binding and invalidating a memory window check whose it is: a bind's
    /// region must be of the window's PD (and a type 1 window's QP too), a local
    /// invalidation's window of the QP's PD, and a peer's SEND_WITH_INV must arrive on the
    /// QP a type 2 window is bound to (IBA 10.6.7; mlx5's windows are created with the
    /// QP check on, kernel hw/mlx5/mr.c `mlx5_ib_alloc_mw()` `en_rinval` and
    /// providers/mlx5/qp.c `MLX5_WQE_UMR_CTRL_FLAG_CHECK_QPN`). rxe checks only the type
    /// 2 bind's QP PD (rxe_mw.c `rxe_check_bind_mw()`; `rxe_check_invalidate_mw()` looks
    /// at the state and the type alone), so any QP of the device may invalidate any
    /// type 2 window.
    pub mw_owner_checks: bool,
    /// Whether the receive of a SEND_WITH_INV carries the kernel's
    /// `IB_WC_WITH_INVALIDATE` bit (1 << 2, which libibverbs reads as
    /// `IBV_WC_IP_CSUM_OK`) instead of `IBV_WC_WITH_INV` (1 << 3), the invalidated rkey
    /// in `invalidated_rkey` all the same. rxe writes the kernel's `enum ib_wc_flags`
    /// into the user's CQE (rxe_resp.c `do_complete()`: `uwc->wc_flags |=
    /// IB_WC_WITH_INVALIDATE`), and the provider copies it as it is (rdma-core
    /// providers/rxe/rxe.c `rxe_poll_cq()`); mlx5's provider sets `IBV_WC_WITH_INV`.
    pub inv_flag_kernel_bit: bool,
    /// Whether a port that is down fails what would be sent through it. An HCA's port
    /// that goes down stops the packets of every transport: RC and UC requests time out
    /// and are retried per `retry_cnt` (nothing is lost if the port returns in time), UD
    /// datagrams are lost and their WRs complete successfully (IBA; a ConnectX). rxe sends
    /// through its netdev's routes, which a netdev taken down no longer has:
    /// `rxe_prepare()` (rxe_net.c) fails with "Host not reachable", `init_req_packet()`
    /// gives no packet, and the WQE completes with `IBV_WC_LOC_QP_OP_ERR` and the QP goes
    /// to ERR (rxe_req.c), for a new WR at once and for one in flight at its resend
    /// (the conformance group `port` on rxe0, with `ip link set <netdev> down`). Not
    /// modelled: rxe's address resolution (`ibv_create_ah`, `ibv_modify_qp` to RTR)
    /// through the same missing route.
    pub port_down_fails_sends: bool,
    /// Which queues are rounded up to a power of two minus one: the CQs (`cqe` at
    /// `ibv_create_cq` and `ibv_resize_cq`), a QP's send and receive queues (the `cap`
    /// of `ibv_query_qp`, which posting is checked against) and SRQs (`ibv_query_srq`'s
    /// `max_wr`). rxe rounds all of them (rxe_queue.c `rxe_queue_init()`), mlx5 its CQs
    /// (rdma-core providers/mlx5/verbs.c `create_cq()`); the verbs promise at least what
    /// was asked, which `portable` gives and no more. See [`QueueSizing`].
    pub queue_sizing: QueueSizing,
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
        post_send_enomem: false,
        pre_rts_send_kept: false,
        write_imm_bad_rkey: WcStatus::LocAccessErr,
        responder_error_events: true,
        srq_limit_at_create: false,
        qkey_high_bit_own: true,
        sq_drained_unasked: false,
        rd_atomic_pow2: false,
        rd_atomic_over_limit_served: false,
        send_error_sqe: true,
        mw_region_bounds: false,
        mw_owner_checks: true,
        inv_flag_kernel_bit: false,
        port_down_fails_sends: false,
        queue_sizing: QueueSizing::AsAsked,
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
        post_send_enomem: false,
        pre_rts_send_kept: true,
        write_imm_bad_rkey: WcStatus::RemAccessErr,
        responder_error_events: false,
        srq_limit_at_create: true,
        qkey_high_bit_own: false,
        sq_drained_unasked: true,
        rd_atomic_pow2: true,
        rd_atomic_over_limit_served: true,
        send_error_sqe: false,
        mw_region_bounds: true,
        mw_owner_checks: false,
        inv_flag_kernel_bit: true,
        port_down_fails_sends: true,
        queue_sizing: QueueSizing::All,
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
        post_send_enomem: true,
        pre_rts_send_kept: false,
        write_imm_bad_rkey: WcStatus::LocAccessErr,
        responder_error_events: true,
        srq_limit_at_create: false,
        qkey_high_bit_own: true,
        sq_drained_unasked: false,
        rd_atomic_pow2: true,
        rd_atomic_over_limit_served: false,
        send_error_sqe: true,
        mw_region_bounds: false,
        mw_owner_checks: true,
        inv_flag_kernel_bit: false,
        port_down_fails_sends: false,
        queue_sizing: QueueSizing::CqOnly,
    };
}

impl Default for Switches {
    fn default() -> Self {
        Switches::PORTABLE
    }
}
