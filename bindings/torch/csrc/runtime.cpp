// The runtime, errors, dtypes, devices, streams and op calls.
#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <mutex>
#include <pthread.h>
#include <unordered_map>

#include "common.h"

namespace tpurt_torch {

namespace {

std::once_flag g_once;
tpurt_runtime g_rt{0};
int g_devices = 0;
std::string g_platform;

constexpr int kMaxDevices = 64;
bool g_bad_fork = false;

}  // namespace

void check(tpurt_status* s, const char* what) {
  if (s == nullptr) {
    return;
  }
  uint32_t code = tpurt_status_code(s);
  std::string msg = std::string("tpu: ") + what + ": " + tpurt_status_message(s);
  tpurt_status_destroy(s);
  if (code == TPURT_CODE_UNIMPLEMENTED) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, msg);
  }
  if (code == TPURT_CODE_OUT_OF_MEMORY) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
  }
  TORCH_CHECK(false, msg);
}

void check(tpurt_status* s, const std::string& what) { check(s, what.c_str()); }

tpurt_runtime runtime() {
  std::call_once(g_once, [] {
    tpurt_runtime_options opts{};
    opts.struct_size = sizeof(opts);
    tpurt_runtime rt{0};
    check(tpurt_runtime_create(&opts, &rt), "creating the runtime");
    uint32_t n = 0;
    check(tpurt_device_count(rt, &n), "counting devices");
    char name[32] = {0};
    size_t len = 0;
    check(tpurt_runtime_platform_name(rt, name, sizeof(name) - 1, &len), "naming the platform");
    g_platform = name;
    g_devices = static_cast<int>(std::min<uint32_t>(n, kMaxDevices));
    g_rt = rt;
    pthread_atfork(nullptr, nullptr, [] { g_bad_fork = true; });
  });
  TORCH_CHECK(!g_bad_fork,
              "tpu: cannot use the tpu device in a process forked after it started; use the "
              "'spawn' start method for multiprocessing");
  TORCH_CHECK(g_rt.handle != 0, "tpu: the runtime failed to start earlier");
  return g_rt;
}

bool runtime_initialized() { return g_rt.handle != 0; }

bool in_bad_fork() { return g_bad_fork; }

int device_count() {
  runtime();
  return g_devices;
}

std::string platform_name() {
  runtime();
  return g_platform;
}

// --- dtypes ---------------------------------------------------------------

bool has_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool:
    case at::kByte:
    case at::kChar:
    case at::kInt:
    case at::kLong:
    case at::kHalf:
    case at::kBFloat16:
    case at::kFloat:
    case at::kDouble:
      return true;
    default:
      return false;
  }
}

uint32_t dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kBool: return TPURT_DTYPE_BOOL;
    case at::kByte: return TPURT_DTYPE_U8;
    case at::kChar: return TPURT_DTYPE_I8;
    case at::kInt: return TPURT_DTYPE_I32;
    case at::kLong: return TPURT_DTYPE_I64;
    case at::kHalf: return TPURT_DTYPE_F16;
    case at::kBFloat16: return TPURT_DTYPE_BF16;
    case at::kFloat: return TPURT_DTYPE_F32;
    case at::kDouble: return TPURT_DTYPE_F64;
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "tpu: dtype ", t,
                                  " is not supported by the runtime (it has bool, uint8, int8, "
                                  "int32, int64, float16, bfloat16, float32, float64)");
  }
}

at::ScalarType scalar_type_of(uint32_t d) {
  switch (d) {
    case TPURT_DTYPE_BOOL: return at::kBool;
    case TPURT_DTYPE_U8: return at::kByte;
    case TPURT_DTYPE_I8: return at::kChar;
    case TPURT_DTYPE_I32: return at::kInt;
    case TPURT_DTYPE_I64: return at::kLong;
    case TPURT_DTYPE_F16: return at::kHalf;
    case TPURT_DTYPE_BF16: return at::kBFloat16;
    case TPURT_DTYPE_F32: return at::kFloat;
    case TPURT_DTYPE_F64: return at::kDouble;
    default: TORCH_CHECK(false, "tpu: the runtime returned an unknown dtype ", d);
  }
}

// --- devices and streams --------------------------------------------------

