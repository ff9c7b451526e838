//! What the conformance binaries (the runner and `soak`) share on their command line: the
//! `--backend` choice, and running code generic over [`verbs_api::Backend`] on the backend
//! chosen, with a clear error when it cannot be opened or was not built in.

use std::process::ExitCode;

/// The `--backend` value.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum BackendKind {
    /// The simulated HCA (no hardware needed).
    Sim,
    /// libibverbs: a real HCA or Soft-RoCE (build with `--features ibverbs`).
    Ibverbs,
    /// The deterministic backend (backend-sim-det): one thread, a virtual clock, a seeded
    /// faulty network (`--seed`, `--loss`, `--dup`, `--split`, `--profile`, `--budget`); the
    /// runner only, without rdma_cm.
    Det,
}

/// Exit code 2 after saying that this binary does not run on the deterministic backend.
pub fn no_det() -> ExitCode {
    eprintln!(
        "error: --backend det runs in the conformance runner only (`conformance --backend det --seed N`)"
    );
    ExitCode::from(2)
}

/// The sim backend as configured by the environment (`RDMA_SIM_LISTEN`, ...), or exit
/// code 2 after printing why not.
pub fn sim() -> Result<backend_sim::SimBackend, ExitCode> {
    backend_sim::SimBackend::from_env().map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    })
}

/// Exit code 2 after saying that this binary was built without the ibverbs backend and
/// which command builds it in.
pub fn not_built(rebuild: &str) -> ExitCode {
    eprintln!(
        "error: this binary was built without the ibverbs backend; rebuild with `{rebuild}` \
         (needs libibverbs-dev, librdmacm-dev, pkg-config and libclang-dev)"
    );
    ExitCode::from(2)
}

/// `with_backend!(kind, "cargo command that builds ibverbs in", |b| expr)`: evaluates
/// `expr` (an [`ExitCode`]) with `b` bound to a reference to the chosen backend.
#[macro_export]
macro_rules! with_backend {
    ($kind:expr, $rebuild:expr, |$b:ident| $body:expr) => {
        match $kind {
            $crate::cli::BackendKind::Sim => match $crate::cli::sim() {
                Ok(backend) => {
                    let $b = &backend;
                    $body
                }
                Err(code) => code,
            },
            #[cfg(feature = "ibverbs")]
            $crate::cli::BackendKind::Ibverbs => {
                let backend = backend_ibverbs::IbvBackend;
                let $b = &backend;
                $body
            }
            #[cfg(not(feature = "ibverbs"))]
            $crate::cli::BackendKind::Ibverbs => $crate::cli::not_built($rebuild),
            $crate::cli::BackendKind::Det => $crate::cli::no_det(),
        }
    };
}
