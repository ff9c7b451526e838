//! Device profiles at the verbs level: the resource switches where rxe and a ConnectX
//! differ (when a send queue slot is free again; whether RESET and destroy remove a QP's
//! completions), and the portability warnings `portable` gives where no single choice
//! covers both.

use std::time::Duration;

use backend_sim::{Profile, SimBackend, SimConfig, SimCq, SimQp};
use backend_sim_proto::trace_capture::Capture;
use tracing::Level;
use verbs_api::*;

const WAIT: Duration = Duration::from_secs(10);

/// A device playing `profile` with one RC QP of `depth` send slots connected to itself,
/// its CQ (with a channel, so that a test can wait for a completion without polling it)
/// and a region to WRITE within.
struct Rig {
    _ctx: backend_sim::SimContext,
    ch: backend_sim::SimChannel,
    cq: SimCq,
    qp: SimQp,
    mr: backend_sim::SimMr,
    sge: [Sge; 1],
}

fn rig(profile: Profile, depth: u32) -> Rig {
    let sim = SimBackend::new(SimConfig {
        profile,
        ..SimConfig::default()
    });
    rig_on(&sim, depth)
}

/// [`rig`] on a device of `sim`.
fn rig_on(sim: &SimBackend, depth: u32) -> Rig {
    let ctx = sim.open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(64, Some(&ch)).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(depth, 1)))
        .unwrap();
    let mr = pd
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let p = RcParams::default();
    let me = local_endpoint(&ctx, &qp, &p, 7).unwrap();
    connect_rc(&qp, &p, me.psn, &me).unwrap();
    let sge = [mr.sge(0, 8).unwrap()];
    Rig {
        _ctx: ctx,
        ch,
        cq,
        qp,
        mr,
        sge,
    }
}

impl Rig {
    fn write(&self, id: u64, signaled: bool) -> SendWr<'_> {
        let wr = SendWr::write(id, &self.sge, self.mr.remote().at(1024));
        if signaled {
            wr.signaled()
        } else {
            wr
        }
    }

    /// Posts `n` WRITEs, the last one signaled, and waits (without polling) until its
    /// completion is in the CQ: every one of them has completed.
    fn fill(&self, n: u64) {
        self.cq.req_notify(false).unwrap();
        let wrs: Vec<SendWr<'_>> = (0..n).map(|i| self.write(i, i + 1 == n)).collect();
        self.qp.post_send(&wrs).unwrap();
        assert!(
            self.ch.get_cq_event(Some(WAIT)).unwrap().is_some(),
            "no completion"
        );
        self.cq.ack_events(1);
    }
}

fn warnings(log: &Capture, text: &str) -> usize {
    log.find(Level::WARN, text).len()
}

/// `portable` and mlx5 free a slot only when a completion covering it is polled: with
/// every WR of a full queue complete but its completion unpolled, the next post is
/// ENOMEM (and `portable` warns, once per QP); polling frees the slots. rxe freed them at
/// completion and takes the post.
#[test]
fn a_full_send_queue_of_unpolled_completions_refuses_posts_except_on_rxe() {
    for profile in Profile::ALL {
        let log = Capture::default();
        log.run(|| {
            let r = rig(profile, 4);
            r.fill(4);
            let more = r.qp.post_send(&[r.write(10, true)]);
            if profile == Profile::Rxe {
                more.unwrap();
                assert_eq!(poll_n(&r.cq, 2, WAIT).unwrap().len(), 2);
                return;
            }
            assert_eq!(more.unwrap_err().errno(), libc::ENOMEM, "{profile}");
            // Refused again: still one warning.
            assert!(r.qp.post_send(&[r.write(11, true)]).is_err());
            let mut wc = [WorkCompletion::default(); 4];
            assert_eq!(r.cq.poll(&mut wc).unwrap(), 1, "the one signaled WRITE");
            r.qp.post_send(&[r.write(12, true)]).unwrap();
            assert_eq!(poll_n(&r.cq, 1, WAIT).unwrap()[0].wr_id, 12);
        });
        let want = usize::from(profile.warns());
        assert_eq!(warnings(&log, "belong to WRs that completed"), want, "{profile}");
    }
}

/// The same pitfall as programs meet it: a loop of unsignaled WRs and one signaled WR
/// per queue's worth, whose completion it polls, runs under every profile.
#[test]
fn signaling_one_wr_per_queue_depth_and_polling_it_runs_everywhere() {
    for profile in Profile::ALL {
        let r = rig(profile, 8);
        for round in 0..20u64 {
            let wrs: Vec<SendWr<'_>> = (0..8).map(|i| r.write(round * 8 + i, i == 7)).collect();
            r.qp.post_send(&wrs).unwrap();
            let wc = poll_n(&r.cq, 1, WAIT).unwrap();
            assert_eq!((wc[0].wr_id, wc[0].status), (round * 8 + 7, WcStatus::Success));
        }
    }
}

