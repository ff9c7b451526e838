//! The QP state machine and its attributes (`man ibv_create_qp`, `man ibv_modify_qp`,
//! `man ibv_query_qp`; IBA 10.3).

use verbs_api::{
    ah_attr_for, connect_rc, modify_to_init, modify_to_rtr, modify_to_rts, AccessFlags as A, AhAttr,
    AsyncElement, AsyncEventType, Backend, Context, Endpoint, Error, LinkLayer, MemoryRegion,
    ProtectionDomain, QpAttr, QpAttrMask as M, QpCap, QpInitAttr, QpState, QueuePair, RcParams, RecvWr,
    SendWr,
};

use super::case;
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Failure, Outcome, Profile};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "qp.create",
            "a new RC QP is in RESET with distinct numbers and at least the capacities asked for",
            "man ibv_create_qp; rdma-core tests/test_qp.py test_create_rc_qp",
            qp_create
        ),
        case!(
            "qp.create-too-many-wr",
            "max_send_wr above max_qp_wr is refused",
            "man ibv_create_qp (cap limits)",
            qp_create_too_many_wr
        ),
        case!(
            "qp.create-too-many-sge",
            "max_send_sge above max_sge is refused",
            "man ibv_create_qp (cap limits)",
            qp_create_too_many_sge
        ),
        case!(
            "qp.bring-up",
            "RESET -> INIT -> RTR -> RTS with the RC masks; query returns what was set",
            "man ibv_modify_qp (RC transitions), man ibv_query_qp; rdma-core tests/test_qp.py test_modify_qp",
            qp_bring_up
        ),
        case!(
            "qp.invalid-transition",
            "RESET -> RTR and RESET -> RTS are refused with EINVAL naming both states",
            "man ibv_modify_qp; IBA 10.3.1 (state transitions)",
            qp_invalid_transition
        ),
        case!(
            "qp.init-missing-attr",
            "RESET -> INIT without IBV_QP_PORT is refused with EINVAL",
            "man ibv_modify_qp: required attributes for RESET -> INIT",
            qp_init_missing
        ),
        case!(
            "qp.rtr-missing-attr",
            "INIT -> RTR without IBV_QP_DEST_QPN is refused with EINVAL",
            "man ibv_modify_qp: required attributes for INIT -> RTR",
            qp_rtr_missing
        ),
        case!(
            "qp.rts-missing-attr",
            "RTR -> RTS without IBV_QP_SQ_PSN is refused with EINVAL",
            "man ibv_modify_qp: required attributes for RTR -> RTS",
            qp_rts_missing
        ),
        case!(
            "qp.extra-attr",
            "RESET -> INIT with an RTR-only attribute in the mask is refused with EINVAL",
            "IBA 10.3.1 (optional attributes per transition); ib_modify_qp_is_ok",
            qp_extra_attr
        ),
        case!(
            "qp.bad-port",
            "INIT with a port that does not exist is refused with EINVAL",
            "man ibv_modify_qp (port_num)",
            qp_bad_port
        ),
        case!(
            "qp.rd-atomic-limit",
            "max_rd_atomic above max_qp_init_rd_atom is refused with EINVAL",
            "man ibv_modify_qp (max_rd_atomic); man ibv_query_device",
            qp_rd_atomic_limit
        ),
        case!(
            "qp.to-err",
            "INIT and RTS QPs can be moved to ERR; query says ERR",
            "man ibv_modify_qp (any state -> ERR)",
            qp_to_err
        ),
        case!(
            "qp.reuse",
            "a QP moved RTS -> ERR -> RESET can be brought up again and carries traffic",
            "man ibv_modify_qp (any state -> RESET); IBA 10.3.1",
            qp_reuse
        ),
        case!(
            "qp.sqd-resume",
            "a WR posted in SQD is held, and sent after SQD -> RTS without another post",
            "man ibv_modify_qp (IBV_QPS_SQD); IBA 10.3.1 (SQD -> RTS resumes the send queue)",
            qp_sqd_resume
        ),
        case!(
            "qp.sqd-budget",
            "rnr_retry lowered from 7 to 0 by SQD -> SQD holds for the next SEND: one RNR NAK ends it in RNR_RETRY_EXC_ERR",
            "man ibv_modify_qp (SQD -> SQD: timeout, retry_cnt, rnr_retry, max_rd_atomic); IBA 11.2.5.2 and 10.3.1",
            qp_sqd_budget
        ),
        case!(
            "qp.rd-atomic-rounding",
            "max_rd_atomic and max_dest_rd_atomic 3 are granted and reported as 3",
            "man ibv_modify_qp (max_rd_atomic, max_dest_rd_atomic); man ibv_query_qp",
            qp_rd_atomic_rounding
        ),
        case!(
            "qp.sqd-event-unasked",
            "RTS -> SQD without en_sqd_async_notify raises no SQ_DRAINED; with it, SQ_DRAINED comes",
            "man ibv_modify_qp (en_sqd_async_notify); IBA 11.6.3.1 (Send Queue Drained)",
            qp_sqd_event_unasked
        ),
        case!(
            "qp.av-udp-hint",
            "an RC pair whose address vectors carry UCX's RoCE hints connects: a flow label of all 32 bits set (the GRH holds its low 20) and, on an Ethernet (RoCE) port, a DLID of 0xC000 (ignored: the GID names the peer)",
            "IBA 8.3.1 (FlowLabel: 20 bits); rdma-core providers/mlx5 mlx5_create_ah (IB_GRH_FLOWLABEL_MASK); the kernel's rdma_ah_set_dlid (no DLID in a RoCE address); UCX uct_ib_iface_fill_ah_attr_from_gid_lid",
            qp_av_udp_hint
        ),
    ]
}

