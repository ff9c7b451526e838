//! mcast-pub: one publisher, several subscribers, over UD multicast (`man
//! ibv_attach_mcast`; IBA 10.5).
//!
//! Each subscriber opens the device on its own (on the sim a device of its own, as on
//! another host), brings a UD QP up and attaches it to one multicast group: an MGID (on
//! RoCE an IPv4 multicast address, `::ffff:239.x.y.z`, which the host also joins at the
//! IP level, as rdma_cm does) and, on InfiniBand, an MLID. The
//! publisher has one UD QP, not attached, and one address handle whose GRH names the
//! group; it sends every datagram once, to QP 0xFFFFFF with the group's Q_Key, and the
//! fabric hands a copy to every attached QP. A datagram carries the publisher's sequence
//! number and a checksum over a payload generated from it (`examples::datagram::wire`),
//! so each subscriber checks every byte it receives and counts as dropped every sequence
//! number it never saw.
//!
//! UD drops a datagram that finds no receive posted, and no one is told: the sender's
//! completion says success. Subscribers that keep up tell the publisher how many receives
//! they have posted (credits, as a real publisher learns them from its subscribers'
//! acknowledgements or NAKs), and it never runs ahead of them; `--starve-after N` makes
//! subscriber 0 a slow one that the publisher does not wait for: after N datagrams it
//! stops posting receives until the publisher is done, and the datagrams sent meanwhile
//! are dropped at its QP and counted.
//!
//! `bench` measures what multicast costs: the same stream to one subscriber by unicast
//! UD, then to `--subscribers` by multicast, and prints each subscriber's bandwidth.
//!
//! ```text
//! mcast-pub demo                                   # 3 subscribers, subscriber 0 starved once
//! mcast-pub demo --subscribers 5 --starve-after 0  # nobody starved: nothing may drop
//! mcast-pub bench --subscribers 4                  # unicast vs multicast, MB/s per subscriber
//! mcast-pub bench --subscribers 4 --one-device     # the subscribers' QPs on one device
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::{Args, Parser, Subcommand};
use examples::backend::open_device;
use examples::cli::CommonArgs;
use examples::datagram::wire;
use examples::transport::{ud_to_rts, GRH, QKEY};
use examples::wait::{check_wc, Waiter};
use examples::{with_backend, Res};
use verbs_api::{
    ah_attr_for, local_endpoint, AccessFlags, AhAttr, Backend, CompletionQueue, Context, Gid, GlobalRoute,
    LinkLayer, MemoryRegion, ProtectionDomain, QpCap, QpInitAttr, QueuePair, RecvWr, SendWr, WorkCompletion,
    MULTICAST_QPN,
};

/// One publisher, several subscribers, on UD multicast.
#[derive(Parser, Debug)]
#[command(
    name = "mcast-pub",
    version,
    after_help = "Examples:\n  mcast-pub demo\n  mcast-pub demo --subscribers 5 --starve-after 0\n  mcast-pub bench --subscribers 4\n  mcast-pub bench --subscribers 4 --one-device"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Publish to the subscribers and check that every datagram arrived intact or was
    /// counted dropped, and that the starved subscriber dropped some.
    Demo(Stream),
    /// Unicast UD to one subscriber, then multicast to `--subscribers`: MB/s per
    /// subscriber, and their ratio.
    Bench(Stream),
}

/// What is sent, and to how many.
#[derive(Args, Debug, Clone)]
struct Stream {
    /// Subscribers (each a QP of its own context, attached to the group).
    #[arg(long, default_value_t = 3)]
    subscribers: usize,
    /// Datagrams to publish.
    #[arg(long, default_value_t = 2000)]
    messages: u64,
    /// Bytes per datagram (at least the 32-byte header, at most the port's MTU).
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Receives each subscriber keeps posted.
    #[arg(long, default_value_t = 256)]
    depth: u32,
    /// Subscriber 0 stops posting receives after this many datagrams until the publisher
    /// is done (0: nobody starves). Demo only.
    #[arg(long, default_value_t = 200)]
    starve_after: u64,
    /// All subscribers' QPs on one context (one device, as several programs on one host
    /// share its HCA): the fabric carries one copy, the device hands it to each QP.
    /// Without it each subscriber opens a context of its own (on the sim, a device of its
    /// own, as on separate hosts).
    #[arg(long)]
    one_device: bool,
}

