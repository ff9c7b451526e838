//! The table of behavioural switches: each switch's name, what it decides, its value
//! under every profile (read from [`Switches`] itself, so the table cannot drift from
//! what the sim does) and the sources of each choice. `devinfo` prints it and
//! docs/profiles.md reproduces it (a test checks that every switch is there).

use verbs_api::WcStatus;

use backend_sim_proto::queue_sizing::QueueSizing;

use super::{Profile, RecvError, SlotRelease, Switches};

/// One switch of the table.
pub struct SwitchDoc {
    /// The field of [`Switches`].
    pub name: &'static str,
    /// What it decides.
    pub what: &'static str,
    /// Where each choice comes from.
    pub source: &'static str,
    /// The conformance cases that observe it (`conformance/tests/switches.rs` checks that
    /// their observations tell the profiles apart where the switch does).
    pub cases: &'static [&'static str],
    value: fn(&Switches) -> String,
}

impl SwitchDoc {
    /// The switch's value under `p`, as the table shows it.
    pub fn value(&self, p: Profile) -> String {
        (self.value)(&p.switches())
    }
}

fn status(s: WcStatus) -> String {
    format!("{s:?}")
}

fn recv_error(e: RecvError, iba: &str) -> String {
    match e {
        RecvError::Iba => iba.to_string(),
        RecvError::MalformedWqe => "LocQpOpErr (RC peer: RemOpErr), QP to ERR".to_string(),
    }
}

fn yes_no(b: bool, yes: &str, no: &str) -> String {
    if b { yes } else { no }.to_string()
}

