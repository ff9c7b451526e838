//! The five regions under attack, in one buffer with canary bytes around each: their
//! indices, lengths, keys, protection domains and rights (the table in the crate docs).

use verbs_api::AccessFlags;

/// The PD of the QP.
pub const PD: u32 = 1;
/// Region indices.
pub const TARGET: usize = 0;
/// Remote read only: never changes.
pub const READONLY: usize = 1;
/// Receive buffers and landing zone of our READs/atomics.
pub const LOCAL: usize = 2;
/// Another PD: never changes.
pub const FOREIGN: usize = 3;
/// Deregistered before the input: never changes.
pub const DEAD: usize = 4;
/// How many regions.
pub(crate) const NREG: usize = 5;
/// Each region's length.
pub(crate) const REGION_LEN: [usize; NREG] = [4096, 1024, 4096, 1024, 1024];
/// Each region's key (fixed, so that every input reproduces exactly).
pub(crate) const KEYS: [u32; NREG] = [0x7a11_0e01, 0x7a11_0e02, 0x7a11_0e03, 0x7a11_0e04, 0x7a11_0e05];
/// Largest region: bounds a READ response.
pub const MR_MAX: usize = 4096;
/// Canary bytes before and after each region.
pub(crate) const GUARD: usize = 512;
/// The canary byte.
pub(crate) const CANARY: u8 = 0xc5;

/// The PD of region `r`.
pub(crate) fn region_pd(r: usize) -> u32 {
    if r == FOREIGN {
        2
    } else {
        PD
    }
}

/// The rights of region `r`.
pub(crate) fn region_access(r: usize) -> AccessFlags {
    match r {
        READONLY => AccessFlags::REMOTE_READ,
        LOCAL => AccessFlags::LOCAL_WRITE,
        _ => AccessFlags::ALL,
    }
}
