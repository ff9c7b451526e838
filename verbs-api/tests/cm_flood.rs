//! A flood of silent connections at a `cm` listener, from another process, in a process
//! whose open-file limit leaves little room: [`CmListener::request`] hands over the one
//! client whose connection request arrives, holds no thread per connection, takes no
//! descriptor from the reserve the clients being served need, and holds a bounded
//! number of connections.
//!
//! `harness = false` (see Cargo.toml): `main` is the test, so it can lower its own
//! open-file limit and count its own threads and descriptors without other tests
//! running beside it, and run itself again as the flooder.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use verbs_api::cm::{encode_hello, CmListener, Offer, SETUP_BOUND};
use verbs_api::Endpoint;

/// Silent connections the flooder opens.
const FLOOD: usize = 2000;
/// Room for connections in setup above the descriptors kept in reserve.
const ROOM: usize = 40;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        println!("cm_flood: test");
        return;
    }
    if let Ok(to) = std::env::var("CM_FLOOD_TO") {
        flooder(to.parse().unwrap());
        return;
    }
    a_client_gets_through_a_flood_of_silent_connections();
    println!("test cm_flood::a_client_gets_through_a_flood_of_silent_connections ... ok");
}

fn nofile() -> libc::rlimit {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct on this stack frame.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    r
}

fn set_nofile(soft: u64) {
    let r = libc::rlimit {
        rlim_cur: soft.min(nofile().rlim_max),
        rlim_max: nofile().rlim_max,
    };
    // SAFETY: setrlimit reads one rlimit struct on this stack frame.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// Opens [`FLOOD`] connections that say nothing and holds them; after the first 300, a
/// client connects beside them and sends a connection request, and says its address.
fn flooder(to: SocketAddr) {
    set_nofile(u64::MAX);
    let client = move || {
        let mut s = TcpStream::connect(to).unwrap();
        let ep = Endpoint {
            qpn: 7,
            ..Endpoint::default()
        };
        s.write_all(&encode_hello(&ep, &Offer::new().private_data(*b"legit")))
            .unwrap();
        println!("legit {}", s.local_addr().unwrap());
        std::io::stdout().flush().unwrap();
        s
    };
    let mut held = Vec::new();
    let mut legit = None;
    for i in 0..FLOOD {
        if i == 300 {
            legit = Some(std::thread::spawn(client));
        }
        if let Ok(s) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
            held.push(s);
        }
    }
    held.extend(legit.map(|t| t.join().unwrap()));
    std::thread::sleep(Duration::from_secs(60));
}

fn a_client_gets_through_a_flood_of_silent_connections() {
    let listener = CmListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("CM_FLOOD_TO", addr.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = BufReader::new(child.stdout.take().unwrap());
    // The usual limit, with all but the reserve and room for ROOM connections taken.
    let limit = 1024;
    set_nofile(limit);
    let reserve = SETUP_BOUND.fd_reserve;
    let taken: Vec<_> = (count("/proc/self/fd")..limit as usize - reserve - ROOM)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
    let (fds, threads) = (count("/proc/self/fd"), count("/proc/self/task"));

    let request = listener.request(Duration::from_secs(60)).unwrap();
    assert_eq!(request.private_data(), b"legit");
    assert_eq!(request.endpoint().qpn, 7);
    let mut line = String::new();
    said.read_line(&mut line).unwrap();
    assert_eq!(
        Some(request.peer_addr().to_string().as_str()),
        line.trim().strip_prefix("legit "),
        "the request is the client's"
    );
    assert_eq!(count("/proc/self/task"), threads, "no thread per connection");
    let held = count("/proc/self/fd").saturating_sub(fds);
    assert!(
        held <= ROOM + 1,
        "{held} descriptors held for connections (room for {ROOM} in setup and the request)"
    );
    // The reserve is free for the client being served (its QP's connection and more).
    let files: Vec<_> = (0..reserve / 2)
        .map(|i| {
            std::fs::File::open("/dev/null").unwrap_or_else(|e| panic!("descriptor {i} of the reserve: {e}"))
        })
        .collect();
    drop((files, taken));
    let _ = child.kill();
    let _ = child.wait();
}
