/*
 * dds.h: C API of DDS, disaggregated storage with the file service on a DPU.
 *
 * Link with libdds (cargo build --release -p dds-capi: target/release/libdds.so or libdds.a;
 * the static library also needs -lpthread -ldl -lm).
 *
 * Conventions:
 *  - Every function returns a dds_status: DDS_OK (0) or an error code (the DDS protocol
 *    status codes, plus DDS_INTERNAL). Results are written through out-pointers, only on
 *    success. dds_status_name() and dds_status_message() describe a code;
 *    dds_last_error_message() tells why the calling thread's last call failed.
 *  - NULL or misaligned pointers, handles that are not live (detected on a best-effort
 *    basis) and out-of-range arguments fail with DDS_INVALID_ARGUMENT, never crash.
 *  - Reads, writes and flushes are non-blocking: they complete through the notification
 *    group of their file (dds_poll_wait), tagged with the io context given at issue and the
 *    file context given to dds_poll_add. The *_sync variants wait for their own result.
 *
 * Threads: a dds_t may be used from many threads at once (every call but dds_disconnect,
 * which must be the last call on it). A dds_group_t may be used from many threads at once
 * (issue and dds_poll_wait) until dds_delete_group or dds_disconnect. A dds_dir_iter_t
 * belongs to one thread at a time.
 */


#ifndef DDS_H
#define DDS_H

/* Generated from crates/dds-capi by cbindgen (build.rs): do not edit. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/**
 * Most buffers one `dds_read_scatter` may name.
 */
#define DDS_IOV_MAX 16

/**
 * `timeout_us` of `dds_poll_wait`: sleep until a completion arrives (or the DPU is gone).
 */
#define DDS_WAIT_FOREVER 18446744073709551615ull

/**
 * `dds_dir_entry.kind` of a file.
 */
#define DDS_ENTRY_FILE 0

/**
 * `dds_dir_entry.kind` of a directory.
 */
#define DDS_ENTRY_DIR 1

/**
 * A registered buffer (opaque): shared memory of the connection that the DPU reads and
 * writes by DMA. Create with `dds_register_buffer`, get its address with `dds_buffer_data`,
 * free with `dds_unregister_buffer` or `dds_disconnect`.
 */
typedef struct dds_buffer_t dds_buffer_t;

/**
 * A snapshot of a directory's entries (opaque), from `dds_list_directory`. Independent of
 * the connection (it may outlive it); free with `dds_dir_close`. Not safe for concurrent
 * use from several threads.
 */
typedef struct dds_dir_iter_t dds_dir_iter_t;

/**
 * A notification group (opaque): a request ring, a response ring and the completions of the
 * files bound to it. Create with `dds_create_group` (or get the connection's default group
 * with `dds_default_group`); free with `dds_delete_group` or `dds_disconnect`.
 * `dds_poll_wait` may be called on one group from many threads at once.
 */
typedef struct dds_group_t dds_group_t;

/**
 * A connection to the DPU (opaque). Create with `dds_connect`, free with `dds_disconnect`.
 * Every function taking a `dds_t *` may be called from many threads at once, except
 * `dds_disconnect`, which must be the last call on the handle.
 */
typedef struct dds_t dds_t;

/**
 * Result code of every `dds_*` function: `DDS_OK` (0) or one of the `DDS_*` error codes.
 * Codes 0..=22 are the status codes of the DDS protocol (docs/records.md); the library adds
 * `DDS_INTERNAL`.
 */
typedef int32_t dds_status;

/**
 * A file id, as returned by `dds_create_file` and `dds_lookup`.
 */
typedef uint32_t dds_file_id;

/**
 * Settings of a notification group (`dds_group_config_default` fills in the defaults).
 */
typedef struct dds_group_config {
    /**
     * Request ring data bytes: a power of two from 64 KiB to 1 GiB.
     */
    size_t request_ring_bytes;
    /**
     * Response ring data bytes: a power of two from 64 KiB to 1 GiB.
     */
    size_t response_ring_bytes;
    /**
     * Bound on request bytes in flight; 0 = the whole request ring.
     */
    size_t max_inflight_bytes;
    /**
     * Outstanding operations at most, 1..=65534; more fail with
     * `DDS_TOO_MANY_OUTSTANDING`.
     */
    uint32_t max_outstanding;
} dds_group_config;

/**
 * Connection settings (`dds_config_default` fills in the defaults).
 */
