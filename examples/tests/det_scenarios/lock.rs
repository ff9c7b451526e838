//! dist-lock in one thread: clients on their own devices and QPs take a CMP_AND_SWP
//! spinlock on the server's lock word (0 -> token), and inside the critical section add
//! their share to a total with FETCH_AND_ADD and increment a counter with an RDMA READ
//! and an RDMA WRITE (the example's proof: a read-modify-write that loses increments
//! unless the lock excludes), then release it with CMP_AND_SWP (token -> 0). The server
//! takes no part (one-sided verbs). A shadow in the test follows who holds the lock and
//! what the words must hold. The invariant: the lock is never granted while the shadow
//! has a holder; an acquire never finds its own token, a release always does; the READ of the counter and the value
//! the FETCH_AND_ADD returns are exactly what the increments and adds before gave (each
//! atomic executed exactly once, whatever the network resent); the final words are
//! clients x iterations, the sum of the adds, and a free lock.
//!
//! The example's ticket lock is not run here; the spinlock is what the CAS and FAA
//! paths need.

use verbs_api::{
    AccessFlags, Backend, CompletionQueue, MemoryRegion, MrOf, ProtectionDomain, QpOf, QueuePair, RemoteMr,
    SendWr, WorkCompletion,
};

use crate::fabric::{self, verb, Node};

/// Clients, each with its own device and QP.
pub const CLIENTS: usize = 3;
/// Critical sections per client.
const ITERS: u64 = 6;
/// Turns (each client polling once) before the run counts as stuck: more than ten
/// times what the longest seed takes.
const TURNS: usize = 10_000;

/// The hosts of the scenario.
pub const HOSTS: [&str; 4] = ["server", "c0", "c1", "c2"];

const LOCK: u64 = 0;
const COUNTER: u64 = 8;
const TOTAL: u64 = 16;

/// A bug planted in the clients, for the test that shows a seed finds it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bugs {
    /// The release is posted before the counter's WRITE: the increment leaves the
    /// critical section.
    pub release_before_write: bool,
}

/// What a run did, for the tests' totals.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    /// Acquire attempts that found the lock taken.
    pub contended: u64,
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Its CMP_AND_SWP (0 -> token) is posted.
    Acquiring,
    /// Holding the lock: its FETCH_AND_ADD and the READ of the counter are posted.
    Reading {
        pending: u8,
    },
    /// Its WRITE of the counter is posted.
    Writing,
    /// Its release is posted (and, with the bug, its WRITE after it).
    Releasing {
        pending: u8,
    },
    Done,
}

struct Client<B: Backend> {
    id: usize,
    node: Node<B>,
    qp: QpOf<B>,
    /// Words the atomics and the READ return into: FAA @0, CAS @8, READ @16, WRITE @24.
    local: MrOf<B>,
    step: Step,
    iter: u64,
}

/// What the words must hold and who holds the lock, as the test knows it.
#[derive(Debug, Default)]
struct Shadow {
    holder: Option<usize>,
    counter: u64,
    total: u64,
}

const WR_CAS: u64 = 1;
const WR_FAA: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;
const WR_RELEASE: u64 = 5;

fn token(id: usize) -> u64 {
    id as u64 + 1
}

/// What client `id` adds to the total each time: different per client, so that an add
/// run twice or lost shows.
fn share(id: usize) -> u64 {
    10u64.pow(id as u32)
}

/// Runs the clients against the lock region; `Err` says what broke the invariant.
pub fn run<B: Backend>(b: &B, bugs: Bugs) -> Result<Outcome, String> {
    let server = fabric::node(b, "server", 16)?;
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_ATOMIC
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_WRITE;
    let region = server.pd.reg_mr(64, access).map_err(verb)?;
    let remote = region.remote();
    let mut clients = Vec::new();
    let mut server_qps = Vec::new();
    for id in 0..CLIENTS {
        let node = fabric::node(b, HOSTS[1 + id], 16)?;
        let qp = fabric::rc_qp(&node, 4, 1)?;
        let sqp: QpOf<B> = fabric::rc_qp(&server, 1, 1)?;
        fabric::rc_pair((&node, &qp), (&server, &sqp), &fabric::params())?;
        server_qps.push(sqp);
        let local = node.pd.reg_mr(32, AccessFlags::LOCAL_WRITE).map_err(verb)?;
        let mut c = Client {
            id,
            node,
            qp,
            local,
            step: Step::Done,
            iter: 0,
        };
        c.acquire(&remote)?;
        clients.push(c);
    }
    let mut shadow = Shadow::default();
    let mut out = Outcome::default();
    let mut turns = 0;
    while clients.iter().any(|c| c.step != Step::Done) {
        turns += 1;
        if turns > TURNS {
            let at: Vec<_> = clients.iter().map(|c| (c.iter, c.step)).collect();
            return Err(format!("no end after {TURNS} turns: clients at {at:?}"));
        }
        for c in &mut clients {
            c.turn(&remote, &mut shadow, &mut out, bugs)?;
        }
    }
    let word = |o: u64| region.read_u64(o as usize).map_err(verb);
    let want_total: u64 = (0..CLIENTS).map(|id| share(id) * ITERS).sum();
    let (lock, counter, total) = (word(LOCK)?, word(COUNTER)?, word(TOTAL)?);
    if (lock, counter, total) != (0, CLIENTS as u64 * ITERS, want_total) {
        return Err(format!(
            "at the end the lock word is {lock:#x}, the counter {counter}, the total {total}; \
             they must be 0, {}, {want_total}",
            CLIENTS as u64 * ITERS
        ));
    }
    Ok(out)
}

