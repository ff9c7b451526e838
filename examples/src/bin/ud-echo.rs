//! ud-echo: one UD QP serving several clients, datagram by datagram (unreliable
//! datagrams: no connection, no acknowledgement, no retransmission).
//!
//! Each client has a UD QP of its own and registers with the server over TCP: its
//! endpoint (GID, LID, QP number) and its number go one way, the server's endpoint and
//! the largest datagram it takes (the port's MTU) the other. Both sides build an address
//! handle from the other's endpoint. The server's one QP receives every client's
//! datagrams; a completion's `src_qp` says whose it is, and the echo goes back through
//! that client's address handle to that QP. Every datagram carries the client's number,
//! a sequence number and a checksum over a payload generated from both
//! (`examples::datagram::wire`), so both ends check every byte of every datagram that
//! arrives, and a client counts a datagram whose echo does not come within
//! `--loss-timeout-ms` as lost.
//!
//! A UD receive buffer holds the 40-byte GRH in front of the payload, so every receive is
//! 40 bytes larger than the largest datagram, and the payload is read from byte 40.
//!
//! UD drops a datagram that finds no receive posted, silently: the sender's completion
//! says success. `--starve-after N` makes the server stop re-posting receives after N
//! datagrams, let its receive queue run empty and keep it so for `--starve-ms`; the demo
//! checks that the datagrams sent meanwhile are counted lost (sent, never answered) while
//! every one delivered arrived intact.
//!
//! ```text
//! ud-echo demo                                    # server child + 2 clients, RQ starved once
//! ud-echo demo --no-starve                        # nothing need be lost
//! ud-echo server --listen 0.0.0.0:18530 --clients 2
//! ud-echo client --server HOST:18530 --clients 2
//! ```

use std::collections::{HashMap, VecDeque};
use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender as Tx};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use examples::backend::open_device;
use examples::child::announce_listening;
use examples::cli::CommonArgs;
use examples::conn::{self, QpOpts};
use examples::datagram::opts::{ClientArgs, ClientTuning, DemoArgs, ServerArgs, ServerTuning};
use examples::datagram::report::{print_clients, print_senders, sender_prefix, ClientReport, Sender};
use examples::datagram::tracker::{Echo, Tracker};
use examples::datagram::wire::{self, HEADER};
use examples::demo::{start_server, ChildArgs};
use examples::kv::report::DryQueue;
use examples::stats::Latencies;
use examples::transport::{ud_to_rts, GRH, QKEY};
use examples::wait::{check_wc, Waiter};
use examples::{side_channel, threads, with_backend, Res};
use verbs_api::cm::{self, Offer};
use verbs_api::{
    ah_attr_for, local_endpoint, AccessFlags, Backend, CompletionQueue, Context, Endpoint, MemoryRegion,
    ProtectionDomain, QpType, QueuePair, RcParams, SendWr, Sge, WorkCompletion,
};

/// One UD QP echoing datagrams to several clients.
#[derive(Parser, Debug)]
#[command(
    name = "ud-echo",
    version,
    after_help = "Examples:\n  ud-echo demo\n  ud-echo demo --no-starve\n  ud-echo server --listen 0.0.0.0:18530 --clients 2\n  ud-echo client --server HOST:18530 --clients 2"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Echo the datagrams of `--clients` clients on one UD QP, then exit when they are
    /// done.
    Server(ServerArgs),
    /// Send datagrams to a server and check every echo.
    Client(ClientArgs),
    /// Start a server child process, run the clients, and check that every datagram was
    /// echoed intact or counted lost, and that the server's empty receive queue lost
    /// some.
    Demo(DemoArgs),
}

fn main() -> ExitCode {
    examples::program::main("ud-echo", |cli: Cli| run(&cli))
}

