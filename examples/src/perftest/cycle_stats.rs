//! perftest's arithmetic over cycle-counter stamps, for `perf --perftest`: the same
//! samples, the same trimming and rounding, so that a row of `perf` and a row of
//! `ib_*_lat` / `ib_*_bw` are computed alike (perftest 4.5, `print_report_lat` and
//! `print_report_bw` in `perftest_parameters.c`).
//!
//! Latency: a sample is the time between two consecutive posts (`tposted[i + 1] -
//! tposted[i]`: one whole iteration, the tool's own work included), divided by 2 for the
//! ping-pongs (SEND, WRITE). The samples are sorted and the two largest dropped; "typical"
//! is the median of the rest; t_max is the second largest of all (the value just past
//! the kept ones), the percentiles the values at `ceil(n * p)`. The standard deviation truncates each squared deviation to an integer
//! number of microseconds squared, as perftest does.
//!
//! Bandwidth: `tposted[i]` is stamped before each post, `tcompleted[j]` when the
//! completion of WR `j` (every `cq_mod`-th is signaled) is polled. The average is the
//! bytes over `tcompleted[last] - tposted[0]`; the peak is the smallest time per message
//! over every window from a post to a later polled completion. MB is 2^20 bytes.

use super::clock::Cycles;

/// Samples dropped from the top (perftest's `LAT_MEASURE_TAIL`).
const TAIL: usize = 2;

/// A latency row, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatStats {
    /// Smallest sample.
    pub min: f64,
    /// The second largest sample (perftest's t_max, the value just past those kept).
    pub max: f64,
    /// Median ("typical").
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation (perftest's integer-truncated one).
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// perftest's median of the first `n` sorted values.
fn median(n: usize, d: &[Cycles]) -> Cycles {
    if (n - 1) % 2 == 1 {
        (d[n / 2] + d[n / 2 - 1]) / 2
    } else {
        d[n / 2]
    }
}

/// The latency row of `tposted` (one stamp per iteration, at least 4); `halve` for the
/// ping-pongs; `mhz` counter ticks per microsecond.
pub fn latency(tposted: &[Cycles], halve: bool, mhz: f64) -> Option<LatStats> {
    if tposted.len() < TAIL + 2 {
        return None;
    }
    let mut d: Vec<Cycles> = tposted.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    d.sort_unstable();
    let q = mhz * if halve { 2.0 } else { 1.0 };
    let n = d.len() - TAIL;
    let us = |c: Cycles| c as f64 / q;
    let avg = d[..n].iter().map(|&c| us(c)).sum::<f64>() / n as f64;
    let var = d[..n]
        .iter()
        .map(|&c| {
            let dev = (avg - us(c)) as i64;
            (dev * dev) as f64
        })
        .sum::<f64>()
        / n as f64;
    let at = |p: f64| us(d[((n as f64 * p).ceil() as usize).min(d.len() - 1)]);
    Some(LatStats {
        min: us(d[0]),
        max: us(d[n]),
        typical: us(median(n, &d)),
        avg,
        stdev: var.sqrt(),
        p99: at(0.99),
        p999: at(0.999),
    })
}

/// A bandwidth row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BwStats {
    /// Peak, MB/s.
    pub peak_mbps: f64,
    /// Average, MB/s.
    pub avg_mbps: f64,
    /// Messages per microsecond.
    pub msg_rate_mpps: f64,
    /// The run, microseconds.
    pub elapsed_us: f64,
}

/// perftest measures no peak in a bandwidth run of more iterations than this (its
/// peak search visits every pair of stamps, quadratic in the run: perftest_parameters.c
/// "BW peak won't be measured in this run"), and stamps only its start and end.
pub const NO_PEAK_ABOVE: u64 = 20_000;

