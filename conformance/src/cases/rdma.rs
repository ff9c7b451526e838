//! One-sided RDMA WRITE and READ (IBA 9.4.2 / 9.4.4, `man ibv_post_send` (wr.rdma)).

use verbs_api::{AccessFlags as A, Backend, MemoryRegion, QueuePair, RecvWr, SendWr, WcOpcode, PSN_MASK};

use super::case;
use crate::env::{connect, pattern, read_back};
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Outcome};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "rdma.write",
            "RDMA WRITE of 1 B, 4095 B, 64 KiB and 1 MiB lands byte for byte; the responder sees no completion",
            "IBA 9.4.2; man ibv_post_send (IBV_WR_RDMA_WRITE)",
            write
        ),
        case!(
            "rdma.read",
            "RDMA READ of 1 B, 4095 B, 64 KiB and 1 MiB returns the remote bytes; byte_len is the length",
            "IBA 9.4.4; man ibv_post_send (IBV_WR_RDMA_READ)",
            read
        ),
        case!(
            "rdma.write-imm",
            "RDMA_WRITE_WITH_IMM writes the region and consumes one receive as RECV_RDMA_WITH_IMM with the immediate; the receive buffer is untouched",
            "IBA 9.4.2; man ibv_poll_cq (IBV_WC_RECV_RDMA_WITH_IMM)",
            write_imm
        ),
        case!("rdma.write-zero-length", "a zero-length RDMA WRITE completes successfully", "IBA 9.4.2 (zero-length RDMA)", write_zero),
        case!("rdma.read-scatter", "an RDMA READ scatters into three local SGEs", "man ibv_post_send (sg_list for READ)", read_scatter),
        case!(
            "rdma.write-gather",
            "an RDMA WRITE gathers from three local SGEs into one remote range",
            "man ibv_post_send (sg_list)",
            write_gather
        ),
        case!(
            "rdma.psn-per-packet",
            "a message takes one PSN per packet of the path MTU, from a first PSN two below the wrap: a WRITE of 4 MTUs 4, a SEND of 1.5 MTUs 2, a READ of 3 MTUs less a byte 3, a zero-length WRITE 1; sq_psn and rq_psn move by 10, modulo 2^24",
            "IBA 9.7.1 (PSNs per packet); man ibv_query_qp (sq_psn, rq_psn)",
            psn_per_packet
        ),
    ]
}

const SIZES: [usize; 4] = [1, 4095, 64 * 1024, 1 << 20];

fn write<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let src = env.mr(&p.pd, 1 << 20, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, (1 << 20) + 64, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    for (i, len) in SIZES.into_iter().enumerate() {
        let data = pattern(len, i as u8);
        src.write(0, &data)?;
        p.a.post_send(&[SendWr::write(i as u64, &[src.sge(0, len)?], dst.remote().at(64)).signaled()])?;
        let wc = env.wait1(&p.cq_a)?;
        ensure!(wc.is_ok(), "{len} B: status {:?}", wc.status);
        ensure_eq!(wc.opcode, WcOpcode::RdmaWrite, "opcode");
        ensure!(read_back(&dst, 64, len)? == data, "{len} B: written bytes differ");
    }
    ensure!(
        read_back(&dst, 0, 64)?.iter().all(|&b| b == 0),
        "bytes before the target range changed"
    );
    env.expect_empty(&p.cq_b, "the responder's CQ")?;
    Ok(Outcome::Pass)
}

fn read<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let remote = env.mr(&p.pd, 1 << 20, A::LOCAL_WRITE | A::REMOTE_READ)?;
    let sink = env.mr(&p.pd, 1 << 20, A::LOCAL_WRITE)?;
    for (i, len) in SIZES.into_iter().enumerate() {
        let data = pattern(len, 100 + i as u8);
        remote.write(0, &data)?;
        p.a.post_send(&[SendWr::read(i as u64, &[sink.sge(0, len)?], remote.remote().at(0)).signaled()])?;
        let wc = env.wait1(&p.cq_a)?;
        ensure!(wc.is_ok(), "{len} B: status {:?}", wc.status);
        ensure_eq!(wc.opcode, WcOpcode::RdmaRead, "opcode");
        ensure_eq!(wc.byte_len as usize, len, "byte_len");
        ensure!(read_back(&sink, 0, len)? == data, "{len} B: read bytes differ");
    }
    env.expect_empty(&p.cq_b, "the responder's CQ")?;
    Ok(Outcome::Pass)
}

