//! Registered memory and the access checks every data path goes through
//! (`man ibv_reg_mr`; IBA 10.6 "Memory management", 9.7.4.1.4 / C9-xx responder checks).
//!
//! - [`MrShared`] is one registered region and [`Seg`] a range inside it (both defined
//!   in the crate's private `region` module, below this one and below [`crate::window`]):
//!   where its bytes are, which PD it belongs to, its access flags and its key. Owned
//!   regions free their buffer when the last reference goes; regions over caller memory
//!   are fenced by [`MrShared::kill`], which waits until no data-path copy is inside the
//!   region (each copy *pins* it).
//! - [`MrTable`] maps keys to regions. Keys are random 32-bit values (never sequential),
//!   unique on the device; lkey and rkey are the same value, as on ConnectX and rxe. It
//!   remembers the keys of the last [`RETIRED_KEYS`] deregistered regions, so that a
//!   request naming one is refused as such, and hands none of them out again meanwhile.
//! - [`MrTable::resolve_local`] checks a gather/scatter list (lkey exists, same PD, inside
//!   the region, `LOCAL_WRITE` when the HCA writes): a failure is `IBV_WC_LOC_PROT_ERR`.
//! - [`MrTable::resolve_remote`] is the one remote access check: rkey exists, same PD as
//!   the responder QP, the QP's and the region's access flags allow the operation, the
//!   range lies inside the region, and atomics are 8 bytes and 8-byte aligned. An rkey
//!   that names a memory window ([`crate::window`]) is checked against the window
//!   instead: bound, of the QP's PD, for a type 2 window bound to that QP, its rights,
//!   and the range inside the window (inside its region, on a device that checks that
//!   only: rxe).
//! - The table keeps the device's windows too, by the upper 24 bits of their rkeys, and
//!   binds and invalidates them ([`MrTable::bind_window`], [`MrTable::invalidate`]).
//!   Region keys and window indexes never overlap: a region's key never has a window's
//!   index as its upper 24 bits, so an rkey names one or the other.
//!
//! The access check follows an rkey to a window and the window to its region, so the
//! modules stack that way: this table over [`crate::window`] over the region.

use std::sync::Arc;

use parking_lot::RwLock;
use rustc_hash::FxHashMap;
use verbs_api::{AccessFlags, MwType, Sge};

pub use crate::region::{MrShared, Seg};
use crate::window::{self, BindError, BindReq, InvalidateError, Invalidator, MwShared, OnQp};

/// Why a remote access was refused (all complete as `IBV_WC_REM_ACCESS_ERR` except
/// `Misaligned`, which is an invalid request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteAccessError {
    /// No region or window with this rkey, and none had it among the last
    /// [`RETIRED_KEYS`] deregistered.
    BadKey,
    /// The rkey named a region that has been deregistered (or a window deallocated).
    Deregistered,
    /// The rkey names a memory window that is not bound (never bound, unbound, or
    /// invalidated).
    UnboundWindow,
    /// The rkey names a memory window whose rkey has another tag now (it was bound
    /// again since).
    StaleWindowKey,
    /// The rkey names a type 2 memory window bound to another QP.
    WindowOfOtherQp,
    /// The memory window does not grant the operation.
    WindowAccess,
    /// The range leaves the memory window.
    OutsideWindow,
    /// The region belongs to another PD than the responder QP.
    WrongPd,
    /// The QP's `qp_access_flags` do not allow the operation.
    QpAccess,
    /// The region's access flags do not allow the operation.
    MrAccess,
    /// The range leaves the region.
    OutOfBounds,
    /// An atomic on an address that is not 8-byte aligned.
    Misaligned,
}

/// Why a local SGE was refused (`IBV_WC_LOC_PROT_ERR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalAccessError {
    /// No region with this lkey.
    BadKey,
    /// The region belongs to another PD than the QP.
    WrongPd,
    /// The HCA must write, but the region lacks `LOCAL_WRITE`.
    NoLocalWrite,
    /// The SGE leaves the region.
    OutOfBounds,
}

