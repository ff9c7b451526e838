//! The library defines exactly the dynamic symbols of Debian bookworm's libibverbs, with
//! their versions (`nm -D --defined-only`, version nodes included): a program's every
//! reference to libibverbs binds to it under `LD_PRELOAD`; and besides them only the libc
//! calls it interposes (src/interpose.rs), unversioned, so that they take the place of
//! libc's versioned ones (`stat@GLIBC_2.33`).

mod common;

use std::process::Command;

fn defined(path: &std::path::Path) -> Vec<String> {
    let out = Command::new("nm")
        .arg("-D")
        .arg("--defined-only")
        .arg(path)
        .output()
        .expect("run nm (binutils)");
    assert!(
        out.status.success(),
        "nm {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
        .collect();
    v.sort();
    v
}

/// The libc functions the library interposes (src/interpose.rs).
const INTERPOSED: [&str; 20] = [
    "stat",
    "stat64",
    "lstat",
    "lstat64",
    "fstatat",
    "fstatat64",
    "statx",
    "access",
    "faccessat",
    "open",
    "open64",
    "openat",
    "openat64",
    "fopen",
    "fopen64",
    "opendir",
    "write",
    "close",
    "fstat",
    "fstat64",
];

#[test]
fn same_symbols_and_versions_as_libibverbs() {
    let real = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    assert!(real.exists(), "libibverbs1 is not installed");
    let theirs = defined(real);
    let ours = defined(&common::lib());
    let missing: Vec<_> = theirs.iter().filter(|s| !ours.contains(s)).collect();
    let extra: Vec<_> = ours
        .iter()
        .filter(|s| !theirs.contains(s) && !INTERPOSED.iter().any(|i| s.as_str() == format!("T {i}")))
        .collect();
    for i in INTERPOSED {
        assert!(
            ours.contains(&format!("T {i}")),
            "{i} is not defined, unversioned"
        );
    }
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing: {missing:#?}\nextra: {extra:#?}"
    );
    assert!(ours.len() >= 193 + INTERPOSED.len(), "{} symbols", ours.len());
    assert!(ours.contains(&"T ibv_get_device_list@@IBVERBS_1.1".to_string()));
    assert!(ours.contains(&"T ibv_get_device_list@IBVERBS_1.0".to_string()));
    assert!(ours.contains(&"A IBVERBS_PRIVATE_34".to_string()));
}

#[test]
fn does_not_link_libibverbs() {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(common::lib())
        .output()
        .expect("run readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("NEEDED"), "{text}");
    assert!(
        !text.contains("libibverbs"),
        "the library must not need libibverbs:\n{text}"
    );
}
