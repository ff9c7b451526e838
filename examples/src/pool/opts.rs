//! param-pool's command-line options, by subcommand.

use clap::Args;

/// How an owner rewrites its vectors (`server` and `demo`).
#[derive(Args, Debug, Clone)]
pub struct OwnerTuning {
    /// Vectors per owner.
    #[arg(long, default_value_t = 16)]
    pub vectors: u32,
    /// Parameters (f32) per vector.
    #[arg(long, default_value_t = 1024)]
    pub dim: u32,
    /// Pause between two vector updates, in microseconds (0: rewrite continuously).
    #[arg(long, default_value_t = 0)]
    pub update_pause_us: u64,
}

/// `param-pool server`.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// Address to listen on for connection setup (port 0: any free port; loopback by
    /// default, 0.0.0.0:PORT accepts other hosts).
    #[arg(long, default_value = "127.0.0.1:18516")]
    pub listen: String,
    /// Reader connections to accept (one per reader thread).
    #[arg(long, default_value_t = 1)]
    pub readers: u32,
    #[command(flatten)]
    pub revoke: Revoke,
    #[command(flatten)]
    pub tuning: OwnerTuning,
}

/// Which readers an owner revokes, and when (`server` and `demo`).
#[derive(Args, Debug, Clone)]
pub struct Revoke {
    /// Readers to revoke (the last ones to connect) by invalidating their windows.
    #[arg(long, default_value_t = 0)]
    pub revoke: u32,
    /// When to revoke them, in milliseconds after the last reader connected.
    #[arg(long, default_value_t = 500)]
    pub revoke_after_ms: u64,
}

/// What the readers do (`client` and `demo`).
#[derive(Args, Debug, Clone)]
pub struct ReaderTuning {
    /// Reader threads (each with its own QP to every owner).
    #[arg(long, default_value_t = 2)]
    pub readers: u32,
    /// How long to read, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub duration_ms: u64,
    /// RDMA READs in flight per reader.
    #[arg(long, default_value_t = 4)]
    pub depth: u32,
    /// Use vectors without checking versions or checksum (negative control: torn vectors
    /// get used).
    #[arg(long)]
    pub no_version_check: bool,
}

/// `param-pool client`.
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// An owner's connection-setup address (repeat for several owners).
    #[arg(long, default_value = "127.0.0.1:18516")]
    pub server: Vec<String>,
    #[command(flatten)]
    pub tuning: ReaderTuning,
}

/// `param-pool demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Owner processes.
    #[arg(long, default_value_t = 1)]
    pub owners: u32,
    #[command(flatten)]
    pub owner: OwnerTuning,
    #[command(flatten)]
    pub reader: ReaderTuning,
    /// Readers each owner revokes (the last to connect), a quarter into the reading.
    #[arg(long, default_value_t = 1)]
    pub revoke: u32,
}
