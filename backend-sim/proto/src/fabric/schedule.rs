//! The schedule of a deterministic run: every fault the network applied, each keyed as
//! the seed's [`Decider`](crate::faults::network::Decider) keys its decisions (link, opcode, PSN,
//! attempt), and the network that applies a given schedule instead of the seed's draws.
//!
//! A [`Net`](super::Net) that records ([`Net::record_faults`](super::Net::record_faults))
//! lists what it did to each frame that did not go through clean: lost, delayed beyond
//! the link's latency, duplicated, cut into its packets, the connection reset as it was
//! sent. One [`Fault`] is one of these, so that a frame both delayed and duplicated is
//! two faults, each removable on its own. A net that is forced
//! ([`Net::force`](super::Net::force)) decides each frame from the schedule alone: the
//! faults listed for its key, and a clean delivery after the latency for every frame the
//! schedule does not name. Replaying the schedule a seed's run recorded gives that run
//! again (the same trace); replaying a part of it gives the run with only those faults,
//! which is what a shrinker needs.
//!
//! The text form is one line per fault, readable and read back by [`Schedule`]'s
//! `FromStr` (lines may also be separated by `;`, for an environment variable):
//!
//! ```text
//! at 41.200us 0x3a1b2c->0x77e0f1 Write/0x11 psn 12 attempt 0 drop
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::faults::network::Decision;
use crate::wire::Frame;

/// Which sending of which frame a decision is about: the key the seed's decisions are
/// drawn by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameKey {
    /// One direction of one connection (the sending QPN in the high 32 bits, the
    /// receiving one in the low, for the deterministic backend).
    pub link: u64,
    /// The frame's opcode byte.
    pub opcode: u8,
    /// The frame's PSN (0 for a frame that carries none).
    pub psn: u32,
    /// How many times this frame (link, opcode, PSN) was sent before.
    pub attempt: u32,
}

/// What the network did to a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    /// Lost: never delivered.
    Drop,
    /// Delivered this much later than the link's latency.
    Delay(Duration),
    /// Delivered twice, the copy this long after the first.
    Duplicate(Duration),
    /// Cut into its packets, each then decided on its own.
    Split,
    /// The connection broke as it was sent.
    Reset,
}

/// One fault the network applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// When the frame was sent (virtual time since the start).
    pub at: Duration,
    /// Which frame.
    pub key: FrameKey,
    /// The frame's kind, for people (`Write`, `WritePart`, `Ack`...).
    pub kind: String,
    /// What was done to it.
    pub what: What,
}

/// The faults of a run in the order they were applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// The faults.
    pub faults: Vec<Fault>,
}

impl Schedule {
    /// How many faults.
    pub fn len(&self) -> usize {
        self.faults.len()
    }

    /// Whether the network applied no fault.
    pub fn is_empty(&self) -> bool {
        self.faults.is_empty()
    }

    /// The one-line form, faults separated by `; ` (for an environment variable).
    pub fn to_line(&self) -> String {
        let lines: Vec<String> = self.faults.iter().map(ToString::to_string).collect();
        lines.join("; ")
    }
}

impl From<Vec<Fault>> for Schedule {
    fn from(faults: Vec<Fault>) -> Self {
        Schedule { faults }
    }
}

/// `us` with three decimals: nanosecond exact, read back by [`parse_us`].
struct Us(Duration);

impl fmt::Display for Us {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.as_nanos();
        write!(f, "{}.{:03}us", n / 1000, n % 1000)
    }
}

fn parse_us(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a time in microseconds (like 12.500us)");
    let v = s.strip_suffix("us").ok_or_else(bad)?;
    let (whole, frac) = v.split_once('.').unwrap_or((v, "0"));
    if frac.is_empty() || frac.len() > 3 {
        return Err(bad());
    }
    let whole: u64 = whole.parse().map_err(|_| bad())?;
    let frac: u64 = format!("{frac:0<3}").parse().map_err(|_| bad())?;
    let nanos = whole
        .checked_mul(1000)
        .and_then(|n| n.checked_add(frac))
        .ok_or_else(bad)?;
    Ok(Duration::from_nanos(nanos))
}

impl fmt::Display for What {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            What::Drop => write!(f, "drop"),
            What::Delay(d) => write!(f, "delay +{}", Us(d)),
            What::Duplicate(d) => write!(f, "duplicate +{}", Us(d)),
            What::Split => write!(f, "split"),
            What::Reset => write!(f, "reset"),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = &self.key;
        write!(
            f,
            "at {} {:#x}->{:#x} {}/{:#04x} psn {} attempt {} {}",
            Us(self.at),
            k.link >> 32,
            k.link as u32,
            self.kind,
            k.opcode,
            k.psn,
            k.attempt,
            self.what
        )
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for fault in &self.faults {
            writeln!(f, "{fault}")?;
        }
        Ok(())
    }
}