/// `portable` and mlx5 remove a QP's completions from its CQ on RESET and on destroy;
/// `portable` warns that it removed some the application never polled. rxe leaves them
/// to be polled.
#[test]
fn reset_and_destroy_remove_unpolled_completions_except_on_rxe() {
    for profile in Profile::ALL {
        for destroy in [false, true] {
            let log = Capture::default();
            let left = log.run(|| {
                let r = rig(profile, 4);
                r.fill(2);
                let Rig { cq, qp, _ctx, .. } = r;
                if destroy {
                    drop(qp);
                } else {
                    let reset = QpAttr {
                        qp_state: QpState::Reset,
                        ..Default::default()
                    };
                    qp.modify(&reset, QpAttrMask::STATE).unwrap();
                }
                let mut wc = [WorkCompletion::default(); 4];
                cq.poll(&mut wc).unwrap()
            });
            let kept = profile == Profile::Rxe;
            assert_eq!(left, usize::from(kept), "{profile}, destroy {destroy}");
            let what = if destroy {
                "destroy of the QP removed"
            } else {
                "RESET of the QP removed"
            };
            assert_eq!(
                warnings(&log, what),
                usize::from(profile.warns()),
                "{profile}, destroy {destroy}"
            );
        }
    }
}

/// The advice about removed completions is said once per backend (every MPI_Finalize
/// destroys QPs with completions nobody polls), at the level the configuration asks.
#[test]
fn removed_completions_are_advised_once_per_backend_at_its_level() {
    use backend_sim::profile::warnings::Level as Advice;
    for level in [Advice::Warn, Advice::Debug] {
        let log = Capture::default();
        log.run(|| {
            let sim = SimBackend::new(SimConfig {
                portability_warnings: level,
                ..SimConfig::default()
            });
            for _ in 0..3 {
                let r = rig_on(&sim, 4);
                r.fill(2);
                drop(r);
            }
        });
        let what = "of its completions that were never polled";
        let (warned, debug) = (
            log.find(Level::WARN, what).len(),
            log.find(Level::DEBUG, what).len(),
        );
        let want = if level == Advice::Warn { (1, 0) } else { (0, 1) };
        assert_eq!((warned, debug), want, "{level}");
    }
}

/// Polling every completion before RESET leaves nothing to remove: no warning.
#[test]
fn reset_after_polling_everything_is_quiet() {
    let log = Capture::default();
    log.run(|| {
        let r = rig(Profile::Portable, 4);
        r.fill(2);
        assert_eq!(poll_n(&r.cq, 1, WAIT).unwrap().len(), 1);
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..Default::default()
        };
        r.qp.modify(&reset, QpAttrMask::STATE).unwrap();
    });
    assert_eq!(log.find(Level::WARN, "portability").len(), 0);
}

/// `RDMA_SIM_PROFILE` chooses the profile, and an unknown one is an error that names
/// the known ones. (One test sets the variable: tests run in threads of one process.)
#[test]
fn the_environment_chooses_the_profile() {
    std::env::set_var("RDMA_SIM_PROFILE", "mlx5");
    let p = SimBackend::from_env().map(|b| b.config().profile);
    std::env::set_var("RDMA_SIM_PROFILE", "cx9");
    let bad = SimBackend::from_env().err().map(|e| e.to_string());
    // Set empty, a variable counts as unset (a script's `RDMA_SIM_PROFILE=$P`).
    std::env::set_var("RDMA_SIM_PROFILE", "");
    std::env::set_var("RDMA_SIM_DEVICES", "");
    std::env::set_var("RDMA_SIM_PORTABILITY_WARNINGS", "");
    let empty = SimBackend::from_env().map(|b| b.config().clone());
    std::env::set_var("RDMA_SIM_PORTABILITY_WARNINGS", "debug");
    let debug = SimBackend::from_env().map(|b| b.config().portability_warnings);
    std::env::set_var("RDMA_SIM_PORTABILITY_WARNINGS", "loud");
    let bad_level = SimBackend::from_env().err().map(|e| e.to_string());
    for v in [
        "RDMA_SIM_PROFILE",
        "RDMA_SIM_DEVICES",
        "RDMA_SIM_PORTABILITY_WARNINGS",
    ] {
        std::env::remove_var(v);
    }
    assert_eq!(empty.unwrap(), SimConfig::default());
    assert_eq!(debug.unwrap(), backend_sim::profile::warnings::Level::Debug);
    let bad_level = bad_level.expect("an unknown level is an error");
    assert!(
        bad_level.contains("loud") && bad_level.contains("warn"),
        "{bad_level}"
    );
    assert_eq!(p.unwrap(), Profile::Mlx5);
    let bad = bad.expect("an unknown profile is an error");
    assert!(
        bad.contains("cx9") && bad.contains("portable") && bad.contains("rxe"),
        "{bad}"
    );
    let ctx = SimBackend::new(SimConfig {
        profile: Profile::Rxe,
        ..SimConfig::default()
    })
    .open("sim0")
    .unwrap();
    let d = ctx.query_device().unwrap();
    assert_eq!(
        (d.vendor_id, d.max_qp_rd_atom, d.max_srq_sge),
        (0xff_ffff, 128, 27)
    );
    assert_eq!(ctx.query_port(1).unwrap().max_msg_sz, 0x80_0000);
}

