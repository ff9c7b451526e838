//! What a send error does to a QP of an unreliable transport (UC, UD), for the `uc` and
//! `ud` groups: IBA 10.3.1 moves it to SQE (Send Queue Error), where the failed WR
//! completes with its error, the send queue's other WRs and those posted later complete
//! with WR_FLUSH_ERR, the receive queue keeps working, and `ibv_modify_qp` to RTS resumes
//! sending (a ConnectX does this; IPoIB recovers its UD QP that way). rxe moves the QP to
//! ERR instead: its receives are flushed and ERR -> RTS is no transition.

use verbs_api::{
    Backend, QpAttr, QpAttrMask as M, QpState, QueuePair, RecvWr, SendWr, WcStatus, WorkCompletion,
};

use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome, Profile};

/// Why rxe's status of a send with a bad lkey differs (any transport).
pub(super) const RXE_BAD_LKEY: &str = "rxe's lookup_mr() finds no region of the QP's PD for the lkey, \
copy_data() returns -EINVAL (rxe_mr.c), and rxe_req.c completes every error of finish_packet() but -EFAULT \
as IB_WC_LOC_QP_OP_ERR";

/// Why rxe's QP goes to ERR rather than SQE.
const RXE_TO_ERR: &str =
    "rxe moves a QP of any transport to ERR on a send error: rxe_req.c's err: path sets \
QP_STATE_ERROR and rxe_comp.c's COMPST_ERROR calls rxe_qp_error(), which flushes the receive queue too; \
ERR -> RTS is no transition (ib_modify_qp_is_ok())";

/// The QP under test and the traffic around it.
pub(super) struct Rig<'a, B: Backend> {
    /// The UC or UD QP whose send fails.
    pub qp: &'a B::Qp,
    /// Its CQ (sends and receives).
    pub cq: &'a B::Cq,
    /// A receive for one message from the peer, posted before the error.
    pub recv: RecvWr<'a>,
    /// A signaled send whose lkey names no region (wr_id 1).
    pub bad: SendWr<'a>,
    /// A good signaled send posted behind it in the same call (wr_id 2).
    pub behind: SendWr<'a>,
    /// A good signaled send posted once the QP is out of RTS (wr_id 3).
    pub later: SendWr<'a>,
    /// A good signaled send posted after the return to RTS (wr_id 4).
    pub after: SendWr<'a>,
    /// Has the peer send one message to the QP (and waits for the peer's completion).
    pub peer_send: &'a dyn Fn() -> Result<(), Failure>,
}

/// Waits until the completions of every WR in `ids` are there, in order of arrival;
/// returns them in the order of `ids` and keeps any other completion in `others`.
fn wait_for<B: Backend>(
    env: &Env<B>,
    cq: &B::Cq,
    ids: &[u64],
    others: &mut Vec<WorkCompletion>,
) -> Result<Vec<WorkCompletion>, Failure> {
    let mut got: Vec<WorkCompletion> = Vec::new();
    while got.len() < ids.len() {
        let wc = env.wait1(cq)?;
        if ids.contains(&wc.wr_id) {
            got.push(wc);
        } else {
            others.push(wc);
        }
    }
    got.sort_by_key(|w| ids.iter().position(|&i| i == w.wr_id));
    Ok(got)
}

/// Runs the send error on `rig`: `what` names the transport in the observations.
pub(super) fn run<B: Backend>(env: &Env<B>, what: &str, rig: Rig<'_, B>) -> CaseResult {
    let Rig {
        qp,
        cq,
        recv,
        bad,
        behind,
        later,
        after,
        peer_send,
    } = rig;
    qp.post_recv(&[recv])?;
    qp.post_send(&[bad, behind])?;
    let mut others = Vec::new();
    let wcs = wait_for(env, cq, &[1, 2], &mut others)?;
    env.expect_status(
        &format!("{what} SEND with a bad lkey"),
        &wcs[0],
        WcStatus::LocProtErr,
        &[(Profile::Rxe, WcStatus::LocQpOpErr, RXE_BAD_LKEY)],
    )?;
    env.observe("the SEND behind it", format_args!("{:?}", wcs[1].status));
    ensure_eq!(
        wcs[1].status,
        WcStatus::WrFlushErr,
        "the SEND behind the failed one"
    );
    let state = qp.state()?;
    env.observe("QP state after the error", format_args!("{state:?}"));
    let sqe = state == QpState::Sqe;
    if env.profile == Profile::Rxe && state == QpState::Err {
        env.deviation(format!("{what}: the QP goes to ERR instead of SQE; {RXE_TO_ERR}"));
    } else {
        ensure_eq!(state, QpState::Sqe, "{what} QP's state after a send error");
    }

    // The receive side: in SQE it takes the peer's message, in ERR its receive was flushed.
    peer_send()?;
    let r = match others.pop() {
        Some(w) => w,
        None => env.wait1(cq)?,
    };
    ensure!(others.is_empty(), "completions nobody asked for: {others:?}");
    ensure_eq!(r.wr_id, 100, "the receive's wr_id");
    env.observe(
        "the receive posted before the error",
        format_args!("{:?}", r.status),
    );
    let want = if sqe {
        WcStatus::Success
    } else {
        WcStatus::WrFlushErr
    };
    ensure_eq!(
        r.status,
        want,
        "the receive posted before the error (QP in {state:?})"
    );

    // A send posted now is flushed, in SQE as in ERR.
    qp.post_send(&[later])?;
    let wc = env.wait1(cq)?;
    ensure_eq!(wc.wr_id, 3, "wr_id of the SEND posted after the error");
    env.observe("a SEND posted after the error", format_args!("{:?}", wc.status));
    ensure_eq!(wc.status, WcStatus::WrFlushErr, "a SEND posted in {state:?}");

    // SQE -> RTS resumes sending; ERR -> RTS is no transition.
    let to_rts = qp.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            ..Default::default()
        },
        M::STATE,
    );
    env.observe(
        "modify to RTS",
        match &to_rts {
            Ok(()) => "accepted".to_string(),
            Err(e) => crate::env::errno_name(e.errno()),
        },
    );
    match to_rts {
        Ok(()) => {
            ensure!(sqe, "{state:?} -> RTS was accepted");
            ensure_eq!(qp.state()?, QpState::Rts, "state after SQE -> RTS");
            qp.post_send(&[after])?;
            let wc = env.wait1(cq)?;
            ensure!(
                wc.wr_id == 4 && wc.status == WcStatus::Success,
                "a SEND after SQE -> RTS: {wc:?}"
            );
        }
        Err(e) => {
            ensure!(!sqe, "SQE -> RTS refused: {e}");
            ensure_eq!(e.errno(), libc::EINVAL, "ERR -> RTS ({e})");
            ensure_eq!(qp.state()?, QpState::Err, "state after the refused move");
        }
    }
    env.expect_empty(cq, "the QP's CQ at the end")?;
    Ok(Outcome::Pass)
}
