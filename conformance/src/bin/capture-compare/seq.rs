//! A capture as the sequences a comparison holds against another device's: its
//! conversations, in the order of their first packets, each one row per RoCE packet in
//! capture order, with what does not depend on the device (the direction, the transport
//! when it is not RC, PSN and MSN as steps from the previous packet to the same QP, the
//! payload's length, the AETH syndrome decoded, RETH lengths, atomic operands and
//! original values, immediate data, Q_Keys, multicast groups, and rkeys numbered in the
//! order the conversation first names them, so that a SEND with Invalidate's IETH is
//! seen to name the rkey an earlier RETH used), and what the comparison checks of each
//! packet on the way: its ICRC, recomputed as rxe computes it, and its UDP source port,
//! derived from the QP numbers as rxe derives it. Conversations are compared one by one:
//! how the packets of several QP pairs interleave is the scheduling of the moment.
//!
//! A conversation is an RC or UC QP pair's packets, which share a UDP source port (rxe's
//! derivation is symmetric in the two QP numbers); a UD QP pair's datagrams both ways,
//! by the source QP in their DETH and the destination QP (a UD QP's source port is its
//! own, so the two directions' differ); or one UD QP's datagrams to one multicast group
//! (destination QP 0xFFFFFF, IBA 10.5.2.4: the group's address is the destination GID,
//! the IP destination in RoCE v2). Datagrams to or from the GSI QP (QP1: the
//! communication manager's MADs, which rdma_cm sends on a RoCE device and the sim's
//! connection manager does not put on its wire) are set aside and counted, their ICRC
//! and source port still checked.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use backend_sim_proto::capture::headers::Headers;
use backend_sim_proto::capture::opcode::{self, Transport};
use backend_sim_proto::capture::packet::{udp_source_port, udp_source_port_of_qp};
use backend_sim_proto::capture::parse::{parse, ParseError, Parsed};
use backend_sim_proto::capture::read::packets;

/// PSNs and MSNs are 24 bits.
const MASK: u32 = 0x00ff_ffff;

/// The destination QP of a multicast datagram (IBA 10.5.2.4: the permissive QP).
pub const MCAST_QPN: u32 = 0x00ff_ffff;

/// The General Services Interface's QP, where the CM's MADs go (IBA 13.5.1).
const GSI_QPN: u32 = 1;

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
    /// Packets whose UDP source port is not the one rxe derives from their QP numbers,
    /// by port: [`Seq::sport_bad`] holds them against another capture's.
    pub odd_ports: BTreeMap<u16, usize>,
    /// Packets that are not RoCE v2, or do not parse.
    pub other: usize,
    /// Datagrams to or from the GSI QP (CM MADs), left out of the conversations.
    pub gsi: usize,
}

impl Seq {
    /// How many packets have a UDP source port that is neither the one rxe derives from
    /// their QP numbers nor one `other` (the other device's capture of the case) uses
    /// as well where it is not: rxe derives the port from the address vector's flow
    /// label when it has one (`udp_source_port`), which the case chooses, so both
    /// devices use the same port, while their QP numbers differ.
    pub fn sport_bad(&self, other: &Seq) -> usize {
        self.odd_ports
            .iter()
            .filter(|(p, _)| !other.odd_ports.contains_key(p))
            .map(|(_, n)| n)
            .sum()
    }
}

/// What the packets of one conversation share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// An RC or UC QP pair's UDP source port.
    Port(u16),
    /// A UD QP pair, the lower QP number first.
    Ud(u32, u32),
    /// A UD QP's datagrams to a multicast group.
    Group(u32, IpAddr),
}

impl Key {
    fn of(p: &Parsed) -> Key {
        let dst = p.headers.bth.dst_qpn;
        match p.headers.deth {
            Some((_, src)) if dst == MCAST_QPN => Key::Group(src, p.dst),
            Some((_, src)) => Key::Ud(src.min(dst), src.max(dst)),
            None => Key::Port(p.src_port),
        }
    }
}

/// Whether a packet goes to or comes from the GSI QP.
fn is_gsi(h: &Headers) -> bool {
    h.bth.dst_qpn == GSI_QPN || h.deth.is_some_and(|(_, src)| src == GSI_QPN)
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
    /// The multicast group it goes to (its IP destination), if it goes to one.
    pub group: Option<IpAddr>,
}

/// The state of the packets to one destination QP.
struct Dest {
    psn: u32,
    msn: Option<u32>,
}

