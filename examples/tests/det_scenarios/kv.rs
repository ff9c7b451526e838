//! kv-rpc in one thread: the example's wire format, store, workload, request window and
//! per-connection slot bookkeeping (`examples::kv`), its clients and its server driven
//! by turns over RC SEND/RECV. The server pre-posts fewer receives per connection than
//! a client keeps requests in flight, and re-posts what each poll consumed with one
//! `post_recv` (the batched refill); a SEND that meets an empty receive queue is RNR
//! NAKed and retried. The invariant: every request gets exactly its reply (the window
//! refuses a reply to a request not in flight, the workload checks each against the
//! store's model) and the store executed each request exactly once.
//!
//! The SRQ variant ([`Setup::srq`], the binary's `--srq`): the server's QPs take their
//! receives from one shared receive queue of fewer receives than the clients keep in
//! flight, refilled in one batch when its limit event (`IBV_EVENT_SRQ_LIMIT_REACHED`)
//! comes, or at once when it ran empty unarmed (`examples::kv::srq::SrqPool`); a
//! request finds its connection by the QP its receive completed on.

use examples::kv::report::ClientReport;
use examples::kv::slots::ConnSlots;
use examples::kv::srq::SrqPool;
use examples::kv::store::{Served, Store};
use examples::kv::window::Window;
use examples::kv::workload::Workload;
use examples::kv::{self, MAX_REQ, MAX_RESP};
use examples::lists;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use verbs_api::{
    AccessFlags, AsyncElement, AsyncEventType, Backend, CompletionQueue, Context, MemoryRegion, MrOf,
    ProtectionDomain, QpOf, QueuePair, RcParams, SharedReceiveQueue, SrqAttr, SrqAttrMask, SrqOf, WcOpcode,
    WorkCompletion,
};

use crate::fabric::{self, verb, Node};

/// Client connections.
pub const CLIENTS: usize = 2;
/// Keys per client (PUT, GET, DELETE of half, GET again).
const KEYS: u32 = 6;
/// Bytes per value: the largest, so that a PUT and the answer to a GET are two packets
/// each (path MTU 1024), and a packet lost inside one is resent from there.
const VALUE: usize = kv::MAX_VALUE;
/// Requests a client keeps in flight.
const WINDOW: usize = 6;
/// Receives the server keeps posted per connection: fewer than a client's window, so
/// that the queue runs dry and SENDs meet RNR NAKs between refills.
const DEPTH: u32 = 4;
/// The server takes a turn after this many turns of its clients: it is slower than
/// they are, so that requests arrive while it is not looking and its receive queues run
/// dry before it refills them.
const SERVER_EVERY: usize = 3;
/// Receives of the SRQ of [`Setup::srq`]: what the connections' own queues hold
/// together, fewer than the clients keep in flight.
const SRQ_DEPTH: u32 = CLIENTS as u32 * DEPTH;
/// Its limit: the event comes when fewer receives than this are left.
const SRQ_LIMIT: u32 = SRQ_DEPTH / 2;
/// Response slots per connection.
const RESP_SLOTS: u32 = 2 * DEPTH;
/// Turns (each client polling once, the server every [`SERVER_EVERY`]th) before the run
/// counts as stuck: more than ten times what the longest seed takes.
const TURNS: usize = 5_000;

/// The hosts of the scenario.
pub const HOSTS: [&str; 3] = ["server", "c0", "c1"];

/// How a run is set up.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    /// The clients' RNR retry count (7: retry for ever, as the example's default).
    pub rnr_retry: u8,
    /// A bug planted in the server, for the test that shows a seed finds it: a response
    /// slot is free again as soon as its SEND is posted, not when it completes, so a
    /// resent response carries whatever the slot holds by then.
    pub resp_slot_freed_at_post: bool,
    /// The server's QPs share one SRQ of [`SRQ_DEPTH`] receives, refilled on its limit
    /// event, instead of [`DEPTH`] receives each.
    pub srq: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            rnr_retry: 7,
            resp_slot_freed_at_post: false,
            srq: false,
        }
    }
}

/// What a run did, for the tests' totals.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    /// Times a server receive queue (or the SRQ) ran dry.
    pub dry: u32,
    /// SRQ limit events the server refilled on.
    pub srq_events: u64,
}

const RECV: u64 = 1 << 63;
/// A receive of the SRQ: its slot is the pool's, its connection the QP it completed on.
const SRQ: u64 = 1 << 62;

fn wr_id(recv: bool, conn: usize, slot: u32) -> u64 {
    (if recv { RECV } else { 0 }) | ((conn as u64) << 32) | slot as u64
}

fn split(id: u64) -> (bool, usize, u32) {
    (id & RECV != 0, ((id & !(RECV | SRQ)) >> 32) as usize, id as u32)
}

