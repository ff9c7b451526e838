//! Smoke test of the libibverbs backend on a real device (Soft-RoCE in `ci/rxe-vm.sh`).
//!
//! ```text
//! ibv_smoke [DEVICE [GID_INDEX]]     default: the first device, GID index 1
//! ```
//!
//! Two RC QPs on one device, connected to each other with `connect_rc`, run every
//! operation and the error paths a program relies on; then a shared receive queue with
//! its limit event, UD datagrams through an address handle, UC, and the asynchronous
//! events. Each check prints PASS or FAIL and the exit status is 1 if any failed. The
//! checks are written against the `verbs_api` traits only (generic over the backend);
//! `main` picks `IbvBackend`.

use std::fmt::Display;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use backend_ibverbs::IbvBackend;
use verbs_api::{
    ah_attr_for, connect_rc, local_endpoint, poll_n, poll_quiet, AccessFlags, AddressHandle, AsyncElement,
    AsyncEventType, Backend, ChannelOf, CompletionChannel, CompletionQueue, Context, ContextOf, CqOf,
    Endpoint, Error, MemoryRegion, MrOf, PdOf, ProtectionDomain, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpOf,
    QpState, QpType, QueuePair, RcParams, RecvWr, SendWr, SharedReceiveQueue, SrqAttr, SrqAttrMask, WcFlags,
    WcOpcode, WcStatus, WorkCompletion,
};

/// How long to wait for completions (TCG emulation is slow).
const WAIT: Duration = Duration::from_secs(20);

type Check = Result<String, String>;

/// `?` for any error: turns it into the failure text, with what was being done.
trait Why<T> {
    fn why(self, what: &str) -> Result<T, String>;
}

impl<T, E: Display> Why<T> for Result<T, E> {
    fn why(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// Two RC QPs on one device, connected to each other, each with its own CQ.
struct Pair<B: Backend> {
    a: QpOf<B>,
    b: QpOf<B>,
    cq_a: CqOf<B>,
    cq_b: CqOf<B>,
}

struct Env<'a, B: Backend> {
    ctx: &'a ContextOf<B>,
    pd: PdOf<B>,
    params: RcParams,
}

const CAP: QpCap = QpCap {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_send_sge: 2,
    max_recv_sge: 2,
    max_inline_data: 64,
};

impl<B: Backend> Env<'_, B> {
    /// A connected pair; `pa` / `pb` are the connection parameters of each side.
    fn pair_with(
        &self,
        pa: &RcParams,
        pb: &RcParams,
        cap: QpCap,
        cqe: u32,
        chan_b: Option<&ChannelOf<B>>,
    ) -> Result<Pair<B>, String> {
        let cq_a = self.ctx.create_cq(cqe, None).why("create_cq")?;
        let cq_b = self.ctx.create_cq(cqe, chan_b).why("create_cq")?;
        let a = self
            .pd
            .create_qp(&QpInitAttr::rc(&cq_a, &cq_a, cap))
            .why("create_qp")?;
        let b = self
            .pd
            .create_qp(&QpInitAttr::rc(&cq_b, &cq_b, cap))
            .why("create_qp")?;
        let ea = local_endpoint(self.ctx, &a, pa, 0x11_1111).why("local_endpoint")?;
        let eb = local_endpoint(self.ctx, &b, pb, 0x22_2222).why("local_endpoint")?;
        connect_rc(&a, pa, ea.psn, &eb).why("connect_rc(a)")?;
        connect_rc(&b, pb, eb.psn, &ea).why("connect_rc(b)")?;
        Ok(Pair { a, b, cq_a, cq_b })
    }

    fn pair(&self) -> Result<Pair<B>, String> {
        self.pair_with(&self.params, &self.params, CAP, 64, None)
    }

    fn mr(&self, len: usize) -> Result<MrOf<B>, String> {
        self.pd.reg_mr(len, AccessFlags::ALL).why("reg_mr")
    }
}

fn wait(cq: &impl CompletionQueue, n: usize) -> Result<Vec<WorkCompletion>, String> {
    poll_n(cq, n, WAIT).why("poll")
}

