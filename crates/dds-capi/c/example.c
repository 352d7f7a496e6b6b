/*
 * A tour of the DDS C API: connect, create a directory and a file, write with WriteFile-style
 * calls and a gather write, read back with plain and scatter reads through a notification
 * group, flush, and check every byte; then the same through a registered buffer, which the DPU
 * reads and writes by DMA (no copy by the library).
 *
 * Usage: example [SOCKET]   (default: the DPU's default socket)
 * Exits 0 when everything matched, 1 otherwise.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dds.h"

#define CHECK(call)                                                                    \
    do {                                                                               \
        dds_status rc_ = (call);                                                       \
        if (rc_ != DDS_OK) {                                                           \
            fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call, \
                    dds_status_name(rc_), dds_last_error_message());                   \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

enum { PAGE = 4096, FILE_BYTES = 3 * PAGE, TAIL_BYTES = 512 };

static const uint64_t FILE_CTX = 0xF11E;
/* How long each sleeping poll-wait may take at most (5 s). */
static const uint64_t WAIT_US = 5u * 1000u * 1000u;

static uint8_t expected[FILE_BYTES + TAIL_BYTES];

/* Waits (sleeping) for one completion of `group` and checks its contexts and result. */
static dds_completion wait_one(dds_group_t *group, uint64_t io_ctx_min, uint64_t io_ctx_max) {
    dds_completion c;
    CHECK(dds_poll_wait(group, &c, WAIT_US));
    EXPECT(c.file_ctx == FILE_CTX, "file_ctx %" PRIx64, c.file_ctx);
    EXPECT(c.io_ctx >= io_ctx_min && c.io_ctx <= io_ctx_max, "io_ctx %" PRIu64, c.io_ctx);
    EXPECT(c.status == DDS_OK, "io %" PRIu64 ": %s", c.io_ctx, dds_status_name(c.status));
    return c;
}

