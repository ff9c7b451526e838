//! ud-echo's server: one UD QP for every client; clients register over TCP, each
//! datagram is answered through the address handle of the client whose `src_qp` it
//! carries, and the receive queue may be starved on purpose (`Starve`).

use crate::{private_u32, write_hello};
use anyhow::{bail, Context as _};
use examples::backend::open_device;
use examples::child::announce_listening;
use examples::cli::CommonArgs;
use examples::conn::{self, QpOpts};
use examples::datagram::opts::{ServerArgs, ServerTuning};
use examples::datagram::report::{print_senders, Sender};
use examples::datagram::wire::{self};
use examples::kv::report::DryQueue;
use examples::transport::{ud_to_rts, GRH, QKEY};
use examples::wait::{check_wc, Waiter};
use examples::{side_channel, Res};
use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender as Tx};
use std::time::{Duration, Instant};
use verbs_api::cm::{self};
use verbs_api::{
    ah_attr_for, local_endpoint, AccessFlags, Backend, CompletionQueue, Context, Endpoint, MemoryRegion,
    ProtectionDomain, QpType, QueuePair, RcParams, SendWr, Sge, WorkCompletion,
};

/// A registered client: its number, its QP (the `src_qp` of its datagrams) and the
/// address handle its echoes go through.
struct Registration<B: Backend> {
    id: u32,
    qpn: u32,
    ah: B::Ah,
}

/// wr_id of the server's echoes (its receives' are their slot numbers).
const SEND_BIT: u64 = 1 << 63;

pub(crate) fn server<B: Backend>(b: &B, common: &CommonArgs, a: &ServerArgs) -> Res<()> {
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
