/* The main job, for now: a tour of the emulated TPU through the C ABI --
 * devices, HBM pools, streams and events -- as a C/C++ frontend sees it.
 * Built and run by `make run` (see the README). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpurt.h"

#define CHECK(call)                                                    \
  do {                                                                 \
    tpurt_status *s_ = (call);                                         \
    if (s_) {                                                          \
      fprintf(stderr, "%s failed: %s\n", #call, tpurt_status_message(s_)); \
      tpurt_status_destroy(s_);                                        \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

static void print_stats(tpurt_runtime rt, uint32_t dev, const char *when) {
  tpurt_memory_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(tpurt_memory_get_stats(rt, dev, &st));
  printf("  %-28s allocated %8.2f MiB (peak %8.2f)  reserved %8.2f MiB  segments %llu\n", when,
         mib(st.allocated_bytes.current), mib(st.allocated_bytes.peak), mib(st.reserved_bytes.current),
         (unsigned long long)st.num_segments);
}

int main(void) {
  printf("tpurt %s, C ABI %u\n", tpurt_version_string(), tpurt_abi_version());

  tpurt_runtime rt;
  CHECK(tpurt_runtime_create(NULL, &rt)); /* defaults: TPURT_* env, else host 2x2 */
  char platform[32];
  size_t len;
  CHECK(tpurt_runtime_platform_name(rt, platform, sizeof platform, &len));
  uint32_t dims[4];
  size_t nd;
  CHECK(tpurt_runtime_topology(rt, dims, 4, &nd));
  uint32_t n;
  CHECK(tpurt_device_count(rt, &n));
  printf("platform %s, %u devices in a ", platform, n);
  for (size_t i = 0; i < nd; i++) printf(i ? "x%u" : "%u", dims[i]);
  printf(" mesh\n");
  for (uint32_t d = 0; d < n; d++) {
    tpurt_device_properties p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    CHECK(tpurt_device_get_properties(rt, d, &p));
    printf("  tpu:%u  %s  HBM %.0f GiB  TensorCores %u  SparseCores %u  coords (", d, p.name,
           (double)p.hbm_capacity_bytes / (1u << 30), p.tensor_cores, p.sparse_cores);
    for (uint32_t i = 0; i < p.num_coords; i++) printf(i ? ",%u" : "%u", p.coords[i]);
    printf(")\n");
  }

  /* Pipeline on tpu:0: the TensorCore stream fills a buffer, the SparseCore
   * stream waits on an event and copies it to tpu:1, timed by events. */
  printf("\nstreams and events on tpu:0 -> tpu:1\n");
  const uint64_t bytes = 64u << 20;
  tpurt_stream tc, sc;
  tpurt_stream_options so;
  memset(&so, 0, sizeof so);
  so.struct_size = sizeof so;
  so.core = TPURT_CORE_TENSOR;
  CHECK(tpurt_stream_create(rt, 0, &so, &tc));
  so.core = TPURT_CORE_SPARSE;
  CHECK(tpurt_stream_create(rt, 1, &so, &sc));
  tpurt_event start, filled, copied;
  CHECK(tpurt_event_create(rt, TPURT_EVENT_TIMING, &start));
  CHECK(tpurt_event_create(rt, TPURT_EVENT_TIMING, &filled));
  CHECK(tpurt_event_create(rt, TPURT_EVENT_TIMING, &copied));
  print_stats(rt, 0, "tpu:0 before");
  tpurt_buffer a, b;
  CHECK(tpurt_buffer_allocate(rt, 0, bytes, tc, &a));
  CHECK(tpurt_buffer_allocate(rt, 1, bytes, sc, &b));
  CHECK(tpurt_event_record(start, tc));
  CHECK(tpurt_buffer_fill(a, 0, bytes, 0x2a, tc, TPURT_COPY_ASYNC));
  CHECK(tpurt_event_record(filled, tc));
  CHECK(tpurt_stream_wait_event(sc, filled));
  CHECK(tpurt_copy_device_to_device(a, NULL, b, NULL, sc, TPURT_COPY_ASYNC));
  CHECK(tpurt_event_record(copied, sc));
  CHECK(tpurt_buffer_record_stream(a, sc)); /* a is read on sc: free it only after */
  print_stats(rt, 0, "tpu:0 with 64 MiB live");
  CHECK(tpurt_event_synchronize(copied));
  float fill_ms, copy_ms;
  CHECK(tpurt_event_elapsed_time(start, filled, &fill_ms));
  CHECK(tpurt_event_elapsed_time(filled, copied, &copy_ms));
  unsigned char last;
  tpurt_layout one;
  uint64_t one_size = 1;
  memset(&one, 0, sizeof one);
  one.struct_size = sizeof one;
  one.offset_bytes = bytes - 1;
  one.ndim = 1;
  one.elem_size = 1;
  one.sizes = &one_size;
  CHECK(tpurt_copy_device_to_host(b, &one, &last, 1, sc, 0));
  printf("  fill 64 MiB on tpu:0 TensorCore: %7.2f ms (%.1f GB/s)\n", fill_ms, bytes / (fill_ms * 1e6));
  printf("  copy to tpu:1 after the event:   %7.2f ms (%.1f GB/s); last byte 0x%02x\n", copy_ms,
         bytes / (copy_ms * 1e6), last);

  /* Freed memory stays cached in the pool and is reused without the OS. */
  CHECK(tpurt_buffer_free(a));
  CHECK(tpurt_device_synchronize(rt, 1));
  print_stats(rt, 0, "tpu:0 after free (cached)");
  CHECK(tpurt_buffer_allocate(rt, 0, bytes, tc, &a));
  print_stats(rt, 0, "tpu:0 same size again");
  CHECK(tpurt_buffer_free(a));
  uint64_t released;
  CHECK(tpurt_memory_empty_cache(rt, 0, &released));
  print_stats(rt, 0, "tpu:0 after empty_cache");

  /* Bad input is an error with a message, never a crash. */
  printf("\nerrors are statuses:\n");
  tpurt_buffer huge;
  tpurt_status *s = tpurt_buffer_allocate(rt, 0, 1ull << 40, tc, &huge);
  printf("  allocate 1 TiB -> code %u: %s\n", tpurt_status_code(s), tpurt_status_message(s));
  tpurt_status_destroy(s);
  s = tpurt_buffer_free(a);
  printf("  free twice      -> code %u: %s\n", tpurt_status_code(s), tpurt_status_message(s));
  tpurt_status_destroy(s);

  /* Ops in the three eager modes: y = layer_norm(gelu(x + b) + x). */
  printf("\nops on tpu:0 (bias + GELU + residual + layer_norm, 1024x1024 f32), 5 steps per mode\n");
  {
    const uint64_t rows = 1024, cols = 1024;
    uint64_t xs[2] = {rows, cols}, bs[1] = {cols};
    float *host = malloc(rows * cols * sizeof(float));
    for (uint64_t i = 0; i < rows * cols; i++) host[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    tpurt_buffer bx, bb, bh, bg, by, bo, bm, br;
    CHECK(tpurt_buffer_allocate(rt, 0, rows * cols * 4, tc, &bx));
    CHECK(tpurt_buffer_allocate(rt, 0, cols * 4, tc, &bb));
    CHECK(tpurt_copy_host_to_device(host, rows * cols * 4, bx, NULL, tc, 0));
    CHECK(tpurt_copy_host_to_device(host, cols * 4, bb, NULL, tc, 0));
    uint32_t add, gelu, ln;
    CHECK(tpurt_op_lookup("add", &add));
    CHECK(tpurt_op_lookup("gelu", &gelu));
    CHECK(tpurt_op_lookup("layer_norm", &ln));
    tpurt_tensor t_x, t_b, t_h, t_g, t_y, t_o, t_m, t_r;
    uint64_t ms[2] = {rows, 1};
#define TENSOR(T, B, N, S)                  \
    memset(&T, 0, sizeof T);               \
    T.struct_size = sizeof T;              \
    T.buffer = B;                          \
    T.dtype = TPURT_DTYPE_F32;             \
    T.ndim = N;                            \
    T.sizes = S;
    TENSOR(t_x, bx, 2, xs);
    TENSOR(t_b, bb, 1, bs);
    int64_t nshape[1] = {(int64_t)cols};
    tpurt_attr ln_attr;
    memset(&ln_attr, 0, sizeof ln_attr);
    ln_attr.name = "normalized_shape";
    ln_attr.kind = TPURT_ATTR_INTS;
    ln_attr.ints = nshape;
    ln_attr.count = 1;
    const char *names[3] = {"DEFER_NEVER (strict)", "DEFER_NEVER_AND_LAUNCH_BLOCKING (debug)", "DEFER_AND_FUSE"};
    uint32_t modes[3] = {TPURT_EAGER_DEFER_NEVER, TPURT_EAGER_DEFER_NEVER_AND_LAUNCH_BLOCKING, TPURT_EAGER_DEFER_AND_FUSE};
    for (int m = 0; m < 3; m++) {
      CHECK(tpurt_eager_mode_push(modes[m]));
      /* Defer-and-fuse's steps under the profiler: each step's flush is one task. */
      if (m == 2) CHECK(tpurt_profiler_start());
      float total = 0;
      for (int step = 0; step < 5; step++) {
        tpurt_event e0, e1;
        CHECK(tpurt_event_create(rt, TPURT_EVENT_TIMING, &e0));
        CHECK(tpurt_event_create(rt, TPURT_EVENT_TIMING, &e1));
        CHECK(tpurt_event_record(e0, tc));
        CHECK(tpurt_buffer_allocate(rt, 0, rows * cols * 4, tc, &bh));
        CHECK(tpurt_buffer_allocate(rt, 0, rows * cols * 4, tc, &bg));
        CHECK(tpurt_buffer_allocate(rt, 0, rows * cols * 4, tc, &by));
        CHECK(tpurt_buffer_allocate(rt, 0, rows * cols * 4, tc, &bo));
        CHECK(tpurt_buffer_allocate(rt, 0, rows * 4, tc, &bm));
        CHECK(tpurt_buffer_allocate(rt, 0, rows * 4, tc, &br));
        TENSOR(t_h, bh, 2, xs);
        TENSOR(t_g, bg, 2, xs);
        TENSOR(t_y, by, 2, xs);
        TENSOR(t_o, bo, 2, xs);
        TENSOR(t_m, bm, 2, ms);
        TENSOR(t_r, br, 2, ms);
        tpurt_tensor in1[2] = {t_x, t_b}, in3[2] = {t_g, t_x}, outs[3] = {t_o, t_m, t_r};
        CHECK(tpurt_op_launch(rt, add, in1, 2, &t_h, 1, NULL, 0, tc));
        CHECK(tpurt_op_launch(rt, gelu, &t_h, 1, &t_g, 1, NULL, 0, tc));
        CHECK(tpurt_op_launch(rt, add, in3, 2, &t_y, 1, NULL, 0, tc));
        CHECK(tpurt_op_launch(rt, ln, &t_y, 1, outs, 3, &ln_attr, 1, tc));
        /* Intermediates freed before the flush: defer-and-fuse never stores them. */
        CHECK(tpurt_buffer_free(bh));
        CHECK(tpurt_buffer_free(bg));
        CHECK(tpurt_buffer_free(by));
        CHECK(tpurt_event_record(e1, tc));
        CHECK(tpurt_event_synchronize(e1));
        float ms_step;
        CHECK(tpurt_event_elapsed_time(e0, e1, &ms_step));
        if (step > 0) total += ms_step; /* the first step compiles */
        float probe;
        tpurt_layout one_el;
        uint64_t one_n = 1;
        memset(&one_el, 0, sizeof one_el);
        one_el.struct_size = sizeof one_el;
        one_el.ndim = 1;
        one_el.elem_size = 4;
        one_el.sizes = &one_n;
        CHECK(tpurt_copy_device_to_host(bo, &one_el, &probe, 4, tc, 0));
        if (step == 4) printf("  %-42s %7.2f ms/step (device time), y[0,0] = %+.5f\n", names[m], total / 4, probe);
        CHECK(tpurt_buffer_free(bo));
        CHECK(tpurt_buffer_free(bm));
        CHECK(tpurt_buffer_free(br));
        CHECK(tpurt_event_destroy(e0));
        CHECK(tpurt_event_destroy(e1));
      }
      uint32_t popped;
      CHECK(tpurt_eager_mode_pop(&popped));
      if (m == 2) {
        char *events;
        CHECK(tpurt_device_synchronize(rt, 0));
        CHECK(tpurt_profiler_stop(&events));
        int tasks = 0, kernels = 0;
        for (const char *p = events; (p = strstr(p, "\"kind\":\"")) != NULL; p++) {
          if (strncmp(p + 8, "task\"", 5) == 0) tasks++;
          else kernels++;
        }
        printf("  profiler: %d tasks and %d host kernels in those steps\n", tasks, kernels);
        tpurt_string_free(events);
      }
    }
    tpurt_compile_cache_stats cs;
    memset(&cs, 0, sizeof cs);
    cs.struct_size = sizeof cs;
    CHECK(tpurt_compile_cache_get_stats(rt, &cs));
    printf("  compile cache: %llu requests, %llu memory hits, %llu disk hits, %llu compiles (%.1f ms)\n",
           (unsigned long long)cs.requests, (unsigned long long)cs.memory_hits, (unsigned long long)cs.disk_hits,
           (unsigned long long)cs.misses, cs.compile_seconds * 1e3);
    CHECK(tpurt_buffer_free(bx));
    CHECK(tpurt_buffer_free(bb));
    free(host);
  }

  char *json;
  CHECK(tpurt_memory_snapshot(rt, 1, &json));
  printf("\nmemory snapshot of tpu:1: %.160s...\n", json);
  tpurt_string_free(json);

  CHECK(tpurt_buffer_free(b));
  CHECK(tpurt_runtime_destroy(rt));
  printf("done\n");
  return 0;
}
