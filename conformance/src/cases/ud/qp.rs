//! A UD QP's attributes and the work requests it refuses (`man ibv_modify_qp` for
//! IBV_QPT_UD, `man ibv_post_send`): the modify masks of each transition, RDMA WRITE on
//! UD, a send without (or with a needless) destination, and a send error's SQE state.

use verbs_api::{
    ah_attr_for, local_endpoint, AccessFlags as A, AddressHandle, Backend, Context, MemoryRegion,
    ProtectionDomain, QpAttr, QpAttrMask as M, QpInitAttr, QpState, QueuePair, RecvWr, SendWr, Sge, WcStatus,
};

use super::{UdSetup, GRH, QKEY, QUIET};
use crate::cases::send_error;
use crate::env::pattern;
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome, Profile};

pub(super) fn ud_modify_masks<B: Backend>(env: &Env<B>) -> CaseResult {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16, None)?;
    let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq, env.opts().cap))?;
    ensure_eq!(qp.state()?, QpState::Reset, "a new UD QP's state");
    let refuse = |what: &str, attr: &QpAttr, mask: M| -> Result<(), Failure> {
        match qp.modify(attr, mask) {
            Ok(()) => Err(Failure(format!("{what} accepted"))),
            Err(e) => {
                ensure_eq!(e.errno(), libc::EINVAL, "{what} ({e})");
                Ok(())
            }
        }
    };
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qkey: 0x123,
        qp_access_flags: A::REMOTE_WRITE,
        ..Default::default()
    };
    refuse(
        "UD RESET -> INIT with RC's mask (ACCESS_FLAGS, no QKEY)",
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )?;
    refuse(
        "UD RESET -> INIT without QKEY",
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT,
    )?;
    ensure_eq!(qp.state()?, QpState::Reset, "state after the refused modifies");
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)?;
    let q = qp.query()?;
    ensure_eq!(
        (q.qp_state, q.qkey),
        (QpState::Init, 0x123),
        "state and Q_Key after INIT"
    );
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        dest_qp_num: 0x42,
        path_mtu: verbs_api::Mtu::Mtu1024,
        ..Default::default()
    };
    refuse("UD INIT -> RTR with DEST_QPN", &rtr, M::STATE | M::DEST_QPN)?;
    refuse("UD INIT -> RTR with PATH_MTU", &rtr, M::STATE | M::PATH_MTU)?;
    qp.modify(&rtr, M::STATE)?;
    ensure_eq!(
        qp.state()?,
        QpState::Rtr,
        "state after INIT -> RTR with the state alone"
    );
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0x45,
        timeout: 14,
        ..Default::default()
    };
    refuse("UD RTR -> RTS without SQ_PSN", &rts, M::STATE)?;
    refuse(
        "UD RTR -> RTS with TIMEOUT",
        &rts,
        M::STATE | M::SQ_PSN | M::TIMEOUT,
    )?;
    qp.modify(&rts, M::STATE | M::SQ_PSN)?;
    let q = qp.query()?;
    ensure_eq!(
        (q.qp_state, q.sq_psn),
        (QpState::Rts, 0x45),
        "state and SQ PSN after RTS"
    );
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..Default::default()
    };
    qp.modify(&reset, M::STATE)?;
    ensure_eq!(qp.state()?, QpState::Reset, "state after RTS -> RESET");
    Ok(Outcome::Pass)
}

/// rxe accepts the post and fails the WR when it executes.
const RXE_WRITE_ON_UD: &str = "RDMA WRITE on UD is accepted by post_send, then completes with LOC_QP_OP_ERR and \
the QP goes to ERR: rdma-core providers/rxe/rxe.c validate_send_wr() does not check the opcode against the QP \
type; the kernel's rxe_req.c next_opcode() accepts only SEND and SEND_WITH_IMM on UD (IB_WC_LOC_QP_OP_ERR) and \
rxe_comp.c moves the QP to ERR (rxe_qp_error())";