fn one_ok(cq: &impl CompletionQueue, wr_id: u64, opcode: WcOpcode) -> Result<WorkCompletion, String> {
    let wc = wait(cq, 1)?[0];
    ensure!(
        wc.status == WcStatus::Success && wc.wr_id == wr_id && wc.opcode == opcode,
        "expected wr_id {wr_id} {opcode:?} SUCCESS, got wr_id {} {:?} {:?} (vendor_err {:#x})",
        wc.wr_id,
        wc.opcode,
        wc.status,
        wc.vendor_err
    );
    Ok(wc)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

// ---------------------------------------------------------------- the checks

fn device_info<B: Backend>(backend: &B, env: &Env<'_, B>, gid_index: u8) -> Check {
    let names: Vec<String> = backend
        .devices()
        .why("devices")?
        .into_iter()
        .map(|d| d.name)
        .collect();
    let dev = env.ctx.query_device().why("query_device")?;
    let port = env.ctx.query_port(1).why("query_port")?;
    let gid = env.ctx.query_gid(1, gid_index as u32).why("query_gid")?;
    let caps = env.ctx.capabilities().why("capabilities")?;
    println!(
        "     devices {names:?}; {} fw {:?} max_qp {} max_qp_wr {} max_sge {} max_cqe {} atomic {:?}",
        env.ctx.name(),
        dev.fw_ver,
        dev.max_qp,
        dev.max_qp_wr,
        dev.max_sge,
        dev.max_cqe,
        dev.atomic_cap
    );
    println!(
        "     port 1: {:?} {:?} active_mtu {:?} max_msg_sz {}; GID[{gid_index}] {gid}",
        port.state, port.link_layer, port.active_mtu, port.max_msg_sz
    );
    println!("     {caps:?}");
    ensure!(!gid.is_zero(), "GID {gid_index} is zero");
    ensure!(
        caps.imm_data,
        "immediate data should be supported on an IB-transport device"
    );
    Ok(format!(
        "{} port {:?}, max_inline_data {}",
        env.ctx.name(),
        port.state,
        caps.max_inline_data
    ))
}

fn mr_rules<B: Backend>(env: &Env<'_, B>) -> Check {
    let empty = env.pd.reg_mr(0, AccessFlags::LOCAL_WRITE).why("reg_mr(0)")?;
    ensure!(empty.is_empty(), "reg_mr(0) has length {}", empty.len());
    match env.pd.reg_mr(4096, AccessFlags::REMOTE_WRITE) {
        Ok(_) => return Err("REMOTE_WRITE without LOCAL_WRITE was accepted".into()),
        Err(e) if e.errno() == libc::EINVAL => {}
        Err(e) => {
            return Err(format!(
                "REMOTE_WRITE without LOCAL_WRITE: expected EINVAL, got {e}"
            ))
        }
    }
    match env
        .pd
        .reg_mr(4096, AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ)
    {
        Ok(_) => return Err("REMOTE_ATOMIC without LOCAL_WRITE was accepted".into()),
        Err(e) if e.errno() == libc::EINVAL => {}
        Err(e) => {
            return Err(format!(
                "REMOTE_ATOMIC without LOCAL_WRITE: expected EINVAL, got {e}"
            ))
        }
    }
    let mr = env.mr(1 << 20)?;
    ensure!(mr.addr() % 4096 == 0, "buffer not page aligned: {:#x}", mr.addr());
    ensure!(mr.to_vec().iter().all(|&b| b == 0), "buffer not zeroed");
    Ok(format!(
        "len 0 ok; REMOTE_WRITE/ATOMIC alone -> EINVAL; 1 MiB lkey {:#x}",
        mr.lkey()
    ))
}

fn qp_state_machine<B: Backend>(env: &Env<'_, B>) -> Check {
    let cq = env.ctx.create_cq(8, None).why("create_cq")?;
    let qp = env
        .pd
        .create_qp(&QpInitAttr::rc(&cq, &cq, CAP))
        .why("create_qp")?;
    let q = qp.query().why("query")?;
    ensure!(q.qp_state == QpState::Reset, "new QP in {:?}", q.qp_state);
    ensure!(
        q.cap.max_send_wr >= CAP.max_send_wr && q.cap.max_inline_data >= CAP.max_inline_data,
        "granted cap {:?} smaller than asked {CAP:?}",
        q.cap
    );
    let bad = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    let e = qp
        .modify(&bad, QpAttrMask::STATE)
        .err()
        .ok_or("RESET -> RTS was accepted")?;
    ensure!(
        matches!(
            e,
            Error::InvalidTransition {
                current: QpState::Reset,
                requested: QpState::Rts
            }
        ),
        "RESET -> RTS: expected InvalidTransition, got {e:?}"
    );
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    let e = qp
        .modify(&init, QpAttrMask::STATE | QpAttrMask::PORT)
        .err()
        .ok_or("INIT without PKEY_INDEX accepted")?;
    ensure!(
        matches!(e, Error::InvalidAttrMask { .. }),
        "expected InvalidAttrMask, got {e:?}"
    );
    let mr = env.mr(64)?;
    let sge = [mr.sge(0, 8).why("sge")?];
    let e = qp
        .post_send(&[SendWr::send(1, &sge)])
        .err()
        .ok_or("post_send in RESET accepted")?;
    ensure!(
        e.errno() == libc::EINVAL && e.index == 0,
        "post_send in RESET: {e}"
    );
    let recv_in_reset = match qp.post_recv(&[RecvWr::new(2, &sge)]) {
        Ok(()) => "post_recv in RESET accepted".to_string(),
        Err(e) => format!("post_recv in RESET: {}", e.error),
    };
    Ok(format!(
        "cap {:?}; RESET->RTS: {e0}; post_send in RESET: {}; {recv_in_reset}",
        q.cap,
        e.error,
        e0 = "InvalidTransition"
    ))
}

fn send_recv<B: Backend>(env: &Env<'_, B>, p: &Pair<B>, ma: &MrOf<B>, mb: &MrOf<B>) -> Check {
    let len = 4096;
    let data = pattern(len, 3);
    ma.write(0, &data).why("write")?;
    mb.fill(0);
    let rs = [mb.sge(0, len).why("sge")?];
    p.b.post_recv(&[RecvWr::new(100, &rs)]).why("post_recv")?;
    let ss = [ma.sge(0, len).why("sge")?];
    p.a.post_send(&[SendWr::send(1, &ss).signaled()])
        .why("post_send")?;
    one_ok(&p.cq_a, 1, WcOpcode::Send)?;
    let wc = one_ok(&p.cq_b, 100, WcOpcode::Recv)?;
    ensure!(wc.byte_len == len as u32, "byte_len {}", wc.byte_len);
    ensure!(wc.imm().is_none(), "unexpected imm {:?}", wc.imm());
    ensure!(
        wc.qp_num == p.b.qp_num(),
        "qp_num {:#x} != {:#x}",
        wc.qp_num,
        p.b.qp_num()
    );
    let mut got = vec![0; len];
    mb.read(0, &mut got).why("read")?;
    ensure!(got == data, "received data differs");
    let _ = env;
    Ok(format!("{len} B intact, byte_len {}", wc.byte_len))
}

fn send_with_imm<B: Backend>(p: &Pair<B>, ma: &MrOf<B>, mb: &MrOf<B>) -> Check {
    let data = pattern(100, 9);
    ma.write(0, &data).why("write")?;
    let rs = [mb.sge(0, 4096).why("sge")?];
    p.b.post_recv(&[RecvWr::new(101, &rs)]).why("post_recv")?;
    let ss = [ma.sge(0, 100).why("sge")?];
    p.a.post_send(&[SendWr::send_with_imm(2, &ss, 0xdead_beef).signaled()])
        .why("post_send")?;
    one_ok(&p.cq_a, 2, WcOpcode::Send)?;
    let wc = one_ok(&p.cq_b, 101, WcOpcode::Recv)?;
    ensure!(
        wc.wc_flags.contains(WcFlags::WITH_IMM),
        "WITH_IMM not set: {:?}",
        wc.wc_flags
    );
    ensure!(wc.imm() == Some(0xdead_beef), "imm {:#x}", wc.imm_data);
    ensure!(wc.byte_len == 100, "byte_len {}", wc.byte_len);
    let mut got = vec![0; 100];
    mb.read(0, &mut got).why("read")?;
    ensure!(got == data, "data differs");
    Ok(format!("imm {:#x}, flags {:?}", wc.imm_data, wc.wc_flags))
}

fn rdma_write<B: Backend>(p: &Pair<B>, ma: &MrOf<B>, mb: &MrOf<B>) -> Check {
    let data = pattern(3000, 5);
    ma.write(0, &data).why("write")?;
    mb.fill(0xee);
    let ss = [ma.sge(0, 3000).why("sge")?];
    let remote = mb.remote().at(100);
    p.a.post_send(&[SendWr::write(3, &ss, remote).signaled()])
        .why("post_send")?;
    one_ok(&p.cq_a, 3, WcOpcode::RdmaWrite)?;
    let got = mb.to_vec();
    ensure!(got[100..3100] == data[..], "written data differs");
    ensure!(
        got[..100].iter().all(|&b| b == 0xee),
        "bytes before the target changed"
    );
    ensure!(
        got[3100..].iter().all(|&b| b == 0xee),
        "bytes after the target changed"
    );
    let quiet = poll_quiet(&p.cq_b, Duration::from_millis(50)).why("poll")?;
    ensure!(
        quiet.is_empty(),
        "WRITE produced a completion at the target: {quiet:?}"
    );
    Ok("3000 B at offset 100, neighbours untouched, no target completion".into())
}

fn rdma_write_with_imm<B: Backend>(p: &Pair<B>, ma: &MrOf<B>, mb: &MrOf<B>) -> Check {
    let data = pattern(512, 1);
    ma.write(0, &data).why("write")?;
    let rs: [verbs_api::Sge; 0] = [];
    p.b.post_recv(&[RecvWr::new(102, &rs)]).why("post_recv")?;
    let ss = [ma.sge(0, 512).why("sge")?];
    p.a.post_send(&[SendWr::write_with_imm(4, &ss, mb.remote().at(0), 0x0102_0304).signaled()])
        .why("post_send")?;
    one_ok(&p.cq_a, 4, WcOpcode::RdmaWrite)?;
    let wc = one_ok(&p.cq_b, 102, WcOpcode::RecvRdmaWithImm)?;
    ensure!(wc.imm() == Some(0x0102_0304), "imm {:?}", wc.imm());
    let mut got = vec![0; 512];
    mb.read(0, &mut got).why("read")?;
    ensure!(got == data, "data differs");
    Ok(format!(
        "RECV_RDMA_WITH_IMM imm {:#x}, byte_len {}",
        wc.imm_data, wc.byte_len
    ))
}

fn rdma_read<B: Backend>(p: &Pair<B>, ma: &MrOf<B>, mb: &MrOf<B>) -> Check {
    let data = pattern(5000, 77);
    mb.write(1000, &data).why("write")?;
    ma.fill(0);
    let ss = [ma.sge(0, 2000).why("sge")?, ma.sge(4000, 3000).why("sge")?];
    p.a.post_send(&[SendWr::read(5, &ss, mb.remote().at(1000)).signaled()])
        .why("post_send")?;
    let wc = one_ok(&p.cq_a, 5, WcOpcode::RdmaRead)?;
    let got = ma.to_vec();
    ensure!(got[..2000] == data[..2000], "first SGE differs");
    ensure!(got[4000..7000] == data[2000..], "second SGE differs");
    ensure!(
        got[2000..4000].iter().all(|&b| b == 0),
        "gap between SGEs written"
    );
    Ok(format!("5000 B into 2 SGEs, byte_len {}", wc.byte_len))
}

fn atomics<B: Backend>(p: &Pair<B>, ma: &MrOf<B>, mb: &MrOf<B>) -> Check {
    mb.write_u64(64, 100).why("write_u64")?;
    ma.write_u64(0, 0).why("write_u64")?;
    let res = [ma.sge(0, 8).why("sge")?];
    let target = mb.remote().at(64);
    p.a.post_send(&[SendWr::fetch_and_add(6, &res, target, 5).signaled()])
        .why("post_send")?;
    one_ok(&p.cq_a, 6, WcOpcode::FetchAdd)?;
    let (old, now) = (ma.read_u64(0).why("read")?, mb.read_u64(64).why("read")?);
    ensure!(
        old == 100 && now == 105,
        "FETCH_AND_ADD: old {old} (want 100), now {now} (want 105)"
    );

    p.a.post_send(&[SendWr::cmp_and_swp(7, &res, target, 105, 7).signaled()])
        .why("post_send")?;
    one_ok(&p.cq_a, 7, WcOpcode::CompSwap)?;
    let (old, now) = (ma.read_u64(0).why("read")?, mb.read_u64(64).why("read")?);
    ensure!(
        old == 105 && now == 7,
        "CMP_AND_SWP hit: old {old} (want 105), now {now} (want 7)"
    );

    p.a.post_send(&[SendWr::cmp_and_swp(8, &res, target, 1, 9).signaled()])
        .why("post_send")?;
    one_ok(&p.cq_a, 8, WcOpcode::CompSwap)?;
    let (old, now) = (ma.read_u64(0).why("read")?, mb.read_u64(64).why("read")?);
    ensure!(
        old == 7 && now == 7,
        "CMP_AND_SWP miss: old {old} (want 7), now {now} (want 7)"
    );
    Ok("FAA 100+5 -> old 100; CAS(105->7) old 105; CAS(1->9) miss, old 7".into())
}

fn inline_send<B: Backend>(p: &Pair<B>, ma: &MrOf<B>, mb: &MrOf<B>) -> Check {
    let data = pattern(48, 200);
    ma.write(0, &data).why("write")?;
    let rs = [mb.sge(0, 4096).why("sge")?];
    p.b.post_recv(&[RecvWr::new(103, &rs)]).why("post_recv")?;
    let ss = [ma.sge(0, 48).why("sge")?];
    p.a.post_send(&[SendWr::send(9, &ss).inline().signaled()])
        .why("post_send inline")?;
    ma.fill(0); // inline data was copied at post time
    one_ok(&p.cq_a, 9, WcOpcode::Send)?;
    let wc = one_ok(&p.cq_b, 103, WcOpcode::Recv)?;
    let mut got = vec![0; 48];
    mb.read(0, &mut got).why("read")?;
    ensure!(
        got == data && wc.byte_len == 48,
        "inline data differs (byte_len {})",
        wc.byte_len
    );

    // An inline SGE outside its region must be refused before the provider copies it.
    let outside = [verbs_api::Sge::new(
        ma.addr() + ma.len() as u64 - 8,
        48,
        ma.lkey(),
    )];
    let ok = [ma.sge(0, 8).why("sge")?];
    let e =
        p.a.post_send(&[
            SendWr::write(10, &ok, mb.remote().at(0)),
            SendWr::send(11, &outside).inline(),
        ])
        .err()
        .ok_or("inline SGE outside its region was posted")?;
    ensure!(
        e.index == 1 && e.wr_id == 11 && e.errno() == libc::EINVAL,
        "expected WR #1 refused with EINVAL, got {e}"
    );
    let unknown = [verbs_api::Sge::new(0x1000, 8, 0xdead)];
    let e2 =
        p.a.post_send(&[SendWr::send(12, &unknown).inline()])
            .err()
            .ok_or("unknown lkey posted")?;
    ensure!(e2.index == 0 && e2.errno() == libc::EINVAL, "unknown lkey: {e2}");
    // WR #0 of the first list (an unsignaled WRITE) was posted; send one signaled WR
    // after it to see that the queue still works.
    p.a.post_send(&[SendWr::write(13, &ok, mb.remote().at(0)).signaled()])
        .why("post_send")?;
    one_ok(&p.cq_a, 13, WcOpcode::RdmaWrite)?;
    Ok(format!("48 B inline intact; bad inline SGE refused: {}", e.error))
}

fn bad_rkey<B: Backend>(env: &Env<'_, B>) -> Check {
    let p = env.pair()?;
    let (ma, mb) = (env.mr(4096)?, env.mr(4096)?);
    mb.fill(0x5a);
    let ss = [ma.sge(0, 64).why("sge")?];
    let mut remote = mb.remote().at(0);
    remote.rkey ^= 0x0000_ff00;
    p.a.post_send(&[SendWr::write(20, &ss, remote).signaled()])
        .why("post_send")?;
    let wc = wait(&p.cq_a, 1)?[0];
    ensure!(
        wc.status == WcStatus::RemAccessErr,
        "expected REM_ACCESS_ERR, got {:?} (vendor_err {:#x})",
        wc.status,
        wc.vendor_err
    );
    ensure!(mb.to_vec().iter().all(|&b| b == 0x5a), "target memory changed");
    let state = p.a.state().why("state")?;
    ensure!(
        state == QpState::Err,
        "requester QP in {state:?} after REM_ACCESS_ERR"
    );
    // In ERR every new WR is flushed.
    p.a.post_send(&[SendWr::send(21, &ss).signaled()])
        .why("post_send in ERR")?;
    let fl = wait(&p.cq_a, 1)?[0];
    ensure!(
        fl.status == WcStatus::WrFlushErr && fl.wr_id == 21,
        "expected WR_FLUSH_ERR, got {fl:?}"
    );
    let resp = p.b.state().why("state")?;
    Ok(format!(
        "REM_ACCESS_ERR (vendor_err {:#x}), requester ERR, then WR_FLUSH_ERR; responder QP in {resp:?}",
        wc.vendor_err
    ))
}

fn rnr<B: Backend>(env: &Env<'_, B>) -> Check {
    let pa = RcParams {
        rnr_retry: 0,
        ..env.params
    };
    let p = env.pair_with(&pa, &env.params, CAP, 64, None)?;
    let ma = env.mr(4096)?;
    let ss = [ma.sge(0, 64).why("sge")?];
    let t0 = Instant::now();
    p.a.post_send(&[SendWr::send(30, &ss).signaled()])
        .why("post_send")?;
    let wc = wait(&p.cq_a, 1)?[0];
    ensure!(
        wc.status == WcStatus::RnrRetryExcErr,
        "expected RNR_RETRY_EXC_ERR, got {:?} (vendor_err {:#x})",
        wc.status,
        wc.vendor_err
    );
    Ok(format!(
        "RNR_RETRY_EXC_ERR after {:?} with rnr_retry 0",
        t0.elapsed()
    ))
}

fn completion_channel<B: Backend>(env: &Env<'_, B>) -> Check {
    let chan = env.ctx.create_comp_channel().why("create_comp_channel")?;
    let p = env.pair_with(&env.params, &env.params, CAP, 64, Some(&chan))?;
    let (ma, mb) = (env.mr(4096)?, env.mr(4096)?);
    ensure!(chan.fd() >= 0, "fd {}", chan.fd());
    p.cq_b.req_notify(false).why("req_notify")?;
    let none = chan
        .get_cq_event(Some(Duration::from_millis(100)))
        .why("get_cq_event")?;
    ensure!(none.is_none(), "event before any completion: {none:?}");
    let rs = [mb.sge(0, 64).why("sge")?];
    p.b.post_recv(&[RecvWr::new(40, &rs)]).why("post_recv")?;
    let ss = [ma.sge(0, 64).why("sge")?];
    p.a.post_send(&[SendWr::send(41, &ss)]).why("post_send")?;
    let t0 = Instant::now();
    let ev = chan.get_cq_event(Some(WAIT)).why("get_cq_event")?;
    let waited = t0.elapsed();
    ensure!(
        ev == Some(p.cq_b.handle()),
        "event {ev:?}, expected CQ handle {}",
        p.cq_b.handle()
    );
    p.cq_b.ack_events(1);
    one_ok(&p.cq_b, 40, WcOpcode::Recv)?;
    // Not re-armed: the next completion raises no event.
    p.b.post_recv(&[RecvWr::new(42, &rs)]).why("post_recv")?;
    p.a.post_send(&[SendWr::send(43, &ss)]).why("post_send")?;
    one_ok(&p.cq_b, 42, WcOpcode::Recv)?;
    let again = chan
        .get_cq_event(Some(Duration::from_millis(100)))
        .why("get_cq_event")?;
    ensure!(again.is_none(), "event without req_notify: {again:?}");
    // Taken but unacknowledged events must not block the CQ's destruction.
    p.cq_b.req_notify(false).why("req_notify")?;
    p.b.post_recv(&[RecvWr::new(44, &rs)]).why("post_recv")?;
    p.a.post_send(&[SendWr::send(45, &ss)]).why("post_send")?;
    let ev = chan.get_cq_event(Some(WAIT)).why("get_cq_event")?;
    ensure!(ev == Some(p.cq_b.handle()), "second event {ev:?}");
    drop(p); // ack happens in Drop
    Ok(format!(
        "event for CQ {} after {waited:?}; no event unarmed; drop with unacked event ok",
        ev.unwrap_or_default()
    ))
}

fn queue_full<B: Backend>(env: &Env<'_, B>) -> Check {
    let p = env.pair()?;
    let granted = p.b.query().why("query")?.cap.max_recv_wr;
    let mb = env.mr(64)?;
    let rs = [mb.sge(0, 64).why("sge")?];
    // Devices may round queues up beyond what they report: post until the queue refuses.
    let n = 4 * granted as u64 + 64;
    let wrs: Vec<RecvWr<'_>> = (0..n).map(|i| RecvWr::new(i, &rs)).collect();
    let e =
        p.b.post_recv(&wrs)
            .err()
            .ok_or(format!("{n} receives posted on a queue of {granted}"))?;
    ensure!(
        matches!(e.error, Error::QueueFull { capacity, .. } if capacity == granted)
            && e.index >= granted as usize
            && e.wr_id == e.index as u64,
        "expected QueueFull at index >= {granted}, got {e}"
    );
    let note = if e.index > granted as usize {
        format!(" (the queue holds {} although max_recv_wr is {granted})", e.index)
    } else {
        String::new()
    };
    Ok(format!("receive #{}: {}{note}", e.index, e.error))
}

/// An RC pair whose responder B takes its receives from `srq`: the SRQ's receives are
/// consumed in order, completions name B, B's own receive queue is refused, and the limit
/// event fires once the SRQ drops below its limit, naming the SRQ.
fn srq<B: Backend>(env: &Env<'_, B>) -> Check {
    let srq = env.pd.create_srq(&SrqAttr::new(16, 1)).why("create_srq")?;
    let granted = srq.query().why("query_srq")?;
    ensure!(
        granted.max_wr >= 16 && granted.max_sge >= 1 && granted.srq_limit == 0,
        "query_srq: {granted:?}"
    );
    let cq_a = env.ctx.create_cq(16, None).why("create_cq")?;
    let cq_b = env.ctx.create_cq(16, None).why("create_cq")?;
    let a = env
        .pd
        .create_qp(&QpInitAttr::rc(&cq_a, &cq_a, CAP))
        .why("create_qp")?;
    let b = env
        .pd
        .create_qp(&QpInitAttr::rc(&cq_b, &cq_b, CAP).with_srq(&srq))
        .why("create_qp(srq)")?;
    let ea = local_endpoint(env.ctx, &a, &env.params, 0x33).why("local_endpoint")?;
    let eb = local_endpoint(env.ctx, &b, &env.params, 0x44).why("local_endpoint")?;
    connect_rc(&a, &env.params, ea.psn, &eb).why("connect_rc(a)")?;
    connect_rc(&b, &env.params, eb.psn, &ea).why("connect_rc(b)")?;
    let (ma, mb) = (env.mr(4096)?, env.mr(4096)?);
    let rs: Vec<_> = (0..4)
        .map(|i| mb.sge(i * 64, 64))
        .collect::<Result<_, _>>()
        .why("sge")?;
    let e = b
        .post_recv(&[RecvWr::new(9, &rs[..1])])
        .err()
        .ok_or("post_recv on a QP with an SRQ accepted")?;
    ensure!(e.errno() == libc::EINVAL, "post_recv on an SRQ QP: {e}");
    for (i, s) in rs.iter().enumerate() {
        srq.post_recv(&[RecvWr::new(200 + i as u64, std::slice::from_ref(s))])
            .why("post_srq_recv")?;
    }
    srq.modify(&SrqAttr::default().with_limit(3), SrqAttrMask::LIMIT)
        .why("modify_srq(LIMIT)")?;
    ensure!(srq.query().why("query_srq")?.srq_limit == 3, "limit not armed");
    let ss = [ma.sge(0, 8).why("sge")?];
    for i in 0..2u64 {
        ma.write(0, &[i as u8 + 1; 8]).why("write")?;
        a.post_send(&[SendWr::send(i, &ss).signaled()]).why("post_send")?;
        one_ok(&cq_a, i, WcOpcode::Send)?;
        let wc = one_ok(&cq_b, 200 + i, WcOpcode::Recv)?;
        ensure!(
            wc.qp_num == b.qp_num(),
            "qp_num {:#x}, expected B {:#x}",
            wc.qp_num,
            b.qp_num()
        );
    }
    let ev = env
        .ctx
        .get_async_event(Some(WAIT))
        .why("get_async_event")?
        .ok_or("no SRQ limit event after the count fell to 2 (limit 3)")?;
    let got = (ev.event_type, ev.element);
    let seen = ev.to_string();
    env.ctx.ack_async_event(ev);
    ensure!(
        got == (AsyncEventType::SrqLimitReached, AsyncElement::Srq(srq.handle())),
        "event {got:?}"
    );
    let after = srq.query().why("query_srq")?.srq_limit;
    ensure!(after == 0, "srq_limit {after} after the event (should disarm)");
    Ok(format!(
        "granted {granted:?}; post_recv on the QP: EINVAL; 2 receives via SRQ on QP {:#x}; {seen}",
        b.qp_num()
    ))
}

/// RESET -> INIT -> RTR -> RTS of a UD QP (`man ibv_modify_qp`, UD).
fn ud_up(qp: &impl QueuePair, qkey: u32, sq_psn: u32) -> Result<(), String> {
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qkey,
        ..Default::default()
    };
    qp.modify(
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .why("UD RESET -> INIT")?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..Default::default()
    };
    qp.modify(&rtr, QpAttrMask::STATE).why("UD INIT -> RTR")?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn,
        ..Default::default()
    };
    qp.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .why("UD RTR -> RTS")
}