impl<B: Backend> Client<B> {
    fn post(&self, wr: SendWr<'_>) -> Result<(), String> {
        self.qp.post_send(&[wr.signaled()]).map_err(verb)
    }

    fn acquire(&mut self, remote: &RemoteMr) -> Result<(), String> {
        let sge = [self.local.sge(8, 8).map_err(verb)?];
        self.post(SendWr::cmp_and_swp(
            WR_CAS,
            &sge,
            remote.at(LOCK),
            0,
            token(self.id),
        ))?;
        self.step = Step::Acquiring;
        Ok(())
    }

    fn release(&mut self, remote: &RemoteMr) -> Result<(), String> {
        let sge = [self.local.sge(8, 8).map_err(verb)?];
        self.post(SendWr::cmp_and_swp(
            WR_RELEASE,
            &sge,
            remote.at(LOCK),
            token(self.id),
            0,
        ))
    }

    fn write_counter(&mut self, remote: &RemoteMr, shadow: &mut Shadow) -> Result<(), String> {
        shadow.counter += 1;
        self.local.write_u64(24, shadow.counter).map_err(verb)?;
        let sge = [self.local.sge(24, 8).map_err(verb)?];
        self.post(SendWr::write(WR_WRITE, &sge, remote.at(COUNTER)))
    }

    /// Polls once and moves on with what completed.
    fn turn(
        &mut self,
        remote: &RemoteMr,
        shadow: &mut Shadow,
        out: &mut Outcome,
        bugs: Bugs,
    ) -> Result<(), String> {
        if self.step == Step::Done {
            return Ok(());
        }
        let mut wcs = [WorkCompletion::default(); 4];
        let n = self.node.cq.poll(&mut wcs).map_err(verb)?;
        let id = self.id;
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                return Err(format!("client {id}: WR {} completed {:?}", wc.wr_id, wc.status));
            }
            let word = |o: usize| self.local.read_u64(o).map_err(verb);
            match (self.step, wc.wr_id) {
                (Step::Acquiring, WR_CAS) => {
                    let old = word(8)?;
                    if old == token(id) {
                        return Err(format!(
                            "client {id} asked for the lock and found its own token in the word: \
                             it already held it (an acquire ran twice)"
                        ));
                    }
                    if old != 0 {
                        out.contended += 1;
                        self.acquire(remote)?;
                        continue;
                    }
                    if let Some(h) = shadow.holder {
                        return Err(format!(
                            "client {id} was granted the lock while client {h} held it"
                        ));
                    }
                    shadow.holder = Some(id);
                    let faa = [self.local.sge(0, 8).map_err(verb)?];
                    self.post(SendWr::fetch_and_add(WR_FAA, &faa, remote.at(TOTAL), share(id)))?;
                    let rd = [self.local.sge(16, 8).map_err(verb)?];
                    self.post(SendWr::read(WR_READ, &rd, remote.at(COUNTER)))?;
                    self.step = Step::Reading { pending: 2 };
                }
                (Step::Reading { pending }, WR_FAA | WR_READ) => {
                    if pending > 1 {
                        self.step = Step::Reading { pending: pending - 1 };
                        continue;
                    }
                    let (before, counter) = (word(0)?, word(16)?);
                    if before != shadow.total || counter != shadow.counter {
                        return Err(format!(
                            "client {id} holding the lock: FETCH_AND_ADD returned {before} and the counter \
                             read {counter}, but {} was added and {} increments made before",
                            shadow.total, shadow.counter
                        ));
                    }
                    shadow.total += share(id);
                    if bugs.release_before_write {
                        shadow.holder = None;
                        self.release(remote)?;
                        self.write_counter(remote, shadow)?;
                        self.step = Step::Releasing { pending: 2 };
                    } else {
                        self.write_counter(remote, shadow)?;
                        self.step = Step::Writing;
                    }
                }
                (Step::Writing, WR_WRITE) => {
                    shadow.holder = None;
                    self.release(remote)?;
                    self.step = Step::Releasing { pending: 1 };
                }
                (Step::Releasing { pending }, WR_RELEASE | WR_WRITE) => {
                    if wc.wr_id == WR_RELEASE && word(8)? != token(id) {
                        return Err(format!(
                            "client {id} released the lock, but the word held {:#x}, not its token",
                            word(8)?
                        ));
                    }
                    if pending > 1 {
                        self.step = Step::Releasing { pending: pending - 1 };
                        continue;
                    }
                    self.iter += 1;
                    if self.iter == ITERS {
                        self.step = Step::Done;
                    } else {
                        self.acquire(remote)?;
                    }
                }
                (step, wr) => return Err(format!("client {id}: WR {wr} completed while {step:?}")),
            }
        }
        Ok(())
    }
}