struct Client<B: Backend> {
    id: usize,
    node: Node<B>,
    qp: QpOf<B>,
    req: MrOf<B>,
    resp: MrOf<B>,
    work: Workload,
    window: Window,
    rep: ClientReport,
    buf: Vec<u8>,
}

struct Conn<B: Backend> {
    qp: QpOf<B>,
    slots: ConnSlots,
}

/// The SRQ of [`Setup::srq`] and the bookkeeping of its receive slots.
struct Shared<B: Backend> {
    srq: SrqOf<B>,
    pool: SrqPool,
    /// The connection of each server QP, by QPN.
    by_qpn: HashMap<u32, usize>,
}

struct Server<B: Backend> {
    node: Node<B>,
    recv: MrOf<B>,
    resp: MrOf<B>,
    conns: Vec<Conn<B>>,
    shared: Option<Shared<B>>,
    store: Store,
    /// [`Setup::resp_slot_freed_at_post`].
    bug: bool,
    req: Vec<u8>,
    out: Vec<u8>,
}

/// Runs the clients' workloads against the server; `Err` says what broke the invariant.
pub fn run<B: Backend>(b: &B, setup: Setup) -> Result<Outcome, String> {
    let snode = fabric::node(b, "server", 1024)?;
    let recv = reg(&snode, CLIENTS * DEPTH as usize * MAX_REQ)?;
    let resp = reg(&snode, CLIENTS * RESP_SLOTS as usize * MAX_RESP)?;
    let mut server = Server {
        node: snode,
        recv,
        resp,
        conns: Vec::new(),
        shared: None,
        store: Store::default(),
        bug: setup.resp_slot_freed_at_post,
        req: vec![0; MAX_REQ],
        out: vec![0; MAX_RESP],
    };
    if setup.srq {
        let srq = server
            .node
            .pd
            .create_srq(&SrqAttr::new(SRQ_DEPTH, 1))
            .map_err(verb)?;
        // Pool slot `s` is the receive slot `s` of connection 0's range: the pool spans
        // the connections' ranges, which are adjacent.
        Server::<B>::post_srq(&server.recv, &srq, &(0..SRQ_DEPTH).collect::<Vec<_>>())?;
        server.shared = Some(Shared {
            srq,
            pool: SrqPool::new(SRQ_DEPTH, SRQ_LIMIT),
            by_qpn: HashMap::new(),
        });
    }
    let params = RcParams {
        rnr_retry: setup.rnr_retry,
        ..fabric::params()
    };
    let mut clients = Vec::new();
    for id in 0..CLIENTS {
        let node = fabric::node(b, HOSTS[1 + id], 256)?;
        let qp = fabric::rc_qp(&node, WINDOW as u32, WINDOW as u32)?;
        let srq = server.shared.as_ref().map(|s| &s.srq);
        let sqp = fabric::rc_qp_on(&server.node, RESP_SLOTS, DEPTH, srq)?;
        fabric::rc_pair((&node, &qp), (&server.node, &sqp), &params)?;
        match server.shared.as_mut() {
            Some(sh) => {
                sh.by_qpn.insert(sqp.qp_num(), id);
            }
            None => server.post_recvs(&sqp, id, &(0..DEPTH).collect::<Vec<_>>())?,
        }
        server.conns.push(Conn {
            qp: sqp,
            slots: ConnSlots::new(DEPTH, RESP_SLOTS),
        });
        let (req, resp) = (reg(&node, WINDOW * MAX_REQ)?, reg(&node, WINDOW * MAX_RESP)?);
        let items: Vec<_> = (0..WINDOW)
            .map(|s| (RECV | s as u64, s * MAX_RESP, MAX_RESP))
            .collect();
        lists::post_recvs(&qp, &resp, &items).map_err(verb)?;
        let work = Workload::new(id as u32, KEYS, VALUE);
        clients.push(Client {
            id,
            window: Window::new(WINDOW, work.len()),
            work,
            node,
            qp,
            req,
            resp,
            rep: ClientReport::default(),
            buf: vec![0; MAX_REQ.max(MAX_RESP)],
        });
    }
    if let Some(sh) = server.shared.as_mut() {
        sh.arm()?;
    }
    let mut turns = 0;
    while !clients.iter().all(|c| c.window.finished()) {
        turns += 1;
        if turns > TURNS {
            let done: Vec<_> = clients.iter().map(|c| c.window.done()).collect();
            let srq = server
                .shared
                .as_ref()
                .map_or(String::new(), |s| format!("; the SRQ's pool: {:?}", s.pool));
            return Err(format!(
                "no end after {TURNS} turns: requests answered {done:?}{srq}"
            ));
        }
        for c in &mut clients {
            c.turn()?;
        }
        if turns % SERVER_EVERY == 0 {
            server.turn()?;
        }
    }
    let mut want = Served::default();
    for c in &clients {
        if c.rep.mismatches != 0 {
            return Err(format!("client {}: wrong answers: {:?}", c.id, c.rep.examples));
        }
        for i in 0..c.work.len() {
            match c.work.op(i) {
                kv::Op::Get => want.get += 1,
                kv::Op::Put => want.put += 1,
                kv::Op::Delete => want.delete += 1,
            }
        }
    }
    if server.store.served != want {
        return Err(format!(
            "the store served {:?}, the clients asked {want:?}: a request ran twice or not at all",
            server.store.served
        ));
    }
    Ok(match server.shared.as_ref() {
        Some(sh) => Outcome {
            dry: sh.pool.dry.count(),
            srq_events: sh.pool.events,
        },
        None => Outcome {
            dry: server.conns.iter().map(|c| c.slots.dry.count()).sum(),
            srq_events: 0,
        },
    })
}

