//! The backend: its configuration (`SimConfig`, and the environment), the devices it
//! lists (`ibv_get_device_list`) and opening one (`ibv_open_device`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use verbs_api::{Backend, DeviceInfo, Error, Result};

use super::context::SimContext;
use super::cq::SimChannel;
use super::cq::SimCq;
use super::pd::SimMr;
use super::pd::SimPd;
use super::qp::SimQp;
use crate::device::DeviceShared;

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
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            devices: 2,
            advertise: None,
        }
    }
}

/// The simulated-HCA backend.
#[derive(Clone, Debug, Default)]
pub struct SimBackend {
    pub(crate) config: SimConfig,
}

impl SimBackend {
    /// A backend with the given configuration.
    pub fn new(config: SimConfig) -> Self {
        SimBackend { config }
    }

    /// The default configuration, overridden by `RDMA_SIM_LISTEN` (an `ip` or `ip:port`
    /// to listen on, e.g. `0.0.0.0:18515` to accept other hosts), `RDMA_SIM_ADVERTISE`
    /// (with a wildcard listen: the IP to advertise) and `RDMA_SIM_DEVICES` (how many
    /// devices to list).
    pub fn from_env() -> Result<Self> {
        let mut c = SimConfig::default();
        if let Ok(v) = std::env::var("RDMA_SIM_LISTEN") {
            c.listen = v
                .parse::<SocketAddr>()
                .or_else(|_| v.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 0)))
                .map_err(|_| Error::invalid("RDMA_SIM_LISTEN", format!("{v:?} is not an ip or ip:port")))?;
        }
        if let Ok(v) = std::env::var("RDMA_SIM_ADVERTISE") {
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
        if let Ok(v) = std::env::var("RDMA_SIM_DEVICES") {
            c.devices = v
                .parse()
                .map_err(|_| Error::invalid("RDMA_SIM_DEVICES", format!("{v:?} is not a number")))?;
        }
        Ok(SimBackend { config: c })
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    fn index_of(&self, name: &str) -> Option<u32> {
        let i: u32 = name.strip_prefix("sim")?.parse().ok()?;
        (i < self.config.devices).then_some(i)
    }
}

impl Backend for SimBackend {
    type Context = SimContext;
    type Pd = SimPd;
    type Mr = SimMr;
    type Cq = SimCq;
    type Channel = SimChannel;
    type Qp = SimQp;

    fn name(&self) -> &'static str {
        "sim"
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        Ok((0..self.config.devices)
            .map(|i| DeviceInfo {
                name: format!("sim{i}"),
                guid: 0x5349_4d00_0000_0000 | ((std::process::id() as u64) << 16) | i as u64,
                transport: "simulated (TCP)".into(),
            })
            .collect())
    }

    fn open(&self, name: &str) -> Result<SimContext> {
        let Some(index) = self.index_of(name) else {
            return Err(Error::DeviceNotFound {
                name: name.to_string(),
                available: self.devices()?.into_iter().map(|d| d.name).collect(),
            });
        };
        let mut listen = self.config.listen;
        if listen.port() != 0 {
            listen.set_port(listen.port() + index as u16);
        }
        Ok(SimContext {
            dev: DeviceShared::open(name, index, listen, self.config.advertise)?,
        })
    }
}