fn main() -> std::process::ExitCode {
    examples::program::main("mcast-pub", |cli: Cli| run(&cli))
}

fn run(cli: &Cli) -> Res<()> {
    let common = &cli.common;
    match &cli.cmd {
        Cmd::Demo(s) => with_backend!(common, |b| demo(b, common, s)),
        Cmd::Bench(s) => with_backend!(common, |b| bench(b, common, s)),
    }
}

/// What a subscriber saw.
#[derive(Debug, Default, Clone)]
struct Seen {
    received: u64,
    dropped: u64,
    damaged: u64,
    bytes: u64,
    /// When its last datagram arrived.
    last: Option<Instant>,
}

/// What the publisher and its subscribers share in this process.
struct Shared {
    /// Receives each subscriber has posted so far (the publisher's credits); a starved
    /// subscriber's are not waited for.
    posted: Vec<AtomicU64>,
    /// Set once the publisher sent its last datagram (the number sent is `messages`).
    done: AtomicBool,
    /// Set once every subscriber is attached and has its receives posted.
    ready: AtomicU64,
    /// The subscriber that starves, whose credits the publisher does not wait for.
    starved: Option<usize>,
}

impl Shared {
    /// The datagrams the publisher may have sent in all: the fewest receives a
    /// subscriber that keeps up has posted.
    fn credit(&self) -> u64 {
        let keeps_up = self
            .posted
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != self.starved);
        keeps_up
            .map(|(_, p)| p.load(Ordering::Acquire))
            .min()
            .unwrap_or(u64::MAX)
    }
}

/// Where datagrams go.
#[derive(Clone, Copy, Debug)]
enum Dest {
    /// The group `(MGID, MLID)`.
    Group(Gid, u16),
    /// The one subscriber, by unicast.
    Unicast,
}

/// A group of this process's own: on an Ethernet (RoCE) port an IPv4 multicast address,
/// on InfiniBand an MGID of the site-local scope and a multicast LID.
fn group<C: Context>(ctx: &C) -> Res<(Gid, u16)> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let r = now.map_or(0, |d| d.as_nanos() as u64).to_le_bytes();
    let pid = std::process::id().to_be_bytes();
    Ok(if ctx.query_port(1)?.link_layer == LinkLayer::Ethernet {
        (Gid::from(std::net::Ipv4Addr::new(239, pid[1], pid[2], pid[3])), 0)
    } else {
        let mut g = [0u8; 16];
        g[..2].copy_from_slice(&[0xff, 0x15]);
        g[8..12].copy_from_slice(&pid);
        g[12..].copy_from_slice(&r[..4]);
        (Gid(g), 0xc001)
    })
}

fn demo<B: Backend>(b: &B, common: &CommonArgs, s: &Stream) -> Res<()> {
    ensure!(s.subscribers > 0, "--subscribers must be at least 1");
    let ctx = open_device(b, common.device.as_deref())?;
    let (mgid, mlid) = group(&ctx)?;
    println!(
        "mcast-pub: {} subscriber(s) of group {mgid} (MLID {mlid:#x}), {} datagrams of {} B{}",
        s.subscribers,
        s.messages,
        s.size,
        match s.starve_after {
            0 => String::new(),
            n => format!("; subscriber 0 posts no receives after {n} datagrams until the publisher is done"),
        }
    );
    let (seen, elapsed) = publish(b, common, &ctx, s, Dest::Group(mgid, mlid), s.starve_after)?;
    let mut ok = true;
    for (i, v) in seen.iter().enumerate() {
        println!(
            "  subscriber {i}: received {} intact, dropped {}, damaged {}",
            v.received, v.dropped, v.damaged
        );
        ok &= v.received + v.dropped == s.messages && v.damaged == 0;
        let starved = i == 0 && s.starve_after > 0;
        ok &= starved || v.dropped == 0;
    }
    println!("published in {:.1} ms", elapsed.as_secs_f64() * 1e3);
    if !ok {
        bail!("a datagram is unaccounted for, damaged, or dropped at a subscriber that kept up (see above)");
    }
    if s.starve_after > 0 && s.starve_after + u64::from(s.depth) < s.messages && seen[0].dropped == 0 {
        bail!("the starved subscriber dropped nothing");
    }
    let dropped: u64 = seen.iter().map(|v| v.dropped).sum();
    println!(
        "demo: OK: {} subscriber(s), every datagram received intact or counted dropped ({dropped} dropped in all, \
         none at a subscriber that kept up)",
        s.subscribers
    );
    Ok(())
}