fn reg<B: Backend>(n: &Node<B>, len: usize) -> Result<MrOf<B>, String> {
    n.pd.reg_mr(len, AccessFlags::LOCAL_WRITE).map_err(verb)
}

impl<B: Backend> Client<B> {
    /// Fills the window (one `post_send`), polls once, takes what completed and re-posts
    /// the response receives it consumed (one `post_recv`).
    fn turn(&mut self) -> Result<(), String> {
        let mut batch = Vec::new();
        while let Some((s, i)) = self.window.take(Instant::now()) {
            let len = self.work.encode(i, &mut self.buf).map_err(|e| e.to_string())?;
            self.req.write(s * MAX_REQ, &self.buf[..len]).map_err(verb)?;
            batch.push((s as u64, s * MAX_REQ, len));
        }
        if !batch.is_empty() {
            lists::post_sends(&self.qp, &self.req, &batch).map_err(verb)?;
        }
        let mut wcs = [WorkCompletion::default(); 16];
        let n = self.node.cq.poll(&mut wcs).map_err(verb)?;
        let mut repost = Vec::new();
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                return Err(format!(
                    "client {}: WR {:#x} completed {:?}",
                    self.id, wc.wr_id, wc.status
                ));
            }
            if wc.wr_id & RECV != 0 {
                let s = (wc.wr_id & !RECV) as usize;
                let len = (wc.byte_len as usize).min(MAX_RESP);
                self.resp.read(s * MAX_RESP, &mut self.buf[..len]).map_err(verb)?;
                repost.push((wc.wr_id, s * MAX_RESP, MAX_RESP));
                let r = kv::decode_response(&self.buf[..len])
                    .map_err(|e| format!("client {}: bad response: {e}", self.id))?;
                let i = self
                    .window
                    .answered(r.req_id, Instant::now(), &mut self.rep)
                    .map_err(|e| format!("client {}: {e}", self.id))?;
                self.work.check(i, &r, &mut self.rep);
            } else if wc.opcode == WcOpcode::Send {
                self.window.sent(wc.wr_id as usize);
            }
        }
        if !repost.is_empty() {
            lists::post_recvs(&self.qp, &self.resp, &repost).map_err(verb)?;
        }
        Ok(())
    }
}

impl<B: Backend> Server<B> {
    fn recv_off(c: usize, s: u32) -> usize {
        (c * DEPTH as usize + s as usize) * MAX_REQ
    }

    fn resp_off(c: usize, s: u32) -> usize {
        (c * RESP_SLOTS as usize + s as usize) * MAX_RESP
    }

    fn post_recvs(&self, qp: &QpOf<B>, c: usize, slots: &[u32]) -> Result<(), String> {
        let items: Vec<_> = slots
            .iter()
            .map(|&s| (wr_id(true, c, s), Self::recv_off(c, s), MAX_REQ))
            .collect();
        lists::post_recvs(qp, &self.recv, &items).map_err(verb)
    }

    /// Posts the pool's slots `slots` (in `recv`) to `srq` with one `post_srq_recv`.
    fn post_srq(recv: &MrOf<B>, srq: &SrqOf<B>, slots: &[u32]) -> Result<(), String> {
        let items: Vec<_> = slots
            .iter()
            .map(|&s| (RECV | SRQ | u64::from(s), Self::recv_off(0, s), MAX_REQ))
            .collect();
        lists::post_srq_recvs(srq, recv, &items).map_err(verb)
    }

