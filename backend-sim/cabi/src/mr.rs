//! Memory regions (`man ibv_reg_mr`, `man ibv_rereg_mr`, `man ibv_dereg_mr`): the
//! program's memory, registered with the sim as C programs register it
//! ([`ProtectionDomain::reg_mr_raw`]).
//!
//! The sim reaches registered memory through the program's own address space, by
//! virtual address: a region whose I/O virtual address differs from its address
//! (`ibv_reg_mr_iova` with another `iova`, `IBV_ACCESS_ZERO_BASED`) and on-demand
//! paging (`IBV_ACCESS_ON_DEMAND`) are refused with EOPNOTSUPP. The optional access
//! bits (`IBV_ACCESS_RELAXED_ORDERING` and the rest of `IBV_ACCESS_OPTIONAL_RANGE`) are
//! ignored, as libibverbs ignores them where the kernel lacks them.
//!
//! The memory is checked as the kernel checks the pages it pins
//! ([`backend_sim::mapping`]): a range that wraps or spans more than 2^32 pages is
//! EINVAL, one that is not all mapped, readable, and writable where the access asks for
//! writes (`MW_BIND` included) is EFAULT.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use verbs_api::{AccessFlags, MemoryRegion, MrOf, ProtectionDomain};

use crate::abi::{ibv_mr, ibv_pd};
use crate::ffi::{errno_of, errno_verb, ptr_verb, set_errno, Errno};
use crate::live::{self, Kind, Object};
use crate::pd::{next_handle, Pd};
use crate::runtime::B;

/// `IBV_ACCESS_LOCAL_WRITE` .. `IBV_ACCESS_HUGETLB`: the access bits a program may pass.
const KNOWN_ACCESS: u32 = 0xff;
/// `IBV_ACCESS_ZERO_BASED`
const ZERO_BASED: u32 = 1 << 5;
/// `IBV_ACCESS_ON_DEMAND`
const ON_DEMAND: u32 = 1 << 6;
/// `IBV_ACCESS_HUGETLB`: a hint about the pages, nothing to do.
const HUGETLB: u32 = 1 << 7;
/// `IBV_ACCESS_OPTIONAL_RANGE` (bits 20..=29).
const OPTIONAL_RANGE: u32 = 0x3ff0_0000;
/// `IBV_REREG_MR_ERR_INPUT`: refused before the provider; the old region is still valid.
const IBV_REREG_MR_ERR_INPUT: c_int = -1;
/// `IBV_REREG_MR_ERR_CMD`: the provider (or the kernel) refused; the region stays as it
/// was.
const IBV_REREG_MR_ERR_CMD: c_int = -4;

/// A registered memory region.
#[repr(C)]
pub struct Mr {
    /// What programs see, shared with them.
    pub c: UnsafeCell<ibv_mr>,
    /// The sim's region over the program's memory: replaced only by `ibv_rereg_mr`,
    /// which the program must not call while it uses the region in another call.
    sim: UnsafeCell<MrOf<B>>,
    /// Its PD (which it holds a count on); changed by `ibv_rereg_mr`.
    pd: AtomicPtr<Pd>,
}

impl Mr {
    /// The sim's region.
    pub fn sim(&self) -> &MrOf<B> {
        // SAFETY: only `ibv_rereg_mr` writes it, which `man ibv_rereg_mr` does not allow
        // during another call on the region (as libibverbs rewrites `struct ibv_mr`).
        unsafe { &*self.sim.get() }
    }
}

// SAFETY: `#[repr(C)]` with the `ibv_mr` first.
unsafe impl Object for Mr {
    const KIND: Kind = Kind::Mr;
    type C = ibv_mr;
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: the MR holds a count on its PD, so the PD is alive.
        unsafe { &*self.pd.load(Ordering::Acquire) }.release();
    }
}

fn reg(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> Result<*mut ibv_mr, Errno> {
    // SAFETY: used within this call only.
    let p = unsafe { live::get::<Pd>(pd) }?;
    let access = access & !OPTIONAL_RANGE;
    if access & !KNOWN_ACCESS != 0 || addr.is_null() || length == 0 {
        return Err(libc::EINVAL);
    }
    if access & (ZERO_BASED | ON_DEMAND) != 0 || iova != addr as u64 {
        tracing::debug!(access, iova, addr = ?addr, "ibv_reg_mr: the sim registers memory at its own address only");
        return Err(libc::EOPNOTSUPP);
    }
    // `MW_BIND` included: the sim checks it when a window is bound, and pins (checks) the
    // pages writable for it, as the kernel's `ib_access_writable()`.
    let flags = AccessFlags::from_bits_truncate(access & !HUGETLB);
    // SAFETY: `man ibv_reg_mr`: the program keeps `addr..addr + length` valid while it is
    // registered, and deregisters it (which waits for the sim's copies to end) before
    // giving the memory up. Registered memory is shared with the HCA by contract, and
    // this library never makes Rust references into it.
    let sim =
        unsafe { p.sim.reg_mr_raw(addr.cast(), length, flags) }.map_err(|e| errno_of("ibv_reg_mr", &e))?;
    p.hold();
    let c = ibv_mr {
        context: p.ctx().c_ptr(),
        pd,
        addr,
        length,
        handle: next_handle(),
        lkey: sim.lkey(),
        rkey: sim.rkey(),
    };
    Ok(live::register(Box::new(Mr {
        c: UnsafeCell::new(c),
        sim: UnsafeCell::new(sim),
        pd: AtomicPtr::new((p as *const Pd).cast_mut()),
    })))
}

/// `ibv_reg_mr`.
pub(crate) unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    ptr_verb("ibv_reg_mr", || reg(pd, addr, length, addr as u64, access as u32))
}

