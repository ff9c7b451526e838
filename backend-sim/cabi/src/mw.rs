//! Memory windows (`man ibv_alloc_mw`, `man ibv_bind_mw`): `ops.alloc_mw`,
//! `ops.dealloc_mw` and `ops.bind_mw`, which the header's inline functions call, and what
//! a `IBV_WR_BIND_MW` of `ibv_post_send` or `ibv_wr_bind_mw` names (the window, the
//! region and their checks).
//!
//! The program's `struct ibv_mw` holds the window's rkey as the program knows it: a bind
//! names the window by it (rxe's and mlx5's providers pass `mw->rkey` to the device, which
//! refuses a stale one), so the sim's window handle takes it before every post. A type 1
//! bind (`ibv_bind_mw`) writes the new rkey there, as the providers do; a type 2 bind
//! leaves it to the program (the new rkey is the WR's `bind_mw.rkey`).

use std::cell::UnsafeCell;
use std::ffi::c_int;

use verbs_api::{
    AccessFlags, BindMw, MemoryRegion, MemoryWindow, MwBind, MwBindInfo, MwOf, MwType, ProtectionDomain,
    QueuePair,
};

use crate::abi::{ibv_mw, ibv_mw_bind, ibv_mw_bind_info, ibv_pd, ibv_qp};
use crate::ffi::{errno_of, errno_verb, ptr_verb, Errno};
use crate::live::{self, Kind, Object};
use crate::mr::Mr;
use crate::pd::{next_handle, Pd};
use crate::post::send_flags;
use crate::qp::Qp;
use crate::runtime::B;

/// `IBV_ACCESS_ZERO_BASED`: the sim's windows are addressed by virtual address only.
const ZERO_BASED: u32 = 1 << 5;

/// A memory window.
#[repr(C)]
pub struct Mw {
    /// What programs see, shared with them.
    pub c: UnsafeCell<ibv_mw>,
    /// The sim's window.
    pub sim: MwOf<B>,
    pd: *const Pd,
}

// SAFETY: `#[repr(C)]` with the `ibv_mw` first.
unsafe impl Object for Mw {
    const KIND: Kind = Kind::Mw;
    type C = ibv_mw;
}

impl Drop for Mw {
    fn drop(&mut self) {
        // SAFETY: the window holds a count on its PD.
        unsafe { &*self.pd }.release();
    }
}

impl Mw {
    /// The sim's window, holding the rkey the program's `struct ibv_mw` says (read now:
    /// the program may have written it).
    pub fn synced(&self) -> &MwOf<B> {
        // SAFETY: the C part lives as long as the window; `rkey` is a plain field the
        // program writes only between its own calls.
        let rkey = unsafe { (*self.c.get()).rkey };
        self.sim.set_rkey(rkey);
        &self.sim
    }
}

/// `ops.alloc_mw` (what the inline `ibv_alloc_mw` calls): a window of type 1 or 2, NULL
/// with errno EINVAL for another type, EOPNOTSUPP where the profile has none.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: u32) -> *mut ibv_mw {
    ptr_verb("ibv_alloc_mw", || {
        // SAFETY: used within this call; the window then holds a count.
        let p = unsafe { live::get::<Pd>(pd) }?;
        let t = MwType::from_raw(mw_type).ok_or(libc::EINVAL)?;
        let sim = p.sim.alloc_mw(t).map_err(|e| errno_of("ibv_alloc_mw", &e))?;
        p.hold();
        Ok(live::register(Box::new(Mw {
            c: UnsafeCell::new(ibv_mw {
                context: p.ctx().c_ptr(),
                pd,
                rkey: sim.rkey(),
                handle: next_handle(),
                type_: mw_type,
            }),
            sim,
            pd: p,
        })))
    })
}

/// `ops.dealloc_mw` (what the inline `ibv_dealloc_mw` calls): 0 or EINVAL. A bound
/// window is deallocated too: its rkey stops working.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    errno_verb("ibv_dealloc_mw", || {
        // SAFETY: no reference to the window is in use.
        drop(unsafe { live::unregister::<Mw>(mw) }?);
        Ok(())
    })
}

/// The region of a bind (`None` for none), or EINVAL for a pointer that is not one.
///
/// # Safety
///
/// The reference must not outlive the region (a concurrent `ibv_dereg_mr` of it is the
/// program's error).
unsafe fn region<'a>(info: &ibv_mw_bind_info) -> Result<Option<&'a Mr>, Errno> {
    if info.mr.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's contract.
    unsafe { live::get::<Mr>(info.mr) }.map(Some)
}

/// The binding `info` names, for the sim: zero-based windows are EINVAL (the sim
/// addresses windows by virtual address, as `rxe_bind_mw()` refuses a zero-based type 1
/// window).
fn bind_info<'a>(info: &ibv_mw_bind_info, mr: Option<&'a Mr>) -> Result<MwBindInfo<'a>, Errno> {
    if info.mw_access_flags & ZERO_BASED != 0 {
        return Err(libc::EINVAL);
    }
    Ok(MwBindInfo {
        mr: mr.map(|m| m.sim() as &dyn MemoryRegion),
        addr: info.addr,
        length: info.length,
        mw_access_flags: AccessFlags::from_bits_truncate(info.mw_access_flags),
    })
}

/// A `IBV_WR_BIND_MW` of the program's window `mw` with the new `rkey`, bound as `info`
/// says, for the sim (the window's handle synced with its `struct ibv_mw`).
///
/// # Safety
///
/// `mw` and `info.mr` must be NULL or objects of this library, which outlive the result.
pub unsafe fn bind_wr<'a>(mw: *mut ibv_mw, rkey: u32, info: &ibv_mw_bind_info) -> Result<BindMw<'a>, Errno> {
    // SAFETY: the caller's contract.
    let w: &'a Mw = unsafe { live::get::<Mw>(mw) }?;
    // SAFETY: the caller's contract.
    let mr = unsafe { region(info) }?;
    Ok(BindMw {
        mw: w.synced(),
        rkey,
        bind_info: bind_info(info, mr)?,
    })
}

/// `ops.bind_mw` (what the inline `ibv_bind_mw` calls after its own checks): binds the
/// type 1 window through the QP's send queue and writes its new rkey into the program's
/// `struct ibv_mw`; 0, or an error number (EINVAL for a zero-based window, a window of
/// type 2 or an object that is not this library's, EPERM for a region of another PD).
pub(crate) unsafe extern "C" fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, bind: *mut ibv_mw_bind) -> c_int {
    errno_verb("ibv_bind_mw", || {
        if bind.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program passes its `struct ibv_mw_bind`.
        let b = unsafe { &*bind };
        // SAFETY: used within this call.
        let q = unsafe { live::get::<Qp>(qp.cast()) }?;
        // SAFETY: as above.
        let w = unsafe { live::get::<Mw>(mw) }?;
        // SAFETY: as above.
        let mr = unsafe { region(&b.bind_info) }?;
        let info = bind_info(&b.bind_info, mr)?;
        let args = MwBind {
            wr_id: b.wr_id,
            send_flags: send_flags(b.send_flags)?,
            bind_info: info,
        };
        let rkey = q
            .sim
            .bind_mw(w.synced(), &args)
            .map_err(|e| errno_of("ibv_bind_mw", &e))?;
        // SAFETY: the C part lives as long as the window; the providers write `rkey`
        // here once the bind is posted.
        unsafe { (*w.c.get()).rkey = rkey };
        Ok(())
    })
}
