//! Work completions: `struct ibv_wc`, `enum ibv_wc_status`, `enum ibv_wc_opcode`
//! (`man ibv_poll_cq`), with libibverbs' numbering so that completions from two backends
//! compare value by value.

use crate::flags::WcFlags;
use std::fmt;

/// `enum ibv_wc_status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`
    #[default]
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`: the message does not fit the receive buffers (responder),
    /// or the gather list is too long.
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`: internal QP consistency error.
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_EEC_OP_ERR`
    LocEecOpErr = 3,
    /// `IBV_WC_LOC_PROT_ERR`: an SGE with a bad lkey, outside its MR, or without the
    /// access the operation needs.
    LocProtErr = 4,
    /// `IBV_WC_WR_FLUSH_ERR`: the QP was in ERR when the WR was processed.
    WrFlushErr = 5,
    /// `IBV_WC_MW_BIND_ERR`
    MwBindErr = 6,
    /// `IBV_WC_BAD_RESP_ERR`: unexpected transport response.
    BadRespErr = 7,
    /// `IBV_WC_LOC_ACCESS_ERR`
    LocAccessErr = 8,
    /// `IBV_WC_REM_INV_REQ_ERR`: the responder found the request invalid (message too
    /// long for the receive buffers, unsupported or misaligned operation).
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR`: bad rkey, wrong PD, missing access right, or out of bounds.
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR`: the responder could not complete the operation.
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR`: no answer within `timeout`, `retry_cnt` times.
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: RNR NAKs outlasted `rnr_retry`.
    RnrRetryExcErr = 13,
    /// `IBV_WC_LOC_RDD_VIOL_ERR`
    LocRddViolErr = 14,
    /// `IBV_WC_REM_INV_RD_REQ_ERR`
    RemInvRdReqErr = 15,
    /// `IBV_WC_REM_ABORT_ERR`
    RemAbortErr = 16,
    /// `IBV_WC_INV_EECN_ERR`
    InvEecnErr = 17,
    /// `IBV_WC_INV_EEC_STATE_ERR`
    InvEecStateErr = 18,
    /// `IBV_WC_FATAL_ERR`
    FatalErr = 19,
    /// `IBV_WC_RESP_TIMEOUT_ERR`
    RespTimeoutErr = 20,
    /// `IBV_WC_GENERAL_ERR`
    GeneralErr = 21,
    /// `IBV_WC_TM_ERR`
    TmErr = 22,
    /// `IBV_WC_TM_RNDV_INCOMPLETE`
    TmRndvIncomplete = 23,
}

