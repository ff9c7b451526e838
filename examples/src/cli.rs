//! What every example shares on its command line: `--backend`, `--device`,
//! `--gid-index`, `--timeout` and the sim's `--profile` ([`CommonArgs`]), and passing them on to a child process
//! of a demo.

use std::time::Duration;

use clap::{Args, ValueEnum};
use verbs_api::RcParams;

/// Which verbs backend runs the example.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The simulated HCA over TCP (no hardware needed).
    Sim,
    /// libibverbs: a real HCA or Soft-RoCE (build with `--features ibverbs`).
    Ibverbs,
}

impl BackendKind {
    /// The name `--backend` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Sim => "sim",
            BackendKind::Ibverbs => "ibverbs",
        }
    }
}

/// The options every example takes.
#[derive(Args, Clone, Debug)]
pub struct CommonArgs {
    /// Verbs backend.
    #[arg(long, value_enum, default_value = "sim", global = true)]
    pub backend: BackendKind,
    /// RDMA device (default: the backend's first device). On the sim every process opens
    /// its own simulated device, so server and client may both use sim0.
    #[arg(long, short = 'd', global = true)]
    pub device: Option<String>,
    /// Source GID index for connections (rxe / RoCE v2 over IPv4 usually needs 1).
    #[arg(long, short = 'x', default_value_t = 0, global = true)]
    pub gid_index: u8,
    /// Bound on every wait (completions, connection setup), in seconds.
    #[arg(long, default_value_t = 10.0, global = true)]
    pub timeout: f64,
    /// The kind of HCA the sim plays: portable, rxe or mlx5 (default: `RDMA_SIM_PROFILE`,
    /// else portable; see docs/profiles.md). The sim only.
    #[arg(long, global = true, value_name = "portable|rxe|mlx5")]
    pub profile: Option<backend_sim::Profile>,
}

impl CommonArgs {
    /// The wait bound.
    pub fn wait(&self) -> Duration {
        Duration::from_secs_f64(self.timeout.max(0.001))
    }

    /// RC connection attributes with this GID index.
    pub fn rc_params(&self) -> RcParams {
        RcParams {
            gid_index: self.gid_index,
            ..RcParams::default()
        }
    }

    /// The same options as arguments, to pass to a child process of a demo.
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec!["--backend".to_string(), self.backend.as_str().to_string()];
        if let Some(d) = &self.device {
            v.push("--device".into());
            v.push(d.clone());
        }
        v.push("--gid-index".into());
        v.push(self.gid_index.to_string());
        v.push("--timeout".into());
        v.push(self.timeout.to_string());
        if let Some(p) = self.profile {
            v.push("--profile".into());
            v.push(p.name().into());
        }
        v
    }
}
