//! Posting work requests: `ibv_post_send`, `ibv_post_recv` and `ibv_post_srq_recv`
//! (`man ibv_post_send`, `man ibv_post_recv`, `man ibv_post_srq_recv`).
//!
//! A slice of [`SendWr`] becomes a linked list of `struct ibv_send_wr` with their
//! `struct ibv_sge` arrays, built in stack buffers (up to [`STACK_WRS`] WRs and
//! [`STACK_SGES`] SGEs; longer lists use a heap buffer), so a post allocates nothing in
//! the common case. libibverbs' `bad_wr` is mapped back to the index of the WR.
//!
//! The commonest post, one WR with a few SGEs, takes a path of its own that builds the
//! one `ibv_send_wr` (or `ibv_recv_wr`) and its SGEs and calls the provider, nothing
//! else: the data path's cost over a C program that calls libibverbs directly is this
//! conversion (`examples/call_cost.rs` counts it).
//!
//! Receives go to a QP's receive queue or to an SRQ ([`RecvQueue`]): one code path, with
//! the provider call and the error's wording as the only differences.
//!
//! The checks done here, each because the provider would otherwise read memory it must
//! not:
//!
//! - An `IBV_SEND_INLINE` WR has its gather list copied by the provider at post time, from
//!   `addr`, without any lkey check, so every inline SGE must lie inside the registered
//!   region its lkey names (the context's span table, read-locked for the whole post so
//!   that no region is deregistered meanwhile).
//! - A send on a UD QP must name its destination (`wr.ud`), and only a UD QP may have one:
//!   a provider reads `wr.ud.ah` of every UD WR as its own address-handle structure (a
//!   missing one is a NULL dereference), and the `ud` of a connected QP's WR would be
//!   silently ignored. The address handle must be this backend's ([`IbvAh`]) and of the
//!   QP's device context.
//!
//! - A BIND_MW names its window and region by reference (`wr.bind_mw`); both must be
//!   this backend's ([`IbvMw`], [`IbvMr`]) and of the QP's device context, since the
//!   provider dereferences them. The windows a post binds are locked for the post (their
//!   `struct ibv_mw::rkey`, which the provider reads, takes the new rkey once it is
//!   posted: see [`crate::mw`]).
//!
//! A WR that fails a check is not posted: the WRs before it are, and the post fails with
//! EINVAL naming it.

use std::mem::MaybeUninit;
use std::os::raw::c_int;
use std::ptr::null_mut;

use std::any::{Any, TypeId};
use std::sync::Arc;

use rdma_sys::{atomic_t, bind_mw_t, imm_data_invalidated_rkey_union_t, rdma_t, ud_t, wr_t};
use rdma_sys::{
    ibv_ah, ibv_mr, ibv_mw_bind_info, ibv_post_recv, ibv_post_send, ibv_recv_wr, ibv_send_wr, ibv_sge,
};
use verbs_api::{
    AddressHandle, BindMw, Error, PostError, QpState, QpType, QueueKind, QueuePair, RecvWr, SendFlags,
    SendWr, Sge, UdDest, WrOp,
};

use rustc_hash::FxHashMap;

use crate::ah::IbvAh;
use crate::async_events::MrSpan;
use crate::context::CtxInner;
use crate::errno::rc_errno;
use crate::mr::IbvMr;
use crate::mw::IbvMw;
use crate::qp::IbvQp;

mod recv;
pub(crate) use recv::{post_recv, RecvQueue};

/// WRs per post built on the stack.
pub(crate) const STACK_WRS: usize = 16;
/// SGEs per post built on the stack.
pub(crate) const STACK_SGES: usize = 32;

/// Runs `f` on an uninitialized buffer of `n` elements: on the stack if `n <= N`.
fn with_scratch<T, const N: usize, R>(n: usize, f: impl FnOnce(&mut [MaybeUninit<T>]) -> R) -> R {
    if n <= N {
        let mut buf: [MaybeUninit<T>; N] = [const { MaybeUninit::uninit() }; N];
        f(&mut buf[..n])
    } else {
        let mut v: Vec<MaybeUninit<T>> = Vec::with_capacity(n);
        v.resize_with(n, MaybeUninit::uninit);
        f(&mut v)
    }
}

