// The shim between PyTorch's dispatcher and the tpurt C ABI. It includes
// only include/tpurt.h from tpurt; everything it knows of the runtime comes
// through that header. Logic (op semantics, memory, streams) lives in the
// runtime: this layer translates tensors, scalars and errors.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <initializer_list>
#include <deque>
#include <list>
#include <string>
#include <vector>

#include "tpurt.h"

namespace tpurt_torch {

// The process-wide runtime, created on first use (platform from
// TPURT_PLATFORM) and kept for the life of the process, as a CUDA context.
tpurt_runtime runtime();
bool runtime_initialized();
// True in a child forked after the runtime started: its worker threads did
// not come along, so the runtime cannot be used there.
bool in_bad_fork();
int device_count();
// The platform's name ("host", "xla").
std::string platform_name();

// Throws a c10 error carrying the runtime's message when `s` is an error
// (NotImplementedError for TPURT_CODE_UNIMPLEMENTED, OutOfMemoryError for
// TPURT_CODE_OUT_OF_MEMORY); `what` says what was being done.
void check(tpurt_status* s, const char* what);
void check(tpurt_status* s, const std::string& what);

uint32_t dtype_of(at::ScalarType t);  // throws for dtypes the runtime lacks
bool has_dtype(at::ScalarType t);
at::ScalarType scalar_type_of(uint32_t dtype);

// --- memory -------------------------------------------------------------
c10::Allocator* allocator();
// The buffer behind a tpu tensor's storage.
tpurt_buffer buffer_of(const at::Tensor& t);
tpurt_buffer buffer_of(const c10::Storage& s);
tpurt_buffer buffer_of_data_ptr(const c10::DataPtr& dp);
// A new storage of `nbytes` on `device`, from the HBM pool.
c10::DataPtr allocate(int device, size_t nbytes);
// Grow or shrink a storage's bytes, keeping its contents (resize_).
void resize_bytes(const c10::Storage& storage, size_t nbytes);
at::Tensor empty(at::IntArrayRef size, at::ScalarType dtype, int device);
// An op's output (from tpurt_op_call) as a contiguous tensor that owns it.
at::Tensor wrap_output(tpurt_buffer buffer, uint64_t address, const tpurt_tensor_type& ty, int device);

// --- devices and streams ------------------------------------------------
int current_device();
// The precision of f32 products: torch's float32 matmul precision followed
// until set here (nullopt: follow torch's again).
uint32_t matmul_precision();
void set_matmul_precision(std::optional<uint32_t> precision);
bool matmul_precision_follows_torch();
void set_current_device(int device);
void check_device(int device);
// Streams as torch sees them: id 0 is a device's default stream, others
// index a table of created streams.
c10::Stream current_stream(int device);
c10::Stream set_current_stream(c10::Stream s);  // returns the previous
c10::Stream new_stream(int device, int priority, bool sparse_core);
tpurt_stream stream_handle(const c10::Stream& s);
c10::Stream stream_from_id(int device, int64_t id);

// --- tensors ------------------------------------------------------------
// A tensor as the C ABI describes it; owns the size and stride arrays
// (inline: building one allocates nothing).
struct Desc {
  tpurt_tensor t{};
  uint64_t sizes[TPURT_MAX_DIMS];
  uint64_t strides[TPURT_MAX_DIMS];
  Desc() = default;
  explicit Desc(const at::Tensor& x) { fill(x); }
  void fill(const at::Tensor& x);
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
};
// tpurt_layout of a tpu tensor (owning its arrays as Desc does).
struct LayoutDesc {
  tpurt_layout l{};
  uint64_t sizes[TPURT_MAX_DIMS];
  uint64_t strides[TPURT_MAX_DIMS];
  explicit LayoutDesc(const at::Tensor& x);
};

// --- ops ----------------------------------------------------------------
// Attributes for an op call; owns every array and string it points at.
// Names must be string literals (they are not copied). Empty, it
// allocates nothing.
class Attrs {
 public:
  Attrs() = default;
  Attrs(const Attrs& o);
  Attrs& operator=(const Attrs&) = delete;
  Attrs& i(const char* name, int64_t v);
  Attrs& f(const char* name, double v);
  Attrs& b(const char* name, bool v);
  Attrs& ints(const char* name, at::IntArrayRef v);
  Attrs& floats(const char* name, at::ArrayRef<double> v);
  Attrs& dtype(const char* name, at::ScalarType t);
  Attrs& str(const char* name, const std::string& v);
  const std::vector<tpurt_attr>& items() const { return items_; }

