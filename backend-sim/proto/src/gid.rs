//! The sim's default GIDs (`man ibv_query_gid`, IBA 4.1.1): every port's GID 0 is its
//! default GID, the link-local prefix `fe80::/64` and an EUI-64 interface id (an
//! InfiniBand port's GUID, a RoCE port's MAC turned into a modified EUI-64 as the kernel's
//! `make_default_gid()` does with `addrconf_ifid_eui48()`). A sim device has neither a
//! GUID nor a MAC of its own, so its MAC is made of `02:00` (locally administered) and its
//! IPv4 address: the default GID then names the device as its IP GID (`::ffff:a.b.c.d`)
//! does, and either can be derived from the other. A device at an IPv6 address has no
//! such GID (no MAC holds the address): its default GID is its IP GID.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The default GID of the device whose IP GID is `ip_gid` (IPv4-mapped, or an IPv6
/// address, which is its own default).
pub fn default_of(ip_gid: &[u8; 16]) -> [u8; 16] {
    let Some(v4) = Ipv6Addr::from(*ip_gid).to_ipv4_mapped() else {
        return *ip_gid;
    };
    let [a, b, c, d] = v4.octets();
    let mac = [0x02, 0x00, a, b, c, d];
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    // Modified EUI-64: ff:fe in the middle, the universal/local bit flipped.
    g[8..16].copy_from_slice(&[mac[0] ^ 0x02, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]]);
    g
}

/// The IPv4 address a sim device's default GID ([`default_of`]) holds, if `gid` is one.
pub fn default_ipv4(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    let prefix = gid[0] == 0xfe && gid[1] == 0x80 && gid[2..8].iter().all(|&b| b == 0);
    let e = &gid[8..16];
    (prefix && e[0] == 0 && e[1] == 0 && e[3] == 0xff && e[4] == 0xfe)
        .then(|| Ipv4Addr::new(e[2], e[5], e[6], e[7]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_default_gid_is_link_local() {
        let ip = Ipv4Addr::new(127, 3, 4, 5);
        let g = default_of(&ip.to_ipv6_mapped().octets());
        assert_eq!(
            Ipv6Addr::from(g),
            "fe80::7fff:fe03:405".parse::<Ipv6Addr>().unwrap()
        );
        let v6: Ipv6Addr = "2001:db8::1".parse().unwrap();
        assert_eq!(default_of(&v6.octets()), v6.octets());
        // An ordinary link-local GID names no sim device.
        assert_eq!(
            default_ipv4(&"fe80::1:2ff:fe03:405".parse::<Ipv6Addr>().unwrap().octets()),
            None
        );
    }

    proptest! {
        #[test]
        fn the_default_gid_gives_its_address_back(o in any::<[u8; 4]>()) {
            let ip = Ipv4Addr::from(o);
            prop_assert_eq!(default_ipv4(&default_of(&ip.to_ipv6_mapped().octets())), Some(ip));
        }
    }
}
