//! The deterministic backend as a [`verbs_api::Backend`]: its objects' types, its
//! devices listed and opened by name (`ibv_get_device_list`, `ibv_open_device`), and its
//! clock, which is virtual: [`Backend::settle`] runs the world instead of sleeping.

use std::time::Duration;

use verbs_api::{Backend, DeviceInfo, Error, Result};

use crate::cq::{DetChannel, DetCq};
use crate::det::Det;
use crate::handles::{DetContext, DetPd};
use crate::limits::guid;
use crate::objects::DetMr;
use crate::qp::DetQp;
use crate::refuse::{DetAh, DetMw};
use crate::srq::DetSrq;

impl Backend for Det {
    type Context = DetContext;
    type Pd = DetPd;
    type Mr = DetMr;
    type Cq = DetCq;
    type Channel = DetChannel;
    type Qp = DetQp;
    type Srq = DetSrq;
    type Ah = DetAh;
    type Mw = DetMw;

    fn name(&self) -> &'static str {
        "det"
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        let w = self.shared.enter("ibv_get_device_list")?;
        Ok(w.devices
            .iter()
            .enumerate()
            .map(|(i, d)| DeviceInfo {
                name: d.name.clone(),
                guid: guid(i),
                transport: "InfiniBand".into(),
            })
            .collect())
    }

    /// Runs the world through `d` of virtual time, or until nothing is left to happen
    /// ([`Det::settle`]): a thread's sleep would move nothing in it.
    fn settle(&self, d: Duration) -> Result<()> {
        Det::settle(self, d).map(drop)
    }

    /// Always: the world's clock moves as its program waits.
    fn clock_is_virtual(&self) -> bool {
        true
    }

    fn open(&self, name: &str) -> Result<DetContext> {
        let mut w = self.shared.enter("ibv_open_device")?;
        match w.devices.iter().position(|d| d.name == name) {
            Some(dev) => {
                w.contexts.push(Default::default());
                let id = w.contexts.len() - 1;
                Ok(DetContext::new(self.shared.clone(), dev, id, name.into()))
            }
            None => Err(Error::DeviceNotFound {
                name: name.into(),
                available: w.devices.iter().map(|d| d.name.clone()).collect(),
            }),
        }
    }
}
