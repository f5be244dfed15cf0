// tpurt._C: what the Python package needs beyond the dispatcher: device
// queries, streams, memory statistics, eager modes, compile-cache controls
// and the CPU fallback's switch and counts.
#include <torch/csrc/Generator.h>
#include <torch/extension.h>

#include <mutex>
#include <string>
#include <unordered_set>

#include "common.h"
#include "fallback.h"
#include "generator.h"

namespace py = pybind11;

namespace tpurt_torch {
namespace {

py::dict stat_dict(const tpurt_memory_stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

py::dict memory_stats(int device) {
  check_device(device);
  tpurt_memory_stats s{};
  s.struct_size = sizeof(s);
  check(tpurt_memory_get_stats(runtime(), static_cast<uint32_t>(device), &s), "memory_stats");
  py::dict d;
  d["allocated_bytes"] = stat_dict(s.allocated_bytes);
  d["reserved_bytes"] = stat_dict(s.reserved_bytes);
  d["active_bytes"] = stat_dict(s.active_bytes);
  d["requested_bytes"] = stat_dict(s.requested_bytes);
  d["num_alloc"] = s.num_alloc;
  d["num_free"] = s.num_free;
  d["num_ooms"] = s.num_ooms;
  d["num_alloc_retries"] = s.num_alloc_retries;
  d["num_segments"] = s.num_segments;
  d["peak_num_segments"] = s.peak_num_segments;
  d["num_segment_allocs"] = s.num_segment_allocs;
  d["num_segment_frees"] = s.num_segment_frees;
  d["capacity_bytes"] = s.capacity_bytes;
  d["plugin_bytes"] = stat_dict(s.plugin_bytes);
  return d;
}

std::string profiler_stop() {
  char* json = nullptr;
  check(tpurt_profiler_stop(&json), "profiler stop");
  std::string out(json == nullptr ? "" : json);
  tpurt_string_free(json);
  return out;
}

std::string memory_snapshot(int device) {
  check_device(device);
  char* json = nullptr;
  check(tpurt_memory_snapshot(runtime(), static_cast<uint32_t>(device), &json), "memory_snapshot");
  std::string out(json == nullptr ? "" : json);
  tpurt_string_free(json);
  return out;
}

py::dict device_properties(int device) {
  check_device(device);
  tpurt_device_properties p{};
  p.struct_size = sizeof(p);
  check(tpurt_device_get_properties(runtime(), static_cast<uint32_t>(device), &p), "get_device_properties");
  py::dict d;
  d["index"] = p.index;
  d["name"] = std::string(p.name);
  d["kind"] = std::string(p.kind);
  d["total_memory"] = p.hbm_capacity_bytes;
  d["tensor_cores"] = p.tensor_cores;
  d["sparse_cores"] = p.sparse_cores;
  d["coords"] = std::vector<uint32_t>(p.coords, p.coords + std::min<uint32_t>(p.num_coords, 4));
  d["host_chip"] = p.host_chip;
  return d;
}

// The TPU slice this process is part of (the TPU_* variables), or None.
py::object slice_info() {
  tpurt_slice_info s{};
  s.struct_size = sizeof(s);
  check(tpurt_runtime_slice_info(runtime(), &s), "slice_info");
  if (s.in_slice == 0) return py::none();
  py::dict d;
  d["name"] = s.name[0] != 0 ? py::object(py::str(s.name)) : py::none();
  d["accelerator_type"] = s.accelerator_type[0] != 0 ? py::object(py::str(s.accelerator_type)) : py::none();
  d["topology"] = std::vector<uint32_t>(s.topology, s.topology + std::min<uint32_t>(s.num_dims, 4));
  d["chips_per_host_bounds"] = std::vector<uint32_t>(s.chips_per_host_bounds, s.chips_per_host_bounds + 3);
  d["host_bounds"] = std::vector<uint32_t>(s.host_bounds, s.host_bounds + 3);
  d["worker_id"] = s.worker_id;
  d["num_hosts"] = s.num_hosts;
  d["host_chips"] = s.host_chips;
  d["visible_chips"] = s.visible_chips;
  return d;
}

py::dict cache_stats() {
  tpurt_compile_cache_stats s{};
  s.struct_size = sizeof(s);
  check(tpurt_compile_cache_get_stats(runtime(), &s), "compile cache stats");
  py::dict d;
  d["requests"] = s.requests;
  d["memory_hits"] = s.memory_hits;
  d["disk_hits"] = s.disk_hits;
  d["hits"] = s.memory_hits + s.disk_hits;
  d["misses"] = s.misses;
  d["compile_seconds"] = s.compile_seconds;
  d["corrupt_entries"] = s.corrupt_entries;
  d["foreign_entries"] = s.foreign_entries;
  d["evictions"] = s.evictions;
  return d;
}

std::vector<uint32_t> topology() {
  uint32_t dims[8] = {0};
  size_t n = 0;
  check(tpurt_runtime_topology(runtime(), dims, 8, &n), "topology");
  return std::vector<uint32_t>(dims, dims + std::min<size_t>(n, 8));
}

// Names of ops and attributes called from Python, kept for the life of the
// process: the op-id cache and Attrs hold their addresses.
const char* intern(const std::string& s) {
  static std::mutex mu;
  static std::unordered_set<std::string> names;
  std::lock_guard<std::mutex> g(mu);
  return names.insert(s).first->c_str();
}

// A runtime op by name on tpu tensors, with attributes from a dict of
// bool, int, float, str or a list of ints or of floats.
std::vector<at::Tensor> call_op(const std::string& name, const std::vector<at::Tensor>& inputs,
                                const py::dict& attrs) {
  Attrs a;
  for (const auto& kv : attrs) {
    const char* k = intern(py::str(kv.first).cast<std::string>());
    py::handle v = kv.second;
    if (py::isinstance<py::bool_>(v)) {
      a.b(k, v.cast<bool>());
    } else if (py::isinstance<py::int_>(v)) {
      a.i(k, v.cast<int64_t>());
    } else if (py::isinstance<py::float_>(v)) {
      a.f(k, v.cast<double>());
    } else if (py::isinstance<py::str>(v)) {
      a.str(k, v.cast<std::string>());
    } else if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
      auto seq = v.cast<py::sequence>();
      bool all_int = true;
      for (auto item : seq) all_int = all_int && py::isinstance<py::int_>(item);
      if (all_int) {
        a.ints(k, seq.cast<std::vector<int64_t>>());
      } else {
        a.floats(k, seq.cast<std::vector<double>>());
      }
    } else {
      throw py::type_error("tpu op " + name + ": attribute " + k + " has unsupported type " +
                           py::str(v.get_type()).cast<std::string>());
    }
  }
  return call(intern(name), inputs, a);
}

py::tuple stream_tuple(const c10::Stream& s) {
  return py::make_tuple(s.id(), static_cast<int>(s.device_index()), static_cast<int>(s.device_type()));
}

}  // namespace
}  // namespace tpurt_torch

