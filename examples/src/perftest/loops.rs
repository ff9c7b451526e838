//! perftest's measurement loops, for `perf --perftest`: the calls perftest 4.5 makes, in
//! its order, so that a side-by-side run compares the verbs layers and not two ways of
//! waiting (`run_iter_lat`, `run_iter_lat_send`, `run_iter_lat_write`, `run_iter_bw` and
//! `run_iter_bw_server` in `perftest_resources.c`).
//!
//! - Waiting is busy polling: `poll` for one completion (a batch of 16 in the bandwidth
//!   loops) until it returns one, or a load of the byte a peer's WRITE sets; no yield, no
//!   clock read per poll. A wait still ends: every 4096th empty poll reads the cycle
//!   counter, and a wait longer than the run's timeout fails naming what it waited for.
//! - Stamps come from the cycle counter ([`clock`](super::clock)): one before each post.
//!   The bandwidth loop also stamps each polled completion.
//! - The bandwidth loop's WRs walk their local and remote addresses through a page a
//!   cache line at a time, as perftest's do ([`walk`](super::walk)).
//! - One WR per `post_send`; every `cq_mod`-th WR and the last are signaled
//!   (latency tests: every WR). SEND tests take receive completions from a CQ of their
//!   own, repost one receive per completion while more are to come, and wait for each
//!   send's completion right after posting it.
//!
//! These loops are for devices that make progress on their own (an HCA, rxe). The
//! default loops in `src/bin/perf/` yield and nap when idle, which a software HCA
//! sharing a few CPUs with the test needs.

use anyhow::{bail, Context as _};
use verbs_api::{Backend, CompletionQueue, MemoryRegion, QueuePair, SendFlags, SendWr, Sge, WorkCompletion};

use super::clock::{self, Cycles};
use super::cycle_stats::NO_PEAK_ABOVE;
use super::opts::{AtomicType, Test};
use super::side::{to_peer, Side};
use super::walk::{self, Walk};
use crate::wait::check_wc;
use crate::Res;

/// Completions polled at once by the bandwidth loops (perftest's `CTX_POLL_BATCH`).
const POLL_BATCH: usize = 16;

/// A bounded busy wait: reads the clock only every 4096th idle turn (the first such
/// reading starts the count), so that a wait that ends soon costs no clock reading.
struct Spin {
    start: Option<Cycles>,
    limit: Cycles,
    turns: u32,
}

impl Spin {
    #[inline(always)]
    fn new(side: &Side<impl Backend>) -> Spin {
        Spin {
            start: None,
            limit: side.spin_limit,
            turns: 0,
        }
    }

    #[inline(always)]
    fn idle(&mut self, what: &dyn Fn() -> String) -> Res<()> {
        self.turns = self.turns.wrapping_add(1);
        if self.turns % 4096 == 0 {
            let now = clock::now();
            let start = *self.start.get_or_insert(now);
            if now.wrapping_sub(start) > self.limit {
                bail!(
                    "timed out waiting for {} (a lost completion or a dead peer)",
                    what()
                );
            }
        }
        Ok(())
    }
}

/// Polls `cq` for one completion, busily, and checks it.
#[inline(always)]
fn poll_one<C: CompletionQueue>(cq: &C, spin: &mut Spin, what: &dyn Fn() -> String) -> Res<WorkCompletion> {
    let mut wc = [WorkCompletion::default()];
    while cq.poll(&mut wc)? == 0 {
        spin.idle(what)?;
    }
    check_wc(&wc[0], what)?;
    Ok(wc[0])
}

/// READ or atomic latency (`run_iter_lat`): post one signaled WR, poll its completion;
/// returns the stamp of each post.
pub fn read_atomic_lat<B: Backend>(side: &mut Side<B>, size: usize, iters: u64) -> Res<Vec<Cycles>> {
    let sge = [side
        .mr
        .sge(0, if side.cfg.test == Test::ReadLat { size } else { 8 })?];
    let remote = side.remote.at(0);
    let wr = match (side.cfg.test, side.cfg.atomic) {
        (Test::ReadLat, _) => SendWr::read(0, &sge, remote),
        (_, AtomicType::FetchAndAdd) => SendWr::fetch_and_add(0, &sge, remote, 1),
        (_, AtomicType::CmpAndSwap) => SendWr::cmp_and_swp(0, &sge, remote, 0, 0),
    }
    .signaled();
    let mut tposted = vec![0; iters as usize];
    let name = side.cfg.test.name();
    for t in tposted.iter_mut() {
        *t = clock::now();
        side.rc.qp.post_send(&[wr]).context("posting")?;
        let mut spin = Spin::new(side);
        poll_one(&side.rc.cq, &mut spin, &|| format!("a {name} completion"))?;
    }
    Ok(tposted)
}

