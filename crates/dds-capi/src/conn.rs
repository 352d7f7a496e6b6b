//! Connecting, and the directory and file operations (control plane).

use std::ffi::c_char;
use std::time::Duration;

use dds_host::{default_socket_path, Config, Dds, FileInfo, GroupConfig};

use crate::handle::{conn, dds_t, free_conn, input, new_conn, out_ptr, str_arg};
use crate::status::{dds_status, guard, Error, Result};
use crate::types::{
    dds_config, dds_file_id, dds_file_info, dds_group_config, dds_info, dds_space_info,
};

pub(crate) fn c_group_config(g: &GroupConfig) -> dds_group_config {
    dds_group_config {
        request_ring_bytes: g.request_ring_bytes,
        response_ring_bytes: g.response_ring_bytes,
        max_inflight_bytes: g.max_inflight_bytes,
        max_outstanding: u32::from(g.max_outstanding),
    }
}

pub(crate) fn group_config(c: &dds_group_config) -> Result<GroupConfig> {
    let max_outstanding = u16::try_from(c.max_outstanding)
        .ok()
        .filter(|&n| n != 0 && n != u16::MAX)
        .ok_or_else(|| Error::invalid("max_outstanding must be in 1..=65534"))?;
    Ok(GroupConfig {
        request_ring_bytes: c.request_ring_bytes,
        response_ring_bytes: c.response_ring_bytes,
        max_outstanding,
        max_inflight_bytes: c.max_inflight_bytes,
    })
}

fn file_info(f: &FileInfo) -> dds_file_info {
    dds_file_info {
        id: f.id,
        size: f.size,
    }
}

/// Writes the default connection settings into `*config`.
///
/// # Safety
/// `config` is NULL or points to writable memory for a `dds_config`.
#[no_mangle]
pub unsafe extern "C" fn dds_config_default(config: *mut dds_config) -> dds_status {
    guard(|| {
        let config = out_ptr(config, "config")?;
        let d = Config::default();
        config.write(dds_config {
            default_group: c_group_config(&d.default_group),
            rpc_timeout_us: u64::try_from(d.rpc_timeout.as_micros()).unwrap_or(u64::MAX),
        });
        Ok(())
    })
}

/// Writes the default notification group settings into `*config`.
///
/// # Safety
/// `config` is NULL or points to writable memory for a `dds_group_config`.
#[no_mangle]
pub unsafe extern "C" fn dds_group_config_default(config: *mut dds_group_config) -> dds_status {
    guard(|| {
        let config = out_ptr(config, "config")?;
        config.write(c_group_config(&GroupConfig::default()));
        Ok(())
    })
}

/// Initialize: connects to the DPU listening on the Unix socket `socket_path` (NULL = the
/// default socket, `dpu.sock` in `$XDG_RUNTIME_DIR/dds`, `/run/dds` for root, otherwise
/// `/tmp/dds-$UID`) with default settings, and stores the new connection
/// in `*out`. Fails with `DDS_DPU_DEAD` when no DPU listens there.
///
/// # Safety
/// `socket_path` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_connect(
    socket_path: *const c_char,
    out: *mut *mut dds_t,
) -> dds_status {
    dds_connect_with(socket_path, std::ptr::null(), out)
}

/// Connects like `dds_connect` with the settings in `*config` (NULL = defaults).
///
/// # Safety
/// `socket_path` is NULL or a NUL-terminated string; `config` is NULL or a readable
/// `dds_config`; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_connect_with(
    socket_path: *const c_char,
    config: *const dds_config,
    out: *mut *mut dds_t,
) -> dds_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let socket = if socket_path.is_null() {
            default_socket_path()
        } else {
            std::path::PathBuf::from(str_arg(socket_path, "socket_path")?)
        };
        let config = if config.is_null() {
            Config::default()
        } else {
            let c = input(config, "config")?;
            if c.rpc_timeout_us == 0 {
                return Err(Error::invalid("rpc_timeout_us must not be 0"));
            }
            Config {
                default_group: group_config(&c.default_group)?,
                rpc_timeout: Duration::from_micros(c.rpc_timeout_us),
            }
        };
        let dds = Dds::connect_with(&socket, config)?;
        out.write(new_conn(dds));
        Ok(())
    })
}

/// Closes the connection and frees `dds` together with all its group handles (the default
/// group and those of `dds_create_group`). The DPU forgets the connection's groups.
/// Operations still in flight are abandoned: buffers of pending reads must stay valid until
/// this returns, and are not written afterwards.
///
/// # Safety
/// `dds` is NULL or a live handle that no other thread uses during or after this call.
#[no_mangle]
pub unsafe extern "C" fn dds_disconnect(dds: *mut dds_t) -> dds_status {
    guard(|| {
        conn(dds)?;
        free_conn(dds);
        Ok(())
    })
}

/// Stores in `*connected` whether the DPU is still reachable (false once it is known to be
/// gone; a new `dds_connect` is then needed).
///
/// # Safety
/// `dds` is NULL or a live handle; `connected` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_is_connected(dds: *mut dds_t, connected: *mut bool) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let connected = out_ptr(connected, "connected")?;
        connected.write(h.dds.is_connected());
        Ok(())
    })
}

/// Stores what the DPU announced at connect (I/O limits, alignment) in `*info`.
///
/// # Safety
/// `dds` is NULL or a live handle; `info` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_get_info(dds: *mut dds_t, info: *mut dds_info) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let info = out_ptr(info, "info")?;
        let hello = h.dds.hello();
        info.write(dds_info {
            protocol_version: hello.version,
            payload_align: hello.payload_align,
            max_io_bytes: hello.max_io_bytes,
            block_size: hello.block_size,
        });
        Ok(())
    })
}

