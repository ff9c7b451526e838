//! perftest against `perf --perftest` on the same device: reads the runs that
//! `ci/perftest-vs-perf.sh` leaves in a directory and reduces them to one line per row
//! (test and size): the median over the alternating pairs of `perf / perftest` for the
//! typical and the minimum latency, or for the average bandwidth.
//!
//! A run is a file `<test>-<size>__<pair>__perftest.txt` (perftest's own output: the
//! figures are on the line after the `#bytes` header) or `<test>-<size>__<pair>__perf.json`
//! (`perf --json`: one [`Row`](super::report::Row) object). A pair counts when both of
//! its runs gave figures; a run that failed or printed none (perftest prints `inf` when
//! it cannot read the CPU's frequency) is reported as missing, not guessed.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use crate::stats::median;
use crate::Res;

/// The figures of one run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Figures {
    /// Latency rows: typical (median) microseconds; bandwidth rows: average MB/s.
    pub main: f64,
    /// Latency rows: minimum microseconds; bandwidth rows: message rate (Mpps).
    pub second: f64,
}

/// Parses perftest's output: the figures of its one result row.
pub fn parse_perftest(text: &str, lat: bool) -> Option<Figures> {
    let mut lines = text.lines();
    lines.find(|l| l.trim_start().starts_with("#bytes"))?;
    let row = lines.next()?;
    let v: Vec<f64> = row
        .split_whitespace()
        .map(|f| f.parse::<f64>().ok().filter(|x| x.is_finite()))
        .collect::<Option<_>>()?;
    let f = if lat {
        // #bytes #iterations t_min t_max t_typical ...
        Figures {
            main: *v.get(4)?,
            second: *v.get(2)?,
        }
    } else {
        // #bytes #iterations BW_peak BW_average MsgRate
        Figures {
            main: *v.get(3)?,
            second: *v.get(4)?,
        }
    };
    (f.main > 0.0).then_some(f)
}

/// Parses `perf --json` output (its last row).
pub fn parse_perf(text: &str, lat: bool) -> Option<Figures> {
    let row: serde_json::Value = text
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l.trim()).ok())?;
    let get = |k: &str| row.get(k)?.as_f64().filter(|x| x.is_finite());
    let f = if lat {
        Figures {
            main: get("t_typical_us")?,
            second: get("t_min_us")?,
        }
    } else {
        Figures {
            main: get("bw_avg_MBps")?,
            second: get("msg_rate_Mpps")?,
        }
    };
    (f.main > 0.0).then_some(f)
}

/// One row of the comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Line {
    /// The test (`send_lat`, ...).
    pub test: String,
    /// Message size.
    pub size: u64,
    /// Whether it is a latency row.
    pub latency: bool,
    /// perftest's figures, pair by pair (complete pairs only).
    pub perftest: Vec<Figures>,
    /// perf's figures, pair by pair.
    pub perf: Vec<Figures>,
    /// Pairs with a run missing.
    pub incomplete: usize,
    /// Median of `perf / perftest`: typical latency, or average bandwidth.
    pub ratio_main: Option<f64>,
    /// Median of `perf / perftest`: minimum latency (bandwidth rows: message rate).
    pub ratio_second: Option<f64>,
}

impl Line {
    /// Whether the row meets the target: within `tol` (0.05 for 5%) of perftest. One way
    /// ([`Target::NoSlower`], perf against C on the same device): latency ratios at most
    /// `1 + tol`, bandwidth at least `1 - tol`. Both ways ([`Target::Within`], two
    /// programs that should cost the same): every ratio in `[1 - tol, 1 + tol]`.
    pub fn meets(&self, tol: f64, target: Target) -> Option<bool> {
        let ok = |r: f64| match target {
            Target::Within => (1.0 - tol..=1.0 + tol).contains(&r),
            Target::NoSlower if self.latency => r <= 1.0 + tol,
            Target::NoSlower => r >= 1.0 - tol,
        };
        match (self.ratio_main, self.ratio_second) {
            (Some(a), Some(b)) if self.latency => Some(ok(a) && ok(b)),
            (Some(a), _) if !self.latency => Some(ok(a)),
            _ => None,
        }
    }
}

