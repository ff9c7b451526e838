//! The backend and its configuration (`SimConfig`, or the environment).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use verbs_api::{Error, Result};

use crate::profile::warnings::{Advice, Level};
use crate::profile::{Profile, UnknownProfile};

/// Configuration of the simulated devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Address the devices listen on. Port 0 gives each device an ephemeral port; a fixed
    /// port `p` gives device `i` the port `p + i`.
    pub listen: SocketAddr,
    /// How many devices (`sim0`, `sim1`, ...) the backend lists.
    pub devices: u32,
    /// With a wildcard `listen` (`0.0.0.0`, `::`): the IP the devices advertise as their
    /// GID, where peers connect. `None`: the host's first non-loopback address of the
    /// listen address's family. Ignored for a specific listen IP, which is advertised.
    pub advertise: Option<IpAddr>,
    /// The kind of HCA every device plays ([`Profile`]): its limits and behaviour where
    /// HCAs differ. Default: `portable`.
    pub profile: Profile,
    /// How the `portable` profile's advice about calls that succeeded is logged (CQEs a
    /// RESET or destroy removed unpolled, an `srq_limit` given at creation; see
    /// [`crate::profile::warnings`]): each piece once per backend, as a warning
    /// (default) or a debug event.
    pub portability_warnings: Level,
    /// Where the devices' arbitrary choices (QP numbers, keys, their LID or loopback IP)
    /// come from: `None` (default) the operating system's generator, `Some(seed)` a hash
    /// of the seed, so that a run repeats them ([`crate::choices`]).
    pub seed: Option<u64>,
    /// A capture of the devices' traffic ([`crate::capture`]): the file every device
    /// of this backend writes its packets to, and how much of each it keeps. `None`:
    /// the process's capture if `RDMA_SIM_PCAP` names one, else none.
    pub capture: Option<CaptureConfig>,
    /// How the devices' connections run: [`Transport::Auto`](crate::same_host::Transport)
    /// (default) over a unix socket between two devices on the same host (same network
    /// namespace) and over TCP otherwise, or [`Transport::Tcp`](crate::same_host::Transport)
    /// over TCP always ([`crate::same_host`]).
    pub transport: crate::same_host::Transport,
}

/// Where a backend's devices capture their traffic ([`SimConfig::capture`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureConfig {
    /// The pcapng file (`%p` in it becomes the process id).
    pub path: std::path::PathBuf,
    /// How much of each packet is kept.
    pub snaplen: crate::capture::Snaplen,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            devices: 2,
            advertise: None,
            profile: Profile::default(),
            portability_warnings: Level::default(),
            seed: None,
            capture: None,
            transport: crate::same_host::Transport::Auto,
        }
    }
}

/// The simulated-HCA backend.
#[derive(Clone, Debug)]
pub struct SimBackend {
    pub(crate) config: SimConfig,
    /// The portability advice its devices give (shared by them, and by clones).
    pub(crate) advice: Arc<Advice>,
    /// Its connection manager (shared by clones), made on first use.
    pub(crate) cm: crate::rdmacm::CmCell,
    /// The process that made it, whose ID its devices' GUIDs carry: a child forked from
    /// that process lists the same GUIDs as the parent it inherited the backend from, and
    /// the devices it opens have them too.
    pub(crate) pid: u32,
    /// The capture file of [`SimConfig::capture`] (shared by clones), opened when the
    /// first device opens.
    pub(crate) capture: Arc<std::sync::OnceLock<Option<Arc<crate::capture::Capture>>>>,
}

impl Default for SimBackend {
    fn default() -> Self {
        SimBackend::new(SimConfig::default())
    }
}

