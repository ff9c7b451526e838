//! The examples' statistics, in one place:
//!
//! - [`Latencies`]: samples in nanoseconds and their [`Summary`], what perftest prints
//!   (min, max, median ("typical"), mean, standard deviation, 99th and 99.9th
//!   percentiles). Percentiles use the nearest-rank method on the sorted samples
//!   ([`percentile`]), as perftest does, so that `perf`'s figures read like its.
//! - [`Figures`]: a handful of figures in any unit (one per run or round, or per sample of
//!   a baseline), for perf-compare: [`median`], percentiles, smallest and largest. A
//!   percentile there is the value at the rounded index `(n - 1) p / 100` (for an even
//!   count the median is the upper of the two middle values): the rule perf-compare's
//!   reports have always used, kept so that they compare with the earlier ones.
//! - [`per_sec`] for rates and [`si`] to print them.

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

/// Figures sorted once (NaN last), for their median, percentiles and range.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    sorted: Vec<f64>,
}

impl FromIterator<f64> for Figures {
    fn from_iter<I: IntoIterator<Item = f64>>(values: I) -> Self {
        let mut sorted: Vec<f64> = values.into_iter().collect();
        sorted.sort_by(|a, b| a.total_cmp(b));
        Figures { sorted }
    }
}

impl Figures {
    /// The value at the rounded index `(n - 1) p / 100` (`p` in 0..=100); NaN without
    /// figures.
    pub fn percentile(&self, p: f64) -> f64 {
        if self.sorted.is_empty() {
            return f64::NAN;
        }
        self.sorted[((self.sorted.len() - 1) as f64 * p / 100.0).round() as usize]
    }

    /// The 50th [`percentile`](Figures::percentile).
    pub fn median(&self) -> f64 {
        self.percentile(50.0)
    }

    /// The smallest (NaN left out; +inf without figures).
    pub fn min(&self) -> f64 {
        self.sorted.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// The largest (NaN left out; -inf without figures).
    pub fn max(&self) -> f64 {
        self.sorted.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }
}

/// The median of `values` ([`Figures::median`]).
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    values.into_iter().collect::<Figures>().median()
}

/// `count` per second over `elapsed` (a zero duration counts as a nanosecond).
pub fn per_sec(count: f64, elapsed: Duration) -> f64 {
    count / elapsed.as_secs_f64().max(1e-9)
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
    fn figures_take_the_rounded_index() {
        let f: Figures = [4.0, 1.0, 3.0, 2.0].into_iter().collect();
        assert_eq!(f.median(), 3.0, "the upper middle of an even count");
        assert_eq!(median([5.0, 1.0, 3.0]), 3.0);
        assert_eq!((f.percentile(0.0), f.percentile(100.0)), (1.0, 4.0));
        assert_eq!((f.min(), f.max()), (1.0, 4.0));
        assert!(median([]).is_nan());
        let with_nan: Figures = [2.0, f64::NAN, 1.0].into_iter().collect();
        assert_eq!((with_nan.min(), with_nan.max()), (1.0, 2.0));
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
