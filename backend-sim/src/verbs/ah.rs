//! Address handles (`man ibv_create_ah`, `man ibv_destroy_ah`): the destination of UD
//! sends. An address handle resolves its address vector once, the way a QP's is resolved
//! (GID → the peer device's IP, LID → its TCP port; without a GRH the device is on this
//! host; on an Ethernet port the GID alone), and keeps its PD alive. On an InfiniBand
//! port the GRH is optional (`is_global`), on an Ethernet (RoCE) port required; with it
//! the datagrams carry its fields, and the receiver finds a GRH in front of its buffer.
//!
//! An address handle whose GRH names a multicast GID leads to a multicast group (IBA
//! 10.5): its datagrams go to the devices with members of the group, and to QP 0xFFFFFF
//! there ([`crate::mcast`]). On InfiniBand, where a group also has an MLID, the sim
//! names it by the MGID alone: a handle with a multicast DLID needs the GRH.
//!
//! A send WR names its address handle by reference ([`verbs_api::SendWr::ud`]);
//! [`route_of`] recognises this backend's handles by type and refuses any other, or one
//! of another device, with EINVAL, before the WR is queued.

use std::any::{Any, TypeId};
use std::sync::Arc;

use verbs_api::{AddressHandle, AhAttr, Error, Result};

use crate::device::{DeviceShared, PdShared};
use crate::qp::ud::AhRoute;
use backend_sim_proto::wire::Grh;

/// The bits of a GRH's flow label (IBA 8.3.1, `IB_GRH_FLOWLABEL_MASK`).
const FLOW_LABEL_MASK: u32 = 0xf_ffff;

/// An address handle of the sim.
pub struct SimAh {
    attr: AhAttr,
    route: AhRoute,
    /// Keeps the PD (and through it the device) alive as long as the handle.
    pd: Arc<PdShared>,
}

impl SimAh {
    /// `ibv_create_ah` in `pd`: `attr`'s port must be the device's port 1, on InfiniBand
    /// its DLID a port number (not 0), on Ethernet (RoCE) the GRH there (its DLID
    /// ignored), and with a GRH its source GID index inside the GID table (EINVAL
    /// otherwise, as `ib_create_user_ah` and rxe's `rxe_av_chk_attr()` refuse a bad port
    /// or GID index); of the flow label only the low 20 bits count.
    pub(crate) fn create(pd: &Arc<PdShared>, attr: &AhAttr) -> Result<SimAh> {
        let bad = |name: &'static str, reason: String| Err(Error::InvalidAttr { name, reason });
        let addr = &pd.dev.addr;
        if attr.port_num != 1 {
            return bad(
                "ah_attr.port_num",
                format!("port {} does not exist (the device has port 1)", attr.port_num),
            );
        }
        if let Err((name, reason)) = addr.check_av(attr.is_global, attr.dlid) {
            return bad(name, reason);
        }
        if attr.is_global {
            if let Err((name, reason)) = addr.check_sgid_index(attr.grh.sgid_index) {
                return bad(name, reason);
            }
        } else if attr.dlid >= verbs_api::MULTICAST_LID_BASE && attr.dlid != verbs_api::mcast::PERMISSIVE_LID
        {
            return bad(
                "ah_attr.is_global",
                format!(
                    "LID {:#x} is a multicast LID: the sim names a multicast group by its MGID, so \
                     an address handle to a group needs the GRH with the MGID",
                    attr.dlid
                ),
            );
        }
        let multicast = attr.is_global && attr.grh.dgid.is_multicast();
        let grh = attr.is_global.then_some(Grh {
            dgid: attr.grh.dgid.0,
            // The GRH's field has 20 bits: mlx5 takes the low 20 (`mlx5_create_ah()`,
            // `IB_GRH_FLOWLABEL_MASK`) and rxe refuses no value, so neither does the sim.
            // UCX sets all 32 on purpose (rdma-core's flow-label-to-UDP-port conversion).
            flow_label: attr.grh.flow_label & FLOW_LABEL_MASK,
            traffic_class: attr.grh.traffic_class,
            hop_limit: attr.grh.hop_limit,
            // GID 0, where it is the default GID rather than the IP's.
            src_default: attr.grh.sgid_index == 0 && addr.gid() != addr.ip_gid(),
        });
        Ok(SimAh {
            attr: *attr,
            route: AhRoute {
                // A group has no one device: its datagrams go to its members' devices
                // (`datagram`), by the GRH's DGID.
                peer: if multicast {
                    std::net::SocketAddr::from(([0, 0, 0, 0], 0))
                } else {
                    addr.av_addr(attr)
                },
                grh,
            },
            pd: pd.clone(),
        })
    }
}

impl AddressHandle for SimAh {
    fn attr(&self) -> AhAttr {
        self.attr
    }
}

impl std::fmt::Debug for SimAh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimAh")
            .field("attr", &self.attr)
            .field("peer", &self.route.peer)
            .finish()
    }
}

/// Where `ah` leads, if it is an address handle of the sim made on device `dev`.
pub(crate) fn route_of(ah: &dyn AddressHandle, dev: &Arc<DeviceShared>) -> Option<AhRoute> {
    // The same test as `<dyn Any>::downcast_ref`, spelled out for the `AddressHandle`
    // object.
    if <dyn AddressHandle as Any>::type_id(ah) != TypeId::of::<SimAh>() {
        return None;
    }
    // SAFETY: the object's concrete type is SimAh (checked just above), so the data
    // pointer of the trait object points to a live SimAh for as long as `ah` is borrowed.
    let ah = unsafe { &*(ah as *const dyn AddressHandle as *const SimAh) };
    Arc::ptr_eq(&ah.pd.dev, dev).then_some(ah.route)
}