/// The signed step from `from` to `to` in 24-bit sequence space.
pub fn step(from: u32, to: u32) -> i32 {
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
    // The QPs the sim's event comments name (`QP 0x1234: state ...`).
    let mut qpns: Vec<u32> = pkts
        .iter()
        .filter(|p| p.is_event())
        .filter_map(|p| p.comment.as_deref()?.strip_prefix("QP 0x"))
        .filter_map(|c| u32::from_str_radix(c.split(':').next()?, 16).ok())
        .collect();
    for p in pkts.iter().filter(|p| !p.is_event()) {
        match p.ip.map(|ip| parse(p.data, ip, p.orig_len)) {
            Some(Ok(x)) => parsed.push(x),
            Some(Err(ParseError::NotRoce)) | None => seq.other += 1,
            Some(Err(_)) => seq.other += 1,
        }
    }
    // Every QP of the capture: an RC or UC packet's source port is derived from its own
    // QP and the peer's, the peer being another QP packets went to or a comment named.
    qpns.extend(parsed.iter().map(|p| p.headers.bth.dst_qpn));
    qpns.sort_unstable();
    qpns.dedup();
    // A conversation's index and the QP its first packet went to, by its key.
    let mut convs: HashMap<Key, (usize, u32)> = HashMap::new();
    for p in &parsed {
        if p.icrc_ok.is_some() {
            seq.icrc_checked += 1;
        }
        if p.icrc_ok == Some(false) {
            seq.icrc_bad += 1;
        }
        if !sport_ok(p, &qpns) {
            *seq.odd_ports.entry(p.src_port).or_default() += 1;
        }
        let h = p.headers;
        if is_gsi(&h) {
            seq.gsi += 1;
            continue;
        }
        let n = convs.len();
        let &mut (conv, opener) = convs.entry(Key::of(p)).or_insert((n, h.bth.dst_qpn));
        if conv == seq.pkts.len() {
            seq.pkts.push(Vec::new());
        }
        seq.pkts[conv].push(Pkt {
            to_opener: h.bth.dst_qpn == opener,
            headers: h,
            payload_len: p.payload_len,
            group: p.dst.is_multicast().then_some(p.dst),
        });
        seq.packets += 1;
    }
    seq.convs = seq.pkts.iter().map(|c| rows(c)).collect();
    Ok(seq)
}

/// The rows of a conversation's packets: PSN and MSN steps from the packet before to
/// the same QP, rkeys by the order the conversation first names them.
pub fn rows(pkts: &[Pkt]) -> Vec<String> {
    let mut dests: HashMap<u32, Dest> = HashMap::new();
    let mut rkeys = Rkeys::default();
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
            let transport = match opcode::transport(h.bth.opcode) {
                Some(Transport::Uc) => "UC ",
                Some(Transport::Ud) => "UD ",
                _ => "",
            };
            let name = opcode::name(h.bth.opcode).unwrap_or("?");
            let mut row = format!("{dir} {transport}{name} {psn}");
            row.push_str(&fields(h, p.payload_len, &mut d.msn, &mut rkeys));
            // (The group's address is the case's choice of the moment, not the device's.)
            if p.group.is_some() {
                row.push_str(" group");
            }
            row
        })
        .collect()
}

/// The rkeys a conversation names, in the order it first names them: a device's rkeys
/// are its own numbers, the order is what two devices share.
#[derive(Default)]
struct Rkeys(Vec<u32>);

impl Rkeys {
    /// `k1` for the first rkey named, `k2` for the second, ...
    fn name(&mut self, rkey: u32) -> String {
        let i = match self.0.iter().position(|&k| k == rkey) {
            Some(i) => i,
            None => {
                self.0.push(rkey);
                self.0.len() - 1
            }
        };
        format!("k{}", i + 1)
    }
}

/// The rest of a row: flags, length, the extension headers' device-independent fields.
fn fields(h: &Headers, payload: usize, msn: &mut Option<u32>, rkeys: &mut Rkeys) -> String {
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
        s.push_str(&format!(" reth.len={} rkey={}", r.len, rkeys.name(r.rkey)));
    }
    if let Some(a) = h.atomic_eth {
        s.push_str(&format!(
            " swap/add={:#x} cmp={:#x} rkey={}",
            a.swap_add,
            a.compare,
            rkeys.name(a.rkey)
        ));
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
        s.push_str(&format!(" ieth={}", rkeys.name(k)));
    }
    if let Some((qkey, _)) = h.deth {
        s.push_str(&format!(" qkey={qkey:#x}"));
    }
    if h.bth.dst_qpn == MCAST_QPN {
        s.push_str(" qp=mcast");
    }
    s
}

/// How far from a QP number of the capture the peer of a QP that only receives may be.
const NEIGHBOURS: u32 = 8;

