//! The work-request builder of extended QPs (`man ibv_wr_post`): `ibv_wr_start`, one
//! `ibv_wr_<opcode>` per WR (which takes `qp->wr_id` and `qp->wr_flags` as they are at
//! that call), its data (`ibv_wr_set_sge*`, `ibv_wr_set_inline_data*`) and destination
//! (`ibv_wr_set_ud_addr`), then `ibv_wr_complete` posts them all, or `ibv_wr_abort`
//! drops them.
//!
//! These calls return nothing; as in libibverbs' providers, the first error (an
//! operation the QP was not created for, data without a WR, an operation the sim does
//! not have: TSO, atomic write, XRC) is kept and returned by `ibv_wr_complete`, which then posts nothing.
//! Inline data is copied at the call, as the man page allows the buffer's reuse at once.

use std::ffi::{c_int, c_void};

use arrayvec::ArrayVec;
use verbs_api::{AddressHandle, QpState, QueuePair as _, RemoteAddr, SendFlags, SendWr, Sge, UdDest, WrOp};

use crate::abi::{ibv_ah, ibv_data_buf, ibv_mw, ibv_mw_bind_info, ibv_qp, ibv_qp_ex, ibv_sge};
use crate::ah::Ah;
use crate::ffi::{errno_of, value_verb, void_verb, Errno};
use crate::live;
use crate::post::send_flags;
use crate::qp::{Qp, POST_BATCH};

/// `IBV_QP_EX_WITH_*` bit of each operation (`enum ibv_qp_create_send_ops_flags`).
const WITH_RDMA_WRITE: u64 = 1 << 0;
const WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
const WITH_SEND: u64 = 1 << 2;
const WITH_SEND_WITH_IMM: u64 = 1 << 3;
const WITH_RDMA_READ: u64 = 1 << 4;
const WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
const WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
const WITH_LOCAL_INV: u64 = 1 << 7;
const WITH_BIND_MW: u64 = 1 << 8;
const WITH_SEND_WITH_INV: u64 = 1 << 9;

/// A WR's data.
enum Data {
    Sges(Vec<Sge>),
    Inline(Vec<u8>),
}

/// One WR between its `ibv_wr_<opcode>` and `ibv_wr_complete`.
struct Pending {
    wr_id: u64,
    flags: u32,
    op: WrOp,
    data: Data,
    ud: Option<(*mut ibv_ah, u32, u32)>,
    /// A BIND_MW's window, new rkey and binding (`ibv_wr_bind_mw`'s arguments).
    bind: Option<(*mut ibv_mw, u32, ibv_mw_bind_info)>,
}

/// The WRs of one `ibv_wr_start` .. `ibv_wr_complete`.
#[derive(Default)]
pub struct Builder {
    wrs: Vec<Pending>,
    error: Option<Errno>,
}

impl Builder {
    fn fail(&mut self, e: Errno) {
        self.error.get_or_insert(e);
    }

    fn last(&mut self) -> Option<&mut Pending> {
        let last = self.wrs.last_mut();
        if last.is_none() {
            self.error.get_or_insert(libc::EINVAL);
        }
        last
    }
}

/// Runs `f` on the QP and its builder, for a call of the builder interface (a NULL QP is
/// ignored: these calls return nothing).
///
/// # Safety
///
/// `qp` must be NULL or a live QP of this library.
unsafe fn with_builder(call: &'static str, qp: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut Builder)) {
    // SAFETY: the caller's contract.
    let q = unsafe { live::get_fast::<Qp>(qp) };
    void_verb(call, || {
        if let Ok(q) = q {
            f(q, &mut q.builder.lock());
        }
    })
}

