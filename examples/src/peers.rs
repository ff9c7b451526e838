//! The other reference points of the performance issues, measured on this machine, each
//! a server and a client process on this host, as `bench/ucx-libfabric.sh` runs them by
//! hand:
//!
//! - over TCP loopback: UCX (`ucx_perftest` of Debian's `ucx-utils`, `UCX_TLS=tcp
//!   UCX_NET_DEVICES=lo`: `tag_lat` and `ucp_fadd`) and libfabric's `tcp` provider
//!   (`fi_pingpong -p tcp -e msg` of `libfabric-bin`), against the sim over TCP;
//! - over shared memory: UCX's `posix` transport for messages and atomics and `cma`
//!   (`process_vm_readv`/`writev`) for one-sided transfers (`UCX_TLS=posix,cma,self`:
//!   `tag_lat`, `ucp_fadd`, `ucp_put_bw` and `ucp_get` of 1 MiB) and libfabric's `shm`
//!   provider (`fi_pingpong -p shm -e rdm`), against the sim's same-host path.
//!
//! `perf-compare --only peers` and `--only same-host` pair each of these figures with the
//! sim's, measured right after it.
//!
//! What each figure is: `tag_lat` is the median of half a round trip (as the sim's
//! `send_lat`), `ucp_fadd` the median of one whole fetch-and-add (as `atomic_lat`),
//! `ucp_put_bw` and `ucp_get` the bandwidth over the whole run in MB/s of 2^20 bytes (as
//! `perf`'s), and `fi_pingpong`'s "usec/xfer" one way (its mean: it prints no median).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::child::{ChildProc, Echo};
use anyhow::Context as _;

use crate::Res;

/// How long one reference run may take (100 000 round trips take 1-2 s here).
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a reference server may take to listen.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);

/// The size of the bandwidth references' messages.
pub const BW_SIZE: u64 = 1 << 20;

/// The UCX transports of the same-host references.
const UCX_SHM_TLS: &str = "posix,cma,self";

/// One reference test (8-byte messages, [`BW_SIZE`] for the bandwidth ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reference {
    /// UCX `ucx_perftest -t tag_lat` over TCP: tag-matched ping-pong, half a round trip.
    UcxTagLat,
    /// UCX `ucx_perftest -t ucp_fadd` over TCP: a 64-bit fetch-and-add (software atomics).
    UcxFetchAdd,
    /// libfabric `fi_pingpong -p tcp -e msg`: one-way time per transfer.
    FabricPingpong,
    /// UCX `tag_lat` over shared memory (`posix`).
    UcxTagLatShm,
    /// UCX `ucp_fadd` over shared memory (CPU atomics on the mapped memory).
    UcxFetchAddShm,
    /// UCX `ucp_put_bw` of 1 MiB over shared memory and `cma`.
    UcxPutBwShm,
    /// UCX `ucp_get` of 1 MiB over shared memory and `cma`.
    UcxGetShm,
    /// libfabric `fi_pingpong -p shm -e rdm`: one-way time per transfer.
    FabricPingpongShm,
}

impl Reference {
    /// The program that runs it.
    pub fn program(self) -> &'static str {
        match self {
            Reference::FabricPingpong | Reference::FabricPingpongShm => "fi_pingpong",
            _ => "ucx_perftest",
        }
    }

    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Reference::UcxTagLat => "UCX tag_lat",
            Reference::UcxFetchAdd => "UCX ucp_fadd",
            Reference::FabricPingpong => "libfabric fi_pingpong",
            Reference::UcxTagLatShm => "UCX tag_lat posix",
            Reference::UcxFetchAddShm => "UCX ucp_fadd posix",
            Reference::UcxPutBwShm => "UCX ucp_put_bw posix/cma",
            Reference::UcxGetShm => "UCX ucp_get posix/cma",
            Reference::FabricPingpongShm => "libfabric fi_pingpong shm",
        }
    }

    /// Whether its figure is a bandwidth (MB/s) rather than a time (us).
    pub fn is_bandwidth(self) -> bool {
        matches!(self, Reference::UcxPutBwShm | Reference::UcxGetShm)
    }

    /// `ucx_perftest`'s test name and message size.
    fn ucx_test(self) -> (&'static str, u64) {
        match self {
            Reference::UcxTagLat | Reference::UcxTagLatShm => ("tag_lat", 8),
            Reference::UcxFetchAdd | Reference::UcxFetchAddShm => ("ucp_fadd", 8),
            Reference::UcxPutBwShm => ("ucp_put_bw", BW_SIZE),
            _ => ("ucp_get", BW_SIZE),
        }
    }

    /// The UCX transports it runs over.
    fn ucx_tls(self) -> &'static str {
        match self {
            Reference::UcxTagLat | Reference::UcxFetchAdd => "tcp",
            _ => UCX_SHM_TLS,
        }
    }

    /// The server's and the client's arguments, with the out-of-band port and the
    /// iterations.
    fn args(self, port: &str, iters: &str) -> (Vec<String>, Vec<String>) {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        match self {
            Reference::FabricPingpong | Reference::FabricPingpongShm => {
                let (prov, ep) = match self {
                    Reference::FabricPingpong => ("tcp", "msg"),
                    _ => ("shm", "rdm"),
                };
                (
                    own(&["-p", prov, "-e", ep, "-B", port, "-S", "8", "-I", iters]),
                    own(&[
                        "-p",
                        prov,
                        "-e",
                        ep,
                        "-P",
                        port,
                        "-S",
                        "8",
                        "-I",
                        iters,
                        "127.0.0.1",
                    ]),
                )
            }
            _ => {
                let (t, size) = self.ucx_test();
                let size = size.to_string();
                (
                    own(&["-p", port]),
                    own(&["127.0.0.1", "-p", port, "-t", t, "-s", &size, "-n", iters]),
                )
            }
        }
    }

    /// Runs it with `iters` iterations and returns its figure: microseconds, or MB/s for
    /// a bandwidth (see the module documentation for what each figure is).
    pub fn measure(self, iters: u64) -> Res<f64> {
        let prog = find_program(self.program())
            .ok_or_else(|| anyhow::anyhow!("{} is not installed ({INSTALL})", self.program()))?;
        let port = free_port()?;
        let (server_args, client_args) = self.args(&port.to_string(), &iters.to_string());
        let cmd = |args: &[String]| {
            let mut c = Command::new(&prog);
            c.args(args).env("UCX_TLS", self.ucx_tls());
            if self.ucx_tls() == "tcp" {
                c.env("UCX_NET_DEVICES", "lo");
            }
            c
        };
        let mut server = ChildProc::spawn_program(
            &format!("{} server", self.program()),
            &mut cmd(&server_args),
            Echo::Quiet,
        )?;
        let deadline = Instant::now() + LISTEN_TIMEOUT;
        while !listening(port) {
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "{} server did not listen on port {port} within {:.0} s",
                    self.program(),
                    LISTEN_TIMEOUT.as_secs_f64()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut client = ChildProc::spawn_program(
            &format!("{} client", self.program()),
            &mut cmd(&client_args),
            Echo::Quiet,
        )?;
        client.wait_success(RUN_TIMEOUT)?;
        server.wait(Duration::from_secs(10))?;
        let out = client.output();
        let figure = match self {
            Reference::FabricPingpong | Reference::FabricPingpongShm => parse_fabric(&out, 8),
            r if r.is_bandwidth() => parse_ucx(&out, UCX_BW_OVERALL),
            _ => parse_ucx(&out, UCX_LAT_TYPICAL),
        };
        figure.ok_or_else(|| {
            anyhow::anyhow!(
                "{} printed no result; its output:\n{}",
                self.name(),
                out.join("\n")
            )
        })
    }
}

