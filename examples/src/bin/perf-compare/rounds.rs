//! One round of every group of targets ([`Rounds::round`]): each sim figure is paired
//! with its baseline measured right before and after it ([`bracketed`]; the one-thread
//! cost row: a TCP run right before it; the message rate row: its fixed target). The
//! host's speed drifts by tens of percent from one minute to the next, so a ratio is
//! only taken between neighbours, and the table reports the median of those ratios.

use std::collections::BTreeMap;

use examples::stats::{median, Figures};
use examples::{peers, streams, Res};

use crate::bracket::{bracketed, Baseline as _, Stream};
use crate::multi_qp::multi_qp_write_bw;
use crate::perf_runs::{perf1, perf1_same_host_in};
use crate::report::Pair;
use crate::rows::{
    map_key, peer_key, COST_MESSAGES_PER_LAT_ITER, MAP_MODE, PEER_ITERS_PER_LAT_ITER, PEER_ROWS, QP_ROWS,
    RATE_MSGS, SHM_BW_ITERS, SHM_RATE_MPPS, SHM_RATE_ROW, SHM_ROWS, SHORT_ROW, SHORT_RUNS, SRQ_BW_ROW,
    SRQ_BW_TCP_ROW, SRQ_RATE_ROW, TCP_QP_ROW, UD_ROW,
};
use crate::tcp::{tcp_pingpong, tcp_stream, Peer};
use crate::{cost, Cli, Group};

/// What the rounds measured: the raw TCP figures and every (sim, baseline) pair, by row.
#[derive(Debug, Default)]
pub struct Rounds {
    /// The busy-polling ping-pong's one-way medians.
    pub tcp_busy: Vec<f64>,
    /// The blocking ping-pong's.
    pub tcp_block: Vec<f64>,
    /// Each stream baseline's figure (the better of its two halves).
    pub tcp_bw: Vec<f64>,
    /// Each stream baseline's (blocking, busy) halves.
    pub tcp_bw_modes: Vec<(f64, f64)>,
    /// The pairs, by row key.
    pub pairs: BTreeMap<String, Vec<Pair>>,
    /// Rows over a transport that drops: each run's (messages dropped, messages sent).
    pub drops: BTreeMap<String, Vec<(u64, u64)>>,
    /// Rows not measured, and why.
    pub unmeasured: BTreeMap<String, String>,
}

/// Adds one (sim, baseline) pair to row `k`.
fn pair(pairs: &mut BTreeMap<String, Vec<Pair>>, k: &str, sim: f64, base: f64, tries: u32) {
    pairs
        .entry(k.to_string())
        .or_default()
        .push(Pair { sim, base, tries });
}

impl Rounds {
    /// One round of every group `want` selects, against the TCP `peer`.
    pub fn round(&mut self, cli: &Cli, peer: &Peer, want: &dyn Fn(Group) -> bool) -> Res<()> {
        if want(Group::Lat) {
            self.lat(cli, peer)?;
        }
        if want(Group::Bw) {
            self.bw(peer)?;
        }
        if want(Group::Rate) {
            self.rate()?;
        }
        if want(Group::Peers) {
            self.peers(cli)?;
        }
        if want(Group::SameHost) {
            self.same_host(cli)?;
        }
        if want(Group::Cost) {
            let msgs = cli.lat_iters * COST_MESSAGES_PER_LAT_ITER;
            let base = cost::tcp_ns_per_message(msgs)?;
            let sim = cost::sim_ns_per_message(msgs)?;
            pair(&mut self.pairs, "cost", sim.message, base.message, 1);
            pair(&mut self.pairs, "empty_look", sim.empty_look, base.empty_look, 1);
        }
        if want(Group::Qps) {
            self.qps(cli)?;
        }
        if want(Group::Srq) {
            self.srq(peer)?;
        }
        if want(Group::Ud) {
            self.ud()?;
        }
        Ok(())
    }

