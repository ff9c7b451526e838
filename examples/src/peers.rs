//! The performance issue's other reference points, measured on this machine: UCX over
//! TCP (`ucx_perftest` of Debian's `ucx-utils`: `tag_lat` and `ucp_fadd`, with
//! `UCX_TLS=tcp UCX_NET_DEVICES=lo`) and libfabric's `tcp` provider (`fi_pingpong` of
//! `libfabric-bin`), each a server and a client process over 127.0.0.1, as
//! `bench/ucx-libfabric.sh` runs them by hand. `perf-compare --only peers` pairs every one
//! of these figures with the sim's, measured right after it.
//!
//! What each figure is: `tag_lat` is the median of half a round trip (as the sim's
//! `send_lat`), `ucp_fadd` the median of one whole fetch-and-add (as `atomic_lat`), and
//! `fi_pingpong`'s "usec/xfer" one way (its mean: it prints no median).

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

/// One reference test, 8-byte messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reference {
    /// UCX `ucx_perftest -t tag_lat`: tag-matched ping-pong, half a round trip.
    UcxTagLat,
    /// UCX `ucx_perftest -t ucp_fadd`: a 64-bit fetch-and-add (software atomics over TCP).
    UcxFetchAdd,
    /// libfabric `fi_pingpong -p tcp -e msg`: one-way time per transfer.
    FabricPingpong,
}

impl Reference {
    /// The program that runs it.
    pub fn program(self) -> &'static str {
        match self {
            Reference::UcxTagLat | Reference::UcxFetchAdd => "ucx_perftest",
            Reference::FabricPingpong => "fi_pingpong",
        }
    }

    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Reference::UcxTagLat => "UCX tag_lat",
            Reference::UcxFetchAdd => "UCX ucp_fadd",
            Reference::FabricPingpong => "libfabric fi_pingpong",
        }
    }

    /// Runs it with `iters` iterations and returns its figure in microseconds (see the
    /// module documentation for what each figure is).
    pub fn measure(self, iters: u64) -> Res<f64> {
        let prog = find_program(self.program())
            .ok_or_else(|| anyhow::anyhow!("{} is not installed ({INSTALL})", self.program()))?;
        let port = free_port()?;
        let port_s = port.to_string();
        let iters_s = iters.to_string();
        let (server_args, client_args): (Vec<&str>, Vec<&str>) = match self {
            Reference::UcxTagLat | Reference::UcxFetchAdd => {
                let t = if self == Reference::UcxTagLat {
                    "tag_lat"
                } else {
                    "ucp_fadd"
                };
                (
                    vec!["-p", &port_s],
                    vec!["127.0.0.1", "-p", &port_s, "-t", t, "-s", "8", "-n", &iters_s],
                )
            }
            Reference::FabricPingpong => (
                vec!["-p", "tcp", "-e", "msg", "-B", &port_s, "-S", "8", "-I", &iters_s],
                vec![
                    "-p",
                    "tcp",
                    "-e",
                    "msg",
                    "-P",
                    &port_s,
                    "-S",
                    "8",
                    "-I",
                    &iters_s,
                    "127.0.0.1",
                ],
            ),
        };
        let cmd = |args: &[&str]| {
            let mut c = Command::new(&prog);
            c.args(args).env("UCX_TLS", "tcp").env("UCX_NET_DEVICES", "lo");
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
            Reference::UcxTagLat | Reference::UcxFetchAdd => parse_ucx(&out),
            Reference::FabricPingpong => parse_fabric(&out, 8),
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

/// The median of `ucx_perftest`'s last line: `Final: <iterations> <p50> <avg> ...`.
fn parse_ucx(lines: &[String]) -> Option<f64> {
    let l = lines.iter().rev().find(|l| l.starts_with("Final:"))?;
    l.split_whitespace().nth(2)?.parse().ok()
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
        assert_eq!(parse_ucx(&out), Some(6.475));
        assert_eq!(parse_ucx(&lines("no result")), None);
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
