//! Unreliable connected QPs (`man ibv_create_qp`, `man ibv_modify_qp` and `man
//! ibv_post_send` for IBV_QPT_UC): SEND and RDMA WRITE (with immediate) only, no ACKs and
//! no retries, so what would be an RNR or access NAK on RC is a message the responder
//! drops while the requester completes successfully.

use std::time::Duration;

use verbs_api::{
    ah_attr_for, modify_to_init, AccessFlags as A, Backend, MemoryRegion, QpAttr, QpAttrMask as M, QpState,
    QpType, QueuePair, RecvWr, SendWr, Sge, WcFlags, WcOpcode, WcStatus,
};

use super::{case, send_error};
use crate::env::{connect_uc, pattern, read_back};
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome, Pair, PairOpts, Profile};

pub fn list<B: Backend>() -> Vec<crate::Case<B>> {
    vec![
        case!(
            "uc.send",
            "SEND and SEND_WITH_IMM over UC land in the posted receive with the immediate",
            "man ibv_post_send (opcodes valid for UC); man ibv_poll_cq",
            uc_send,
            requires [Uc]
        ),
        case!(
            "uc.write",
            "an RDMA WRITE of several packets over UC lands in remote memory; the responder sees no completion",
            "man ibv_post_send (IBV_WR_RDMA_WRITE on UC)",
            uc_write,
            requires [Uc]
        ),
        case!(
            "uc.write-imm",
            "RDMA_WRITE_WITH_IMM over UC writes and completes a receive as RECV_RDMA_WITH_IMM",
            "man ibv_post_send (IBV_WR_RDMA_WRITE_WITH_IMM on UC); man ibv_poll_cq",
            uc_write_imm,
            requires [Uc]
        ),
        case!(
            "uc.read-refused",
            "an RDMA READ on a UC QP is refused (EINVAL): UC has no reads",
            "man ibv_post_send (opcode table: RDMA_READ is RC only); IBA vol. 1 (UC: SEND and RDMA WRITE only)",
            uc_read_refused,
            requires [Uc]
        ),
        case!(
            "uc.atomic-refused",
            "an atomic on a UC QP is refused (EINVAL): UC has no atomics",
            "man ibv_post_send (opcode table: atomics are RC only); IBA vol. 1 (UC: SEND and RDMA WRITE only)",
            uc_atomic_refused,
            requires [Uc]
        ),
        case!(
            "uc.empty-rq",
            "a UC SEND that finds no receive is dropped: the sender completes SUCCESS, nothing arrives, the QP stays RTS",
            "IBA vol. 1, UC responder errors (class D: the message is dropped, no NAK); man ibv_post_recv",
            uc_empty_rq,
            requires [Uc]
        ),
        case!(
            "uc.bad-rkey",
            "a UC WRITE with a bad rkey is dropped: the sender completes SUCCESS, memory untouched, the QP stays RTS",
            "IBA 10.6.3.1 (R_Key check); IBA vol. 1, UC responder errors (class E: dropped, no NAK)",
            uc_bad_rkey,
            requires [Uc]
        ),
        case!(
            "uc.send-error",
            "a UC SEND with a bad lkey fails (LOC_PROT_ERR), the QP goes to SQE: the SEND behind it and those posted later are flushed, receives go on, SQE -> RTS sends again",
            "IBA 10.3.1 (SQE: send queue error of UC and UD QPs); man ibv_modify_qp (IBV_QPS_SQE -> IBV_QPS_RTS)",
            uc_send_error,
            requires [Uc]
        ),
        case!(
            "uc.modify-masks",
            "UC's INIT -> RTR and RTR -> RTS refuse RC's read, RNR and retry attributes and take their own",
            "man ibv_modify_qp (UC: RTR: AV, PATH_MTU, DEST_QPN, RQ_PSN; RTS: SQ_PSN)",
            uc_modify_masks,
            requires [Uc]
        ),
    ]
}

/// How long "nothing happens" is watched for.
const QUIET: Duration = Duration::from_millis(300);

/// Pair options for UC: the transport, and the only remote right UC has.
fn uc_opts<B: Backend>(env: &Env<B>) -> PairOpts {
    let mut o = env.opts();
    o.qp_type = QpType::Uc;
    o.a.access = A::REMOTE_WRITE;
    o.b.access = A::REMOTE_WRITE;
    o
}

