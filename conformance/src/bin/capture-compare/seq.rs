//! A capture as the sequences a comparison holds against another device's: its
//! conversations (the packets of one QP pair, which share a UDP source port, rxe's
//! derivation being symmetric in the two QP numbers), in the order of their first
//! packets, each one row per RoCE packet in capture order, with what does not depend on
//! the device (the direction, PSN and MSN as steps from the previous packet to the same
//! QP, the payload's length, the AETH syndrome decoded, RETH lengths, atomic operands and
//! original values, immediate data), and what the comparison checks of each packet on
//! the way: its ICRC, recomputed as rxe computes it, and its UDP source port, derived
//! from the QP numbers as rxe derives it. Conversations are compared one by one: how
//! the packets of several QP pairs interleave is the scheduling of the moment.

use std::collections::HashMap;

use backend_sim_proto::capture::headers::Headers;
use backend_sim_proto::capture::opcode;
use backend_sim_proto::capture::packet::{udp_source_port, udp_source_port_of_qp};
use backend_sim_proto::capture::parse::{parse, ParseError, Parsed};
use backend_sim_proto::capture::read::packets;

/// PSNs and MSNs are 24 bits.
const MASK: u32 = 0x00ff_ffff;

/// One capture, read.
#[derive(Debug, Default)]
pub struct Seq {
    /// The conversations' rows.
    pub convs: Vec<Vec<String>>,
    /// The conversations' packets.
    pub pkts: Vec<Vec<Pkt>>,
    /// How many packets.
    pub packets: usize,
    /// Packets whose whole bytes were kept, and of those, the ones whose ICRC is not the
    /// one rxe computes.
    pub icrc_checked: usize,
    pub icrc_bad: usize,
    /// Packets whose UDP source port is not the one rxe derives from their QP numbers.
    pub sport_bad: usize,
    /// Packets that are not RoCE v2, or do not parse.
    pub other: usize,
}

/// A packet of a conversation.
#[derive(Clone, Debug)]
pub struct Pkt {
    /// Whether it goes to the QP the conversation's first packet went to.
    pub to_opener: bool,
    /// Its transport headers.
    pub headers: Headers,
    /// Its payload's length.
    pub payload_len: usize,
}

/// The state of the packets to one destination QP.
struct Dest {
    psn: u32,
    msn: Option<u32>,
}

/// The signed step from `from` to `to` in 24-bit sequence space.
fn step(from: u32, to: u32) -> i32 {
    let d = to.wrapping_sub(from) & MASK;
    if d >= 1 << 23 {
        d as i32 - (1 << 24)
    } else {
        d as i32
    }
}

fn signed(d: i32) -> String {
    if d >= 0 {
        format!("+{d}")
    } else {
        d.to_string()
    }
}

/// An AETH syndrome as IBA 9.7.5.2 names it: `ACK`, `RNR NAK t=N` (the timer code) or
/// `NAK <code>`.
pub fn syndrome(s: u8) -> String {
    match s >> 5 {
        0 => "ACK".into(),
        1 => format!("RNR NAK t={}", s & 0x1f),
        3 => match s & 0x1f {
            0 => "NAK PSN-seq".into(),
            1 => "NAK inv-req".into(),
            2 => "NAK rem-access".into(),
            3 => "NAK rem-op".into(),
            4 => "NAK inv-rd-req".into(),
            c => format!("NAK {c}"),
        },
        _ => format!("AETH {s:#04x}"),
    }
}

/// Reads the capture `bytes` (pcapng or pcap).
pub fn read(bytes: &[u8]) -> Result<Seq, String> {
    let pkts = packets(bytes).map_err(|e| e.to_string())?;
    let mut parsed = Vec::new();
    let mut seq = Seq::default();
    for p in pkts.iter().filter(|p| !p.is_event()) {
        match p.ip.map(|ip| parse(p.data, ip, p.orig_len)) {
            Some(Ok(x)) => parsed.push(x),
            Some(Err(ParseError::NotRoce)) | None => seq.other += 1,
            Some(Err(_)) => seq.other += 1,
        }
    }
    // Every destination QP of the capture: an RC or UC packet's source port is derived
    // from its own QP and the peer's, the peer being another QP packets went to.
    let qpns: Vec<u32> = parsed.iter().map(|p| p.headers.bth.dst_qpn).collect();
    // A conversation's index and the QP its first packet went to, by source port.
    let mut convs: HashMap<u16, (usize, u32)> = HashMap::new();
    for p in &parsed {
        if p.icrc_ok.is_some() {
            seq.icrc_checked += 1;
        }
        if p.icrc_ok == Some(false) {
            seq.icrc_bad += 1;
        }
        if !sport_ok(p, &qpns) {
            seq.sport_bad += 1;
        }
        let h = p.headers;
        let n = convs.len();
        let &mut (conv, opener) = convs.entry(p.src_port).or_insert((n, h.bth.dst_qpn));
        if conv == seq.pkts.len() {
            seq.pkts.push(Vec::new());
        }
        seq.pkts[conv].push(Pkt {
            to_opener: h.bth.dst_qpn == opener,
            headers: h,
            payload_len: p.payload_len,
        });
        seq.packets += 1;
    }
    seq.convs = seq.pkts.iter().map(|c| rows(c)).collect();
    Ok(seq)
}

