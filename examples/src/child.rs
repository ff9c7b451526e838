//! Child processes for the `demo` subcommands: a demo runs the server (and sometimes
//! clients) as children of the same binary (`std::env::current_exe`), learns the server's
//! port from the `listening on ADDR` line it prints (servers bind port 0), echoes the
//! children's output with a `[name]` prefix, bounds every wait, and kills whatever is
//! still running when it is dropped (so an error in the demo never leaves a stray server).
//! Other programs run the same way ([`ChildProc::spawn_program`]: UCX's and libfabric's test
//! programs for [`peers`](crate::peers)).

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::Res;

/// The line a server prints once it accepts connections: `listening on 127.0.0.1:40123`.
pub const LISTENING: &str = "listening on ";

/// Prints the [`LISTENING`] line for `addr`.
pub fn announce_listening(addr: SocketAddr) {
    println!("{LISTENING}{addr}");
}

/// Where a child's standard output is echoed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Echo {
    /// To our stdout, prefixed with `[name] `.
    Stdout,
    /// To our stderr, prefixed (keeps our stdout clean, e.g. for JSON).
    Stderr,
    /// Not at all (the lines are still kept; see [`ChildProc::output`]).
    Quiet,
}

/// A running child process of this binary.
pub struct ChildProc {
    name: String,
    child: Child,
    lines: Receiver<String>,
    kept: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

impl ChildProc {
    /// Starts this binary with `args`; `name` prefixes its echoed output.
    pub fn spawn(name: &str, args: &[String], echo: Echo) -> Res<ChildProc> {
        let exe = std::env::current_exe().context("finding this program's path to start a child")?;
        ChildProc::spawn_program(name, Command::new(exe).args(args), echo)
    }

    /// Starts another program, as `cmd` describes it (its standard streams are replaced:
    /// stdin empty, stdout and stderr read as by [`ChildProc::spawn`]).
    pub fn spawn_program(name: &str, cmd: &mut Command, echo: Echo) -> Res<ChildProc> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        let (tx, rx) = channel();
        let kept = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        {
            let (name, kept, tx) = (name.to_string(), kept.clone(), tx.clone());
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                    match echo {
                        Echo::Stdout => println!("[{name}] {line}"),
                        Echo::Stderr => eprintln!("[{name}] {line}"),
                        Echo::Quiet => {}
                    }
                    if let Ok(mut k) = kept.lock() {
                        k.push(line.clone());
                    }
                    let _ = tx.send(line);
                }
            }));
        }
        {
            let name = name.to_string();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                    eprintln!("[{name}] {line}");
                }
            }));
        }
        drop(tx);
        Ok(ChildProc {
            name: name.to_string(),
            child,
            lines: rx,
            kept,
            readers,
            status: None,
        })
    }

    /// The child's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for a stdout line starting with `prefix` and returns it.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> Res<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    anyhow::bail!(
                        "{} printed no line starting with {prefix:?} within {:.1} s",
                        self.name,
                        timeout.as_secs_f64()
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let st = self.wait(Duration::from_secs(5))?;
                    anyhow::bail!(
                        "{} exited ({st}) before printing a line starting with {prefix:?}",
                        self.name
                    )
                }
            }
        }
    }

    /// Waits for the [`LISTENING`] line and returns the address to connect to (an
    /// unspecified listen IP becomes loopback).
    pub fn listen_addr(&mut self, timeout: Duration) -> Res<SocketAddr> {
        let line = self.wait_line(LISTENING, timeout)?;
        let text = line[LISTENING.len()..].trim();
        let mut addr: SocketAddr = text
            .parse()
            .with_context(|| format!("{} printed a bad listen address {text:?}", self.name))?;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        Ok(addr)
    }

    /// Waits up to `timeout` for the child to exit; kills it and fails after that.
    pub fn wait(&mut self, timeout: Duration) -> Res<ExitStatus> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().context("waiting for a child")? {
                self.status = Some(s);
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                return Ok(s);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                anyhow::bail!(
                    "{} did not finish within {:.1} s; killed it",
                    self.name,
                    timeout.as_secs_f64()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the child and fails unless it exited with status 0.
    pub fn wait_success(&mut self, timeout: Duration) -> Res<()> {
        let st = self.wait(timeout)?;
        if st.success() {
            Ok(())
        } else {
            anyhow::bail!("{} failed ({st})", self.name)
        }
    }

    /// Every stdout line so far.
    pub fn output(&self) -> Vec<String> {
        self.kept.lock().map(|k| k.clone()).unwrap_or_default()
    }

    /// The last stdout line starting with `prefix`.
    pub fn last_line(&self, prefix: &str) -> Option<String> {
        self.output().into_iter().rev().find(|l| l.starts_with(prefix))
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        if self.status.is_none() {
            if let Ok(None) = self.child.try_wait() {
                let _ = self.child.kill();
            }
            let _ = self.child.wait();
        }
    }
}
