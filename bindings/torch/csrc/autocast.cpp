// torch.autocast("tpu"): torch's own cast policies (the op lists CUDA
// uses) registered at the AutocastPrivateUse1 key; every other op falls
// through. Matmuls, convolutions and attention run in the autocast dtype
// (bfloat16 or float16, torch.tpu.get_amp_supported_dtype), norms, losses,
// softmax and reductions in float32.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace tpurt_torch {
namespace {

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

#define TPU_LOW_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TPU_LOW_PRECISION_FP)
  AT_FORALL_FP32(TPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_PROMOTE(TPU_PROMOTE)
}

}  // namespace
}  // namespace tpurt_torch
