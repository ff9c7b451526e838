//! What a perf run measures ([`Cfg`]: the test, its sizes and iterations, the queue
//! depths), which the client sends the server as connection private data, and the
//! server's answer ([`Ready`]).

use anyhow::bail;
use serde::{Deserialize, Serialize};

use verbs_api::{Capabilities, RcParams};

use super::opts::{AtomicType, Connection, PerfCli, Test};
use crate::transport::GRH;
use crate::Res;

/// The run's parameters, sent by the client to the server as connection private data.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cfg {
    /// The test.
    pub test: Test,
    /// (size, iterations) per row.
    pub rows: Vec<(u64, u64)>,
    /// Send WRs outstanding (`-t`).
    pub tx_depth: u32,
    /// Receives posted for the send tests (`-r`).
    pub rx_depth: u32,
    /// Largest message sent inline (`-I`).
    pub inline: u32,
    /// The atomic operation (`-A`).
    pub atomic: AtomicType,
    /// Measure with perftest's loops, clock and defaults (`--perftest`).
    #[serde(default)]
    pub perftest: bool,
    /// CQ moderation asked for (`-Q`): every how many WRs a bandwidth test signals.
    #[serde(default)]
    pub cq_mod: Option<u32>,
    /// The connection type (`-c`).
    #[serde(default)]
    pub connection: Connection,
    /// Receives from a shared receive queue (`--use_srq`).
    #[serde(default)]
    pub use_srq: bool,
    /// The one-sided tests go through memory windows (`--mw`).
    #[serde(default)]
    pub mw: bool,
}

/// What the server answers on the side channel once it is ready.
#[derive(Serialize, Deserialize, Debug)]
pub enum Ready {
    /// Ready: the server's memory region, for the one-sided tests.
    Ok {
        /// Its address.
        addr: u64,
        /// Its rkey.
        rkey: u32,
        /// Its length.
        len: u64,
    },
    /// The server refuses the run, saying why.
    Err(String),
}