fn qp_sqd_budget<B: Backend>(env: &Env<B>) -> CaseResult {
    // With rnr_retry 7 a SEND to a QP without receives is retried for ever; B's
    // min_rnr_timer (0.01 ms) keeps the retries quick.
    let mut o = env.opts();
    o.a.rnr_retry = 7;
    o.b.min_rnr_timer = 1;
    let p = env.pair(&o)?;
    let src = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    let to = |state| QpAttr {
        qp_state: state,
        ..Default::default()
    };
    p.a.modify(&to(QpState::Sqd), M::STATE)?;
    // Attributes change in SQD only once the send queue has drained (rxe refuses them
    // while `sq_draining`); nothing was sent, so that is at once or nearly.
    let deadline = std::time::Instant::now() + env.cfg.timeout;
    while p.a.query()?.sq_draining {
        ensure!(
            std::time::Instant::now() < deadline,
            "the empty send queue never drained in SQD"
        );
        env.settle(std::time::Duration::from_millis(1))?;
    }
    let budget = QpAttr {
        rnr_retry: 0,
        ..to(QpState::Sqd)
    };
    p.a.modify(&budget, M::STATE | M::RNR_RETRY)?;
    ensure_eq!(p.a.query()?.rnr_retry, 0, "rnr_retry queried after SQD -> SQD");
    p.a.modify(&to(QpState::Rts), M::STATE)?;
    p.a.post_send(&[SendWr::send(1, &[src.sge(0, 8)?]).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    env.observe(
        "SEND to no receive after rnr_retry 7 -> 0 in SQD",
        format!("{:?}", wc.status),
    );
    ensure_eq!(
        (wc.wr_id, wc.status),
        (1, verbs_api::WcStatus::RnrRetryExcErr),
        "the SEND after SQD -> SQD"
    );
    Ok(Outcome::Pass)
}

fn qp_rd_atomic_rounding<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.a.max_rd_atomic = 3;
    o.a.max_dest_rd_atomic = 3;
    let p = env.pair(&o)?;
    let q = p.a.query()?;
    let got = (q.max_rd_atomic, q.max_dest_rd_atomic);
    env.observe(
        "max_rd_atomic, max_dest_rd_atomic after 3, 3",
        format!("{}, {}", got.0, got.1),
    );
    match got {
        (3, 3) => Ok(Outcome::Pass),
        (4, 4) if env.profile != Profile::Portable => {
            env.deviation(
                "3 is rounded up to 4: rxe_qp.c rxe_qp_from_attr() (roundup_pow_of_two()); mlx5 \
                 stores log2 values (kernel hw/mlx5/qp.c fls(n - 1), reported as 1 << log)",
            );
            Ok(Outcome::Pass)
        }
        _ => Err(Failure(format!(
            "max_rd_atomic, max_dest_rd_atomic after 3, 3: {}, {}",
            got.0, got.1
        ))),
    }
}

fn qp_sqd_event_unasked<B: Backend>(env: &Env<B>) -> CaseResult {
    let to = |state| QpAttr {
        qp_state: state,
        ..Default::default()
    };
    for asked in [false, true] {
        let p = env.pair(&env.opts())?;
        let what = if asked {
            "event after RTS -> SQD with en_sqd_async_notify"
        } else {
            "event after RTS -> SQD without en_sqd_async_notify"
        };
        if asked {
            let a = QpAttr {
                en_sqd_async_notify: true,
                ..to(QpState::Sqd)
            };
            p.a.modify(&a, M::STATE | M::EN_SQD_ASYNC_NOTIFY)?;
        } else {
            p.a.modify(&to(QpState::Sqd), M::STATE)?;
        }
        let wait = if asked {
            env.cfg.timeout
        } else {
            std::time::Duration::from_millis(500)
        };
        let got = env.take_event(what, wait)?;
        let drained = Some((AsyncEventType::SqDrained, AsyncElement::Qp(p.a.qp_num())));
        match (asked, got) {
            (true, g) => ensure_eq!(g, drained, "{what}"),
            (false, None) => {}
            (false, g) if g == drained && env.profile == Profile::Rxe => env.deviation(
                "rxe raises SQ_DRAINED on every drain (rxe_req.c req_next_wqe(), rxe_comp.c); \
                 en_sqd_async_notify is only stored (rxe_qp.c rxe_qp_from_attr())",
            ),
            (false, g) => return Err(Failure(format!("{what}: {g:?}, expected none"))),
        }
        p.a.modify(&to(QpState::Rts), M::STATE)?;
    }
    Ok(Outcome::Pass)
}

fn einval(what: &str, r: verbs_api::Result<()>) -> Result<Error, Failure> {
    match r {
        Ok(()) => Err(Failure(format!("{what}: succeeded, expected EINVAL"))),
        Err(e) => {
            ensure_eq!(e.errno(), libc::EINVAL, "{what}: errno ({e})");
            Ok(e)
        }
    }
}

fn qp_create<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair_unconnected(&env.opts())?;
    ensure_eq!(p.a.state()?, QpState::Reset, "state of a new QP");
    ensure!(
        p.a.qp_num() != p.b.qp_num(),
        "two QPs share number {}",
        p.a.qp_num()
    );
    ensure!(p.a.qp_num() > 1, "QP number {} is reserved", p.a.qp_num());
    let cap = p.a.query()?.cap;
    let want = env.opts().cap;
    ensure!(
        cap.max_send_wr >= want.max_send_wr
            && cap.max_recv_wr >= want.max_recv_wr
            && cap.max_send_sge >= want.max_send_sge
            && cap.max_recv_sge >= want.max_recv_sge
            && cap.max_inline_data >= want.max_inline_data,
        "granted {cap:?} for {want:?}"
    );
    Ok(Outcome::Pass)
}

