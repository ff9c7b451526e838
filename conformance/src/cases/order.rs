//! Ordering on one RC QP (IBA 9.5 "Transaction ordering", 10.8.3.3 fences,
//! `man ibv_post_send` (IBV_SEND_FENCE)).

use verbs_api::{AccessFlags as A, Backend, MemoryRegion, QueuePair, RecvWr, SendWr, WcOpcode};

use super::case;
use crate::env::{pattern, read_back};
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Outcome};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "order.write-then-send",
            "data of an RDMA WRITE is visible when the SEND posted after it completes at the receiver",
            "IBA 9.5 (requests execute in order at the responder)",
            write_then_send
        ),
        case!(
            "order.fence",
            "a FENCEd WRITE whose source is the target of an earlier READ sends the bytes the READ returned",
            "man ibv_post_send (IBV_SEND_FENCE); IBA 10.8.3.3",
            fence
        ),
        case!(
            "order.mixed-completions",
            "WRITE, READ, SEND, FETCH_AND_ADD, WRITE complete in posting order with their opcodes",
            "IBA 10.8.6 (completions in order per send queue); man ibv_poll_cq",
            mixed
        ),
    ]
}

fn write_then_send<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let src = env.mr(&p.pd, 65536, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 65536, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let data = pattern(60000, 2);
    src.write(0, &data)?;
    src.write(60000, b"done")?;
    p.b.post_recv(&[RecvWr::new(1, &[dst.sge(60000, 64)?])])?;
    p.a.post_send(&[
        SendWr::write(1, &[src.sge(0, 60000)?], dst.remote().at(0)),
        SendWr::send(2, &[src.sge(60000, 4)?]).signaled(),
    ])?;
    let r = env.wait1(&p.cq_b)?;
    ensure!(r.is_ok(), "status {:?}", r.status);
    ensure!(
        read_back(&dst, 0, 60000)? == data,
        "WRITE data not visible when the SEND arrived"
    );
    ensure!(env.wait1(&p.cq_a)?.is_ok(), "send completion");
    Ok(Outcome::Pass)
}

fn fence<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let remote = env.mr(&p.pd, 65536, A::LOCAL_WRITE | A::REMOTE_READ | A::REMOTE_WRITE)?;
    let local = env.mr(&p.pd, 65536, A::LOCAL_WRITE)?;
    let data = pattern(32768, 90);
    remote.write(0, &data)?;
    // READ remote[0..32K] into local, then (fenced) WRITE local into remote[32K..64K].
    p.a.post_send(&[
        SendWr::read(1, &[local.sge(0, 32768)?], remote.remote().at(0)),
        SendWr::write(2, &[local.sge(0, 32768)?], remote.remote().at(32768))
            .fence()
            .signaled(),
    ])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure!(
        wc.is_ok() && wc.wr_id == 2,
        "completion {:?} {:?}",
        wc.wr_id,
        wc.status
    );
    ensure!(
        read_back(&remote, 32768, 32768)? == data,
        "the fenced WRITE did not carry the READ's data"
    );
    Ok(Outcome::Pass)
}

fn mixed<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 8192, A::ALL)?;
    p.b.post_recv(&[RecvWr::new(9, &[mr.sge(4096, 64)?])])?;
    let r = mr.remote();
    p.a.post_send(&[
        SendWr::write(1, &[mr.sge(0, 16)?], r.at(1024)).signaled(),
        SendWr::read(2, &[mr.sge(2048, 16)?], r.at(1024)).signaled(),
        SendWr::send(3, &[mr.sge(0, 16)?]).signaled(),
        SendWr::fetch_and_add(4, &[mr.sge(3000, 8)?], r.at(3072), 1).signaled(),
        SendWr::write(5, &[mr.sge(0, 16)?], r.at(1100)).signaled(),
    ])?;
    let wcs = env.wait(&p.cq_a, 5)?;
    let got: Vec<(u64, WcOpcode)> = wcs.iter().map(|w| (w.wr_id, w.opcode)).collect();
    ensure!(
        wcs.iter().all(|w| w.is_ok()),
        "statuses {:?}",
        wcs.iter().map(|w| w.status).collect::<Vec<_>>()
    );
    ensure_eq!(
        got,
        vec![
            (1, WcOpcode::RdmaWrite),
            (2, WcOpcode::RdmaRead),
            (3, WcOpcode::Send),
            (4, WcOpcode::FetchAdd),
            (5, WcOpcode::RdmaWrite)
        ],
        "completion order"
    );
    Ok(Outcome::Pass)
}