    /// The latency tests, each between two busy-polling ping-pongs.
    fn lat(&mut self, cli: &Cli, peer: &Peer) -> Res<()> {
        let n = cli.lat_iters.to_string();
        self.tcp_block
            .push(median(tcp_pingpong(peer, cli.lat_iters / 4, false)?));
        // Each sim test between two ping-pongs, as the bandwidth tests: this VM's
        // latency flips between two levels (TCP one way about 3.9 or 5.7 us) for
        // seconds at a time, and a test in one level is no match for a baseline
        // from the other.
        let tcp_busy = &mut self.tcp_busy;
        let mut one_way = || -> Res<f64> {
            let v = median(tcp_pingpong(peer, cli.lat_iters, true)?);
            tcp_busy.push(v);
            Ok(v)
        };
        let mut before = one_way()?;
        for t in ["send_lat", "write_lat", "read_lat", "atomic_lat"] {
            let sim = || Ok(perf1(&[t, "-s", "8", "-n", &n])?.t_typical_us);
            let b = bracketed(before, sim, &mut one_way)?;
            before = b.last;
            // READ and atomics take a round trip.
            let trips = if t.starts_with("send") || t.starts_with("write") {
                1.0
            } else {
                2.0
            };
            pair(&mut self.pairs, t, b.sim, trips * b.base, b.tries);
        }
        Ok(())
    }

    /// SEND over a shared receive queue: 64 B messages and 1 MiB between two runs
    /// without one, and 1 MiB between two TCP streams.
    fn srq(&mut self, peer: &Peer) -> Res<()> {
        let n = RATE_MSGS.to_string();
        let send_bw = |size: &str, n: &str, srq: bool| {
            let mut args = vec!["send_bw", "-s", size, "-t", "128", "-n", n];
            if srq {
                args.push("--use_srq");
            }
            perf1(&args)
        };
        let rate = |srq| Ok(send_bw("64", &n, srq)?.msg_rate_mpps);
        let b = bracketed(rate(false)?, || rate(true), || rate(false))?;
        pair(&mut self.pairs, SRQ_RATE_ROW, b.sim, b.base, b.tries);
        let bw = |srq| Ok(send_bw("1048576", "8000", srq)?.bw_avg_mbps);
        let b = bracketed(bw(false)?, || bw(true), || bw(false))?;
        pair(&mut self.pairs, SRQ_BW_ROW, b.sim, b.base, b.tries);
        let (tcp_bw, tcp_bw_modes) = (&mut self.tcp_bw, &mut self.tcp_bw_modes);
        let mut stream = || stream_baseline(peer, tcp_bw, tcp_bw_modes);
        let b = bracketed(stream()?, || bw(true), &mut stream)?;
        pair(&mut self.pairs, SRQ_BW_TCP_ROW, b.sim, b.base, b.tries);
        Ok(())
    }

    /// UD: 64-byte datagrams, the rate at which the receiver takes them, and the
    /// datagrams dropped apart; not measured on a device without UD.
    fn ud(&mut self) -> Res<()> {
        if !sim_has_ud()? {
            self.unmeasured
                .insert(UD_ROW.into(), "not measured: the device has no UD".into());
            return Ok(());
        }
        let n = RATE_MSGS.to_string();
        let row = perf1(&["send_bw", "-c", "UD", "-s", "64", "-t", "128", "-n", &n])?;
        pair(&mut self.pairs, UD_ROW, row.msg_rate_mpps, 1.0, 1);
        self.drops
            .entry(UD_ROW.into())
            .or_default()
            .push((row.dropped.unwrap_or(0), RATE_MSGS));
        Ok(())
    }

