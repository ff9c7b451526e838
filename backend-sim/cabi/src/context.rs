//! An open device (`man ibv_open_device`, `man ibv_close_device`): the `verbs_context`
//! programs reach through their `ibv_context *`, and the sim's context behind it.
//!
//! `ibv_close_device` returns at once, as libibverbs' does, but the context's memory
//! stays until the last object made from it is destroyed: objects point at their context
//! (`cq->context->ops.poll_cq` is how `ibv_poll_cq` finds its code), and a program that
//! closes the device first must not make them point at freed memory. The device's sim
//! side closes with the last of them too.
//!
//! `cmd_fd` is a real descriptor, as libibverbs' (the uverbs device it sends commands
//! on) always is: programs `dup` it (rdma-core's tests, before `ibv_import_device`) or
//! `fstat` it. The sim has no command channel, so it is `/dev/null`, a character device
//! like uverbs: nothing this library does goes through it, reads find nothing and writes
//! go nowhere. It is close-on-exec, as libibverbs opens it, and closed with the
//! context.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use verbs_api::Context as _;

use crate::abi::{ibv_context, ibv_device, verbs_context};
use crate::ffi::{errno_verb, ptr_verb, Errno};
use crate::live::{self, Kind, Object};
use crate::runtime::{device, runtime, Device, SimContext};

/// An open device.
#[repr(C)]
pub struct Context {
    /// What programs see (they hold `&vctx.context`), shared with them.
    pub vctx: UnsafeCell<verbs_context>,
    /// The sim's context, shared by every context of the device in the process.
    pub sim: Arc<SimContext>,
    /// The listed device.
    pub device: &'static Device,
    /// 1 while open, plus one per object made from it.
    refs: AtomicUsize,
    /// The objects asynchronous events name, by the number the sim gives them.
    pub elements: Mutex<Elements>,
    /// What `cmd_fd` is (see the module docs).
    _cmd: File,
}

/// The C objects of a context that asynchronous events can name, as addresses.
#[derive(Default)]
pub struct Elements {
    /// QPs by QP number.
    pub qps: HashMap<u32, usize>,
    /// CQs by handle.
    pub cqs: HashMap<u32, usize>,
    /// SRQs by handle.
    pub srqs: HashMap<u32, usize>,
}

// SAFETY: `Context` is `#[repr(C)]` and holds `vctx` at offset 0, whose `context` field
// (the `ibv_context`) sits at `offset_of!(verbs_context, context)`.
unsafe impl Object for Context {
    const KIND: Kind = Kind::Context;
    type C = ibv_context;
    const OFFSET: usize = std::mem::offset_of!(verbs_context, context);
}

impl Context {
    /// The C pointer programs hold.
    pub fn c_ptr(&self) -> *mut ibv_context {
        // The `ibv_context` is inside the `UnsafeCell`, which programs may write.
        <Context as Object>::c_ptr((self as *const Context).cast_mut())
    }

    /// Counts an object made from this context; it keeps the context's memory.
    pub fn hold(&self) {
        self.refs.fetch_add(1, Ordering::Relaxed);
    }

    /// Undoes [`hold`](Self::hold) (or the open), freeing the context after the last.
    ///
    /// # Safety
    ///
    /// `this` is a context made by `ibv_open_device`, and the caller gives up the count
    /// it held (no reference to the context may be used after this call).
    pub unsafe fn release(this: *const Context) {
        // SAFETY: the caller holds a count, so the context is alive.
        if unsafe { &*this }.refs.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: the last count: nothing refers to the context any more; it was
            // leaked from a Box by `ibv_open_device`.
            drop(unsafe { Box::from_raw(this.cast_mut()) });
        }
    }
}

/// `ibv_open_device`.
pub(crate) unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    ptr_verb("ibv_open_device", || {
        let rt = runtime()?;
        let device = device(dev)?;
        // Unlike most refusals, this one is the environment's (a listen address taken
        // or not this host's), which the program's own message does not name.
        let sim = device.open(&rt.backend).map_err(|e| {
            tracing::warn!(device = %device.name, error = %e, "ibv_open_device failed");
            e.errno()
        })?;
        let async_fd = sim.async_fd();
        crate::fd::make_blocking(async_fd);
        // Rust opens files close-on-exec.
        let cmd = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map_err(|e| {
                tracing::warn!(error = %e, "ibv_open_device: cannot open /dev/null for cmd_fd");
                e.raw_os_error().unwrap_or(libc::EIO)
            })?;
        let ctx = Box::new(Context {
            vctx: UnsafeCell::new(crate::ops::verbs_context(dev, async_fd, cmd.as_raw_fd())),
            sim,
            device,
            refs: AtomicUsize::new(1),
            elements: Mutex::default(),
            _cmd: cmd,
        });
        Ok(live::register(ctx))
    })
}

/// `ibv_close_device`: 0, or EINVAL for a pointer that is not an open context.
pub(crate) unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    errno_verb("ibv_close_device", || {
        let this = live::forget::<Context>(ctx)?;
        // SAFETY: `forget` checked that this is an open context; the open's count is
        // given up here.
        unsafe { Context::release(this) };
        Ok(())
    })
}

/// The context behind a C pointer (live, not closed).
///
/// # Safety
///
/// See [`live::get`].
pub unsafe fn get<'a>(ctx: *const ibv_context) -> Result<&'a Context, Errno> {
    // SAFETY: forwarded contract.
    unsafe { live::get::<Context>(ctx) }
}