pub(super) fn ud_opcode_write<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    let target = u.pd.reg_mr(64, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    u.src.fill(0x11);
    let sge = [u.src.sge(0, 8)?];
    let wr = SendWr::write(1, &sge, target.remote().at(0))
        .signaled()
        .ud(&u.ah, u.r.qp_num(), QKEY);
    let posted = u.s[0].post_send(&[wr]);
    env.observe_post("post", &posted);
    match posted {
        Err(e) => ensure_eq!(e.errno(), libc::EINVAL, "WRITE on UD ({e})"),
        Ok(()) if env.profile == Profile::Rxe => {
            let wc = env.wait1(&u.cq_s)?;
            env.observe("completion", format_args!("{:?}", wc.status));
            ensure_eq!(wc.status, WcStatus::LocQpOpErr, "WRITE on UD: the completion");
            ensure_eq!(
                u.s[0].state()?,
                QpState::Err,
                "WRITE on UD: the QP's state after it"
            );
            env.deviation(RXE_WRITE_ON_UD);
        }
        Ok(()) => {
            let got = env.quiet(&u.cq_s, QUIET)?;
            return Err(Failure(format!(
                "WRITE on UD was accepted by post_send (completions: {got:?})"
            )));
        }
    }
    ensure!(
        target.to_vec().iter().all(|&b| b == 0),
        "WRITE on UD changed memory"
    );
    env.expect_empty(&u.cq_r, "the receiver's CQ")?;
    Ok(Outcome::Pass)
}

/// The QP under test is `r`; it sends to `s[0]` (which posts no receive: what reached it
/// would be dropped), and `s[0]` sends it the datagram its receive waits for.
pub(super) fn ud_send_error<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    let params = env.params();
    let ep_s = local_endpoint(&env.ctx, &u.s[0], &params, 0)?;
    let ah_s = u.pd.create_ah(&ah_attr_for(&ep_s, &params))?;
    let qpn_s = u.s[0].qp_num();
    fn to<'a>(wr: SendWr<'a>, ah: &'a dyn AddressHandle, qpn: u32) -> SendWr<'a> {
        wr.signaled().ud(ah, qpn, QKEY)
    }
    u.src.write(0, &pattern(64, 9))?;
    let good = [u.src.sge(0, 64)?];
    let bad = [Sge::new(u.src.addr(), 16, u.src.lkey() ^ 0x0f0f_0000)];
    let into = [u.dst.sge(0, GRH + 64)?];
    let peer_send = || u.send(env, 0, 50, 0, 64, QKEY);
    send_error::run(
        env,
        "UD",
        send_error::Rig {
            qp: &u.r,
            cq: &u.cq_r,
            recv: RecvWr::new(100, &into),
            bad: to(SendWr::send(1, &bad), &ah_s, qpn_s),
            behind: to(SendWr::send(2, &good), &ah_s, qpn_s),
            later: to(SendWr::send(3, &good), &ah_s, qpn_s),
            after: to(SendWr::send(4, &good), &ah_s, qpn_s),
            peer_send: &peer_send,
        },
    )
}

pub(super) fn ud_destination<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    let sge = [u.src.sge(0, 8)?];
    match u.s[0].post_send(&[SendWr::send(1, &sge).signaled()]) {
        Ok(()) => return Err(Failure("a UD send without a destination was posted".into())),
        Err(e) => {
            ensure_eq!(e.errno(), libc::EINVAL, "UD send without wr.ud ({e})");
            ensure_eq!(e.index, 0, "index");
        }
    }
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    let sge = [mr.sge(0, 8)?];
    match p
        .a
        .post_send(&[SendWr::send(2, &sge).signaled().ud(&u.ah, u.r.qp_num(), QKEY)])
    {
        Ok(()) => return Err(Failure("an RC send with a UD destination was posted".into())),
        Err(e) => ensure_eq!(e.errno(), libc::EINVAL, "RC send with wr.ud ({e})"),
    }
    env.expect_empty(&u.cq_s, "the UD sender's CQ")?;
    env.expect_empty(&p.cq_a, "the RC sender's CQ")?;
    // The queues still work.
    u.post(3, 0, 64)?;
    u.send(env, 0, 4, 0, 8, QKEY)?;
    ensure!(env.wait1(&u.cq_r)?.is_ok(), "a UD send with its destination");
    Ok(Outcome::Pass)
}
