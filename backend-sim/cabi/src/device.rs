//! The device list (`man ibv_get_device_list`, `man ibv_get_device_name`,
//! `man ibv_get_device_guid`, `man ibv_get_device_index`).

use std::ffi::{c_char, c_int};

use crate::abi::ibv_device;
use crate::ffi::{ptr_verb, set_errno, value_verb, void_verb};
use crate::runtime::{device, runtime};

/// `ibv_get_device_list`: a NULL-terminated array of the sim's devices (allocated with
/// `calloc`, freed by `ibv_free_device_list`), its length in `*num_devices`.
pub(crate) unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    ptr_verb("ibv_get_device_list", || {
        let rt = runtime()?;
        let n = rt.devices.len();
        // SAFETY: calloc has no preconditions; the result is checked.
        let list = unsafe { libc::calloc(n + 1, size_of::<*mut ibv_device>()) }.cast::<*mut ibv_device>();
        if list.is_null() {
            return Err(libc::ENOMEM);
        }
        for (i, d) in rt.devices.iter().enumerate() {
            // SAFETY: `list` holds n + 1 pointers; i < n. The devices live for the
            // process, so the pointers stay valid after the list is freed, as in
            // libibverbs.
            unsafe { *list.add(i) = (&d.c as *const ibv_device).cast_mut() };
        }
        if !num_devices.is_null() {
            // SAFETY: the program passes a valid `int *` or NULL.
            unsafe { *num_devices = n as c_int };
        }
        Ok(list)
    })
}

/// `ibv_free_device_list`.
pub(crate) unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    void_verb("ibv_free_device_list", || {
        // SAFETY: `list` is NULL or came from `ibv_get_device_list`'s calloc.
        unsafe { libc::free(list.cast()) }
    })
}

/// `ibv_get_device_name`: the device's name, or NULL (errno EINVAL) for a pointer that
/// is not a listed device.
pub(crate) unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    ptr_verb("ibv_get_device_name", || {
        Ok(device(dev)?.c.name.as_ptr().cast_mut())
    })
    .cast_const()
}

/// `ibv_get_device_guid`: the node GUID in network byte order (0, errno EINVAL, for a
/// pointer that is not a listed device).
pub(crate) unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    value_verb("ibv_get_device_guid", 0, || match device(dev) {
        Ok(d) => d.guid.to_be(),
        Err(e) => {
            set_errno(e);
            0
        }
    })
}

/// `ibv_get_device_index`: the device's position in the list, or -1.
pub(crate) unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    value_verb("ibv_get_device_index", -1, || match device(dev) {
        Ok(d) => d.index as c_int,
        Err(_) => -1,
    })
}
