//! Asynchronous events: `ibv_get_async_event` and `ibv_ack_async_event`
//! (`man ibv_get_async_event`), read by one thread per open device.
//!
//! Some failures are reported only here: a CQ overflow (`IBV_EVENT_CQ_ERR`) and a QP
//! that hit a fatal error outside of a work request (`IBV_EVENT_QP_FATAL`,
//! `IBV_EVENT_QP_REQ_ERR`, `IBV_EVENT_QP_ACCESS_ERR`). The thread marks the CQ so that
//! its next poll fails with [`verbs_api::Error::CqOverflow`], records QP errors on the QP,
//! keeps the last events in a bounded log, and acknowledges every event at once (an
//! unacknowledged event makes `ibv_destroy_cq` / `ibv_destroy_qp` wait forever).
//!
//! The thread `poll(2)`s the context's `async_fd` (switched to O_NONBLOCK, as the man
//! page's example does) together with an eventfd; writing the eventfd stops the thread,
//! which the context does in `Drop` before `ibv_close_device`.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Mutex, RwLock};
use rdma_sys::{ibv_ack_async_event, ibv_async_event, ibv_context, ibv_cq, ibv_get_async_event, ibv_qp};
use rustc_hash::FxHashMap;
use verbs_api::{Error, Result};

use crate::errno::last_errno;

/// How many events [`Registry::log`] keeps.
const LOG_CAPACITY: usize = 256;

/// `enum ibv_event_type`, with libibverbs' numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEventKind {
    /// `IBV_EVENT_CQ_ERR`: the CQ overflowed; it is in error.
    CqErr,
    /// `IBV_EVENT_QP_FATAL`: the QP hit an error it cannot report in a completion.
    QpFatal,
    /// `IBV_EVENT_QP_REQ_ERR`: invalid request local work queue error.
    QpReqErr,
    /// `IBV_EVENT_QP_ACCESS_ERR`: local access violation error.
    QpAccessErr,
    /// `IBV_EVENT_COMM_EST`: communication established (first packet in RTR).
    CommEst,
    /// `IBV_EVENT_SQ_DRAINED`: the send queue of a QP in SQD is drained.
    SqDrained,
    /// `IBV_EVENT_PATH_MIG`: path migrated.
    PathMig,
    /// `IBV_EVENT_PATH_MIG_ERR`: path migration failed.
    PathMigErr,
    /// `IBV_EVENT_DEVICE_FATAL`: the device is unusable.
    DeviceFatal,
    /// `IBV_EVENT_PORT_ACTIVE`: a port became active.
    PortActive,
    /// `IBV_EVENT_PORT_ERR`: a port went down.
    PortErr,
    /// `IBV_EVENT_LID_CHANGE`
    LidChange,
    /// `IBV_EVENT_PKEY_CHANGE`
    PkeyChange,
    /// `IBV_EVENT_SM_CHANGE`
    SmChange,
    /// `IBV_EVENT_SRQ_ERR`
    SrqErr,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`
    SrqLimitReached,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`
    QpLastWqeReached,
    /// `IBV_EVENT_CLIENT_REREGISTER`
    ClientReregister,
    /// `IBV_EVENT_GID_CHANGE`
    GidChange,
    /// `IBV_EVENT_WQ_FATAL`
    WqFatal,
    /// A value this crate does not know.
    Other(u32),
}

impl AsyncEventKind {
    /// From the raw `ibv_event_type` value.
    pub fn from_raw(v: u32) -> Self {
        use AsyncEventKind::*;
        match v {
            0 => CqErr,
            1 => QpFatal,
            2 => QpReqErr,
            3 => QpAccessErr,
            4 => CommEst,
            5 => SqDrained,
            6 => PathMig,
            7 => PathMigErr,
            8 => DeviceFatal,
            9 => PortActive,
            10 => PortErr,
            11 => LidChange,
            12 => PkeyChange,
            13 => SmChange,
            14 => SrqErr,
            15 => SrqLimitReached,
            16 => QpLastWqeReached,
            17 => ClientReregister,
            18 => GidChange,
            19 => WqFatal,
            v => Other(v),
        }
    }

    /// Whether the event is about a QP (its element is a `struct ibv_qp *`).
    fn is_qp_event(self) -> bool {
        use AsyncEventKind::*;
        matches!(
            self,
            QpFatal | QpReqErr | QpAccessErr | CommEst | SqDrained | PathMig | PathMigErr | QpLastWqeReached
        )
    }

