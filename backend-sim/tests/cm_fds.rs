//! verbs_api::cm when the process runs out of file descriptors: the error says EMFILE and
//! names the open-file limit, and the accept paths (blocking and async) wait for
//! descriptors to be freed instead of failing, warning once per episode.
//!
//! The open-file limit is per process, so every test runs its scenario in a child process
//! of this test binary (re-run with `--exact` and `CM_FDS_CHILD` set), lowers the limit
//! there and fills the descriptor table with `/dev/null`s. The parent checks that the
//! child ran its one test and passed.
use std::fs::File;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backend_sim::{SimBackend, SimContext, SimCq, SimPd, SimQp};
use verbs_api::cm::{connect, AsyncCmListener, CmListener, Offer};
use verbs_api::*;

const CHILD_VAR: &str = "CM_FDS_CHILD";

/// Runs `scenario` in a child process (this binary, only the test `name`).
fn in_child(name: &str, scenario: fn()) {
    if std::env::var(CHILD_VAR).as_deref() == Ok(name) {
        scenario();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, name)
        .output()
        .unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && so.contains("test result: ok. 1 passed"),
        "the child running {name} failed ({}):\n--- stdout ---\n{so}\n--- stderr ---\n{se}",
        out.status
    );
}

/// Lowers the soft open-file limit to what is open now plus `headroom`; returns it.
fn lower_fd_limit(headroom: u64) -> u64 {
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one live rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        r.rlim_cur = open + headroom;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
    }
    assert_eq!(open_file_limit(), Some(open + headroom));
    open + headroom
}

/// Opens `/dev/null` until the process is out of descriptors. A descriptor another
/// thread holds for a moment (an accept(2) that finds no client) would be free again
/// after the first EMFILE, so the table counts as full only when two tries in a row, a
/// little apart, fail.
fn exhaust_fds() -> Vec<File> {
    let mut held = Vec::new();
    let mut refused = 0;
    while refused < 2 {
        match File::open("/dev/null") {
            Ok(f) => {
                held.push(f);
                refused = 0;
            }
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("opening /dev/null: {e}"),
        }
        assert!(held.len() < 100_000, "the descriptor limit did not take");
    }
    held
}

/// The warnings logged through `tracing`, in order.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    fn install() -> Warnings {
        let w = Warnings::default();
        tracing::subscriber::set_global_default(w.clone()).unwrap();
        w
    }

    fn get(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

struct Message<'a>(&'a mut String);

impl tracing::field::Visit for Message<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        *m.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        let mut msg = String::new();
        e.record(&mut Message(&mut msg));
        self.0.lock().unwrap().push(msg);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn qp_on(ctx: &SimContext) -> (SimPd, SimCq, SimQp) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(16, 16)))
        .unwrap();
    (pd, cq, qp)
}

/// The client: connects, retrying while the one free descriptor is briefly held by the
/// server's own accept(2) (which reserves a descriptor before it looks for a connection).
fn connect_retrying(addr: SocketAddr, ctx: &SimContext, qp: &SimQp) -> Result<u32> {
    let offer = Offer::new().timeout(Duration::from_secs(20));
    for _ in 0..100 {
        match connect(addr, ctx, qp, &RcParams::default(), &offer) {
            Err(e) if e.errno() == libc::EMFILE => std::thread::sleep(Duration::from_millis(1)),
            r => return r.map(|p| p.endpoint.qpn),
        }
    }
    panic!("the client never got a descriptor for its socket");
}

fn limit_text(limit: u64) -> String {
    format!("out of file descriptors (EMFILE): the open-file limit is {limit} (ulimit -n)")
}

/// Holds descriptors until the server is seen still waiting for `hold`, then frees them.
fn hold_then_free<T: std::fmt::Debug>(held: Vec<File>, server: &mpsc::Receiver<T>, hold: Duration) {
    match server.recv_timeout(hold) {
        Err(mpsc::RecvTimeoutError::Timeout) => {}
        other => panic!("the accept gave up while out of descriptors: {other:?}"),
    }
    drop(held);
}

#[test]
fn connect_out_of_descriptors_says_emfile_and_names_the_limit() {
    in_child(
        "connect_out_of_descriptors_says_emfile_and_names_the_limit",
        || {
            let ctx = SimBackend::default().open("sim0").unwrap();
            let (_pd, _cq, qp) = qp_on(&ctx);
            let listener = CmListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let limit = lower_fd_limit(32);
            let held = exhaust_fds();
            let e = connect(addr, &ctx, &qp, &RcParams::default(), &Offer::new()).unwrap_err();
            drop(held);
            assert_eq!(e.errno(), libc::EMFILE, "{e}");
            assert_eq!(e.to_string(), format!("connect: {}", limit_text(limit)));
        },
    );
}

