//! Asynchronous events: `ibv_get_async_event` and `ibv_ack_async_event`
//! (`man ibv_get_async_event`), read by one thread per open device.
//!
//! The thread reads every event libibverbs delivers, names its element the way
//! [`verbs_api::AsyncElement`] does (a CQ or SRQ by its handle, kept in `cq_context` /
//! `srq_context`; a QP by number; a port by number), queues it for the application in the
//! context's [`EventQueue`] and acknowledges it to libibverbs at once. The application
//! takes events from that queue ([`verbs_api::Context::get_async_event`]) and acknowledges
//! them there; destroying a QP, CQ or SRQ first waits for those acknowledgements
//! ([`EventQueue::forget`]), as `ibv_destroy_*` would, so the semantics of the man page hold
//! while libibverbs itself never waits on the application.
//!
//! Two events also change what later calls return: a CQ overflow (`IBV_EVENT_CQ_ERR`)
//! marks the CQ so that its next poll fails with [`verbs_api::Error::CqOverflow`], and a QP
//! error outside of a work request (`IBV_EVENT_QP_FATAL`, `IBV_EVENT_QP_REQ_ERR`,
//! `IBV_EVENT_QP_ACCESS_ERR`) is recorded on the QP.
//!
//! An event is queued only while its object is in the registry; a QP, CQ or SRQ leaves
//! the registry before it waits for acknowledgements and is destroyed, so no event for an
//! object that is going away is queued after its `forget`.
//!
//! The thread `poll(2)`s the context's `async_fd` (switched to O_NONBLOCK, as the man
//! page's example does) together with an eventfd; writing the eventfd stops the thread,
//! which the context does in `Drop` before `ibv_close_device`.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Mutex, RwLock};
use rdma_sys::{
    ibv_ack_async_event, ibv_async_event, ibv_context, ibv_cq, ibv_get_async_event, ibv_qp, ibv_srq,
};
use rustc_hash::FxHashMap;
use verbs_api::event_queue::EventQueue;
use verbs_api::{AsyncElement, AsyncEvent, AsyncEventType, ElementKind, Error, Result};

use crate::errno::last_errno;

/// `struct ibv_async_event` with the event type as a plain integer: rdma-sys declares
/// it as a Rust enum, and a value this build does not know would be undefined behaviour
/// there. Same layout: an 8-byte union of pointers / `int`, then a 4-byte enum.
#[repr(C)]
struct RawAsyncEvent {
    element: u64,
    event_type: u32,
}

const _: () = assert!(std::mem::size_of::<RawAsyncEvent>() == std::mem::size_of::<ibv_async_event>());
const _: () = assert!(std::mem::align_of::<RawAsyncEvent>() == std::mem::align_of::<ibv_async_event>());

/// What the async thread knows about a CQ.
#[derive(Debug, Default)]
pub(crate) struct CqState {
    /// How many `IBV_EVENT_CQ_ERR` events arrived (0: not overflowed).
    pub(crate) overflows: AtomicU64,
    /// Completion events taken with `ibv_get_cq_event` and not yet acknowledged.
    pub(crate) unacked: AtomicU32,
}

/// What the async thread knows about a QP.
#[derive(Debug, Default)]
pub(crate) struct QpState {
    /// The last QP error event.
    pub(crate) fatal: Mutex<Option<AsyncEventType>>,
}

/// A registered region: `[addr, addr + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MrSpan {
    pub(crate) addr: u64,
    pub(crate) len: u64,
}

impl MrSpan {
    /// Whether `[addr, addr + len)` lies inside the span.
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        match (addr.checked_sub(self.addr), addr.checked_add(len)) {
            (Some(_), Some(end)) => end <= self.addr.saturating_add(self.len),
            _ => false,
        }
    }
}

/// The per-context tables shared by the verbs objects and the async thread.
pub(crate) struct Registry {
    /// Registered regions by lkey (for the inline-SGE check). Writers (MR drop) take the
    /// write lock, so a region cannot be deregistered while an inline post reads it.
    pub(crate) mrs: RwLock<FxHashMap<u32, MrSpan>>,
    /// Live CQs by handle.
    pub(crate) cqs: Mutex<HashMap<u32, Arc<CqState>>>,
    /// Live QPs by QP number.
    pub(crate) qps: Mutex<HashMap<u32, Arc<QpState>>>,
    /// Live SRQs by handle.
    pub(crate) srqs: Mutex<HashSet<u32>>,
    /// The next CQ handle.
    pub(crate) next_cq_handle: AtomicU32,
    /// The next SRQ handle.
    pub(crate) next_srq_handle: AtomicU32,
    /// The events the application reads (`ibv_get_async_event`).
    pub(crate) events: EventQueue,
}

