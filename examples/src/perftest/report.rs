//! What perf prints, as perftest does: the header ([`print_header`]) and a row per size
//! ([`Row`], [`print_row`]); with `--json` one JSON object per row instead. A SEND
//! bandwidth row over UC or UD is the receiver's count ([`Received`],
//! [`bw_row_received`]), with the messages dropped apart. The format
//! is perftest's, column for column, so that the figures sit beside `ib_write_bw`'s.

use std::io::Write as _;
use std::time::Duration;

use serde::Serialize;
use verbs_api::{Backend, Context, MemoryRegion, QueuePair};

use super::cycle_stats::{BwStats, LatStats};
use super::opts::{Connection, PerfCli, Test};
use super::params::Cfg;
use super::side::Side;
use crate::stats::Latencies;
use crate::Res;

/// One result row (also the `--json` object).
#[derive(Serialize, Debug, Clone)]
#[allow(non_snake_case)]
pub struct Row {
    /// The test.
    pub test: &'static str,
    /// The backend.
    pub backend: &'static str,
    /// The device.
    pub device: String,
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Smallest time per message (latency: half a round trip for the ping-pongs).
    pub t_min_us: f64,
    /// Largest.
    pub t_max_us: f64,
    /// Median (perftest's "typical").
    pub t_typical_us: f64,
    /// Mean.
    pub t_avg_us: f64,
    /// Standard deviation.
    pub t_stdev_us: f64,
    /// 99th percentile.
    pub t_p99_us: f64,
    /// 99.9th percentile.
    pub t_p999_us: f64,
    /// Best rate over any tenth of the run (latency tests: the mean's rate).
    pub bw_peak_MBps: f64,
    /// Bytes over the whole run.
    pub bw_avg_MBps: f64,
    /// Messages per microsecond.
    pub msg_rate_Mpps: f64,
    /// SEND bandwidth over UC or UD: messages the receiver took (the rates are its).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received: Option<u64>,
    /// The same: messages sent and never received.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
}

/// What the receiver of a SEND bandwidth row over UC or UD counted: the messages it took,
/// and the time from the first to the last of them.
#[derive(Serialize, serde::Deserialize, Debug, Clone, Copy, Default, PartialEq)]
pub struct Received {
    /// Receive completions.
    pub received: u64,
    /// Nanoseconds from the first to the last.
    pub span_ns: u64,
}

/// perftest's MB: 2^20 bytes.
pub const MB: f64 = 1048576.0;
/// The rule between the table's parts.
pub const LINE: &str =
    "---------------------------------------------------------------------------------------";

/// Prints perftest's header: the test, the device and its link, the queue depths, both
/// ends' addresses, and the table's column names.
pub fn print_header<B: Backend>(
    cli: &PerfCli,
    cfg: &Cfg,
    ctx: &B::Context,
    side: &Side<B>,
    remote: &verbs_api::Endpoint,
) -> Res<()> {
    let port = ctx.query_port(1)?;
    let caps = ctx.capabilities()?;
    let link = match caps.link_layer {
        verbs_api::LinkLayer::Ethernet => "Ethernet",
        _ => "IB",
    };
    let qa = side.rc.qp.query()?;
    println!("{LINE}");
    println!("{:^87}", cfg.test.title(cfg.atomic));
    println!(" Dual-port       : OFF\t\tDevice         : {}", ctx.name());
    println!(" Number of qps   : 1\t\tTransport type : IB");
    println!(
        " Connection type : {}\t\tUsing SRQ      : {}",
        cfg.connection.name(),
        if cfg.use_srq { "ON" } else { "OFF" }
    );
    println!(" Backend         : {}", cli.common.backend.as_str());
    if cfg.test.is_lat() {
        println!(" TX depth        : 1");
    } else {
        println!(" TX depth        : {}", cfg.tx_depth);
        println!(
            " CQ Moderation   : {}",
            cfg.cq_mod_for(cfg.rows.first().map_or(8, |r| r.0))
        );
    }
    match cfg.test {
        Test::SendLat => println!(" RX depth        : 16"),
        Test::SendBw => println!(" RX depth        : {}", cfg.rx_depth),
        _ => {}
    }
    // A UD QP has no path: its datagrams are at most the port's MTU.
    let mtu = if cfg.connection == Connection::Ud {
        port.active_mtu
    } else {
        qa.path_mtu
    };
    println!(" Mtu             : {}[B]", mtu.bytes());
    println!(" Link type       : {link}");
    if cfg.test.is_send() || matches!(cfg.test, Test::WriteLat | Test::WriteBw) {
        println!(" Max inline data : {}[B]", side.inline);
    }
    if cfg.perftest {
        println!(
            " Measured as     : perftest (busy polling, cycle counter at {:.2} MHz)",
            side.mhz
        );
    }
    println!(" rdma_cm QPs\t : OFF");
    println!(" Data ex. method : Ethernet");
    println!("{LINE}");
    println!(
        " local address: LID 0x{:04x} QPN 0x{:04x} PSN 0x{:06x} RKey 0x{:06x} VAddr 0x{:016x}",
        port.lid,
        side.rc.qp.qp_num(),
        qa.sq_psn,
        side.mr.rkey(),
        side.mr.addr()
    );
    println!(
        " remote address: LID 0x{:04x} QPN 0x{:04x} PSN 0x{:06x} RKey 0x{:06x} VAddr 0x{:016x}",
        remote.lid, remote.qpn, remote.psn, side.remote.rkey, side.remote.addr
    );
    println!("{LINE}");
    if cfg.test.is_lat() {
        println!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
        );
    } else {
        println!(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]");
    }
    Ok(())
}

