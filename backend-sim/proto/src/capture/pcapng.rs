//! The pcapng blocks a capture file is made of (the IETF draft "PCAP Next Generation
//! Dump File Format"): a section header, an Ethernet interface with nanosecond
//! timestamps for the packets, and enhanced packet blocks whose comments carry the
//! verbs context. Context that goes with no packet (a QP's state change, a WR posted, a
//! completion) is an [`event`]: a packet of a second interface, Wireshark's "exported
//! PDU" link type naming its syslog dissector, whose text is both the packet's comment
//! (tshark's `frame.comment`) and the syslog message Wireshark's packet list shows. The
//! blocks are written in this host's byte order, which the section header's magic tells
//! readers.

/// Link type Ethernet (LINKTYPE_ETHERNET).
pub const LINKTYPE_ETHERNET: u16 = 1;

/// Link type Wireshark Upper PDU (LINKTYPE_WIRESHARK_UPPER_PDU): tags, then the bytes
/// the dissector a tag names reads.
pub const LINKTYPE_UPPER_PDU: u16 = 252;

/// The interface of the packets ([`header`] writes it first).
pub const PACKETS: u32 = 0;

/// The interface of the events ([`header`] writes it second).
pub const EVENTS: u32 = 1;

/// An exported PDU's tag naming the dissector of the bytes after the tags
/// (EXP_PDU_TAG_DISSECTOR_NAME), and the tag that ends them.
const EXP_PDU_TAG_DISSECTOR_NAME: u16 = 12;
const EXP_PDU_TAG_END: u16 = 0;

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

/// Appends a section header naming the application, the interface every packet is on
/// ([`PACKETS`]: Ethernet, `snaplen` bytes kept of each packet (0: all), nanosecond
/// timestamps) and the one of the events ([`EVENTS`]).
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
    block(out, IDB, |o| {
        o.extend_from_slice(&LINKTYPE_UPPER_PDU.to_ne_bytes());
        o.extend_from_slice(&0u16.to_ne_bytes());
        o.extend_from_slice(&0u32.to_ne_bytes());
        option(o, IF_NAME, b"verbs");
        option(o, IF_TSRESOL, &[9]);
        option(o, OPT_END, &[]);
    });
}

/// Appends an enhanced packet block of `iface`: `orig_len` bytes long on the wire, of
/// which `fill` appends those kept (the caller cuts them at the snap length).
fn epb(
    out: &mut Vec<u8>,
    iface: u32,
    ts_ns: u64,
    orig_len: usize,
    comment: Option<&str>,
    fill: impl FnOnce(&mut Vec<u8>),
) {
    block(out, EPB, |o| {
        o.extend_from_slice(&iface.to_ne_bytes());
        o.extend_from_slice(&((ts_ns >> 32) as u32).to_ne_bytes());
        o.extend_from_slice(&(ts_ns as u32).to_ne_bytes());
        let lens = o.len();
        o.extend_from_slice(&[0; 8]);
        let start = o.len();
        fill(o);
        let kept = o.len() - start;
        o[lens..lens + 4].copy_from_slice(&(kept as u32).to_ne_bytes());
        o[lens + 4..lens + 8].copy_from_slice(&(orig_len.max(kept) as u32).to_ne_bytes());
        o.resize(o.len() + (4 - kept % 4) % 4, 0);
        if let Some(c) = comment {
            option(o, OPT_COMMENT, c.as_bytes());
            option(o, OPT_END, &[]);
        }
    });
}

/// Appends an event of the verbs context at `ts_ns` ([`EVENTS`]' packet): `text` as the
/// packet's comment and as a syslog message.
pub fn event(out: &mut Vec<u8>, ts_ns: u64, text: &str) {
    // Within an option's 16-bit length, cut at a character's boundary.
    let mut end = text.len().min(0xff00);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let text = &text[..end];
    epb(out, EVENTS, ts_ns, 0, Some(text), |o| {
        let name = b"syslog";
        let padded = name.len().next_multiple_of(4);
        o.extend_from_slice(&EXP_PDU_TAG_DISSECTOR_NAME.to_be_bytes());
        o.extend_from_slice(&(padded as u16).to_be_bytes());
        o.extend_from_slice(name);
        o.resize(o.len() + padded - name.len(), 0);
        o.extend_from_slice(&EXP_PDU_TAG_END.to_be_bytes());
        o.extend_from_slice(&0u16.to_be_bytes());
        o.extend_from_slice(text.as_bytes());
    });
}

/// Appends a packet of [`PACKETS`] at `ts_ns` that `fill` appends, cut at `snaplen`
/// bytes (`None`: kept whole), `orig_len` bytes on the wire, with an optional comment.
pub fn packet_with(
    out: &mut Vec<u8>,
    ts_ns: u64,
    orig_len: usize,
    snaplen: Option<usize>,
    comment: Option<&str>,
    fill: impl FnOnce(&mut Vec<u8>),
) {
    epb(out, PACKETS, ts_ns, orig_len, comment, |o| {
        let start = o.len();
        fill(o);
        if let Some(n) = snaplen {
            o.truncate(start + n.min(o.len() - start));
        }
    });
}

/// Appends a packet seen at `ts_ns` (nanoseconds since the epoch) of which `data` was
/// kept (at most the snap length) out of `orig_len` bytes, with an optional comment.
pub fn packet(out: &mut Vec<u8>, ts_ns: u64, data: &[u8], orig_len: usize, comment: Option<&str>) {
    packet_with(out, ts_ns, orig_len, None, comment, |o| o.extend_from_slice(data));
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
        event(&mut out, 1_700_000_000_123_456_791, "QP 0x11: RTR -> RTS");
        let kinds: Vec<u32> = blocks(&out).into_iter().map(|(k, _)| k).collect();
        assert_eq!(kinds, vec![SHB, IDB, IDB, EPB, EPB, EPB]);
    }
}
