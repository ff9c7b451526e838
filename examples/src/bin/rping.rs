//! rping: rdma-core's `rping` over verbs-api's connection manager, on either backend,
//! with rping's options and protocol (`examples::rping`): a C `rping` can be the other
//! side.
//!
//! ```text
//! rping -s -a 127.0.0.1 -p 7174 -v            # server (one client)
//! rping -c -a 127.0.0.1 -p 7174 -C 10 -v -V   # client
//! ```

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;

use anyhow::ensure;
use clap::Parser;
use examples::cli::CommonArgs;
use examples::rping::{client, server, Opts};
use examples::with_backend;

#[derive(Parser, Debug)]
#[command(about = "rping over verbs-api's connection manager (rping's protocol and options)")]
struct Cli {
    /// Server.
    #[arg(short = 's', conflicts_with = "client", required_unless_present = "client")]
    server: bool,
    /// Client.
    #[arg(short = 'c')]
    client: bool,
    /// Address: the server's to bind, the client's to connect to.
    #[arg(short = 'a')]
    addr: IpAddr,
    /// Port.
    #[arg(short = 'p', default_value_t = 7174)]
    port: u16,
    /// Pings (client; 0: for ever).
    #[arg(short = 'C', default_value_t = 0)]
    count: u64,
    /// Buffer size (rping's default: 64).
    #[arg(short = 'S', default_value_t = 64)]
    size: u32,
    /// Print the ping data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate the ping data (client).
    #[arg(short = 'V')]
    validate: bool,
    #[command(flatten)]
    common: CommonArgs,
}

fn main() -> ExitCode {
    examples::program::main("rping", |cli: Cli| {
        ensure!(
            cli.size >= 32,
            "-S {}: rping's buffers hold at least 32 bytes",
            cli.size
        );
        let o = Opts {
            addr: SocketAddr::new(cli.addr, cli.port),
            count: cli.count,
            size: cli.size,
            verbose: cli.verbose,
            validate: cli.validate,
            wait: cli.common.wait(),
        };
        if cli.server {
            with_backend!(cli.common, |b| server(b, &o).map(drop))
        } else {
            with_backend!(cli.common, |b| client(b, &o).map(drop))
        }
    })
}