impl Row {
    /// A row whose times are the summary of `lat` (the rates left 0).
    fn of<C: Context>(cli: &PerfCli, ctx: &C, size: u64, iters: u64, lat: &Latencies) -> Row {
        let s = lat.summary();
        Row {
            test: cli.test.name(),
            backend: cli.common.backend.as_str(),
            device: ctx.name().to_string(),
            size,
            iters,
            t_min_us: s.min_us,
            t_max_us: s.max_us,
            t_typical_us: s.p50_us,
            t_avg_us: s.avg_us,
            t_stdev_us: s.stdev_us,
            t_p99_us: s.p99_us,
            t_p999_us: s.p999_us,
            bw_peak_MBps: 0.0,
            bw_avg_MBps: 0.0,
            msg_rate_Mpps: 0.0,
            received: None,
            dropped: None,
        }
    }
}

/// The row of a latency test: the summary of its samples.
pub fn lat_row<C: Context>(cli: &PerfCli, ctx: &C, size: u64, iters: u64, lat: &Latencies) -> Row {
    let mut row = Row::of(cli, ctx, size, iters, lat);
    let avg = row.t_avg_us;
    if avg > 0.0 {
        row.bw_peak_MBps = size as f64 / (avg * 1e-6) / MB;
        row.bw_avg_MBps = row.bw_peak_MBps;
        row.msg_rate_Mpps = 1.0 / avg;
    }
    row
}

/// The row of a bandwidth test from its run time and (time, messages completed)
/// samples.
pub fn bw_row<C: Context>(
    cli: &PerfCli,
    ctx: &C,
    size: u64,
    iters: u64,
    elapsed: Duration,
    samples: &[(Duration, u64)],
) -> Row {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let avg = (size * iters) as f64 / secs / MB;
    // Peak: the best rate over any window of at least a tenth of the messages.
    let min_msgs = (iters / 10).max(1);
    let pts: Vec<(f64, u64)> = std::iter::once((0.0, 0))
        .chain(samples.iter().map(|&(t, c)| (t.as_secs_f64(), c)))
        .collect();
    let mut peak = avg;
    let mut i = 0;
    for j in 1..pts.len() {
        while i + 1 < j && pts[j].1 - pts[i + 1].1 >= min_msgs {
            i += 1;
        }
        let (dt, dm) = (pts[j].0 - pts[i].0, pts[j].1 - pts[i].1);
        if dm >= min_msgs && dt > 0.0 {
            peak = peak.max((dm * size) as f64 / dt / MB);
        }
    }
    // Per-message time of each completion batch (ns), for the t_* fields.
    let mut lat = Latencies::default();
    for w in pts.windows(2).filter(|w| w[1].1 > w[0].1) {
        lat.record_ns(((w[1].0 - w[0].0) * 1e9 / (w[1].1 - w[0].1) as f64) as u64);
    }
    Row {
        t_avg_us: secs * 1e6 / iters as f64,
        bw_peak_MBps: peak,
        bw_avg_MBps: avg,
        msg_rate_Mpps: iters as f64 / secs / 1e6,
        ..Row::of(cli, ctx, size, iters, &lat)
    }
}