impl WcStatus {
    const ALL: [WcStatus; 24] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
        WcStatus::TmErr,
        WcStatus::TmRndvIncomplete,
    ];

    /// From the raw `ibv_wc_status` value.
    pub fn from_raw(v: u32) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    /// `ibv_wc_status_str()`'s text.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "operation aborted",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
            WcStatus::TmErr => "TM error",
            WcStatus::TmRndvIncomplete => "TM software rendezvous",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `enum ibv_wc_opcode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`
    #[default]
    Send = 0,
    /// `IBV_WC_RDMA_WRITE`
    RdmaWrite = 1,
    /// `IBV_WC_RDMA_READ`
    RdmaRead = 2,
    /// `IBV_WC_COMP_SWAP`
    CompSwap = 3,
    /// `IBV_WC_FETCH_ADD`
    FetchAdd = 4,
    /// `IBV_WC_BIND_MW`
    BindMw = 5,
    /// `IBV_WC_LOCAL_INV`
    LocalInv = 6,
    /// `IBV_WC_TSO`
    Tso = 7,
    /// `IBV_WC_RECV`: a receive consumed by SEND or SEND_WITH_IMM.
    Recv = 128,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`: a receive consumed by RDMA_WRITE_WITH_IMM.
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// From the raw `ibv_wc_opcode` value.
    pub fn from_raw(v: u32) -> Option<Self> {
        Some(match v {
            0 => WcOpcode::Send,
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            3 => WcOpcode::CompSwap,
            4 => WcOpcode::FetchAdd,
            5 => WcOpcode::BindMw,
            6 => WcOpcode::LocalInv,
            7 => WcOpcode::Tso,
            128 => WcOpcode::Recv,
            129 => WcOpcode::RecvRdmaWithImm,
            _ => return None,
        })
    }

    /// The completion opcode of a send WR opcode.
    pub fn of_send(op: crate::wr::WrOpcode) -> Self {
        use crate::wr::WrOpcode as W;
        match op {
            W::Send | W::SendWithImm => WcOpcode::Send,
            W::RdmaWrite | W::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            W::RdmaRead => WcOpcode::RdmaRead,
            W::AtomicCmpAndSwp => WcOpcode::CompSwap,
            W::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            W::LocalInv => WcOpcode::LocalInv,
            W::BindMw => WcOpcode::BindMw,
            W::SendWithInv => WcOpcode::Send,
        }
    }
}

/// `struct ibv_wc`. As `man ibv_poll_cq` says, when `status` is not `Success` only
/// `wr_id`, `status`, `qp_num` and `vendor_err` are meaningful.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    /// The `wr_id` of the completed WR.
    pub wr_id: u64,
    /// Completion status.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Vendor-specific error syndrome.
    pub vendor_err: u32,
    /// Bytes transferred (receives, READ, atomics).
    pub byte_len: u32,
    /// Immediate data in host byte order, valid when `wc_flags` has `WITH_IMM`; or, as
    /// `ibv_wc`'s union has it, the rkey a SEND_WITH_INV invalidated (`invalidated_rkey`),
    /// valid when `wc_flags` has `WITH_INV`.
    pub imm_data: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Remote QP number (UD).
    pub src_qp: u32,
    /// `IBV_WC_*` flags.
    pub wc_flags: WcFlags,
    /// P_Key index (GSI QPs).
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    /// The immediate data, if the completion carries one.
    pub fn imm(&self) -> Option<u32> {
        self.wc_flags.contains(WcFlags::WITH_IMM).then_some(self.imm_data)
    }

    /// The rkey the peer's SEND_WITH_INV invalidated (`invalidated_rkey`), if the
    /// completion carries one: marked `IBV_WC_WITH_INV`, or, as rxe marks it (the kernel's
    /// `IB_WC_WITH_INVALIDATE` bit, which libibverbs names `IBV_WC_IP_CSUM_OK`), a receive
    /// without immediate data with `IP_CSUM_OK` and a nonzero key (no rkey is 0, and a
    /// checksum-offload receive leaves the union 0).
    pub fn invalidated_rkey(&self) -> Option<u32> {
        let rxe_mark = self.opcode == WcOpcode::Recv
            && self.wc_flags.contains(WcFlags::IP_CSUM_OK)
            && !self.wc_flags.contains(WcFlags::WITH_IMM)
            && self.imm_data != 0;
        (self.wc_flags.contains(WcFlags::WITH_INV) || rxe_mark).then_some(self.imm_data)
    }

    /// Whether `status` is `Success`.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_invalidated_rkey_is_found_under_either_mark() {
        let recv = |flags: WcFlags, imm_data: u32| WorkCompletion {
            opcode: WcOpcode::Recv,
            wc_flags: flags,
            imm_data,
            ..WorkCompletion::default()
        };
        assert_eq!(
            recv(WcFlags::WITH_INV, 0x1234_5601).invalidated_rkey(),
            Some(0x1234_5601)
        );
        // rxe's mark: the kernel's IB_WC_WITH_INVALIDATE, read as IBV_WC_IP_CSUM_OK.
        let rxe = WcFlags::GRH | WcFlags::IP_CSUM_OK;
        assert_eq!(recv(rxe, 0x1234_5601).invalidated_rkey(), Some(0x1234_5601));
        // A checksum-offload receive (no rkey), immediate data, or no mark at all.
        assert_eq!(recv(rxe, 0).invalidated_rkey(), None);
        assert_eq!(recv(rxe | WcFlags::WITH_IMM, 7).invalidated_rkey(), None);
        assert_eq!(recv(WcFlags::GRH, 7).invalidated_rkey(), None);
    }

    #[test]
    fn numbering_matches_verbs_h() {
        assert_eq!(WcStatus::RnrRetryExcErr as u32, 13);
        assert_eq!(WcStatus::RemAccessErr as u32, 10);
        assert_eq!(WcStatus::WrFlushErr as u32, 5);
        assert_eq!(WcStatus::TmRndvIncomplete as u32, 23);
        for v in 0..24 {
            assert_eq!(WcStatus::from_raw(v).unwrap() as u32, v);
        }
        assert_eq!(WcStatus::from_raw(24), None);
        assert_eq!(WcOpcode::RecvRdmaWithImm as u32, 129);
        assert_eq!(WcOpcode::from_raw(129), Some(WcOpcode::RecvRdmaWithImm));
    }
}
