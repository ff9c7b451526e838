//! Where the control sockets live, and the check that the directory is the user's alone.
//!
//! A directory under `/tmp` can be made by anyone first; a socket in a directory that
//! another user owns or can write would let them replace it, and one others can search
//! would let them connect. So the directory is used only if it is a real directory (not a
//! link), owned by the effective user, with no permission bits for group or others.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The setting that moves the control sockets, or turns them off (`off`).
pub const SETTING: &str = "RDMA_SIM_CONTROL";

/// The directory of the control sockets: `RDMA_SIM_CONTROL` (`off`: none), else
/// `$XDG_RUNTIME_DIR/rdma-sim`, else `/tmp/rdma-sim-<uid>`. An empty setting is unset.
pub fn resolve() -> Option<PathBuf> {
    match std::env::var_os(SETTING) {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => Some(match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(run) if !run.is_empty() => Path::new(&run).join("rdma-sim"),
            _ => PathBuf::from(format!("/tmp/rdma-sim-{}", rustix::process::geteuid().as_raw())),
        }),
    }
}

/// Makes `dir` if it is missing (mode 0700), and checks that it is the user's alone.
pub fn ensure(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    check(dir)
}

/// Whether `dir` is a directory of the effective user's, closed to everyone else.
pub fn check(dir: &Path) -> io::Result<()> {
    let m = std::fs::symlink_metadata(dir)?;
    let refuse = |why: String| Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
    if !m.file_type().is_dir() {
        return refuse(format!("{} is not a directory", dir.display()));
    }
    let me = rustix::process::geteuid().as_raw();
    if m.uid() != me {
        return refuse(format!(
            "{} belongs to uid {}, not to this user ({me})",
            dir.display(),
            m.uid()
        ));
    }
    let mode = m.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return refuse(format!(
            "{} is open to other users (mode {mode:o}; it must be 700)",
            dir.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rdma-sim-dir-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_new_directory_is_made_private() {
        let d = scratch("new");
        ensure(&d).unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_open_to_others_is_refused() {
        let d = scratch("open");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = ensure(&d).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("mode 755"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_link_to_a_directory_is_refused() {
        let d = scratch("link-target");
        let l = scratch("link");
        ensure(&d).unwrap();
        std::os::unix::fs::symlink(&d, &l).unwrap();
        let e = ensure(&l).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        std::fs::remove_file(&l).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
