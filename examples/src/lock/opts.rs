//! dist-lock's command-line options, by subcommand.

use clap::{Args, ValueEnum};

/// Which lock a client takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// CMP_AND_SWP spinlock with exponential backoff.
    Cas,
    /// FETCH_AND_ADD ticket lock.
    Ticket,
}

impl Mode {
    /// The name `--mode` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Cas => "cas",
            Mode::Ticket => "ticket",
        }
    }
}

/// Which lock(s) a demo runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DemoMode {
    /// The CMP_AND_SWP spinlock.
    Cas,
    /// The FETCH_AND_ADD ticket lock.
    Ticket,
    /// One run of each.
    Both,
}

/// `dist-lock server`.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// Address to listen on for connection setup (port 0: any free port; loopback by
    /// default, 0.0.0.0:PORT accepts other hosts).
    #[arg(long, default_value = "127.0.0.1:18517")]
    pub listen: String,
    /// Client QPs to accept (threads in all client processes) before starting them.
    #[arg(long, default_value_t = 2)]
    pub clients: u32,
    /// Fail unless the final counter equals this.
    #[arg(long)]
    pub expect_counter: Option<u64>,
}

/// What the client threads do (`client`).
#[derive(Args, Debug, Clone)]
pub struct ClientTuning {
    /// Lock flavour.
    #[arg(long, value_enum, default_value = "cas")]
    pub mode: Mode,
    /// Threads in this process, each with its own QP.
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
    /// Lock acquisitions (counter increments) per thread.
    #[arg(long, default_value_t = 200)]
    pub iters: u32,
    /// Longest backoff between two attempts, in microseconds.
    #[arg(long, default_value_t = 500)]
    pub max_backoff_us: u64,
}

/// `dist-lock client`.
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// The server's connection-setup address.
    #[arg(long, default_value = "127.0.0.1:18517")]
    pub server: String,
    #[command(flatten)]
    pub tuning: ClientTuning,
}

/// `dist-lock demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Which lock(s) to run.
    #[arg(long, value_enum, default_value = "both")]
    pub mode: DemoMode,
    /// Client processes.
    #[arg(long, default_value_t = 2)]
    pub procs: u32,
    /// Threads per client process.
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
    /// Acquisitions per thread.
    #[arg(long, default_value_t = 200)]
    pub iters: u32,
    /// Longest backoff between two attempts, in microseconds.
    #[arg(long, default_value_t = 500)]
    pub max_backoff_us: u64,
}
