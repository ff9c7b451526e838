//! The judge of the capture encoding: tshark (Wireshark's dissector for RoCE v2 on UDP
//! port 4791) reads a capture of every kind of packet the sim sends, over IPv4 and
//! IPv6, without a malformed packet, and dissects the fields the sim wrote.

use backend_sim_proto::capture::opcode::Transport;
use backend_sim_proto::capture::packet::{self, udp_source_port, Route};
use backend_sim_proto::capture::pcapng;
use backend_sim_proto::capture::segment::{segments, Context};
use backend_sim_proto::wire::{Frame, NakCode};
use capture_judge::{fields, Scratch};

fn mapped(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

fn frames() -> Vec<(Transport, Frame)> {
    use Transport::*;
    vec![
        (
            Rc,
            Frame::Send {
                psn: 10,
                len: 3000,
                imm: None,
                solicited: false,
                ack_req: true,
                inv: None,
            },
        ),
        (
            Rc,
            Frame::Send {
                psn: 13,
                len: 5,
                imm: Some(0xabcd),
                solicited: true,
                ack_req: true,
                inv: None,
            },
        ),
        (
            Rc,
            Frame::Write {
                psn: 14,
                len: 2048,
                addr: 0x7f00_0000_1000,
                rkey: 0x1234,
                imm: None,
                solicited: false,
                ack_req: true,
            },
        ),
        (
            Rc,
            Frame::Write {
                psn: 16,
                len: 8,
                addr: 0x7f00_0000_2000,
                rkey: 0x1234,
                imm: Some(7),
                solicited: false,
                ack_req: true,
            },
        ),
        (
            Rc,
            Frame::Read {
                psn: 17,
                len: 4096,
                addr: 0x7f00_0000_3000,
                rkey: 0x99,
                inflight: 1,
            },
        ),
        (Rc, Frame::ReadResp { psn: 17, len: 4096 }),
        (
            Rc,
            Frame::CmpSwap {
                psn: 21,
                inflight: 1,
                addr: 0x7f00_0000_4000,
                rkey: 0x99,
                compare: 1,
                swap: 2,
            },
        ),
        (
            Rc,
            Frame::FetchAdd {
                psn: 22,
                inflight: 1,
                addr: 0x7f00_0000_4008,
                rkey: 0x99,
                add: 5,
            },
        ),
        (
            Rc,
            Frame::AtomicResp {
                psn: 22,
                orig: 0x1122_3344,
            },
        ),
        (Rc, Frame::Ack { psn: 22 }),
        (
            Rc,
            Frame::Nak {
                psn: 23,
                code: NakCode::Rnr { timer: 12 },
                reason: None,
            },
        ),
        (
            Rc,
            Frame::Nak {
                psn: 23,
                code: NakCode::RemoteAccess,
                reason: None,
            },
        ),
        (
            Rc,
            Frame::Send {
                psn: 24,
                len: 8,
                imm: None,
                solicited: false,
                ack_req: true,
                inv: Some(0x4321),
            },
        ),
        (
            Uc,
            Frame::Write {
                psn: 1,
                len: 100,
                addr: 0x1000,
                rkey: 3,
                imm: None,
                solicited: false,
                ack_req: false,
            },
        ),
        (
            Ud,
            Frame::Datagram {
                psn: 0,
                len: 64,
                dst_qpn: 0x20,
                src_qpn: 0x21,
                qkey: 0x1111_1111,
                imm: Some(3),
                solicited: false,
                grh: None,
            },
        ),
    ]
}

fn capture(src: [u8; 16], dst: [u8; 16], path: &std::path::Path) -> Vec<(u8, u32)> {
    let mut out = Vec::new();
    pcapng::header(&mut out, "backend-sim tests", "sim0", 0);
    let route = Route {
        src_gid: src,
        dst_gid: dst,
        src_port: udp_source_port(0, 0x11, 0x12),
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
    };
    let mut expect = Vec::new();
    let mut ts = 1_700_000_000_000_000_000u64;
    for (transport, f) in frames() {
        let cx = Context {
            transport,
            dst_qpn: 0x12,
            mtu: 1024,
            msn: 3,
        };
        for s in segments(&f, &cx) {
            let payload: Vec<u8> = s.payload.clone().map(|i| i as u8).collect();
            let mut p = Vec::new();
            packet::write(&route, &s.headers, &payload, &mut p).unwrap();
            pcapng::packet(&mut out, ts, &p, p.len(), Some("a comment"));
            ts += 1000;
            expect.push((s.headers.bth.opcode, s.headers.bth.psn));
        }
    }
    std::fs::write(path, &out).unwrap();
    expect
}

/// `allowed`: expert messages besides the packet comment that the packets may earn.
fn check(src: [u8; 16], dst: [u8; 16], name: &str, allowed: &[&str]) {
    let file = Scratch::new(&format!("capture-{name}"), "pcapng");
    let expect = capture(src, dst, file.path());
    let rows = fields(
        file.path(),
        &[
            "infiniband.bth.opcode",
            "infiniband.bth.psn",
            "_ws.malformed",
            "_ws.expert.message",
            "frame.comment",
        ],
    );
    assert_eq!(rows.len(), expect.len(), "one dissected frame per packet");
    for (row, (opcode, psn)) in rows.iter().zip(&expect) {
        assert_eq!(row[0], opcode.to_string(), "opcode of {row:?}");
        assert_eq!(row[1], psn.to_string(), "PSN of {row:?}");
        assert!(row[2].is_empty(), "malformed: {row:?}");
        // The packet comment is itself expert information; no other (a dissector's
        // warning or error) may appear but those allowed.
        let fine = |m: &str| m == "a comment" || allowed.contains(&m);
        assert!(row[3].split(',').all(fine), "expert info: {row:?}");
        assert_eq!(row[4], "a comment");
    }
}

#[test]
fn tshark_dissects_every_packet_kind_over_ipv4() {
    check(mapped([10, 0, 0, 1]), mapped([10, 0, 0, 2]), "v4", &[]);
}

#[test]
fn tshark_dissects_every_packet_kind_over_ipv6() {
    let mut a = [0u8; 16];
    a[0] = 0xfd;
    a[15] = 1;
    let mut b = a;
    b[15] = 2;
    // rxe sends a UDP checksum of 0 over IPv6 too (prepare_udp_hdr()), which RFC 6935
    // allows tunnels and Wireshark flags.
    check(a, b, "v6", &["Illegal checksum value (0)"]);
}
