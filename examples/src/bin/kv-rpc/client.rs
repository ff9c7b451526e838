//! kv-rpc's clients: each keeps up to `--window` requests in flight on its QP and
//! checks every answer against the workload's model of the store.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::wr_ids::RECV_BIT;
use anyhow::{bail, Context as _};
use examples::backend::open_device;
use examples::cli::CommonArgs;
use examples::conn::{self, QpOpts};
use examples::kv::opts::ClientTuning;
use examples::kv::report::ClientReport;
use examples::kv::window::Window;
use examples::kv::workload::Workload;
use examples::kv::{self, MAX_REQ, MAX_RESP};
use examples::stats::Latencies;
use examples::wait::{self, status_name, Waiter};
use examples::{lists, side_channel, threads, Res};
use verbs_api::cm::{Offer, Peer};
use verbs_api::{
    modify_to_init, AccessFlags, Backend, CompletionQueue, Context, MemoryRegion, ProtectionDomain,
    QueuePair, RecvWr, WcOpcode, WcStatus, WorkCompletion,
};

/// Runs `tuning.clients` connections in parallel threads against `addr`.
pub(crate) fn clients<B: Backend>(
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
