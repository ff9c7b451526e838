//! Completion queues and completion channels: `ibv_create_cq` / `ibv_destroy_cq`,
//! `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_create_comp_channel` /
//! `ibv_destroy_comp_channel`, `ibv_get_cq_event` / `ibv_ack_cq_events`
//! (`man ibv_create_cq`, `man ibv_poll_cq`, `man ibv_req_notify_cq`,
//! `man ibv_create_comp_channel`, `man ibv_get_cq_event`).
//!
//! Each CQ gets a handle, unique within its context, stored in `cq_context`, so that
//! `ibv_get_cq_event` (and the async thread, for `IBV_EVENT_CQ_ERR`) map the CQ back to
//! it.
//!
//! # Choices
//!
//! - **Overflow.** libibverbs reports an overflowed CQ only as the asynchronous event
//!   `IBV_EVENT_CQ_ERR`. Once the async thread has seen it, every `poll` fails with
//!   [`Error::CqOverflow`]. libibverbs does not say how many completions were lost;
//!   `lost` is the number of `IBV_EVENT_CQ_ERR` events seen so far, a lower bound (Soft-RoCE
//!   raises one event per dropped completion, which makes it exact there; hardware usually
//!   raises one per overflow, which reads as "at least 1"). Completions polled before the
//!   event arrived were delivered normally.
//! - **Unknown values.** A status outside `enum ibv_wc_status` becomes
//!   [`WcStatus::GeneralErr`]; the raw status is kept in `vendor_err` when the provider
//!   left that 0 (a non-zero vendor syndrome is never overwritten). An unknown opcode
//!   becomes [`WcOpcode::Send`] (the opcode of an error completion is undefined anyway).
//! - **Event accounting.** The CQ counts events taken from its channel and not yet
//!   acknowledged. `ack_events` acknowledges at most that many (acknowledging more would
//!   make `ibv_destroy_cq` wait forever) and Drop acknowledges the rest.

use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::ibv_resize_cq;
use rdma_sys::ibv_wc;
use rdma_sys::{ibv_ack_cq_events, ibv_comp_channel, ibv_cq, ibv_create_comp_channel, ibv_create_cq};
use rdma_sys::{ibv_destroy_comp_channel, ibv_destroy_cq, ibv_get_cq_event, ibv_poll_cq, ibv_req_notify_cq};
use verbs_api::{
    AsyncElement, CompletionChannel, CompletionQueue, Error, Result, WcFlags, WcOpcode, WcStatus,
    WorkCompletion,
};

use crate::async_events::{set_nonblocking, CqState};
use crate::context::CtxInner;
use crate::errno::{last_errno, rc_errno};

/// Completions fetched per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// An all-zero `struct ibv_wc` (a valid value: integers and an integer union).
// SAFETY: all-zero is a valid ibv_wc.
const ZERO_WC: ibv_wc = unsafe { std::mem::zeroed() };

thread_local! {
    /// Where a batch poll lets the provider write. A provider fills only the fields valid
    /// for each completion, so the entries it is handed must be initialized: they are
    /// zeroed once here and each entry again after its completion is read, so that an
    /// empty poll (the common case in a busy loop) zeroes nothing.
    static SCRATCH: std::cell::UnsafeCell<[ibv_wc; POLL_BATCH]> =
        const { std::cell::UnsafeCell::new([ZERO_WC; POLL_BATCH]) };
}

/// Maps one `struct ibv_wc` (see the module docs for unknown values).
#[inline(always)]
pub(crate) fn wc_from_raw(wc: &ibv_wc) -> WorkCompletion {
    let status = WcStatus::from_raw(wc.status);
    let vendor_err = match status {
        None if wc.vendor_err == 0 => wc.status,
        _ => wc.vendor_err,
    };
    let wc_flags = WcFlags::from_bits_truncate(wc.wc_flags);
    let imm_data = if wc_flags.contains(WcFlags::WITH_IMM) {
        // SAFETY: both union variants are u32; the buffer was zeroed before polling, so
        // the bytes are initialized whatever the provider wrote.
        u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })
    } else if wc_flags.intersects(WcFlags::WITH_INV | WcFlags::IP_CSUM_OK) {
        // SAFETY: as above; the invalidated rkey is in host order. rxe marks it with the
        // kernel's IB_WC_WITH_INVALIDATE bit, which reads as IBV_WC_IP_CSUM_OK, rather
        // than IBV_WC_WITH_INV.
        unsafe { wc.imm_data_invalidated_rkey_union.invalidated_rkey }
    } else {
        // Neither immediate data nor an invalidated rkey: whatever the union holds is
        // no value of the completion's.
        0
    };
    WorkCompletion {
        wr_id: wc.wr_id,
        status: status.unwrap_or(WcStatus::GeneralErr),
        opcode: WcOpcode::from_raw(wc.opcode).unwrap_or_default(),
        vendor_err,
        byte_len: wc.byte_len,
        imm_data,
        qp_num: wc.qp_num,
        src_qp: wc.src_qp,
        wc_flags,
        pkey_index: wc.pkey_index,
        slid: wc.slid,
        sl: wc.sl,
        dlid_path_bits: wc.dlid_path_bits,
    }
}