fn run(cli: &Cli) -> Res<()> {
    let common = &cli.common;
    match &cli.cmd {
        Cmd::Server(a) => with_backend!(common, |b| server(b, common, a)),
        Cmd::Client(a) => {
            let addr = conn::parse_addr(&a.server)?;
            let reports = with_backend!(common, |b| clients(b, common, &a.tuning, addr, a.first_id))?;
            if !print_clients(&reports) {
                bail!("some datagrams are unaccounted for or came back wrong (see above)")
            }
            Ok(())
        }
        Cmd::Demo(a) => demo(common, a),
    }
}

// ---------------------------------------------------------------------------------------
// registration: each side's endpoint in a verbs-api connection hello (`cm`'s format: the
// client's through `cm::exchange`, the server's answer below), over a TCP connection that
// then stays open until the client is done.

fn write_hello(stream: &mut TcpStream, me: &Endpoint, private: &[u8]) -> Res<()> {
    let hello = cm::encode_hello(me, &Offer::new().private_data(private.to_vec()));
    stream.write_all(&hello).context("sending the registration")
}

/// The 4-byte big-endian number in a hello's private data.
fn private_u32(p: &[u8]) -> Res<u32> {
    let b: [u8; 4] = p
        .try_into()
        .map_err(|_| anyhow::anyhow!("registration private data of {} bytes, expected 4", p.len()))?;
    Ok(u32::from_be_bytes(b))
}

// ---------------------------------------------------------------------------------------
// server

/// A registered client: its number, its QP (the `src_qp` of its datagrams) and the
/// address handle its echoes go through.
struct Registration<B: Backend> {
    id: u32,
    qpn: u32,
    ah: B::Ah,
}

/// wr_id of the server's echoes (its receives' are their slot numbers).
const SEND_BIT: u64 = 1 << 63;

fn server<B: Backend>(b: &B, common: &CommonArgs, a: &ServerArgs) -> Res<()> {
    let t = &a.tuning;
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    let params = common.rc_params();
    let mtu = ctx.query_port(params.port_num)?.active_mtu.bytes() as usize;
    let depth = t.recv_depth.max(1);
    let cq = ctx.create_cq(2 * depth, None).context("creating the CQ")?;
    let opts = QpOpts::new(depth, depth);
    let (qp, _) = conn::create_qp_of::<B>(&ctx, &pd, (&cq, &cq), &opts, QpType::Ud, None)?;
    ud_to_rts(&qp, &params, QKEY, 0).context("bringing the UD QP to RTS")?;
    let slot = GRH + mtu;
    let rx = pd.reg_mr(depth as usize * slot, AccessFlags::LOCAL_WRITE)?;
    let tx = pd.reg_mr(depth as usize * mtu, AccessFlags::LOCAL_WRITE)?;
    post_recvs(&qp, &rx, slot, &(0..depth).collect::<Vec<_>>())?;
    let me = local_endpoint(&ctx, &qp, &params, 0)?;
    let listener = conn::listen(&a.listen)?.with_request_timeout(common.wait().min(cm::REQUEST_TIMEOUT));
    announce_listening(listener.local_addr()?);
    println!(
        "server: device {}, one UD QP {:#x} for {} client(s), {depth} receives of {GRH} B GRH + {mtu} B (the MTU){}",
        ctx.name(),
        qp.qp_num(),
        a.clients,
        match t.starve_after {
            Some(n) => format!("; after {n} datagrams the receive queue is left empty for {} ms", t.starve_ms),
            None => String::new(),
        }
    );
    let (reg_tx, reg_rx) = channel();
    let (done, stop) = (AtomicBool::new(false), AtomicBool::new(false));
    let reg = Registrar::<B> {
        listener: &listener,
        pd: &pd,
        params: &params,
        me: &me,
        mtu,
        clients: a.clients.max(1),
        setup: common.wait(),
    };
    std::thread::scope(|s| {
        let registrar = s.spawn(|| reg.run(&reg_tx, &done, &stop));
        let mut echo = Echoer::<B> {
            qp: &qp,
            rx: &rx,
            tx: &tx,
            slot,
            mtu,
            registrations: reg_rx,
            by_qpn: HashMap::new(),
            senders: Vec::new(),
            free_tx: (0..depth).rev().collect(),
            tx_slots: depth as usize,
            backlog: VecDeque::new(),
            consumed: Vec::new(),
            posted: depth,
            received: 0,
            unknown: 0,
            failed: 0,
            dry: DryQueue::default(),
            starve: Starve::new(t),
        };
        let served = echo.serve(&cq, &done, common.wait().max(Duration::from_secs(30)));
        stop.store(true, Ordering::Relaxed);
        let registered = registrar
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the registration thread panicked")));
        served?;
        registered?;
        echo.report()
    })
}

