//! What a perf run measures ([`Cfg`]: the test, its sizes and iterations, the queue
//! depths), which the client sends the server as connection private data, and the
//! server's answer ([`Ready`]).

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::opts::{AtomicType, PerfCli, Test};
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

impl Cfg {
    /// The largest message.
    pub fn max_size(&self) -> u64 {
        self.rows.iter().map(|r| r.0).max().unwrap_or(8).max(8)
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
                let n = match cli.iters {
                    Some(n) => n.max(1),
                    None => {
                        let base = if t.is_lat() { 1000 } else { 5000 };
                        base.min(((512u64 << 20) / s).max(16))
                    }
                };
                (s, n)
            })
            .collect();
        let tx_depth = cli.tx_depth.unwrap_or(if t.is_lat() { 1 } else { 128 }).max(1);
        Ok(Cfg {
            test: t,
            rows,
            tx_depth,
            rx_depth: cli.rx_depth.max(2),
            inline: cli.inline_size.unwrap_or(if t.is_lat() { 220 } else { 0 }),
            atomic: cli.atomic_type,
        })
    }
}

/// Every how many WRs a bandwidth test asks for a completion: half the send queue, but
/// at least every 16 MiB, so that a slow device still reports progress within the
/// timeout.
pub fn signal_every(depth: u64, size: u64) -> u64 {
    (depth / 2).min((16u64 << 20) / size.max(1)).max(1)
}
