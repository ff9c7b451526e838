//! A device's multicast groups (rxe's `rxe_mcast.c`, uverbs' attachment lists): which of
//! its QPs are attached to which group, within the profile's limits, and each QP's list
//! of (MGID, MLID) pairs as `ibv_attach_mcast` gave them.
//!
//! - A QP joins a group once, whatever MLIDs it was attached with; a pair given again
//!   changes nothing (uverbs' list); a pair it does not hold is EINVAL at detach. The
//!   QP leaves the group with its last pair for that MGID.
//! - Past `max_mcast_grp` groups, `max_mcast_qp_attach` QPs in a group or
//!   `max_total_mcast_qp_attach` memberships in all, an attach is ENOMEM (rxe's
//!   `rxe_get_mcg()` and `__rxe_init_mca()`).
//! - The first member of a group on the device, and its last leaving, are what the
//!   host's view of the group ([`registry`](super::registry)) hears of.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use verbs_api::{Error, Gid, Result};

use crate::qp::QpShared;

/// What an attach or a detach changed for the device as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing the rest of the fabric needs to hear.
    None,
    /// The group's first member on this device.
    Joined,
    /// The group's last member on this device left.
    Left,
}

/// A QP in a group.
struct Member {
    qpn: u32,
    qp: Weak<QpShared>,
}

#[derive(Default)]
struct Inner {
    /// Members by group.
    by_gid: HashMap<Gid, Vec<Member>>,
    /// Each QP's (MGID, MLID) pairs.
    by_qp: HashMap<u32, Vec<(Gid, u16)>>,
    /// Memberships in all.
    total: u32,
}

/// The multicast groups of one device.
pub struct Groups {
    max_grp: u32,
    max_qp_attach: u32,
    max_total: u32,
    inner: Mutex<Inner>,
}

impl Groups {
    /// No groups yet, within these limits (`max_mcast_grp`, `max_mcast_qp_attach`,
    /// `max_total_mcast_qp_attach`).
    pub fn new(max_grp: u32, max_qp_attach: u32, max_total: u32) -> Groups {
        Groups {
            max_grp,
            max_qp_attach,
            max_total,
            inner: Mutex::default(),
        }
    }

    /// `ibv_attach_mcast` of QP `qpn` (`qp`) to (`gid`, `lid`), checked by the caller
    /// ([`verbs_api::mcast::check_attach`]).
    pub fn attach(&self, qpn: u32, qp: Weak<QpShared>, gid: Gid, lid: u16) -> Result<Change> {
        let mut g = self.inner.lock();
        let Inner { by_gid, by_qp, total } = &mut *g;
        let pairs = by_qp.entry(qpn).or_default();
        if pairs.contains(&(gid, lid)) {
            return Ok(Change::None);
        }
        if pairs.iter().any(|(g, _)| *g == gid) {
            pairs.push((gid, lid));
            return Ok(Change::None);
        }
        let no_memory = |reason: String| {
            Err(Error::NoMemory {
                call: "ibv_attach_mcast",
                reason,
            })
        };
        let members = by_gid.get(&gid).map_or(0, Vec::len) as u32;
        if members == 0 && by_gid.len() as u32 >= self.max_grp {
            if pairs.is_empty() {
                by_qp.remove(&qpn);
            }
            return no_memory(format!("the device has {} groups (max_mcast_grp)", self.max_grp));
        }
        if members >= self.max_qp_attach {
            if pairs.is_empty() {
                by_qp.remove(&qpn);
            }
            return no_memory(format!("group {gid} has {members} QPs (max_mcast_qp_attach)"));
        }
        if *total >= self.max_total {
            if pairs.is_empty() {
                by_qp.remove(&qpn);
            }
            return no_memory(format!(
                "{} attachments on the device (max_total_mcast_qp_attach)",
                self.max_total
            ));
        }
        pairs.push((gid, lid));
        *total += 1;
        by_gid.entry(gid).or_default().push(Member { qpn, qp });
        Ok(if members == 0 {
            Change::Joined
        } else {
            Change::None
        })
    }

    /// `ibv_detach_mcast` of QP `qpn` from (`gid`, `lid`): EINVAL unless it holds that
    /// pair.
    pub fn detach(&self, qpn: u32, gid: Gid, lid: u16) -> Result<Change> {
        let mut g = self.inner.lock();
        let Inner { by_gid, by_qp, total } = &mut *g;
        let Some(pairs) = by_qp.get_mut(&qpn) else {
            return Err(not_attached(qpn, &gid, lid));
        };
        let Some(i) = pairs.iter().position(|p| *p == (gid, lid)) else {
            return Err(not_attached(qpn, &gid, lid));
        };
        pairs.swap_remove(i);
        let still = pairs.iter().any(|(g, _)| *g == gid);
        if pairs.is_empty() {
            by_qp.remove(&qpn);
        }
        if still {
            return Ok(Change::None);
        }
        *total -= 1;
        Ok(remove_member(by_gid, &gid, qpn))
    }