typedef struct dds_config {
    /**
     * Settings of the default notification group, created at connect.
     */
    struct dds_group_config default_group;
    /**
     * How long a control call (create, stat, ...) waits for the DPU, in microseconds
     * (not 0). A control call that times out leaves the connection unusable.
     */
    uint64_t rpc_timeout_us;
} dds_config;

/**
 * What the DPU announced at connect.
 */
typedef struct dds_info {
    /**
     * Control protocol version.
     */
    uint32_t protocol_version;
    /**
     * Alignment of I/O payloads in the rings (512 on O_DIRECT devices).
     */
    uint32_t payload_align;
    /**
     * Largest read or write in bytes; larger ones fail with `DDS_TOO_LARGE`.
     */
    uint32_t max_io_bytes;
    /**
     * Device block size in bytes.
     */
    uint32_t block_size;
} dds_info;

/**
 * A file's id and size.
 */
typedef struct dds_file_info {
    dds_file_id id;
    uint64_t size;
} dds_file_info;

/**
 * Capacity of the file service (`dds_free_space`).
 */
typedef struct dds_space_info {
    uint64_t total_bytes;
    uint64_t free_bytes;
    uint64_t segment_size;
    uint32_t files;
    uint32_t dirs;
} dds_space_info;

/**
 * One directory entry returned by `dds_dir_next`.
 */
typedef struct dds_dir_entry {
    /**
     * NUL-terminated entry name (no path), owned by the iterator: valid until
     * `dds_dir_close`.
     */
    const char *name;
    /**
     * `DDS_ENTRY_FILE` or `DDS_ENTRY_DIR`.
     */
    uint32_t kind;
    /**
     * File id (files) or directory id (directories).
     */
    uint32_t id;
    /**
     * File size in bytes (0 for directories).
     */
    uint64_t size;
} dds_dir_entry;

/**
 * A completed operation, as `dds_poll_wait` returns it.
 */
typedef struct dds_completion {
    /**
     * The file context given to `dds_poll_add` (0 for files in the default group).
     */
    uint64_t file_ctx;
    /**
     * The io context given when the operation was issued.
     */
    uint64_t io_ctx;
    /**
     * `DDS_OK`, or why the operation failed.
     */
    dds_status status;
    /**
     * Bytes read (short at end of file) or written; 0 for a flush.
     */
    uint32_t bytes;
} dds_completion;

/**
 * One destination buffer of `dds_read_scatter`.
 */
typedef struct dds_iovec {
    void *base;
    uint32_t len;
} dds_iovec;

/**
 * One source buffer of `dds_write_gather`.
 */
typedef struct dds_const_iovec {
    const void *base;
    uint32_t len;
} dds_const_iovec;

/**
 * Success.
 */
#define DDS_OK 0

/**
 * No such file id (or a stale id of a deleted file).
 */
#define DDS_UNKNOWN_FILE 1

/**
 * No such directory.
 */
#define DDS_UNKNOWN_DIR 2

/**
 * No such path.
 */
#define DDS_NOT_FOUND 3

/**
 * The path exists already.
 */
#define DDS_EXISTS 4

/**
 * Directory not empty.
 */
#define DDS_NOT_EMPTY 5

/**
 * Read starts beyond end of file, or write beyond the maximum file size.
 */
#define DDS_OUT_OF_RANGE 6

/**
 * Device full.
 */
#define DDS_NO_SPACE 7

/**
 * Request larger than the maximum I/O size or the ring.
 */
#define DDS_TOO_LARGE 8

/**
 * All request slots of the notification group are in use: poll completions and retry.
 */
#define DDS_TOO_MANY_OUTSTANDING 9

/**
 * A path component exceeds the configured limit.
 */
#define DDS_NAME_TOO_LONG 10

/**
 * File table full.
 */
#define DDS_TOO_MANY_FILES 11

/**
 * Directory table full.
 */
#define DDS_TOO_MANY_DIRS 12

/**
 * Malformed path (also: a path that is not valid UTF-8).
 */
#define DDS_INVALID_PATH 13

/**
 * Device I/O error.
 */
#define DDS_IO 14

/**
 * Metadata checksum failure.
 */
#define DDS_CORRUPT 15

/**
 * Malformed record or control message.
 */
#define DDS_BAD_REQUEST 16

/**
 * The DPU process is gone.
 */