/// How to install the reference programs.
pub const INSTALL: &str = "apt-get install ucx-utils libfabric-bin";

/// The reference programs not found on `PATH`.
pub fn missing() -> Vec<&'static str> {
    ["ucx_perftest", "fi_pingpong"]
        .into_iter()
        .filter(|p| find_program(p).is_none())
        .collect()
}

fn find_program(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A port nobody listens on right now (the kernel's pick for a socket bound to port 0).
fn free_port() -> Res<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// Whether some socket listens on TCP `port` (`/proc/net/tcp` and `tcp6`; asking by
/// connecting would take the reference server's one connection).
fn listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .map(|t| listens_in(&t, port))
            .unwrap_or(false)
    })
}

/// Whether a `/proc/net/tcp`-format table has a LISTEN (state `0A`) socket on `port`.
fn listens_in(table: &str, port: u16) -> bool {
    let want = format!("{port:04X}");
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[3] == "0A" && f[1].rsplit(':').next() == Some(want.as_str())
    })
}

/// Columns of `ucx_perftest`'s `Final:` line (`Final: <iterations> <typical latency>
/// <average latency> <overall latency> <average bandwidth> <overall bandwidth> ...`):
/// the typical (median) latency, in us.
const UCX_LAT_TYPICAL: usize = 2;
/// The bandwidth over the whole run, in MB/s (2^20 bytes).
const UCX_BW_OVERALL: usize = 6;

/// Column `col` of `ucx_perftest`'s last line.
fn parse_ucx(lines: &[String], col: usize) -> Option<f64> {
    let l = lines.iter().rev().find(|l| l.starts_with("Final:"))?;
    l.split_whitespace().nth(col)?.parse().ok()
}

/// `fi_pingpong`'s "usec/xfer" column (the seventh) of the row whose first column is `size`.
fn parse_fabric(lines: &[String], size: u64) -> Option<f64> {
    let size = size.to_string();
    lines.iter().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.first() == Some(&size.as_str()) && f.len() >= 7 {
            f[6].parse().ok()
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(t: &str) -> Vec<String> {
        t.lines().map(str::to_string).collect()
    }

    #[test]
    fn ucx_final_line_gives_the_median() {
        let out = lines(
            "[thread 0]             72103      6.530     6.935     6.935        1.10       1.10      144204      144204\n\
             Final:                100000      6.475     6.910     6.928        1.10       1.10      144712      144345",
        );
        assert_eq!(parse_ucx(&out, UCX_LAT_TYPICAL), Some(6.475));
        assert_eq!(parse_ucx(&lines("no result"), UCX_LAT_TYPICAL), None);
    }

    #[test]
    fn ucx_final_line_gives_the_overall_bandwidth() {
        let out = lines(
            "Final:                  2000     21.711    83.641    83.641    11955.92   11950.15       11956       11950",
        );
        assert_eq!(parse_ucx(&out, UCX_BW_OVERALL), Some(11950.15));
    }

    #[test]
    fn fabric_row_of_the_size_gives_usec_per_xfer() {
        let out = lines(
            "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
             8       100k    =100k    1.5m        1.63s      0.98       8.16       0.12",
        );
        assert_eq!(parse_fabric(&out, 8), Some(8.16));
        assert_eq!(parse_fabric(&out, 64), None);
    }

    #[test]
    fn a_listening_socket_is_found_by_port_and_state() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000:7A69 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n\
   1: 0100007F:7A6A 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2\n";
        assert!(listens_in(table, 0x7A69));
        assert!(
            !listens_in(table, 0x7A6A),
            "an established socket is not a listener"
        );
        assert!(!listens_in(table, 80));
    }

    #[test]
    fn this_process_listening_is_seen() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(listening(l.local_addr().unwrap().port()));
    }
}
