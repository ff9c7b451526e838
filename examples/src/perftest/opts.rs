//! perf's command line: perftest's flags ([`PerfCli`]), its tests ([`Test`],
//! [`AtomicType`]) and connection types ([`Connection`]).

use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};

use verbs_api::QpType;

use crate::cli::CommonArgs;

/// perftest-style RDMA latency and bandwidth tests.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "perf",
    version,
    after_help = "Examples:\n  perf write_bw -s 1048576          (starts its own server on loopback)\n  perf send_lat -a -n 200\n  perf send_bw -c UD -s 64\n  perf send_bw --use_srq\n  perf read_lat --json\n  perf write_bw --server -p 18515   /   perf write_bw HOST -p 18515"
)]
pub struct PerfCli {
    /// The test.
    #[arg(value_enum)]
    pub test: Test,
    /// Server to connect to (host or host:port). Without it (and without --server), a
    /// server is started as a child process on loopback.
    pub address: Option<String>,
    /// Run as the server: wait for one client on -p (perftest's role without an address).
    #[arg(long)]
    pub server: bool,
    /// IP the server binds (with --server; loopback by default, 0.0.0.0 accepts other
    /// hosts).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: String,
    /// Connection-setup TCP port.
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Message size in bytes (default: 2 for latency, 65536 for bandwidth; atomics: 8).
    #[arg(short = 's', long)]
    pub size: Option<u64>,
    /// Iterations per size (default: 1000 latency / 5000 bandwidth, fewer for big sizes).
    #[arg(short = 'n', long)]
    pub iters: Option<u64>,
    /// Run all sizes from 2 B to 8 MiB (powers of two).
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Send-queue depth: work requests outstanding (default 128 for bandwidth, 1 for latency).
    #[arg(short = 't', long)]
    pub tx_depth: Option<u32>,
    /// Receive-queue depth for the send tests.
    #[arg(short = 'r', long, default_value_t = 512)]
    pub rx_depth: u32,
    /// Largest message sent inline (default 220 for latency, 0 for bandwidth; capped by
    /// the device).
    #[arg(short = 'I', long)]
    pub inline_size: Option<u32>,
    /// Atomic operation of atomic_lat / atomic_bw.
    #[arg(short = 'A', long, value_enum, default_value = "FETCH_AND_ADD")]
    pub atomic_type: AtomicType,
    /// Accepted for perftest compatibility and ignored (perf warns about no CPU
    /// frequency: times come from the monotonic clock, or with --perftest from the cycle
    /// counter at the rate perftest would use).
    #[arg(short = 'F', long)]
    pub cpu_freq: bool,
    /// Local ACK timeout of the QP (perftest's `-u`): 4.096 us x 2^u before a request
    /// without an answer is resent (default 14, about 67 ms).
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31))]
    pub qp_timeout: u8,
    /// CQ moderation of the bandwidth tests: signal every Q-th WR (default: half the TX
    /// depth; with --perftest, perftest's 100, or 1 above 8 KiB).
    #[arg(short = 'Q', long)]
    pub cq_mod: Option<u32>,
    /// Measure exactly as perftest does, for side-by-side runs with `ib_*_lat` /
    /// `ib_*_bw` on the same device: busy polling, one post per WR, stamps from the CPU's
    /// cycle counter, perftest's statistics and its defaults (inline size, CQ
    /// moderation, iterations). Both ends need it. Meant for devices that progress on
    /// their own (an HCA, rxe); the default loops suit the sim on few CPUs better.
    #[arg(long)]
    pub perftest: bool,
    /// Connection type (perftest's `-c`): RC, UC (SEND and WRITE tests; no
    /// retransmission: a SEND that finds no receive is dropped) or UD (SEND tests;
    /// datagrams of at most one MTU). Both ends need the same.
    #[arg(short = 'c', long = "connection", value_enum, default_value = "RC")]
    pub connection: Connection,
    /// Receives from a shared receive queue (SEND tests; perftest's `--use_srq`). Both
    /// ends need it.
    #[arg(long = "use_srq")]
    pub use_srq: bool,
    /// Reach the peer's memory through a type 2 memory window instead of its region's
    /// rkey (READ, WRITE and atomic tests over RC), and after the rows report how fast
    /// the client binds a type 2 window through its send queue. Both ends need it.
    #[arg(long)]
    pub mw: bool,
    /// One JSON object per size on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// A perftest test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Test {
    /// SEND ping-pong latency (ib_send_lat).
    SendLat,
    /// RDMA WRITE ping-pong latency (ib_write_lat).
    WriteLat,
    /// RDMA READ latency (ib_read_lat).
    ReadLat,
    /// Atomic latency (ib_atomic_lat).
    AtomicLat,
    /// SEND bandwidth (ib_send_bw).
    SendBw,
    /// RDMA WRITE bandwidth (ib_write_bw).
    WriteBw,
    /// RDMA READ bandwidth (ib_read_bw).
    ReadBw,
    /// Atomic bandwidth (ib_atomic_bw).
    AtomicBw,
}

