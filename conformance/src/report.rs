//! Reports: a text table for people, JSON for scripts, and a side-by-side comparison of
//! two JSON reports (for example the sim and a real device) that says where they do not
//! agree ([`check`]).
//!
//! A JSON report is an object: the backend, the device, the device's capabilities as
//! queried by the run ([`DeviceCaps`]) and one row per case ([`JsonRow`]). A pass
//! granted through a documented deviation has `detail` "deviation: ..."; a skip names in
//! `lacks` the capability the device lacks ([`Lack`]), which the recorded capabilities
//! must confirm. Reports of earlier versions, a bare array of rows, still load (without
//! capabilities).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use verbs_api::{AtomicCap, Capabilities, DeviceAttr};

use crate::CaseReport;

/// A device capability whose absence lets a case skip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lack {
    /// The device reports `IBV_ATOMIC_NONE` (`atomic_cap`).
    Atomics,
    /// `max_qp_init_rd_atom` is 255 or more, so no `u8` `max_rd_atomic` exceeds it.
    RdAtomLimitBelowU8,
    /// No shared receive queues (`max_srq` is 0).
    Srq,
    /// SRQs cannot be resized (no `IBV_DEVICE_SRQ_RESIZE`).
    SrqResize,
    /// No UD QPs.
    Ud,
    /// No UC QPs.
    Uc,
    /// No memory windows of type 1 and type 2 (`IBV_DEVICE_MEM_WINDOW` and a
    /// `IBV_DEVICE_MEM_WINDOW_TYPE_2*`).
    Mw,
    /// The runner cannot take the device's port down and up (on a real device that
    /// takes root: `ip link set dev NETDEV down`); not a capability of the device.
    PortControl,
}

impl Lack {
    /// Why a device with `caps` lacks this, or `None` when it has it. For the lacks a
    /// case declares up front ([`Case::requires`](crate::Case::requires)); the others
    /// need a device attribute a case checks itself.
    pub fn missing_in(self, caps: &Capabilities) -> Option<String> {
        match self {
            Lack::Srq if !caps.srq => {
                Some("the device has no shared receive queues (capabilities: srq false)".into())
            }
            Lack::SrqResize if !caps.srq_resize => Some(
                "the device cannot resize an SRQ (capabilities: srq_resize false, no IBV_DEVICE_SRQ_RESIZE)"
                    .into(),
            ),
            Lack::Ud if !caps.ud => Some("the device has no UD QPs (capabilities: ud false)".into()),
            Lack::Uc if !caps.uc => Some("the device has no UC QPs (capabilities: uc false)".into()),
            Lack::Mw if !(caps.mw_type1 && caps.mw_type2) => Some(
                "the device lacks type 1 or type 2 memory windows (capabilities: mw_type1, mw_type2)".into(),
            ),
            Lack::Atomics if caps.atomic_cap == AtomicCap::None => {
                Some("the device reports IBV_ATOMIC_NONE".into())
            }
            _ => None,
        }
    }

    /// Whether `caps` confirm that the device lacks this; if not, why not.
    pub fn explained_by(self, caps: &DeviceCaps) -> Result<(), String> {
        let has = |what: &str| Err(format!("its capabilities say {what} true"));
        match self {
            Lack::Srq if !caps.srq => Ok(()),
            Lack::Srq => has("srq"),
            Lack::SrqResize if !caps.srq || !caps.srq_resize => Ok(()),
            Lack::SrqResize => has("srq_resize"),
            Lack::Ud if !caps.ud => Ok(()),
            Lack::Ud => has("ud"),
            Lack::Uc if !caps.uc => Ok(()),
            Lack::Uc => has("uc"),
            Lack::Mw if !caps.mw => Ok(()),
            Lack::Mw => has("mw"),
            Lack::Atomics if caps.atomic_cap == "none" => Ok(()),
            Lack::Atomics => Err(format!("its atomic_cap is {:?}, not \"none\"", caps.atomic_cap)),
            // The runner's privileges, which no capability records: the skip's reason
            // says which command failed.
            Lack::PortControl => Ok(()),
            Lack::RdAtomLimitBelowU8 if caps.max_qp_init_rd_atom >= 255 => Ok(()),
            Lack::RdAtomLimitBelowU8 => Err(format!(
                "its max_qp_init_rd_atom is {}, which a u8 does exceed",
                caps.max_qp_init_rd_atom
            )),
        }
    }
}