/// Whether a packet's UDP source port is the one rxe derives: a UD packet's from its
/// source QP (in the DETH), an RC or UC packet's from its QP and its peer's, one of the
/// capture's other QPs (destinations, or named by the sim's event comments) or, when the
/// peer receives nothing and no comment names it (a UC stream one way on a device's
/// capture), a QP number next to one of them (rxe numbers QPs in sequence, and a case
/// creates a pair's QPs one after the other).
fn sport_ok(p: &Parsed, qpns: &[u32]) -> bool {
    let dst = p.headers.bth.dst_qpn;
    if let Some((_, src_qp)) = p.headers.deth {
        return p.src_port == udp_source_port_of_qp(src_qp);
    }
    let from = |q: u32| q != dst && udp_source_port(0, q, dst) == p.src_port;
    qpns.iter().any(|&q| from(q))
        || qpns
            .iter()
            .any(|&q| (q.saturating_sub(NEIGHBOURS)..=q.saturating_add(NEIGHBOURS).min(MASK)).any(from))
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
        packet_to(gid(1), h, payload, src_port)
    }

    fn packet_to(dst_gid: [u8; 16], h: &Headers, payload: &[u8], src_port: u16) -> Vec<u8> {
        let route = Route {
            src_gid: gid(1),
            dst_gid,
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
        assert_eq!((s.packets, s.icrc_checked, s.icrc_bad), (4, 4, 1));
        assert_eq!(s.sport_bad(&Seq::default()), 1);
        // A port both devices use is one the address vector's flow label gave.
        assert_eq!(s.sport_bad(&s), 0);
    }

    /// A UD SEND Only from `src` to `dst` with Q_Key `qkey`, its source port rxe's.
    fn datagram(src: u32, dst: u32, psn: u32, qkey: u32, dst_gid: [u8; 16]) -> Vec<u8> {
        let mut h = Headers::new(0x64, dst, psn);
        h.deth = Some((qkey, src));
        packet_to(dst_gid, &h, b"dgram", udp_source_port_of_qp(src))
    }

    #[test]
    fn datagrams_pair_by_qp_numbers_groups_by_address_and_cm_mads_are_set_aside() {
        let mut group = gid(0);
        group[12..].copy_from_slice(&[239, 1, 2, 3]);
        let frames = [
            datagram(0x21, 0x22, 7, 0x1111, gid(1)),
            // The answer has its own source port, yet is the same QP pair's.
            datagram(0x22, 0x21, 3, 0x1111, gid(1)),
            datagram(0x21, MCAST_QPN, 8, 0x2222, group),
            // A CM MAD to QP1 and its answer from it.
            datagram(0x1, 0x1, 0, 0x8001_0000, gid(1)),
            datagram(0x21, 0x22, 9, 0x1111, gid(1)),
        ];
        let s = read(&pcap(&frames)).unwrap();
        assert_eq!(
            s.convs,
            [
                vec![
                    "-> UD SEND_ONLY psn first len=5 qkey=0x1111",
                    "<- UD SEND_ONLY psn first len=5 qkey=0x1111",
                    "-> UD SEND_ONLY psn+2 len=5 qkey=0x1111",
                ],
                vec!["-> UD SEND_ONLY psn first len=5 qkey=0x2222 qp=mcast group"],
            ]
        );
        assert_eq!((s.packets, s.gsi, s.icrc_checked, s.icrc_bad), (4, 1, 5, 0));
        assert!(s.odd_ports.is_empty());
    }

    #[test]
    fn rkeys_are_numbered_so_an_invalidate_names_the_one_a_write_used() {
        use backend_sim_proto::capture::headers::Reth;
        let (a, b) = (0x11, 0x12);
        let port = udp_source_port(0, a, b);
        let write = |rkey: u32, psn: u32| {
            let mut h = Headers::new(opcode::op::WRITE_ONLY, b, psn);
            h.reth = Some(Reth {
                addr: 0,
                rkey,
                len: 4,
            });
            packet(&h, b"abcd", port)
        };
        let mut inv = Headers::new(opcode::op::SEND_ONLY_INV, b, 3);
        inv.ieth = Some(0x5503);
        let mut uc = Headers::new(0x20 | opcode::op::SEND_ONLY, b, 4);
        uc.bth.solicited = true;
        let frames = [
            write(0x5503, 1),
            write(0x7704, 2),
            packet(&inv, b"", port),
            packet(&uc, b"", port),
        ];
        let s = read(&pcap(&frames)).unwrap();
        assert_eq!(
            s.convs[0],
            [
                "-> RDMA_WRITE_ONLY psn first len=4 reth.len=4 rkey=k1",
                "-> RDMA_WRITE_ONLY psn+1 len=4 reth.len=4 rkey=k2",
                "-> SEND_ONLY_WITH_INVALIDATE psn+1 len=0 ieth=k1",
                "-> UC SEND_ONLY psn+1 SE len=0",
            ]
        );
    }

    #[test]
    fn a_one_way_stream_has_its_port_from_a_neighbouring_qp() {
        // A UC stream to QP 0xcd: its peer, 0xcc, receives nothing.
        let uc = |peer: u32| {
            let h = Headers::new(0x20 | opcode::op::SEND_ONLY, 0xcd, 1);
            packet(&h, b"x", udp_source_port(0, peer, 0xcd))
        };
        let s = read(&pcap(&[uc(0xcc)])).unwrap();
        assert_eq!(s.sport_bad(&Seq::default()), 0);
        let s = read(&pcap(&[uc(0x4321)])).unwrap();
        assert_eq!(s.sport_bad(&Seq::default()), 1);
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