    /// The 1 MiB bandwidth tests, each between two TCP streams.
    fn bw(&mut self, peer: &Peer) -> Res<()> {
        // The stronger of the two polling modes is a stream's figure. Each sim test
        // runs between two streams and their mean is its baseline, as for the QP rows:
        // with a stream before it only, a sim run that fell into one of this VM's slow
        // phases was held against a stream from before the phase began. When the two
        // streams disagree by more than `STEADY`, blocking half with blocking half or
        // busy half with busy half, the host changed speed meanwhile and the test runs
        // again (`bracketed`, `Stream`).
        let (tcp_bw, tcp_bw_modes) = (&mut self.tcp_bw, &mut self.tcp_bw_modes);
        let mut stream = || stream_baseline(peer, tcp_bw, tcp_bw_modes);
        let mut before = stream()?;
        for t in ["write_bw", "read_bw", "send_bw"] {
            let sim = || Ok(perf1(&[t, "-s", "1048576", "-n", "8000"])?.bw_avg_mbps);
            let b = bracketed(before, sim, &mut stream)?;
            pair(&mut self.pairs, t, b.sim, b.base, b.tries);
            before = b.last;
        }
        Ok(())
    }

    /// The message rate, and the short runs.
    fn rate(&mut self) -> Res<()> {
        let row = perf1(&["write_bw", "-s", "64", "-t", "128", "-n", "1000000"])?;
        pair(&mut self.pairs, "write_bw_64", row.msg_rate_mpps, 1.0, 1);
        // Short runs of small WRITEs with a shallow send queue: the slowest of several
        // against their median shows runs that stall (a few milliseconds each, so
        // cheap to repeat).
        let mut rates = Vec::with_capacity(SHORT_RUNS);
        for _ in 0..SHORT_RUNS {
            rates.push(perf1(&["write_bw", "-s", "64", "-t", "16", "-n", "2000"])?.msg_rate_mpps);
        }
        let rates: Figures = rates.into_iter().collect();
        pair(&mut self.pairs, SHORT_ROW, rates.min(), rates.median(), 1);
        Ok(())
    }

    /// The sim's latency against UCX and libfabric.
    fn peers(&mut self, cli: &Cli) -> Res<()> {
        let n = cli.lat_iters.to_string();
        // Each of the sim's counterparts between two runs of the reference.
        for (peer, tests) in PEER_ROWS {
            let reference = || peer.measure(cli.lat_iters * PEER_ITERS_PER_LAT_ITER);
            let mut before = reference()?;
            for t in tests {
                let sim = || Ok(perf1(&[t, "-s", "8", "-n", &n])?.t_typical_us);
                let b = bracketed(before, sim, reference)?;
                before = b.last;
                pair(&mut self.pairs, &peer_key(t, peer), b.sim, b.base, b.tries);
            }
        }
        Ok(())
    }

    /// The sim's same-host path against UCX and libfabric over shared memory, each sim
    /// test between two runs of its reference (a test measured in map mode too: that
    /// run next, between the default's second run of the reference and a third); and its
    /// message rate, in both modes.
    fn same_host(&mut self, cli: &Cli) -> Res<()> {
        let n = cli.lat_iters.to_string();
        let bw_n = SHM_BW_ITERS.to_string();
        let size = peers::BW_SIZE.to_string();
        for (peer, test, _, map) in SHM_ROWS {
            let iters = match peer.is_bandwidth() {
                true => SHM_BW_ITERS,
                false => cli.lat_iters * PEER_ITERS_PER_LAT_ITER,
            };
            let reference = || peer.measure(iters);
            let sim = |mode: Option<&str>| match peer.is_bandwidth() {
                true => Ok(perf1_same_host_in(mode, &[test, "-s", &size, "-n", &bw_n])?.bw_avg_mbps),
                false => Ok(perf1_same_host_in(mode, &[test, "-s", "8", "-n", &n])?.t_typical_us),
            };
            let key = peer_key(test, peer);
            let b = bracketed(reference()?, || sim(None), reference)?;
            pair(&mut self.pairs, &key, b.sim, b.base, b.tries);
            if map {
                let b = bracketed(b.last, || sim(Some(MAP_MODE)), reference)?;
                pair(&mut self.pairs, &map_key(&key), b.sim, b.base, b.tries);
            }
        }
        let n = RATE_MSGS.to_string();
        for mode in [None, Some(MAP_MODE)] {
            let row = perf1_same_host_in(mode, &["write_bw", "-s", "64", "-t", "128", "-n", &n])?;
            let key = match mode {
                None => SHM_RATE_ROW.to_string(),
                Some(_) => map_key(SHM_RATE_ROW),
            };
            pair(&mut self.pairs, &key, row.msg_rate_mpps, SHM_RATE_MPPS, 1);
        }
        Ok(())
    }

