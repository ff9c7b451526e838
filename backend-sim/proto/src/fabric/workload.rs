//! A seeded workload on the [`Fabric`](super::Fabric) and the model it must match.
//!
//! A posts a mix of SENDs, WRITEs, READs, FETCH_AND_ADDs and COMPARE_AND_SWAPs (and with
//! [`Spec::duplex`] B does too, towards A, on the same connection) while the peer posts
//! receives now and then (so some SENDs meet an empty queue and are NAKed RNR),
//! with the clock running between posts. A WRITE over bytes an earlier READ reads is
//! fenced: without the fence, a READ resent because its response was lost is executed
//! again after the WRITE and returns the WRITE's bytes, which RC allows (IBA 9.7.5.1.5
//! has the responder re-execute a duplicate READ). RC's guarantees (IBA 9.7, 10.8.3) give a
//! sequential model: every WR completes once, in order, successfully; each receive holds
//! the SEND of its position; B's memory ends as A's WRITEs and atomics in posting order
//! leave it; each READ returns the memory as of its position, each atomic the value
//! before it, executed exactly once however often the network made A resend it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use verbs_api::{AccessFlags, RecvWr, SendWr, Sge, WcOpcode, WcStatus};

use super::{Attrs, Fabric, FaultMix, Stats, PD};
use crate::faults::network;
use crate::memory::{MrShared, Seg};
use crate::requester::PostCheck;

/// B's memory that A's WRITEs, READs and atomics reach.
const REMOTE: usize = 8192;
/// The atomics' words (after the bytes WRITEs and READs use).
const FAA_AT: usize = REMOTE;
const CAS_AT: usize = REMOTE + 8;
/// The longest SEND, and the room of each receive.
const MAX_SEND: usize = 2048;
/// Receives B can hold.
const RECVS: usize = 1024;
/// The longest WRITE or READ.
const MAX_RDMA: usize = 3000;

/// What a run does.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Work requests A posts.
    pub ops: usize,
    /// The network's faults.
    pub mix: FaultMix,
    /// The connection's attributes.
    pub attrs: Attrs,
    /// Deliveries and timer firings after which the run counts as stuck.
    pub max_events: u64,
    /// Both ends post (each its own mix, against the other's memory), not only A.
    pub duplex: bool,
    /// The network is expected to exhaust the transport retries (`retry_cnt`): every end
    /// that posts must end in ERR, its WRs completed each once and in order, successes,
    /// then one `IBV_WC_RETRY_EXC_ERR`, then `IBV_WC_WR_FLUSH_ERR` (IBA 10.3.1 and
    /// 9.7.5.1.1); otherwise any error breaks the model.
    pub retries_exhausted: bool,
}

impl Spec {
    /// `ops` work requests over `mix`, default attributes.
    pub fn new(ops: usize, mix: FaultMix) -> Spec {
        Spec {
            ops,
            mix,
            attrs: Attrs::default(),
            max_events: 2_000_000,
            duplex: false,
            retries_exhausted: false,
        }
    }
}

/// How a run that matched the model went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The hash of every delivery and completion ([`Fabric::trace`]).
    pub trace: u64,
    /// What the network did.
    pub stats: Stats,
    /// Virtual time the run took.
    pub took: Duration,
}

/// A run that did not match the model: the seed replays it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The seed.
    pub seed: u64,
    /// What differed.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {}: {}", self.seed, self.what)
    }
}

/// The workload's own choices (which operations, sizes, values): a SplitMix64 stream,
/// apart from the network's decisions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        network::mix(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What A's WR expects.
enum Expect {
    Send,
    Write,
    /// A READ: where its bytes land in A's region, and what they must be.
    Read(usize, Vec<u8>),
    /// An atomic: where the original value lands, and what it must be.
    Atomic(WcOpcode, usize, u64),
}

/// The WR A posts, without its gather list.
#[derive(Clone, Copy)]
enum Kind {
    Send,
    Write((u64, u32)),
    Read((u64, u32)),
    Faa((u64, u32), u64),
    Cas((u64, u32), u64, u64),
}

impl Kind {
    fn wr<'a>(self, id: u64, s: &'a [Sge]) -> SendWr<'a> {
        match self {
            Kind::Send => SendWr::send(id, s),
            Kind::Write(dst) => SendWr::write(id, s, dst),
            Kind::Read(src) => SendWr::read(id, s, src),
            Kind::Faa(dst, add) => SendWr::fetch_and_add(id, s, dst, add),
            Kind::Cas(dst, compare, swap) => SendWr::cmp_and_swp(id, s, dst, compare, swap),
        }
    }
}