namespace {

thread_local int t_device = 0;
// Per thread, per device: the current stream's id (0: the default stream).
thread_local std::array<int64_t, kMaxDevices> t_stream_ids{};

struct StreamTable {
  std::mutex mu;
  // Created streams; id = index + 1. Handles live as long as the process
  // (as torch's streams do).
  std::vector<std::pair<int, tpurt_stream>> created;
  // Default streams' handles, once looked up (0: not yet).
  std::array<std::atomic<uint64_t>, kMaxDevices> defaults{};
};

StreamTable& streams() {
  static auto* t = new StreamTable();
  return *t;
}

}  // namespace

void check_device(int device) {
  int n = device_count();
  TORCH_CHECK_INDEX(device >= 0 && device < n, "tpu: device index ", device,
                    " is out of range (there are ", n, " tpu devices)");
}

int current_device() { return t_device; }

void set_current_device(int device) {
  check_device(device);
  t_device = device;
}

c10::Stream stream_from_id(int device, int64_t id) {
  return c10::Stream(c10::Stream::UNSAFE,
                     c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)),
                     static_cast<c10::StreamId>(id));
}

c10::Stream current_stream(int device) {
  check_device(device);
  return stream_from_id(device, t_stream_ids[device]);
}

c10::Stream set_current_stream(c10::Stream s) {
  int device = s.device_index();
  c10::Stream prev = current_stream(device);
  stream_handle(s);  // validates
  t_stream_ids[device] = s.id();
  return prev;
}

c10::Stream new_stream(int device, int priority, bool sparse_core) {
  check_device(device);
  tpurt_stream_options o{};
  o.struct_size = sizeof(o);
  o.priority = priority;
  o.core = sparse_core ? TPURT_CORE_SPARSE : TPURT_CORE_TENSOR;
  tpurt_stream h{0};
  check(tpurt_stream_create(runtime(), static_cast<uint32_t>(device), &o, &h), "creating a stream");
  auto& t = streams();
  std::lock_guard<std::mutex> g(t.mu);
  t.created.emplace_back(device, h);
  return stream_from_id(device, static_cast<int64_t>(t.created.size()));
}

tpurt_stream stream_handle(const c10::Stream& s) {
  TORCH_CHECK(s.device_type() == c10::DeviceType::PrivateUse1, "tpu: ", s, " is not a tpu stream");
  int device = s.device_index();
  check_device(device);
  auto& t = streams();
  if (s.id() == 0) {
    uint64_t h = t.defaults[device].load(std::memory_order_acquire);
    if (h == 0) {
      tpurt_stream d{0};
      check(tpurt_stream_get_default(runtime(), static_cast<uint32_t>(device), &d), "getting the default stream");
      uint64_t expected = 0;
      if (!t.defaults[device].compare_exchange_strong(expected, d.handle)) {
        tpurt_status_destroy(tpurt_stream_destroy(d));  // another thread won; same stream
      }
      h = t.defaults[device].load(std::memory_order_acquire);
    }
    return tpurt_stream{h};
  }
  std::lock_guard<std::mutex> g(t.mu);
  auto idx = static_cast<size_t>(s.id());
  TORCH_CHECK(s.id() > 0 && idx <= t.created.size() && t.created[idx - 1].first == device,
              "tpu: stream id ", s.id(), " is not a stream of tpu:", device);
  return t.created[idx - 1].second;
}

// --- tensors ----------------------------------------------------------------

namespace {
template <typename D>
void fill_dims(const at::Tensor& x, D& d) {
  TORCH_CHECK(x.dim() <= TPURT_MAX_DIMS, "tpu: tensors have at most ", TPURT_MAX_DIMS,
              " dimensions, got ", x.dim());
  for (int64_t i = 0; i < x.dim(); ++i) {
    d.sizes[i] = static_cast<uint64_t>(x.size(i));
    int64_t st = x.size(i) == 1 ? 0 : x.stride(i);
    TORCH_CHECK(st >= 0, "tpu: negative strides are not supported (dimension ", i, " has ",
                x.stride(i), ")");
    d.strides[i] = static_cast<uint64_t>(st);
  }
}

uint64_t offset_bytes(const at::Tensor& x) {
  return static_cast<uint64_t>(x.storage_offset()) * x.element_size();
}
}  // namespace

