//! One registered memory region and a byte range inside it (`man ibv_reg_mr`): where the
//! region's bytes are, which PD it belongs to, its access flags and its key, and the one
//! way the data path touches those bytes.
//!
//! - [`MrShared`] is one region. Owned regions free their buffer when the last reference
//!   goes; regions over caller memory are fenced by [`MrShared::kill`], which waits until
//!   no data-path copy is inside the region (each copy *pins* it).
//! - [`Seg`] is a range of one region, as an access check grants it: every copy into or
//!   out of it, and every atomic on it, happens under a pin.
//!
//! No `&[u8]` into registered memory is ever created: copies use raw pointers while the
//! region is pinned, and atomics use `AtomicU64::from_ptr` on aligned words.
//!
//! This is the bottom of the memory modules: a window ([`crate::window`]) is bound to a
//! region, and the table ([`crate::memory`]) finds regions and windows by key and checks
//! accesses; neither is named here. The crate's users reach these types as
//! `memory::MrShared` and `memory::Seg`.

use std::alloc::Layout;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use verbs_api::AccessFlags;

const DEAD: u32 = 1 << 31;

/// One registered memory region.
pub struct MrShared {
    /// Handle of the PD it belongs to.
    pub pd: u32,
    /// Its key (lkey == rkey).
    pub key: u32,
    /// Access flags.
    pub access: AccessFlags,
    base: *mut u8,
    len: usize,
    owned: Option<Layout>,
    /// DEAD bit | number of copies in progress.
    state: AtomicU32,
}

// SAFETY: `base` points to memory that is valid for the region's life (owned: freed only in
// Drop; caller memory: kept valid by the caller until `kill` returns, per `reg_mr_raw`'s
// contract). All access goes through raw-pointer copies under a pin or through atomics, so
// sharing the descriptor between threads is sound.
unsafe impl Send for MrShared {}
// SAFETY: see `Send`; the only interior mutability is the atomic `state`.
unsafe impl Sync for MrShared {}

impl MrShared {
    /// A zeroed, page-aligned owned buffer of `len` bytes.
    pub fn new_owned(pd: u32, key: u32, len: usize, access: AccessFlags) -> Option<MrShared> {
        let layout = Layout::from_size_align(len.max(1), 4096).ok()?;
        // SAFETY: the layout has non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            return None;
        }
        Some(MrShared {
            pd,
            key,
            access,
            base,
            len,
            owned: Some(layout),
            state: AtomicU32::new(0),
        })
    }

    /// A region over caller memory.
    ///
    /// # Safety
    ///
    /// `base..base + len` must stay valid for reads and writes until [`MrShared::kill`]
    /// has returned.
    pub unsafe fn new_borrowed(
        pd: u32,
        key: u32,
        base: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> MrShared {
        MrShared {
            pd,
            key,
            access,
            base,
            len,
            owned: None,
            state: AtomicU32::new(0),
        }
    }

    /// Start of the region.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// Length of the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The region's first address as the HCA sees it.
    pub fn addr(&self) -> u64 {
        self.base as u64
    }

    /// Offset of `[addr, addr + len)` inside the region, if it lies inside.
    pub fn offset_of(&self, addr: u64, len: u64) -> Option<usize> {
        let off = addr.checked_sub(self.addr())?;
        let end = off.checked_add(len)?;
        (end <= self.len as u64).then_some(off as usize)
    }

    /// Pins the region for one copy; false if it is dead. Every successful `pin` must be
    /// followed by one `unpin`.
    pub(crate) fn pin(&self) -> bool {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            if s & DEAD != 0 {
                return false;
            }
            match self
                .state
                .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
    }

    /// Ends a copy started with `pin`.
    pub(crate) fn unpin(&self) {
        self.state.fetch_sub(1, Ordering::Release);
    }

    /// Fences the region: after this returns, no data-path copy touches its memory any
    /// more (those in progress have finished, later ones see it dead and skip).
    pub fn kill(&self) {
        self.state.fetch_or(DEAD, Ordering::AcqRel);
        while self.state.load(Ordering::Acquire) & !DEAD != 0 {
            std::hint::spin_loop();
            std::thread::yield_now();
        }
    }

    /// Whether [`MrShared::kill`] has run.
    pub fn is_dead(&self) -> bool {
        self.state.load(Ordering::Acquire) & DEAD != 0
    }

    /// Copies bytes at `offset` out of the region into `dst` (`offset + dst.len()` must
    /// lie inside the region; clamped if not). Returns false if the region was
    /// deregistered: `dst` is zeroed then, and must not be passed off as the region's
    /// bytes.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> bool {
        let offset = offset.min(self.len);
        let n = dst.len().min(self.len - offset);
        if !self.pin() {
            dst.fill(0);
            return false;
        }
        // SAFETY: `offset + n <= len` (clamped above), inside the region, which the pin
        // keeps valid (see `kill`).
        let src = unsafe { self.base.add(offset) };
        if n == 8 && src as usize % 8 == 0 {
            // An aligned word: one atomic load (see `Seg::copy_in`).
            // SAFETY: aligned, in bounds, pinned.
            let v = unsafe { AtomicU64::from_ptr(src.cast()) }.load(Ordering::SeqCst);
            dst[..8].copy_from_slice(&v.to_ne_bytes());
        } else {
            // SAFETY: `src..src + n` is inside the pinned region; `dst` is ordinary memory
            // of at least `n` bytes, distinct from the region.
            unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), n) }
        }
        self.unpin();
        true
    }
}

