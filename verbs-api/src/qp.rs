//! Queue-pair types: `enum ibv_qp_type`, `enum ibv_qp_state`, `struct ibv_qp_cap`,
//! `struct ibv_qp_init_attr`, `struct ibv_qp_attr` and `struct ibv_ah_attr`
//! (`man ibv_create_qp`, `man ibv_modify_qp`, `man ibv_query_qp`).

use crate::device::{Gid, Mtu};
use crate::flags::AccessFlags;

/// `enum ibv_qp_type`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum QpType {
    /// `IBV_QPT_RC`: reliable connected.
    #[default]
    Rc = 2,
    /// `IBV_QPT_UC`: unreliable connected.
    Uc = 3,
    /// `IBV_QPT_UD`: unreliable datagram.
    Ud = 4,
}

/// `enum ibv_qp_state`: RESET → INIT → RTR → RTS (→ SQD), and ERR from anywhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum QpState {
    /// `IBV_QPS_RESET`: just created, or reset; queues empty.
    #[default]
    Reset = 0,
    /// `IBV_QPS_INIT`: receives may be posted.
    Init = 1,
    /// `IBV_QPS_RTR`: ready to receive.
    Rtr = 2,
    /// `IBV_QPS_RTS`: ready to send.
    Rts = 3,
    /// `IBV_QPS_SQD`: send queue drained.
    Sqd = 4,
    /// `IBV_QPS_SQE`: send queue error (UC/UD only).
    Sqe = 5,
    /// `IBV_QPS_ERR`: every outstanding and new WR completes with WR_FLUSH_ERR.
    Err = 6,
}

impl QpState {
    /// From the raw `ibv_qp_state` value.
    pub fn from_raw(v: u32) -> Option<Self> {
        Some(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => return None,
        })
    }
}

/// `struct ibv_qp_cap`: queue sizes asked for at create time; `create_qp` may round them
/// up and [`QueuePair::query`](crate::QueuePair::query) returns what was granted.
///
/// As with libibverbs, the granted values are what the queues hold at least: a provider
/// may round up (Soft-RoCE grants 2^n - 1), so a queue can accept more WRs than asked
/// for before `post_send`/`post_recv` fails with ENOMEM. Portable code keeps its own
/// count of outstanding WRs against the value it asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct QpCap {
    /// Outstanding send WRs.
    pub max_send_wr: u32,
    /// Outstanding receive WRs.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send WR.
    pub max_inline_data: u32,
}

impl QpCap {
    /// `max_send_wr` and `max_recv_wr` WRs, one SGE per WR each way, no inline data: the
    /// common case; change a field, or add inline data with [`QpCap::with_inline`].
    pub const fn new(max_send_wr: u32, max_recv_wr: u32) -> QpCap {
        QpCap {
            max_send_wr,
            max_recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }

    /// The same with `max_inline_data` bytes of inline data per send WR.
    pub const fn with_inline(self, max_inline_data: u32) -> QpCap {
        QpCap {
            max_inline_data,
            ..self
        }
    }
}

/// `struct ibv_qp_init_attr` for [`ProtectionDomain::create_qp`](crate::ProtectionDomain::create_qp),
/// generic over the backend's CQ and SRQ types.
#[derive(Debug)]
pub struct QpInitAttr<'a, Cq, Srq> {
    /// CQ for send completions.
    pub send_cq: &'a Cq,
    /// CQ for receive completions (may be the same CQ).
    pub recv_cq: &'a Cq,
    /// The SRQ the QP takes its receives from (`None`: a receive queue of its own).
    pub srq: Option<&'a Srq>,
    /// Queue sizes (`max_recv_wr` and `max_recv_sge` are ignored with an SRQ).
    pub cap: QpCap,
    /// Transport.
    pub qp_type: QpType,
    /// Every send WR generates a completion, as if `IBV_SEND_SIGNALED` were set.
    pub sq_sig_all: bool,
    /// `create_flags` of `ibv_create_qp_ex` (`IBV_QP_CREATE_*`, libibverbs' bits; 0 for
    /// none). A device refuses a flag it does not take with EOPNOTSUPP, as rxe's and
    /// mlx5's kernels do ([`Capabilities::qp_create_flags`](crate::Capabilities) says
    /// which it takes).
    pub create_flags: u32,
}

/// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` of `enum ibv_qp_create_flags`: the QP does not
/// receive the multicast datagrams it sends itself, though it is attached to their group
/// (other QPs of its device still do). Without it an attached sender receives its own,
/// on rxe and on a ConnectX alike.
pub const QP_CREATE_BLOCK_SELF_MCAST_LB: u32 = 1 << 1;

