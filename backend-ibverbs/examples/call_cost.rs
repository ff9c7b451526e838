//! The Rust side of backend-ibverbs' per-call benchmark: the calls of
//! `bench/call_cost.c`, made through backend-ibverbs and the `verbs_api` traits, each in
//! a function of the same name, so that `valgrind --tool=callgrind` counts the
//! instructions of each (inclusive of libibverbs and the provider) and
//! `ci/call-cost.sh` prints the difference per call: what the Rust layer costs over C.
//!
//! ```text
//! call_cost [DEVICE [GID_INDEX [ITERS [PHASE]]]]   default: the first device, 1, 1000, all
//! ```
//!
//! The phases, each ITERS times (a callgrind run takes one, and counts per function):
//! - `send`: `cc_post_send`, `post_send` of one signaled 8-byte RDMA WRITE (built once,
//!   as a C program builds its `ibv_send_wr` once) from QP a to QP b; then `cc_poll`,
//!   `poll` for one entry, which finds the completion (the CQ is armed before the post
//!   and its event awaited outside both);
//! - `inline`: the same with the WRITE's 8 bytes inline (`IBV_SEND_INLINE`);
//! - `empty`: `cc_poll` on an empty CQ;
//! - `recv`: `cc_post_recv`, `post_recv` of one receive WR with one SGE.

use std::process::ExitCode;
use std::time::Duration;

use backend_ibverbs::IbvBackend;
use verbs_api::{
    connect_rc, local_endpoint, AccessFlags, Backend, CompletionChannel, CompletionQueue, Context,
    MemoryRegion, PostError, ProtectionDomain, QpCap, QpInitAttr, QueuePair, RcParams, RecvWr, SendWr,
    WorkCompletion,
};

#[inline(never)]
fn cc_post_send<Q: QueuePair>(qp: &Q, wr: &[SendWr<'_>]) -> Result<(), PostError> {
    qp.post_send(wr)
}

#[inline(never)]
fn cc_poll<C: CompletionQueue>(cq: &C, wc: &mut [WorkCompletion]) -> verbs_api::Result<usize> {
    cq.poll(wc)
}

#[inline(never)]
fn cc_post_recv<Q: QueuePair>(qp: &Q, wr: &[RecvWr<'_>]) -> Result<(), PostError> {
    qp.post_recv(wr)
}

fn run<B: Backend>(
    backend: &B,
    device: Option<&str>,
    gid_index: u8,
    iters: u32,
    phase: &str,
) -> Result<(), String> {
    let on = |p: &str| phase == "all" || phase == p;
    let e = |what: &'static str| move |err: verbs_api::Error| format!("{what}: {err}");
    let ctx = match device {
        Some(d) => backend.open(d),
        None => backend.open_first(),
    }
    .map_err(e("open"))?;
    let pd = ctx.alloc_pd().map_err(e("alloc_pd"))?;
    let mr = pd
        .reg_mr(
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .map_err(e("reg_mr"))?;
    let ch = ctx.create_comp_channel().map_err(e("create_comp_channel"))?;
    let cq_a = ctx.create_cq(64, Some(&ch)).map_err(e("create_cq"))?;
    let cq_b = ctx.create_cq(64, None).map_err(e("create_cq"))?;
    let cq_e = ctx.create_cq(64, None).map_err(e("create_cq"))?;
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: iters,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let a = pd
        .create_qp(&QpInitAttr::rc(&cq_a, &cq_a, cap))
        .map_err(e("create_qp"))?;
    let b = pd
        .create_qp(&QpInitAttr::rc(&cq_b, &cq_b, cap))
        .map_err(e("create_qp"))?;
    let params = RcParams {
        gid_index,
        ..RcParams::default()
    };
    let ea = local_endpoint(&ctx, &a, &params, 0).map_err(e("local_endpoint"))?;
    let eb = local_endpoint(&ctx, &b, &params, 0).map_err(e("local_endpoint"))?;
    connect_rc(&a, &params, 0, &eb).map_err(e("connect a"))?;
    connect_rc(&b, &params, 0, &ea).map_err(e("connect b"))?;

    let sge = [mr.sge(0, 8).map_err(e("sge"))?];
    let plain = [SendWr::write(1, &sge, mr.remote().at(64)).signaled()];
    let inline = [plain[0].inline()];
    let mut wc = [WorkCompletion::default()];
    let sends = if on("send") { iters } else { 0 };
    let inlines = if on("inline") { iters } else { 0 };
    for i in 0..sends + inlines {
        let wr = if i < sends { &plain } else { &inline };
        cq_a.req_notify(false).map_err(e("req_notify"))?;
        cc_post_send(&a, wr).map_err(|p| format!("post_send: {p}"))?;
        ch.get_cq_event(Some(Duration::from_secs(20)))
            .map_err(e("get_cq_event"))?
            .ok_or("no completion event within 20 s")?;
        cq_a.ack_events(1);
        let n = cc_poll(&cq_a, &mut wc).map_err(e("poll"))?;
        if n != 1 || !wc[0].is_ok() {
            return Err(format!(
                "no successful completion after its event: {n} {:?}",
                wc[0]
            ));
        }
    }
    for _ in 0..if on("empty") { iters } else { 0 } {
        if cc_poll(&cq_e, &mut wc).map_err(e("poll"))? != 0 {
            return Err("a completion on the empty CQ".into());
        }
    }
    let rsge = [mr.sge(128, 64).map_err(e("sge"))?];
    let rwr = [RecvWr::new(2, &rsge)];
    for i in 0..if on("recv") { iters } else { 0 } {
        cc_post_recv(&b, &rwr).map_err(|p| format!("post_recv {i}: {p}"))?;
    }
    println!("call_cost (Rust): {phase}, {iters} iterations on {}", ctx.name());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let device = args.first().map(String::as_str);
    let gid_index = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    let iters = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let phase = args.get(3).map_or("all", String::as_str);
    if !["all", "send", "inline", "empty", "recv"].contains(&phase) {
        eprintln!("call_cost: PHASE is one of all, send, inline, empty, recv");
        return ExitCode::FAILURE;
    }
    match run(&IbvBackend, device, gid_index, iters, phase) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("call_cost: {e}");
            ExitCode::FAILURE
        }
    }
}
