//! Socket addresses as rdma_cm's commands carry them: `sockaddr_in` or `sockaddr_in6` in a
//! `sockaddr_in6`-sized field or a `sockaddr_storage` with its size, and librdmacm's
//! `sockaddr_ib` (`AF_IB`), whose service ID's low 16 bits are the port.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::abi::ucma::{sockaddr_in6, sockaddr_storage, AF_IB};
use crate::ffi::Errno;

const AF_INET: u16 = libc::AF_INET as u16;
const AF_INET6: u16 = libc::AF_INET6 as u16;

/// The address in the first `len` bytes of `b` (`None`: an empty address, family 0).
pub fn parse(b: &[u8]) -> Result<Option<SocketAddr>, Errno> {
    if b.len() < 2 {
        return Ok(None);
    }
    let family = u16::from_ne_bytes([b[0], b[1]]);
    let port = |at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
    match family {
        0 => Ok(None),
        AF_INET if b.len() >= 8 => {
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Ok(Some(SocketAddr::new(IpAddr::V4(ip), port(2))))
        }
        AF_INET6 if b.len() >= 24 => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[8..24]);
            Ok(Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port(2))))
        }
        // sockaddr_ib: family, pkey, flowinfo, the GID (16), the service ID (be64): the
        // sim binds it as the wildcard address at the service ID's port.
        AF_IB if b.len() >= 32 => {
            let mut sid = [0u8; 8];
            sid.copy_from_slice(&b[24..32]);
            let port = (u64::from_be_bytes(sid) & 0xffff) as u16;
            Ok(Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)))
        }
        AF_INET | AF_INET6 | AF_IB => Err(libc::EINVAL),
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// The address in a `sockaddr_in6`-sized field.
pub fn from_in6(a: &sockaddr_in6) -> Result<Option<SocketAddr>, Errno> {
    // SAFETY: a plain 28-byte structure, viewed as its bytes.
    let b = unsafe {
        std::slice::from_raw_parts((a as *const sockaddr_in6).cast::<u8>(), size_of::<sockaddr_in6>())
    };
    parse(b)
}

/// The address in the first `size` bytes of a `sockaddr_storage`.
pub fn from_storage(a: &sockaddr_storage, size: u16) -> Result<Option<SocketAddr>, Errno> {
    let n = usize::from(size).min(a.bytes.len());
    parse(&a.bytes[..n])
}

/// `a` as a `sockaddr_in` or `sockaddr_in6` in `out`; its size.
pub fn write(a: SocketAddr, out: &mut [u8]) -> u16 {
    out.fill(0);
    match a {
        SocketAddr::V4(v4) => {
            out[0..2].copy_from_slice(&AF_INET.to_ne_bytes());
            out[2..4].copy_from_slice(&v4.port().to_be_bytes());
            out[4..8].copy_from_slice(&v4.ip().octets());
            size_of::<libc::sockaddr_in>() as u16
        }
        SocketAddr::V6(v6) => {
            out[0..2].copy_from_slice(&AF_INET6.to_ne_bytes());
            out[2..4].copy_from_slice(&v6.port().to_be_bytes());
            out[8..24].copy_from_slice(&v6.ip().octets());
            out[24..28].copy_from_slice(&v6.scope_id().to_ne_bytes());
            size_of::<libc::sockaddr_in6>() as u16
        }
    }
}

/// `a` in a `sockaddr_in6`-sized field.
pub fn to_in6(a: Option<SocketAddr>) -> sockaddr_in6 {
    let mut b = [0u8; size_of::<sockaddr_in6>()];
    if let Some(a) = a {
        write(a, &mut b);
    }
    // SAFETY: 28 bytes into a plain 28-byte structure.
    unsafe { std::mem::transmute::<[u8; size_of::<sockaddr_in6>()], sockaddr_in6>(b) }
}

/// `a` in a `sockaddr_storage`, and its size (0 for none).
pub fn to_storage(a: Option<SocketAddr>) -> (sockaddr_storage, u16) {
    let mut s = sockaddr_storage::default();
    let n = a.map_or(0, |a| write(a, &mut s.bytes));
    (s, n)
}

/// A `sockaddr_ib` holding `gid` (what the GID query answers), in a `sockaddr_storage`.
pub fn ib_with_gid(gid: [u8; 16]) -> sockaddr_storage {
    let mut s = sockaddr_storage::default();
    s.bytes[0..2].copy_from_slice(&AF_IB.to_ne_bytes());
    s.bytes[8..24].copy_from_slice(&gid);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_through_both_containers() {
        for a in ["127.0.0.1:7471", "[::1]:18515", "10.1.2.3:0"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(from_in6(&to_in6(Some(a))), Ok(Some(a)));
            let (s, n) = to_storage(Some(a));
            assert_eq!(from_storage(&s, n), Ok(Some(a)));
        }
        assert_eq!(from_in6(&to_in6(None)), Ok(None));
        let mut ib = [0u8; 48];
        ib[0..2].copy_from_slice(&AF_IB.to_ne_bytes());
        ib[24..32].copy_from_slice(&0x0106_1d00u64.to_be_bytes());
        assert_eq!(parse(&ib), Ok(Some("0.0.0.0:7424".parse().unwrap())));
        assert_eq!(parse(&[1, 0, 0, 0]), Err(libc::EAFNOSUPPORT));
        assert_eq!(parse(&[2, 0, 0]), Err(libc::EINVAL));
    }
}
