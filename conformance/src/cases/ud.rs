//! Unreliable datagrams (`man ibv_create_ah`, `man ibv_post_send` (wr.ud), `man
//! ibv_post_recv` (the 40-byte GRH), `man ibv_modify_qp` for IBV_QPT_UD; rdma-core
//! tests/test_qp.py test_modify_ud_qp and the UD traffic of tests/utils.py): datagrams of
//! at most one MTU to any QP an address handle reaches, checked by Q_Key, named by the
//! sender's QP number, dropped silently when they cannot be delivered.
//!
//! The traffic cases send from UD QPs `s[i]` (one CQ) to one UD QP `r` (its own CQ) of the
//! same device, through an address handle built from `r`'s endpoint (with the GRH: the
//! GID is never zero). Where RoCE and InfiniBand differ (what the 40 bytes of GRH hold,
//! whether a handle may lack the GRH), a case branches on the port's link layer: rxe is
//! RoCE (Ethernet), the sim's port InfiniBand.

use std::time::Duration;

use verbs_api::{
    ah_attr_for, local_endpoint, AccessFlags as A, AddressHandle, Backend, Context, Endpoint, Gid, LinkLayer,
    MemoryRegion, ProtectionDomain, QpAttr, QpAttrMask as M, QpInitAttr, QpState, QpType, QueuePair, RecvWr,
    SendWr, Sge, SharedReceiveQueue, SrqAttr, WcFlags, WcOpcode, WcStatus,
};

use super::{case, send_error};
use crate::env::{pattern, read_back, ud_to_rts};
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome, Profile};

pub fn list<B: Backend>() -> Vec<crate::Case<B>> {
    vec![
        case!(
            "ud.send-recv",
            "SEND and SEND_WITH_IMM through an address handle: payload after 40 bytes, byte_len with them, src_qp, GRH flag",
            "man ibv_post_recv (GRH in the first 40 bytes); man ibv_poll_cq (src_qp, IBV_WC_GRH); rdma-core tests/utils.py (UD traffic)",
            ud_send_recv,
            requires [Ud]
        ),
        case!(
            "ud.grh",
            "the 40 bytes before a UD payload hold the GRH: on RoCE over IPv4 20 zero bytes and the IPv4 header, over IPv6 the IPv6 header; on InfiniBand the IB GRH, only from a sender whose address handle has one",
            "man ibv_post_recv; IBA vol. 1 8.3 (GRH: IPVer 6, NxtHdr 0x1B, a GRH only with one in the address vector); RoCE v2 (Annex A17: the IP header in the 40 bytes)",
            ud_grh,
            requires [Ud]
        ),
        case!(
            "ud.wrong-qkey",
            "a datagram with the wrong Q_Key is dropped and counted in the port's qkey_viol_cntr",
            "IBA vol. 1, Q_Key check of UD datagrams; man ibv_query_port (qkey_viol_cntr)",
            ud_wrong_qkey,
            requires [Ud]
        ),
        case!(
            "ud.qkey-high-bit",
            "a send WR whose remote_qkey has the high bit set sends the QP's own Q_Key",
            "IBA 10.2.5 (a Q_Key with the high-order bit set in a send WR: the QP's Q_Key is used)",
            ud_qkey_high_bit,
            requires [Ud]
        ),
        case!(
            "ud.empty-rq",
            "a datagram that finds no receive is dropped: the sender completes SUCCESS and nothing arrives",
            "man ibv_post_recv; IBA vol. 1 (UD: no receive WQE, the datagram is silently dropped)",
            ud_empty_rq,
            requires [Ud]
        ),
        case!(
            "ud.recv-too-small",
            "a UD receive too short for the 40 bytes and the datagram completes with LOC_LEN_ERR and nothing is written past it; the sender completes SUCCESS",
            "man ibv_poll_cq (IBV_WC_LOC_LEN_ERR); IBA vol. 1 10.7.2.2 (a message longer than the receive WQE is a local length error)",
            ud_recv_too_small,
            requires [Ud]
        ),
        case!(
            "ud.too-large",
            "a UD send longer than the port's MTU completes SUCCESS and nothing arrives; one of exactly the MTU arrives",
            "IBA C10-93.1.1 (no packet is emitted and no error is generated for a UD message above the MTU)",
            ud_too_large,
            requires [Ud]
        ),
        case!(
            "ud.two-senders",
            "one UD QP receiving from two senders tells them apart by src_qp",
            "man ibv_poll_cq (src_qp: the remote QP number, UD only)",
            ud_two_senders,
            requires [Ud]
        ),
        case!(
            "ud.modify-masks",
            "UD modify_qp: INIT needs PKEY_INDEX, PORT and QKEY; RTR only the state; RTS SQ_PSN; RC's attributes refused",
            "man ibv_modify_qp (UD); rdma-core tests/test_qp.py test_modify_ud_qp",
            ud_modify_masks,
            requires [Ud]
        ),
        case!(
            "ud.opcode-write",
            "an RDMA WRITE on a UD QP is refused (EINVAL): UD has SEND only",
            "man ibv_post_send (opcode table: UD takes SEND and SEND_WITH_IMM)",
            ud_opcode_write,
            requires [Ud]
        ),
        case!(
            "ud.destination",
            "a send on a UD QP without a destination, or one with a destination on an RC QP, fails with EINVAL",
            "man ibv_post_send (wr.ud: ah, remote_qpn, remote_qkey are for UD QPs)",
            ud_destination,
            requires [Ud]
        ),
        case!(
            "ud.ah",
            "create_ah keeps its attributes; on an Ethernet (RoCE) port an address handle without the GRH fails with EINVAL",
            "man ibv_create_ah (is_global required where the port requires the GRH)",
            ud_ah,
            requires [Ud]
        ),
        case!(
            "ud.send-error",
            "a UD SEND with a bad lkey fails (LOC_PROT_ERR), the QP goes to SQE: the SEND behind it and those posted later are flushed, datagrams are still received, SQE -> RTS sends again",
            "IBA 10.3.1 (SQE: send queue error of UC and UD QPs); man ibv_modify_qp (IBV_QPS_SQE -> IBV_QPS_RTS); Linux ipoib_ib.c ipoib_qp_state_validate_work()",
            ud_send_error,
            requires [Ud]
        ),
        case!(
            "ud.srq",
            "a UD QP on an SRQ receives datagrams into the SRQ's receives, naming itself and the sender",
            "man ibv_create_srq (SRQs for RC and UD QPs); man ibv_poll_cq (qp_num, src_qp)",
            ud_srq,
            requires [Ud, Srq]
        ),
        case!(
            "ud.ah-udp-hint",
            "an address handle with UCX's RoCE hints reaches its QP: a flow label of all 32 bits set (the GRH holds its low 20) and, on an Ethernet (RoCE) port, a DLID of 0xC000 (ignored: the GID names the peer)",
            "IBA 8.3.1 (FlowLabel: 20 bits); rdma-core providers/mlx5 mlx5_create_ah (IB_GRH_FLOWLABEL_MASK); the kernel's rdma_ah_set_dlid (no DLID in a RoCE address); UCX uct_ib_iface_fill_ah_attr_from_gid_lid",
            ud_ah_udp_hint,
            requires [Ud]
        ),
    ]
}

