//! The pcapng blocks a capture file is made of (the IETF draft "PCAP Next Generation
//! Dump File Format"): a section header, one Ethernet interface with nanosecond
//! timestamps, and enhanced packet blocks whose comments carry the verbs context. The
//! blocks are written in this host's byte order, which the section header's magic tells
//! readers.

/// Link type Ethernet (LINKTYPE_ETHERNET).
pub const LINKTYPE_ETHERNET: u16 = 1;

const SHB: u32 = 0x0a0d_0d0a;
const IDB: u32 = 0x0000_0001;
const EPB: u32 = 0x0000_0006;
const OPT_END: u16 = 0;
const OPT_COMMENT: u16 = 1;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_TSRESOL: u16 = 9;

fn option(out: &mut Vec<u8>, code: u16, value: &[u8]) {
    // An option's length field is 16 bits: a longer value is cut.
    let value = &value[..value.len().min(0xfff0)];
    out.extend_from_slice(&code.to_ne_bytes());
    out.extend_from_slice(&(value.len() as u16).to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len() + (4 - value.len() % 4) % 4, 0);
}

/// Writes a block of `kind` whose body `body` appends, with its two length fields.
fn block(out: &mut Vec<u8>, kind: u32, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&[0; 4]);
    body(out);
    let len = (out.len() - start + 4) as u32;
    out[start + 4..start + 8].copy_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&len.to_ne_bytes());
}

/// Appends a section header naming the application, and the one interface every
/// packet is on: Ethernet, `snaplen` bytes kept of each packet (0: all), nanosecond
/// timestamps.
pub fn header(out: &mut Vec<u8>, app: &str, if_name: &str, snaplen: u32) {
    block(out, SHB, |o| {
        o.extend_from_slice(&0x1a2b_3c4du32.to_ne_bytes());
        o.extend_from_slice(&1u16.to_ne_bytes());
        o.extend_from_slice(&0u16.to_ne_bytes());
        o.extend_from_slice(&u64::MAX.to_ne_bytes()); // section length not given
        option(o, SHB_USERAPPL, app.as_bytes());
        option(o, OPT_END, &[]);
    });
    block(out, IDB, |o| {
        o.extend_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
        o.extend_from_slice(&0u16.to_ne_bytes());
        o.extend_from_slice(&snaplen.to_ne_bytes());
        option(o, IF_NAME, if_name.as_bytes());
        option(o, IF_TSRESOL, &[9]);
        option(o, OPT_END, &[]);
    });
}

/// Appends a packet seen at `ts_ns` (nanoseconds since the epoch) of which `data` was
/// kept (at most the snap length) out of `orig_len` bytes, with an optional comment.
pub fn packet(out: &mut Vec<u8>, ts_ns: u64, data: &[u8], orig_len: usize, comment: Option<&str>) {
    block(out, EPB, |o| {
        o.extend_from_slice(&0u32.to_ne_bytes()); // interface 0
        o.extend_from_slice(&((ts_ns >> 32) as u32).to_ne_bytes());
        o.extend_from_slice(&(ts_ns as u32).to_ne_bytes());
        o.extend_from_slice(&(data.len() as u32).to_ne_bytes());
        o.extend_from_slice(&(orig_len as u32).to_ne_bytes());
        o.extend_from_slice(data);
        o.resize(o.len() + (4 - data.len() % 4) % 4, 0);
        if let Some(c) = comment {
            option(o, OPT_COMMENT, c.as_bytes());
            option(o, OPT_END, &[]);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks the blocks, checking both length fields and the alignment.
    fn blocks(mut b: &[u8]) -> Vec<(u32, usize)> {
        let mut v = Vec::new();
        while !b.is_empty() {
            let kind = u32::from_ne_bytes(b[0..4].try_into().unwrap());
            let len = u32::from_ne_bytes(b[4..8].try_into().unwrap()) as usize;
            assert_eq!(len % 4, 0);
            assert_eq!(
                u32::from_ne_bytes(b[len - 4..len].try_into().unwrap()) as usize,
                len
            );
            v.push((kind, len));
            b = &b[len..];
        }
        v
    }

    #[test]
    fn blocks_are_well_formed() {
        let mut out = Vec::new();
        header(&mut out, "backend-sim", "sim0", 128);
        packet(
            &mut out,
            1_700_000_000_123_456_789,
            &[1, 2, 3, 4, 5],
            1000,
            Some("QP 0x11: RTS"),
        );
        packet(&mut out, 1_700_000_000_123_456_790, &[1; 64], 64, None);
        let kinds: Vec<u32> = blocks(&out).into_iter().map(|(k, _)| k).collect();
        assert_eq!(kinds, vec![SHB, IDB, EPB, EPB]);
    }
}