fn create_with<B: Backend>(env: &Env<B>, cap: QpCap) -> Result<verbs_api::Result<B::Qp>, Failure> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16, None)?;
    Ok(pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)))
}

fn qp_create_too_many_wr<B: Backend>(env: &Env<B>) -> CaseResult {
    let max = env.ctx.query_device()?.max_qp_wr;
    let cap = QpCap::new(max.saturating_add(1), 1);
    ensure!(
        create_with(env, cap)?.is_err(),
        "max_send_wr {} accepted",
        max as u64 + 1
    );
    Ok(Outcome::Pass)
}

fn qp_create_too_many_sge<B: Backend>(env: &Env<B>) -> CaseResult {
    let max = env.ctx.query_device()?.max_sge;
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: max.saturating_add(1),
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    ensure!(
        create_with(env, cap)?.is_err(),
        "max_send_sge {} accepted",
        max as u64 + 1
    );
    Ok(Outcome::Pass)
}

fn qp_bring_up<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.a.timeout = 12;
    o.a.retry_cnt = 5;
    o.a.rnr_retry = 3;
    o.a.min_rnr_timer = 9;
    o.a.access = A::REMOTE_READ | A::REMOTE_WRITE;
    let p = env.pair_unconnected(&o)?;
    modify_to_init(&p.a, &o.a)?;
    ensure_eq!(p.a.state()?, QpState::Init, "after INIT");
    modify_to_rtr(&p.a, &o.a, &p.ep_b)?;
    ensure_eq!(p.a.state()?, QpState::Rtr, "after RTR");
    verbs_api::modify_to_rts(&p.a, &o.a, p.ep_a.psn)?;
    let q = p.a.query()?;
    ensure_eq!(q.qp_state, QpState::Rts, "after RTS");
    ensure_eq!(q.dest_qp_num, p.b.qp_num(), "dest_qp_num");
    ensure_eq!(q.rq_psn, p.ep_b.psn, "rq_psn");
    ensure_eq!(q.timeout, 12, "timeout");
    ensure_eq!(q.retry_cnt, 5, "retry_cnt");
    ensure_eq!(q.rnr_retry, 3, "rnr_retry");
    ensure_eq!(q.min_rnr_timer, 9, "min_rnr_timer");
    ensure_eq!(q.path_mtu, o.a.path_mtu, "path_mtu");
    ensure_eq!(q.port_num, 1, "port_num");
    ensure!(
        q.qp_access_flags.contains(A::REMOTE_READ | A::REMOTE_WRITE),
        "qp_access_flags {:?}",
        q.qp_access_flags
    );
    Ok(Outcome::Pass)
}

