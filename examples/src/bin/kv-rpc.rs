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
//! ```text
//! kv-rpc demo                                  # server child + 2 client connections, checked
//! kv-rpc demo --no-refill                      # RNR retries: same result, much slower
//! kv-rpc demo --no-refill --rnr-retry 0        # RNR_RETRY_EXC_ERR, counted (exit 0 when seen)
//! kv-rpc server --listen 0.0.0.0:18515 --clients 1
//! kv-rpc client --server 10.0.0.1:18515
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand};
use examples::backend::open_device;
use examples::child::{announce_listening, ChildProc, Echo};
use examples::cli::CommonArgs;
use examples::conn::{self, QpOpts};
use examples::kv::{self, Op, Status, MAX_REQ, MAX_RESP};
use examples::stats::{per_sec, si, Latencies};
use examples::wait::{status_name, Waiter};
use examples::{with_backend, Res};
use verbs_api::cm::Offer;
use verbs_api::{
    modify_to_init, AccessFlags, Backend, CompletionQueue, Context, MemoryRegion, ProtectionDomain,
    QueuePair, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
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

#[derive(Args, Debug, Clone)]
struct ServerTuning {
    /// Receives pre-posted per client QP (each of the maximum request size).
    #[arg(long, default_value_t = 64)]
    recv_depth: u32,
    /// Do not re-post receives after each poll batch; only the slow --tick-ms
    /// housekeeping tick re-posts them (shows RQ exhaustion and RNR NAKs).
    #[arg(long)]
    no_refill: bool,
    /// With --no-refill: the housekeeping tick that re-posts consumed receives, in ms
    /// (0: never).
    #[arg(long, default_value_t = 20)]
    tick_ms: u64,
}

#[derive(Args, Debug, Clone)]
struct ServerArgs {
    /// Address to listen on for connection setup (port 0: any free port; loopback by
    /// default, 0.0.0.0:PORT accepts other hosts).
    #[arg(long, default_value = "127.0.0.1:18515")]
    listen: String,
    /// Client connections to accept before serving.
    #[arg(long, default_value_t = 1)]
    clients: u32,
    #[command(flatten)]
    tuning: ServerTuning,
}

#[derive(Args, Debug, Clone)]
struct ClientTuning {
    /// Client connections (each a thread with its own QP).
    #[arg(long, default_value_t = 2)]
    clients: u32,
    /// Keys per connection: each is PUT, GET, half are DELETEd, all are GET again.
    #[arg(long, default_value_t = 2000)]
    keys: u32,
    /// Value size in bytes (at most 1024).
    #[arg(long, default_value_t = 64)]
    value_size: usize,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 16)]
    window: u32,
    /// The client QP's rnr_retry: 7 retries forever, 0 fails on the first RNR NAK.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(0..=7))]
    rnr_retry: u8,
}

#[derive(Args, Debug, Clone)]
struct ClientArgs {
    /// The server's connection-setup address.
    #[arg(long, default_value = "127.0.0.1:18515")]
    server: String,
    /// Number of the first connection (keys are named `c<id>-k<i>`; give processes
    /// sharing one server distinct ranges).
    #[arg(long, default_value_t = 0)]
    first_id: u32,
    #[command(flatten)]
    tuning: ClientTuning,
}

#[derive(Args, Debug, Clone)]
struct DemoArgs {
    #[command(flatten)]
    server: ServerTuning,
    #[command(flatten)]
    client: ClientTuning,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    examples::init_tracing();
    examples::report("kv-rpc", run(cli))
}

