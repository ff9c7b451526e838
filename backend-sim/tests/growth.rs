//! A device whose application thread drives progress while a fifth connection comes up.
//!
//! With at most four connections, a spinning thread reads each socket directly and the
//! progress thread (asleep on its doorbell while the application drives) takes them out
//! of the device's epoll set. From the fifth on, application threads ask the epoll set
//! which sockets are ready: the first four must be back in it at once, not when the
//! progress thread next looks (here: never, as the grace period is 30 s).
//!
//! Its own test binary: it sets `RDMA_SIM_GRACE_US` for the whole process.

mod common;

use common::{read_back, read_mrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use verbs_api::*;

#[test]
fn connections_read_directly_go_back_to_epoll_when_a_fifth_comes_up() {
    // The only test of this binary, run before any device exists: no other thread reads
    // the environment meanwhile.
    std::env::set_var("RDMA_SIM_GRACE_US", "30000000");
    let sim = backend_sim::SimBackend::default();
    let (c0, c1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let cq0 = c0.create_cq(64, None).unwrap();
    let cq1 = Arc::new(c1.create_cq(64, None).unwrap());
    let p = RcParams::default();
    let cap = QpCap::new(4, 4);
    let connect = |psn: u32| {
        let a = pd0.create_qp(&QpInitAttr::rc(&cq0, &cq0, cap)).unwrap();
        let b = pd1.create_qp(&QpInitAttr::rc(&cq1, &cq1, cap)).unwrap();
        let ea = local_endpoint(&c0, &a, &p, psn).unwrap();
        let eb = local_endpoint(&c1, &b, &p, psn + 1).unwrap();
        connect_rc(&a, &p, ea.psn, &eb).unwrap();
        connect_rc(&b, &p, eb.psn, &ea).unwrap();
        (a, b)
    };
    let mut pairs: Vec<_> = (0..4).map(|k| connect(10 * k + 1)).collect();
    let (mra, mrb) = read_mrs(&pd0, &pd1);
    let read = |qp: &backend_sim::SimQp, v: u64, what: &str| read_back(qp, &cq0, &mra, &mrb, 64, v, what);
    // The target's application polls its CQ in a tight loop from here on: it drives
    // sim1, whose progress thread sleeps on the doorbell once traffic wakes it.
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let (cq1, stop) = (cq1.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut wc = [WorkCompletion::default(); 4];
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(cq1.poll(&mut wc).unwrap(), 0);
            }
        })
    };
    for i in 0..50u64 {
        read(
            &pairs[(i % 4) as usize].0,
            i,
            &format!("READ {i} over four connections"),
        );
    }
    std::thread::sleep(Duration::from_millis(5));
    pairs.push(connect(41));
    for i in 0..20u64 {
        read(
            &pairs[(i % 5) as usize].0,
            1000 + i,
            &format!("READ {i} over five connections"),
        );
    }
    stop.store(true, Ordering::Relaxed);
    driver.join().unwrap();
}