void Desc::fill(const at::Tensor& x) {
  TORCH_CHECK(x.device().type() == c10::DeviceType::PrivateUse1, "tpu: expected a tpu tensor, got ",
              x.device());
  fill_dims(x, *this);
  t.struct_size = sizeof(t);
  t.buffer = buffer_of(x);
  t.dtype = dtype_of(x.scalar_type());
  t.ndim = static_cast<uint32_t>(x.dim());
  t.offset_bytes = offset_bytes(x);
  t.sizes = sizes;
  t.strides = strides;
}

LayoutDesc::LayoutDesc(const at::Tensor& x) {
  fill_dims(x, *this);
  l.struct_size = sizeof(l);
  l.offset_bytes = offset_bytes(x);
  l.ndim = static_cast<uint32_t>(x.dim());
  l.elem_size = static_cast<uint32_t>(x.element_size());
  l.sizes = sizes;
  l.strides = strides;
}

// --- attributes ---------------------------------------------------------------

Attrs::Attrs(const Attrs& o) {
  // Deep copy: the items point into the copy's own lists.
  for (const auto& a : o.items_) {
    switch (a.kind) {
      case TPURT_ATTR_INTS: ints(a.name, at::IntArrayRef(a.ints, a.count)); break;
      case TPURT_ATTR_FLOATS: floats(a.name, at::ArrayRef<double>(a.floats, a.count)); break;
      case TPURT_ATTR_STRING: str(a.name, a.string); break;
      default: items_.push_back(a);
    }
  }
}

tpurt_attr& Attrs::add(const char* name, uint32_t kind) {
  tpurt_attr a{};
  a.name = name;
  a.kind = kind;
  items_.push_back(a);
  return items_.back();
}

Attrs& Attrs::i(const char* name, int64_t v) {
  add(name, TPURT_ATTR_INT).int_value = v;
  return *this;
}
Attrs& Attrs::f(const char* name, double v) {
  add(name, TPURT_ATTR_FLOAT).float_value = v;
  return *this;
}
Attrs& Attrs::b(const char* name, bool v) {
  add(name, TPURT_ATTR_BOOL).int_value = v ? 1 : 0;
  return *this;
}
Attrs& Attrs::ints(const char* name, at::IntArrayRef v) {
  ints_.emplace_back(v.begin(), v.end());
  auto& a = add(name, TPURT_ATTR_INTS);
  a.ints = ints_.back().data();
  a.count = ints_.back().size();
  return *this;
}
Attrs& Attrs::floats(const char* name, at::ArrayRef<double> v) {
  floats_.emplace_back(v.begin(), v.end());
  auto& a = add(name, TPURT_ATTR_FLOATS);
  a.floats = floats_.back().data();
  a.count = floats_.back().size();
  return *this;
}
Attrs& Attrs::dtype(const char* name, at::ScalarType t) {
  add(name, TPURT_ATTR_DTYPE).int_value = dtype_of(t);
  return *this;
}
Attrs& Attrs::str(const char* name, const std::string& v) {
  strings_.push_back(v);
  add(name, TPURT_ATTR_STRING).string = strings_.back().c_str();
  return *this;
}

// --- op calls -------------------------------------------------------------------