/// Registers the clients: reads their hellos as they arrive, every client connecting at
/// once on this thread ([`cm::CmListener::request`]: each within `setup`, a flood of
/// connections bounded, so that a client that sends garbage or nothing holds up nobody
/// and is dropped with a warning), makes each one's address handle, hands it to the
/// serving loop, answers; then waits until every client says it is done.
struct Registrar<'a, B: Backend> {
    listener: &'a cm::CmListener,
    pd: &'a B::Pd,
    params: &'a RcParams,
    me: &'a Endpoint,
    mtu: usize,
    clients: u32,
    setup: Duration,
}

impl<B: Backend> Registrar<'_, B> {
    fn run(&self, out: &Tx<Registration<B>>, done: &AtomicBool, stop: &AtomicBool) -> Res<()> {
        let Some(mut streams) = self.register(out, stop)? else {
            return Ok(());
        };
        // Done: each client says so on its registration connection (or closes it).
        let mut finished = vec![false; streams.len()];
        while !finished.iter().all(|&f| f) && !stop.load(Ordering::Relaxed) {
            for (f, s) in finished.iter_mut().zip(streams.iter_mut()) {
                if !*f {
                    *f = side_channel::peer_done(s)?;
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        done.store(true, Ordering::Release);
        Ok(())
    }

    /// Accepts until `clients` have registered; returns their connections (`None`: the
    /// serving loop is gone).
    fn register(&self, out: &Tx<Registration<B>>, stop: &AtomicBool) -> Res<Option<Vec<TcpStream>>> {
        let mut streams = Vec::new();
        let wait = self.setup.max(Duration::from_secs(30));
        let mut since = Instant::now();
        while streams.len() < self.clients as usize {
            if stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let request = match self.listener.request(Duration::from_millis(50)) {
                Ok(r) => r,
                Err(verbs_api::Error::Timeout { .. } | verbs_api::Error::OutOfFiles { .. }) => {
                    if since.elapsed() > wait {
                        bail!(
                            "timed out after {:.1} s waiting for {} client(s) to register",
                            wait.as_secs_f64(),
                            self.clients - streams.len() as u32
                        );
                    }
                    continue;
                }
                Err(e) => return Err(e).context("accepting a client"),
            };
            since = Instant::now();
            let (from, ep) = (request.peer_addr(), *request.endpoint());
            let id = private_u32(request.private_data());
            let mut stream = request.into_stream();
            match id.and_then(|id| self.admit(&mut stream, from, ep, id, out)) {
                Ok(true) => streams.push(stream),
                Ok(false) => return Ok(None),
                Err(e) => tracing::warn!("dropped the client at {from}: {e:#}"),
            }
        }
        Ok(Some(streams))
    }

    /// A client's address handle, handed to the serving loop before the answer (the
    /// client sends only after it, so its first datagram finds the server knowing it);
    /// `false` if the serving loop is gone.
    fn admit(
        &self,
        stream: &mut TcpStream,
        from: SocketAddr,
        ep: Endpoint,
        id: u32,
        out: &Tx<Registration<B>>,
    ) -> Res<bool> {
        let ah = self
            .pd
            .create_ah(&ah_attr_for(&ep, self.params))
            .with_context(|| format!("an address handle for client {id} ({ep:?})"))?;
        if out.send(Registration { id, qpn: ep.qpn, ah }).is_err() {
            return Ok(false);
        }
        write_hello(stream, self.me, &(self.mtu as u32).to_be_bytes())?;
        println!("server: client {id} registered from {from} (QP {:#x})", ep.qpn);
        Ok(true)
    }
}

/// When the server lets its receive queue run empty (`--starve-after`, `--starve-ms`).
#[derive(Debug)]
enum Starve {
    /// Not at all.
    Never,
    /// After this many datagrams received.
    After(u64, Duration),
    /// Receives are not re-posted; the queue is running empty.
    Draining(Duration),
    /// Empty since then, for that long.
    Empty(Instant, Duration),
    /// Over: the queue was refilled after this long empty.
    Over(Duration),
}

impl Starve {
    fn new(t: &ServerTuning) -> Starve {
        match t.starve_after {
            Some(n) => Starve::After(n, Duration::from_millis(t.starve_ms)),
            None => Starve::Never,
        }
    }

    /// Whether consumed receives may be posted again now, with `received` datagrams
    /// received and `posted` receives posted; moves through the states.
    fn may_repost(&mut self, received: u64, posted: u32, now: Instant) -> bool {
        loop {
            *self = match *self {
                Starve::After(n, d) if received >= n => {
                    println!("server: {received} datagrams received: receives are no longer re-posted");
                    Starve::Draining(d)
                }
                Starve::Draining(d) if posted == 0 => {
                    println!(
                        "server: the receive queue is empty; keeping it so for {} ms",
                        d.as_millis()
                    );
                    Starve::Empty(now, d)
                }
                Starve::Empty(t0, d) if now.saturating_duration_since(t0) >= d => {
                    let was = now.saturating_duration_since(t0);
                    println!(
                        "server: refilling the receive queue after {} ms empty",
                        was.as_millis()
                    );
                    Starve::Over(was)
                }
                _ => break,
            };
        }
        !matches!(self, Starve::Draining(_) | Starve::Empty(..))
    }
}

/// The serving loop's state: the QP, its buffers, who is who, what waits to be echoed.
struct Echoer<'a, B: Backend> {
    qp: &'a B::Qp,
    rx: &'a B::Mr,
    tx: &'a B::Mr,
    /// Bytes per receive: GRH + MTU.
    slot: usize,
    mtu: usize,
    registrations: Receiver<Registration<B>>,
    /// Client index and address handle, by QP number.
    by_qpn: HashMap<u32, (usize, B::Ah)>,
    senders: Vec<Sender>,
    free_tx: Vec<u32>,
    /// Send slots in all.
    tx_slots: usize,
    /// Received datagrams waiting for a send slot: (receive slot, bytes, client index).
    backlog: VecDeque<(u32, usize, usize)>,
    /// Receive slots to post again.
    consumed: Vec<u32>,
    posted: u32,
    received: u64,
    /// Datagrams from a QP that never registered.
    unknown: u64,
    /// Unsuccessful completions.
    failed: u64,
    dry: DryQueue,
    starve: Starve,
}

impl<B: Backend> Echoer<'_, B> {
    /// Takes the registrations handed over so far.
    fn take_registrations(&mut self) {
        while let Ok(r) = self.registrations.try_recv() {
            self.by_qpn.insert(r.qpn, (self.senders.len(), r.ah));
            self.senders.push(Sender {
                id: r.id,
                qpn: r.qpn,
                ..Sender::default()
            });
        }
    }

    /// Serves until the clients are done and every echo has left; fails after
    /// `timeout` without a datagram, a completion or a client finishing.
    fn serve(&mut self, cq: &B::Cq, done: &AtomicBool, timeout: Duration) -> Res<()> {
        let mut wcs = [WorkCompletion::default(); 32];
        let mut waiter = Waiter::new(timeout);
        let mut buf = vec![0u8; self.mtu];
        loop {
            let n = cq.poll(&mut wcs)?;
            let now = Instant::now();
            for wc in &wcs[..n] {
                if wc.wr_id & SEND_BIT != 0 {
                    self.free_tx.push(wc.wr_id as u32);
                    self.failed += u64::from(!wc.is_ok());
                } else {
                    self.received(wc, now, &mut buf)?;
                }
            }
            self.echo_backlog()?;
            if self.starve.may_repost(self.received, self.posted, now) && !self.consumed.is_empty() {
                post_recvs(self.qp, self.rx, self.slot, &self.consumed)?;
                self.posted += self.consumed.len() as u32;
                self.consumed.clear();
                self.dry.refilled(now);
            }
            if n > 0 {
                waiter.progress();
                continue;
            }
            if done.load(Ordering::Acquire) && self.backlog.is_empty() && self.free_tx.len() == self.tx_slots
            {
                return Ok(());
            }
            waiter.idle(&|| "datagrams from the clients".to_string())?;
        }
    }

    /// A receive completed: check the datagram, note its sender, queue its echo.
    fn received(&mut self, wc: &WorkCompletion, now: Instant, buf: &mut [u8]) -> Res<()> {
        let slot = wc.wr_id as u32;
        self.posted -= 1;
        if self.posted == 0 {
            self.dry.ran_dry(now);
        }
        if !wc.is_ok() {
            self.failed += 1;
            self.consumed.push(slot);
            return check_wc(wc, &|| "a receive".to_string());
        }
        self.received += 1;
        // The completion names the sending QP; a datagram from a client registered a
        // moment ago may come before its registration was taken.
        if !self.by_qpn.contains_key(&wc.src_qp) {
            self.take_registrations();
        }
        let Some(&(c, _)) = self.by_qpn.get(&wc.src_qp) else {
            self.unknown += 1;
            self.consumed.push(slot);
            return Ok(());
        };
        let len = (wc.byte_len as usize).saturating_sub(GRH).min(self.mtu);
        self.rx.read(slot as usize * self.slot + GRH, &mut buf[..len])?;
        let s = &mut self.senders[c];
        match wire::decode(&buf[..len]) {
            Ok(d) if d.client == s.id => {
                s.received += 1;
                s.max_seq = Some(s.max_seq.map_or(d.seq, |m| m.max(d.seq)));
                self.backlog.push_back((slot, d.len, c));
            }
            Ok(d) => {
                s.foreign += 1;
                eprintln!(
                    "server: a datagram from QP {:#x} (client {}) names client {}",
                    wc.src_qp, s.id, d.client
                );
                self.consumed.push(slot);
            }
            Err(e) => {
                s.damaged += 1;
                eprintln!(
                    "server: a damaged datagram from client {} ({} bytes): {e}",
                    s.id, len
                );
                self.consumed.push(slot);
            }
        }
        Ok(())
    }

    /// Echoes what waits, while send slots are free: each datagram copied to a send slot
    /// and sent back to its client's QP through its address handle (one `post_send`).
    fn echo_backlog(&mut self) -> Res<()> {
        let mut sends = Vec::new();
        let mut buf = vec![0u8; self.mtu];
        while let (Some(&(slot, len, c)), Some(&t)) = (self.backlog.front(), self.free_tx.last()) {
            self.backlog.pop_front();
            self.free_tx.pop();
            self.rx.read(slot as usize * self.slot + GRH, &mut buf[..len])?;
            self.tx.write(t as usize * self.mtu, &buf[..len])?;
            self.consumed.push(slot);
            sends.push((t, len, c));
        }
        if sends.is_empty() {
            return Ok(());
        }
        let sges: Vec<[Sge; 1]> = sends
            .iter()
            .map(|&(t, len, _)| self.tx.sge(t as usize * self.mtu, len).map(|g| [g]))
            .collect::<verbs_api::Result<_>>()?;
        let wrs: Vec<SendWr<'_>> = sends
            .iter()
            .zip(&sges)
            .map(|(&(t, _, c), g)| {
                let s = &self.senders[c];
                let ah = &self.by_qpn[&s.qpn].1;
                SendWr::send(SEND_BIT | t as u64, g)
                    .signaled()
                    .ud(ah, s.qpn, QKEY)
            })
            .collect();
        self.qp.post_send(&wrs).context("posting echoes")?;
        for &(_, _, c) in &sends {
            self.senders[c].echoed += 1;
        }
        Ok(())
    }

    /// Prints what the server saw; fails if a datagram arrived damaged or named another
    /// client than the QP it came from.
    fn report(mut self) -> Res<()> {
        self.take_registrations();
        self.dry.finish();
        print_senders(&self.senders);
        println!(
            "server: received {} datagrams ({} from unregistered QPs); receive queue ran dry {} times, empty \
             for {:.0} ms in total (the device drops a datagram that finds it empty){}",
            self.received,
            self.unknown,
            self.dry.count(),
            self.dry.total().as_secs_f64() * 1e3,
            match self.starve {
                Starve::Over(d) => format!("; left empty on purpose for {} ms", d.as_millis()),
                _ => String::new(),
            }
        );
        let bad: u64 = self.senders.iter().map(|s| s.damaged + s.foreign).sum();
        if bad > 0 || self.failed > 0 {
            bail!(
                "{bad} datagrams arrived damaged or named another client, {} completions failed",
                self.failed
            )
        }
        Ok(())
    }
}

