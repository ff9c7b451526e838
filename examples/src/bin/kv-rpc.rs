//! kv-rpc: a key-value store served over SEND/RECV (the two-sided pattern of the RDMA
//! communication model).
//!
//! The server pre-posts `--recv-depth` receives of the fixed maximum request size per
//! client QP and, after each batch of completions it polls, re-posts as many as it
//! consumed (one `post_recv` with a list: the batched refill), so the receive queue never
//! runs dry. Clients keep up to `--window` requests in flight and measure each request's
//! latency from post to response.
//!
//! `--no-refill` turns the batched refill off: receives are re-posted only by a slow
//! housekeeping tick (`--tick-ms`). In between, the receive queue runs dry and every SEND
//! meets an RNR NAK. With the client's default `--rnr-retry 7` (retry forever) the
//! requests still complete, slowly (the client reports the stalls, the server how long
//! its queue was empty); with `--rnr-retry 0` the first RNR NAK completes the request with
//! `IBV_WC_RNR_RETRY_EXC_ERR`, the QP goes to ERR and the rest is flushed.
//!
//! `--srq` gives the server one shared receive queue for all its client QPs instead of a
//! receive queue per QP. A receive's `wr_id` names its slot in the shared pool, so the
//! request is found whatever QP it arrived on, and the completion's `qp_num` names the
//! QP, so the answer goes back on it. Consumed receives are not re-posted after each
//! poll but in one batch when the SRQ's limit event (`IBV_EVENT_SRQ_LIMIT_REACHED`)
//! fires, and the limit is armed again; the demo checks that it fired and that no SEND
//! met an empty queue for good (`IBV_WC_RNR_RETRY_EXC_ERR`).
//!
//! This file holds the verbs calls, the protocol and the demo's invariant; the wire
//! format, the store, the workload and its checks, the reports and the options are in
//! `examples::kv`.
//!
//! ```text
//! kv-rpc demo                                  # server child + 2 client connections, checked
//! kv-rpc demo --no-refill                      # RNR retries: same result, much slower
//! kv-rpc demo --no-refill --rnr-retry 0        # RNR_RETRY_EXC_ERR, counted (exit 0 when seen)
//! kv-rpc demo --srq                            # one SRQ for all clients, refilled on its limit event
//! kv-rpc server --listen 0.0.0.0:18515 --clients 1
//! kv-rpc client --server 10.0.0.1:18515
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use examples::backend::open_device;
use examples::child::{announce_listening, ChildProc};
use examples::cli::CommonArgs;
use examples::conn::{self, QpOpts};
use examples::demo::{start_server, ChildArgs};
use examples::kv::opts::{ClientArgs, ClientTuning, DemoArgs, ServerArgs, ServerTuning};
use examples::kv::report::{
    print_clients, print_server_start, print_srq, ClientReport, ServerReport, SRQ_EVENTS,
};
use examples::kv::slots::ConnSlots;
use examples::kv::srq::SrqPool;
use examples::kv::store::Store;
use examples::kv::window::Window;
use examples::kv::workload::Workload;
use examples::kv::{self, MAX_REQ, MAX_RESP};
use examples::stats::Latencies;
use examples::wait::{self, status_name, Waiter};
use examples::{lists, side_channel, threads, with_backend, Res};
use verbs_api::cm::{Offer, Peer};
use verbs_api::{
    modify_to_init, AccessFlags, AsyncElement, AsyncEventType, Backend, CompletionQueue, Context,
    MemoryRegion, ProtectionDomain, QpType, QueuePair, RecvWr, SharedReceiveQueue, SrqAttr, SrqAttrMask,
    WcOpcode, WcStatus, WorkCompletion,
};