/// Adds a WR of `op` (needing `with` among the QP's operations).
///
/// # Safety
///
/// As [`with_builder`].
unsafe fn add(call: &'static str, qp: *mut ibv_qp_ex, with: u64, op: Result<WrOp, Errno>) {
    let f = |q: &Qp, b: &mut Builder| {
        let op = match op {
            Ok(op) if q.send_ops().unwrap_or(0) & with != 0 => op,
            Ok(_) => return b.fail(libc::EINVAL),
            Err(e) => return b.fail(e),
        };
        // SAFETY: the C part lives as long as `q`; the program wrote these fields before
        // this call (the builder's contract), on this thread.
        let (wr_id, flags) = unsafe { ((*q.c.get()).wr_id, (*q.c.get()).wr_flags) };
        b.wrs.push(Pending {
            wr_id,
            flags,
            op,
            data: Data::Sges(Vec::new()),
            ud: None,
            bind: None,
        });
    };
    // SAFETY: forwarded contract.
    unsafe { with_builder(call, qp, f) }
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    // SAFETY: the program passes its QP.
    unsafe { with_builder("ibv_wr_start", qp, |_, b| *b = Builder::default()) }
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    // SAFETY: the program passes its QP.
    unsafe { with_builder("ibv_wr_abort", qp, |_, b| *b = Builder::default()) }
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    let remote = RemoteAddr::new(addr, rkey);
    // SAFETY: the program passes its QP.
    unsafe {
        add(
            "ibv_wr_rdma_write",
            qp,
            WITH_RDMA_WRITE,
            Ok(WrOp::RdmaWrite { remote }),
        )
    }
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    let op = WrOp::RdmaWriteWithImm {
        remote: RemoteAddr::new(addr, rkey),
        imm_data: u32::from_be(imm),
    };
    // SAFETY: the program passes its QP.
    unsafe { add("ibv_wr_rdma_write_imm", qp, WITH_RDMA_WRITE_WITH_IMM, Ok(op)) }
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: the program passes its QP.
    unsafe { add("ibv_wr_send", qp, WITH_SEND, Ok(WrOp::Send)) }
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    let op = WrOp::SendWithImm {
        imm_data: u32::from_be(imm),
    };
    // SAFETY: the program passes its QP.
    unsafe { add("ibv_wr_send_imm", qp, WITH_SEND_WITH_IMM, Ok(op)) }
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    let remote = RemoteAddr::new(addr, rkey);
    // SAFETY: the program passes its QP.
    unsafe {
        add(
            "ibv_wr_rdma_read",
            qp,
            WITH_RDMA_READ,
            Ok(WrOp::RdmaRead { remote }),
        )
    }
}

unsafe extern "C" fn wr_atomic_cmp_swp(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, compare: u64, swap: u64) {
    let op = WrOp::AtomicCmpAndSwp {
        remote: RemoteAddr::new(addr, rkey),
        compare,
        swap,
    };
    // SAFETY: the program passes its QP.
    unsafe { add("ibv_wr_atomic_cmp_swp", qp, WITH_ATOMIC_CMP_AND_SWP, Ok(op)) }
}

unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, add_: u64) {
    let op = WrOp::AtomicFetchAndAdd {
        remote: RemoteAddr::new(addr, rkey),
        add: add_,
    };
    // SAFETY: the program passes its QP.
    unsafe { add("ibv_wr_atomic_fetch_add", qp, WITH_ATOMIC_FETCH_AND_ADD, Ok(op)) }
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    let op = WrOp::LocalInv {
        rkey: invalidate_rkey,
    };
    // SAFETY: the program passes its QP.
    unsafe { add("ibv_wr_local_inv", qp, WITH_LOCAL_INV, Ok(op)) }
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    let op = WrOp::SendWithInv {
        rkey: invalidate_rkey,
    };
    // SAFETY: the program passes its QP.
    unsafe { add("ibv_wr_send_inv", qp, WITH_SEND_WITH_INV, Ok(op)) }
}

/// `ibv_wr_bind_mw`: binds the type 2 window `mw` with the new `rkey` as `info` says,
/// in the send queue's order (the window and region are looked up at `ibv_wr_complete`,
/// as providers read them when they build the WQE).
unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    let info = if info.is_null() {
        Err(libc::EINVAL)
    } else {
        // SAFETY: the program passes its `struct ibv_mw_bind_info`, copied now.
        Ok(unsafe { *info })
    };
    // SAFETY: the program passes its QP.
    unsafe { add("ibv_wr_bind_mw", qp, WITH_BIND_MW, info.map(|_| WrOp::BindMw)) };
    if let Ok(info) = info {
        let f = |_: &Qp, b: &mut Builder| {
            if let Some(w) = b.wrs.last_mut().filter(|w| w.op == WrOp::BindMw) {
                w.bind = Some((mw, rkey, info));
            }
        };
        // SAFETY: the program passes its QP.
        unsafe { with_builder("ibv_wr_bind_mw", qp, f) }
    }
}

/// The operations the sim does not have (TSO, atomic write, XRC): `ibv_wr_complete`
/// fails with EOPNOTSUPP.
unsafe extern "C" fn wr_unserved(qp: *mut ibv_qp_ex) {
    // SAFETY: the program passes its QP.
    unsafe { with_builder("ibv_wr_*", qp, |_, b| b.fail(libc::EOPNOTSUPP)) }
}

