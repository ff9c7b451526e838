//! The registered memory region (`struct ibv_mr`, `man ibv_reg_mr`) as a trait, with its
//! checked copy-in and copy-out accessors (see the safety model in [`crate::traits`]). A
//! window's bind names a region by reference, so the trait sits below the memory windows
//! and the work requests; the public path is [`crate::traits::MemoryRegion`].

use crate::endpoint::RemoteMr;
use crate::error::{Error, Result};
use crate::flags::AccessFlags;
use crate::sge::Sge;

/// A registered memory region (`struct ibv_mr`).
///
/// # Safety
///
/// Implementors guarantee that `as_ptr()..as_ptr() + len()` is valid for reads and writes
/// for as long as the region exists (the default accessors rely on it).
pub unsafe trait MemoryRegion: std::any::Any + Send + Sync {
    /// Start of the region.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Local key, for SGEs.
    fn lkey(&self) -> u32;
    /// Remote key, for peers.
    fn rkey(&self) -> u32;
    /// The access flags it was registered with.
    fn access(&self) -> AccessFlags;

    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The region's address as the HCA sees it (`ibv_mr::addr`).
    fn addr(&self) -> u64 {
        self.as_ptr() as u64
    }

    /// An SGE for `len` bytes at `offset`, checked against the region.
    fn sge(&self, offset: usize, len: usize) -> Result<Sge> {
        check_range(offset, len, self.len())?;
        let length =
            u32::try_from(len).map_err(|_| Error::invalid("sge", format!("length {len} exceeds 32 bits")))?;
        Ok(Sge {
            addr: self.addr() + offset as u64,
            length,
            lkey: self.lkey(),
        })
    }

    /// An SGE covering the whole region (the length saturates at 2^32 - 1).
    fn sge_all(&self) -> Sge {
        Sge {
            addr: self.addr(),
            length: u32::try_from(self.len()).unwrap_or(u32::MAX),
            lkey: self.lkey(),
        }
    }

    /// The descriptor a peer needs for one-sided access to the whole region.
    fn remote(&self) -> RemoteMr {
        RemoteMr {
            addr: self.addr(),
            rkey: self.rkey(),
            len: self.len() as u64,
        }
    }

    /// Copies `buf.len()` bytes at `offset` out of the region.
    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        check_range(offset, buf.len(), self.len())?;
        // SAFETY: the range is inside the region (checked above), which the trait contract
        // keeps valid while `self` lives; `buf` is a distinct Rust buffer, so the ranges do
        // not overlap. No reference into the region is created.
        unsafe { std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(offset, data.len(), self.len())?;
        // SAFETY: as in `read`; the destination range is inside the region.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.as_ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Sets every byte of the region to `byte`.
    fn fill(&self, byte: u8) {
        // SAFETY: the whole region is valid for writes (trait contract).
        unsafe { std::ptr::write_bytes(self.as_ptr(), byte, self.len()) };
    }

    /// A copy of the whole region.
    fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.read(0, &mut v).expect("whole region is in bounds");
        v
    }

    /// Reads a native-endian 64-bit word at `offset`. At an 8-byte aligned address this
    /// is an atomic load, so it never tears against remote atomics on the same word.
    fn read_u64(&self, offset: usize) -> Result<u64> {
        check_range(offset, 8, self.len())?;
        // SAFETY: in bounds (checked above).
        let p = unsafe { self.as_ptr().add(offset) };
        if (p as usize) % 8 == 0 {
            // SAFETY: `p` is 8-byte aligned, in bounds and valid for the region's life;
            // all concurrent accesses by the HCA to aligned words are atomic too.
            Ok(unsafe { std::sync::atomic::AtomicU64::from_ptr(p.cast()) }
                .load(std::sync::atomic::Ordering::SeqCst))
        } else {
            let mut b = [0u8; 8];
            self.read(offset, &mut b)?;
            Ok(u64::from_ne_bytes(b))
        }
    }

    /// Writes a native-endian 64-bit word at `offset` (an atomic store when aligned).
    fn write_u64(&self, offset: usize, value: u64) -> Result<()> {
        check_range(offset, 8, self.len())?;
        // SAFETY: in bounds (checked above).
        let p = unsafe { self.as_ptr().add(offset) };
        if (p as usize) % 8 == 0 {
            // SAFETY: as in `read_u64`.
            unsafe { std::sync::atomic::AtomicU64::from_ptr(p.cast()) }
                .store(value, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        } else {
            self.write(offset, &value.to_ne_bytes())
        }
    }
}

impl dyn MemoryRegion {
    /// The region as its backend's type `T`, if it is one (`<dyn Any>::downcast_ref` for
    /// the `MemoryRegion` object): how a backend recognises its own regions in a
    /// window's bind.
    pub fn downcast_ref<T: MemoryRegion>(&self) -> Option<&T> {
        if <dyn MemoryRegion as std::any::Any>::type_id(self) == std::any::TypeId::of::<T>() {
            // SAFETY: the object's concrete type is T (checked just above), so the data
            // pointer of the trait object points to a live T for as long as `self` is
            // borrowed.
            Some(unsafe { &*(self as *const dyn MemoryRegion as *const T) })
        } else {
            None
        }
    }
}

fn check_range(offset: usize, len: usize, region: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= region => Ok(()),
        _ => Err(Error::OutOfBounds {
            offset,
            end: offset.saturating_add(len),
            len: region,
        }),
    }
}