/// The device's capabilities as the run found them (`ibv_query_device` and the
/// verbs-api [`Capabilities`]): what a skip must be explained by.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceCaps {
    /// `atomic_cap`: "none", "hca" or "glob".
    pub atomic_cap: String,
    /// Outstanding READ/atomic requests a QP may issue.
    pub max_qp_init_rd_atom: u32,
    /// Outstanding READ/atomic requests a QP may receive.
    pub max_qp_rd_atom: u32,
    /// SEND_WITH_IMM and RDMA_WRITE_WITH_IMM are supported.
    pub imm_data: bool,
    /// Shared receive queues are supported.
    pub srq: bool,
    /// SRQs can be resized (absent in reports of earlier versions: false).
    #[serde(default)]
    pub srq_resize: bool,
    /// UD QPs are supported.
    pub ud: bool,
    /// UC QPs are supported (absent in reports of earlier versions: false).
    #[serde(default)]
    pub uc: bool,
    /// Memory windows of type 1 and 2 (absent in reports of earlier versions: false).
    #[serde(default)]
    pub mw: bool,
    /// Largest `max_inline_data`.
    pub max_inline_data: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// WRs per queue.
    pub max_qp_wr: u32,
    /// CQ entries.
    pub max_cqe: u32,
}

impl DeviceCaps {
    /// From what the device reports.
    pub fn new(attr: &DeviceAttr, caps: &Capabilities) -> Self {
        DeviceCaps {
            atomic_cap: match attr.atomic_cap {
                AtomicCap::None => "none",
                AtomicCap::Hca => "hca",
                AtomicCap::Glob => "glob",
            }
            .into(),
            max_qp_init_rd_atom: attr.max_qp_init_rd_atom,
            max_qp_rd_atom: attr.max_qp_rd_atom,
            imm_data: caps.imm_data,
            srq: caps.srq,
            srq_resize: caps.srq_resize,
            ud: caps.ud,
            uc: caps.uc,
            mw: caps.mw_type1 && caps.mw_type2,
            max_inline_data: caps.max_inline_data,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_qp_wr: caps.max_qp_wr,
            max_cqe: caps.max_cqe,
        }
    }
}

/// A JSON report.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// Backend that ran the cases.
    pub backend: String,
    /// Device that ran them.
    pub device: String,
    /// The device's capabilities (absent in reports of earlier versions).
    #[serde(default)]
    pub capabilities: Option<DeviceCaps>,
    /// The profile the cases expected of the device (and the sim played): `portable`,
    /// `rxe` or `mlx5` (absent in reports of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// One row per case.
    pub cases: Vec<JsonRow>,
}