fn qp_invalid_transition<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair_unconnected(&env.opts())?;
    for target in [QpState::Rtr, QpState::Rts] {
        let attr = QpAttr {
            qp_state: target,
            ..Default::default()
        };
        let e = einval(&format!("RESET -> {target:?}"), p.a.modify(&attr, M::STATE))?;
        if env.backend.name() == "sim" {
            let msg = e.to_string();
            ensure!(
                msg.contains("Reset") && msg.contains(&format!("{target:?}")),
                "error does not name the states: {msg}"
            );
        }
    }
    ensure_eq!(p.a.state()?, QpState::Reset, "state after refused transitions");
    Ok(Outcome::Pass)
}

fn qp_init_missing<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair_unconnected(&env.opts())?;
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: A::REMOTE_WRITE,
        ..Default::default()
    };
    einval(
        "RESET -> INIT without PORT",
        p.a.modify(&attr, M::STATE | M::PKEY_INDEX | M::ACCESS_FLAGS),
    )?;
    ensure_eq!(p.a.state()?, QpState::Reset, "state");
    Ok(Outcome::Pass)
}

fn rtr_attr(env: &Env<impl Backend>, p: &crate::Pair<impl Backend>) -> QpAttr {
    QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: verbs_api::Mtu::Mtu1024,
        dest_qp_num: p.ep_b.qpn,
        rq_psn: p.ep_b.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: verbs_api::ah_attr_for(&p.ep_b, &env.params()),
        ..Default::default()
    }
}

fn qp_rtr_missing<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair_unconnected(&env.opts())?;
    modify_to_init(&p.a, &env.params())?;
    let attr = rtr_attr(env, &p);
    einval(
        "INIT -> RTR without DEST_QPN",
        p.a.modify(
            &attr,
            M::STATE | M::AV | M::PATH_MTU | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
        ),
    )?;
    ensure_eq!(p.a.state()?, QpState::Init, "state");
    Ok(Outcome::Pass)
}

fn qp_rts_missing<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair_unconnected(&env.opts())?;
    modify_to_init(&p.a, &env.params())?;
    modify_to_rtr(&p.a, &env.params(), &p.ep_b)?;
    let attr = QpAttr {
        qp_state: QpState::Rts,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..Default::default()
    };
    einval(
        "RTR -> RTS without SQ_PSN",
        p.a.modify(
            &attr,
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
        ),
    )?;
    ensure_eq!(p.a.state()?, QpState::Rtr, "state");
    Ok(Outcome::Pass)
}

fn qp_extra_attr<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair_unconnected(&env.opts())?;
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: A::REMOTE_WRITE,
        dest_qp_num: p.ep_b.qpn,
        ..Default::default()
    };
    einval(
        "RESET -> INIT with DEST_QPN",
        p.a.modify(
            &attr,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS | M::DEST_QPN,
        ),
    )?;
    Ok(Outcome::Pass)
}

fn qp_bad_port<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair_unconnected(&env.opts())?;
    let n = env.ctx.query_device()?.phys_port_cnt;
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: n + 1,
        ..Default::default()
    };
    einval(
        "INIT on a missing port",
        p.a.modify(&attr, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
    )?;
    Ok(Outcome::Pass)
}

