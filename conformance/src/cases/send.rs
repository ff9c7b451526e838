//! Two-sided SEND/RECV (`man ibv_post_send`, `man ibv_post_recv`, `man ibv_poll_cq`;
//! IBA 9.4.3, 10.7.2.2).

use verbs_api::{AccessFlags as A, Backend, MemoryRegion, QueuePair, RecvWr, SendWr, WcFlags, WcOpcode};

use super::case;
use crate::env::{pattern, read_back};
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Outcome};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "send.basic",
            "a SEND lands in the posted receive; both completions carry wr_id, opcode, qp_num and byte_len",
            "man ibv_poll_cq (struct ibv_wc); rdma-core tests/test_qp.py traffic",
            send_basic
        ),
        case!(
            "send.imm",
            "SEND_WITH_IMM delivers the immediate with IBV_WC_WITH_IMM",
            "man ibv_post_send (IBV_WR_SEND_WITH_IMM), man ibv_poll_cq (imm_data)",
            send_imm
        ),
        case!(
            "send.sge",
            "a 3-SGE gather list arrives in a 3-SGE scatter list byte for byte",
            "man ibv_post_send (sg_list), man ibv_post_recv",
            send_sge
        ),
        case!(
            "send.inline",
            "an INLINE SEND is copied at post time: overwriting the buffer afterwards changes nothing",
            "man ibv_post_send (IBV_SEND_INLINE)",
            send_inline
        ),
        case!(
            "send.zero-length",
            "a zero-length SEND consumes a receive with byte_len 0",
            "IBA 9.4.3 (zero-length messages)",
            send_zero
        ),
        case!(
            "send.unsignaled",
            "unsignaled SENDs produce no completion; the signaled one after them does",
            "man ibv_post_send (IBV_SEND_SIGNALED); man ibv_create_qp (sq_sig_all)",
            send_unsignaled
        ),
        case!(
            "send.sq-sig-all",
            "with sq_sig_all every SEND completes",
            "man ibv_create_qp (sq_sig_all)",
            send_sig_all
        ),
        case!(
            "send.order",
            "200 SENDs arrive and complete in posting order",
            "IBA 9.5 (RC ordering); man ibv_poll_cq",
            send_order
        ),
        case!(
            "send.large",
            "a 1 MiB SEND arrives intact",
            "IBA 9.4.3 (multi-packet messages)",
            send_large
        ),
    ]
}

fn send_basic<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 8192, A::LOCAL_WRITE)?;
    let data = pattern(1000, 1);
    mr.write(0, &data)?;
    p.b.post_recv(&[RecvWr::new(0xb0b, &[mr.sge(4096, 2048)?])])?;
    p.a.post_send(&[SendWr::send(0xa11ce, &[mr.sge(0, 1000)?]).signaled()])?;
    let s = env.wait1(&p.cq_a)?;
    let r = env.wait1(&p.cq_b)?;
    ensure!(s.is_ok() && r.is_ok(), "statuses {:?} / {:?}", s.status, r.status);
    ensure_eq!(s.wr_id, 0xa11ce, "send wr_id");
    ensure_eq!(s.opcode, WcOpcode::Send, "send opcode");
    ensure_eq!(s.qp_num, p.a.qp_num(), "send qp_num");
    ensure_eq!(r.wr_id, 0xb0b, "recv wr_id");
    ensure_eq!(r.opcode, WcOpcode::Recv, "recv opcode");
    ensure_eq!(r.byte_len, 1000, "recv byte_len");
    ensure_eq!(r.qp_num, p.b.qp_num(), "recv qp_num");
    ensure!(
        !r.wc_flags.contains(WcFlags::WITH_IMM),
        "WITH_IMM without immediate"
    );
    ensure_eq!(read_back(&mr, 4096, 1000)?, data, "payload");
    Ok(Outcome::Pass)
}

fn send_imm<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    mr.write(0, b"imm")?;
    p.b.post_recv(&[RecvWr::new(1, &[mr.sge(1024, 64)?])])?;
    p.a.post_send(&[SendWr::send_with_imm(2, &[mr.sge(0, 3)?], 0xdead_beef).signaled()])?;
    let r = env.wait1(&p.cq_b)?;
    ensure!(r.is_ok(), "status {:?}", r.status);
    ensure_eq!(r.opcode, WcOpcode::Recv, "opcode");
    ensure_eq!(r.imm(), Some(0xdead_beef), "immediate");
    ensure_eq!(r.byte_len, 3, "byte_len");
    ensure!(env.wait1(&p.cq_a)?.is_ok(), "send completion");
    Ok(Outcome::Pass)
}

fn send_sge<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 16384, A::LOCAL_WRITE)?;
    let data = pattern(3 * 700, 5);
    mr.write(100, &data[..700])?;
    mr.write(2000, &data[700..1400])?;
    mr.write(5000, &data[1400..])?;
    let gather = [mr.sge(100, 700)?, mr.sge(2000, 700)?, mr.sge(5000, 700)?];
    let scatter = [mr.sge(8000, 1000)?, mr.sge(10000, 100)?, mr.sge(12000, 1000)?];
    p.b.post_recv(&[RecvWr::new(1, &scatter)])?;
    p.a.post_send(&[SendWr::send(2, &gather).signaled()])?;
    let r = env.wait1(&p.cq_b)?;
    ensure!(r.is_ok(), "status {:?}", r.status);
    ensure_eq!(r.byte_len, 2100, "byte_len");
    let mut got = read_back(&mr, 8000, 1000)?;
    got.extend(read_back(&mr, 10000, 100)?);
    got.extend(read_back(&mr, 12000, 1000)?);
    ensure!(got == data, "scattered bytes differ from the gathered ones");
    Ok(Outcome::Pass)
}

