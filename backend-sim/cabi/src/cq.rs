//! Completion queues (`man ibv_create_cq`, `man ibv_create_cq_ex`, `man ibv_resize_cq`,
//! `man ibv_destroy_cq`, `man ibv_req_notify_cq`, `man ibv_ack_cq_events`).
//!
//! Every CQ is built as a `struct ibv_cq_ex` (whose first part is `struct ibv_cq`), so
//! the same object serves `ibv_poll_cq` and the `ibv_start_poll()` interface
//! ([`crate::poll`]).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use verbs_api::{CompletionQueue, Context as _, CqOf, WorkCompletion};

use crate::abi::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_cq_ex, ibv_cq_init_attr_ex, CQ_CREATE_FLAGS_HINTS,
    IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_WC_STANDARD_FLAGS,
};
use crate::channel::Channel;
use crate::context::{self, Context};
use crate::ffi::{errno_of, errno_verb, ptr_verb, void_verb, Errno};
use crate::live::{self, Kind, Object};
use crate::pd::next_handle;
use crate::runtime::{B, NUM_COMP_VECTORS};

/// A completion queue.
#[repr(C)]
pub struct Cq {
    /// What programs see, shared with them.
    pub c: UnsafeCell<ibv_cq_ex>,
    /// The sim's CQ.
    pub sim: CqOf<B>,
    /// Its context (which it holds a count on).
    ctx: *const Context,
    /// The channel it reports to, or NULL.
    channel: *const Channel,
    /// QPs using it: `ibv_destroy_cq` refuses while any lives.
    users: AtomicUsize,
    /// The completion `ibv_start_poll`/`ibv_next_poll` took, which the `ibv_wc_read_*`
    /// accessors read.
    pub current: Mutex<WorkCompletion>,
}

// SAFETY: `#[repr(C)]` with the `ibv_cq_ex` (and so the `ibv_cq`) first.
unsafe impl Object for Cq {
    const KIND: Kind = Kind::Cq;
    type C = ibv_cq_ex;
}

impl Cq {
    /// The CQ's context.
    pub fn ctx(&self) -> &Context {
        // SAFETY: the CQ holds a count on its context.
        unsafe { &*self.ctx }
    }

    /// The `cq_context` the program gave (or set since).
    pub fn cq_context(&self) -> *mut c_void {
        // SAFETY: the C part lives as long as `self`; a plain read of a pointer field.
        unsafe { (*self.c.get()).cq.cq_context }
    }

    /// Counts a QP using this CQ.
    pub fn hold(&self) {
        self.users.fetch_add(1, Ordering::Relaxed);
    }

    /// Undoes [`hold`](Self::hold).
    pub fn release(&self) {
        self.users.fetch_sub(1, Ordering::Relaxed);
    }

    /// The CQ behind a program's `ibv_cq *`, looked up.
    ///
    /// # Safety
    ///
    /// See [`live::get`].
    pub unsafe fn get<'a>(cq: *const ibv_cq) -> Result<&'a Cq, Errno> {
        // SAFETY: forwarded contract; an `ibv_cq *` of ours is the `ibv_cq_ex`'s address.
        unsafe { live::get::<Cq>(cq.cast()) }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        let handle = self.sim.handle();
        self.ctx().elements.lock().cqs.remove(&handle);
        if !self.channel.is_null() {
            // SAFETY: the channel cannot be destroyed while this CQ reports to it.
            unsafe { &*self.channel }.detach(handle);
        }
        // SAFETY: the count taken at creation, given up once.
        unsafe { Context::release(self.ctx) };
    }
}