namespace {

// An op's id, and whether it reads the precision of f32 products.
struct OpInfo {
  uint32_t id;
  bool reads_precision;
};

OpInfo op_info(const char* name) {
  // Op names are string literals: a per-thread map keyed by their address
  // needs no lock and no string.
  thread_local std::unordered_map<const char*, OpInfo> ids;
  auto it = ids.find(name);
  if (it != ids.end()) {
    return it->second;
  }
  OpInfo info{0, false};
  check(tpurt_op_lookup(name, &info.id), std::string("looking up op ") + name);
  check(tpurt_op_reads_precision(info.id, &info.reads_precision), std::string("looking up op ") + name);
  ids.emplace(name, info);
  return info;
}

// Tensors as the op calls see them: pointers, so nothing's reference count
// moves (see `In`).
using Ptrs = c10::SmallVector<const at::Tensor*, 8>;

Ptrs ptrs_of(Ins ts) {
  Ptrs p;
  for (const In& t : ts) p.push_back(&t.get());
  return p;
}
Ptrs ptrs_of(const std::vector<at::Tensor>& ts) {
  Ptrs p;
  for (const at::Tensor& t : ts) p.push_back(&t);
  return p;
}

int device_of(const Ptrs& inputs, const char* op) {
  for (const at::Tensor* x : inputs) {
    if (x->defined() && x->device().type() == c10::DeviceType::PrivateUse1) {
      return x->device().index();
    }
  }
  TORCH_CHECK(false, "tpu: ", op, ": no input is a tpu tensor");
}

// The inputs with 0-dim CPU tensors moved to `device` (kept alive in
// `moved`), and the indices of the wrapped numbers among them.
Ptrs on_device(const Ptrs& inputs, int device, const char* op, std::vector<at::Tensor>& moved,
               std::vector<int64_t>& wrapped) {
  Ptrs out;
  moved.reserve(inputs.size());  // pointers into it stay valid
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& x = *inputs[i];
    TORCH_CHECK(x.defined(), "tpu: ", op, ": input ", i, " is undefined");
    if (x.unsafeGetTensorImpl()->is_wrapped_number()) {
      wrapped.push_back(static_cast<int64_t>(i));
    }
    if (x.device().type() == c10::DeviceType::PrivateUse1) {
      TORCH_CHECK(x.device().index() == device, "tpu: ", op, ": expected all tensors on tpu:", device,
                  ", but input ", i, " is on ", x.device());
      out.push_back(&x);
    } else {
      TORCH_CHECK(x.dim() == 0, "tpu: ", op, ": expected all tensors on tpu:", device, ", but input ",
                  i, " is on ", x.device(), " (only 0-dim CPU tensors may join tpu tensors)");
      moved.push_back(device_scalar(x, device, x.unsafeGetTensorImpl()->is_wrapped_number()));
      out.push_back(&moved.back());
    }
  }
  return out;
}

// `attrs`, plus the wrapped-number indices when there are any (a copy is
// made only then).
const Attrs& with_wrapped(const Attrs& attrs, const std::vector<int64_t>& wrapped,
                          std::optional<Attrs>& storage) {
  if (wrapped.empty()) {
    return attrs;
  }
  storage.emplace(attrs);
  storage->ints("wrapped", wrapped);
  return *storage;
}

// The C ABI's descriptors of a list of tensors; up to four live inline, so
// a typical op call allocates nothing for them.
class Descs {
 public:
  explicit Descs(const Ptrs& ts) : n_(ts.size()) {
    if (n_ > kInline) {
      big_.reset(new Desc[n_]);
      big_t_.resize(n_);
    }
    Desc* d = big_ ? big_.get() : small_;
    tpurt_tensor* t = data();
    for (size_t i = 0; i < n_; ++i) {
      d[i].fill(*ts[i]);
      t[i] = d[i].t;
    }
  }
  tpurt_tensor* data() { return big_ ? big_t_.data() : small_t_; }
  size_t size() const { return n_; }

 private:
  static constexpr size_t kInline = 4;
  size_t n_;
  Desc small_[kInline];
  tpurt_tensor small_t_[kInline];
  std::unique_ptr<Desc[]> big_;
  std::vector<tpurt_tensor> big_t_;
};

// The precision of f32 products follows torch's
// set_float32_matmul_precision ("highest", "high", "medium": HIGHEST, HIGH,
// DEFAULT) until torch.tpu.precision sets one; checked before each op that
// reads it (torch's getter costs about 40 ns, 2% of a tiny op, so not
// before every op), passed to the runtime when it changed.
std::atomic<bool> g_precision_set{false};
std::atomic<int> g_precision_followed{-1};

void follow_torch_precision() {
  if (g_precision_set.load(std::memory_order_relaxed)) return;
  auto torch_p = at::globalContext().float32MatmulPrecision();
  int p = static_cast<int>(torch_p);
  if (g_precision_followed.load(std::memory_order_relaxed) == p) return;
  uint32_t code = torch_p == at::Float32MatmulPrecision::HIGHEST ? TPURT_PRECISION_HIGHEST
                  : torch_p == at::Float32MatmulPrecision::HIGH  ? TPURT_PRECISION_HIGH
                                                                 : TPURT_PRECISION_DEFAULT;
  check(tpurt_matmul_precision_set(code), "matmul precision (from torch.set_float32_matmul_precision)");
  g_precision_followed.store(p, std::memory_order_relaxed);
}