fn sge_to_raw(s: &Sge) -> ibv_sge {
    ibv_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

/// One `struct ibv_send_wr` for `wr`, pointing at `sg_list` (`num_sge` entries) and
/// `next`. Immediate data goes out in network byte order. A UD destination is added by
/// [`set_ud`].
pub(crate) fn send_wr_to_raw(
    wr: &SendWr<'_>,
    sg_list: *mut ibv_sge,
    num_sge: c_int,
    next: *mut ibv_send_wr,
) -> ibv_send_wr {
    // SAFETY: all-zero is a valid ibv_send_wr (integers, raw pointers, unions of them).
    let mut r: ibv_send_wr = unsafe { std::mem::zeroed() };
    r.wr_id = wr.wr_id;
    r.next = next;
    r.sg_list = sg_list;
    r.num_sge = num_sge;
    r.opcode = wr.op.opcode() as u32;
    r.send_flags = wr.send_flags.bits();
    if let Some(imm) = wr.op.imm_data() {
        r.imm_data_invalidated_rkey_union = imm_data_invalidated_rkey_union_t {
            imm_data: imm.to_be(),
        };
    }
    if let Some(rkey) = wr.op.invalidate_rkey() {
        r.imm_data_invalidated_rkey_union = imm_data_invalidated_rkey_union_t {
            invalidated_rkey: rkey,
        };
    }
    match wr.op {
        WrOp::Send
        | WrOp::SendWithImm { .. }
        | WrOp::SendWithInv { .. }
        | WrOp::LocalInv { .. }
        | WrOp::BindMw => {}
        WrOp::RdmaWrite { remote } | WrOp::RdmaWriteWithImm { remote, .. } | WrOp::RdmaRead { remote } => {
            r.wr = wr_t {
                rdma: rdma_t {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                },
            };
        }
        WrOp::AtomicCmpAndSwp {
            remote,
            compare,
            swap,
        } => {
            r.wr = wr_t {
                atomic: atomic_t {
                    remote_addr: remote.addr,
                    compare_add: compare,
                    swap,
                    rkey: remote.rkey,
                },
            };
        }
        WrOp::AtomicFetchAndAdd { remote, add } => {
            r.wr = wr_t {
                atomic: atomic_t {
                    remote_addr: remote.addr,
                    compare_add: add,
                    swap: 0,
                    rkey: remote.rkey,
                },
            };
        }
    }
    r
}

/// Writes `wr`'s UD destination into `r.wr.ud`, with `ah` (resolved by [`ud_ah`]) as the
/// address handle. A UD QP reads `wr.ud` whatever the opcode (only SEND and SEND_WITH_IMM
/// are valid on UD; the provider reports any other), so the destination takes the union.
#[inline]
pub(crate) fn set_ud(r: &mut ibv_send_wr, wr: &SendWr<'_>, ah: *mut ibv_ah) {
    if let Some(ud) = wr.ud {
        r.wr = wr_t {
            ud: ud_t {
                ah,
                remote_qpn: ud.remote_qpn,
                remote_qkey: ud.remote_qkey,
            },
        };
    }
}

/// The window and region of a BIND_MW, checked (see the module docs): both this
/// backend's and of the context `ctx`.
fn bind_objects<'a>(b: &BindMw<'a>, ctx: *const CtxInner) -> Result<(&'a IbvMw, *mut ibv_mr), Error> {
    let mw =
        b.mw.downcast_ref::<IbvMw>()
            .filter(|m| std::ptr::eq(Arc::as_ptr(&m.pd.ctx), ctx))
            .ok_or_else(|| {
                Error::invalid(
                    "ibv_post_send",
                    "wr.bind_mw.mw is not a memory window of this context",
                )
            })?;
    let mr = match b.bind_info.mr {
        None => null_mut(),
        Some(m) => m
            .downcast_ref::<IbvMr>()
            .filter(|m| std::ptr::eq(Arc::as_ptr(&m.pd.ctx), ctx))
            .ok_or_else(|| {
                Error::invalid(
                    "ibv_post_send",
                    "wr.bind_mw.bind_info.mr is not a memory region of this context",
                )
            })?
            .as_raw(),
    };
    Ok((mw, mr))
}

