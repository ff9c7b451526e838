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
//!
//! Here the case list (in report order) and the setup every case shares ([`UdSetup`]);
//! the cases by job: `traffic` (what arrives and how it is named), `drops` (Q_Key checks
//! and what is dropped), `qp` (the QP's attributes and the work requests it refuses),
//! `ah` (address handles).

use std::time::Duration;

use verbs_api::{
    ah_attr_for, local_endpoint, AccessFlags as A, Backend, Context, Endpoint, MemoryRegion,
    ProtectionDomain, QpInitAttr, QpType, QueuePair, RecvWr, SendWr, WcOpcode, WcStatus,
};

use super::case;
use crate::env::ud_to_rts;
use crate::{ensure, ensure_eq, Env, Failure};

mod ah;
mod drops;
mod qp;
mod traffic;

use ah::{ud_ah, ud_ah_udp_hint};
use drops::{ud_empty_rq, ud_qkey_high_bit, ud_recv_too_small, ud_too_large, ud_wrong_qkey};
use qp::{ud_destination, ud_modify_masks, ud_opcode_write, ud_send_error};
use traffic::{ud_grh, ud_send_recv, ud_srq, ud_two_senders};

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