#define DDS_DPU_DEAD 17

/**
 * The request ring has no room now: poll completions and retry.
 */
#define DDS_RING_FULL 18

/**
 * A blocking call timed out; also returned by `dds_poll_wait` when no completion arrived
 * within its timeout (always so in non-blocking mode when nothing is ready).
 */
#define DDS_TIMEOUT 19

/**
 * The file service's queue is full: retry.
 */
#define DDS_BUSY 20

/**
 * Bad argument to a library call: a NULL or misaligned pointer, a handle that is not live,
 * a length out of range.
 */
#define DDS_INVALID_ARGUMENT 21

/**
 * Protocol version mismatch, or a reply the library does not understand.
 */
#define DDS_PROTOCOL 22

/**
 * No registered buffer with this id on this connection (it was unregistered, or the handle
 * belongs to another connection).
 */
#define DDS_UNKNOWN_BUFFER 23

/**
 * The offset and length reach outside the registered buffer.
 */
#define DDS_BUFFER_RANGE 24

/**
 * Registering would exceed the DPU's cap on registered buffers or bytes per connection.
 */
#define DDS_BUFFER_LIMIT 25

/**
 * A defect inside the library was caught at the API boundary (the call did not complete;
 * its effects are unknown). `dds_last_error_message` has the details.
 */
#define DDS_INTERNAL 255

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * Allocates `len` bytes of shared memory, registers them with the DPU (a sealed memfd passed
 * over the control socket) and stores the new buffer handle in `*out`. Reads and writes on
 * ranges of it (`dds_read_registered`, `dds_write_registered` and their `_sync` forms) move
 * their data by DMA straight between the DPU and the buffer. `DDS_BUFFER_LIMIT`: the DPU's
 * cap on registered bytes per connection is reached.
 *
 * # Safety
 * `dds` is NULL or a live handle; `out` is NULL or writable.
 */
dds_status dds_register_buffer(struct dds_t *dds, size_t len, struct dds_buffer_t **out);

/**
 * Stores the buffer's address (page aligned) in `*data` and its length in `*len` (either may
 * be NULL). The application fills and reads the buffer there; a range with a read in flight
 * must not be accessed, and one with a write in flight must not change, until the
 * completion.
 *
 * # Safety
 * `buf` is NULL or a live buffer handle; `data` and `len` are NULL or writable.
 */
dds_status dds_buffer_data(const struct dds_buffer_t *buf, void **data, size_t *len);

/**
 * Unregisters a buffer of connection `dds` and frees its handle. Operations still in flight
 * on it keep it registered until they complete; its memory is unmapped after that.
 *
 * # Safety
 * `dds` is NULL or a live handle; `buf` is NULL or a buffer handle of `dds` that no other
 * thread uses during or after this call.
 */
dds_status dds_unregister_buffer(struct dds_t *dds, struct dds_buffer_t *buf);

/**
 * Issues a read of `len` bytes of file `file` at `offset` that the DPU puts by DMA into
 * `buf` at `buf_offset` (no copy by the library). Completes like `dds_read` (bytes read,
 * short at end of file). `DDS_BUFFER_RANGE`: the range reaches outside the buffer.
 *
 * # Safety
 * `dds` is NULL or a live handle; `buf` is NULL or a buffer handle of `dds`; the range is
 * not accessed until the completion has been returned by `dds_poll_wait`.
 */
dds_status dds_read_registered(struct dds_t *dds,
                               dds_file_id file,
                               uint64_t offset,
                               const struct dds_buffer_t *buf,
                               size_t buf_offset,
                               uint32_t len,
                               uint64_t io_ctx);

/**
 * Issues a write of `len` bytes of `buf` at `buf_offset` to file `file` at `offset`; the DPU
 * fetches them by DMA from the buffer (no copy by the library), so the range must not change
 * until the completion. Completes like `dds_write` (bytes written).
 *
 * # Safety
 * `dds` is NULL or a live handle; `buf` is NULL or a buffer handle of `dds`.
 */
dds_status dds_write_registered(struct dds_t *dds,
                                dds_file_id file,
                                uint64_t offset,
                                const struct dds_buffer_t *buf,
                                size_t buf_offset,
                                uint32_t len,
                                uint64_t io_ctx);

