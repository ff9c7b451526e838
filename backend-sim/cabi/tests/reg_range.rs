//! A C program (tests/c/reg_range.c) registers memory it does not own, with this
//! library preloaded: each registration is refused with the errno the kernel gives when
//! it cannot pin the pages (EFAULT for a page not mapped, not readable, or not writable
//! where writes are asked; EINVAL for a range that wraps or spans more than 2^32 pages),
//! and memory it does own registers (read-only memory with read-only access too).

mod common;

use std::time::Duration;

#[test]
fn memory_the_program_does_not_own_is_refused() {
    let stdout = common::run_c_check("reg_range", &[], &[], Duration::from_secs(60)).0;
    assert!(!stdout.contains("FAIL"), "{stdout}");
}