/// How many keys of deregistered regions a [`MrTable`] remembers.
pub const RETIRED_KEYS: usize = 1024;

/// The keys of the regions deregistered last, oldest overwritten first: a request that
/// names one is refused as [`RemoteAccessError::Deregistered`] rather than as a key that
/// never existed, in bounded memory (4 KiB). Looked through only when a key is not found,
/// and when a new key is chosen.
#[derive(Default)]
struct Retired {
    keys: Vec<u32>,
    /// Where the next key goes once `keys` is full.
    next: usize,
}

impl Retired {
    fn add(&mut self, key: u32) {
        if self.keys.len() < RETIRED_KEYS {
            self.keys.push(key);
        } else {
            self.keys[self.next] = key;
            self.next = (self.next + 1) % RETIRED_KEYS;
        }
    }

    fn contains(&self, key: u32) -> bool {
        self.keys.contains(&key)
    }
}

#[derive(Default)]
struct Keys {
    map: FxHashMap<u32, Arc<MrShared>>,
    retired: Retired,
    /// Memory windows, by the upper 24 bits of their rkeys.
    windows: FxHashMap<u32, Arc<MwShared>>,
}

impl Keys {
    /// Whether a region key or a retired key has `index` as its upper 24 bits (which a
    /// new window's index must not have).
    fn index_of_a_region(&self, index: u32) -> bool {
        (0..=0xffu32).any(|tag| self.map.contains_key(&(index << 8 | tag)))
            || self.retired.keys.iter().any(|k| k >> 8 == index)
    }
}

/// The responder QP a remote request arrived on, as the access check sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its PD.
    pub pd: u32,
    /// Its number (a type 2 window serves the QP it is bound to only).
    pub qpn: u32,
    /// Its `qp_access_flags`.
    pub access: AccessFlags,
    /// Check an access through a window against the bounds of the window's region
    /// rather than the window's own (`Switches::mw_region_bounds`, rxe's).
    pub region_bounds: bool,
}

/// The regions of one device, by key. Keys are random, so the map uses the fast
/// (non-keyed) Fx hash: every SEND, WRITE and inline post looks one up.
#[derive(Default)]
pub struct MrTable {
    keys: RwLock<Keys>,
}

impl MrTable {
    /// A key that is not in use: drawn from `draw` (the device passes a CSPRNG, so keys
    /// are not guessable in sequence; this crate reads no entropy of its own), non-zero,
    /// and not one of the recently deregistered keys, so that a stale rkey a peer still
    /// holds never reaches a new region (and is reported as deregistered, which it is).
    pub fn fresh_key(&self, mut draw: impl FnMut() -> u32) -> u32 {
        let keys = self.keys.read();
        loop {
            let k: u32 = draw();
            if k != 0
                && !keys.map.contains_key(&k)
                && !keys.retired.contains(k)
                && !keys.windows.contains_key(&(k >> 8))
            {
                return k;
            }
        }
    }

    /// `ibv_alloc_mw`: a new window of PD `pd`, not bound, with an rkey whose index
    /// (upper 24 bits) is drawn from `draw` (as [`MrTable::fresh_key`]'s keys) and is
    /// neither a window's nor the upper bits of a region's key, and whose tag is drawn too.
    pub fn alloc_window(&self, pd: u32, mw_type: MwType, mut draw: impl FnMut() -> u32) -> Arc<MwShared> {
        let mut keys = self.keys.write();
        loop {
            let r = draw();
            let index = r >> 8;
            if index == 0 || keys.windows.contains_key(&index) || keys.index_of_a_region(index) {
                continue;
            }
            let mw = Arc::new(MwShared::new(pd, mw_type, r));
            keys.windows.insert(index, mw.clone());
            return mw;
        }
    }

