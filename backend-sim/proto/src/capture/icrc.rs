//! The RoCE v2 Invariant CRC (IBA Annex A17.3.3), computed as Linux's rxe computes it
//! (`rxe_icrc.c`): CRC-32 (the Ethernet polynomial, reflected) seeded as if 64 one bits
//! came first, over the IP and UDP headers and the BTH with their variant fields set to
//! ones (IPv4: type of service, TTL, header checksum; IPv6: traffic class, flow label,
//! hop limit; the UDP checksum; the BTH's byte of FECN, BECN and reserved bits), then the
//! rest of the packet up to the ICRC. The packet carries the complement of the result
//! in little-endian byte order, as rxe writes it.

/// CRC-32 with the reflected polynomial 0xEDB88320, one byte at a time from a table.
const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Continues a CRC-32 (no pre- or post-inversion: the kernel's `crc32_le`).
fn crc32_le(mut crc: u32, bytes: &[u8]) -> u32 {
    for &b in bytes {
        crc = TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// The CRC state after the 64 one bits IBA puts in place of the LRH.
const SEED: u32 = 0xdebb_20e3;

const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;
const BTH_LEN: usize = super::headers::BTH_LEN;

/// The ICRC field of a packet whose bytes from its IP header up to the ICRC are
/// `packet` (IP, UDP, BTH and the rest, payload and pad included): the four bytes to
/// append. `None` if `packet` is shorter than its headers or not IPv4 or IPv6 with
/// headers of the fixed size RoCE v2 sends.
pub fn icrc(packet: &[u8]) -> Option<[u8; 4]> {
    let ip_len = match packet.first()? >> 4 {
        4 if packet[0] & 0x0f == 5 => IPV4_LEN,
        6 => IPV6_LEN,
        _ => return None,
    };
    let fixed = ip_len + UDP_LEN + BTH_LEN;
    if packet.len() < fixed {
        return None;
    }
    let mut head = [0u8; IPV6_LEN + UDP_LEN + BTH_LEN];
    let head = &mut head[..fixed];
    head.copy_from_slice(&packet[..fixed]);
    if ip_len == IPV4_LEN {
        head[1] = 0xff; // type of service
        head[8] = 0xff; // TTL
        head[10] = 0xff; // header checksum
        head[11] = 0xff;
    } else {
        head[0] |= 0x0f; // traffic class, high nibble
        head[1] = 0xff; // traffic class, low nibble, and the flow label
        head[2] = 0xff;
        head[3] = 0xff;
        head[7] = 0xff; // hop limit
    }
    head[ip_len + 6] = 0xff; // UDP checksum
    head[ip_len + 7] = 0xff;
    head[ip_len + UDP_LEN + 4] = 0xff; // FECN, BECN, reserved
    let crc = crc32_le(SEED, head);
    let crc = crc32_le(crc, &packet[fixed..]);
    Some((!crc).to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_is_64_one_bits() {
        assert_eq!(crc32_le(0xffff_ffff, &[0xff; 8]), SEED);
    }

    #[test]
    fn crc32_is_the_ethernet_crc() {
        // CRC-32 of "123456789" is 0xCBF43926 (pre- and post-inverted).
        assert_eq!(!crc32_le(!0, b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn variant_fields_do_not_change_it_and_invariant_ones_do() {
        let mut p = vec![0u8; IPV4_LEN + UDP_LEN + BTH_LEN + 8];
        p[0] = 0x45;
        p[IPV4_LEN + UDP_LEN] = 0x04;
        let base = icrc(&p).unwrap();
        for i in [1, 8, 10, 11, IPV4_LEN + 6, IPV4_LEN + 7, IPV4_LEN + UDP_LEN + 4] {
            let mut q = p.clone();
            q[i] ^= 0x5a;
            assert_eq!(icrc(&q).unwrap(), base, "byte {i} is variant");
        }
        for i in [
            2,
            12,
            IPV4_LEN,
            IPV4_LEN + UDP_LEN,
            IPV4_LEN + UDP_LEN + 5,
            p.len() - 1,
        ] {
            let mut q = p.clone();
            q[i] ^= 0x5a;
            assert_ne!(icrc(&q).unwrap(), base, "byte {i} is invariant");
        }
        assert!(icrc(&p[..30]).is_none());
        assert!(icrc(&[0x46; 80]).is_none(), "IPv4 options are not RoCE v2's");
    }
}