/**
 * Blocking form of `dds_read_registered`: stores the bytes read in `*bytes_read` unless it
 * is NULL.
 *
 * # Safety
 * As for `dds_read_registered`, the range untouched during the call; `bytes_read` is NULL or
 * writable.
 */
dds_status dds_read_registered_sync(struct dds_t *dds,
                                    dds_file_id file,
                                    uint64_t offset,
                                    const struct dds_buffer_t *buf,
                                    size_t buf_offset,
                                    uint32_t len,
                                    uint32_t *bytes_read);

/**
 * Blocking form of `dds_write_registered`: stores the bytes written in `*bytes_written`
 * unless it is NULL.
 *
 * # Safety
 * As for `dds_write_registered`; `bytes_written` is NULL or writable.
 */
dds_status dds_write_registered_sync(struct dds_t *dds,
                                     dds_file_id file,
                                     uint64_t offset,
                                     const struct dds_buffer_t *buf,
                                     size_t buf_offset,
                                     uint32_t len,
                                     uint32_t *bytes_written);

/**
 * Writes the default connection settings into `*config`.
 *
 * # Safety
 * `config` is NULL or points to writable memory for a `dds_config`.
 */
dds_status dds_config_default(struct dds_config *config);

/**
 * Writes the default notification group settings into `*config`.
 *
 * # Safety
 * `config` is NULL or points to writable memory for a `dds_group_config`.
 */
dds_status dds_group_config_default(struct dds_group_config *config);

/**
 * Initialize: connects to the DPU listening on the Unix socket `socket_path` (NULL = the
 * default socket, `dpu.sock` in `$XDG_RUNTIME_DIR/dds`, `/run/dds` for root, otherwise
 * `/tmp/dds-$UID`) with default settings, and stores the new connection
 * in `*out`. Fails with `DDS_DPU_DEAD` when no DPU listens there.
 *
 * # Safety
 * `socket_path` is NULL or a NUL-terminated string; `out` is NULL or writable.
 */
dds_status dds_connect(const char *socket_path, struct dds_t **out);

/**
 * Connects like `dds_connect` with the settings in `*config` (NULL = defaults).
 *
 * # Safety
 * `socket_path` is NULL or a NUL-terminated string; `config` is NULL or a readable
 * `dds_config`; `out` is NULL or writable.
 */
dds_status dds_connect_with(const char *socket_path,
                            const struct dds_config *config,
                            struct dds_t **out);

/**
 * Closes the connection and frees `dds` together with all its group handles (the default
 * group and those of `dds_create_group`). The DPU forgets the connection's groups.
 * Operations still in flight are abandoned: buffers of pending reads must stay valid until
 * this returns, and are not written afterwards.
 *
 * # Safety
 * `dds` is NULL or a live handle that no other thread uses during or after this call.
 */
dds_status dds_disconnect(struct dds_t *dds);

/**
 * Stores in `*connected` whether the DPU is still reachable (false once it is known to be
 * gone; a new `dds_connect` is then needed).
 *
 * # Safety
 * `dds` is NULL or a live handle; `connected` is NULL or writable.
 */
dds_status dds_is_connected(struct dds_t *dds, bool *connected);

/**
 * Stores what the DPU announced at connect (I/O limits, alignment) in `*info`.
 *
 * # Safety
 * `dds` is NULL or a live handle; `info` is NULL or writable.
 */
dds_status dds_get_info(struct dds_t *dds, struct dds_info *info);

/**
 * CreateDirectory: creates the directory `path` (e.g. `"/db"`). Directories sit directly
 * under the root; files sit in the root or in a directory (`"/db/pages"`).
 *
 * # Safety
 * `dds` is NULL or a live handle; `path` is NULL or a NUL-terminated string.
 */
dds_status dds_create_directory(struct dds_t *dds, const char *path);

/**
 * RemoveDirectory: removes the empty directory `path` (`DDS_NOT_EMPTY` otherwise).
 *
 * # Safety
 * `dds` is NULL or a live handle; `path` is NULL or a NUL-terminated string.
 */
dds_status dds_remove_directory(struct dds_t *dds, const char *path);

/**
 * CreateFile: creates the empty file `path` (`DDS_EXISTS` if it exists, `DDS_UNKNOWN_DIR`
 * if its directory does not) and stores its id and size in `*info`.
 *
 * # Safety
 * `dds` is NULL or a live handle; `path` is NULL or a NUL-terminated string; `info` is
 * NULL or writable.
 */
