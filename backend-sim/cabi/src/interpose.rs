//! The libc calls through which programs look at files, answered for the sim's places
//! ([`crate::vfs`]) from the process's tree, and passed to libc untouched for every other
//! path.
//!
//! A preloaded library's definitions come before libc's in the dynamic linker's lookup,
//! so a program's calls (and its libraries': UCX's `libucs` and `libuct_ib`, Open MPI's
//! `libopen-pal` and openib BTL, hwloc) land here. The set is what those programs and
//! libibverbs users call, under the names glibc 2.33 and later gives them (Debian
//! bookworm's programs are built against glibc 2.36):
//!
//! - `stat`, `stat64`, `lstat`, `lstat64`, `fstatat`, `fstatat64`, `statx`;
//! - `access`, `faccessat`;
//! - `open`, `open64`, `openat`, `openat64`, `fopen`, `fopen64`;
//! - `opendir` (libc's `readdir`, `scandir` of an open directory, and the `*at` calls on
//!   a descriptor the calls above opened need nothing more);
//! - for `/dev/infiniband/rdma_cm` ([`crate::ucma`]): `open` of it, and `write`,
//!   `close`, `fstat` and `fstat64` of the descriptors it gives, which look at a
//!   descriptor's bit in a table (no more while no program opened it) and pass every
//!   other descriptor to libc untouched.
//!
//! Only an absolute path is looked up (`*at` calls with a relative path are the host's);
//! inside the tree the links (`/dev/infiniband/uverbsN` → `/dev/null`) are followed
//! also by `lstat` and `AT_SYMLINK_NOFOLLOW`, so that the node looks like the character
//! device it stands for. Not interposed: the `__xstat` family of programs linked against
//! glibc before 2.33, `realpath` (a sim device resolves to no PCI device, which is what
//! UCX concludes for a virtual device such as rxe's too), the fortified `__open_2`, and
//! system calls made directly. The check for a path elsewhere compares a few bytes
//! ([`crate::vfs::lookup`]); libc's function is found once (`dlsym(RTLD_NEXT)`).
//!
//! `open` and `openat` are variadic in C; stable Rust cannot define a variadic function,
//! so they take the mode as a fixed third (fourth) argument. On x86-64 and AArch64 Linux
//! a variadic integer argument travels where a fixed one does, so the mode the program
//! passed (or whatever the register holds, when `O_CREAT` and `O_TMPFILE` are absent and
//! libc ignores it) reaches libc's `open` as it came.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::ffi::set_errno;
use crate::vfs::{lookup, Lookup};

/// libc's definition of `name` (the next one after this library), looked up once; `None`
/// if there is none.
macro_rules! libc_fn {
    ($name:expr, $ty:ty) => {{
        static CACHE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
        let mut f = CACHE.load(Ordering::Relaxed);
        if f.is_null() {
            const NAME: &CStr = match CStr::from_bytes_with_nul(concat!($name, "\0").as_bytes()) {
                Ok(n) => n,
                Err(_) => panic!("a symbol name"),
            };
            // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name has no other
            // precondition.
            f = unsafe { libc::dlsym(libc::RTLD_NEXT, NAME.as_ptr()) };
            CACHE.store(f, Ordering::Relaxed);
        }
        // SAFETY: a function pointer and a data pointer have the same size here, a NULL
        // one is `None`, and libc's function of that name has the C signature `$ty`
        // spells.
        unsafe { std::mem::transmute::<*mut c_void, Option<$ty>>(f) }
    }};
}

/// Defines each exported C function `name(args) -> ret`, which finds libc's `name` (of
/// type `F`) and hands it and the program's arguments to `via`.
macro_rules! export {
    ($($name:ident => $via:ident($fty:ty; $($arg:ident: $t:ty),*) -> $ret:ty;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`, answered for the sim's places (see the module docs).")]
        ///
        /// # Safety
        ///
        #[doc = concat!("The C contract of `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $t),*) -> $ret {
            let real = libc_fn!(stringify!($name), $fty);
            // SAFETY: the caller's contract, which is the C function's, passed on.
            unsafe { $via(real, $($arg),*) }
        }
    )*};
}