impl Report {
    /// Parses a report, or a bare array of rows as earlier versions wrote.
    pub fn parse(text: &str) -> Result<Report, String> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Any {
            Report(Report),
            Rows(Vec<JsonRow>),
        }
        match serde_json::from_str::<Any>(text).map_err(|e| e.to_string())? {
            Any::Report(r) => Ok(r),
            Any::Rows(cases) => Ok(Report {
                backend: cases.first().map(|r| r.backend.clone()).unwrap_or_default(),
                device: cases.first().map(|r| r.device.clone()).unwrap_or_default(),
                capabilities: None,
                profile: None,
                cases,
            }),
        }
    }

    /// `backend:device (profile)`, or `fallback` when the report names neither.
    pub fn label(&self, fallback: &str) -> String {
        if self.backend.is_empty() && self.device.is_empty() {
            fallback.to_string()
        } else if let Some(p) = &self.profile {
            format!("{}:{} ({p})", self.backend, self.device)
        } else {
            format!("{}:{}", self.backend, self.device)
        }
    }
}

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
    /// For a skip: the capability the device lacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lacks: Option<Lack>,
    /// What the device did where the case observed it (a status, an errno, an event),
    /// by what was observed: `--compare` holds two reports to the same values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub observed: BTreeMap<String, String>,
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
            lacks: r.lacks,
            observed: r.observed.iter().cloned().collect(),
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
pub fn compare(ra: &Report, rb: &Report) -> String {
    let (a, b) = (&ra.cases[..], &rb.cases[..]);
    let (la, lb) = (ra.label("A"), rb.label("B"));
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

/// Any number of reports side by side (for example the sim under `portable`, the sim
/// under `rxe`, and rxe0): one column per report with each case's result, then, for each
/// case whose reports observed different values, one line per observation with every
/// report's value (`-`: not observed). A view, not a check: [`check`] compares two.
pub fn side_by_side(reports: &[Report]) -> String {
    let labels: Vec<String> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| r.label(&format!("#{}", i + 1)))
        .collect();
    let maps: Vec<BTreeMap<&str, &JsonRow>> = reports
        .iter()
        .map(|r| r.cases.iter().map(|c| (c.id.as_str(), c)).collect())
        .collect();
    let mut ids: Vec<&str> = Vec::new();
    for r in reports {
        for c in &r.cases {
            if !ids.contains(&c.id.as_str()) {
                ids.push(&c.id);
            }
        }
    }
    let idw = ids.iter().map(|i| i.len()).max().unwrap_or(4).max(4);
    let colw: Vec<usize> = labels.iter().map(|l| l.len().max(18)).collect();
    let mut s = String::new();
    let _ = write!(s, "| {:<idw$} |", "case");
    for (l, w) in labels.iter().zip(&colw) {
        let _ = write!(s, " {l:<w$} |");
    }
    let _ = write!(s, "\n|{}|", "-".repeat(idw + 2));
    for w in &colw {
        let _ = write!(s, "{}|", "-".repeat(w + 2));
    }
    s.push('\n');
    let mut differing = Vec::new();
    for id in &ids {
        let _ = write!(s, "| {id:<idw$} |");
        for (m, w) in maps.iter().zip(&colw) {
            let cell = m
                .get(id)
                .map_or_else(|| "-".to_string(), |c| result_cell(&c.status, &c.detail));
            let _ = write!(s, " {cell:<w$} |");
        }
        s.push('\n');
        let keys: BTreeSet<&String> = maps
            .iter()
            .filter_map(|m| m.get(id))
            .flat_map(|c| c.observed.keys())
            .collect();
        for k in keys {
            let values: Vec<&str> = maps
                .iter()
                .map(|m| {
                    m.get(id)
                        .and_then(|c| c.observed.get(k))
                        .map_or("-", |v| v.as_str())
                })
                .collect();
            if values.iter().any(|v| *v != values[0]) {
                differing.push(format!("- {id}: {k}: {}", values.join(" | ")));
            }
        }
    }
    if !differing.is_empty() {
        let _ = writeln!(s, "\nobserved values that differ ({}):", labels.join(" | "));
        s.push_str(&differing.join("\n"));
        s.push('\n');
    }
    s
}

/// How [`check_with`] treats a case one device skips and the other runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OneSided {
    /// A disagreement: the case was not compared.
    Fail,
    /// A gap, listed apart, when the skip names a capability that the skipping device's
    /// recorded capabilities confirm it lacks (a backend that does not implement a
    /// feature yet); any other one-sided skip is still a disagreement.
    Gap,
}

/// Where two reports do not agree, one line per case (empty: they agree). A case must be
/// in both reports and pass on both, a pass with a recorded deviation counting as a pass;
/// a case skipped on one side only was not compared; a skip must name the capability the
/// device lacks, and that device's recorded capabilities must confirm it.
pub fn check(ra: &Report, rb: &Report) -> Vec<String> {
    check_with(ra, rb, OneSided::Fail).0
}