impl Registry {
    /// Empty tables and an empty event queue.
    pub(crate) fn new() -> Result<Registry> {
        Ok(Registry {
            mrs: RwLock::default(),
            cqs: Mutex::default(),
            qps: Mutex::default(),
            srqs: Mutex::default(),
            next_cq_handle: AtomicU32::new(0),
            next_srq_handle: AtomicU32::new(0),
            events: EventQueue::new()?,
        })
    }

    /// Records one event: marks its CQ or QP and queues it for the application, if the
    /// object it names is still registered (see the module docs). Events of a type this
    /// build does not know, and work-queue events (this crate creates no WQs), are only
    /// acknowledged.
    ///
    /// # Safety
    ///
    /// `raw` must come from `ibv_get_async_event` and not yet be acknowledged (so the CQ,
    /// QP or SRQ it names is still alive: libibverbs destroys none while an event for it
    /// is unacknowledged).
    unsafe fn record(&self, raw: &RawAsyncEvent) {
        let Some(event_type) = AsyncEventType::from_raw(raw.event_type) else {
            return;
        };
        let raise = |element| self.events.raise(AsyncEvent { event_type, element });
        match event_type.element_kind() {
            ElementKind::Cq => {
                let cq = raw.element as usize as *mut ibv_cq;
                if cq.is_null() {
                    return;
                }
                // SAFETY: the event names a live CQ (caller contract); `cq_context` was set
                // to the CQ's handle at creation and never changes.
                let handle = unsafe { (*cq).cq_context } as usize as u32;
                let cqs = self.cqs.lock();
                if let Some(state) = cqs.get(&handle) {
                    if event_type == AsyncEventType::CqErr {
                        state.overflows.fetch_add(1, Ordering::SeqCst);
                    }
                    raise(AsyncElement::Cq(handle));
                }
            }
            ElementKind::Qp => {
                let qp = raw.element as usize as *mut ibv_qp;
                if qp.is_null() {
                    return;
                }
                // SAFETY: the event names a live QP (caller contract).
                let qpn = unsafe { (*qp).qp_num };
                let qps = self.qps.lock();
                if let Some(state) = qps.get(&qpn) {
                    if matches!(
                        event_type,
                        AsyncEventType::QpFatal | AsyncEventType::QpReqErr | AsyncEventType::QpAccessErr
                    ) {
                        *state.fatal.lock() = Some(event_type);
                    }
                    raise(AsyncElement::Qp(qpn));
                }
            }
            ElementKind::Srq => {
                let srq = raw.element as usize as *mut ibv_srq;
                if srq.is_null() {
                    return;
                }
                // SAFETY: the event names a live SRQ (caller contract); `srq_context` was
                // set to the SRQ's handle at creation and never changes.
                let handle = unsafe { (*srq).srq_context } as usize as u32;
                let srqs = self.srqs.lock();
                if srqs.contains(&handle) {
                    raise(AsyncElement::Srq(handle));
                }
            }
            ElementKind::Port => {
                // The union's `int port_num` is its low 4 bytes (x86-64 is little-endian).
                if let Ok(port) = u8::try_from(raw.element as u32) {
                    raise(AsyncElement::Port(port));
                }
            }
            ElementKind::Device => raise(AsyncElement::Device),
            ElementKind::Wq => {}
        }
    }
}

/// A raw pointer that may move to the async thread.
struct CtxPtr(*mut ibv_context);

// SAFETY: `ibv_context` is thread-safe (crate docs); the pointer stays valid until the
// context's Drop, which joins the thread before `ibv_close_device`.
unsafe impl Send for CtxPtr {}

