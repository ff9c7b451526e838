//! Reports: a text table for people, JSON for scripts, and a side-by-side comparison of
//! two JSON reports (for example the sim and a real device).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::CaseReport;

/// One row of a JSON report.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JsonRow {
    /// Case id.
    pub id: String,
    /// Group.
    pub group: String,
    /// What the case checks.
    pub name: String,
    /// Where the behaviour is specified.
    #[serde(default)]
    pub source: String,
    /// "pass", "fail" or "skip".
    pub status: String,
    /// Failure or skip reason, or the deviations a pass was granted.
    pub detail: String,
    /// Wall time in milliseconds.
    #[serde(default)]
    pub time_ms: f64,
    /// Backend that ran it.
    #[serde(default)]
    pub backend: String,
    /// Device that ran it.
    #[serde(default)]
    pub device: String,
}

/// JSON rows for a run.
pub fn json_rows(reports: &[CaseReport], backend: &str, device: &str) -> Vec<JsonRow> {
    reports
        .iter()
        .map(|r| JsonRow {
            id: r.id.into(),
            group: r.group.into(),
            name: r.name.into(),
            source: r.source.into(),
            status: r.status.into(),
            detail: r.detail.clone(),
            time_ms: (r.time.as_secs_f64() * 1e6).round() / 1e3,
            backend: backend.into(),
            device: device.into(),
        })
        .collect()
}

fn result_cell(status: &str, detail: &str) -> String {
    if status == "pass" && detail.starts_with("deviation") {
        "pass (deviation)".into()
    } else {
        status.into()
    }
}

/// The text table: id, group, name, result, time; then the details of every case that
/// failed, was skipped or passed with a deviation; then the totals.
pub fn table(rows: &[JsonRow]) -> String {
    let mut s = String::new();
    let idw = rows.iter().map(|r| r.id.len()).max().unwrap_or(2).max(2);
    let gw = rows.iter().map(|r| r.group.len()).max().unwrap_or(5).max(5);
    let nw = 64;
    let _ = writeln!(
        s,
        "{:<idw$}  {:<gw$}  {:<nw$}  {:<16}  {:>9}",
        "id", "group", "name", "result", "time"
    );
    let _ = writeln!(s, "{}", "-".repeat(idw + gw + nw + 16 + 9 + 8));
    for r in rows {
        let mut name: String = r.name.chars().take(nw).collect();
        if r.name.chars().count() > nw {
            name.pop();
            name.push('~');
        }
        let _ = writeln!(
            s,
            "{:<idw$}  {:<gw$}  {:<nw$}  {:<16}  {:>7.1}ms",
            r.id,
            r.group,
            name,
            result_cell(&r.status, &r.detail),
            r.time_ms
        );
    }
    let notes: Vec<&JsonRow> = rows.iter().filter(|r| !r.detail.is_empty()).collect();
    if !notes.is_empty() {
        let _ = writeln!(s);
        for r in notes {
            let _ = writeln!(s, "{} [{}]: {}", r.id, r.status, r.detail);
        }
    }
    let count = |st: &str| rows.iter().filter(|r| r.status == st).count();
    let dev = rows
        .iter()
        .filter(|r| r.status == "pass" && !r.detail.is_empty())
        .count();
    let _ = writeln!(
        s,
        "\n{} cases: {} passed ({} with a documented deviation), {} failed, {} skipped",
        rows.len(),
        count("pass"),
        dev,
        count("fail"),
        count("skip")
    );
    s
}

/// Two reports side by side, by case id, in the order of the first.
pub fn compare(a: &[JsonRow], b: &[JsonRow]) -> String {
    let label = |rows: &[JsonRow], fallback: &str| {
        rows.first()
            .map(|r| format!("{}:{}", r.backend, r.device))
            .unwrap_or_else(|| fallback.to_string())
    };
    let (la, lb) = (label(a, "A"), label(b, "B"));
    let bmap: BTreeMap<&str, &JsonRow> = b.iter().map(|r| (r.id.as_str(), r)).collect();
    let idw = a.iter().chain(b).map(|r| r.id.len()).max().unwrap_or(2).max(2);
    let mut s = String::new();
    let _ = writeln!(s, "| {:<idw$} | {:<18} | {:<18} |", "case", la, lb);
    let _ = writeln!(
        s,
        "|{}|{}|{}|",
        "-".repeat(idw + 2),
        "-".repeat(20),
        "-".repeat(20)
    );
    let mut seen = std::collections::BTreeSet::new();
    for r in a {
        seen.insert(r.id.as_str());
        let other = bmap
            .get(r.id.as_str())
            .map(|o| result_cell(&o.status, &o.detail))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            s,
            "| {:<idw$} | {:<18} | {:<18} |",
            r.id,
            result_cell(&r.status, &r.detail),
            other
        );
    }
    for r in b.iter().filter(|r| !seen.contains(r.id.as_str())) {
        let _ = writeln!(
            s,
            "| {:<idw$} | {:<18} | {:<18} |",
            r.id,
            "-",
            result_cell(&r.status, &r.detail)
        );
    }
    let notes: Vec<String> = a
        .iter()
        .map(|r| (&la, r))
        .chain(b.iter().map(|r| (&lb, r)))
        .filter(|(_, r)| !r.detail.is_empty())
        .map(|(l, r)| format!("- {} on {l}: {} ({})", r.id, r.detail, r.status))
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(s, "\n{}", notes.join("\n"));
    }
    s
}