/// Two UD QPs: a datagram through an address handle arrives behind its 40-byte GRH and
/// names its sender; a UD send without a destination, or with an address handle of
/// another context, is refused before the provider sees it.
fn ud<B: Backend>(backend: &B, env: &Env<'_, B>) -> Check {
    const QKEY: u32 = 0x1111_1111;
    let cq = env.ctx.create_cq(16, None).why("create_cq")?;
    let a = env
        .pd
        .create_qp(&QpInitAttr::ud(&cq, &cq, CAP))
        .why("create_qp(UD)")?;
    let b = env
        .pd
        .create_qp(&QpInitAttr::ud(&cq, &cq, CAP))
        .why("create_qp(UD)")?;
    ensure!(a.qp_type() == QpType::Ud, "qp_type {:?}", a.qp_type());
    ud_up(&a, QKEY, 0x10)?;
    ud_up(&b, QKEY, 0x20)?;
    let eb: Endpoint = local_endpoint(env.ctx, &b, &env.params, 0).why("local_endpoint")?;
    let ah = env
        .pd
        .create_ah(&ah_attr_for(&eb, &env.params))
        .why("create_ah")?;
    ensure!(ah.attr().grh.dgid == eb.gid, "ah.attr() {:?}", ah.attr());
    let (ma, mb) = (env.mr(4096)?, env.mr(4096)?);
    let data = pattern(200, 11);
    ma.write(0, &data).why("write")?;
    b.post_recv(&[RecvWr::new(7, &[mb.sge(0, 40 + 200).why("sge")?])])
        .why("post_recv")?;
    let ss = [ma.sge(0, 200).why("sge")?];
    a.post_send(&[SendWr::send(1, &ss).signaled().ud(&ah, b.qp_num(), QKEY)])
        .why("post_send(UD)")?;
    let wcs = wait(&cq, 2)?;
    let recv = wcs
        .iter()
        .find(|w| w.wr_id == 7)
        .ok_or(format!("no receive completion: {wcs:?}"))?;
    ensure!(
        wcs.iter().all(|w| w.status == WcStatus::Success),
        "statuses {wcs:?}"
    );
    ensure!(
        recv.byte_len == 240 && recv.src_qp == a.qp_num() && recv.wc_flags.contains(WcFlags::GRH),
        "receive: byte_len {} src_qp {:#x} (A is {:#x}) flags {:?}",
        recv.byte_len,
        recv.src_qp,
        a.qp_num(),
        recv.wc_flags
    );
    let mut got = vec![0; 200];
    mb.read(40, &mut got).why("read")?;
    ensure!(got == data, "payload after the GRH differs");
    let e = a
        .post_send(&[SendWr::send(2, &ss)])
        .err()
        .ok_or("a UD send without a destination was accepted")?;
    ensure!(e.errno() == libc::EINVAL, "UD send without ud: {e}");
    let other = backend.open(env.ctx.name()).why("open")?;
    let other_pd = other.alloc_pd().why("alloc_pd")?;
    let foreign = other_pd
        .create_ah(&ah_attr_for(&eb, &env.params))
        .why("create_ah")?;
    let e = a
        .post_send(&[SendWr::send(3, &ss).ud(&foreign, b.qp_num(), QKEY)])
        .err()
        .ok_or("an address handle of another context was accepted")?;
    ensure!(e.errno() == libc::EINVAL, "foreign AH: {e}");
    Ok(format!(
        "200 B + GRH, byte_len {}, src_qp {:#x}, flags {:?}; no destination / foreign AH: EINVAL",
        recv.byte_len, recv.src_qp, recv.wc_flags
    ))
}