/// SEND ping-pong (`run_iter_lat_send`), on both sides: wait for the peer's message
/// (the client not before its first send), repost the receive, stamp, send, wait for
/// the send's completion. Receives are taken from `recv_cq`.
pub fn send_lat<B: Backend>(
    side: &mut Side<B>,
    recv_cq: &B::Cq,
    size: usize,
    iters: u64,
    client: bool,
) -> Res<Vec<Cycles>> {
    let sge = [side.mr.sge(side.max, size)?];
    let ud = side.ud.clone();
    let mut wr = to_peer(SendWr::send(1, &sge), ud.as_ref()).signaled();
    if size as u32 <= side.inline {
        wr.send_flags |= SendFlags::INLINE;
    }
    let prefilled = side.posted as u64;
    let mut tposted = vec![0; iters as usize];
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    while scnt < iters || rcnt < iters {
        if rcnt < iters && !(scnt < 1 && client) {
            let mut spin = Spin::new(side);
            poll_one(recv_cq, &mut spin, &|| format!("the peer's SEND {rcnt}"))?;
            rcnt += 1;
            side.posted -= 1;
            if rcnt + prefilled <= iters {
                side.post_recvs(1)?;
            }
        }
        if scnt < iters {
            tposted[scnt as usize] = clock::now();
            scnt += 1;
            side.rc.qp.post_send(&[wr]).context("posting")?;
            let mut spin = Spin::new(side);
            poll_one(&side.rc.cq, &mut spin, &|| {
                format!("the completion of SEND {scnt}")
            })?;
        }
    }
    Ok(tposted)
}

/// RDMA WRITE ping-pong (`run_iter_lat_write`), on both sides: wait until the last byte
/// of the receive area holds the peer's count (the client not before its first WRITE),
/// stamp, set the count in the send area, WRITE it, wait for the WRITE's completion.
pub fn write_lat<B: Backend>(side: &mut Side<B>, size: usize, iters: u64, client: bool) -> Res<Vec<Cycles>> {
    let max = side.max;
    let sge = [side.mr.sge(max, size)?];
    let mut wr = SendWr::write(1, &sge, side.remote.at(0)).signaled();
    if size as u32 <= side.inline {
        wr.send_flags |= SendFlags::INLINE;
    }
    let poll_at = size - 1;
    let (word, shift) = (poll_at & !7, poll_at % 8);
    let mut tposted = vec![0; iters as usize];
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    while scnt < iters || rcnt < iters {
        if rcnt < iters && !(scnt < 1 && client) {
            rcnt += 1;
            let want = rcnt as u8;
            let mut spin = Spin::new(side);
            while side.mr.read_u64(word)?.to_ne_bytes()[shift] != want {
                spin.idle(&|| format!("the peer's WRITE {rcnt}"))?;
            }
        }
        if scnt < iters {
            tposted[scnt as usize] = clock::now();
            scnt += 1;
            side.mr.write(max + poll_at, &[scnt as u8])?;
            side.rc.qp.post_send(&[wr]).context("posting")?;
            let mut spin = Spin::new(side);
            poll_one(&side.rc.cq, &mut spin, &|| {
                format!("the completion of WRITE {scnt}")
            })?;
        }
    }
    Ok(tposted)
}

