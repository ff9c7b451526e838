//! perftest-vs-perf: the table of a sitting of `ci/perftest-vs-perf.sh`, perftest's
//! `ib_*` programs against `perf --perftest` on the same device, alternating: per row the
//! medians of both tools and the median of `perf / perftest` over the pairs
//! (`examples::perftest::versus`).
//!
//! ```text
//! perftest-vs-perf DIR [--json OUT] [--tolerance 0.05] [--target no-slower|within]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use examples::perftest::versus;
use examples::Res;

/// Reduces a directory of perftest and perf runs to one table.
#[derive(Parser, Debug)]
#[command(name = "perftest-vs-perf", version)]
struct Cli {
    /// The directory ci/perftest-vs-perf.sh filled.
    dir: PathBuf,
    /// Also write the table as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The target: within this fraction of perftest.
    #[arg(long, default_value_t = 0.05)]
    tolerance: f64,
    /// `no-slower`: perf no slower than perftest beyond the tolerance (perf against C on
    /// one device); `within`: the two within the tolerance of each other either way
    /// (perftest through the sim's C ABI against perf on the sim).
    #[arg(long, value_enum, default_value_t = versus::Target::NoSlower)]
    target: versus::Target,
}

fn main() -> ExitCode {
    examples::program::main("perftest-vs-perf", |cli: Cli| run(&cli))
}

fn run(cli: &Cli) -> Res<()> {
    let lines = versus::collect(&cli.dir)?;
    anyhow::ensure!(!lines.is_empty(), "no runs in {}", cli.dir.display());
    print!("{}", versus::markdown(&lines, cli.tolerance, cli.target));
    if let Some(out) = &cli.json {
        let doc = serde_json::json!({
            "what": "perftest against perf --perftest on the same device, alternating pairs; ratios are medians over the pairs of perf / perftest (latency: typical and minimum; bandwidth: average)",
            "tolerance": cli.tolerance,
            "target": format!("{:?}", cli.target),
            "rows": lines,
        });
        std::fs::write(out, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