/// The Q_Key of every UD QP here (rdma-core tests/base.py's UD_QKEY).
pub(super) const QKEY: u32 = 0x1111_1111;
/// Bytes of the GRH at the start of every UD receive buffer.
pub(super) const GRH: usize = 40;
/// How long "nothing happens" is watched for.
pub(super) const QUIET: Duration = Duration::from_millis(300);

/// UD senders `s[i]` and a receiver `r`, all in RTS with [`QKEY`], and an address handle
/// that reaches `r`.
pub(super) struct UdSetup<B: Backend> {
    pub(super) pd: B::Pd,
    pub(super) cq_s: B::Cq,
    pub(super) cq_r: B::Cq,
    pub(super) s: Vec<B::Qp>,
    pub(super) r: B::Qp,
    /// `r`'s endpoint (GID, LID, QPN).
    pub(super) ep_r: Endpoint,
    pub(super) ah: B::Ah,
    /// Send buffers (16 KiB).
    pub(super) src: B::Mr,
    /// Receive buffers (16 KiB).
    pub(super) dst: B::Mr,
}

impl<B: Backend> UdSetup<B> {
    pub(super) fn new(env: &Env<B>, senders: usize) -> Result<Self, Failure> {
        let params = env.params();
        let pd = env.ctx.alloc_pd()?;
        let cq_s = env.ctx.create_cq(64, None)?;
        let cq_r = env.ctx.create_cq(64, None)?;
        let cap = env.opts().cap;
        let mut s = Vec::new();
        for i in 0..senders {
            let q = pd.create_qp(&QpInitAttr::ud(&cq_s, &cq_s, cap))?;
            ud_to_rts(&q, &params, QKEY, 0x10 + i as u32)?;
            s.push(q);
        }
        let r = pd.create_qp(&QpInitAttr::ud(&cq_r, &cq_r, cap))?;
        ensure_eq!(r.qp_type(), QpType::Ud, "qp_type");
        ud_to_rts(&r, &params, QKEY, 0x20)?;
        let ep_r = local_endpoint(&env.ctx, &r, &params, 0)?;
        let ah = pd.create_ah(&ah_attr_for(&ep_r, &params))?;
        let src = pd.reg_mr(16384, A::LOCAL_WRITE)?;
        let dst = pd.reg_mr(16384, A::LOCAL_WRITE)?;
        Ok(UdSetup {
            pd,
            cq_s,
            cq_r,
            s,
            r,
            ep_r,
            ah,
            src,
            dst,
        })
    }