fn create(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut ibv_cq_ex, Errno> {
    // SAFETY: used within this call only.
    let c = unsafe { context::get(ctx) }?;
    let ch = if channel.is_null() {
        None
    } else {
        // SAFETY: used within this call only (the CQ then holds the channel busy).
        let ch = unsafe { live::get::<Channel>(channel) }?;
        if !std::ptr::eq(ch.ctx(), c) {
            return Err(libc::EINVAL);
        }
        Some(ch)
    };
    let cqe = u32::try_from(cqe).ok().filter(|n| *n > 0).ok_or(libc::EINVAL)?;
    if !(0..NUM_COMP_VECTORS).contains(&comp_vector) {
        return Err(libc::EINVAL);
    }
    crate::provider_env::mlx5_alloc(c, "MLX_CQ")?;
    let sim = c
        .sim
        .create_cq(cqe, ch.map(|ch| &ch.sim))
        .map_err(|e| errno_of("ibv_create_cq", &e))?;
    let handle = sim.handle();
    c.hold();
    let cq = Box::new(Cq {
        c: UnsafeCell::new(crate::poll::cq_ex(ibv_cq {
            context: c.c_ptr(),
            channel,
            cq_context,
            handle: next_handle(),
            cqe: sim.capacity().min(c_int::MAX as u32) as c_int,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            comp_events_completed: 0,
            async_events_completed: 0,
        })),
        sim,
        ctx: c,
        channel: ch.map_or(std::ptr::null(), |ch| ch as *const Channel),
        users: AtomicUsize::new(0),
        current: Mutex::default(),
    });
    let p = live::register(cq);
    c.elements.lock().cqs.insert(handle, p as usize);
    if let Some(ch) = ch {
        ch.attach(handle, p.cast());
    }
    Ok(p)
}

/// `ibv_create_cq`.
pub(crate) unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    ptr_verb("ibv_create_cq", || {
        create(ctx, cqe, cq_context, channel, comp_vector)
    })
    .cast()
}

/// `verbs_context::create_cq_ex` (what `ibv_create_cq_ex` calls): the standard
/// completion fields only (no timestamps: the device reports no clock), EOPNOTSUPP for
/// others; the create flags are hints the sim may ignore.
pub(crate) unsafe extern "C" fn create_cq_ex_op(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    ptr_verb("ibv_create_cq_ex", || {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program passes a `struct ibv_cq_init_attr_ex *`.
        let a = unsafe { &*attr };
        if a.comp_mask & !IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags & !CQ_CREATE_FLAGS_HINTS != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if a.wc_flags & !IBV_WC_STANDARD_FLAGS != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let cqe = c_int::try_from(a.cqe).map_err(|_| libc::EINVAL)?;
        let vector = c_int::try_from(a.comp_vector).map_err(|_| libc::EINVAL)?;
        create(ctx, cqe, a.cq_context, a.channel, vector)
    })
}

/// `ibv_resize_cq`: EOPNOTSUPP (the sim's CQs keep their size), or EINVAL.
pub(crate) unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, _cqe: c_int) -> c_int {
    errno_verb("ibv_resize_cq", || {
        // SAFETY: only looked up.
        unsafe { Cq::get(cq) }?;
        Err(libc::EOPNOTSUPP)
    })
}

/// `ibv_destroy_cq`: 0, EBUSY while a QP uses it, or EINVAL.
pub(crate) unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    errno_verb("ibv_destroy_cq", || {
        // SAFETY: used only before the CQ is freed below.
        let q = unsafe { Cq::get(cq) }?;
        if q.users.load(Ordering::Acquire) != 0 {
            return Err(libc::EBUSY);
        }
        // SAFETY: checked live just above; `q` is not used again.
        drop(unsafe { live::unregister::<Cq>(cq.cast()) }?);
        Ok(())
    })
}

/// `ops.req_notify_cq` (what the inline `ibv_req_notify_cq` calls).
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    errno_verb("ibv_req_notify_cq", || {
        // SAFETY: the data path trusts the program's CQ pointer, as libibverbs does.
        let q = unsafe { live::get_fast::<Cq>(cq.cast()) }?;
        q.sim
            .req_notify(solicited_only != 0)
            .map_err(|e| errno_of("ibv_req_notify_cq", &e))
    })
}

/// `ibv_ack_cq_events`.
pub(crate) unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    void_verb("ibv_ack_cq_events", || {
        // SAFETY: used within this call only.
        if let Ok(q) = unsafe { Cq::get(cq) } {
            q.sim.ack_events(nevents);
            // SAFETY: the C part is ours to write (programs only read this field); acks
            // of one CQ come from the thread that took its events.
            unsafe {
                let c = q.c.get();
                (*c).cq.comp_events_completed = (*c).cq.comp_events_completed.wrapping_add(nevents);
            }
        }
    })
}
