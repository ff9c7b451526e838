//! A whole RoCE v2 packet as it would cross an Ethernet wire (IBA Annex A17): Ethernet,
//! IPv4 (for IPv4-mapped GIDs) or IPv6, UDP to port 4791, the transport headers, the
//! payload and its pad, and the ICRC. The fields an HCA derives rather than reads from
//! the verbs are derived as Linux's rxe derives them: the UDP source port from the QP
//! numbers and flow label (`rdma_get_udp_sport()`), IPv4's don't-fragment bit, a UDP
//! checksum of 0; and a sim device's MAC from its GID ([`crate::gid`]).

use std::net::Ipv6Addr;

use super::headers::{HeaderError, Headers};
use super::icrc::icrc;

/// RoCE v2's UDP destination port (IANA).
pub const ROCE_V2_PORT: u16 = 4791;

/// Ethernet header length.
pub const ETH_LEN: usize = 14;

/// Where a packet goes: the two ends' GIDs and what the sender's address vector says of
/// the route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// The sender's GID (its source GID index's entry).
    pub src_gid: [u8; 16],
    /// The destination's GID.
    pub dst_gid: [u8; 16],
    /// The UDP source port ([`udp_source_port`]).
    pub src_port: u16,
    /// Traffic class (IPv4: the type of service byte).
    pub traffic_class: u8,
    /// Hop limit (IPv4: TTL).
    pub hop_limit: u8,
    /// Flow label (IPv6 only; 20 bits).
    pub flow_label: u32,
}

/// The UDP source port of a QP's packets, as rxe chooses it: from the flow label of
/// its address vector, or when that is 0 from the two QP numbers
/// (`rdma_calc_flow_label()` then `rdma_flow_label_to_udp_sport()`), into 0xC000-0xFFFF.
pub fn udp_source_port(flow_label: u32, qpn: u32, dst_qpn: u32) -> u16 {
    let fl = match flow_label & 0xf_ffff {
        0 => {
            let mut v = qpn as u64 * dst_qpn as u64;
            v ^= v >> 20;
            v ^= v >> 40;
            (v & 0xf_ffff) as u32
        }
        fl => fl,
    };
    let low = (fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14);
    (low | 0xc000) as u16
}

/// The UDP source port of a QP whose address vector never set one (a UD QP): rxe's
/// `RXE_ROCE_V2_SPORT + (hash_32(qpn, 14) & 0x3fff)`.
pub fn udp_source_port_of_qp(qpn: u32) -> u16 {
    let hash = qpn.wrapping_mul(0x61c8_8647) >> (32 - 14);
    0xc000 + (hash & 0x3fff) as u16
}

/// The MAC of the sim device with this GID: `02:00` and the IPv4 address for an
/// IPv4-mapped GID or a sim default GID (see [`crate::gid`]), the EUI-48 inside a
/// modified EUI-64 interface id, else `02` and the GID's last five bytes. A multicast
/// GID's is the group's Ethernet multicast address, as IP maps it (RFC 1112: `01:00:5e`
/// and the low 23 bits of an IPv4 group; RFC 2464: `33:33` and the last 4 bytes of an
/// IPv6 one).
pub fn mac_of(gid: &[u8; 16]) -> [u8; 6] {
    let ip = Ipv6Addr::from(*gid);
    match ip.to_ipv4_mapped() {
        Some(v4) if v4.is_multicast() => {
            let [_, b, c, d] = v4.octets();
            return [0x01, 0x00, 0x5e, b & 0x7f, c, d];
        }
        None if ip.is_multicast() => return [0x33, 0x33, gid[12], gid[13], gid[14], gid[15]],
        _ => {}
    }
    let v4 = Ipv6Addr::from(*gid)
        .to_ipv4_mapped()
        .or_else(|| crate::gid::default_ipv4(gid));
    if let Some(v4) = v4 {
        let [a, b, c, d] = v4.octets();
        return [0x02, 0x00, a, b, c, d];
    }
    let e = &gid[8..16];
    if e[3] == 0xff && e[4] == 0xfe {
        return [e[0] ^ 0x02, e[1], e[2], e[5], e[6], e[7]];
    }
    [0x02, gid[11], gid[12], gid[13], gid[14], gid[15]]
}

fn ipv4_of(gid: &[u8; 16]) -> Option<[u8; 4]> {
    Ipv6Addr::from(*gid).to_ipv4_mapped().map(|a| a.octets())
}

/// The IPv4 header checksum (RFC 791: one's complement of the one's complement sum).
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]]) as u32).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Appends the packet to `out`: `headers` and `payload` (its pad added) on `route`,
/// with its ICRC. IPv4 when both GIDs are IPv4-mapped, else IPv6.
pub fn write(route: &Route, headers: &Headers, payload: &[u8], out: &mut Vec<u8>) -> Result<(), HeaderError> {
    let start = out.len();
    let ip = write_headers(route, headers, payload.len(), out)? + start;
    let pad = (4 - payload.len() % 4) % 4;
    out.extend_from_slice(payload);
    out.extend_from_slice(&[0u8; 3][..pad]);
    let crc = icrc(&out[ip..]).expect("a packet this function built has its headers");
    out.extend_from_slice(&crc);
    Ok(())
}

