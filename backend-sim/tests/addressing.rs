//! Where a device says it can be reached: its GID table and LID, for a specific listen
//! address and for a wildcard one (which must advertise an address peers can reach, never
//! `0.0.0.0`). GID 0 is the port's default GID (link-local, made of the device's IPv4
//! address: `backend_sim_proto::gid`), GID 1 the address itself.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use backend_sim::{SimBackend, SimConfig};
use verbs_api::*;

/// The default GID of a device at `ip`.
fn default_gid(ip: Ipv4Addr) -> Gid {
    Gid(backend_sim_proto::gid::default_of(&Gid::from(ip).0))
}

fn wildcard(advertise: Option<IpAddr>) -> SimBackend {
    SimBackend::new(SimConfig {
        listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        advertise,
        ..SimConfig::default()
    })
}

#[test]
fn a_specific_listen_address_is_the_gid() {
    let ctx = SimBackend::default().open("sim0").unwrap();
    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.gid_tbl_len, 2);
    assert_eq!(port.lid, ctx.listen_addr().port());
    assert_eq!(ctx.query_gid(1, 0).unwrap(), default_gid(Ipv4Addr::LOCALHOST));
    assert_eq!(ctx.query_gid(1, 1).unwrap(), Gid::from(Ipv4Addr::LOCALHOST));
    assert!(ctx.query_gid(1, 2).is_err());
    assert_eq!(ctx.advertised_addr(), ctx.listen_addr());
}

#[test]
fn a_wildcard_listen_advertises_a_host_address_and_lists_the_others() {
    let ctx = wildcard(None).open("sim0").unwrap();
    assert!(ctx.listen_addr().ip().is_unspecified());
    let adv = ctx.advertised_addr();
    assert!(!adv.ip().is_unspecified(), "advertises {adv}");
    assert_eq!(adv.port(), ctx.listen_addr().port());
    let v4 = match adv.ip() {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(_) => panic!("an IPv4 wildcard advertised {adv}"),
    };
    let gid1 = ctx.query_gid(1, 1).unwrap();
    assert_eq!(gid1, Gid::from(v4));
    assert_eq!(ctx.query_gid(1, 0).unwrap(), default_gid(v4));
    let n = ctx.query_port(1).unwrap().gid_tbl_len;
    let table: Vec<Gid> = (0..n).map(|i| ctx.query_gid(1, i).unwrap()).collect();
    for g in &table[2..] {
        let v4 = g
            .to_ipv6()
            .to_ipv4_mapped()
            .expect("0.0.0.0 lists IPv4 addresses only");
        assert!(!v4.is_loopback() && !v4.is_unspecified(), "{table:?}");
        assert_ne!(*g, gid1, "{table:?}");
    }
}

#[test]
fn a_configured_advertised_address_is_the_gid() {
    let ip = Ipv4Addr::new(127, 0, 0, 9);
    let ctx = wildcard(Some(ip.into())).open("sim0").unwrap();
    assert_eq!(ctx.query_gid(1, 0).unwrap(), default_gid(ip));
    assert_eq!(ctx.query_gid(1, 1).unwrap(), Gid::from(ip));
    assert_eq!(ctx.advertised_addr().ip(), IpAddr::V4(ip));
}

/// Two devices that listen on the wildcard, each told the other's GID: connected, they
/// reach each other at the advertised addresses, named by GID 0 (the default GID) or
/// GID 1 (the address's).
#[test]
fn wildcard_devices_connect_through_their_advertised_gids() {
    let ip = Ipv4Addr::new(127, 0, 0, 9);
    let sim = wildcard(Some(ip.into()));
    let (c0, c1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let (cq0, cq1) = (c0.create_cq(8, None).unwrap(), c1.create_cq(8, None).unwrap());
    let src = pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pd1.reg_mr(64, AccessFlags::ALL).unwrap();
    for (gid_index, gid) in [(0, default_gid(ip)), (1, Gid::from(ip))] {
        let a = pd0
            .create_qp(&QpInitAttr::rc(&cq0, &cq0, QpCap::new(4, 4)))
            .unwrap();
        let b = pd1
            .create_qp(&QpInitAttr::rc(&cq1, &cq1, QpCap::new(4, 4)))
            .unwrap();
        let p = RcParams {
            gid_index,
            ..RcParams::default()
        };
        let ea = local_endpoint(&c0, &a, &p, 1).unwrap();
        let eb = local_endpoint(&c1, &b, &p, 2).unwrap();
        assert_eq!(ea.gid, gid);
        connect_rc(&a, &p, ea.psn, &eb).unwrap();
        connect_rc(&b, &p, eb.psn, &ea).unwrap();
        src.write(0, b"across").unwrap();
        a.post_send(&[SendWr::write(1, &[src.sge(0, 6).unwrap()], dst.remote().at(0)).signaled()])
            .unwrap();
        let wc = poll_n(&cq0, 1, std::time::Duration::from_secs(5)).unwrap();
        assert_eq!(wc[0].status, WcStatus::Success, "GID {gid_index}: {wc:?}");
        let mut got = [0u8; 6];
        dst.read(0, &mut got).unwrap();
        assert_eq!(&got, b"across");
        dst.write(0, &[0; 6]).unwrap();
    }
}
