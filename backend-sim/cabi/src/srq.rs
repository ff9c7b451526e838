//! Shared receive queues (`man ibv_create_srq`, `man ibv_create_srq_ex`,
//! `man ibv_modify_srq`, `man ibv_query_srq`, `man ibv_destroy_srq`), wired to the
//! verbs-api SRQ: they work as soon as the sim creates SRQs, and until then the sim's
//! EOPNOTSUPP is what the program gets. `ibv_post_srq_recv` is in [`crate::post`].

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

use verbs_api::{ProtectionDomain, SharedReceiveQueue, SrqAttr, SrqAttrMask, SrqOf};

use crate::abi::{
    ibv_context, ibv_pd, ibv_srq, ibv_srq_attr, ibv_srq_init_attr, ibv_srq_init_attr_ex, IBV_SRQT_BASIC,
    IBV_SRQ_INIT_ATTR_PD, IBV_SRQ_INIT_ATTR_TYPE,
};
use crate::context;
use crate::ffi::{errno_of, errno_verb, ptr_verb, Errno};
use crate::live::{self, Kind, Object};
use crate::pd::{next_handle, Pd};
use crate::runtime::B;

/// A shared receive queue.
#[repr(C)]
pub struct Srq {
    /// What programs see, shared with them.
    pub c: UnsafeCell<ibv_srq>,
    /// The sim's SRQ.
    pub sim: SrqOf<B>,
    pd: *const Pd,
    /// QPs taking their receives from it: `ibv_destroy_srq` refuses while any lives.
    users: AtomicUsize,
}

// SAFETY: `#[repr(C)]` with the `ibv_srq` first.
unsafe impl Object for Srq {
    const KIND: Kind = Kind::Srq;
    type C = ibv_srq;
}

impl Srq {
    /// Counts a QP using this SRQ.
    pub fn hold(&self) {
        self.users.fetch_add(1, Ordering::Relaxed);
    }

    /// Undoes [`hold`](Self::hold).
    pub fn release(&self) {
        self.users.fetch_sub(1, Ordering::Relaxed);
    }

    fn pd(&self) -> &Pd {
        // SAFETY: the SRQ holds a count on its PD.
        unsafe { &*self.pd }
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        let handle = self.sim.handle();
        self.pd().ctx().elements.lock().srqs.remove(&handle);
        self.pd().release();
    }
}

fn attr_to_c(a: &SrqAttr) -> ibv_srq_attr {
    ibv_srq_attr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

fn create(
    pd: *mut ibv_pd,
    srq_context: *mut std::ffi::c_void,
    attr: &mut ibv_srq_attr,
) -> Result<*mut ibv_srq, Errno> {
    // SAFETY: used within this call; the SRQ then holds a count.
    let p = unsafe { live::get::<Pd>(pd) }?;
    crate::provider_env::mlx5_alloc(p.ctx(), "MLX_SRQ")?;
    let asked = SrqAttr {
        max_wr: attr.max_wr,
        max_sge: attr.max_sge,
        srq_limit: attr.srq_limit,
    };
    let sim = p
        .sim
        .create_srq(&asked)
        .map_err(|e| errno_of("ibv_create_srq", &e))?;
    *attr = attr_to_c(&sim.created_attr(&asked));
    let handle = sim.handle();
    p.hold();
    let s = live::register(Box::new(Srq {
        c: UnsafeCell::new(ibv_srq {
            context: p.ctx().c_ptr(),
            srq_context,
            pd,
            handle: next_handle(),
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            events_completed: 0,
        }),
        sim,
        pd: p,
        users: AtomicUsize::new(0),
    }));
    p.ctx().elements.lock().srqs.insert(handle, s as usize);
    Ok(s)
}

/// `ibv_create_srq`: the granted sizes are written back to `attr`.
pub(crate) unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    ptr_verb("ibv_create_srq", || {
        if init.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program passes a `struct ibv_srq_init_attr *`.
        let i = unsafe { &mut *init };
        create(pd, i.srq_context, &mut i.attr)
    })
}

/// `verbs_context::create_srq_ex` (what `ibv_create_srq_ex` calls for more than a basic
/// SRQ in a PD): basic SRQs only; XRC and tag-matching SRQs are EOPNOTSUPP.
pub(crate) unsafe extern "C" fn create_srq_ex_op(
    ctx: *mut ibv_context,
    init: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    ptr_verb("ibv_create_srq_ex", || {
        // SAFETY: used within this call only.
        let c = unsafe { context::get(ctx) }?;
        if init.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program passes a `struct ibv_srq_init_attr_ex *`.
        let i = unsafe { &mut *init };
        let basic = i.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 || i.srq_type == IBV_SRQT_BASIC;
        if i.comp_mask & !(IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE) != 0 || !basic {
            return Err(libc::EOPNOTSUPP);
        }
        if i.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: only looked up.
        if !std::ptr::eq(unsafe { live::get::<Pd>(i.pd) }?.ctx(), c) {
            return Err(libc::EINVAL);
        }
        create(i.pd, i.srq_context, &mut i.attr)
    })
}

/// `ibv_modify_srq`: 0 or an error number.
pub(crate) unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    errno_verb("ibv_modify_srq", || {
        // SAFETY: used within this call only.
        let s = unsafe { live::get::<Srq>(srq) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let mask = SrqAttrMask::from_bits(mask as u32).ok_or(libc::EINVAL)?;
        // SAFETY: the program passes a `struct ibv_srq_attr *`.
        let a = unsafe { &*attr };
        let a = SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        };
        s.sim.modify(&a, mask).map_err(|e| errno_of("ibv_modify_srq", &e))
    })
}

/// `ibv_query_srq`: 0 or an error number.
pub(crate) unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    errno_verb("ibv_query_srq", || {
        // SAFETY: used within this call only.
        let s = unsafe { live::get::<Srq>(srq) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let a = s.sim.query().map_err(|e| errno_of("ibv_query_srq", &e))?;
        // SAFETY: the program passes a `struct ibv_srq_attr *`.
        unsafe { attr.write(attr_to_c(&a)) };
        Ok(())
    })
}

/// `ibv_destroy_srq`: 0, EBUSY while QPs use it, or EINVAL.
pub(crate) unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    errno_verb("ibv_destroy_srq", || {
        // SAFETY: used only before the SRQ is freed below.
        let s = unsafe { live::get::<Srq>(srq) }?;
        if s.users.load(Ordering::Acquire) != 0 {
            return Err(libc::EBUSY);
        }
        // SAFETY: checked live just above; `s` is not used again.
        drop(unsafe { live::unregister::<Srq>(srq) }?);
        Ok(())
    })
}