/// The shared part of a completion channel; CQs reporting to it hold an `Arc` of it.
pub(crate) struct ChanInner {
    raw: *mut ibv_comp_channel,
    ctx: Arc<CtxInner>,
}

// SAFETY: `ibv_comp_channel` is safe for multi-threaded access (crate docs); destroyed
// only in Drop, when no CQ uses it (they hold an Arc of it).
unsafe impl Send for ChanInner {}
// SAFETY: as above.
unsafe impl Sync for ChanInner {}

impl Drop for ChanInner {
    fn drop(&mut self) {
        // SAFETY: no CQ reports to this channel any more; destroyed once.
        unsafe { ibv_destroy_comp_channel(self.raw) };
    }
}

/// A completion channel (`struct ibv_comp_channel`). Its fd is non-blocking.
pub struct IbvChannel {
    inner: Arc<ChanInner>,
}

impl std::fmt::Debug for IbvChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvChannel").field("fd", &self.fd()).finish()
    }
}

impl IbvChannel {
    /// `ibv_create_comp_channel`, with the fd switched to O_NONBLOCK.
    pub(crate) fn create(ctx: Arc<CtxInner>) -> Result<IbvChannel> {
        // SAFETY: the context is open (we hold an Arc).
        let raw = unsafe { ibv_create_comp_channel(ctx.raw) };
        if raw.is_null() {
            return Err(Error::from_errno("ibv_create_comp_channel", last_errno()));
        }
        let inner = Arc::new(ChanInner { raw, ctx });
        // SAFETY: the channel is live; `fd` is a plain field.
        set_nonblocking(unsafe { (*raw).fd }, "fcntl(comp_channel fd)")?;
        Ok(IbvChannel { inner })
    }

    /// The `struct ibv_comp_channel *`, valid while this channel or a CQ using it lives.
    pub fn as_raw(&self) -> *mut ibv_comp_channel {
        self.inner.raw
    }
}

impl CompletionChannel for IbvChannel {
    fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let wait_ms: c_int = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    // round up, so that a short timeout still waits
                    c_int::try_from(left.as_micros().div_ceil(1000)).unwrap_or(c_int::MAX)
                }
            };
            let mut pfd = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
            if n < 0 {
                match last_errno() {
                    libc::EINTR => continue,
                    e => return Err(Error::from_errno("poll(comp_channel)", e)),
                }
            }
            if n == 0 {
                return Ok(None);
            }
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut cq_context: *mut c_void = std::ptr::null_mut();
            // SAFETY: the channel is live; both out-pointers are valid.
            if unsafe { ibv_get_cq_event(self.inner.raw, &mut cq, &mut cq_context) } != 0 {
                match last_errno() {
                    // another thread took the event first
                    libc::EAGAIN | libc::EINTR => {
                        if deadline.is_some_and(|d| Instant::now() >= d) {
                            return Ok(None);
                        }
                        continue;
                    }
                    e => return Err(Error::from_errno("ibv_get_cq_event", e)),
                }
            }
            let handle = cq_context as usize as u32;
            {
                let cqs = self.inner.ctx.registry.cqs.lock();
                if let Some(state) = cqs.get(&handle) {
                    state.unacked.fetch_add(1, Ordering::SeqCst);
                    return Ok(Some(handle));
                }
            }
            // The CQ is being dropped: it no longer counts events, so acknowledge this
            // one here (its `ibv_destroy_cq` waits for it, so `cq` is still valid).
            // SAFETY: `cq` was just returned by ibv_get_cq_event and is acknowledged once.
            unsafe { ibv_ack_cq_events(cq, 1) };
        }
    }

    fn fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is a plain field.
        unsafe { (*self.inner.raw).fd }
    }
}

