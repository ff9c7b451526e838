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
//! This file holds the verbs calls, the protocol and the demo's invariant; the wire
//! format, the store, the workload and its checks, the reports and the options are in
//! `examples::kv`.
//!
//! ```text
//! kv-rpc demo                                  # server child + 2 client connections, checked
//! kv-rpc demo --no-refill                      # RNR retries: same result, much slower
//! kv-rpc demo --no-refill --rnr-retry 0        # RNR_RETRY_EXC_ERR, counted (exit 0 when seen)
//! kv-rpc server --listen 0.0.0.0:18515 --clients 1
//! kv-rpc client --server 10.0.0.1:18515
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use examples::backend::open_device;
use examples::child::announce_listening;
use examples::cli::CommonArgs;
use examples::conn::{self, QpOpts};
use examples::demo::{start_server, ChildArgs};
use examples::kv::opts::{ClientArgs, ClientTuning, DemoArgs, ServerArgs, ServerTuning};
use examples::kv::report::{print_clients, print_server_start, ClientReport, ServerReport};
use examples::kv::slots::ConnSlots;
use examples::kv::store::Store;
use examples::kv::window::Window;
use examples::kv::workload::Workload;
use examples::kv::{self, MAX_REQ, MAX_RESP};
use examples::stats::Latencies;
use examples::wait::{self, status_name, Waiter};
use examples::{lists, side_channel, threads, with_backend, Res};
use verbs_api::cm::{Offer, Peer};
use verbs_api::{
    modify_to_init, AccessFlags, Backend, CompletionQueue, Context, MemoryRegion, ProtectionDomain,
    QueuePair, RecvWr, WcOpcode, WcStatus, WorkCompletion,
};

/// A key-value store over SEND/RECV with pre-posted, batch-refilled receives.
#[derive(Parser, Debug)]
#[command(
    name = "kv-rpc",
    version,
    after_help = "Examples:\n  kv-rpc demo\n  kv-rpc demo --no-refill\n  kv-rpc demo --no-refill --rnr-retry 0\n  kv-rpc server --listen 0.0.0.0:18515 --clients 2\n  kv-rpc client --server HOST:18515 --clients 2"
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
        Cmd::Server(a) => with_backend!(common.backend, |b| server(b, common, a)),
        Cmd::Client(a) => {
            let addr = conn::parse_addr(&a.server)?;
            let reports = with_backend!(common.backend, |b| clients(
                b, common, &a.tuning, addr, a.first_id
            ))?;
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

/// wr_id layout: bit 63 set for receives, bits 32..63 the connection, low 32 bits the slot.
const RECV_BIT: u64 = 1 << 63;

fn wr_id(recv: bool, conn: usize, slot: u32) -> u64 {
    (if recv { RECV_BIT } else { 0 }) | ((conn as u64) << 32) | slot as u64
}

fn split_wr_id(id: u64) -> (bool, usize, u32) {
    (id & RECV_BIT != 0, ((id & !RECV_BIT) >> 32) as usize, id as u32)
}

/// The server's registered buffers: `depth` receive slots of [`MAX_REQ`] and
/// `resp_slots` response slots of [`MAX_RESP`] bytes per connection.
struct Buffers<B: Backend> {
    recv: B::Mr,
    resp: B::Mr,
    depth: u32,
    resp_slots: u32,
}

impl<B: Backend> Buffers<B> {
    fn register(pd: &B::Pd, nconn: usize, depth: u32) -> Res<Self> {
        // Responses in flight per connection: one per request being answered; twice the
        // receive depth is more than a client can have outstanding.
        let resp_slots = depth * 2;
        let recv = pd
            .reg_mr(nconn * depth as usize * MAX_REQ, AccessFlags::LOCAL_WRITE)
            .context("registering the receive buffers")?;
        let resp = pd
            .reg_mr(nconn * resp_slots as usize * MAX_RESP, AccessFlags::LOCAL_WRITE)
            .context("registering the response buffers")?;
        Ok(Buffers {
            recv,
            resp,
            depth,
            resp_slots,
        })
    }

    fn recv_off(&self, c: usize, s: u32) -> usize {
        (c * self.depth as usize + s as usize) * MAX_REQ
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
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    let bufs = Buffers::<B>::register(&pd, nconn, depth)?;
    let cqe = nconn as u32 * (depth + bufs.resp_slots);
    let cq = ctx.create_cq(cqe, None).context("creating the CQ")?;
    let acceptor = conn::Acceptor::start(conn::listen(&a.listen)?, common.wait())?;
    announce_listening(acceptor.local_addr());
    print_server_start(ctx.name(), nconn, depth, t);
    let params = common.rc_params();
    let mut conns: Vec<ServerConn<B>> = Vec::with_capacity(nconn);
    for c in 0..nconn {
        let (qp, _cap) = conn::create_qp_on::<B>(&ctx, &pd, &cq, &QpOpts::new(bufs.resp_slots, depth))?;
        // Receives first, then accept: the client may send as soon as it is connected.
        let prepare = |qp: &B::Qp| -> Res<()> {
            modify_to_init(qp, &params)?;
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
    let mut store = Store::default();
    let rep = serve(&cq, &bufs, &mut conns, &mut store, t, common)?;
    rep.print(&store, conns.iter_mut().map(|c| &mut c.slots.dry));
    Ok(())
}

fn accept_timeout(common: &CommonArgs) -> Duration {
    common.wait().max(Duration::from_secs(30))
}

/// Serves until every client has said it is done: poll, execute and answer, refill.
fn serve<B: Backend>(
    cq: &B::Cq,
    bufs: &Buffers<B>,
    conns: &mut [ServerConn<B>],
    store: &mut Store,
    t: &ServerTuning,
    common: &CommonArgs,
) -> Res<ServerReport> {
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
            let (is_recv, c, slot) = split_wr_id(wc.wr_id);
            let Some(sc) = conns.get_mut(c) else {
                bail!("completion with an unknown wr_id {:#x}", wc.wr_id)
            };
            if is_recv {
                sc.slots.receive_completed(now);
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
            if !t.no_refill {
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
    let sargs = ChildArgs::server(common)
        .opt("--clients", a.client.clients.max(1))
        .opt("--recv-depth", a.server.recv_depth)
        .opt("--tick-ms", a.server.tick_ms)
        .flag("--no-refill", a.server.no_refill);
    println!(
        "demo: starting the kv-rpc server, then {} client connection(s) x {} keys{}",
        a.client.clients,
        a.client.keys,
        match (a.server.no_refill, a.client.rnr_retry) {
            (false, _) => String::new(),
            (true, 0) => " (no refill, rnr_retry 0: expecting IBV_WC_RNR_RETRY_EXC_ERR)".into(),
            (true, r) => format!(" (no refill, rnr_retry {r}: expecting RNR retries to slow things down)"),
        }
    );
    let (mut server, addr) = start_server("server", &sargs)?;
    let reports = with_backend!(common.backend, |b| clients(b, common, &a.client, addr, 0))?;
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