unsafe extern "C" fn wr_u32_unserved(qp: *mut ibv_qp_ex, _v: u32) {
    // SAFETY: the program passes its QP.
    unsafe { wr_unserved(qp) }
}

unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
    // SAFETY: the program passes its QP.
    unsafe { wr_unserved(qp) }
}

unsafe extern "C" fn wr_atomic_write(qp: *mut ibv_qp_ex, _rkey: u32, _addr: u64, _wr: *const c_void) {
    // SAFETY: the program passes its QP.
    unsafe { wr_unserved(qp) }
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    let f = |_: &Qp, b: &mut Builder| {
        if let Some(w) = b.last() {
            w.data = Data::Sges(vec![Sge::new(addr, length, lkey)]);
        }
    };
    // SAFETY: the program passes its QP.
    unsafe { with_builder("ibv_wr_set_sge", qp, f) }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    let sges = match n {
        0 => Ok(Vec::new()),
        _ if list.is_null() => Err(libc::EINVAL),
        // SAFETY: the program passes `n` SGEs.
        _ => Ok(unsafe { std::slice::from_raw_parts(list, n) }
            .iter()
            .map(|s| Sge::new(s.addr, s.length, s.lkey))
            .collect()),
    };
    let f = |_: &Qp, b: &mut Builder| match sges {
        Ok(sges) => {
            if let Some(w) = b.last() {
                w.data = Data::Sges(sges);
            }
        }
        Err(e) => b.fail(e),
    };
    // SAFETY: the program passes its QP.
    unsafe { with_builder("ibv_wr_set_sge_list", qp, f) }
}

/// Copies the program's inline buffers now.
///
/// # Safety
///
/// Each buffer must be readable for its length.
unsafe fn copy_inline(bufs: impl Iterator<Item = (*const u8, usize)>) -> Result<Vec<u8>, Errno> {
    let mut data = Vec::new();
    for (p, n) in bufs {
        match n {
            0 => {}
            _ if p.is_null() => return Err(libc::EINVAL),
            // SAFETY: the caller's contract; copied into our own buffer.
            _ => data.extend_from_slice(unsafe { std::slice::from_raw_parts(p, n) }),
        }
    }
    Ok(data)
}

fn set_inline(b: &mut Builder, data: Result<Vec<u8>, Errno>) {
    match data {
        Ok(data) => {
            if let Some(w) = b.last() {
                w.data = Data::Inline(data);
            }
        }
        Err(e) => b.fail(e),
    }
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: the program passes a buffer readable for `length` bytes.
    let data = unsafe { copy_inline(std::iter::once((addr.cast_const().cast::<u8>(), length))) };
    // SAFETY: the program passes its QP.
    unsafe { with_builder("ibv_wr_set_inline_data", qp, |_, b| set_inline(b, data)) }
}

unsafe extern "C" fn wr_set_inline_data_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_data_buf) {
    let data = match n {
        0 => Ok(Vec::new()),
        _ if list.is_null() => Err(libc::EINVAL),
        _ => {
            // SAFETY: the program passes `n` buffer descriptors.
            let bufs = unsafe { std::slice::from_raw_parts(list, n) };
            // SAFETY: each descriptor names a readable buffer.
            unsafe { copy_inline(bufs.iter().map(|d| (d.addr.cast_const().cast::<u8>(), d.length))) }
        }
    };
    // SAFETY: the program passes its QP.
    unsafe { with_builder("ibv_wr_set_inline_data_list", qp, |_, b| set_inline(b, data)) }
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32) {
    let f = |_: &Qp, b: &mut Builder| {
        if let Some(w) = b.last() {
            w.ud = Some((ah, remote_qpn, remote_qkey));
        }
    };
    // SAFETY: the program passes its QP.
    unsafe { with_builder("ibv_wr_set_ud_addr", qp, f) }
}