/// The row of a SEND bandwidth run over UC or UD from what the receiver counted: its rate
/// between its first and last message (`received - 1` gaps), and the messages sent and
/// never received, apart.
pub fn bw_row_received<C: Context>(cli: &PerfCli, ctx: &C, size: u64, iters: u64, got: Received) -> Row {
    let secs = got.span_ns as f64 * 1e-9;
    let gaps = got.received.saturating_sub(1);
    let rate = if secs > 0.0 { gaps as f64 / secs } else { 0.0 };
    Row {
        t_avg_us: if gaps > 0 { secs * 1e6 / gaps as f64 } else { 0.0 },
        bw_peak_MBps: rate * size as f64 / MB,
        bw_avg_MBps: rate * size as f64 / MB,
        msg_rate_Mpps: rate / 1e6,
        received: Some(got.received),
        dropped: Some(iters.saturating_sub(got.received)),
        ..Row::of(cli, ctx, size, iters, &Latencies::default())
    }
}

/// The row of a `--perftest` latency run, from perftest's arithmetic.
pub fn lat_row_perftest<C: Context>(cli: &PerfCli, ctx: &C, size: u64, iters: u64, s: &LatStats) -> Row {
    let mut row = Row::of(cli, ctx, size, iters, &Latencies::default());
    row.t_min_us = s.min;
    row.t_max_us = s.max;
    row.t_typical_us = s.typical;
    row.t_avg_us = s.avg;
    row.t_stdev_us = s.stdev;
    row.t_p99_us = s.p99;
    row.t_p999_us = s.p999;
    if s.avg > 0.0 {
        row.bw_peak_MBps = size as f64 / (s.avg * 1e-6) / MB;
        row.bw_avg_MBps = row.bw_peak_MBps;
        row.msg_rate_Mpps = 1.0 / s.avg;
    }
    row
}

/// The row of a `--perftest` bandwidth run, from perftest's arithmetic (the `t_*` fields
/// hold only the mean time per message).
pub fn bw_row_perftest<C: Context>(cli: &PerfCli, ctx: &C, size: u64, iters: u64, s: &BwStats) -> Row {
    Row {
        t_avg_us: s.elapsed_us / iters.max(1) as f64,
        bw_peak_MBps: s.peak_mbps,
        bw_avg_MBps: s.avg_mbps,
        msg_rate_Mpps: s.msg_rate_mpps,
        ..Row::of(cli, ctx, size, iters, &Latencies::default())
    }
}

/// Prints a row: perftest's columns, or one JSON object with `--json`.
pub fn print_row(cli: &PerfCli, r: &Row) -> Res<()> {
    let mut out = std::io::stdout().lock();
    if cli.json {
        writeln!(out, "{}", serde_json::to_string(r)?)?;
    } else if cli.test.is_lat() {
        writeln!(
            out,
            " {:<6} {:<14} {:<14.2} {:<12.2} {:<18.2} {:<14.2} {:<15.2} {:<22.2} {:<.2}",
            r.size,
            r.iters,
            r.t_min_us,
            r.t_max_us,
            r.t_typical_us,
            r.t_avg_us,
            r.t_stdev_us,
            r.t_p99_us,
            r.t_p999_us
        )?;
    } else {
        writeln!(
            out,
            " {:<10} {:<14} {:<18.2} {:<20.2} {:.6}",
            r.size, r.iters, r.bw_peak_MBps, r.bw_avg_MBps, r.msg_rate_Mpps
        )?;
        if let (Some(got), Some(lost)) = (r.received, r.dropped) {
            writeln!(
                out,
                " (counted at the receiver: {got} of {} messages received, {lost} dropped; the rates are the receiver's)",
                r.iters
            )?;
        }
    }
    out.flush()?;
    Ok(())
}
