//! async-echo: an echo service on tokio, the smallest complete async RDMA program.
//!
//! The server accepts connections with [`AsyncCmListener`] (the QP goes to RTS during the
//! exchange) and serves each on its own task; the client connects with [`connect_async`].
//! Both await completions through [`AsyncCq`] (the completion channel's fd in tokio's
//! reactor, armed and drained without losing an event), so no thread spins on a CQ.
//! Messages are SENDs into pre-posted receives; a receive is re-posted *before* the echo
//! goes out, so the client's next SEND never meets an empty receive queue.
//!
//! ```text
//! async-echo demo                          # server and 4 clients in one process; checks every echo
//! async-echo server --listen 0.0.0.0:18520
//! async-echo client --server HOST:18520 -n 1000
//! ```
//!
//! The subcommands and their options are in `examples::echo`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use examples::backend::open_device;
use examples::cli::CommonArgs;
use examples::echo::Cmd;
use examples::program::describe;
use examples::{with_backend, Res};
use verbs_api::aio::AsyncCq;
use verbs_api::cm::{connect_async, AsyncCmListener, AsyncConnectRequest, Offer};
use verbs_api::*;

/// An echo service over SEND/RECV on tokio (verbs_api::aio and cm).
#[derive(Parser, Debug)]
#[command(name = "async-echo", version)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Largest message.
const MSG: usize = 256;
const RECV: u64 = 1;
const SEND: u64 = 2;

/// One end of a connection: a QP whose CQ is awaited on tokio, and its two buffers.
struct Conn<B: Backend> {
    qp: QpOf<B>,
    acq: AsyncCq<B>,
    rx: MrOf<B>,
    tx: MrOf<B>,
}

fn conn<B: Backend>(ctx: &B::Context) -> Res<Conn<B>> {
    let pd = ctx.alloc_pd()?;
    let ch = ctx.create_comp_channel()?;
    let cq = ctx.create_cq(16, Some(&ch))?;
    let cap = QpCap::new(4, 4);
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap))?;
    let rx = pd.reg_mr(MSG, AccessFlags::LOCAL_WRITE)?;
    let tx = pd.reg_mr(MSG, AccessFlags::LOCAL_WRITE)?;
    Ok(Conn {
        acq: AsyncCq::new(cq, ch)?,
        qp,
        rx,
        tx,
    })
}

/// The completion, or an error naming its status.
fn ok(wc: WorkCompletion) -> Res<WorkCompletion> {
    if !wc.is_ok() {
        bail!("wr {} completed with {}", wc.wr_id, wc.status.as_str());
    }
    Ok(wc)
}

// --- the server: accept, then echo each connection on its own task -----------------

// README:begin: docs/api.md shows these regions verbatim (tests/readme.rs checks it)
// Server: the listener reads every connecting client's request at once (one that sends
// garbage or nothing within `setup` is dropped, a flood is bounded); each client is then
// set up and served on a task of its own. With `clients`, it stops after that many.
async fn server<B: Backend>(
    ctx: Arc<B::Context>,
    listener: AsyncCmListener,
    p: RcParams,
    setup: Duration,
    clients: Option<usize>,
) -> Res<()> {
    let listener = listener.with_request_timeout(setup);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients.unwrap_or(usize::MAX) {
        let request = listener.request(Duration::MAX).await?; // the client's hello, checked
        let ctx = ctx.clone();
        tasks.spawn(async move {
            let from = request.peer_addr();
            match serve::<B>(&ctx, request, &p).await {
                Ok(n) => println!("server: echoed {n} messages to {from}"),
                Err(e) => tracing::warn!("dropped the client at {from}: {e}"),
            }
        });
        while let Some(done) = tasks.try_join_next() {
            done?; // (a task that panicked)
        }
    }
    while let Some(done) = tasks.join_next().await {
        done?;
    }
    Ok(())
}

async fn serve<B: Backend>(ctx: &B::Context, request: AsyncConnectRequest, p: &RcParams) -> Res<u64> {
    let c = conn::<B>(ctx)?; // QP + AsyncCq + rx/tx MRs
    modify_to_init(&c.qp, p)?; // INIT: receives may be posted
    c.qp.post_recv(&[RecvWr::new(RECV, &[c.rx.sge_all()])])?;
    request.accept(ctx, &c.qp, p, &Offer::new()).await?; // both QPs are in RTS now
    echo(&c).await
}

async fn echo<B: Backend>(c: &Conn<B>) -> Res<u64> {
    let mut msg = [0u8; MSG];
    for n in 0.. {
        let len = ok(c.acq.completion(RECV).await?)?.byte_len as usize;
        c.rx.read(0, &mut msg[..len])?;
        if &msg[..len] == b"bye" {
            return Ok(n);
        }
        c.tx.write(0, &msg[..len])?;
        c.qp.post_recv(&[RecvWr::new(RECV, &[c.rx.sge_all()])])?; // before the echo leaves
        ok(c.acq
            .post_send(&c.qp, SendWr::send(SEND, &[c.tx.sge(0, len)?]))
            .await?)?;
    }
    unreachable!("the loop only ends by returning")
}
// README:end

