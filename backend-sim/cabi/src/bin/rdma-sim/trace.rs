//! `rdma-sim trace FILE`: a capture of RoCE v2 traffic (the sim's, or `tcpdump -w` of a
//! real RoCE port's UDP port 4791) as a ladder diagram per connection in the terminal,
//! requests one way and ACKs, NAKs and responses the other, with what went wrong
//! counted (resent PSNs, NAKs by kind, ICRC mismatches, the longest silence); `--svg`
//! draws the same ladders for runs too long to read in a terminal.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use backend_sim_proto::capture::headers::Headers;
use backend_sim_proto::capture::opcode::{self, Transport};
use backend_sim_proto::capture::parse::{parse, Parsed};
use backend_sim_proto::capture::read::packets;
use clap::Args;

/// `rdma-sim trace`'s options.
#[derive(Args, Debug)]
pub struct TraceArgs {
    /// The capture: pcapng or pcap, Ethernet or Linux cooked (`tcpdump -i any`).
    file: PathBuf,
    /// Rows shown per connection in the terminal (0: all).
    #[arg(long, default_value_t = 60)]
    limit: usize,
    /// Only the connections with a QP of this number (hex with 0x, or decimal).
    #[arg(long, value_parser = parse_qpn)]
    qp: Option<u32>,
    /// Also draw the ladders into this SVG file (every row).
    #[arg(long, value_name = "OUT.svg")]
    svg: Option<PathBuf>,
}

fn parse_qpn(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    v.map_err(|e| format!("not a QP number: {e}"))
}

/// One end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct End {
    ip: IpAddr,
    /// Its QP (learnt from the packets sent to it).
    qpn: Option<u32>,
}

/// One packet of a connection's ladder.
#[derive(Debug)]
struct Row {
    ts_ns: u64,
    /// Sent by the connection's end `a` (drawn left to right).
    from_a: bool,
    text: String,
    /// What is remarkable about it (resent, NAK, bad ICRC).
    mark: Option<&'static str>,
    comment: Option<String>,
}

/// A connection's packets and what they show.
#[derive(Debug)]
struct Conn {
    transport: Transport,
    a: End,
    b: End,
    rows: Vec<Row>,
    /// Request PSNs seen, per direction (a resend repeats one).
    seen: [HashSet<u32>; 2],
    resent: usize,
    naks: BTreeMap<&'static str, usize>,
    bad_icrc: usize,
}

/// What a trace found: the connections, and what was not RoCE.
#[derive(Debug, Default)]
struct Trace {
    conns: BTreeMap<(IpAddr, IpAddr, u16, u32), Conn>,
    other: usize,
    malformed: usize,
}

/// The AETH's meaning (IBA 9.7.5.2.8).
fn aeth_text(syndrome: u8) -> (String, Option<&'static str>) {
    match syndrome >> 5 {
        0 => ("ACK".into(), None),
        1 => {
            let t = verbs_api::timers::rnr_timer(syndrome & 31);
            (
                format!("RNR NAK (timer {}: {:?})", syndrome & 31, t),
                Some("RNR NAK"),
            )
        }
        3 => {
            let (what, mark) = match syndrome & 31 {
                0 => ("PSN sequence error", "NAK PSN sequence error"),
                1 => ("invalid request", "NAK invalid request"),
                2 => ("remote access error", "NAK remote access error"),
                3 => ("remote operational error", "NAK remote operational error"),
                _ => ("invalid RD request", "NAK invalid RD request"),
            };
            (format!("NAK {what}"), Some(mark))
        }
        _ => (
            format!("AETH syndrome {syndrome:#04x}"),
            Some("reserved AETH syndrome"),
        ),
    }
}

