//! The process's tree: a private directory that holds the files [`super::files`] writes
//! and that the interposed look-ups ([`crate::interpose`]) are answered from.
//!
//! It is made on the first look-up that needs it or the first `ibv_open_device`,
//! whichever comes first (a child forked from the process makes its own: its devices,
//! opened in it, have ports of their own, and its parent's tree goes with the parent), in the temporary directory (`TMPDIR`,
//! else `/tmp`) as `verbs-sim-sys-<pid>-XXXXXX` by `mkdtemp` (mode 0700: the process's own,
//! for a user without root too), and removed when the process that made it exits
//! normally (`atexit`; a child forked from it leaves it to its parent). A process killed
//! by a signal cannot remove its tree, so each tree holds a lock (`flock` on its `lock`
//! file, held by the process while it lives, released by the kernel when it dies), and
//! a new tree removes the trees of the same user whose lock it can take (a tree is
//! renamed to its own name only once it holds its lock). The lock,
//! rather than a process ID, tells a dead owner from a live one also across PID
//! namespaces that share the temporary directory. The files are ordinary files, so every libc call a
//! program makes on them (`stat`, `opendir`, `readdir`, `read`, ...) behaves as libc's
//! does, with nothing emulated.

use std::ffi::{c_char, CString, OsString};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicPtr, Ordering};

use parking_lot::Mutex;

use crate::ffi::Errno;

/// A made tree.
pub struct Tree {
    root: PathBuf,
    /// The process that made it (and removes it).
    pid: u32,
    /// Serialises writers (the first look-up, a device's open).
    writing: Mutex<()>,
}

/// A tree made (or not) by process `pid`.
struct Made {
    pid: u32,
    tree: Result<Tree, Errno>,
}

/// The tree of the process that made the last one (a forked child finds its parent's
/// here, and makes its own). Each is made once per process and kept for its life.
static TREE: AtomicPtr<Made> = AtomicPtr::new(std::ptr::null_mut());
/// Held while a tree is made.
static MAKING: Mutex<()> = Mutex::new(());

/// The tree made by this process, if any.
fn mine() -> Option<&'static Made> {
    // SAFETY: `TREE` is null or points to a leaked `Made`, never freed.
    let m = unsafe { TREE.load(Ordering::Acquire).as_ref() }?;
    (m.pid == std::process::id()).then_some(m)
}

/// The process's tree, made (and filled) on first use; the error number if it cannot be
/// made (logged once).
pub fn get() -> Result<&'static Tree, Errno> {
    if let Some(m) = mine() {
        return m.tree.as_ref().map_err(|e| *e);
    }
    let _g = MAKING.lock();
    let m = match mine() {
        Some(m) => m,
        None => {
            let made: &'static Made = Box::leak(Box::new(Made {
                pid: std::process::id(),
                tree: make(),
            }));
            TREE.store((made as *const Made).cast_mut(), Ordering::Release);
            made
        }
    };
    m.tree.as_ref().map_err(|e| *e)
}

/// The process's tree if it has been made.
pub fn existing() -> Option<&'static Tree> {
    mine()?.tree.as_ref().ok()
}

fn make() -> Result<Tree, Errno> {
    let fail = |e: io::Error| {
        tracing::error!(error = %e, "cannot make the directory that answers for the sim's /sys and /dev files");
        e.raw_os_error().unwrap_or(libc::EIO)
    };
    let pid = std::process::id();
    let tmp = std::env::temp_dir();
    // Made under a staging name and renamed once locked, so that a tree under its own
    // name always has its lock (the sweep takes a tree without one for a dead
    // process's).
    let staging = mkdtemp(&tmp.join(format!("{STAGING}{pid}-XXXXXX"))).map_err(fail)?;
    lock(&staging);
    let suffix = staging
        .file_name()
        .map(|n| n.as_bytes()[STAGING.len()..].to_vec())
        .unwrap_or_default();
    let root = tmp.join(OsString::from_vec([PREFIX.as_bytes(), &suffix].concat()));
    if let Err(e) = std::fs::rename(&staging, &root) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(fail(e));
    }
    sweep(&root);
    let tree = Tree {
        root,
        pid,
        writing: Mutex::new(()),
    };
    if let Err(e) = super::files::fill(&tree) {
        tracing::error!(error = %e, root = %tree.root.display(), "cannot write the sim's /sys and /dev files");
        tree.remove();
        return Err(e.raw_os_error().unwrap_or(libc::EIO));
    }
    // SAFETY: `remove_at_exit` is an `extern "C" fn()` that does not unwind.
    unsafe { libc::atexit(remove_at_exit) };
    Ok(tree)
}

