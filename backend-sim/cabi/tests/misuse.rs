//! A C program (tests/c/misuse.c), compiled against the installed `<infiniband/verbs.h>`
//! and run with this library preloaded: bad use of the verbs gets libibverbs' documented
//! answers (never an abort), the data path works through the header's inline functions
//! (including inline data from the stack, the `ibv_wr_*` builder and `ibv_start_poll`),
//! and a program that exits without destroying its objects exits at once.

mod common;

use std::time::Duration;

#[test]
fn misuse_gets_libibverbs_answers() {
    let prog = common::CProgram::compile("misuse");
    let out = common::wait(
        common::preloaded(&prog.exe, &[]).spawn().unwrap(),
        Duration::from_secs(60),
    );
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
