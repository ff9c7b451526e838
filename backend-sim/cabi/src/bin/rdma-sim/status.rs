//! `rdma-sim status`: the sim devices live on this host (this user's programs), read from
//! each device's control endpoint (`backend_sim::control`), printed in the manner of
//! `ibv_devinfo` (a device's line) and `rdma resource show qp` (a QP's).

use std::fmt::Write as _;
use std::process::ExitCode;

use backend_sim::control::{self, DeviceStatus, QpStatus};

/// Prints every live device; `json`: one JSON array of their statuses.
pub fn print(json: bool) -> anyhow::Result<ExitCode> {
    let found = control::list(None)?;
    if json {
        let ok: Vec<&DeviceStatus> = found.iter().filter_map(|f| f.status.as_ref().ok()).collect();
        println!("{}", serde_json::to_string_pretty(&ok)?);
    } else if found.is_empty() {
        let dir = control::directory()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        println!("no sim devices are open (none of this user's programs holds one; sockets in {dir})");
    }
    for f in &found {
        match &f.status {
            Ok(s) if !json => print!("{}", render(s)),
            Ok(_) => {}
            Err(e) => eprintln!("rdma-sim: {}: no answer ({e})", f.path.display()),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `rdma-sim port DEVICE down|up|addr`: moves the port of every live device named
/// `device` (of process `pid` only, if given), or changes its address, and says which;
/// fails if there is none.
pub fn set_port(device: &str, pid: Option<u32>, request: control::PortRequest) -> anyhow::Result<ExitCode> {
    let done = control::set_port(None, device, pid, request)?;
    if done.is_empty() {
        anyhow::bail!(
            "no live sim device {device}{} (see rdma-sim status)",
            match pid {
                Some(p) => format!(" in process {p}"),
                None => String::new(),
            }
        );
    }
    let mut failed = false;
    for f in &done {
        match &f.status {
            Ok(s) => println!(
                "{} {} (pid {}): port {}, LID {:#x}, GIDs {}",
                s.program,
                s.device,
                s.pid,
                s.port,
                s.lid,
                s.gids.join(" ")
            ),
            Err(e) => {
                failed = true;
                eprintln!("rdma-sim: {}: {e}", f.path.display());
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// A device and its QPs, one line each.
fn render(s: &DeviceStatus) -> String {
    let mut out = String::new();
    let gid = s
        .gids
        .get(1)
        .or(s.gids.first())
        .map(String::as_str)
        .unwrap_or("-");
    let _ = writeln!(
        out,
        "{}  pid {} {}  profile {}  {} port {} lid {}  gid {}  listen {}  node_guid {:016x}  mrs {}  qps {}",
        s.device,
        s.pid,
        s.program,
        s.profile,
        s.link_layer,
        s.port,
        s.lid,
        gid,
        s.listen,
        s.node_guid,
        s.mrs,
        s.qps.len()
    );
    let counters: Vec<String> = s.counters.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(out, "    counters: {}", counters.join("  "));
    for q in &s.qps {
        let _ = writeln!(out, "    {}", qp_line(q));
    }
    out
}

fn qp_line(q: &QpStatus) -> String {
    let mut l = format!("lqpn 0x{:06x} type {} state {}", q.qpn, q.qp_type, q.state);
    if let Some(d) = q.dest_qpn {
        let _ = write!(l, " rqpn 0x{d:06x}");
    }
    if let Some(p) = &q.peer {
        let _ = write!(
            l,
            " peer {p} {}",
            if q.connected { "connected" } else { "not-connected" }
        );
    }
    let _ = write!(
        l,
        " sq-psn {} rq-psn {} sq-outstanding {} ",
        q.sq_psn, q.rq_psn, q.sq_outstanding
    );
    if q.srq {
        l.push_str("srq");
    } else {
        let _ = write!(l, "rq-posted {}", q.rq_posted);
    }
    l
}
