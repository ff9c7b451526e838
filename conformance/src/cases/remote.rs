//! Two hosts: SEND/RECV, RDMA WRITE and READ, atomics and a bad rkey between QPs on two
//! devices that reach each other over the network, each case in two halves (see
//! [`peer`](crate::peer)): run with `--peer HOST:PORT` against a runner started with
//! `--serve`, or without a peer against a second context in this process.

use verbs_api::{
    AccessFlags as A, AtomicCap, Backend, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair,
    RecvWr, SendWr, WcOpcode, WcStatus,
};

use super::case;
use crate::env::{pattern, read_back};
use crate::peer::{self, ClientSide, ServerHalf, ServerSide};
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Failure, Outcome};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "remote.send",
            "SEND and SEND_WITH_IMM to a QP on another device land in its posted receives in order, bytes and immediates intact; each side's endpoint names a reachable GID",
            "IBA 9.4.1; man ibv_post_send, ibv_post_recv",
            send
        ),
        case!(
            "remote.write-read",
            "RDMA WRITE into the other device's region lands there (the server checks its memory); RDMA READ returns it",
            "IBA 9.4.2 / 9.4.4; man ibv_post_send (wr.rdma)",
            write_read
        ),
        case!(
            "remote.atomic",
            "FETCH_AND_ADD and CMP_AND_SWP on the other device's region return the old values; the server sees the final value",
            "IBA 9.4.5; man ibv_post_send (wr.atomic)",
            atomic
        ),
        case!(
            "remote.bad-rkey",
            "an RDMA WRITE with a wrong rkey to the other device completes with REM_ACCESS_ERR and changes nothing there",
            "IBA 9.7.5.2.8 (remote access error); man ibv_poll_cq",
            bad_rkey
        ),
    ]
}

/// The server half of each case, by id.
pub fn halves<B: Backend>(id: &str) -> Option<ServerHalf<B>> {
    Some(match id {
        "remote.send" => send_server::<B>,
        "remote.write-read" | "remote.bad-rkey" => memory_server::<B>,
        "remote.atomic" => atomic_server::<B>,
        _ => return None,
    })
}

/// Runs `client` on a fresh QP of `env`'s device against the server half of `id`.
fn run<B: Backend, T>(
    env: &Env<B>,
    id: &str,
    client: impl FnOnce(&B::Pd, &B::Qp, &B::Cq, &mut ClientSide) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(256, None)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, peer::cap()))?;
    let p = peer::params(env.cfg);
    peer::run_client(env, &qp, &p, id, halves::<B>, |side| client(&pd, &qp, &cq, side))
}

const MSGS: u64 = 32;
const MSG: usize = 256;

