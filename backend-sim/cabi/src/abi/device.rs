//! Devices and what they report: `struct ibv_device`, `union ibv_gid`,
//! `struct ibv_gid_entry`, `struct ibv_device_attr(_ex)`, `struct ibv_port_attr`
//! (`man ibv_get_device_list`, `man ibv_query_device_ex`, `man ibv_query_port`,
//! `man ibv_query_gid_ex`).

use std::ffi::{c_char, c_int, c_void};

/// `IBV_SYSFS_NAME_MAX`
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `IBV_NODE_CA`
pub const IBV_NODE_CA: c_int = 1;
/// `IBV_TRANSPORT_IB`
pub const IBV_TRANSPORT_IB: c_int = 0;

/// `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    /// `struct _ibv_device_ops` (obsolete, never called).
    pub _ops: [*mut c_void; 2],
    /// `enum ibv_node_type`
    pub node_type: c_int,
    /// `enum ibv_transport_type`
    pub transport_type: c_int,
    /// Name of the kernel device, e.g. `mlx5_0` (here `sim0`).
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    /// Name of the uverbs device.
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    /// The uverbs device's sysfs directory.
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    /// The IB device's sysfs directory.
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// `union ibv_gid` (16 bytes, aligned as its `__be64` halves).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid {
    /// `raw`
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_entry {
    /// The GID.
    pub gid: ibv_gid,
    /// Its index in the port's table.
    pub gid_index: u32,
    /// The port.
    pub port_num: u32,
    /// `enum ibv_gid_type`
    pub gid_type: u32,
    /// The netdev's ifindex (0: none).
    pub ndev_ifindex: u32,
}

/// `IBV_GID_TYPE_IB`
pub const IBV_GID_TYPE_IB: u32 = 0;
/// `IBV_GID_TYPE_ROCE_V2`
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `IBV_GID_TYPE_SYSFS_IB_ROCE_V1` (`enum ibv_gid_type_sysfs`, libibverbs' driver.h)
pub const IBV_GID_TYPE_SYSFS_IB_ROCE_V1: u32 = 0;
/// `IBV_GID_TYPE_SYSFS_ROCE_V2`
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    /// Big-endian.
    pub node_guid: u64,
    /// Big-endian.
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    /// `enum ibv_atomic_cap`
    pub atomic_cap: u32,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_query_device_ex_input`.
#[repr(C)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

/// `struct ibv_odp_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_odp_caps {
    pub general_caps: u64,
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

/// `struct ibv_tso_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tso_caps {
    pub max_tso: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_rss_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_rss_caps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

/// `struct ibv_packet_pacing_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_packet_pacing_caps {
    pub qp_rate_limit_min: u32,
    pub qp_rate_limit_max: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_tm_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tm_caps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

/// `struct ibv_cq_moderation_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_cq_moderation_caps {
    pub max_cq_count: u16,
    pub max_cq_period: u16,
}

/// `struct ibv_pci_atomic_caps`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_pci_atomic_caps {
    pub fetch_add: u16,
    pub swap: u16,
    pub compare_swap: u16,
}

/// `struct ibv_device_attr_ex`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_caps: ibv_tso_caps,
    pub rss_caps: ibv_rss_caps,
    pub max_wq_type_rq: u32,
    pub packet_pacing_caps: ibv_packet_pacing_caps,
    pub raw_packet_caps: u32,
    pub tm_caps: ibv_tm_caps,
    pub cq_mod_caps: ibv_cq_moderation_caps,
    pub max_dm_size: u64,
    pub pci_atomic_caps: ibv_pci_atomic_caps,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    /// `enum ibv_port_state`
    pub state: u32,
    /// `enum ibv_mtu`
    pub max_mtu: u32,
    /// `enum ibv_mtu`
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// Bytes of `struct _compat_ibv_port_attr`, what programs built before
/// `port_cap_flags2` existed pass to the exported `ibv_query_port`: `ibv_port_attr`
/// up to and including `flags`.
pub const COMPAT_PORT_ATTR_SIZE: usize = std::mem::offset_of!(ibv_port_attr, port_cap_flags2);
