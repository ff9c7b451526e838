//! The device and port attributes of each profile: the limits and identities that
//! `ibv_query_device` and `ibv_query_port` report on a real device of that kind, which the
//! sim then also enforces (a QP, CQ or SRQ asked beyond them is EINVAL, a message longer
//! than `max_msg_sz` fails with `IBV_WC_LOC_LEN_ERR`).
//!
//! - rxe: the kernel's `drivers/infiniband/sw/rxe/rxe_param.h` of Linux 6.1 (bookworm's),
//!   where most limits are `DEFAULT_MAX_VALUE` (1 << 20) and `rxe.c`
//!   `rxe_init_device_param()` derives the rest (`max_cqe` = 2^15 - 1, `max_qp` and
//!   `max_srq` less their first index, `max_mr` half the index space), and the port of an
//!   rxe on a netdev of MTU 1500: `active_mtu` 1024 (`eth_mtu_int_to_enum()`).
//! - mlx5: `ibv_devinfo -v` of a ConnectX-5 (MT4119) as NVIDIA's documentation and
//!   rdma-core's issue reports show it; firmware versions move some limits, so code
//!   should read them rather than trust these figures.
//! - portable: for each limit the smaller of the two, so that what fits here fits on both.
//!
//! What the sim cannot take from the profile stays the sim's own, the same under every
//! profile: the GID table's shape (the sim's two entries for the address it advertises,
//! against rxe's 1024-entry table whose first entry is a `fe80::` link-local GID) and its
//! P_Key table (one entry, the default P_Key, where rxe has 64 and a ConnectX 128).

use verbs_api::{AtomicCap, LinkLayer, Mtu};

/// `IBV_DEVICE_SRQ_RESIZE` of `enum ibv_device_cap_flags`: `ibv_modify_srq` may change
/// an SRQ's `max_wr`. Every profile has it (rxe_param.h `RXE_DEVICE_CAP_FLAGS`, mlx5).
pub const IBV_DEVICE_SRQ_RESIZE: u32 = 1 << 13;

/// `IBV_DEVICE_MEM_WINDOW`: type 1 memory windows.
pub const IBV_DEVICE_MEM_WINDOW: u32 = 1 << 17;
/// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`: type 2 memory windows associated with a QP and its
/// PD (IBA's 2B).
pub const IBV_DEVICE_MEM_WINDOW_TYPE_2B: u32 = 1 << 24;

/// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` of `enum ibv_qp_create_flags`: the QP does not
/// receive the multicast it sends itself.
pub const IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: u32 = verbs_api::QP_CREATE_BLOCK_SELF_MCAST_LB;

/// The `vendor_id` of a device without an IEEE OUI of its own: rxe_param.h
/// `RXE_VENDOR_ID`. Software devices report it; no vendor table of a program (perftest's
/// device list, UCX's, rdma-core's tests) gives it a path of its own.
pub const NO_VENDOR: u32 = 0xff_ffff;

/// `DEFAULT_MAX_VALUE` of rxe_param.h.
const RXE_DEFAULT_MAX: u32 = 1 << 20;