/// The size of a page (`sysconf(_SC_PAGESIZE)`; 4096 if it does not say).
fn page_size() -> usize {
    // SAFETY: `sysconf` reads a constant of the system; no memory is passed.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

impl Cfg {
    /// The largest message.
    pub fn max_size(&self) -> u64 {
        self.rows.iter().map(|r| r.0).max().unwrap_or(8).max(8)
    }

    /// The size of each of a side's two areas (receive, send): the largest message (on
    /// UD with the 40-byte GRH in front of it), and under `--perftest` at least a page,
    /// as perftest's buffers are (`cycle_buffer`), so that the byte a peer writes and the
    /// byte this side writes are pages apart.
    pub fn area_size(&self) -> usize {
        let grh = if self.connection == Connection::Ud { GRH } else { 0 };
        let max = self.max_size() as usize + grh;
        if self.perftest {
            max.next_multiple_of(4096)
        } else {
            max
        }
    }

    /// The size of a side's region: its two areas, rounded up to whole pages, as
    /// perftest's `memalign(page_size, ..)` buffers are, so that a backend that treats
    /// whole pages specially (the sim's map mode, `RDMA_SIM_ONESIDED=map`, moves a
    /// page-aligned region's pages into shared memory) takes the region.
    pub fn region_size(&self) -> usize {
        (2 * self.area_size()).next_multiple_of(page_size())
    }

    /// The run `cli` asks for: sizes and iterations, perftest's defaults.
    pub fn from_cli(cli: &PerfCli) -> Res<Cfg> {
        let t = cli.test;
        let sizes: Vec<u64> = if t.is_atomic() {
            if cli.size.is_some_and(|s| s != 8) {
                eprintln!("perf: atomics are 8 bytes; ignoring -s");
            }
            vec![8]
        } else if cli.all {
            (1..=23).map(|e| 1u64 << e).collect()
        } else {
            vec![cli.size.unwrap_or(if t.is_lat() { 2 } else { 65536 })]
        };
        if sizes.iter().any(|&s| s == 0 || s > (1 << 30)) {
            bail!("-s must be between 1 and 1 GiB");
        }
        let rows = sizes
            .into_iter()
            .map(|s| {
                let base = if t.is_lat() { 1000 } else { 5000 };
                let n = match cli.iters {
                    Some(n) => n.max(if cli.perftest { 5 } else { 1 }),
                    None if cli.perftest => base,
                    None => base.min(((512u64 << 20) / s).max(16)),
                };
                (s, n)
            })
            .collect();
        if let Some(why) = cli.connection.refuses(t) {
            bail!("{why}");
        }
        if cli.mw && (t.is_send() || cli.connection != Connection::Rc) {
            bail!("--mw is for the READ, WRITE and atomic tests over RC: the others reach no remote memory");
        }
        if cli.use_srq && !t.is_send() {
            bail!("--use_srq is for the SEND tests (send_lat, send_bw): the others post no receives");
        }
        let tx_depth = cli.tx_depth.unwrap_or(if t.is_lat() { 1 } else { 128 }).max(1);
        Ok(Cfg {
            test: t,
            rows,
            tx_depth,
            rx_depth: cli.rx_depth.max(2),
            inline: cli.inline_size.unwrap_or(if t.is_lat() { 220 } else { 0 }),
            atomic: cli.atomic_type,
            perftest: cli.perftest,
            cq_mod: cli.cq_mod,
            connection: cli.connection,
            use_srq: cli.use_srq,
            mw: cli.mw,
        })
    }

    /// On UD, no message is larger than `mtu` (a datagram is one packet): sizes above it
    /// are left out of an `-a` run, and a single size is lowered to it, as perftest does
    /// ("Max msg size in UD is MTU"); says so on stderr. Nothing changes on RC and UC.
    pub fn limit_to_mtu(&mut self, mtu: u64) {
        if self.connection != Connection::Ud || self.rows.iter().all(|r| r.0 <= mtu) {
            return;
        }
        if self.rows.len() > 1 {
            self.rows.retain(|r| r.0 <= mtu);
            eprintln!("perf: UD messages are at most the MTU ({mtu} B): larger sizes are left out");
        } else if let Some(r) = self.rows.first_mut() {
            eprintln!(
                "perf: UD messages are at most the MTU: -s {} lowered to {mtu}",
                r.0
            );
            r.0 = mtu;
        }
    }

    /// Whether this is a SEND bandwidth run over a transport that may drop messages: the
    /// receiver counts what arrives until the sender says it is done, and the rate is
    /// the receiver's.
    pub fn counts_at_receiver(&self) -> bool {
        self.test == Test::SendBw && self.connection.unreliable()
    }

    /// Every how many WRs a bandwidth row of `size`-byte messages signals. Under
    /// `--perftest`, perftest's rule: `-Q` or 100, but every WR above 8 KiB when `-Q` is
    /// not given and the run has one size, never more than the TX depth. Otherwise
    /// [`signal_every`] (or `-Q`).
    pub fn cq_mod_for(&self, size: u64) -> u32 {
        let depth = self.tx_depth.max(1);
        if !self.perftest {
            return self
                .cq_mod
                .unwrap_or_else(|| signal_every(depth as u64, size) as u32)
                .clamp(1, depth);
        }
        let m = match self.cq_mod {
            Some(q) => q,
            None if size > 8192 && self.rows.len() == 1 => 1,
            None => 100,
        };
        m.clamp(1, depth)
    }
}

/// The RC attributes perftest gives its QPs, on top of `base`: as many outstanding
/// READs and atomics as the device allows for the READ and atomic tests (its
/// `ctx_set_out_reads`), one for the others.
pub fn perftest_rc_params(base: RcParams, test: Test, caps: &Capabilities) -> RcParams {
    let reads = if matches!(
        test,
        Test::ReadLat | Test::ReadBw | Test::AtomicLat | Test::AtomicBw
    ) {
        caps.max_qp_rd_atom
            .min(caps.max_qp_init_rd_atom)
            .clamp(1, u8::MAX as u32) as u8
    } else {
        1
    };
    RcParams {
        max_rd_atomic: reads,
        max_dest_rd_atomic: reads,
        ..base
    }
}

/// perftest's default inline size for a latency test on a device of `vendor_id` (its
/// `ctx_set_max_inline`): SEND 236 and WRITE 220 bytes on the devices it knows (Mellanox /
/// NVIDIA, Intel), less on some (Broadcom 96, QLogic 128, Amazon EFA 32), and none on a
/// device it does not recognise (rxe, the sim) or for any other test.
pub fn perftest_inline(test: Test, vendor_id: u32) -> u32 {
    let (send, write) = match vendor_id {
        0x02c9 | 0x15b3 | 0x8086 => (236, 220),
        0x14e4 => (96, 96),
        0x1077 => (128, 128),
        0x1d0f => (32, 32),
        _ => (0, 0),
    };
    match test {
        Test::SendLat => send,
        Test::WriteLat => write,
        _ => 0,
    }
}

/// Every how many WRs a bandwidth test asks for a completion: half the send queue, but
/// at least every 16 MiB, so that a slow device still reports progress within the
/// timeout.
pub fn signal_every(depth: u64, size: u64) -> u64 {
    (depth / 2).min((16u64 << 20) / size.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn cfg(args: &[&str]) -> Res<Cfg> {
        let mut v = vec!["perf"];
        v.extend_from_slice(args);
        Cfg::from_cli(&PerfCli::parse_from(v))
    }

    #[test]
    fn ud_sizes_stop_at_the_mtu_and_tests_a_transport_lacks_are_refused() {
        let mut c = cfg(&["send_bw", "-c", "UD", "-a"]).unwrap();
        c.limit_to_mtu(1024);
        assert_eq!(c.rows.last().map(|r| r.0), Some(1024));
        assert_eq!(c.rows.len(), 10, "2 B .. 1 KiB");
        let mut c = cfg(&["send_bw", "-c", "UD", "-s", "4096"]).unwrap();
        c.limit_to_mtu(1024);
        assert_eq!(c.rows[0].0, 1024);
        assert_eq!(c.area_size(), 1024 + GRH, "the GRH in front of each receive");
        let mut c = cfg(&["send_bw", "-c", "UC", "-s", "4096"]).unwrap();
        c.limit_to_mtu(1024);
        assert_eq!(c.rows[0].0, 4096, "UC messages span packets");
        assert!(c.counts_at_receiver());
        assert!(!cfg(&["send_bw", "--use_srq"]).unwrap().counts_at_receiver());
        assert!(cfg(&["read_lat", "-c", "UC"]).is_err());
        assert!(cfg(&["atomic_bw", "-c", "UC"]).is_err());
        assert!(cfg(&["write_lat", "-c", "UC"]).is_ok());
        assert!(cfg(&["write_bw", "-c", "UD"]).is_err());
        assert!(cfg(&["send_lat", "--use_srq"]).is_ok());
        assert!(cfg(&["write_lat", "--use_srq"]).is_err());
    }
}
