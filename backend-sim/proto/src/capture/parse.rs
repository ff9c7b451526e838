//! Reading a RoCE v2 packet back (the inverse of [`super::packet`]), for a capture of the
//! sim's traffic or of a real RoCE port (`tcpdump udp port 4791`): the network layer's
//! addresses, the UDP source port, the transport headers, the payload's length and
//! whether the ICRC matches the one rxe would compute.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::headers::{HeaderError, Headers};
use super::icrc::icrc;
use super::packet::ROCE_V2_PORT;

/// A RoCE v2 packet read from a capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// Source IP address.
    pub src: IpAddr,
    /// Destination IP address.
    pub dst: IpAddr,
    /// UDP source port (rxe derives it from the QP pair: the two directions of an RC
    /// connection share it).
    pub src_port: u16,
    /// The transport headers.
    pub headers: Headers,
    /// Payload bytes (from the lengths in the headers, whatever the capture kept).
    pub payload_len: usize,
    /// Whether the ICRC is the one computed over the packet; `None` when the capture cut
    /// the packet short.
    pub icrc_ok: Option<bool>,
}

/// Why bytes are not a RoCE v2 packet.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not IPv4/IPv6 UDP to port 4791 (other traffic in a capture).
    #[error("not a RoCE v2 packet")]
    NotRoce,
    /// Cut short before the transport headers end.
    #[error("truncated: {0}")]
    Truncated(&'static str),
    /// Transport headers that do not decode.
    #[error(transparent)]
    Headers(#[from] HeaderError),
    /// Lengths that do not add up.
    #[error("the UDP length {0} is shorter than the headers and ICRC")]
    Length(usize),
}

/// Reads the packet whose network layer (its IP header) starts `ip` bytes into the
/// captured `data`, `orig_len` bytes long on the wire.
pub fn parse(data: &[u8], ip: usize, orig_len: usize) -> Result<Parsed, ParseError> {
    let n = data.get(ip..).ok_or(ParseError::Truncated("link header"))?;
    let (src, dst, ip_len) = match n.first().map(|b| b >> 4) {
        Some(4) if n.len() >= 20 => {
            let ihl = (n[0] & 0x0f) as usize * 4;
            if n[9] != 17 || ihl < 20 {
                return Err(ParseError::NotRoce);
            }
            let a = |i: usize| IpAddr::V4(Ipv4Addr::new(n[i], n[i + 1], n[i + 2], n[i + 3]));
            (a(12), a(16), ihl)
        }
        Some(6) if n.len() >= 40 => {
            if n[6] != 17 {
                return Err(ParseError::NotRoce);
            }
            let a = |i: usize| IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&n[i..i + 16]).unwrap()));
            (a(8), a(24), 40)
        }
        Some(4 | 6) => return Err(ParseError::Truncated("IP header")),
        _ => return Err(ParseError::NotRoce),
    };
    let u = n
        .get(ip_len..ip_len + 8)
        .ok_or(ParseError::Truncated("UDP header"))?;
    if u16::from_be_bytes([u[2], u[3]]) != ROCE_V2_PORT {
        return Err(ParseError::NotRoce);
    }
    let src_port = u16::from_be_bytes([u[0], u[1]]);
    let udp_len = u16::from_be_bytes([u[4], u[5]]) as usize;
    let t = &n[ip_len + 8..];
    let (headers, hdr_len, pad) = Headers::read(t).map_err(|e| match e {
        HeaderError::Short(..) => ParseError::Truncated("transport headers"),
        e => e.into(),
    })?;
    let payload_len = udp_len
        .checked_sub(8 + hdr_len + pad + 4)
        .ok_or(ParseError::Length(udp_len))?;
    let whole = ip + ip_len + udp_len;
    let icrc_ok = (data.len() >= whole && orig_len >= whole).then(|| {
        let end = whole - 4;
        icrc(&data[ip..end]).is_some_and(|c| c[..] == data[end..whole])
    });
    Ok(Parsed {
        src,
        dst,
        src_port,
        headers,
        payload_len,
        icrc_ok,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::headers::Reth;
    use crate::capture::opcode::op;
    use crate::capture::packet::{write, Route, ETH_LEN};

    fn route() -> Route {
        let mut a = [0u8; 16];
        a[10] = 0xff;
        a[11] = 0xff;
        let mut b = a;
        a[12..].copy_from_slice(&[10, 0, 0, 1]);
        b[12..].copy_from_slice(&[10, 0, 0, 2]);
        Route {
            src_gid: a,
            dst_gid: b,
            src_port: 0xc123,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        }
    }

    #[test]
    fn a_packet_reads_back() {
        let mut h = Headers::new(op::WRITE_ONLY, 0x12, 77);
        h.reth = Some(Reth {
            addr: 1,
            rkey: 2,
            len: 5,
        });
        let mut p = Vec::new();
        write(&route(), &h, b"hello", &mut p).unwrap();
        let r = parse(&p, ETH_LEN, p.len()).unwrap();
        assert_eq!(r.headers, h);
        assert_eq!(r.payload_len, 5);
        assert_eq!(r.src_port, 0xc123);
        assert_eq!(r.src, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(r.icrc_ok, Some(true));
        // A flipped payload bit fails the ICRC; a cut packet has none to check.
        let mut bad = p.clone();
        bad[p.len() - 6] ^= 1;
        assert_eq!(parse(&bad, ETH_LEN, bad.len()).unwrap().icrc_ok, Some(false));
        assert_eq!(parse(&p[..70], ETH_LEN, p.len()).unwrap().icrc_ok, None);
        assert_eq!(
            parse(&p[..50], ETH_LEN, p.len()),
            Err(ParseError::Truncated("transport headers"))
        );
        let mut other = p.clone();
        other[ETH_LEN + 23] = 0x35; // UDP port 4661
        assert_eq!(parse(&other, ETH_LEN, other.len()), Err(ParseError::NotRoce));
    }
}