fn bench<B: Backend>(b: &B, common: &CommonArgs, s: &Stream) -> Res<()> {
    let ctx = open_device(b, common.device.as_deref())?;
    let (mgid, mlid) = group(&ctx)?;
    let one = Stream {
        subscribers: 1,
        ..s.clone()
    };
    let rate = |seen: &[Seen], t: Duration| -> Vec<f64> {
        seen.iter()
            .map(|v| v.bytes as f64 / t.as_secs_f64() / 1e6)
            .collect()
    };
    let (seen, t) = publish(b, common, &ctx, &one, Dest::Unicast, 0)?;
    let uni = rate(&seen, t)[0];
    let (seen, t) = publish(b, common, &ctx, s, Dest::Group(mgid, mlid), 0)?;
    let multi = rate(&seen, t);
    let worst = multi.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "{} datagrams of {} B, {} receives posted per subscriber",
        s.messages, s.size, s.depth
    );
    println!("unicast UD, 1 subscriber:        {uni:9.1} MB/s");
    let each: Vec<String> = multi.iter().map(|r| format!("{r:.1}")).collect();
    println!(
        "multicast, {} subscribers:       {worst:9.1} MB/s per subscriber (slowest; each: {})",
        s.subscribers,
        each.join(" ")
    );
    println!("multicast / unicast per subscriber: {:.2}", worst / uni);
    Ok(())
}

/// Runs the subscribers (threads, each on a context of its own) and the publisher on
/// `ctx`; what each subscriber saw, and the time from the first send to the last
/// datagram's arrival.
fn publish<B: Backend>(
    b: &B,
    common: &CommonArgs,
    ctx: &B::Context,
    s: &Stream,
    dest: Dest,
    starve_after: u64,
) -> Res<(Vec<Seen>, Duration)> {
    let mtu = ctx.query_port(1)?.active_mtu.bytes() as usize;
    ensure!(
        (wire::HEADER..=mtu).contains(&s.size),
        "--size {} is not between the {}-byte header and the port's MTU ({mtu})",
        s.size,
        wire::HEADER
    );
    let shared = Shared {
        posted: (0..s.subscribers).map(|_| AtomicU64::new(0)).collect(),
        done: AtomicBool::new(false),
        ready: AtomicU64::new(0),
        starved: (starve_after > 0).then_some(0),
    };
    let (tx_ep, rx_ep) = std::sync::mpsc::channel();
    let contexts = if s.one_device { 1 } else { s.subscribers };
    let contexts: Vec<B::Context> = (0..contexts)
        .map(|_| open_device(b, common.device.as_deref()))
        .collect::<Res<_>>()?;
    std::thread::scope(|scope| {
        let subs: Vec<_> = (0..s.subscribers)
            .map(|i| {
                let (shared, tx_ep) = (&shared, tx_ep.clone());
                let ctx = &contexts[i % contexts.len()];
                let starve = if i == 0 { starve_after } else { 0 };
                scope.spawn(move || subscriber::<B>(ctx, common, s, dest, i, starve, shared, tx_ep))
            })
            .collect();
        drop(tx_ep);
        let started = publisher(ctx, common, s, dest, &shared, &rx_ep);
        shared.done.store(true, Ordering::Release);
        let seen: Vec<Seen> = subs
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a subscriber panicked")))
            })
            .collect::<Res<_>>()?;
        let started = started?;
        let end = seen.iter().filter_map(|v| v.last).max().unwrap_or(started);
        Ok((seen, end.saturating_duration_since(started)))
    })
}

