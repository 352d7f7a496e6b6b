//! Notification groups and PollWait.

use std::time::{Duration, Instant};

use dds_host::{Completion, Group};

use crate::conn::group_config;
use crate::handle::{conn, dds_group_t, dds_t, free_group, input, new_group, out_ptr};
use crate::status::{dds_status, guard, status_code, Error, Result, DDS_TIMEOUT};
use crate::types::{dds_completion, dds_file_id, dds_group_config, DDS_WAIT_FOREVER};

/// Longest single sleep handed to the host library (a longer wait loops).
const CHUNK: Duration = Duration::from_secs(3600);

fn c_completion(c: &Completion) -> dds_completion {
    dds_completion {
        file_ctx: c.file_ctx,
        io_ctx: c.io_ctx,
        status: status_code(c.status),
        bytes: c.bytes,
    }
}

/// One completion, waiting up to `timeout_us` (0 = do not wait, `DDS_WAIT_FOREVER`).
fn wait_one(g: &Group, timeout_us: u64) -> Result<Option<Completion>> {
    if timeout_us == 0 {
        return Ok(g.poll_wait(Duration::ZERO)?);
    }
    let deadline = match timeout_us {
        DDS_WAIT_FOREVER => None,
        us => Instant::now().checked_add(Duration::from_micros(us)),
    };
    loop {
        let chunk = match deadline {
            None => CHUNK,
            Some(d) => d.saturating_duration_since(Instant::now()).min(CHUNK),
        };
        if let Some(c) = g.poll_wait(chunk)? {
            return Ok(Some(c));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
    }
}

fn timed_out() -> Error {
    Error::new(DDS_TIMEOUT, "no completion within the timeout")
}

/// GetDefaultPoll: stores in `*out` the connection's default group, which receives the
/// completions of every file not moved to another group by `dds_poll_add`. The handle is
/// owned by the connection: it stays valid until `dds_disconnect` and cannot be deleted.
///
/// # Safety
/// `dds` is NULL or a live handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_default_group(
    dds: *mut dds_t,
    out: *mut *mut dds_group_t,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let out = out_ptr(out, "out")?;
        out.write(h.default_group);
        Ok(())
    })
}

/// PollCreate: creates a notification group with its own pair of rings, with the settings
/// in `*config` (NULL = `dds_group_config_default`), and stores it in `*out`.
///
/// # Safety
/// `dds` is NULL or a live handle; `config` is NULL or a readable `dds_group_config`; `out`
/// is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_create_group(
    dds: *mut dds_t,
    config: *const dds_group_config,
    out: *mut *mut dds_group_t,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let out = out_ptr(out, "out")?;
        let cfg = if config.is_null() {
            dds_host::GroupConfig::default()
        } else {
            group_config(&input(config, "config")?)?
        };
        let g = new_group(h.dds.create_group(&cfg)?);
        h.lock_groups().insert(g as usize);
        out.write(g);
        Ok(())
    })
}

/// PollDelete: deletes a group made by `dds_create_group` on this connection and frees its
/// handle (also when the DPU reports an error). Its files go back to the default group;
/// operations still pending in it are abandoned, so their buffers are never written after
/// this returns. The default group cannot be deleted (`DDS_INVALID_ARGUMENT`).
///
/// # Safety
/// `dds` is NULL or a live handle; `group` is NULL or a group handle that no other thread
/// uses during or after this call.
#[no_mangle]
pub unsafe extern "C" fn dds_delete_group(dds: *mut dds_t, group: *mut dds_group_t) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        if group.is_null() {
            return Err(Error::invalid("dds_group_t handle is NULL"));
        }
        if group == h.default_group {
            return Err(Error::invalid("the default group cannot be deleted"));
        }
        if !h.lock_groups().remove(&(group as usize)) {
            return Err(Error::invalid("not a live group of this connection"));
        }
        let g = free_group(group);
        Ok(h.dds.delete_group(g)?)
    })
}

/// PollAdd: sends the completions of file `file` to `group` (of this connection), tagged
/// with `file_ctx`. Operations issued before keep completing through the previous group.
///
/// # Safety
/// `dds` is NULL or a live handle; `group` is NULL or a live group handle.
#[no_mangle]
pub unsafe extern "C" fn dds_poll_add(
    dds: *mut dds_t,
    file: dds_file_id,
    group: *mut dds_group_t,
    file_ctx: u64,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        if group.is_null() {
            return Err(Error::invalid("dds_group_t handle is NULL"));
        }
        if !h.owns_group(group) {
            return Err(Error::invalid("not a live group of this connection"));
        }
        let g = crate::handle::group(group)?;
        Ok(h.dds.poll_add(file, &g.group, file_ctx)?)
    })
}

/// PollWait: stores one completed operation of `group` in `*out`. `timeout_us` is how long
/// to wait for one, in microseconds: 0 = non-blocking (return at once), `DDS_WAIT_FOREVER` =
/// until one arrives. While waiting the thread sleeps (no CPU) until the DPU signals the
/// group. Returns `DDS_TIMEOUT` when none arrived in time, and `DDS_DPU_DEAD` once the DPU is
/// gone and every pending operation has been returned (failed with `DDS_DPU_DEAD`). The
/// operation's own outcome is `out->status`. Many threads may wait on one group.
///
/// # Safety
/// `group` is NULL or a live group handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_poll_wait(
    group: *mut dds_group_t,
    out: *mut dds_completion,
    timeout_us: u64,
) -> dds_status {
    guard(|| {
        let g = crate::handle::group(group)?;
        let out = out_ptr(out, "out")?;
        match wait_one(&g.group, timeout_us)? {
            Some(c) => {
                out.write(c_completion(&c));
                Ok(())
            }
            None => Err(timed_out()),
        }
    })
}

/// PollWait for a batch: waits like `dds_poll_wait` for the first completion, then takes up
/// to `max - 1` more that are ready without waiting. Stores them in `out[0 .. *count]`.
/// Returns `DDS_TIMEOUT` (with `*count` = 0) when none arrived in time.
///
/// # Safety
/// `group` is NULL or a live group handle; `out` is NULL or `max` writable entries; `count`
/// is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_poll_wait_many(
    group: *mut dds_group_t,
    out: *mut dds_completion,
    max: usize,
    count: *mut usize,
    timeout_us: u64,
) -> dds_status {
    guard(|| {
        let g = crate::handle::group(group)?;
        let out = out_ptr(out, "out")?;
        let count = out_ptr(count, "count")?;
        if max == 0 {
            return Err(Error::invalid("max is 0"));
        }
        count.write(0);
        let Some(first) = wait_one(&g.group, timeout_us)? else {
            return Err(timed_out());
        };
        out.write(c_completion(&first));
        let mut n = 1;
        while n < max {
            // A failure here (the DPU is gone) is reported by the next call.
            match g.group.poll_wait(Duration::ZERO) {
                Ok(Some(c)) => {
                    out.add(n).write(c_completion(&c));
                    n += 1;
                }
                Ok(None) | Err(_) => break,
            }
        }
        count.write(n);
        Ok(())
    })
}

/// Stores the number of operations issued in `group` and not yet returned in `*count`.
///
/// # Safety
/// `group` is NULL or a live group handle; `count` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_group_outstanding(
    group: *mut dds_group_t,
    count: *mut usize,
) -> dds_status {
    guard(|| {
        let g = crate::handle::group(group)?;
        let count = out_ptr(count, "count")?;
        count.write(g.group.outstanding());
        Ok(())
    })
}