/// The shared part of a CQ; QPs using it hold an `Arc` of it.
pub(crate) struct CqInner {
    pub(crate) raw: *mut ibv_cq,
    handle: u32,
    capacity: std::sync::atomic::AtomicU32,
    state: Arc<CqState>,
    pub(crate) ctx: Arc<CtxInner>,
    /// Dropped after the CQ is destroyed (field drop order follows `Drop::drop`).
    _channel: Option<Arc<ChanInner>>,
}

// SAFETY: `ibv_cq` is safe for multi-threaded access (crate docs: providers lock their
// CQs); destroyed only in Drop, when no QP uses it (they hold an Arc of it).
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // Leave the table first: from now on get_cq_event acknowledges events for this
        // CQ itself, so the count below is final, and no asynchronous event for it is
        // queued after `forget`, which waits for those the application took.
        self.ctx.registry.cqs.lock().remove(&self.handle);
        self.ctx.registry.events.forget(AsyncElement::Cq(self.handle));
        let unacked = self.state.unacked.swap(0, Ordering::SeqCst);
        if unacked > 0 {
            // SAFETY: the CQ is live; these events were taken and never acknowledged.
            unsafe { ibv_ack_cq_events(self.raw, unacked) };
        }
        // SAFETY: no QP uses the CQ (they hold an Arc); every event taken is acknowledged;
        // destroyed once.
        unsafe { ibv_destroy_cq(self.raw) };
    }
}

/// A completion queue (`struct ibv_cq`).
pub struct IbvCq {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for IbvCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvCq")
            .field("handle", &self.inner.handle)
            .field("capacity", &self.inner.capacity.load(Ordering::Relaxed))
            .finish()
    }
}

impl IbvCq {
    /// `ibv_create_cq` with `cq_context` = `handle`, on comp vector 0.
    pub(crate) fn create(
        ctx: Arc<CtxInner>,
        cqe: u32,
        channel: Option<&IbvChannel>,
        handle: u32,
    ) -> Result<IbvCq> {
        let n = c_int::try_from(cqe)
            .map_err(|_| Error::invalid("ibv_create_cq", format!("cqe {cqe} exceeds INT_MAX")))?;
        if let Some(ch) = channel {
            if !Arc::ptr_eq(&ch.inner.ctx, &ctx) {
                return Err(Error::invalid(
                    "ibv_create_cq",
                    "the completion channel belongs to another device context",
                ));
            }
        }
        let chan_raw = channel.map_or(std::ptr::null_mut(), |c| c.inner.raw);
        let state = Arc::new(CqState::default());
        // Enter the table before the CQ exists, so that no event can miss it.
        ctx.registry.cqs.lock().insert(handle, state.clone());
        // SAFETY: the context is open and the channel (if any) live; cq_context is an
        // opaque integer that libibverbs hands back.
        let raw = unsafe { ibv_create_cq(ctx.raw, n, handle as usize as *mut c_void, chan_raw, 0) };
        if raw.is_null() {
            let e = last_errno();
            ctx.registry.cqs.lock().remove(&handle);
            return Err(match e {
                libc::EINVAL => Error::invalid(
                    "ibv_create_cq",
                    format!("cqe {cqe} is out of range for this device (see max_cqe)"),
                ),
                libc::ENOMEM => Error::NoMemory {
                    call: "ibv_create_cq",
                    reason: format!("cannot allocate a CQ of {cqe} entries"),
                },
                e => Error::from_errno("ibv_create_cq", e),
            });
        }
        // SAFETY: the CQ is live; `cqe` is a plain field (the granted size).
        let capacity = u32::try_from(unsafe { (*raw).cqe }).unwrap_or(0);
        Ok(IbvCq {
            inner: Arc::new(CqInner {
                raw,
                handle,
                capacity: capacity.into(),
                state,
                ctx,
                _channel: channel.map(|c| c.inner.clone()),
            }),
        })
    }

    /// The `struct ibv_cq *`, valid while this CQ or a QP using it lives.
    pub fn as_raw(&self) -> *mut ibv_cq {
        self.inner.raw
    }

