//! `rdma-sim`: runs any libibverbs program on the simulated HCA, as `faketime` or
//! `torsocks` run a program under theirs: it puts the sim's libibverbs
//! (`libibverbs_sim.so`) first in the program's `LD_PRELOAD`, sets the sim's settings from
//! its options, and `exec`s the program, so the program's exit status and signals are its
//! own. `rdma-sim env` prints the same settings for a shell; `rdma-sim status` lists the
//! sim devices live on this host; `rdma-sim trace` shows a RoCE v2 capture as ladders.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod library;
mod program;
mod status;
mod trace;

const ABOUT: &str = "Run RDMA (libibverbs) programs on a simulated HCA: no RDMA hardware, no kernel module";

const LONG_ABOUT: &str = "\
Run RDMA (libibverbs) programs on a simulated HCA: no RDMA hardware, no kernel module, no root.

rdma-sim runs PROGRAM with libibverbs_sim.so preloaded (LD_PRELOAD), a libibverbs that
serves every verb from a simulated HCA in the program's own process. Two programs under
rdma-sim talk to each other over TCP (loopback by default) as over a fabric: RC, UC and UD
QPs, SRQs, RDMA WRITE/READ, atomics, RNR NAKs and retries, access checks on every rkey,
completion channels and async events behave as on an HCA. Unmodified binaries work:
ibverbs-utils, perftest, qperf, UCX (ucx_perftest, Open MPI's pml ucx), your own.

The devices are sim0, sim1, ... (one by default under rdma-sim). A device's port LID is
its TCP port and GID index 0/1 name its IP, so the usual out-of-band exchange of
LID/GID, QPN and PSN is all a peer needs; across hosts, listen on 0.0.0.0 and use GIDs
(-g 0). With --profile rxe the port is RoCE v2 (Ethernet, LID 0, GIDs only), as on rxe0.

Options set the environment variables in brackets; variables already set are kept
where no option is given. Not served: programs that dlopen libibverbs and look symbols
up on that handle, static binaries, and set-user-ID programs (the loader ignores
LD_PRELOAD for them). librdmacm programs (rping, perftest -R, rsockets, libfabric's
verbs provider) run too: the sim serves /dev/infiniband/rdma_cm.";

const EXAMPLES: &str = "\
Examples:
  rdma-sim ibv_devinfo -v
  rdma-sim -- ib_write_bw &  rdma-sim -- ib_write_bw 127.0.0.1      server, then client
  rdma-sim -- ibv_rc_pingpong -g 0 &  rdma-sim -- ibv_rc_pingpong -g 0 127.0.0.1
  rdma-sim --profile rxe -- ucx_perftest -t tag_lat &  rdma-sim --profile rxe -- ucx_perftest 127.0.0.1 -t tag_lat
  rdma-sim --log backend_sim=debug -- ./my_program                  why a verb failed
  eval \"$(rdma-sim env)\"; ib_send_lat                               this shell's programs on the sim
  rdma-sim status                                                   devices and QPs of running programs
  rdma-sim --pcap run-%p.pcapng -- ib_send_bw                      its packets, for Wireshark
  rdma-sim trace roce.pcap --svg roce.svg                           a RoCE v2 capture as ladders

  rdma-sim port sim0 down; sleep 1; rdma-sim port sim0 up           a port fault (PORT_ERR, then PORT_ACTIVE)
  rdma-sim port sim0 addr                                           a new LID or GID (LID_CHANGE / GID_CHANGE)";

/// The command line.
#[derive(Parser, Debug)]
#[command(
    name = "rdma-sim",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = EXAMPLES,
    override_usage = "rdma-sim [OPTIONS] [--] PROGRAM [ARGS]...\n       rdma-sim [OPTIONS] env\n       rdma-sim status [--json]\n       rdma-sim port DEVICE down|up|addr [--pid PID]\n       rdma-sim trace FILE [--svg OUT]\n       rdma-sim lib"
)]
struct Cli {
    #[command(flatten)]
    settings: Settings,
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// The program to run, and its arguments (`--` first if the program is named env,
    /// status or lib, or its name starts with `-`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM [ARGS]"
    )]
    program: Vec<OsString>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the settings as `export` lines: `eval "$(rdma-sim env)"` puts this shell's
    /// programs on the sim. With arguments it runs env(1), as any program:
    /// `rdma-sim env UCX_TLS=rc_v ucx_perftest`.
    Env {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<OsString>,
    },
    /// List the sim devices live on this host (every program of this user), with their
    /// QPs, states, peers and counters, as `rdma resource show qp` does.
    Status {
        /// One JSON array instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Take the port of a live sim device down, or bring it back, as a cable pulled and
    /// plugged in again: its programs get IBV_EVENT_PORT_ERR / IBV_EVENT_PORT_ACTIVE, and
    /// what they send meanwhile is lost (RC retries per retry_cnt) or, under the rxe
    /// profile, fails.
    Port {
        /// The device (sim0, ...): that device of every program of this user, unless
        /// --pid names one.
        device: String,
        /// down, up, or addr (a new LID on an InfiniBand port, a GID added to a RoCE
        /// port: LID_CHANGE / GID_CHANGE).
        #[arg(value_parser = ["down", "up", "addr"])]
        state: String,
        /// Only the device of this process.
        #[arg(long)]
        pid: Option<u32>,
    },
    /// Print the path of the libibverbs_sim.so that rdma-sim preloads.
    Lib,
    /// Show a capture of RoCE v2 traffic (pcapng or pcap, e.g. `tcpdump -i eth0 -w
    /// FILE udp port 4791` on a Soft-RoCE or RoCE host) as a ladder per connection:
    /// requests, ACKs, NAKs with their kind and RNR timer, resent PSNs, ICRC mismatches.
    Trace(trace::TraceArgs),
}

