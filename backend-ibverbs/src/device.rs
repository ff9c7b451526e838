//! The device list and opening a device: `ibv_get_device_list`, `ibv_free_device_list`,
//! `ibv_get_device_name`, `ibv_get_device_guid`, `ibv_open_device`
//! (`man ibv_get_device_list`, `man ibv_get_device_name`, `man ibv_open_device`).

use std::ffi::CStr;
use std::os::raw::c_int;

use rdma_sys::{ibv_device, ibv_free_device_list, ibv_get_device_guid, ibv_get_device_list};
use rdma_sys::{ibv_get_device_name, ibv_transport_type};
use verbs_api::{Backend, DeviceInfo, Error, Result};

use crate::ah::IbvAh;
use crate::context::IbvContext;
use crate::cq::{IbvChannel, IbvCq};
use crate::errno::last_errno;
use crate::mr::IbvMr;
use crate::pd::IbvPd;
use crate::qp::IbvQp;
use crate::srq::IbvSrq;

/// What [`Error::NoDevice`] says when libibverbs lists no device.
pub(crate) const NO_DEVICE_HINT: &str = "libibverbs lists no RDMA device: load a driver (for Soft-RoCE: \
     `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0`) or use the sim backend";

/// The libibverbs backend: every RDMA device that `ibv_get_device_list` shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbvBackend;

/// The NULL-terminated array of `ibv_get_device_list`, freed on drop.
pub(crate) struct DeviceList {
    list: *mut *mut ibv_device,
    len: usize,
}

impl DeviceList {
    /// `ibv_get_device_list`. A system without RDMA support (no uverbs in the kernel:
    /// libibverbs fails with ENOSYS) yields an empty list, as does one without devices.
    pub(crate) fn get() -> Result<DeviceList> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the returned array is owned by us until
        // `ibv_free_device_list` (in Drop).
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = last_errno();
            return match e {
                libc::ENOSYS | libc::ENODEV | libc::ENOENT => Ok(DeviceList {
                    list: std::ptr::null_mut(),
                    len: 0,
                }),
                e => Err(Error::from_errno("ibv_get_device_list", e)),
            };
        }
        Ok(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    /// The device pointers (valid while `self` lives).
    pub(crate) fn devices(&self) -> impl Iterator<Item = *mut ibv_device> + '_ {
        (0..self.len).map(move |i| {
            // SAFETY: `list` holds `len` valid entries (followed by a NULL terminator).
            unsafe { *self.list.add(i) }
        })
    }

    /// The names of all devices.
    pub(crate) fn names(&self) -> Vec<String> {
        self.devices().map(device_name).collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: `list` came from `ibv_get_device_list` and is freed once. Contexts
            // opened from it stay valid (`man ibv_get_device_list`: "Once a device has
            // been opened, the list may be freed").
            unsafe { ibv_free_device_list(self.list) };
        }
    }
}

/// `ibv_get_device_name`.
pub(crate) fn device_name(dev: *mut ibv_device) -> String {
    // SAFETY: `dev` is a device of a live device list; the name is a NUL-terminated
    // string inside the device structure.
    let p = unsafe { ibv_get_device_name(dev) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL, NUL-terminated, valid while the device list lives.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn transport_name(t: ibv_transport_type::Type) -> &'static str {
    match t {
        ibv_transport_type::IBV_TRANSPORT_IB => "InfiniBand",
        ibv_transport_type::IBV_TRANSPORT_IWARP => "iWARP",
        ibv_transport_type::IBV_TRANSPORT_USNIC => "usNIC",
        ibv_transport_type::IBV_TRANSPORT_USNIC_UDP => "usNIC UDP",
        ibv_transport_type::IBV_TRANSPORT_UNSPECIFIED => "unspecified",
        _ => "unknown",
    }
}

impl Backend for IbvBackend {
    type Context = IbvContext;
    type Pd = IbvPd;
    type Mr = IbvMr;
    type Cq = IbvCq;
    type Channel = IbvChannel;
    type Qp = IbvQp;
    type Srq = IbvSrq;
    type Ah = IbvAh;
    type Mw = crate::mw::IbvMw;

    fn name(&self) -> &'static str {
        "ibverbs"
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        let list = DeviceList::get()?;
        Ok(list
            .devices()
            .map(|d| DeviceInfo {
                name: device_name(d),
                // SAFETY: `d` is a device of the live list.
                guid: u64::from_be(unsafe { ibv_get_device_guid(d) }),
                // SAFETY: as above; `transport_type` is a plain field.
                transport: transport_name(unsafe { (*d).transport_type }).to_owned(),
            })
            .collect())
    }

    fn open(&self, name: &str) -> Result<IbvContext> {
        let list = DeviceList::get()?;
        if list.len == 0 {
            return Err(Error::NoDevice {
                hint: NO_DEVICE_HINT.to_owned(),
            });
        }
        let found = list.devices().find(|&d| device_name(d) == name);
        match found {
            Some(dev) => IbvContext::open(dev, name.to_owned()),
            None => Err(Error::DeviceNotFound {
                name: name.to_owned(),
                available: list.names(),
            }),
        }
    }

    fn open_first(&self) -> Result<IbvContext> {
        let list = DeviceList::get()?;
        let first = list.devices().next();
        match first {
            Some(dev) => IbvContext::open(dev, device_name(dev)),
            None => Err(Error::NoDevice {
                hint: NO_DEVICE_HINT.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs_api::Context as _;

    /// The build host has no RDMA device: the list is empty and opening says so. (If a
    /// device is present the test checks that an unknown name lists the real ones.)
    #[test]
    fn no_device_gives_a_clear_error() {
        let devs = IbvBackend
            .devices()
            .expect("device list never fails without hardware");
        if devs.is_empty() {
            match IbvBackend.open_first() {
                Err(Error::NoDevice { hint }) => assert!(hint.contains("rdma link add"), "{hint}"),
                other => panic!("expected NoDevice, got {:?}", other.map(|c| c.name().to_owned())),
            }
            assert!(matches!(IbvBackend.open("mlx5_0"), Err(Error::NoDevice { .. })));
        } else {
            match IbvBackend.open("no-such-device") {
                Err(Error::DeviceNotFound { available, .. }) => assert_eq!(available.len(), devs.len()),
                other => panic!(
                    "expected DeviceNotFound, got {:?}",
                    other.map(|c| c.name().to_owned())
                ),
            }
        }
    }

    #[test]
    fn backend_name() {
        assert_eq!(IbvBackend.name(), "ibverbs");
        assert_eq!(transport_name(ibv_transport_type::IBV_TRANSPORT_IB), "InfiniBand");
    }
}
