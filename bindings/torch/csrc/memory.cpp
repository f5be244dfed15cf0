// The allocator (the HBM pool behind every tpu storage), resize, empty
// tensors and copies between devices.
#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "common.h"

namespace tpurt_torch {

namespace {

// A storage's DataPtr: the data pointer is the buffer's device address (a
// name, never dereferenced here: torch compares and offsets it), the
// context this struct.
struct BufferCtx {
  tpurt_buffer buffer;
};

void free_buffer(void* ctx) {
  auto* c = static_cast<BufferCtx*>(ctx);
  // Stream-ordered in the runtime: the memory is reused only after queued
  // work that reads or writes it finished. A failure here has no caller to
  // report to (a deleter must not throw); the runtime counts the buffer.
  tpurt_status_destroy(tpurt_buffer_free(c->buffer));
  delete c;
}

class TpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override { return tpurt_torch::allocate(current_device(), nbytes); }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(false, "tpu: copy_data on device addresses is not supported; use Tensor.copy_");
  }
};

TpuAllocator g_allocator;

}  // namespace

// Torch looks the allocator up by device type where it has no tensor to go
// by (torch.UntypedStorage(n, device="tpu"), which Storage.clone and so
// copy.deepcopy of a tpu tensor use); unregistered, it is null there.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

c10::Allocator* allocator() { return &g_allocator; }