/// A UC pair (connected without the RC-only attributes): SEND and WRITE_WITH_IMM arrive.
fn uc<B: Backend>(env: &Env<'_, B>) -> Check {
    let cq_a = env.ctx.create_cq(16, None).why("create_cq")?;
    let cq_b = env.ctx.create_cq(16, None).why("create_cq")?;
    let a = env
        .pd
        .create_qp(&QpInitAttr::uc(&cq_a, &cq_a, CAP))
        .why("create_qp(UC)")?;
    let b = env
        .pd
        .create_qp(&QpInitAttr::uc(&cq_b, &cq_b, CAP))
        .why("create_qp(UC)")?;
    let ea = local_endpoint(env.ctx, &a, &env.params, 0x55).why("local_endpoint")?;
    let eb = local_endpoint(env.ctx, &b, &env.params, 0x66).why("local_endpoint")?;
    for (qp, me, peer) in [(&a, &ea, &eb), (&b, &eb, &ea)] {
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::REMOTE_WRITE,
            ..Default::default()
        };
        qp.modify(
            &init,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
        )
        .why("UC RESET -> INIT")?;
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: env.params.path_mtu,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            ah_attr: ah_attr_for(peer, &env.params),
            ..Default::default()
        };
        qp.modify(
            &rtr,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN,
        )
        .why("UC INIT -> RTR")?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: me.psn,
            ..Default::default()
        };
        qp.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
            .why("UC RTR -> RTS")?;
    }
    let (ma, mb) = (env.mr(4096)?, env.mr(4096)?);
    let data = pattern(300, 13);
    ma.write(0, &data).why("write")?;
    b.post_recv(&[
        RecvWr::new(1, &[mb.sge(0, 512).why("sge")?]),
        RecvWr::new(2, &[mb.sge(512, 8).why("sge")?]),
    ])
    .why("post_recv")?;
    let ss = [ma.sge(0, 300).why("sge")?];
    a.post_send(&[SendWr::send(10, &ss).signaled()])
        .why("post_send")?;
    one_ok(&cq_a, 10, WcOpcode::Send)?;
    let wc = one_ok(&cq_b, 1, WcOpcode::Recv)?;
    ensure!(wc.byte_len == 300, "SEND byte_len {}", wc.byte_len);
    a.post_send(&[SendWr::write_with_imm(11, &ss, mb.remote().at(1024), 0x77).signaled()])
        .why("post_send")?;
    one_ok(&cq_a, 11, WcOpcode::RdmaWrite)?;
    let wc = one_ok(&cq_b, 2, WcOpcode::RecvRdmaWithImm)?;
    ensure!(wc.imm() == Some(0x77), "imm {:?}", wc.imm());
    let mut got = vec![0; 300];
    mb.read(1024, &mut got).why("read")?;
    ensure!(got == data, "written data differs");
    mb.read(0, &mut got).why("read")?;
    ensure!(got == data, "sent data differs");
    Ok("SEND 300 B and WRITE_WITH_IMM 300 B delivered".into())
}

