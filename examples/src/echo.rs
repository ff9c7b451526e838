//! async-echo's command line: its subcommands and their options.

use clap::Subcommand;

/// async-echo's subcommands.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Serve clients until killed.
    Server {
        /// Side-channel address to listen on.
        #[arg(long, default_value = "127.0.0.1:18520")]
        listen: String,
    },
    /// Send `-n` messages and check every echo.
    Client {
        /// The server's side-channel address.
        #[arg(long, default_value = "127.0.0.1:18520")]
        server: String,
        /// Messages to send.
        #[arg(short = 'n', long, default_value_t = 1000)]
        count: u64,
    },
    /// A server and `--clients` clients in one process (one device, a QP pair per client).
    Demo {
        /// Concurrent clients.
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// Messages per client.
        #[arg(short = 'n', long, default_value_t = 1000)]
        count: u64,
    },
}
