//! A seeded workload on the [`Fabric`](super::Fabric) and the model it must match.
//!
//! A posts a mix of SENDs, WRITEs, READs, FETCH_AND_ADDs and COMPARE_AND_SWAPs while B
//! posts receives now and then (so some SENDs meet an empty queue and are NAKed RNR),
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

use super::{faults, Attrs, Fabric, FaultMix, Stats, PD};
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
}

impl Spec {
    /// `ops` work requests over `mix`, default attributes.
    pub fn new(ops: usize, mix: FaultMix) -> Spec {
        Spec {
            ops,
            mix,
            attrs: Attrs::default(),
            max_events: 2_000_000,
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
        faults::mix(self.0)
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

fn region(f: &mut Fabric, of_b: bool, len: usize) -> Arc<MrShared> {
    let key = f.fresh_key(of_b);
    let mr = Arc::new(MrShared::new_owned(PD, key, len, AccessFlags::ALL).expect("a region of this size"));
    if of_b { f.b_mrs() } else { f.a_mrs() }.insert(mr.clone());
    mr
}

fn sge(m: &MrShared, off: usize, len: usize) -> Sge {
    Sge::new(m.addr() + off as u64, len as u32, m.key)
}

fn put(m: &Arc<MrShared>, at: usize, data: &[u8]) {
    Seg {
        mr: m.clone(),
        offset: at,
        len: data.len(),
    }
    .copy_in(0, data);
}

fn get(m: &Arc<MrShared>, at: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    Seg {
        mr: m.clone(),
        offset: at,
        len,
    }
    .copy_out(0, &mut out);
    out
}

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Runs the workload of `seed` under `spec` and checks it against the model.
pub fn run(seed: u64, spec: &Spec) -> Result<Outcome, Violation> {
    let fail = |what: String| Violation { seed, what };
    let mut f = Fabric::new(seed, spec.mix, spec.attrs);
    let mut rng = Rng(seed ^ 0x5eed);
    let local = region(&mut f, false, spec.ops * MAX_RDMA + 4096);
    let remote = region(&mut f, true, REMOTE + 16);
    let rbufs = region(&mut f, true, spec.ops.min(RECVS) * MAX_SEND);
    let mut model = vec![0u8; REMOTE + 16];
    let mut expect: Vec<(u64, Expect)> = Vec::new();
    let mut sends: Vec<Vec<u8>> = Vec::new();
    let mut recvs = 0usize;
    let mut next_local = 0usize;
    // READs since the last fence: a WRITE over their bytes must wait for them
    // (`IBV_SEND_FENCE`), or a READ resent after its response was lost would read it.
    let mut unfenced_reads: Vec<(usize, usize)> = Vec::new();
    let post_recv = |f: &mut Fabric, recvs: &mut usize| {
        if *recvs < spec.ops.min(RECVS) {
            let s = [sge(&rbufs, *recvs * MAX_SEND, MAX_SEND)];
            f.resp
                .post(&RecvWr::new(1_000_000 + *recvs as u64, &s))
                .expect("room for every receive");
            *recvs += 1;
        }
    };
    for _ in 0..rng.below(8) {
        post_recv(&mut f, &mut recvs);
    }
    for id in 1..=spec.ops as u64 {
        let at = next_local;
        let (kind, exp): (Kind, Expect);
        let len;
        let mut fence = false;
        match rng.below(10) {
            0..=3 => {
                len = rng.below(MAX_SEND as u64 + 1) as usize;
                let data: Vec<u8> = (0..len)
                    .map(|i| (i as u64 ^ id.wrapping_mul(131)) as u8)
                    .collect();
                put(&local, at, &data);
                sends.push(data);
                kind = Kind::Send;
                exp = Expect::Send;
            }
            4 | 5 => {
                let off = rng.below(REMOTE as u64) as usize;
                len = (rng.below(MAX_RDMA as u64 + 1) as usize).min(REMOTE - off);
                let byte = rng.next() as u8;
                if unfenced_reads.iter().any(|&(o, l)| o < off + len && off < o + l) {
                    fence = true;
                    unfenced_reads.clear();
                }
                put(&local, at, &vec![byte; len]);
                model[off..off + len].fill(byte);
                let dst = (remote.addr() + off as u64, remote.key);
                kind = Kind::Write(dst);
                exp = Expect::Write;
            }
            6 | 7 => {
                let off = rng.below(REMOTE as u64) as usize;
                len = (rng.below(MAX_RDMA as u64 + 1) as usize).min(REMOTE - off);
                let src = (remote.addr() + off as u64, remote.key);
                unfenced_reads.push((off, len));
                kind = Kind::Read(src);
                exp = Expect::Read(at, model[off..off + len].to_vec());
            }
            8 => {
                len = 8;
                let add = rng.next() >> 40;
                let old = word(&model, FAA_AT);
                model[FAA_AT..FAA_AT + 8].copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
                let dst = (remote.addr() + FAA_AT as u64, remote.key);
                kind = Kind::Faa(dst, add);
                exp = Expect::Atomic(WcOpcode::FetchAdd, at, old);
            }
            _ => {
                len = 8;
                let old = word(&model, CAS_AT);
                // Half of them compare equal and swap.
                let compare = if rng.below(2) == 0 { old } else { rng.next() };
                let swap = rng.next();
                if compare == old {
                    model[CAS_AT..CAS_AT + 8].copy_from_slice(&swap.to_ne_bytes());
                }
                let dst = (remote.addr() + CAS_AT as u64, remote.key);
                kind = Kind::Cas(dst, compare, swap);
                exp = Expect::Atomic(WcOpcode::CompSwap, at, old);
            }
        }
        next_local += len.max(8).next_multiple_of(8);
        let s = [sge(&local, at, len)];
        let wr = kind.wr(id, &s).signaled();
        let wr = if fence { wr.fence() } else { wr };
        let mut tries = 0;
        loop {
            match f.post(&wr) {
                Ok(()) => break,
                Err(PostCheck::Full | PostCheck::FullUnpolled) if tries < 1000 => {
                    tries += 1;
                    let t = f.now() + Duration::from_millis(1);
                    f.run_until(t, spec.max_events);
                }
                Err(e) => return Err(fail(format!("post of WR {id} refused: {e:?}"))),
            }
        }
        expect.push((id, exp));
        if rng.below(3) == 0 {
            post_recv(&mut f, &mut recvs);
        }
        if rng.below(4) == 0 {
            let t = f.now() + Duration::from_micros(rng.below(100));
            f.run_until(t, spec.max_events);
        }
        if let Some(b) = f.broken() {
            return Err(fail(format!("{b:?}")));
        }
    }
    while recvs < sends.len() {
        post_recv(&mut f, &mut recvs);
    }
    f.run_until(Duration::from_secs(3600), spec.max_events);
    check(&f, &expect, &sends, &local, &remote, &rbufs, &model).map_err(fail)?;
    Ok(Outcome {
        trace: f.trace(),
        stats: f.stats,
        took: f.now(),
    })
}

/// The model's checks, in the order a failure is easiest to read.
fn check(
    f: &Fabric,
    expect: &[(u64, Expect)],
    sends: &[Vec<u8>],
    local: &Arc<MrShared>,
    remote: &Arc<MrShared>,
    rbufs: &Arc<MrShared>,
    model: &[u8],
) -> Result<(), String> {
    if let Some(b) = f.broken() {
        return Err(format!("{b:?}"));
    }
    let (a_err, b_err) = f.errors();
    let first_bad = f.send_wc.iter().find(|w| w.status != WcStatus::Success);
    if a_err || b_err || first_bad.is_some() {
        return Err(format!(
            "an error on a correct workload (A in ERR: {a_err}, B in ERR: {b_err}; first failed completion: {first_bad:?}; \
             {} of {} WRs completed)",
            f.send_wc.len(),
            expect.len()
        ));
    }
    let got: Vec<u64> = f.send_wc.iter().map(|w| w.wr_id).collect();
    let want: Vec<u64> = expect.iter().map(|(id, _)| *id).collect();
    if got != want {
        let at = got
            .iter()
            .zip(&want)
            .position(|(g, w)| g != w)
            .unwrap_or(got.len().min(want.len()));
        return Err(format!(
            "send completions out of order or missing: {} of {} arrived, first difference at #{at}",
            got.len(),
            want.len()
        ));
    }
    if f.recv_wc.len() != sends.len() {
        return Err(format!(
            "{} receive completions for {} SENDs",
            f.recv_wc.len(),
            sends.len()
        ));
    }
    for (k, ((w, _), data)) in f.recv_wc.iter().zip(sends).enumerate() {
        if w.wr_id != 1_000_000 + k as u64
            || w.status != WcStatus::Success
            || w.byte_len as usize != data.len()
        {
            return Err(format!("receive #{k}: {w:?}, for a SEND of {} bytes", data.len()));
        }
        if get(rbufs, k * MAX_SEND, data.len()) != *data {
            return Err(format!("receive #{k} holds other bytes than SEND #{k}"));
        }
    }
    let mem = get(remote, 0, model.len());
    if mem[..REMOTE] != model[..REMOTE] {
        let at = mem.iter().zip(model).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!("B's memory differs from the model at byte {at}"));
    }
    if word(&mem, FAA_AT) != word(model, FAA_AT) || word(&mem, CAS_AT) != word(model, CAS_AT) {
        return Err(format!(
            "atomic words {:#x}/{:#x}, the model {:#x}/{:#x}: an atomic executed other than once",
            word(&mem, FAA_AT),
            word(&mem, CAS_AT),
            word(model, FAA_AT),
            word(model, CAS_AT)
        ));
    }
    for (id, e) in expect {
        match e {
            Expect::Read(at, want) if get(local, *at, want.len()) != *want => {
                return Err(format!("READ {id} returned other bytes than the model"));
            }
            Expect::Atomic(op, at, old) => {
                let got = word(&get(local, *at, 8), 0);
                if got != *old {
                    return Err(format!("{op:?} {id} returned {got:#x}, the model {old:#x}"));
                }
            }
            _ => {}
        }
    }
    Ok(())
}
