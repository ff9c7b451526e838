//! ud-echo's datagram: a 32-byte header (magic, client, sequence number, payload length,
//! checksum) and a payload generated from the client and the sequence number, so that a
//! receiver checks every byte without having been told what was sent.
//!
//! ```text
//! magic u32 "UDE1" | client u32 | seq u64 | len u32 | reserved u32 | checksum u64 | payload[len]
//! ```
//!
//! All fields big-endian; the checksum is FNV-1a (64 bits) over the first 24 bytes and
//! the payload. [`decode`] accepts a datagram only if the magic, the length, the checksum
//! and every payload byte are right ([`Damage`] says what was not).

/// The header's first four bytes.
pub const MAGIC: u32 = u32::from_be_bytes(*b"UDE1");
/// Bytes of the header; the smallest datagram.
pub const HEADER: usize = 32;

/// A datagram that decoded intact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Datagram {
    /// The sending client.
    pub client: u32,
    /// Its sequence number (0, 1, ... per client).
    pub seq: u64,
    /// Bytes in all, header included.
    pub len: usize,
}

/// What is wrong with a datagram that did not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// Fewer bytes than a header.
    Short(usize),
    /// Not this format.
    Magic(u32),
    /// The header names more payload than arrived (`said` bytes, `got` arrived).
    Length {
        /// Payload bytes the header names.
        said: usize,
        /// Payload bytes that arrived.
        got: usize,
    },
    /// The checksum does not match.
    Checksum,
    /// The checksum matches but a payload byte is not the one the sender generates.
    Payload,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::Short(n) => write!(f, "{n} bytes, shorter than the {HEADER}-byte header"),
            Damage::Magic(m) => write!(f, "magic {m:#010x} is not ud-echo's"),
            Damage::Length { said, got } => write!(f, "the header says {said} payload bytes, {got} arrived"),
            Damage::Checksum => f.write_str("checksum mismatch"),
            Damage::Payload => f.write_str("payload differs from what the sender generates"),
        }
    }
}

/// The payload byte stream of `(client, seq)` (xorshift64*, seeded by both).
fn payload(client: u32, seq: u64) -> impl Iterator<Item = u8> {
    let mut x = (u64::from(client) << 40 ^ seq).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    std::iter::repeat_with(move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
    })
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Writes datagram `seq` of `client`, `len` bytes in all (at least [`HEADER`]), into
/// the front of `buf`; returns `len`.
///
/// # Panics
///
/// If `len` is below [`HEADER`] or above `buf.len()`.
pub fn encode(client: u32, seq: u64, len: usize, buf: &mut [u8]) -> usize {
    assert!((HEADER..=buf.len()).contains(&len), "datagram of {len} bytes");
    let n = len - HEADER;
    buf[0..4].copy_from_slice(&MAGIC.to_be_bytes());
    buf[4..8].copy_from_slice(&client.to_be_bytes());
    buf[8..16].copy_from_slice(&seq.to_be_bytes());
    buf[16..20].copy_from_slice(&(n as u32).to_be_bytes());
    buf[20..24].fill(0);
    for (d, s) in buf[HEADER..len].iter_mut().zip(payload(client, seq)) {
        *d = s;
    }
    let sum = fnv1a(&[&buf[..24], &buf[HEADER..len]]);
    buf[24..32].copy_from_slice(&sum.to_be_bytes());
    len
}

/// Decodes the datagram at the front of `buf` (which may hold more bytes after it),
/// checking every byte.
pub fn decode(buf: &[u8]) -> Result<Datagram, Damage> {
    if buf.len() < HEADER {
        return Err(Damage::Short(buf.len()));
    }
    let be32 = |at: usize| u32::from_be_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
    let be64 = |at: usize| u64::from_be_bytes(buf[at..at + 8].try_into().expect("8 bytes"));
    if be32(0) != MAGIC {
        return Err(Damage::Magic(be32(0)));
    }
    let (client, seq, n) = (be32(4), be64(8), be32(16) as usize);
    let got = buf.len() - HEADER;
    if n > got {
        return Err(Damage::Length { said: n, got });
    }
    let body = &buf[HEADER..HEADER + n];
    if fnv1a(&[&buf[..24], body]) != be64(24) {
        return Err(Damage::Checksum);
    }
    if !body.iter().copied().eq(payload(client, seq).take(n)) {
        return Err(Damage::Payload);
    }
    Ok(Datagram {
        client,
        seq,
        len: HEADER + n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_decodes_to_what_was_encoded_and_any_flipped_byte_is_caught() {
        let mut buf = [0u8; 300];
        let len = encode(7, 123_456, 256, &mut buf);
        assert_eq!(
            decode(&buf[..len]),
            Ok(Datagram {
                client: 7,
                seq: 123_456,
                len: 256
            })
        );
        assert_eq!(decode(&buf).map(|d| d.len), Ok(256), "bytes after it are ignored");
        for at in [0, 5, 9, 17, 25, 32, 200, 255] {
            let mut bad = buf;
            bad[at] ^= 0x10;
            assert!(decode(&bad[..len]).is_err(), "byte {at} flipped went unnoticed");
        }
        assert_eq!(decode(&buf[..100]), Err(Damage::Length { said: 224, got: 68 }));
        assert_eq!(decode(&buf[..8]), Err(Damage::Short(8)));
        let empty = encode(1, 0, HEADER, &mut buf);
        assert_eq!(decode(&buf[..empty]).map(|d| d.len), Ok(HEADER));
    }

    #[test]
    fn payloads_differ_by_client_and_sequence_number() {
        let (mut a, mut b, mut c) = ([0u8; 64], [0u8; 64], [0u8; 64]);
        encode(1, 5, 64, &mut a);
        encode(2, 5, 64, &mut b);
        encode(1, 6, 64, &mut c);
        assert_ne!(a[HEADER..], b[HEADER..]);
        assert_ne!(a[HEADER..], c[HEADER..]);
        // Another client's datagram with a correct checksum is still not this one's.
        let mut forged = a;
        forged[4..8].copy_from_slice(&2u32.to_be_bytes());
        let sum = fnv1a(&[&forged[..24], &forged[HEADER..]]);
        forged[24..32].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(decode(&forged), Err(Damage::Payload));
    }
}
