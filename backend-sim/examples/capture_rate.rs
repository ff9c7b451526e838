//! How many packets per second a capture writes (`RDMA_SIM_PCAP`'s path: frames cut
//! into packets, encoded, written as pcapng blocks to a file), with headers only (the
//! default) and whole. The frames are an RC stream's mix: 4 KiB SENDs at a path MTU of
//! 1024 (four packets each) and the ACKs that answer them.
//!
//! `cargo run --release -p backend-sim --example capture_rate [-- --frames N] [--out DIR]`
//! prints a table; `--out DIR` also writes DIR/capture-rate.md and .json.

use std::time::Instant;

use backend_sim::capture::{Capture, Flow, Snaplen};
use backend_sim_proto::capture::opcode::Transport;
use backend_sim_proto::wire::Frame;

fn gid(last: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[10, 0, 0, last]);
    g
}

/// Writes `frames` frames of the mix; returns (packets, seconds, bytes written).
fn run(snap: Snaplen, frames: u32, dir: &std::path::Path) -> (u64, f64, u64) {
    let path = dir.join(format!("capture-rate-{}.pcapng", std::process::id()));
    let cap = Capture::create(&path, snap).expect("a file in the temporary directory");
    let req = Flow::new(gid(1), gid(2), 0xc123, 0, Transport::Rc, 0x12, 1024);
    let ack = Flow::new(gid(2), gid(1), 0xc123, 0, Transport::Rc, 0x11, 1024);
    let payload = vec![0x5au8; 4096];
    let mut packets = 0u64;
    let t = Instant::now();
    for i in 0..frames {
        let psn = (i * 4) & 0xff_ffff;
        let send = Frame::Send {
            psn,
            len: 4096,
            imm: None,
            solicited: false,
            ack_req: true,
            inv: None,
        };
        cap.frame(&req, &send, 0, &payload, None);
        cap.frame(
            &ack,
            &Frame::Ack {
                psn: (psn + 3) & 0xff_ffff,
            },
            i,
            &[],
            None,
        );
        packets += 5;
    }
    cap.flush();
    let secs = t.elapsed().as_secs_f64();
    drop(cap);
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    std::fs::remove_file(&path).ok();
    (packets, secs, bytes)
}

fn main() {
    let mut frames = 400_000u32;
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--frames" => frames = args.next().and_then(|v| v.parse().ok()).expect("--frames N"),
            "--out" => out = Some(std::path::PathBuf::from(args.next().expect("--out DIR"))),
            _ => {
                eprintln!("usage: capture_rate [--frames N] [--out DIR]");
                std::process::exit(2);
            }
        }
    }
    let dir = std::env::temp_dir();
    let mut md = String::from("| snap length | packets | packets/s | MB/s written |\n|---|---|---|---|\n");
    let mut json = Vec::new();
    for (name, snap) in [("headers", Snaplen::Headers), ("all", Snaplen::Whole)] {
        let (packets, secs, bytes) = run(snap, frames, &dir);
        let rate = packets as f64 / secs;
        let mbs = bytes as f64 / secs / 1e6;
        md.push_str(&format!("| {name} | {packets} | {rate:.0} | {mbs:.0} |\n"));
        json.push(format!(
            "{{\"snaplen\": \"{name}\", \"packets\": {packets}, \"seconds\": {secs:.4}, \"packets_per_s\": {rate:.0}, \"bytes\": {bytes}}}"
        ));
    }
    print!("{md}");
    if let Some(d) = out {
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("capture-rate.md"), &md).unwrap();
        let j = format!("{{\"frames\": {frames}, \"rows\": [{}]}}\n", json.join(", "));
        std::fs::write(d.join("capture-rate.json"), j).unwrap();
    }
}