export! {
    stat => stat_via(StatFn; path: *const c_char, buf: *mut libc::stat) -> c_int;
    stat64 => stat_via(StatFn; path: *const c_char, buf: *mut libc::stat) -> c_int;
    lstat => lstat_via(StatFn; path: *const c_char, buf: *mut libc::stat) -> c_int;
    lstat64 => lstat_via(StatFn; path: *const c_char, buf: *mut libc::stat) -> c_int;
    fstatat => fstatat_via(FstatatFn; dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int;
    fstatat64 => fstatat_via(FstatatFn; dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int;
    statx => statx_via(StatxFn; dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut c_void) -> c_int;
    access => access_via(AccessFn; path: *const c_char, mode: c_int) -> c_int;
    faccessat => faccessat_via(FaccessatFn; dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int;
    open => open_via(OpenFn; path: *const c_char, flags: c_int, mode: c_uint) -> c_int;
    open64 => open_via(OpenFn; path: *const c_char, flags: c_int, mode: c_uint) -> c_int;
    openat => openat_via(OpenatFn; dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int;
    openat64 => openat_via(OpenatFn; dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int;
    fopen => fopen_via(FopenFn; path: *const c_char, mode: *const c_char) -> *mut libc::FILE;
    fopen64 => fopen_via(FopenFn; path: *const c_char, mode: *const c_char) -> *mut libc::FILE;
    opendir => opendir_via(OpendirFn; path: *const c_char) -> *mut libc::DIR;
    write => write_via(WriteFn; fd: c_int, buf: *const c_void, count: usize) -> isize;
    close => close_via(CloseFn; fd: c_int) -> c_int;
    fstat => fstat_via(FstatFn; fd: c_int, buf: *mut libc::stat) -> c_int;
    fstat64 => fstat_via(FstatFn; fd: c_int, buf: *mut libc::stat) -> c_int;
}

/// The path libc is given for a program's path: the host's own, or the tree's file.
enum Target {
    Host(*const c_char),
    Tree(std::ffi::CString),
}

impl Target {
    fn ptr(&self) -> *const c_char {
        match self {
            Target::Host(p) => *p,
            Target::Tree(p) => p.as_ptr(),
        }
    }

    /// `flags` for libc: inside the tree without `AT_SYMLINK_NOFOLLOW`, so that the
    /// tree's links are followed (see the module docs).
    fn at_flags(&self, flags: c_int) -> c_int {
        match self {
            Target::Host(_) => flags,
            Target::Tree(_) => flags & !libc::AT_SYMLINK_NOFOLLOW,
        }
    }
}

/// Calls `call` with libc's function and the path libc is to be given for the program's
/// `path`; `fail` with errno set if libc has no such function (cannot happen in a
/// dynamically linked program: ENOSYS) or the path is the sim's and the tree cannot be
/// made.
///
/// # Safety
///
/// `path` is NULL or a NUL-terminated string.
unsafe fn with<F, T>(real: Option<F>, path: *const c_char, fail: T, call: impl FnOnce(F, Target) -> T) -> T {
    let Some(f) = real else {
        set_errno(libc::ENOSYS);
        return fail;
    };
    // SAFETY: the caller's contract.
    match unsafe { lookup(path) } {
        Lookup::Outside => call(f, Target::Host(path)),
        Lookup::Inside(p) => call(f, Target::Tree(p)),
        Lookup::Unavailable(e) => {
            set_errno(e);
            fail
        }
    }
}

type StatFn = unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int;
type FstatatFn = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
type StatxFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint, *mut c_void) -> c_int;
type AccessFn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type FaccessatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_int) -> c_int;
type OpenFn = unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int;
type FopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;
type OpendirFn = unsafe extern "C" fn(*const c_char) -> *mut libc::DIR;
type WriteFn = unsafe extern "C" fn(c_int, *const c_void, usize) -> isize;
type CloseFn = unsafe extern "C" fn(c_int) -> c_int;
type FstatFn = unsafe extern "C" fn(c_int, *mut libc::stat) -> c_int;

// Each `*_via` below has the C contract of its function, and calls libc's with the
// program's arguments, the path replaced.

unsafe fn stat_via(real: Option<StatFn>, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: the C contract of `stat`.
    unsafe { with(real, path, -1, |f, t| f(t.ptr(), buf)) }
}

unsafe fn lstat_via(real: Option<StatFn>, path: *const c_char, buf: *mut libc::stat) -> c_int {
    let follow = libc_fn!("stat", StatFn);
    // SAFETY: the C contract of `lstat` (which `stat`'s is, for the tree's files).
    unsafe {
        with(real, path, -1, |f, t| match (&t, follow) {
            (Target::Tree(_), Some(stat)) => stat(t.ptr(), buf),
            _ => f(t.ptr(), buf),
        })
    }
}

unsafe fn fstatat_via(
    real: Option<FstatatFn>,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the C contract of `fstatat`.
    unsafe { with(real, path, -1, |f, t| f(dirfd, t.ptr(), buf, t.at_flags(flags))) }
}

unsafe fn statx_via(
    real: Option<StatxFn>,
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut c_void,
) -> c_int {
    // SAFETY: the C contract of `statx`.
    unsafe {
        with(real, path, -1, |f, t| {
            f(dirfd, t.ptr(), t.at_flags(flags), mask, buf)
        })
    }
}

unsafe fn access_via(real: Option<AccessFn>, path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: the C contract of `access`.
    unsafe { with(real, path, -1, |f, t| f(t.ptr(), mode)) }
}

unsafe fn faccessat_via(
    real: Option<FaccessatFn>,
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: the C contract of `faccessat`.
    unsafe { with(real, path, -1, |f, t| f(dirfd, t.ptr(), mode, t.at_flags(flags))) }
}

unsafe fn open_via(real: Option<OpenFn>, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: the C contract of `open`: a NUL-terminated path.
    if unsafe { crate::vfs::is_rdma_cm(path) } {
        return crate::ucma::open(flags);
    }
    // SAFETY: the C contract of `open` (see the module docs for `mode`).
    unsafe { with(real, path, -1, |f, t| f(t.ptr(), flags, mode)) }
}

unsafe fn openat_via(
    real: Option<OpenatFn>,
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: the C contract of `openat`: a NUL-terminated path (an absolute one names
    // the device whatever `dirfd` is).
    if unsafe { crate::vfs::is_rdma_cm(path) } {
        return crate::ucma::open(flags);
    }
    // SAFETY: the C contract of `openat` (see the module docs for `mode`).
    unsafe { with(real, path, -1, |f, t| f(dirfd, t.ptr(), flags, mode)) }
}

unsafe fn fopen_via(real: Option<FopenFn>, path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: the C contract of `fopen`.
    unsafe { with(real, path, std::ptr::null_mut(), |f, t| f(t.ptr(), mode)) }
}

unsafe fn opendir_via(real: Option<OpendirFn>, path: *const c_char) -> *mut libc::DIR {
    // SAFETY: the C contract of `opendir`.
    unsafe { with(real, path, std::ptr::null_mut(), |f, t| f(t.ptr())) }
}

unsafe fn write_via(real: Option<WriteFn>, fd: c_int, buf: *const c_void, count: usize) -> isize {
    if crate::ucma::is_cm_fd(fd) {
        return crate::ucma::write(fd, buf as u64, count);
    }
    match real {
        // SAFETY: the C contract of `write`, passed on.
        Some(f) => unsafe { f(fd, buf, count) },
        None => {
            set_errno(libc::ENOSYS);
            -1
        }
    }
}

unsafe fn close_via(real: Option<CloseFn>, fd: c_int) -> c_int {
    if crate::ucma::is_cm_fd(fd) {
        crate::ucma::close(fd);
    }
    match real {
        // SAFETY: the C contract of `close`, passed on.
        Some(f) => unsafe { f(fd) },
        None => {
            set_errno(libc::ENOSYS);
            -1
        }
    }
}

unsafe fn fstat_via(real: Option<FstatFn>, fd: c_int, buf: *mut libc::stat) -> c_int {
    let Some(f) = real else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the C contract of `fstat`, passed on.
    let r = unsafe { f(fd, buf) };
    if r == 0 && crate::ucma::is_cm_fd(fd) {
        // SAFETY: libc filled `buf`, valid for writes (the caller's contract).
        unsafe { crate::ucma::fstat(buf) };
    }
    r
}