dds_status dds_create_file(struct dds_t *dds, const char *path, struct dds_file_info *info);

/**
 * Opens `path`, creating it when it does not exist; stores its id and size in `*info`.
 *
 * # Safety
 * As `dds_create_file`.
 */
dds_status dds_open_or_create_file(struct dds_t *dds, const char *path, struct dds_file_info *info);

/**
 * Looks up the file `path` (`DDS_NOT_FOUND` if there is none) and stores its id and size
 * in `*info`.
 *
 * # Safety
 * As `dds_create_file`.
 */
dds_status dds_lookup(struct dds_t *dds, const char *path, struct dds_file_info *info);

/**
 * GetFileInformationById: stores the id and size of file `file` in `*info`
 * (`DDS_UNKNOWN_FILE` if there is no such file).
 *
 * # Safety
 * `dds` is NULL or a live handle; `info` is NULL or writable.
 */
dds_status dds_stat(struct dds_t *dds, dds_file_id file, struct dds_file_info *info);

/**
 * GetFileSize: stores the size of file `file` in bytes in `*size`.
 *
 * # Safety
 * `dds` is NULL or a live handle; `size` is NULL or writable.
 */
dds_status dds_get_file_size(struct dds_t *dds, dds_file_id file, uint64_t *size);

/**
 * ChangeFileSize / SetEndOfFile: truncates or extends file `file` to `size` bytes
 * (extended bytes read as zeros).
 *
 * # Safety
 * `dds` is NULL or a live handle.
 */
dds_status dds_change_file_size(struct dds_t *dds, dds_file_id file, uint64_t size);

/**
 * DeleteFile: deletes file `file`; its id becomes stale (`DDS_UNKNOWN_FILE`).
 *
 * # Safety
 * `dds` is NULL or a live handle.
 */
dds_status dds_delete_file(struct dds_t *dds, dds_file_id file);

/**
 * Exposes file `file` to the DPU's offload engine (`exposed` non-zero) or withdraws it: only
 * exposed files are read on the DPU for network clients or cached by cache-on-write. Stores
 * in `*engine` (if not NULL) 1 when the DPU runs an offload engine, 0 when it runs none (the
 * call then has no effect).
 *
 * # Safety
 * `dds` is NULL or a live handle; `engine` is NULL or writable.
 */
dds_status dds_expose_file(struct dds_t *dds, dds_file_id file, uint32_t exposed, uint32_t *engine);

/**
 * MoveFile: renames (and possibly moves to another directory) the file `from` to `to`;
 * the file keeps its id. `DDS_EXISTS` if `to` is taken.
 *
 * # Safety
 * `dds` is NULL or a live handle; `from` and `to` are NULL or NUL-terminated strings.
 */
dds_status dds_rename(struct dds_t *dds, const char *from, const char *to);

/**
 * GetStorageFreeSpace: stores the capacity of the file service in `*space`.
 *
 * # Safety
 * `dds` is NULL or a live handle; `space` is NULL or writable.
 */
dds_status dds_free_space(struct dds_t *dds, struct dds_space_info *space);

/**
 * Lists the directory `path` (`"/"` for the root): stores in `*out` an iterator over a
 * snapshot of its entries, to be read with `dds_dir_next` and freed with `dds_dir_close`.
 *
 * # Safety
 * `dds` is NULL or a live handle; `path` is NULL or a NUL-terminated string; `out` is NULL
 * or writable.
 */
dds_status dds_list_directory(struct dds_t *dds, const char *path, struct dds_dir_iter_t **out);

/**
 * Stores the number of entries of the listing in `*count`.
 *
 * # Safety
 * `iter` is NULL or a live iterator; `count` is NULL or writable.
 */
dds_status dds_dir_count(struct dds_dir_iter_t *iter, size_t *count);

/**
 * FindNextFile: stores the next entry in `*entry` and true in `*has_entry`; at the end of
 * the listing stores false in `*has_entry` and leaves `*entry` alone. Entry names stay valid
 * until `dds_dir_close`.
 *
 * # Safety
 * `iter` is NULL or a live iterator used by no other thread; `entry` and `has_entry` are
 * NULL or writable.
 */
dds_status dds_dir_next(struct dds_dir_iter_t *iter, struct dds_dir_entry *entry, bool *has_entry);

/**
 * Frees a directory iterator and the names it returned.
 *
 * # Safety
 * `iter` is NULL or a live iterator used by no other thread during or after this call.
 */