PYBIND11_MODULE(_C, m) {
  using namespace tpurt_torch;
  m.doc() = "tpurt: the tpu device for PyTorch, over the tpurt C ABI";
  m.def("_register", [] { register_device(); });
  m.def("call_op", &call_op, py::arg("name"), py::arg("inputs"), py::arg("attrs") = py::dict(),
        "Run a runtime op by name on tpu tensors; returns its outputs.");
  m.def("handle_counts", [] {
    tpurt_handle_counts c{};
    c.struct_size = sizeof(c);
    check(tpurt_handle_counts_get(&c), "handle_counts");
    py::dict d;
    d["runtimes"] = c.runtimes;
    d["streams"] = c.streams;
    d["events"] = c.events;
    d["buffers"] = c.buffers;
    d["executables"] = c.executables;
    return d;
  });
  m.def("abi_version", [] { return tpurt_abi_version(); });
  m.def("version", [] { return std::string(tpurt_version_string()); });
  m.def("is_initialized", [] { return runtime_initialized(); });
  m.def("is_in_bad_fork", [] { return in_bad_fork(); });
  m.def("init", [] { runtime(); });
  m.def("device_count", [] { return device_count(); });
  m.def("platform", [] { return platform_name(); });
  m.def("topology", [] { return topology(); });
  m.def("current_device", [] { return current_device(); });
  m.def("set_device", [](int d) { set_current_device(d); });
  m.def("synchronize", [](int d) {
    check_device(d);
    py::gil_scoped_release nogil;
    check(tpurt_device_synchronize(runtime(), static_cast<uint32_t>(d)), "synchronize");
  });
  // Launch what `d`'s current stream holds for defer-and-fuse; returns how
  // many ops that was.
  m.def("launch_deferred", [](int d) {
    check_device(d);
    size_t launched = 0;
    check(tpurt_stream_flush(stream_handle(current_stream(d)), &launched), "launch deferred ops");
    return launched;
  });
  // Launch it as the op limit would, at a step boundary (see
  // tpurt_stream_mark_step); returns how many ops that was.
  m.def("mark_step", [](int d) {
    check_device(d);
    size_t launched = 0;
    check(tpurt_stream_mark_step(stream_handle(current_stream(d)), &launched), "mark a step");
    return launched;
  });
  m.def("device_properties", &device_properties);
  m.def("slice_info", &slice_info);

  // Streams: (stream_id, device_index, device_type) triples, as torch.Stream takes.
  m.def("current_stream", [](int d) { return stream_tuple(current_stream(d)); });
  m.def("default_stream", [](int d) {
    check_device(d);
    return stream_tuple(stream_from_id(d, 0));
  });
  m.def("new_stream", [](int d, int priority, bool sparse_core) {
    return stream_tuple(new_stream(d, priority, sparse_core));
  });
  m.def("set_stream", [](int64_t id, int d) { set_current_stream(stream_from_id(d, id)); });
  m.def("stream_core", [](int64_t id, int d) {
    uint32_t dev = 0, core = 0;
    int32_t prio = 0;
    check(tpurt_stream_get_info(stream_handle(stream_from_id(d, id)), &dev, &prio, &core), "stream info");
    return py::make_tuple(prio, core == TPURT_CORE_SPARSE ? "sparse" : "tensor");
  });
  m.def("stream_reset", [](int64_t id, int d) {
    check(tpurt_stream_reset(stream_handle(stream_from_id(d, id))), "stream reset");
  });

  // Memory.
  m.def("memory_stats", &memory_stats);
  m.def("reset_peak_memory_stats", [](int d) {
    check_device(d);
    check(tpurt_memory_reset_peak_stats(runtime(), static_cast<uint32_t>(d)), "reset_peak_memory_stats");
  });
  m.def("empty_cache", [](int d) {
    check_device(d);
    uint64_t released = 0;
    py::gil_scoped_release nogil;
    check(tpurt_memory_empty_cache(runtime(), static_cast<uint32_t>(d), &released), "empty_cache");
    return released;
  });
  m.def("memory_snapshot", &memory_snapshot);
  m.def("profiler_start", [] { check(tpurt_profiler_start(), "profiler start"); });
  m.def("profiler_stop", &profiler_stop);

  // Eager modes.
  m.def("eager_mode", [] {
    uint32_t mode = 0;
    check(tpurt_eager_mode_get(&mode), "eager mode");
    return mode;
  });
  m.def("set_eager_mode", [](uint32_t mode) { check(tpurt_eager_mode_set(mode), "set_eager_mode"); });
  m.def("push_eager_mode", [](uint32_t mode) { check(tpurt_eager_mode_push(mode), "push eager mode"); });
  m.def("pop_eager_mode", [] {
    uint32_t mode = 0;
    check(tpurt_eager_mode_pop(&mode), "pop eager mode");
    return mode;
  });

  // The precision of f32 products.
  m.def("matmul_precision", &matmul_precision);
  m.def("set_matmul_precision", &set_matmul_precision, py::arg("precision"));
  m.def("matmul_precision_follows_torch", &matmul_precision_follows_torch);

  // Compiler options (a JSON object).
  m.def("set_compiler_options",
        [](const std::string& json) { check(tpurt_compiler_options_set(json.c_str()), "compiler options"); });
  m.def("compiler_options", [] {
    char* json = nullptr;
    check(tpurt_compiler_options_get(&json), "compiler options");
    std::string out(json);
    tpurt_string_free(json);
    return out;
  });

  // The compile cache.
  m.def("cache_stats", &cache_stats);
  m.def("cache_clear", [](bool memory, bool disk) {
    check(tpurt_compile_cache_clear(runtime(), memory, disk), "clearing the compile cache");
  });
  m.def("cache_only", [](bool on) {
    check(tpurt_compile_cache_set_cache_only(runtime(), on), "cache_only");
  });
  m.def("dump_on_miss", [](std::optional<std::string> dir) {
    check(tpurt_compile_cache_set_dump_on_miss(runtime(), dir ? dir->c_str() : nullptr), "dump_on_miss");
  });

  m.def("copy_region", [](const at::Tensor& dst, const at::Tensor& src) { copy_region(dst, src); });
  m.def("set_shape_buckets", [](uint32_t kind, std::vector<uint64_t> sizes) {
    check(tpurt_compile_cache_set_buckets(runtime(), kind, sizes.data(), sizes.size()), "set_shape_buckets");
  });
  m.def("shape_bucket", [](uint64_t n) {
    uint64_t b = 0;
    check(tpurt_compile_cache_bucket(runtime(), n, &b), "shape_bucket");
    return b;
  });

  // Attention.
  m.def("fused_attention_enabled", [] { return fused_attention_enabled(); });
  m.def("set_fused_attention_enabled", [](bool on) { set_fused_attention_enabled(on); });

  // The CPU fallback.
  m.def("cpu_fallback_enabled", [] { return cpu_fallback_enabled(); });
  m.def("set_cpu_fallback_enabled", [](bool on) { set_cpu_fallback_enabled(on); });
  m.def("fallback_counts", [] { return fallback_counts(); });
  m.def("reset_fallback_counts", [] { reset_fallback_counts(); });

  // RNG: the default generators as torch.Generator objects.
  m.def("default_generator", [](int d) {
    check_device(d);
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(all_default_generators()[d]));
  });
}
