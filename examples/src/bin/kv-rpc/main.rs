//! kv-rpc: a key-value store served over SEND/RECV (the two-sided pattern of the RDMA
//! communication model).
//!
//! The server pre-posts `--recv-depth` receives of the fixed maximum request size per
//! client QP and, after each batch of completions it polls, re-posts as many as it
//! consumed (one `post_recv` with a list: the batched refill), so the receive queue never
//! runs dry. Clients keep up to `--window` requests in flight and measure each request's
//! latency from post to response.
//!
//! `--no-refill` turns the batched refill off: receives are re-posted only by a slow
//! housekeeping tick (`--tick-ms`). In between, the receive queue runs dry and every SEND
//! meets an RNR NAK. With the client's default `--rnr-retry 7` (retry forever) the
//! requests still complete, slowly (the client reports the stalls, the server how long
//! its queue was empty); with `--rnr-retry 0` the first RNR NAK completes the request with
//! `IBV_WC_RNR_RETRY_EXC_ERR`, the QP goes to ERR and the rest is flushed.
//!
//! `--srq` gives the server one shared receive queue for all its client QPs instead of a
//! receive queue per QP. A receive's `wr_id` names its slot in the shared pool, so the
//! request is found whatever QP it arrived on, and the completion's `qp_num` names the
//! QP, so the answer goes back on it. Consumed receives are not re-posted after each
//! poll but in one batch when the SRQ's limit event (`IBV_EVENT_SRQ_LIMIT_REACHED`)
//! fires, and the limit is armed again; the demo checks that it fired and that no SEND
//! met an empty queue for good (`IBV_WC_RNR_RETRY_EXC_ERR`).
//!
//! The verbs calls and the protocol are in `server.rs` and `client.rs`, the demo and its
//! invariant here; the wire format, the store, the workload and its checks, the reports
//! and the options are in `examples::kv`.
//!
//! ```text
//! kv-rpc demo                                  # server child + 2 client connections, checked
//! kv-rpc demo --no-refill                      # RNR retries: same result, much slower
//! kv-rpc demo --no-refill --rnr-retry 0        # RNR_RETRY_EXC_ERR, counted (exit 0 when seen)
//! kv-rpc demo --srq                            # one SRQ for all clients, refilled on its limit event
//! kv-rpc server --listen 0.0.0.0:18515 --clients 1
//! kv-rpc client --server 10.0.0.1:18515
//! ```

mod client;
mod server;
mod wr_ids;

use client::clients;
use server::server;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use examples::child::ChildProc;
use examples::cli::CommonArgs;
use examples::conn;
use examples::demo::{start_server, ChildArgs};
use examples::kv::opts::{ClientArgs, DemoArgs, ServerArgs};
use examples::kv::report::{print_clients, ClientReport, SRQ_EVENTS};
use examples::{with_backend, Res};
use verbs_api::WcStatus;

/// A key-value store over SEND/RECV with pre-posted, batch-refilled receives.
#[derive(Parser, Debug)]
#[command(
    name = "kv-rpc",
    version,
    after_help = "Examples:\n  kv-rpc demo\n  kv-rpc demo --srq\n  kv-rpc demo --no-refill\n  kv-rpc demo --no-refill --rnr-retry 0\n  kv-rpc server --listen 0.0.0.0:18515 --clients 2\n  kv-rpc client --server HOST:18515 --clients 2"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve the store to `--clients` connections, then exit when they are done.
    Server(ServerArgs),
    /// Run PUTs, GETs and DELETEs against a server and check the answers.
    Client(ClientArgs),
    /// Start a server child process, run the clients, check that every GET returned what
    /// was PUT and deleted keys are gone (or, with --no-refill --rnr-retry 0, that the
    /// RNR_RETRY_EXC_ERR happened).
    Demo(DemoArgs),
}

fn main() -> ExitCode {
    examples::program::main("kv-rpc", |cli: Cli| run(&cli))
}

fn run(cli: &Cli) -> Res<()> {
    let common = &cli.common;
    match &cli.cmd {
        Cmd::Server(a) => with_backend!(common, |b| server(b, common, a)),
        Cmd::Client(a) => {
            let addr = conn::parse_addr(&a.server)?;
            let reports = with_backend!(common, |b| clients(b, common, &a.tuning, addr, a.first_id))?;
            if !print_clients(&reports, a.tuning.window, a.tuning.value_size) {
                bail!("some requests failed or returned wrong answers (see above)")
            }
            Ok(())
        }
        Cmd::Demo(a) => demo(common, a),
    }
}