pub(super) fn region(f: &mut Fabric, of_b: bool, len: usize) -> Arc<MrShared> {
    let key = f.fresh_key(of_b);
    let mr = Arc::new(MrShared::new_owned(PD, key, len, AccessFlags::ALL).expect("a region of this size"));
    f.end(of_b).mrs.insert(mr.clone());
    mr
}

pub(super) fn sge(m: &MrShared, off: usize, len: usize) -> Sge {
    Sge::new(m.addr() + off as u64, len as u32, m.key)
}

pub(super) fn put(m: &Arc<MrShared>, at: usize, data: &[u8]) {
    Seg {
        mr: m.clone(),
        offset: at,
        len: data.len(),
    }
    .copy_in(0, data);
}

pub(super) fn get(m: &Arc<MrShared>, at: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    Seg {
        mr: m.clone(),
        offset: at,
        len,
    }
    .copy_out(0, &mut out);
    out
}

/// `len` bytes of a message, from `seed`: no two packets of a message alike (no period
/// that divides a path MTU), so bytes sent from the wrong offset of a message show.
pub(super) fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i ^ (i >> 8).wrapping_mul(29) ^ seed.wrapping_mul(131)) as u8)
        .collect()
}

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// One direction's traffic: the requester's end (`from_b`), its buffers, the peer's
/// memory it reaches, and the model of what the peer's memory and receives must hold.
struct Flow {
    from_b: bool,
    name: &'static str,
    ops: usize,
    /// The requester's own memory (gather lists, READ and atomic results).
    local: Arc<MrShared>,
    /// The peer's memory its WRITEs, READs and atomics reach.
    remote: Arc<MrShared>,
    /// The peer's receive buffers.
    rbufs: Arc<MrShared>,
    model: Vec<u8>,
    expect: Vec<(u64, Expect)>,
    sends: Vec<Vec<u8>>,
    recvs: usize,
    next_local: usize,
    // READs since the last fence: a WRITE over their bytes must wait for them
    // (`IBV_SEND_FENCE`), or a READ resent after its response was lost would read it.
    unfenced_reads: Vec<(usize, usize)>,
    posted: u64,
}

impl Flow {
    fn new(f: &mut Fabric, from_b: bool, ops: usize) -> Flow {
        Flow {
            from_b,
            name: if from_b { "B" } else { "A" },
            ops,
            local: region(f, from_b, ops * MAX_RDMA + 4096),
            remote: region(f, !from_b, REMOTE + 16),
            rbufs: region(f, !from_b, ops.clamp(1, RECVS) * MAX_SEND),
            model: vec![0u8; REMOTE + 16],
            expect: Vec::new(),
            sends: Vec::new(),
            recvs: 0,
            next_local: 0,
            unfenced_reads: Vec::new(),
            posted: 0,
        }
    }

    /// The peer posts one more receive for this flow's SENDs.
    fn post_recv(&mut self, f: &mut Fabric) {
        if self.recvs < self.ops.clamp(1, RECVS) {
            let s = [sge(&self.rbufs, self.recvs * MAX_SEND, MAX_SEND)];
            f.end(!self.from_b)
                .post_recv(&RecvWr::new(1_000_000 + self.recvs as u64, &s))
                .expect("room for every receive");
            self.recvs += 1;
        }
    }

