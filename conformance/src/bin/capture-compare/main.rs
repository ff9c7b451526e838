//! `capture-compare SIM_DIR RXE_DIR`: the conformance cases' captures on the sim
//! (`conformance --pcap SIM_DIR`, `<case>.pcapng`) and on a RoCE device
//! (`conformance --backend ibverbs --pcap RXE_DIR`, tcpdump's `<case>.pcap`) side by
//! side, case by case: the opcode sequence, PSN steps, segmentation (payload lengths),
//! AETH syndromes and MSN steps, RETH lengths, atomic operands and original values
//! ([`seq`]), aligned so that a packet one side sends and the other does not shows as
//! one line ([`align`]). Every packet whose bytes were kept whole has its ICRC recomputed
//! as rxe computes it (`rxe_icrc.c`, the sim's own function), and every packet's UDP
//! source port is held to the one rxe derives from its QP numbers.
//!
//! Prints Markdown (a summary table, then each case's lines, the first `--max-lines`
//! (200) of each; a line marked `!` differs); `--out FILE` writes it there instead;
//! `--label` names the device's column (rxe0). Exits 1 when a packet's ICRC or source port is
//! not rxe's, or a capture cannot be read; differences in the sequences are what the
//! output is for, and do not fail it. Datagrams to or from QP1 (the CM's MADs, which
//! rdma_cm sends on a RoCE device and the sim's connection manager does not) are set
//! aside: counted beside the packets (`+N CM MADs`), not compared.

mod align;
mod seq;
mod verdict;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use align::{align, fold, Line, Run};
use seq::Seq;

/// The width of the sim's column.
const COL: usize = 58;

fn usage() -> ExitCode {
    eprintln!("usage: capture-compare SIM_DIR RXE_DIR [--out FILE] [--label NAME] [--max-lines N]");
    ExitCode::from(2)
}

/// The case ids with a capture in `dir` with extension `ext`.
fn cases(dir: &Path, ext: &str) -> Result<BTreeSet<String>, String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(rd
        .filter_map(Result::ok)
        .filter_map(|e| {
            let p = e.path();
            (p.extension()? == ext).then(|| p.file_stem()?.to_str().map(str::to_string))?
        })
        .collect())
}