/// [`check`], with one-sided skips treated as `one_sided` says: the disagreements, and
/// the gaps (one line per case) that [`OneSided::Gap`] set apart.
pub fn check_with(ra: &Report, rb: &Report, one_sided: OneSided) -> (Vec<String>, Vec<String>) {
    let mut gaps = Vec::new();
    let sides = [(ra, ra.label("A")), (rb, rb.label("B"))];
    let mut problems = Vec::new();
    for (r, label) in &sides {
        let mut seen = BTreeSet::new();
        for row in &r.cases {
            if !seen.insert(row.id.as_str()) {
                problems.push(format!(
                    "{}: listed more than once in the report of {label}",
                    row.id
                ));
            }
        }
    }
    let maps: Vec<BTreeMap<&str, &JsonRow>> = sides
        .iter()
        .map(|(r, _)| r.cases.iter().map(|row| (row.id.as_str(), row)).collect())
        .collect();
    let mut ids: Vec<&str> = Vec::new();
    for (r, _) in &sides {
        for row in &r.cases {
            if !ids.contains(&row.id.as_str()) {
                ids.push(&row.id);
            }
        }
    }
    for id in ids {
        let rows = [maps[0].get(id).copied(), maps[1].get(id).copied()];
        let mut why: Vec<String> = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            let (report, label) = &sides[i];
            let Some(row) = row else {
                why.push(format!("missing from the report of {label}"));
                continue;
            };
            match row.status.as_str() {
                "pass" => {}
                "fail" => why.push(format!("fails on {label}: {}", row.detail)),
                "skip" => match (row.lacks, &report.capabilities) {
                    (None, _) => why.push(format!(
                        "skipped on {label} without naming a capability the device lacks ({})",
                        row.detail
                    )),
                    (Some(lack), None) => why.push(format!(
                        "skipped on {label} for lack of {lack:?} ({}), but its report records no capabilities to confirm it",
                        row.detail
                    )),
                    (Some(lack), Some(caps)) => {
                        if let Err(e) = lack.explained_by(caps) {
                            why.push(format!(
                                "skipped on {label} for lack of {lack:?} ({}), which its capabilities do not explain: {e}",
                                row.detail
                            ));
                        }
                    }
                },
                other => why.push(format!("unknown status {other:?} on {label}")),
            }
        }
        if let [Some(x), Some(y)] = rows {
            if (x.status == "skip") != (y.status == "skip") {
                let (skipped, ran) = if x.status == "skip" { (0, 1) } else { (1, 0) };
                let detail = rows[skipped].map_or("", |r| r.detail.as_str());
                // A gap only if the skip itself was in order (nothing above objected).
                if one_sided == OneSided::Gap && why.is_empty() {
                    gaps.push(format!(
                        "{id}: skipped on {} ({detail}), run on {}",
                        sides[skipped].1, sides[ran].1
                    ));
                } else {
                    why.push(format!(
                        "skipped on {} only ({detail}) but run on {}: the two were not compared",
                        sides[skipped].1, sides[ran].1
                    ));
                }
            }
        }
        if let [Some(x), Some(y)] = rows {
            why.extend(observed_differences(x, y, &sides[0].1, &sides[1].1));
        }
        if !why.is_empty() {
            problems.push(format!("{id}: {}", why.join("; ")));
        }
    }
    (problems, gaps)
}