    /// `ibv_dealloc_mw`: the window leaves the table, bound or not; its rkey is refused
    /// from now on (as deallocated, while it is among the last [`RETIRED_KEYS`]).
    pub fn dealloc_window(&self, mw: &Arc<MwShared>) {
        let mut keys = self.keys.write();
        let rkey = mw.rkey();
        if keys.windows.get(&(rkey >> 8)).is_some_and(|w| Arc::ptr_eq(w, mw)) {
            keys.windows.remove(&(rkey >> 8));
            keys.retired.add(rkey);
        }
        mw.kill();
    }

    /// How many windows are bound to the region with key `key`.
    pub fn windows_bound_to(&self, key: u32) -> usize {
        let keys = self.keys.read();
        keys.windows
            .values()
            .filter(|w| w.bound_mr() == Some(key))
            .count()
    }

    /// Executes a bind of the send queue of QP `on` (`IBV_WR_BIND_MW`, see
    /// [`crate::window`]); `owner_checks`: `Switches::mw_owner_checks`.
    pub fn bind_window(&self, req: &BindReq, on: OnQp, owner_checks: bool) -> Result<(), BindError> {
        let mr = req.mr_key.and_then(|k| self.get(k));
        window::bind(req, mr, on, owner_checks)
    }

    /// Invalidates the window `rkey` names for `who` (`IBV_WR_LOCAL_INV`, or a peer's
    /// SEND_WITH_INV), or with `apply` false checks only that it may.
    pub fn invalidate(
        &self,
        rkey: u32,
        who: Invalidator,
        owner_checks: bool,
        apply: bool,
    ) -> Result<(), InvalidateError> {
        let keys = self.keys.read();
        let mw = keys.windows.get(&(rkey >> 8)).ok_or(InvalidateError::NotWindow)?;
        window::invalidate(mw, rkey, who, owner_checks, apply)
    }

    /// Adds a region.
    pub fn insert(&self, mr: Arc<MrShared>) {
        self.keys.write().map.insert(mr.key, mr);
    }

    /// Removes a region: from now on its key resolves to nothing, and is remembered as
    /// deregistered (among the last [`RETIRED_KEYS`]).
    pub fn remove(&self, key: u32) -> Option<Arc<MrShared>> {
        let mut keys = self.keys.write();
        let mr = keys.map.remove(&key);
        if mr.is_some() {
            keys.retired.add(key);
        }
        mr
    }

    /// Deregisters `mr` (`ibv_dereg_mr`): its key resolves to nothing from now on, and
    /// once this returns no copy touches its memory (those in progress have finished).
    pub fn deregister(&self, mr: &MrShared) {
        self.remove(mr.key);
        mr.kill();
    }

    /// Looks a key up.
    pub fn get(&self, key: u32) -> Option<Arc<MrShared>> {
        self.keys.read().map.get(&key).cloned()
    }

    /// Whether `key` named a region deregistered lately (one of the last
    /// [`RETIRED_KEYS`]) and names none now.
    pub fn was_deregistered(&self, key: u32) -> bool {
        let keys = self.keys.read();
        !keys.map.contains_key(&key) && keys.retired.contains(key)
    }