/// The sim's settings, as options.
#[derive(Args, Debug, Default)]
struct Settings {
    /// The HCA the devices play: portable (default; the strictest of rxe and ConnectX),
    /// rxe (Soft-RoCE of Linux 6.1: RoCE v2, Ethernet port) or mlx5 (a ConnectX-5)
    /// [RDMA_SIM_PROFILE]
    #[arg(short, long, value_name = "PROFILE", value_parser = ["portable", "rxe", "mlx5"])]
    profile: Option<String>,
    /// How many devices (sim0, sim1, ...) the program sees; 1 unless set
    /// [RDMA_SIM_DEVICES]
    #[arg(short = 'n', long, value_name = "N")]
    devices: Option<u32>,
    /// IP or IP:PORT the devices listen on: 127.0.0.1 by default; 0.0.0.0 to be reached
    /// from other hosts; with a PORT, device i listens on PORT+i [RDMA_SIM_LISTEN]
    #[arg(short, long, value_name = "ADDR")]
    listen: Option<String>,
    /// With a wildcard --listen: the IP the devices advertise in their GIDs, where peers
    /// connect [RDMA_SIM_ADVERTISE]
    #[arg(long, value_name = "IP")]
    advertise: Option<IpAddr>,
    /// The sim's log filter, e.g. debug or backend_sim=debug (warnings only by default)
    /// [RUST_LOG]
    #[arg(long, value_name = "FILTER")]
    log: Option<String>,
    /// Where devices put their status sockets for `rdma-sim status`, or off
    /// [RDMA_SIM_CONTROL]
    #[arg(long, value_name = "DIR")]
    control: Option<OsString>,
    /// Write the packets the program's devices send, as RoCE v2, and the verbs context
    /// (pcapng; %p becomes the process id), for Wireshark or `rdma-sim trace`
    /// [RDMA_SIM_PCAP]
    #[arg(long, value_name = "FILE")]
    pcap: Option<OsString>,
    /// Seed the devices' arbitrary choices (QP numbers, MR and window keys, LIDs,
    /// loopback IPs), decimal or 0x hex, so that a run repeats them [RDMA_SIM_SEED]
    #[arg(long, value_name = "N", value_parser = seed)]
    seed: Option<u64>,
    /// How much of each captured packet to keep: headers (the default), a number of
    /// bytes, or all (payload and ICRC) [RDMA_SIM_PCAP_SNAPLEN]
    #[arg(long, value_name = "N|all|headers")]
    snaplen: Option<String>,
    /// The libibverbs_sim.so to preload, instead of the one beside rdma-sim or carried in
    /// it [RDMA_SIM_LIB]
    #[arg(long, value_name = "PATH")]
    lib: Option<PathBuf>,
}