    /// Posts this flow's next WR, drawn from `rng`, running the fabric while the send
    /// queue is full.
    fn post_one(&mut self, f: &mut Fabric, rng: &mut Rng, max_events: u64) -> Result<(), String> {
        self.posted += 1;
        let id = self.posted;
        let at = self.next_local;
        let (kind, exp): (Kind, Expect);
        let len;
        let mut fence = false;
        let (local, remote) = (&self.local, &self.remote);
        match rng.below(10) {
            0..=3 => {
                len = rng.below(MAX_SEND as u64 + 1) as usize;
                let data = pattern(id, len);
                put(local, at, &data);
                self.sends.push(data);
                kind = Kind::Send;
                exp = Expect::Send;
            }
            4 | 5 => {
                let off = rng.below(REMOTE as u64) as usize;
                len = (rng.below(MAX_RDMA as u64 + 1) as usize).min(REMOTE - off);
                let data = pattern(rng.next(), len);
                if self
                    .unfenced_reads
                    .iter()
                    .any(|&(o, l)| o < off + len && off < o + l)
                {
                    fence = true;
                    self.unfenced_reads.clear();
                }
                put(local, at, &data);
                self.model[off..off + len].copy_from_slice(&data);
                kind = Kind::Write((remote.addr() + off as u64, remote.key));
                exp = Expect::Write;
            }
            6 | 7 => {
                let off = rng.below(REMOTE as u64) as usize;
                len = (rng.below(MAX_RDMA as u64 + 1) as usize).min(REMOTE - off);
                self.unfenced_reads.push((off, len));
                kind = Kind::Read((remote.addr() + off as u64, remote.key));
                exp = Expect::Read(at, self.model[off..off + len].to_vec());
            }
            8 => {
                len = 8;
                let add = rng.next() >> 40;
                let old = word(&self.model, FAA_AT);
                self.model[FAA_AT..FAA_AT + 8].copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
                kind = Kind::Faa((remote.addr() + FAA_AT as u64, remote.key), add);
                exp = Expect::Atomic(WcOpcode::FetchAdd, at, old);
            }
            _ => {
                len = 8;
                let old = word(&self.model, CAS_AT);
                // Half of them compare equal and swap.
                let compare = if rng.below(2) == 0 { old } else { rng.next() };
                let swap = rng.next();
                if compare == old {
                    self.model[CAS_AT..CAS_AT + 8].copy_from_slice(&swap.to_ne_bytes());
                }
                kind = Kind::Cas((remote.addr() + CAS_AT as u64, remote.key), compare, swap);
                exp = Expect::Atomic(WcOpcode::CompSwap, at, old);
            }
        }
        self.next_local += len.max(8).next_multiple_of(8);
        let s = [sge(local, at, len)];
        let wr = kind.wr(id, &s).signaled();
        let wr = if fence { wr.fence() } else { wr };
        let mut tries = 0;
        loop {
            match f.end(self.from_b).post(&wr) {
                Ok(()) => break,
                Err(PostCheck::Full | PostCheck::FullUnpolled) if tries < 1000 => {
                    tries += 1;
                    let t = f.now() + Duration::from_millis(1);
                    f.run_until(t, max_events);
                }
                Err(e) => return Err(format!("{}: post of WR {id} refused: {e:?}", self.name)),
            }
        }
        self.expect.push((id, exp));
        Ok(())
    }

    /// The model of a run whose retries ran out: this end in ERR, each WR completed once
    /// and in order, successes, then one RETRY_EXC_ERR (the WR the peer never
    /// acknowledged), then flushes; each receive the peer holds for it completed at most
    /// once, in order, and once the peer is in ERR only successes and then flushes.
    fn check_retries_exhausted(&self, f: &Fabric) -> Result<(), String> {
        let (me, peer) = if self.from_b { (&f.b, &f.a) } else { (&f.a, &f.b) };
        let name = self.name;
        if !me.in_error() {
            return Err(format!(
                "{name} is in {:?}, not ERR, after its retries ran out",
                me.qp().state()
            ));
        }
        let got: Vec<u64> = me.send_wc.iter().map(|w| w.wr_id).collect();
        let want: Vec<u64> = self.expect.iter().map(|(id, _)| *id).collect();
        if got != want {
            return Err(format!(
                "{name}'s send completions: {got:?}, not each WR once in order: {want:?}"
            ));
        }
        let statuses: Vec<WcStatus> = me.send_wc.iter().map(|w| w.status).collect();
        let ok = statuses
            .iter()
            .position(|s| *s != WcStatus::Success)
            .is_some_and(|k| {
                statuses[k] == WcStatus::RetryExcErr
                    && statuses[k + 1..].iter().all(|s| *s == WcStatus::WrFlushErr)
            });
        if !ok {
            return Err(format!(
                "{name}'s statuses {statuses:?}: not successes, one RETRY_EXC_ERR, then flushes"
            ));
        }
        let ids: Vec<u64> = peer.recv_wc.iter().map(|(w, _)| w.wr_id).collect();
        let posted: Vec<u64> = (0..self.recvs as u64).map(|k| 1_000_000 + k).collect();
        if !posted.starts_with(&ids) {
            return Err(format!(
                "receives for {name}'s SENDs completed as {ids:?}, not once each in order"
            ));
        }
        let mut flushed = false;
        for (w, _) in &peer.recv_wc {
            flushed |= w.status == WcStatus::WrFlushErr;
            if w.status
                != if flushed {
                    WcStatus::WrFlushErr
                } else {
                    WcStatus::Success
                }
            {
                return Err(format!("a receive for {name}'s SENDs: {w:?}"));
            }
        }
        Ok(())
    }

