//! perf: perftest-style latency and bandwidth over any verbs backend, so that the sim's
//! (or your HCA's) numbers sit beside `ib_send_lat`, `ib_write_bw` and friends.
//!
//! Tests: `send_lat`, `write_lat`, `read_lat`, `atomic_lat`, `send_bw`, `write_bw`,
//! `read_bw`, `atomic_bw`, with perftest's flags (`-s` size, `-n` iterations, `-a` all
//! sizes 2 B .. 8 MiB, `-t` TX depth, `-d` device, `-x` GID index, `-p` port, `-F`
//! accepted and ignored, `-A` atomic type, `-I` inline size, `-r` RX depth).
//!
//! Roles: `perf TEST --server` waits for one client on `-p` (what perftest does without an
//! address); `perf TEST HOST` is the client. Unlike perftest, `perf TEST` with neither
//! starts its own server as a child process on loopback and runs the client against it,
//! so one command is a complete run. The client sends its parameters to the server
//! (connection private data); the server must run the same test.
//!
//! How it measures (as perftest does):
//! - `send_lat`, `write_lat`: ping-pong; each side sends and waits for the other's
//!   message (`write_lat` polls the last byte of its receive buffer, like ib_write_lat);
//!   the reported latency is half the round trip.
//! - `read_lat`, `atomic_lat`: one operation outstanding; the time to its completion.
//! - `*_bw`: `-t` work requests kept outstanding, every `t/2`-th signaled (the send queue
//!   holds `t`), one post per batch; the clock is read once per polled batch of
//!   completions, never per message. BW average = bytes / elapsed; BW peak = the best
//!   rate over any window of at least a tenth of the run; MB = 2^20 bytes as in perftest.
//!   In `--json`, a BW test's `t_*` fields are the per-message times of those completion
//!   batches.
//!
//! Without `-n`, iterations are perftest's defaults (1000 for latency, 5000 for
//! bandwidth) reduced for large messages so that one size moves at most 512 MiB.
//!
//! `-c UC|UD` runs over another transport (perftest's connection types: UC for the
//! SEND and WRITE tests, UD for the SEND tests, datagrams of at most the port's MTU, the
//! 40-byte GRH in front of each receive), and `--use_srq` takes the SEND tests' receives
//! from a shared receive queue; both ends need the same. UC and UD retransmit nothing,
//! so a SEND bandwidth row over them is counted at the receiver: it takes what arrives
//! until the sender says it is done, and the row's rates are the receiver's (from its
//! first message to its last), with the messages sent and never received reported
//! apart.
//!
//! `--mw` (on both ends; READ, WRITE and atomic tests over RC) reaches each side's memory
//! through a type 2 memory window bound over it instead of its region's rkey, and then
//! reports how fast the client binds (and invalidates) a type 2 window through its send
//! queue (`examples::perftest::mw`).
//!
//! `--perftest` (on both ends) swaps these loops for perftest's own
//! (`examples::perftest::loops`), stamped with the cycle counter and reduced with
//! perftest's arithmetic, for side-by-side runs with `ib_*` on one device.
//!
//! This file holds the connection setup and the measurement loops of both ends; the
//! command line, the run's parameters, a side's ping-pong primitives and perftest's
//! output are in `examples::perftest`.

mod client;
mod server;
mod setup;

use client::client;
use server::server;

use anyhow::Context as _;
use examples::child::{ChildProc, Echo};
use examples::demo::ChildArgs;
use examples::perftest::opts::PerfCli;
use examples::perftest::params::Cfg;
use examples::{with_backend, Res};
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    examples::program::main("perf", |cli: PerfCli| run(&cli))
}

fn run(cli: &PerfCli) -> Res<()> {
    let common = &cli.common;
    if cli.server {
        return with_backend!(common, |b| server(b, cli));
    }
    let cfg = Cfg::from_cli(cli)?;
    match &cli.address {
        Some(a) => {
            let addr = if a.contains(':') && a.parse::<std::net::Ipv6Addr>().is_err() {
                a.clone()
            } else {
                format!("{a}:{}", cli.port)
            };
            with_backend!(common, |b| client(b, cli, &cfg, &addr))
        }
        None => loopback(cli, &cfg),
    }
}

/// No address: a server child on loopback, the client here.
fn loopback(cli: &PerfCli, cfg: &Cfg) -> Res<()> {
    let args = ChildArgs::new(&cli.common, cli.test.name())
        .flag("--server", true)
        .flag("--perftest", cli.perftest)
        .opt("-c", cli.connection.name())
        .flag("--use_srq", cli.use_srq)
        .flag("--mw", cli.mw)
        .opt("-u", cli.qp_timeout)
        .opt("--bind", "127.0.0.1")
        .opt("-p", 0)
        .opt("-r", cfg.rx_depth);
    let echo = if cli.json { Echo::Stderr } else { Echo::Quiet };
    let mut child = ChildProc::spawn("perf-server", args.as_slice(), echo)?;
    let addr = child.listen_addr(Duration::from_secs(20))?;
    let r = with_backend!(cli.common, |b| client(b, cli, cfg, &addr.to_string()));
    match r {
        Ok(()) => child
            .wait_success(cli.common.wait() + Duration::from_secs(10))
            .context("the loopback server"),
        Err(e) => {
            let _ = child.wait(Duration::from_secs(2));
            for l in child.output() {
                eprintln!("[perf-server] {l}");
            }
            Err(e)
        }
    }
}
