//! kv-rpc's server: one QP per client, receives pre-posted and refilled in batches (or
//! from the shared receive queue on its limit event), each request answered on its QP.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::wr_ids::{split_wr_id, srq_wr_id, wr_id, SRQ_BIT};
use anyhow::{bail, Context as _};
use examples::backend::open_device;
use examples::child::announce_listening;
use examples::cli::CommonArgs;
use examples::conn::{self, QpOpts};
use examples::kv::opts::{ServerArgs, ServerTuning};
use examples::kv::report::{print_server_start, print_srq, ServerReport};
use examples::kv::slots::ConnSlots;
use examples::kv::srq::SrqPool;
use examples::kv::store::Store;
use examples::kv::{MAX_REQ, MAX_RESP};
use examples::wait::{status_name, Waiter};
use examples::{lists, side_channel, Res};
use verbs_api::cm::{Offer, Peer};
use verbs_api::{
    modify_to_init, AccessFlags, AsyncElement, AsyncEventType, Backend, CompletionQueue, Context,
    MemoryRegion, ProtectionDomain, QpType, QueuePair, SharedReceiveQueue, SrqAttr, SrqAttrMask,
    WorkCompletion,
};

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

    /// Arms the limit, unless the SRQ may be empty (see [`SrqPool::can_arm`]).
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

pub(crate) fn server<B: Backend>(b: &B, common: &CommonArgs, a: &ServerArgs) -> Res<()> {
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