/// Writes a BIND_MW's window and binding into `r.bind_mw` (checked by [`bind_objects`]).
fn set_bind(r: &mut ibv_send_wr, b: &BindMw<'_>, ctx: *const CtxInner) {
    if let Ok((mw, mr)) = bind_objects(b, ctx) {
        r.bind_mw_tso_union.bind_mw = bind_mw_t {
            mw: mw.as_raw(),
            rkey: b.rkey,
            bind_info: ibv_mw_bind_info {
                mr,
                addr: b.bind_info.addr,
                length: b.bind_info.length,
                mw_access_flags: b.bind_info.mw_access_flags.bits(),
            },
        };
    }
}

/// The address handle of a UD destination, if it is one of this backend's: the same test
/// as `<dyn Any>::downcast_ref`, spelled out for the `AddressHandle` object.
#[inline]
fn as_ibv_ah(ah: &dyn AddressHandle) -> Option<&IbvAh> {
    if <dyn AddressHandle as Any>::type_id(ah) == TypeId::of::<IbvAh>() {
        // SAFETY: the object's concrete type is IbvAh (checked just above), so the data
        // pointer of the trait object points to a live IbvAh for as long as `ah` is borrowed.
        Some(unsafe { &*(ah as *const dyn AddressHandle as *const IbvAh) })
    } else {
        None
    }
}

/// The `wr.ud.ah` to post `wr` on `qp` with (see [`ud_ah_for`]).
#[inline]
fn ud_ah(qp: &IbvQp, wr: &SendWr<'_>) -> Result<*mut ibv_ah, Error> {
    ud_ah_for(qp.qp_num, qp.qp_type, Arc::as_ptr(&qp.pd.ctx), wr)
}

/// The `wr.ud.ah` to post `wr` with on QP `qp_num` of type `qp_type` of the context `ctx`:
/// NULL for a connected QP's WR without a destination; the handle's pointer for a UD WR
/// whose handle is this backend's and of that context; otherwise why not (EINVAL).
#[inline]
fn ud_ah_for(
    qp_num: u32,
    qp_type: QpType,
    ctx: *const CtxInner,
    wr: &SendWr<'_>,
) -> Result<*mut ibv_ah, Error> {
    match (&wr.ud, qp_type == QpType::Ud) {
        (None, false) => Ok(null_mut()),
        (Some(ud), true) => match as_ibv_ah(ud.ah) {
            Some(ah) if std::ptr::eq(Arc::as_ptr(&ah.pd.ctx), ctx) => Ok(ah.raw),
            found => Err(foreign_ah(ud, found.is_some())),
        },
        (None, true) => Err(ud_missing(qp_num)),
        (Some(_), false) => Err(ud_on_connected(qp_num, qp_type)),
    }
}

#[cold]
#[inline(never)]
fn foreign_ah(ud: &UdDest<'_>, ibverbs: bool) -> Error {
    Error::invalid(
        "ibv_post_send",
        if ibverbs {
            format!(
                "the address handle ({:?}) belongs to another device context than the QP",
                ud.ah.attr()
            )
        } else {
            "the address handle was not created by the ibverbs backend".into()
        },
    )
}

#[cold]
#[inline(never)]
fn ud_missing(qp_num: u32) -> Error {
    Error::invalid(
        "ibv_post_send",
        format!(
            "QP {qp_num:#x} is UD: a send needs its destination (SendWr::ud: address handle, remote QPN, \
             Q_Key)"
        ),
    )
}

#[cold]
#[inline(never)]
fn ud_on_connected(qp_num: u32, qp_type: QpType) -> Error {
    Error::invalid(
        "ibv_post_send",
        format!(
            "QP {qp_num:#x} is {qp_type:?}: only UD sends take a destination (SendWr::ud); a connected QP \
             sends to the peer it was connected to"
        ),
    )
}