/// Where two runs of one case observed different things (`la`, `lb` name the reports):
/// a value that differs, or one observed on one side only. Rows without observations
/// (a report from before they were recorded, a case that records none) are not compared.
fn observed_differences(x: &JsonRow, y: &JsonRow, la: &str, lb: &str) -> Vec<String> {
    if x.observed.is_empty() || y.observed.is_empty() {
        return Vec::new();
    }
    let mut why = Vec::new();
    let keys: BTreeSet<&String> = x.observed.keys().chain(y.observed.keys()).collect();
    for k in keys {
        match (x.observed.get(k), y.observed.get(k)) {
            (Some(a), Some(b)) if a != b => why.push(format!("observed {k}: {a} on {la}, {b} on {lb}")),
            (Some(a), None) => why.push(format!("observed {k}: {a} on {la}, nothing on {lb}")),
            (None, Some(b)) => why.push(format!("observed {k}: nothing on {la}, {b} on {lb}")),
            _ => {}
        }
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, status: &str, detail: &str, lacks: Option<Lack>) -> JsonRow {
        JsonRow {
            id: id.into(),
            group: id.split('.').next().unwrap().into(),
            name: String::new(),
            source: String::new(),
            status: status.into(),
            detail: detail.into(),
            time_ms: 1.0,
            backend: String::new(),
            device: String::new(),
            lacks,
            observed: BTreeMap::new(),
        }
    }

    fn caps(atomic_cap: &str, rd_atom: u32) -> DeviceCaps {
        DeviceCaps {
            atomic_cap: atomic_cap.into(),
            max_qp_init_rd_atom: rd_atom,
            ..DeviceCaps::default()
        }
    }

    fn report(device: &str, caps: Option<DeviceCaps>, cases: Vec<JsonRow>) -> Report {
        Report {
            backend: if device.starts_with("sim") {
                "sim"
            } else {
                "ibverbs"
            }
            .into(),
            device: device.into(),
            capabilities: caps,
            profile: None,
            cases,
        }
    }

    fn pass(id: &str) -> JsonRow {
        row(id, "pass", "", None)
    }

    const NO_ATOMICS: &str = "the device reports IBV_ATOMIC_NONE";

    /// The sim and rxe0 as CI runs them: every case passes, some on rxe0 only through a
    /// documented deviation; a skip on both sides that both devices' capabilities explain.
    #[test]
    fn reports_that_agree_up_to_recorded_deviations_and_explained_skips_compare_clean() {
        let a = report(
            "sim0",
            Some(caps("none", 255)),
            vec![
                pass("send.basic"),
                pass("errors.bad-lkey"),
                row("atomic.fetch-add", "skip", NO_ATOMICS, Some(Lack::Atomics)),
                row(
                    "qp.rd-atomic-limit",
                    "skip",
                    "max 255",
                    Some(Lack::RdAtomLimitBelowU8),
                ),
            ],
        );
        let b = report(
            "rxe0",
            Some(caps("none", 300)),
            vec![
                pass("send.basic"),
                row(
                    "errors.bad-lkey",
                    "pass",
                    "deviation: rxe's copy_data() returns -EINVAL",
                    None,
                ),
                row("atomic.fetch-add", "skip", NO_ATOMICS, Some(Lack::Atomics)),
                row(
                    "qp.rd-atomic-limit",
                    "skip",
                    "max 300",
                    Some(Lack::RdAtomLimitBelowU8),
                ),
            ],
        );
        assert_eq!(check(&a, &b), Vec::<String>::new());
    }

    #[test]
    fn a_case_that_fails_on_one_side_is_a_disagreement() {
        let a = report(
            "sim0",
            Some(caps("hca", 16)),
            vec![pass("send.basic"), pass("rnr.exhausted")],
        );
        let b = report(
            "rxe0",
            Some(caps("hca", 16)),
            vec![
                pass("send.basic"),
                row(
                    "rnr.exhausted",
                    "fail",
                    "expected RNR_RETRY_EXC_ERR, got SUCCESS",
                    None,
                ),
            ],
        );
        assert_eq!(
            check(&a, &b),
            ["rnr.exhausted: fails on ibverbs:rxe0: expected RNR_RETRY_EXC_ERR, got SUCCESS"]
        );
    }

    #[test]
    fn a_case_missing_from_either_report_is_named() {
        let a = report(
            "sim0",
            Some(caps("hca", 16)),
            vec![pass("send.basic"), pass("only.a")],
        );
        let b = report(
            "rxe0",
            Some(caps("hca", 16)),
            vec![pass("send.basic"), pass("only.b")],
        );
        assert_eq!(
            check(&a, &b),
            [
                "only.a: missing from the report of ibverbs:rxe0",
                "only.b: missing from the report of sim:sim0"
            ]
        );
    }

    #[test]
    fn a_case_skipped_on_one_side_only_was_not_compared() {
        let a = report("sim0", Some(caps("hca", 16)), vec![pass("atomic.fetch-add")]);
        let b = report(
            "siw0",
            Some(caps("none", 16)),
            vec![row("atomic.fetch-add", "skip", NO_ATOMICS, Some(Lack::Atomics))],
        );
        let p = check(&a, &b);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("atomic.fetch-add: skipped on ibverbs:siw0 only")
                && p[0].contains("not compared"),
            "{p:?}"
        );
    }

    /// With gaps allowed, a one-sided skip that the skipping device's capabilities
    /// explain is a gap, not a disagreement; one they do not explain still is.
    #[test]
    fn gaps_allowed_set_explained_one_sided_skips_apart() {
        let a = report(
            "sim0",
            Some(caps("none", 16)),
            vec![row("atomic.fetch-add", "skip", NO_ATOMICS, Some(Lack::Atomics))],
        );
        let b = report(
            "rxe0",
            Some(caps("hca", 16)),
            vec![row("atomic.fetch-add", "pass", "", None)],
        );
        let (p, g) = check_with(&a, &b, OneSided::Gap);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(g.len(), 1);
        assert!(g[0].starts_with("atomic.fetch-add: skipped on sim:sim0"), "{g:?}");
        assert_eq!(
            check_with(&a, &b, OneSided::Fail).0.len(),
            1,
            "strict: a disagreement"
        );
        let unexplained = report(
            "sim0",
            Some(caps("hca", 16)),
            vec![row("atomic.fetch-add", "skip", NO_ATOMICS, Some(Lack::Atomics))],
        );
        let (p, g) = check_with(&unexplained, &b, OneSided::Gap);
        assert_eq!((p.len(), g.len()), (1, 0), "{p:?}");
    }

    #[test]
    fn a_skip_the_capabilities_do_not_explain_is_named() {
        let skip = || row("atomic.fetch-add", "skip", NO_ATOMICS, Some(Lack::Atomics));
        let a = report("sim0", Some(caps("none", 16)), vec![skip()]);
        let b = report("rxe0", Some(caps("hca", 16)), vec![skip()]);
        let p = check(&a, &b);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("skipped on ibverbs:rxe0 for lack of Atomics")
                && p[0].contains("its atomic_cap is \"hca\""),
            "{p:?}"
        );
        let skip = || {
            row(
                "qp.rd-atomic-limit",
                "skip",
                "max",
                Some(Lack::RdAtomLimitBelowU8),
            )
        };
        let a = report("sim0", Some(caps("hca", 255)), vec![skip()]);
        let b = report("rxe0", Some(caps("hca", 128)), vec![skip()]);
        let p = check(&a, &b);
        assert!(
            p.len() == 1 && p[0].contains("max_qp_init_rd_atom is 128"),
            "{p:?}"
        );
    }

    #[test]
    fn a_skip_without_a_named_capability_or_without_recorded_capabilities_is_named() {
        let a = report(
            "sim0",
            Some(caps("none", 16)),
            vec![row("atomic.cas", "skip", "no reason", None)],
        );
        let b = report(
            "rxe0",
            None,
            vec![row("atomic.cas", "skip", NO_ATOMICS, Some(Lack::Atomics))],
        );
        let p = check(&a, &b);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("skipped on sim:sim0 without naming a capability"),
            "{p:?}"
        );
        assert!(
            p[0].contains("ibverbs:rxe0 for lack of Atomics") && p[0].contains("records no capabilities"),
            "{p:?}"
        );
    }

    #[test]
    fn reports_round_trip_and_the_earlier_bare_array_still_loads() {
        let r = report(
            "sim0",
            Some(caps("hca", 16)),
            vec![
                pass("send.basic"),
                row("atomic.cas", "skip", NO_ATOMICS, Some(Lack::Atomics)),
            ],
        );
        let text = serde_json::to_string_pretty(&r).unwrap();
        assert!(text.contains("\"lacks\": \"atomics\""), "{text}");
        assert_eq!(Report::parse(&text).unwrap(), r);
        let old = r#"[{"id":"send.basic","group":"send","name":"n","status":"pass","detail":"","backend":"sim","device":"sim0"}]"#;
        let o = Report::parse(old).unwrap();
        assert_eq!(
            (o.label("A"), o.capabilities, o.cases.len()),
            ("sim:sim0".to_string(), None, 1)
        );
    }

    #[test]
    fn transport_lacks_are_explained_by_the_capabilities_and_missing_in_them() {
        let none = DeviceCaps::default();
        let all = DeviceCaps {
            srq: true,
            srq_resize: true,
            ud: true,
            uc: true,
            mw: true,
            ..DeviceCaps::default()
        };
        for lack in [Lack::Srq, Lack::SrqResize, Lack::Ud, Lack::Uc, Lack::Mw] {
            assert_eq!(lack.explained_by(&none), Ok(()), "{lack:?}");
            assert!(lack.explained_by(&all).is_err(), "{lack:?}");
        }
        // An SRQ-less device cannot resize one either.
        let no_srq = DeviceCaps {
            srq: false,
            ..all.clone()
        };
        assert_eq!(Lack::SrqResize.explained_by(&no_srq), Ok(()));
        let mut c = Capabilities::default();
        assert!(Lack::Ud.missing_in(&c).unwrap().contains("ud false"));
        c.srq = true;
        c.ud = true;
        c.uc = true;
        assert_eq!(Lack::Srq.missing_in(&c), None);
        assert_eq!(Lack::Ud.missing_in(&c), None);
        assert_eq!(Lack::Uc.missing_in(&c), None);
        assert!(Lack::SrqResize.missing_in(&c).is_some());
        assert!(Lack::Mw.missing_in(&c).is_some());
        c.mw_type1 = true;
        c.mw_type2 = true;
        assert_eq!(Lack::Mw.missing_in(&c), None);
        // Reports without the newer fields still load, as lacking them.
        let old = r#"{"backend":"sim","device":"sim0","capabilities":{"atomic_cap":"hca","max_qp_init_rd_atom":16,"max_qp_rd_atom":16,"imm_data":true,"srq":false,"ud":false,"max_inline_data":0,"max_send_sge":4,"max_recv_sge":4,"max_qp_wr":1,"max_cqe":1},"cases":[]}"#;
        let r = Report::parse(old).unwrap();
        let caps = r.capabilities.unwrap();
        assert!(!caps.uc && !caps.srq_resize && !caps.mw);
    }

    /// Two reports whose cases pass on both but observed a different status in one
    /// case do not agree, naming the case, the observation and both values; observations
    /// on one side only disagree too; rows without observations are not compared.
    #[test]
    fn an_observed_status_that_differs_is_a_disagreement() {
        let obs = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let with = |id: &str, o: BTreeMap<String, String>| JsonRow {
            observed: o,
            ..row(id, "pass", "", None)
        };
        let a = report(
            "sim0",
            None,
            vec![
                with(
                    "errors.recv_too_small",
                    obs(&[("responder", "LocLenErr"), ("requester", "RemInvReqErr")]),
                ),
                with("errors.bad_lkey", obs(&[("SEND with a bad lkey", "LocProtErr")])),
                with("rdma.write", BTreeMap::new()),
            ],
        );
        assert!(check(&a, &a).is_empty());
        let mut b = a.clone();
        b.device = "rxe0".into();
        b.backend = "ibverbs".into();
        b.cases[0]
            .observed
            .insert("responder".into(), "LocQpOpErr".into());
        b.cases[1].observed.insert("post".into(), "EINVAL".into());
        b.cases[2].observed.insert("whatever".into(), "x".into());
        let p = check(&a, &b);
        assert_eq!(
            p,
            [
                "errors.recv_too_small: observed responder: LocLenErr on sim:sim0, LocQpOpErr on ibverbs:rxe0",
                "errors.bad_lkey: observed post: nothing on sim:sim0, EINVAL on ibverbs:rxe0",
            ],
            "{p:#?}"
        );
    }

    /// Three reports side by side: a column each, and the observations that differ with
    /// every report's value.
    #[test]
    fn three_reports_side_by_side_show_each_result_and_the_differing_observations() {
        let with = |id: &str, status: &str, detail: &str, o: &[(&str, &str)]| JsonRow {
            observed: o.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..row(id, status, detail, None)
        };
        let mut portable = report(
            "sim0",
            None,
            vec![with(
                "errors.recv-too-small",
                "pass",
                "",
                &[("responder", "LocLenErr")],
            )],
        );
        portable.profile = Some("portable".into());
        let mut rxe = report(
            "sim0",
            None,
            vec![with(
                "errors.recv-too-small",
                "pass",
                "deviation: rxe",
                &[("responder", "LocQpOpErr")],
            )],
        );
        rxe.profile = Some("rxe".into());
        let rxe0 = report(
            "rxe0",
            None,
            vec![
                with(
                    "errors.recv-too-small",
                    "pass",
                    "deviation: rxe",
                    &[("responder", "LocQpOpErr")],
                ),
                row("rdma.write", "pass", "", None),
            ],
        );
        let t = side_by_side(&[portable, rxe, rxe0]);
        assert!(t.contains("| case "), "{t}");
        assert!(
            t.contains("sim:sim0 (portable)") && t.contains("sim:sim0 (rxe)") && t.contains("ibverbs:rxe0"),
            "{t}"
        );
        let line = t
            .lines()
            .find(|l| l.starts_with("| errors.recv-too-small"))
            .unwrap();
        assert_eq!(line.matches("pass (deviation)").count(), 2, "{t}");
        let line = t.lines().find(|l| l.starts_with("| rdma.write")).unwrap();
        assert_eq!(line.matches(" - ").count(), 2, "{t}");
        assert!(
            t.contains("- errors.recv-too-small: responder: LocLenErr | LocQpOpErr | LocQpOpErr"),
            "{t}"
        );
    }
}
