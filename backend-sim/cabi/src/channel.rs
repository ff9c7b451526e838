//! Completion channels (`man ibv_create_comp_channel`, `man ibv_get_cq_event`): the
//! sim's channel, whose descriptor is a real fd that polls readable while an event is
//! pending (see [`crate::fd`] for its blocking mode).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};

use parking_lot::Mutex;
use verbs_api::{ChannelOf, CompletionChannel, Context as _};

use crate::abi::{ibv_comp_channel, ibv_context, ibv_cq};
use crate::context::{self, Context};
use crate::cq::Cq;
use crate::ffi::{errno_of, errno_verb, minus_one_verb, ptr_verb};
use crate::live::{self, Kind, Object};
use crate::runtime::B;

/// A completion channel.
#[repr(C)]
pub struct Channel {
    /// What programs see, shared with them.
    pub c: UnsafeCell<ibv_comp_channel>,
    /// The sim's channel.
    pub sim: ChannelOf<B>,
    /// Its context (which it holds a count on).
    ctx: *const Context,
    /// The CQs reporting to it, by handle: where an event's handle leads.
    cqs: Mutex<HashMap<u32, usize>>,
}

// SAFETY: `#[repr(C)]` with the `ibv_comp_channel` first.
unsafe impl Object for Channel {
    const KIND: Kind = Kind::Channel;
    type C = ibv_comp_channel;
}

impl Channel {
    /// The channel's context.
    pub fn ctx(&self) -> &Context {
        // SAFETY: the channel holds a count on its context.
        unsafe { &*self.ctx }
    }

    /// A CQ now reports here.
    pub fn attach(&self, handle: u32, cq: *mut ibv_cq) {
        let mut cqs = self.cqs.lock();
        cqs.insert(handle, cq as usize);
        self.set_refcnt(cqs.len());
    }

    /// A CQ reporting here is destroyed.
    pub fn detach(&self, handle: u32) {
        let mut cqs = self.cqs.lock();
        cqs.remove(&handle);
        self.set_refcnt(cqs.len());
    }

    /// `ibv_comp_channel::refcnt`, which libibverbs keeps as the number of CQs.
    fn set_refcnt(&self, n: usize) {
        // SAFETY: the C part is ours to write (programs only read `refcnt`); written
        // under the `cqs` lock.
        unsafe { (*self.c.get()).refcnt = n as c_int };
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: the count taken in `ibv_create_comp_channel`, given up once.
        unsafe { Context::release(self.ctx) };
    }
}

/// `ibv_create_comp_channel`.
pub(crate) unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    ptr_verb("ibv_create_comp_channel", || {
        // SAFETY: used within this call only.
        let c = unsafe { context::get(ctx) }?;
        let sim = c
            .sim
            .create_comp_channel()
            .map_err(|e| errno_of("ibv_create_comp_channel", &e))?;
        crate::fd::make_blocking(sim.fd());
        c.hold();
        Ok(live::register(Box::new(Channel {
            c: UnsafeCell::new(ibv_comp_channel {
                context: c.c_ptr(),
                fd: sim.fd(),
                refcnt: 0,
            }),
            sim,
            ctx: c,
            cqs: Mutex::default(),
        })))
    })
}

/// `ibv_destroy_comp_channel`: 0, EBUSY while CQs report to it, or EINVAL.
pub(crate) unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    errno_verb("ibv_destroy_comp_channel", || {
        // SAFETY: used only before the channel is freed below.
        let c = unsafe { live::get::<Channel>(ch) }?;
        if !c.cqs.lock().is_empty() {
            return Err(libc::EBUSY);
        }
        // SAFETY: checked live just above; `c` is not used again.
        drop(unsafe { live::unregister::<Channel>(ch) }?);
        Ok(())
    })
}

/// `ibv_get_cq_event`: reads the channel's descriptor as libibverbs does, so it waits for
/// the next event (or, on a descriptor the program made non-blocking, fails at once with
/// EAGAIN when there is none) and a signal interrupts the wait (EINTR, unless the
/// handler was installed with `SA_RESTART`); it names the event's CQ and that CQ's
/// `cq_context`. 0, or -1 with errno.
pub(crate) unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    minus_one_verb("ibv_get_cq_event", || {
        // SAFETY: the channel cannot be destroyed while a CQ reports to it, and the
        // program does not destroy it while waiting on it.
        let c = unsafe { live::get::<Channel>(ch) }?;
        if cq.is_null() || cq_context.is_null() {
            return Err(libc::EINVAL);
        }
        loop {
            let handle = c
                .sim
                .read_cq_event()
                .map_err(|e| errno_of("ibv_get_cq_event", &e))?;
            // An event of a CQ destroyed since it was raised names nothing: skip it.
            let Some(&addr) = c.cqs.lock().get(&handle) else {
                continue;
            };
            let this = addr as *mut ibv_cq;
            // SAFETY: a CQ in the map is live (destroy detaches it first).
            let user = unsafe { &*Cq::from_c(this.cast()) }.cq_context();
            // SAFETY: the program passes valid out-pointers (checked non-NULL above).
            unsafe {
                *cq = this;
                *cq_context = user;
            }
            return Ok(0);
        }
    })
}
