//! UD multicast (`man ibv_attach_mcast`; IBA 10.5 and 9.6.1.4; the kernel's
//! `ib_attach_mcast()` and uverbs' attachment list): a UD QP attached to a group (an
//! MGID and an MLID) receives every datagram sent to the group's address, each QP
//! checking its own Q_Key; a datagram names the group by an address handle whose GRH
//! holds the MGID, and QP [`MULTICAST_QPN`].
//!
//! What every backend shares is here: the numbers IBA reserves and the checks the
//! kernel makes before any driver sees an attach or a detach ([`check_attach`]). What a
//! QP's attachments are follows uverbs, which keeps one list per QP of (MGID, MLID)
//! pairs: attaching a pair it holds again succeeds and changes nothing, detaching a pair
//! it does not hold is EINVAL, and `ibv_destroy_qp` of an attached QP fails with EBUSY
//! (a verbs-api QP handle, which cannot fail to drop, detaches itself first).
//!
//! Receiving needs more than the attach: the fabric must deliver the group to the port.
//! On InfiniBand a join at the subnet administrator does it (the man page's note), on
//! RoCE the host's IP-level join of the group's address (what rdma_cm's
//! `rdma_join_multicast` does); `ibv_attach_mcast` alone programs only the HCA.

use crate::device::{Gid, LinkLayer};
use crate::error::{Error, Result};
use crate::qp::QpType;

/// The destination QP of every multicast datagram (IBA 9.6.1.4: a packet to a multicast
/// LID or GID names QP 0xFFFFFF), in `wr.ud.remote_qpn`.
pub const MULTICAST_QPN: u32 = 0xff_ffff;

/// The first multicast LID (IBA 4.1.3: 0xC000 to 0xFFFE are multicast LIDs).
pub const MULTICAST_LID_BASE: u16 = 0xc000;

/// The host's IP-level membership of a RoCE v2 group, held while the socket lives: on a
/// port whose GID `local` is an IPv4 address, joins the IPv4 multicast address that
/// `mgid` names on that interface (`IP_ADD_MEMBERSHIP`, the IGMP join rdma_cm's
/// `rdma_join_multicast` makes), so that the network, and the host's own IP stack for a
/// sender on the same host (Soft-RoCE sends through it), deliver the group to the port.
/// `Ok(None)` where an IP join means nothing: either GID is not an IPv4 one (InfiniBand,
/// where the subnet administrator's join does it).
pub fn ip_join(mgid: &Gid, local: &Gid) -> std::io::Result<Option<std::net::UdpSocket>> {
    let (Some(group), Some(iface)) = (mgid.to_ipv4_mapped(), local.to_ipv4_mapped()) else {
        return Ok(None);
    };
    let s = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))?;
    s.join_multicast_v4(&group, &iface)?;
    Ok(Some(s))
}

/// The permissive LID, never a group's.
pub const PERMISSIVE_LID: u16 = 0xffff;

/// The checks of the kernel's `ib_attach_mcast()` / `ib_detach_mcast()` for `call`: the
/// GID must be a multicast GID ([`Gid::is_multicast`]), the QP a UD QP, and on an
/// InfiniBand port the LID a multicast LID (0xC000 to 0xFFFE); an Ethernet (RoCE) port
/// ignores the LID (RoCE annex A17.5.6). Each failure is EINVAL and says which.
pub fn check_attach(call: &'static str, qp_type: QpType, gid: &Gid, lid: u16, link: LinkLayer) -> Result<()> {
    if !gid.is_multicast() {
        return Err(Error::invalid(call, format!("{gid} is not a multicast GID")));
    }
    if qp_type != QpType::Ud {
        return Err(Error::invalid(
            call,
            format!("only UD QPs join multicast groups (this QP is {qp_type:?})"),
        ));
    }
    if link != LinkLayer::Ethernet && (lid < MULTICAST_LID_BASE || lid == PERMISSIVE_LID) {
        return Err(Error::invalid(
            call,
            format!("LID {lid:#x} is not a multicast LID (0xc000 to 0xfffe) on an InfiniBand port"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(s: &str) -> Gid {
        Gid::from(s.parse::<std::net::Ipv6Addr>().unwrap())
    }

    #[test]
    fn the_kernels_checks() {
        let mg = gid("ff12:401b::1");
        let ib = LinkLayer::InfiniBand;
        assert!(check_attach("a", QpType::Ud, &mg, 0xc001, ib).is_ok());
        let errno = |r: Result<()>| r.unwrap_err().errno();
        assert_eq!(
            errno(check_attach("a", QpType::Ud, &gid("fe80::1"), 0xc001, ib)),
            libc::EINVAL
        );
        assert_eq!(
            errno(check_attach("a", QpType::Rc, &mg, 0xc001, ib)),
            libc::EINVAL
        );
        assert_eq!(errno(check_attach("a", QpType::Ud, &mg, 0x10, ib)), libc::EINVAL);
        assert_eq!(
            errno(check_attach("a", QpType::Ud, &mg, 0xffff, ib)),
            libc::EINVAL
        );
        // RoCE ignores the LID.
        assert!(check_attach("a", QpType::Ud, &gid("::ffff:239.1.2.3"), 0, LinkLayer::Ethernet).is_ok());
    }
}
