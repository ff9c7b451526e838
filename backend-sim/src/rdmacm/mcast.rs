//! rdma_cm's multicast groups (`man rdma_join_multicast`; the kernel's
//! `rdma_join_multicast()`, `cma_set_mgid()`, `cma_iboe_set_mgid()` and
//! `cma_make_mc_event()`): the group an IP multicast address names, as the address
//! vector a `MULTICAST_JOIN` event reports.
//!
//! - **RoCE** (an Ethernet port; rdma_cm's default GID type there is RoCE v2): the MGID
//!   is the address itself, IPv4-mapped for IPv4; no MLID (0); hop limit 64.
//! - **InfiniBand**: the MGID is IPoIB's mapping of the address (RFC 4391's
//!   `ff1S:401b:PKEY::` prefix and the address's low 28 bits; `ff1S:601b:PKEY:` and its
//!   low 80 bits for IPv6), with rdma_cm's signature (0x01 for 0x1b) for `RDMA_PS_UDP`,
//!   link-local scope (IPoIB's default broadcast group) and the default P_Key. The MLID,
//!   which a subnet administrator assigns, is a multicast LID drawn from the MGID, so
//!   every member on every host gets the same one.
//!
//! The join itself programs nothing: as with librdmacm, the program attaches its QP
//! (`ibv_attach_mcast` with the event's MGID and MLID), which is where the sim's fabric
//! learns that a device receives the group (`crate::mcast`). A process can thus only
//! ever attach its own QPs.

use std::net::{IpAddr, SocketAddr};

use verbs_api::rdmacm::{PortSpace, UdParam, UDP_QKEY};
use verbs_api::{AhAttr, Gid, GlobalRoute, LinkLayer, MULTICAST_LID_BASE, MULTICAST_QPN};

use super::route::{self, SGID_INDEX};

/// IPoIB's P_Key of the default partition (the broadcast group's).
const PKEY: u16 = 0xffff;
/// Link-local scope, IPoIB's default broadcast group's.
const IB_SCOPE: u8 = 0x2;
/// The hop limit of a RoCE v2 group (`IPV6_DEFAULT_HOPLIMIT`).
const ROCE_HOP_LIMIT: u8 = 64;

/// The MGID of multicast address `ip` for an id in port space `ps` on a port of link
/// layer `link`.
pub fn mgid(ip: IpAddr, ps: PortSpace, link: LinkLayer) -> Gid {
    if link == LinkLayer::Ethernet {
        return Gid(route::ip16(ip));
    }
    let mut g = [0u8; 16];
    g[0] = 0xff;
    g[1] = 0x10 | IB_SCOPE;
    g[4..6].copy_from_slice(&PKEY.to_be_bytes());
    match ip {
        IpAddr::V4(v4) => {
            g[2..4].copy_from_slice(&[0x40, 0x1b]);
            let a = v4.octets();
            g[12] = a[0] & 0x0f;
            g[13..16].copy_from_slice(&a[1..4]);
        }
        IpAddr::V6(v6) => {
            g[2..4].copy_from_slice(&[0x60, 0x1b]);
            g[6..16].copy_from_slice(&v6.octets()[6..16]);
        }
    }
    if ps == PortSpace::Udp {
        // rdma_cm's signature (`mc_map[7] = 0x01`).
        g[3] = 0x01;
    }
    Gid(g)
}

/// The MLID of group `mgid` on an InfiniBand port: a multicast LID (0xC000 to 0xFFFE)
/// drawn from the MGID; 0 on an Ethernet port.
pub fn mlid(mgid: &Gid, link: LinkLayer) -> u16 {
    if link == LinkLayer::Ethernet {
        return 0;
    }
    let fold = mgid.0.chunks_exact(2).fold(0u16, |acc, c| {
        acc.rotate_left(5) ^ u16::from_be_bytes([c[0], c[1]])
    });
    MULTICAST_LID_BASE + fold % (0xffff - MULTICAST_LID_BASE)
}

/// The parameters of the `MULTICAST_JOIN` event for a join of `addr` by an id in port
/// space `ps` with traffic class `tos` on a port of link layer `link`.
pub fn join_param(addr: SocketAddr, ps: PortSpace, link: LinkLayer, tos: u8) -> UdParam {
    let dgid = mgid(addr.ip(), ps, link);
    let dlid = mlid(&dgid, link);
    let roce = link == LinkLayer::Ethernet;
    UdParam {
        private_data: Vec::new(),
        ah_attr: AhAttr {
            grh: GlobalRoute {
                dgid,
                flow_label: 0,
                sgid_index: SGID_INDEX,
                hop_limit: if roce { ROCE_HOP_LIMIT } else { 0 },
                traffic_class: tos,
            },
            dlid,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            is_global: true,
            port_num: 1,
        },
        qp_num: MULTICAST_QPN,
        qkey: UDP_QKEY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roce_mgids_are_the_address_ipv4_mapped() {
        let g = mgid("239.1.2.3".parse().unwrap(), PortSpace::Udp, LinkLayer::Ethernet);
        assert_eq!(
            g.0,
            "::ffff:239.1.2.3".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(mlid(&g, LinkLayer::Ethernet), 0);
        assert!(g.is_multicast());
    }

    #[test]
    fn ib_mgids_are_ipoibs_mapping_with_rdma_cms_signature() {
        // (The address's low 28 bits: 239 = 0xef keeps 0xf.)
        let ip: IpAddr = "239.129.2.3".parse().unwrap();
        let udp = mgid(ip, PortSpace::Udp, LinkLayer::InfiniBand);
        assert_eq!(
            udp.0,
            "ff12:4001:ffff::f81:203"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
        );
        let ipoib = mgid(ip, PortSpace::Ipoib, LinkLayer::InfiniBand);
        assert_eq!(
            ipoib.0,
            "ff12:401b:ffff::f81:203"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
        );
        assert!(udp.is_multicast());
        let l = mlid(&udp, LinkLayer::InfiniBand);
        assert!((MULTICAST_LID_BASE..0xffff).contains(&l), "{l:#x}");
        assert_eq!(l, mlid(&udp, LinkLayer::InfiniBand));
    }
}
