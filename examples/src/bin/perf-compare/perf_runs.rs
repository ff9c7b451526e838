//! The sim's figures come from the `perf` tool, run as a separate process (two, with its
//! loopback server), as a user would run it: [`perf`] runs it with `--json` and parses
//! its rows.
//!
//! Each row measures the sim over the path its baseline runs on: the rows against
//! loopback TCP over TCP ([`perf1`] sets `RDMA_SIM_TRANSPORT=tcp`), the rows against
//! shared-memory transports over the same-host path ([`perf1_same_host_in`] sets `auto`),
//! whatever the environment says; the curves ([`perf`]) take the environment's. The rows
//! run the fast path's default (`RDMA_SIM_ONESIDED` unset) unless a row asks for a mode.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{anyhow, bail, Context as _};
use examples::Res;

/// The figures perf-compare reads from one `perf --json` row.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct PerfRow {
    /// Message size.
    pub size: u64,
    /// Median time per message.
    #[serde(default)]
    pub t_typical_us: f64,
    /// Its 99th percentile.
    #[serde(default)]
    pub t_p99_us: f64,
    /// The largest.
    #[serde(default)]
    pub t_max_us: f64,
    /// Average bandwidth.
    #[serde(default)]
    #[serde(rename = "bw_avg_MBps")]
    pub bw_avg_mbps: f64,
    /// Message rate.
    #[serde(default)]
    #[serde(rename = "msg_rate_Mpps")]
    pub msg_rate_mpps: f64,
    /// A SEND bandwidth row over UC or UD: messages sent and never received (its rates
    /// are the receiver's).
    #[serde(default)]
    pub dropped: Option<u64>,
}

/// The `perf` binary next to this one.
fn perf_exe() -> Res<PathBuf> {
    let p = std::env::current_exe()?.with_file_name("perf");
    if !p.exists() {
        bail!(
            "{} not found: build it with `cargo build --release -p examples`",
            p.display()
        );
    }
    Ok(p)
}

/// Runs `perf ARGS --json` and returns its rows, over the path the environment names.
pub fn perf(args: &[String]) -> Res<Vec<PerfRow>> {
    perf_over(None, args)
}

/// The path a row's `perf` runs over: `RDMA_SIM_TRANSPORT`, and `RDMA_SIM_ONESIDED`
/// (`None`: unset, the default).
#[derive(Clone, Copy)]
struct Path<'a> {
    transport: &'a str,
    onesided: Option<&'a str>,
}

/// Runs `perf ARGS --json` over `path` (unless `None`: the environment's).
fn perf_over(path: Option<Path<'_>>, args: &[String]) -> Res<Vec<PerfRow>> {
    let mut cmd = Command::new(perf_exe()?);
    if let Some(p) = path {
        cmd.env("RDMA_SIM_TRANSPORT", p.transport);
        match p.onesided {
            Some(v) => cmd.env("RDMA_SIM_ONESIDED", v),
            None => cmd.env_remove("RDMA_SIM_ONESIDED"),
        };
    }
    let out = cmd.args(args).arg("--json").output().context("running perf")?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(10).collect();
        bail!(
            "perf {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(|l| serde_json::from_str(l).map_err(|e| anyhow!("perf output {l:?}: {e}")))
        .collect()
}

/// Runs `perf ARGS --json` over loopback TCP for one row (the rows whose baseline is TCP).
pub fn perf1(args: &[&str]) -> Res<PerfRow> {
    perf1_over(
        Path {
            transport: "tcp",
            onesided: None,
        },
        args,
    )
}

/// Runs `perf ARGS --json` over the same-host path for one row (the rows whose baseline
/// is a shared-memory transport), with `RDMA_SIM_ONESIDED` set to `onesided` (`None`:
/// unset, the default path).
pub fn perf1_same_host_in(onesided: Option<&str>, args: &[&str]) -> Res<PerfRow> {
    perf1_over(
        Path {
            transport: "auto",
            onesided,
        },
        args,
    )
}

fn perf1_over(path: Path<'_>, args: &[&str]) -> Res<PerfRow> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    perf_over(Some(path), &args)?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("perf printed no result"))
}
