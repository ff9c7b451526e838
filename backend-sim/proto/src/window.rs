//! Memory windows (`man ibv_alloc_mw`, `man ibv_bind_mw`; IBA 10.6.7): what one window is
//! bound to, and the rules of binding and invalidating it. The device's
//! [`MrTable`](crate::memory::MrTable) keeps its windows beside its regions, looks a
//! window up by the upper 24 bits of its rkey (the index; the low 8 bits are the tag the
//! consumer rotates, `ibv_inc_rkey`) and runs remote accesses through a window in its one
//! access check.
//!
//! - A type 1 window is bound by a bind of the send queue (`ibv_bind_mw`) to any QP of
//!   its PD, rebound at will, unbound by a bind of length 0, and cannot be invalidated
//!   (o10-37.2.26: `IBV_WR_LOCAL_INV` and SEND_WITH_INV of one fail).
//! - A type 2 window (IBA's 2B) is bound by an `IBV_WR_BIND_MW` of a QP of its PD, only
//!   while it is not bound (o10-37.2.30), to a region and a non-zero length
//!   (o10-37.2.40); from then on only requests arriving on that QP may use it, until a
//!   local or remote invalidation frees it.
//! - Every bind needs a region with `MW_BIND` (C10-73), `LOCAL_WRITE` on the region for a
//!   window that grants remote writes or atomics (C10-74), and the window inside the
//!   region (C10-75); the bind names the window by the rkey it has now, and the window
//!   takes the new rkey's tag.
//!
//! rxe 6.1 checks each of those (rxe_mw.c `rxe_check_bind_mw()`), but not whose a window
//! is: a bind's region may belong to another PD, a type 1 window may be bound through a
//! QP of another PD, and an invalidation (local, or a peer's SEND_WITH_INV) looks at
//! neither the PD nor the QP of the window (`rxe_check_invalidate_mw()`). IBA checks
//! them; the profile decides ([`Switches::mw_owner_checks`](crate::switches::Switches)).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use verbs_api::{AccessFlags, MwType};

use crate::region::MrShared;

/// What a window is bound to.
#[derive(Clone)]
pub(crate) struct Binding {
    /// The region.
    pub mr: Arc<MrShared>,
    /// The window's first address.
    pub addr: u64,
    /// Its length (non-zero).
    pub len: u64,
    /// The rights it grants.
    pub access: AccessFlags,
    /// Type 2: the QP it is bound to, the only one that may use it.
    pub qpn: Option<u32>,
}

/// A window's state: its rkey now and what it is bound to.
pub(crate) struct WindowState {
    pub rkey: u32,
    pub bound: Option<Binding>,
}

/// One memory window of a device.
pub struct MwShared {
    /// Handle of the PD it belongs to.
    pub pd: u32,
    /// Its type.
    pub mw_type: MwType,
    /// Deallocated (`ibv_dealloc_mw`): binds naming it fail.
    dead: AtomicBool,
    pub(crate) state: Mutex<WindowState>,
}

impl std::fmt::Debug for MwShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MwShared({:?} of PD {} rkey {:#x})",
            self.mw_type,
            self.pd,
            self.rkey()
        )
    }
}

impl MwShared {
    pub(crate) fn new(pd: u32, mw_type: MwType, rkey: u32) -> Self {
        MwShared {
            pd,
            mw_type,
            dead: AtomicBool::new(false),
            state: Mutex::new(WindowState { rkey, bound: None }),
        }
    }

    /// Its rkey now.
    pub fn rkey(&self) -> u32 {
        self.state.lock().rkey
    }

    /// Whether it is bound to a region.
    pub fn is_bound(&self) -> bool {
        self.state.lock().bound.is_some()
    }

    /// The key of the region it is bound to, if any.
    pub fn bound_mr(&self) -> Option<u32> {
        self.state.lock().bound.as_ref().map(|b| b.mr.key)
    }

    pub(crate) fn kill(&self) {
        self.dead.store(true, Ordering::Release);
        self.state.lock().bound = None;
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }
}

/// A bind as the send queue executes it (`IBV_WR_BIND_MW`, resolved at post time).
#[derive(Clone, Debug)]
pub struct BindReq {
    /// The window.
    pub mw: Arc<MwShared>,
    /// The window's rkey as the poster named it (`mw->rkey` of the WR's window).
    pub mw_rkey: u32,
    /// The rkey it gets (its tag is taken).
    pub new_rkey: u32,
    /// The region's lkey (`bind_info.mr->lkey`), `None` without a region.
    pub mr_key: Option<u32>,
    /// The window's first address.
    pub addr: u64,
    /// Its length (0: unbind, type 1 only).
    pub len: u64,
    /// The rights it grants.
    pub access: AccessFlags,
}

/// The QP a bind or an invalidation executes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnQp {
    /// Its PD.
    pub pd: u32,
    /// Its number.
    pub qpn: u32,
}