/// Posts receives of `slot` bytes into `mr` at the given slots (wr_id: the slot), with
/// one `post_recv`.
fn post_recvs<Q: QueuePair, M: MemoryRegion>(qp: &Q, mr: &M, slot: usize, slots: &[u32]) -> Res<()> {
    let items: Vec<_> = slots
        .iter()
        .map(|&s| (u64::from(s), s as usize * slot, slot))
        .collect();
    examples::lists::post_recvs(qp, mr, &items).context("posting receives")
}

// ---------------------------------------------------------------------------------------
// client

/// Runs `t.clients` clients on threads of their own against the server at `addr`.
fn clients<B: Backend>(
    b: &B,
    common: &CommonArgs,
    t: &ClientTuning,
    addr: SocketAddr,
    first_id: u32,
) -> Res<Vec<ClientReport>> {
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    threads::on_threads(t.clients.max(1), "client", |i| {
        client::<B>(&ctx, &pd, common, t, addr, first_id + i)
            .with_context(|| format!("client {}", first_id + i))
    })
}

/// wr_id bit of a client's receives (its sends' are their slot numbers).
const RECV_BIT: u64 = 1 << 63;

fn client<B: Backend>(
    ctx: &B::Context,
    pd: &B::Pd,
    common: &CommonArgs,
    t: &ClientTuning,
    addr: SocketAddr,
    id: u32,
) -> Res<ClientReport> {
    let params = common.rc_params();
    let mtu = ctx.query_port(params.port_num)?.active_mtu.bytes() as usize;
    let window = t.window.max(1);
    let cq = ctx.create_cq(2 * window, None)?;
    let opts = QpOpts::new(window, window);
    let (qp, _) = conn::create_qp_of::<B>(ctx, pd, (&cq, &cq), &opts, QpType::Ud, None)?;
    ud_to_rts(&qp, &params, QKEY, 0).context("bringing the UD QP to RTS")?;
    let me = local_endpoint(ctx, &qp, &params, 0)?;
    let offer = Offer::new().private_data(id.to_be_bytes()).timeout(common.wait());
    let cm::Peer {
        endpoint: server,
        private_data: private,
        mut stream,
        ..
    } = cm::exchange(addr, &me, &offer)
        .with_context(|| format!("registering with the server at {addr} (is it running?)"))?;
    let largest = (private_u32(&private)? as usize).min(mtu);
    if !(HEADER..=largest).contains(&t.size) {
        bail!(
            "--size {} is outside {HEADER}..={largest} bytes (a datagram is at most one MTU)",
            t.size
        );
    }
    let ah = pd
        .create_ah(&ah_attr_for(&server, &params))
        .context("an address handle for the server")?;
    let slot = GRH + mtu;
    let rx = pd.reg_mr(window as usize * slot, AccessFlags::LOCAL_WRITE)?;
    let tx = pd.reg_mr(window as usize * t.size, AccessFlags::LOCAL_WRITE)?;
    let recv = |slots: &[u32]| -> Res<()> {
        let items: Vec<_> = slots
            .iter()
            .map(|&s| (RECV_BIT | u64::from(s), s as usize * slot, slot))
            .collect();
        examples::lists::post_recvs(&qp, &rx, &items).context("posting receives")
    };
    recv(&(0..window).collect::<Vec<_>>())?;
    let mut rep = ClientReport {
        id,
        qpn: qp.qp_num(),
        lat: Latencies::with_capacity(t.count as usize),
        ..ClientReport::default()
    };
    let mut tracker = Tracker::new(t.count, Duration::from_millis(t.loss_timeout_ms));
    let mut free_tx: Vec<u32> = (0..window).rev().collect();
    let mut buf = vec![0u8; mtu];
    let mut wcs = [WorkCompletion::default(); 32];
    let mut repost = Vec::new();
    let mut waiter = Waiter::new(common.wait().max(Duration::from_millis(4 * t.loss_timeout_ms)));
    let start = Instant::now();
    loop {
        let now = Instant::now();
        // Fill the window: one post_send for all the datagrams that fit.
        let mut batch = Vec::new();
        while let (Some(seq), Some(&s)) = (tracker.next_to_send(window as usize), free_tx.last()) {
            free_tx.pop();
            let len = wire::encode(id, seq, t.size, &mut buf);
            tx.write(s as usize * t.size, &buf[..len])?;
            batch.push(s);
            tracker.sent(now);
        }
        if !batch.is_empty() {
            let sges: Vec<[Sge; 1]> = batch
                .iter()
                .map(|&s| tx.sge(s as usize * t.size, t.size).map(|g| [g]))
                .collect::<verbs_api::Result<_>>()?;
            let wrs: Vec<SendWr<'_>> = batch
                .iter()
                .zip(&sges)
                .map(|(&s, g)| SendWr::send(u64::from(s), g).signaled().ud(&ah, server.qpn, QKEY))
                .collect();
            qp.post_send(&wrs).context("posting datagrams")?;
        }
        let n = cq.poll(&mut wcs)?;
        // After the poll: an echo of a datagram sent in this turn takes longer than 0.
        let now = Instant::now();
        for wc in &wcs[..n] {
            check_wc(wc, &|| "a datagram or its echo".to_string())?;
            if wc.wr_id & RECV_BIT == 0 {
                free_tx.push(wc.wr_id as u32);
                continue;
            }
            let s = wc.wr_id as u32;
            let len = (wc.byte_len as usize).saturating_sub(GRH).min(mtu);
            rx.read(s as usize * slot + GRH, &mut buf[..len])?;
            match wire::decode(&buf[..len]) {
                Ok(d) if d.client == id && d.len == t.size && wc.src_qp == server.qpn => {
                    if let Echo::Answered(rtt) = tracker.echo(d.seq, now) {
                        rep.lat.record(rtt);
                    }
                }
                other => {
                    tracker.damaged();
                    eprintln!("client {id}: a bad echo from QP {:#x}: {other:?}", wc.src_qp);
                }
            }
            repost.push(s);
        }
        if !repost.is_empty() {
            recv(&repost)?;
            repost.clear();
        }
        let lost = tracker.expire(now);
        if tracker.finished() && free_tx.len() == window as usize {
            break;
        }
        if n > 0 || lost > 0 {
            waiter.progress();
        } else {
            waiter.idle(&|| format!("echoes ({} in flight)", tracker.in_flight()))?;
        }
    }
    rep.wall = start.elapsed();
    rep.counts = tracker.counts;
    // The server exits when every client is done.
    let _ = side_channel::send_msg(&mut stream, b"done");
    Ok(rep)
}

