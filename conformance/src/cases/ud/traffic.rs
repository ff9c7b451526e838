//! UD delivery (`man ibv_post_recv`, `man ibv_poll_cq`): what arrives and how it is
//! named: the payload behind the 40 bytes of GRH and what those bytes hold, the sender's
//! QP number, several senders to one QP, a QP on a shared receive queue.

use verbs_api::{
    ah_attr_for, local_endpoint, AccessFlags as A, AddressHandle, Backend, Context, Gid, LinkLayer,
    MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair, RecvWr, SendWr, SharedReceiveQueue, SrqAttr,
    WcFlags, WcOpcode,
};

use super::{UdSetup, GRH, QKEY};
use crate::env::{pattern, read_back, ud_to_rts};
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome};

pub(super) fn ud_send_recv<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    let data = pattern(256, 5);
    u.src.write(0, &data)?;
    u.post(1, 0, 256)?;
    u.post(2, 4096, 64)?;
    u.send(env, 0, 10, 0, 256, QKEY)?;
    let wc = env.wait1(&u.cq_r)?;
    ensure!(wc.is_ok(), "receive: {:?}", wc.status);
    ensure_eq!(wc.wr_id, 1, "wr_id");
    ensure_eq!(wc.opcode, WcOpcode::Recv, "opcode");
    ensure_eq!(wc.byte_len as usize, GRH + 256, "byte_len (the GRH included)");
    ensure_eq!(wc.qp_num, u.r.qp_num(), "qp_num");
    ensure_eq!(wc.src_qp, u.s[0].qp_num(), "src_qp");
    ensure!(
        wc.wc_flags.contains(WcFlags::GRH),
        "IBV_WC_GRH missing: {:?}",
        wc.wc_flags
    );
    ensure!(
        !wc.wc_flags.contains(WcFlags::WITH_IMM),
        "flags {:?}",
        wc.wc_flags
    );
    ensure_eq!(read_back(&u.dst, GRH, 256)?, data, "payload after the GRH");
    if env.ctx.query_port(1)?.link_layer == LinkLayer::InfiniBand {
        ensure_eq!(wc.slid, u.ep_r.lid, "slid (the sender's port LID)");
    }
    u.s[0].post_send(&[SendWr::send_with_imm(11, &[u.src.sge(0, 32)?], 0x0bad_cafe)
        .signaled()
        .ud(&u.ah, u.r.qp_num(), QKEY)])?;
    ensure!(env.wait1(&u.cq_s)?.is_ok(), "SEND_WITH_IMM");
    let wc = env.wait1(&u.cq_r)?;
    ensure!(wc.is_ok() && wc.wr_id == 2, "receive of SEND_WITH_IMM: {wc:?}");
    ensure_eq!(wc.byte_len as usize, GRH + 32, "byte_len");
    ensure!(
        wc.wc_flags.contains(WcFlags::WITH_IMM | WcFlags::GRH),
        "flags {:?}",
        wc.wc_flags
    );
    ensure_eq!(wc.imm(), Some(0x0bad_cafe), "immediate");
    ensure_eq!(wc.src_qp, u.s[0].qp_num(), "src_qp");
    Ok(Outcome::Pass)
}

pub(super) fn ud_grh<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    u.dst.fill(0xee);
    u.src.write(0, b"behind the GRH")?;
    u.post(1, 0, 14)?;
    u.send(env, 0, 1, 0, 14, QKEY)?;
    let wc = env.wait1(&u.cq_r)?;
    ensure!(
        wc.is_ok() && wc.wc_flags.contains(WcFlags::GRH),
        "receive: {wc:?}"
    );
    let grh = read_back(&u.dst, 0, GRH)?;
    // Sender and receiver are on this device and port: both GIDs are the one at the
    // configured index.
    let gid: Gid = u.ep_r.gid;
    let port = env.ctx.query_port(1)?;
    match (port.link_layer, gid.to_ipv4_mapped()) {
        // RoCE v2 over IPv4 (rxe's `execute()` copies the received IP header).
        (LinkLayer::Ethernet, Some(ip)) => {
            ensure_eq!(
                grh[..20].to_vec(),
                vec![0u8; 20],
                "the 20 bytes before the IPv4 header"
            );
            let ipv4 = &grh[20..];
            ensure_eq!(ipv4[0], 0x45, "IPv4 version and header length");
            ensure_eq!(ipv4[9], 17, "IPv4 protocol (UDP)");
            ensure_eq!(ipv4[12..16].to_vec(), ip.octets().to_vec(), "IPv4 source address");
            ensure_eq!(
                ipv4[16..20].to_vec(),
                ip.octets().to_vec(),
                "IPv4 destination address"
            );
        }
        // RoCE v2 over IPv6: the IPv6 header, which has the GRH's layout.
        (LinkLayer::Ethernet, None) => {
            ensure_eq!(grh[0] >> 4, 6, "IP version");
            ensure_eq!(grh[6], 17, "next header (UDP)");
            ensure_eq!(grh[8..24].to_vec(), gid.0.to_vec(), "source GID");
            ensure_eq!(grh[24..40].to_vec(), gid.0.to_vec(), "destination GID");
        }
        // InfiniBand (the sim's port; "unspecified" is how older drivers report it): the
        // IB GRH of IBA 8.3.1, with the address handle's hop limit, and IBA's payload
        // length: BTH 12 + DETH 8 + the 14 bytes padded to 16 + ICRC 4.
        (LinkLayer::InfiniBand | LinkLayer::Unspecified, _) => {
            ensure_eq!(grh[0] >> 4, 6, "IPVer");
            ensure_eq!(u16::from_be_bytes([grh[4], grh[5]]), 40, "PayLen");
            ensure_eq!(grh[6], 0x1b, "NxtHdr (an IBA transport header)");
            ensure_eq!(grh[7], u.ah.attr().grh.hop_limit, "HopLmt");
            ensure_eq!(grh[8..24].to_vec(), gid.0.to_vec(), "source GID");
            ensure_eq!(grh[24..40].to_vec(), gid.0.to_vec(), "destination GID");
        }
    }
    ensure_eq!(read_back(&u.dst, GRH, 14)?, b"behind the GRH".to_vec(), "payload");
    if port.link_layer != LinkLayer::Ethernet {
        // On InfiniBand a packet has a GRH only when its sender's address vector has one:
        // through a handle without it the 40 bytes are not written and not flagged (on
        // RoCE every handle has the GRH: see ud.ah).
        let local = u.pd.create_ah(&verbs_api::AhAttr {
            is_global: false,
            ..u.ah.attr()
        })?;
        u.dst.fill(0xee);
        u.post(2, 0, 14)?;
        u.s[0].post_send(&[SendWr::send(2, &[u.src.sge(0, 14)?]).signaled().ud(
            &local,
            u.r.qp_num(),
            QKEY,
        )])?;
        ensure!(
            env.wait1(&u.cq_s)?.is_ok(),
            "the send through a handle without the GRH"
        );
        let wc = env.wait1(&u.cq_r)?;
        ensure!(wc.is_ok() && wc.wr_id == 2, "receive: {wc:?}");
        ensure_eq!(wc.byte_len as usize, GRH + 14, "byte_len (the 40 bytes counted)");
        ensure!(
            !wc.wc_flags.contains(WcFlags::GRH),
            "IBV_WC_GRH without a GRH: {:?}",
            wc.wc_flags
        );
        ensure_eq!(
            read_back(&u.dst, 0, GRH)?,
            vec![0xee; GRH],
            "the 40 bytes of a datagram without a GRH"
        );
        ensure_eq!(read_back(&u.dst, GRH, 14)?, b"behind the GRH".to_vec(), "payload");
    }
    Ok(Outcome::Pass)
}