fn send<B: Backend>(env: &Env<B>) -> CaseResult {
    let gid = env.ctx.query_gid(1, env.cfg.gid_index as u32)?;
    run(env, "remote.send", |pd, qp, cq, side| {
        ensure!(
            !side.peer.gid.is_zero()
                && side.peer.gid.to_ipv6().to_ipv4_mapped() != Some(std::net::Ipv4Addr::UNSPECIFIED),
            "the peer's GID {:?} names no address",
            side.peer.gid
        );
        side.link.expect("posted")?;
        let src = pd.reg_mr(MSG * MSGS as usize, A::LOCAL_WRITE)?;
        for i in 0..MSGS {
            let off = i as usize * MSG;
            src.write(off, &pattern(MSG, i as u8))?;
            let sge = [src.sge(off, MSG)?];
            let wr = match i % 2 {
                0 => SendWr::send(i, &sge),
                _ => SendWr::send_with_imm(i, &sge, 0x5eed_0000 | i as u32),
            };
            qp.post_send(&[wr.signaled()])?;
        }
        let wcs =
            verbs_api::poll_n(cq, MSGS as usize, env.cfg.timeout).map_err(|e| Failure(e.to_string()))?;
        for (i, wc) in wcs.iter().enumerate() {
            ensure_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success), "SEND {i}");
        }
        side.link.say(&format!("gid {}", hex(&gid.0)))?;
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

fn send_server<B: Backend>(s: &mut ServerSide<B>) -> Result<(), Failure> {
    let pd_mr = s.mr;
    for i in 0..MSGS {
        s.qp.post_recv(&[RecvWr::new(i, &[pd_mr.sge(i as usize * MSG, MSG)?])])?;
    }
    s.link.say("posted")?;
    let wcs = verbs_api::poll_n(s.cq, MSGS as usize, s.timeout).map_err(|e| Failure(e.to_string()))?;
    for (i, wc) in wcs.iter().enumerate() {
        let i = i as u64;
        ensure_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (i, WcStatus::Success, WcOpcode::Recv),
            "receive {i}"
        );
        ensure_eq!(wc.byte_len as usize, MSG, "receive {i}: byte_len");
        let imm = (i % 2 == 1).then_some(0x5eed_0000 | i as u32);
        ensure_eq!(wc.imm(), imm, "receive {i}: immediate");
        ensure!(
            read_back(s.mr, i as usize * MSG, MSG)? == pattern(MSG, i as u8),
            "receive {i}: the bytes differ from what was sent"
        );
    }
    // The client's endpoint named the GID its own device reports.
    let said = s.link.hear()?;
    ensure_eq!(said, format!("gid {}", hex(&s.peer.gid.0)), "the client's GID");
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn write_read<B: Backend>(env: &Env<B>) -> CaseResult {
    run(env, "remote.write-read", |pd, qp, cq, side| {
        let len = 48 * 1024;
        let data = pattern(len, 0x42);
        let src = pd.reg_mr(2 * len, A::LOCAL_WRITE)?;
        src.write(0, &data)?;
        qp.post_send(&[SendWr::write(1, &[src.sge(0, len)?], side.mr.at(512)).signaled()])?;
        let wc = env.wait1(cq)?;
        ensure_eq!((wc.wr_id, wc.status), (1, WcStatus::Success), "WRITE");
        side.link.say(&format!("check 512 {len} 66"))?;
        side.link.expect("checked")?;
        qp.post_send(&[SendWr::read(2, &[src.sge(len, len)?], side.mr.at(512)).signaled()])?;
        let wc = env.wait1(cq)?;
        ensure_eq!(
            (wc.wr_id, wc.status, wc.byte_len as usize),
            (2, WcStatus::Success, len),
            "READ"
        );
        ensure!(
            read_back(&src, len, len)? == data,
            "the READ returned other bytes"
        );
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

/// Checks regions on request: `check OFF LEN SEED` (the pattern is there, the rest of
/// the region is zero) or `zero` (nothing changed); answers `checked` or fails.
fn memory_server<B: Backend>(s: &mut ServerSide<B>) -> Result<(), Failure> {
    let msg = s.link.hear()?;
    let w: Vec<&str> = msg.split(' ').collect();
    let all = read_back(s.mr, 0, peer::SERVER_MR)?;
    match w.as_slice() {
        ["check", off, len, seed] => {
            let parse = |v: &str| {
                v.parse::<usize>()
                    .map_err(|_| Failure(format!("bad request {msg:?}")))
            };
            let (off, len, seed) = (parse(off)?, parse(len)?, parse(seed)? as u8);
            ensure!(
                all[off..off + len] == pattern(len, seed)[..],
                "the WRITE did not land as sent"
            );
            ensure!(
                all[..off].iter().chain(&all[off + len..]).all(|&b| b == 0),
                "bytes outside the written range changed"
            );
        }
        ["zero"] => ensure!(all.iter().all(|&b| b == 0), "the region changed"),
        _ => return Err(Failure(format!("bad request {msg:?}"))),
    }
    s.link.say("checked")
}

fn atomic<B: Backend>(env: &Env<B>) -> CaseResult {
    if env.ctx.capabilities()?.atomic_cap == AtomicCap::None {
        return Ok(Outcome::Skip(
            crate::report::Lack::Atomics,
            "the device reports IBV_ATOMIC_NONE".into(),
        ));
    }
    run(env, "remote.atomic", |pd, qp, cq, side| {
        side.link.expect("ready")?;
        let old = pd.reg_mr(8 * 17, A::LOCAL_WRITE)?;
        for i in 0..16u64 {
            qp.post_send(&[
                SendWr::fetch_and_add(i, &[old.sge(8 * i as usize, 8)?], side.mr.at(64), 3).signaled(),
            ])?;
            let wc = env.wait1(cq)?;
            ensure_eq!((wc.wr_id, wc.status), (i, WcStatus::Success), "FETCH_AND_ADD {i}");
            ensure_eq!(
                old.read_u64(8 * i as usize)?,
                1000 + 3 * i,
                "FETCH_AND_ADD {i}: old value"
            );
        }
        qp.post_send(&[SendWr::cmp_and_swp(16, &[old.sge(128, 8)?], side.mr.at(64), 1048, 7).signaled()])?;
        let wc = env.wait1(cq)?;
        ensure_eq!((wc.wr_id, wc.status), (16, WcStatus::Success), "CMP_AND_SWP");
        ensure_eq!(old.read_u64(128)?, 1048, "CMP_AND_SWP: old value");
        side.link.say("done")?;
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

fn atomic_server<B: Backend>(s: &mut ServerSide<B>) -> Result<(), Failure> {
    s.mr.write_u64(64, 1000)?;
    s.link.say("ready")?;
    s.link.expect("done")?;
    ensure_eq!(
        s.mr.read_u64(64)?,
        7,
        "the word after 16 FETCH_AND_ADDs of 3 and a CMP_AND_SWP"
    );
    Ok(())
}

fn bad_rkey<B: Backend>(env: &Env<B>) -> CaseResult {
    run(env, "remote.bad-rkey", |pd, qp, cq, side| {
        let src = pd.reg_mr(64, A::LOCAL_WRITE)?;
        src.write(0, &[0xab; 64])?;
        let mut wrong = side.mr;
        wrong.rkey ^= 0x0100_0000;
        qp.post_send(&[SendWr::write(1, &[src.sge(0, 64)?], wrong.at(0)).signaled()])?;
        let wc = env.wait1(cq)?;
        ensure_eq!(
            (wc.wr_id, wc.status),
            (1, WcStatus::RemAccessErr),
            "WRITE with a wrong rkey"
        );
        ensure_eq!(qp.state()?, verbs_api::QpState::Err, "the requester's QP state");
        side.link.say("zero")?;
        side.link.expect("checked")?;
        Ok(())
    })?;
    Ok(Outcome::Pass)
}