fn load(path: &Path) -> Result<Seq, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    seq::read(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// A block's lines: the count on the first (`3x`), the rows of a block of more than one
/// bracketed.
fn block_lines(r: Option<&Run>) -> Vec<String> {
    let Some((rows, n)) = r else {
        return Vec::new();
    };
    let count = if *n == 1 { String::new() } else { format!("{n}x ") };
    if rows.len() == 1 {
        return vec![format!("{count}{}", rows[0])];
    }
    let pad = " ".repeat(count.len());
    rows.iter()
        .enumerate()
        .map(|(k, row)| {
            let bracket = match k {
                0 => "[ ",
                k if k + 1 == rows.len() => "] ",
                _ => "| ",
            };
            format!("{}{bracket}{row}", if k == 0 { &count } else { &pad })
        })
        .collect()
}

/// A case's lines, conversation by conversation (the first `max` of them, then how
/// many more), and how many differ.
fn case_lines(a: &Seq, b: &Seq, max: usize) -> (String, usize) {
    let mut s = String::new();
    let mut differ = 0;
    let mut shown = 0;
    let none = Vec::new();
    for c in 0..a.convs.len().max(b.convs.len()) {
        if a.convs.len().max(b.convs.len()) > 1 {
            let _ = writeln!(s, "  -- QP pair {} --", c + 1);
        }
        let (fa, fb) = (
            fold(a.convs.get(c).unwrap_or(&none)),
            fold(b.convs.get(c).unwrap_or(&none)),
        );
        for l in &align(&fa, &fb) {
            let (left, right) = match l {
                Line::Same(r) => (block_lines(Some(r)), block_lines(Some(r))),
                Line::Count(x, y) => (block_lines(Some(x)), block_lines(Some(y))),
                Line::Differ(x, y) => (block_lines(*x), block_lines(*y)),
            };
            let mark = if l.differs() {
                differ += 1;
                '!'
            } else {
                ' '
            };
            for k in 0..left.len().max(right.len()) {
                shown += 1;
                if shown > max {
                    continue;
                }
                let (x, y) = (
                    left.get(k).map_or("", String::as_str),
                    right.get(k).map_or("", String::as_str),
                );
                let _ = writeln!(s, "{mark} {x:<COL$} | {y}");
            }
        }
    }
    if shown > max {
        let _ = writeln!(s, "  ... {} more lines", shown - max);
    }
    (s, differ)
}

/// A side's packet count, with the CM MADs set aside, if any.
fn packets(s: &Seq) -> String {
    match s.gsi {
        0 => s.packets.to_string(),
        n => format!("{} (+{n} CM MADs)", s.packets),
    }
}

fn icrc(s: &Seq) -> String {
    if s.icrc_checked == 0 {
        "-".into()
    } else if s.icrc_bad == 0 {
        format!("{} ok", s.icrc_checked)
    } else {
        format!("**{} of {} bad**", s.icrc_bad, s.icrc_checked)
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut dirs = Vec::new();
    let mut out: Option<PathBuf> = None;
    let mut label = "rxe0".to_string();
    let mut max_lines = 200;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => match args.next() {
                Some(f) => out = Some(f.into()),
                None => return usage(),
            },
            "--max-lines" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) => max_lines = n,
                None => return usage(),
            },
            "--label" => match args.next() {
                Some(l) => label = l,
                None => return usage(),
            },
            "-h" | "--help" => return usage(),
            _ => dirs.push(PathBuf::from(a)),
        }
    }
    let [sim_dir, rxe_dir] = &dirs[..] else {
        return usage();
    };
    let (sim_cases, rxe_cases) = match (cases(sim_dir, "pcapng"), cases(rxe_dir, "pcap")) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("capture-compare: {e}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    let mut summary = String::new();
    let mut detail = String::new();
    let _ = writeln!(
        summary,
        "| case | sim packets | {label} packets | lines that differ | verdict | {label} ICRC | source ports not rxe's (sim / {label}) |\n|---|---|---|---|---|---|---|"
    );
    for id in sim_cases.intersection(&rxe_cases) {
        let (a, b) = match (
            load(&sim_dir.join(format!("{id}.pcapng"))),
            load(&rxe_dir.join(format!("{id}.pcap"))),
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                let _ = writeln!(summary, "| {id} | | | cannot read: {e} | | | |");
                failed = true;
                continue;
            }
        };
        let (lines, differ) = case_lines(&a, &b, max_lines);
        let (sport_a, sport_b) = (a.sport_bad(&b), b.sport_bad(&a));
        failed |= b.icrc_bad > 0 || a.icrc_bad > 0 || sport_a > 0 || sport_b > 0;
        let _ = writeln!(
            summary,
            "| {id} | {} | {} | {} | {} | {} | {} / {} |",
            packets(&a),
            packets(&b),
            if differ == 0 {
                "none".to_string()
            } else {
                differ.to_string()
            },
            verdict::verdict(&a, &b).name(),
            icrc(&b),
            sport_a,
            sport_b
        );
        let _ = writeln!(
            detail,
            "\n### {id}\n\n```text\n  {:<COL$} | {label}\n{lines}```",
            "sim"
        );
    }
    for id in sim_cases.symmetric_difference(&rxe_cases) {
        let side = if sim_cases.contains(id) {
            "sim"
        } else {
            label.as_str()
        };
        let _ = writeln!(summary, "| {id} | | | captured on {side} only | | | |");
    }
    let text = format!("{summary}{detail}");
    match out {
        Some(f) => {
            if let Err(e) = std::fs::write(&f, text) {
                eprintln!("capture-compare: {}: {e}", f.display());
                return ExitCode::from(2);
            }
        }
        None => print!("{text}"),
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