/// What a row's ratios must show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// perf is no slower than perftest by more than the tolerance (either may be faster).
    NoSlower,
    /// The two are within the tolerance of each other, whichever is faster.
    Within,
}

/// The order of the tests in the table.
const ORDER: [&str; 8] = [
    "send_lat",
    "write_lat",
    "read_lat",
    "atomic_lat",
    "send_bw",
    "write_bw",
    "read_bw",
    "atomic_bw",
];

/// Reads every run in `dir` and builds the table.
pub fn collect(dir: &Path) -> Res<Vec<Line>> {
    // (test, size) -> pair -> (perftest, perf)
    type Pairs = BTreeMap<u32, (Option<Figures>, Option<Figures>)>;
    let mut rows: BTreeMap<(usize, String, u64), Pairs> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some((row, pair, tool)) = split_name(name) else {
            continue;
        };
        let Some((test, size)) = row.rsplit_once('-') else {
            continue;
        };
        let (Some(rank), Ok(size)) = (ORDER.iter().position(|t| *t == test), size.parse::<u64>()) else {
            continue;
        };
        let lat = test.ends_with("_lat");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let slot = rows
            .entry((rank, test.to_string(), size))
            .or_default()
            .entry(pair)
            .or_default();
        match tool {
            Tool::Perftest => slot.0 = parse_perftest(&text, lat),
            Tool::Perf => slot.1 = parse_perf(&text, lat),
        }
    }
    Ok(rows
        .into_iter()
        .map(|((_, test, size), pairs)| {
            let latency = test.ends_with("_lat");
            let mut line = Line {
                test,
                size,
                latency,
                perftest: vec![],
                perf: vec![],
                incomplete: 0,
                ratio_main: None,
                ratio_second: None,
            };
            for (_, (a, b)) in pairs {
                match (a, b) {
                    (Some(a), Some(b)) => {
                        line.perftest.push(a);
                        line.perf.push(b);
                    }
                    _ => line.incomplete += 1,
                }
            }
            let ratios = |f: fn(&Figures) -> f64| -> Option<f64> {
                let r: Vec<f64> = line
                    .perftest
                    .iter()
                    .zip(&line.perf)
                    .filter(|(a, _)| f(a) > 0.0)
                    .map(|(a, b)| f(b) / f(a))
                    .collect();
                (!r.is_empty()).then(|| median(r.iter().copied()))
            };
            line.ratio_main = ratios(|f| f.main);
            line.ratio_second = ratios(|f| f.second);
            line
        })
        .collect())
}

enum Tool {
    Perftest,
    Perf,
}

fn split_name(name: &str) -> Option<(&str, u32, Tool)> {
    let mut parts = name.split("__");
    let (row, pair, tool) = (parts.next()?, parts.next()?, parts.next()?);
    let tool = match tool {
        "perftest.txt" => Tool::Perftest,
        "perf.json" => Tool::Perf,
        _ => return None,
    };
    Some((row, pair.parse().ok()?, tool))
}

