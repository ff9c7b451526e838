//! A seed fixes the devices' arbitrary choices (`backend_sim::choices`): with the same
//! seed a run sees the same QP numbers, MR and window keys, LID and GID, on every
//! profile, and rdma_cm the same ephemeral ports; another seed, or none, chooses
//! otherwise.

use backend_sim::profile::Profile;
use backend_sim::{SimBackend, SimConfig};
use verbs_api::*;

/// What a run chose: QP numbers, MR lkeys and rkeys, a window's rkey, the LID and GID.
#[derive(Debug, PartialEq, Eq)]
struct Chosen {
    qpns: Vec<u32>,
    keys: Vec<(u32, u32)>,
    window: u32,
    lid: u16,
    gid: Gid,
}

/// Opens sim0 under `seed` and `profile`, makes three QPs, two MRs and a type 2 window,
/// and closes it all again (so that a second run can take the same address).
fn run(seed: Option<u64>, profile: Profile) -> Chosen {
    let sim = SimBackend::new(SimConfig {
        seed,
        profile,
        ..SimConfig::default()
    });
    let ctx = sim.open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qps: Vec<_> = (0..3)
        .map(|_| pd.create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(4, 4))).unwrap())
        .collect();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND;
    let mrs: Vec<_> = (0..2).map(|_| pd.reg_mr(4096, access).unwrap()).collect();
    let mw = pd.alloc_mw(MwType::Type2).unwrap();
    let port = ctx.query_port(1).unwrap();
    Chosen {
        qpns: qps.iter().map(|q| q.qp_num()).collect(),
        keys: mrs.iter().map(|m| (m.lkey(), m.rkey())).collect(),
        window: mw.rkey(),
        lid: port.lid,
        gid: ctx.query_gid(1, 1).unwrap(),
    }
}

#[test]
fn the_same_seed_makes_the_same_choices_on_every_profile() {
    for profile in Profile::ALL {
        let a = run(Some(42), profile);
        let b = run(Some(42), profile);
        assert_eq!(a, b, "{profile}: seed 42 twice");
        let c = run(Some(43), profile);
        assert_ne!(a.qpns, c.qpns, "{profile}: seeds 42 and 43");
        assert_ne!(a.keys, c.keys, "{profile}: seeds 42 and 43");
        if profile == Profile::Rxe {
            // A RoCE device's GID is the loopback IP it drew.
            assert_ne!(a.gid, c.gid, "{profile}: seeds 42 and 43");
        } else {
            assert_ne!(a.lid, c.lid, "{profile}: seeds 42 and 43");
        }
    }
}

#[test]
fn without_a_seed_runs_choose_independently() {
    let (a, b) = (run(None, Profile::Portable), run(None, Profile::Portable));
    // (Three 24-bit QP numbers alike by chance: about once in 2^72 runs.)
    assert_ne!(a.qpns, b.qpns);
}

/// The ephemeral ports rdma_cm gives two ids bound to port 0 on a backend under `seed`.
fn cm_ports(seed: Option<u64>) -> Vec<u16> {
    use verbs_api::rdmacm::{CmBackend, CmEventChannel, CmId, PortSpace};
    let sim = SimBackend::new(SimConfig {
        seed,
        ..SimConfig::default()
    });
    let ch = sim.create_event_channel().unwrap();
    let ids: Vec<_> = (0..2)
        .map(|i| ch.create_id(i, PortSpace::Tcp, QpType::Rc).unwrap())
        .collect();
    ids.iter()
        .map(|id| {
            id.bind_addr("127.0.0.1:0".parse().unwrap()).unwrap();
            id.query_addr().unwrap().src.unwrap().port()
        })
        .collect()
}

#[test]
fn the_same_seed_gives_rdma_cm_the_same_ephemeral_ports() {
    // Seeds of their own: the device these ids open would else draw the address the
    // other test's devices draw under its seed, at the same moment.
    assert_eq!(cm_ports(Some(4242)), cm_ports(Some(4242)));
    assert_ne!(cm_ports(Some(4242)), cm_ports(Some(4243)));
}
