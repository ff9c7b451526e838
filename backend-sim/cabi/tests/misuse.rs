//! A C program (tests/c/misuse.c), compiled against the installed `<infiniband/verbs.h>`
//! and run with this library preloaded: bad use of the verbs gets libibverbs' documented
//! answers (never an abort), the data path works through the header's inline functions
//! (including inline data from the stack, the `ibv_wr_*` builder and `ibv_start_poll`),
//! and a program that exits without destroying its objects exits at once.

mod common;

use std::process::Command;
use std::time::Duration;

#[test]
fn misuse_gets_libibverbs_answers() {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/misuse.c");
    let dir = std::env::temp_dir().join(format!("ibverbs-sim-misuse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("misuse");
    let cc = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(src)
        .arg("-libverbs")
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "cc failed (needs libibverbs-dev): {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = common::wait(
        common::preloaded(exe.to_str().unwrap(), &[]).spawn().unwrap(),
        Duration::from_secs(60),
    );
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("0 failed"), "{stdout}");
    assert!(
        stdout.lines().filter(|l| l.starts_with("ok")).count() > 60,
        "{stdout}"
    );
}