impl Test {
    /// Its name on the command line (`send_lat`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Test::SendLat => "send_lat",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::AtomicLat => "atomic_lat",
            Test::SendBw => "send_bw",
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::AtomicBw => "atomic_bw",
        }
    }
    /// Whether it measures latency (else bandwidth).
    pub fn is_lat(self) -> bool {
        matches!(
            self,
            Test::SendLat | Test::WriteLat | Test::ReadLat | Test::AtomicLat
        )
    }
    /// Whether it runs atomics.
    pub fn is_atomic(self) -> bool {
        matches!(self, Test::AtomicLat | Test::AtomicBw)
    }
    /// Whether it runs SENDs (and needs receives posted).
    pub fn is_send(self) -> bool {
        matches!(self, Test::SendLat | Test::SendBw)
    }
    /// The title of its table, as perftest prints it.
    pub fn title(self, atomic: AtomicType) -> String {
        let verb = match self {
            Test::SendLat | Test::SendBw => "Send".to_string(),
            Test::WriteLat | Test::WriteBw => "RDMA_Write".to_string(),
            Test::ReadLat | Test::ReadBw => "RDMA_Read".to_string(),
            Test::AtomicLat | Test::AtomicBw => format!("Atomic {}", atomic.name()),
        };
        format!("{verb} {} Test", if self.is_lat() { "Latency" } else { "BW" })
    }
}

/// perftest's connection types (`-c`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum Connection {
    /// Reliable connected.
    #[default]
    #[value(name = "RC")]
    Rc,
    /// Unreliable connected.
    #[value(name = "UC")]
    Uc,
    /// Unreliable datagram.
    #[value(name = "UD")]
    Ud,
}

impl Connection {
    /// The QP type.
    pub fn qp_type(self) -> QpType {
        match self {
            Connection::Rc => QpType::Rc,
            Connection::Uc => QpType::Uc,
            Connection::Ud => QpType::Ud,
        }
    }

    /// Its name on the command line and in the header.
    pub fn name(self) -> &'static str {
        crate::transport::type_name(self.qp_type())
    }

    /// Whether a message may be dropped (nothing is retransmitted).
    pub fn unreliable(self) -> bool {
        self != Connection::Rc
    }

    /// Why `test` cannot run over this connection type, if it cannot (perftest allows
    /// UC for SEND and WRITE, UD for SEND).
    pub fn refuses(self, test: Test) -> Option<String> {
        match self {
            Connection::Rc => None,
            Connection::Uc if matches!(test, Test::ReadLat | Test::ReadBw) || test.is_atomic() => {
                Some(format!(
                    "{} over UC: UC has no RDMA READ and no atomics (SEND and WRITE tests only)",
                    test.name()
                ))
            }
            Connection::Ud if !test.is_send() => Some(format!(
                "{} over UD: UD has SEND only (send_lat and send_bw)",
                test.name()
            )),
            _ => None,
        }
    }
}

/// The atomic operation of the atomic tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum AtomicType {
    /// IBV_WR_ATOMIC_CMP_AND_SWP.
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
    /// IBV_WR_ATOMIC_FETCH_AND_ADD.
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
}

impl AtomicType {
    /// Its name on the command line and in the title.
    pub fn name(self) -> &'static str {
        match self {
            AtomicType::CmpAndSwap => "CMP_AND_SWAP",
            AtomicType::FetchAndAdd => "FETCH_AND_ADD",
        }
    }
}
