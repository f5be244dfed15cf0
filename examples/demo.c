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

  char *json;
  CHECK(tpurt_memory_snapshot(rt, 1, &json));
  printf("\nmemory snapshot of tpu:1: %.160s...\n", json);
  tpurt_string_free(json);

  CHECK(tpurt_buffer_free(b));
  CHECK(tpurt_runtime_destroy(rt));
  printf("done\n");
  return 0;
}