    /// Number of registered regions.
    pub fn len(&self) -> usize {
        self.keys.read().map.len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves a local gather/scatter list of a QP in PD `pd` into `out` (cleared first)
    /// and returns its total length. Zero-length SGEs are skipped without a key check.
    pub fn resolve_local(
        &self,
        pd: u32,
        sges: &[Sge],
        need_write: bool,
        out: &mut Vec<Seg>,
    ) -> Result<u64, LocalAccessError> {
        out.clear();
        self.for_each_local(Some(pd), sges, need_write, |mr, offset, len| {
            out.push(Seg {
                mr: mr.clone(),
                offset,
                len,
            });
            true
        })
    }

    /// Copies the bytes of an inline WR's gather list to the end of `out` (read by the CPU
    /// at post time): each SGE must lie inside the region of this device its lkey names,
    /// the verbs API's rule for inline data, which lets no stray pointer be read. The
    /// region's PD is not checked, as an HCA does not check an inline SGE's lkey at all
    /// (`man ibv_post_send`: IBV_SEND_INLINE, "the L_Key will not be checked"), and the
    /// libibverbs backend lets any region of the context through. `Ok(false)`: a region
    /// was deregistered before its bytes were read. Cheaper than resolving and then
    /// copying: no `Seg` and no reference count per SGE (the table's lock keeps the
    /// regions while they are read).
    pub fn gather_inline(&self, sges: &[Sge], out: &mut Vec<u8>) -> Result<bool, LocalAccessError> {
        let mut copied = true;
        self.for_each_local(None, sges, false, |mr, offset, len| {
            let at = out.len();
            out.resize(at + len, 0);
            copied = mr.copy_out(offset, &mut out[at..]);
            copied
        })?;
        Ok(copied)
    }

    /// Checks each non-empty SGE of a local list (key, PD unless `pd` is `None`,
    /// `LOCAL_WRITE` if `need_write`, bounds) and hands its region, offset and length to
    /// `f`, under the table's read lock, stopping early when `f` returns false. Returns
    /// the list's total length.
    fn for_each_local(
        &self,
        pd: Option<u32>,
        sges: &[Sge],
        need_write: bool,
        mut f: impl FnMut(&Arc<MrShared>, usize, usize) -> bool,
    ) -> Result<u64, LocalAccessError> {
        let keys = self.keys.read();
        let map = &keys.map;
        let mut total = 0u64;
        for s in sges {
            if s.length == 0 {
                continue;
            }
            let mr = map.get(&s.lkey).ok_or(LocalAccessError::BadKey)?;
            if pd.is_some_and(|pd| mr.pd != pd) {
                return Err(LocalAccessError::WrongPd);
            }
            if need_write && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(LocalAccessError::NoLocalWrite);
            }
            let offset = mr
                .offset_of(s.addr, s.length as u64)
                .ok_or(LocalAccessError::OutOfBounds)?;
            total += s.length as u64;
            if !f(mr, offset, s.length as usize) {
                break;
            }
        }
        Ok(total)
    }

