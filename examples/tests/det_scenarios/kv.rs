//! kv-rpc in one thread: the example's wire format, store, workload, request window and
//! per-connection slot bookkeeping (`examples::kv`), its clients and its server driven
//! by turns over RC SEND/RECV. The server pre-posts fewer receives per connection than
//! a client keeps requests in flight, and re-posts what each poll consumed with one
//! `post_recv` (the batched refill); a SEND that meets an empty receive queue is RNR
//! NAKed and retried. The invariant: every request gets exactly its reply (the window
//! refuses a reply to a request not in flight, the workload checks each against the
//! store's model) and the store executed each request exactly once.
//!
//! The kv-rpc binary's SRQ variant is not run: the deterministic backend refuses SRQs.

use examples::kv::report::ClientReport;
use examples::kv::slots::ConnSlots;
use examples::kv::store::{Served, Store};
use examples::kv::window::Window;
use examples::kv::workload::Workload;
use examples::kv::{self, MAX_REQ, MAX_RESP};
use examples::lists;
use std::time::Instant;
use verbs_api::{
    AccessFlags, Backend, CompletionQueue, MemoryRegion, MrOf, ProtectionDomain, QpOf, RcParams, WcOpcode,
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
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            rnr_retry: 7,
            resp_slot_freed_at_post: false,
        }
    }
}

/// What a run did, for the tests' totals.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    /// Times a server receive queue ran dry.
    pub dry: u32,
}

const RECV: u64 = 1 << 63;

fn wr_id(recv: bool, conn: usize, slot: u32) -> u64 {
    (if recv { RECV } else { 0 }) | ((conn as u64) << 32) | slot as u64
}

fn split(id: u64) -> (bool, usize, u32) {
    (id & RECV != 0, ((id & !RECV) >> 32) as usize, id as u32)
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

struct Server<B: Backend> {
    node: Node<B>,
    recv: MrOf<B>,
    resp: MrOf<B>,
    conns: Vec<Conn<B>>,
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
        store: Store::default(),
        bug: setup.resp_slot_freed_at_post,
        req: vec![0; MAX_REQ],
        out: vec![0; MAX_RESP],
    };
    let params = RcParams {
        rnr_retry: setup.rnr_retry,
        ..fabric::params()
    };
    let mut clients = Vec::new();
    for id in 0..CLIENTS {
        let node = fabric::node(b, HOSTS[1 + id], 256)?;
        let qp = fabric::rc_qp(&node, WINDOW as u32, WINDOW as u32)?;
        let sqp = fabric::rc_qp(&server.node, RESP_SLOTS, DEPTH)?;
        fabric::rc_pair((&node, &qp), (&server.node, &sqp), &params)?;
        server.post_recvs(&sqp, id, &(0..DEPTH).collect::<Vec<_>>())?;
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
    let mut turns = 0;
    while !clients.iter().all(|c| c.window.finished()) {
        turns += 1;
        if turns > TURNS {
            let done: Vec<_> = clients.iter().map(|c| c.window.done()).collect();
            return Err(format!("no end after {TURNS} turns: requests answered {done:?}"));
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
    Ok(Outcome {
        dry: server.conns.iter().map(|c| c.slots.dry.count()).sum(),
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

    /// Polls once, takes what completed, answers every request it can (one `post_send`
    /// a connection) and re-posts every consumed receive (one `post_recv` a connection).
    fn turn(&mut self) -> Result<(), String> {
        let mut wcs = [WorkCompletion::default(); 32];
        let n = self.node.cq.poll(&mut wcs).map_err(verb)?;
        let now = Instant::now();
        for wc in &wcs[..n] {
            let (recv, c, slot) = split(wc.wr_id);
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
                conn.slots.receive_completed(now);
                conn.slots.request(slot, wc.byte_len);
            } else if !self.bug {
                conn.slots.response_sent(slot);
            }
        }
        for c in 0..self.conns.len() {
            self.answer(c)?;
            let consumed = self.conns[c].slots.take_consumed();
            if !consumed.is_empty() {
                self.post_recvs(&self.conns[c].qp, c, &consumed)?;
                self.conns[c].slots.reposted(consumed.len() as u32, now);
            }
        }
        Ok(())
    }

    fn answer(&mut self, c: usize) -> Result<(), String> {
        let mut answers = Vec::new();
        while let Some((slot, len, rslot)) = self.conns[c].slots.next_request() {
            let len = (len as usize).min(MAX_REQ);
            self.recv
                .read(Self::recv_off(c, slot), &mut self.req[..len])
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