fn send_inline<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let max = p.a.query()?.cap.max_inline_data as usize;
    ensure!(max >= 32, "max_inline_data {max}");
    mr.write(0, &[0x11; 32])?;
    p.b.post_recv(&[RecvWr::new(1, &[mr.sge(1024, 64)?])])?;
    p.a.post_send(&[SendWr::send(2, &[mr.sge(0, 32)?]).inline().signaled()])?;
    mr.write(0, &[0x22; 32])?;
    let r = env.wait1(&p.cq_b)?;
    ensure!(r.is_ok(), "status {:?}", r.status);
    ensure_eq!(
        read_back(&mr, 1024, 32)?,
        vec![0x11; 32],
        "payload (must be the bytes at post time)"
    );
    ensure!(env.wait1(&p.cq_a)?.is_ok(), "send completion");
    Ok(Outcome::Pass)
}

fn send_zero<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    p.b.post_recv(&[RecvWr::new(1, &[mr.sge(0, 64)?])])?;
    p.a.post_send(&[SendWr::send(2, &[]).signaled()])?;
    let r = env.wait1(&p.cq_b)?;
    ensure!(r.is_ok(), "status {:?}", r.status);
    ensure_eq!(r.byte_len, 0, "byte_len");
    ensure!(env.wait1(&p.cq_a)?.is_ok(), "send completion");
    Ok(Outcome::Pass)
}

fn send_unsignaled<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    for i in 0..4 {
        p.b.post_recv(&[RecvWr::new(i, &[mr.sge(1024 + i as usize * 64, 64)?])])?;
    }
    let sge = [mr.sge(0, 16)?];
    p.a.post_send(&[
        SendWr::send(10, &sge),
        SendWr::send(11, &sge),
        SendWr::send(12, &sge),
        SendWr::send(13, &sge).signaled(),
    ])?;
    let s = env.wait1(&p.cq_a)?;
    ensure_eq!(s.wr_id, 13, "the only send completion");
    ensure_eq!(env.wait(&p.cq_b, 4)?.len(), 4, "receives");
    env.expect_empty(&p.cq_a, "unsignaled SENDs")?;
    Ok(Outcome::Pass)
}

fn send_sig_all<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.sq_sig_all = true;
    let p = env.pair(&o)?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    for i in 0..4 {
        p.b.post_recv(&[RecvWr::new(i, &[mr.sge(1024, 64)?])])?;
    }
    let sge = [mr.sge(0, 16)?];
    p.a.post_send(&[
        SendWr::send(10, &sge),
        SendWr::send(11, &sge),
        SendWr::send(12, &sge),
        SendWr::send(13, &sge),
    ])?;
    let ids: Vec<u64> = env.wait(&p.cq_a, 4)?.iter().map(|w| w.wr_id).collect();
    ensure_eq!(ids, vec![10, 11, 12, 13], "send completions");
    Ok(Outcome::Pass)
}

fn send_order<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.cap.max_send_wr = 256;
    o.cap.max_recv_wr = 256;
    let p = env.pair(&o)?;
    let n = 200usize;
    let mr = env.mr(&p.pd, 64 * 1024, A::LOCAL_WRITE)?;
    for i in 0..n {
        mr.write(i * 8, &(i as u64).to_le_bytes())?;
        p.b.post_recv(&[RecvWr::new(i as u64, &[mr.sge(32768 + i * 8, 8)?])])?;
    }
    for i in 0..n {
        p.a.post_send(&[SendWr::send(i as u64, &[mr.sge(i * 8, 8)?]).signaled()])?;
    }
    let s = env.wait(&p.cq_a, n)?;
    let r = env.wait(&p.cq_b, n)?;
    for i in 0..n {
        ensure_eq!(s[i].wr_id, i as u64, "send completion {i}");
        ensure_eq!(r[i].wr_id, i as u64, "receive completion {i}");
        let mut b = [0u8; 8];
        mr.read(32768 + i * 8, &mut b)?;
        ensure_eq!(u64::from_le_bytes(b), i as u64, "payload of message {i}");
    }
    Ok(Outcome::Pass)
}

fn send_large<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let len = 1 << 20;
    let src = env.mr(&p.pd, len, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, len, A::LOCAL_WRITE)?;
    let data = pattern(len, 77);
    src.write(0, &data)?;
    p.b.post_recv(&[RecvWr::new(1, &[dst.sge_all()])])?;
    p.a.post_send(&[SendWr::send(2, &[src.sge_all()]).signaled()])?;
    let r = env.wait1(&p.cq_b)?;
    ensure!(r.is_ok(), "status {:?}", r.status);
    ensure_eq!(r.byte_len as usize, len, "byte_len");
    ensure!(dst.to_vec() == data, "1 MiB payload differs");
    Ok(Outcome::Pass)
}