fn uc_pair<B: Backend>(env: &Env<B>) -> Result<Pair<B>, Failure> {
    let p = env.pair(&uc_opts(env))?;
    ensure_eq!(p.a.qp_type(), QpType::Uc, "qp_type");
    Ok(p)
}

fn uc_send<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = uc_pair(env)?;
    let src = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let data = pattern(1500, 3);
    src.write(0, &data)?;
    p.b.post_recv(&[
        RecvWr::new(1, &[dst.sge(0, 2048)?]),
        RecvWr::new(2, &[dst.sge(2048, 64)?]),
    ])?;
    p.a.post_send(&[
        SendWr::send(10, &[src.sge(0, 1500)?]).signaled(),
        SendWr::send_with_imm(11, &[src.sge(0, 16)?], 0x1234_5678).signaled(),
    ])?;
    let ws = env.wait(&p.cq_a, 2)?;
    ensure!(
        ws.iter()
            .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Send),
        "sender: {ws:?}"
    );
    let wr = env.wait(&p.cq_b, 2)?;
    ensure!(wr.iter().all(|w| w.is_ok()), "receives: {wr:?}");
    ensure_eq!((wr[0].wr_id, wr[0].byte_len), (1, 1500), "first receive");
    ensure_eq!(wr[0].opcode, WcOpcode::Recv, "opcode");
    ensure_eq!(wr[0].qp_num, p.b.qp_num(), "qp_num");
    ensure_eq!((wr[1].wr_id, wr[1].byte_len), (2, 16), "second receive");
    ensure!(
        wr[1].wc_flags.contains(WcFlags::WITH_IMM),
        "flags {:?}",
        wr[1].wc_flags
    );
    ensure_eq!(wr[1].imm(), Some(0x1234_5678), "immediate");
    ensure_eq!(read_back(&dst, 0, 1500)?, data, "SEND payload");
    ensure_eq!(
        read_back(&dst, 2048, 16)?,
        data[..16].to_vec(),
        "SEND_WITH_IMM payload"
    );
    Ok(Outcome::Pass)
}

fn uc_write<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = uc_pair(env)?;
    let src = env.mr(&p.pd, 8192, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 8192, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let data = pattern(5000, 7); // several packets at any path MTU up to 4096
    src.write(0, &data)?;
    p.a.post_send(&[SendWr::write(1, &[src.sge(0, 5000)?], dst.remote().at(100)).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure!(wc.is_ok() && wc.opcode == WcOpcode::RdmaWrite, "WRITE: {wc:?}");
    ensure_eq!(read_back(&dst, 100, 5000)?, data, "written bytes");
    ensure_eq!(
        read_back(&dst, 0, 100)?,
        vec![0u8; 100],
        "bytes before the target"
    );
    env.expect_empty(&p.cq_b, "the responder's CQ")?;
    Ok(Outcome::Pass)
}

fn uc_write_imm<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = uc_pair(env)?;
    let src = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let data = pattern(300, 9);
    src.write(0, &data)?;
    p.b.post_recv(&[RecvWr::new(5, &[dst.sge(2048, 8)?])])?;
    p.a.post_send(&[SendWr::write_with_imm(1, &[src.sge(0, 300)?], dst.remote().at(0), 0xabcd).signaled()])?;
    let ws = env.wait1(&p.cq_a)?;
    ensure!(ws.is_ok() && ws.opcode == WcOpcode::RdmaWrite, "sender: {ws:?}");
    let wr = env.wait1(&p.cq_b)?;
    ensure!(wr.is_ok(), "receive: {:?}", wr.status);
    ensure_eq!(wr.wr_id, 5, "wr_id");
    ensure_eq!(wr.opcode, WcOpcode::RecvRdmaWithImm, "opcode");
    ensure_eq!(wr.imm(), Some(0xabcd), "immediate");
    ensure_eq!(wr.byte_len, 300, "byte_len");
    ensure_eq!(read_back(&dst, 0, 300)?, data, "written bytes");
    Ok(Outcome::Pass)
}

/// rxe accepts the post and fails the WR when it executes.
fn rxe_op_on_uc(op: &str) -> String {
    format!(
        "{op} on UC is accepted by post_send, then completes with LOC_QP_OP_ERR and the QP goes to ERR: \
         rdma-core providers/rxe/rxe.c validate_send_wr() does not check the opcode against the QP type; \
         the kernel's rxe_req.c next_opcode() finds no UC opcode for it (IB_WC_LOC_QP_OP_ERR) and \
         rxe_comp.c moves the QP to ERR (rxe_qp_error())"
    )
}

/// Posts `wr` on UC QP A and expects the refusal (EINVAL), or on rxe its documented
/// failure as a completion. Either way `untouched` keeps its bytes.
fn expect_refused<B: Backend>(
    env: &Env<B>,
    p: &Pair<B>,
    wr: SendWr<'_>,
    op: &str,
    untouched: &[(&B::Mr, u8)],
) -> CaseResult {
    let posted = p.a.post_send(&[wr]);
    env.observe_post(format!("{op}: post").as_str(), &posted);
    match posted {
        Err(e) => ensure_eq!(e.errno(), libc::EINVAL, "{op} on UC ({e})"),
        Ok(()) if env.profile == Profile::Rxe => {
            let wc = env.wait1(&p.cq_a)?;
            env.observe(format!("{op}: completion"), format_args!("{:?}", wc.status));
            ensure_eq!(wc.status, WcStatus::LocQpOpErr, "{op} on UC: the completion");
            ensure_eq!(p.a.state()?, QpState::Err, "{op} on UC: the QP's state after it");
            env.deviation(rxe_op_on_uc(op));
        }
        Ok(()) => {
            let got = env.quiet(&p.cq_a, QUIET)?;
            return Err(Failure(format!(
                "{op} on UC was accepted by post_send (completions: {got:?})"
            )));
        }
    }
    for (mr, byte) in untouched {
        ensure!(mr.to_vec().iter().all(|b| b == byte), "{op} on UC changed memory");
    }
    Ok(Outcome::Pass)
}

fn uc_read_refused<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = uc_pair(env)?;
    let local = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    let remote = env.mr(&p.pd, 64, A::LOCAL_WRITE | A::REMOTE_READ)?;
    remote.fill(0x77);
    let sge = [local.sge(0, 64)?];
    let wr = SendWr::read(1, &sge, remote.remote().at(0)).signaled();
    expect_refused(env, &p, wr, "RDMA READ", &[(&local, 0), (&remote, 0x77)])
}

