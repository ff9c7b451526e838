//! Work requests: `struct ibv_sge`, `struct ibv_send_wr` and `struct ibv_recv_wr`
//! (`man ibv_post_send`, `man ibv_post_recv`).
//!
//! `ibv_send_wr` keeps the per-opcode fields in a union (`wr.rdma`, `wr.atomic`) next to
//! `opcode` and `imm_data`; here the opcode is a Rust enum, [`WrOp`], that carries exactly
//! the fields its opcode uses, so a WRITE without a remote address cannot be built.
//! [`WrOp::opcode`] gives libibverbs' `enum ibv_wr_opcode` numbering. Work requests borrow
//! their scatter/gather list, so posting allocates nothing.

use crate::ah::AddressHandle;
use crate::flags::SendFlags;
pub use crate::sge::{RemoteAddr, Sge};
use crate::window::{BindMw, MemoryWindow, MwBindInfo};

/// `enum ibv_wr_opcode`, with libibverbs' numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WrOpcode {
    /// `IBV_WR_RDMA_WRITE`
    RdmaWrite = 0,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`
    RdmaWriteWithImm = 1,
    /// `IBV_WR_SEND`
    Send = 2,
    /// `IBV_WR_SEND_WITH_IMM`
    SendWithImm = 3,
    /// `IBV_WR_RDMA_READ`
    RdmaRead = 4,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`
    AtomicCmpAndSwp = 5,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`
    AtomicFetchAndAdd = 6,
    /// `IBV_WR_LOCAL_INV`
    LocalInv = 7,
    /// `IBV_WR_BIND_MW`
    BindMw = 8,
    /// `IBV_WR_SEND_WITH_INV`
    SendWithInv = 9,
}

/// The operation of a send WR, with the fields its opcode uses.
///
/// Immediate data is given in host byte order; the ibverbs backend converts it to the
/// network byte order `ibv_send_wr::imm_data` expects, and back on completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WrOp {
    /// `IBV_WR_SEND`: consumes a receive at the peer.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`: SEND plus 32 bits delivered in the receive completion.
    SendWithImm {
        /// Immediate data.
        imm_data: u32,
    },
    /// `IBV_WR_RDMA_WRITE`: write the gather list to remote memory.
    RdmaWrite {
        /// `wr.rdma.remote_addr` / `wr.rdma.rkey`.
        remote: RemoteAddr,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: WRITE, then consume a receive at the peer and complete
    /// it as `IBV_WC_RECV_RDMA_WITH_IMM` with the immediate.
    RdmaWriteWithImm {
        /// `wr.rdma.remote_addr` / `wr.rdma.rkey`.
        remote: RemoteAddr,
        /// Immediate data.
        imm_data: u32,
    },
    /// `IBV_WR_RDMA_READ`: read remote memory into the scatter list.
    RdmaRead {
        /// `wr.rdma.remote_addr` / `wr.rdma.rkey`.
        remote: RemoteAddr,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: if the remote 64-bit word equals `compare`, replace it
    /// with `swap`; the old value lands in the (8-byte) local SGE either way.
    AtomicCmpAndSwp {
        /// `wr.atomic.remote_addr` / `wr.atomic.rkey` (8-byte aligned).
        remote: RemoteAddr,
        /// `wr.atomic.compare_add`.
        compare: u64,
        /// `wr.atomic.swap`.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: add to the remote 64-bit word (wrapping); the old
    /// value lands in the (8-byte) local SGE.
    AtomicFetchAndAdd {
        /// `wr.atomic.remote_addr` / `wr.atomic.rkey` (8-byte aligned).
        remote: RemoteAddr,
        /// `wr.atomic.compare_add`.
        add: u64,
    },
    /// `IBV_WR_LOCAL_INV`: invalidate the type 2 memory window with this rkey (a local
    /// operation of the send queue: nothing goes to the peer).
    LocalInv {
        /// `invalidate_rkey`.
        rkey: u32,
    },
    /// `IBV_WR_BIND_MW`: bind a memory window; the window and the binding are the WR's
    /// [`SendWr::bind`] (`wr.bind_mw`). A local operation of the send queue.
    BindMw,
    /// `IBV_WR_SEND_WITH_INV`: SEND, and the peer invalidates the memory window with this
    /// rkey before completing the receive (`IBV_WC_WITH_INV`).
    SendWithInv {
        /// `invalidate_rkey`.
        rkey: u32,
    },
}

impl WrOp {
    /// libibverbs' opcode number.
    pub fn opcode(&self) -> WrOpcode {
        match self {
            WrOp::Send => WrOpcode::Send,
            WrOp::SendWithImm { .. } => WrOpcode::SendWithImm,
            WrOp::RdmaWrite { .. } => WrOpcode::RdmaWrite,
            WrOp::RdmaWriteWithImm { .. } => WrOpcode::RdmaWriteWithImm,
            WrOp::RdmaRead { .. } => WrOpcode::RdmaRead,
            WrOp::AtomicCmpAndSwp { .. } => WrOpcode::AtomicCmpAndSwp,
            WrOp::AtomicFetchAndAdd { .. } => WrOpcode::AtomicFetchAndAdd,
            WrOp::LocalInv { .. } => WrOpcode::LocalInv,
            WrOp::BindMw => WrOpcode::BindMw,
            WrOp::SendWithInv { .. } => WrOpcode::SendWithInv,
        }
    }

    /// The rkey a LOCAL_INV or SEND_WITH_INV invalidates (`invalidate_rkey`).
    pub fn invalidate_rkey(&self) -> Option<u32> {
        match *self {
            WrOp::LocalInv { rkey } | WrOp::SendWithInv { rkey } => Some(rkey),
            _ => None,
        }
    }

    /// Whether the send queue executes it without the peer (BIND_MW, LOCAL_INV): no
    /// message, no PSN, completed in order with the rest.
    pub fn is_local(&self) -> bool {
        matches!(self, WrOp::LocalInv { .. } | WrOp::BindMw)
    }

    /// The immediate data, if the opcode carries one.
    pub fn imm_data(&self) -> Option<u32> {
        match *self {
            WrOp::SendWithImm { imm_data } | WrOp::RdmaWriteWithImm { imm_data, .. } => Some(imm_data),
            _ => None,
        }
    }

    /// The remote address, for RDMA and atomic opcodes.
    pub fn remote(&self) -> Option<RemoteAddr> {
        match *self {
            WrOp::RdmaWrite { remote }
            | WrOp::RdmaWriteWithImm { remote, .. }
            | WrOp::RdmaRead { remote }
            | WrOp::AtomicCmpAndSwp { remote, .. }
            | WrOp::AtomicFetchAndAdd { remote, .. } => Some(remote),
            WrOp::Send
            | WrOp::SendWithImm { .. }
            | WrOp::SendWithInv { .. }
            | WrOp::LocalInv { .. }
            | WrOp::BindMw => None,
        }
    }

    /// Whether the responder must have a receive posted (SEND, SEND_WITH_IMM,
    /// SEND_WITH_INV, RDMA_WRITE_WITH_IMM).
    pub fn consumes_recv(&self) -> bool {
        matches!(
            self,
            WrOp::Send | WrOp::SendWithImm { .. } | WrOp::SendWithInv { .. } | WrOp::RdmaWriteWithImm { .. }
        )
    }

    /// Whether the operation is an atomic.
    pub fn is_atomic(&self) -> bool {
        matches!(
            self,
            WrOp::AtomicCmpAndSwp { .. } | WrOp::AtomicFetchAndAdd { .. }
        )
    }

    /// Whether the responder answers with data (READ and atomics): these count against
    /// `max_rd_atomic` and are what `IBV_SEND_FENCE` waits for.
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(self, WrOp::RdmaRead { .. }) || self.is_atomic()
    }
}

/// `struct ibv_send_wr` (without `next`: a list is a slice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Gather list (for READ and atomics: the scatter list for the returned data).
    pub sg_list: &'a [Sge],
    /// Opcode and its fields.
    pub op: WrOp,
    /// `IBV_SEND_*` flags.
    pub send_flags: SendFlags,
    /// `wr.ud`: where a UD send goes (`None` on connected QPs).
    pub ud: Option<UdDest<'a>>,
    /// `wr.bind_mw`: the window an [`WrOp::BindMw`] binds and to what (`None` for every
    /// other opcode).
    pub bind: Option<BindMw<'a>>,
}

