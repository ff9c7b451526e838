//! param-pool in one thread: the owner rewrites its parameter vectors in place with the
//! example's seqlock protocol (`examples::pool::update_slot`) between the reader's
//! turns, while the reader fetches whole slots with RDMA READ and accepts one only when
//! the example's check (`examples::pool::check`: equal even versions, checksum) passes.
//! A READ whose response loses a packet is resent for the rest of the slot, which the
//! owner may have rewritten meanwhile: the check must turn that copy away. The
//! invariant: every accepted slot is exactly the vector the owner wrote for that id and
//! version (regenerated from them, `matches_generated`), of a version that was current
//! at some moment between the READ's post and its completion.

use examples::pool::{self, SlotCheck};
use verbs_api::{
    AccessFlags, Backend, CompletionQueue, MemoryRegion, ProtectionDomain, QpOf, QueuePair, SendWr,
    WorkCompletion,
};

use crate::fabric::{self, verb};

/// Vectors in the pool.
const SLOTS: usize = 4;
/// Parameters per vector: a slot of three packets (path MTU 1024).
const DIM: usize = 512;
/// The owner rewrites a slot every this many turns: a few times while a READ is under
/// way, not so often that no READ ever gets a stable copy.
const UPDATE_EVERY: usize = 8;
/// Slots the reader must accept in all.
const ACCEPTS: usize = 40;
/// Turns (a reader poll, perhaps an owner update) before the run counts as stuck: more
/// than ten times what the longest seed takes.
const TURNS: usize = 20_000;

/// The hosts of the scenario.
pub const HOSTS: [&str; 2] = ["owner", "reader"];

/// A bug planted in the reader, for the test that shows a seed finds it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bugs {
    /// The reader trusts the head version alone (even: stable), as a seqlock reader
    /// does that forgets a READ is not one atomic copy.
    pub head_only: bool,
}

/// What a run did, for the tests' totals.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    /// Slots turned away (versions torn or checksum wrong) and read again.
    pub rejected: u64,
    /// Updates the owner made.
    pub updates: u64,
}

/// Runs the reader against the rewriting owner; `Err` says what broke the invariant.
pub fn run<B: Backend>(b: &B, bugs: Bugs) -> Result<Outcome, String> {
    let size = pool::slot_size(DIM);
    let owner = fabric::node(b, "owner", 16)?;
    let reader = fabric::node(b, "reader", 64)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let pool_mr = owner.pd.reg_mr(SLOTS * size, access).map_err(verb)?;
    let local = reader
        .pd
        .reg_mr(SLOTS * size, AccessFlags::LOCAL_WRITE)
        .map_err(verb)?;
    for s in 0..SLOTS {
        pool::init_slot(&pool_mr, s * size, s as u64, DIM).map_err(verb)?;
    }
    let oqp: QpOf<B> = fabric::rc_qp(&owner, 4, 4)?;
    let rqp: QpOf<B> = fabric::rc_qp(&reader, SLOTS as u32, 4)?;
    fabric::rc_pair((&reader, &rqp), (&owner, &oqp), &fabric::params())?;

    // The owner's current version of each slot; the version each outstanding READ was
    // posted at.
    let mut version = [0u64; SLOTS];
    let mut posted: [Option<u64>; SLOTS] = [None; SLOTS];
    let mut scratch = vec![0u8; pool::payload_len(DIM)];
    let mut bytes = vec![0u8; size];
    let mut out = Outcome::default();
    let (mut accepted, mut turn) = (0, 0);
    let mut wcs = [WorkCompletion::default(); SLOTS];
    while accepted < ACCEPTS {
        turn += 1;
        if turn > TURNS {
            return Err(format!("no end after {TURNS} turns: {accepted} slots accepted"));
        }
        for s in 0..SLOTS {
            if posted[s].is_none() {
                let sge = [local.sge(s * size, size).map_err(verb)?];
                let wr = SendWr::read(s as u64, &sge, pool_mr.remote().at((s * size) as u64)).signaled();
                rqp.post_send(&[wr]).map_err(verb)?;
                posted[s] = Some(version[s]);
            }
        }
        let n = reader.cq.poll(&mut wcs).map_err(verb)?;
        for wc in &wcs[..n] {
            let s = wc.wr_id as usize;
            if !wc.is_ok() || s >= SLOTS {
                return Err(format!("READ {:#x} completed {:?}", wc.wr_id, wc.status));
            }
            let since = posted[s].take().ok_or("a READ completed twice")?;
            local.read(s * size, &mut bytes).map_err(verb)?;
            let seen = if bugs.head_only {
                let head = u64::from_ne_bytes(bytes[pool::HEAD..pool::HEAD + 8].try_into().unwrap());
                let id = u64::from_ne_bytes(bytes[pool::ID..pool::ID + 8].try_into().unwrap());
                (head % 2 == 0).then_some((id, head))
            } else {
                match pool::check(&bytes, DIM) {
                    SlotCheck::Stable { id, version } => Some((id, version)),
                    SlotCheck::Torn { .. } | SlotCheck::BadChecksum { .. } => None,
                }
            };
            let Some((id, v)) = seen else {
                out.rejected += 1;
                continue;
            };
            if id != s as u64 || !pool::matches_generated(&bytes, id, v, DIM, &mut scratch) {
                return Err(format!(
                    "slot {s} accepted as vector {id} version {v}, but its payload is not that vector"
                ));
            }
            if v < since || v > version[s] {
                return Err(format!(
                    "slot {s} read at version {v}: its versions from the READ's post to its completion were {since}..={}",
                    version[s]
                ));
            }
            accepted += 1;
        }
        // The owner rewrites its slots in turn.
        if turn % UPDATE_EVERY != 0 {
            continue;
        }
        let s = turn / UPDATE_EVERY % SLOTS;
        version[s] =
            pool::update_slot(&pool_mr, s * size, s as u64, version[s], DIM, &mut scratch).map_err(verb)?;
        out.updates += 1;
    }
    Ok(out)
}
