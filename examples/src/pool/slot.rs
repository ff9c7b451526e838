//! The param-pool slot: one parameter vector in registered memory, laid out so that a
//! reader that fetches the whole slot with one RDMA READ can tell whether it saw a
//! consistent vector.
//!
//! ```text
//! offset 0        head version  u64   even: stable, odd: being written
//!        8        vector id     u64
//!        16       payload       dim x f32 (little-endian), padded to 8 bytes
//!        16+P     checksum      u64   over id, version and payload
//!        24+P     tail version  u64
//! ```
//!
//! The owner updates a slot from version `v` (even) to `v + 2` like a seqlock with a
//! version at both ends: head := v+1, tail := v+1, (fence), payload and checksum,
//! (fence), tail := v+2, head := v+2. A reader accepts a slot only when head == tail,
//! both are even, *and* the checksum over id, version and payload matches
//! ([`check`]); anything else is a torn read, and it reads again.
//!
//! Why both. If a READ copied the slot strictly front to back (or back to front), the
//! versions alone would catch every torn copy. Nothing promises that order: an HCA
//! splits a READ into PCIe reads that may complete out of order, and a CPU copying the
//! slot with a fast-string `rep movsb` (which is how the Linux kernel copies a user
//! buffer into a socket, so how the sim gathers a READ response) may perform its loads
//! out of order too. CI caught exactly that: 1 READ in 7103 had equal even versions
//! around a payload that was half rewritten. The checksum (what Pilaf-style
//! self-verifying objects use) closes the gap; the versions catch the common case
//! cheaply and tell "being written" from "corrupt".
//!
//! The demo also proves the result with an oracle no real reader has: every vector a
//! reader *uses* is compared with the contents regenerated from its id and version
//! ([`matches_generated`]).

use std::sync::atomic::{fence, Ordering};

use verbs_api::MemoryRegion;

/// Offset of the head version.
pub const HEAD: usize = 0;
/// Offset of the vector id.
pub const ID: usize = 8;
/// Offset of the payload.
pub const PAYLOAD: usize = 16;

/// Payload bytes of a `dim`-element vector (padded to 8).
pub fn payload_len(dim: usize) -> usize {
    (dim * 4).div_ceil(8) * 8
}

/// Bytes of one slot.
pub fn slot_size(dim: usize) -> usize {
    PAYLOAD + payload_len(dim) + 16
}

/// Offset of the checksum in a slot.
pub fn checksum_at(dim: usize) -> usize {
    PAYLOAD + payload_len(dim)
}

/// Offset of the tail version in a slot.
pub fn tail_at(dim: usize) -> usize {
    checksum_at(dim) + 8
}

/// Parameter `i` of vector `id` at `version`: a deterministic value, different in every
/// element from one version to the next, so any mix of two versions is detectable.
pub fn param(id: u64, version: u64, i: usize) -> f32 {
    let mut x = id
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(version.wrapping_mul(0xbf58_476d_1ce4_e5b9))
        .wrapping_add(i as u64);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 29;
    ((x & 0xf_ffff) as f32) / 1024.0
}

/// Fills `out` (payload bytes) with vector `id` at `version`.
pub fn fill_payload(out: &mut [u8], id: u64, version: u64, dim: usize) {
    out.fill(0);
    for i in 0..dim {
        out[i * 4..i * 4 + 4].copy_from_slice(&param(id, version, i).to_le_bytes());
    }
}

/// The checksum over id, version and payload.
pub fn checksum(id: u64, version: u64, payload: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |w: u64| {
        h = (h ^ w).wrapping_mul(0x100_0000_01b3);
        h ^= h >> 29;
    };
    mix(id);
    mix(version);
    for c in payload.chunks(8) {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        mix(u64::from_le_bytes(w));
    }
    h
}

/// Writes the initial (version 0) slot `id` at `offset`.
pub fn init_slot(mr: &impl MemoryRegion, offset: usize, id: u64, dim: usize) -> verbs_api::Result<()> {
    let mut payload = vec![0u8; payload_len(dim)];
    fill_payload(&mut payload, id, 0, dim);
    mr.write_u64(offset + HEAD, 0)?;
    mr.write_u64(offset + ID, id)?;
    mr.write(offset + PAYLOAD, &payload)?;
    mr.write_u64(offset + checksum_at(dim), checksum(id, 0, &payload))?;
    mr.write_u64(offset + tail_at(dim), 0)
}

/// Updates slot `id` at `offset` from `version` (even) to `version + 2` with the seqlock
/// protocol of the module docs; `scratch` holds the new payload (payload_len bytes).
pub fn update_slot(
    mr: &impl MemoryRegion,
    offset: usize,
    id: u64,
    version: u64,
    dim: usize,
    scratch: &mut [u8],
) -> verbs_api::Result<u64> {
    let next = version + 2;
    fill_payload(scratch, id, next, dim);
    let sum = checksum(id, next, scratch);
    mr.write_u64(offset + HEAD, version + 1)?;
    mr.write_u64(offset + tail_at(dim), version + 1)?;
    // The payload stores must not move before the odd versions.
    fence(Ordering::SeqCst);
    mr.write(offset + PAYLOAD, scratch)?;
    mr.write_u64(offset + checksum_at(dim), sum)?;
    // ... nor after the even ones.
    fence(Ordering::SeqCst);
    mr.write_u64(offset + tail_at(dim), next)?;
    mr.write_u64(offset + HEAD, next)?;
    Ok(next)
}