/// The value of the setting `name`, if it is set and not empty: an empty assignment
/// (`RDMA_SIM_PROFILE=`, or a script's `RDMA_SIM_PROFILE=$PROFILE` with nothing in
/// `PROFILE`) means "unset", as it does for most programs' variables.
fn setting(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl SimBackend {
    /// A backend with the given configuration.
    pub fn new(config: SimConfig) -> Self {
        crate::choices::reseed_in_forked_children();
        SimBackend {
            advice: Arc::new(Advice::new(config.portability_warnings)),
            config,
            cm: crate::rdmacm::CmCell::default(),
            pid: std::process::id(),
            capture: Arc::default(),
        }
    }

    /// The capture its devices write to: the configured one (a file that cannot be
    /// created is warned about once, and nothing captured), else the process's.
    pub(crate) fn capture(&self) -> Option<Arc<crate::capture::Capture>> {
        let Some(c) = &self.config.capture else {
            return crate::capture::global().cloned();
        };
        self.capture
            .get_or_init(|| {
                let path = crate::capture::expand(&c.path);
                crate::capture::Capture::create(&path, c.snaplen)
                    .inspect_err(
                        |e| tracing::warn!(path = %path.display(), "capture: cannot create the file: {e}"),
                    )
                    .ok()
            })
            .clone()
    }

    /// The default configuration, overridden by `RDMA_SIM_LISTEN` (an `ip` or `ip:port`
    /// to listen on, e.g. `0.0.0.0:18515` to accept other hosts), `RDMA_SIM_ADVERTISE`
    /// (with a wildcard listen: the IP to advertise), `RDMA_SIM_DEVICES` (how many
    /// devices to list), `RDMA_SIM_PROFILE` (`portable`, `rxe` or `mlx5`: the kind of
    /// HCA the devices play; any other value is an error),
    /// `RDMA_SIM_TRANSPORT` (`auto` or `tcp`, see [`SimConfig::transport`]) and
    /// `RDMA_SIM_PORTABILITY_WARNINGS` (`warn` or `debug`). A variable set empty counts
    /// as unset.
    pub fn from_env() -> Result<Self> {
        Self::from_env_over(SimConfig::default())
    }

    /// As [`from_env`](Self::from_env), with `c` where the environment says nothing.
    pub fn from_env_over(mut c: SimConfig) -> Result<Self> {
        if let Some(v) = setting("RDMA_SIM_LISTEN") {
            c.listen = v
                .parse::<SocketAddr>()
                .or_else(|_| v.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 0)))
                .map_err(|_| Error::invalid("RDMA_SIM_LISTEN", format!("{v:?} is not an ip or ip:port")))?;
        }
        if let Some(v) = setting("RDMA_SIM_ADVERTISE") {
            let ip = v
                .parse::<IpAddr>()
                .map_err(|_| Error::invalid("RDMA_SIM_ADVERTISE", format!("{v:?} is not an IP address")))?;
            if ip.is_unspecified() {
                return Err(Error::invalid(
                    "RDMA_SIM_ADVERTISE",
                    format!("{v:?} is a wildcard: name an address peers can reach"),
                ));
            }
            c.advertise = Some(ip);
        }
        if let Some(v) = setting("RDMA_SIM_DEVICES") {
            c.devices = v
                .parse()
                .map_err(|_| Error::invalid("RDMA_SIM_DEVICES", format!("{v:?} is not a number")))?;
        }
        if let Some(seed) = crate::choices::seed_from_env()? {
            c.seed = Some(seed);
        }
        if let Some(v) = setting("RDMA_SIM_PROFILE") {
            c.profile = v
                .parse()
                .map_err(|e: UnknownProfile| Error::invalid("RDMA_SIM_PROFILE", e.to_string()))?;
        }
        if let Some(v) = setting(crate::same_host::TRANSPORT_SETTING) {
            c.transport = v
                .parse()
                .map_err(|e: String| Error::invalid(crate::same_host::TRANSPORT_SETTING, e))?;
        }
        if let Some(v) = setting("RDMA_SIM_PORTABILITY_WARNINGS") {
            c.portability_warnings = v
                .parse()
                .map_err(|e: String| Error::invalid("RDMA_SIM_PORTABILITY_WARNINGS", e))?;
        }
        Ok(SimBackend::new(c))
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// The IP the devices advertise (their GID 1): the listen IP, or for a wildcard
    /// listen the configured advertised address or else the host's first non-loopback
    /// address (the network interface that holds it is the devices' netdev). Under the
    /// rxe profile on loopback each device draws an address of 127.0.0.0/8 when it
    /// opens; this is then the listen address, on the same interface.
    pub fn advertised_ip(&self) -> IpAddr {
        let ip = self.config.listen.ip();
        if !ip.is_unspecified() {
            return ip;
        }
        self.config
            .advertise
            .unwrap_or_else(|| crate::host_addrs::advertised(ip, &crate::host_addrs::host_addrs()))
    }

    /// The node GUID of device `index` ("SIM", the process, the index).
    pub(crate) fn guid(&self, index: u32) -> u64 {
        0x5349_4d00_0000_0000 | (u64::from(self.pid) << 16) | u64::from(index)
    }

    pub(super) fn index_of(&self, name: &str) -> Option<u32> {
        let i: u32 = name.strip_prefix("sim")?.parse().ok()?;
        (i < self.config.devices).then_some(i)
    }
}