    /// The overflow error, if the CQ overflowed.
    #[cold]
    #[inline(never)]
    fn overflow(&self) -> Option<Error> {
        match self.inner.state.overflows.load(Ordering::SeqCst) {
            0 => None,
            lost => Some(Error::CqOverflow {
                cq: self.inner.handle,
                lost,
            }),
        }
    }
}

impl IbvCq {
    /// `ibv_poll_cq` for one entry: the commonest poll, without the batch loop.
    #[inline(always)]
    fn poll_one(&self, dst: &mut WorkCompletion) -> Result<usize> {
        // Zeroed, so that every byte the provider does not write is initialized.
        let mut raw = MaybeUninit::<ibv_wc>::zeroed();
        // SAFETY: the CQ is live; `raw` has room for one entry.
        let n = unsafe { ibv_poll_cq(self.inner.raw, 1, raw.as_mut_ptr()) };
        if n <= 0 {
            return if n == 0 { Ok(0) } else { Err(poll_failed(n)) };
        }
        // SAFETY: zeroed above (all-zero is a valid ibv_wc), then written by the provider.
        *dst = wc_from_raw(unsafe { raw.assume_init_ref() });
        Ok(1)
    }
}

/// The error of a failed `ibv_poll_cq`.
#[cold]
#[inline(never)]
fn poll_failed(rc: c_int) -> Error {
    Error::from_errno("ibv_poll_cq", rc_errno(rc))
}

