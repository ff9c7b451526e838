//! Starting the program: finding it on `PATH` as a shell would, telling the user when the
//! loader will ignore the preload (set-user-ID and set-group-ID programs), and `exec`
//! (the program takes rdma-sim's place: its exit status and signals are its own).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Runs `argv` in this process's place; returns only if it could not (127: not found,
/// 126: not executable, as a shell answers).
pub fn exec(argv: &[OsString]) -> ExitCode {
    let Some((prog, args)) = argv.split_first() else {
        return ExitCode::from(2);
    };
    let Some(path) = resolve(prog) else {
        eprintln!("rdma-sim: {}: command not found", prog.to_string_lossy());
        return ExitCode::from(127);
    };
    if let Ok(m) = std::fs::metadata(&path) {
        if m.permissions().mode() & 0o6000 != 0 {
            eprintln!(
                "rdma-sim: warning: {} is set-user-ID or set-group-ID: the loader ignores LD_PRELOAD \
                 for it, so it will not see the sim",
                path.display()
            );
        }
    }
    let e = std::process::Command::new(&path).arg0(prog).args(args).exec();
    eprintln!("rdma-sim: {}: {e}", path.display());
    ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

/// Where `prog` is: itself if it names a path, else the first executable file of that
/// name on `PATH`.
fn resolve(prog: &OsStr) -> Option<PathBuf> {
    if prog.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(prog));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| {
            if d.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                d
            }
        })
        .map(|d| d.join(prog))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `v` quoted for a POSIX shell.
pub fn shell_quote(v: &OsStr) -> String {
    let s = v.to_string_lossy();
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes_and_spaces() {
        assert_eq!(shell_quote(OsStr::new("a b")), "'a b'");
        assert_eq!(shell_quote(OsStr::new("it's")), r"'it'\''s'");
    }

    #[test]
    fn programs_are_found_on_path_or_by_their_path() {
        assert!(resolve(OsStr::new("sh")).is_some_and(|p| p.ends_with("sh")));
        assert_eq!(resolve(OsStr::new("./x")), Some(PathBuf::from("./x")));
        assert_eq!(resolve(OsStr::new("no-such-program-anywhere")), None);
    }
}
