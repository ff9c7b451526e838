//! What kv-rpc prints: each client connection's outcome ([`ClientReport`],
//! [`print_clients`]) and the server's ([`ServerReport`], with how long each receive
//! queue was empty: [`DryQueue`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use verbs_api::WcStatus;

use super::opts::ServerTuning;
use super::srq::SrqPool;
use super::store::Store;
use super::wire::MAX_REQ;
use super::workload::CHECK_LABELS;
use crate::stats::{per_sec, si, Latencies};
use crate::wait::status_name;

/// The outcome of one client connection.
#[derive(Debug, Default)]
pub struct ClientReport {
    /// The connection's number.
    pub id: u32,
    /// Requests it was to send.
    pub total: usize,
    /// Requests answered.
    pub completed: usize,
    /// From the first request to the end.
    pub wall: Duration,
    /// Each request's time from post to response.
    pub lat: Latencies,
    /// Answers that matched, by [`Expect`](super::workload::Expect) (PUT ok, GET value,
    /// DELETE ok, GET gone).
    pub checked: [u64; 4],
    /// Answers that did not match.
    pub mismatches: u64,
    /// The first few mismatches, described.
    pub examples: Vec<String>,
    /// Unsuccessful completions, by status.
    pub errors: BTreeMap<&'static str, u64>,
    /// The first unsuccessful completion, described.
    pub first_error: Option<String>,
    /// Gaps of more than 1 ms without a response while requests were in flight.
    pub stalls: u64,
    /// Their total length.
    pub stalled: Duration,
}

impl ClientReport {
    /// Whether a completion with status `s` was counted.
    pub fn saw(&self, s: WcStatus) -> bool {
        self.errors.contains_key(status_name(s))
    }
}

/// Prints the client reports and their total (`window` requests in flight, values of
/// `value_size` bytes); returns whether every request succeeded and was answered right.
pub fn print_clients(reports: &[ClientReport], window: u32, value_size: usize) -> bool {
    let mut all = Latencies::default();
    let mut ok = true;
    let mut wall = Duration::ZERO;
    let mut completed = 0;
    for r in reports {
        print_client(r);
        ok &= r.mismatches == 0 && r.completed == r.total && r.first_error.is_none();
        all.merge(&r.lat);
        wall = wall.max(r.wall);
        completed += r.completed;
    }
    println!(
        "total: {completed} requests over {} connection(s) (window {window}, value {value_size} B) in {:.3} s: {}ops/s; latency {}",
        reports.len(),
        wall.as_secs_f64(),
        si(per_sec(completed as f64, wall)),
        all.summary()
    );
    ok
}

fn print_client(r: &ClientReport) {
    println!(
        "client {}: {} of {} requests answered in {:.3} s: {}ops/s; latency {}",
        r.id,
        r.completed,
        r.total,
        r.wall.as_secs_f64(),
        si(per_sec(r.completed as f64, r.wall)),
        r.lat.summary()
    );
    let checked: Vec<String> = r
        .checked
        .iter()
        .zip(CHECK_LABELS)
        .map(|(v, k)| format!("{v} {k}"))
        .collect();
    println!(
        "client {}: checked: {}; wrong answers: {}",
        r.id,
        checked.join(", "),
        r.mismatches
    );
    for e in &r.examples {
        println!("client {}:   wrong: {e}", r.id);
    }
    println!(
        "client {}: stalls (no response for > 1 ms with requests in flight): {}, {:.1} ms in total ({:.0}% of the run)",
        r.id,
        r.stalls,
        r.stalled.as_secs_f64() * 1e3,
        100.0 * r.stalled.as_secs_f64() / r.wall.as_secs_f64().max(1e-9)
    );
    if let Some(e) = &r.first_error {
        println!("client {}: first error: {e}", r.id);
        println!("client {}: error completions: {:?}", r.id, r.errors);
    }
}

/// How often and how long one receive queue of the server was empty (every SEND that
/// arrived meanwhile got an RNR NAK).
#[derive(Clone, Copy, Debug, Default)]
pub struct DryQueue {
    since: Option<Instant>,
    total: Duration,
    count: u32,
}

impl DryQueue {
    /// The last posted receive was consumed at `now`.
    pub fn ran_dry(&mut self, now: Instant) {
        self.since = Some(now);
        self.count += 1;
    }

    /// Receives were posted again at `now`.
    pub fn refilled(&mut self, now: Instant) {
        if let Some(t0) = self.since.take() {
            self.total += now - t0;
        }
    }

    /// How many times the queue ran dry.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// How long it was empty in all (an empty spell still going on counts once
    /// [`DryQueue::finish`] ended it).
    pub fn total(&self) -> Duration {
        self.total
    }