/// A key-value store over SEND/RECV with pre-posted, batch-refilled receives.
#[derive(Parser, Debug)]
#[command(
    name = "kv-rpc",
    version,
    after_help = "Examples:\n  kv-rpc demo\n  kv-rpc demo --srq\n  kv-rpc demo --no-refill\n  kv-rpc demo --no-refill --rnr-retry 0\n  kv-rpc server --listen 0.0.0.0:18515 --clients 2\n  kv-rpc client --server HOST:18515 --clients 2"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve the store to `--clients` connections, then exit when they are done.
    Server(ServerArgs),
    /// Run PUTs, GETs and DELETEs against a server and check the answers.
    Client(ClientArgs),
    /// Start a server child process, run the clients, check that every GET returned what
    /// was PUT and deleted keys are gone (or, with --no-refill --rnr-retry 0, that the
    /// RNR_RETRY_EXC_ERR happened).
    Demo(DemoArgs),
}

fn main() -> ExitCode {
    examples::program::main("kv-rpc", |cli: Cli| run(&cli))
}

fn run(cli: &Cli) -> Res<()> {
    let common = &cli.common;
    match &cli.cmd {
        Cmd::Server(a) => with_backend!(common, |b| server(b, common, a)),
        Cmd::Client(a) => {
            let addr = conn::parse_addr(&a.server)?;
            let reports = with_backend!(common, |b| clients(b, common, &a.tuning, addr, a.first_id))?;
            if !print_clients(&reports, a.tuning.window, a.tuning.value_size) {
                bail!("some requests failed or returned wrong answers (see above)")
            }
            Ok(())
        }
        Cmd::Demo(a) => demo(common, a),
    }
}

// ---------------------------------------------------------------------------------------
// server

/// wr_id layout: bit 63 set for receives, bit 62 for receives of the shared queue,
/// bits 32..62 the connection (0 for the shared queue's: which QP takes a receive is
/// known only from its completion), low 32 bits the slot.
const RECV_BIT: u64 = 1 << 63;
const SRQ_BIT: u64 = 1 << 62;

fn wr_id(recv: bool, conn: usize, slot: u32) -> u64 {
    (if recv { RECV_BIT } else { 0 }) | ((conn as u64) << 32) | slot as u64
}

fn srq_wr_id(slot: u32) -> u64 {
    RECV_BIT | SRQ_BIT | slot as u64
}

fn split_wr_id(id: u64) -> (bool, usize, u32) {
    (
        id & RECV_BIT != 0,
        ((id & !(RECV_BIT | SRQ_BIT)) >> 32) as usize,
        id as u32,
    )
}

/// The server's registered buffers: `depth` receive slots of [`MAX_REQ`] per connection
/// (with an SRQ: the SRQ's slots, shared), and `resp_slots` response slots of
/// [`MAX_RESP`] bytes per connection.
struct Buffers<B: Backend> {
    recv: B::Mr,
    resp: B::Mr,
    depth: u32,
    resp_slots: u32,
    shared: bool,
}

impl<B: Backend> Buffers<B> {
    fn register(pd: &B::Pd, nconn: usize, depth: u32, srq_depth: Option<u32>) -> Res<Self> {
        // Responses in flight per connection: one per request being answered; twice the
        // receive depth is more than a client can have outstanding.
        let resp_slots = depth * 2;
        let recv_slots = srq_depth.map_or(nconn * depth as usize, |d| d as usize);
        let recv = pd
            .reg_mr(recv_slots * MAX_REQ, AccessFlags::LOCAL_WRITE)
            .context("registering the receive buffers")?;
        let resp = pd
            .reg_mr(nconn * resp_slots as usize * MAX_RESP, AccessFlags::LOCAL_WRITE)
            .context("registering the response buffers")?;
        Ok(Buffers {
            recv,
            resp,
            depth,
            resp_slots,
            shared: srq_depth.is_some(),
        })
    }

    /// Where receive slot `s` of connection `c` is; with an SRQ, slot `s` of the pool,
    /// whatever connection its request came from.
    fn recv_off(&self, c: usize, s: u32) -> usize {
        if self.shared {
            s as usize * MAX_REQ
        } else {
            (c * self.depth as usize + s as usize) * MAX_REQ
        }
    }

    fn resp_off(&self, c: usize, s: u32) -> usize {
        (c * self.resp_slots as usize + s as usize) * MAX_RESP
    }

