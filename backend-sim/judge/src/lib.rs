//! The judge of the sim's captures in the workspace's tests: `tshark` (Debian's package,
//! Wireshark's dissector of RoCE v2 on UDP port 4791) reads a pcapng file and gives the
//! fields a test asks for, one row per frame ([`fields`]), and a test holds every packet
//! to having none malformed and no dissector error ([`well_formed`]). Captures a test
//! writes go to [`Scratch`] files, removed when the test is done unless `KEEP_CAPTURE`
//! is set (to open them in Wireshark).
//!
//! A test crate depends on it as a dev-dependency by path: it is no part of a published
//! crate.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// The upper-layer protocols Wireshark guesses at in a SEND's payload (NFS over RDMA, SMB
/// Direct, iSER, SDP, SMC-R, FC over InfiniBand): a test's counting bytes would be taken
/// for theirs and called malformed, and what is judged is the RoCE encoding, not the
/// payload.
pub const PAYLOAD_HEURISTICS: [&str; 6] = [
    "rpcrdma_infiniband",
    "smb_direct_infiniband",
    "iser_infiniband",
    "sdp_infiniband",
    "smcr_infiniband",
    "fc_infiniband",
];

/// tshark's fields `fields` of each frame of the capture at `path`: one row per frame
/// (the verbs context's events are frames too, with no packet field), a field's several
/// occurrences joined by `,`. Panics, saying why, if tshark does not run or fails: the
/// judge is not optional where a test asks for it (`.ci/run` installs tshark).
pub fn fields(path: &Path, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(path);
    for h in PAYLOAD_HEURISTICS {
        cmd.args(["--disable-heuristic", h]);
    }
    cmd.args([
        "-T",
        "fields",
        "-E",
        "separator=;",
        "-E",
        "occurrence=a",
        "-E",
        "aggregator=,",
    ]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd
        .output()
        .expect("tshark runs (Debian's tshark package; .ci/run installs it)");
    assert!(
        out.status.success(),
        "tshark -r {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("tshark writes UTF-8")
        .lines()
        .map(|l| l.split(';').map(str::to_owned).collect())
        .collect()
}

/// The fields tshark sets on a packet it could not dissect, or on which a dissector
/// reported something: the first empty for a well-formed packet, the others aligned (one
/// severity per message).
const TROUBLE: [&str; 3] = ["_ws.malformed", "_ws.expert.severity", "_ws.expert.message"];

/// The expert severity of an error in tshark's numbering (`_ws.expert.severity`):
/// warnings and notes below it, comments (the verbs context) far below.
const ERROR_SEVERITY: u32 = 0x0080_0000;

/// The one error a well-formed capture may hold: a UDP checksum of 0 over IPv6, which rxe
/// sends (`prepare_udp_hdr()`) as RFC 6935 allows tunnels, and Wireshark flags.
pub const ZERO_UDP_CHECKSUM: &str = "Illegal checksum value (0)";

/// The dissector errors among tshark's `severities` and `messages` of one frame, but
/// [`ZERO_UDP_CHECKSUM`].
fn errors<'a>(severities: &str, messages: &'a str) -> Vec<&'a str> {
    let sev = severities.split(',').map(|s| {
        s.strip_prefix("0x")
            .map_or_else(|| s.parse().ok(), |h| u32::from_str_radix(h, 16).ok())
    });
    sev.zip(messages.split(','))
        .filter(|(s, m)| s.unwrap_or(0) >= ERROR_SEVERITY && *m != ZERO_UDP_CHECKSUM)
        .map(|(_, m)| m)
        .collect()
}

/// [`fields`] of the capture at `path`, after checking that tshark found no malformed
/// packet and no error in any frame but [`ZERO_UDP_CHECKSUM`] (panics naming the frame
/// otherwise).
pub fn well_formed(path: &Path, wanted: &[&str]) -> Vec<Vec<String>> {
    let mut all: Vec<&str> = TROUBLE.to_vec();
    all.extend_from_slice(wanted);
    fields(path, &all)
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            assert!(
                r[0].is_empty(),
                "{}: frame {} is malformed: {r:?}",
                path.display(),
                i + 1
            );
            let e = errors(&r[1], &r[2]);
            assert!(
                e.is_empty(),
                "{}: frame {} has dissector errors {e:?}: {r:?}",
                path.display(),
                i + 1
            );
            r.split_off(TROUBLE.len())
        })
        .collect()
}

/// [`well_formed`] of a capture held in memory.
pub fn well_formed_of(bytes: &[u8], wanted: &[&str]) -> Vec<Vec<String>> {
    let f = Scratch::new("judge", "pcapng");
    std::fs::write(f.path(), bytes).expect("the scratch capture is written");
    well_formed(f.path(), wanted)
}

/// A file or directory in the temporary directory, named for this process and unique in
/// it, removed when dropped unless `KEEP_CAPTURE` is set.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// A path `sim-<what>-<pid>-<n>.<ext>` (nothing created there yet).
    pub fn new(what: &str, ext: &str) -> Scratch {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        Scratch(std::env::temp_dir().join(format!("sim-{what}-{}-{n}.{ext}", std::process::id())))
    }

    /// A directory `sim-<what>-<pid>-<n>`, created.
    pub fn dir(what: &str) -> Scratch {
        let s = Scratch::new(what, "d");
        std::fs::create_dir_all(&s.0).expect("the scratch directory is created");
        s
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("KEEP_CAPTURE").is_some() {
            eprintln!("kept {}", self.0.display());
        } else if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}
