//! The soak test as a program: many QPs across two devices, mixed traffic, exact
//! accounting, flat memory (see `conformance::soak`). Prints the figures (or JSON) and
//! exits non-zero if anything was lost, duplicated, corrupted or leaked.
//!
//! ```text
//! cargo run --release -p conformance --bin soak                                   # 256 QPs on the sim
//! cargo run --release -p conformance --bin soak -- --qps 512 --ops 4000           # 2M operations
//! cargo run --release -p conformance --features ibverbs --bin soak -- --backend ibverbs -x 1
//! ```

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use conformance::cli::BackendKind;
use conformance::soak::{self, Mix, SoakConfig};
use verbs_api::Backend;

/// Soak a verbs backend: QPs connected pairwise across two devices, SEND/RECV, RDMA
/// WRITE/READ and atomics with many WRs outstanding, every completion, byte and atomic
/// result checked, RSS sampled after a warm-up and at the end.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Backend to soak.
    #[arg(long, value_enum, default_value = "sim")]
    backend: BackendKind,
    /// First device (default: the backend's first device).
    #[arg(long)]
    device_a: Option<String>,
    /// Second device (default: the backend's second device, or the first one opened again).
    #[arg(long)]
    device_b: Option<String>,
    /// GID index for connections (RoCE v2 over IPv4 usually needs 1).
    #[arg(long, short = 'x', default_value_t = 0)]
    gid_index: u8,
    /// QPs in total, half on each device, connected pairwise across them (even).
    #[arg(long, default_value_t = 256)]
    qps: usize,
    /// Signaled send WRs posted by each QP (total = qps x ops).
    #[arg(long, default_value_t = 2000)]
    ops: u64,
    /// Send WRs outstanding per QP (also receives posted per QP).
    #[arg(long, default_value_t = 16)]
    depth: usize,
    /// Payload sizes of SEND/WRITE/READ, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,61,512,1500,4096")]
    sizes: Vec<u32>,
    /// Operation weights, e.g. send=3,write=3,read=2,faa=1,cas=1.
    #[arg(long, default_value = "send=3,write=3,read=2,faa=1,cas=1")]
    mix: String,
    /// Seed of every choice.
    #[arg(long, default_value_t = 0x5eed_50a4)]
    seed: u64,
    /// Remote WRITE/READ slots per QP.
    #[arg(long, default_value_t = 8)]
    slots: usize,
    /// Shared FETCH_AND_ADD counters per device.
    #[arg(long, default_value_t = 8)]
    counters: usize,
    /// QPs per CQ.
    #[arg(long, default_value_t = 32)]
    qps_per_cq: usize,
    /// Fail if RSS grows by more than this after the warm-up (MiB).
    #[arg(long, default_value_t = 64)]
    max_rss_growth_mib: u64,
    /// Fail if no completion arrives for this long (seconds).
    #[arg(long, default_value_t = 30.0)]
    stall_timeout: f64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mix = match Mix::parse(&args.mix) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: --mix: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = SoakConfig {
        qps: args.qps,
        ops_per_qp: args.ops,
        depth: args.depth,
        sizes: args.sizes.clone(),
        seed: args.seed,
        mix,
        slots: args.slots,
        counters: args.counters,
        qps_per_cq: args.qps_per_cq,
        max_rss_growth: args.max_rss_growth_mib << 20,
        stall_timeout: Duration::from_secs_f64(args.stall_timeout),
        gid_index: args.gid_index,
        ..SoakConfig::default()
    };
    conformance::with_backend!(
        args.backend,
        "cargo run --release -p conformance --features ibverbs --bin soak -- --backend ibverbs",
        |b| run(b, &args, &cfg)
    )
}

fn run<B: Backend>(backend: &B, args: &Args, cfg: &SoakConfig) -> ExitCode {
    let listed = match backend.devices() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let first = listed.first().map(|d| d.name.clone());
    let Some(a) = args.device_a.clone().or(first.clone()) else {
        eprintln!("error: the {} backend lists no devices", backend.name());
        return ExitCode::from(2);
    };
    let b = args
        .device_b
        .clone()
        .or_else(|| listed.iter().map(|d| d.name.clone()).find(|n| *n != a))
        .unwrap_or_else(|| a.clone());
    if !args.json {
        eprintln!(
            "soak: {} backend, {} + {}, {} QPs x {} ops = {} ops, depth {}",
            backend.name(),
            a,
            b,
            cfg.qps,
            cfg.ops_per_qp,
            cfg.qps as u64 * cfg.ops_per_qp,
            cfg.depth
        );
    }
    let result = soak::run(backend, (&a, &b), cfg);
    let (report, problems) = match &result {
        Ok(r) => (Some(r), Vec::new()),
        Err(f) => (f.report.as_deref(), f.problems.clone()),
    };
    if args.json {
        let v = serde_json::json!({
            "status": if problems.is_empty() { "pass" } else { "fail" },
            "problems": problems,
            "report": report,
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("report serializes"));
    } else {
        if let Some(r) = report {
            println!("{r}");
        }
        if problems.is_empty() {
            println!("PASS: every completion once, every byte and atomic result exact, memory flat");
        } else {
            println!("FAIL:");
            for p in &problems {
                println!("  {p}");
            }
        }
    }
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