/// Objects keep their parents alive: dropping the context, PD and CQs first must leave
/// the QP and MR usable, and the final drops must not fail or hang.
fn drop_order<B: Backend>(backend: &B, env: &Env<'_, B>) -> Check {
    let ctx = backend.open(env.ctx.name()).why("open")?;
    let pd = ctx.alloc_pd().why("alloc_pd")?;
    let chan = ctx.create_comp_channel().why("create_comp_channel")?;
    let cq = ctx.create_cq(8, Some(&chan)).why("create_cq")?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, CAP)).why("create_qp")?;
    let mr = pd.reg_mr(4096, AccessFlags::ALL).why("reg_mr")?;
    drop(ctx);
    drop(pd);
    drop(chan);
    drop(cq);
    let state = qp.state().why("query after parents dropped")?;
    mr.write(0, b"still here").why("write")?;
    let mut back = [0u8; 10];
    mr.read(0, &mut back).why("read")?;
    ensure!(&back == b"still here", "MR contents lost");
    drop(mr);
    drop(qp);
    Ok(format!(
        "context, PD, channel, CQ dropped first; QP still answers ({state:?})"
    ))
}

fn cq_overflow<B: Backend>(env: &Env<'_, B>) -> Check {
    let cap = QpCap {
        max_send_wr: 64,
        ..CAP
    };
    let p = env.pair_with(&env.params, &env.params, cap, 2, None)?;
    let size = p.cq_a.capacity();
    let (ma, mb) = (env.mr(64)?, env.mr(64)?);
    let ss = [ma.sge(0, 8).why("sge")?];
    let n = size as u64 + 4;
    ensure!(n <= 64, "CQ of {size} entries is too large for this check");
    for i in 0..n {
        p.a.post_send(&[SendWr::write(50 + i, &ss, mb.remote().at(0)).signaled()])
            .why("post_send")?;
    }
    let deadline = Instant::now() + WAIT;
    let mut buf = [WorkCompletion::default(); 1];
    loop {
        std::thread::sleep(Duration::from_millis(200));
        // Poll nothing until the async event had time to arrive.
        match p.cq_a.poll(&mut buf[..0]) {
            Err(Error::CqOverflow { cq, lost }) => {
                ensure!(
                    cq == p.cq_a.handle(),
                    "overflow names CQ {cq}, expected {}",
                    p.cq_a.handle()
                );
                let ev = env
                    .ctx
                    .get_async_event(Some(WAIT))
                    .why("get_async_event")?
                    .ok_or("no asynchronous event for the overflow")?;
                let seen = ev.to_string();
                let want = (AsyncEventType::CqErr, AsyncElement::Cq(cq));
                let got = (ev.event_type, ev.element);
                env.ctx.ack_async_event(ev);
                ensure!(got == want, "event {got:?}, expected {want:?}");
                return Ok(format!(
                    "{n} completions into a CQ of {size}: {}; event: {seen}",
                    Error::CqOverflow { cq, lost }
                ));
            }
            Err(e) => return Err(format!("poll: {e}")),
            Ok(_) if Instant::now() > deadline => {
                return Err(format!(
                    "{n} completions into a CQ of {size}: no overflow reported"
                ))
            }
            Ok(_) => {}
        }
    }
}