    /// Takes the server's asynchronous events without waiting: on the SRQ's limit event,
    /// a refill of every freed slot; an SRQ left empty and unarmed, which raises no
    /// event, is refilled at once. Any other event breaks the run.
    fn srq_events(&mut self) -> Result<(), String> {
        let Some(sh) = self.shared.as_mut() else {
            return Ok(());
        };
        while let Some(ev) = self
            .node
            .ctx
            .get_async_event(Some(Duration::ZERO))
            .map_err(verb)?
        {
            let what = (ev.event_type, ev.element);
            self.node.ctx.ack_async_event(ev);
            if what
                != (
                    AsyncEventType::SrqLimitReached,
                    AsyncElement::Srq(sh.srq.handle()),
                )
            {
                return Err(format!("server: asynchronous event {what:?}"));
            }
            sh.pool.event();
            let batch = sh.pool.take_batch();
            Self::refill(&self.recv, sh, batch, true)?;
        }
        if sh.pool.must_post_now() {
            let batch = sh.pool.take_batch();
            Self::refill(&self.recv, sh, batch, false)?;
        }
        Ok(())
    }

    /// Posts `batch` to the SRQ (`on_event`: because its limit event came) and arms the
    /// limit again.
    fn refill(recv: &MrOf<B>, sh: &mut Shared<B>, batch: Vec<u32>, on_event: bool) -> Result<(), String> {
        if !batch.is_empty() {
            Self::post_srq(recv, &sh.srq, &batch)?;
        }
        sh.pool.reposted(batch.len() as u32, Instant::now(), on_event);
        sh.arm()
    }

    /// Polls once, takes what completed, answers every request it can (one `post_send`
    /// a connection) and re-posts every consumed receive (one `post_recv` a connection;
    /// with an SRQ, frees them for its next refill).
    fn turn(&mut self) -> Result<(), String> {
        let mut wcs = [WorkCompletion::default(); 32];
        let n = self.node.cq.poll(&mut wcs).map_err(verb)?;
        self.srq_events()?;
        let now = Instant::now();
        for wc in &wcs[..n] {
            let (recv, mut c, slot) = split(wc.wr_id);
            let shared = self.shared.as_mut().filter(|_| wc.wr_id & SRQ != 0);
            if let Some(sh) = &shared {
                c = *sh
                    .by_qpn
                    .get(&wc.qp_num)
                    .ok_or_else(|| format!("server: an SRQ receive completed on QP {:#x}", wc.qp_num))?;
            }
            if !wc.is_ok() {
                return Err(format!(
                    "server: connection {c}: WR {:#x} completed {:?}",
                    wc.wr_id, wc.status
                ));
            }
            let conn = self
                .conns
                .get_mut(c)
                .ok_or_else(|| format!("server: a completion of no connection: {wc:?}"))?;
            if recv {
                match shared {
                    Some(sh) => sh.pool.taken(now),
                    None => conn.slots.receive_completed(now),
                }
                conn.slots.request(slot, wc.byte_len);
            } else if !self.bug {
                conn.slots.response_sent(slot);
            }
        }
        for c in 0..self.conns.len() {
            self.answer(c)?;
            let consumed = self.conns[c].slots.take_consumed();
            if let Some(sh) = self.shared.as_mut() {
                // Answered: the slots wait for the SRQ's next refill.
                sh.pool.freed(consumed);
            } else if !consumed.is_empty() {
                self.post_recvs(&self.conns[c].qp, c, &consumed)?;
                self.conns[c].slots.reposted(consumed.len() as u32, now);
            }
        }
        Ok(())
    }

    fn answer(&mut self, c: usize) -> Result<(), String> {
        let mut answers = Vec::new();
        // An SRQ's slots are the pool's, whatever connection took them.
        let range = if self.shared.is_some() { 0 } else { c };
        while let Some((slot, len, rslot)) = self.conns[c].slots.next_request() {
            let len = (len as usize).min(MAX_REQ);
            self.recv
                .read(Self::recv_off(range, slot), &mut self.req[..len])
                .map_err(verb)?;
            let rlen = self.store.execute(&self.req[..len], &mut self.out);
            let at = Self::resp_off(c, rslot);
            self.resp.write(at, &self.out[..rlen]).map_err(verb)?;
            let item = (wr_id(false, c, rslot), at, rlen);
            if self.bug {
                // Posted at once, so that the next answer cannot overwrite it before the
                // post; freed at once, so that a later one can before it completes.
                lists::post_sends(&self.conns[c].qp, &self.resp, &[item]).map_err(verb)?;
                self.conns[c].slots.response_sent(rslot);
            } else {
                answers.push(item);
            }
        }
        if answers.is_empty() {
            return Ok(());
        }
        lists::post_sends(&self.conns[c].qp, &self.resp, &answers).map_err(verb)
    }
}

impl<B: Backend> Shared<B> {
    /// Arms the SRQ's limit, unless it is empty (no receive would be taken to raise
    /// the event: [`SrqPool::can_arm`]).
    fn arm(&mut self) -> Result<(), String> {
        if !self.pool.can_arm() {
            return Ok(());
        }
        let attr = SrqAttr::default().with_limit(self.pool.limit());
        self.srq.modify(&attr, SrqAttrMask::LIMIT).map_err(verb)?;
        self.pool.armed();
        Ok(())
    }
}
