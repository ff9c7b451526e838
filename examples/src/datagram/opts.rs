//! ud-echo's command-line options, by subcommand.

use clap::Args;

/// The server's receive queue, and when it lets it run empty (`server` and `demo`).
#[derive(Args, Debug, Clone)]
pub struct ServerTuning {
    /// Receives kept posted on the server's UD QP (each 40 B of GRH + the MTU).
    #[arg(long, default_value_t = 64)]
    pub recv_depth: u32,
    /// After this many datagrams received, stop re-posting receives: the receive queue
    /// runs empty, and the device drops what arrives until --starve-ms have passed
    /// (default: never for `server`; a quarter of the datagrams for `demo`).
    #[arg(long)]
    pub starve_after: Option<u64>,
    /// How long the receive queue stays empty, in ms, before it is filled again.
    #[arg(long, default_value_t = 200)]
    pub starve_ms: u64,
}

/// `ud-echo server`.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// Address clients register at over TCP (port 0: any free port; 0.0.0.0:PORT accepts
    /// other hosts).
    #[arg(long, default_value = "127.0.0.1:18530")]
    pub listen: String,
    /// Clients to serve; the server exits when they are all done.
    #[arg(long, default_value_t = 1)]
    pub clients: u32,
    #[command(flatten)]
    pub tuning: ServerTuning,
}

/// What the clients send (`client` and `demo`).
#[derive(Args, Debug, Clone)]
pub struct ClientTuning {
    /// Clients (each a thread with its own UD QP).
    #[arg(long, default_value_t = 2)]
    pub clients: u32,
    /// Datagrams per client.
    #[arg(short = 'n', long, default_value_t = 2000)]
    pub count: u64,
    /// Bytes per datagram, its 32-byte header included (at most the port's MTU).
    #[arg(long, default_value_t = 256)]
    pub size: usize,
    /// Datagrams in flight per client.
    #[arg(long, default_value_t = 16)]
    pub window: u32,
    /// A datagram not echoed within this many ms counts as lost.
    #[arg(long, default_value_t = 500)]
    pub loss_timeout_ms: u64,
}

/// `ud-echo client`.
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// The server's registration address.
    #[arg(long, default_value = "127.0.0.1:18530")]
    pub server: String,
    /// Number of the first client (processes sharing one server take distinct ranges).
    #[arg(long, default_value_t = 0)]
    pub first_id: u32,
    #[command(flatten)]
    pub tuning: ClientTuning,
}

/// `ud-echo demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    #[command(flatten)]
    pub server: ServerTuning,
    #[command(flatten)]
    pub client: ClientTuning,
    /// Never let the server's receive queue run empty (then nothing need be lost).
    #[arg(long)]
    pub no_starve: bool,
}