/// CreateDirectory: creates the directory `path` (e.g. `"/db"`). Directories sit directly
/// under the root; files sit in the root or in a directory (`"/db/pages"`).
///
/// # Safety
/// `dds` is NULL or a live handle; `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dds_create_directory(dds: *mut dds_t, path: *const c_char) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        Ok(h.dds.create_dir(str_arg(path, "path")?)?)
    })
}

/// RemoveDirectory: removes the empty directory `path` (`DDS_NOT_EMPTY` otherwise).
///
/// # Safety
/// `dds` is NULL or a live handle; `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dds_remove_directory(dds: *mut dds_t, path: *const c_char) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        Ok(h.dds.remove_dir(str_arg(path, "path")?)?)
    })
}

/// CreateFile: creates the empty file `path` (`DDS_EXISTS` if it exists, `DDS_UNKNOWN_DIR`
/// if its directory does not) and stores its id and size in `*info`.
///
/// # Safety
/// `dds` is NULL or a live handle; `path` is NULL or a NUL-terminated string; `info` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_create_file(
    dds: *mut dds_t,
    path: *const c_char,
    info: *mut dds_file_info,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let p = str_arg(path, "path")?;
        let info = out_ptr(info, "info")?;
        info.write(file_info(&h.dds.create_file(p)?));
        Ok(())
    })
}

/// Opens `path`, creating it when it does not exist; stores its id and size in `*info`.
///
/// # Safety
/// As `dds_create_file`.
#[no_mangle]
pub unsafe extern "C" fn dds_open_or_create_file(
    dds: *mut dds_t,
    path: *const c_char,
    info: *mut dds_file_info,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let p = str_arg(path, "path")?;
        let info = out_ptr(info, "info")?;
        info.write(file_info(&h.dds.open_or_create(p)?));
        Ok(())
    })
}

/// Looks up the file `path` (`DDS_NOT_FOUND` if there is none) and stores its id and size
/// in `*info`.
///
/// # Safety
/// As `dds_create_file`.
#[no_mangle]
pub unsafe extern "C" fn dds_lookup(
    dds: *mut dds_t,
    path: *const c_char,
    info: *mut dds_file_info,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let p = str_arg(path, "path")?;
        let info = out_ptr(info, "info")?;
        info.write(file_info(&h.dds.lookup(p)?));
        Ok(())
    })
}

/// GetFileInformationById: stores the id and size of file `file` in `*info`
/// (`DDS_UNKNOWN_FILE` if there is no such file).
///
/// # Safety
/// `dds` is NULL or a live handle; `info` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_stat(
    dds: *mut dds_t,
    file: dds_file_id,
    info: *mut dds_file_info,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let info = out_ptr(info, "info")?;
        info.write(file_info(&h.dds.stat(file)?));
        Ok(())
    })
}

/// GetFileSize: stores the size of file `file` in bytes in `*size`.
///
/// # Safety
/// `dds` is NULL or a live handle; `size` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_get_file_size(
    dds: *mut dds_t,
    file: dds_file_id,
    size: *mut u64,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let size = out_ptr(size, "size")?;
        size.write(h.dds.file_size(file)?);
        Ok(())
    })
}

/// ChangeFileSize / SetEndOfFile: truncates or extends file `file` to `size` bytes
/// (extended bytes read as zeros).
///
/// # Safety
/// `dds` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn dds_change_file_size(
    dds: *mut dds_t,
    file: dds_file_id,
    size: u64,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        Ok(h.dds.set_file_size(file, size)?)
    })
}

/// DeleteFile: deletes file `file`; its id becomes stale (`DDS_UNKNOWN_FILE`).
///
/// # Safety
/// `dds` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn dds_delete_file(dds: *mut dds_t, file: dds_file_id) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        Ok(h.dds.delete_file(file)?)
    })
}

/// Exposes file `file` to the DPU's offload engine (`exposed` non-zero) or withdraws it: only
/// exposed files are read on the DPU for network clients or cached by cache-on-write. Stores
/// in `*engine` (if not NULL) 1 when the DPU runs an offload engine, 0 when it runs none (the
/// call then has no effect).
///
/// # Safety
/// `dds` is NULL or a live handle; `engine` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_expose_file(
    dds: *mut dds_t,
    file: dds_file_id,
    exposed: u32,
    engine: *mut u32,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let on = h.dds.expose_file(file, exposed != 0)?;
        if !engine.is_null() {
            engine.write(u32::from(on));
        }
        Ok(())
    })
}

/// MoveFile: renames (and possibly moves to another directory) the file `from` to `to`;
/// the file keeps its id. `DDS_EXISTS` if `to` is taken.
///
/// # Safety
/// `dds` is NULL or a live handle; `from` and `to` are NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn dds_rename(
    dds: *mut dds_t,
    from: *const c_char,
    to: *const c_char,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let from = str_arg(from, "from")?;
        let to = str_arg(to, "to")?;
        Ok(h.dds.rename(from, to)?)
    })
}

/// GetStorageFreeSpace: stores the capacity of the file service in `*space`.
///
/// # Safety
/// `dds` is NULL or a live handle; `space` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_free_space(dds: *mut dds_t, space: *mut dds_space_info) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let space = out_ptr(space, "space")?;
        let s = h.dds.free_space()?;
        space.write(dds_space_info {
            total_bytes: s.total_bytes,
            free_bytes: s.free_bytes,
            segment_size: s.segment_size,
            files: s.files,
            dirs: s.dirs,
        });
        Ok(())
    })
}