/// The rxe profile's port is Ethernet (RoCE v2), as rxe0's: LID 0, each device at an IP
/// of its own, so that two devices (of one process here, of two in the examples' tests)
/// find each other by GID alone; an address vector without the GRH is refused, as on
/// RoCE; a listen port other than the RoCE port is a clear error.
#[test]
fn the_rxe_profile_is_an_ethernet_port_reached_by_gid_alone() {
    let sim = SimBackend::new(SimConfig {
        profile: Profile::Rxe,
        ..SimConfig::default()
    });
    let (c0, c1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (p0, p1) = (c0.query_port(1).unwrap(), c1.query_port(1).unwrap());
    assert_eq!((p0.link_layer, p0.lid, p1.lid), (LinkLayer::Ethernet, 0, 0));
    let (g0, g1) = (c0.query_gid(1, 1).unwrap(), c1.query_gid(1, 1).unwrap());
    assert_ne!(g0, g1, "each device has an IP of its own");
    assert!(g0.to_ipv4_mapped().unwrap().is_loopback(), "{g0}");

    // An RC WRITE from sim0 to sim1, the endpoints exchanging (GID, LID 0, QPN, PSN).
    let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let (cq0, cq1) = (c0.create_cq(16, None).unwrap(), c1.create_cq(16, None).unwrap());
    let a = pd0
        .create_qp(&QpInitAttr::rc(&cq0, &cq0, QpCap::new(4, 1)))
        .unwrap();
    let b = pd1
        .create_qp(&QpInitAttr::rc(&cq1, &cq1, QpCap::new(4, 1)))
        .unwrap();
    let p = RcParams {
        gid_index: 1,
        ..RcParams::default()
    };
    let (ea, eb) = (
        local_endpoint(&c0, &a, &p, 1).unwrap(),
        local_endpoint(&c1, &b, &p, 2).unwrap(),
    );
    assert_eq!((ea.lid, eb.lid), (0, 0));
    connect_rc(&a, &p, ea.psn, &eb).unwrap();
    connect_rc(&b, &p, eb.psn, &ea).unwrap();
    let src = pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pd1
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    src.write(0, b"by gid").unwrap();
    a.post_send(&[SendWr::write(1, &[src.sge(0, 6).unwrap()], dst.remote().at(0)).signaled()])
        .unwrap();
    assert_eq!(poll_n(&cq0, 1, WAIT).unwrap()[0].status, WcStatus::Success);
    let mut got = [0u8; 6];
    dst.read(0, &mut got).unwrap();
    assert_eq!(&got, b"by gid");

    // No GRH: no way to name the peer on Ethernet.
    let mut ah = ah_attr_for(&eb, &p);
    ah.is_global = false;
    assert_eq!(pd0.create_ah(&ah).err().map(|e| e.errno()), Some(libc::EINVAL));
    let c = pd0
        .create_qp(&QpInitAttr::rc(&cq0, &cq0, QpCap::new(4, 1)))
        .unwrap();
    modify_to_init(&c, &p).unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: p.path_mtu,
        dest_qp_num: eb.qpn,
        ah_attr: ah,
        ..Default::default()
    };
    let e = c
        .modify(
            &rtr,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN,
        )
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");

    let fixed = SimBackend::new(SimConfig {
        profile: Profile::Rxe,
        listen: "127.0.0.1:18999".parse().unwrap(),
        ..SimConfig::default()
    });
    let e = fixed
        .open("sim0")
        .err()
        .expect("a port other than RoCE's")
        .to_string();
    assert!(e.contains("4791"), "{e}");
}