fn hex<T: TryFrom<u64>>(s: &str, what: &str) -> Result<T, String> {
    let bad = || format!("{s:?} is not a {what} (hex, like 0x1f)");
    let h = s.strip_prefix("0x").ok_or_else(bad)?;
    let v = u64::from_str_radix(h, 16).map_err(|_| bad())?;
    T::try_from(v).map_err(|_| bad())
}

fn number(s: Option<&str>, what: &str) -> Result<u32, String> {
    let s = s.ok_or_else(|| format!("the {what} is missing"))?;
    s.parse().map_err(|_| format!("{s:?} is not a {what}"))
}

fn word<'a>(it: &mut impl Iterator<Item = &'a str>, want: &str) -> Result<(), String> {
    match it.next() {
        Some(w) if w == want => Ok(()),
        other => Err(format!("expected {want:?}, found {other:?}")),
    }
}

impl FromStr for Fault {
    type Err = String;

    /// Reads the form [`Fault`]'s `Display` writes.
    fn from_str(line: &str) -> Result<Fault, String> {
        let mut it = line.split_whitespace();
        word(&mut it, "at")?;
        let at = parse_us(it.next().ok_or("the time is missing")?)?;
        let link = it.next().ok_or("the link (0xA->0xB) is missing")?;
        let (from, to) = link
            .split_once("->")
            .ok_or_else(|| format!("{link:?} is not a link (0xA->0xB)"))?;
        let link = (hex::<u64>(from, "QPN")? << 32) | hex::<u64>(to, "QPN")?;
        let frame = it.next().ok_or("the frame (Kind/0xNN) is missing")?;
        let (kind, opcode) = frame
            .split_once('/')
            .ok_or_else(|| format!("{frame:?} is not a frame (Kind/0xNN)"))?;
        let opcode = hex::<u8>(opcode, "opcode")?;
        word(&mut it, "psn")?;
        let psn = number(it.next(), "PSN")?;
        word(&mut it, "attempt")?;
        let attempt = number(it.next(), "attempt")?;
        let what = match it.next() {
            Some("drop") => What::Drop,
            Some("split") => What::Split,
            Some("reset") => What::Reset,
            Some(w @ ("delay" | "duplicate")) => {
                let d = it
                    .next()
                    .and_then(|d| d.strip_prefix('+'))
                    .ok_or_else(|| format!("{w} needs a time (+12.500us)"))?;
                let d = parse_us(d)?;
                if w == "delay" {
                    What::Delay(d)
                } else {
                    What::Duplicate(d)
                }
            }
            other => {
                return Err(format!(
                    "{other:?} is not a fault (drop, delay +T, duplicate +T, split, reset)"
                ))
            }
        };
        if let Some(extra) = it.next() {
            return Err(format!("{extra:?} after the fault"));
        }
        Ok(Fault {
            at,
            key: FrameKey {
                link,
                opcode,
                psn,
                attempt,
            },
            kind: kind.to_string(),
            what,
        })
    }
}

impl FromStr for Schedule {
    type Err = String;

    /// Reads one fault a line (or separated by `;`); empty lines are skipped.
    fn from_str(text: &str) -> Result<Schedule, String> {
        text.split(['\n', ';'])
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .enumerate()
            .map(|(i, l)| l.parse().map_err(|e| format!("fault {}: {l:?}: {e}", i + 1)))
            .collect::<Result<Vec<Fault>, String>>()
            .map(Schedule::from)
    }
}

/// The frame's kind as a word: its variant (and a part's kind).
pub(super) fn kind(frame: &Frame) -> String {
    use fmt::Write;
    if let Frame::Part { kind, .. } = frame {
        return format!("{kind:?}Part");
    }
    // The variant's name is the first thing its `Debug` writes: stop there rather than
    // format every field of every faulted frame.
    struct Name(String);
    impl fmt::Write for Name {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let end = s.find(|c: char| !c.is_alphanumeric()).unwrap_or(s.len());
            self.0.push_str(&s[..end]);
            if end < s.len() {
                Err(fmt::Error)
            } else {
                Ok(())
            }
        }
    }
    let mut name = Name(String::new());
    let _ = write!(name, "{frame:?}");
    name.0
}

/// The faults of a schedule by frame: what a forced network decides.
#[derive(Default)]
pub(super) struct Forced {
    by_key: FxHashMap<FrameKey, Vec<What>>,
}