fn demo(common: &CommonArgs, a: &DemoArgs) -> Res<()> {
    let expect_rnr_error = a.server.no_refill && a.client.rnr_retry == 0;
    let mut sargs = ChildArgs::server(common)
        .opt("--clients", a.client.clients.max(1))
        .opt("--recv-depth", a.server.recv_depth)
        .opt("--tick-ms", a.server.tick_ms)
        .flag("--no-refill", a.server.no_refill)
        .flag("--srq", a.server.srq);
    if let Some(d) = a.server.srq_depth {
        sargs = sargs.opt("--srq-depth", d);
    }
    if let Some(l) = a.server.srq_limit {
        sargs = sargs.opt("--srq-limit", l);
    }
    println!(
        "demo: starting the kv-rpc server, then {} client connection(s) x {} keys{}",
        a.client.clients,
        a.client.keys,
        match (a.server.no_refill, a.client.rnr_retry) {
            (false, _) if a.server.srq => " (one shared receive queue, refilled on its limit event)".into(),
            (false, _) => String::new(),
            (true, 0) => " (no refill, rnr_retry 0: expecting IBV_WC_RNR_RETRY_EXC_ERR)".into(),
            (true, r) => format!(" (no refill, rnr_retry {r}: expecting RNR retries to slow things down)"),
        }
    );
    let (mut server, addr) = start_server("server", &sargs)?;
    let reports = with_backend!(common, |b| clients(b, common, &a.client, addr, 0))?;
    let ok = print_clients(&reports, a.client.window, a.client.value_size);
    server
        .wait_success(common.wait() + Duration::from_secs(10))
        .context("the kv-rpc server")?;
    if expect_rnr_error {
        let seen = reports.iter().filter(|r| r.saw(WcStatus::RnrRetryExcErr)).count();
        let answered: usize = reports.iter().map(|r| r.completed).sum();
        if seen == 0 {
            bail!(
                "expected IBV_WC_RNR_RETRY_EXC_ERR with --no-refill --rnr-retry 0, but no connection saw it"
            )
        }
        println!(
            "demo: OK: expected outcome observed: {seen} of {} connection(s) got IBV_WC_RNR_RETRY_EXC_ERR \
             once the server's {} receives were used up ({answered} requests answered before that); \
             the rest were flushed (IBV_WC_WR_FLUSH_ERR)",
            reports.len(),
            a.server.recv_depth
        );
        Ok(())
    } else if ok && a.server.srq {
        srq_outcome(&reports, &server)
    } else if ok {
        let checks: u64 = reports.iter().flat_map(|r| r.checked.iter()).sum();
        println!(
            "demo: OK: all {checks} answers checked: every GET returned the value PUT, every deleted key is gone"
        );
        Ok(())
    } else {
        bail!("invariant violated: wrong answers or failed requests (see above)")
    }
}

/// `demo --srq`: every answer was right (checked by the caller); the SRQ's limit event
/// fired at least once (the server says how often) and no SEND failed for want of a
/// receive (`IBV_WC_RNR_RETRY_EXC_ERR`).
fn srq_outcome(reports: &[ClientReport], server: &ChildProc) -> Res<()> {
    if let Some(r) = reports.iter().find(|r| r.saw(WcStatus::RnrRetryExcErr)) {
        bail!(
            "client {} got IBV_WC_RNR_RETRY_EXC_ERR: the shared receive queue ran dry",
            r.id
        )
    }
    let line = server
        .last_line(SRQ_EVENTS)
        .context("the server did not say how often the SRQ limit event fired")?;
    let fired: u64 = line[SRQ_EVENTS.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("unreadable line from the server: {line:?}"))?;
    if fired == 0 {
        bail!("the SRQ limit event never fired, so the shared queue was never refilled on it")
    }
    let checks: u64 = reports.iter().flat_map(|r| r.checked.iter()).sum();
    println!(
        "demo: OK: all {checks} answers checked over one shared receive queue; its limit event fired {fired} \
         times and each time a batch of receives was posted; no IBV_WC_RNR_RETRY_EXC_ERR"
    );
    Ok(())
}