fn describe(h: &Headers, payload_len: usize) -> (String, Option<&'static str>) {
    let name = opcode::name(h.bth.opcode).unwrap_or("?");
    let mut s = format!("{name} psn {}", h.bth.psn);
    let mut mark = None;
    if let Some(r) = h.reth {
        let _ = write!(s, " va {:#x} rkey {:#x} len {}", r.addr, r.rkey, r.len);
    } else if payload_len > 0 {
        let _ = write!(s, " len {payload_len}");
    }
    if let Some(a) = h.atomic_eth {
        let _ = write!(
            s,
            " va {:#x} rkey {:#x} add/swap {} cmp {}",
            a.addr, a.rkey, a.swap_add, a.compare
        );
    }
    if let Some(a) = h.aeth {
        let (t, m) = aeth_text(a.syndrome);
        mark = m;
        s = format!("{t} psn {} msn {}", h.bth.psn, a.msn);
        if h.bth.opcode & 0x1f != opcode::op::ACKNOWLEDGE {
            s = format!("{name} psn {} msn {} len {payload_len}", h.bth.psn, a.msn);
        }
    }
    if let Some(v) = h.atomic_ack {
        let _ = write!(s, " orig {v}");
    }
    if let Some((qkey, src)) = h.deth {
        let _ = write!(s, " qkey {qkey:#x} src qp {src:#x}");
    }
    if let Some(v) = h.imm {
        let _ = write!(s, " imm {v:#x}");
    }
    if let Some(v) = h.ieth {
        let _ = write!(s, " inv rkey {v:#x}");
    }
    if h.bth.ack_req {
        s.push_str(" A");
    }
    if h.bth.solicited {
        s.push_str(" SE");
    }
    (s, mark)
}

impl Trace {
    fn add(&mut self, p: &Parsed, ts_ns: u64, comment: Option<String>) {
        let h = &p.headers;
        let Some(transport) = opcode::transport(h.bth.opcode) else {
            self.malformed += 1;
            return;
        };
        // Both directions of a connection share the UDP source port (rxe derives it from
        // the QP pair, symmetrically); a UD pair is told apart by its QPs too.
        let (lo, hi) = if p.src <= p.dst {
            (p.src, p.dst)
        } else {
            (p.dst, p.src)
        };
        let qp_key = match h.deth {
            Some((_, src)) => src.min(h.bth.dst_qpn) ^ (src.max(h.bth.dst_qpn) << 8),
            None => 0,
        };
        let conn = self
            .conns
            .entry((lo, hi, p.src_port, qp_key))
            .or_insert_with(|| Conn {
                transport,
                a: End { ip: p.src, qpn: None },
                b: End { ip: p.dst, qpn: None },
                rows: Vec::new(),
                seen: Default::default(),
                resent: 0,
                naks: BTreeMap::new(),
                bad_icrc: 0,
            });
        let from_a = p.src == conn.a.ip
            && (p.src != p.dst || conn.b.qpn != Some(h.bth.dst_qpn) || conn.a.qpn == Some(h.bth.dst_qpn));
        let (to, from) = if from_a {
            (&mut conn.b, &mut conn.a)
        } else {
            (&mut conn.a, &mut conn.b)
        };
        to.qpn.get_or_insert(h.bth.dst_qpn);
        if let Some((_, src)) = h.deth {
            from.qpn.get_or_insert(src);
        }
        let (text, mut mark) = describe(h, p.payload_len);
        if let Some(m) = mark {
            *conn.naks.entry(m).or_default() += 1;
        }
        if !opcode::is_response(h.bth.opcode) && !conn.seen[from_a as usize].insert(h.bth.psn) {
            conn.resent += 1;
            mark = Some("resent");
        }
        if p.icrc_ok == Some(false) {
            conn.bad_icrc += 1;
            mark = Some("ICRC mismatch");
        }
        conn.rows.push(Row {
            ts_ns,
            from_a,
            text,
            mark,
            comment,
        });
    }
}

fn end_name(e: &End) -> String {
    match e.qpn {
        Some(q) => format!("{} QP {q:#08x}", e.ip),
        None => format!("{} QP ?", e.ip),
    }
}

fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::Rc => "RC",
        Transport::Uc => "UC",
        Transport::Ud => "UD",
    }
}

const HALF: usize = 58;

