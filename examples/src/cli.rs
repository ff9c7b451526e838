//! What every example shares on its command line (`--backend`, `--device`, `--gid-index`,
//! `--timeout`), opening the chosen device, and [`with_backend!`](crate::with_backend):
//! the one `match` that turns the run-time `--backend` choice into a call of a function
//! generic over `B: verbs_api::Backend`.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use verbs_api::{Backend, RcParams};

use anyhow::Context as _;

use crate::Res;

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
        v
    }
}

/// Opens `--device`, or the backend's first device.
pub fn open_device<B: Backend>(backend: &B, device: Option<&str>) -> Res<B::Context> {
    match device {
        Some(name) => backend
            .open(name)
            .with_context(|| format!("opening device {name} of the {} backend", backend.name())),
        None => backend
            .open_first()
            .with_context(|| format!("opening the first device of the {} backend", backend.name())),
    }
}

/// The sim backend, configured from `RDMA_SIM_LISTEN` / `RDMA_SIM_DEVICES`.
pub fn sim_backend() -> Res<backend_sim::SimBackend> {
    backend_sim::SimBackend::from_env().context("configuring the sim backend")
}

/// The error for `--backend ibverbs` in a build without the `ibverbs` feature.
pub fn no_ibverbs(bin: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "this binary was built without the ibverbs backend; rebuild with \
         `cargo run --release -p examples --features ibverbs --bin {bin} -- --backend ibverbs ...` \
         (needs libibverbs-dev, librdmacm-dev, pkg-config and libclang-dev)"
    )
}

/// Runs `$body` with `$b` bound to a `&B` of the backend `$kind` names; `$body` is
/// usually a call of a function generic over `B: Backend`, and must evaluate to a
/// [`Res`](crate::Res). The surrounding function must return a `Res` too.
///
/// ```text
/// with_backend!(args.common.backend, |b| server(b, &args))
/// ```
#[macro_export]
macro_rules! with_backend {
    ($kind:expr, |$b:ident| $body:expr) => {
        match $kind {
            $crate::cli::BackendKind::Sim => {
                let backend = $crate::cli::sim_backend()?;
                let $b = &backend;
                $body
            }
            #[cfg(feature = "ibverbs")]
            $crate::cli::BackendKind::Ibverbs => {
                let backend = $crate::IbvBackend;
                let $b = &backend;
                $body
            }
            #[cfg(not(feature = "ibverbs"))]
            $crate::cli::BackendKind::Ibverbs => Err($crate::cli::no_ibverbs(env!("CARGO_BIN_NAME"))),
        }
    };
}

/// Prints `PROG: error: ...` for a failed run (see [`describe`]) and turns the outcome
/// into an exit code (0 on success, 1 on error).
pub fn report(prog: &str, r: Res<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{prog}: error: {}", describe(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error with every context it gathered on its way up, outermost first:
/// `connecting to the server at ...: cm connect failed: Connection refused (os error 111)`.
///
/// Like anyhow's `{:#}`, except that a cause whose text its parent already ends with is
/// left out: `verbs_api::Error`'s messages include their source's text (`"{call} failed:
/// {source}"`), which `{:#}` would print twice.
pub fn describe(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_are_joined_and_a_source_already_in_its_parent_is_not_repeated() {
        let io = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        let e = Err::<(), _>(verbs_api::Error::from_io("connect", io))
            .context("connecting to the server at 127.0.0.1:1")
            .unwrap_err();
        let io_text = std::io::Error::from_raw_os_error(libc::ECONNREFUSED).to_string();
        assert_eq!(
            describe(&e),
            format!("connecting to the server at 127.0.0.1:1: connect failed: {io_text}")
        );
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(describe(&e), "outer: inner");
    }
}