// --- the client: connect, send, await each echo and check it ------------------------

// README:begin
// Client: connect, then send each message and await its echo.
async fn client<B: Backend>(ctx: &B::Context, server: &str, p: &RcParams, msgs: &[String]) -> Res<()> {
    let c = conn::<B>(ctx)?;
    connect_async(server, ctx, &c.qp, p, &Offer::new()).await?;
    let mut echo = [0u8; MSG];
    for msg in msgs.iter().map(String::as_str).chain(["bye"]) {
        c.tx.write(0, msg.as_bytes())?;
        let last = msg == "bye";
        if !last {
            c.qp.post_recv(&[RecvWr::new(RECV, &[c.rx.sge_all()])])?;
        }
        ok(c.acq
            .post_send(&c.qp, SendWr::send(SEND, &[c.tx.sge(0, msg.len())?]))
            .await?)?;
        if !last {
            let len = ok(c.acq.completion(RECV).await?)?.byte_len as usize;
            c.rx.read(0, &mut echo[..len])?;
            if echo[..len] != *msg.as_bytes() {
                bail!(
                    "echo of {msg:?} came back as {:?}",
                    String::from_utf8_lossy(&echo[..len])
                );
            }
        }
    }
    Ok(())
}
// README:end

/// Runs a client over `count` messages with a bound that grows with the count; returns
/// its run time.
async fn timed_client<B: Backend>(
    ctx: &B::Context,
    server: &str,
    p: &RcParams,
    count: u64,
    wait: Duration,
) -> Res<Duration> {
    let msgs: Vec<String> = (0..count).map(|i| format!("hello #{i}")).collect();
    let limit = wait + Duration::from_millis(count);
    let start = Instant::now();
    tokio::time::timeout(limit, client::<B>(ctx, server, p, &msgs))
        .await
        .map_err(|_| anyhow::anyhow!("the client did not finish within {limit:?}"))??;
    Ok(start.elapsed())
}

// --- command line ---------------------------------------------------------------------

fn main() -> ExitCode {
    examples::program::main("async-echo", |cli: Cli| run(&cli))
}

fn run(cli: &Cli) -> Res<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    with_backend!(cli.common, |b| rt.block_on(main_async(b, cli)))
}

async fn main_async<B: Backend>(b: &B, cli: &Cli) -> Res<()> {
    let ctx = Arc::new(open_device(b, cli.common.device.as_deref())?);
    let p = cli.common.rc_params();
    let wait = cli.common.wait();
    match &cli.cmd {
        Cmd::Server { listen } => {
            let listener = AsyncCmListener::bind(listen.as_str()).await?;
            examples::child::announce_listening(listener.local_addr()?);
            server::<B>(ctx, listener, p, wait, None).await
        }
        Cmd::Client { server, count } => {
            let t = timed_client::<B>(&ctx, server, &p, *count, wait).await?;
            report_client(0, *count, t);
            Ok(())
        }
        Cmd::Demo { clients, count } => demo::<B>(ctx, p, wait, *clients, *count).await,
    }
}

/// A server task and `clients` clients in this process; fails unless every echo matched
/// and the server ended cleanly.
async fn demo<B: Backend>(
    ctx: Arc<B::Context>,
    p: RcParams,
    wait: Duration,
    clients: usize,
    count: u64,
) -> Res<()> {
    let listener = AsyncCmListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let srv = tokio::spawn(server::<B>(ctx.clone(), listener, p, wait, Some(clients)));
    let runs = (0..clients).map(|i| {
        let (ctx, addr) = (&ctx, addr.to_string());
        async move {
            let t = timed_client::<B>(ctx, &addr, &p, count, wait).await?;
            report_client(i, count, t);
            Res::Ok(())
        }
    });
    let results = futures_util::future::join_all(runs).await;
    let mut failed: Vec<String> = results
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| r.err().map(|e| format!("client {i}: {}", describe(&e))))
        .collect();
    if failed.is_empty() {
        // Every client said goodbye: the server's tasks end on their own.
        match tokio::time::timeout(wait, srv).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => failed.push(format!("server: {}", describe(&e))),
            Ok(Err(e)) => failed.push(format!("server task: {e}")),
            Err(_) => failed.push(format!("server: not done {wait:?} after the last client")),
        }
    }
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    println!("demo: OK: {clients} client(s) x {count} messages, every echo matched what was sent");
    Ok(())
}

/// A client's line: its echoes, run time and time per round trip.
fn report_client(i: usize, count: u64, t: Duration) {
    let per = t.as_secs_f64() * 1e6 / (count.max(1) as f64);
    println!(
        "client {i}: {count} echoes in {:.3} s: {per:.1} us per round trip",
        t.as_secs_f64()
    );
}