#[test]
fn blocking_accept_waits_out_emfile_and_sets_the_client_up() {
    in_child("blocking_accept_waits_out_emfile_and_sets_the_client_up", || {
        let warnings = Warnings::install();
        let ctx = SimBackend::default().open("sim0").unwrap();
        let (_pd_s, _cq_s, qp_s) = qp_on(&ctx);
        let (_pd_c, _cq_c, qp_c) = qp_on(&ctx);
        let listener = CmListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let limit = lower_fd_limit(48);
        let (tx, rx) = mpsc::channel();
        // The table is filled before the server starts: its accept(2) polls hold a
        // descriptor for a moment, and filling the table while it polls could leave a
        // second one free, with which the server would accept at once.
        let mut held = exhaust_fds();
        // One descriptor for the client's socket: its connection then waits in the
        // listen backlog while the server's accept(2) fails with EMFILE.
        held.pop();
        std::thread::scope(|s| {
            s.spawn(|| {
                let offer = Offer::new().timeout(Duration::from_secs(20));
                let r = listener.accept(&ctx, &qp_s, &RcParams::default(), &offer);
                tx.send(r.map(|p| p.endpoint.qpn)).unwrap();
            });
            let client = s.spawn(|| connect_retrying(addr, &ctx, &qp_c));
            hold_then_free(held, &rx, Duration::from_millis(400));
            let server_saw = rx.recv_timeout(Duration::from_secs(20)).unwrap().unwrap();
            let client_saw = client.join().unwrap().unwrap();
            assert_eq!((server_saw, client_saw), (qp_c.qp_num(), qp_s.qp_num()));
        });
        assert_eq!(qp_s.state().unwrap(), QpState::Rts);
        let w = warnings.get();
        let starved: Vec<&String> = w.iter().filter(|m| m.contains("EMFILE")).collect();
        assert_eq!(starved.len(), 1, "one warning per episode, got {w:#?}");
        assert!(starved[0].contains(&limit_text(limit)), "{}", starved[0]);
        assert!(starved[0].contains(&addr.to_string()), "{}", starved[0]);
    });
}

#[test]
fn blocking_accept_out_of_time_while_out_of_descriptors_says_emfile() {
    in_child(
        "blocking_accept_out_of_time_while_out_of_descriptors_says_emfile",
        || {
            let ctx = SimBackend::default().open("sim0").unwrap();
            let (_pd, _cq, qp) = qp_on(&ctx);
            let listener = CmListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let limit = lower_fd_limit(32);
            let mut held = exhaust_fds();
            held.pop();
            // A client whose connection waits in the backlog (its setup is never answered).
            let _pending = std::net::TcpStream::connect(addr).unwrap();
            let start = Instant::now();
            let offer = Offer::new().timeout(Duration::from_millis(300));
            let e = listener
                .accept(&ctx, &qp, &RcParams::default(), &offer)
                .unwrap_err();
            let took = start.elapsed();
            drop(held);
            assert_eq!(e.errno(), libc::EMFILE, "{e}");
            assert_eq!(e.to_string(), format!("accept: {}", limit_text(limit)));
            assert!(
                took >= Duration::from_millis(300) && took < Duration::from_secs(3),
                "the accept should have retried until its timeout: {took:?}"
            );
        },
    );
}

#[test]
fn async_accept_waits_out_emfile_and_sets_the_client_up() {
    in_child("async_accept_waits_out_emfile_and_sets_the_client_up", || {
        let warnings = Warnings::install();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let ctx = SimBackend::default().open("sim0").unwrap();
        let (_pd_s, _cq_s, qp_s) = qp_on(&ctx);
        let (_pd_c, _cq_c, qp_c) = qp_on(&ctx);
        let listener = rt.block_on(AsyncCmListener::bind("127.0.0.1:0")).unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let limit = lower_fd_limit(48);
        let (tx, rx) = mpsc::channel();
        // Filled before the server starts, as in the blocking test.
        let mut held = exhaust_fds();
        held.pop();
        std::thread::scope(|s| {
            let rt = &rt;
            s.spawn(|| {
                let offer = Offer::new().timeout(Duration::from_secs(20));
                let r = rt.block_on(listener.accept(&ctx, &qp_s, &RcParams::default(), &offer));
                tx.send(r.map(|p| p.endpoint.qpn)).unwrap();
            });
            let client = s.spawn(|| connect_retrying(addr, &ctx, &qp_c));
            hold_then_free(held, &rx, Duration::from_millis(400));
            let server_saw = rx.recv_timeout(Duration::from_secs(20)).unwrap().unwrap();
            let client_saw = client.join().unwrap().unwrap();
            assert_eq!((server_saw, client_saw), (qp_c.qp_num(), qp_s.qp_num()));
        });
        let w = warnings.get();
        let starved: Vec<&String> = w.iter().filter(|m| m.contains("EMFILE")).collect();
        assert_eq!(starved.len(), 1, "one warning per episode, got {w:#?}");
        assert!(starved[0].contains(&limit_text(limit)), "{}", starved[0]);
    });
}
