/* Exercises the whole tpurt C ABI through include/tpurt.h, bad inputs
 * included. Built and run by capi/tests/c_api.rs; exits non-zero on the
 * first failed check and prints what failed. */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "tpurt.h"

static int checks = 0;

#define FAIL(...)                                                   \
  do {                                                              \
    fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                 \
    fprintf(stderr, __VA_ARGS__);                                   \
    fprintf(stderr, "\n");                                          \
    exit(1);                                                        \
  } while (0)

/* The call must succeed. */
#define OK(call)                                                            \
  do {                                                                      \
    tpurt_status *s_ = (call);                                              \
    checks++;                                                               \
    if (s_) FAIL("%s failed: %s", #call, tpurt_status_message(s_));         \
  } while (0)

/* The call must fail with `code` and a message containing `needle`. */
#define ERR(call, code, needle)                                                \
  do {                                                                         \
    tpurt_status *s_ = (call);                                                 \
    checks++;                                                                  \
    if (!s_) FAIL("%s succeeded; expected code %d", #call, (int)(code));       \
    if (tpurt_status_code(s_) != (code))                                       \
      FAIL("%s: code %u, expected %d (%s)", #call, tpurt_status_code(s_),      \
           (int)(code), tpurt_status_message(s_));                             \
    if (!strstr(tpurt_status_message(s_), (needle)))                           \
      FAIL("%s: message \"%s\" lacks \"%s\"", #call,                          \
           tpurt_status_message(s_), (needle));                                \
    tpurt_status_destroy(s_);                                                  \
  } while (0)

#define CHECK(cond)                                   \
  do {                                                \
    checks++;                                         \
    if (!(cond)) FAIL("check failed: %s", #cond);     \
  } while (0)

static tpurt_runtime make_runtime(uint32_t chips, uint64_t hbm) {
  tpurt_runtime_options o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.platform = "host";
  o.host_chips = chips;
  o.host_hbm_bytes = hbm;
  o.compile_cache_dir = "off"; /* hermetic: no shared disk cache */
  tpurt_runtime rt;
  OK(tpurt_runtime_create(&o, &rt));
  return rt;
}

static void test_version_and_runtime(void) {
  CHECK(tpurt_abi_version() == TPURT_ABI_VERSION);
  CHECK(strlen(tpurt_version_string()) > 0);
  CHECK(tpurt_status_code(NULL) == TPURT_CODE_OK);

  tpurt_runtime rt = make_runtime(4, 64u << 20);
  uint32_t n = 0;
  OK(tpurt_device_count(rt, &n));
  CHECK(n == 4);
  uint32_t dims[4];
  size_t nd = 0;
  OK(tpurt_runtime_topology(rt, dims, 4, &nd));
  CHECK(nd == 2 && dims[0] == 2 && dims[1] == 2);
  ERR(tpurt_runtime_topology(rt, dims, 1, &nd), TPURT_CODE_INVALID_ARGUMENT, "holds 1");
  char name[16];
  size_t len = 0;
  OK(tpurt_runtime_platform_name(rt, name, sizeof name, &len));
  CHECK(strcmp(name, "host") == 0 && len == 4);

  tpurt_device_properties p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  OK(tpurt_device_get_properties(rt, 3, &p));
  CHECK(p.index == 3 && p.hbm_capacity_bytes == (64u << 20));
  CHECK(p.tensor_cores == 1 && p.sparse_cores == 1);
  CHECK(p.num_coords == 2 && p.coords[0] == 1 && p.coords[1] == 1);
  CHECK(strstr(p.name, "emulated TPU") != NULL);
  CHECK(p.host_chip == 3);
  ERR(tpurt_device_get_properties(rt, 4, &p), TPURT_CODE_NOT_FOUND, "device 4");
  ERR(tpurt_device_get_properties(rt, 0, NULL), TPURT_CODE_INVALID_ARGUMENT, "NULL");
  /* An older caller with a shorter struct: only its part is written. */
  struct {
    size_t struct_size;
    uint32_t index;
    uint32_t guard;
  } small;
  small.struct_size = offsetof(tpurt_device_properties, name);
  small.guard = 0xdeadbeef;
  OK(tpurt_device_get_properties(rt, 2, (tpurt_device_properties *)&small));
  CHECK(small.index == 2 && small.guard == 0xdeadbeef);
  p.struct_size = 0;
  ERR(tpurt_device_get_properties(rt, 0, &p), TPURT_CODE_INVALID_ARGUMENT, "struct_size");

  /* Options: bad platform, bad topology, struct too small. */
  tpurt_runtime_options o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.platform = "cuda";
  tpurt_runtime bad;
  ERR(tpurt_runtime_create(&o, &bad), TPURT_CODE_NOT_FOUND, "platform");
  o.platform = "host";
  o.host_chips = 3;
  o.host_topology = "2x2";
  ERR(tpurt_runtime_create(&o, &bad), TPURT_CODE_INVALID_ARGUMENT, "has 4 chips but 3");
  o.struct_size = 2;
  ERR(tpurt_runtime_create(&o, &bad), TPURT_CODE_INVALID_ARGUMENT, "struct_size");
  ERR(tpurt_runtime_create(NULL, NULL), TPURT_CODE_INVALID_ARGUMENT, "out is NULL");

  OK(tpurt_runtime_destroy(rt));
  ERR(tpurt_runtime_destroy(rt), TPURT_CODE_INVALID_HANDLE, "destroyed already");
  ERR(tpurt_device_count(rt, &n), TPURT_CODE_INVALID_HANDLE, "destroyed already");
  tpurt_runtime null_rt = {0};
  ERR(tpurt_device_count(null_rt, &n), TPURT_CODE_INVALID_HANDLE, "null");
  tpurt_runtime forged = {0x1234};
  ERR(tpurt_device_count(forged, &n), TPURT_CODE_INVALID_HANDLE, "not a tpurt_runtime");
}

static void test_buffers_and_copies(void) {
  tpurt_runtime rt = make_runtime(2, 64u << 20);
  tpurt_stream none = {0};
  tpurt_buffer a, b, c;
  OK(tpurt_buffer_allocate(rt, 0, 6 * sizeof(float), none, &a));
  uint64_t size = 0;
  uint32_t dev = 9;
  OK(tpurt_buffer_get_info(a, &size, &dev));
  CHECK(size == 24 && dev == 0);

  /* Device addresses: non-zero, distinct, ranges disjoint, and an error
     (not a crash) for a bad handle or a NULL output. */
  tpurt_buffer d, e;
  /* Live handles: two more buffers, then back to where they were. */
  tpurt_handle_counts h0 = {.struct_size = sizeof h0}, h1 = {.struct_size = sizeof h1};
  OK(tpurt_handle_counts_get(&h0));
  CHECK(h0.runtimes >= 1 && h0.buffers >= 1);
  OK(tpurt_buffer_allocate(rt, 0, 4096, none, &d));
  OK(tpurt_buffer_allocate(rt, 1, 4096, none, &e));
  OK(tpurt_handle_counts_get(&h1));
  CHECK(h1.buffers == h0.buffers + 2 && h1.streams == h0.streams);
  ERR(tpurt_handle_counts_get(NULL), TPURT_CODE_INVALID_ARGUMENT, "tpurt_handle_counts");
  uint64_t ad = 0, ae = 0, aa = 0;
  OK(tpurt_buffer_get_address(a, &aa));
  OK(tpurt_buffer_get_address(d, &ad));
  OK(tpurt_buffer_get_address(e, &ae));
  CHECK(aa != 0 && ad != 0 && ae != 0);
  CHECK(aa + 24 <= ad || ad + 4096 <= aa);
  CHECK(ad + 4096 <= ae || ae + 4096 <= ad);
  ERR(tpurt_buffer_get_address(d, NULL), TPURT_CODE_INVALID_ARGUMENT, "address");
  OK(tpurt_buffer_free(d));
  OK(tpurt_buffer_free(e));
  OK(tpurt_handle_counts_get(&h1));
  CHECK(h1.buffers == h0.buffers);
  ERR(tpurt_buffer_get_address(d, &ad), TPURT_CODE_INVALID_HANDLE, "");

  /* Contiguous round trip. */
  float host[6] = {1, 2, 3, 4, 5, 6}, back[6] = {0};
  OK(tpurt_copy_host_to_device(host, sizeof host, a, NULL, none, 0));
  OK(tpurt_copy_device_to_host(a, NULL, back, sizeof back, none, 0));
  CHECK(memcmp(host, back, sizeof host) == 0);

  /* Strided: read the 2x3 matrix transposed (3x2, strides 1,3). */
  uint64_t tsizes[2] = {3, 2}, tstrides[2] = {1, 3};
  tpurt_layout t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.ndim = 2;
  t.elem_size = sizeof(float);
  t.sizes = tsizes;
  t.strides = tstrides;
  float tr[6];
  OK(tpurt_copy_device_to_host(a, &t, tr, sizeof tr, none, 0));
  float expect_t[6] = {1, 4, 2, 5, 3, 6};
  CHECK(memcmp(tr, expect_t, sizeof tr) == 0);

  /* Device to device across chips, into a strided destination, async. */
  OK(tpurt_buffer_allocate(rt, 1, 6 * sizeof(float), none, &b));
  tpurt_stream s1;
  tpurt_stream_options so;
  memset(&so, 0, sizeof so);
  so.struct_size = sizeof so;
  so.priority = -1;
  so.core = TPURT_CORE_TENSOR;
  OK(tpurt_stream_create(rt, 1, &so, &s1));
  OK(tpurt_copy_device_to_device(a, &t, b, NULL, s1, TPURT_COPY_ASYNC));
  float b_host[6] = {0};
  OK(tpurt_copy_device_to_host(b, NULL, b_host, sizeof b_host, s1, TPURT_COPY_ASYNC));
  OK(tpurt_stream_synchronize(s1));
  CHECK(memcmp(b_host, expect_t, sizeof b_host) == 0);

  /* Async host-to-device stages its source: overwriting it at once is safe. */
  float src[6] = {9, 9, 9, 9, 9, 9};
  OK(tpurt_copy_host_to_device(src, sizeof src, b, NULL, s1, TPURT_COPY_ASYNC));
  src[0] = -1;
  OK(tpurt_copy_device_to_host(b, NULL, b_host, sizeof b_host, s1, 0));
  CHECK(b_host[0] == 9);

  OK(tpurt_buffer_fill(b, 0, 24, 0, none, 0));
  OK(tpurt_copy_device_to_host(b, NULL, b_host, sizeof b_host, none, 0));
  CHECK(b_host[5] == 0);

  /* Bad inputs: sizes, layouts, flags, NULLs, handles. */
  ERR(tpurt_copy_host_to_device(host, 8, a, NULL, none, 0), TPURT_CODE_INVALID_ARGUMENT, "has 8 bytes");
  ERR(tpurt_copy_host_to_device(NULL, 24, a, NULL, none, 0), TPURT_CODE_INVALID_ARGUMENT, "src is NULL");
  ERR(tpurt_copy_device_to_host(a, NULL, NULL, 24, none, 0), TPURT_CODE_INVALID_ARGUMENT, "dst is NULL");
  ERR(tpurt_copy_host_to_device(host, 24, a, NULL, none, 0x80), TPURT_CODE_INVALID_ARGUMENT, "unknown copy flags");
  uint64_t big_strides[2] = {100, 1};
  t.strides = big_strides;
  ERR(tpurt_copy_device_to_host(a, &t, tr, sizeof tr, none, 0), TPURT_CODE_INVALID_ARGUMENT, "reaches byte");
  t.strides = tstrides;
  t.ndim = 99;
  ERR(tpurt_copy_device_to_host(a, &t, tr, sizeof tr, none, 0), TPURT_CODE_INVALID_ARGUMENT, "ndim is 99");
  t.ndim = 2;
  t.sizes = NULL;
  ERR(tpurt_copy_device_to_host(a, &t, tr, sizeof tr, none, 0), TPURT_CODE_INVALID_ARGUMENT, "sizes is NULL");
  tpurt_buffer wrong = {s1.handle};
  ERR(tpurt_buffer_free(wrong), TPURT_CODE_INVALID_HANDLE, "is a tpurt_stream");
  ERR(tpurt_buffer_allocate(rt, 7, 16, none, &c), TPURT_CODE_NOT_FOUND, "device 7");
  ERR(tpurt_buffer_allocate(rt, 0, 16, s1, &c), TPURT_CODE_INVALID_ARGUMENT, "stream of device 1");

  /* Out of memory is an error with the numbers, never an abort. */
  ERR(tpurt_buffer_allocate(rt, 0, 1ull << 40, none, &c), TPURT_CODE_OUT_OF_MEMORY, "capacity");

  OK(tpurt_buffer_free(a));
  ERR(tpurt_buffer_free(a), TPURT_CODE_INVALID_HANDLE, "destroyed already");
  ERR(tpurt_copy_device_to_host(a, NULL, back, sizeof back, none, 0), TPURT_CODE_INVALID_HANDLE, "destroyed already");
  OK(tpurt_stream_destroy(s1));
  ERR(tpurt_stream_destroy(s1), TPURT_CODE_INVALID_HANDLE, "destroyed already");
  /* Destroying the runtime invalidates its remaining buffers. */
  OK(tpurt_runtime_destroy(rt));
  ERR(tpurt_buffer_free(b), TPURT_CODE_INVALID_HANDLE, "destroyed already");
}

static void test_streams_and_events(void) {
  tpurt_runtime rt = make_runtime(2, 64u << 20);
  tpurt_stream def, tc, sc;
  OK(tpurt_stream_get_default(rt, 0, &def));
  OK(tpurt_stream_create(rt, 0, NULL, &tc));
  tpurt_stream_options so;
  memset(&so, 0, sizeof so);
  so.struct_size = sizeof so;
  so.core = TPURT_CORE_SPARSE;
  OK(tpurt_stream_create(rt, 0, &so, &sc));
  uint32_t dev;
  int32_t prio;
  uint32_t core;
  OK(tpurt_stream_get_info(sc, &dev, &prio, &core));
  CHECK(dev == 0 && prio == 0 && core == TPURT_CORE_SPARSE);
  so.core = 5;
  tpurt_stream bad;
  ERR(tpurt_stream_create(rt, 0, &so, &bad), TPURT_CODE_INVALID_ARGUMENT, "options.core is 5");

  tpurt_event e0, e1, plain;
  OK(tpurt_event_create(rt, TPURT_EVENT_TIMING, &e0));
  OK(tpurt_event_create(rt, TPURT_EVENT_TIMING, &e1));
  OK(tpurt_event_create(rt, 0, &plain));
  ERR(tpurt_event_create(rt, 4, &plain), TPURT_CODE_INVALID_ARGUMENT, "unknown event flags");
  bool done = false;
  OK(tpurt_event_query(plain, &done));
  CHECK(done); /* never recorded: complete */

  /* A chain: tc writes, sc waits on an event, then copies. */
  tpurt_buffer x, y;
  OK(tpurt_buffer_allocate(rt, 0, 1 << 20, tc, &x));
  OK(tpurt_buffer_allocate(rt, 0, 1 << 20, sc, &y));
  OK(tpurt_event_record(e0, tc));
  OK(tpurt_buffer_fill(x, 0, 1 << 20, 7, tc, TPURT_COPY_ASYNC));
  OK(tpurt_event_record(e1, tc));
  OK(tpurt_stream_wait_event(sc, e1));
  OK(tpurt_copy_device_to_device(x, NULL, y, NULL, sc, TPURT_COPY_ASYNC));
  OK(tpurt_buffer_record_stream(x, sc));
  OK(tpurt_stream_wait_stream(def, sc));
  unsigned char probe[4] = {0};
  tpurt_layout l;
  memset(&l, 0, sizeof l);
  uint64_t four = 4;
  l.struct_size = sizeof l;
  l.offset_bytes = (1 << 20) - 4;
  l.ndim = 1;
  l.elem_size = 1;
  l.sizes = &four;
  OK(tpurt_copy_device_to_host(y, &l, probe, 4, def, 0));
  CHECK(probe[0] == 7 && probe[3] == 7);
  OK(tpurt_event_synchronize(e1));
  float ms = -1;
  OK(tpurt_event_elapsed_time(e0, e1, &ms));
  CHECK(ms >= 0);
  ERR(tpurt_event_elapsed_time(plain, e1, &ms), TPURT_CODE_FAILED_PRECONDITION, "without timing");
  OK(tpurt_stream_query(sc, &done));
  OK(tpurt_device_synchronize(rt, 0));
  OK(tpurt_stream_query(sc, &done));
  CHECK(done);
  ERR(tpurt_stream_query(sc, NULL), TPURT_CODE_INVALID_ARGUMENT, "done is NULL");
  ERR(tpurt_event_record(e0, (tpurt_stream){0}), TPURT_CODE_INVALID_HANDLE, "null");

  /* A stream reset without a failure is harmless. */
  OK(tpurt_stream_reset(sc));

  /* Objects of two runtimes don't mix. */
  tpurt_runtime other = make_runtime(1, 16u << 20);
  tpurt_stream os;
  OK(tpurt_stream_create(other, 0, NULL, &os));
  ERR(tpurt_stream_wait_stream(sc, os), TPURT_CODE_INVALID_ARGUMENT, "different runtimes");
  ERR(tpurt_event_record(e0, os), TPURT_CODE_INVALID_ARGUMENT, "different runtime");
  OK(tpurt_runtime_destroy(other));
  ERR(tpurt_stream_synchronize(os), TPURT_CODE_INVALID_HANDLE, "destroyed already");

  OK(tpurt_buffer_free(x));
  OK(tpurt_buffer_free(y));
  OK(tpurt_event_destroy(e0));
  ERR(tpurt_event_destroy(e0), TPURT_CODE_INVALID_HANDLE, "destroyed already");
  OK(tpurt_stream_destroy(def));
  /* The default stream itself lives on. */
  OK(tpurt_stream_get_default(rt, 0, &def));
  OK(tpurt_stream_synchronize(def));
  OK(tpurt_runtime_destroy(rt));
}

static void test_memory_api(void) {
  tpurt_runtime rt = make_runtime(1, 64u << 20);
  tpurt_memory_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  OK(tpurt_memory_get_stats(rt, 0, &st));
  CHECK(st.allocated_bytes.current == 0 && st.capacity_bytes == (64u << 20));
  tpurt_buffer bufs[8];
  for (int i = 0; i < 8; i++) OK(tpurt_buffer_allocate(rt, 0, 3u << 20, (tpurt_stream){0}, &bufs[i]));
  OK(tpurt_memory_get_stats(rt, 0, &st));
  CHECK(st.allocated_bytes.current >= 24u << 20);
  CHECK(st.reserved_bytes.current >= st.allocated_bytes.current);
  CHECK(st.num_alloc == 8);
  /* The host platform's kernels work in the pool: no plugin buffers. */
  CHECK(st.plugin_bytes.current == 0 && st.plugin_bytes.allocated == 0);
  /* A caller built before plugin_bytes existed passes a shorter struct:
     it is filled up to its size and not a byte beyond. */
  {
    tpurt_memory_stats older;
    memset(&older, 0xAB, sizeof older);
    older.struct_size = offsetof(tpurt_memory_stats, plugin_bytes);
    OK(tpurt_memory_get_stats(rt, 0, &older));
    CHECK(older.num_alloc == 8 && older.capacity_bytes == (64u << 20));
    CHECK(older.struct_size == offsetof(tpurt_memory_stats, plugin_bytes));
    CHECK(older.plugin_bytes.current == 0xABABABABABABABABull);
  }
  char *json = NULL;
  OK(tpurt_memory_snapshot(rt, 0, &json));
  CHECK(json && strstr(json, "\"segments\"") && strstr(json, "active_allocated"));
  tpurt_string_free(json);
  ERR(tpurt_memory_snapshot(rt, 0, NULL), TPURT_CODE_INVALID_ARGUMENT, "json is NULL");

  /* OOM names what was asked and what is held. */
  tpurt_buffer big;
  tpurt_status *s = tpurt_buffer_allocate(rt, 0, 48u << 20, (tpurt_stream){0}, &big);
  CHECK(s && tpurt_status_code(s) == TPURT_CODE_OUT_OF_MEMORY);
  const char *m = tpurt_status_message(s);
  CHECK(strstr(m, "allocated") && strstr(m, "reserved") && strstr(m, "capacity"));
  tpurt_status_destroy(s);
  OK(tpurt_memory_get_stats(rt, 0, &st));
  CHECK(st.num_ooms == 1);

  for (int i = 0; i < 8; i++) OK(tpurt_buffer_free(bufs[i]));
  OK(tpurt_memory_get_stats(rt, 0, &st));
  CHECK(st.allocated_bytes.current == 0 && st.reserved_bytes.current > 0);
  uint64_t released = 0;
  OK(tpurt_memory_empty_cache(rt, 0, &released));
  CHECK(released > 0);
  OK(tpurt_memory_get_stats(rt, 0, &st));
  CHECK(st.reserved_bytes.current == 0 && st.allocated_bytes.peak >= 24u << 20);
  OK(tpurt_memory_reset_peak_stats(rt, 0));
  OK(tpurt_memory_get_stats(rt, 0, &st));
  CHECK(st.allocated_bytes.peak == 0);
  OK(tpurt_runtime_destroy(rt));
}

static tpurt_tensor tensor_of(tpurt_buffer b, uint32_t dtype, uint32_t ndim, const uint64_t *sizes,
                              const uint64_t *strides, uint64_t offset) {
  tpurt_tensor t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.buffer = b;
  t.dtype = dtype;
  t.ndim = ndim;
  t.sizes = sizes;
  t.strides = strides;
  t.offset_bytes = offset;
  return t;
}

static tpurt_attr int_attr(const char *name, int64_t v) {
  tpurt_attr a;
  memset(&a, 0, sizeof a);
  a.name = name;
  a.kind = TPURT_ATTR_INT;
  a.int_value = v;
  return a;
}

static void test_ops_modes_graphs_and_cache(void) {
  tpurt_runtime rt = make_runtime(2, 64u << 20);
  tpurt_stream none = {0};
  uint32_t add_id, softmax_id;
  OK(tpurt_op_lookup("add", &add_id));
  OK(tpurt_op_lookup("softmax", &softmax_id));
  ERR(tpurt_op_lookup("softmx", &add_id), TPURT_CODE_NOT_FOUND, "softmax");

  /* x: 2x3 f32; y: the same buffer read transposed as 3x2 (a view). */
  tpurt_buffer bx, bo;
  OK(tpurt_buffer_allocate(rt, 0, 6 * sizeof(float), none, &bx));
  OK(tpurt_buffer_allocate(rt, 0, 6 * sizeof(float), none, &bo));
  float x[6] = {1, 2, 3, 4, 5, 6};
  OK(tpurt_copy_host_to_device(x, sizeof x, bx, NULL, none, 0));
  uint64_t s23[2] = {2, 3}, s32[2] = {3, 2}, st[2] = {1, 3};
  tpurt_tensor tx = tensor_of(bx, TPURT_DTYPE_F32, 2, s23, NULL, 0);
  tpurt_tensor to = tensor_of(bo, TPURT_DTYPE_F32, 2, s23, NULL, 0);

  /* Infer, then launch add(x, x) with alpha = 2 -> 3x. */
  tpurt_tensor_type types[2] = {{TPURT_DTYPE_F32, 2, {2, 3}}, {TPURT_DTYPE_F32, 2, {2, 3}}};
  tpurt_tensor_type out_types[2];
  size_t nout = 0;
  tpurt_attr alpha;
  memset(&alpha, 0, sizeof alpha);
  alpha.name = "alpha";
  alpha.kind = TPURT_ATTR_FLOAT;
  alpha.float_value = 2.0;
  OK(tpurt_op_infer(add_id, types, 2, &alpha, 1, out_types, 2, &nout));
  CHECK(nout == 1 && out_types[0].dtype == TPURT_DTYPE_F32 && out_types[0].sizes[1] == 3);
  tpurt_tensor ins[2] = {tx, tx};
  OK(tpurt_op_launch(rt, add_id, ins, 2, &to, 1, &alpha, 1, none));
  float out[6];
  OK(tpurt_copy_device_to_host(bo, NULL, out, sizeof out, none, 0));
  CHECK(out[0] == 3 && out[5] == 18);

  /* tpurt_op_call: the same add with its output allocated by the call. */
  tpurt_buffer made[2];
  tpurt_tensor_type made_types[2];
  size_t nmade = 0;
  uint64_t made_addr[2] = {0, 0}, addr_check = 1;
  OK(tpurt_op_call(rt, add_id, ins, 2, &alpha, 1, 0, none, made, made_types, made_addr, 2, &nmade));
  CHECK(nmade == 1 && made_types[0].dtype == TPURT_DTYPE_F32 && made_types[0].ndim == 2);
  OK(tpurt_buffer_get_address(made[0], &addr_check));
  CHECK(made_addr[0] == addr_check && addr_check != 0);
  CHECK(made_types[0].sizes[0] == 2 && made_types[0].sizes[1] == 3);
  OK(tpurt_copy_device_to_host(made[0], NULL, out, sizeof out, none, 0));
  CHECK(out[0] == 3 && out[5] == 18);
  OK(tpurt_buffer_free(made[0]));
  ERR(tpurt_op_call(rt, add_id, ins, 2, &alpha, 1, 0, none, made, made_types, NULL, 0, &nmade),
      TPURT_CODE_INVALID_ARGUMENT, "the op has 1 outputs, more than the 0");
  ERR(tpurt_op_call(rt, add_id, ins, 2, &alpha, 1, 7, none, made, made_types, NULL, 2, &nmade),
      TPURT_CODE_NOT_FOUND, "device 7");

  /* A transposed view as input: softmax over dim 0 of x^T equals softmax over rows of x. */
  tpurt_tensor xt = tensor_of(bx, TPURT_DTYPE_F32, 2, s32, st, 0);
  tpurt_tensor ot = tensor_of(bo, TPURT_DTYPE_F32, 2, s32, NULL, 0);
  tpurt_attr dim0 = int_attr("dim", 0);
  OK(tpurt_op_launch(rt, softmax_id, &xt, 1, &ot, 1, &dim0, 1, none));
  OK(tpurt_copy_device_to_host(bo, NULL, out, sizeof out, none, 0));
  /* column 0 of the result is softmax([1,2,3]) */
  CHECK(out[0] > 0.08f && out[0] < 0.1f && out[4] > 0.66f && out[4] < 0.67f);

  /* Errors name the op and the argument. */
  ERR(tpurt_op_launch(rt, add_id, ins, 1, &to, 1, NULL, 0, none), TPURT_CODE_INVALID_ARGUMENT, "add: takes 2 to 3 inputs, got 1");
  tpurt_tensor bad_out = tensor_of(bo, TPURT_DTYPE_F64, 2, s23, NULL, 0);
  ERR(tpurt_op_launch(rt, add_id, ins, 2, &bad_out, 1, NULL, 0, none), TPURT_CODE_INVALID_ARGUMENT, "outputs[0]");
  tpurt_tensor i32x = tensor_of(bx, TPURT_DTYPE_I32, 2, s23, NULL, 0);
  tpurt_tensor mixed[2] = {tx, i32x};
  ERR(tpurt_op_launch(rt, add_id, mixed, 2, &i32x, 1, NULL, 0, none), TPURT_CODE_INVALID_ARGUMENT,
      "add: output 0 is i32[2,3] but must be f32[2,3]");
  ERR(tpurt_op_launch(rt, softmax_id, &tx, 1, &to, 1, NULL, 0, none), TPURT_CODE_INVALID_ARGUMENT,
      "softmax: attribute dim");
  ERR(tpurt_op_launch(rt, 99999, &tx, 1, &to, 1, NULL, 0, none), TPURT_CODE_NOT_FOUND, "op id 99999");
  uint64_t big[2] = {20, 30};
  tpurt_tensor oob = tensor_of(bx, TPURT_DTYPE_F32, 2, big, NULL, 0);
  ERR(tpurt_op_launch(rt, softmax_id, &oob, 1, &to, 1, &dim0, 1, none), TPURT_CODE_INVALID_ARGUMENT, "inputs[0]");
  tpurt_tensor nosizes = tensor_of(bx, TPURT_DTYPE_F32, 2, NULL, NULL, 0);
  ERR(tpurt_op_launch(rt, softmax_id, &nosizes, 1, &to, 1, &dim0, 1, none), TPURT_CODE_INVALID_ARGUMENT, "sizes is NULL");
  tpurt_tensor baddtype = tensor_of(bx, 42, 2, s23, NULL, 0);
  ERR(tpurt_op_launch(rt, softmax_id, &baddtype, 1, &to, 1, &dim0, 1, none), TPURT_CODE_INVALID_ARGUMENT, "dtype code 42");

  /* Modes: get, push debug (a NaN is caught and named), pop. */
  uint32_t mode = 99;
  OK(tpurt_eager_mode_get(&mode));
  CHECK(mode == TPURT_EAGER_DEFER_NEVER);
  OK(tpurt_eager_mode_push(TPURT_EAGER_DEFER_NEVER_AND_LAUNCH_BLOCKING));
  uint32_t log_id;
  OK(tpurt_op_lookup("log", &log_id));
  float neg[6] = {1, -1, 1, 1, 1, 1};
  OK(tpurt_copy_host_to_device(neg, sizeof neg, bx, NULL, none, 0));
  ERR(tpurt_op_launch(rt, log_id, &tx, 1, &to, 1, NULL, 0, none), TPURT_CODE_FAILED_PRECONDITION,
      "log: output 0 holds NaN at position [0, 1]");
  OK(tpurt_eager_mode_pop(&mode));
  CHECK(mode == TPURT_EAGER_DEFER_NEVER_AND_LAUNCH_BLOCKING);
  ERR(tpurt_eager_mode_pop(&mode), TPURT_CODE_FAILED_PRECONDITION, "without a matching push");
  ERR(tpurt_eager_mode_set(7), TPURT_CODE_INVALID_ARGUMENT, "eager mode 7");
  OK(tpurt_op_launch(rt, log_id, &tx, 1, &to, 1, NULL, 0, none)); /* strict: no check */

  /* The precision of f32 products: HIGHEST unless set; an op takes the
     one in force when it is called. 1 + 2^-10 is 1 in bf16, so its square
     is 1 at DEFAULT (operands rounded to bf16) and 1 + 2^-9 + 2^-20 at
     HIGHEST. */
  uint32_t precision = 99;
  OK(tpurt_matmul_precision_get(&precision));
  CHECK(precision == TPURT_PRECISION_HIGHEST);
  uint32_t mm_id;
  OK(tpurt_op_lookup("mm", &mm_id));
  bool reads = false;
  OK(tpurt_op_reads_precision(mm_id, &reads));
  CHECK(reads);
  OK(tpurt_op_reads_precision(add_id, &reads));
  CHECK(!reads);
  ERR(tpurt_op_reads_precision(100000, &reads), TPURT_CODE_NOT_FOUND, "op id 100000");
  float one_ish[6] = {1.0f + 1.0f / 1024, 0, 0, 0, 0, 0};
  OK(tpurt_copy_host_to_device(one_ish, sizeof one_ish, bx, NULL, none, 0));
  uint64_t s22[2] = {2, 2};
  tpurt_tensor mm_in[2] = {tx, tensor_of(bx, TPURT_DTYPE_F32, 2, s32, NULL, 0)};
  tpurt_tensor mm_out = tensor_of(bo, TPURT_DTYPE_F32, 2, s22, NULL, 0);
  float squares[2];
  OK(tpurt_matmul_precision_push(TPURT_PRECISION_DEFAULT));
  OK(tpurt_matmul_precision_get(&precision));
  CHECK(precision == TPURT_PRECISION_DEFAULT);
  OK(tpurt_op_launch(rt, mm_id, mm_in, 2, &mm_out, 1, NULL, 0, none));
  OK(tpurt_copy_device_to_host(bo, NULL, out, sizeof out, none, 0));
  squares[0] = out[0];
  OK(tpurt_matmul_precision_pop(&precision));
  CHECK(precision == TPURT_PRECISION_DEFAULT);
  OK(tpurt_op_launch(rt, mm_id, mm_in, 2, &mm_out, 1, NULL, 0, none));
  OK(tpurt_copy_device_to_host(bo, NULL, out, sizeof out, none, 0));
  squares[1] = out[0];
  CHECK(squares[0] == 1.0f);
  CHECK(squares[1] == (1.0f + 1.0f / 1024) * (1.0f + 1.0f / 1024));
  ERR(tpurt_matmul_precision_pop(&precision), TPURT_CODE_FAILED_PRECONDITION, "without a matching push");
  ERR(tpurt_matmul_precision_set(3), TPURT_CODE_INVALID_ARGUMENT, "matmul precision 3");
  ERR(tpurt_matmul_precision_push(3), TPURT_CODE_INVALID_ARGUMENT, "matmul precision 3");
  ERR(tpurt_matmul_precision_get(NULL), TPURT_CODE_INVALID_ARGUMENT, "precision");
  OK(tpurt_matmul_precision_set(TPURT_PRECISION_HIGH));
  OK(tpurt_matmul_precision_get(&precision));
  CHECK(precision == TPURT_PRECISION_HIGH);
  OK(tpurt_matmul_precision_set(TPURT_PRECISION_HIGHEST));

  /* Compiler options: a JSON object in, the canonical one out. */
  char *copts = NULL;
  OK(tpurt_compiler_options_get(&copts));
  CHECK(strcmp(copts, "{}") == 0);
  tpurt_string_free(copts);
  OK(tpurt_compiler_options_set("{\"xla_b\": 2, \"xla_a\": true}"));
  OK(tpurt_compiler_options_get(&copts));
  CHECK(strcmp(copts, "{\"xla_a\":true,\"xla_b\":2}") == 0);
  tpurt_string_free(copts);
  ERR(tpurt_compiler_options_set("{\"xla_a\": [1]}"), TPURT_CODE_INVALID_ARGUMENT, "compiler option \"xla_a\"");
  ERR(tpurt_compiler_options_set("[1]"), TPURT_CODE_INVALID_ARGUMENT, "JSON object");
  ERR(tpurt_compiler_options_get(NULL), TPURT_CODE_INVALID_ARGUMENT, "json");
  OK(tpurt_compiler_options_set(NULL));
  OK(tpurt_compiler_options_get(&copts));
  CHECK(strcmp(copts, "{}") == 0);
  tpurt_string_free(copts);

  /* Deferred ops wait for a flush; tpurt_stream_flush launches them and
     says how many there were. */
  tpurt_stream def;
  OK(tpurt_stream_get_default(rt, 0, &def));
  OK(tpurt_eager_mode_push(TPURT_EAGER_DEFER_AND_FUSE));
  OK(tpurt_op_launch(rt, add_id, ins, 2, &to, 1, &alpha, 1, none));
  OK(tpurt_op_launch(rt, add_id, ins, 2, &to, 1, &alpha, 1, none));
  size_t launched = 9;
  OK(tpurt_stream_flush(def, &launched));
  CHECK(launched == 2);
  OK(tpurt_stream_flush(def, &launched));
  CHECK(launched == 0);
  OK(tpurt_stream_flush(def, NULL));
  /* A marked step launches them as well (the op limit's way). */
  OK(tpurt_op_launch(rt, add_id, ins, 2, &to, 1, &alpha, 1, none));
  OK(tpurt_stream_mark_step(def, &launched));
  CHECK(launched == 1);
  OK(tpurt_stream_mark_step(def, &launched));
  CHECK(launched == 0);
  OK(tpurt_stream_mark_step(def, NULL));
  OK(tpurt_eager_mode_pop(&mode));
  OK(tpurt_stream_synchronize(def));
  float xs[6];
  OK(tpurt_copy_device_to_host(bx, NULL, xs, sizeof xs, none, 0));
  OK(tpurt_copy_device_to_host(bo, NULL, out, sizeof out, none, 0));
  for (int i = 0; i < 6; i++) CHECK(out[i] == 3 * xs[i]);
  OK(tpurt_stream_destroy(def));
  ERR(tpurt_stream_flush(def, &launched), TPURT_CODE_INVALID_HANDLE, "destroyed already");
  ERR(tpurt_stream_mark_step(def, &launched), TPURT_CODE_INVALID_HANDLE, "destroyed already");

  /* A whole graph in canonical form: z = x * y. */
  const char *graph =
      "{\"params\":[0,1],\"nodes\":[{\"prim\":{\"binary\":\"mul\"},\"inputs\":[0,1],\"outputs\":[2]}],"
      "\"outputs\":[2],\"types\":[{\"dtype\":\"f32\",\"dims\":[2,3]},{\"dtype\":\"f32\",\"dims\":[2,3]},"
      "{\"dtype\":\"f32\",\"dims\":[2,3]}]}";
  tpurt_executable exe;
  OK(tpurt_graph_compile(rt, graph, &exe));
  OK(tpurt_copy_host_to_device(x, sizeof x, bx, NULL, none, 0));
  OK(tpurt_executable_run(exe, ins, 2, &to, 1, none));
  OK(tpurt_copy_device_to_host(bo, NULL, out, sizeof out, none, 0));
  CHECK(out[2] == 9 && out[5] == 36);
  ERR(tpurt_graph_compile(rt, "{\"params\":", &exe), TPURT_CODE_INVALID_ARGUMENT, "not a tpurt graph");
  OK(tpurt_executable_destroy(exe));
  ERR(tpurt_executable_run(exe, ins, 2, &to, 1, none), TPURT_CODE_INVALID_HANDLE, "destroyed already");

  /* The compile cache counted all that; cache-only turns a miss into an error. */
  tpurt_compile_cache_stats cs;
  memset(&cs, 0, sizeof cs);
  cs.struct_size = sizeof cs;
  OK(tpurt_compile_cache_get_stats(rt, &cs));
  CHECK(cs.requests >= 4 && cs.misses >= 4);
  OK(tpurt_compile_cache_set_cache_only(rt, true));
  uint32_t exp_id;
  OK(tpurt_op_lookup("exp", &exp_id));
  ERR(tpurt_op_launch(rt, exp_id, &tx, 1, &to, 1, NULL, 0, none), TPURT_CODE_FAILED_PRECONDITION, "cache");
  OK(tpurt_op_launch(rt, add_id, ins, 2, &to, 1, &alpha, 1, none)); /* cached: fine */
  OK(tpurt_compile_cache_set_cache_only(rt, false));
  OK(tpurt_compile_cache_clear(rt, true, false));

  /* Shape buckets: the policy frontends pad dynamic dimensions by. */
  uint64_t bucket = 0;
  OK(tpurt_compile_cache_bucket(rt, 9, &bucket));
  CHECK(bucket == 16);
  const uint64_t sizes[2] = {128, 32};
  OK(tpurt_compile_cache_set_buckets(rt, TPURT_BUCKETS_SIZES, sizes, 2));
  OK(tpurt_compile_cache_bucket(rt, 33, &bucket));
  CHECK(bucket == 128);
  OK(tpurt_compile_cache_bucket(rt, 200, &bucket));
  CHECK(bucket == 256);
  const uint64_t min = 100;
  OK(tpurt_compile_cache_set_buckets(rt, TPURT_BUCKETS_POWERS_OF_TWO, &min, 1));
  OK(tpurt_compile_cache_bucket(rt, 3, &bucket));
  CHECK(bucket == 128);
  OK(tpurt_compile_cache_set_buckets(rt, TPURT_BUCKETS_EXACT, NULL, 0));
  OK(tpurt_compile_cache_bucket(rt, 37, &bucket));
  CHECK(bucket == 37);
  ERR(tpurt_compile_cache_set_buckets(rt, 7, NULL, 0), TPURT_CODE_INVALID_ARGUMENT, "bucket kind 7");
  ERR(tpurt_compile_cache_set_buckets(rt, TPURT_BUCKETS_SIZES, NULL, 0), TPURT_CODE_INVALID_ARGUMENT,
      "at least one size");
  ERR(tpurt_compile_cache_set_buckets(rt, TPURT_BUCKETS_SIZES, NULL, 3), TPURT_CODE_INVALID_ARGUMENT, "NULL");
  ERR(tpurt_compile_cache_set_buckets(rt, TPURT_BUCKETS_POWERS_OF_TWO, sizes, 2), TPURT_CODE_INVALID_ARGUMENT,
      "one size");
  ERR(tpurt_compile_cache_bucket(rt, 3, NULL), TPURT_CODE_INVALID_ARGUMENT, "out");
  OK(tpurt_compile_cache_set_buckets(rt, TPURT_BUCKETS_POWERS_OF_TWO, NULL, 0));

  OK(tpurt_buffer_free(bx));
  OK(tpurt_buffer_free(bo));
  OK(tpurt_runtime_destroy(rt));
}

/* A process that is one host of a TPU slice (the TPU_* variables TPU VMs,
   GKE and Ray set) sees its visible chips, with slice coordinates. */
static void test_slice_from_environment(void) {
  tpurt_runtime rt = make_runtime(0, 64u << 20);
  tpurt_slice_info si;
  memset(&si, 0xff, sizeof si);
  si.struct_size = sizeof si;
  OK(tpurt_runtime_slice_info(rt, &si));
  CHECK(si.in_slice == 0 && si.visible_chips == 0 && si.name[0] == 0);
  ERR(tpurt_runtime_slice_info(rt, NULL), TPURT_CODE_INVALID_ARGUMENT, "NULL");
  OK(tpurt_runtime_destroy(rt));

  setenv("TPU_NAME", "slice-c", 1);
  setenv("TPU_ACCELERATOR_TYPE", "v4-16", 1);
  setenv("TPU_TOPOLOGY", "2x2x2", 1);
  setenv("TPU_WORKER_ID", "1", 1);
  setenv("TPU_VISIBLE_CHIPS", "2,3", 1);
  rt = make_runtime(0, 64u << 20);
  uint32_t n = 0;
  OK(tpurt_device_count(rt, &n));
  CHECK(n == 2);
  memset(&si, 0, sizeof si);
  si.struct_size = sizeof si;
  OK(tpurt_runtime_slice_info(rt, &si));
  CHECK(si.in_slice == 1 && si.worker_id == 1 && si.num_hosts == 2);
  CHECK(si.host_chips == 4 && si.visible_chips == 2 && si.num_dims == 3);
  CHECK(si.host_bounds[2] == 2 && si.chips_per_host_bounds[0] == 2);
  CHECK(strcmp(si.name, "slice-c") == 0 && strcmp(si.accelerator_type, "v4-16") == 0);
  tpurt_device_properties p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  OK(tpurt_device_get_properties(rt, 1, &p));
  CHECK(p.host_chip == 3 && p.num_coords == 3);
  CHECK(p.coords[0] == 1 && p.coords[1] == 1 && p.coords[2] == 1);
  OK(tpurt_runtime_destroy(rt));

  /* A bad value is an error naming the variable, not a crash. */
  setenv("TPU_VISIBLE_CHIPS", "2,9", 1);
  tpurt_runtime_options o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.platform = "host";
  o.compile_cache_dir = "off";
  ERR(tpurt_runtime_create(&o, &rt), TPURT_CODE_INVALID_ARGUMENT, "TPU_VISIBLE_CHIPS");
  unsetenv("TPU_NAME");
  unsetenv("TPU_ACCELERATOR_TYPE");
  unsetenv("TPU_TOPOLOGY");
  unsetenv("TPU_WORKER_ID");
  unsetenv("TPU_VISIBLE_CHIPS");
}

static void test_profiler(void) {
  tpurt_runtime rt = make_runtime(1, 16u << 20);
  tpurt_stream none = {0};
  uint32_t add_id;
  OK(tpurt_op_lookup("add", &add_id));
  tpurt_buffer bx;
  OK(tpurt_buffer_allocate(rt, 0, 4 * sizeof(float), none, &bx));
  float x[4] = {1, 2, 3, 4};
  OK(tpurt_copy_host_to_device(x, sizeof x, bx, NULL, none, 0));
  uint64_t s4[1] = {4};
  tpurt_tensor tx = tensor_of(bx, TPURT_DTYPE_F32, 1, s4, NULL, 0);
  tpurt_tensor ins[2] = {tx, tx};

  char *json = NULL;
  ERR(tpurt_profiler_stop(&json), TPURT_CODE_FAILED_PRECONDITION, "not recording");
  OK(tpurt_profiler_start());
  ERR(tpurt_profiler_start(), TPURT_CODE_FAILED_PRECONDITION, "already recording");
  OK(tpurt_op_launch(rt, add_id, ins, 2, &tx, 1, NULL, 0, none));
  OK(tpurt_device_synchronize(rt, 0));
  OK(tpurt_profiler_stop(&json));
  /* The add ran as a task of the default stream, its kernel inside it. */
  CHECK(json != NULL && strstr(json, "\"name\":\"add\"") != NULL);
  CHECK(strstr(json, "\"kind\":\"kernel\"") != NULL && strstr(json, "\"dropped\":0") != NULL);
  tpurt_string_free(json);
  /* A NULL out pointer drops the recording. */
  OK(tpurt_profiler_start());
  OK(tpurt_profiler_stop(NULL));
  OK(tpurt_buffer_free(bx));
  OK(tpurt_runtime_destroy(rt));
}

int main(void) {
  test_version_and_runtime();
  test_slice_from_environment();
  test_buffers_and_copies();
  test_streams_and_events();
  test_memory_api();
  test_ops_modes_graphs_and_cache();
  test_profiler();
  printf("C API test: %d checks passed\n", checks);
  return 0;
}