fn uc_atomic_refused<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = uc_pair(env)?;
    let local = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    let remote = env.mr(&p.pd, 64, A::LOCAL_WRITE | A::REMOTE_ATOMIC)?;
    let sge = [local.sge(0, 8)?];
    let wr = SendWr::fetch_and_add(1, &sge, remote.remote().at(0), 1).signaled();
    expect_refused(env, &p, wr, "FETCH_AND_ADD", &[(&local, 0), (&remote, 0)])
}

fn uc_empty_rq<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = uc_pair(env)?;
    let src = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    src.write(0, b"dropped")?;
    src.write(64, b"second")?;
    p.a.post_send(&[SendWr::send(1, &[src.sge(0, 7)?]).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure_eq!(
        wc.status,
        WcStatus::Success,
        "the sender's completion of the dropped SEND"
    );
    // Time for the message to reach the responder and be dropped there.
    env.settle(QUIET)?;
    env.expect_empty(&p.cq_b, "the responder's CQ after a SEND with no receive")?;
    ensure_eq!(p.b.state()?, QpState::Rts, "the responder's state");
    ensure_eq!(p.a.state()?, QpState::Rts, "the requester's state");
    p.b.post_recv(&[RecvWr::new(2, &[dst.sge(0, 64)?])])?;
    p.a.post_send(&[SendWr::send(3, &[src.sge(64, 6)?]).signaled()])?;
    let ws = env.wait1(&p.cq_a)?;
    ensure!(ws.is_ok(), "second SEND: {:?}", ws.status);
    let wr = env.wait1(&p.cq_b)?;
    ensure!(wr.is_ok(), "receive: {:?}", wr.status);
    ensure_eq!(
        wr.byte_len,
        6,
        "byte_len (the second message, not the dropped one)"
    );
    ensure_eq!(read_back(&dst, 0, 6)?, b"second".to_vec(), "payload");
    Ok(Outcome::Pass)
}

fn uc_bad_rkey<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = uc_pair(env)?;
    let src = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    src.fill(0x42);
    let mut bad = dst.remote().at(0);
    bad.rkey ^= 0x00ff_ff00;
    p.a.post_send(&[SendWr::write(1, &[src.sge(0, 64)?], bad).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure_eq!(
        wc.status,
        WcStatus::Success,
        "the sender's completion of the WRITE with a bad rkey"
    );
    env.settle(QUIET)?;
    ensure!(
        dst.to_vec().iter().all(|&b| b == 0),
        "memory changed by a WRITE with a bad rkey"
    );
    env.expect_empty(&p.cq_b, "the responder's CQ")?;
    ensure_eq!(p.b.state()?, QpState::Rts, "the responder's state");
    ensure_eq!(p.a.state()?, QpState::Rts, "the requester's state");
    p.a.post_send(&[SendWr::write(2, &[src.sge(0, 64)?], dst.remote().at(0)).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure!(wc.is_ok(), "WRITE with the right rkey: {:?}", wc.status);
    ensure_eq!(read_back(&dst, 0, 64)?, vec![0x42u8; 64], "written bytes");
    Ok(Outcome::Pass)
}

fn uc_send_error<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = uc_pair(env)?;
    let src = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    src.write(0, &pattern(64, 9))?;
    let good = [src.sge(0, 64)?];
    let bad = [Sge::new(src.addr(), 16, src.lkey() ^ 0x0f0f_0000)];
    let into = [dst.sge(0, 64)?];
    let peer_send = || -> Result<(), Failure> {
        p.b.post_send(&[SendWr::send(50, &good).signaled()])?;
        let wc = env.wait1(&p.cq_b)?;
        ensure!(wc.is_ok(), "the peer's SEND: {wc:?}");
        Ok(())
    };
    send_error::run(
        env,
        "UC",
        send_error::Rig {
            qp: &p.a,
            cq: &p.cq_a,
            recv: RecvWr::new(100, &into),
            bad: SendWr::send(1, &bad).signaled(),
            behind: SendWr::send(2, &good).signaled(),
            later: SendWr::send(3, &good).signaled(),
            after: SendWr::write(4, &good, dst.remote().at(1024)).signaled(),
            peer_send: &peer_send,
        },
    )
}

fn uc_modify_masks<B: Backend>(env: &Env<B>) -> CaseResult {
    let o = uc_opts(env);
    let p = env.pair_unconnected(&o)?;
    modify_to_init(&p.a, &o.a)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: o.a.path_mtu,
        dest_qp_num: p.ep_b.qpn,
        rq_psn: p.ep_b.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: ah_attr_for(&p.ep_b, &o.a),
        ..Default::default()
    };
    let uc_rtr = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    for extra in [M::MAX_DEST_RD_ATOMIC, M::MIN_RNR_TIMER] {
        match p.a.modify(&rtr, uc_rtr | extra) {
            Ok(()) => return Err(Failure(format!("UC INIT -> RTR accepted RC's {extra:?}"))),
            Err(e) => ensure_eq!(e.errno(), libc::EINVAL, "UC INIT -> RTR with {extra:?} ({e})"),
        }
    }
    ensure_eq!(p.a.state()?, QpState::Init, "state after the refused modifies");
    p.a.modify(&rtr, uc_rtr)?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: p.ep_a.psn,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..Default::default()
    };
    for extra in [M::TIMEOUT, M::RETRY_CNT, M::RNR_RETRY, M::MAX_QP_RD_ATOMIC] {
        match p.a.modify(&rts, M::STATE | M::SQ_PSN | extra) {
            Ok(()) => return Err(Failure(format!("UC RTR -> RTS accepted RC's {extra:?}"))),
            Err(e) => ensure_eq!(e.errno(), libc::EINVAL, "UC RTR -> RTS with {extra:?} ({e})"),
        }
    }
    p.a.modify(&rts, M::STATE | M::SQ_PSN)?;
    ensure_eq!(p.a.state()?, QpState::Rts, "state");
    // The B side through the helper, and traffic across, proves the masks are enough.
    connect_uc(&p.b, &o.b, p.ep_b.psn, &p.ep_a)?;
    let src = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    src.write(0, b"uc")?;
    p.b.post_recv(&[RecvWr::new(1, &[dst.sge(0, 64)?])])?;
    p.a.post_send(&[SendWr::send(2, &[src.sge(0, 2)?]).signaled()])?;
    ensure!(env.wait1(&p.cq_a)?.is_ok(), "SEND");
    let wr = env.wait1(&p.cq_b)?;
    ensure!(wr.is_ok() && wr.byte_len == 2, "receive: {wr:?}");
    Ok(Outcome::Pass)
}