    /// 64 QPs against one, and raw TCP's 64 connections against one.
    fn qps(&mut self, cli: &Cli) -> Res<()> {
        for (t, depth, posting, _) in QP_ROWS {
            // One QP before and after the 64 (their mean is the baseline): the host's
            // speed can change between two runs, and a baseline from one side only
            // put some pairs at 0.8 and others at 1.8 of each other. Taken again when the
            // two single-QP runs disagree (`bracketed`).
            let one = || multi_qp_write_bw(1, depth, 65536, cli.qp_gib << 30, posting);
            let many = || multi_qp_write_bw(64, depth, 65536, cli.qp_gib << 30, posting);
            let b = bracketed(one()?, many, one)?;
            pair(&mut self.pairs, t, b.sim, b.base, b.tries);
        }
        // The same comparison for raw TCP with the same traffic: what 64 connections
        // cost the kernel, as against what they cost the sim.
        let one = || streams::write_bw(1, 16, 65536, cli.qp_gib << 30);
        let many = || streams::write_bw(64, 16, 65536, cli.qp_gib << 30);
        let b = bracketed(one()?, many, one)?;
        pair(&mut self.pairs, TCP_QP_ROW, b.sim, b.base, b.tries);
        Ok(())
    }
}

/// One TCP stream baseline (both halves), kept in the rounds' stream figures.
fn stream_baseline(peer: &Peer, tcp_bw: &mut Vec<f64>, modes: &mut Vec<(f64, f64)>) -> Res<Stream> {
    let s = Stream {
        blocking: tcp_stream(peer, 1.5, false)?,
        busy: tcp_stream(peer, 1.5, true)?,
    };
    modes.push((s.blocking, s.busy));
    tcp_bw.push(s.figure());
    Ok(s)
}

/// Whether the sim's devices (as `perf` opens them) have UD QPs.
fn sim_has_ud() -> Res<bool> {
    use verbs_api::{Backend as _, Context as _};
    let sim = examples::backend::sim_backend()?;
    Ok(sim.open_first()?.capabilities()?.ud)
}

/// The groups a run measures: those `--only` names (all without it), less the UCX and
/// libfabric rows when their programs are missing (an error if `--only peers` or
/// `--only same-host` asks for them).
pub fn wanted(cli: &Cli) -> Res<impl Fn(Group) -> bool + '_> {
    let missing = peers::missing();
    if !missing.is_empty() {
        if let Some(g) = cli.only.iter().find(|g| needs_peers(**g)) {
            let name = clap::ValueEnum::to_possible_value(g).map(|v| v.get_name().to_string());
            anyhow::bail!(
                "--only {} needs {} ({})",
                name.unwrap_or_default(),
                missing.join(" and "),
                peers::INSTALL
            );
        }
        eprintln!(
            "perf-compare: {} not installed, so the UCX and libfabric rows are left out ({})",
            missing.join(" and "),
            peers::INSTALL
        );
    }
    Ok(move |g: Group| {
        (cli.only.is_empty() || cli.only.contains(&g)) && (!needs_peers(g) || missing.is_empty())
    })
}

/// Whether group `g` runs UCX and libfabric.
fn needs_peers(g: Group) -> bool {
    matches!(g, Group::Peers | Group::SameHost)
}
