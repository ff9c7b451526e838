//! The host's own IP addresses (`man 3 getifaddrs`), for a device that listens on a
//! wildcard address: it must advertise an address its peers can reach (never `0.0.0.0`),
//! and its GID table lists the host's addresses as a RoCE port's does (rxe lists every
//! address of its netdev).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The addresses of the host's interfaces that are up, in the order the kernel lists them;
/// IPv6 link-local addresses are left out (reaching one needs a scope the GID cannot
/// carry).
pub fn host_addrs() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head to `head`; on success we walk the list (each
    // node and its `ifa_addr` live until freeifaddrs) and free it once.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut p = head;
        while let Some(ifa) = p.as_ref() {
            p = ifa.ifa_next;
            if ifa.ifa_flags & libc::IFF_UP as u32 == 0 || ifa.ifa_addr.is_null() {
                continue;
            }
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    let v6 = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                    if v6.segments()[0] & 0xffc0 != 0xfe80 {
                        out.push(IpAddr::V6(v6));
                    }
                }
                _ => {}
            }
        }
        libc::freeifaddrs(head);
    }
    out
}

/// What a device listening on the wildcard `wild` (`0.0.0.0` or `::`) advertises: the
/// first non-loopback address of the host of the same family (IPv4 for `::` as well when
/// the host has no global IPv6 address), else loopback.
pub fn advertised(wild: IpAddr, addrs: &[IpAddr]) -> IpAddr {
    let usable = |a: &&IpAddr| !a.is_loopback() && !a.is_unspecified();
    let same_family = addrs
        .iter()
        .filter(usable)
        .find(|a| a.is_ipv4() == wild.is_ipv4());
    let any = addrs.iter().find(usable);
    match (wild, same_family, any) {
        (_, Some(a), _) => *a,
        (IpAddr::V6(_), None, Some(a)) => *a,
        (IpAddr::V4(_), _, _) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        (IpAddr::V6(_), _, None) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_has_its_loopback_address() {
        assert!(host_addrs().contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)));
    }

    #[test]
    fn a_wildcard_advertises_a_reachable_address() {
        let v4 = |s: &str| s.parse::<IpAddr>().unwrap();
        let host = [
            v4("127.0.0.1"),
            v4("10.1.2.3"),
            v4("192.168.0.7"),
            v4("2001:db8::5"),
        ];
        assert_eq!(advertised(v4("0.0.0.0"), &host), v4("10.1.2.3"));
        assert_eq!(advertised(v4("::"), &host), v4("2001:db8::5"));
        assert_eq!(advertised(v4("::"), &host[..3]), v4("10.1.2.3"));
        assert_eq!(advertised(v4("0.0.0.0"), &host[..1]), v4("127.0.0.1"));
        assert_eq!(advertised(v4("0.0.0.0"), &[]), v4("127.0.0.1"));
    }
}
