// Factories, views and metadata ops: they alias storage instead of
// copying, as on CPU and CUDA, so an in-place write through a view is seen
// by every tensor that shares the storage.
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include "common.h"

namespace tpurt_torch {
namespace {

int device_index(std::optional<at::Device> device) {
  if (!device.has_value() || !device->has_index()) {
    return current_device();
  }
  TORCH_CHECK(device->type() == c10::DeviceType::PrivateUse1, "tpu: expected a tpu device, got ", *device);
  return device->index();
}

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided, "tpu: only strided tensors are supported, got ",
              *layout);
  int d = device_index(device);
  check_device(d);
  auto st = dtype.value_or(at::get_default_dtype_as_scalartype());
  dtype_of(st);
  c10::DeviceGuard g(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(d)));
  return at::detail::empty_generic(size, allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   st, memory_format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided, "tpu: only strided tensors are supported");
  int d = device_index(device);
  check_device(d);
  auto st = dtype.value_or(at::get_default_dtype_as_scalartype());
  dtype_of(st);
  c10::DeviceGuard g(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(d)));
  return at::detail::empty_strided_generic(size, stride, allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), st);
}

// Bytes a (sizes, strides, offset) view needs in its storage.
size_t needed_bytes(at::IntArrayRef size, at::IntArrayRef stride, int64_t offset, size_t itemsize) {
  int64_t numel = 1;
  for (auto s : size) numel *= s;
  if (numel == 0) {
    return 0;
  }
  int64_t last = offset;
  for (size_t i = 0; i < size.size(); ++i) last += (size[i] - 1) * stride[i];
  return static_cast<size_t>(last + 1) * itemsize;
}

void grow_storage_for(const at::Tensor& self) {
  size_t need = needed_bytes(self.sizes(), self.strides(), self.storage_offset(), self.itemsize());
  if (need > self.storage().nbytes()) {
    resize_bytes(self.storage(), need);
  }
}

const at::Tensor& resize_(const at::Tensor& self, at::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  auto fmt = memory_format.value_or(at::MemoryFormat::Contiguous);
  TORCH_CHECK(fmt != at::MemoryFormat::Preserve, "tpu: resize_ does not take memory format Preserve");
  if (self.sizes().equals(size) && fmt == at::MemoryFormat::Contiguous) {
    return self;
  }
  impl->set_sizes_contiguous(size);
  if (fmt != at::MemoryFormat::Contiguous) {
    impl->empty_tensor_restride(fmt);
  }
  grow_storage_for(self);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, int64_t offset, at::IntArrayRef size,
                        at::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1, "tpu: set_ expects a tpu storage, got ",
              source.device());
  auto* impl = self.unsafeGetTensorImpl();
  if (!self.storage().is_alias_of(source)) {
    impl->set_storage_keep_dtype(std::move(source));
  }
  TORCH_CHECK(offset >= 0, "tpu: set_: storage offset must be non-negative, got ", offset);
  impl->set_storage_offset(offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    TORCH_CHECK(size.size() == stride.size(), "tpu: set_: ", size.size(), " sizes but ", stride.size(),
                " strides");
    impl->set_sizes_and_strides(size, stride);
  }
  grow_storage_for(self);
  return self;
}

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage source, c10::SymInt offset,
                                      c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return set_storage(self, std::move(source), offset.expect_int(), C10_AS_INTARRAYREF_SLOW(size),
                     C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  size_t n = source.nbytes() / self.itemsize();
  return set_storage(self, std::move(source), 0, {static_cast<int64_t>(n)}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) {
    return self;
  }
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage fresh(c10::Storage::use_byte_size_t(), 0, allocate(self.device().index(), 0), allocator(),
                     true);
  return set_storage(self, fresh, 0, {0}, {});
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "tpu: a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  at::Tensor host = at::empty({}, at::TensorOptions().dtype(self.scalar_type()));
  copy_into(host, self.reshape({}), false);
  return host.item();
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  // tpu and CPU dense tensors may take each other's place in
  // `param.data = ...` (Module.to keeps tied weights tied that way).
  auto dense = [](const at::Tensor& t) {
    return t.layout() == at::kStrided &&
           (t.device().type() == c10::DeviceType::PrivateUse1 || t.device().type() == c10::DeviceType::CPU);
  };
  if (dense(self) && dense(from)) {
    return true;
  }
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  copy_into(dst, self, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (!dst.sizes().equals(self.sizes())) {
    resize_(dst, self.sizes(), std::nullopt);
  }
  copy_into(dst, self, false);
  return dst;
}

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  if (self.numel() == 0) {
    return self;
  }
  copy_into(self, scalar_on(value, self.device().index()), false);
  return self;
}

at::Tensor& fill_tensor(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "tpu: fill_ takes a 0-dim value tensor, got ", value.dim(), " dimensions");
  copy_into(self, value, false);
  return self;
}

// Zeros. Under DEFER_AND_FUSE from the runtime's `full`: a constant of
// the recorded graph, where fill_ uploads its value from the host as a
// parameter; the graph then knows the value: the sum of zero tensors
// updated in disjoint slices (slice_backward's, for a tensor sliced in
// parts) becomes one concatenation (runtime/src/fusion/simplify.rs). In
// the other modes a contiguous tensor is zeroed by a byte fill on its
// stream: no program per shape (autograd's zero gradients of a compiled
// graph's unused outputs would otherwise compile one per sequence length).
at::Tensor& zero_(at::Tensor& self) {
  if (self.numel() == 0) {
    return self;
  }
  uint32_t mode = 0;
  check(tpurt_eager_mode_get(&mode), "eager mode");
  if (mode != TPURT_EAGER_DEFER_AND_FUSE && self.is_contiguous()) {
    uint64_t offset = static_cast<uint64_t>(self.storage_offset()) * self.element_size();
    uint64_t size = static_cast<uint64_t>(self.numel()) * self.element_size();
    check(tpurt_buffer_fill(buffer_of(self), offset, size, 0, stream_handle(current_stream(self.device().index())),
                            mode == TPURT_EAGER_DEFER_NEVER ? TPURT_COPY_ASYNC : 0),
          "zero_");
    return self;
  }
  call_into("full", std::vector<at::Tensor>{}, {self},
            Attrs().ints("size", self.sizes()).f("value", 0.0).dtype("dtype", self.scalar_type()));
  return self;
}

void record_stream(at::Tensor& self, c10::Stream s) {
  check(tpurt_buffer_record_stream(buffer_of(self), stream_handle(s)), "record_stream");
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("fill_.Scalar", fill_scalar);
  m.impl("fill_.Tensor", fill_tensor);
  m.impl("zero_", zero_);
  m.impl("record_stream", record_stream);
}

// _has_compatible_shallow_copy_type is called with a CPU tensor and a tpu
// tensor (Module._apply asks it before `param.data = moved`); its default
// kernel sits at the Autograd keys, so ours goes there too.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

}  // namespace tpurt_torch
