//! What a UD QP drops or refuses to deliver (IBA 10.2.5, C10-93.1.1; `man
//! ibv_query_port` qkey_viol_cntr): a wrong Q_Key, the Q_Key a send WR's high bit
//! replaces, a datagram that finds no receive, a receive too short, a send above the MTU.

use verbs_api::{Backend, Context, MemoryRegion, QpState, QueuePair, WcStatus};

use super::{UdSetup, GRH, QKEY, QUIET};
use crate::env::{pattern, read_back};
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome, Profile};

pub(super) fn ud_qkey_high_bit<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    u.src.write(0, b"own")?;
    u.src.write(64, b"next")?;
    u.post(1, 0, 64)?;
    u.post(2, 4096, 64)?;
    // The sender's Q_Key is QKEY, the receiver's too: sent as "the QP's own", it matches.
    u.send(env, 0, 1, 0, 3, 0x8000_0000)?;
    let first = env.quiet(&u.cq_r, QUIET)?;
    env.observe(
        "datagram sent with remote_qkey 0x80000000",
        if first.is_empty() { "dropped" } else { "delivered" },
    );
    match first.as_slice() {
        [wc] => {
            ensure!(wc.is_ok() && wc.wr_id == 1, "its receive: {wc:?}");
            ensure_eq!(read_back(&u.dst, GRH, 3)?, b"own".to_vec(), "payload");
        }
        [] if env.profile == Profile::Rxe => env.deviation(
            "rxe sends the WR's remote_qkey as it is (rxe_req.c init_req_packet(): \
             deth_set_qkey(pkt, ibwr->wr.ud.remote_qkey)), so the receiver's Q_Key check drops it",
        ),
        [] => {
            return Err(Failure(
                "the datagram sent with remote_qkey 0x80000000 was dropped".into(),
            ))
        }
        more => {
            return Err(Failure(format!(
                "{} completions for one datagram: {more:?}",
                more.len()
            )))
        }
    }
    // The receiver still works with the plain Q_Key.
    u.send(env, 0, 2, 64, 4, QKEY)?;
    let wc = env.wait1(&u.cq_r)?;
    ensure!(wc.is_ok(), "the datagram sent with QKEY: {wc:?}");
    Ok(Outcome::Pass)
}

pub(super) fn ud_wrong_qkey<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    u.src.write(0, b"wrong")?;
    u.src.write(64, b"right")?;
    u.post(1, 0, 64)?;
    let before = env.ctx.query_port(1)?.qkey_viol_cntr;
    // Bit 31 clear: a plain Q_Key, not "use the QP's own".
    u.send(env, 0, 1, 0, 5, QKEY ^ 0x00ff_0000)?;
    env.settle(QUIET)?;
    env.expect_empty(&u.cq_r, "the receiver's CQ after a datagram with the wrong Q_Key")?;
    let after = env.ctx.query_port(1)?.qkey_viol_cntr;
    // The counter is 16 bits wide and saturates (IBA PortInfo Q_KeyViolations).
    ensure!(
        after > before || before >= 0xffff,
        "qkey_viol_cntr {before} -> {after}: the violation was not counted"
    );
    u.send(env, 0, 2, 64, 5, QKEY)?;
    let wc = env.wait1(&u.cq_r)?;
    ensure!(
        wc.is_ok() && wc.wr_id == 1,
        "receive with the right Q_Key: {wc:?}"
    );
    ensure_eq!(
        read_back(&u.dst, GRH, 5)?,
        b"right".to_vec(),
        "payload (not the dropped datagram)"
    );
    Ok(Outcome::Pass)
}

pub(super) fn ud_empty_rq<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    u.src.write(0, b"dropped")?;
    u.src.write(64, b"second")?;
    u.send(env, 0, 1, 0, 7, QKEY)?;
    env.settle(QUIET)?;
    env.expect_empty(
        &u.cq_r,
        "the receiver's CQ after a datagram with no receive posted",
    )?;
    ensure_eq!(u.r.state()?, QpState::Rts, "the receiver's state");
    u.post(2, 0, 64)?;
    u.send(env, 0, 3, 64, 6, QKEY)?;
    let wc = env.wait1(&u.cq_r)?;
    ensure!(wc.is_ok() && wc.wr_id == 2, "receive: {wc:?}");
    ensure_eq!(wc.byte_len as usize, GRH + 6, "byte_len (the second datagram)");
    ensure_eq!(read_back(&u.dst, GRH, 6)?, b"second".to_vec(), "payload");
    Ok(Outcome::Pass)
}

/// rxe fails the receive as malformed and moves the QP to ERR.
const RXE_UD_TOO_SMALL: &str = "rxe's copy_data() returns -EINVAL when the datagram and its 40 bytes of GRH exceed the \
receive's SGEs (rxe_mr.c), send_data_in() reports RESPST_ERR_MALFORMED_WQE, completed as LOC_QP_OP_ERR, and the QP \
goes to ERR (rxe_resp.c)";

pub(super) fn ud_recv_too_small<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    u.dst.fill(0xee);
    u.src.write(0, &pattern(100, 3))?;
    // Room for the GRH and 10 bytes, at 1024 of a buffer watched on both sides.
    u.post(1, 1024, 10)?;
    u.send(env, 0, 1, 0, 100, QKEY)?;
    let wc = env.wait1(&u.cq_r)?;
    ensure_eq!(wc.wr_id, 1, "wr_id");
    env.expect_status(
        "receive",
        &wc,
        WcStatus::LocLenErr,
        &[(Profile::Rxe, WcStatus::LocQpOpErr, RXE_UD_TOO_SMALL)],
    )?;
    let all = u.dst.to_vec();
    ensure!(
        all[..1024]
            .iter()
            .chain(&all[1024 + GRH + 10..])
            .all(|&b| b == 0xee),
        "bytes outside the receive's buffer were written"
    );
    Ok(Outcome::Pass)
}

pub(super) fn ud_too_large<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    let mtu = env.ctx.query_port(1)?.active_mtu.bytes() as usize;
    ensure!(
        GRH + mtu < u.dst.len(),
        "an MTU of {mtu} does not fit the buffers"
    );
    let data = pattern(mtu + 1, 17);
    u.src.write(0, &data)?;
    u.post(1, 0, mtu + 1)?;
    u.send(env, 0, 1, 0, mtu + 1, QKEY)?;
    env.settle(QUIET)?;
    env.expect_empty(
        &u.cq_r,
        &format!(
            "the receiver's CQ after a datagram of {} bytes (MTU {mtu})",
            mtu + 1
        ),
    )?;
    u.send(env, 0, 2, 0, mtu, QKEY)?;
    let wc = env.wait1(&u.cq_r)?;
    ensure!(
        wc.is_ok() && wc.wr_id == 1,
        "receive of an MTU-sized datagram: {wc:?}"
    );
    ensure_eq!(wc.byte_len as usize, GRH + mtu, "byte_len");
    ensure_eq!(read_back(&u.dst, GRH, mtu)?, data[..mtu].to_vec(), "payload");
    Ok(Outcome::Pass)
}
