//! What a soak runs: its size, its payload sizes, its seed and its mix of operations.

use std::time::Duration;

use serde::Serialize;

/// Relative weights of the operations a QP posts (a CMP_AND_SWP goes to the QP's own
/// chain word or to the shared word, half and half).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Mix {
    /// SEND_WITH_IMM (consumes a receive at the peer).
    pub send: u32,
    /// RDMA WRITE.
    pub write: u32,
    /// RDMA READ.
    pub read: u32,
    /// ATOMIC_FETCH_AND_ADD on a shared counter.
    pub fetch_add: u32,
    /// ATOMIC_CMP_AND_SWP on the QP's chain word or the shared word.
    pub cmp_swap: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            send: 3,
            write: 3,
            read: 2,
            fetch_add: 1,
            cmp_swap: 1,
        }
    }
}

impl Mix {
    /// The sum of the weights.
    pub(super) fn total(&self) -> u64 {
        [self.send, self.write, self.read, self.fetch_add, self.cmp_swap]
            .iter()
            .map(|&w| w as u64)
            .sum()
    }

    /// Parses `send=3,write=3,read=2,fetch_add=1,cmp_swap=1` (names may be shortened to
    /// `faa` and `cas`; omitted operations keep their default weight).
    pub fn parse(s: &str) -> Result<Mix, String> {
        let mut m = Mix::default();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: expected name=weight"))?;
            let v: u32 = v.trim().parse().map_err(|_| format!("{part:?}: bad weight"))?;
            match k.trim() {
                "send" => m.send = v,
                "write" => m.write = v,
                "read" => m.read = v,
                "fetch_add" | "faa" => m.fetch_add = v,
                "cmp_swap" | "cas" => m.cmp_swap = v,
                other => return Err(format!("unknown operation {other:?}")),
            }
        }
        if m.total() == 0 {
            return Err("every weight is 0".into());
        }
        Ok(m)
    }
}

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct SoakConfig {
    /// QPs in total, half on each device (an even number, at least 2).
    pub qps: usize,
    /// Signaled send WRs each QP posts.
    pub ops_per_qp: u64,
    /// Send WRs each QP keeps outstanding (also the receives each QP keeps posted).
    pub depth: usize,
    /// Payload sizes of SEND, WRITE and READ (one is picked per WR).
    pub sizes: Vec<u32>,
    /// Seed of every choice (operation, size, slot, counter, PSNs).
    pub seed: u64,
    /// Operation weights.
    pub mix: Mix,
    /// Remote WRITE/READ slots per QP (each `max(sizes)` bytes).
    pub slots: usize,
    /// Shared FETCH_AND_ADD counters per device.
    pub counters: usize,
    /// QPs sharing one CQ (send and receive completions).
    pub qps_per_cq: usize,
    /// Fraction of all operations completed before the first RSS sample.
    pub warmup: f64,
    /// The run fails if RSS grows by more than this many bytes after the warm-up.
    pub max_rss_growth: u64,
    /// The run fails if no completion arrives for this long.
    pub stall_timeout: Duration,
    /// GID index for the connections (1 for RoCE v2 over IPv4 on rxe).
    pub gid_index: u8,
}

impl Default for SoakConfig {
    /// The size `cargo test` runs on the sim: 256 QPs (128 per device), 1000 WRs each.
    fn default() -> Self {
        SoakConfig {
            qps: 256,
            ops_per_qp: 1000,
            depth: 16,
            sizes: vec![1, 8, 61, 512, 1500, 4096],
            seed: 0x5eed_50a4,
            mix: Mix::default(),
            slots: 8,
            counters: 8,
            qps_per_cq: 32,
            warmup: 0.2,
            max_rss_growth: 64 << 20,
            stall_timeout: Duration::from_secs(30),
            gid_index: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_parses() {
        let m = Mix::parse("send=1,faa=0,cas=5").unwrap();
        assert_eq!((m.send, m.fetch_add, m.cmp_swap, m.write), (1, 0, 5, 3));
        assert!(Mix::parse("bogus=1").is_err());
        assert!(Mix::parse("send=0,write=0,read=0,faa=0,cas=0").is_err());
    }
}
