//! Which `libibverbs_sim.so` to preload: the one named (`--lib`, `RDMA_SIM_LIB`), else the
//! one beside rdma-sim (a target folder, a release tarball: `bin/` or `bin/../lib/`), else
//! the copy a release build of rdma-sim carries (what `cargo install` gives, since it
//! installs binaries only), written once to the user's cache folder.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

/// The library's file name.
pub const NAME: &str = "libibverbs_sim.so";

/// The library to preload.
pub fn find(named: Option<&Path>) -> anyhow::Result<PathBuf> {
    let named = named
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("RDMA_SIM_LIB").map(PathBuf::from));
    if let Some(p) = named {
        if !p.is_file() {
            bail!("{}: no such library", p.display());
        }
        return absolute(&p);
    }
    let exe = std::env::current_exe().context("cannot tell where rdma-sim is")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    // Beside it; in a tarball's lib folder; in a target folder where only the launcher
    // was built (the library is then left in `deps`).
    let beside = [
        dir.join(NAME),
        dir.join("../lib").join(NAME),
        dir.join("../lib/rdma-sim").join(NAME),
        dir.join("deps").join(NAME),
    ];
    for p in beside {
        if p.is_file() {
            return absolute(&p);
        }
    }
    match bundled() {
        Some(bytes) => extract(bytes),
        None => bail!(
            "{NAME} is not beside {} and this build of rdma-sim carries none (only release builds \
             do): build it (`cargo build -p backend-sim-cabi`, which writes both into the same \
             folder) or name it with --lib",
            exe.display()
        ),
    }
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    p.canonicalize().with_context(|| format!("{}", p.display()))
}

/// `LD_PRELOAD` with `lib` first: the program's own preloads stay, after it, and another
/// copy of the sim's library is dropped (two would both define libibverbs).
pub fn preload_with(lib: &Path) -> OsString {
    let mut v = OsString::from(lib);
    if let Some(old) = std::env::var_os("LD_PRELOAD") {
        for entry in old.to_string_lossy().split([':', ' ']).filter(|e| !e.is_empty()) {
            if Path::new(entry).file_name().is_some_and(|n| n == NAME) {
                continue;
            }
            v.push(":");
            v.push(entry);
        }
    }
    v
}

// The shared object this rdma-sim carries (see build.rs): assembled into the binary by
// `.incbin`, between two symbols.
#[cfg(rdma_sim_bundle)]
std::arch::global_asm!(
    ".pushsection .rodata.rdma_sim_bundle, \"a\", @progbits",
    ".balign 64",
    ".globl rdma_sim_bundle_start",
    ".hidden rdma_sim_bundle_start",
    "rdma_sim_bundle_start:",
    concat!(".incbin \"", env!("RDMA_SIM_BUNDLE"), "\""),
    ".globl rdma_sim_bundle_end",
    ".hidden rdma_sim_bundle_end",
    "rdma_sim_bundle_end:",
    ".popsection",
);

/// The shared object this rdma-sim carries, if it carries one.
#[cfg(rdma_sim_bundle)]
fn bundled() -> Option<&'static [u8]> {
    extern "C" {
        static rdma_sim_bundle_start: u8;
        static rdma_sim_bundle_end: u8;
    }
    // SAFETY: the two symbols delimit one read-only byte array in this binary (above),
    // the end after the start; it lives as long as the program.
    unsafe {
        let start = std::ptr::addr_of!(rdma_sim_bundle_start);
        let end = std::ptr::addr_of!(rdma_sim_bundle_end);
        let len = end.offset_from(start) as usize;
        Some(std::slice::from_raw_parts(start, len)).filter(|b| !b.is_empty())
    }
}

#[cfg(not(rdma_sim_bundle))]
fn bundled() -> Option<&'static [u8]> {
    None
}

/// Writes `bytes` to the user's cache folder under a name made of their hash (once:
/// later runs find it there), and returns its path.
fn extract(bytes: &[u8]) -> anyhow::Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    let dir = cache_dir()?;
    let path = dir.join(format!("libibverbs_sim-{:016x}.so", h.finish()));
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64) {
        return Ok(path);
    }
    let tmp = dir.join(format!(".{NAME}.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write()
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
        .with_context(|| format!("cannot write the sim's library to {}", path.display()))?;
    remove_old_copies(&dir, &path);
    Ok(path)
}

/// `$XDG_CACHE_HOME/rdma-sim`, else `~/.cache/rdma-sim`: made private if new, and used
/// only if it is the user's alone (a library another user could replace would run in
/// every program started here).
fn cache_dir() -> anyhow::Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => match std::env::var_os("HOME") {
            Some(h) if !h.is_empty() => Path::new(&h).join(".cache"),
            _ => bail!("neither XDG_CACHE_HOME nor HOME is set: name the library with --lib"),
        },
    };
    let dir = base.join("rdma-sim");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot make {}", dir.display()))?;
    let m = std::fs::symlink_metadata(&dir)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me || m.permissions().mode() & 0o022 != 0 {
        bail!(
            "{} is not a directory of this user's that others cannot write: name the library with --lib",
            dir.display()
        );
    }
    Ok(dir)
}

/// Removes copies written by other builds of rdma-sim, once they are old enough that no
/// program being started still needs to map them (a program already running keeps its
/// mapping).
fn remove_old_copies(dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let ours = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("libibverbs_sim-") && n.ends_with(".so"));
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() > 600));
        if ours && old && p != keep {
            let _ = std::fs::remove_file(&p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sim_comes_first_and_other_preloads_stay() {
        std::env::set_var("LD_PRELOAD", "/a/libfoo.so /old/libibverbs_sim.so:/b/libbar.so");
        let v = preload_with(Path::new("/new/libibverbs_sim.so"));
        assert_eq!(v, "/new/libibverbs_sim.so:/a/libfoo.so:/b/libbar.so");
    }
}
