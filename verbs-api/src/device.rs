//! Devices, ports and what they can do: `ibv_get_device_list`, `ibv_query_device`
//! (`struct ibv_device_attr`), `ibv_query_port` (`struct ibv_port_attr`),
//! `ibv_query_gid` (`union ibv_gid`), plus the [`Capabilities`] summary that programs and
//! the conformance suite use to decide what to expect from a device.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// A 128-bit global identifier (`union ibv_gid`). For RoCE it is an IPv6 address
/// (IPv4-mapped for IPv4 interfaces).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID.
    pub const ZERO: Gid = Gid([0; 16]);

    /// The GID as an IPv6 address.
    pub fn to_ipv6(self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// The IPv4 address, if this is an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn to_ipv4_mapped(self) -> Option<Ipv4Addr> {
        self.to_ipv6().to_ipv4_mapped()
    }

    /// Whether every byte is zero.
    pub fn is_zero(self) -> bool {
        self.0 == [0; 16]
    }

    /// Whether this is a multicast GID, as the kernel's `rdma_is_multicast_addr()`
    /// decides: an IPv4-mapped GID of an IPv4 multicast address (`::ffff:224.0.0.0/100`,
    /// RoCE v2 over IPv4), or any GID whose first byte is 0xff (IPv6 multicast, and
    /// InfiniBand's multicast GIDs).
    pub fn is_multicast(self) -> bool {
        match self.to_ipv4_mapped() {
            Some(v4) => v4.is_multicast(),
            None => self.0[0] == 0xff,
        }
    }
}

/// A GUID (host order) as `ibv_devinfo` prints it and sysfs spells it (`node_guid`):
/// four groups of four hex digits.
pub fn guid_text(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (g >> 48) & 0xffff,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Self {
        Gid(a.octets())
    }
}

impl From<Ipv4Addr> for Gid {
    /// The IPv4-mapped GID `::ffff:a.b.c.d`, as RoCE v2 uses for IPv4 interfaces.
    fn from(a: Ipv4Addr) -> Self {
        Gid(a.to_ipv6_mapped().octets())
    }
}

impl fmt::Display for Gid {
    /// `ibv_devinfo`'s format: eight groups of four hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// One entry of the device list (`ibv_get_device_list`, `ibv_get_device_name`,
/// `ibv_get_device_guid`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel/provider name, e.g. `mlx5_0`, `rxe0`, `sim0`.
    pub name: String,
    /// Node GUID.
    pub guid: u64,
    /// Transport, e.g. "InfiniBand" (`ibv_transport_type`).
    pub transport: String,
}

/// `enum ibv_atomic_cap`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u32)]
pub enum AtomicCap {
    /// `IBV_ATOMIC_NONE`: no atomics.
    #[default]
    None = 0,
    /// `IBV_ATOMIC_HCA`: atomic against other atomics of this HCA.
    Hca = 1,
    /// `IBV_ATOMIC_GLOB`: atomic against CPU accesses too.
    Glob = 2,
}

impl AtomicCap {
    /// From the raw `ibv_atomic_cap` value.
    pub fn from_raw(v: u32) -> Self {
        match v {
            1 => AtomicCap::Hca,
            2 => AtomicCap::Glob,
            _ => AtomicCap::None,
        }
    }
}

/// `struct ibv_device_attr` (the fields programs use).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID.
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Largest registrable memory region.
    pub max_mr_size: u64,
    /// Supported page sizes.
    pub page_size_cap: u64,
    /// Vendor ID (IEEE OUI).
    pub vendor_id: u32,
    /// Vendor part ID.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Maximum number of QPs.
    pub max_qp: u32,
    /// Maximum outstanding WRs per queue.
    pub max_qp_wr: u32,
    /// `enum ibv_device_cap_flags` bits.
    pub device_cap_flags: u32,
    /// Maximum SGEs per send/receive WR.
    pub max_sge: u32,
    /// Maximum SGEs per RDMA READ WR.
    pub max_sge_rd: u32,
    /// Maximum number of CQs.
    pub max_cq: u32,
    /// Maximum CQ entries.
    pub max_cqe: u32,
    /// Maximum number of MRs.
    pub max_mr: u32,
    /// Maximum number of memory windows (0: none).
    pub max_mw: u32,
    /// Maximum number of PDs.
    pub max_pd: u32,
    /// Maximum outstanding RDMA READ/atomic requests a QP may receive (responder side).
    pub max_qp_rd_atom: u32,
    /// Maximum outstanding RDMA READ/atomic requests a QP may issue (requester side).
    pub max_qp_init_rd_atom: u32,
    /// Atomic operation support.
    pub atomic_cap: AtomicCap,
    /// Maximum SRQs (0: no SRQ).
    pub max_srq: u32,
    /// Maximum WRs per SRQ.
    pub max_srq_wr: u32,
    /// Maximum SGEs per SRQ receive.
    pub max_srq_sge: u32,
    /// Maximum number of partitions.
    pub max_pkeys: u16,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
    /// Most multicast groups the device's QPs may be attached to (0: no multicast).
    pub max_mcast_grp: u32,
    /// Most QPs attached to one multicast group.
    pub max_mcast_qp_attach: u32,
    /// Most attachments of QPs to multicast groups in all.
    pub max_total_mcast_qp_attach: u32,
}

/// `enum ibv_port_state`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u32)]
pub enum PortState {
    /// `IBV_PORT_NOP`
    #[default]
    Nop = 0,
    /// `IBV_PORT_DOWN`
    Down = 1,
    /// `IBV_PORT_INIT`
    Init = 2,
    /// `IBV_PORT_ARMED`
    Armed = 3,
    /// `IBV_PORT_ACTIVE`
    Active = 4,
    /// `IBV_PORT_ACTIVE_DEFER`
    ActiveDefer = 5,
}

