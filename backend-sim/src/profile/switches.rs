//! The table of behavioural switches: each switch's name, what it decides, its value
//! under every profile (read from [`Switches`] itself, so the table cannot drift from
//! what the sim does) and the sources of each choice. `devinfo` prints it and
//! docs/profiles.md reproduces it (a test checks that every switch is there).

use verbs_api::WcStatus;

use super::{Profile, RecvError, SlotRelease, Switches};

/// One switch of the table.
pub struct SwitchDoc {
    /// The field of [`Switches`].
    pub name: &'static str,
    /// What it decides.
    pub what: &'static str,
    /// Where each choice comes from.
    pub source: &'static str,
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
            value: |s| yes_no(s.cq_clean_on_reset, "removed", "left in the CQ"),
        },
        SwitchDoc {
            name: "retry_cnt_7_infinite",
            what: "retry_cnt 7",
            source: "IBA 9.7.5.2.8 (only rnr_retry 7 is infinite), mlx5; rxe: rxe_comp.c \
                     COMPST_ERROR_RETRY does not count down a retry_cnt of 7",
            value: |s| yes_no(s.retry_cnt_7_infinite, "retry for ever", "seven retries"),
        },
        SwitchDoc {
            name: "send_bad_lkey",
            what: "requester status of a SEND/WRITE with a bad lkey",
            source: "IBA and mlx5: local protection error; rxe: rxe_req.c maps copy_data()'s \
                     -EINVAL to IB_WC_LOC_QP_OP_ERR",
            value: |s| status(s.send_bad_lkey),
        },
        SwitchDoc {
            name: "recv_too_small",
            what: "a message longer than the receive (RC, UC, UD)",
            source: "IBA 9.7.5.2.3 and mlx5: LOC_LEN_ERR, RC peer REM_INV_REQ_ERR; rxe: \
                     copy_data() -EINVAL, RESPST_ERR_MALFORMED_WQE (rxe_resp.c)",
            value: |s| recv_error(s.recv_too_small, "LocLenErr (RC peer: RemInvReqErr)"),
        },
        SwitchDoc {
            name: "recv_bad_lkey",
            what: "a receive whose SGE has a bad lkey",
            source: "IBA and mlx5: LOC_PROT_ERR, RC peer REM_OP_ERR; rxe: copy_data() \
                     -EINVAL, RESPST_ERR_MALFORMED_WQE (rxe_resp.c)",
            value: |s| recv_error(s.recv_bad_lkey, "LocProtErr (RC peer: RemOpErr)"),
        },
        SwitchDoc {
            name: "qp_access_invalid_request",
            what: "a request the responder QP's qp_access_flags forbid",
            source: "IBA 9.7.5.2.3 and mlx5: remote access error; rxe: rxe_resp.c \
                     check_op_valid() NAKs AETH_NAK_INVALID_REQ",
            value: |s| yes_no(s.qp_access_invalid_request, "RemInvReqErr", "RemAccessErr"),
        },
        SwitchDoc {
            name: "misaligned_atomic_einval",
            what: "an atomic to an address not 8-byte aligned",
            source: "IBA 9.4.5 (the responder refuses it), mlx5 does not check at post; \
                     rxe: rdma-core providers/rxe/rxe.c validate_send_wr()",
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
            value: |s| yes_no(s.last_wqe_reached, "raised", "never"),
        },
        SwitchDoc {
            name: "sqd_rts_resumes",
            what: "WRs posted in SQD after SQD -> RTS",
            source: "IBA 10.3.1, mlx5; rxe: rxe_qp.c rxe_qp_from_attr() does not schedule \
                     the requester",
            value: |s| yes_no(s.sqd_rts_resumes, "start at once", "wait for the next post"),
        },
        SwitchDoc {
            name: "recv_in_err_flushed",
            what: "a receive posted to a QP in ERR",
            source: "IBA 10.8.3.1, mlx5; rxe: providers/rxe/rxe.c post_recv does not enter \
                     the kernel, which flushes only when its responder runs",
            value: |s| yes_no(s.recv_in_err_flushed, "flushed at once", "never completes"),
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

    #[test]
    fn every_switch_is_one_where_rxe_differs_from_portable() {
        for d in table() {
            assert_ne!(d.value(Profile::Rxe), d.value(Profile::Portable), "{}", d.name);
        }
    }
}