/// The table as Markdown: one line per row, medians of each tool and the median ratios.
pub fn markdown(lines: &[Line], tol: f64, target: Target) -> String {
    let mut out = String::from(
        "| test | size | pairs | perftest | perf | perf / perftest | perftest min | perf min | perf / perftest (min) | within target |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for l in lines {
        let med = |v: &[Figures], f: fn(&Figures) -> f64| {
            let x: Vec<f64> = v.iter().map(f).collect();
            if x.is_empty() {
                "-".to_string()
            } else {
                format!("{:.2}", median(x.iter().copied()))
            }
        };
        let r = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
        let unit = if l.latency { "us" } else { "MB/s" };
        let (min_a, min_b, min_r) = if l.latency {
            (
                med(&l.perftest, |f| f.second),
                med(&l.perf, |f| f.second),
                r(l.ratio_second),
            )
        } else {
            ("".into(), "".into(), "".into())
        };
        let pairs = if l.incomplete > 0 {
            format!("{} ({} incomplete)", l.perf.len(), l.incomplete)
        } else {
            l.perf.len().to_string()
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} {unit} | {} {unit} | {} | {} | {} | {} | {} |\n",
            l.test,
            l.size,
            pairs,
            med(&l.perftest, |f| f.main),
            med(&l.perf, |f| f.main),
            r(l.ratio_main),
            min_a,
            min_b,
            min_r,
            match l.meets(tol, target) {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAT: &str = "---\n #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 2       1000          24.49          1196.49      28.26    \t       35.82       \t45.32  \t\t276.57  \t\t1196.49\n---\n";
    const BW: &str = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      500              30.80              30.77  \t\t   0.000492\n";

    #[test]
    fn reads_perftest_rows() {
        assert_eq!(
            parse_perftest(LAT, true),
            Some(Figures {
                main: 28.26,
                second: 24.49
            })
        );
        assert_eq!(
            parse_perftest(BW, false),
            Some(Figures {
                main: 30.77,
                second: 0.000492
            })
        );
        let broken = LAT.replace("24.49          1196.49      28.26", "inf          inf      inf");
        assert_eq!(parse_perftest(&broken, true), None, "perftest's inf is no figure");
        assert_eq!(parse_perftest("Couldn't connect\n", true), None);
    }

    #[test]
    fn reads_perf_json() {
        let j = r#"{"test":"read_lat","t_min_us":17.5,"t_typical_us":41.0,"bw_avg_MBps":0.1,"msg_rate_Mpps":0.02}"#;
        assert_eq!(
            parse_perf(j, true),
            Some(Figures {
                main: 41.0,
                second: 17.5
            })
        );
        assert_eq!(parse_perf("perf: error: timed out", true), None);
    }

    #[test]
    fn collects_pairs_and_median_ratios() {
        let dir = std::env::temp_dir().join(format!("versus-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lat = |typ: f64, min: f64| {
            LAT.replace("28.26", &typ.to_string())
                .replace("24.49", &min.to_string())
        };
        let perf = |typ: f64, min: f64| format!(r#"{{"t_typical_us":{typ},"t_min_us":{min}}}"#);
        for (p, a, b) in [(1, 10.0, 11.0), (2, 10.0, 10.0), (3, 10.0, 10.5)] {
            std::fs::write(dir.join(format!("read_lat-8__{p}__perftest.txt")), lat(a, 5.0)).unwrap();
            std::fs::write(dir.join(format!("read_lat-8__{p}__perf.json")), perf(b, 5.0)).unwrap();
        }
        // a pair whose perftest run failed
        std::fs::write(dir.join("read_lat-8__4__perftest.txt"), "Couldn't connect").unwrap();
        std::fs::write(dir.join("read_lat-8__4__perf.json"), perf(99.0, 5.0)).unwrap();
        std::fs::write(dir.join("send_lat-8__1__perftest.txt"), lat(10.0, 5.0)).unwrap();
        std::fs::write(dir.join("send_lat-8__1__perf.json"), perf(12.0, 5.0)).unwrap();
        let lines = collect(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].test, "send_lat", "tests in perftest's order");
        let r = &lines[1];
        assert_eq!((r.perf.len(), r.incomplete), (3, 1));
        assert!((r.ratio_main.unwrap() - 1.05).abs() < 1e-9);
        assert_eq!(r.ratio_second, Some(1.0));
        assert_eq!(r.meets(0.05, Target::NoSlower), Some(true));
        assert_eq!(lines[0].meets(0.05, Target::NoSlower), Some(false));
        // perf 5% slower on the typical latency, as fast on the minimum: within 5%
        // both ways; 20% faster is no miss one way, a miss both ways.
        assert_eq!(r.meets(0.05, Target::Within), Some(true));
        let mut fast = r.clone();
        fast.ratio_main = Some(0.8);
        assert_eq!(fast.meets(0.05, Target::NoSlower), Some(true));
        assert_eq!(fast.meets(0.05, Target::Within), Some(false));
        let md = markdown(&lines, 0.05, Target::NoSlower);
        assert!(
            md.contains("| read_lat | 8 | 3 (1 incomplete) | 10.00 us | 10.50 us | 1.050 |"),
            "{md}"
        );
    }
}
