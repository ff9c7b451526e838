//! UD multicast (`man ibv_attach_mcast`; IBA 10.5, 9.6.1.4; rxe's `rxe_mcast.c` and
//! `rxe_recv.c`): a device's groups and the host's view of which devices have members.
//!
//! - **Attach** (`ibv_attach_mcast`): the kernel's checks
//!   ([`verbs_api::mcast::check_attach`]), then the QP joins the group in the device's
//!   table ([`Groups`], with the profile's limits); a device's first member of a group
//!   makes the device a member in the host's view ([`registry`]), which is how the sim's
//!   fabric joins a port to a group (an InfiniBand port joins at the subnet
//!   administrator, a RoCE host at the IP level; the sim does it with the attach).
//! - **Sending** (`datagram`): a UD send whose address handle's GRH names a multicast
//!   GID goes to the group: one copy to each device the view names (on the link to it,
//!   or to the device's own queue), never one per QP.
//! - **Receiving** (`datagram`): a datagram to QP [`verbs_api::MULTICAST_QPN`] with a
//!   multicast DGID goes to each QP of the device attached to that group, each checking
//!   its own Q_Key and taking its own receive, as rxe's `rxe_rcv_mcast_pkt()` does;
//!   the sending QP itself too (on rxe and a ConnectX alike), unless it was created with
//!   `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`.
//!
//! Who may receive: only the QPs a device attached itself. Another process can at most
//! make a device a member in the view, which sends that device datagrams its groups do
//! not take (dropped, counted); a datagram's source is still the link's.

pub mod groups;
pub mod registry;

pub use groups::{Change, Groups};
pub use registry::registry;

use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use verbs_api::{Gid, LinkLayer, QpType, Result};

use crate::qp::QpShared;

/// A device's groups and its place in the host's view of them.
pub struct Multicast {
    /// Its groups and their members.
    pub groups: Groups,
    link: LinkLayer,
    /// Where the device is reached: what the view records it as. Held across a change of
    /// the groups and what the view hears of it, so that the view hears of a group's
    /// first member and last leaving in the order they happened.
    publish: Mutex<SocketAddr>,
}

impl Multicast {
    /// No groups yet, for the device reached at `addr`, with a port of link layer
    /// `link`, within the profile's limits.
    pub fn new(addr: SocketAddr, link: LinkLayer, limits: &crate::profile::Attrs) -> Multicast {
        Multicast {
            groups: Groups::new(
                limits.max_mcast_grp,
                limits.max_mcast_qp_attach,
                limits.max_total_mcast_qp_attach,
            ),
            link,
            publish: Mutex::new(addr),
        }
    }

    /// `ibv_attach_mcast` of `qp`.
    pub fn attach(&self, qp: &Arc<QpShared>, gid: &Gid, lid: u16) -> Result<()> {
        verbs_api::mcast::check_attach("ibv_attach_mcast", qp.qp_type, gid, lid, self.link)?;
        let addr = self.publish.lock();
        if self.groups.attach(qp.qpn, Arc::downgrade(qp), *gid, lid)? == Change::Joined {
            registry().join(gid, *addr);
        }
        Ok(())
    }

    /// `ibv_detach_mcast` of QP `qpn` (of type `qp_type`).
    pub fn detach(&self, qpn: u32, qp_type: QpType, gid: &Gid, lid: u16) -> Result<()> {
        verbs_api::mcast::check_attach("ibv_detach_mcast", qp_type, gid, lid, self.link)?;
        let addr = self.publish.lock();
        if self.groups.detach(qpn, *gid, lid)? == Change::Left {
            registry().leave(gid, *addr);
        }
        Ok(())
    }

    /// QP `qpn` leaves every group (it is destroyed).
    pub fn detach_all(&self, qpn: u32) {
        let addr = self.publish.lock();
        for gid in self.groups.detach_all(qpn) {
            registry().leave(&gid, *addr);
        }
    }

    /// The device closes: it is no member of any group any more.
    pub fn close(&self) {
        let addr = self.publish.lock();
        for gid in self.groups.groups() {
            registry().leave(&gid, *addr);
        }
    }

    /// The device is reached at `to` now (its LID changed): the view names it there for
    /// each of its groups, as a switch keeps forwarding a group to a port whose LID
    /// changed (multicast forwarding is by port, not by the member's LID).
    pub fn moved(&self, to: SocketAddr) {
        let mut addr = self.publish.lock();
        for gid in self.groups.groups() {
            registry().join(&gid, to);
            registry().leave(&gid, *addr);
        }
        *addr = to;
    }

    /// The live QPs attached to `gid`, into `out`.
    pub fn members(&self, gid: &Gid, out: &mut Vec<Arc<QpShared>>) {
        self.groups.members(gid, out)
    }
}
