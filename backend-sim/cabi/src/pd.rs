//! Protection domains (`man ibv_alloc_pd`, `man ibv_dealloc_pd`).

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use verbs_api::{Context as _, PdOf};

use crate::abi::{ibv_context, ibv_pd};
use crate::context::{self, Context};
use crate::ffi::{errno_of, errno_verb, ptr_verb};
use crate::live::{self, Kind, Object};
use crate::runtime::B;

/// A protection domain.
#[repr(C)]
pub struct Pd {
    /// What programs see, shared with them.
    pub c: UnsafeCell<ibv_pd>,
    /// The sim's PD.
    pub sim: PdOf<B>,
    /// Its context (which the PD holds a count on).
    ctx: *const Context,
    /// MRs, QPs, SRQs and AHs made in it: `ibv_dealloc_pd` refuses while any lives.
    children: AtomicUsize,
}

// SAFETY: `#[repr(C)]` with the `ibv_pd` first.
unsafe impl Object for Pd {
    const KIND: Kind = Kind::Pd;
    type C = ibv_pd;
}

/// A process-wide counter for the `handle` fields of the objects programs see (the
/// kernel's object handles; nothing uses them but they are told apart).
pub fn next_handle() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Pd {
    /// The PD's context.
    pub fn ctx(&self) -> &Context {
        // SAFETY: the PD holds a count on its context, which keeps it alive.
        unsafe { &*self.ctx }
    }

    /// Counts an object made in this PD.
    pub fn hold(&self) {
        self.children.fetch_add(1, Ordering::Relaxed);
    }

    /// Undoes [`hold`](Self::hold).
    pub fn release(&self) {
        self.children.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: the count taken in `ibv_alloc_pd`, given up once.
        unsafe { Context::release(self.ctx) };
    }
}

/// `ibv_alloc_pd`.
pub(crate) unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    ptr_verb("ibv_alloc_pd", || {
        // SAFETY: used within this call only.
        let c = unsafe { context::get(ctx) }?;
        let sim = c.sim.alloc_pd().map_err(|e| errno_of("ibv_alloc_pd", &e))?;
        c.hold();
        Ok(live::register(Box::new(Pd {
            c: UnsafeCell::new(ibv_pd {
                context: c.c_ptr(),
                handle: next_handle(),
            }),
            sim,
            ctx: c,
            children: AtomicUsize::new(0),
        })))
    })
}

/// `ibv_dealloc_pd`: 0, EBUSY while MRs, QPs, SRQs or AHs of the PD exist (as the
/// kernel answers), or EINVAL.
pub(crate) unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    errno_verb("ibv_dealloc_pd", || {
        // SAFETY: used only before the PD is freed below.
        let p = unsafe { live::get::<Pd>(pd) }?;
        if p.children.load(Ordering::Acquire) != 0 {
            return Err(libc::EBUSY);
        }
        // SAFETY: checked live just above; the reference `p` is not used again.
        drop(unsafe { live::unregister::<Pd>(pd) }?);
        Ok(())
    })
}