fn qp_rd_atomic_limit<B: Backend>(env: &Env<B>) -> CaseResult {
    let max = env.ctx.query_device()?.max_qp_init_rd_atom;
    if max >= 255 {
        return Ok(Outcome::Skip(
            crate::report::Lack::RdAtomLimitBelowU8,
            format!("max_qp_init_rd_atom is {max}: no u8 value exceeds it"),
        ));
    }
    let p = env.pair_unconnected(&env.opts())?;
    modify_to_init(&p.a, &env.params())?;
    modify_to_rtr(&p.a, &env.params(), &p.ep_b)?;
    let attr = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: (max + 1) as u8,
        ..Default::default()
    };
    einval(
        "max_rd_atomic above the device limit",
        p.a.modify(
            &attr,
            M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
        ),
    )?;
    Ok(Outcome::Pass)
}

fn qp_to_err<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    p.a.modify(&err, M::STATE)?;
    ensure_eq!(p.a.state()?, QpState::Err, "RTS -> ERR");
    let q = env.pair_unconnected(&env.opts())?;
    modify_to_init(&q.a, &env.params())?;
    q.a.modify(&err, M::STATE)?;
    ensure_eq!(q.a.state()?, QpState::Err, "INIT -> ERR");
    Ok(Outcome::Pass)
}

fn qp_reuse<B: Backend>(env: &Env<B>) -> CaseResult {
    let o = env.opts();
    let p = env.pair(&o)?;
    for qp in [&p.a, &p.b] {
        qp.modify(
            &QpAttr {
                qp_state: QpState::Err,
                ..Default::default()
            },
            M::STATE,
        )?;
        qp.modify(
            &QpAttr {
                qp_state: QpState::Reset,
                ..Default::default()
            },
            M::STATE,
        )?;
        ensure_eq!(qp.state()?, QpState::Reset, "after RESET");
    }
    // Flushed completions of the first life may sit in the CQs; drain them.
    let _ = env.quiet(&p.cq_a, std::time::Duration::from_millis(10))?;
    let _ = env.quiet(&p.cq_b, std::time::Duration::from_millis(10))?;
    connect_rc(&p.a, &o.a, 0x30, &verbs_api::Endpoint { psn: 0x40, ..p.ep_b })?;
    connect_rc(&p.b, &o.b, 0x40, &verbs_api::Endpoint { psn: 0x30, ..p.ep_a })?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    mr.write(0, b"second life")?;
    p.b.post_recv(&[RecvWr::new(7, &[mr.sge(2048, 64)?])])?;
    p.a.post_send(&[SendWr::send(8, &[mr.sge(0, 11)?]).signaled()])?;
    let wa = env.wait1(&p.cq_a)?;
    let wb = env.wait1(&p.cq_b)?;
    ensure!(
        wa.is_ok() && wb.is_ok(),
        "after reuse: {:?} / {:?}",
        wa.status,
        wb.status
    );
    ensure_eq!(
        crate::env::read_back(&mr, 2048, 11)?,
        b"second life".to_vec(),
        "data"
    );
    Ok(Outcome::Pass)
}

/// rxe leaves the WRs posted in SQD waiting after SQD -> RTS: its modify moves the QP to
/// RTS without scheduling the requester, so they go with the next post.
const RXE_SQD_RTS: &str = "the WR held in SQD waits after SQD -> RTS until the next post_send: \
rxe_qp_from_attr() moves the QP to RTS without scheduling the requester task \
(drivers/infiniband/sw/rxe/rxe_qp.c)";

