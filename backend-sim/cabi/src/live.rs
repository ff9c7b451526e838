//! The objects this library made and has not destroyed, by the address programs hold.
//!
//! Each C object (`ibv_pd`, `ibv_qp`, ...) is the first part of a Rust object that owns
//! the sim's handle behind it. The create verb moves that object to the heap and records
//! its address here; the destroy verb removes it and frees it. Every verb outside the data
//! path first looks the pointer up, so a NULL, a pointer this library never returned, an
//! object of the wrong kind or one already destroyed is refused with EINVAL instead of
//! being read (libibverbs would follow it and crash). The data-path operations reached
//! through `ops` (`ibv_post_send`, `ibv_poll_cq`, ...) check for NULL only: a lookup on
//! every post would cost a lock, and libibverbs checks nothing there either.

use std::collections::HashMap;
use std::sync::LazyLock;

use parking_lot::Mutex;

use crate::ffi::Errno;

/// What an address names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Context,
    Pd,
    Mr,
    Mw,
    Channel,
    Cq,
    Qp,
    Srq,
    Ah,
}

static LIVE: LazyLock<Mutex<HashMap<usize, Kind>>> = LazyLock::new(Default::default);

/// A Rust object that carries a C object programs hold.
///
/// # Safety
///
/// `Self` is `#[repr(C)]` and holds its `C` object at byte offset `OFFSET`, so that the
/// C pointer and the object's address convert into each other.
pub unsafe trait Object: Sized {
    /// What the registry calls it.
    const KIND: Kind;
    /// The C structure programs see.
    type C;
    /// Where the C structure sits in `Self`.
    const OFFSET: usize = 0;

    /// The C pointer programs get for `this`.
    fn c_ptr(this: *mut Self) -> *mut Self::C {
        this.cast::<u8>().wrapping_add(Self::OFFSET).cast()
    }

    /// The object a C pointer of this kind points into.
    fn from_c(c: *const Self::C) -> *mut Self {
        c.cast::<u8>().wrapping_sub(Self::OFFSET).cast_mut().cast()
    }
}

/// Moves `obj` to the heap, records it, and returns the C pointer programs get.
pub fn register<T: Object>(obj: Box<T>) -> *mut T::C {
    let c = T::c_ptr(Box::into_raw(obj));
    LIVE.lock().insert(c as usize, T::KIND);
    c
}

/// The object behind `c`, if `c` is a live object of this kind.
///
/// # Safety
///
/// The caller must not use the reference after the object is destroyed (a concurrent
/// destroy of the same object is the program's error, as in libibverbs).
pub unsafe fn get<'a, T: Object>(c: *const T::C) -> Result<&'a T, Errno> {
    if c.is_null() || LIVE.lock().get(&(c as usize)) != Some(&T::KIND) {
        return Err(libc::EINVAL);
    }
    // SAFETY: the address was registered for this kind by `register` and not yet
    // removed, so it points into a live `T` (the `Object` contract places `C` at
    // `OFFSET`); the caller bounds the reference's use.
    Ok(unsafe { &*T::from_c(c) })
}

/// The object behind `c` without the registry lookup (NULL is still refused): for the
/// data path.
///
/// # Safety
///
/// `c` must be NULL or a live object of this kind made by this library.
pub unsafe fn get_fast<'a, T: Object>(c: *const T::C) -> Result<&'a T, Errno> {
    if c.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller guarantees `c` is a live object of this kind (`Object`
    // contract for the offset).
    Ok(unsafe { &*T::from_c(c) })
}

/// Forgets `c` and hands its object back for dropping. Fails with EINVAL if `c` is not
/// a live object of this kind (a second destroy, for example).
///
/// # Safety
///
/// No reference to the object may be in use (see [`get`]).
pub unsafe fn unregister<T: Object>(c: *const T::C) -> Result<Box<T>, Errno> {
    let mut live = LIVE.lock();
    if c.is_null() || live.get(&(c as usize)) != Some(&T::KIND) {
        return Err(libc::EINVAL);
    }
    live.remove(&(c as usize));
    drop(live);
    // SAFETY: registered by `register`, which leaked a `Box<T>` at this address;
    // removed from the registry just now, so this is the only owner.
    Ok(unsafe { Box::from_raw(T::from_c(c)) })
}

/// Forgets `c` without freeing its object: for a context, whose memory outlives
/// `ibv_close_device` until its last object is destroyed (see `context`). Fails with
/// EINVAL if `c` is not a live object of this kind.
pub fn forget<T: Object>(c: *const T::C) -> Result<*mut T, Errno> {
    let mut live = LIVE.lock();
    if c.is_null() || live.get(&(c as usize)) != Some(&T::KIND) {
        return Err(libc::EINVAL);
    }
    live.remove(&(c as usize));
    Ok(T::from_c(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    struct Thing {
        c: u64,
        drops: std::sync::Arc<std::sync::atomic::AtomicU32>,
    }

    // SAFETY: `#[repr(C)]` with `c` first.
    unsafe impl Object for Thing {
        const KIND: Kind = Kind::Ah;
        type C = u64;
    }

    impl Drop for Thing {
        fn drop(&mut self) {
            self.drops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[repr(C)]
    struct Other(u64);

    // SAFETY: `#[repr(C)]` with its only field first.
    unsafe impl Object for Other {
        const KIND: Kind = Kind::Srq;
        type C = u64;
    }

    #[test]
    fn lookups_refuse_null_foreign_mistyped_and_destroyed_objects() {
        let drops = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let c = register(Box::new(Thing {
            c: 42,
            drops: drops.clone(),
        }));
        // SAFETY: every lookup here: the registry decides; nothing is destroyed while a
        // reference is in use.
        unsafe {
            assert_eq!(get::<Thing>(c).map(|t| t.c), Ok(42));
            assert_eq!(get::<Thing>(std::ptr::null()).err(), Some(libc::EINVAL));
            let stack = 7u64;
            assert_eq!(get::<Thing>(&stack).err(), Some(libc::EINVAL));
            assert!(get::<Other>(c).is_err(), "another kind");
            assert!(forget::<Other>(c).is_err(), "another kind is not forgotten");
            drop(unregister::<Thing>(c).unwrap());
            assert_eq!(drops.load(std::sync::atomic::Ordering::Relaxed), 1);
            assert_eq!(get::<Thing>(c).err(), Some(libc::EINVAL));
            assert_eq!(
                unregister::<Thing>(c).err(),
                Some(libc::EINVAL),
                "destroyed twice"
            );
        }
        assert_eq!(drops.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