namespace {
c10::DataPtr data_ptr_of(tpurt_buffer b, int device);

// The DataPtr of a buffer whose device address is known: the address as
// the data pointer, the buffer (freed with it) as the context.
c10::DataPtr data_ptr_at(tpurt_buffer b, uint64_t address, int device) {
  return c10::DataPtr(reinterpret_cast<void*>(address), new BufferCtx{b}, &free_buffer,
                      c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
}
}  // namespace

c10::DataPtr allocate(int device, size_t nbytes) {
  check_device(device);
  tpurt_buffer b{0};
  auto stream = stream_handle(current_stream(device));
  check(tpurt_buffer_allocate(runtime(), static_cast<uint32_t>(device), nbytes, stream, &b),
        "allocating " + std::to_string(nbytes) + " bytes on tpu:" + std::to_string(device));
  return data_ptr_of(b, device);
}

at::Tensor wrap_output(tpurt_buffer buffer, uint64_t address, const tpurt_tensor_type& ty, int device) {
  auto dtype = scalar_type_of(ty.dtype);
  size_t numel = 1;
  for (uint32_t d = 0; d < ty.ndim; ++d) numel *= ty.sizes[d];
  c10::Storage storage(c10::Storage::use_byte_size_t(), numel * c10::elementSize(dtype),
                       data_ptr_at(buffer, address, device), allocator(), true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                    c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                    caffe2::TypeMeta::fromScalarType(dtype));
  int64_t sizes[TPURT_MAX_DIMS];
  for (uint32_t d = 0; d < ty.ndim; ++d) sizes[d] = static_cast<int64_t>(ty.sizes[d]);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(c10::IntArrayRef(sizes, ty.ndim));
  return t;
}

namespace {
c10::DataPtr data_ptr_of(tpurt_buffer b, int device) {
  uint64_t address = 0;
  tpurt_status* s = tpurt_buffer_get_address(b, &address);
  if (s != nullptr) {
    tpurt_status_destroy(tpurt_buffer_free(b));
    check(s, "reading a buffer's address");
  }
  return data_ptr_at(b, address, device);
}
}  // namespace

tpurt_buffer buffer_of_data_ptr(const c10::DataPtr& dp) {
  TORCH_CHECK(dp.get_deleter() == &free_buffer,
              "tpu: this storage was not allocated by tpurt (device ", dp.device(), ")");
  return static_cast<BufferCtx*>(dp.get_context())->buffer;
}

tpurt_buffer buffer_of(const c10::Storage& s) { return buffer_of_data_ptr(s.data_ptr()); }

tpurt_buffer buffer_of(const at::Tensor& t) {
  TORCH_CHECK(t.has_storage(), "tpu: the tensor has no storage");
  return buffer_of(t.storage());
}

at::Tensor empty(at::IntArrayRef size, at::ScalarType dtype, int device) {
  c10::DeviceGuard g(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
  dtype_of(dtype);
  return at::detail::empty_generic(size, allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   dtype, std::nullopt);
}

void resize_bytes(const c10::Storage& storage, size_t nbytes) {
  TORCH_CHECK(storage.resizable(), "tpu: trying to resize a storage that is not resizable");
  int device = storage.device().index();
  c10::DataPtr fresh = allocate(device, nbytes);
  size_t keep = std::min(nbytes, storage.nbytes());
  if (keep > 0) {
    // The old bytes, as bytes, into the new buffer, in stream order.
    tpurt_buffer src = buffer_of(storage);
    auto* ctx = static_cast<BufferCtx*>(fresh.get_context());
    uint64_t sizes[1] = {keep};
    tpurt_layout l{};
    l.struct_size = sizeof(l);
    l.ndim = 1;
    l.elem_size = 1;
    l.sizes = sizes;
    check(tpurt_copy_device_to_device(src, &l, ctx->buffer, &l, stream_handle(current_stream(device)),
                                      TPURT_COPY_ASYNC),
          "keeping a storage's bytes while resizing it");
  }
  const_cast<c10::Storage&>(storage).set_data_ptr_noswap(std::move(fresh));
  const_cast<c10::Storage&>(storage).set_nbytes(nbytes);
}

namespace {

bool is_tpu(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

void host_to_device(const at::Tensor& dst, const at::Tensor& src) {
  // Cast and broadcast on the host, then one strided copy in.
  at::Tensor host = src.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
  LayoutDesc l(dst);
  int device = dst.device().index();
  check(tpurt_copy_host_to_device(host.data_ptr(), host.nbytes(), buffer_of(dst), &l.l,
                                  stream_handle(current_stream(device)), TPURT_COPY_ASYNC),
        "copying to " + dst.device().str());
}

void device_to_host(const at::Tensor& dst, const at::Tensor& src) {
  at::Tensor s = src.expand(dst.sizes());
  bool direct = dst.is_contiguous() && dst.scalar_type() == s.scalar_type();
  at::Tensor host = direct ? dst : at::empty(dst.sizes(), at::TensorOptions().dtype(s.scalar_type()));
  LayoutDesc l(s);
  int device = src.device().index();
  // Synchronous: the host memory is pageable and the caller reads it next.
  check(tpurt_copy_device_to_host(buffer_of(s), &l.l, host.data_ptr(), host.nbytes(),
                                  stream_handle(current_stream(device)), 0),
        "copying from " + src.device().str());
  if (!direct) {
    dst.copy_(host);
  }
}

void device_to_device(const at::Tensor& dst, const at::Tensor& src) {
  int dd = dst.device().index();
  int sd = src.device().index();
  if (dd == sd) {
    at::Tensor from = src;
    if (buffer_of(src).handle == buffer_of(dst).handle) {
      // Overlapping views of one buffer: read everything before writing.
      c10::DeviceGuard g(src.device());
      from = call1("copy", {src});
    }
    // One op: cast, broadcast and write through dst's strides.
    Attrs a;
    a.dtype("dtype", dst.scalar_type());
    a.ints("size", dst.sizes());
    c10::DeviceGuard g(dst.device());
    call_into("copy", {from}, {dst}, a);
    return;
  }
  at::Tensor s = src;
  if (s.scalar_type() != dst.scalar_type() || !s.sizes().equals(dst.sizes())) {
    c10::DeviceGuard g(src.device());
    s = empty(dst.sizes(), dst.scalar_type(), sd);
    copy_into(s, src, false);
  }
  LayoutDesc ls(s);
  LayoutDesc ld(dst);
  // Ordered after the work queued so far on both devices' current streams:
  // the copy runs on dst's stream, which first waits for src's.
  tpurt_stream dst_stream = stream_handle(current_stream(dd));
  check(tpurt_stream_wait_stream(dst_stream, stream_handle(current_stream(sd))),
        "ordering a cross-device copy");
  check(tpurt_copy_device_to_device(buffer_of(s), &ls.l, buffer_of(dst), &ld.l, dst_stream,
                                    TPURT_COPY_ASYNC),
        "copying from " + src.device().str() + " to " + dst.device().str());
}

}  // namespace

void copy_region(const at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK(is_tpu(dst) && is_tpu(src) && dst.device() == src.device(),
              "copy_region: both tensors must be on one tpu device, not ", src.device(), " and ", dst.device());
  TORCH_CHECK(dst.scalar_type() == src.scalar_type(), "copy_region: dtypes differ (", src.scalar_type(), " into ",
              dst.scalar_type(), ")");
  TORCH_CHECK(dst.sizes().equals(src.sizes()), "copy_region: sizes differ (", src.sizes(), " into ", dst.sizes(),
              ")");
  if (dst.numel() == 0) {
    return;
  }
  // A strided copy by the runtime on the current stream: no program, so
  // sizes that change from call to call compile nothing.
  LayoutDesc ls(src);
  LayoutDesc ld(dst);
  check(tpurt_copy_device_to_device(buffer_of(src), &ls.l, buffer_of(dst), &ld.l,
                                    stream_handle(current_stream(dst.device().index())), TPURT_COPY_ASYNC),
        "copy_region");
}

void copy_into(const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  if (dst.numel() == 0) {
    return;
  }
  if (is_tpu(dst) && is_tpu(src)) {
    device_to_device(dst, src);
  } else if (is_tpu(dst)) {
    host_to_device(dst, src);
  } else if (is_tpu(src)) {
    device_to_host(dst, src);
  } else {
    dst.copy_(src, non_blocking);
  }
}

}  // namespace tpurt_torch
