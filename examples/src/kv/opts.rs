//! kv-rpc's command-line options, by subcommand.

use clap::Args;

/// How the server keeps its receive queues filled (`server` and `demo`).
#[derive(Args, Debug, Clone)]
pub struct ServerTuning {
    /// Receives pre-posted per client QP (each of the maximum request size).
    #[arg(long, default_value_t = 64)]
    pub recv_depth: u32,
    /// Do not re-post receives after each poll batch; only the slow --tick-ms
    /// housekeeping tick re-posts them (shows RQ exhaustion and RNR NAKs).
    #[arg(long)]
    pub no_refill: bool,
    /// With --no-refill: the housekeeping tick that re-posts consumed receives, in ms
    /// (0: never).
    #[arg(long, default_value_t = 20)]
    pub tick_ms: u64,
    /// One shared receive queue for all client QPs, refilled in a batch each time its
    /// limit event (IBV_EVENT_SRQ_LIMIT_REACHED) fires.
    #[arg(long, conflicts_with = "no_refill")]
    pub srq: bool,
    /// With --srq: receives in the shared queue (default: --recv-depth x the clients).
    #[arg(long)]
    pub srq_depth: Option<u32>,
    /// With --srq: the limit armed; the event fires when fewer receives than this are
    /// left (default: half the queue).
    #[arg(long)]
    pub srq_limit: Option<u32>,
}

impl ServerTuning {
    /// With `--srq`, the shared queue's (depth, limit) for `clients` connections.
    pub fn srq_size(&self, clients: u32) -> Option<(u32, u32)> {
        self.srq.then(|| {
            let depth = self
                .srq_depth
                .unwrap_or(self.recv_depth.max(1) * clients.max(1))
                .max(1);
            (depth, self.srq_limit.unwrap_or(depth / 2).clamp(1, depth))
        })
    }
}

/// `kv-rpc server`.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// Address to listen on for connection setup (port 0: any free port; loopback by
    /// default, 0.0.0.0:PORT accepts other hosts).
    #[arg(long, default_value = "127.0.0.1:18515")]
    pub listen: String,
    /// Client connections to accept before serving.
    #[arg(long, default_value_t = 1)]
    pub clients: u32,
    #[command(flatten)]
    pub tuning: ServerTuning,
}

/// What the clients do (`client` and `demo`).
#[derive(Args, Debug, Clone)]
pub struct ClientTuning {
    /// Client connections (each a thread with its own QP).
    #[arg(long, default_value_t = 2)]
    pub clients: u32,
    /// Keys per connection: each is PUT, GET, half are DELETEd, all are GET again.
    #[arg(long, default_value_t = 2000)]
    pub keys: u32,
    /// Value size in bytes (at most 1024).
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 16)]
    pub window: u32,
    /// The client QP's rnr_retry: 7 retries forever, 0 fails on the first RNR NAK.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(0..=7))]
    pub rnr_retry: u8,
}

/// `kv-rpc client`.
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// The server's connection-setup address.
    #[arg(long, default_value = "127.0.0.1:18515")]
    pub server: String,
    /// Number of the first connection (keys are named `c<id>-k<i>`; give processes
    /// sharing one server distinct ranges).
    #[arg(long, default_value_t = 0)]
    pub first_id: u32,
    #[command(flatten)]
    pub tuning: ClientTuning,
}

/// `kv-rpc demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    #[command(flatten)]
    pub server: ServerTuning,
    #[command(flatten)]
    pub client: ClientTuning,
}
