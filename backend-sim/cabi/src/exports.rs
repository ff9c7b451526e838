//! The library's dynamic symbols: libibverbs' names and versions (`symbols.txt`), each an
//! alias of the Rust function that serves it.
//!
//! A program loaded with this library in `LD_PRELOAD` binds its references to
//! libibverbs' functions (`ibv_open_device@IBVERBS_1.1`) to the first object in the
//! lookup order that defines them with a matching version, which is this one, so every
//! call lands here and none reaches the real libibverbs the program also loads. The
//! symbols carry libibverbs' versions (build.rs gives the linker a version script made
//! from `symbols.txt`), so versioned references to the old 1.0 ABI find this library's
//! answers for it rather than falling through to the real library.
//!
//! rustc exports `#[no_mangle]` functions with a version script of its own that would
//! leave them unversioned, so the C names are defined here instead, in assembly, as
//! aliases (`.set`) of ordinary Rust functions; `.symver` gives the older versions their
//! non-default names (`ibv_get_device_list@IBVERBS_1.0`).

include!(concat!(env!("OUT_DIR"), "/exports.rs"));
