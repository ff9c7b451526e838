//! A C program (tests/c/misuse.c), compiled against the installed `<infiniband/verbs.h>`
//! and run with this library preloaded: bad use of the verbs gets libibverbs' documented
//! answers (never an abort), the data path works through the header's inline functions
//! (including inline data from the stack, the `ibv_wr_*` builder and `ibv_start_poll`),
//! and a program that exits without destroying its objects exits at once.

mod common;

use std::time::Duration;

#[test]
fn misuse_gets_libibverbs_answers() {
    let stdout = common::run_c_check("misuse", &[], &[], Duration::from_secs(60)).0;
    assert!(
        stdout.lines().filter(|l| l.starts_with("ok")).count() > 60,
        "{stdout}"
    );
}