impl PortState {
    /// From the raw `ibv_port_state` value.
    pub fn from_raw(v: u32) -> Self {
        match v {
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            _ => PortState::Nop,
        }
    }
}

/// `IBV_LINK_LAYER_*`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkLayer {
    /// Unspecified (treated as InfiniBand).
    #[default]
    Unspecified = 0,
    /// InfiniBand.
    InfiniBand = 1,
    /// Ethernet (RoCE, iWARP).
    Ethernet = 2,
}

/// `enum ibv_mtu`: the path MTU of a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
pub enum Mtu {
    /// `IBV_MTU_256`
    Mtu256 = 1,
    /// `IBV_MTU_512`
    Mtu512 = 2,
    /// `IBV_MTU_1024`
    #[default]
    Mtu1024 = 3,
    /// `IBV_MTU_2048`
    Mtu2048 = 4,
    /// `IBV_MTU_4096`
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// From the raw `ibv_mtu` value.
    pub fn from_raw(v: u32) -> Option<Self> {
        Some(match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

/// `struct ibv_port_attr` (the fields programs use).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical port state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// Length of the GID table.
    pub gid_tbl_len: u32,
    /// Largest message size.
    pub max_msg_sz: u32,
    /// Length of the P_Key table.
    pub pkey_tbl_len: u16,
    /// Base LID of the port (0 on RoCE; on the sim, its TCP port: see `backend-sim`).
    pub lid: u16,
    /// LID of the subnet manager.
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Active link width (`ibv_width` encoding).
    pub active_width: u8,
    /// Active link speed (`ibv_speed` encoding).
    pub active_speed: u8,
    /// Physical port state.
    pub phys_state: u8,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// UD datagrams dropped for a wrong Q_Key (`qkey_viol_cntr`).
    pub qkey_viol_cntr: u32,
    /// Packets dropped for a wrong P_Key (`bad_pkey_cntr`).
    pub bad_pkey_cntr: u32,
}

/// What a device can do, in one place: a summary of device and port attributes plus
/// what the verbs attributes do not say (immediate data, inline size). Programs and the
/// conformance suite read it to decide what to expect (as pyverbs skips on EOPNOTSUPP and
/// google/rdma-unit-test introspects per device).
///
/// `#[non_exhaustive]`: backends build it from `Capabilities::default()` and set fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Atomic support (`IBV_ATOMIC_NONE` means CMP_AND_SWP / FETCH_AND_ADD fail).
    pub atomic_cap: AtomicCap,
    /// SEND_WITH_IMM and RDMA_WRITE_WITH_IMM are supported.
    pub imm_data: bool,
    /// Shared receive queues are supported.
    pub srq: bool,
    /// Maximum SRQs.
    pub max_srq: u32,
    /// Maximum receives per SRQ.
    pub max_srq_wr: u32,
    /// Maximum SGEs per SRQ receive.
    pub max_srq_sge: u32,
    /// SRQs can be resized (`IBV_DEVICE_SRQ_RESIZE`: `modify` with `MAX_WR`).
    pub srq_resize: bool,
    /// Type 1 memory windows (`IBV_DEVICE_MEM_WINDOW`).
    pub mw_type1: bool,
    /// Type 2 memory windows (`IBV_DEVICE_MEM_WINDOW_TYPE_2A` or `_2B`).
    pub mw_type2: bool,
    /// UD QPs are supported.
    pub ud: bool,
    /// UC QPs are supported.
    pub uc: bool,
    /// Largest `max_inline_data` a QP may be created with (0: inline not supported or
    /// not known).
    pub max_inline_data: u32,
    /// Maximum SGEs per send WR.
    pub max_send_sge: u32,
    /// Maximum SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Maximum SGEs per RDMA READ WR.
    pub max_sge_rd: u32,
    /// Maximum WRs per queue.
    pub max_qp_wr: u32,
    /// Maximum CQ entries.
    pub max_cqe: u32,
    /// Maximum outstanding READ/atomic requests a QP may issue.
    pub max_qp_init_rd_atom: u32,
    /// Maximum outstanding READ/atomic requests a QP may receive.
    pub max_qp_rd_atom: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Link layer of port 1.
    pub link_layer: LinkLayer,
    /// The `create_flags` of `ibv_create_qp_ex` the device accepts (`IBV_QP_CREATE_*`,
    /// libibverbs' bits; 0: none, or not known).
    pub qp_create_flags: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_formats_like_ibv_devinfo() {
        let g = Gid::from(Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:0a4d:0001");
        assert_eq!(g.to_ipv4_mapped(), Some(Ipv4Addr::new(10, 77, 0, 1)));
        assert!(Gid::ZERO.is_zero());
    }

    #[test]
    fn multicast_gids_are_the_kernels() {
        let g = |s: &str| Gid::from(s.parse::<Ipv6Addr>().unwrap());
        assert!(g("::ffff:239.1.2.3").is_multicast());
        assert!(g("::ffff:224.0.0.1").is_multicast());
        assert!(!g("::ffff:10.77.0.1").is_multicast());
        assert!(g("ff12:401b::1").is_multicast());
        assert!(g("ff0e::1").is_multicast());
        assert!(!g("fe80::1").is_multicast());
        assert!(!Gid::ZERO.is_multicast());
    }

    #[test]
    fn mtu_bytes() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_raw(3), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_raw(9), None);
    }
}