/// Sends `s.messages` datagrams to `dest` once every subscriber is ready, within the
/// credits of those that keep up; when it started.
fn publisher<C: Context>(
    ctx: &C,
    common: &CommonArgs,
    s: &Stream,
    dest: Dest,
    shared: &Shared,
    endpoints: &std::sync::mpsc::Receiver<verbs_api::Endpoint>,
) -> Res<Instant> {
    let params = common.rc_params();
    let depth = 64u32;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(depth, None)?;
    let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq, QpCap::new(depth, 1)))?;
    ud_to_rts(&qp, &params, QKEY, 0)?;
    let mr = pd.reg_mr(depth as usize * s.size, AccessFlags::LOCAL_WRITE)?;
    let (ah, remote_qpn) = match dest {
        Dest::Group(mgid, mlid) => {
            let ah = pd.create_ah(&AhAttr {
                grh: GlobalRoute {
                    dgid: mgid,
                    sgid_index: common.gid_index,
                    hop_limit: 1,
                    ..Default::default()
                },
                dlid: mlid,
                is_global: true,
                port_num: params.port_num,
                ..Default::default()
            })?;
            (ah, MULTICAST_QPN)
        }
        Dest::Unicast => {
            let ep = endpoints
                .recv_timeout(common.wait())
                .context("the subscriber never said where it is")?;
            (pd.create_ah(&ah_attr_for(&ep, &params))?, ep.qpn)
        }
    };
    let until = Instant::now() + common.wait();
    while shared.ready.load(Ordering::Acquire) < s.subscribers as u64 {
        ensure!(
            Instant::now() < until,
            "the subscribers were not ready within the timeout"
        );
        std::thread::yield_now();
    }
    let started = Instant::now();
    let mut outstanding = 0u32;
    let mut wcs = vec![WorkCompletion::default(); depth as usize];
    let mut buf = vec![0u8; s.size];
    let mut allowed = 0u64;
    for seq in 0..s.messages {
        if seq >= allowed {
            // Credits: every subscriber that keeps up has a receive posted for this one.
            let mut w = Waiter::new(common.wait());
            loop {
                allowed = shared.credit();
                if allowed > seq {
                    break;
                }
                w.idle(&|| format!("no credit from a subscriber for datagram {seq}"))?;
            }
        }
        reap(&cq, &mut wcs, &mut outstanding, depth - 1, common)?;
        let slot = (seq % u64::from(depth)) as usize * s.size;
        wire::encode(0, seq, s.size, &mut buf);
        mr.write(slot, &buf)?;
        qp.post_send(&[SendWr::send(seq, &[mr.sge(slot, s.size)?])
            .signaled()
            .ud(&ah, remote_qpn, QKEY)])?;
        outstanding += 1;
    }
    reap(&cq, &mut wcs, &mut outstanding, 0, common)?;
    Ok(started)
}

/// Takes the publisher's send completions until at most `keep` are outstanding.
fn reap<C: CompletionQueue>(
    cq: &C,
    wcs: &mut [WorkCompletion],
    outstanding: &mut u32,
    keep: u32,
    common: &CommonArgs,
) -> Res<()> {
    let mut wait = Waiter::new(common.wait());
    while *outstanding > keep {
        let n = cq.poll(wcs)?;
        for wc in &wcs[..n] {
            check_wc(wc, &|| "a publisher's send".to_string())?;
        }
        *outstanding -= n as u32;
        if n > 0 {
            wait.progress();
        } else {
            wait.idle(&|| "the publisher's send completions".to_string())?;
        }
    }
    Ok(())
}

