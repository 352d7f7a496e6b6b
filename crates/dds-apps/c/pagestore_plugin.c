/*
 * The pagestore offload app (docs/pagestore-protocol.md) as a C plugin: READs are offloaded
 * by mapping the request directly to a file read; WRITEs go to the host. A READ that
 * overlaps an earlier WRITE of the same message stays with the host. Per-page cache keys
 * (file id << 40 | page number, 4 KiB pages) are invalidated before a WRITE is forwarded and
 * cached when a host write completes.
 *
 * Build: cc -shared -fPIC -O2 -I include c/pagestore_plugin.c -o libpagestore_plugin.so
 * Test-only switches: -DDDS_TEST_FAULTS (a request with req_id 0xBADBAD makes the predicate
 * return an out-of-range descriptor), -DDDS_TEST_ABI=N (declare ABI version N).
 */
#include "dds_offload.h"

#include <string.h>

#define MSG_HDR 8u
#define REQ_HDR 32u
#define RESP_HDR 24u
#define MSG_MAX (16u << 20)
#define REQS_MAX 1024u
#define IO_MAX (1u << 20)
#define OP_READ 1u
#define OP_WRITE 2u
#define PAGE_SHIFT 12u

#ifndef DDS_TEST_ABI
#define DDS_TEST_ABI DDS_OFFLOAD_ABI_VERSION
#endif

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void wr32(uint8_t *p, uint32_t v) { wr16(p, (uint16_t)v); wr16(p + 2, (uint16_t)(v >> 16)); }
static void wr64(uint8_t *p, uint64_t v) { wr32(p, (uint32_t)v); wr32(p + 4, (uint32_t)(v >> 32)); }
static size_t pad8(size_t n) { return (n + 7u) & ~(size_t)7u; }
static uint64_t page_key(uint32_t file, uint64_t page) {
    return ((uint64_t)file << 40) | (page & ((1ull << 40) - 1));
}

struct req {
    uint8_t op;
    uint32_t file_id;
    uint64_t offset;
    uint32_t len;
    uint64_t req_id;
    size_t size;
};

/* Parses the request at `at`; 0 ok, -1 malformed. */
static int parse_req(const uint8_t *msg, size_t len, size_t at, struct req *r) {
    if (at > len || len - at < REQ_HDR) return -1;
    const uint8_t *h = msg + at;
    r->op = h[0];
    if (r->op != OP_READ && r->op != OP_WRITE) return -1;
    if (h[1] || h[2] || h[3] || rd32(h + 20)) return -1;
    r->file_id = rd32(h + 4);
    r->offset = rd64(h + 8);
    r->len = rd32(h + 16);
    r->req_id = rd64(h + 24);
    if (r->len > IO_MAX) return -1;
    r->size = REQ_HDR + (r->op == OP_WRITE ? pad8(r->len) : 0);
    if (len - at < r->size) return -1;
    return 0;
}

static int32_t message_len(void *user, const uint8_t *buf, size_t len, size_t *out) {
    (void)user;
    if (len < 4) return DDS_FRAME_NEED_MORE;
    uint32_t n = rd32(buf);
    if (n < MSG_HDR + REQ_HDR || n > MSG_MAX) return DDS_FRAME_MALFORMED;
    *out = n;
    return DDS_FRAME_OK;
}

static int32_t response_len(void *user, const uint8_t *buf, size_t len, size_t *out) {
    (void)user;
    if (len < 4) return DDS_FRAME_NEED_MORE;
    uint32_t n = rd32(buf);
    if (n < RESP_HDR || n > RESP_HDR + IO_MAX || (n & 7u)) return DDS_FRAME_MALFORMED;
    *out = n;
    return DDS_FRAME_OK;
}

/* 1 if any page of the read is masked by an unanswered earlier WRITE of the connection. */
static int any_masked(const dds_cache_view *cache, const struct req *r) {
    uint64_t first = r->offset >> PAGE_SHIFT;
    uint64_t end = ((r->offset + (r->len ? r->len : 1) - 1) >> PAGE_SHIFT) + 1;
    for (uint64_t p = first; p < end; p++)
        if (cache->masked(cache->ctx, page_key(r->file_id, p))) return 1;
    return 0;
}

static int overlaps(const struct req *w, const struct req *r) {
    return w->file_id == r->file_id && w->offset < r->offset + r->len &&
           r->offset < w->offset + w->len;
}

static int32_t predicate(void *user, const uint8_t *msg, size_t len, const dds_cache_view *cache,
                         dds_req_list *host, dds_req_list *dpu) {
    (void)user;
    size_t n;
    if (message_len(NULL, msg, len, &n) != DDS_FRAME_OK || n != len) return -1;
    uint32_t count = (uint32_t)msg[4] | (uint32_t)msg[5] << 8;
    if (count == 0 || count > REQS_MAX || msg[6] || msg[7]) return -1;
    size_t at = MSG_HDR;
    int writes = 0;
    for (uint32_t pos = 0; pos < count; pos++) {
        struct req r;
        if (parse_req(msg, len, at, &r)) return -1;
        int offload = r.op == OP_READ && !any_masked(cache, &r);
        if (offload && writes) {
            size_t at2 = MSG_HDR;
            while (at2 < at) {
                struct req w;
                if (parse_req(msg, len, at2, &w)) return -1;
                if (w.op == OP_WRITE && overlaps(&w, &r)) { offload = 0; break; }
                at2 += w.size;
            }
        }
        if (r.op == OP_WRITE) writes = 1;
        dds_req_list *l = offload ? dpu : host;
        if (l->len >= l->capacity) return -1;
        dds_req_desc d = {(uint32_t)at, (uint32_t)r.size, pos};
#ifdef DDS_TEST_FAULTS
        if (r.req_id == 0xBADBADu) d.offset = 0xFFFFFF00u;
#endif
        l->items[l->len++] = d;
        at += r.size;
    }
    return at == len ? 0 : -1;
}