/// A bandwidth run (`run_iter_bw`): keep `tx_depth` WRs outstanding, one post per WR,
/// every `cq_mod`-th (and the last) signaled; returns the stamps of every post and of
/// the polled completions, or above [`NO_PEAK_ABOVE`] iterations (perftest's rule) only
/// the run's start and end (see [`cycle_stats::bandwidth`](super::cycle_stats::bandwidth)).
pub fn bw<B: Backend>(side: &mut Side<B>, size: usize, iters: u64) -> Res<(Vec<Cycles>, Vec<Cycles>)> {
    let cfg = &side.cfg;
    let (depth, cq_mod) = (cfg.tx_depth as u64, cfg.cq_mod_for(size as u64) as u64);
    let sge = [side.mr.sge(side.max, size)?];
    let sge8 = [side.mr.sge(side.max, 8)?];
    let remote = side.remote.at(0);
    let ud = side.ud.clone();
    let mut template = match (cfg.test, cfg.atomic) {
        (Test::SendBw, _) => to_peer(SendWr::send(0, &sge), ud.as_ref()),
        (Test::WriteBw, _) => SendWr::write(0, &sge, remote),
        (Test::ReadBw, _) => SendWr::read(0, &sge, remote),
        (_, AtomicType::FetchAndAdd) => SendWr::fetch_and_add(0, &sge8, remote, 1),
        (_, AtomicType::CmpAndSwap) => SendWr::cmp_and_swp(0, &sge8, remote, 0, 0),
    };
    if size as u32 <= side.inline && matches!(cfg.test, Test::SendBw | Test::WriteBw) {
        template.send_flags |= SendFlags::INLINE;
    }
    let local = template.sg_list[0];
    let mut walker = Walk::new(local.length as u64);
    // perftest stamps every post and completion only when it will search the peak.
    let peak = iters <= NO_PEAK_ABOVE;
    let n = if peak { iters as usize } else { 1 };
    let (mut tposted, mut tcompleted) = (vec![0; n], vec![0; n]);
    let mut wcs = [WorkCompletion::default(); POLL_BATCH];
    let (mut scnt, mut ccnt) = (0u64, 0u64);
    let name = cfg.test.name();
    let mut spin = Spin::new(side);
    if !peak {
        tposted[0] = clock::now();
    }
    while scnt < iters || ccnt < iters {
        while scnt < iters && scnt - ccnt < depth {
            let mut wr = template;
            let walked;
            if let Some(w) = walker.as_mut() {
                let off = w.advance();
                walked = [Sge::new(local.addr + off, local.length, local.lkey)];
                wr.sg_list = &walked;
                wr.op = walk::shifted(wr.op, off);
            }
            wr.wr_id = scnt;
            if (scnt + 1) % cq_mod == 0 || scnt + 1 == iters {
                wr.send_flags |= SendFlags::SIGNALED;
            }
            if peak {
                tposted[scnt as usize] = clock::now();
            }
            side.rc.qp.post_send(&[wr]).context("posting")?;
            scnt += 1;
        }
        if ccnt < iters {
            let k = side.rc.cq.poll(&mut wcs)?;
            if k == 0 {
                spin.idle(&|| format!("{name} completions ({ccnt} of {iters} done, {scnt} posted)"))?;
                continue;
            }
            spin = Spin::new(side);
            for wc in &wcs[..k] {
                check_wc(wc, &|| format!("{name} message {}", wc.wr_id))?;
                ccnt += cq_mod;
                if peak {
                    tcompleted[(ccnt.min(iters) - 1) as usize] = clock::now();
                }
            }
            ccnt = ccnt.min(iters);
        }
    }
    if !peak {
        tcompleted[0] = clock::now();
    }
    Ok((tposted, tcompleted))
}

/// The receiving side of a SEND bandwidth run (`run_iter_bw_server`): poll receive
/// completions 16 at a time from `recv_cq` and repost one receive per completion while
/// more messages are to come.
pub fn send_bw_server<B: Backend>(side: &mut Side<B>, recv_cq: &B::Cq, iters: u64) -> Res<()> {
    let mut wcs = [WorkCompletion::default(); POLL_BATCH];
    let mut posted_total = side.posted as u64;
    let mut rcnt = 0u64;
    let mut spin = Spin::new(side);
    while rcnt < iters {
        let k = recv_cq.poll(&mut wcs)?;
        if k == 0 {
            spin.idle(&|| format!("SENDs ({rcnt} of {iters} received)"))?;
            continue;
        }
        spin = Spin::new(side);
        for wc in &wcs[..k] {
            check_wc(wc, &|| "a receive".to_string())?;
            rcnt += 1;
            side.posted -= 1;
            if posted_total < iters {
                side.post_recvs(1)?;
                posted_total += 1;
            }
        }
    }
    Ok(())
}
