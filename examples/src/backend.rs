//! Backend selection: [`with_backend!`](crate::with_backend), the one `match` that turns
//! the run-time `--backend` choice into a call of a function generic over
//! `B: verbs_api::Backend`, and opening the chosen device.

use anyhow::Context as _;
use verbs_api::Backend;

use crate::Res;

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

/// The sim backend, configured from `RDMA_SIM_LISTEN` / `RDMA_SIM_DEVICES` /
/// `RDMA_SIM_PROFILE`.
pub fn sim_backend() -> Res<backend_sim::SimBackend> {
    backend_sim::SimBackend::from_env().context("configuring the sim backend")
}

/// [`sim_backend`], with the profile `--profile` names if it does.
pub fn sim_backend_for(common: &crate::cli::CommonArgs) -> Res<backend_sim::SimBackend> {
    let b = sim_backend()?;
    Ok(match common.profile {
        Some(profile) => backend_sim::SimBackend::new(backend_sim::SimConfig {
            profile,
            ..b.config().clone()
        }),
        None => b,
    })
}

/// The error for `--backend ibverbs` in a build without the `ibverbs` feature.
pub fn no_ibverbs(bin: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "this binary was built without the ibverbs backend; rebuild with \
         `cargo run --release -p examples --features ibverbs --bin {bin} -- --backend ibverbs ...` \
         (needs libibverbs-dev, librdmacm-dev, pkg-config and libclang-dev)"
    )
}

/// Runs `$body` with `$b` bound to a `&B` of the backend the [`CommonArgs`](crate::cli::CommonArgs) `$common` name; `$body` is
/// usually a call of a function generic over `B: Backend`, and must evaluate to a
/// [`Res`](crate::Res). The surrounding function must return a `Res` too.
///
/// ```text
/// with_backend!(args.common, |b| server(b, &args))
/// ```
#[macro_export]
macro_rules! with_backend {
    ($common:expr, |$b:ident| $body:expr) => {
        match $common.backend {
            $crate::cli::BackendKind::Sim => {
                let backend = $crate::backend::sim_backend_for(&$common)?;
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
            $crate::cli::BackendKind::Ibverbs => Err($crate::backend::no_ibverbs(env!("CARGO_BIN_NAME"))),
        }
    };
}