impl CompletionQueue for IbvCq {
    #[inline]
    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        if self.inner.state.overflows.load(Ordering::SeqCst) != 0 {
            return Err(self.overflow().unwrap_or(Error::CqOverflow {
                cq: self.inner.handle,
                lost: 1,
            }));
        }
        if let [one] = wc {
            return self.poll_one(one);
        }
        SCRATCH.with(|scratch| {
            // SAFETY: the buffer is this thread's and nothing else borrows it: poll does
            // not call back into user code, so it cannot be re-entered on this thread.
            let raw = unsafe { &mut *scratch.get() };
            let base = raw.as_mut_ptr();
            let mut done = 0;
            while done < wc.len() {
                let want = (wc.len() - done).min(POLL_BATCH);
                // SAFETY: the CQ is live; `base` has room for `want` entries, all zeroed.
                let n = unsafe { ibv_poll_cq(self.inner.raw, want as c_int, base) };
                if n < 0 {
                    return Err(poll_failed(n));
                }
                let n = (n as usize).min(want);
                for (dst, src) in wc[done..done + n].iter_mut().zip(raw[..n].iter_mut()) {
                    *dst = wc_from_raw(src);
                    // Zeroed again for the next poll (see SCRATCH).
                    *src = ZERO_WC;
                }
                done += n;
                if n < want {
                    break;
                }
            }
            Ok(done)
        })
    }

    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // SAFETY: the CQ is live.
        let rc = unsafe { ibv_req_notify_cq(self.inner.raw, solicited_only as c_int) };
        if rc != 0 {
            return Err(Error::from_errno("ibv_req_notify_cq", rc_errno(rc)));
        }
        Ok(())
    }

    fn ack_events(&self, n: u32) {
        // Acknowledge at most what was taken: over-acknowledging would make
        // ibv_destroy_cq wait forever.
        let taken = self
            .inner
            .state
            .unacked
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| Some(u - u.min(n)))
            .unwrap_or(0);
        let k = taken.min(n);
        if k > 0 {
            // SAFETY: the CQ is live; `k` events were taken and not yet acknowledged.
            unsafe { ibv_ack_cq_events(self.inner.raw, k) };
        }
    }

    fn capacity(&self) -> u32 {
        self.inner.capacity.load(Ordering::Relaxed)
    }

    fn resize(&self, cqe: u32) -> Result<()> {
        let n = c_int::try_from(cqe)
            .map_err(|_| Error::invalid("ibv_resize_cq", format!("cqe {cqe} exceeds INT_MAX")))?;
        // SAFETY: the CQ is live; the provider resizes it under its own lock.
        let rc = unsafe { ibv_resize_cq(self.inner.raw, n) };
        if rc != 0 {
            return Err(Error::from_errno("ibv_resize_cq", rc_errno(rc)));
        }
        // SAFETY: the CQ is live; `cqe` is a plain field the call just updated.
        let granted = unsafe { (*self.inner.raw).cqe };
        self.inner
            .capacity
            .store(u32::try_from(granted).unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }

    fn handle(&self) -> u32 {
        self.inner.handle
    }

    fn channel_fd(&self) -> Option<RawFd> {
        // SAFETY: a channel the CQ reports to lives at least as long as the CQ (it holds
        // an Arc of it); `fd` is a plain field.
        self.inner._channel.as_ref().map(|ch| unsafe { (*ch.raw).fd })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_sys::{ibv_wc_opcode as O, ibv_wc_status as S};

    fn raw_wc() -> ibv_wc {
        // SAFETY: all-zero is a valid ibv_wc.
        unsafe { std::mem::zeroed() }
    }

    #[test]
    fn recv_with_imm_is_converted_to_host_order() {
        let mut w = raw_wc();
        w.wr_id = 77;
        w.status = S::IBV_WC_SUCCESS;
        w.opcode = O::IBV_WC_RECV;
        w.byte_len = 4096;
        w.imm_data_invalidated_rkey_union.imm_data = 0x1234_5678u32.to_be();
        w.wc_flags = rdma_sys::ibv_wc_flags::IBV_WC_WITH_IMM.0;
        w.qp_num = 0x11;
        w.src_qp = 0x22;
        w.pkey_index = 3;
        w.slid = 4;
        w.sl = 5;
        w.dlid_path_bits = 6;
        let wc = wc_from_raw(&w);
        assert_eq!(
            wc,
            WorkCompletion {
                wr_id: 77,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                vendor_err: 0,
                byte_len: 4096,
                imm_data: 0x1234_5678,
                qp_num: 0x11,
                src_qp: 0x22,
                wc_flags: WcFlags::WITH_IMM,
                pkey_index: 3,
                slid: 4,
                sl: 5,
                dlid_path_bits: 6,
            }
        );
        assert_eq!(wc.imm(), Some(0x1234_5678));
    }

    #[test]
    fn imm_is_ignored_without_the_flag() {
        let mut w = raw_wc();
        w.opcode = O::IBV_WC_RECV_RDMA_WITH_IMM;
        w.imm_data_invalidated_rkey_union.imm_data = 0xdead_beef;
        let wc = wc_from_raw(&w);
        assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc.imm(), None);
        assert_eq!(wc.imm_data, 0);
    }

    #[test]
    fn every_known_status_maps_one_to_one() {
        for raw in 0..=S::IBV_WC_TM_RNDV_INCOMPLETE {
            let mut w = raw_wc();
            w.status = raw;
            let wc = wc_from_raw(&w);
            assert_eq!(wc.status as u32, raw);
            assert_eq!(wc.vendor_err, 0);
        }
        let mut w = raw_wc();
        w.status = S::IBV_WC_REM_ACCESS_ERR;
        w.vendor_err = 0x88;
        assert_eq!(wc_from_raw(&w).status, WcStatus::RemAccessErr);
        assert_eq!(wc_from_raw(&w).vendor_err, 0x88);
    }

    #[test]
    fn unknown_status_becomes_general_err_keeping_the_raw_value() {
        let mut w = raw_wc();
        w.status = 200;
        let wc = wc_from_raw(&w);
        assert_eq!(wc.status, WcStatus::GeneralErr);
        assert_eq!(wc.vendor_err, 200);
        w.vendor_err = 0x51;
        assert_eq!(
            wc_from_raw(&w).vendor_err,
            0x51,
            "a vendor syndrome is never overwritten"
        );
        w.opcode = 77;
        assert_eq!(wc_from_raw(&w).opcode, WcOpcode::Send);
    }

    #[test]
    fn opcode_numbering_matches_verbs_h() {
        for (raw, op) in [
            (O::IBV_WC_SEND, WcOpcode::Send),
            (O::IBV_WC_RDMA_WRITE, WcOpcode::RdmaWrite),
            (O::IBV_WC_RDMA_READ, WcOpcode::RdmaRead),
            (O::IBV_WC_COMP_SWAP, WcOpcode::CompSwap),
            (O::IBV_WC_FETCH_ADD, WcOpcode::FetchAdd),
            (O::IBV_WC_RECV, WcOpcode::Recv),
            (O::IBV_WC_RECV_RDMA_WITH_IMM, WcOpcode::RecvRdmaWithImm),
        ] {
            let mut w = raw_wc();
            w.opcode = raw;
            assert_eq!(wc_from_raw(&w).opcode, op);
        }
    }
}
