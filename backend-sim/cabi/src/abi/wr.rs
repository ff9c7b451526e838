//! Work requests and completions: `struct ibv_sge`, `struct ibv_send_wr`,
//! `struct ibv_recv_wr` and `struct ibv_wc` (`man ibv_post_send`, `man ibv_post_recv`,
//! `man ibv_poll_cq`).

use std::ffi::c_int;

use super::objects::ibv_ah;

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_wr_rdma,
    pub atomic: ibv_wr_atomic,
    pub ud: ibv_wr_ud,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut super::ibv_mr,
    pub addr: u64,
    pub length: u64,
    /// `enum ibv_access_flags`
    pub mw_access_flags: u32,
}

/// `struct ibv_mw_bind`: the arguments of `ibv_bind_mw`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// The anonymous union of `bind_mw` and `tso` at the end of `struct ibv_send_wr`:
/// `bind_mw` is the larger (an `ibv_mw *`, an rkey, and `struct ibv_mw_bind_info`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_tail {
    pub mw: *mut super::ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    /// `enum ibv_wr_opcode`
    pub opcode: u32,
    pub send_flags: u32,
    /// `imm_data` (big-endian) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`
    pub remote_srqn: u32,
    pub tail: ibv_send_wr_tail,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    /// `enum ibv_wc_status`
    pub status: u32,
    /// `enum ibv_wc_opcode`
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (big-endian) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `IBV_SEND_IP_CSUM`: checksum offload of raw Ethernet and UD QPs; nothing to do here.
pub const IBV_SEND_IP_CSUM: u32 = 1 << 4;