/// Posts the pending WRs.
fn complete(q: &Qp, b: Builder) -> Result<(), Errno> {
    if let Some(e) = b.error {
        return Err(e);
    }
    let ud = q.qp_type == 4;
    for round in b.wrs.chunks(POST_BATCH) {
        // Each inline WR's data as a list of one piece, for the sim to read.
        let mut pieces: ArrayVec<[&[u8]; 1], POST_BATCH> = ArrayVec::new();
        for w in round {
            pieces.push(match &w.data {
                Data::Inline(bytes) => [bytes.as_slice()],
                Data::Sges(_) => [&[]],
            });
        }
        let mut wrs: ArrayVec<SendWr<'_>, POST_BATCH> = ArrayVec::new();
        let mut inline: ArrayVec<Option<&[&[u8]]>, POST_BATCH> = ArrayVec::new();
        for (i, w) in round.iter().enumerate() {
            let mut flags = send_flags(w.flags)?;
            let sg_list: &[Sge] = match &w.data {
                Data::Sges(s) => s,
                Data::Inline(bytes) if bytes.is_empty() => &[],
                Data::Inline(_) => {
                    flags |= SendFlags::INLINE;
                    &[]
                }
            };
            inline.push(flags.contains(SendFlags::INLINE).then_some(&pieces[i][..]));
            let dest = match (ud, w.ud) {
                (true, Some((ah, remote_qpn, remote_qkey))) => {
                    // SAFETY: the program passes an address handle of this library.
                    let ah: &Ah = unsafe { live::get_fast::<Ah>(ah) }?;
                    Some(UdDest {
                        ah: &ah.sim as &dyn AddressHandle,
                        remote_qpn,
                        remote_qkey,
                    })
                }
                (true, None) => return Err(libc::EINVAL),
                (false, _) => None,
            };
            let bind = match &w.bind {
                // SAFETY: the program's window and region live until the post returns
                // (its `ibv_wr_bind_mw` contract).
                Some((mw, rkey, info)) => Some(unsafe { crate::mw::bind_wr(*mw, *rkey, info) }?),
                None => None,
            };
            wrs.push(SendWr {
                wr_id: w.wr_id,
                sg_list,
                op: w.op,
                send_flags: flags,
                ud: dest,
                bind,
            });
        }
        q.sim
            .post_send_with_inline(&wrs, &inline)
            .map_err(|e| refusal(q, &e.error))?;
    }
    Ok(())
}

/// The errno of `ibv_wr_complete` when the sim refused its WRs: EINVAL while the QP has
/// not reached RTS since its creation or last RESET, whatever the refusal, as providers
/// answer (mlx5's `wr_complete` is a function that fails with EINVAL until the QP is in
/// RTS, although its `ibv_post_send` answers ENOMEM; rxe's doorbell is refused with
/// EINVAL; IBA C10-22, C10-25, C10-29: an immediate error); else the sim's.
#[cold]
fn refusal(q: &Qp, e: &verbs_api::Error) -> Errno {
    let errno = errno_of("ibv_wr_complete", e);
    match q.sim.state() {
        Ok(QpState::Reset | QpState::Init | QpState::Rtr) => libc::EINVAL,
        _ => errno,
    }
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    value_verb("ibv_wr_complete", libc::EIO, || {
        // SAFETY: the program passes its QP.
        let Ok(q) = (unsafe { live::get_fast::<Qp>(qp) }) else {
            return libc::EINVAL;
        };
        let b = std::mem::take(&mut *q.builder.lock());
        match complete(q, b) {
            Ok(()) => 0,
            Err(e) => e,
        }
    })
}

/// A QP's C part: `base` followed by the builder interface.
pub fn qp_ex(base: ibv_qp) -> ibv_qp_ex {
    ibv_qp_ex {
        qp_base: base,
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
        wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
        wr_bind_mw: Some(wr_bind_mw),
        wr_local_inv: Some(wr_local_inv),
        wr_rdma_read: Some(wr_rdma_read),
        wr_rdma_write: Some(wr_rdma_write),
        wr_rdma_write_imm: Some(wr_rdma_write_imm),
        wr_send: Some(wr_send),
        wr_send_imm: Some(wr_send_imm),
        wr_send_inv: Some(wr_send_inv),
        wr_send_tso: Some(wr_send_tso),
        wr_set_ud_addr: Some(wr_set_ud_addr),
        wr_set_xrc_srqn: Some(wr_u32_unserved),
        wr_set_inline_data: Some(wr_set_inline_data),
        wr_set_inline_data_list: Some(wr_set_inline_data_list),
        wr_set_sge: Some(wr_set_sge),
        wr_set_sge_list: Some(wr_set_sge_list),
        wr_start: Some(wr_start),
        wr_complete: Some(wr_complete),
        wr_abort: Some(wr_abort),
        wr_atomic_write: Some(wr_atomic_write),
    }
}