/// A new directory named by `template` (ending in XXXXXX), mode 0700.
fn mkdtemp(template: &std::path::Path) -> io::Result<PathBuf> {
    let mut buf = template.as_os_str().as_bytes().to_vec();
    buf.push(0);
    // SAFETY: `buf` is a NUL-terminated template ending in XXXXXX, which mkdtemp
    // rewrites in place.
    if unsafe { libc::mkdtemp(buf.as_mut_ptr().cast::<c_char>()) }.is_null() {
        return Err(io::Error::last_os_error());
    }
    buf.pop();
    Ok(PathBuf::from(OsString::from_vec(buf)))
}

/// Takes the tree's lock and holds it as long as its descriptor is open: for the life of
/// the process (close-on-exec: a program the process executes has a tree of its own).
/// Without the lock the tree has no lock file either, so no sweep removes it.
fn lock(dir: &std::path::Path) {
    let path = dir.join(LOCK);
    let locked = std::fs::File::create(&path).and_then(|f| {
        // SAFETY: flock on an open descriptor has no other precondition.
        match unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } {
            0 => Ok(f),
            _ => Err(io::Error::last_os_error()),
        }
    });
    match locked {
        Ok(f) => std::mem::forget(f),
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            tracing::warn!(error = %e, "cannot lock the sim's /sys and /dev directory: if the process is killed it stays");
        }
    }
}

/// The file whose lock says the tree's process lives.
const LOCK: &str = "lock";
/// The start of every tree's name.
const PREFIX: &str = "verbs-sim-sys-";
/// The start of a tree's name while it is being made (before it holds its lock).
const STAGING: &str = "verbs-sim-new-";

/// Removes the trees beside `mine` left by processes that died without removing them:
/// those whose lock can be taken (trees of other users cannot be opened, and are left).
fn sweep(mine: &std::path::Path) {
    let Some(dir) = mine.parent() else { return };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path == mine || !e.file_name().as_bytes().starts_with(PREFIX.as_bytes()) {
            continue;
        }
        let Ok(f) = std::fs::File::open(path.join(LOCK)) else {
            continue;
        };
        // SAFETY: flock on an open descriptor has no other precondition.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

extern "C" fn remove_at_exit() {
    if let Some(t) = existing() {
        if t.pid == std::process::id() {
            t.remove();
        }
    }
}

impl Tree {
    /// `root/rel/rest` as a C path (`rest` empty or starting with `/`).
    pub fn path(&self, rel: &str, rest: &[u8]) -> Option<CString> {
        let mut v = Vec::with_capacity(self.root.as_os_str().len() + rel.len() + rest.len() + 2);
        v.extend_from_slice(self.root.as_os_str().as_bytes());
        v.push(b'/');
        v.extend_from_slice(rel.as_bytes());
        v.extend_from_slice(rest);
        CString::new(v).ok()
    }

    /// Holds off other writers while `f` writes.
    pub fn writing<T>(&self, f: impl FnOnce() -> T) -> T {
        let _g = self.writing.lock();
        f()
    }

    /// Writes `text` and a newline (as sysfs ends its values) to `rel`, making its
    /// directories.
    pub fn write(&self, rel: &str, text: &str) -> io::Result<()> {
        let p = self.root.join(rel);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(p, format!("{text}\n"))
    }

    /// Makes the directory `rel` (and its parents).
    pub fn dir(&self, rel: &str) -> io::Result<()> {
        std::fs::create_dir_all(self.root.join(rel))
    }

    /// Makes `rel` a symbolic link to `target`.
    pub fn link(&self, rel: &str, target: &str) -> io::Result<()> {
        let p = self.root.join(rel);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir)?;
        }
        match std::os::unix::fs::symlink(target, &p) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            r => r,
        }
    }

    /// Removes `rel` and what it holds, if it exists.
    pub fn clear(&self, rel: &str) -> io::Result<()> {
        match std::fs::remove_dir_all(self.root.join(rel)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
