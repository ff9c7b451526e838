//! Runs the deterministic fabric's seeded workload over a range of seeds and prints what
//! happened: how many seeds matched the model, the first that did not (with the command
//! that replays it), the frames the network carried, lost and duplicated, and how fast
//! the fabric ran (frames per second of wall time). `--split` is the share of frames of
//! several packets the network cuts into their packets (default 50).
//!
//! ```text
//! cargo run --release -p backend-sim-proto --example fabric -- [--seeds A..B] [--ops N]
//!     [--loss PCT] [--dup PCT] [--jitter-us US] [--reset-ppm PPM] [--split PCT] [--duplex]
//! RDMA_FABRIC_LOG=1 ... --seeds S..S+1      # one seed, every frame printed
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use backend_sim_proto::fabric::workload::{run, Spec};
use backend_sim_proto::fabric::FaultMix;

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} needs a value")),
        None => default,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seeds: String = arg(&args, "--seeds", "0..200".to_string());
    let (a, b) = seeds.split_once("..").expect("--seeds A..B");
    let (a, b): (u64, u64) = (a.parse().expect("seed"), b.parse().expect("seed"));
    let ops: usize = arg(&args, "--ops", 200);
    let mut mix = FaultMix::lossy(arg(&args, "--loss", 5), arg(&args, "--dup", 5));
    mix.jitter = Duration::from_micros(arg(&args, "--jitter-us", 20));
    mix.reset_ppm = arg(&args, "--reset-ppm", 0);
    mix.split_ppm = arg::<u32>(&args, "--split", 50).min(100) * 10_000;
    let mut spec = Spec::new(ops, mix);
    spec.duplex = args.iter().any(|a| a == "--duplex");
    let start = Instant::now();
    let (mut ok, mut failed, mut first) = (0u64, 0u64, None);
    let (mut delivered, mut lost, mut dup, mut timeouts, mut resets) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut split = 0u64;
    let mut took = Duration::ZERO;
    for seed in a..b {
        match run(seed, &spec) {
            Ok(o) => {
                ok += 1;
                delivered += o.stats.delivered;
                lost += o.stats.lost;
                dup += o.stats.duplicated;
                timeouts += o.stats.timeouts;
                resets += o.stats.resets;
                split += o.stats.split;
                took += o.took;
            }
            Err(v) => {
                failed += 1;
                first.get_or_insert(v);
            }
        }
    }
    let wall = start.elapsed();
    println!(
        "seeds {a}..{b}: {ok} matched the model, {failed} did not ({ops} WRs {}; loss {}%, duplication {}%, jitter {:?}, resets {} ppm, frames cut into packets {}%)",
        if spec.duplex { "from each end" } else { "from A" },
        mix.loss_ppm / 10_000,
        mix.dup_ppm / 10_000,
        mix.jitter,
        mix.reset_ppm,
        mix.split_ppm / 10_000
    );
    println!(
        "frames: {delivered} delivered, {lost} lost, {dup} duplicated, {split} cut into packets; {resets} connection resets; {timeouts} local ACK timeouts; {:?} of virtual time",
        took
    );
    println!(
        "wall time {:.2} s: {:.0} frames/s, {:.0} seeds/s",
        wall.as_secs_f64(),
        delivered as f64 / wall.as_secs_f64(),
        (b - a) as f64 / wall.as_secs_f64()
    );
    match first {
        None => ExitCode::SUCCESS,
        Some(v) => {
            println!("first failure: {v}");
            println!(
                "replay: cargo run --release -p backend-sim-proto --example fabric -- --seeds {}..{} --ops {ops} --loss {} --dup {} --jitter-us {} --reset-ppm {} --split {}{}",
                v.seed,
                v.seed + 1,
                mix.loss_ppm / 10_000,
                mix.dup_ppm / 10_000,
                mix.jitter.as_micros(),
                mix.reset_ppm,
                mix.split_ppm / 10_000,
                if spec.duplex { " --duplex" } else { "" }
            );
            ExitCode::FAILURE
        }
    }
}