impl Settings {
    /// The variables to set, in order: the settings given, then the defaults rdma-sim
    /// adds where the environment has none.
    fn variables(&self, lib: &std::path::Path) -> Vec<(&'static str, OsString)> {
        let mut v: Vec<(&'static str, OsString)> = Vec::new();
        let mut set = |k: &'static str, val: Option<OsString>| {
            if let Some(val) = val {
                v.push((k, val));
            }
        };
        set("RDMA_SIM_PROFILE", self.profile.clone().map(Into::into));
        let devices = self
            .devices
            .map(|n| n.to_string().into())
            .or_else(|| std::env::var_os("RDMA_SIM_DEVICES").is_none().then(|| "1".into()));
        set("RDMA_SIM_DEVICES", devices);
        set("RDMA_SIM_LISTEN", self.listen.clone().map(Into::into));
        set(
            "RDMA_SIM_ADVERTISE",
            self.advertise.map(|ip| ip.to_string().into()),
        );
        set("RUST_LOG", self.log.clone().map(Into::into));
        set("RDMA_SIM_CONTROL", self.control.clone());
        set("RDMA_SIM_PCAP", self.pcap.clone());
        set("RDMA_SIM_SEED", self.seed.map(|s| s.to_string().into()));
        set("RDMA_SIM_PCAP_SNAPLEN", self.snaplen.clone().map(Into::into));
        set("LD_PRELOAD", Some(library::preload_with(lib)));
        v
    }
}

/// `--seed` as [`backend_sim::choices::parse_seed`] reads it.
fn seed(v: &str) -> Result<u64, String> {
    backend_sim::choices::parse_seed(v).ok_or_else(|| format!("{v:?} is not a number (decimal or 0x hex)"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rdma-sim: {e:#}");
            ExitCode::from(125)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    enum Then {
        Exec(Vec<OsString>),
        PrintEnv,
        PrintLib,
    }
    let then = match cli.cmd {
        Some(Cmd::Status { json }) => return status::print(json),
        Some(Cmd::Trace(args)) => return trace::run(&args).map(|()| ExitCode::SUCCESS),
        Some(Cmd::Port { device, state, pid }) => {
            let request = match state.as_str() {
                "down" => backend_sim::control::PortRequest::Down,
                "up" => backend_sim::control::PortRequest::Up,
                _ => backend_sim::control::PortRequest::Address,
            };
            return status::set_port(&device, pid, request);
        }
        Some(Cmd::Env { args }) if args.is_empty() => Then::PrintEnv,
        Some(Cmd::Env { args }) => Then::Exec(std::iter::once("env".into()).chain(args).collect()),
        Some(Cmd::Lib) => Then::PrintLib,
        None if !cli.program.is_empty() => Then::Exec(cli.program),
        None => {
            use clap::CommandFactory;
            Cli::command().print_help()?;
            return Ok(ExitCode::from(2));
        }
    };
    let lib = library::find(cli.settings.lib.as_deref())?;
    if let Then::PrintLib = then {
        println!("{}", lib.display());
        return Ok(ExitCode::SUCCESS);
    }
    let vars = cli.settings.variables(&lib);
    for (k, v) in &vars {
        // rdma-sim is single-threaded: the variables are for the program it execs, and
        // for the check below.
        std::env::set_var(k, v);
    }
    // The library would refuse a bad setting at the program's first verb, far from here.
    backend_sim::SimBackend::from_env().map_err(|e| anyhow::anyhow!("{e}"))?;
    match then {
        Then::Exec(argv) => Ok(program::exec(&argv)),
        _ => {
            for (k, v) in &vars {
                println!("export {k}={}", program::shell_quote(v));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