/// A `srq_limit` given to `ibv_create_srq` is armed on rxe only; `portable` ignores it,
/// as mlx5 does, and warns that rxe would arm it.
#[test]
fn srq_limit_at_creation_is_armed_on_rxe_only_and_portable_warns() {
    for profile in Profile::ALL {
        let log = Capture::default();
        let limit = log.run(|| {
            let sim = SimBackend::new(SimConfig {
                profile,
                ..SimConfig::default()
            });
            let ctx = sim.open("sim0").unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let srq = pd.create_srq(&SrqAttr::new(16, 1).with_limit(5)).unwrap();
            // No limit, no warning.
            pd.create_srq(&SrqAttr::new(16, 1)).unwrap();
            srq.query().unwrap().srq_limit
        });
        let armed = profile == Profile::Rxe;
        assert_eq!(limit, if armed { 5 } else { 0 }, "{profile}");
        let want = usize::from(profile.warns());
        assert_eq!(warnings(&log, "ignored srq_limit 5"), want, "{profile}");
    }
}

/// A UD QP whose send fails (a bad lkey) goes to SQE under `portable` and mlx5 (IBA
/// 10.3.1), where SQE -> RTS brings it back, and to ERR under rxe; `portable` warns, once
/// per QP, that rxe would move it to ERR.
#[test]
fn a_send_error_moves_a_ud_qp_to_sqe_except_on_rxe_and_portable_warns() {
    const QKEY: u32 = 0x1111_1111;
    for profile in Profile::ALL {
        let log = Capture::default();
        let states = log.run(|| {
            let sim = SimBackend::new(SimConfig {
                profile,
                ..SimConfig::default()
            });
            let ctx = sim.open("sim0").unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq, QpCap::new(4, 1))).unwrap();
            let up = [
                (
                    QpState::Init,
                    QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
                ),
                (QpState::Rtr, QpAttrMask::empty()),
                (QpState::Rts, QpAttrMask::SQ_PSN),
            ];
            for (state, mask) in up {
                let attr = QpAttr {
                    qp_state: state,
                    port_num: 1,
                    qkey: QKEY,
                    ..Default::default()
                };
                qp.modify(&attr, QpAttrMask::STATE | mask).unwrap();
            }
            let p = RcParams::default();
            let me = local_endpoint(&ctx, &qp, &p, 0).unwrap();
            let ah = pd.create_ah(&ah_attr_for(&me, &p)).unwrap();
            let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
            let bad = [Sge::new(mr.addr(), 8, mr.lkey() ^ 0x0f0f_0000)];
            let mut states = Vec::new();
            for id in 0..2 {
                qp.post_send(&[SendWr::send(id, &bad).signaled().ud(&ah, qp.qp_num(), QKEY)])
                    .unwrap();
                let mut wc = [WorkCompletion::default(); 1];
                let end = std::time::Instant::now() + WAIT;
                while cq.poll(&mut wc).unwrap() == 0 {
                    assert!(std::time::Instant::now() < end, "{profile}: no completion");
                    std::thread::yield_now();
                }
                assert!(!wc[0].is_ok(), "{profile}: {:?}", wc[0]);
                let state = qp.state().unwrap();
                states.push(state);
                if state == QpState::Sqe {
                    let rts = QpAttr {
                        qp_state: QpState::Rts,
                        ..Default::default()
                    };
                    qp.modify(&rts, QpAttrMask::STATE).unwrap();
                    assert_eq!(qp.state().unwrap(), QpState::Rts, "{profile}: SQE -> RTS");
                }
            }
            states
        });
        let want = if profile == Profile::Rxe {
            QpState::Err
        } else {
            QpState::Sqe
        };
        assert_eq!(states, [want, want], "{profile}");
        let warned = usize::from(profile.warns());
        assert_eq!(warnings(&log, "went to SQE"), warned, "{profile}");
    }
}

/// An SRQ of `max_wr` 0: mlx5 makes one that holds no receive (every post ENOMEM), rxe
/// refuses it (EINVAL), and so does `portable`, the stricter of the two.
#[test]
fn an_srq_of_no_receives_is_made_on_mlx5_only() {
    for profile in [Profile::Portable, Profile::Rxe, Profile::Mlx5] {
        let sim = SimBackend::new(SimConfig {
            profile,
            ..SimConfig::default()
        });
        let ctx = sim.open("sim0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let attr = SrqAttr {
            max_wr: 0,
            max_sge: 1,
            srq_limit: 0,
        };
        match (profile, pd.create_srq(&attr)) {
            (Profile::Mlx5, Ok(srq)) => {
                let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
                let e = srq
                    .post_recv(&[RecvWr::new(1, &[mr.sge(0, 64).unwrap()])])
                    .unwrap_err();
                assert_eq!(e.errno(), libc::ENOMEM, "{e}");
            }
            (Profile::Mlx5, Err(e)) => panic!("mlx5 refused an SRQ of max_wr 0: {e}"),
            (p, Ok(_)) => panic!("{p} made an SRQ of max_wr 0"),
            (_, Err(e)) => assert_eq!(e.errno(), libc::EINVAL, "{e}"),
        }
    }
}
