//! The packets of a capture file: pcapng (any byte order, several interfaces, their
//! timestamp resolutions, packet comments) or classic pcap (microsecond or nanosecond,
//! either byte order), over Ethernet or Linux cooked headers (what `tcpdump -i any`
//! writes), so that a capture of rxe's traffic reads as the sim's does.

/// One captured packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Captured<'a> {
    /// When, in nanoseconds since the epoch.
    pub ts_ns: u64,
    /// The bytes kept.
    pub data: &'a [u8],
    /// Its length on the wire.
    pub orig_len: usize,
    /// Where its network layer (IP header) starts in `data`, by its interface's link
    /// type; `None` for link types other than Ethernet and Linux cooked.
    pub ip: Option<usize>,
    /// The packet's comment (pcapng).
    pub comment: Option<String>,
    /// Its interface's link type (1: Ethernet; the sim's events are
    /// [`super::pcapng::LINKTYPE_UPPER_PDU`]'s).
    pub linktype: u32,
}

impl Captured<'_> {
    /// Whether it is an event of the verbs context a sim capture holds, not a packet.
    pub fn is_event(&self) -> bool {
        self.linktype == super::pcapng::LINKTYPE_UPPER_PDU as u32
    }
}

/// A file that is not a capture this reader knows, or is cut inside a block.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// Neither pcapng nor pcap.
    #[error("not a pcap or pcapng file")]
    Format,
    /// A block or record runs past the end of the file, or is malformed.
    #[error("malformed capture at byte {0}")]
    Malformed(usize),
}

/// Where the IP header starts under a link type.
fn ip_offset(linktype: u32, data: &[u8]) -> Option<usize> {
    match linktype {
        // Ethernet, with one 802.1Q tag at most.
        1 => match data.get(12..14)? {
            [0x81, 0x00] => Some(18),
            _ => Some(14),
        },
        113 => Some(16), // Linux cooked (SLL)
        276 => Some(20), // Linux cooked v2 (SLL2)
        _ => None,
    }
}

#[derive(Clone, Copy)]
struct Order(bool);

impl Order {
    fn u16(self, b: &[u8], at: usize) -> Option<u16> {
        let v = b.get(at..at + 2)?.try_into().ok()?;
        Some(if self.0 {
            u16::from_le_bytes(v)
        } else {
            u16::from_be_bytes(v)
        })
    }
    fn u32(self, b: &[u8], at: usize) -> Option<u32> {
        let v = b.get(at..at + 4)?.try_into().ok()?;
        Some(if self.0 {
            u32::from_le_bytes(v)
        } else {
            u32::from_be_bytes(v)
        })
    }
}

/// Every packet of the capture `file`, in file order.
pub fn packets(file: &[u8]) -> Result<Vec<Captured<'_>>, ReadError> {
    let magic = file.get(0..4).ok_or(ReadError::Format)?;
    match magic {
        [0x0a, 0x0d, 0x0d, 0x0a] => pcapng(file),
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => pcap(file, Order(true)),
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => pcap(file, Order(false)),
        _ => Err(ReadError::Format),
    }
}

fn pcap(file: &[u8], o: Order) -> Result<Vec<Captured<'_>>, ReadError> {
    let nanos = matches!(file[..4], [0x4d, 0x3c, 0xb2, 0xa1] | [0xa1, 0xb2, 0x3c, 0x4d]);
    let linktype = o.u32(file, 20).ok_or(ReadError::Malformed(0))? & 0x0fff_ffff;
    let mut out = Vec::new();
    let mut at = 24;
    while at < file.len() {
        let bad = ReadError::Malformed(at);
        let secs = o.u32(file, at).ok_or(bad.clone())? as u64;
        let frac = o.u32(file, at + 4).ok_or(bad.clone())? as u64;
        let caplen = o.u32(file, at + 8).ok_or(bad.clone())? as usize;
        let orig_len = o.u32(file, at + 12).ok_or(bad.clone())? as usize;
        let data = file.get(at + 16..at + 16 + caplen).ok_or(bad)?;
        let ts_ns = secs * 1_000_000_000 + if nanos { frac } else { frac * 1000 };
        out.push(Captured {
            ts_ns,
            data,
            orig_len,
            ip: ip_offset(linktype, data),
            comment: None,
            linktype,
        });
        at += 16 + caplen;
    }
    Ok(out)
}

/// An interface of a pcapng section: its link type and timestamp units per second.
#[derive(Clone, Copy)]
struct Interface {
    linktype: u32,
    per_sec: u64,
}