    /// QP `qpn` leaves every group (it is destroyed); the groups it was the device's last
    /// member of.
    pub fn detach_all(&self, qpn: u32) -> Vec<Gid> {
        let mut g = self.inner.lock();
        let Inner { by_gid, by_qp, total } = &mut *g;
        let Some(mut pairs) = by_qp.remove(&qpn) else {
            return Vec::new();
        };
        pairs.sort_unstable();
        pairs.dedup_by_key(|p| p.0);
        let mut left = Vec::new();
        for (gid, _) in pairs {
            *total -= 1;
            if remove_member(by_gid, &gid, qpn) == Change::Left {
                left.push(gid);
            }
        }
        left
    }

    /// Whether QP `qpn` is attached to any group (`ibv_destroy_qp` is EBUSY then).
    pub fn is_attached(&self, qpn: u32) -> bool {
        self.inner.lock().by_qp.contains_key(&qpn)
    }

    /// The groups with members on the device.
    pub fn groups(&self) -> Vec<Gid> {
        self.inner.lock().by_gid.keys().copied().collect()
    }

    /// The live QPs attached to `gid`, into `out` (cleared first).
    pub fn members(&self, gid: &Gid, out: &mut Vec<Arc<QpShared>>) {
        out.clear();
        if let Some(m) = self.inner.lock().by_gid.get(gid) {
            out.extend(m.iter().filter_map(|m| m.qp.upgrade()));
        }
    }
}

/// Takes QP `qpn` out of `gid`'s members: [`Change::Left`] if it was the last.
fn remove_member(by_gid: &mut HashMap<Gid, Vec<Member>>, gid: &Gid, qpn: u32) -> Change {
    let Some(m) = by_gid.get_mut(gid) else {
        return Change::None;
    };
    m.retain(|m| m.qpn != qpn);
    if m.is_empty() {
        by_gid.remove(gid);
        Change::Left
    } else {
        Change::None
    }
}

fn not_attached(qpn: u32, gid: &Gid, lid: u16) -> Error {
    Error::invalid(
        "ibv_detach_mcast",
        format!("QP {qpn:#x} is not attached to group {gid} with LID {lid:#x}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(last: u8) -> Gid {
        let mut g = [0u8; 16];
        g[0] = 0xff;
        g[15] = last;
        Gid(g)
    }

    #[test]
    fn pairs_are_kept_as_uverbs_keeps_them() {
        let t = Groups::new(8, 8, 64);
        assert_eq!(t.attach(1, Weak::new(), gid(1), 0xc001).unwrap(), Change::Joined);
        // The same pair again, and the same group with another MLID: nothing new.
        assert_eq!(t.attach(1, Weak::new(), gid(1), 0xc001).unwrap(), Change::None);
        assert_eq!(t.attach(1, Weak::new(), gid(1), 0xc002).unwrap(), Change::None);
        assert_eq!(t.attach(2, Weak::new(), gid(1), 0xc001).unwrap(), Change::None);
        assert_eq!(t.detach(1, gid(1), 0xc003).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(t.detach(3, gid(1), 0xc001).unwrap_err().errno(), libc::EINVAL);
        // QP 1 stays in the group until its last pair for it goes.
        assert_eq!(t.detach(1, gid(1), 0xc001).unwrap(), Change::None);
        assert!(t.is_attached(1));
        assert_eq!(t.detach(1, gid(1), 0xc002).unwrap(), Change::None);
        assert!(!t.is_attached(1));
        assert_eq!(t.detach(2, gid(1), 0xc001).unwrap(), Change::Left);
        assert!(t.groups().is_empty());
    }

    #[test]
    fn the_limits_are_enomem_and_leave_nothing_behind() {
        let t = Groups::new(2, 2, 3);
        t.attach(1, Weak::new(), gid(1), 0xc001).unwrap();
        t.attach(2, Weak::new(), gid(1), 0xc001).unwrap();
        // A third QP in a group of two.
        assert_eq!(
            t.attach(3, Weak::new(), gid(1), 0xc001).unwrap_err().errno(),
            libc::ENOMEM
        );
        assert!(!t.is_attached(3));
        t.attach(1, Weak::new(), gid(2), 0xc001).unwrap();
        // A third group; then a fourth attachment.
        assert_eq!(
            t.attach(1, Weak::new(), gid(3), 0xc001).unwrap_err().errno(),
            libc::ENOMEM
        );
        assert_eq!(
            t.attach(2, Weak::new(), gid(2), 0xc001).unwrap_err().errno(),
            libc::ENOMEM
        );
        let mut left = t.detach_all(1);
        left.sort();
        assert_eq!(left, vec![gid(2)]);
        t.attach(2, Weak::new(), gid(2), 0xc001).unwrap();
    }
}