fn qp_sqd_resume<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let src = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    src.write(0, b"before SQD")?;
    src.write(64, b"held in SQD")?;
    // One WRITE first: the connection is up and idle when the QP moves to SQD.
    p.a.post_send(&[SendWr::write(1, &[src.sge(0, 10)?], dst.remote().at(0)).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure!(wc.is_ok(), "WRITE before SQD: {:?}", wc.status);
    let to = |state| QpAttr {
        qp_state: state,
        ..Default::default()
    };
    p.a.modify(&to(QpState::Sqd), M::STATE)?;
    ensure_eq!(p.a.state()?, QpState::Sqd, "after RTS -> SQD");
    p.a.post_send(&[SendWr::write(2, &[src.sge(64, 11)?], dst.remote().at(64)).signaled()])?;
    env.expect_empty(&p.cq_a, "a WRITE posted in SQD")?;
    ensure_eq!(
        crate::env::read_back(&dst, 64, 11)?,
        vec![0u8; 11],
        "target of the WRITE posted in SQD, before SQD -> RTS"
    );
    p.a.modify(&to(QpState::Rts), M::STATE)?;
    ensure_eq!(p.a.state()?, QpState::Rts, "after SQD -> RTS");
    // No further post: the transition alone must start the held WRITE.
    let wc = if env.profile == Profile::Rxe {
        match env.quiet(&p.cq_a, std::time::Duration::from_secs(2))?.as_slice() {
            [wc] => {
                env.observe("SQD -> RTS", "resumes");
                *wc
            }
            [] => {
                env.observe("SQD -> RTS", "waits for the next post");
                env.deviation(RXE_SQD_RTS);
                // The next post starts the held WRITE, and then itself.
                p.a.post_send(&[SendWr::write(3, &[src.sge(0, 10)?], dst.remote().at(128)).signaled()])?;
                let wcs = env.wait(&p.cq_a, 2)?;
                ensure_eq!(
                    (wcs[1].wr_id, wcs[1].status),
                    (3, verbs_api::WcStatus::Success),
                    "the WRITE posted after SQD -> RTS"
                );
                wcs[0]
            }
            more => return Err(Failure(format!("one completion expected, got {more:?}"))),
        }
    } else {
        env.observe("SQD -> RTS", "resumes");
        env.wait1(&p.cq_a)?
    };
    ensure_eq!(
        (wc.wr_id, wc.status),
        (2, verbs_api::WcStatus::Success),
        "the WRITE held in SQD"
    );
    ensure_eq!(
        crate::env::read_back(&dst, 64, 11)?,
        b"held in SQD".to_vec(),
        "target of the WRITE held in SQD"
    );
    Ok(Outcome::Pass)
}

/// The address vector UCX 1.13 gives a QP or an address handle towards `remote`
/// (`uct_ib_iface_fill_ah_attr_from_gid_lid()`): on an Ethernet (RoCE) port a DLID of
/// `0xC000 | path` (its UDP source-port hint) and a flow label of `~path` (all 32 bits set
/// for path 0, for rdma-core's flow-label-to-UDP-port conversion); on InfiniBand the
/// peer's LID, and the same flow label. Always with the GRH.
pub(crate) fn ucx_ah_attr(remote: &Endpoint, params: &RcParams, link_layer: LinkLayer) -> AhAttr {
    let mut ah = ah_attr_for(remote, params);
    ah.is_global = true;
    ah.grh.flow_label = !0;
    if link_layer == LinkLayer::Ethernet {
        ah.dlid = 0xc000;
    }
    ah
}

fn qp_av_udp_hint<B: Backend>(env: &Env<B>) -> CaseResult {
    let o = env.opts();
    let p = env.pair_unconnected(&o)?;
    let link_layer = env.ctx.query_port(1)?.link_layer;
    for (qp, params, psn, remote) in [
        (&p.a, &o.a, p.ep_a.psn, &p.ep_b),
        (&p.b, &o.b, p.ep_b.psn, &p.ep_a),
    ] {
        modify_to_init(qp, params)?;
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: params.path_mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: params.max_dest_rd_atomic,
            min_rnr_timer: params.min_rnr_timer,
            ah_attr: ucx_ah_attr(remote, params, link_layer),
            ..Default::default()
        };
        qp.modify(
            &rtr,
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        )?;
        modify_to_rts(qp, params, psn)?;
    }
    // Both directions: each side's address vector must name the other.
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    mr.write(0, b"hinted write")?;
    p.a.post_send(&[SendWr::write(1, &[mr.sge(0, 12)?], mr.remote().at(1024)).signaled()])?;
    let wa = env.wait1(&p.cq_a)?;
    ensure!(wa.is_ok(), "WRITE from A: {:?}", wa.status);
    ensure_eq!(
        crate::env::read_back(&mr, 1024, 12)?,
        b"hinted write".to_vec(),
        "written data"
    );
    mr.write(0, b"hinted send")?;
    p.a.post_recv(&[RecvWr::new(2, &[mr.sge(2048, 64)?])])?;
    p.b.post_send(&[SendWr::send(3, &[mr.sge(0, 11)?]).signaled()])?;
    let wb = env.wait1(&p.cq_b)?;
    let wa = env.wait1(&p.cq_a)?;
    ensure!(
        wa.is_ok() && wb.is_ok(),
        "SEND from B: {:?} / receive at A: {:?}",
        wb.status,
        wa.status
    );
    ensure_eq!(
        crate::env::read_back(&mr, 2048, 11)?,
        b"hinted send".to_vec(),
        "received data"
    );
    Ok(Outcome::Pass)
}