    /// Ends an empty spell that is still going on (at the end of the run).
    pub fn finish(&mut self) {
        if let Some(t0) = self.since.take() {
            self.total += t0.elapsed();
        }
    }
}

/// The server's first line: its device, clients and how it refills receive queues.
pub fn print_server_start(device: &str, clients: usize, depth: u32, t: &ServerTuning) {
    if let Some((d, l)) = t.srq_size(clients as u32) {
        println!(
            "server: device {device}, {clients} client(s), one shared receive queue of {d} receives of \
             {MAX_REQ} B for all of them, refilled in a batch when fewer than {l} are left (SRQ limit event)"
        );
        return;
    }
    println!(
        "server: device {device}, {clients} client(s), {depth} receives of {MAX_REQ} B pre-posted per QP, {}",
        if t.no_refill && t.tick_ms == 0 {
            "NO refill at all (consumed receives are never re-posted)".to_string()
        } else if t.no_refill {
            format!("NO batched refill (re-posted only every {} ms)", t.tick_ms)
        } else {
            "batched refill after every poll".to_string()
        }
    );
}

/// What the server counted while it served.
#[derive(Debug)]
pub struct ServerReport {
    /// `post_recv` calls that re-posted consumed receives.
    pub refills: u64,
    /// Receives they re-posted.
    pub reposted: u64,
    /// Unsuccessful completions (and failed `post_send`s), by status.
    pub errors: BTreeMap<&'static str, u64>,
    /// When the first request arrived.
    pub first_req: Option<Instant>,
    /// When the last one arrived.
    pub last_req: Instant,
}

impl Default for ServerReport {
    fn default() -> Self {
        ServerReport {
            refills: 0,
            reposted: 0,
            errors: BTreeMap::new(),
            first_req: None,
            last_req: Instant::now(),
        }
    }
}

impl ServerReport {
    /// Counts one refill: (`post_recv` calls, receives) as a connection's refill returns them.
    pub fn add_refill(&mut self, (calls, receives): (u64, u64)) {
        self.refills += calls;
        self.reposted += receives;
    }

    /// Counts a completion or failure of kind `what`.
    pub fn error(&mut self, what: &'static str) {
        *self.errors.entry(what).or_default() += 1;
    }

    /// Prints the figures: what `store` served, the refills, each connection's receive
    /// queue (`dry`, in connection order; ended now), the errors.
    pub fn print<'a>(&self, store: &Store, dry: impl IntoIterator<Item = &'a mut DryQueue>) {
        let elapsed = self
            .last_req
            .saturating_duration_since(self.first_req.unwrap_or(self.last_req));
        let s = store.served;
        println!(
            "server: served {} requests (GET {}, PUT {}, DELETE {}, bad {}) in {:.3} s: {}ops/s",
            s.total(),
            s.get,
            s.put,
            s.delete,
            s.bad,
            elapsed.as_secs_f64(),
            si(per_sec(s.total() as f64, elapsed))
        );
        if self.refills > 0 {
            println!(
                "server: re-posted {} receives in {} post_recv calls (avg {:.1} per refill)",
                self.reposted,
                self.refills,
                self.reposted as f64 / self.refills.max(1) as f64
            );
        }
        for (c, d) in dry.into_iter().enumerate() {
            d.finish();
            println!(
                "server: client {c}: receive queue ran dry {} times, empty for {:.0} ms in total{}",
                d.count,
                d.total.as_secs_f64() * 1e3,
                if d.count > 0 {
                    " (SENDs arriving meanwhile got RNR NAKs)"
                } else {
                    ""
                }
            );
        }
        if !self.errors.is_empty() {
            println!("server: error completions: {:?}", self.errors);
        }
        println!("server: keys stored at exit: {}", store.len());
    }
}

/// The line that says how often the SRQ's limit event fired (the demo reads it).
pub const SRQ_EVENTS: &str = "server: SRQ limit event fired ";

/// Prints what the shared receive queue's refills did: the limit events, the batches,
/// the fewest receives left, the empty spells.
pub fn print_srq(pool: &mut SrqPool) {
    pool.dry.finish();
    println!(
        "{SRQ_EVENTS}{} times (limit {} of {} receives); {} refills posted {} receives (avg {:.1} per \
         post_srq_recv, {} without an event because the SRQ was empty)",
        pool.events,
        pool.limit(),
        pool.depth(),
        pool.refills,
        pool.reposted,
        pool.reposted as f64 / pool.refills.max(1) as f64,
        pool.refills_unarmed
    );
    println!(
        "server: SRQ: fewest receives left {}; ran dry {} times, empty for {:.0} ms in total{}",
        pool.low_water,
        pool.dry.count(),
        pool.dry.total().as_secs_f64() * 1e3,
        if pool.dry.count() > 0 {
            " (SENDs arriving meanwhile got RNR NAKs)"
        } else {
            ""
        }
    );
}