/// Every switch, in the order of [`Switches`]' fields.
pub fn table() -> &'static [SwitchDoc] {
    const T: &[SwitchDoc] = &[
        SwitchDoc {
            name: "sq_slot_release",
            what: "when a send queue slot is free for ibv_post_send again",
            source: "rxe: rxe_comp.c do_complete() advances the SQ at completion; mlx5: \
                     rdma-core providers/mlx5/cq.c moves the SQ tail in ibv_poll_cq",
            cases: &["profile.sq-slot-release"],
            value: |s| {
                match s.sq_slot_release {
                    SlotRelease::AtCompletion => "at completion",
                    SlotRelease::AtPoll => "when its CQE (or a later one) is polled",
                }
                .to_string()
            },
        },
        SwitchDoc {
            name: "cq_clean_on_reset",
            what: "a QP's CQEs on RESET and destroy",
            source: "mlx5: rdma-core providers/mlx5/verbs.c mlx5_cq_clean() from \
                     mlx5_modify_qp(RESET), __mlx5_cq_clean() from mlx5_destroy_qp(); rxe: neither rxe_qp.c nor \
                     providers/rxe touch the CQ",
            cases: &["profile.cq-clean-on-reset"],
            value: |s| yes_no(s.cq_clean_on_reset, "removed", "left in the CQ"),
        },
        SwitchDoc {
            name: "retry_cnt_7_infinite",
            what: "retry_cnt 7",
            source: "IBA 9.7.5.2.8 (only rnr_retry 7 is infinite), mlx5; rxe: rxe_comp.c \
                     COMPST_ERROR_RETRY does not count down a retry_cnt of 7",
            cases: &["profile.retry-cnt-7"],
            value: |s| yes_no(s.retry_cnt_7_infinite, "retry for ever", "seven retries"),
        },
        SwitchDoc {
            name: "send_bad_lkey",
            what: "requester status of a SEND/WRITE (RC, UC, UD) whose lkey names no region, or \
                   one of another PD",
            source: "IBA and mlx5: local protection error; rxe: rxe_mr.c lookup_mr() refuses both, \
                     copy_data() -EINVAL, which rxe_req.c completes as IB_WC_LOC_QP_OP_ERR",
            cases: &[
                "errors.bad-lkey",
                "errors.lkey-other-pd",
                "uc.send-error",
                "ud.send-error",
            ],
            value: |s| status(s.send_bad_lkey),
        },
        SwitchDoc {
            name: "recv_too_small",
            what: "a message longer than the receive (RC, UC, UD)",
            source: "IBA 9.7.5.2.3 and mlx5: LOC_LEN_ERR, RC peer REM_INV_REQ_ERR; rxe: \
                     copy_data() -EINVAL, RESPST_ERR_MALFORMED_WQE (rxe_resp.c)",
            cases: &["errors.recv-too-small", "ud.recv-too-small"],
            value: |s| recv_error(s.recv_too_small, "LocLenErr (RC peer: RemInvReqErr)"),
        },
        SwitchDoc {
            name: "recv_bad_lkey",
            what: "a receive whose SGE has a bad lkey",
            source: "IBA and mlx5: LOC_PROT_ERR, RC peer REM_OP_ERR; rxe: copy_data() \
                     -EINVAL, RESPST_ERR_MALFORMED_WQE (rxe_resp.c)",
            cases: &["errors.recv-bad-lkey"],
            value: |s| recv_error(s.recv_bad_lkey, "LocProtErr (RC peer: RemOpErr)"),
        },
        SwitchDoc {
            name: "qp_access_invalid_request",
            what: "a request the responder QP's qp_access_flags forbid",
            source: "IBA 9.7.5.2.3 and mlx5: remote access error; rxe: rxe_resp.c \
                     check_op_valid() NAKs AETH_NAK_INVALID_REQ",
            cases: &["access.write-qp-flags", "access.read-qp-flags"],
            value: |s| yes_no(s.qp_access_invalid_request, "RemInvReqErr", "RemAccessErr"),
        },
        SwitchDoc {
            name: "misaligned_atomic_einval",
            what: "an atomic to an address not 8-byte aligned",
            source: "IBA 9.4.5 (the responder refuses it), mlx5 does not check at post; \
                     rxe: rdma-core providers/rxe/rxe.c validate_send_wr()",
            cases: &["access.atomic-misaligned"],
            value: |s| {
                yes_no(
                    s.misaligned_atomic_einval,
                    "EINVAL at post",
                    "RemInvReqErr completion",
                )
            },
        },
        SwitchDoc {
            name: "opcode_checked_at_post",
            what: "READ/atomic on UC, WRITE/READ/atomic on UD",
            source: "man ibv_post_send (EINVAL); rxe: validate_send_wr() ignores the QP type, \
                     rxe_req.c next_opcode() fails it, rxe_comp.c moves the QP to ERR",
            cases: &["uc.read-refused", "uc.atomic-refused", "ud.opcode-write"],
            value: |s| {
                yes_no(
                    s.opcode_checked_at_post,
                    "EINVAL at post",
                    "LocQpOpErr, QP to ERR",
                )
            },
        },
        SwitchDoc {
            name: "last_wqe_reached",
            what: "IBV_EVENT_QP_LAST_WQE_REACHED when a QP on an SRQ goes to ERR",
            source: "IBA 11.6.3.1, man ibv_get_async_event, mlx5; rxe never raises it",
            cases: &["srq.last-wqe"],
            value: |s| yes_no(s.last_wqe_reached, "raised", "never"),
        },
        SwitchDoc {
            name: "sqd_rts_resumes",
            what: "WRs posted in SQD after SQD -> RTS",
            source: "IBA 10.3.1, mlx5; rxe: rxe_qp.c rxe_qp_from_attr() does not schedule \
                     the requester",
            cases: &["qp.sqd-resume"],
            value: |s| yes_no(s.sqd_rts_resumes, "start at once", "wait for the next post"),
        },
        SwitchDoc {
            name: "recv_in_err_flushed",
            what: "a receive posted to a QP in ERR",
            source: "IBA 10.8.3.1, mlx5; rxe: providers/rxe/rxe.c post_recv does not enter \
                     the kernel, which flushes only when its responder runs",
            cases: &["errors.flush-new-posts"],
            value: |s| yes_no(s.recv_in_err_flushed, "flushed at once", "never completes"),
        },
        SwitchDoc {
            name: "post_send_enomem",
            what: "errno of ibv_post_send for a WR posted before RTS, with too many SGEs or too much inline data",
            source: "man ibv_post_send (EINVAL: invalid value in wr); rxe: providers/rxe/rxe.c \
                     validate_send_wr(), kernel rxe_verbs.c rxe_post_send() before RTS; mlx5: \
                     providers/mlx5/qp.c _mlx5_post_send() (num_sge > sq.qp_state_max_gs, -1 \
                     before RTS) and set_data_inl_seg()",
            cases: &["post.send-before-rts", "post.too-many-sge", "post.inline-too-long"],
            value: |s| yes_no(s.post_send_enomem, "ENOMEM", "EINVAL"),
        },
        SwitchDoc {
            name: "pre_rts_send_kept",
            what: "send WRs refused because the QP is in INIT or RTR",
            source: "IBA 10.8.2, mlx5 (_mlx5_post_send() refuses before writing the WQE); rxe: \
                     providers/rxe/rxe.c rxe_post_send() queues each WR, then the kernel refuses \
                     the doorbell (rxe_verbs.c rxe_post_send(), req.state < QP_STATE_READY)",
            cases: &["post.send-before-rts-kept"],
            value: |s| {
                yes_no(
                    s.pre_rts_send_kept,
                    "queued all the same, sent after RTS at the next post",
                    "not queued",
                )
            },
        },
        SwitchDoc {
            name: "write_imm_bad_rkey",
            what: "the receive an RC WRITE_WITH_IMM consumed when its R_Key is bad",
            source: "IBA 11.6.2 (local access error on a buffer of an RDMA Write with \
                     Immediate), mlx5 maps its local access syndrome to it (providers/mlx5/cq.c); \
                     rxe: rxe_resp.c RESPST_ERR_RKEY_VIOLATION -> do_class_ac_error(qp, \
                     AETH_NAK_REM_ACC_ERR, IB_WC_REM_ACCESS_ERR) -> do_complete()",
            cases: &["access.write-imm-bad-rkey"],
            value: |s| format!("{}, QP to ERR", status(s.write_imm_bad_rkey)),
        },
        SwitchDoc {
            name: "responder_error_events",
            what: "IBV_EVENT_QP_ACCESS_ERR / IBV_EVENT_QP_REQ_ERR on an RC responder that refuses a request",
            source: "IBA 11.6.3.1, man ibv_get_async_event, mlx5 (kernel hw/mlx5/qp.c \
                     mlx5_ib_handle_qp_event()); rxe raises no QP event but SQ_DRAINED (no other \
                     IB_EVENT_QP_* in drivers/infiniband/sw/rxe/)",
            cases: &["events.responder-errors"],
            value: |s| yes_no(s.responder_error_events, "raised", "never"),
        },
        SwitchDoc {
            name: "srq_limit_at_create",
            what: "a non-zero srq_limit given to ibv_create_srq",
            source: "man ibv_create_srq (irrelevant at creation), mlx5 (kernel hw/mlx5/srq.c \
                     mlx5_ib_create_srq() sets no low watermark); rxe: rxe_srq.c \
                     rxe_srq_from_init() sets srq->limit",
            cases: &["srq.limit-at-create"],
            value: |s| yes_no(s.srq_limit_at_create, "armed", "ignored (portable: warns)"),
        },
        SwitchDoc {
            name: "qkey_high_bit_own",
            what: "a UD send WR whose remote_qkey has the high bit set",
            source: "IBA 10.2.5, mlx4/mthca/hfi1/qib in software, a ConnectX in hardware; rxe: \
                     rxe_req.c init_req_packet() sends wr.ud.remote_qkey as it is",
            cases: &["ud.qkey-high-bit"],
            value: |s| {
                yes_no(
                    s.qkey_high_bit_own,
                    "the QP's own Q_Key is sent",
                    "the WR's value is sent",
                )
            },
        },
        SwitchDoc {
            name: "sq_drained_unasked",
            what: "IBV_EVENT_SQ_DRAINED after RTS -> SQD without en_sqd_async_notify",
            source: "IBA 11.6.3.1, man ibv_modify_qp (en_sqd_async_notify), mlx5; rxe: rxe_req.c \
                     req_next_wqe() and rxe_comp.c raise it on every drain, the flag is only stored",
            cases: &["qp.sqd-event-unasked"],
            value: |s| yes_no(s.sq_drained_unasked, "raised", "not raised"),
        },
        SwitchDoc {
            name: "rd_atomic_pow2",
            what: "max_rd_atomic / max_dest_rd_atomic that are not a power of two",
            source: "IBA (the value asked for); rxe: rxe_qp.c rxe_qp_from_attr() \
                     roundup_pow_of_two(); mlx5: kernel hw/mlx5/qp.c log_sra_max/log_rra_max = \
                     fls(n - 1), reported as 1 << them",
            cases: &["qp.rd-atomic-rounding"],
            value: |s| yes_no(s.rd_atomic_pow2, "rounded up to a power of two", "as asked"),
        },
        SwitchDoc {
            name: "rd_atomic_over_limit_served",
            what: "a READ/atomic sent while the requester has more outstanding than the responder's max_dest_rd_atomic",
            source: "IBA 9.7.5.2.3 (an invalid request: the responder lacks the resources), \
                     mlx5; rxe: rxe_resp.c check_resource() serves it and recycles its oldest \
                     responder resource",
            cases: &["errors.rd-atomic-over-limit"],
            value: |s| {
                yes_no(
                    s.rd_atomic_over_limit_served,
                    "served",
                    "RemInvReqErr (an invalid request NAK), QP to ERR",
                )
            },
        },
        SwitchDoc {
            name: "send_error_sqe",
            what: "a UC or UD QP whose send WR completes in error",
            source: "IBA 10.3.1 (SQE: the receive queue works on, SQE -> RTS resumes); mlx5: \
                     kernel hw/mlx5/qp.c reports MLX5_QP_STATE_SQER as IB_QPS_SQE, \
                     MLX5_CMD_OP_SQERR2RTS_QP, IPoIB's ipoib_qp_state_validate_work() moves SQE -> RTS; \
                     rxe: rxe_req.c sets QP_STATE_ERROR, rxe_comp.c rxe_qp_error()",
            cases: &["uc.send-error", "ud.send-error"],
            value: |s| {
                yes_no(
                    s.send_error_sqe,
                    "to SQE (sends flushed, receives go on)",
                    "to ERR (receives flushed)",
                )
            },
        },
        SwitchDoc {
            name: "mw_region_bounds",
            what: "a remote access through a memory window past the window's end, inside its region",
            source: "IBA 10.6.7.2, mlx5: the window's bounds; rxe: rxe_resp.c check_rkey() checks \
                     the window's region's range after rxe_lookup_mw()",
            cases: &["mw.bounds"],
            value: |s| yes_no(s.mw_region_bounds, "served", "RemAccessErr"),
        },
        SwitchDoc {
            name: "mw_owner_checks",
            what: "a SEND_WITH_INV naming a type 2 window bound to another QP (and the PD checks of binds)",
            source: "IBA 10.6.7.3, mlx5: kernel hw/mlx5/mr.c mlx5_ib_alloc_mw() en_rinval; rxe: \
                     rxe_mw.c rxe_check_invalidate_mw() checks the type and state only",
            cases: &["mw.inv-other-qp"],
            value: |s| yes_no(s.mw_owner_checks, "RemInvReqErr, QP to ERR", "invalidated"),
        },
        SwitchDoc {
            name: "inv_flag_kernel_bit",
            what: "the wc_flags bit of the receive of a SEND_WITH_INV",
            source: "IBA, mlx5: IBV_WC_WITH_INV; rxe: rxe_resp.c do_complete() writes the \
                     kernel's IB_WC_WITH_INVALIDATE (1 << 2, libibverbs' IBV_WC_IP_CSUM_OK) into \
                     the user's CQE",
            cases: &["mw.send-with-inv"],
            value: |s| yes_no(s.inv_flag_kernel_bit, "IP_CSUM_OK (1 << 2)", "WITH_INV"),
        },
        SwitchDoc {
            name: "port_down_fails_sends",
            what: "a send through a port that is down",
            source: "IBA (the packets are lost: RC and UC retried per retry_cnt, UD completes), a ConnectX; \
                     rxe: rxe_net.c rxe_prepare() finds no route on a netdev taken down, rxe_req.c completes \
                     the WQE LOC_QP_OP_ERR and the QP goes to ERR (observed on rxe0)",
            cases: &["port.rc-while-down", "port.ud-while-down"],
            value: |s| {
                yes_no(
                    s.port_down_fails_sends,
                    "fails: LOC_QP_OP_ERR, the QP to ERR",
                    "lost: RC and UC retried per retry_cnt, UD completes SUCCESS",
                )
            },
        },
        SwitchDoc {
            name: "queue_sizing",
            what: "the entries of a CQ, send queue, receive queue or SRQ asked for n",
            source: "man ibv_create_cq, man ibv_create_qp (at least what was asked); rxe: \
                     rxe_queue.c rxe_queue_init() gives every queue roundup_pow_of_two(n + 1) - 1, \
                     ibv_create_qp and ibv_create_srq hand back the WR counts asked (observed on \
                     rxe0); mlx5: rdma-core providers/mlx5/verbs.c create_cq() and mlx5_resize_cq() \
                     align_queue_size(cqe + 1) - 1",
            cases: &["profile.queue-sizes"],
            value: |s| {
                match s.queue_sizing {
                    QueueSizing::AsAsked => "as asked",
                    QueueSizing::CqOnly => "CQs 2^k - 1 >= n, the others as asked",
                    QueueSizing::All => "every queue 2^k - 1 >= n (CQ 4 holds 7)",
                }
                .to_string()
            },
        },
    ];
    T
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of `Switches` has a row: the `Debug` output names each field once.
    #[test]
    fn the_table_has_a_row_for_every_switch() {
        let dbg = format!("{:?}", Switches::PORTABLE);
        let fields: Vec<&str> = dbg
            .trim_start_matches("Switches {")
            .trim_end_matches('}')
            .split(", ")
            .map(|f| f.split(':').next().unwrap().trim())
            .collect();
        let names: Vec<&str> = table().iter().map(|d| d.name).collect();
        assert_eq!(names, fields);
    }

    /// The docs' table lists every switch.
    #[test]
    fn docs_profiles_md_lists_every_switch() {
        let doc = include_str!("../../../docs/profiles.md");
        for d in table() {
            assert!(
                doc.contains(&format!("`{}`", d.name)),
                "docs/profiles.md lacks `{}`",
                d.name
            );
        }
    }

    /// A switch is a place where HCAs differ: rxe or mlx5 chooses other than portable.
    #[test]
    fn every_switch_is_one_where_a_profile_differs_from_portable() {
        for d in table() {
            let portable = d.value(Profile::Portable);
            assert!(
                d.value(Profile::Rxe) != portable || d.value(Profile::Mlx5) != portable,
                "{}",
                d.name
            );
        }
    }
}