/// The first WR that must not reach the provider, and why: a UD destination missing, out
/// of place or not this backend's ([`ud_ah`]), an inline SGE outside the region its lkey
/// names (`spans` is `None` when no WR is inline), or a gather list longer than `int`.
fn first_unpostable(
    wrs: &[SendWr<'_>],
    spans: Option<&FxHashMap<u32, MrSpan>>,
    ctx: *const CtxInner,
    ud_ah: impl Fn(&SendWr<'_>) -> Result<*mut ibv_ah, Error>,
) -> Option<(usize, Error)> {
    for (i, wr) in wrs.iter().enumerate() {
        if let Err(e) = ud_ah(wr) {
            return Some((i, e));
        }
        match (wr.op, &wr.bind) {
            (WrOp::BindMw, Some(b)) => {
                if let Err(e) = bind_objects(b, ctx) {
                    return Some((i, e));
                }
            }
            (WrOp::BindMw, None) | (_, Some(_)) => {
                return Some((
                    i,
                    Error::invalid(
                        "ibv_post_send",
                        "IBV_WR_BIND_MW needs its window and binding (wr.bind_mw), and only it",
                    ),
                ))
            }
            _ => {}
        }
        if c_int::try_from(wr.sg_list.len()).is_err() {
            return Some((
                i,
                Error::invalid(
                    "ibv_post_send",
                    format!("{} SGEs exceed INT_MAX", wr.sg_list.len()),
                ),
            ));
        }
        if !wr.send_flags.contains(SendFlags::INLINE) {
            continue;
        }
        let Some(spans) = spans else { continue };
        if let Some(e) = inline_outside(wr, spans) {
            return Some((i, e));
        }
    }
    None
}

/// Why an inline WR must not reach the provider: one of its SGEs is not inside the
/// region its lkey names.
#[inline]
fn inline_outside(wr: &SendWr<'_>, spans: &FxHashMap<u32, MrSpan>) -> Option<Error> {
    let j = wr.sg_list.iter().position(|s| {
        !spans
            .get(&s.lkey)
            .is_some_and(|span| span.contains(s.addr, s.length as u64))
    })?;
    Some(inline_error(j, &wr.sg_list[j]))
}

#[cold]
#[inline(never)]
fn inline_error(j: usize, s: &Sge) -> Error {
    Error::invalid(
        "ibv_post_send",
        format!(
            "inline SGE #{j} (addr {:#x}, length {}, lkey {:#x}) is not inside a memory region of this \
             context registered with that lkey",
            s.addr, s.length, s.lkey
        ),
    )
}

/// Index of `bad` in the array at `base` (0 if the provider left it NULL or foreign).
fn bad_index<T>(base: *const T, bad: *const T, len: usize) -> usize {
    let size = std::mem::size_of::<T>();
    let (b, x) = (base as usize, bad as usize);
    if bad.is_null() || x < b || size == 0 {
        return 0;
    }
    ((x - b) / size).min(len.saturating_sub(1))
}

/// Explains a failed post: ENOMEM is a full queue; EINVAL in a state that refuses the
/// post names the state; anything else is passed on.
#[cold]
#[inline(never)]
fn post_error(qp: &IbvQp, kind: QueueKind, errno: i32, index: usize, wr_id: u64) -> PostError {
    let call = match kind {
        QueueKind::Send => "ibv_post_send",
        QueueKind::Recv => "ibv_post_recv",
    };
    let error = match errno {
        libc::ENOMEM => {
            // What the queue really holds: some providers write back only the sizes asked
            // for at create time, and report the rounded-up ones in ibv_query_qp.
            let cap = QueuePair::query(qp).map_or(qp.cap, |a| a.cap);
            Error::QueueFull {
                queue: kind,
                qpn: qp.qp_num,
                capacity: match kind {
                    QueueKind::Send => cap.max_send_wr,
                    QueueKind::Recv => cap.max_recv_wr,
                },
            }
        }
        libc::EINVAL => {
            let state = qp.state().ok();
            match (kind, state) {
                (QueueKind::Send, Some(s @ (QpState::Reset | QpState::Init | QpState::Rtr))) => {
                    Error::InvalidQpState {
                        call,
                        qpn: qp.qp_num,
                        state: s,
                        reason: "sends need RTS",
                    }
                }
                (QueueKind::Recv, Some(s @ QpState::Reset)) => Error::InvalidQpState {
                    call,
                    qpn: qp.qp_num,
                    state: s,
                    reason: "receives need INIT or later",
                },
                _ => Error::invalid(
                    call,
                    format!(
                        "the provider refused WR #{index} (EINVAL): too many SGEs (max {}), inline \
                         data above max_inline_data ({}), or an opcode this QP does not support",
                        match kind {
                            QueueKind::Send => qp.cap.max_send_sge,
                            QueueKind::Recv => qp.cap.max_recv_sge,
                        },
                        qp.cap.max_inline_data
                    ),
                ),
            }
        }
        e => Error::from_errno(call, e),
    };
    PostError { index, wr_id, error }
}

/// SGEs of a lone WR that the fast path takes.
const ONE_WR_SGES: usize = 4;

/// `ibv_post_send` for `wrs` (see the module docs).
#[inline]
pub(crate) fn post_send(qp: &IbvQp, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
    // The common case, one WR with a few SGEs, skips the list's machinery.
    if let [wr] = wrs {
        if wr.sg_list.len() <= ONE_WR_SGES && wr.bind.is_none() && wr.op != WrOp::BindMw {
            return post_one_send(qp, wr);
        }
    }
    post_send_list(qp, wrs)
}

/// One WR of at most [`ONE_WR_SGES`] SGEs: checked if inline, built on the stack and
/// posted.
#[inline(always)]
fn post_one_send(qp: &IbvQp, wr: &SendWr<'_>) -> Result<(), PostError> {
    // One test keeps connected QPs' WRs off the UD path (which checks the destination).
    if wr.ud.is_some() || qp.qp_type == QpType::Ud {
        return post_one_send_ud(qp, wr);
    }
    post_one_send_to(qp, wr, null_mut())
}

/// [`post_one_send`] of a WR that has a destination or is on a UD QP: the destination is
/// checked ([`ud_ah`]) before the WR is built.
#[inline(never)]
fn post_one_send_ud(qp: &IbvQp, wr: &SendWr<'_>) -> Result<(), PostError> {
    match ud_ah(qp, wr) {
        Ok(ah) => post_one_send_to(qp, wr, ah),
        Err(error) => Err(PostError {
            index: 0,
            wr_id: wr.wr_id,
            error,
        }),
    }
}

/// Builds and posts one WR; `ah` is its checked address handle (NULL: not UD).
#[inline(always)]
fn post_one_send_to(qp: &IbvQp, wr: &SendWr<'_>, ah: *mut ibv_ah) -> Result<(), PostError> {
    // Held until the provider has copied the inline data.
    let spans = if wr.send_flags.contains(SendFlags::INLINE) {
        let spans = qp.pd.ctx.registry.mrs.read();
        if let Some(error) = inline_outside(wr, &spans) {
            return Err(PostError {
                index: 0,
                wr_id: wr.wr_id,
                error,
            });
        }
        Some(spans)
    } else {
        None
    };
    let mut sges = [const { MaybeUninit::<ibv_sge>::uninit() }; ONE_WR_SGES];
    for (d, s) in sges.iter_mut().zip(wr.sg_list) {
        d.write(sge_to_raw(s));
    }
    let sg_list = if wr.sg_list.is_empty() {
        null_mut()
    } else {
        sges.as_mut_ptr().cast::<ibv_sge>()
    };
    // fits: at most ONE_WR_SGES
    let mut raw = send_wr_to_raw(wr, sg_list, wr.sg_list.len() as c_int, null_mut());
    if !ah.is_null() {
        set_ud(&mut raw, wr, ah);
    }
    let mut bad: *mut ibv_send_wr = null_mut();
    // SAFETY: the QP is live; `raw` is a fully initialized WR whose `num_sge` SGEs are
    // initialized in `sges`; both outlive the call. SGE addresses are checked by the HCA
    // through the lkey when the WR executes, except for inline ones, which were checked
    // above against live regions that the held span lock keeps registered. A UD WR's
    // address handle is a live one of this context (`ud_ah`; borrowed by `wr`).
    let rc = unsafe { ibv_post_send(qp.raw, &mut raw, &mut bad) };
    drop(spans);
    if rc == 0 {
        return Ok(());
    }
    Err(post_error(qp, QueueKind::Send, rc_errno(rc), 0, wr.wr_id))
}

/// `ibv_post_send` for a list, or a WR that is inline or has many SGEs.
#[inline(never)]
fn post_send_list(qp: &IbvQp, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
    if wrs.is_empty() {
        return Ok(());
    }
    let any_inline = wrs.iter().any(|w| w.send_flags.contains(SendFlags::INLINE));
    // Held until the provider has copied the inline data.
    let spans = any_inline.then(|| qp.pd.ctx.registry.mrs.read());
    let ctx = Arc::as_ptr(&qp.pd.ctx);
    let refused = first_unpostable(wrs, spans.as_deref(), ctx, |wr| ud_ah(qp, wr));
    let postable = refused.as_ref().map_or(wrs.len(), |(i, _)| *i);
    if postable > 0 {
        // The windows bound, each locked once, in address order, for the post and the
        // update of their rkeys.
        let mut windows: Vec<&IbvMw> = wrs[..postable]
            .iter()
            .filter_map(|w| w.bind.as_ref())
            .filter_map(|b| bind_objects(b, ctx).ok())
            .map(|(mw, _)| mw)
            .collect();
        windows.sort_by_key(|m| *m as *const IbvMw);
        windows.dedup_by_key(|m| *m as *const IbvMw);
        let guards: Vec<_> = windows.iter().map(|m| m.lock()).collect();
        let posted = post_send_checked(qp, &wrs[..postable]);
        let done = posted.as_ref().err().map_or(postable, |e| e.index);
        for b in wrs[..done].iter().filter_map(|w| w.bind.as_ref()) {
            if let Ok((mw, _)) = bind_objects(b, ctx) {
                mw.bound(b);
            }
        }
        drop(guards);
        posted?;
    }
    drop(spans);
    match refused {
        None => Ok(()),
        Some((index, error)) => Err(PostError {
            index,
            wr_id: wrs[index].wr_id,
            error,
        }),
    }
}

/// Builds the linked list and calls `ibv_post_send`. `wrs` passed `first_unpostable`.
fn post_send_checked(qp: &IbvQp, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
    let nsge: usize = wrs.iter().map(|w| w.sg_list.len()).sum();
    with_scratch::<ibv_sge, STACK_SGES, _>(nsge, |sges| {
        with_scratch::<ibv_send_wr, STACK_WRS, _>(wrs.len(), |raw_wrs| {
            let sge_base = sges.as_mut_ptr().cast::<ibv_sge>();
            let wr_base = raw_wrs.as_mut_ptr().cast::<ibv_send_wr>();
            let mut off = 0;
            for (i, wr) in wrs.iter().enumerate() {
                for (j, s) in wr.sg_list.iter().enumerate() {
                    // SAFETY: off + j < nsge, the length of `sges`.
                    unsafe { sge_base.add(off + j).write(sge_to_raw(s)) };
                }
                let sg_list = if wr.sg_list.is_empty() {
                    null_mut()
                } else {
                    // SAFETY: off < nsge (this WR has at least one SGE there).
                    unsafe { sge_base.add(off) }
                };
                let next = if i + 1 < wrs.len() {
                    // SAFETY: i + 1 < wrs.len(), the length of `raw_wrs`.
                    unsafe { wr_base.add(i + 1) }
                } else {
                    null_mut()
                };
                // fits: checked by first_unpostable
                let num_sge = wr.sg_list.len() as c_int;
                let mut raw = send_wr_to_raw(wr, sg_list, num_sge, next);
                if wr.ud.is_some() {
                    // resolves: checked by first_unpostable
                    set_ud(&mut raw, wr, ud_ah(qp, wr).unwrap_or(null_mut()));
                }
                if let Some(b) = &wr.bind {
                    // resolves: checked by first_unpostable
                    set_bind(&mut raw, b, Arc::as_ptr(&qp.pd.ctx));
                }
                // SAFETY: i < wrs.len(), the length of `raw_wrs`.
                unsafe { wr_base.add(i).write(raw) };
                off += wr.sg_list.len();
            }
            let mut bad: *mut ibv_send_wr = null_mut();
            // SAFETY: the QP is live; `wr_base` heads a NULL-terminated list of fully
            // initialized WRs whose SGE arrays live in `sges`, both outliving the call.
            // SGE addresses are checked by the HCA through the lkey when the WR executes,
            // except for inline ones, which `first_unpostable` checked against live
            // regions that the held span lock keeps registered. UD WRs carry live address
            // handles of this context (`first_unpostable`; borrowed by `wrs`).
            let rc = unsafe { ibv_post_send(qp.raw, wr_base, &mut bad) };
            if rc == 0 {
                return Ok(());
            }
            let index = bad_index(wr_base, bad, wrs.len());
            Err(post_error(
                qp,
                QueueKind::Send,
                rc_errno(rc),
                index,
                wrs[index].wr_id,
            ))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_sys::ibv_send_flags as F;
    use rdma_sys::ibv_wr_opcode as O;
    use verbs_api::{RemoteAddr, WrOpcode};

    #[test]
    fn opcode_and_flag_values_match_verbs_h() {
        for (ours, theirs) in [
            (WrOpcode::RdmaWrite, O::IBV_WR_RDMA_WRITE),
            (WrOpcode::RdmaWriteWithImm, O::IBV_WR_RDMA_WRITE_WITH_IMM),
            (WrOpcode::Send, O::IBV_WR_SEND),
            (WrOpcode::SendWithImm, O::IBV_WR_SEND_WITH_IMM),
            (WrOpcode::RdmaRead, O::IBV_WR_RDMA_READ),
            (WrOpcode::AtomicCmpAndSwp, O::IBV_WR_ATOMIC_CMP_AND_SWP),
            (WrOpcode::AtomicFetchAndAdd, O::IBV_WR_ATOMIC_FETCH_AND_ADD),
        ] {
            assert_eq!(ours as u32, theirs);
        }
        assert_eq!(SendFlags::FENCE.bits(), F::IBV_SEND_FENCE.0);
        assert_eq!(SendFlags::SIGNALED.bits(), F::IBV_SEND_SIGNALED.0);
        assert_eq!(SendFlags::SOLICITED.bits(), F::IBV_SEND_SOLICITED.0);
        assert_eq!(SendFlags::INLINE.bits(), F::IBV_SEND_INLINE.0);
    }

    #[test]
    fn send_with_imm_goes_out_big_endian() {
        let sge = [Sge::new(0x1000, 8, 5)];
        let wr = SendWr::send_with_imm(9, &sge, 0x0102_0304).signaled().solicited();
        let r = send_wr_to_raw(&wr, null_mut(), 1, null_mut());
        assert_eq!(r.wr_id, 9);
        assert_eq!(r.opcode, O::IBV_WR_SEND_WITH_IMM);
        assert_eq!(r.send_flags, F::IBV_SEND_SIGNALED.0 | F::IBV_SEND_SOLICITED.0);
        assert_eq!(r.num_sge, 1);
        // SAFETY: reading the u32 union variant that was written.
        let imm = unsafe { r.imm_data_invalidated_rkey_union.imm_data };
        assert_eq!(imm.to_ne_bytes(), [1, 2, 3, 4]);
    }

    #[test]
    fn rdma_and_atomic_fields() {
        let remote = RemoteAddr::new(0xdead_0000, 0x77);
        let r = send_wr_to_raw(
            &SendWr::write_with_imm(1, &[], remote, 5),
            null_mut(),
            0,
            null_mut(),
        );
        assert_eq!(r.opcode, O::IBV_WR_RDMA_WRITE_WITH_IMM);
        // SAFETY: reading the variant that was written.
        let (addr, rkey) = unsafe { (r.wr.rdma.remote_addr, r.wr.rdma.rkey) };
        assert_eq!((addr, rkey), (0xdead_0000, 0x77));

        let r = send_wr_to_raw(&SendWr::read(2, &[], remote), null_mut(), 0, null_mut());
        assert_eq!(r.opcode, O::IBV_WR_RDMA_READ);
        // SAFETY: as above.
        assert_eq!(unsafe { r.wr.rdma.remote_addr }, 0xdead_0000);

        let r = send_wr_to_raw(
            &SendWr::cmp_and_swp(3, &[], remote, 10, 20),
            null_mut(),
            0,
            null_mut(),
        );
        assert_eq!(r.opcode, O::IBV_WR_ATOMIC_CMP_AND_SWP);
        // SAFETY: as above.
        let a = unsafe { r.wr.atomic };
        assert_eq!(
            (a.remote_addr, a.compare_add, a.swap, a.rkey),
            (0xdead_0000, 10, 20, 0x77)
        );

        let r = send_wr_to_raw(
            &SendWr::fetch_and_add(4, &[], remote, 3),
            null_mut(),
            0,
            null_mut(),
        );
        assert_eq!(r.opcode, O::IBV_WR_ATOMIC_FETCH_AND_ADD);
        // SAFETY: as above.
        let a = unsafe { r.wr.atomic };
        assert_eq!((a.compare_add, a.rkey), (3, 0x77));
    }

    #[test]
    fn inline_sges_must_lie_in_their_region() {
        let mut spans = FxHashMap::default();
        spans.insert(
            5,
            MrSpan {
                addr: 0x1000,
                len: 64,
            },
        );
        let good = [Sge::new(0x1000, 64, 5)];
        let outside = [Sge::new(0x1020, 64, 5)];
        let wrong_key = [Sge::new(0x1000, 8, 6)];
        let wrs = [
            SendWr::send(0, &good).inline(),
            SendWr::send(1, &outside), // not inline: the HCA checks it
            SendWr::send(2, &wrong_key).inline(),
        ];
        let (i, e) = first_unpostable(&wrs, Some(&spans), null_mut(), |_| Ok(null_mut())).unwrap();
        assert_eq!(i, 2);
        assert!(e.to_string().contains("inline SGE #0"), "{e}");
        assert_eq!(e.errno(), libc::EINVAL);
        let wrs = [
            SendWr::send(0, &good).inline(),
            SendWr::send(1, &outside).inline(),
        ];
        assert_eq!(
            first_unpostable(&wrs, Some(&spans), null_mut(), |_| Ok(null_mut()))
                .unwrap()
                .0,
            1
        );
        assert!(first_unpostable(&wrs[..1], Some(&spans), null_mut(), |_| Ok(null_mut())).is_none());
    }

    /// An address handle of another backend.
    struct OtherAh;

    impl AddressHandle for OtherAh {
        fn attr(&self) -> verbs_api::AhAttr {
            verbs_api::AhAttr::default()
        }
    }

    #[test]
    fn ud_destinations_go_with_ud_qps_only() {
        // Never dereferenced: only compared with an IbvAh's context.
        let ctx = std::ptr::NonNull::<CtxInner>::dangling().as_ptr().cast_const();
        let sge = [Sge::new(0x1000, 8, 5)];
        let plain = SendWr::send(1, &sge);
        assert_eq!(ud_ah_for(7, QpType::Rc, ctx, &plain).unwrap(), null_mut());
        assert_eq!(ud_ah_for(7, QpType::Uc, ctx, &plain).unwrap(), null_mut());
        let e = ud_ah_for(7, QpType::Ud, ctx, &plain).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        assert!(e.to_string().contains("needs its destination"), "{e}");
        let other = OtherAh;
        let to_other = SendWr::send(2, &sge).ud(&other, 0x42, 0x1111);
        let e = ud_ah_for(7, QpType::Rc, ctx, &to_other).unwrap_err();
        assert!(e.to_string().contains("only UD sends take a destination"), "{e}");
        let e = ud_ah_for(7, QpType::Ud, ctx, &to_other).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        assert!(
            e.to_string().contains("not created by the ibverbs backend"),
            "{e}"
        );
        assert!(as_ibv_ah(&other).is_none());
        // A list stops at the first WR that breaks the rule.
        let wrs = [plain, to_other, plain];
        let (i, _) =
            first_unpostable(&wrs, None, null_mut(), |wr| ud_ah_for(7, QpType::Rc, ctx, wr)).unwrap();
        assert_eq!(i, 1);
    }

    #[test]
    fn the_ud_destination_fills_wr_ud() {
        let other = OtherAh;
        let sge = [Sge::new(0x1000, 8, 5)];
        let wr = SendWr::send_with_imm(3, &sge, 9).ud(&other, 0x42, 0x1111_1111);
        let ah = std::ptr::NonNull::<ibv_ah>::dangling().as_ptr();
        let mut r = send_wr_to_raw(&wr, null_mut(), 1, null_mut());
        set_ud(&mut r, &wr, ah);
        // SAFETY: reading the variant that was written.
        let ud = unsafe { r.wr.ud };
        assert_eq!((ud.ah, ud.remote_qpn, ud.remote_qkey), (ah, 0x42, 0x1111_1111));
        assert_eq!(r.opcode, O::IBV_WR_SEND_WITH_IMM);
    }

    #[test]
    fn bad_wr_maps_to_its_index() {
        let a = [0u64; 4];
        let base = a.as_ptr();
        assert_eq!(bad_index(base, base.wrapping_add(2), 4), 2);
        assert_eq!(bad_index(base, std::ptr::null(), 4), 0);
        assert_eq!(bad_index(base, base.wrapping_add(9), 4), 3);
    }

    #[test]
    fn scratch_buffers_switch_to_the_heap() {
        assert_eq!(with_scratch::<u64, 4, _>(3, |b| b.len()), 3);
        assert_eq!(with_scratch::<u64, 4, _>(100, |b| b.len()), 100);
        assert_eq!(with_scratch::<u64, 4, _>(0, |b| b.len()), 0);
    }
}