    /// Posts the receive slots `slots` of connection `c` with one `post_recv`.
    fn post_recvs(&self, qp: &B::Qp, c: usize, slots: &[u32]) -> Res<()> {
        let items: Vec<_> = slots
            .iter()
            .map(|&s| (wr_id(true, c, s), self.recv_off(c, s), MAX_REQ))
            .collect();
        lists::post_recvs(qp, &self.recv, &items).context("posting receives")
    }

    /// Posts the pool's slots `slots` to the SRQ with one `post_srq_recv`.
    fn post_srq(&self, srq: &B::Srq, slots: &[u32]) -> Res<()> {
        let items: Vec<_> = slots
            .iter()
            .map(|&s| (srq_wr_id(s), self.recv_off(0, s), MAX_REQ))
            .collect();
        lists::post_srq_recvs(srq, &self.recv, &items).context("posting receives to the SRQ")
    }
}

/// The shared receive queue of `--srq` and its bookkeeping.
struct Shared<B: Backend> {
    srq: B::Srq,
    pool: SrqPool,
}

impl<B: Backend> Shared<B> {
    /// Creates the SRQ, fills it (the limit is armed once clients are connected).
    fn create(pd: &B::Pd, bufs: &Buffers<B>, depth: u32, limit: u32) -> Res<Self> {
        let srq = pd
            .create_srq(&SrqAttr::new(depth, 1))
            .with_context(|| format!("creating a shared receive queue of {depth} receives"))?;
        bufs.post_srq(&srq, &(0..depth).collect::<Vec<_>>())?;
        Ok(Shared {
            srq,
            pool: SrqPool::new(depth, limit),
        })
    }

    /// Arms the limit, unless the SRQ is empty (see [`SrqPool::can_arm`]).
    fn arm(&mut self) -> Res<()> {
        if !self.pool.can_arm() {
            return Ok(());
        }
        let attr = SrqAttr::default().with_limit(self.pool.limit());
        self.srq
            .modify(&attr, SrqAttrMask::LIMIT)
            .context("arming the SRQ limit")?;
        self.pool.armed();
        Ok(())
    }

    /// Posts every freed slot in one batch (`on_event`: because the limit event fired)
    /// and arms the limit again.
    fn refill(&mut self, bufs: &Buffers<B>, now: Instant, on_event: bool) -> Res<()> {
        let batch = self.pool.take_batch();
        if !batch.is_empty() {
            bufs.post_srq(&self.srq, &batch)?;
        }
        self.pool.reposted(batch.len() as u32, now, on_event);
        self.arm()
    }

    /// Takes the device's asynchronous events: on the SRQ's limit event, a refill. Other
    /// events (a QP's fatal error, say) are logged. Each is acknowledged.
    fn events(&mut self, ctx: &B::Context, bufs: &Buffers<B>, now: Instant) -> Res<()> {
        while let Some(ev) = ctx.get_async_event(Some(Duration::ZERO))? {
            let ours = ev.event_type == AsyncEventType::SrqLimitReached
                && ev.element == AsyncElement::Srq(self.srq.handle());
            if ours {
                self.pool.event();
                let r = self.refill(bufs, now, true);
                ctx.ack_async_event(ev);
                r?;
            } else {
                tracing::warn!("server: asynchronous event: {ev}");
                ctx.ack_async_event(ev);
            }
        }
        // An SRQ left empty and unarmed sends no event: what is free is posted now.
        if self.pool.must_post_now() {
            self.refill(bufs, now, false)?;
        }
        Ok(())
    }
}

/// One client connection on the server.
struct ServerConn<B: Backend> {
    qp: B::Qp,
    peer: Peer,
    slots: ConnSlots,
    done: bool,
}