// The op's id, with torch's precision passed on first if the op reads it.
uint32_t prepared_op(const char* op) {
  OpInfo info = op_info(op);
  if (info.reads_precision) follow_torch_precision();
  return info.id;
}

std::vector<at::Tensor> call_ptrs(const char* op, const Ptrs& inputs, const Attrs& attrs) {
  int device = inputs.empty() ? current_device() : device_of(inputs, op);
  uint32_t id = prepared_op(op);
  std::vector<int64_t> wrapped;
  std::vector<at::Tensor> moved;
  Ptrs ins = on_device(inputs, device, op, moved, wrapped);
  std::optional<Attrs> extended;
  const Attrs& a = with_wrapped(attrs, wrapped, extended);
  // One call: the runtime allocates the outputs from the device's pool and
  // queues the op; the buffers become the storages of new tensors.
  Descs in_d(ins);
  std::array<tpurt_buffer, 8> bufs{};
  std::array<tpurt_tensor_type, 8> types{};
  std::array<uint64_t, 8> addrs{};
  size_t n_out = 0;
  const auto& items = a.items();
  check(tpurt_op_call(runtime(), id, in_d.data(), in_d.size(), items.data(), items.size(), static_cast<uint32_t>(device),
                      stream_handle(current_stream(device)), bufs.data(), types.data(), addrs.data(), bufs.size(),
                      &n_out),
        op);
  std::vector<at::Tensor> outs;
  outs.reserve(n_out);
  for (size_t i = 0; i < n_out; ++i) {
    outs.push_back(wrap_output(bufs[i], addrs[i], types[i], device));
  }
  return outs;
}

at::Tensor only(const char* op, std::vector<at::Tensor> outs) {
  TORCH_CHECK(outs.size() == 1, "tpu: op ", op, " returned ", outs.size(), " outputs, expected 1");
  return std::move(outs[0]);
}

void call_into_ptrs(const char* op, const Ptrs& inputs, const std::vector<at::Tensor>& outputs,
                    const Attrs& attrs) {
  uint32_t id = prepared_op(op);
  Ptrs outs = ptrs_of(outputs);
  int device = device_of(inputs.empty() ? outs : inputs, op);
  std::vector<int64_t> wrapped;
  std::vector<at::Tensor> moved;
  Ptrs ins = on_device(inputs, device, op, moved, wrapped);
  std::optional<Attrs> extended;
  const Attrs& a = with_wrapped(attrs, wrapped, extended);
  Descs in_d(ins);
  Descs out_d(outs);
  const auto& items = a.items();
  check(tpurt_op_launch(runtime(), id, in_d.data(), in_d.size(), out_d.data(), out_d.size(), items.data(),
                        items.size(), stream_handle(current_stream(device))),
        op);
}

}  // namespace

int device_of(const std::vector<at::Tensor>& inputs, const char* op) { return device_of(ptrs_of(inputs), op); }

uint32_t matmul_precision() {
  follow_torch_precision();
  uint32_t precision = 0;
  check(tpurt_matmul_precision_get(&precision), "matmul precision");
  return precision;
}
void set_matmul_precision(std::optional<uint32_t> precision) {
  if (!precision) {
    g_precision_set.store(false);
    g_precision_followed.store(-1);
    follow_torch_precision();
    return;
  }
  check(tpurt_matmul_precision_set(*precision), "set matmul precision");
  g_precision_set.store(true);
}
bool matmul_precision_follows_torch() { return !g_precision_set.load(); }

std::vector<at::Tensor> call(const char* op, Ins inputs, const Attrs& attrs) {
  return call_ptrs(op, ptrs_of(inputs), attrs);
}
std::vector<at::Tensor> call(const char* op, const std::vector<at::Tensor>& inputs, const Attrs& attrs) {
  return call_ptrs(op, ptrs_of(inputs), attrs);
}
at::Tensor call1(const char* op, Ins inputs, const Attrs& attrs) {
  return only(op, call_ptrs(op, ptrs_of(inputs), attrs));
}
at::Tensor call1(const char* op, const std::vector<at::Tensor>& inputs, const Attrs& attrs) {
  return only(op, call_ptrs(op, ptrs_of(inputs), attrs));
}
void call_into(const char* op, Ins inputs, const std::vector<at::Tensor>& outputs, const Attrs& attrs) {
  call_into_ptrs(op, ptrs_of(inputs), outputs, attrs);
}
void call_into(const char* op, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
               const Attrs& attrs) {
  call_into_ptrs(op, ptrs_of(inputs), outputs, attrs);
}