/// What a reader makes of a slot it fetched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotCheck {
    /// head == tail, even, checksum matches: usable; the id and version it holds.
    Stable {
        /// Vector id.
        id: u64,
        /// Version.
        version: u64,
    },
    /// The versions disagree or are odd: an update was in progress. Re-read.
    Torn {
        /// Head version seen.
        head: u64,
        /// Tail version seen.
        tail: u64,
    },
    /// The versions agree but the checksum does not: the READ copied the middle of the
    /// slot at another moment than its ends. Re-read.
    BadChecksum {
        /// The (agreeing) version seen at both ends.
        version: u64,
    },
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

/// The reader's acceptance test of a fetched slot (`bytes` is the whole slot): versions,
/// then checksum.
pub fn check(bytes: &[u8], dim: usize) -> SlotCheck {
    let head = u64_at(bytes, HEAD);
    let tail = u64_at(bytes, tail_at(dim));
    if head != tail || head % 2 != 0 {
        return SlotCheck::Torn { head, tail };
    }
    let id = u64_at(bytes, ID);
    let payload = &bytes[PAYLOAD..PAYLOAD + payload_len(dim)];
    if checksum(id, head, payload) != u64_at(bytes, checksum_at(dim)) {
        return SlotCheck::BadChecksum { version: head };
    }
    SlotCheck::Stable { id, version: head }
}

/// The oracle: whether the slot's payload is exactly vector `id` at `version`, as
/// regenerated from them (the proof that a used vector is not torn; a real reader
/// cannot do this, which is why it relies on [`check`]).
pub fn matches_generated(bytes: &[u8], id: u64, version: u64, dim: usize, scratch: &mut [u8]) -> bool {
    let payload = &bytes[PAYLOAD..PAYLOAD + payload_len(dim)];
    fill_payload(scratch, id, version, dim);
    scratch == payload
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(id: u64, version: u64, dim: usize) -> Vec<u8> {
        let mut b = vec![0u8; slot_size(dim)];
        let mut p = vec![0u8; payload_len(dim)];
        fill_payload(&mut p, id, version, dim);
        b[HEAD..HEAD + 8].copy_from_slice(&version.to_ne_bytes());
        b[ID..ID + 8].copy_from_slice(&id.to_ne_bytes());
        b[PAYLOAD..PAYLOAD + p.len()].copy_from_slice(&p);
        let c = checksum_at(dim);
        b[c..c + 8].copy_from_slice(&checksum(id, version, &p).to_ne_bytes());
        let t = tail_at(dim);
        b[t..t + 8].copy_from_slice(&version.to_ne_bytes());
        b
    }

    #[test]
    fn stable_slot_verifies() {
        let dim = 13;
        let b = slot(3, 8, dim);
        let mut scratch = vec![0u8; payload_len(dim)];
        assert_eq!(check(&b, dim), SlotCheck::Stable { id: 3, version: 8 });
        assert!(matches_generated(&b, 3, 8, dim, &mut scratch));
    }

    /// Every front-to-back and back-to-front cut between two versions is either detected
    /// by the versions or is a whole version.
    #[test]
    fn every_cut_is_detected() {
        let dim = 16;
        let old = slot(1, 4, dim);
        // The bytes of the new version as they stand mid-update (odd ends).
        let mut mid = slot(1, 6, dim);
        mid[HEAD..HEAD + 8].copy_from_slice(&5u64.to_ne_bytes());
        let t = tail_at(dim);
        mid[t..t + 8].copy_from_slice(&5u64.to_ne_bytes());
        let new = slot(1, 6, dim);
        let mut scratch = vec![0u8; payload_len(dim)];
        for (a, b) in [(&old, &mid), (&old, &new), (&mid, &new)] {
            for cut in 0..=old.len() {
                for mixed in [
                    [&a[..cut], &b[cut..]].concat(), // front part read earlier (older)
                    [&b[..cut], &a[cut..]].concat(), // back part read earlier
                ] {
                    if let SlotCheck::Stable { id, version } = check(&mixed, dim) {
                        assert!(
                            matches_generated(&mixed, id, version, dim, &mut scratch),
                            "cut {cut}"
                        );
                    }
                }
            }
        }
    }

    /// A copy out of order (both ends read before the update began, the middle during
    /// it) has agreeing even versions; the checksum catches it.
    #[test]
    fn middle_copied_late_is_caught_by_the_checksum() {
        let dim = 16;
        let old = slot(2, 10, dim);
        let new = slot(2, 12, dim);
        let mut mixed = old.clone();
        let half = PAYLOAD + payload_len(dim) / 2;
        mixed[half..checksum_at(dim)].copy_from_slice(&new[half..checksum_at(dim)]);
        assert_eq!(check(&mixed, dim), SlotCheck::BadChecksum { version: 10 });
        let mut scratch = vec![0u8; payload_len(dim)];
        assert!(!matches_generated(&mixed, 2, 10, dim, &mut scratch));
    }
}