int main(int argc, char **argv) {
    const char *socket = argc > 1 ? argv[1] : NULL;
    for (size_t i = 0; i < sizeof expected; i++) {
        expected[i] = (uint8_t)(i * 7 + i / 251 + 1);
    }

    dds_t *dds = NULL;
    CHECK(dds_connect(socket, &dds));
    dds_info info;
    CHECK(dds_get_info(dds, &info));
    EXPECT(info.max_io_bytes >= FILE_BYTES, "max_io_bytes %" PRIu32, info.max_io_bytes);

    /* CreateDirectory + CreateFile (idempotent, so the example can run twice). */
    dds_status rc = dds_create_directory(dds, "/example");
    EXPECT(rc == DDS_OK || rc == DDS_EXISTS, "create_directory: %s", dds_status_name(rc));
    dds_file_info file;
    CHECK(dds_open_or_create_file(dds, "/example/data.bin", &file));
    CHECK(dds_change_file_size(dds, file.id, 0));

    /* PollCreate + PollAdd: the file's completions go to our own group. */
    dds_group_config gcfg;
    CHECK(dds_group_config_default(&gcfg));
    gcfg.max_outstanding = 64;
    dds_group_t *group = NULL;
    CHECK(dds_create_group(dds, &gcfg, &group));
    CHECK(dds_poll_add(dds, file.id, group, FILE_CTX));

    /* WriteFile x2 and WriteFileGather x1, all in flight at once. */
    CHECK(dds_write(dds, file.id, 0, expected, PAGE, 1));
    CHECK(dds_write(dds, file.id, PAGE, expected + PAGE, PAGE, 2));
    dds_const_iovec gather[3] = {
        {expected + 2 * PAGE, 1000},
        {expected + 2 * PAGE + 1000, 3000},
        {expected + 2 * PAGE + 4000, PAGE - 4000},
    };
    CHECK(dds_write_gather(dds, file.id, 2 * PAGE, gather, 3, 3));
    unsigned seen = 0;
    uint64_t written = 0;
    for (int i = 0; i < 3; i++) {
        dds_completion c = wait_one(group, 1, 3);
        EXPECT(!(seen & (1u << c.io_ctx)), "io %" PRIu64 " completed twice", c.io_ctx);
        EXPECT(c.bytes == PAGE, "io %" PRIu64 " wrote %" PRIu32, c.io_ctx, c.bytes);
        seen |= 1u << c.io_ctx;
        written += c.bytes;
    }

    /* FlushFileBuffers. */
    CHECK(dds_flush(dds, file.id, 4));
    dds_completion fc = wait_one(group, 4, 4);
    EXPECT(fc.bytes == 0, "flush bytes %" PRIu32, fc.bytes);

    /* ReadFile and ReadFileScatter, harvested with non-blocking and sleeping poll-waits. */
    static uint8_t plain[PAGE], s0[100], s1[5000], s2[2 * PAGE - 5100];
    dds_iovec scatter[3] = {{s0, sizeof s0}, {s1, sizeof s1}, {s2, sizeof s2}};
    CHECK(dds_read(dds, file.id, 0, plain, PAGE, 10));
    CHECK(dds_read_scatter(dds, file.id, PAGE, scatter, 3, 11));
    dds_completion got[2];
    size_t n = 0;
    unsigned long empty_polls = 0;
    dds_completion c;
    while ((rc = dds_poll_wait(group, &c, 0)) == DDS_TIMEOUT) {
        empty_polls++; /* non-blocking mode: nothing ready yet */
    }
    CHECK(rc);
    got[n++] = c;
    size_t more = 0;
    CHECK(dds_poll_wait_many(group, &got[n], 2 - n, &more, WAIT_US));
    n += more;
    EXPECT(n == 2, "%zu read completions", n);
    uint64_t read_back = 0;
    for (size_t i = 0; i < n; i++) {
        EXPECT(got[i].status == DDS_OK, "read %" PRIu64 ": %s", got[i].io_ctx,
               dds_status_name(got[i].status));
        EXPECT(got[i].file_ctx == FILE_CTX, "file_ctx %" PRIx64, got[i].file_ctx);
        uint32_t want = got[i].io_ctx == 10 ? PAGE : 2 * PAGE;
        EXPECT(got[i].io_ctx == 10 || got[i].io_ctx == 11, "io_ctx %" PRIu64, got[i].io_ctx);
        EXPECT(got[i].bytes == want, "read %" PRIu64 ": %" PRIu32 " bytes", got[i].io_ctx,
               got[i].bytes);
        read_back += got[i].bytes;
    }
    EXPECT(memcmp(plain, expected, PAGE) == 0, "plain read differs");
    EXPECT(memcmp(s0, expected + PAGE, sizeof s0) == 0, "scatter buffer 0 differs");
    EXPECT(memcmp(s1, expected + PAGE + sizeof s0, sizeof s1) == 0, "scatter buffer 1 differs");
    EXPECT(memcmp(s2, expected + PAGE + sizeof s0 + sizeof s1, sizeof s2) == 0,
           "scatter buffer 2 differs");

    /* Blocking convenience calls: append a tail, read across the end of file (short read). */
    uint32_t done = 0;
    CHECK(dds_write_sync(dds, file.id, FILE_BYTES, expected + FILE_BYTES, TAIL_BYTES, &done));
    EXPECT(done == TAIL_BYTES, "blocking write %" PRIu32, done);
    written += done;
    uint8_t tail[2 * TAIL_BYTES];
    CHECK(dds_read_sync(dds, file.id, FILE_BYTES, tail, sizeof tail, &done));
    EXPECT(done == TAIL_BYTES, "short read %" PRIu32, done);
    EXPECT(memcmp(tail, expected + FILE_BYTES, TAIL_BYTES) == 0, "blocking read differs");
    read_back += done;
    CHECK(dds_flush_sync(dds, file.id));

    /* GetFileSize, directory listing, free space. */
    uint64_t size = 0;
    CHECK(dds_get_file_size(dds, file.id, &size));
    EXPECT(size == FILE_BYTES + TAIL_BYTES, "size %" PRIu64, size);
    dds_dir_iter_t *it = NULL;
    CHECK(dds_list_directory(dds, "/example", &it));
    dds_dir_entry e;
    bool has = false;
    int found = 0;
    for (;;) {
        CHECK(dds_dir_next(it, &e, &has));
        if (!has) {
            break;
        }
        if (e.kind == DDS_ENTRY_FILE && strcmp(e.name, "data.bin") == 0) {
            EXPECT(e.id == file.id && e.size == size, "listed id %" PRIu32 " size %" PRIu64,
                   e.id, e.size);
            found = 1;
        }
    }
    CHECK(dds_dir_close(it));
    EXPECT(found, "data.bin not listed");
    dds_space_info space;
    CHECK(dds_free_space(dds, &space));

    /* Registered buffer: writes are taken from it and reads land in it by DMA. */
    dds_buffer_t *rbuf = NULL;
    CHECK(dds_register_buffer(dds, 4 * PAGE, &rbuf));
    void *rdata = NULL;
    size_t rlen = 0;
    CHECK(dds_buffer_data(rbuf, &rdata, &rlen));
    EXPECT(rdata != NULL && rlen == 4 * PAGE, "registered buffer of %zu bytes", rlen);
    uint8_t *rb = rdata;
    memcpy(rb + PAGE, expected, PAGE);
    CHECK(dds_write_registered(dds, file.id, 0, rbuf, PAGE, PAGE, 20));
    dds_completion rc20 = wait_one(group, 20, 20);
    EXPECT(rc20.bytes == PAGE, "registered write %" PRIu32, rc20.bytes);
    CHECK(dds_read_registered(dds, file.id, PAGE, rbuf, 2 * PAGE, PAGE, 21));
    dds_completion rc21 = wait_one(group, 21, 21);
    EXPECT(rc21.bytes == PAGE, "registered read %" PRIu32, rc21.bytes);
    EXPECT(memcmp(rb + 2 * PAGE, expected + PAGE, PAGE) == 0, "registered read differs");
    memcpy(rb, expected + 2 * PAGE, PAGE);
    CHECK(dds_write_registered_sync(dds, file.id, 2 * PAGE, rbuf, 0, PAGE, &done));
    EXPECT(done == PAGE, "blocking registered write %" PRIu32, done);
    memset(rb, 0, 4 * PAGE);
    CHECK(dds_read_registered_sync(dds, file.id, 0, rbuf, 0, 3 * PAGE, &done));
    EXPECT(done == 3 * PAGE, "blocking registered read %" PRIu32, done);
    EXPECT(memcmp(rb, expected, 3 * PAGE) == 0, "blocking registered read differs");
    rc = dds_read_registered(dds, file.id, 0, rbuf, 3 * PAGE + 1, PAGE, 22);
    EXPECT(rc == DDS_BUFFER_RANGE, "range outside the buffer: %s", dds_status_name(rc));
    CHECK(dds_unregister_buffer(dds, rbuf));

    /* Errors are codes, not crashes. */
    dds_file_info none;
    rc = dds_stat(dds, 0xFFFFFFF0u, &none);
    EXPECT(rc == DDS_UNKNOWN_FILE, "stat of a bad id: %s", dds_status_name(rc));
    rc = dds_read(NULL, file.id, 0, plain, PAGE, 0);
    EXPECT(rc == DDS_INVALID_ARGUMENT, "NULL handle: %s", dds_status_name(rc));

    CHECK(dds_delete_group(dds, group));
    CHECK(dds_disconnect(dds));

    printf("wrote %" PRIu64 " bytes (2 writes, 1 gather write, 1 blocking write)\n", written);
    printf("read back %" PRIu64 " bytes (plain, scatter, blocking read); all bytes match\n",
           read_back);
    printf("file /example/data.bin: id %" PRIu32 ", %" PRIu64 " bytes; %" PRIu64
           " of %" PRIu64 " bytes free\n",
           file.id, size, space.free_bytes, space.total_bytes);
    printf("non-blocking polls that found nothing: %lu\n", empty_polls);
    printf("stat of an unknown id: %s\n", dds_status_name(DDS_UNKNOWN_FILE));
    printf("registered buffer: 2 writes and 2 reads by DMA, all bytes match; outside it: %s\n",
           dds_status_name(DDS_BUFFER_RANGE));
    printf("dds example: OK\n");
    return 0;
}