impl<'a, Cq, Srq> QpInitAttr<'a, Cq, Srq> {
    /// A QP of type `qp_type` on the given CQs with the given capacities and selective
    /// signaling.
    pub fn new(qp_type: QpType, send_cq: &'a Cq, recv_cq: &'a Cq, cap: QpCap) -> Self {
        QpInitAttr {
            send_cq,
            recv_cq,
            srq: None,
            cap,
            qp_type,
            sq_sig_all: false,
            create_flags: 0,
        }
    }

    /// An RC QP (reliable connected).
    pub fn rc(send_cq: &'a Cq, recv_cq: &'a Cq, cap: QpCap) -> Self {
        Self::new(QpType::Rc, send_cq, recv_cq, cap)
    }

    /// A UC QP (unreliable connected: SEND and WRITE, no READ or atomics, no ACKs).
    pub fn uc(send_cq: &'a Cq, recv_cq: &'a Cq, cap: QpCap) -> Self {
        Self::new(QpType::Uc, send_cq, recv_cq, cap)
    }

    /// A UD QP (unreliable datagrams of at most one MTU, to any QP an address handle
    /// reaches).
    pub fn ud(send_cq: &'a Cq, recv_cq: &'a Cq, cap: QpCap) -> Self {
        Self::new(QpType::Ud, send_cq, recv_cq, cap)
    }

    /// The same, taking its receives from `srq`.
    pub fn with_srq(self, srq: &'a Srq) -> Self {
        QpInitAttr {
            srq: Some(srq),
            ..self
        }
    }

    /// The same with every send WR signaled (`sq_sig_all`).
    pub fn sig_all(self) -> Self {
        QpInitAttr {
            sq_sig_all: true,
            ..self
        }
    }

    /// The same with `create_flags` (`IBV_QP_CREATE_*`, e.g.
    /// [`QP_CREATE_BLOCK_SELF_MCAST_LB`]).
    pub fn with_create_flags(self, create_flags: u32) -> Self {
        QpInitAttr { create_flags, ..self }
    }
}

/// `struct ibv_global_route`: the GRH part of an address vector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GlobalRoute {
    /// Destination GID.
    pub dgid: Gid,
    /// Flow label.
    pub flow_label: u32,
    /// Index of the source GID in the local port's GID table.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`: the address vector of the remote port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AhAttr {
    /// Global routing header fields (used when `is_global`).
    pub grh: GlobalRoute,
    /// Destination LID.
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Whether the GRH is used (always on RoCE).
    pub is_global: bool,
    /// Local port number.
    pub port_num: u8,
}

/// `struct ibv_qp_attr`: the attributes of `ibv_modify_qp` / `ibv_query_qp`. Which fields
/// a modify call reads is given by its [`QpAttrMask`](crate::QpAttrMask).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct QpAttr {
    /// Requested (modify) or current (query) state.
    pub qp_state: QpState,
    /// Assumed current state (with `IBV_QP_CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Expected PSN of the first incoming request (24 bits).
    pub rq_psn: u32,
    /// PSN of the first outgoing request (24 bits).
    pub sq_psn: u32,
    /// Remote QP number.
    pub dest_qp_num: u32,
    /// Remote operations this QP accepts (`IBV_ACCESS_REMOTE_*`).
    pub qp_access_flags: AccessFlags,
    /// Queue capacities (query only).
    pub cap: QpCap,
    /// Address vector of the remote port.
    pub ah_attr: AhAttr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Asynchronous event when SQD is reached.
    pub en_sqd_async_notify: bool,
    /// Whether the send queue is draining (query only).
    pub sq_draining: bool,
    /// Outstanding RDMA READ/atomic requests this QP may issue.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ/atomic requests this QP accepts.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (0-31, see [`rnr_timer`](crate::timers::rnr_timer)): how long a
    /// requester waits before resending after this QP answered RNR.
    pub min_rnr_timer: u8,
    /// Local port.
    pub port_num: u8,
    /// Local ACK timeout code: 4.096 µs × 2^timeout, 0 = infinite.
    pub timeout: u8,
    /// Transport retries before RETRY_EXC_ERR (0-7).
    pub retry_cnt: u8,
    /// RNR retries before RNR_RETRY_EXC_ERR (0-6; 7 = retry forever).
    pub rnr_retry: u8,
}

/// PSNs are 24-bit.
pub const PSN_MASK: u32 = 0x00ff_ffff;