/// `wr.ud` of `struct ibv_send_wr`: the destination of a send on a UD QP.
#[derive(Clone, Copy)]
pub struct UdDest<'a> {
    /// The address handle of the destination port (`wr.ud.ah`).
    pub ah: &'a dyn AddressHandle,
    /// The destination QP number (`wr.ud.remote_qpn`).
    pub remote_qpn: u32,
    /// The destination's Q_Key (`wr.ud.remote_qkey`). A value with the high bit set means
    /// the sending QP's own Q_Key (IBA 10.2.4.1, `man ibv_post_send`).
    pub remote_qkey: u32,
}

impl std::fmt::Debug for UdDest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdDest")
            .field("ah", &self.ah.attr())
            .field("remote_qpn", &format_args!("{:#x}", self.remote_qpn))
            .field("remote_qkey", &format_args!("{:#x}", self.remote_qkey))
            .finish()
    }
}

impl PartialEq for UdDest<'_> {
    /// The same address handle (by identity), QP number and Q_Key.
    fn eq(&self, other: &Self) -> bool {
        std::ptr::addr_eq(self.ah, other.ah)
            && self.remote_qpn == other.remote_qpn
            && self.remote_qkey == other.remote_qkey
    }
}

impl Eq for UdDest<'_> {}

impl<'a> SendWr<'a> {
    /// A work request with no flags.
    pub fn new(wr_id: u64, op: WrOp, sg_list: &'a [Sge]) -> Self {
        SendWr {
            wr_id,
            sg_list,
            op,
            send_flags: SendFlags::empty(),
            ud: None,
            bind: None,
        }
    }