fn pcapng(file: &[u8]) -> Result<Vec<Captured<'_>>, ReadError> {
    let mut out = Vec::new();
    let mut ifaces: Vec<Interface> = Vec::new();
    let mut o = Order(true);
    let mut at = 0;
    while at < file.len() {
        let bad = || ReadError::Malformed(at);
        if file.get(at..at + 4) == Some(&[0x0a, 0x0d, 0x0d, 0x0a]) {
            // A section header: its magic sets the byte order of what follows.
            o = match file.get(at + 8..at + 12) {
                Some([0x4d, 0x3c, 0x2b, 0x1a]) => Order(true),
                Some([0x1a, 0x2b, 0x3c, 0x4d]) => Order(false),
                _ => return Err(bad()),
            };
            ifaces.clear();
        }
        let kind = o.u32(file, at).ok_or_else(bad)?;
        let len = o.u32(file, at + 4).ok_or_else(bad)? as usize;
        if len < 12 || len % 4 != 0 {
            return Err(bad());
        }
        let block = file.get(at..at + len).ok_or_else(bad)?;
        let body = &block[8..len - 4];
        match kind {
            1 => {
                let linktype = o.u16(body, 0).ok_or_else(bad)? as u32;
                let mut per_sec = 1_000_000;
                for (code, v) in options(o, body.get(8..).unwrap_or_default()) {
                    if code == 9 {
                        if let Some(&r) = v.first() {
                            per_sec = if r & 0x80 != 0 {
                                1u64.checked_shl((r & 0x7f) as u32).unwrap_or(u64::MAX)
                            } else {
                                10u64.checked_pow(r as u32).unwrap_or(u64::MAX)
                            };
                        }
                    }
                }
                ifaces.push(Interface { linktype, per_sec });
            }
            6 => {
                let iface = o.u32(body, 0).ok_or_else(bad)? as usize;
                let i = *ifaces.get(iface).ok_or_else(bad)?;
                let ts =
                    ((o.u32(body, 4).ok_or_else(bad)? as u64) << 32) | o.u32(body, 8).ok_or_else(bad)? as u64;
                let caplen = o.u32(body, 12).ok_or_else(bad)? as usize;
                let orig_len = o.u32(body, 16).ok_or_else(bad)? as usize;
                let data = body.get(20..20 + caplen).ok_or_else(bad)?;
                let opts_at = 20 + caplen.div_ceil(4) * 4;
                let comment = options(o, body.get(opts_at..).unwrap_or_default())
                    .find(|(code, _)| *code == 1)
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
                let ts_ns = (ts as u128 * 1_000_000_000 / i.per_sec.max(1) as u128) as u64;
                out.push(Captured {
                    ts_ns,
                    data,
                    orig_len,
                    ip: ip_offset(i.linktype, data),
                    comment,
                    linktype: i.linktype,
                });
            }
            _ => {}
        }
        at += len;
    }
    Ok(out)
}

/// The options in `b` (code, value) up to the end option or the bytes' end.
fn options(o: Order, b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let code = o.u16(b, at)?;
        let len = o.u16(b, at + 2)? as usize;
        if code == 0 {
            return None;
        }
        let v = b.get(at + 4..at + 4 + len)?;
        at += 4 + len.div_ceil(4) * 4;
        Some((code, v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::pcapng;

    #[test]
    fn pcapng_reads_back() {
        let mut f = Vec::new();
        pcapng::header(&mut f, "test", "sim0", 0);
        pcapng::packet(&mut f, 1_700_000_000_123_456_789, &[1; 20], 60, Some("hello"));
        pcapng::packet(&mut f, 1_700_000_000_123_456_790, &[2; 21], 21, None);
        let p = packets(&f).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].ts_ns, 1_700_000_000_123_456_789);
        assert_eq!((p[0].data.len(), p[0].orig_len), (20, 60));
        assert_eq!(p[0].comment.as_deref(), Some("hello"));
        assert_eq!(p[1].data, &[2; 21][..]);
        assert_eq!(p[1].ip, Some(14));
        assert!(matches!(packets(&f[..f.len() - 3]), Err(ReadError::Malformed(_))));
    }

    #[test]
    fn classic_pcap_reads() {
        // Big-endian microsecond pcap, Linux cooked link type, one record.
        let mut f = vec![0xa1, 0xb2, 0xc3, 0xd4, 0, 2, 0, 4];
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_be_bytes());
        f.extend_from_slice(&113u32.to_be_bytes());
        f.extend_from_slice(&5u32.to_be_bytes());
        f.extend_from_slice(&7u32.to_be_bytes());
        f.extend_from_slice(&3u32.to_be_bytes());
        f.extend_from_slice(&3u32.to_be_bytes());
        f.extend_from_slice(&[9, 9, 9]);
        let p = packets(&f).unwrap();
        assert_eq!(p[0].ts_ns, 5_000_007_000);
        assert_eq!(p[0].ip, Some(16));
        assert_eq!(packets(b"nonsense"), Err(ReadError::Format));
    }

    #[test]
    fn garbage_never_panics() {
        let mut f = Vec::new();
        pcapng::header(&mut f, "test", "sim0", 0);
        pcapng::packet(&mut f, 1, &[1; 20], 60, Some("x"));
        for i in 0..f.len() {
            for v in [0u8, 0xff, 0x7f] {
                let mut g = f.clone();
                g[i] = v;
                let _ = packets(&g);
                let _ = packets(&g[..i]);
            }
        }
    }
}