fn run(cli: Cli) -> Res<()> {
    let common = &cli.common;
    match &cli.cmd {
        Cmd::Server(a) => with_backend!(common.backend, |b| server(b, common, a)),
        Cmd::Client(a) => {
            let addr = conn::parse_addr(&a.server)?;
            let reports = with_backend!(common.backend, |b| clients(
                b, common, &a.tuning, addr, a.first_id
            ))?;
            let ok = summarize(&reports, &a.tuning);
            if ok {
                Ok(())
            } else {
                bail!("some requests failed or returned wrong answers (see above)")
            }
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

/// One client connection on the server.
struct ServerConn<B: Backend> {
    qp: B::Qp,
    peer: verbs_api::cm::Peer,
    /// Receives currently posted.
    posted: u32,
    /// Receive slots consumed and processed, waiting to be re-posted.
    consumed: Vec<u32>,
    /// Received requests (slot, length) waiting for a free response slot.
    pending: VecDeque<(u32, u32)>,
    /// Free response slots.
    free_resp: Vec<u32>,
    done: bool,
    dry_since: Option<Instant>,
    dry_total: Duration,
    dry_count: u32,
}

fn server<B: Backend>(b: &B, common: &CommonArgs, a: &ServerArgs) -> Res<()> {
    let t = &a.tuning;
    let depth = t.recv_depth.max(1);
    let nconn = a.clients.max(1) as usize;
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    // Responses in flight per connection: one per request being answered; twice the
    // receive depth is more than a client can have outstanding.
    let resp_slots = depth * 2;
    let recv_mr = pd
        .reg_mr(nconn * depth as usize * MAX_REQ, AccessFlags::LOCAL_WRITE)
        .context("registering the receive buffers")?;
    let resp_mr = pd
        .reg_mr(nconn * resp_slots as usize * MAX_RESP, AccessFlags::LOCAL_WRITE)
        .context("registering the response buffers")?;
    let cqe = nconn as u32 * (depth + resp_slots);
    let cq = ctx.create_cq(cqe, None).context("creating the CQ")?;
    let acceptor = conn::Acceptor::start(conn::listen(&a.listen)?, common.wait())?;
    announce_listening(acceptor.local_addr());
    println!(
        "server: device {}, {} client(s), {depth} receives of {MAX_REQ} B pre-posted per QP, {}",
        ctx.name(),
        nconn,
        if t.no_refill && t.tick_ms == 0 {
            "NO refill at all (consumed receives are never re-posted)".to_string()
        } else if t.no_refill {
            format!("NO batched refill (re-posted only every {} ms)", t.tick_ms)
        } else {
            "batched refill after every poll".to_string()
        }
    );
    let params = common.rc_params();
    let recv_off = |c: usize, s: u32| (c * depth as usize + s as usize) * MAX_REQ;
    let resp_off = |c: usize, s: u32| (c * resp_slots as usize + s as usize) * MAX_RESP;
    let mut conns: Vec<ServerConn<B>> = Vec::with_capacity(nconn);
    for c in 0..nconn {
        let (qp, _cap) = conn::create_qp_on::<B>(&ctx, &pd, &cq, &QpOpts::new(resp_slots, depth))?;
        // Receives first, then accept: the client may send as soon as it is connected.
        let prepare = |qp: &B::Qp| -> Res<()> {
            modify_to_init(qp, &params)?;
            post_recvs(qp, &recv_mr, c, &(0..depth).collect::<Vec<_>>(), &recv_off)
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
            posted: depth,
            consumed: Vec::new(),
            pending: VecDeque::new(),
            free_resp: (0..resp_slots).rev().collect(),
            done: false,
            dry_since: None,
            dry_total: Duration::ZERO,
            dry_count: 0,
        });
    }

    let mut store: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut counts = [0u64; 4]; // GET, PUT, DELETE, bad
    let mut errors: BTreeMap<&'static str, u64> = BTreeMap::new();
    let (mut refills, mut reposted) = (0u64, 0u64);
    let mut wcs = [WorkCompletion::default(); 32];
    let mut req = vec![0u8; MAX_REQ];
    let mut resp = vec![0u8; MAX_RESP];
    let mut waiter = Waiter::new(common.wait().max(Duration::from_secs(30)));
    let tick = Duration::from_millis(t.tick_ms);
    let mut next_tick = Instant::now() + tick;
    let mut last_peer_check = Instant::now();
    let mut first_req: Option<Instant> = None;
    let mut last_req = Instant::now();
    loop {
        let n = cq.poll(&mut wcs)?;
        if n == 0 {
            let now = Instant::now();
            if t.no_refill && t.tick_ms > 0 && now >= next_tick {
                next_tick = now + tick;
                for (c, sc) in conns.iter_mut().enumerate() {
                    let (r, k) = refill::<B>(sc, &recv_mr, c, &recv_off, now)?;
                    refills += r;
                    reposted += k;
                }
            }
            if now - last_peer_check >= Duration::from_millis(2) {
                last_peer_check = now;
                for sc in conns.iter_mut().filter(|c| !c.done) {
                    sc.done = examples::side_channel::peer_done(&mut sc.peer.stream)?;
                }
                if conns.iter().all(|c| c.done) {
                    break;
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
                sc.posted -= 1;
                if sc.posted == 0 {
                    sc.dry_since = Some(now);
                    sc.dry_count += 1;
                }
            }
            if !wc.is_ok() {
                *errors.entry(status_name(wc.status)).or_default() += 1;
                continue;
            }
            if is_recv {
                sc.pending.push_back((slot, wc.byte_len));
                first_req.get_or_insert(now);
                last_req = now;
            } else {
                sc.free_resp.push(slot);
            }
        }
        // Execute what arrived and answer, one post_send per connection.
        for (c, sc) in conns.iter_mut().enumerate() {
            let mut answers: Vec<(u32, usize)> = Vec::new();
            while let (Some(&(slot, len)), Some(rslot)) = (sc.pending.front(), sc.free_resp.last().copied()) {
                sc.pending.pop_front();
                sc.free_resp.pop();
                let len = (len as usize).min(MAX_REQ);
                recv_mr.read(recv_off(c, slot), &mut req[..len])?;
                let rlen = execute(&req[..len], &mut store, &mut counts, &mut resp);
                resp_mr.write(resp_off(c, rslot), &resp[..rlen])?;
                answers.push((rslot, rlen));
                sc.consumed.push(slot);
            }
            if !answers.is_empty() {
                let sges: Vec<[Sge; 1]> = answers
                    .iter()
                    .map(|&(s, l)| resp_mr.sge(resp_off(c, s), l).map(|g| [g]))
                    .collect::<verbs_api::Result<_>>()?;
                let wrs: Vec<SendWr<'_>> = answers
                    .iter()
                    .zip(&sges)
                    .map(|(&(s, _), g)| SendWr::send(wr_id(false, c, s), g).signaled())
                    .collect();
                if let Err(e) = sc.qp.post_send(&wrs) {
                    // The client's QP may be gone (e.g. after RNR_RETRY_EXC_ERR); ours
                    // then errors too. Count and keep serving the others.
                    *errors.entry("post_send failed").or_default() += 1;
                    eprintln!("server: client {c}: {e}");
                }
            }
            if !t.no_refill {
                let (r, k) = refill::<B>(sc, &recv_mr, c, &recv_off, now)?;
                refills += r;
                reposted += k;
            }
        }
    }
    let elapsed = last_req.saturating_duration_since(first_req.unwrap_or(last_req));
    let total: u64 = counts.iter().sum();
    println!(
        "server: served {total} requests (GET {}, PUT {}, DELETE {}, bad {}) in {:.3} s: {}ops/s",
        counts[0],
        counts[1],
        counts[2],
        counts[3],
        elapsed.as_secs_f64(),
        si(per_sec(total as f64, elapsed))
    );
    println!(
        "server: re-posted {reposted} receives in {refills} post_recv calls (avg {:.1} per refill)",
        reposted as f64 / refills.max(1) as f64
    );
    for (c, sc) in conns.iter_mut().enumerate() {
        if let Some(t0) = sc.dry_since.take() {
            sc.dry_total += t0.elapsed();
        }
        println!(
            "server: client {c}: receive queue ran dry {} times, empty for {:.0} ms in total{}",
            sc.dry_count,
            sc.dry_total.as_secs_f64() * 1e3,
            if sc.dry_count > 0 {
                " (SENDs arriving meanwhile got RNR NAKs)"
            } else {
                ""
            }
        );
    }
    if !errors.is_empty() {
        println!("server: error completions: {errors:?}");
    }
    println!("server: keys stored at exit: {}", store.len());
    Ok(())
}

fn accept_timeout(common: &CommonArgs) -> Duration {
    common.wait().max(Duration::from_secs(30))
}

/// Re-posts every consumed receive of one connection with one `post_recv`; returns
/// (calls, receives).
fn refill<B: Backend>(
    sc: &mut ServerConn<B>,
    recv_mr: &B::Mr,
    c: usize,
    recv_off: &dyn Fn(usize, u32) -> usize,
    now: Instant,
) -> Res<(u64, u64)> {
    if sc.consumed.is_empty() {
        return Ok((0, 0));
    }
    let slots = std::mem::take(&mut sc.consumed);
    // A QP in ERR still accepts receives (they flush); a failure here is fatal.
    post_recvs(&sc.qp, recv_mr, c, &slots, recv_off)?;
    sc.posted += slots.len() as u32;
    if let Some(t0) = sc.dry_since.take() {
        sc.dry_total += now - t0;
    }
    Ok((1, slots.len() as u64))
}

fn post_recvs<Q: QueuePair, M: MemoryRegion>(
    qp: &Q,
    mr: &M,
    c: usize,
    slots: &[u32],
    off: &dyn Fn(usize, u32) -> usize,
) -> Res<()> {
    let sges: Vec<[Sge; 1]> = slots
        .iter()
        .map(|&s| mr.sge(off(c, s), MAX_REQ).map(|g| [g]))
        .collect::<verbs_api::Result<_>>()?;
    let wrs: Vec<RecvWr<'_>> = slots
        .iter()
        .zip(&sges)
        .map(|(&s, g)| RecvWr::new(wr_id(true, c, s), g))
        .collect();
    qp.post_recv(&wrs).context("posting receives")
}

/// Runs one request against the store and encodes the response into `resp`.
fn execute(
    req: &[u8],
    store: &mut HashMap<Vec<u8>, Vec<u8>>,
    counts: &mut [u64; 4],
    resp: &mut [u8],
) -> usize {
    match kv::decode_request(req) {
        Ok(r) => match r.op {
            Op::Get => {
                counts[0] += 1;
                match store.get(r.key) {
                    Some(v) => kv::encode_response(resp, Status::Ok, r.op as u8, r.req_id, v),
                    None => kv::encode_response(resp, Status::NotFound, r.op as u8, r.req_id, &[]),
                }
            }
            Op::Put => {
                counts[1] += 1;
                store.insert(r.key.to_vec(), r.value.to_vec());
                kv::encode_response(resp, Status::Ok, r.op as u8, r.req_id, &[])
            }
            Op::Delete => {
                counts[2] += 1;
                let st = if store.remove(r.key).is_some() {
                    Status::Ok
                } else {
                    Status::NotFound
                };
                kv::encode_response(resp, st, r.op as u8, r.req_id, &[])
            }
        },
        Err(_) => {
            counts[3] += 1;
            kv::encode_response(resp, Status::BadRequest, 0, 0, &[])
        }
    }
}

// ---------------------------------------------------------------------------------------
// client

/// What a request must get back.
#[derive(Clone, Copy, Debug)]
enum Expect {
    PutOk = 0,
    Value = 1,
    DeleteOk = 2,
    Gone = 3,
}

const CHECK_LABELS: [&str; 4] = [
    "PUT ok",
    "GET returned the PUT value",
    "DELETE ok",
    "GET of a deleted key: not found",
];

/// The outcome of one client connection.
#[derive(Debug, Default)]
struct ClientReport {
    id: u32,
    total: usize,
    completed: usize,
    wall: Duration,
    lat: Latencies,
    /// Answers that matched, by [`Expect`] (PUT ok, GET value, DELETE ok, GET gone).
    checked: [u64; 4],
    mismatches: u64,
    examples: Vec<String>,
    errors: BTreeMap<&'static str, u64>,
    first_error: Option<String>,
    stalls: u64,
    stalled: Duration,
}

impl ClientReport {
    fn saw(&self, s: WcStatus) -> bool {
        self.errors.contains_key(status_name(s))
    }
}

#[derive(Clone, Copy, Debug)]
enum Slot {
    Free,
    Busy {
        req: usize,
        t0: Instant,
        send_done: bool,
        resp_done: bool,
    },
}

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
    let results: Vec<Res<ClientReport>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..tuning.clients.max(1))
            .map(|i| {
                let (ctx, pd) = (&ctx, &pd);
                s.spawn(move || client_conn::<B>(ctx, pd, common, tuning, addr, first_id + i))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("client thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect()
}

fn client_conn<B: Backend>(
    ctx: &B::Context,
    pd: &B::Pd,
    common: &CommonArgs,
    tuning: &ClientTuning,
    addr: SocketAddr,
    id: u32,
) -> Res<ClientReport> {
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
    let mut peer = conn::connect(addr, ctx, &rc.qp, &params, Offer::new(), timeout)?;

    // The workload: PUT all, GET all, DELETE the even keys, GET all again.
    let keys: Vec<Vec<u8>> = (0..tuning.keys)
        .map(|i| format!("c{id}-k{i}").into_bytes())
        .collect();
    let mut ops: Vec<(Op, usize, Expect)> = Vec::new();
    ops.extend((0..keys.len()).map(|k| (Op::Put, k, Expect::PutOk)));
    ops.extend((0..keys.len()).map(|k| (Op::Get, k, Expect::Value)));
    ops.extend(
        (0..keys.len())
            .step_by(2)
            .map(|k| (Op::Delete, k, Expect::DeleteOk)),
    );
    ops.extend((0..keys.len()).map(|k| (Op::Get, k, if k % 2 == 0 { Expect::Gone } else { Expect::Value })));

    let mut rep = ClientReport {
        id,
        total: ops.len(),
        lat: Latencies::with_capacity(ops.len()),
        ..Default::default()
    };
    let mut slots = vec![Slot::Free; window];
    let (mut next, mut done) = (0usize, 0usize);
    let mut wcs = [WorkCompletion::default(); 32];
    let mut buf = vec![0u8; MAX_REQ];
    let mut rbuf = vec![0u8; MAX_RESP];
    let mut waiter = Waiter::new(timeout);
    let stall = Duration::from_millis(1);
    let start = Instant::now();
    let mut last_event = start;
    let mut repost: Vec<usize> = Vec::new();
    'run: loop {
        // Fill the window with one post_send.
        let mut batch: Vec<(usize, usize)> = Vec::new();
        let now = Instant::now();
        if next == done {
            last_event = now; // the pipeline was empty: no stall until now
        }
        while next < ops.len() && next - done < window {
            let s = next % window;
            if !matches!(slots[s], Slot::Free) {
                break;
            }
            let (op, k, _) = ops[next];
            let value = if op == Op::Put {
                kv::value_for(&keys[k], tuning.value_size)
            } else {
                Vec::new()
            };
            let len = kv::encode_request(&mut buf, op, next as u32, &keys[k], &value)
                .map_err(anyhow::Error::msg)?;
            req_mr.write(s * MAX_REQ, &buf[..len])?;
            slots[s] = Slot::Busy {
                req: next,
                t0: now,
                send_done: false,
                resp_done: false,
            };
            batch.push((s, len));
            next += 1;
        }
        if !batch.is_empty() {
            let sges: Vec<[Sge; 1]> = batch
                .iter()
                .map(|&(s, l)| req_mr.sge(s * MAX_REQ, l).map(|g| [g]))
                .collect::<verbs_api::Result<_>>()?;
            let wrs: Vec<SendWr<'_>> = batch
                .iter()
                .zip(&sges)
                .map(|(&(s, _), g)| SendWr::send(s as u64, g).signaled())
                .collect();
            rc.qp.post_send(&wrs).context("posting requests")?;
        }
        if done == ops.len() && slots.iter().all(|s| matches!(s, Slot::Free)) {
            break;
        }
        let n = rc.cq.poll(&mut wcs)?;
        if n == 0 {
            waiter.idle(&|| {
                format!(
                    "responses ({done} of {} requests answered, {} in flight{})",
                    ops.len(),
                    next - done,
                    if tuning.rnr_retry == 7 {
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
                *rep.errors.entry(completion_name(wc)).or_default() += 1;
                if rep.first_error.is_none() {
                    let what = if wc.wr_id & RECV_BIT != 0 {
                        "a response receive".to_string()
                    } else {
                        match slots.get(wc.wr_id as usize) {
                            Some(Slot::Busy { req, .. }) => format!("request #{req} ({:?})", ops[*req].0),
                            _ => "a request".to_string(),
                        }
                    };
                    rep.first_error = Some(format!(
                        "{what} completed with {} ({}) after {} answered requests",
                        status_name(wc.status),
                        wc.status,
                        done
                    ));
                }
                continue;
            }
            if wc.wr_id & RECV_BIT != 0 {
                let rs = (wc.wr_id & !RECV_BIT) as usize;
                let len = (wc.byte_len as usize).min(MAX_RESP);
                resp_mr.read(rs * MAX_RESP, &mut rbuf[..len])?;
                repost.push(rs);
                let r = match kv::decode_response(&rbuf[..len]) {
                    Ok(r) => r,
                    Err(e) => bail!("client {id}: bad response: {e}"),
                };
                let s = r.req_id as usize % window;
                let Slot::Busy {
                    req, t0, send_done, ..
                } = slots[s]
                else {
                    bail!(
                        "client {id}: response to request {} that is not in flight",
                        r.req_id
                    )
                };
                if req != r.req_id as usize {
                    bail!(
                        "client {id}: response to request {} while {req} is in flight",
                        r.req_id
                    );
                }
                rep.lat.record(now - t0);
                let gap = now - last_event;
                if gap > stall {
                    rep.stalls += 1;
                    rep.stalled += gap;
                }
                last_event = now;
                let (op, k, expect) = ops[req];
                check(&mut rep, expect, op, &keys[k], &r, tuning.value_size);
                done += 1;
                slots[s] = if send_done {
                    Slot::Free
                } else {
                    Slot::Busy {
                        req,
                        t0,
                        send_done,
                        resp_done: true,
                    }
                };
            } else if wc.opcode == WcOpcode::Send {
                let s = wc.wr_id as usize;
                if let Some(Slot::Busy {
                    req, t0, resp_done, ..
                }) = slots.get(s).copied()
                {
                    slots[s] = if resp_done {
                        Slot::Free
                    } else {
                        Slot::Busy {
                            req,
                            t0,
                            send_done: true,
                            resp_done,
                        }
                    };
                }
            }
        }
        if rep.first_error.is_some() {
            break 'run;
        }
        if !repost.is_empty() {
            let sges: Vec<[Sge; 1]> = repost
                .iter()
                .map(|&s| resp_mr.sge(s * MAX_RESP, MAX_RESP).map(|g| [g]))
                .collect::<verbs_api::Result<_>>()?;
            let wrs: Vec<RecvWr<'_>> = repost
                .iter()
                .zip(&sges)
                .map(|(&s, g)| RecvWr::new(RECV_BIT | s as u64, g))
                .collect();
            rc.qp.post_recv(&wrs).context("re-posting response receives")?;
            repost.clear();
        }
    }
    rep.wall = start.elapsed();
    rep.completed = done;
    if rep.first_error.is_some() {
        // The QP is in ERR: everything outstanding flushes. Collect it (bounded).
        let mut quiet = Waiter::new(Duration::from_millis(300));
        let hard = Instant::now() + timeout;
        while Instant::now() < hard {
            let n = rc.cq.poll(&mut wcs)?;
            if n == 0 {
                if quiet.idle(&String::new).is_err() {
                    break;
                }
                continue;
            }
            quiet.progress();
            for wc in &wcs[..n] {
                *rep.errors.entry(completion_name(wc)).or_default() += 1;
            }
        }
    }
    // Tell the server this connection is done (it exits when all are).
    let _ = examples::side_channel::send_msg(&mut peer.stream, b"done");
    Ok(rep)
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

fn check(rep: &mut ClientReport, expect: Expect, op: Op, key: &[u8], r: &kv::Response<'_>, vsize: usize) {
    let ok = match expect {
        Expect::PutOk | Expect::DeleteOk => r.status == Status::Ok,
        Expect::Gone => r.status == Status::NotFound,
        Expect::Value => r.status == Status::Ok && r.value == kv::value_for(key, vsize).as_slice(),
    };
    let label = CHECK_LABELS[expect as usize];
    if ok {
        rep.checked[expect as usize] += 1;
    } else {
        rep.mismatches += 1;
        if rep.examples.len() < 3 {
            rep.examples.push(format!(
                "{op:?} {}: expected {label}, got {:?} with {} value bytes",
                String::from_utf8_lossy(key),
                r.status,
                r.value.len()
            ));
        }
    }
}

/// Prints the client reports; returns whether every request succeeded and was correct.
fn summarize(reports: &[ClientReport], t: &ClientTuning) -> bool {
    let mut all = Latencies::default();
    let mut ok = true;
    let mut wall = Duration::ZERO;
    let mut completed = 0;
    for r in reports {
        let s = r.lat.summary();
        println!(
            "client {}: {} of {} requests answered in {:.3} s: {}ops/s; latency {}",
            r.id,
            r.completed,
            r.total,
            r.wall.as_secs_f64(),
            si(per_sec(r.completed as f64, r.wall)),
            s
        );
        let checked: Vec<String> = r
            .checked
            .iter()
            .zip(CHECK_LABELS)
            .map(|(v, k)| format!("{v} {k}"))
            .collect();
        println!(
            "client {}: checked: {}; wrong answers: {}",
            r.id,
            checked.join(", "),
            r.mismatches
        );
        for e in &r.examples {
            println!("client {}:   wrong: {e}", r.id);
        }
        println!(
            "client {}: stalls (no response for > 1 ms with requests in flight): {}, {:.1} ms in total ({:.0}% of the run)",
            r.id,
            r.stalls,
            r.stalled.as_secs_f64() * 1e3,
            100.0 * r.stalled.as_secs_f64() / r.wall.as_secs_f64().max(1e-9)
        );
        if let Some(e) = &r.first_error {
            println!("client {}: first error: {e}", r.id);
            println!("client {}: error completions: {:?}", r.id, r.errors);
        }
        ok &= r.mismatches == 0 && r.completed == r.total && r.first_error.is_none();
        all.merge(&r.lat);
        wall = wall.max(r.wall);
        completed += r.completed;
    }
    println!(
        "total: {completed} requests over {} connection(s) (window {}, value {} B) in {:.3} s: {}ops/s; latency {}",
        reports.len(),
        t.window,
        t.value_size,
        wall.as_secs_f64(),
        si(per_sec(completed as f64, wall)),
        all.summary()
    );
    ok
}

// ---------------------------------------------------------------------------------------
// demo

fn demo(common: &CommonArgs, a: &DemoArgs) -> Res<()> {
    let expect_rnr_error = a.server.no_refill && a.client.rnr_retry == 0;
    let mut sargs: Vec<String> = common.to_args();
    sargs.extend(
        [
            "server",
            "--listen",
            "127.0.0.1:0",
            "--clients",
            &a.client.clients.max(1).to_string(),
            "--recv-depth",
            &a.server.recv_depth.to_string(),
            "--tick-ms",
            &a.server.tick_ms.to_string(),
        ]
        .map(String::from),
    );
    if a.server.no_refill {
        sargs.push("--no-refill".into());
    }
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
    let mut server = ChildProc::spawn("server", &sargs, Echo::Stdout)?;
    let addr = server.listen_addr(Duration::from_secs(20))?;
    let reports = with_backend!(common.backend, |b| clients(b, common, &a.client, addr, 0))?;
    let ok = summarize(&reports, &a.client);
    server
        .wait_success(common.wait() + Duration::from_secs(10))
        .context("the kv-rpc server")?;
    if expect_rnr_error {
        let seen = reports.iter().filter(|r| r.saw(WcStatus::RnrRetryExcErr)).count();
        let answered: usize = reports.iter().map(|r| r.completed).sum();
        if seen > 0 {
            println!(
                "demo: OK: expected outcome observed: {seen} of {} connection(s) got IBV_WC_RNR_RETRY_EXC_ERR \
                 once the server's {} receives were used up ({answered} requests answered before that); \
                 the rest were flushed (IBV_WC_WR_FLUSH_ERR)",
                reports.len(),
                a.server.recv_depth
            );
            Ok(())
        } else {
            bail!(
                "expected IBV_WC_RNR_RETRY_EXC_ERR with --no-refill --rnr-retry 0, but no connection saw it"
            )
        }
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