/// The bandwidth row of a run of `iters` messages of `size` bytes. With a stamp per
/// message (`tposted.len() == iters`), `tcompleted` has the same length with stamps at
/// every `cq_mod`-th index and the last, and the peak is searched; with one stamp each
/// (a run above [`NO_PEAK_ABOVE`]), they are the run's start and end, and the peak is 0,
/// as perftest reports it.
pub fn bandwidth(
    size: u64,
    iters: u64,
    tposted: &[Cycles],
    tcompleted: &[Cycles],
    cq_mod: usize,
    mhz: f64,
) -> Option<BwStats> {
    if iters == 0 || tposted.is_empty() || tcompleted.len() != tposted.len() || cq_mod == 0 {
        return None;
    }
    if tposted.len() as u64 != iters {
        let total = tcompleted[0].wrapping_sub(tposted[0]) as f64;
        return Some(BwStats {
            peak_mbps: 0.0,
            avg_mbps: size as f64 * iters as f64 * mhz * 1e6 / (total * 1048576.0),
            msg_rate_mpps: iters as f64 * mhz / total,
            elapsed_us: total / mhz,
        });
    }
    let n = tposted.len();
    // perftest starts from tcompleted[0] - tposted[0], which is a real window only when
    // every WR is signaled (otherwise an unset stamp minus a post wraps to a huge value):
    // starting from the largest value and visiting only stamped indices is the same.
    let mut best = u64::MAX;
    for (i, &posted) in tposted.iter().enumerate() {
        let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
        while j < n {
            best = best.min(tcompleted[j].wrapping_sub(posted) / (j - i + 1) as u64);
            j += cq_mod;
        }
        if n % cq_mod != 0 {
            let j = n - 1;
            best = best.min(tcompleted[j].wrapping_sub(posted) / (j - i + 1) as u64);
        }
    }
    let hz = mhz * 1e6;
    let total = tcompleted[n - 1].wrapping_sub(tposted[0]) as f64;
    let mb = 1048576.0;
    Some(BwStats {
        peak_mbps: if best == 0 || best == u64::MAX {
            0.0
        } else {
            size as f64 * hz / (best as f64 * mb)
        },
        avg_mbps: size as f64 * n as f64 * hz / (total * mb),
        msg_rate_mpps: n as f64 * hz / (total * 1e6),
        elapsed_us: total / mhz,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_drops_the_two_largest_and_halves_ping_pongs() {
        // 11 stamps: 10 gaps of 10 cycles, except two huge ones (dropped) and one of 30
        let mut t = vec![0u64];
        for g in [10, 10, 1000, 10, 30, 10, 10, 900, 10, 10] {
            t.push(t.last().unwrap() + g);
        }
        let s = latency(&t, false, 1.0).unwrap();
        assert_eq!(s.min, 10.0);
        // perftest's t_max is the value just past the kept ones: the second largest
        assert_eq!(s.max, 900.0);
        assert_eq!(s.typical, 10.0);
        assert!((s.avg - 12.5).abs() < 1e-9, "{}", s.avg);
        let h = latency(&t, true, 1.0).unwrap();
        assert_eq!(h.typical, 5.0);
        assert_eq!(latency(&t[..3], false, 1.0), None);
    }

    #[test]
    fn median_averages_the_middle_pair_of_an_even_count_in_whole_cycles() {
        assert_eq!(median(4, &[1, 2, 3, 4]), 2);
        assert_eq!(median(4, &[1, 2, 4, 4]), 3);
        assert_eq!(median(5, &[1, 2, 4, 6, 8]), 4);
    }

    #[test]
    fn stdev_truncates_deviations_to_whole_microseconds() {
        // deviations of 0.5 us truncate to 0
        let t = [0, 10, 21, 31, 42, 52, 1000, 2000];
        let s = latency(&t, false, 1.0).unwrap();
        assert_eq!(s.stdev, 0.0);
    }

    #[test]
    fn bandwidth_average_and_peak() {
        // 4 messages of 1 MiB, one every 100 cycles at 1 MHz, each completion polled
        // 50 cycles after its post; cq_mod 2: completions stamped at indices 1 and 3
        let tposted = [0, 100, 200, 300];
        let tcompleted = [0, 150, 0, 350];
        let s = bandwidth(1 << 20, 4, &tposted, &tcompleted, 2, 1.0).unwrap();
        assert!((s.elapsed_us - 350.0).abs() < 1e-9);
        assert!((s.avg_mbps - 4.0 * 1e6 / 350.0).abs() < 1e-6, "{}", s.avg_mbps);
        assert!((s.msg_rate_mpps - 4.0 / 350.0).abs() < 1e-12);
        // best window: post 3 -> completion 3: 50 cycles for 1 message
        assert!((s.peak_mbps - 1e6 / 50.0).abs() < 1e-6, "{}", s.peak_mbps);
        // The same run stamped only at its start and end: the same average, no peak.
        let s = bandwidth(1 << 20, 4, &[0], &[350], 2, 1.0).unwrap();
        assert!((s.avg_mbps - 4.0 * 1e6 / 350.0).abs() < 1e-6, "{}", s.avg_mbps);
        assert!((s.msg_rate_mpps - 4.0 / 350.0).abs() < 1e-12);
        assert_eq!(s.peak_mbps, 0.0);
    }
}