dds_status dds_dir_close(struct dds_dir_iter_t *iter);

/**
 * GetDefaultPoll: stores in `*out` the connection's default group, which receives the
 * completions of every file not moved to another group by `dds_poll_add`. The handle is
 * owned by the connection: it stays valid until `dds_disconnect` and cannot be deleted.
 *
 * # Safety
 * `dds` is NULL or a live handle; `out` is NULL or writable.
 */
dds_status dds_default_group(struct dds_t *dds, struct dds_group_t **out);

/**
 * PollCreate: creates a notification group with its own pair of rings, with the settings
 * in `*config` (NULL = `dds_group_config_default`), and stores it in `*out`.
 *
 * # Safety
 * `dds` is NULL or a live handle; `config` is NULL or a readable `dds_group_config`; `out`
 * is NULL or writable.
 */
dds_status dds_create_group(struct dds_t *dds,
                            const struct dds_group_config *config,
                            struct dds_group_t **out);

/**
 * PollDelete: deletes a group made by `dds_create_group` on this connection and frees its
 * handle (also when the DPU reports an error). Its files go back to the default group;
 * operations still pending in it are abandoned, so their buffers are never written after
 * this returns. The default group cannot be deleted (`DDS_INVALID_ARGUMENT`).
 *
 * # Safety
 * `dds` is NULL or a live handle; `group` is NULL or a group handle that no other thread
 * uses during or after this call.
 */
dds_status dds_delete_group(struct dds_t *dds, struct dds_group_t *group);

/**
 * PollAdd: sends the completions of file `file` to `group` (of this connection), tagged
 * with `file_ctx`. Operations issued before keep completing through the previous group.
 *
 * # Safety
 * `dds` is NULL or a live handle; `group` is NULL or a live group handle.
 */
dds_status dds_poll_add(struct dds_t *dds,
                        dds_file_id file,
                        struct dds_group_t *group,
                        uint64_t file_ctx);

/**
 * PollWait: stores one completed operation of `group` in `*out`. `timeout_us` is how long
 * to wait for one, in microseconds: 0 = non-blocking (return at once), `DDS_WAIT_FOREVER` =
 * until one arrives. While waiting the thread sleeps (no CPU) until the DPU signals the
 * group. Returns `DDS_TIMEOUT` when none arrived in time, and `DDS_DPU_DEAD` once the DPU is
 * gone and every pending operation has been returned (failed with `DDS_DPU_DEAD`). The
 * operation's own outcome is `out->status`. Many threads may wait on one group.
 *
 * # Safety
 * `group` is NULL or a live group handle; `out` is NULL or writable.
 */
dds_status dds_poll_wait(struct dds_group_t *group,
                         struct dds_completion *out,
                         uint64_t timeout_us);

/**
 * PollWait for a batch: waits like `dds_poll_wait` for the first completion, then takes up
 * to `max - 1` more that are ready without waiting. Stores them in `out[0 .. *count]`.
 * Returns `DDS_TIMEOUT` (with `*count` = 0) when none arrived in time.
 *
 * # Safety
 * `group` is NULL or a live group handle; `out` is NULL or `max` writable entries; `count`
 * is NULL or writable.
 */
dds_status dds_poll_wait_many(struct dds_group_t *group,
                              struct dds_completion *out,
                              size_t max,
                              size_t *count,
                              uint64_t timeout_us);

/**
 * Stores the number of operations issued in `group` and not yet returned in `*count`.
 *
 * # Safety
 * `group` is NULL or a live group handle; `count` is NULL or writable.
 */
dds_status dds_group_outstanding(struct dds_group_t *group, size_t *count);

/**
 * ReadFile: issues a read of `len` bytes of file `file` at `offset` into `buf`. Returns at
 * once; the completion (bytes read: short at end of file) is delivered by `dds_poll_wait`
 * on the file's group. `DDS_TOO_MANY_OUTSTANDING` / `DDS_RING_FULL`: poll completions and
 * retry.
 *
 * # Safety
 * `dds` is NULL or a live handle; `buf` is NULL or `len` writable bytes that stay valid
 * and are not otherwise accessed until the completion has been returned by `dds_poll_wait`
 * (or the connection is closed).
 */
dds_status dds_read(struct dds_t *dds,
                    dds_file_id file,
                    uint64_t offset,
                    void *buf,
                    uint32_t len,
                    uint64_t io_ctx);

