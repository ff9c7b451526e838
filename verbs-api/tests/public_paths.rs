//! The paths users write keep naming the same items after the crate's modules were put
//! in layers: what moved to a lower module is still reachable under the public module
//! where it lived (`wr`, `mw`, `traits`, `endpoint`, `cm`, `rdmacm`) and at the crate
//! root, and both paths are one item.

use std::any::TypeId;
use std::time::Duration;

fn same<A: ?Sized + 'static, B: ?Sized + 'static>() -> bool {
    TypeId::of::<A>() == TypeId::of::<B>()
}

#[test]
fn work_request_parts_under_wr_and_the_root() {
    assert!(same::<verbs_api::wr::Sge, verbs_api::Sge>());
    assert!(same::<verbs_api::wr::RemoteAddr, verbs_api::RemoteAddr>());
    let sge = verbs_api::wr::Sge::new(0x1000, 64, 9);
    assert_eq!((sge.addr, sge.length, sge.lkey), (0x1000, 64, 9));
    // A peer's region descriptor still converts into the address a WRITE names.
    let mr = verbs_api::endpoint::RemoteMr {
        addr: 0x2000,
        rkey: 7,
        len: 64,
    };
    assert_eq!(
        verbs_api::wr::RemoteAddr::from(mr),
        verbs_api::RemoteAddr::new(0x2000, 7)
    );
    assert_eq!(mr.at(8), verbs_api::wr::RemoteAddr::new(0x2008, 7));
}

#[test]
fn verbs_object_traits_under_traits_and_the_root() {
    assert!(same::<
        dyn verbs_api::traits::MemoryRegion,
        dyn verbs_api::MemoryRegion,
    >());
    assert!(same::<
        dyn verbs_api::traits::MemoryWindow,
        dyn verbs_api::MemoryWindow,
    >());
    assert!(same::<
        dyn verbs_api::traits::AddressHandle,
        dyn verbs_api::AddressHandle,
    >());
}

#[test]
fn memory_window_names_under_mw() {
    assert!(same::<verbs_api::mw::MwType, verbs_api::MwType>());
    assert!(same::<verbs_api::mw::MwBind<'static>, verbs_api::MwBind<'static>>());
    assert!(same::<
        verbs_api::mw::MwBindInfo<'static>,
        verbs_api::MwBindInfo<'static>,
    >());
    assert!(same::<verbs_api::mw::BindMw<'static>, verbs_api::BindMw<'static>>());
    assert_eq!(verbs_api::mw::inc_rkey(0x1234_56ff), 0x1234_5600);
    assert_eq!(verbs_api::mw::MwType::from_raw(1), Some(verbs_api::MwType::Type1));
}

#[test]
fn connection_setup_names_under_cm() {
    use verbs_api::cm;
    assert_eq!(cm::parse_hello(b""), Ok(cm::HelloParse::Need(4)));
    let offer = cm::Offer::new().private_data(vec![1, 2, 3]);
    let hello = cm::encode_hello(&verbs_api::Endpoint::default(), &offer);
    let (_, mrs, private) = cm::decode_hello(&mut &hello[..]).unwrap().unwrap();
    assert!(mrs.is_empty());
    assert_eq!(private, offer.private_data);
    const { assert!(cm::MAX_MRS > 0 && cm::MAX_PRIVATE > 0) };
    assert!(cm::DEFAULT_TIMEOUT > Duration::ZERO && cm::REQUEST_TIMEOUT > Duration::ZERO);
    const { assert!(cm::SETUP_BOUND.max > 0) };
    assert!(same::<cm::Peer, cm::Peer<std::net::TcpStream>>());
    assert!(same::<cm::Incoming, cm::Incoming<std::net::TcpStream>>());
    assert!(same::<cm::ConnectRequest, cm::ConnectRequest<std::net::TcpStream>>());
    let listener = cm::CmListener::bind("127.0.0.1:0").unwrap();
    assert!(listener.local_addr().unwrap().port() != 0);
}

/// Type-checked, never called: the calls generic over a backend keep their paths (a
/// backend's own `QueuePair::bind_mw` ends in `mw::post_type1_bind`).
#[allow(dead_code)]
fn generic_calls<C: verbs_api::Context, Q: verbs_api::QueuePair>(
    ctx: &C,
    qp: &Q,
    mw: &dyn verbs_api::MemoryWindow,
    bind: &verbs_api::MwBind<'_>,
) -> verbs_api::Result<()> {
    use verbs_api::cm;
    verbs_api::mw::post_type1_bind(qp, mw, bind)?;
    let (params, offer) = (verbs_api::RcParams::default(), cm::Offer::new());
    cm::connect("peer:1", ctx, qp, &params, &offer)?;
    cm::exchange("peer:1", &verbs_api::Endpoint::default(), &offer)?;
    #[cfg(feature = "tokio")]
    drop(cm::connect_async("peer:1", ctx, qp, &params, &offer));
    Ok(())
}

#[cfg(feature = "tokio")]
#[test]
fn async_connection_setup_names_under_cm() {
    use verbs_api::cm;
    assert!(same::<cm::AsyncPeer, cm::Peer<tokio::net::TcpStream>>());
    assert!(same::<cm::AsyncIncoming, cm::Incoming<tokio::net::TcpStream>>());
    assert!(same::<
        cm::AsyncConnectRequest,
        cm::ConnectRequest<tokio::net::TcpStream>,
    >());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = rt.block_on(cm::AsyncCmListener::bind("127.0.0.1:0")).unwrap();
    assert!(listener.local_addr().unwrap().port() != 0);
}

#[test]
fn connection_manager_data_under_rdmacm() {
    use verbs_api::rdmacm;
    assert_eq!(rdmacm::PortSpace::Udp.qp_type(), verbs_api::QpType::Ud);
    assert_eq!(
        rdmacm::reject::checked(0).unwrap(),
        rdmacm::reject::CONSUMER_DEFINED as u8
    );
    assert!(rdmacm::reject::checked(1).is_err());
    assert_eq!(rdmacm::sidr::SUCCESS, 0);
    assert_eq!(
        rdmacm::CmEventType::from_raw(0),
        Some(rdmacm::CmEventType::AddrResolved)
    );
    assert_eq!(
        rdmacm::private_data_len(rdmacm::CmEventType::ConnectRequest, verbs_api::QpType::Ud),
        180
    );
    const { assert!(rdmacm::MAX_PRIVATE_DATA > 0 && rdmacm::MAX_RD_ATOMIC > 0 && rdmacm::UDP_QKEY != 0) };
    assert_eq!(rdmacm::ConnParam::rc(&[5]).private_data, vec![5]);
}
