//! ud-echo: one UD QP serving several clients, datagram by datagram (unreliable
//! datagrams: no connection, no acknowledgement, no retransmission).
//!
//! Each client has a UD QP of its own and registers with the server over TCP: its
//! endpoint (GID, LID, QP number) and its number go one way, the server's endpoint and
//! the largest datagram it takes (the port's MTU) the other. Both sides build an address
//! handle from the other's endpoint. The server's one QP receives every client's
//! datagrams; a completion's `src_qp` says whose it is, and the echo goes back through
//! that client's address handle to that QP. Every datagram carries the client's number,
//! a sequence number and a checksum over a payload generated from both
//! (`examples::datagram::wire`), so both ends check every byte of every datagram that
//! arrives, and a client counts a datagram whose echo does not come within
//! `--loss-timeout-ms` as lost.
//!
//! A UD receive buffer holds the 40-byte GRH in front of the payload, so every receive is
//! 40 bytes larger than the largest datagram, and the payload is read from byte 40.
//!
//! UD drops a datagram that finds no receive posted, silently: the sender's completion
//! says success. `--starve-after N` makes the server stop re-posting receives after N
//! datagrams, let its receive queue run empty and keep it so for `--starve-ms`; the demo
//! checks that the datagrams sent meanwhile are counted lost (sent, never answered) while
//! every one delivered arrived intact.
//!
//! ```text
//! ud-echo demo                                    # server child + 2 clients, RQ starved once
//! ud-echo demo --no-starve                        # nothing need be lost
//! ud-echo server --listen 0.0.0.0:18530 --clients 2
//! ud-echo client --server HOST:18530 --clients 2
//! ```

mod client;
mod server;

use client::clients;
use server::server;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use examples::cli::CommonArgs;
use examples::conn::{self};
use examples::datagram::opts::{ClientArgs, DemoArgs, ServerArgs};
use examples::datagram::report::{print_clients, sender_prefix};
use examples::demo::{start_server, ChildArgs};
use examples::{with_backend, Res};
use std::io::Write as _;
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::Duration;
use verbs_api::cm::{self, Offer};
use verbs_api::Endpoint;

/// One UD QP echoing datagrams to several clients.
#[derive(Parser, Debug)]
#[command(
    name = "ud-echo",
    version,
    after_help = "Examples:\n  ud-echo demo\n  ud-echo demo --no-starve\n  ud-echo server --listen 0.0.0.0:18530 --clients 2\n  ud-echo client --server HOST:18530 --clients 2"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Echo the datagrams of `--clients` clients on one UD QP, then exit when they are
    /// done.
    Server(ServerArgs),
    /// Send datagrams to a server and check every echo.
    Client(ClientArgs),
    /// Start a server child process, run the clients, and check that every datagram was
    /// echoed intact or counted lost, and that the server's empty receive queue lost
    /// some.
    Demo(DemoArgs),
}

fn main() -> ExitCode {
    examples::program::main("ud-echo", |cli: Cli| run(&cli))
}

fn run(cli: &Cli) -> Res<()> {
    let common = &cli.common;
    match &cli.cmd {
        Cmd::Server(a) => with_backend!(common, |b| server(b, common, a)),
        Cmd::Client(a) => {
            let addr = conn::parse_addr(&a.server)?;
            let reports = with_backend!(common, |b| clients(b, common, &a.tuning, addr, a.first_id))?;
            if !print_clients(&reports) {
                bail!("some datagrams are unaccounted for or came back wrong (see above)")
            }
            Ok(())
        }
        Cmd::Demo(a) => demo(common, a),
    }
}

// ---------------------------------------------------------------------------------------
// registration: each side's endpoint in a verbs-api connection hello (`cm`'s format: the
// client's through `cm::exchange`, the server's answer below), over a TCP connection that
// then stays open until the client is done.

fn write_hello(stream: &mut TcpStream, me: &Endpoint, private: &[u8]) -> Res<()> {
    let hello = cm::encode_hello(me, &Offer::new().private_data(private.to_vec()));
    stream.write_all(&hello).context("sending the registration")
}

/// The 4-byte big-endian number in a hello's private data.
fn private_u32(p: &[u8]) -> Res<u32> {
    let b: [u8; 4] = p
        .try_into()
        .map_err(|_| anyhow::anyhow!("registration private data of {} bytes, expected 4", p.len()))?;
    Ok(u32::from_be_bytes(b))
}

// ---------------------------------------------------------------------------------------
// demo

fn demo(common: &CommonArgs, a: &DemoArgs) -> Res<()> {
    let nclients = a.client.clients.max(1);
    let total = a.client.count * u64::from(nclients);
    let starve_after = (!a.no_starve).then(|| a.server.starve_after.unwrap_or(total / 4));
    let mut sargs = ChildArgs::server(common)
        .opt("--clients", nclients)
        .opt("--recv-depth", a.server.recv_depth)
        .opt("--starve-ms", a.server.starve_ms);
    if let Some(n) = starve_after {
        sargs = sargs.opt("--starve-after", n);
    }
    println!(
        "demo: starting the ud-echo server, then {nclients} client(s) x {} datagrams of {} B{}",
        a.client.count,
        a.client.size,
        match starve_after {
            Some(n) => format!(
                "; after {n} datagrams the server lets its receive queue run empty for {} ms",
                a.server.starve_ms
            ),
            None => String::new(),
        }
    );
    let (mut server, addr) = start_server("server", &sargs)?;
    let reports = with_backend!(common, |b| clients(b, common, &a.client, addr, 0))?;
    let consistent = print_clients(&reports);
    server
        .wait_success(common.wait() + Duration::from_secs(10))
        .context("the ud-echo server (it fails if a datagram arrived damaged)")?;
    if !consistent {
        bail!(
            "invariant violated: a datagram neither echoed nor counted lost, or an echo that came back wrong"
        )
    }
    // What the server received of each client lies between what came back and what was
    // sent: an echo implies the datagram arrived, a datagram lost on the way in is lost.
    for r in &reports {
        let prefix = sender_prefix(r.id);
        let line = server
            .last_line(&prefix)
            .with_context(|| format!("the server printed nothing about client {}", r.id))?;
        let received: u64 = line
            .split("received ")
            .nth(1)
            .and_then(|x| x.split(|ch: char| !ch.is_ascii_digit()).next())
            .and_then(|x| x.parse().ok())
            .with_context(|| format!("unreadable server line {line:?}"))?;
        let c = &r.counts;
        if received < c.echoed || c.sent - received > c.lost {
            bail!(
                "client {}: the server received {received} of its datagrams, but it saw {} echoed and {} lost of {} sent",
                r.id,
                c.echoed,
                c.lost,
                c.sent
            )
        }
    }
    let sent: u64 = reports.iter().map(|r| r.counts.sent).sum();
    let echoed: u64 = reports.iter().map(|r| r.counts.echoed).sum();
    let lost: u64 = reports.iter().map(|r| r.counts.lost).sum();
    if starve_after.is_some() && lost == 0 {
        bail!(
            "the server's receive queue was left empty for {} ms, yet no datagram was lost: the drops went uncounted",
            a.server.starve_ms
        )
    }
    println!(
        "demo: OK: {nclients} client(s) sent {sent} datagrams to one UD QP, which told them apart by src_qp; \
         {echoed} came back intact (sequence number, checksum and every payload byte checked at both ends), \
         {lost} were counted lost (sent, never answered){}",
        if starve_after.is_some() {
            ", dropped while the server's receive queue was empty"
        } else {
            ""
        }
    );
    Ok(())
}