/// Why a bind failed (`IBV_WC_MW_BIND_ERR`, the QP goes to ERR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// The window was deallocated, or its rkey is not the one the bind named.
    #[error("the window was deallocated or its rkey is not the one the bind named (mw->rkey is stale)")]
    StaleWindow,
    /// The region's lkey names no registered region.
    #[error("the bind's region is not registered (bad lkey)")]
    BadMr,
    /// A type 2 window that is bound already (o10-37.2.30).
    #[error("a type 2 window is bound already: invalidate it first")]
    AlreadyBound,
    /// A type 2 window bound with no region or length 0 (o10-37.2.40).
    #[error("a type 2 window cannot be bound to no region or length 0 (invalidate it instead)")]
    Type2Unbind,
    /// The window's PD is not the QP's (C10-72), or the region's PD is not the window's.
    #[error("the window, the region and the QP are not all of one PD")]
    WrongPd,
    /// The region was registered without `IBV_ACCESS_MW_BIND` (C10-73).
    #[error("the region was registered without IBV_ACCESS_MW_BIND")]
    NoMwBind,
    /// A window granting remote writes or atomics on a region without `LOCAL_WRITE`
    /// (C10-74).
    #[error("a window granting remote writes or atomics needs IBV_ACCESS_LOCAL_WRITE on its region")]
    NoLocalWrite,
    /// The window leaves the region (C10-75).
    #[error("the window leaves the region")]
    OutOfBounds,
}

/// Why an invalidation failed (`IBV_WR_LOCAL_INV`: `IBV_WC_LOC_QP_OP_ERR`; a
/// SEND_WITH_INV: the receive completes with `IBV_WC_REM_INV_REQ_ERR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidateError {
    /// The rkey names no window (a region's rkey cannot be invalidated on the sim, which
    /// has no fast-registration regions; rxe refuses a user region's too).
    #[error("the rkey names no memory window")]
    NotWindow,
    /// The rkey names a window whose rkey has another tag now.
    #[error("the rkey is not the window's rkey now (another tag)")]
    StaleKey,
    /// A type 1 window (o10-37.2.26).
    #[error("a type 1 window cannot be invalidated")]
    Type1,
    /// The window is not bound.
    #[error("the window is not bound")]
    NotBound,
    /// The window belongs to another PD than the QP, or (remote) is bound to another QP.
    #[error("the window belongs to another PD than the QP, or is bound to another QP")]
    NotOwner,
}

/// Binds `req.mw` as `req` asks, on QP `on`, with the region `mr` (looked up by
/// `req.mr_key`). `owner_checks`: check whose the window, the region and the QP are
/// ([`Switches::mw_owner_checks`](crate::switches::Switches)).
pub(crate) fn bind(
    req: &BindReq,
    mr: Option<Arc<MrShared>>,
    on: OnQp,
    owner_checks: bool,
) -> Result<(), BindError> {
    let mw = &req.mw;
    let mut st = mw.state.lock();
    if mw.is_dead() || st.rkey != req.mw_rkey {
        return Err(BindError::StaleWindow);
    }
    let mr = if req.len > 0 {
        Some(mr.filter(|m| !m.is_dead()).ok_or(BindError::BadMr)?)
    } else {
        None
    };
    if mw.mw_type == MwType::Type2 {
        if st.bound.is_some() {
            return Err(BindError::AlreadyBound);
        }
        if on.pd != mw.pd {
            return Err(BindError::WrongPd);
        }
        if mr.is_none() {
            return Err(BindError::Type2Unbind);
        }
    } else if owner_checks && on.pd != mw.pd {
        return Err(BindError::WrongPd);
    }
    if let Some(mr) = &mr {
        if owner_checks && mr.pd != mw.pd {
            return Err(BindError::WrongPd);
        }
        if !mr.access.contains(AccessFlags::MW_BIND) {
            return Err(BindError::NoMwBind);
        }
        if req
            .access
            .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !mr.access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(BindError::NoLocalWrite);
        }
        if mr.offset_of(req.addr, req.len).is_none() {
            return Err(BindError::OutOfBounds);
        }
    }
    st.rkey = (st.rkey & !0xff) | (req.new_rkey & 0xff);
    st.bound = mr.map(|mr| Binding {
        mr,
        addr: req.addr,
        len: req.len,
        access: req.access,
        qpn: (mw.mw_type == MwType::Type2).then_some(on.qpn),
    });
    Ok(())
}

/// Who invalidates a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalidator {
    /// `IBV_WR_LOCAL_INV` on this QP: the window must be of its PD.
    Local(OnQp),
    /// A peer's SEND_WITH_INV arriving on this QP: the window must be bound to it.
    Remote(OnQp),
}

/// Invalidates `mw` (found by `rkey`'s index) for `who`, or with `apply` false only checks
/// that it may. `owner_checks` as for [`bind`].
pub(crate) fn invalidate(
    mw: &MwShared,
    rkey: u32,
    who: Invalidator,
    owner_checks: bool,
    apply: bool,
) -> Result<(), InvalidateError> {
    let mut st = mw.state.lock();
    if mw.is_dead() || st.rkey != rkey {
        return Err(InvalidateError::StaleKey);
    }
    if mw.mw_type == MwType::Type1 {
        return Err(InvalidateError::Type1);
    }
    let Some(b) = &st.bound else {
        return Err(InvalidateError::NotBound);
    };
    if owner_checks {
        let mine = match who {
            Invalidator::Local(on) => on.pd == mw.pd,
            Invalidator::Remote(on) => on.pd == mw.pd && b.qpn == Some(on.qpn),
        };
        if !mine {
            return Err(InvalidateError::NotOwner);
        }
    }
    if apply {
        st.bound = None;
    }
    Ok(())
}