 private:
  tpurt_attr& add(const char* name, uint32_t kind);
  std::vector<tpurt_attr> items_;
  // Lists: pointers into their elements stay valid as they grow.
  std::list<std::string> strings_;
  std::list<std::vector<int64_t>> ints_;
  std::list<std::vector<double>> floats_;
};

// An op's input as `call` takes it: a tensor borrowed from the caller, or
// a temporary moved in. Borrowing matters: copying an at::Tensor whose only
// owner is a Python object makes torch take the GIL (which the dispatcher
// has released) to keep that object alive, and again to let it go; that
// was four GIL round trips for a tiny `x + y`.
class In {
 public:
  In(const at::Tensor& t) : borrowed_(&t) {}  // NOLINT: implicit by design
  In(at::Tensor&& t) : owned_(std::move(t)) {}  // NOLINT
  const at::Tensor& get() const { return borrowed_ != nullptr ? *borrowed_ : owned_; }

 private:
  at::Tensor owned_;
  const at::Tensor* borrowed_ = nullptr;
};
using Ins = std::initializer_list<In>;

// Run a runtime op on tpu tensors (0-dim CPU tensors are moved over;
// wrapped Python numbers are marked as such), returning new outputs.
std::vector<at::Tensor> call(const char* op, Ins inputs, const Attrs& attrs = Attrs());
std::vector<at::Tensor> call(const char* op, const std::vector<at::Tensor>& inputs,
                             const Attrs& attrs = Attrs());
at::Tensor call1(const char* op, Ins inputs, const Attrs& attrs = Attrs());
at::Tensor call1(const char* op, const std::vector<at::Tensor>& inputs,
                 const Attrs& attrs = Attrs());
// As call, writing into `outputs` (whose types must be the op's results).
void call_into(const char* op, Ins inputs, const std::vector<at::Tensor>& outputs,
               const Attrs& attrs = Attrs());
void call_into(const char* op, const std::vector<at::Tensor>& inputs,
               const std::vector<at::Tensor>& outputs, const Attrs& attrs = Attrs());
// The device a set of tensors runs on (the first tpu tensor's).
int device_of(const std::vector<at::Tensor>& inputs, const char* op);
// A 0-dim tensor on `device` holding `s` (double, int64 or bool, as torch
// wraps Python numbers), marked as a wrapped number.
at::Tensor scalar_on(const at::Scalar& s, int device);
// A 0-dim CPU tensor's value on `device`, marked a wrapped number when
// `wrapped`, for ops to read and never write.
at::Tensor device_scalar(const at::Tensor& cpu, int device, bool wrapped);
// While one lives on a thread (the outermost counts), scalar_on and
// device_scalar upload each value once: a foreach op's scalar serves
// every tensor of its list.
class ScalarUploadScope {
 public:
  ScalarUploadScope();
  ~ScalarUploadScope();
  ScalarUploadScope(const ScalarUploadScope&) = delete;
  ScalarUploadScope& operator=(const ScalarUploadScope&) = delete;
};
// Copy `src` (any device) into `dst` (any device), with cast and broadcast.
// dst = src for two tensors of one device, dtype and sizes, as a strided
// copy by the runtime (no compiled program).
void copy_region(const at::Tensor& dst, const at::Tensor& src);
void copy_into(const at::Tensor& dst, const at::Tensor& src, bool non_blocking);

// The hooks interface (device.cpp); called once at import.
void register_device();

// --- attention ----------------------------------------------------------------
// Whether scaled_dot_product_attention runs the runtime's attention op
// (the default; TPURT_FUSED_ATTENTION=0 starts with it off) or torch's math decomposition.
bool fused_attention_enabled();
void set_fused_attention_enabled(bool on);

// --- the CPU fallback -----------------------------------------------------
bool cpu_fallback_enabled();
void set_cpu_fallback_enabled(bool on);

}  // namespace tpurt_torch