    /// Posts receive `wr_id` of [`GRH`] + `len` bytes at `offset` of `dst`.
    pub(super) fn post(&self, wr_id: u64, offset: usize, len: usize) -> Result<(), Failure> {
        self.r
            .post_recv(&[RecvWr::new(wr_id, &[self.dst.sge(offset, GRH + len)?])])?;
        Ok(())
    }

    /// Sends `len` bytes at `offset` of `src` from `s[i]` to `r` with `qkey`, and waits
    /// for the sender's completion, which must be SUCCESS.
    fn send(
        &self,
        env: &Env<B>,
        i: usize,
        wr_id: u64,
        offset: usize,
        len: usize,
        qkey: u32,
    ) -> Result<(), Failure> {
        self.s[i].post_send(
            &[SendWr::send(wr_id, &[self.src.sge(offset, len)?]).signaled().ud(
                &self.ah,
                self.r.qp_num(),
                qkey,
            )],
        )?;
        let wc = env.wait1(&self.cq_s)?;
        ensure!(
            wc.wr_id == wr_id && wc.status == WcStatus::Success && wc.opcode == WcOpcode::Send,
            "the sender's completion of datagram {wr_id}: {wc:?}"
        );
        Ok(())
    }
}

fn ud_send_recv<B: Backend>(env: &Env<B>) -> CaseResult {
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

fn ud_grh<B: Backend>(env: &Env<B>) -> CaseResult {
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

fn ud_qkey_high_bit<B: Backend>(env: &Env<B>) -> CaseResult {
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

fn ud_wrong_qkey<B: Backend>(env: &Env<B>) -> CaseResult {
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

fn ud_empty_rq<B: Backend>(env: &Env<B>) -> CaseResult {
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

fn ud_recv_too_small<B: Backend>(env: &Env<B>) -> CaseResult {
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

fn ud_too_large<B: Backend>(env: &Env<B>) -> CaseResult {
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

fn ud_two_senders<B: Backend>(env: &Env<B>) -> CaseResult {
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

fn ud_modify_masks<B: Backend>(env: &Env<B>) -> CaseResult {
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

fn ud_opcode_write<B: Backend>(env: &Env<B>) -> CaseResult {
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
fn ud_send_error<B: Backend>(env: &Env<B>) -> CaseResult {
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

fn ud_destination<B: Backend>(env: &Env<B>) -> CaseResult {
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

fn ud_ah<B: Backend>(env: &Env<B>) -> CaseResult {
    let params = env.params();
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16, None)?;
    let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq, env.opts().cap))?;
    let ep = local_endpoint(&env.ctx, &qp, &params, 0)?;
    let attr = ah_attr_for(&ep, &params);
    let ah = pd.create_ah(&attr)?;
    ensure_eq!(ah.attr(), attr, "attr() of the address handle");
    let local = verbs_api::AhAttr {
        is_global: false,
        ..attr
    };
    let port = env.ctx.query_port(1)?;
    match (port.link_layer, pd.create_ah(&local)) {
        (LinkLayer::Ethernet, Ok(_)) => {
            return Err(Failure(
                "an address handle without the GRH was created on an Ethernet (RoCE) port".into(),
            ))
        }
        (LinkLayer::Ethernet, Err(e)) => {
            ensure_eq!(e.errno(), libc::EINVAL, "create_ah without the GRH on RoCE ({e})")
        }
        (_, Ok(ah)) => ensure_eq!(ah.attr(), local, "attr() of a local address handle"),
        (_, Err(e)) => {
            return Err(Failure(format!(
                "create_ah without the GRH on {:?}: {e}",
                port.link_layer
            )))
        }
    }
    Ok(Outcome::Pass)
}

fn ud_srq<B: Backend>(env: &Env<B>) -> CaseResult {
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

fn ud_ah_udp_hint<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    let link_layer = env.ctx.query_port(1)?.link_layer;
    let ah =
        u.pd.create_ah(&super::qp::ucx_ah_attr(&u.ep_r, &env.params(), link_layer))?;
    u.src.write(0, b"hinted datagram")?;
    u.post(1, 0, 15)?;
    u.s[0].post_send(&[SendWr::send(2, &[u.src.sge(0, 15)?])
        .signaled()
        .ud(&ah, u.r.qp_num(), QKEY)])?;
    ensure!(env.wait1(&u.cq_s)?.is_ok(), "the send through the hinted handle");
    let wc = env.wait1(&u.cq_r)?;
    ensure!(wc.is_ok() && wc.wr_id == 1, "receive: {wc:?}");
    ensure_eq!(
        read_back(&u.dst, GRH, 15)?,
        b"hinted datagram".to_vec(),
        "payload"
    );
    if link_layer != LinkLayer::Ethernet {
        // The IB GRH's first word: IPVer 6, TClass, and the flow label's low 20 bits.
        let grh = read_back(&u.dst, 0, 4)?;
        let word = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
        ensure_eq!(word & 0xf_ffff, 0xf_ffff, "the GRH's flow label");
    }
    Ok(Outcome::Pass)
}