// ---------------------------------------------------------------------------------------
// demo

fn demo(common: &CommonArgs, a: &DemoArgs) -> Res<()> {
    let nclients = a.client.clients.max(1);
    let total = a.client.count * u64::from(nclients);
    let starve_after = (!a.no_starve).then(|| a.server.starve_after.unwrap_or(total / 4));
    let mut sargs = ChildArgs::server(common)
        .opt("--clients", nclients)
        .opt("--recv-depth", a.server.recv_depth)
        .opt("--starve-ms", a.server.starve_ms);
    if let Some(n) = starve_after {
        sargs = sargs.opt("--starve-after", n);
    }
    println!(
        "demo: starting the ud-echo server, then {nclients} client(s) x {} datagrams of {} B{}",
        a.client.count,
        a.client.size,
        match starve_after {
            Some(n) => format!(
                "; after {n} datagrams the server lets its receive queue run empty for {} ms",
                a.server.starve_ms
            ),
            None => String::new(),
        }
    );
    let (mut server, addr) = start_server("server", &sargs)?;
    let reports = with_backend!(common, |b| clients(b, common, &a.client, addr, 0))?;
    let consistent = print_clients(&reports);
    server
        .wait_success(common.wait() + Duration::from_secs(10))
        .context("the ud-echo server (it fails if a datagram arrived damaged)")?;
    if !consistent {
        bail!(
            "invariant violated: a datagram neither echoed nor counted lost, or an echo that came back wrong"
        )
    }
    // What the server received of each client lies between what came back and what was
    // sent: an echo implies the datagram arrived, a datagram lost on the way in is lost.
    for r in &reports {
        let prefix = sender_prefix(r.id);
        let line = server
            .last_line(&prefix)
            .with_context(|| format!("the server printed nothing about client {}", r.id))?;
        let received: u64 = line
            .split("received ")
            .nth(1)
            .and_then(|x| x.split(|ch: char| !ch.is_ascii_digit()).next())
            .and_then(|x| x.parse().ok())
            .with_context(|| format!("unreadable server line {line:?}"))?;
        let c = &r.counts;
        if received < c.echoed || c.sent - received > c.lost {
            bail!(
                "client {}: the server received {received} of its datagrams, but it saw {} echoed and {} lost of {} sent",
                r.id,
                c.echoed,
                c.lost,
                c.sent
            )
        }
    }
    let sent: u64 = reports.iter().map(|r| r.counts.sent).sum();
    let echoed: u64 = reports.iter().map(|r| r.counts.echoed).sum();
    let lost: u64 = reports.iter().map(|r| r.counts.lost).sum();
    if starve_after.is_some() && lost == 0 {
        bail!(
            "the server's receive queue was left empty for {} ms, yet no datagram was lost: the drops went uncounted",
            a.server.starve_ms
        )
    }
    println!(
        "demo: OK: {nclients} client(s) sent {sent} datagrams to one UD QP, which told them apart by src_qp; \
         {echoed} came back intact (sequence number, checksum and every payload byte checked at both ends), \
         {lost} were counted lost (sent, never answered){}",
        if starve_after.is_some() {
            ", dropped while the server's receive queue was empty"
        } else {
            ""
        }
    );
    Ok(())
}