impl<B: Backend> ServerConn<B> {
    /// Answers every received request that has a free response slot (reading it into
    /// `req`, the answer built in `resp`), with one `post_send` for all of them.
    fn answer(
        &mut self,
        c: usize,
        bufs: &Buffers<B>,
        store: &mut Store,
        (req, resp): (&mut [u8], &mut [u8]),
        rep: &mut ServerReport,
    ) -> Res<()> {
        let mut answers = Vec::new();
        while let Some((slot, len, rslot)) = self.slots.next_request() {
            let len = (len as usize).min(MAX_REQ);
            bufs.recv.read(bufs.recv_off(c, slot), &mut req[..len])?;
            let rlen = store.execute(&req[..len], resp);
            bufs.resp.write(bufs.resp_off(c, rslot), &resp[..rlen])?;
            answers.push((wr_id(false, c, rslot), bufs.resp_off(c, rslot), rlen));
        }
        if answers.is_empty() {
            return Ok(());
        }
        if let Err(e) = lists::post_sends(&self.qp, &bufs.resp, &answers) {
            // The client's QP may be gone (e.g. after RNR_RETRY_EXC_ERR); ours then
            // errors too. Count and keep serving the others.
            rep.error("post_send failed");
            eprintln!("server: client {c}: {e}");
        }
        Ok(())
    }

    /// Re-posts every consumed receive with one `post_recv`; returns (calls, receives).
    fn refill(&mut self, c: usize, bufs: &Buffers<B>, now: Instant) -> Res<(u64, u64)> {
        let slots = self.slots.take_consumed();
        if slots.is_empty() {
            return Ok((0, 0));
        }
        // A QP in ERR still accepts receives (they flush); a failure here is fatal.
        bufs.post_recvs(&self.qp, c, &slots)?;
        self.slots.reposted(slots.len() as u32, now);
        Ok((1, slots.len() as u64))
    }
}

fn server<B: Backend>(b: &B, common: &CommonArgs, a: &ServerArgs) -> Res<()> {
    let t = &a.tuning;
    let depth = t.recv_depth.max(1);
    let nconn = a.clients.max(1) as usize;
    let srq_size = t.srq_size(nconn as u32);
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    let bufs = Buffers::<B>::register(&pd, nconn, depth, srq_size.map(|s| s.0))?;
    let cqe = nconn as u32 * bufs.resp_slots + srq_size.map_or(nconn as u32 * depth, |s| s.0);
    let cq = ctx.create_cq(cqe, None).context("creating the CQ")?;
    let mut shared = match srq_size {
        Some((d, limit)) => Some(Shared::<B>::create(&pd, &bufs, d, limit)?),
        None => None,
    };
    let acceptor = conn::Acceptor::start(conn::listen(&a.listen)?, common.wait())?;
    announce_listening(acceptor.local_addr());
    print_server_start(ctx.name(), nconn, depth, t);
    let params = common.rc_params();
    let mut conns: Vec<ServerConn<B>> = Vec::with_capacity(nconn);
    for c in 0..nconn {
        let opts = QpOpts::new(bufs.resp_slots, depth);
        let srq = shared.as_ref().map(|s| &s.srq);
        let (qp, _cap) = conn::create_qp_of::<B>(&ctx, &pd, (&cq, &cq), &opts, QpType::Rc, srq)?;
        // Receives first, then accept: the client may send as soon as it is connected.
        // (The SRQ's are posted already.)
        let prepare = |qp: &B::Qp| -> Res<()> {
            modify_to_init(qp, &params)?;
            if srq.is_some() {
                return Ok(());
            }
            bufs.post_recvs(qp, c, &(0..depth).collect::<Vec<_>>())
        };
        let peer = acceptor.accept(&ctx, &qp, prepare, &params, Offer::new(), accept_timeout(common))?;
        println!(
            "server: client {c} connected (QP {:#x} <-> {:#x})",
            qp.qp_num(),
            peer.endpoint.qpn
        );
        conns.push(ServerConn {
            qp,
            peer,
            slots: ConnSlots::new(depth, bufs.resp_slots),
            done: false,
        });
    }
    if let Some(sh) = shared.as_mut() {
        sh.arm()?;
    }
    let mut store = Store::default();
    let rep = serve(
        &ctx,
        &cq,
        &bufs,
        &mut conns,
        shared.as_mut(),
        &mut store,
        t,
        common,
    )?;
    match shared.as_mut() {
        Some(sh) => {
            rep.print(&store, []);
            print_srq(&mut sh.pool);
        }
        None => rep.print(&store, conns.iter_mut().map(|c| &mut c.slots.dry)),
    }
    Ok(())
}

