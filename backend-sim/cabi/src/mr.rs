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

use verbs_api::{AccessFlags, MemoryRegion, MrOf, ProtectionDomain};

use crate::abi::{ibv_mr, ibv_pd};
use crate::ffi::{errno_of, errno_verb, ptr_verb, set_errno, Errno};
use crate::live::{self, Kind, Object};
use crate::pd::{next_handle, Pd};
use crate::runtime::B;

/// `IBV_ACCESS_LOCAL_WRITE` .. `IBV_ACCESS_HUGETLB`: the access bits a program may pass.
const KNOWN_ACCESS: u32 = 0xff;
/// `IBV_ACCESS_MW_BIND`: binding memory windows (the sim has none, so never exercised).
const MW_BIND: u32 = 1 << 4;
/// `IBV_ACCESS_ZERO_BASED`
const ZERO_BASED: u32 = 1 << 5;
/// `IBV_ACCESS_ON_DEMAND`
const ON_DEMAND: u32 = 1 << 6;
/// `IBV_ACCESS_HUGETLB`: a hint about the pages, nothing to do.
const HUGETLB: u32 = 1 << 7;
/// `IBV_ACCESS_OPTIONAL_RANGE` (bits 20..=29).
const OPTIONAL_RANGE: u32 = 0x3ff0_0000;
/// `IBV_REREG_MR_ERR_INPUT`: the old region is still valid.
const IBV_REREG_MR_ERR_INPUT: c_int = -1;

/// A registered memory region.
#[repr(C)]
pub struct Mr {
    /// What programs see, shared with them.
    pub c: UnsafeCell<ibv_mr>,
    /// The sim's region over the program's memory.
    pub sim: MrOf<B>,
    /// Its PD (which it holds a count on).
    pd: *const Pd,
}

// SAFETY: `#[repr(C)]` with the `ibv_mr` first.
unsafe impl Object for Mr {
    const KIND: Kind = Kind::Mr;
    type C = ibv_mr;
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: the MR holds a count on its PD, so the PD is alive.
        unsafe { &*self.pd }.release();
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
    let flags = AccessFlags::from_bits_truncate(access & !(MW_BIND | HUGETLB));
    if access & MW_BIND != 0 {
        // The kernel pins the pages writable for MW_BIND too (a window bound to the region
        // may grant writes); the sim's own check looks at `flags` only.
        backend_sim::mapping::check_range(addr as usize, length, true)
            .map_err(|e| errno_of("ibv_reg_mr", &e))?;
    }
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
        sim,
        pd: p,
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

/// `ibv_rereg_mr`: not served; `IBV_REREG_MR_ERR_INPUT` with errno EOPNOTSUPP (the
/// region stays registered as it was), or EINVAL for a pointer that is not a region.
pub(crate) unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    _flags: c_int,
    _pd: *mut ibv_pd,
    _addr: *mut c_void,
    _length: usize,
    _access: c_int,
) -> c_int {
    // SAFETY: only looked up.
    let e = match unsafe { live::get::<Mr>(mr) } {
        Ok(_) => libc::EOPNOTSUPP,
        Err(e) => e,
    };
    set_errno(e);
    IBV_REREG_MR_ERR_INPUT
}

/// `ibv_dereg_mr`: 0, or EINVAL. Returns when the sim no longer touches the memory.
pub(crate) unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    errno_verb("ibv_dereg_mr", || {
        // SAFETY: no reference to the MR is in use.
        drop(unsafe { live::unregister::<Mr>(mr) }?);
        Ok(())
    })
}