    /// The same, for a UD QP: to QP `remote_qpn` behind `ah`, with `remote_qkey` (see
    /// [`UdDest`]).
    pub fn ud(mut self, ah: &'a dyn AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.ud = Some(UdDest {
            ah,
            remote_qpn,
            remote_qkey,
        });
        self
    }

    /// `IBV_WR_SEND`.
    pub fn send(wr_id: u64, sg_list: &'a [Sge]) -> Self {
        Self::new(wr_id, WrOp::Send, sg_list)
    }

    /// `IBV_WR_SEND_WITH_IMM`.
    pub fn send_with_imm(wr_id: u64, sg_list: &'a [Sge], imm_data: u32) -> Self {
        Self::new(wr_id, WrOp::SendWithImm { imm_data }, sg_list)
    }

    /// `IBV_WR_RDMA_WRITE`.
    pub fn write(wr_id: u64, sg_list: &'a [Sge], remote: impl Into<RemoteAddr>) -> Self {
        Self::new(
            wr_id,
            WrOp::RdmaWrite {
                remote: remote.into(),
            },
            sg_list,
        )
    }

    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    pub fn write_with_imm(
        wr_id: u64,
        sg_list: &'a [Sge],
        remote: impl Into<RemoteAddr>,
        imm_data: u32,
    ) -> Self {
        Self::new(
            wr_id,
            WrOp::RdmaWriteWithImm {
                remote: remote.into(),
                imm_data,
            },
            sg_list,
        )
    }

    /// `IBV_WR_RDMA_READ`.
    pub fn read(wr_id: u64, sg_list: &'a [Sge], remote: impl Into<RemoteAddr>) -> Self {
        Self::new(
            wr_id,
            WrOp::RdmaRead {
                remote: remote.into(),
            },
            sg_list,
        )
    }

    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    pub fn cmp_and_swp(
        wr_id: u64,
        sg_list: &'a [Sge],
        remote: impl Into<RemoteAddr>,
        compare: u64,
        swap: u64,
    ) -> Self {
        Self::new(
            wr_id,
            WrOp::AtomicCmpAndSwp {
                remote: remote.into(),
                compare,
                swap,
            },
            sg_list,
        )
    }

    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    pub fn fetch_and_add(wr_id: u64, sg_list: &'a [Sge], remote: impl Into<RemoteAddr>, add: u64) -> Self {
        Self::new(
            wr_id,
            WrOp::AtomicFetchAndAdd {
                remote: remote.into(),
                add,
            },
            sg_list,
        )
    }

    /// `IBV_WR_SEND_WITH_INV`: a SEND that has the peer invalidate the window `rkey`.
    pub fn send_with_inv(wr_id: u64, sg_list: &'a [Sge], rkey: u32) -> Self {
        Self::new(wr_id, WrOp::SendWithInv { rkey }, sg_list)
    }

    /// `IBV_WR_LOCAL_INV`: invalidates the type 2 window `rkey`.
    pub fn local_inv(wr_id: u64, rkey: u32) -> Self {
        Self::new(wr_id, WrOp::LocalInv { rkey }, &[])
    }

    /// `IBV_WR_BIND_MW`: binds the window `mw` to `bind_info` with the new `rkey` (a type
    /// 2 window: see [`crate::mw`]; `ibv_wr_bind_mw`).
    pub fn bind_mw(wr_id: u64, mw: &'a dyn MemoryWindow, rkey: u32, bind_info: MwBindInfo<'a>) -> Self {
        let mut wr = Self::new(wr_id, WrOp::BindMw, &[]);
        wr.bind = Some(BindMw { mw, rkey, bind_info });
        wr
    }

    /// Adds `IBV_SEND_SIGNALED`.
    pub fn signaled(mut self) -> Self {
        self.send_flags |= SendFlags::SIGNALED;
        self
    }

    /// Adds `IBV_SEND_INLINE`.
    pub fn inline(mut self) -> Self {
        self.send_flags |= SendFlags::INLINE;
        self
    }

    /// Adds `IBV_SEND_FENCE`.
    pub fn fence(mut self) -> Self {
        self.send_flags |= SendFlags::FENCE;
        self
    }

    /// Adds `IBV_SEND_SOLICITED`.
    pub fn solicited(mut self) -> Self {
        self.send_flags |= SendFlags::SOLICITED;
        self
    }

    /// Replaces the flags.
    pub fn with_flags(mut self, flags: SendFlags) -> Self {
        self.send_flags = flags;
        self
    }

    /// Total bytes of the gather list (wrapping is impossible: at most 2^32 SGEs of
    /// 2^32 bytes fit in a u64).
    pub fn total_len(&self) -> u64 {
        self.sg_list.iter().map(|s| s.length as u64).sum()
    }
}

/// `struct ibv_recv_wr` (without `next`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list for the incoming message.
    pub sg_list: &'a [Sge],
}

impl<'a> RecvWr<'a> {
    /// A receive work request.
    pub fn new(wr_id: u64, sg_list: &'a [Sge]) -> Self {
        RecvWr { wr_id, sg_list }
    }
}