fn write_imm<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let src = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let rbuf = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    let data = pattern(300, 8);
    src.write(0, &data)?;
    p.b.post_recv(&[RecvWr::new(77, &[rbuf.sge(0, 64)?])])?;
    p.a.post_send(&[
        SendWr::write_with_imm(1, &[src.sge(0, 300)?], dst.remote().at(100), 0x1234_5678).signaled(),
    ])?;
    let s = env.wait1(&p.cq_a)?;
    ensure!(s.is_ok(), "requester status {:?}", s.status);
    ensure_eq!(s.opcode, WcOpcode::RdmaWrite, "requester opcode");
    let r = env.wait1(&p.cq_b)?;
    ensure!(r.is_ok(), "responder status {:?}", r.status);
    ensure_eq!(r.wr_id, 77, "consumed receive");
    ensure_eq!(r.opcode, WcOpcode::RecvRdmaWithImm, "responder opcode");
    ensure_eq!(r.imm(), Some(0x1234_5678), "immediate");
    ensure_eq!(r.byte_len, 300, "byte_len");
    ensure_eq!(read_back(&dst, 100, 300)?, data, "written bytes");
    ensure!(
        rbuf.to_vec().iter().all(|&b| b == 0),
        "the receive buffer was written"
    );
    Ok(Outcome::Pass)
}

fn write_zero<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let dst = env.mr(&p.pd, 64, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    p.a.post_send(&[SendWr::write(1, &[], dst.remote().at(0)).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure!(wc.is_ok(), "status {:?}", wc.status);
    Ok(Outcome::Pass)
}

fn read_scatter<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let remote = env.mr(&p.pd, 8192, A::LOCAL_WRITE | A::REMOTE_READ)?;
    let sink = env.mr(&p.pd, 8192, A::LOCAL_WRITE)?;
    let data = pattern(3000, 21);
    remote.write(500, &data)?;
    let sges = [sink.sge(0, 1000)?, sink.sge(2000, 1000)?, sink.sge(5000, 1000)?];
    p.a.post_send(&[SendWr::read(1, &sges, remote.remote().at(500)).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure!(wc.is_ok(), "status {:?}", wc.status);
    let mut got = read_back(&sink, 0, 1000)?;
    got.extend(read_back(&sink, 2000, 1000)?);
    got.extend(read_back(&sink, 5000, 1000)?);
    ensure!(got == data, "scattered bytes differ");
    Ok(Outcome::Pass)
}

fn write_gather<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let src = env.mr(&p.pd, 8192, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 8192, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let data = pattern(2400, 33);
    src.write(0, &data[..800])?;
    src.write(3000, &data[800..1600])?;
    src.write(6000, &data[1600..])?;
    let sges = [src.sge(0, 800)?, src.sge(3000, 800)?, src.sge(6000, 800)?];
    p.a.post_send(&[SendWr::write(1, &sges, dst.remote().at(10)).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure!(wc.is_ok(), "status {:?}", wc.status);
    ensure!(read_back(&dst, 10, 2400)? == data, "gathered bytes differ");
    Ok(Outcome::Pass)
}

fn psn_per_packet<B: Backend>(env: &Env<B>) -> CaseResult {
    let o = env.opts();
    let mtu = o.a.path_mtu.bytes() as usize;
    let mut p = env.pair_unconnected(&o)?;
    // A's first PSN two below 2^24: the WRITE's packets wrap to 0.
    p.ep_a.psn = PSN_MASK - 1;
    connect(&p.a, &o.a, p.ep_a.psn, &p.ep_b)?;
    connect(&p.b, &o.b, p.ep_b.psn, &p.ep_a)?;
    let src = env.mr(&p.pd, 4 * mtu, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 4 * mtu, A::LOCAL_WRITE | A::REMOTE_WRITE | A::REMOTE_READ)?;
    let rbuf = env.mr(&p.pd, 2 * mtu, A::LOCAL_WRITE)?;
    let start = p.a.query()?.sq_psn;
    ensure_eq!(start, PSN_MASK - 1, "sq_psn before");
    ensure_eq!(p.b.query()?.rq_psn, PSN_MASK - 1, "rq_psn before");
    p.b.post_recv(&[RecvWr::new(9, &[rbuf.sge(0, 2 * mtu)?])])?;
    let sges = [
        src.sge(0, 4 * mtu)?,
        src.sge(0, mtu + mtu / 2)?,
        src.sge(0, 3 * mtu - 1)?,
    ];
    let steps: [(SendWr<'_>, u32); 4] = [
        (SendWr::write(1, &sges[0..1], dst.remote().at(0)).signaled(), 4),
        (SendWr::send(2, &sges[1..2]).signaled(), 2),
        (SendWr::read(3, &sges[2..3], dst.remote().at(0)).signaled(), 3),
        (SendWr::write(4, &[], dst.remote().at(0)).signaled(), 1),
    ];
    let mut psn = start;
    for (wr, packets) in &steps {
        p.a.post_send(std::slice::from_ref(wr))?;
        let wc = env.wait1(&p.cq_a)?;
        ensure!(wc.is_ok(), "wr {}: status {:?}", wc.wr_id, wc.status);
        psn = (psn + packets) & PSN_MASK;
        ensure_eq!(p.a.query()?.sq_psn, psn, "sq_psn after wr {}", wc.wr_id);
        ensure_eq!(p.b.query()?.rq_psn, psn, "rq_psn after wr {}", wc.wr_id);
    }
    ensure_eq!(psn, 8, "PSNs wrapped");
    Ok(Outcome::Pass)
}
