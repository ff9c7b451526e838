//! Addresses and routes of the sim's connection manager, as rdma_cm has them on RoCE: the
//! source address the host's routing table picks for a destination, which device an IP
//! belongs to, and the path record (and so the address vector) between two devices.
//!
//! - A device has the IPs its GID table lists (its advertised address, and with a
//!   wildcard listen the host's others). A loopback address, or another address of this
//!   host that no device lists, belongs to the first device, as the kernel's rdma_cm
//!   binds a loopback address to the first device with an active port.
//! - A path names the peer device by the GID of its IP and its LID (0 on an Ethernet
//!   port), and this device by the GID at index 1 (the GID of its IP), with a GRH on
//!   both kinds of port: on the sim a LID alone names a device only on this host, and a
//!   path may cross hosts.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use verbs_api::rdmacm::PathRecord;
use verbs_api::{AhAttr, Gid, GlobalRoute, LinkLayer, Mtu};

use crate::device::DeviceShared;

/// The GID index of a device's own IP (what paths and address vectors use).
pub const SGID_INDEX: u8 = 1;
/// The hop limit of a RoCE path (the IPv4 TTL the kernel's route gives).
const ROCE_HOP_LIMIT: u8 = 64;
/// The hop limit of the sim's InfiniBand paths, which carry a GRH to cross hosts.
const IB_HOP_LIMIT: u8 = 1;
/// The packet lifetime of a RoCE path (the kernel's `CMA_IBOE_PACKET_LIFETIME`), and
/// of the sim's InfiniBand paths.
pub const PACKET_LIFE_TIME: u8 = 16;
/// The path's static rate (`IB_RATE_10_GBPS`).
const RATE: u8 = 3;

/// The source address the host's routing table picks for `dst` (a connected UDP socket's
/// own address), or why there is none (ENETUNREACH, ...).
pub fn source_for(dst: IpAddr) -> io::Result<IpAddr> {
    let any: IpAddr = match dst {
        IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let s = std::net::UdpSocket::bind(SocketAddr::new(any, 0))?;
    s.connect(SocketAddr::new(dst, 9))?;
    Ok(s.local_addr()?.ip())
}

/// Whether `ip` is one of this host's addresses (a socket can be bound to it).
pub fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// An IP as rdma_cm's messages and GIDs carry it: IPv6, IPv4-mapped for IPv4.
pub fn ip16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP of [`ip16`]'s spelling.
pub fn ip_of16(b: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(b);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Whether device `d` has `ip` (its GID table lists it).
pub fn has_ip(d: &DeviceShared, ip: IpAddr) -> bool {
    d.addr.holds_gid(&ip16(ip))
}

/// A device as the other end of a path: the GID of its IP and its LID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Where its listener is (what links and CM messages are addressed to).
    pub addr: SocketAddr,
    /// Its GID.
    pub gid: [u8; 16],
    /// Its LID (0 on an Ethernet port).
    pub lid: u16,
}

impl Peer {
    /// The peer a GID and LID name.
    pub fn new(gid: [u8; 16], lid: u16) -> Peer {
        Peer {
            addr: crate::addressing::gid_addr(&gid, lid),
            gid,
            lid,
        }
    }
}

/// The path from device `d` to `peer` (to a device not known yet: the GID of `dst`'s IP),
/// with traffic class `tos`.
pub fn path(d: &DeviceShared, peer: Option<&Peer>, dst: IpAddr, tos: u8) -> PathRecord {
    let roce = d.limits.link_layer == LinkLayer::Ethernet;
    let (dgid, dlid) = match peer {
        Some(p) => (p.gid, p.lid),
        None => (ip16(dst), 0),
    };
    PathRecord {
        dgid: Gid(dgid),
        sgid: d.addr.ip_gid(),
        dlid,
        slid: d.addr.lid(),
        flow_label: 0,
        hop_limit: if roce { ROCE_HOP_LIMIT } else { IB_HOP_LIMIT },
        traffic_class: tos,
        reversible: true,
        pkey: 0xffff,
        sl: 0,
        mtu: d.limits.active_mtu,
        rate: RATE,
        packet_life_time: PACKET_LIFE_TIME,
        preference: 0,
    }
}

/// The address vector a path gives (`ib_init_ah_attr_from_path`).
pub fn ah_attr(p: &PathRecord) -> AhAttr {
    AhAttr {
        grh: GlobalRoute {
            dgid: p.dgid,
            flow_label: p.flow_label,
            sgid_index: SGID_INDEX,
            hop_limit: p.hop_limit,
            traffic_class: p.traffic_class,
        },
        dlid: p.dlid,
        sl: p.sl,
        src_path_bits: 0,
        static_rate: p.rate,
        is_global: true,
        port_num: 1,
    }
}

/// The smaller of two path MTUs.
pub fn min_mtu(a: Mtu, b: u8) -> Mtu {
    match Mtu::from_raw(u32::from(b)) {
        Some(m) if (m as u32) < (a as u32) => m,
        _ => a,
    }
}