/// Subscriber `i`: attached to the group (or, for unicast, its endpoint sent to the
/// publisher), receiving until the publisher is done and nothing more comes; with
/// `starve` > 0, no receives posted after that many datagrams until the publisher is done.
#[allow(clippy::too_many_arguments)]
fn subscriber<B: Backend>(
    ctx: &B::Context,
    common: &CommonArgs,
    s: &Stream,
    dest: Dest,
    i: usize,
    starve: u64,
    shared: &Shared,
    endpoint: std::sync::mpsc::Sender<verbs_api::Endpoint>,
) -> Res<Seen> {
    let params = common.rc_params();
    let pd = ctx.alloc_pd()?;
    let depth = s.depth.max(1);
    let cq = ctx.create_cq(depth, None)?;
    let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq, QpCap::new(1, depth)))?;
    ud_to_rts(&qp, &params, QKEY, 0)?;
    // On RoCE the host joins the group's IPv4 address too, as rdma_cm does: without it
    // the network (and Soft-RoCE's own IP stack) does not deliver the group here.
    let _ip_member = match dest {
        Dest::Group(mgid, mlid) => {
            qp.attach_mcast(&mgid, mlid)
                .with_context(|| format!("subscriber {i}: joining group {mgid}"))?;
            let local = ctx.query_gid(params.port_num, u32::from(params.gid_index))?;
            verbs_api::mcast::ip_join(&mgid, &local)
                .with_context(|| format!("subscriber {i}: joining {mgid} at the IP level"))?
        }
        Dest::Unicast => {
            let _ = endpoint.send(local_endpoint(ctx, &qp, &params, 0)?);
            None
        }
    };
    let slot = GRH + s.size;
    let mr = pd.reg_mr(depth as usize * slot, AccessFlags::LOCAL_WRITE)?;
    // A receive into slot `k` of `mr` (its wr_id).
    let post = |k: u64| -> Res<()> {
        qp.post_recv(&[RecvWr::new(k, &[mr.sge(k as usize * slot, slot)?])])?;
        shared.posted[i].fetch_add(1, Ordering::Release);
        Ok(())
    };
    for k in 0..u64::from(depth) {
        post(k)?;
    }
    shared.ready.fetch_add(1, Ordering::AcqRel);
    let mut seen = Seen::default();
    let mut next = 0u64;
    // The slots of a starved subscriber, posted again once the publisher is done.
    let mut owed = Vec::new();
    let mut wcs = vec![WorkCompletion::default(); depth as usize];
    let mut quiet_since: Option<Instant> = None;
    let mut buf = vec![0u8; slot];
    let mut wait = Waiter::new(common.wait() + Duration::from_secs(5));
    loop {
        let n = cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            check_wc(wc, &|| format!("subscriber {i}'s receive"))?;
            mr.read(wc.wr_id as usize * slot, &mut buf)?;
            match wire::decode(&buf[GRH..GRH + (wc.byte_len as usize).saturating_sub(GRH)]) {
                Ok(d) => {
                    seen.received += 1;
                    seen.bytes += d.len as u64;
                    next = d.seq + 1;
                }
                Err(_) => seen.damaged += 1,
            }
            seen.last = Some(Instant::now());
            let starving = starve > 0 && seen.received >= starve && !shared.done.load(Ordering::Acquire);
            if starving {
                owed.push(wc.wr_id);
            } else {
                post(wc.wr_id)?;
            }
        }
        let done = shared.done.load(Ordering::Acquire);
        if done {
            for k in owed.drain(..) {
                post(k)?;
            }
        }
        if n > 0 {
            wait.progress();
            quiet_since = None;
        } else if done {
            // Everything the publisher sent has arrived, or will not: UD says nothing of
            // what it dropped.
            let q = *quiet_since.get_or_insert_with(Instant::now);
            if next >= s.messages || q.elapsed() > Duration::from_millis(300) {
                break;
            }
        } else {
            wait.idle(&|| format!("subscriber {i}: datagrams"))?;
        }
    }
    seen.dropped = s.messages - seen.received - seen.damaged;
    if let Dest::Group(mgid, mlid) = dest {
        qp.detach_mcast(&mgid, mlid)?;
    }
    Ok(seen)
}
