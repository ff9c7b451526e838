//! Latency statistics: samples in nanoseconds, and the summary perftest prints (min,
//! max, median ("typical"), mean, standard deviation, 99th and 99.9th percentiles).
//! Percentiles use the nearest-rank method on the sorted samples.

use std::time::Duration;

/// Collected latency samples.
#[derive(Clone, Debug, Default)]
pub struct Latencies {
    ns: Vec<u64>,
}

/// The summary of a set of samples, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Smallest.
    pub min_us: f64,
    /// Largest.
    pub max_us: f64,
    /// Median (perftest's `t_typical`).
    pub p50_us: f64,
    /// Mean.
    pub avg_us: f64,
    /// Population standard deviation.
    pub stdev_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
}

impl Latencies {
    /// Room for `n` samples (so that recording does not allocate).
    pub fn with_capacity(n: usize) -> Self {
        Latencies {
            ns: Vec::with_capacity(n),
        }
    }

    /// Records one sample.
    #[inline]
    pub fn record(&mut self, d: Duration) {
        self.ns.push(d.as_nanos().min(u64::MAX as u128) as u64);
    }

    /// Records one sample given in nanoseconds.
    #[inline]
    pub fn record_ns(&mut self, ns: u64) {
        self.ns.push(ns);
    }

    /// Adds another set's samples.
    pub fn merge(&mut self, other: &Latencies) {
        self.ns.extend_from_slice(&other.ns);
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.ns.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ns.is_empty()
    }

    /// Divides every sample by `d` (perftest reports half the round trip of a ping-pong).
    pub fn scaled(&self, d: u64) -> Latencies {
        Latencies {
            ns: self.ns.iter().map(|v| v / d.max(1)).collect(),
        }
    }

    /// The summary (all zero without samples).
    pub fn summary(&self) -> Summary {
        if self.ns.is_empty() {
            return Summary::default();
        }
        let mut s = self.ns.clone();
        s.sort_unstable();
        let n = s.len();
        let us = |v: u64| v as f64 / 1000.0;
        let mean = s.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = s.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        Summary {
            count: n,
            min_us: us(s[0]),
            max_us: us(s[n - 1]),
            p50_us: us(percentile(&s, 50.0)),
            avg_us: mean / 1000.0,
            stdev_us: var.sqrt() / 1000.0,
            p99_us: us(percentile(&s, 99.0)),
            p999_us: us(percentile(&s, 99.9)),
        }
    }
}

/// Nearest-rank percentile of sorted samples (`p` in 0..=100).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    // The epsilon keeps 99.9% of 1000 at rank 999 despite binary floating point.
    let rank = ((p / 100.0) * sorted.len() as f64 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl std::fmt::Display for Summary {
    /// `p50 12.3 us, p99 45.6 us, p99.9 78.9 us (min .., max .., avg .., n)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us (min {:.1}, avg {:.1}, max {:.1}; {} samples)",
            self.p50_us, self.p99_us, self.p999_us, self.min_us, self.avg_us, self.max_us, self.count
        )
    }
}

/// A rate with an SI suffix: `12.3 k`, `4.56 M`.
pub fn si(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.1} ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let s: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&s, 50.0), 500);
        assert_eq!(percentile(&s, 99.0), 990);
        assert_eq!(percentile(&s, 99.9), 999);
        assert_eq!(percentile(&s, 100.0), 1000);
        assert_eq!(percentile(&s, 0.0), 1);
        assert_eq!(percentile(&[7], 99.9), 7);
    }

    #[test]
    fn summary_of_constant() {
        let mut l = Latencies::default();
        for _ in 0..10 {
            l.record(Duration::from_micros(3));
        }
        let s = l.summary();
        assert_eq!(s.count, 10);
        assert_eq!(s.p50_us, 3.0);
        assert_eq!(s.stdev_us, 0.0);
        assert_eq!(l.scaled(2).summary().avg_us, 1.5);
    }
}
