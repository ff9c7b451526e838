//! The conformance runner: runs the case table against a backend and device and prints a
//! table (or JSON); exits non-zero if any case fails.
//!
//! ```text
//! cargo run --release -p conformance -- --backend sim
//! cargo run --release -p conformance -- --backend sim --json > sim.json
//! cargo run --release -p conformance -- --filter rnr
//! cargo run --release -p conformance -- --filter rnr --pcap captures   # captures/rnr.*.pcapng
//! conformance --backend ibverbs -d rxe0 -x 1 --filter rnr --pcap rxe   # rxe/rnr.*.pcap (tcpdump)
//! cargo run --release -p conformance -- --backend sim --profile rxe --json > sim-rxe.json
//! cargo run --release -p conformance -- --compare sim-rxe.json rxe.json
//! cargo run --release -p conformance -- --side-by-side sim.json sim-rxe.json rxe.json
//! cargo run --release -p conformance -- --serve 0.0.0.0:18600            # host A
//! cargo run --release -p conformance -- --peer HOST_A:18600 -f remote    # host B
//! cargo run --release -p conformance --features ibverbs -- --backend ibverbs -d rxe0 -x 1
//! cargo run --release -p conformance -- --backend det --seed 7 --loss 5 --dup 5 -f send
//! ```

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use conformance::cli::BackendKind;
use conformance::report::{
    check_with, compare, json_rows, side_by_side, table, DeviceCaps, OneSided, Report,
};
use conformance::{cases, run_case, verbs_cases, Case, CaseReport, Config};
use verbs_api::{Backend, Context};

