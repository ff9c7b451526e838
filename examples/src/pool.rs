//! The param-pool slot: one parameter vector in registered memory, laid out so that a
//! reader that fetches the whole slot with one RDMA READ can tell whether it saw a
//! consistent vector, and a checksum that proves it.
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
//! (fence), tail := v+2, head := v+2. The reader accepts a slot only when head == tail
//! and both are even. Whether the READ copies the slot front to back or back to front,
//! any payload byte of an update in progress makes the version read *after* it differ
//! from the one read *before* it, so a torn vector is detected and re-read. (A DMA engine
//! that copied the middle of the slot before both ends could defeat that, which is why
//! every vector a reader *uses* is also checked against its checksum and regenerated
//! contents: the proof does not rest on the copy order.)

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
    /// head == tail, even: usable; the id and version it holds.
    Stable {
        /// Vector id.
        id: u64,
        /// Version.
        version: u64,
    },
    /// An update was in progress: re-read.
    Torn {
        /// Head version seen.
        head: u64,
        /// Tail version seen.
        tail: u64,
    },
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

/// The version check of a fetched slot (`bytes` is the whole slot).
pub fn version_check(bytes: &[u8], dim: usize) -> SlotCheck {
    let head = u64_at(bytes, HEAD);
    let tail = u64_at(bytes, tail_at(dim));
    if head == tail && head % 2 == 0 {
        SlotCheck::Stable {
            id: u64_at(bytes, ID),
            version: head,
        }
    } else {
        SlotCheck::Torn { head, tail }
    }
}

/// Whether a stable slot's checksum matches and its payload is exactly vector `id` at
/// `version` (the proof that a used vector is not torn).
pub fn verify(bytes: &[u8], id: u64, version: u64, dim: usize, scratch: &mut [u8]) -> bool {
    let payload = &bytes[PAYLOAD..PAYLOAD + payload_len(dim)];
    if checksum(id, version, payload) != u64_at(bytes, checksum_at(dim)) {
        return false;
    }
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
        assert_eq!(version_check(&b, dim), SlotCheck::Stable { id: 3, version: 8 });
        assert!(verify(&b, 3, 8, dim, &mut scratch));
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
                    if let SlotCheck::Stable { id, version } = version_check(&mixed, dim) {
                        assert!(verify(&mixed, id, version, dim, &mut scratch), "cut {cut}");
                    }
                }
            }
        }
    }
}