/// `ibv_reg_mr_iova`.
pub(crate) unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    ptr_verb("ibv_reg_mr_iova", || reg(pd, addr, length, iova, access as u32))
}

/// `ibv_reg_mr_iova2` (what the header's `ibv_reg_mr` calls when the access flags are
/// not a constant or hold optional bits).
pub(crate) unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    ptr_verb("ibv_reg_mr_iova2", || reg(pd, addr, length, iova, access))
}

/// `ibv_reg_dmabuf_mr`: NULL, errno EOPNOTSUPP (the sim reaches no device memory).
pub(crate) unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `IBV_REREG_MR_CHANGE_TRANSLATION`
const CHANGE_TRANSLATION: c_int = 1 << 0;
/// `IBV_REREG_MR_CHANGE_PD`
const CHANGE_PD: c_int = 1 << 1;
/// `IBV_REREG_MR_CHANGE_ACCESS`
const CHANGE_ACCESS: c_int = 1 << 2;

/// `ibv_rereg_mr`: 0, or an `IBV_REREG_MR_ERR_*` with errno set and the region as it was,
/// as libibverbs' `ibv_rereg_mr()` answers: `IBV_REREG_MR_ERR_INPUT` and EINVAL for what
/// it refuses before the provider (unknown flags, a new translation without address or
/// length, access bits without `CHANGE_ACCESS`; here also a pointer that is not a
/// region); `IBV_REREG_MR_ERR_CMD` for the provider's refusal: EOPNOTSUPP where the
/// profile's device has no `rereg_mr` (rxe's provider sets none, so libibverbs' dummy
/// answers), else the sim's (mlx5 serves all three changes, keeping the keys).
pub(crate) unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let mut code = IBV_REREG_MR_ERR_INPUT;
    let r = errno_verb("ibv_rereg_mr", || {
        // SAFETY: used within this call only.
        let m = unsafe { live::get::<Mr>(mr) }?;
        if !rereg_input_ok(flags, addr, length, access) {
            return Err(libc::EINVAL);
        }
        code = IBV_REREG_MR_ERR_CMD;
        // SAFETY: as above.
        unsafe { rereg(m, flags, pd, addr, length, access) }
    });
    match r {
        0 => 0,
        _ => code,
    }
}

/// libibverbs' checks of `ibv_rereg_mr()`'s arguments before the provider's.
fn rereg_input_ok(flags: c_int, addr: *mut c_void, length: usize, access: c_int) -> bool {
    flags & !(CHANGE_TRANSLATION | CHANGE_PD | CHANGE_ACCESS) == 0
        && (flags & CHANGE_TRANSLATION == 0 || (!addr.is_null() && length != 0))
        && (access == 0 || flags & CHANGE_ACCESS != 0)
}

/// [`ibv_rereg_mr`] of the live region `m`.
///
/// # Safety
///
/// No other call may use `m` meanwhile (`man ibv_rereg_mr`); with a new translation,
/// `addr..addr + length` is the program's memory, as for `ibv_reg_mr`.
unsafe fn rereg(
    m: &Mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> Result<(), Errno> {
    let old_pd = m.pd.load(Ordering::Acquire);
    let new_pd: &Pd = if flags & CHANGE_PD != 0 {
        // SAFETY: used within this call; the region then holds a count on it.
        unsafe { live::get::<Pd>(pd) }?
    } else {
        // SAFETY: the region holds a count on its PD.
        unsafe { &*old_pd }
    };
    let access = if flags & CHANGE_ACCESS != 0 {
        let a = access as u32 & !OPTIONAL_RANGE;
        if a & !KNOWN_ACCESS != 0 {
            return Err(libc::EINVAL);
        }
        if a & (ZERO_BASED | ON_DEMAND) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        Some(AccessFlags::from_bits_truncate(a & !HUGETLB))
    } else {
        None
    };
    // SAFETY: the caller's contract: no other call uses the region now.
    let sim = unsafe { &mut *m.sim.get() };
    let r = if flags & CHANGE_TRANSLATION != 0 {
        // SAFETY: the caller's contract covers the new memory, as `ibv_reg_mr`'s does.
        unsafe { new_pd.sim.rereg_mr_raw(sim, addr.cast(), length, access) }
    } else {
        new_pd.sim.rereg_mr(sim, access)
    };
    r.map_err(|e| errno_of("ibv_rereg_mr", &e))?;
    if !std::ptr::eq(new_pd, old_pd) {
        new_pd.hold();
        m.pd.store((new_pd as *const Pd).cast_mut(), Ordering::Release);
        // SAFETY: the region held a count on its old PD until now.
        unsafe { &*old_pd }.release();
    }
    // SAFETY: the C part is ours to write; libibverbs rewrites these fields the same way
    // after its provider's `rereg_mr`.
    unsafe {
        let c = &mut *m.c.get();
        if flags & CHANGE_PD != 0 {
            c.pd = pd;
        }
        if flags & CHANGE_TRANSLATION != 0 {
            c.addr = addr;
            c.length = length;
        }
        c.lkey = sim.lkey();
        c.rkey = sim.rkey();
    }
    Ok(())
}

/// `ibv_dereg_mr`: 0, or EINVAL. Returns when the sim no longer touches the memory.
pub(crate) unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    errno_verb("ibv_dereg_mr", || {
        // SAFETY: no reference to the MR is in use.
        drop(unsafe { live::unregister::<Mr>(mr) }?);
        Ok(())
    })
}