    /// The remote access check of a request arriving on QP `at`. `need` is the one right
    /// the operation needs (`REMOTE_WRITE`, `REMOTE_READ` or `REMOTE_ATOMIC`). Returns
    /// `Ok(None)` for a zero-length READ or WRITE, which touches no memory and checks no
    /// key (IBA 9.4.1.1).
    pub fn resolve_remote(
        &self,
        at: &Target,
        rkey: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Option<Seg>, RemoteAccessError> {
        let atomic = need == AccessFlags::REMOTE_ATOMIC;
        if !at.access.contains(need) {
            return Err(RemoteAccessError::QpAccess);
        }
        if len == 0 && !atomic {
            return Ok(None);
        }
        if atomic && addr % 8 != 0 {
            return Err(RemoteAccessError::Misaligned);
        }
        let keys = self.keys.read();
        let Some(mr) = keys.map.get(&rkey) else {
            if let Some(mw) = keys.windows.get(&(rkey >> 8)) {
                return through_window(mw, at, rkey, addr, len, need).map(Some);
            }
            return Err(if keys.retired.contains(rkey) {
                RemoteAccessError::Deregistered
            } else {
                RemoteAccessError::BadKey
            });
        };
        if mr.pd != at.pd {
            return Err(RemoteAccessError::WrongPd);
        }
        if !mr.access.contains(need) {
            return Err(RemoteAccessError::MrAccess);
        }
        let offset = mr.offset_of(addr, len).ok_or(RemoteAccessError::OutOfBounds)?;
        Ok(Some(Seg {
            mr: mr.clone(),
            offset,
            len: len as usize,
        }))
    }
}

/// The remote access check of an rkey that names window `mw` (IBA 10.6.7.2: the
/// window's rkey, bound, its PD, its QP for type 2, its rights, its range), after the
/// QP's checks.
fn through_window(
    mw: &MwShared,
    at: &Target,
    rkey: u32,
    addr: u64,
    len: u64,
    need: AccessFlags,
) -> Result<Seg, RemoteAccessError> {
    let st = mw.state.lock();
    if st.rkey != rkey {
        return Err(RemoteAccessError::StaleWindowKey);
    }
    let Some(b) = &st.bound else {
        return Err(RemoteAccessError::UnboundWindow);
    };
    if mw.pd != at.pd {
        return Err(RemoteAccessError::WrongPd);
    }
    if b.qpn.is_some_and(|q| q != at.qpn) {
        return Err(RemoteAccessError::WindowOfOtherQp);
    }
    if !b.access.contains(need) {
        return Err(RemoteAccessError::WindowAccess);
    }
    let inside_window = addr
        .checked_sub(b.addr)
        .and_then(|off| off.checked_add(len))
        .is_some_and(|end| end <= b.len);
    if !inside_window && !at.region_bounds {
        return Err(RemoteAccessError::OutsideWindow);
    }
    if b.mr.is_dead() {
        return Err(RemoteAccessError::Deregistered);
    }
    let offset = b.mr.offset_of(addr, len).ok_or(RemoteAccessError::OutOfBounds)?;
    Ok(Seg {
        mr: b.mr.clone(),
        offset,
        len: len as usize,
    })
}

/// Keys for tests: a xorshift sequence (predictable; a device draws from a CSPRNG).
#[cfg(test)]
pub(crate) fn test_draw() -> u32 {
    use std::cell::Cell;
    thread_local!(static X: Cell<u32> = const { Cell::new(0x9e37_79b9) });
    X.with(|x| {
        let mut v = x.get();
        v ^= v << 13;
        v ^= v >> 17;
        v ^= v << 5;
        x.set(v);
        v
    })
}

/// Implements `verbs_api::MemoryRegion` for `$t`, whose field `$f` is its region's
/// `Arc<MrShared>`: the sim's regions and the deterministic backend's are both a
/// [`MrShared`] seen through the verbs (lkey and rkey are its key).
#[macro_export]
macro_rules! impl_memory_region {
    ($t:ty, $f:ident) => {
        // SAFETY: `as_ptr()..as_ptr() + len()` is the region's memory, valid while the MR
        // lives (owned: freed only after the last Arc; caller memory: the caller's
        // contract, `reg_mr_raw`'s).
        unsafe impl $crate::__verbs_api::MemoryRegion for $t {
            fn as_ptr(&self) -> *mut u8 {
                self.$f.base()
            }
            fn len(&self) -> usize {
                self.$f.len()
            }
            fn lkey(&self) -> u32 {
                self.$f.key
            }
            fn rkey(&self) -> u32 {
                self.$f.key
            }
            fn access(&self) -> $crate::__verbs_api::AccessFlags {
                self.$f.access
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// QP 0x10 of PD `pd` accepting `access`, checking windows against their own bounds.
    fn tgt(pd: u32, access: AccessFlags) -> Target {
        Target {
            pd,
            qpn: 0x10,
            access,
            region_bounds: false,
        }
    }

    fn table_with(len: usize, access: AccessFlags) -> (MrTable, Arc<MrShared>) {
        let t = MrTable::default();
        let key = t.fresh_key(test_draw);
        let mr = Arc::new(MrShared::new_owned(1, key, len, access).unwrap());
        t.insert(mr.clone());
        (t, mr)
    }

    #[test]
    fn remote_checks_in_order() {
        let all = AccessFlags::ALL;
        let (t, mr) = table_with(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
        let a = mr.addr();
        assert!(t
            .resolve_remote(&tgt(1, all), mr.key, a, 64, AccessFlags::REMOTE_WRITE)
            .unwrap()
            .is_some());
        assert_eq!(
            t.resolve_remote(&tgt(1, all), mr.key ^ 1, a, 8, AccessFlags::REMOTE_WRITE)
                .unwrap_err(),
            RemoteAccessError::BadKey
        );
        assert_eq!(
            t.resolve_remote(&tgt(2, all), mr.key, a, 8, AccessFlags::REMOTE_WRITE)
                .unwrap_err(),
            RemoteAccessError::WrongPd
        );
        assert_eq!(
            t.resolve_remote(&tgt(1, all), mr.key, a, 8, AccessFlags::REMOTE_READ)
                .unwrap_err(),
            RemoteAccessError::MrAccess
        );
        assert_eq!(
            t.resolve_remote(
                &tgt(1, AccessFlags::REMOTE_READ),
                mr.key,
                a,
                8,
                AccessFlags::REMOTE_WRITE
            )
            .unwrap_err(),
            RemoteAccessError::QpAccess
        );
        assert_eq!(
            t.resolve_remote(&tgt(1, all), mr.key, a + 1, 64, AccessFlags::REMOTE_WRITE)
                .unwrap_err(),
            RemoteAccessError::OutOfBounds
        );
        assert_eq!(
            t.resolve_remote(&tgt(1, all), mr.key, a - 1, 2, AccessFlags::REMOTE_WRITE)
                .unwrap_err(),
            RemoteAccessError::OutOfBounds
        );
        // zero-length write checks no key
        assert!(t
            .resolve_remote(&tgt(1, all), 0xdead, 0, 0, AccessFlags::REMOTE_WRITE)
            .unwrap()
            .is_none());
    }

    #[test]
    fn atomics_need_alignment() {
        let (t, mr) = table_with(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC);
        let a = mr.addr();
        assert!(t
            .resolve_remote(
                &tgt(1, AccessFlags::ALL),
                mr.key,
                a + 8,
                8,
                AccessFlags::REMOTE_ATOMIC
            )
            .is_ok());
        assert_eq!(
            t.resolve_remote(
                &tgt(1, AccessFlags::ALL),
                mr.key,
                a + 4,
                8,
                AccessFlags::REMOTE_ATOMIC
            )
            .unwrap_err(),
            RemoteAccessError::Misaligned
        );
    }

    #[test]
    fn dereg_makes_key_unreachable_and_kill_fences() {
        let (t, mr) = table_with(16, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
        let seg = t
            .resolve_remote(
                &tgt(1, AccessFlags::ALL),
                mr.key,
                mr.addr(),
                16,
                AccessFlags::REMOTE_WRITE,
            )
            .unwrap()
            .unwrap();
        t.remove(mr.key);
        mr.kill();
        assert!(t.get(mr.key).is_none());
        assert!(!seg.copy_in(0, b"hello"));
        assert_eq!(
            t.resolve_remote(
                &tgt(1, AccessFlags::ALL),
                mr.key,
                mr.addr(),
                16,
                AccessFlags::REMOTE_WRITE
            )
            .unwrap_err(),
            RemoteAccessError::Deregistered
        );
    }

    /// The table tells a deregistered key from one that never existed for the last
    /// `RETIRED_KEYS` deregistrations, in bounded memory, and never hands a remembered key
    /// out again.
    #[test]
    fn deregistered_keys_are_remembered_boundedly() {
        let t = MrTable::default();
        let mut gone = Vec::new();
        for _ in 0..RETIRED_KEYS + 10 {
            let key = t.fresh_key(test_draw);
            t.insert(Arc::new(
                MrShared::new_owned(1, key, 8, AccessFlags::LOCAL_WRITE).unwrap(),
            ));
            t.remove(key);
            gone.push(key);
        }
        assert_eq!(t.keys.read().retired.keys.len(), RETIRED_KEYS);
        // The first ten were overwritten; the rest are remembered.
        for (i, &k) in gone.iter().enumerate() {
            assert_eq!(t.was_deregistered(k), i >= 10, "key {i}");
        }
        let remembered: std::collections::HashSet<u32> = gone[10..].iter().copied().collect();
        for _ in 0..10_000 {
            assert!(!remembered.contains(&t.fresh_key(test_draw)));
        }
        // A key never seen is unknown; a registered one is no deregistered one.
        let never = (1..).find(|k| !gone.contains(k)).unwrap();
        assert!(!t.was_deregistered(never));
        let (t, mr) = table_with(8, AccessFlags::LOCAL_WRITE);
        assert!(!t.was_deregistered(mr.key));
    }

    #[test]
    fn local_resolution() {
        let (t, mr) = table_with(32, AccessFlags::empty());
        let mut out = Vec::new();
        let sges = [
            Sge::new(mr.addr(), 16, mr.key),
            Sge::new(mr.addr() + 16, 16, mr.key),
        ];
        assert_eq!(t.resolve_local(1, &sges, false, &mut out), Ok(32));
        assert_eq!(out.len(), 2);
        assert_eq!(
            t.resolve_local(1, &sges, true, &mut out),
            Err(LocalAccessError::NoLocalWrite)
        );
        assert_eq!(
            t.resolve_local(1, &[Sge::new(mr.addr() + 17, 16, mr.key)], false, &mut out),
            Err(LocalAccessError::OutOfBounds)
        );
        assert_eq!(
            t.resolve_local(2, &sges, false, &mut out),
            Err(LocalAccessError::WrongPd)
        );
    }

    #[test]
    fn inline_gather_copies_in_order_with_the_key_and_bounds_checks() {
        let (t, mr) = table_with(32, AccessFlags::empty());
        let bytes: Vec<u8> = (0..32).collect();
        let all = Seg {
            mr: mr.clone(),
            offset: 0,
            len: 32,
        };
        assert!(all.copy_in(0, &bytes));
        let mut out = vec![0xee];
        let sges = [
            Sge::new(mr.addr() + 8, 8, mr.key),
            Sge::new(0, 0, 0xdead), // zero length: no key check
            Sge::new(mr.addr() + 1, 3, mr.key),
        ];
        // Appended after what `out` held, in list order; no LOCAL_WRITE needed to read.
        assert_eq!(t.gather_inline(&sges, &mut out), Ok(true));
        assert_eq!(out, [0xee, 8, 9, 10, 11, 12, 13, 14, 15, 1, 2, 3]);
        let bad = |s: Sge| t.gather_inline(&[Sge::new(mr.addr(), 4, mr.key), s], &mut Vec::new());
        assert_eq!(
            bad(Sge::new(mr.addr(), 4, mr.key ^ 1)),
            Err(LocalAccessError::BadKey)
        );
        assert_eq!(
            bad(Sge::new(mr.addr() + 30, 4, mr.key)),
            Err(LocalAccessError::OutOfBounds)
        );
        // The region's PD is not checked (the table holds regions of PD 1 only: a QP of
        // PD 2 reads them all the same).
        assert_eq!(t.gather_inline(&sges, &mut Vec::new()), Ok(true));
        // A region fenced while still in the table (deregistration under way) is not read.
        mr.kill();
        let mut out = Vec::new();
        assert_eq!(t.gather_inline(&sges[..1], &mut out), Ok(false));
        assert_eq!(out, [0; 8]);
    }

    proptest! {
        /// Whatever address and length a peer names, a granted range lies inside the region.
        #[test]
        fn granted_ranges_stay_inside(delta in any::<i64>(), len in any::<u64>()) {
            let (t, mr) = table_with(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
            let addr = mr.addr().wrapping_add(delta as u64);
            if let Ok(Some(seg)) = t.resolve_remote(&tgt(1, AccessFlags::ALL), mr.key, addr, len, AccessFlags::REMOTE_WRITE) {
                prop_assert!(seg.offset + seg.len <= mr.len());
            }
        }
    }
}