/// The ladder and summary of one connection, as text.
fn ladder(c: &Conn, t0: u64, limit: usize, out: &mut String) {
    let _ = writeln!(
        out,
        "{} connection {} <-> {}: {} packets",
        transport_name(c.transport),
        end_name(&c.a),
        end_name(&c.b),
        c.rows.len()
    );
    let _ = writeln!(
        out,
        "{:>12}  {:<w$}  {}",
        "time (ms)",
        end_name(&c.a),
        end_name(&c.b),
        w = HALF
    );
    let shown = if limit == 0 {
        c.rows.len()
    } else {
        limit.min(c.rows.len())
    };
    for r in &c.rows[..shown] {
        let t = (r.ts_ns.saturating_sub(t0)) as f64 / 1e6;
        let mark = r.mark.map(|m| format!("  [{m}]")).unwrap_or_default();
        if r.from_a {
            let _ = writeln!(out, "{t:>12.6}  {:<w$}--->{mark}", r.text, w = HALF - 4);
        } else {
            let _ = writeln!(out, "{t:>12.6}  {:>w$}<---  {}{mark}", "", r.text, w = HALF - 4);
        }
        if let Some(cm) = &r.comment {
            let _ = writeln!(out, "{:>12}  # {cm}", "");
        }
    }
    if shown < c.rows.len() {
        let _ = writeln!(
            out,
            "{:>12}  ... {} more (--limit 0 shows all)",
            "",
            c.rows.len() - shown
        );
    }
    let mut notes = Vec::new();
    if c.resent > 0 {
        notes.push(format!("{} resent", c.resent));
    }
    for (k, n) in &c.naks {
        notes.push(format!("{n} {k}"));
    }
    if c.bad_icrc > 0 {
        notes.push(format!("{} ICRC mismatches", c.bad_icrc));
    }
    if let Some((gap, at)) = c
        .rows
        .windows(2)
        .map(|w| (w[1].ts_ns.saturating_sub(w[0].ts_ns), w[0].ts_ns))
        .max()
    {
        let at = (at.saturating_sub(t0)) as f64 / 1e6;
        notes.push(format!(
            "longest silence {:?} after {at:.6} ms",
            Duration::from_nanos(gap)
        ));
    }
    if !notes.is_empty() {
        let _ = writeln!(out, "{:>12}  {}", "summary:", notes.join(", "));
    }
    out.push('\n');
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Every connection's ladder as one SVG: two lifelines per connection, a row per packet.
fn svg(conns: &[&Conn], t0: u64) -> String {
    const ROW: usize = 16;
    const W: usize = 1100;
    let (left, right) = (330usize, 770usize);
    let mut y = 30;
    let mut body = String::new();
    for c in conns {
        let head = format!(
            "{} {} &lt;-&gt; {}",
            transport_name(c.transport),
            end_name(&c.a),
            end_name(&c.b)
        );
        let _ = writeln!(body, r#"<text x="10" y="{y}" font-weight="bold">{head}</text>"#);
        y += 20;
        let top = y;
        for r in &c.rows {
            let t = (r.ts_ns.saturating_sub(t0)) as f64 / 1e6;
            let color = match r.mark {
                Some("resent") => "darkorange",
                Some(_) => "crimson",
                None if r.from_a => "black",
                None => "seagreen",
            };
            let (x1, x2, tx, anchor) = if r.from_a {
                (left, right, left - 6, "end")
            } else {
                (right, left, right + 6, "start")
            };
            let _ = writeln!(body, r#"<text x="10" y="{}" fill="gray">{t:.6}</text>"#, y + 4);
            let _ = writeln!(
                body,
                r#"<line x1="{x1}" y1="{y}" x2="{x2}" y2="{y}" stroke="{color}" marker-end="url(#h)"/><text x="{tx}" y="{}" text-anchor="{anchor}" fill="{color}">{}</text>"#,
                y + 4,
                escape(&r.text)
            );
            y += ROW;
        }
        for x in [left, right] {
            let _ = writeln!(
                body,
                r#"<line x1="{x}" y1="{}" x2="{x}" y2="{y}" stroke="lightgray"/>"#,
                top - 8
            );
        }
        y += 20;
    }
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{y}" font-family="monospace" font-size="11">
<defs><marker id="h" markerWidth="8" markerHeight="8" refX="8" refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z"/></marker></defs>
{body}</svg>
"#
    )
}

/// Runs `rdma-sim trace`.
pub fn run(args: &TraceArgs) -> Result<()> {
    let bytes = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let caps =
        packets(&bytes).with_context(|| format!("{} is not a capture this can read", args.file.display()))?;
    let mut trace = Trace::default();
    let t0 = caps.first().map(|c| c.ts_ns).unwrap_or(0);
    for c in caps {
        if c.is_event() {
            // The verbs context of a sim capture: for Wireshark's view, not the ladder.
            continue;
        }
        let Some(ip) = c.ip else {
            trace.other += 1;
            continue;
        };
        match parse(c.data, ip, c.orig_len) {
            Ok(p) => trace.add(&p, c.ts_ns, c.comment),
            Err(backend_sim_proto::capture::parse::ParseError::NotRoce) => trace.other += 1,
            Err(_) => trace.malformed += 1,
        }
    }
    let conns: Vec<&Conn> = trace
        .conns
        .values()
        .filter(|c| args.qp.is_none_or(|q| c.a.qpn == Some(q) || c.b.qpn == Some(q)))
        .collect();
    let mut out = String::new();
    for c in &conns {
        ladder(c, t0, args.limit, &mut out);
    }
    let _ = writeln!(
        out,
        "{} connection(s); {} packet(s) not RoCE v2, {} malformed",
        conns.len(),
        trace.other,
        trace.malformed
    );
    print!("{out}");
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&conns, t0)).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use backend_sim_proto::capture::packet::{self, udp_source_port, Route};
    use backend_sim_proto::capture::pcapng;
    use backend_sim_proto::capture::read::packets;
    use backend_sim_proto::capture::segment::{segments, Context};
    use backend_sim_proto::wire::{Frame, NakCode};

    fn gid(last: u8) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 0, 0, last]);
        g
    }

    /// A capture of a WRITE, its RNR-free ACK, a SEND that meets an RNR NAK and is sent
    /// again, between QPs 0x11 (10.0.0.1) and 0x12 (10.0.0.2).
    fn capture() -> Vec<u8> {
        let mut f = Vec::new();
        pcapng::header(&mut f, "test", "sim0", 0);
        let sport = udp_source_port(0, 0x11, 0x12);
        let there = Route {
            src_gid: gid(1),
            dst_gid: gid(2),
            src_port: sport,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        };
        let back = Route {
            src_gid: gid(2),
            dst_gid: gid(1),
            ..there
        };
        let frames = [
            (
                true,
                Frame::Write {
                    psn: 0,
                    len: 2048,
                    addr: 0x1000,
                    rkey: 7,
                    imm: None,
                    solicited: false,
                    ack_req: true,
                },
            ),
            (false, Frame::Ack { psn: 1 }),
            (
                true,
                Frame::Send {
                    psn: 2,
                    len: 16,
                    imm: None,
                    solicited: false,
                    ack_req: true,
                    inv: None,
                },
            ),
            (
                false,
                Frame::Nak {
                    psn: 2,
                    code: NakCode::Rnr { timer: 14 },
                    reason: None,
                },
            ),
            (
                true,
                Frame::Send {
                    psn: 2,
                    len: 16,
                    imm: None,
                    solicited: false,
                    ack_req: true,
                    inv: None,
                },
            ),
            (false, Frame::Ack { psn: 2 }),
        ];
        let mut ts = 1_000_000_000;
        for (out, fr) in frames {
            let (route, dst) = if out { (there, 0x12) } else { (back, 0x11) };
            let cx = Context {
                transport: Transport::Rc,
                dst_qpn: dst,
                mtu: 1024,
                msn: 1,
            };
            for s in segments(&fr, &cx) {
                let mut p = Vec::new();
                packet::write(&route, &s.headers, &vec![0; s.payload.len()], &mut p).unwrap();
                pcapng::packet(&mut f, ts, &p, p.len(), None);
                ts += 10_000;
            }
        }
        f
    }

    #[test]
    fn a_ladder_shows_the_rnr_nak_and_the_resend() {
        let f = capture();
        let mut trace = Trace::default();
        for c in packets(&f).unwrap() {
            trace.add(
                &parse(c.data, c.ip.unwrap(), c.orig_len).unwrap(),
                c.ts_ns,
                c.comment,
            );
        }
        assert_eq!(trace.conns.len(), 1, "both directions are one connection");
        let c = trace.conns.values().next().unwrap();
        assert_eq!((c.a.qpn, c.b.qpn), (Some(0x11), Some(0x12)));
        assert_eq!(c.rows.len(), 7);
        assert_eq!(c.resent, 1);
        assert_eq!(c.naks.get("RNR NAK"), Some(&1));
        let mut out = String::new();
        ladder(c, 1_000_000_000, 0, &mut out);
        assert!(
            out.contains("RDMA_WRITE_FIRST psn 0 va 0x1000 rkey 0x7 len 2048"),
            "{out}"
        );
        assert!(out.contains("RNR NAK (timer 14: 1.28ms) psn 2"), "{out}");
        assert!(out.contains("[resent]"), "{out}");
        assert!(out.contains("1 resent, 1 RNR NAK"), "{out}");
        let s = svg(&[c], 1_000_000_000);
        assert_eq!(s.matches("<line").count(), 7 + 2);
    }
}