    /// The model's checks, in the order a failure is easiest to read.
    fn check(&self, f: &Fabric, retries_exhausted: bool) -> Result<(), String> {
        if retries_exhausted {
            return self.check_retries_exhausted(f);
        }
        let (me, peer) = if self.from_b { (&f.b, &f.a) } else { (&f.a, &f.b) };
        let name = self.name;
        let first_bad = me.send_wc.iter().find(|w| w.status != WcStatus::Success);
        if me.in_error() || peer.in_error() || first_bad.is_some() {
            return Err(format!(
                "{name}'s WRs: an error on a correct workload ({name} in ERR: {}, its peer in ERR: {}; first failed \
                 completion: {first_bad:?}; {} of {} WRs completed)",
                me.in_error(),
                peer.in_error(),
                me.send_wc.len(),
                self.expect.len()
            ));
        }
        let got: Vec<u64> = me.send_wc.iter().map(|w| w.wr_id).collect();
        let want: Vec<u64> = self.expect.iter().map(|(id, _)| *id).collect();
        if got != want {
            let at = got
                .iter()
                .zip(&want)
                .position(|(g, w)| g != w)
                .unwrap_or(got.len().min(want.len()));
            return Err(format!(
                "{name}'s send completions out of order or missing: {} of {} arrived, first difference at #{at}",
                got.len(),
                want.len()
            ));
        }
        if peer.recv_wc.len() != self.sends.len() {
            return Err(format!(
                "{} receive completions for {name}'s {} SENDs",
                peer.recv_wc.len(),
                self.sends.len()
            ));
        }
        for (k, ((w, _), data)) in peer.recv_wc.iter().zip(&self.sends).enumerate() {
            if w.wr_id != 1_000_000 + k as u64
                || w.status != WcStatus::Success
                || w.byte_len as usize != data.len()
            {
                return Err(format!(
                    "receive #{k} of {name}'s SENDs: {w:?}, for a SEND of {} bytes",
                    data.len()
                ));
            }
            if get(&self.rbufs, k * MAX_SEND, data.len()) != *data {
                return Err(format!("receive #{k} holds other bytes than {name}'s SEND #{k}"));
            }
        }
        let model = &self.model;
        let mem = get(&self.remote, 0, model.len());
        if mem[..REMOTE] != model[..REMOTE] {
            let at = mem.iter().zip(model).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "the memory {name} writes differs from the model at byte {at}"
            ));
        }
        if word(&mem, FAA_AT) != word(model, FAA_AT) || word(&mem, CAS_AT) != word(model, CAS_AT) {
            return Err(format!(
                "{name}'s atomic words {:#x}/{:#x}, the model {:#x}/{:#x}: an atomic executed other than once",
                word(&mem, FAA_AT),
                word(&mem, CAS_AT),
                word(model, FAA_AT),
                word(model, CAS_AT)
            ));
        }
        for (id, e) in &self.expect {
            match e {
                Expect::Read(at, want) if get(&self.local, *at, want.len()) != *want => {
                    return Err(format!("{name}'s READ {id} returned other bytes than the model"));
                }
                Expect::Atomic(op, at, old) => {
                    let got = word(&get(&self.local, *at, 8), 0);
                    if got != *old {
                        return Err(format!(
                            "{name}'s {op:?} {id} returned {got:#x}, the model {old:#x}"
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Runs the workload of `seed` under `spec` and checks it against the model.
pub fn run(seed: u64, spec: &Spec) -> Result<Outcome, Violation> {
    let fail = |what: String| Violation { seed, what };
    let mut f = Fabric::new(seed, spec.mix, spec.attrs);
    let mut rng = Rng(seed ^ 0x5eed);
    let mut flows = vec![Flow::new(&mut f, false, spec.ops)];
    if spec.duplex {
        flows.push(Flow::new(&mut f, true, spec.ops));
    }
    for flow in &mut flows {
        for _ in 0..rng.below(8) {
            flow.post_recv(&mut f);
        }
    }
    for _ in 0..spec.ops * flows.len() {
        // (No draw with one flow, so that a one-way run repeats the same seeds' choices.)
        let k = if flows.len() == 1 {
            0
        } else {
            rng.below(2) as usize
        };
        let k = if flows[k].posted as usize == spec.ops {
            1 - k
        } else {
            k
        };
        let flow = &mut flows[k];
        flow.post_one(&mut f, &mut rng, spec.max_events).map_err(fail)?;
        if rng.below(3) == 0 {
            flow.post_recv(&mut f);
        }
        if rng.below(4) == 0 {
            let t = f.now() + Duration::from_micros(rng.below(100));
            f.run_until(t, spec.max_events);
        }
        if let Some(b) = f.broken() {
            return Err(fail(format!("{b:?}")));
        }
    }
    for flow in &mut flows {
        while flow.recvs < flow.sends.len() {
            flow.post_recv(&mut f);
        }
    }
    f.run_until(Duration::from_secs(3600), spec.max_events);
    if let Some(b) = f.broken() {
        return Err(fail(format!("{b:?}")));
    }
    for flow in &flows {
        flow.check(&f, spec.retries_exhausted).map_err(fail)?;
    }
    Ok(Outcome {
        trace: f.trace(),
        stats: f.stats(),
        took: f.now(),
    })
}
