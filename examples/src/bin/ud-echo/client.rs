//! ud-echo's clients: each on its own thread with a UD QP, sending numbered, checksummed
//! datagrams and checking every echo; a datagram whose echo does not come in time is
//! counted as lost.

use crate::private_u32;
use anyhow::{bail, Context as _};
use examples::backend::open_device;
use examples::cli::CommonArgs;
use examples::conn::{self, QpOpts};
use examples::datagram::opts::ClientTuning;
use examples::datagram::report::ClientReport;
use examples::datagram::tracker::{Echo, Tracker};
use examples::datagram::wire::{self, HEADER};
use examples::stats::Latencies;
use examples::transport::{ud_to_rts, GRH, QKEY};
use examples::wait::{check_wc, Waiter};
use examples::{side_channel, threads, Res};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use verbs_api::cm::{self, Offer};
use verbs_api::{
    ah_attr_for, local_endpoint, AccessFlags, Backend, CompletionQueue, Context, MemoryRegion,
    ProtectionDomain, QpType, QueuePair, SendWr, Sge, WorkCompletion,
};

/// Runs `t.clients` clients on threads of their own against the server at `addr`.
pub(crate) fn clients<B: Backend>(
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