impl Forced {
    pub(super) fn new(s: &Schedule) -> Forced {
        let mut by_key: FxHashMap<FrameKey, Vec<What>> = FxHashMap::default();
        for f in &s.faults {
            by_key.entry(f.key).or_default().push(f.what);
        }
        Forced { by_key }
    }

    /// The fate of the frame `key` on a link of `latency`: clean unless the schedule
    /// names it.
    pub(super) fn decision(&self, key: &FrameKey, latency: Duration) -> Decision {
        let mut d = Decision {
            lost: false,
            delay: latency,
            duplicate_after: None,
            reset: false,
            split: false,
        };
        for w in self.by_key.get(key).into_iter().flatten() {
            match *w {
                What::Drop => d.lost = true,
                What::Delay(x) => d.delay += x,
                What::Duplicate(x) => d.duplicate_after = Some(x),
                What::Split => d.split = true,
                What::Reset => d.reset = true,
            }
        }
        d
    }
}

/// The faults of decision `d` as applied to a frame sent whole (not cut) on a link of
/// `latency`: a lost frame is only lost.
pub(super) fn applied(d: &Decision, latency: Duration) -> impl Iterator<Item = What> {
    let lost = d.lost.then_some(What::Drop);
    let delay = (!d.lost && d.delay > latency).then(|| What::Delay(d.delay - latency));
    let dup = d.duplicate_after.filter(|_| !d.lost).map(What::Duplicate);
    lost.into_iter().chain(delay).chain(dup)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(what: What) -> Fault {
        Fault {
            at: Duration::from_nanos(41_205),
            key: FrameKey {
                link: (0x3a_1b2c << 32) | 0x77_e0f1,
                opcode: 0x11,
                psn: 12,
                attempt: 1,
            },
            kind: "Write".into(),
            what,
        }
    }

    #[test]
    fn a_schedule_reads_back_what_it_prints() {
        let s = Schedule::from(vec![
            fault(What::Drop),
            fault(What::Delay(Duration::from_nanos(13_215))),
            fault(What::Duplicate(Duration::ZERO)),
            fault(What::Split),
            fault(What::Reset),
        ]);
        let text = s.to_string();
        assert_eq!(
            text.lines().next(),
            Some("at 41.205us 0x3a1b2c->0x77e0f1 Write/0x11 psn 12 attempt 1 drop")
        );
        assert_eq!(text.parse::<Schedule>(), Ok(s.clone()));
        assert_eq!(s.to_line().parse::<Schedule>(), Ok(s));
    }

    #[test]
    fn a_bad_line_is_refused_saying_why() {
        let e = "at 1.000us 0x1->0x2 Write/0x11 psn x attempt 0 drop"
            .parse::<Schedule>()
            .unwrap_err();
        assert!(e.contains("fault 1") && e.contains("not a PSN"), "{e}");
        let e = "at 1.000us 0x1->0x2 Write/0x11 psn 1 attempt 0 vanish"
            .parse::<Schedule>()
            .unwrap_err();
        assert!(e.contains("not a fault"), "{e}");
        assert!("at 1.0000us 0x1->0x2 Write/0x11 psn 1 attempt 0 drop"
            .parse::<Schedule>()
            .is_err());
        assert!("at 1us 0x1->0x2 Write/0x111 psn 1 attempt 0 drop"
            .parse::<Schedule>()
            .is_err());
    }

    #[test]
    fn a_frame_kind_is_its_variant() {
        let f = Frame::Ack { psn: 7 };
        assert_eq!(kind(&f), "Ack");
    }

    #[test]
    fn a_forced_frame_gets_its_faults_and_every_other_goes_clean() {
        let lat = Duration::from_micros(2);
        let s = Schedule::from(vec![
            fault(What::Delay(Duration::from_micros(5))),
            fault(What::Duplicate(Duration::from_micros(7))),
        ]);
        let forced = Forced::new(&s);
        let d = forced.decision(&s.faults[0].key, lat);
        assert_eq!(d.delay, Duration::from_micros(7));
        assert_eq!(d.duplicate_after, Some(Duration::from_micros(7)));
        assert!(!d.lost && !d.split && !d.reset);
        assert_eq!(
            applied(&d, lat).collect::<Vec<_>>(),
            vec![s.faults[0].what, s.faults[1].what]
        );
        let other = FrameKey {
            attempt: 0,
            ..s.faults[0].key
        };
        let clean = forced.decision(&other, lat);
        assert_eq!(applied(&clean, lat).count(), 0);
        assert_eq!(clean.delay, lat);
    }
}