    /// Whether the event means the QP is in error.
    fn is_qp_error(self) -> bool {
        matches!(
            self,
            AsyncEventKind::QpFatal | AsyncEventKind::QpReqErr | AsyncEventKind::QpAccessErr
        )
    }

    /// Whether the element is a port number.
    fn is_port_event(self) -> bool {
        use AsyncEventKind::*;
        matches!(
            self,
            PortActive | PortErr | LidChange | PkeyChange | SmChange | ClientReregister | GidChange
        )
    }
}

/// One asynchronous event, as the per-device thread saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// The event type.
    pub kind: AsyncEventKind,
    /// The CQ's handle ([`verbs_api::CompletionQueue::handle`]) for `IBV_EVENT_CQ_ERR`.
    pub cq: Option<u32>,
    /// The QP number for QP events.
    pub qp_num: Option<u32>,
    /// The port number for port events.
    pub port: Option<u8>,
}

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
    pub(crate) fatal: Mutex<Option<AsyncEvent>>,
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
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// Registered regions by lkey (for the inline-SGE check). Writers (MR drop) take the
    /// write lock, so a region cannot be deregistered while an inline post reads it.
    pub(crate) mrs: RwLock<FxHashMap<u32, MrSpan>>,
    /// Live CQs by handle.
    pub(crate) cqs: Mutex<HashMap<u32, Arc<CqState>>>,
    /// Live QPs by QP number.
    pub(crate) qps: Mutex<HashMap<u32, Arc<QpState>>>,
    /// The next CQ handle.
    pub(crate) next_cq_handle: AtomicU32,
    /// The last [`LOG_CAPACITY`] events.
    pub(crate) log: Mutex<VecDeque<AsyncEvent>>,
}

impl Registry {
    /// Records one event: marks its CQ or QP and appends it to the log.
    ///
    /// # Safety
    ///
    /// `raw` must come from `ibv_get_async_event` and not yet be acknowledged (so the CQ
    /// or QP it names is still alive: libibverbs destroys neither while an event for it is
    /// unacknowledged).
    unsafe fn record(&self, raw: &RawAsyncEvent) {
        let kind = AsyncEventKind::from_raw(raw.event_type);
        let mut ev = AsyncEvent {
            kind,
            cq: None,
            qp_num: None,
            port: None,
        };
        if kind == AsyncEventKind::CqErr {
            let cq = raw.element as usize as *mut ibv_cq;
            if !cq.is_null() {
                // SAFETY: the event names a live CQ (caller contract); `cq_context` was set
                // to the CQ's handle at creation and never changes.
                let handle = unsafe { (*cq).cq_context } as usize as u32;
                ev.cq = Some(handle);
                if let Some(state) = self.cqs.lock().get(&handle) {
                    state.overflows.fetch_add(1, Ordering::SeqCst);
                }
            }
        } else if kind.is_qp_event() {
            let qp = raw.element as usize as *mut ibv_qp;
            if !qp.is_null() {
                // SAFETY: the event names a live QP (caller contract).
                let qpn = unsafe { (*qp).qp_num };
                ev.qp_num = Some(qpn);
                if kind.is_qp_error() {
                    if let Some(state) = self.qps.lock().get(&qpn) {
                        *state.fatal.lock() = Some(ev);
                    }
                }
            }
        } else if kind.is_port_event() {
            // The union's `int port_num` is its low 4 bytes (x86-64 is little-endian).
            ev.port = u8::try_from(raw.element as u32).ok();
        }
        let mut log = self.log.lock();
        if log.len() == LOG_CAPACITY {
            log.pop_front();
        }
        log.push_back(ev);
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
        assert_eq!(AsyncEventKind::from_raw(0), AsyncEventKind::CqErr);
        assert_eq!(AsyncEventKind::from_raw(1), AsyncEventKind::QpFatal);
        assert_eq!(AsyncEventKind::from_raw(19), AsyncEventKind::WqFatal);
        assert_eq!(AsyncEventKind::from_raw(99), AsyncEventKind::Other(99));
        assert_eq!(
            rdma_sys::ibv_event_type::IBV_EVENT_GID_CHANGE as u32,
            18,
            "numbering follows verbs.h"
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
    fn port_events_decode_the_port() {
        let reg = Registry::default();
        let raw = RawAsyncEvent {
            element: 1,
            event_type: 10,
        };
        // SAFETY: a port event dereferences nothing.
        unsafe { reg.record(&raw) };
        let log = reg.log.lock();
        assert_eq!(log[0].kind, AsyncEventKind::PortErr);
        assert_eq!(log[0].port, Some(1));
    }
}
