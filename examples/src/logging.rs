//! Logging for the example binaries: one `tracing` subscriber that writes to stderr and
//! honours `RUST_LOG` (`RUST_LOG=debug`, `RUST_LOG=backend_sim=trace,warn`, ...), with
//! `warn` when it is unset, so the libraries' warnings (a listener out of file
//! descriptors, a connection the sim refused, ...) are seen.

use tracing_subscriber::filter::{EnvFilter, LevelFilter};

/// Installs the subscriber (once; later calls do nothing).
pub fn init_tracing() {
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .from_env_lossy();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