/// What a device of one kind reports, and the sim enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attrs {
    /// `vendor_id` (IEEE OUI, or [`NO_VENDOR`]).
    pub vendor_id: u32,
    /// `vendor_part_id`.
    pub vendor_part_id: u32,
    /// `page_size_cap`.
    pub page_size_cap: u64,
    /// `max_mr_size`.
    pub max_mr_size: u64,
    /// `max_qp`.
    pub max_qp: u32,
    /// `max_qp_wr`: the deepest send or receive queue.
    pub max_qp_wr: u32,
    /// `max_sge`: SGEs per send or receive WR.
    pub max_sge: u32,
    /// `max_sge_rd`: SGEs per RDMA READ.
    pub max_sge_rd: u32,
    /// `max_cq`.
    pub max_cq: u32,
    /// `max_cqe`: the largest CQ.
    pub max_cqe: u32,
    /// `max_mr`.
    pub max_mr: u32,
    /// `max_pd`.
    pub max_pd: u32,
    /// `max_mw`: memory windows (0: none).
    pub max_mw: u32,
    /// The memory-window bits of `device_cap_flags` (`IBV_DEVICE_MEM_WINDOW`,
    /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`): which window types `ibv_alloc_mw` makes.
    pub mw_flags: u32,
    /// Whether `ibv_rereg_mr` is served (translation, PD and access changes). rxe has
    /// no `rereg_user_mr` (the kernel's rxe_verbs.c sets none, so uverbs answers
    /// EOPNOTSUPP); mlx5 has it (kernel hw/mlx5/mr.c `mlx5_ib_rereg_user_mr()`).
    pub rereg_mr: bool,
    /// `max_qp_rd_atom`: READs/atomics a QP may have outstanding as a responder.
    pub max_qp_rd_atom: u32,
    /// `max_qp_init_rd_atom`: READs/atomics a QP may have outstanding as a requester.
    pub max_qp_init_rd_atom: u32,
    /// `atomic_cap`.
    pub atomic_cap: AtomicCap,
    /// `max_srq`.
    pub max_srq: u32,
    /// `max_srq_wr`.
    pub max_srq_wr: u32,
    /// `max_srq_sge`.
    pub max_srq_sge: u32,
    /// The smallest `max_wr` `ibv_create_srq` takes: rxe refuses 0 (`rxe_srq_chk_init()`:
    /// `max_wr <= 0` is EINVAL); mlx5 takes 0 and makes an SRQ that holds no receive
    /// (`mlx5_alloc_srq_buf()` sizes it for `max_wr + 1` and keeps one WQE free, so every
    /// post is ENOMEM).
    pub min_srq_wr: u32,
    /// The largest `max_inline_data` a QP may be created with (not in
    /// `ibv_query_device`; the provider's limit at `ibv_create_qp`).
    pub max_inline: u32,
    /// The port's `max_mtu`.
    pub max_mtu: Mtu,
    /// The port's `active_mtu`.
    pub active_mtu: Mtu,
    /// The port's `max_msg_sz`: the longest message.
    pub max_msg_sz: u32,
    /// The port's link layer: InfiniBand (LID = the device's TCP port, an address vector
    /// with or without the GRH) or Ethernet (RoCE v2: LID 0, peers reached by GID alone,
    /// see `addressing`).
    pub link_layer: LinkLayer,
    /// The `create_flags` `ibv_create_qp_ex` accepts (`IBV_QP_CREATE_*`).
    pub qp_create_flags: u32,
    /// `max_mcast_grp`: multicast groups the device's QPs may be attached to.
    pub max_mcast_grp: u32,
    /// `max_mcast_qp_attach`: QPs attached to one group.
    pub max_mcast_qp_attach: u32,
    /// `max_total_mcast_qp_attach`: attachments of QPs to groups in all.
    pub max_total_mcast_qp_attach: u32,
}

impl Attrs {
    /// Soft-RoCE of Linux 6.1 on a netdev of MTU 1500 (see the module docs).
    pub const RXE: Attrs = Attrs {
        // rxe_param.h RXE_VENDOR_ID (0XFFFFFF: "no vendor"), RXE_VENDOR_PART_ID 0.
        vendor_id: NO_VENDOR,
        vendor_part_id: 0,
        page_size_cap: 0xffff_f000,
        max_mr_size: u64::MAX,
        // RXE_MAX_QP = DEFAULT_MAX_VALUE - RXE_MIN_QP_INDEX (16).
        max_qp: RXE_DEFAULT_MAX - 16,
        max_qp_wr: RXE_DEFAULT_MAX,
        max_sge: 32,
        max_sge_rd: 32,
        max_cq: RXE_DEFAULT_MAX,
        // (1 << RXE_MAX_LOG_CQE) - 1.
        max_cqe: (1 << 15) - 1,
        // RXE_MAX_MR_INDEX (DEFAULT_MAX_VALUE >> 1) - RXE_MIN_MR_INDEX (1).
        max_mr: (RXE_DEFAULT_MAX >> 1) - 1,
        max_pd: RXE_DEFAULT_MAX,
        // RXE_MAX_MW_INDEX (DEFAULT_MAX_VALUE) - RXE_MIN_MW_INDEX (RXE_MAX_MR_INDEX + 1);
        // RXE_DEVICE_CAP_FLAGS has IB_DEVICE_MEM_WINDOW and _TYPE_2B.
        max_mw: RXE_DEFAULT_MAX - (RXE_DEFAULT_MAX >> 1) - 1,
        mw_flags: IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B,
        rereg_mr: false,
        max_qp_rd_atom: 128,
        max_qp_init_rd_atom: 128,
        atomic_cap: AtomicCap::Hca,
        // DEFAULT_MAX_VALUE - RXE_MIN_SRQ_INDEX (0x20001).
        max_srq: RXE_DEFAULT_MAX - 0x2_0001,
        max_srq_wr: RXE_DEFAULT_MAX,
        max_srq_sge: 27,
        min_srq_wr: 1,
        // RXE_MAX_INLINE_DATA: RXE_MAX_SGE (32) SGEs of 16 bytes.
        max_inline: 32 * 16,
        max_mtu: Mtu::Mtu4096,
        // 1500 less RXE_MAX_HDR_LENGTH (80) rounds down to 1024.
        active_mtu: Mtu::Mtu1024,
        max_msg_sz: 0x80_0000,
        link_layer: LinkLayer::Ethernet,
        // The kernel's rxe_create_qp() refuses every create flag (EOPNOTSUPP).
        qp_create_flags: 0,
        // RXE_MAX_MCAST_GRP, RXE_MAX_MCAST_QP_ATTACH, RXE_MAX_TOT_MCAST_QP_ATTACH.
        max_mcast_grp: 8192,
        max_mcast_qp_attach: 56,
        max_total_mcast_qp_attach: 0x7_0000,
    };

    /// A ConnectX-5 (MT4119) on an InfiniBand port (see the module docs).
    pub const MLX5: Attrs = Attrs {
        // Mellanox's OUI.
        vendor_id: 0x02c9,
        vendor_part_id: 4119,
        page_size_cap: 0xffff_ffff_ffff_f000,
        max_mr_size: u64::MAX,
        max_qp: 1 << 18,
        max_qp_wr: 1 << 15,
        max_sge: 30,
        max_sge_rd: 30,
        max_cq: 1 << 24,
        max_cqe: (1 << 22) - 1,
        max_mr: 1 << 24,
        max_pd: 1 << 24,
        // Kernel hw/mlx5/main.c sets IB_DEVICE_MEM_WINDOW and _TYPE_2B.
        max_mw: 1 << 24,
        mw_flags: IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B,
        rereg_mr: true,
        max_qp_rd_atom: 16,
        max_qp_init_rd_atom: 16,
        atomic_cap: AtomicCap::Hca,
        max_srq: 1 << 23,
        max_srq_wr: (1 << 15) - 1,
        max_srq_sge: 31,
        min_srq_wr: 0,
        // What fits in every ConnectX-4 and later's largest send WQE with room for the
        // headers (the provider grants up to its `max_sq_desc_sz`).
        max_inline: 256,
        max_mtu: Mtu::Mtu4096,
        active_mtu: Mtu::Mtu4096,
        max_msg_sz: 1 << 30,
        link_layer: LinkLayer::InfiniBand,
        // The kernel's mlx5 takes it on a device with the block_lb_mc capability (every
        // ConnectX-4 and later); rdma-core's tests pass it to UD QPs of Mellanox devices.
        qp_create_flags: IBV_QP_CREATE_BLOCK_SELF_MCAST_LB,
        // 1 << log_max_mcg (21), max_qp_mcg (240), and their product (the kernel's
        // mlx5_ib_query_device()).
        max_mcast_grp: 1 << 21,
        max_mcast_qp_attach: 240,
        max_total_mcast_qp_attach: 240 << 21,
    };

    /// The smaller of `a`'s and `b`'s value of every limit, and no vendor
    /// ([`NO_VENDOR`], as a software device; not 0, which programs take for a broken
    /// device): what fits there fits on both.
    pub fn smaller(a: &Attrs, b: &Attrs) -> Attrs {
        let mtu = |x: Mtu, y: Mtu| if (x as u32) <= (y as u32) { x } else { y };
        let atomic = |x: AtomicCap, y: AtomicCap| if (x as u32) <= (y as u32) { x } else { y };
        Attrs {
            vendor_id: NO_VENDOR,
            vendor_part_id: 0,
            // Page sizes both support.
            page_size_cap: a.page_size_cap & b.page_size_cap,
            max_mr_size: a.max_mr_size.min(b.max_mr_size),
            max_qp: a.max_qp.min(b.max_qp),
            max_qp_wr: a.max_qp_wr.min(b.max_qp_wr),
            max_sge: a.max_sge.min(b.max_sge),
            max_sge_rd: a.max_sge_rd.min(b.max_sge_rd),
            max_cq: a.max_cq.min(b.max_cq),
            max_cqe: a.max_cqe.min(b.max_cqe),
            max_mr: a.max_mr.min(b.max_mr),
            max_pd: a.max_pd.min(b.max_pd),
            max_mw: a.max_mw.min(b.max_mw),
            mw_flags: a.mw_flags & b.mw_flags,
            rereg_mr: a.rereg_mr && b.rereg_mr,
            max_qp_rd_atom: a.max_qp_rd_atom.min(b.max_qp_rd_atom),
            max_qp_init_rd_atom: a.max_qp_init_rd_atom.min(b.max_qp_init_rd_atom),
            atomic_cap: atomic(a.atomic_cap, b.atomic_cap),
            max_srq: a.max_srq.min(b.max_srq),
            max_srq_wr: a.max_srq_wr.min(b.max_srq_wr),
            max_srq_sge: a.max_srq_sge.min(b.max_srq_sge),
            min_srq_wr: a.min_srq_wr.max(b.min_srq_wr),
            max_inline: a.max_inline.min(b.max_inline),
            max_mtu: mtu(a.max_mtu, b.max_mtu),
            active_mtu: mtu(a.active_mtu, b.active_mtu),
            max_msg_sz: a.max_msg_sz.min(b.max_msg_sz),
            // InfiniBand's addressing takes the address vectors of both (a LID, with or
            // without the GRH), so programs written for either run; the GRH that RoCE
            // requires is the one difference it lets through.
            link_layer: if a.link_layer == LinkLayer::InfiniBand || b.link_layer == LinkLayer::InfiniBand {
                LinkLayer::InfiniBand
            } else {
                a.link_layer
            },
            // Flags both accept.
            qp_create_flags: a.qp_create_flags & b.qp_create_flags,
            max_mcast_grp: a.max_mcast_grp.min(b.max_mcast_grp),
            max_mcast_qp_attach: a.max_mcast_qp_attach.min(b.max_mcast_qp_attach),
            max_total_mcast_qp_attach: a.max_total_mcast_qp_attach.min(b.max_total_mcast_qp_attach),
        }
    }
}
