//! What a program finds of the sim's devices outside the verbs (src/vfs, src/interpose):
//! a C program (tests/c/sysfs.c) checks the device node UCX checks, the sysfs entries
//! Open MPI and UCX read and `ibv_get_sysfs_path()`, under both link layers, with
//! `SYSFS_PATH`, and as a user without root; the process's tree is gone when it exits,
//! and one left by a killed process is removed by the next.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// Runs the sysfs program (through `cmd`, the program's path its first argument) with
/// the library preloaded and `env`, `TMPDIR` set to `tmp`; asserts every check passed.
fn run(mut cmd: Command, env: &[(&str, &str)], tmp: &Path) -> String {
    cmd.env("LD_PRELOAD", common::lib())
        .env("RDMA_SIM_DEVICES", "1")
        .env("TMPDIR", tmp)
        .env_remove("RDMA_SIM_LISTEN")
        .env_remove("SYSFS_PATH")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = common::wait(cmd.spawn().unwrap(), LIMIT);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("\n0 failed"),
        "{}\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A fresh temporary directory for one test's trees, readable and writable by every
/// user (as /tmp is), removed with it (a failing test's too).
struct TmpDir(std::path::PathBuf);

impl TmpDir {
    fn new(name: &str) -> TmpDir {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("ibverbs-sim-tmp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        TmpDir(d)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn trees(tmp: &Path) -> Vec<String> {
    std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("verbs-sim-sys-"))
        .collect()
}

fn check(name: &str, env: &[(&str, &str)]) {
    let prog = common::compile("cc", "sysfs", &["-libverbs"]);
    let tmp = TmpDir::new(name);
    run(Command::new(&prog.exe), env, &tmp.0);
    assert_eq!(trees(&tmp.0), Vec::<String>::new(), "the tree is removed at exit");
}

#[test]
fn an_infiniband_port() {
    check("ib", &[]);
}

#[test]
fn an_ethernet_port_names_its_netdev() {
    check("rxe", &[("RDMA_SIM_PROFILE", "rxe")]);
}

/// libibverbs' `ibv_get_sysfs_path()` honours `SYSFS_PATH` (its trailing slashes
/// removed), and so do the sim's answers: the device's directories are under it.
#[test]
fn sysfs_path_is_honoured() {
    check("sysfs-path", &[("SYSFS_PATH", "/nonexistent/verbs-sim-sysfs//")]);
}

/// A user without root gets the same: the tree is the user's own.
#[test]
fn a_user_without_root() {
    let prog = common::compile("cc", "sysfs", &["-libverbs"]);
    let tmp = TmpDir::new("user");
    run(common::unprivileged(prog.exe.to_str().unwrap(), &[]), &[], &tmp.0);
    assert_eq!(trees(&tmp.0), Vec::<String>::new(), "the tree is removed at exit");
}

/// A child process killed when the test is done with it, or fails.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pingpong server that opens its device (making its tree) and waits for a client.
fn server(tmp: &Path) -> Killed {
    let port = common::free_port().to_string();
    Killed(
        common::preloaded("ibv_rc_pingpong", &["-p", &port])
            .env("TMPDIR", tmp)
            .spawn()
            .unwrap(),
    )
}

/// A process killed before it could remove its tree leaves it; the next process that
/// makes a tree removes it (its lock is free), and leaves a live process's alone.
#[test]
fn a_killed_process_tree_is_removed_by_the_next() {
    let dir = TmpDir::new("killed");
    let tmp = dir.0.as_path();
    let victim = server(tmp);
    let live = server(tmp);
    let deadline = std::time::Instant::now() + LIMIT;
    while trees(tmp).len() < 2 {
        assert!(std::time::Instant::now() < deadline, "no trees: {:?}", trees(tmp));
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(victim);
    assert_eq!(trees(tmp).len(), 2, "a killed process cannot remove its tree");
    let prog = common::compile("cc", "sysfs", &["-libverbs"]);
    run(Command::new(&prog.exe), &[], tmp);
    let left = trees(tmp);
    let live_prefix = format!("verbs-sim-sys-{}-", live.0.id());
    assert!(
        left.len() == 1 && left[0].starts_with(&live_prefix),
        "left {left:?}: only the live process's tree"
    );
}