impl Drop for MrShared {
    fn drop(&mut self) {
        if let Some(layout) = self.owned {
            // SAFETY: allocated in `new_owned` with this layout; no pins can exist because
            // pins are only taken through an `Arc<MrShared>` that is being dropped.
            unsafe { std::alloc::dealloc(self.base, layout) };
        }
    }
}

/// A byte range inside one registered region, held alive by an `Arc`.
#[derive(Clone)]
pub struct Seg {
    /// The region.
    pub mr: Arc<MrShared>,
    /// Offset of the range in the region.
    pub offset: usize,
    /// Length of the range.
    pub len: usize,
}

impl std::fmt::Debug for Seg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Seg(key {:#x} +{} len {})", self.mr.key, self.offset, self.len)
    }
}

impl Seg {
    /// Runs `f` with a pointer to the range while the region is pinned; `None` if the
    /// region has been deregistered.
    pub fn with_ptr<R>(&self, f: impl FnOnce(*mut u8) -> R) -> Option<R> {
        if !self.mr.pin() {
            return None;
        }
        // SAFETY: `offset + len <= mr.len` is an invariant of every `Seg` built by this
        // module, and the pin keeps caller memory valid (see `MrShared::kill`).
        let r = f(unsafe { self.mr.base.add(self.offset) });
        self.mr.unpin();
        Some(r)
    }

    /// Copies `src` into the range at byte `at` (`at + src.len() <= len`). Returns false
    /// if the region was deregistered (nothing is written then).
    pub fn copy_in(&self, at: usize, src: &[u8]) -> bool {
        debug_assert!(at + src.len() <= self.len);
        let n = src.len().min(self.len.saturating_sub(at));
        self.with_ptr(|p| {
            // SAFETY: `at + n <= len`, inside the pinned range.
            let dst = unsafe { p.add(at) };
            if n == 8 && dst as usize % 8 == 0 {
                // An aligned word: one atomic store, so it never tears against atomics
                // or against the application's `read_u64`.
                let mut w = [0u8; 8];
                w.copy_from_slice(&src[..8]);
                // SAFETY: aligned, in bounds, pinned; every access to aligned words of a
                // region by the sim is atomic.
                unsafe { AtomicU64::from_ptr(dst.cast()) }.store(u64::from_ne_bytes(w), Ordering::SeqCst);
                return;
            }
            // SAFETY: `at + n <= len` (clamped above), so the destination lies inside the
            // pinned range; `src` is ordinary memory distinct from the region.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p.add(at), n) }
        })
        .is_some()
    }

    /// Copies bytes at `at` out of the range into `dst`. Returns false if the region was
    /// deregistered: `dst` is zeroed then, and must not be passed off as the region's bytes.
    pub fn copy_out(&self, at: usize, dst: &mut [u8]) -> bool {
        // Within the range: at most `len - at` bytes.
        let n = dst.len().min(self.len.saturating_sub(at));
        let ok = self.mr.copy_out(self.offset + at.min(self.len), &mut dst[..n]);
        if !ok {
            dst.fill(0);
        }
        ok
    }

    /// Runs `f` on the 64-bit word at the start of the range as an atomic. The range must
    /// be 8 bytes at an 8-byte aligned address (checked by `resolve_remote`).
    pub fn atomic<R>(&self, f: impl FnOnce(&AtomicU64) -> R) -> Option<R> {
        debug_assert!(self.len >= 8);
        self.with_ptr(|p| {
            debug_assert_eq!(p as usize % 8, 0);
            // SAFETY: `p` is 8-byte aligned (checked before the Seg was built), in bounds
            // and pinned; every HCA access to aligned words of a region is atomic.
            f(unsafe { AtomicU64::from_ptr(p.cast()) })
        })
    }
}

/// The bytes `at..at + len` of the scatter list `segs`, as ranges of the same regions:
/// where a part of a message goes (the responder) or comes from (the requester resuming
/// a message at a packet boundary).
pub(crate) fn slice(segs: &[Seg], mut at: usize, len: usize) -> Vec<Seg> {
    let mut out = Vec::new();
    let mut left = len;
    for s in segs {
        if left == 0 {
            break;
        }
        if at >= s.len {
            at -= s.len;
            continue;
        }
        let n = (s.len - at).min(left);
        out.push(Seg {
            mr: s.mr.clone(),
            offset: s.offset + at,
            len: n,
        });
        left -= n;
        at = 0;
    }
    out
}