/**
 * ReadFileScatter: issues a read of the contiguous file range starting at `offset` into the
 * `iovcnt` buffers of `iov` (1 ..= `DDS_IOV_MAX`), filled in order. Completes like
 * `dds_read`. The `iov` array itself may be reused once this returns.
 *
 * # Safety
 * `dds` is NULL or a live handle; `iov` is NULL or `iovcnt` readable entries, each buffer
 * valid as for `dds_read`.
 */
dds_status dds_read_scatter(struct dds_t *dds,
                            dds_file_id file,
                            uint64_t offset,
                            const struct dds_iovec *iov,
                            size_t iovcnt,
                            uint64_t io_ctx);

/**
 * WriteFile: issues a write of `len` bytes from `data` to file `file` at `offset`. The data
 * is copied into the request ring before this returns, so `data` may be reused at once.
 * Completes (bytes written) through `dds_poll_wait` like `dds_read`.
 *
 * # Safety
 * `dds` is NULL or a live handle; `data` is NULL or `len` readable bytes.
 */
dds_status dds_write(struct dds_t *dds,
                     dds_file_id file,
                     uint64_t offset,
                     const void *data,
                     uint32_t len,
                     uint64_t io_ctx);

/**
 * WriteFileGather: issues one write of the `iovcnt` buffers of `iov` (at least one), in
 * order, to the contiguous file range starting at `offset`. The data is copied before this
 * returns. Completes like `dds_write`.
 *
 * # Safety
 * `dds` is NULL or a live handle; `iov` is NULL or `iovcnt` readable entries, each naming
 * readable bytes.
 */
dds_status dds_write_gather(struct dds_t *dds,
                            dds_file_id file,
                            uint64_t offset,
                            const struct dds_const_iovec *iov,
                            size_t iovcnt,
                            uint64_t io_ctx);

/**
 * FlushFileBuffers: issues a flush that completes (through `dds_poll_wait`, 0 bytes) once
 * every write of the file's group acknowledged before it is durable on the device.
 *
 * # Safety
 * `dds` is NULL or a live handle.
 */
dds_status dds_flush(struct dds_t *dds, dds_file_id file, uint64_t io_ctx);

/**
 * Blocking read: reads up to `len` bytes of file `file` at `offset` into `buf` and waits;
 * stores the bytes read (short at end of file) in `*bytes_read` unless it is NULL. The
 * completion is not delivered to `dds_poll_wait`.
 *
 * # Safety
 * `dds` is NULL or a live handle; `buf` is NULL or `len` writable bytes; `bytes_read` is
 * NULL or writable.
 */
dds_status dds_read_sync(struct dds_t *dds,
                         dds_file_id file,
                         uint64_t offset,
                         void *buf,
                         uint32_t len,
                         uint32_t *bytes_read);

/**
 * Blocking write: writes `len` bytes from `data` to file `file` at `offset` and waits;
 * stores the bytes written in `*bytes_written` unless it is NULL.
 *
 * # Safety
 * `dds` is NULL or a live handle; `data` is NULL or `len` readable bytes; `bytes_written`
 * is NULL or writable.
 */
dds_status dds_write_sync(struct dds_t *dds,
                          dds_file_id file,
                          uint64_t offset,
                          const void *data,
                          uint32_t len,
                          uint32_t *bytes_written);

/**
 * Blocking flush: flushes the group of file `file` and waits until the writes acknowledged
 * before are durable.
 *
 * # Safety
 * `dds` is NULL or a live handle.
 */
dds_status dds_flush_sync(struct dds_t *dds, dds_file_id file);

/**
 * The symbolic name of a status code (`"DDS_UNKNOWN_FILE"` for 1), or `"DDS_UNKNOWN_STATUS"`
 * for a code the library does not know. The string is static; never free it.
 */
const char *dds_status_name(dds_status code);

/**
 * A short English description of a status code (`"unknown file id"` for 1). The string is
 * static; never free it.
 */
const char *dds_status_message(dds_status code);

/**
 * The message of the most recent failed `dds_*` call on the calling thread (more detail than
 * `dds_status_message`, e.g. which argument was bad), or `""` when no call failed yet. The
 * pointer stays valid until the next `dds_*` call on the same thread; never free it.
 */
const char *dds_last_error_message(void);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* DDS_H */