/// The rows of a conversation's packets: PSN and MSN steps from the packet before to
/// the same QP.
pub fn rows(pkts: &[Pkt]) -> Vec<String> {
    let mut dests: HashMap<u32, Dest> = HashMap::new();
    pkts.iter()
        .map(|p| {
            let h = &p.headers;
            let first = !dests.contains_key(&h.bth.dst_qpn);
            let d = dests.entry(h.bth.dst_qpn).or_insert(Dest {
                psn: h.bth.psn,
                msn: None,
            });
            let psn = if first {
                "psn first".to_string()
            } else {
                format!("psn{}", signed(step(d.psn, h.bth.psn)))
            };
            d.psn = h.bth.psn;
            let dir = if p.to_opener { "->" } else { "<-" };
            let mut row = format!("{dir} {} {psn}", opcode::name(h.bth.opcode).unwrap_or("?"));
            row.push_str(&fields(h, p.payload_len, &mut d.msn));
            row
        })
        .collect()
}

/// The rest of a row: flags, length, the extension headers' device-independent fields.
fn fields(h: &Headers, payload: usize, msn: &mut Option<u32>) -> String {
    let mut s = String::new();
    if h.bth.solicited {
        s.push_str(" SE");
    }
    if h.bth.ack_req {
        s.push_str(" A");
    }
    let carries = opcode::extensions(h.bth.opcode).is_some_and(|e| e.payload);
    if carries {
        s.push_str(&format!(" len={payload}"));
    }
    if let Some(r) = h.reth {
        s.push_str(&format!(" reth.len={}", r.len));
    }
    if let Some(a) = h.atomic_eth {
        s.push_str(&format!(" swap/add={:#x} cmp={:#x}", a.swap_add, a.compare));
    }
    if let Some(a) = h.aeth {
        let m = match *msn {
            None => format!("msn={}", a.msn),
            Some(prev) => format!("msn{}", signed(step(prev, a.msn))),
        };
        *msn = Some(a.msn);
        s.push_str(&format!(" {} {m}", syndrome(a.syndrome)));
    }
    if let Some(o) = h.atomic_ack {
        s.push_str(&format!(" orig={o:#x}"));
    }
    if let Some(i) = h.imm {
        s.push_str(&format!(" imm={i:#x}"));
    }
    if let Some(k) = h.ieth {
        let _ = k; // an rkey: the device's own number
        s.push_str(" ieth");
    }
    if let Some((qkey, _)) = h.deth {
        s.push_str(&format!(" qkey={qkey:#x}"));
    }
    s
}

/// Whether a packet's UDP source port is the one rxe derives: a UD packet's from its
/// source QP (in the DETH), an RC or UC packet's from its QP and its peer's, one of the
/// capture's other destination QPs.
fn sport_ok(p: &Parsed, qpns: &[u32]) -> bool {
    let dst = p.headers.bth.dst_qpn;
    if let Some((_, src_qp)) = p.headers.deth {
        return p.src_port == udp_source_port_of_qp(src_qp);
    }
    qpns.iter()
        .any(|&q| q != dst && udp_source_port(0, q, dst) == p.src_port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use backend_sim_proto::capture::headers::{ack_syndrome, Aeth};
    use backend_sim_proto::capture::packet::{write, Route};

    /// A classic pcap (little-endian, microseconds, Ethernet) of `frames`.
    fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut f = Vec::new();
        for v in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 65535, 1] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        for p in frames {
            for v in [0u32, 0, p.len() as u32, p.len() as u32] {
                f.extend_from_slice(&v.to_le_bytes());
            }
            f.extend_from_slice(p);
        }
        f
    }

    fn gid(last: u8) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 77, 0, last]);
        g
    }

    fn packet(h: &Headers, payload: &[u8], src_port: u16) -> Vec<u8> {
        let route = Route {
            src_gid: gid(1),
            dst_gid: gid(1),
            src_port,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        };
        let mut out = Vec::new();
        write(&route, h, payload, &mut out).unwrap();
        out
    }

    #[test]
    fn a_conversation_reads_as_steps_and_its_packets_are_checked() {
        let (a, b) = (0x11, 0x12);
        let port = udp_source_port(0, a, b);
        let mut send = Headers::new(opcode::op::SEND_ONLY, b, 0xff_ffff);
        send.bth.ack_req = true;
        let mut next = send;
        next.bth.psn = 0;
        let mut ack = Headers::new(opcode::op::ACKNOWLEDGE, a, 0);
        ack.aeth = Some(Aeth {
            syndrome: ack_syndrome(),
            msn: 2,
        });
        let mut bad_crc = packet(&next, b"xyz", port);
        *bad_crc.last_mut().unwrap() ^= 1;
        let frames = [
            packet(&send, b"hello", port),
            bad_crc,
            packet(&ack, b"", port),
            packet(&next, b"", port ^ 1),
        ];
        let s = read(&pcap(&frames)).unwrap();
        // The last SEND's port is another conversation's.
        assert_eq!(s.convs.len(), 2);
        assert_eq!(
            s.convs[0],
            [
                "-> SEND_ONLY psn first A len=5",
                "-> SEND_ONLY psn+1 A len=3",
                "<- ACKNOWLEDGE psn first ACK msn=2"
            ]
        );
        assert_eq!(s.convs[1], ["-> SEND_ONLY psn first A len=0"]);
        assert_eq!((s.packets, s.icrc_checked, s.icrc_bad, s.sport_bad), (4, 4, 1, 1));
    }

    #[test]
    fn steps_wrap_at_24_bits() {
        assert_eq!(step(MASK, 0), 1);
        assert_eq!(step(0, MASK), -1);
        assert_eq!(step(5, 9), 4);
    }

    #[test]
    fn syndromes_are_named() {
        assert_eq!(syndrome(0x1f), "ACK");
        assert_eq!(syndrome(0x2e), "RNR NAK t=14");
        assert_eq!(syndrome(0x62), "NAK rem-access");
    }
}