static int32_t offload_function(void *user, const uint8_t *msg, size_t len, dds_req_desc req,
                                const dds_cache_view *cache, dds_read_op *out) {
    (void)user;
    struct req r;
    if (parse_req(msg, len, req.offset, &r) || r.op != OP_READ || any_masked(cache, &r)) return 0;
    out->file_id = r.file_id;
    out->size = r.len;
    out->offset = r.offset;
    return 1;
}

static int32_t build_response(void *user, const uint8_t *head, size_t head_len,
                              const dds_read_op *op, int64_t result, uint8_t *room,
                              size_t room_len, uint8_t *data, size_t data_len,
                              uint32_t *header_len, uint32_t *total_len) {
    (void)user;
    (void)op;
    if (head_len < REQ_HDR || room_len < RESP_HDR) return -1;
    uint16_t status = result < 0 ? (uint16_t)(-result) : 0;
    size_t n = result < 0 ? 0 : (size_t)result;
    size_t padded = pad8(n);
    if (padded > data_len) return -1;
    memset(data + n, 0, padded - n);
    uint8_t *h = room + room_len - RESP_HDR;
    memset(h, 0, RESP_HDR);
    wr32(h, (uint32_t)(RESP_HDR + padded));
    wr16(h + 4, status);
    wr16(h + 6, OP_READ);
    wr64(h + 8, rd64(head + 24));
    wr32(h + 16, (uint32_t)n);
    *header_len = RESP_HDR;
    *total_len = (uint32_t)(RESP_HDR + padded);
    return 0;
}

static int64_t build_host_message(void *user, const uint8_t *msg, size_t len,
                                  const dds_req_desc *host, size_t n, uint8_t *out,
                                  size_t out_len) {
    (void)user;
    size_t at = MSG_HDR;
    if (n == 0 || out_len < MSG_HDR) return -1;
    for (size_t i = 0; i < n; i++) {
        size_t s = host[i].offset, l = host[i].len;
        if (s > len || len - s < l || out_len - at < l) return -1;
        memcpy(out + at, msg + s, l);
        at += l;
    }
    wr32(out, (uint32_t)at);
    wr16(out + 4, (uint16_t)n);
    wr16(out + 6, 0);
    return (int64_t)at;
}

static void push_pages(uint32_t file, uint64_t offset, uint64_t len, dds_key_list *keys) {
    uint64_t first = offset >> PAGE_SHIFT;
    uint64_t end = ((offset + (len ? len : 1) - 1) >> PAGE_SHIFT) + 1;
    for (uint64_t p = first; p < end && keys->len < keys->capacity; p++)
        keys->items[keys->len++] = page_key(file, p);
}

static void invalidate_on_forward(void *user, const uint8_t *msg, size_t len, dds_req_desc req,
                                  dds_key_list *keys) {
    (void)user;
    struct req r;
    if (parse_req(msg, len, req.offset, &r) || r.op != OP_WRITE) return;
    push_pages(r.file_id, r.offset, r.len, keys);
}

static void cache_on_write(void *user, uint32_t file, uint64_t offset, const uint8_t *data,
                           size_t len, dds_item_list *items) {
    (void)user;
    (void)data;
    uint64_t first = offset >> PAGE_SHIFT;
    uint64_t end = len ? ((offset + len - 1) >> PAGE_SHIFT) + 1 : first;
    for (uint64_t p = first; p < end && items->len < items->capacity; p++) {
        dds_cache_item *it = &items->items[items->len++];
        it->key = page_key(file, p);
        it->version = 0;
        it->offset = p << PAGE_SHIFT;
        it->tag = 0;
        it->file_id = file;
        it->size = 1u << PAGE_SHIFT;
    }
}

const dds_offload_plugin_v1_t dds_offload_plugin_v1 = {
    .abi_version = DDS_TEST_ABI,
    .header_room = RESP_HDR,
    .name = "pagestore-c",
    .max_message_len = MSG_MAX,
    .max_response_len = RESP_HDR + IO_MAX,
    .max_requests = REQS_MAX,
    .max_forward_keys = (MSG_MAX >> PAGE_SHIFT) + 2 * REQS_MAX,
    .max_write_items = ((64u << 20) >> PAGE_SHIFT) + 2,
    .max_read_keys = 1,
    .user = 0,
    .message_len = message_len,
    .response_len = response_len,
    .offload_predicate = predicate,
    .offload_function = offload_function,
    .build_response = build_response,
    .build_host_message = build_host_message,
    .invalidate_on_forward = invalidate_on_forward,
    .cache_on_write = cache_on_write,
    .invalidate_on_read = 0,
};