namespace {

// A scalar operand (x * 0.5, an optimizer's beta or step size) is an input
// tensor on the device, uploaded for the op: about 6 us of the caller's
// time and a task on the stream each. Inside one foreach op, where one
// value serves every tensor of the list (AdamW's foreach ops: 273 of the
// 323 uploads of a training step of the README's tiny Llama), each value
// is uploaded once, equal values of a scalar list too (AdamW's step sizes
// are one value per list), so the op's program depends on which of its
// scalars are equal: a pattern an optimizer repeats every step. Kept
// past the op, that would hold for every scalar of a deferred recording,
// whose shape (one parameter for two equal values, or two) would then
// change as values met by chance, each time a new program to compile.
struct ScalarKey {
  int device;
  at::ScalarType dtype;
  bool wrapped;
  uint64_t bits;
  bool operator==(const ScalarKey& o) const {
    return device == o.device && dtype == o.dtype && wrapped == o.wrapped && bits == o.bits;
  }
};
// This thread's scope: open while `depth` > 0, emptied when it closes.
struct ScalarScope {
  int depth = 0;
  std::vector<std::pair<ScalarKey, at::Tensor>> uploaded;
};
thread_local ScalarScope t_scalar_scope;

// The upload of `key`'s value in this thread's scope.
std::optional<at::Tensor> uploaded(const ScalarKey& key) {
  for (const auto& [k, t] : t_scalar_scope.uploaded) {
    if (k == key) return t;
  }
  return std::nullopt;
}

// `cpu` on `device`, kept in this thread's scope under `key` (given only
// while the scope is open).
at::Tensor upload_scalar(const at::Tensor& cpu, int device, bool wrapped, const std::optional<ScalarKey>& key) {
  at::Tensor t = empty({}, cpu.scalar_type(), device);
  copy_into(t, cpu, false);
  if (wrapped) {
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  if (key) {
    t_scalar_scope.uploaded.emplace_back(*key, t);
  }
  return t;
}

}  // namespace

ScalarUploadScope::ScalarUploadScope() { ++t_scalar_scope.depth; }

ScalarUploadScope::~ScalarUploadScope() {
  if (--t_scalar_scope.depth == 0) {
    t_scalar_scope.uploaded.clear();
  }
}

at::Tensor device_scalar(const at::Tensor& cpu, int device, bool wrapped) {
  TORCH_CHECK(cpu.dim() == 0 && cpu.device().is_cpu(), "tpu: device_scalar takes a 0-dim CPU tensor");
  std::optional<ScalarKey> key;
  if (size_t size = cpu.element_size(); t_scalar_scope.depth > 0 && size <= sizeof(uint64_t)) {
    uint64_t bits = 0;
    std::memcpy(&bits, cpu.const_data_ptr(), size);
    key = ScalarKey{device, cpu.scalar_type(), wrapped, bits};
    if (auto hit = uploaded(*key)) return *hit;
  }
  return upload_scalar(cpu, device, wrapped, key);
}

at::Tensor scalar_on(const at::Scalar& s, int device) {
  TORCH_CHECK(!s.isComplex(), "tpu: complex scalars are not supported");
  at::ScalarType dtype = s.isBoolean() ? at::kBool : s.isIntegral(false) ? at::kLong : at::kDouble;
  std::optional<ScalarKey> key;
  if (t_scalar_scope.depth > 0) {
    uint64_t bits = 0;
    if (dtype == at::kBool) {
      bits = s.toBool() ? 1 : 0;
    } else if (dtype == at::kLong) {
      int64_t v = s.toLong();
      std::memcpy(&bits, &v, sizeof v);
    } else {
      double v = s.toDouble();
      std::memcpy(&bits, &v, sizeof v);
    }
    key = ScalarKey{device, dtype, true, bits};
    if (auto hit = uploaded(*key)) return *hit;
  }
  return upload_scalar(at::scalar_tensor(s, dtype), device, true, key);
}

}  // namespace tpurt_torch