/// Appends the packet's headers only (Ethernet, IP, UDP, transport), their lengths
/// those of the whole packet with `payload_len` payload bytes, as a capture with a
/// snap length of the headers keeps it. Returns where the IP header starts, from the
/// start of what it appended.
pub fn write_headers(
    route: &Route,
    headers: &Headers,
    payload_len: usize,
    out: &mut Vec<u8>,
) -> Result<usize, HeaderError> {
    let pad = (4 - payload_len % 4) % 4;
    let transport = headers.len() + payload_len + pad + 4;
    let start = out.len();
    out.extend_from_slice(&mac_of(&route.dst_gid));
    out.extend_from_slice(&mac_of(&route.src_gid));
    let v4 = ipv4_of(&route.src_gid).zip(ipv4_of(&route.dst_gid));
    let udp_len = (8 + transport) as u16;
    match v4 {
        Some((src, dst)) => {
            out.extend_from_slice(&0x0800u16.to_be_bytes());
            let total = (20 + 8 + transport) as u16;
            let mut h = [0u8; 20];
            h[0] = 0x45;
            h[1] = route.traffic_class;
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[6] = 0x40; // don't fragment, as rxe sends
            h[8] = route.hop_limit;
            h[9] = 17;
            h[12..16].copy_from_slice(&src);
            h[16..20].copy_from_slice(&dst);
            let sum = ipv4_checksum(&h);
            h[10..12].copy_from_slice(&sum.to_be_bytes());
            out.extend_from_slice(&h);
        }
        None => {
            out.extend_from_slice(&0x86ddu16.to_be_bytes());
            let word = (6u32 << 28) | ((route.traffic_class as u32) << 20) | (route.flow_label & 0xf_ffff);
            out.extend_from_slice(&word.to_be_bytes());
            out.extend_from_slice(&udp_len.to_be_bytes());
            out.push(17);
            out.push(route.hop_limit);
            out.extend_from_slice(&route.src_gid);
            out.extend_from_slice(&route.dst_gid);
        }
    }
    out.extend_from_slice(&route.src_port.to_be_bytes());
    out.extend_from_slice(&ROCE_V2_PORT.to_be_bytes());
    out.extend_from_slice(&udp_len.to_be_bytes());
    out.extend_from_slice(&[0, 0]); // no UDP checksum (RoCE v2 sends 0)
    if let Err(e) = headers.write(payload_len, out) {
        out.truncate(start);
        return Err(e);
    }
    Ok(ETH_LEN)
}

/// The length of the packet [`write`] would build for `headers` and `payload_len` bytes.
pub fn wire_len(route: &Route, headers: &Headers, payload_len: usize) -> usize {
    let v4 = ipv4_of(&route.src_gid).is_some() && ipv4_of(&route.dst_gid).is_some();
    let pad = (4 - payload_len % 4) % 4;
    ETH_LEN + if v4 { 20 } else { 40 } + 8 + headers.len() + payload_len + pad + 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::headers::{ack_syndrome, Aeth};
    use crate::capture::opcode::op;

    fn mapped(a: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a);
        g
    }

    #[test]
    fn an_ack_over_ipv4() {
        let route = Route {
            src_gid: mapped([10, 0, 0, 1]),
            dst_gid: mapped([10, 0, 0, 2]),
            src_port: udp_source_port(0, 17, 18),
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        };
        let mut h = Headers::new(op::ACKNOWLEDGE, 18, 5);
        h.aeth = Some(Aeth {
            syndrome: ack_syndrome(),
            msn: 3,
        });
        let mut out = Vec::new();
        write(&route, &h, &[], &mut out).unwrap();
        assert_eq!(out.len(), wire_len(&route, &h, 0));
        assert_eq!(out.len(), 14 + 20 + 8 + 12 + 4 + 4);
        assert_eq!(&out[0..6], &[2, 0, 10, 0, 0, 2]);
        assert_eq!(&out[12..14], &[0x08, 0x00]);
        assert_eq!(ipv4_checksum(&out[14..34]), 0, "a valid header sums to 0");
        assert_eq!(u16::from_be_bytes([out[36], out[37]]), 4791);
        assert!(u16::from_be_bytes([out[34], out[35]]) >= 0xc000);
    }

    #[test]
    fn source_ports_as_rxe_derives_them() {
        // A flow label given is folded into 14 bits; none is made from the QP numbers.
        assert_eq!(udp_source_port(0x1_2345, 1, 2), 0xc000 | (0x2345 ^ 0x4));
        let p = udp_source_port(0, 0x11, 0x12);
        let v = 0x11u64 * 0x12;
        assert_eq!(p, 0xc000 | ((v & 0x3fff) as u16));
        assert!(udp_source_port_of_qp(0x11) >= 0xc000);
    }

    #[test]
    fn macs_of_sim_gids() {
        let g = mapped([192, 168, 1, 7]);
        assert_eq!(mac_of(&g), [2, 0, 192, 168, 1, 7]);
        assert_eq!(mac_of(&crate::gid::default_of(&g)), [2, 0, 192, 168, 1, 7]);
        assert_eq!(mac_of(&mapped([239, 129, 2, 3])), [1, 0, 0x5e, 1, 2, 3]);
        let mut m6 = [0u8; 16];
        m6[0] = 0xff;
        m6[1] = 0x0e;
        m6[12..].copy_from_slice(&[9, 8, 7, 6]);
        assert_eq!(mac_of(&m6), [0x33, 0x33, 9, 8, 7, 6]);
    }
}
