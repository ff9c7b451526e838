//! The verbs handles: what an application holds (`SimBackend`, `SimContext`, `SimPd`,
//! `SimMr`, `SimMw`, `SimCq`, `SimChannel`, `SimQp`, `SimSrq`, `SimAh`), each implementing its verbs-api trait over
//! the device's shared objects. The [`Backend`] implementation, which names them all, is
//! here: the devices the backend lists (`ibv_get_device_list`) and opening one
//! (`ibv_open_device`).

use verbs_api::{Backend, DeviceInfo, Error, Result};

use crate::device::DeviceShared;
use ah::SimAh;
use backend::SimBackend;
use context::SimContext;
use cq::{SimChannel, SimCq};
use mw::SimMw;
use pd::{SimMr, SimPd};
use qp::SimQp;
use srq::SimSrq;

pub mod ah;
pub mod backend;
pub mod context;
pub mod cq;
pub mod mw;
pub mod pd;
pub mod qp;
pub mod srq;

impl Backend for SimBackend {
    type Context = SimContext;
    type Pd = SimPd;
    type Mr = SimMr;
    type Cq = SimCq;
    type Channel = SimChannel;
    type Qp = SimQp;
    type Srq = SimSrq;
    type Ah = SimAh;
    type Mw = SimMw;

    fn name(&self) -> &'static str {
        "sim"
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        Ok((0..self.config.devices)
            .map(|i| DeviceInfo {
                name: format!("sim{i}"),
                guid: self.guid(i),
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
        // (On an Ethernet port every device listens on the RoCE port, at its own IP.)
        if listen.port() != 0 && self.config.profile.attrs().link_layer != verbs_api::LinkLayer::Ethernet {
            listen.set_port(listen.port() + index as u16);
        }
        Ok(SimContext {
            dev: DeviceShared::open(
                name,
                self.guid(index),
                listen,
                self.config.advertise,
                crate::device::DeviceOptions {
                    profile: self.config.profile,
                    advice: self.advice.clone(),
                    choices: crate::choices::Choices::new(self.config.seed, name),
                    capture: self.capture(),
                    transport: self.config.transport,
                },
            )?,
        })
    }
}