/// The running async-event thread of one context.
pub(crate) struct AsyncThread {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl AsyncThread {
    /// Switches `ctx`'s `async_fd` to non-blocking mode and starts the thread.
    ///
    /// # Safety
    ///
    /// `ctx` must be an open context that stays open until the returned value is dropped.
    pub(crate) unsafe fn start(ctx: *mut ibv_context, name: &str, registry: Arc<Registry>) -> Result<Self> {
        // SAFETY: `ctx` is open (caller contract); `async_fd` is a plain field.
        let async_fd = unsafe { (*ctx).async_fd };
        set_nonblocking(async_fd, "fcntl(async_fd)")?;
        // SAFETY: eventfd has no memory-safety preconditions.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(Error::from_errno("eventfd", last_errno()));
        }
        // SAFETY: `efd` is a fresh descriptor that nothing else owns.
        let stop = unsafe { OwnedFd::from_raw_fd(efd) };
        let ptr = CtxPtr(ctx);
        let thread = std::thread::Builder::new()
            .name(format!("ibv-async-{name}"))
            .spawn(move || {
                let ptr = ptr;
                // SAFETY: the context outlives the thread (joined in Drop), and `efd`
                // stays open until then too.
                unsafe { run(ptr.0, async_fd, efd, &registry) }
            })
            .map_err(|e| Error::Os {
                call: "spawn async-event thread",
                source: e,
            })?;
        Ok(AsyncThread {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for AsyncThread {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sets O_NONBLOCK on `fd`.
pub(crate) fn set_nonblocking(fd: i32, call: &'static str) -> Result<()> {
    // SAFETY: fcntl on a descriptor we were handed; no memory is involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(Error::from_errno(call, last_errno()));
    }
    Ok(())
}

/// The thread body: wait for events or the stop signal; record and acknowledge events.
///
/// # Safety
///
/// `ctx` is open and `stop` is a live eventfd for the whole call.
unsafe fn run(ctx: *mut ibv_context, async_fd: i32, stop: i32, registry: &Registry) {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: async_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if last_errno() == libc::EINTR {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents == 0 {
            continue;
        }
        let mut got = 0;
        loop {
            let mut raw = RawAsyncEvent {
                element: 0,
                event_type: 0,
            };
            let p = (&mut raw as *mut RawAsyncEvent).cast::<ibv_async_event>();
            // SAFETY: `ctx` is open; `p` points to a writable struct of the same size and
            // alignment as `ibv_async_event`, which we only read as integers.
            if unsafe { ibv_get_async_event(ctx, p) } != 0 {
                break; // EAGAIN: drained
            }
            got += 1;
            // SAFETY: the event is fresh and not yet acknowledged.
            unsafe { registry.record(&raw) };
            // SAFETY: acknowledges exactly the event just read, once.
            unsafe { ibv_ack_async_event(p) };
        }
        if got == 0 && fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            return; // the fd is dead: nothing more will come
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_numbering() {
        assert_eq!(
            rdma_sys::ibv_event_type::IBV_EVENT_GID_CHANGE as u32,
            AsyncEventType::GidChange as u32,
            "numbering follows verbs.h"
        );
        assert_eq!(
            rdma_sys::ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED as u32,
            AsyncEventType::SrqLimitReached as u32
        );
        assert_eq!(
            rdma_sys::ibv_event_type::IBV_EVENT_QP_LAST_WQE_REACHED as u32,
            AsyncEventType::QpLastWqeReached as u32
        );
    }

    #[test]
    fn span_contains() {
        let s = MrSpan {
            addr: 0x1000,
            len: 64,
        };
        assert!(s.contains(0x1000, 64));
        assert!(s.contains(0x1010, 0));
        assert!(s.contains(0x1040, 0));
        assert!(!s.contains(0x1000, 65));
        assert!(!s.contains(0xfff, 1));
        assert!(!s.contains(u64::MAX, 2));
    }

    #[test]
    fn port_and_device_events_are_queued_and_unknown_ones_dropped() {
        let reg = Registry::new().unwrap();
        for (element, event_type) in [(1, 10), (0, 99), (0, 8)] {
            let raw = RawAsyncEvent { element, event_type };
            // SAFETY: port, device and unknown events dereference nothing.
            unsafe { reg.record(&raw) };
        }
        let ev = reg.events.get(Some(std::time::Duration::ZERO)).unwrap().unwrap();
        assert_eq!(
            (ev.event_type, ev.element),
            (AsyncEventType::PortErr, AsyncElement::Port(1))
        );
        reg.events.ack(ev);
        let ev = reg.events.get(Some(std::time::Duration::ZERO)).unwrap().unwrap();
        assert_eq!(
            (ev.event_type, ev.element),
            (AsyncEventType::DeviceFatal, AsyncElement::Device)
        );
        reg.events.ack(ev);
        assert_eq!(reg.events.get(Some(std::time::Duration::ZERO)).unwrap(), None);
    }

    #[test]
    fn events_of_unregistered_objects_are_not_queued() {
        let reg = Registry::new().unwrap();
        // SAFETY: all-zero is a valid ibv_srq for reading `srq_context` (NULL: handle 0).
        let mut srq: ibv_srq = unsafe { std::mem::zeroed() };
        let raw = RawAsyncEvent {
            element: &mut srq as *mut ibv_srq as u64,
            event_type: AsyncEventType::SrqLimitReached as u32,
        };
        // SAFETY: `srq` is a live struct for the whole call.
        unsafe { reg.record(&raw) };
        assert_eq!(reg.events.get(Some(std::time::Duration::ZERO)).unwrap(), None);
        reg.srqs.lock().insert(0);
        // SAFETY: as above.
        unsafe { reg.record(&raw) };
        let ev = reg.events.get(Some(std::time::Duration::ZERO)).unwrap().unwrap();
        assert_eq!(ev.element, AsyncElement::Srq(0));
        reg.events.ack(ev);
    }
}