pub(super) fn ud_two_senders<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 2)?;
    u.src.write(0, b"from s0")?;
    u.src.write(64, b"from s1")?;
    u.post(1, 0, 64)?;
    u.post(2, 1024, 64)?;
    u.send(env, 0, 10, 0, 7, QKEY)?;
    u.send(env, 1, 11, 64, 7, QKEY)?;
    let wcs = env.wait(&u.cq_r, 2)?;
    ensure!(wcs.iter().all(|w| w.is_ok()), "receives: {wcs:?}");
    ensure!(
        u.s[0].qp_num() != u.s[1].qp_num(),
        "the two senders share a QP number"
    );
    for wc in &wcs {
        let offset = if wc.wr_id == 1 { 0 } else { 1024 };
        let payload = read_back(&u.dst, offset + GRH, 7)?;
        let sender = match payload.as_slice() {
            b"from s0" => 0,
            b"from s1" => 1,
            other => return Err(Failure(format!("receive {}: payload {other:?}", wc.wr_id))),
        };
        ensure_eq!(
            wc.src_qp,
            u.s[sender].qp_num(),
            "src_qp of the datagram from s{sender}"
        );
    }
    Ok(Outcome::Pass)
}

pub(super) fn ud_srq<B: Backend>(env: &Env<B>) -> CaseResult {
    let params = env.params();
    let pd = env.ctx.alloc_pd()?;
    let srq = pd.create_srq(&SrqAttr::new(16, 1))?;
    let cq_s = env.ctx.create_cq(16, None)?;
    let cq_r = env.ctx.create_cq(16, None)?;
    let cap = env.opts().cap;
    let s = pd.create_qp(&QpInitAttr::ud(&cq_s, &cq_s, cap))?;
    let r = pd.create_qp(&QpInitAttr::ud(&cq_r, &cq_r, cap).with_srq(&srq))?;
    ud_to_rts(&s, &params, QKEY, 1)?;
    ud_to_rts(&r, &params, QKEY, 2)?;
    let ep = local_endpoint(&env.ctx, &r, &params, 0)?;
    let ah = pd.create_ah(&ah_attr_for(&ep, &params))?;
    let src = pd.reg_mr(4096, A::LOCAL_WRITE)?;
    let dst = pd.reg_mr(4096, A::LOCAL_WRITE)?;
    src.write(0, b"via the SRQ")?;
    srq.post_recv(&[RecvWr::new(9, &[dst.sge(0, GRH + 64)?])])?;
    s.post_send(&[SendWr::send(1, &[src.sge(0, 11)?])
        .signaled()
        .ud(&ah, r.qp_num(), QKEY)])?;
    ensure!(env.wait1(&cq_s)?.is_ok(), "UD SEND");
    let wc = env.wait1(&cq_r)?;
    ensure!(wc.is_ok() && wc.wr_id == 9, "receive: {wc:?}");
    ensure_eq!(wc.qp_num, r.qp_num(), "qp_num");
    ensure_eq!(wc.src_qp, s.qp_num(), "src_qp");
    ensure_eq!(wc.byte_len as usize, GRH + 11, "byte_len");
    ensure_eq!(read_back(&dst, GRH, 11)?, b"via the SRQ".to_vec(), "payload");
    Ok(Outcome::Pass)
}
