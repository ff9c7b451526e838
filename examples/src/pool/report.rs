//! What param-pool's readers print: each reader thread's counts ([`ReaderReport`]) and
//! their total ([`print_readers`]).

use std::time::Duration;

use crate::stats::{per_sec, si};

/// One reader thread's counts.
#[derive(Debug, Default, Clone)]
pub struct ReaderReport {
    /// The reader's number.
    pub id: u32,
    /// RDMA READs completed.
    pub reads: u64,
    /// Bytes they fetched.
    pub bytes: u64,
    /// Reads that saw a slot being written (versions or checksum).
    pub torn_detected: u64,
    /// Torn reads whose versions agreed but whose checksum did not.
    pub torn_by_checksum: u64,
    /// Vectors used.
    pub used: u64,
    /// Vectors used that were not what their id and version say.
    pub used_bad: u64,
    /// The first of those, described.
    pub bad_example: Option<String>,
    /// Distinct versions seen per (owner, vector) summed: how many updates readers observed.
    pub fresh: u64,
    /// How long the reader read.
    pub elapsed: Duration,
    /// Owners that revoked this reader's window (a READ through it failed with
    /// REM_ACCESS_ERR).
    pub revoked: u64,
}

/// Prints every reader's counts and the total (`used_anyway`: torn reads were used, as
/// `--no-version-check` does, rather than read again); returns the total.
pub fn print_readers(reps: &[ReaderReport], used_anyway: bool) -> ReaderReport {
    let mut tot = ReaderReport::default();
    for r in reps {
        let el = r.elapsed.as_secs_f64().max(1e-9);
        println!(
            "reader {}: {} READs in {:.2} s ({}reads/s, {}B/s); torn detected{}: {} ({} by checksum); used: {}; used but torn: {}; updates observed: {}",
            r.id,
            r.reads,
            el,
            si(per_sec(r.reads as f64, r.elapsed)),
            si(per_sec(r.bytes as f64, r.elapsed)),
            if used_anyway { " (and used anyway)" } else { " and re-read" },
            r.torn_detected,
            r.torn_by_checksum,
            r.used,
            r.used_bad,
            r.fresh
        );
        if r.revoked > 0 {
            println!("reader {}:   revoked by {} owner(s)", r.id, r.revoked);
        }
        if let Some(e) = &r.bad_example {
            println!("reader {}:   e.g. {e}", r.id);
        }
        tot.reads += r.reads;
        tot.bytes += r.bytes;
        tot.torn_detected += r.torn_detected;
        tot.torn_by_checksum += r.torn_by_checksum;
        tot.used += r.used;
        tot.used_bad += r.used_bad;
        tot.revoked += r.revoked;
        tot.elapsed = tot.elapsed.max(r.elapsed);
    }
    println!(
        "total: {} READs, {}reads/s, {}B/s; torn detected: {} ({:.2}% of reads, {} by checksum, {}); vectors used: {}; torn vectors used: {}",
        tot.reads,
        si(per_sec(tot.reads as f64, tot.elapsed)),
        si(per_sec(tot.bytes as f64, tot.elapsed)),
        tot.torn_detected,
        100.0 * tot.torn_detected as f64 / tot.reads.max(1) as f64,
        tot.torn_by_checksum,
        if used_anyway { "used anyway" } else { "all re-read" },
        tot.used,
        tot.used_bad
    );
    tot
}