fn accept_timeout(common: &CommonArgs) -> Duration {
    common.wait().max(Duration::from_secs(30))
}

/// Serves until every client has said it is done: poll, execute and answer, refill
/// (with an SRQ: take its events first, and refill on its limit event).
#[allow(clippy::too_many_arguments)]
fn serve<B: Backend>(
    ctx: &B::Context,
    cq: &B::Cq,
    bufs: &Buffers<B>,
    conns: &mut [ServerConn<B>],
    mut shared: Option<&mut Shared<B>>,
    store: &mut Store,
    t: &ServerTuning,
    common: &CommonArgs,
) -> Res<ServerReport> {
    // Completions name the QP; with an SRQ that is how a request finds its connection.
    let by_qpn: HashMap<u32, usize> = conns
        .iter()
        .enumerate()
        .map(|(c, sc)| (sc.qp.qp_num(), c))
        .collect();
    let mut rep = ServerReport::default();
    let mut wcs = [WorkCompletion::default(); 32];
    let mut req = vec![0u8; MAX_REQ];
    let mut resp = vec![0u8; MAX_RESP];
    let mut waiter = Waiter::new(accept_timeout(common));
    let tick = Duration::from_millis(t.tick_ms);
    let mut next_tick = Instant::now() + tick;
    let mut last_peer_check = Instant::now();
    loop {
        let n = cq.poll(&mut wcs)?;
        if let Some(sh) = shared.as_deref_mut() {
            sh.events(ctx, bufs, Instant::now())?;
        }
        if n == 0 {
            let now = Instant::now();
            if t.no_refill && t.tick_ms > 0 && now >= next_tick {
                next_tick = now + tick;
                for (c, sc) in conns.iter_mut().enumerate() {
                    rep.add_refill(sc.refill(c, bufs, now)?);
                }
            }
            if now - last_peer_check >= Duration::from_millis(2) {
                last_peer_check = now;
                for sc in conns.iter_mut().filter(|c| !c.done) {
                    sc.done = side_channel::peer_done(&mut sc.peer.stream)?;
                }
                if conns.iter().all(|c| c.done) {
                    return Ok(rep);
                }
            }
            waiter.idle(&|| "requests from the clients".to_string())?;
            continue;
        }
        waiter.progress();
        let now = Instant::now();
        for wc in &wcs[..n] {
            let (is_recv, mut c, slot) = split_wr_id(wc.wr_id);
            let from_srq = wc.wr_id & SRQ_BIT != 0;
            if from_srq {
                let Some(&by_qp) = by_qpn.get(&wc.qp_num) else {
                    bail!("a receive of the SRQ completed on an unknown QP {:#x}", wc.qp_num)
                };
                c = by_qp;
            }
            let Some(sc) = conns.get_mut(c) else {
                bail!("completion with an unknown wr_id {:#x}", wc.wr_id)
            };
            match (is_recv, shared.as_deref_mut()) {
                (true, Some(sh)) if from_srq => sh.pool.taken(now),
                (true, _) => sc.slots.receive_completed(now),
                (false, _) => {}
            }
            if !wc.is_ok() {
                rep.error(status_name(wc.status));
            } else if is_recv {
                sc.slots.request(slot, wc.byte_len);
                rep.first_req.get_or_insert(now);
                rep.last_req = now;
            } else {
                sc.slots.response_sent(slot);
            }
        }
        // Execute what arrived and answer, one post_send per connection.
        for (c, sc) in conns.iter_mut().enumerate() {
            sc.answer(c, bufs, store, (&mut req, &mut resp), &mut rep)?;
            if let Some(sh) = shared.as_deref_mut() {
                // Answered: the slots wait for the next refill.
                sh.pool.freed(sc.slots.take_consumed());
            } else if !t.no_refill {
                rep.add_refill(sc.refill(c, bufs, now)?);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// client

/// Runs `tuning.clients` connections in parallel threads against `addr`.
fn clients<B: Backend>(
    b: &B,
    common: &CommonArgs,
    tuning: &ClientTuning,
    addr: SocketAddr,
    first_id: u32,
) -> Res<Vec<ClientReport>> {
    if tuning.value_size > kv::MAX_VALUE {
        bail!(
            "--value-size {} exceeds {} bytes",
            tuning.value_size,
            kv::MAX_VALUE
        );
    }
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    threads::on_threads(tuning.clients.max(1), "client", |i| {
        let mut c = Client::<B>::connect(&ctx, &pd, common, tuning, addr, first_id + i)?;
        c.run()?;
        c.finish()
    })
}

/// One client connection: its QP, request and response buffers, window and report.
struct Client<'a, B: Backend> {
    rc: conn::RcQp<B>,
    req_mr: B::Mr,
    resp_mr: B::Mr,
    peer: Peer,
    tuning: &'a ClientTuning,
    timeout: Duration,
    work: Workload,
    window: Window,
    rep: ClientReport,
    start: Instant,
    /// Response buffers to re-post.
    repost: Vec<usize>,
    /// A request being encoded, a response being read.
    buf: Vec<u8>,
    rbuf: Vec<u8>,
}

impl<'a, B: Backend> Client<'a, B> {
    /// Registers the buffers, posts a receive per response buffer and connects.
    fn connect(
        ctx: &B::Context,
        pd: &B::Pd,
        common: &CommonArgs,
        tuning: &'a ClientTuning,
        addr: SocketAddr,
        id: u32,
    ) -> Res<Self> {
        let window = tuning.window.max(1) as usize;
        let timeout = common.wait();
        let req_mr = pd
            .reg_mr(window * MAX_REQ, AccessFlags::LOCAL_WRITE)
            .context("registering request buffers")?;
        let resp_mr = pd
            .reg_mr(window * MAX_RESP, AccessFlags::LOCAL_WRITE)
            .context("registering response buffers")?;
        let rc = conn::create_rc::<B>(ctx, pd, &QpOpts::new(window as u32, window as u32))?;
        let mut params = common.rc_params();
        params.rnr_retry = tuning.rnr_retry;
        modify_to_init(&rc.qp, &params)?;
        for s in 0..window {
            let sge = [resp_mr.sge(s * MAX_RESP, MAX_RESP)?];
            rc.qp
                .post_recv(&[RecvWr::new(RECV_BIT | s as u64, &sge)])
                .context("posting response receives")?;
        }
        let peer = conn::connect(addr, ctx, &rc.qp, &params, Offer::new(), timeout)?;
        let work = Workload::new(id, tuning.keys, tuning.value_size);
        let rep = ClientReport {
            id,
            total: work.len(),
            lat: Latencies::with_capacity(work.len()),
            ..Default::default()
        };
        Ok(Client {
            rc,
            req_mr,
            resp_mr,
            peer,
            tuning,
            timeout,
            window: Window::new(window, work.len()),
            work,
            rep,
            start: Instant::now(),
            repost: Vec::new(),
            buf: vec![0u8; MAX_REQ],
            rbuf: vec![0u8; MAX_RESP],
        })
    }

    /// Runs the workload: keep the window full, poll, check each response, re-post its
    /// receive; stops at the first unsuccessful completion.
    fn run(&mut self) -> Res<()> {
        let mut wcs = [WorkCompletion::default(); 32];
        let mut waiter = Waiter::new(self.timeout);
        loop {
            self.fill()?;
            if self.window.finished() {
                return Ok(());
            }
            let n = self.rc.cq.poll(&mut wcs)?;
            if n == 0 {
                waiter.idle(&|| {
                    format!(
                        "responses ({} of {} requests answered, {} in flight{})",
                        self.window.done(),
                        self.work.len(),
                        self.window.in_flight(),
                        if self.tuning.rnr_retry == 7 {
                            "; note: with rnr_retry 7 a SEND that finds the server's receive queue \
                             empty is retried forever"
                        } else {
                            ""
                        }
                    )
                })?;
                continue;
            }
            waiter.progress();
            let now = Instant::now();
            for wc in &wcs[..n] {
                if !wc.is_ok() {
                    self.failed(wc);
                } else if wc.wr_id & RECV_BIT != 0 {
                    self.on_response(wc, now)?;
                } else if wc.opcode == WcOpcode::Send {
                    self.window.sent(wc.wr_id as usize);
                }
            }
            if self.rep.first_error.is_some() {
                return Ok(());
            }
            self.repost()?;
        }
    }

    /// Fills the window with the next requests, posted with one `post_send`.
    fn fill(&mut self) -> Res<()> {
        let mut batch = Vec::new();
        let now = Instant::now();
        while let Some((s, req)) = self.window.take(now) {
            let len = self.work.encode(req, &mut self.buf)?;
            self.req_mr.write(s * MAX_REQ, &self.buf[..len])?;
            batch.push((s as u64, s * MAX_REQ, len));
        }
        if batch.is_empty() {
            return Ok(());
        }
        lists::post_sends(&self.rc.qp, &self.req_mr, &batch).context("posting requests")
    }

    /// Counts an unsuccessful completion and describes the first one.
    fn failed(&mut self, wc: &WorkCompletion) {
        *self.rep.errors.entry(completion_name(wc)).or_default() += 1;
        if self.rep.first_error.is_some() {
            return;
        }
        let what = if wc.wr_id & RECV_BIT != 0 {
            "a response receive".to_string()
        } else {
            match self.window.request_in(wc.wr_id as usize) {
                Some(req) => format!("request #{req} ({:?})", self.work.op(req)),
                None => "a request".to_string(),
            }
        };
        self.rep.first_error = Some(format!(
            "{what} completed with {} ({}) after {} answered requests",
            status_name(wc.status),
            wc.status,
            self.window.done()
        ));
    }

    /// A response arrived: read it, match it to its request, time and check it.
    fn on_response(&mut self, wc: &WorkCompletion, now: Instant) -> Res<()> {
        let id = self.rep.id;
        let rs = (wc.wr_id & !RECV_BIT) as usize;
        let len = (wc.byte_len as usize).min(MAX_RESP);
        self.resp_mr.read(rs * MAX_RESP, &mut self.rbuf[..len])?;
        self.repost.push(rs);
        let r = match kv::decode_response(&self.rbuf[..len]) {
            Ok(r) => r,
            Err(e) => bail!("client {id}: bad response: {e}"),
        };
        let req = self
            .window
            .answered(r.req_id, now, &mut self.rep)
            .with_context(|| format!("client {id}"))?;
        self.work.check(req, &r, &mut self.rep);
        Ok(())
    }

    /// Re-posts the receives of the responses read, with one `post_recv`.
    fn repost(&mut self) -> Res<()> {
        if self.repost.is_empty() {
            return Ok(());
        }
        let items: Vec<_> = self
            .repost
            .drain(..)
            .map(|s| (RECV_BIT | s as u64, s * MAX_RESP, MAX_RESP))
            .collect();
        lists::post_recvs(&self.rc.qp, &self.resp_mr, &items).context("re-posting response receives")
    }

    /// Ends the run: after an error the QP is in ERR and everything outstanding flushes,
    /// which is collected (bounded); then the server is told this connection is done.
    fn finish(mut self) -> Res<ClientReport> {
        self.rep.wall = self.start.elapsed();
        self.rep.completed = self.window.done();
        if self.rep.first_error.is_some() {
            let errors = &mut self.rep.errors;
            wait::drain(&self.rc.cq, Duration::from_millis(300), self.timeout, |wc| {
                *errors.entry(completion_name(wc)).or_default() += 1;
            })?;
        }
        // The server exits when all its connections are done.
        let _ = side_channel::send_msg(&mut self.peer.stream, b"done");
        Ok(self.rep)
    }
}

/// A client completion's status for the error counts (flushes split by queue).
fn completion_name(wc: &WorkCompletion) -> &'static str {
    match (wc.status, wc.wr_id & RECV_BIT != 0) {
        (WcStatus::Success, _) => "success (late)",
        (WcStatus::WrFlushErr, true) => "IBV_WC_WR_FLUSH_ERR (response receives)",
        (WcStatus::WrFlushErr, false) => "IBV_WC_WR_FLUSH_ERR (requests)",
        (s, _) => status_name(s),
    }
}

// ---------------------------------------------------------------------------------------
// demo

fn demo(common: &CommonArgs, a: &DemoArgs) -> Res<()> {
    let expect_rnr_error = a.server.no_refill && a.client.rnr_retry == 0;
    let mut sargs = ChildArgs::server(common)
        .opt("--clients", a.client.clients.max(1))
        .opt("--recv-depth", a.server.recv_depth)
        .opt("--tick-ms", a.server.tick_ms)
        .flag("--no-refill", a.server.no_refill)
        .flag("--srq", a.server.srq);
    if let Some(d) = a.server.srq_depth {
        sargs = sargs.opt("--srq-depth", d);
    }
    if let Some(l) = a.server.srq_limit {
        sargs = sargs.opt("--srq-limit", l);
    }
    println!(
        "demo: starting the kv-rpc server, then {} client connection(s) x {} keys{}",
        a.client.clients,
        a.client.keys,
        match (a.server.no_refill, a.client.rnr_retry) {
            (false, _) if a.server.srq => " (one shared receive queue, refilled on its limit event)".into(),
            (false, _) => String::new(),
            (true, 0) => " (no refill, rnr_retry 0: expecting IBV_WC_RNR_RETRY_EXC_ERR)".into(),
            (true, r) => format!(" (no refill, rnr_retry {r}: expecting RNR retries to slow things down)"),
        }
    );
    let (mut server, addr) = start_server("server", &sargs)?;
    let reports = with_backend!(common, |b| clients(b, common, &a.client, addr, 0))?;
    let ok = print_clients(&reports, a.client.window, a.client.value_size);
    server
        .wait_success(common.wait() + Duration::from_secs(10))
        .context("the kv-rpc server")?;
    if expect_rnr_error {
        let seen = reports.iter().filter(|r| r.saw(WcStatus::RnrRetryExcErr)).count();
        let answered: usize = reports.iter().map(|r| r.completed).sum();
        if seen == 0 {
            bail!(
                "expected IBV_WC_RNR_RETRY_EXC_ERR with --no-refill --rnr-retry 0, but no connection saw it"
            )
        }
        println!(
            "demo: OK: expected outcome observed: {seen} of {} connection(s) got IBV_WC_RNR_RETRY_EXC_ERR \
             once the server's {} receives were used up ({answered} requests answered before that); \
             the rest were flushed (IBV_WC_WR_FLUSH_ERR)",
            reports.len(),
            a.server.recv_depth
        );
        Ok(())
    } else if ok && a.server.srq {
        srq_outcome(&reports, &server)
    } else if ok {
        let checks: u64 = reports.iter().flat_map(|r| r.checked.iter()).sum();
        println!(
            "demo: OK: all {checks} answers checked: every GET returned the value PUT, every deleted key is gone"
        );
        Ok(())
    } else {
        bail!("invariant violated: wrong answers or failed requests (see above)")
    }
}

/// `demo --srq`: every answer was right (checked by the caller); the SRQ's limit event
/// fired at least once (the server says how often) and no SEND failed for want of a
/// receive (`IBV_WC_RNR_RETRY_EXC_ERR`).
fn srq_outcome(reports: &[ClientReport], server: &ChildProc) -> Res<()> {
    if let Some(r) = reports.iter().find(|r| r.saw(WcStatus::RnrRetryExcErr)) {
        bail!(
            "client {} got IBV_WC_RNR_RETRY_EXC_ERR: the shared receive queue ran dry",
            r.id
        )
    }
    let line = server
        .last_line(SRQ_EVENTS)
        .context("the server did not say how often the SRQ limit event fired")?;
    let fired: u64 = line[SRQ_EVENTS.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("unreadable line from the server: {line:?}"))?;
    if fired == 0 {
        bail!("the SRQ limit event never fired, so the shared queue was never refilled on it")
    }
    let checks: u64 = reports.iter().flat_map(|r| r.checked.iter()).sum();
    println!(
        "demo: OK: all {checks} answers checked over one shared receive queue; its limit event fired {fired} \
         times and each time a batch of receives was posted; no IBV_WC_RNR_RETRY_EXC_ERR"
    );
    Ok(())
}