/// Run the verbs conformance suite against a backend.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Backend to test.
    #[arg(long, value_enum, default_value = "sim")]
    backend: BackendKind,
    /// Device to open (default: the backend's first device).
    #[arg(long, short = 'd')]
    device: Option<String>,
    /// GID index for connections (RoCE v2 over IPv4 usually needs 1).
    #[arg(long, short = 'x', default_value_t = 0)]
    gid_index: u8,
    /// Only cases whose id or group contains this text (repeatable).
    #[arg(long, short = 'f')]
    filter: Vec<String>,
    /// Leave out the cases whose id is this (repeatable; applied after `--filter`).
    #[arg(long, value_name = "ID")]
    except: Vec<String>,
    /// Print a JSON array instead of the table.
    #[arg(long)]
    json: bool,
    /// Bound on each wait for a completion, in seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// List the cases and exit.
    #[arg(long)]
    list: bool,
    /// Print the table of a JSON report and exit.
    #[arg(long, value_name = "REPORT.json")]
    render: Option<String>,
    /// Serve the server halves of the `remote` cases on this address (for a runner on
    /// another host started with `--peer`) instead of running cases.
    #[arg(long, value_name = "ADDR")]
    serve: Option<String>,
    /// With `--serve`: exit after serving this many cases (default: serve until killed).
    #[arg(long, value_name = "N", requires = "serve")]
    serve_cases: Option<usize>,
    /// The device profile: what the cases expect where HCAs differ (`rxe` accepts rxe's
    /// recorded deviations) and, with `--backend sim`, the kind of HCA the sim plays.
    /// Default: the sim's own (`RDMA_SIM_PROFILE`, else portable); for ibverbs, rxe on
    /// an `rxe*` device and mlx5 on any other.
    #[arg(long, value_name = "portable|rxe|mlx5")]
    profile: Option<conformance::Profile>,
    /// Run the server halves of the `remote` cases in the runner at this address (started
    /// with `--serve`) instead of in this process.
    #[arg(long, value_name = "HOST:PORT", value_parser = conformance::peer::parse_peer)]
    peer: Option<std::net::SocketAddr>,
    /// Print two JSON reports side by side; exit non-zero, saying why per case, unless
    /// they agree: every case in both, passing on both (a documented deviation counts as
    /// a pass), skipped on both or neither, and every skip explained by its device's
    /// recorded capabilities.
    #[arg(long, num_args = 2, value_names = ["A.json", "B.json"])]
    compare: Option<Vec<String>>,
    /// Print any number of JSON reports side by side (e.g. the sim under portable, the
    /// sim under rxe, rxe0), with the observed values that differ, and exit.
    #[arg(long, num_args = 2.., value_name = "REPORT.json", conflicts_with = "compare")]
    side_by_side: Option<Vec<String>>,
    /// With `--compare`: a case one device skips for a capability its recorded
    /// capabilities confirm it lacks, and the other runs, is listed as a gap (a feature
    /// one backend does not implement yet) instead of failing the comparison.
    #[arg(long, requires = "compare")]
    allow_gaps: bool,
    /// Capture each case's traffic (DIR created): on the sim as RoCE v2 packets with the
    /// verbs context, in DIR/<case id>.pcapng (`RDMA_SIM_PCAP_SNAPLEN` says how much of
    /// each packet is kept); on a RoCE device with tcpdump on its netdev (root), the
    /// packets the device sends, in DIR/<case id>.pcap.
    #[arg(long, value_name = "DIR")]
    pcap: Option<std::path::PathBuf>,
    /// With `--backend det`: the seed of the run (every delay, loss and duplicate).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// With `--backend det`: frames lost, in percent.
    #[arg(long, default_value_t = 0)]
    loss: u32,
    /// With `--backend det`: frames duplicated, in percent.
    #[arg(long, default_value_t = 0)]
    dup: u32,
    /// With `--backend det`: frames of several packets the network cuts into their
    /// packets, in percent (each then lost, duplicated and delayed on its own); default:
    /// 50 under loss or duplication, else 0.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=100))]
    split: Option<u32>,
    /// With `--backend det`: how much virtual time, in seconds, a wait may run the world
    /// past the program's last step before it fails naming what is stuck (a requester
    /// retrying for ever).
    #[arg(long, default_value_t = backend_sim_det::DEFAULT_BUDGET.as_secs_f64())]
    budget: f64,
    /// With `--backend det`: a bug planted on purpose (`NoDuplicateCheck`, `NoAtomicReplay`,
    /// `AckOffByOne`, `ResendFromMessageStart`, `RnrOffByOne`) that the cases must catch,
    /// for the mutation check (ci/mutation-det.sh); needs the `planted-bugs` feature.
    #[arg(long, value_name = "NAME")]
    plant: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(file) = &args.render {
        return match load(file) {
            Ok(report) => {
                print!("{}", table(&report.cases));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    if let Some(files) = &args.side_by_side {
        return match files.iter().map(|f| load(f)).collect::<Result<Vec<_>, _>>() {
            Ok(reports) => {
                print!("{}", side_by_side(&reports));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    if let Some(files) = &args.compare {
        return match (load(&files[0]), load(&files[1])) {
            (Ok(a), Ok(b)) => {
                print!("{}", compare(&a, &b));
                let one_sided = if args.allow_gaps {
                    OneSided::Gap
                } else {
                    OneSided::Fail
                };
                let (problems, gaps) = check_with(&a, &b, one_sided);
                if !gaps.is_empty() {
                    println!(
                        "\ncompare: {} case(s) run on one device only, for a capability the other lacks:",
                        gaps.len()
                    );
                    for g in &gaps {
                        println!("- {g}");
                    }
                }
                if problems.is_empty() {
                    let devs = |r: &Report| {
                        r.cases
                            .iter()
                            .filter(|c| c.detail.starts_with("deviation"))
                            .count()
                    };
                    println!(
                        "\ncompare: the reports agree on all {} cases{} ({} with a documented deviation on {}, {} on {})",
                        a.cases.len() - gaps.len(),
                        if gaps.is_empty() { String::new() } else { format!(" run on both ({} gaps)", gaps.len()) },
                        devs(&a),
                        a.label("A"),
                        devs(&b),
                        b.label("B")
                    );
                    ExitCode::SUCCESS
                } else {
                    println!(
                        "\ncompare: the reports do not agree on {} case(s):",
                        problems.len()
                    );
                    for p in &problems {
                        println!("- {p}");
                    }
                    ExitCode::FAILURE
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    if let Some(dir) = &args.pcap {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("error: --pcap {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    }
    if let (Some(p), BackendKind::Sim) = (args.profile, args.backend) {
        // Read by `SimBackend::from_env` below (before any other thread exists).
        std::env::set_var("RDMA_SIM_PROFILE", p.name());
    }
    if let Err(e) = args.plant.as_deref().map_or(Ok(()), |p| plant(p, args.backend)) {
        eprintln!("error: --plant: {e}");
        return ExitCode::from(2);
    }
    if let BackendKind::Det = args.backend {
        return run_det(&args);
    }
    conformance::with_backend!(
        args.backend,
        "cargo run --release -p conformance --features ibverbs -- --backend ibverbs",
        |b| run(b, &args, cases())
    )
}

/// The suite but rdma_cm on a deterministic world of one device (`det0`) in this
/// thread, its device playing `--profile` (default rxe); the seed and the run's trace
/// are printed to stderr (the same seed and cases give the same trace).
fn run_det(args: &Args) -> ExitCode {
    let mut mix = if args.loss == 0 && args.dup == 0 {
        backend_sim_proto::fabric::FaultMix::clean(Duration::from_micros(2))
    } else {
        backend_sim_proto::fabric::FaultMix::lossy(args.loss, args.dup)
    };
    if let Some(pct) = args.split {
        mix.split_ppm = pct * 10_000;
    }
    let budget = match Duration::try_from_secs_f64(args.budget) {
        Ok(b) if !b.is_zero() => b,
        _ => {
            eprintln!(
                "error: --budget {}: must be a positive number of seconds",
                args.budget
            );
            return ExitCode::from(2);
        }
    };
    let profile = args.profile.unwrap_or(conformance::Profile::Rxe);
    let det = backend_sim_det::Det::builder()
        .seed(args.seed)
        .mix(mix)
        .profile(profile.switches())
        .budget(budget)
        .hosts(["det0"])
        .build();
    let code = run(&det, args, verbs_cases());
    eprintln!(
        "det: seed {} (profile {}, loss {}%, dup {}%, split {}%): trace {:#018x}, {:?} of virtual time, {:?}",
        args.seed,
        profile.name(),
        args.loss,
        args.dup,
        mix.split_ppm / 10_000,
        det.trace(),
        det.now(),
        det.stats()
    );
    code
}

fn load(path: &str) -> Result<Report, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    Report::parse(&text).map_err(|e| format!("{path}: {e}"))
}

/// The device's capabilities, for the report (a skip is checked against them).
fn device_caps<B: Backend>(backend: &B, device: &str) -> Option<DeviceCaps> {
    let r = backend
        .open(device)
        .and_then(|ctx| Ok(DeviceCaps::new(&ctx.query_device()?, &ctx.capabilities()?)));
    match r {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("warning: the report will lack the device's capabilities: {e}");
            None
        }
    }
}

fn run<B: Backend>(backend: &B, args: &Args, all: Vec<Case<B>>) -> ExitCode {
    let device = match &args.device {
        Some(d) => d.clone(),
        None => match backend.devices() {
            Ok(d) if !d.is_empty() => d[0].name.clone(),
            Ok(_) => {
                eprintln!("error: the {} backend lists no devices", backend.name());
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let profile = args
        .profile
        .unwrap_or_else(|| conformance::env::default_profile(backend.name(), &device));
    let cfg = Config {
        device: device.clone(),
        gid_index: args.gid_index,
        timeout: Duration::from_secs_f64(args.timeout),
        peer: args.peer,
        profile,
        capture: args.pcap.clone(),
    };
    if let Some(addr) = &args.serve {
        let halves = conformance::cases::remote_halves::<B>();
        return match conformance::peer::serve(backend, &cfg, addr, args.serve_cases, halves) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    if let Some(x) = args
        .except
        .iter()
        .find(|x| !all.iter().any(|c| c.id == x.as_str()))
    {
        eprintln!("error: --except {x}: no case has this id (`--list` lists them)");
        return ExitCode::from(2);
    }
    let selected: Vec<_> = all
        .iter()
        .filter(|c| !args.except.iter().any(|x| c.id == x.as_str()))
        .filter(|c| {
            args.filter.is_empty()
                || args
                    .filter
                    .iter()
                    .any(|f| c.id.contains(f.as_str()) || c.group == f)
        })
        .collect();
    if args.list {
        for c in &selected {
            println!("{:<40} {:<8} {} [{}]", c.id, c.group, c.name, c.source);
        }
        return ExitCode::SUCCESS;
    }
    if selected.is_empty() {
        eprintln!("error: no case matches {:?}", args.filter);
        return ExitCode::from(2);
    }
    let mut reports: Vec<CaseReport> = Vec::new();
    for c in selected {
        if !args.json {
            eprint!("{:<40}\r", c.id);
            let _ = std::io::stderr().flush();
        }
        reports.push(run_case(backend, &cfg, c));
    }
    let rows = json_rows(&reports, backend.name(), &device);
    if args.json {
        let report = Report {
            backend: backend.name().into(),
            device: device.clone(),
            capabilities: device_caps(backend, &device),
            profile: Some(profile.name().into()),
            cases: rows,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("reports serialize")
        );
    } else {
        println!(
            "backend {} device {} gid-index {} profile {}\n",
            backend.name(),
            device,
            args.gid_index,
            profile
        );
        print!("{}", table(&rows));
    }
    if reports.iter().any(|r| r.status == "fail") {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Plants bug `name` in this thread, where the deterministic world runs the cases.
#[cfg(feature = "planted-bugs")]
fn plant(name: &str, backend: BackendKind) -> Result<(), String> {
    use backend_sim_proto::plant::{set, Plant};
    if !matches!(backend, BackendKind::Det) {
        return Err("bugs are planted on the deterministic backend only (--backend det)".into());
    }
    let p =
        Plant::from_name(name).ok_or_else(|| format!("no planted bug {name:?}; one of {:?}", Plant::ALL))?;
    set(Some(p));
    Ok(())
}

#[cfg(not(feature = "planted-bugs"))]
fn plant(_: &str, _: BackendKind) -> Result<(), String> {
    Err("this build has no planted bugs; build with `cargo build --release -p conformance --features planted-bugs`".into())
}