fn run<B: Backend>(backend: &B, ctx: &ContextOf<B>, gid_index: u8) -> Vec<String> {
    let mut failed = Vec::new();
    let mut report = |name: &str, r: Check| match r {
        Ok(d) => println!("PASS {name:<22} {d}"),
        Err(e) => {
            println!("FAIL {name:<22} {e}");
            failed.push(name.to_string());
        }
    };
    let pd = match ctx.alloc_pd() {
        Ok(pd) => pd,
        Err(e) => {
            report("alloc_pd", Err(e.to_string()));
            return failed;
        }
    };
    let env = Env::<B> {
        ctx,
        pd,
        params: RcParams {
            gid_index,
            ..Default::default()
        },
    };
    report("device info", device_info(backend, &env, gid_index));
    report("mr rules", mr_rules(&env));
    report("qp state machine", qp_state_machine(&env));
    let main = (|| -> Result<_, String> { Ok((env.pair()?, env.mr(8192)?, env.mr(8192)?)) })();
    match &main {
        Ok((p, ma, mb)) => {
            report("send/recv", send_recv(&env, p, ma, mb));
            report("send with imm", send_with_imm(p, ma, mb));
            report("rdma write", rdma_write(p, ma, mb));
            report("rdma write with imm", rdma_write_with_imm(p, ma, mb));
            report("rdma read", rdma_read(p, ma, mb));
            report("atomics", atomics(p, ma, mb));
            report("inline send", inline_send(p, ma, mb));
        }
        Err(e) => report("connect pair", Err(e.clone())),
    }
    report("bad rkey", bad_rkey(&env));
    report("rnr retry exceeded", rnr(&env));
    report("completion channel", completion_channel(&env));
    report("recv queue full", queue_full(&env));
    report("cq overflow", cq_overflow(&env));
    report("srq", srq(&env));
    report("ud", ud(backend, &env));
    report("uc", uc(&env));
    report("drop order", drop_order(backend, &env));
    drop(main);
    failed
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gid_index = match args.get(1).map(|s| s.parse::<u8>()) {
        None => 1,
        Some(Ok(g)) => g,
        Some(Err(e)) => {
            eprintln!("usage: ibv_smoke [DEVICE [GID_INDEX]]: bad GID index: {e}");
            return ExitCode::from(2);
        }
    };
    let backend = IbvBackend;
    let t0 = Instant::now();
    let ctx = match args.first() {
        Some(name) => backend.open(name),
        None => backend.open_first(),
    };
    let ctx = match ctx {
        Ok(c) => c,
        Err(e) => {
            println!("FAIL open: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "ibv_smoke: backend {}, device {}, GID index {gid_index}",
        backend.name(),
        ctx.name()
    );
    let failed = run(&backend, &ctx, gid_index);
    // The events no check took (a CQ overflow raises one per lost completion on rxe).
    let mut events = Vec::new();
    while let Ok(Some(ev)) = ctx.get_async_event(Some(Duration::ZERO)) {
        events.push(ev.to_string());
        ctx.ack_async_event(ev);
    }
    if !events.is_empty() {
        println!("async events not taken by a check: {events:?}");
    }
    drop(ctx);
    if failed.is_empty() {
        println!("ibv_smoke: all checks passed in {:?}", t0.elapsed());
        ExitCode::SUCCESS
    } else {
        println!(
            "ibv_smoke: {} check(s) FAILED: {failed:?} ({:?})",
            failed.len(),
            t0.elapsed()
        );
        ExitCode::FAILURE
    }
}
