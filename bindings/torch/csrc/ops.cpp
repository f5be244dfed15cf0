// Native tpu kernels: aten ops mapped onto the runtime's op library (one
// C ABI call each). Semantics (promotion, broadcasting, reductions) are the
// op library's, which follows torch; this file only maps arguments.
//
// Functional, in-place and out= overloads share one body: in-place and
// out= compute the functional result, then write it through the target's
// strides (one fused copy under defer-and-fuse). The in-place binary
// arithmetic ops write their target directly when their result has its
// type and shape (`inplace_binary`): one launch instead of two.
#include <cstring>

#include <ATen/ops/_foreach_add_native.h>
#include <ATen/ops/_foreach_addcdiv_native.h>
#include <ATen/ops/_foreach_addcmul_native.h>
#include <ATen/ops/_foreach_div_native.h>
#include <ATen/ops/_foreach_lerp_native.h>
#include <ATen/ops/_foreach_mul_native.h>
#include <ATen/ops/_foreach_sqrt_native.h>
#include <ATen/ops/_foreach_sub_native.h>
#include <ATen/ops/_foreach_neg_native.h>
#include <ATen/ops/_foreach_maximum_native.h>
#include <ATen/ops/_foreach_norm_native.h>
#include <ATen/ops/_foreach_copy_native.h>
#include <ATen/ops/_foreach_zero_native.h>
#include <ATen/ops/_foreach_pow_native.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <numeric>

#include "common.h"
#include "fallback.h"
#include "generator.h"

namespace tpurt_torch {
namespace {

using at::Scalar;
using at::Tensor;
using OptTensor = std::optional<Tensor>;

int dev(const Tensor& t) { return t.device().index(); }
Tensor S(const Scalar& s, const Tensor& like) { return scalar_on(s, dev(like)); }

// The result written into `out` (resized if its shape differs), as out=.
Tensor& into(Tensor& out, const Tensor& r) {
  if (!out.sizes().equals(r.sizes())) {
    TORCH_CHECK(out.numel() == 0 || out.is_contiguous(),
                "tpu: an out= tensor of the wrong shape must be empty or contiguous to be resized");
    out.resize_(r.sizes());
  }
  copy_into(out, r, false);
  return out;
}

// The result written back into `self`, as an in-place op.
Tensor& inplace(Tensor& self, const Tensor& r) {
  TORCH_CHECK(at::canCast(r.scalar_type(), self.scalar_type()), "result type ", r.scalar_type(),
              " can't be cast to the desired output type ", self.scalar_type());
  TORCH_CHECK(r.sizes().equals(self.sizes()) || at::infer_size(r.sizes(), self.sizes()) == self.sizes(),
              "output with shape ", self.sizes(), " doesn't match the broadcast shape ", r.sizes());
  copy_into(self, r, false);
  return self;
}

// Whether `op(a, b)` may write `a` directly: its result has a's dtype and
// shape. `a` is a contiguous floating tensor; `b`, on a's device, has a's
// dtype or is a wrapped Python number (which does not promote a floating
// tensor), broadcasts to a's shape, and shares no memory with `a` unless
// it is `a` (the runtime reads inputs that an output overwrites first).
bool writes_in_place(const Tensor& a, const Tensor& b) {
  if (!a.is_floating_point() || !a.is_contiguous() || a.device() != b.device() || b.is_complex()) return false;
  if (b.scalar_type() != a.scalar_type() && !b.unsafeGetTensorImpl()->is_wrapped_number()) return false;
  if (!at::is_expandable_to(b.sizes(), a.sizes())) return false;
  return !b.is_alias_of(a) || b.is_same(a);
}

// Ops whose result on two floating operands of one dtype has that dtype
// (comparisons, which share the registration macro, give bool).
bool keeps_float_type(const char* op) {
  for (const char* k : {"add", "sub", "mul", "div", "remainder", "fmod"}) {
    if (std::strcmp(op, k) == 0) return true;
  }
  return false;
}

// In-place binary `op` of `a` and `b`: straight into `a` where
// `writes_in_place` (and `op` keeps the type), else the result copied
// into `a`.
Tensor& inplace_binary(Tensor& a, const char* op, const Tensor& b) {
  if (keeps_float_type(op) && writes_in_place(a, b)) {
    call_into(op, {a, b}, {a});
    return a;
  }
  return inplace(a, call1(op, {a, b}));
}

Attrs dims_attrs(at::OptionalIntArrayRef dim, bool keepdim) {
  Attrs a;
  if (dim.has_value() && !dim->empty()) {
    a.ints("dim", *dim);
  }
  a.b("keepdim", keepdim);
  return a;
}

// --- pointwise -------------------------------------------------------------

// Scalars that change from call to call (a learning rate, a step size)
// go in as wrapped 0-dim inputs, never as attributes: an attribute is part
// of the compiled graph's key, so each new value would compile anew.
bool is_one(const Scalar& s) { return s.isIntegral(true) ? s.toLong() == 1 : s.toDouble() == 1.0; }

// The inputs of a ± b·alpha: alpha a third input, a wrapped number, which
// the op library applies as torch does (rounded to the result dtype, and
// for bf16 and f16 at f32 with one rounding of the sum).
std::vector<Tensor> with_alpha(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  if (is_one(alpha)) return {a, b};
  return {a, b, S(alpha, b)};
}

void check_alpha(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  bool integral = !a.is_floating_point() && !b.is_floating_point();
  TORCH_CHECK(!(integral && alpha.isFloatingPoint()),
              "For integral input tensors, argument alpha must not be a floating point number.");
}
Tensor k_add(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  check_alpha(a, b, alpha);
  return call1("add", with_alpha(a, b, alpha));
}
Tensor k_sub(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  check_alpha(a, b, alpha);
  return call1("sub", with_alpha(a, b, alpha));
}

// a += alpha·b or a -= alpha·b (`op` "add" or "sub"): straight into `a`
// when alpha is one (see `inplace_binary`), else the result copied in.
Tensor& inplace_add_sub(Tensor& a, const char* op, const Tensor& b, const Scalar& alpha) {
  check_alpha(a, b, alpha);
  if (is_one(alpha)) return inplace_binary(a, op, b);
  return inplace(a, call1(op, with_alpha(a, b, alpha)));
}
Tensor k_div_mode(const Tensor& a, const Tensor& b, std::optional<c10::string_view> mode) {
  Attrs at;
  if (mode.has_value()) {
    at.str("rounding_mode", std::string(*mode));
  }
  return call1("div", {a, b}, at);
}
Tensor k_where(const Tensor& c, const Tensor& a, const Tensor& b) { return call1("where", {c, a, b}); }
Tensor k_masked_fill_s(const Tensor& self, const Tensor& mask, const Scalar& v) {
  return k_where(mask, S(v, self).to(self.scalar_type()), self);
}
Tensor k_masked_fill_t(const Tensor& self, const Tensor& mask, const Tensor& v) {
  TORCH_CHECK(v.dim() == 0, "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
              v.dim(), " dimension(s).");
  Tensor val = v.device().type() == c10::DeviceType::PrivateUse1 ? v : v.to(self.device());
  return k_where(mask, val.to(self.scalar_type()), self);
}
Tensor k_clamp(const Tensor& x, const std::optional<Scalar>& lo, const std::optional<Scalar>& hi) {
  Attrs at;
  if (lo.has_value()) at.f("min", lo->toDouble());
  if (hi.has_value()) at.f("max", hi->toDouble());
  return call1("clamp", {x}, at);
}
Tensor k_clamp_t(const Tensor& x, const OptTensor& lo, const OptTensor& hi) {
  Tensor r = x;
  if (lo.has_value() && lo->defined()) r = call1("maximum", {r, *lo});
  if (hi.has_value() && hi->defined()) r = call1("minimum", {r, *hi});
  return r.is_same(x) ? call1("copy", {x}) : r;
}
// aminmax: amin and amax over one dim or all (a 0-dim tensor has no dim
// to name but 0 or -1), as torch checks.
std::tuple<Tensor, Tensor> k_aminmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  if (dim.has_value()) {
    TORCH_CHECK(x.dim() > 0 || *dim == 0 || *dim == -1, "aminmax: Expected dim to be 0 or -1 for a 0-dim tensor");
    TORCH_CHECK(x.dim() == 0 || x.size(at::maybe_wrap_dim(*dim, x.dim())) > 0,
                "aminmax(): Expected reduction dim ", *dim, " to have non-zero size.");
    if (x.dim() == 0) return {call1("copy", {x}), call1("copy", {x})};
    Attrs a = dims_attrs(at::IntArrayRef(*dim), keepdim);
    return {call1("amin", {x}, a), call1("amax", {x}, a)};
  }
  TORCH_CHECK(x.numel() > 0, "aminmax(): cannot compute aminmax over an empty dimension as the operation has no ",
              "identity.");
  Tensor mn = call1("amin", {x}, dims_attrs(std::nullopt, false));
  Tensor mx = call1("amax", {x}, dims_attrs(std::nullopt, false));
  if (keepdim && x.dim() > 0) {
    std::vector<int64_t> ones(x.dim(), 1);
    return {mn.reshape(ones), mx.reshape(ones)};
  }
  return {mn, mx};
}
// eye into out's dtype, on out's device.
Tensor k_eye(int64_t n, int64_t m, const Tensor& out) {
  c10::OptionalDeviceGuard guard(out.device());
  return call("eye", {}, Attrs().i("n", n).i("m", m).dtype("dtype", out.scalar_type()))[0];
}
Tensor k_gelu(const Tensor& x, c10::string_view approximate) {
  return call1("gelu", {x}, Attrs().str("approximate", std::string(approximate)));
}
Tensor k_lerp_s(const Tensor& a, const Tensor& b, const Scalar& w) { return call1("lerp", {a, b, S(w, a)}); }
Tensor k_lerp_t(const Tensor& a, const Tensor& b, const Tensor& w) { return call1("lerp", {a, b, w}); }
// self + value * t1 * t2 and self + value * t1 / t2, in torch's order of
// operations (value * t1 first), the value a fourth input (a wrapped
// number) that the op library applies at f32 for bf16 and f16, as torch.
std::vector<Tensor> with_value(const Tensor& s, const Tensor& a, const Tensor& b, const Scalar& v) {
  if (is_one(v)) return {s, a, b};
  return {s, a, b, S(v, a)};
}
Tensor k_addcmul(const Tensor& s, const Tensor& a, const Tensor& b, const Scalar& v) {
  return call1("addcmul", with_value(s, a, b, v));
}
Tensor k_addcdiv(const Tensor& s, const Tensor& a, const Tensor& b, const Scalar& v) {
  return call1("addcdiv", with_value(s, a, b, v));
}

// x ** s: the common exponents become cheaper ops (as torch's own kernel
// does), since a model's exponent is a constant and pow costs far more
// than a multiply. Integer tensors keep pow (and its promotion).
Tensor k_pow_scalar(const Tensor& a, const Scalar& b) {
  if (a.is_floating_point() && !b.isComplex()) {
    double e = b.toDouble();
    if (e == 2.0) return call1("square", {a});
    if (e == 0.5) return call1("sqrt", {a});
    if (e == -0.5) return call1("rsqrt", {a});
    if (e == -1.0) return call1("reciprocal", {a});
    if (e == 1.0) return call1("copy", {a});
  }
  return call1("pow", {a, S(b, a)});
}

// --- reductions --------------------------------------------------------------

// A reduction op over `dim` (all when none) with an optional result dtype:
// sum, mean, nansum.
Tensor dims_reduce(const char* op, const Tensor& x, at::OptionalIntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dt) {
  Attrs a = dims_attrs(dim, keepdim);
  if (dt.has_value()) a.dtype("dtype", *dt);
  return call1(op, {x}, a);
}
Tensor k_sum_dim(const Tensor& x, at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dt) {
  return dims_reduce("sum", x, dim, keepdim, dt);
}
Tensor k_sum_all(const Tensor& x, std::optional<at::ScalarType> dt) { return k_sum_dim(x, std::nullopt, false, dt); }
Tensor k_mean_dim(const Tensor& x, at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dt) {
  return dims_reduce("mean", x, dim, keepdim, dt);
}
Tensor k_mean_all(const Tensor& x, std::optional<at::ScalarType> dt) { return k_mean_dim(x, std::nullopt, false, dt); }
Tensor k_amax(const Tensor& x, at::IntArrayRef dim, bool keepdim) { return call1("amax", {x}, dims_attrs(dim, keepdim)); }
Tensor k_amin(const Tensor& x, at::IntArrayRef dim, bool keepdim) { return call1("amin", {x}, dims_attrs(dim, keepdim)); }
Tensor k_max_all(const Tensor& x) { return call1("amax", {x}, dims_attrs(std::nullopt, false)); }
Tensor k_min_all(const Tensor& x) { return call1("amin", {x}, dims_attrs(std::nullopt, false)); }
std::tuple<Tensor, Tensor> k_max_dim(const Tensor& x, int64_t dim, bool keepdim) {
  auto r = call("max_dim", {x}, Attrs().i("dim", dim).b("keepdim", keepdim));
  return {r[0], r[1]};
}
std::tuple<Tensor, Tensor> k_min_dim(const Tensor& x, int64_t dim, bool keepdim) {
  auto r = call("min_dim", {x}, Attrs().i("dim", dim).b("keepdim", keepdim));
  return {r[0], r[1]};
}
Tensor k_argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  Attrs a;
  if (dim.has_value()) a.i("dim", *dim);
  return call1("argmax", {x}, a.b("keepdim", keepdim));
}
Tensor k_argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  Attrs a;
  if (dim.has_value()) a.i("dim", *dim);
  return call1("argmin", {x}, a.b("keepdim", keepdim));
}
Tensor k_prod_dim(const Tensor& x, int64_t dim, bool keepdim, std::optional<at::ScalarType> dt) {
  Tensor in = dt.has_value() ? x.to(*dt) : x;
  return call1("prod", {in}, Attrs().ints("dim", {dim}).b("keepdim", keepdim));
}
Tensor k_prod_all(const Tensor& x, std::optional<at::ScalarType> dt) {
  Tensor in = dt.has_value() ? x.to(*dt) : x;
  return call1("prod", {in}, dims_attrs(std::nullopt, false));
}
Tensor k_var_c(const Tensor& x, at::OptionalIntArrayRef dim, const std::optional<Scalar>& corr, bool keepdim) {
  Attrs a = dims_attrs(dim, keepdim);
  a.f("correction", corr.has_value() ? corr->toDouble() : 1.0);
  return call1("var", {x}, a);
}
Tensor k_std_c(const Tensor& x, at::OptionalIntArrayRef dim, const std::optional<Scalar>& corr, bool keepdim) {
  Attrs a = dims_attrs(dim, keepdim);
  a.f("correction", corr.has_value() ? corr->toDouble() : 1.0);
  return call1("std", {x}, a);
}
Tensor k_logsumexp(const Tensor& x, at::IntArrayRef dim, bool keepdim) {
  return call1("logsumexp", {x}, dims_attrs(dim, keepdim));
}
Tensor k_any_dims(const Tensor& x, at::OptionalIntArrayRef dim, bool keepdim) {
  return call1("any", {x}, dims_attrs(dim, keepdim));
}
Tensor k_any_dim(const Tensor& x, int64_t dim, bool keepdim) { return call1("any", {x}, dims_attrs(at::IntArrayRef{dim}, keepdim)); }
Tensor k_any_all(const Tensor& x) { return call1("any", {x}, dims_attrs(std::nullopt, false)); }
Tensor k_all_dims(const Tensor& x, at::OptionalIntArrayRef dim, bool keepdim) {
  return call1("all", {x}, dims_attrs(dim, keepdim));
}
Tensor k_all_dim(const Tensor& x, int64_t dim, bool keepdim) { return call1("all", {x}, dims_attrs(at::IntArrayRef{dim}, keepdim)); }
Tensor k_all_all(const Tensor& x) { return call1("all", {x}, dims_attrs(std::nullopt, false)); }
Tensor k_cumsum(const Tensor& x, int64_t dim, std::optional<at::ScalarType> dt) {
  Tensor in = dt.has_value() ? x.to(*dt) : x;
  Tensor r = call1("cumsum", {in}, Attrs().i("dim", dim));
  // The op promotes integers to int64, as torch does without a dtype; a
  // dtype given wins (grouped_mm's offsets are a cumsum to int32).
  return dt.has_value() && r.scalar_type() != *dt ? r.to(*dt) : r;
}
Tensor k_cumprod(const Tensor& x, int64_t dim, std::optional<at::ScalarType> dt) {
  Tensor in = dt.has_value() ? x.to(*dt) : x;
  Tensor r = call1("cumprod", {in}, Attrs().i("dim", dim));
  return dt.has_value() && r.scalar_type() != *dt ? r.to(*dt) : r;
}
Tensor k_vector_norm(const Tensor& x, const Scalar& ord, at::OptionalIntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dt) {
  Tensor in = dt.has_value() ? x.to(*dt) : x;
  Attrs a = dims_attrs(dim, keepdim);
  a.f("p", ord.toDouble());
  return call1("norm", {in}, a);
}
// The legacy torch.norm over dims (what pairwise_distance and
// triplet_margin_loss call): a vector norm, p 2 by default.
Tensor k_norm_dims(const Tensor& x, const std::optional<Scalar>& p, at::IntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dt) {
  return k_vector_norm(x, p.value_or(2), dim, keepdim, dt);
}
Tensor k_norm_all(const Tensor& x, const std::optional<Scalar>& p, std::optional<at::ScalarType> dt) {
  return k_vector_norm(x, p.value_or(2), std::nullopt, false, dt);
}
// count_nonzero: the sum of x != 0 over `dim` (every dim when empty), int64.
Tensor k_count_nonzero(const Tensor& x, at::IntArrayRef dim) {
  return at::ne(x, 0).sum(dim, false, at::kLong);
}

// --- linear algebra ------------------------------------------------------------

Tensor k_mm(const Tensor& a, const Tensor& b) { return call1("mm", {a, b}); }
Tensor k_bmm(const Tensor& a, const Tensor& b) { return call1("bmm", {a, b}); }
Tensor k_addmm(const Tensor& s, const Tensor& a, const Tensor& b, const Scalar& beta, const Scalar& alpha) {
  return call1("addmm", {s, a, b}, Attrs().f("beta", beta.toDouble()).f("alpha", alpha.toDouble()));
}
Tensor k_baddbmm(const Tensor& s, const Tensor& a, const Tensor& b, const Scalar& beta, const Scalar& alpha) {
  return call1("baddbmm", {s, a, b}, Attrs().f("beta", beta.toDouble()).f("alpha", alpha.toDouble()));
}
Tensor k_dot(const Tensor& a, const Tensor& b) { return call1("dot", {a, b}); }

// --- nn ----------------------------------------------------------------------------

Tensor k_softmax(const Tensor& x, int64_t dim, bool half_to_float) {
  Attrs a;
  a.i("dim", dim);
  if (half_to_float) a.dtype("dtype", at::kFloat);
  return call1("softmax", {x}, a);
}
Tensor k_log_softmax(const Tensor& x, int64_t dim, bool half_to_float) {
  Attrs a;
  a.i("dim", dim);
  if (half_to_float) a.dtype("dtype", at::kFloat);
  return call1("log_softmax", {x}, a);
}
Tensor k_softmax_bw(const Tensor& g, const Tensor& out, int64_t dim, at::ScalarType input_dtype) {
  return call1("softmax_backward", {g, out}, Attrs().i("dim", dim).dtype("input_dtype", input_dtype));
}
Tensor k_log_softmax_bw(const Tensor& g, const Tensor& out, int64_t dim, at::ScalarType input_dtype) {
  return call1("log_softmax_backward", {g, out}, Attrs().i("dim", dim).dtype("input_dtype", input_dtype));
}

// The optional (weight, bias) inputs of the layer-norm ops, appended to
// `ins`: the runtime takes them positionally, so a bias without a weight
// gets a weight of ones.
void append_norm_params(std::vector<Tensor>& ins, const Tensor& x, at::IntArrayRef shape, bool has_w,
                        const OptTensor& w, bool has_b, const OptTensor& b) {
  if (has_w || has_b) ins.push_back(has_w ? *w : at::ones(shape, x.options()));
  if (has_b) ins.push_back(*b);
}

std::tuple<Tensor, Tensor, Tensor> k_layer_norm(const Tensor& x, at::IntArrayRef shape, const OptTensor& w,
                                              const OptTensor& b, double eps) {
  std::vector<Tensor> ins{x};
  bool has_w = w.has_value() && w->defined();
  bool has_b = b.has_value() && b->defined();
  append_norm_params(ins, x, shape, has_w, w, has_b, b);
  auto r = call("layer_norm", ins, Attrs().ints("normalized_shape", shape).f("eps", eps));
  return {r[0], r[1], r[2]};
}

std::tuple<Tensor, Tensor, Tensor> k_layer_norm_bw(const Tensor& g, const Tensor& x, at::IntArrayRef shape,
                                                 const Tensor& mean, const Tensor& rstd, const OptTensor& w,
                                                 const OptTensor& b, std::array<bool, 3> mask) {
  std::vector<Tensor> ins{g, x, mean, rstd};
  bool has_w = w.has_value() && w->defined();
  bool has_b = b.has_value() && b->defined();
  append_norm_params(ins, x, shape, has_w, w, has_b, b);
  std::vector<int64_t> m{mask[0], mask[1] && has_w, mask[2] && has_b};
  auto r = call("layer_norm_backward", ins, Attrs().ints("normalized_shape", shape).ints("output_mask", m));
  Tensor dx = mask[0] ? r[0] : Tensor();
  Tensor dw = (mask[1] && has_w && r.size() > 1) ? r[1] : Tensor();
  Tensor db = (mask[2] && has_b && r.size() > 2) ? r[2] : Tensor();
  return {dx, dw, db};
}

// native_batch_norm and its backward: the runtime's batch_norm over
// channels (dim 1); a missing weight or bias goes as ones or zeros, and
// the running stats it returns in training are copied into the buffers,
// as torch updates them in place. In evaluation the backward gets the
// running mean and 1 / sqrt(running_var + eps) for the saved stats.
std::tuple<Tensor, Tensor, Tensor> k_batch_norm(const Tensor& x, const OptTensor& w, const OptTensor& b,
                                              const OptTensor& rm, const OptTensor& rv, bool training,
                                              double momentum, double eps) {
  TORCH_CHECK(x.dim() >= 2, "batch_norm: expected an input of at least 2 dims (N, C, ...), got ", x.dim(), "-D");
  int64_t c = x.size(1);
  auto opts = x.options().dtype(at::isReducedFloatingType(x.scalar_type()) ? at::kFloat : x.scalar_type());
  std::vector<Tensor> ins{x, (w.has_value() && w->defined()) ? *w : at::ones({c}, opts),
                          (b.has_value() && b->defined()) ? *b : at::zeros({c}, opts)};
  bool running = rm.has_value() && rm->defined() && rv.has_value() && rv->defined();
  if (running) {
    ins.push_back(*rm);
    ins.push_back(*rv);
  }
  auto r = call("batch_norm", ins, Attrs().b("training", training).f("momentum", momentum).f("eps", eps));
  if (training && running) {
    rm->copy_(r[3]);
    rv->copy_(r[4]);
  }
  return {r[0], r[1], r[2]};
}
std::tuple<Tensor, Tensor, Tensor> k_batch_norm_no_training(const Tensor& x, const OptTensor& w, const OptTensor& b,
                                                          const Tensor& rm, const Tensor& rv, double momentum,
                                                          double eps) {
  return k_batch_norm(x, w, b, rm, rv, false, momentum, eps);
}
std::tuple<Tensor, Tensor, Tensor> k_batch_norm_bw(const Tensor& g, const Tensor& x, const OptTensor& w,
                                                 const OptTensor& rm, const OptTensor& rv, const OptTensor& save_mean,
                                                 const OptTensor& save_invstd, bool train, double eps,
                                                 std::array<bool, 3> mask) {
  int64_t c = x.size(1);
  auto opts = x.options().dtype(at::isReducedFloatingType(x.scalar_type()) ? at::kFloat : x.scalar_type());
  bool has_w = w.has_value() && w->defined();
  Tensor mean, invstd;
  if (train) {
    TORCH_CHECK(save_mean.has_value() && save_mean->defined() && save_invstd.has_value() && save_invstd->defined(),
                "batch_norm_backward: training needs save_mean and save_invstd");
    mean = *save_mean;
    invstd = *save_invstd;
  } else {
    TORCH_CHECK(rm.has_value() && rm->defined() && rv.has_value() && rv->defined(),
                "batch_norm_backward: evaluation needs running_mean and running_var");
    mean = *rm;
    invstd = at::rsqrt(rv->to(opts.dtype()) + eps);
  }
  std::vector<int64_t> m{mask[0], mask[1] && has_w, mask[2]};
  auto r = call("batch_norm_backward", {g, x, has_w ? *w : at::ones({c}, opts), mean, invstd},
                Attrs().b("training", train).ints("output_mask", m));
  return {mask[0] ? r[0] : Tensor(), (mask[1] && has_w) ? r[1] : Tensor(), mask[2] ? r[2] : Tensor()};
}
// native_group_norm_backward (the forward is aten's composite over
// var_mean): the runtime's group_norm_backward; a missing weight goes as
// ones.
std::tuple<Tensor, Tensor, Tensor> k_group_norm_bw(const Tensor& g, const Tensor& x, const Tensor& mean,
                                                 const Tensor& rstd, const OptTensor& w, c10::SymInt n, c10::SymInt c,
                                                 c10::SymInt hxw, int64_t groups, std::array<bool, 3> mask) {
  bool has_w = w.has_value() && w->defined();
  auto opts = x.options().dtype(at::isReducedFloatingType(x.scalar_type()) ? at::kFloat : x.scalar_type());
  Tensor weight = has_w ? *w : at::ones({c.expect_int()}, opts);
  std::vector<int64_t> m{mask[0], mask[1] && has_w, mask[2] && has_w};
  auto r = call("group_norm_backward", {g, x, mean, rstd, weight}, Attrs().i("groups", groups).ints("output_mask", m));
  return {mask[0] ? r[0] : Tensor(), (mask[1] && has_w) ? r[1] : Tensor(), (mask[2] && has_w) ? r[2] : Tensor()};
}
std::tuple<Tensor, Tensor> k_var_mean(const Tensor& x, at::OptionalIntArrayRef dim, const std::optional<Scalar>& corr,
                                      bool keepdim) {
  return {k_var_c(x, dim, corr, keepdim), call1("mean", {x}, dims_attrs(dim, keepdim))};
}

// torch's rms_norm calls _fused_rms_norm on a device that has a kernel for
// it, and its autograd formula _fused_rms_norm_backward with the rstd it
// returned: one runtime op each way, where torch's composite (for devices
// without one) launches six ops forward (pow, mean, add, rsqrt, mul, mul).
std::tuple<Tensor, Tensor> k_fused_rms_norm(const Tensor& x, at::IntArrayRef shape, const OptTensor& w,
                                            std::optional<double> eps) {
  std::vector<Tensor> ins{x};
  if (w.has_value() && w->defined()) ins.push_back(*w);
  Attrs a = Attrs().ints("normalized_shape", shape);
  if (eps.has_value()) a.f("eps", *eps);
  auto r = call("fused_rms_norm", ins, a);
  return {r[0], r[1]};
}

std::tuple<Tensor, Tensor> k_fused_rms_norm_bw(const Tensor& g, const Tensor& x, at::IntArrayRef shape,
                                               const Tensor& rstd, const OptTensor& w, std::array<bool, 2> mask) {
  std::vector<Tensor> ins{g, x, rstd};
  bool has_w = w.has_value() && w->defined();
  if (has_w) ins.push_back(*w);
  std::vector<int64_t> m{mask[0], mask[1] && has_w};
  auto r = call("fused_rms_norm_backward", ins, Attrs().ints("normalized_shape", shape).ints("output_mask", m));
  Tensor dx = mask[0] ? r[0] : Tensor();
  Tensor dw = (mask[1] && has_w && r.size() > 1) ? r[1] : Tensor();
  return {dx, dw};
}

Tensor k_gelu_bw(const Tensor& g, const Tensor& x, c10::string_view approximate) {
  return call1("gelu_backward", {g, x}, Attrs().str("approximate", std::string(approximate)));
}
Tensor k_silu_bw(const Tensor& g, const Tensor& x) { return call1("silu_backward", {g, x}); }
Tensor k_sigmoid_bw(const Tensor& g, const Tensor& y) { return call1("sigmoid_backward", {g, y}); }
Tensor k_tanh_bw(const Tensor& g, const Tensor& y) { return call1("tanh_backward", {g, y}); }
Tensor k_threshold_bw(const Tensor& g, const Tensor& x, const Scalar& t) {
  return call1("threshold_backward", {g, x}, Attrs().f("threshold", t.toDouble()));
}
Tensor k_embedding(const Tensor& w, const Tensor& idx, int64_t padding_idx, bool scale, bool sparse) {
  return call1("embedding", {w, idx});
}
Tensor k_embedding_dense_bw(const Tensor& g, const Tensor& idx, int64_t num_weights, int64_t padding_idx,
                          bool scale) {
  return call1("embedding_backward", {g, idx},
               Attrs().i("num_weights", num_weights).i("padding_idx", padding_idx).b("scale_grad_by_freq", scale));
}
// embedding_bag: the runtime's op returns (output, offset2bag, bag_size,
// max_indices) as aten's _embedding_bag does; its backward ops take them.
std::tuple<Tensor, Tensor, Tensor, Tensor> k_embedding_bag(const Tensor& w, const Tensor& idx, const Tensor& offsets,
                                                           bool scale, int64_t mode, bool sparse, const OptTensor& psw,
                                                           bool include_last_offset, int64_t padding_idx) {
  std::vector<Tensor> ins{w, idx};
  if (idx.dim() == 1) ins.push_back(offsets);
  if (psw.has_value() && psw->defined()) ins.push_back(*psw);
  auto r = call("embedding_bag", ins,
                Attrs().i("mode", mode).b("include_last_offset", include_last_offset).i("padding_idx", padding_idx));
  return {r[0], r[1], r[2], r[3]};
}
Tensor k_embedding_bag_bw(const Tensor& g, const Tensor& idx, const Tensor& offsets, const Tensor& offset2bag,
                          const Tensor& bag_size, const Tensor& max_indices, int64_t num_weights, bool scale,
                          int64_t mode, bool sparse, const OptTensor& psw, int64_t padding_idx) {
  TORCH_CHECK(!sparse,
              "tpu: embedding_bag with sparse=True (a sparse COO gradient) is not supported on tpu; "
              "use sparse=False, whose dense gradient tpu computes");
  std::vector<Tensor> ins{g, idx, offset2bag, bag_size, max_indices};
  if (psw.has_value() && psw->defined()) ins.push_back(*psw);
  return call1("embedding_bag_backward", ins,
               Attrs().i("num_weights", num_weights).i("mode", mode).i("padding_idx", padding_idx)
                   .b("scale_grad_by_freq", scale));
}
Tensor k_embedding_bag_psw_bw(const Tensor& g, const Tensor& w, const Tensor& idx, const Tensor& offsets,
                              const Tensor& offset2bag, int64_t mode, int64_t padding_idx) {
  return call1("embedding_bag_per_sample_weights_backward", {g, w, idx, offset2bag},
               Attrs().i("mode", mode).i("padding_idx", padding_idx));
}
std::tuple<Tensor, Tensor> k_nll_loss_fwd(const Tensor& x, const Tensor& t, const OptTensor& w, int64_t red,
                                        int64_t ignore) {
  std::vector<Tensor> ins{x, t};
  if (w.has_value() && w->defined()) ins.push_back(*w);
  auto r = call("nll_loss", ins, Attrs().i("reduction", red).i("ignore_index", ignore));
  return {r[0], r[1]};
}
Tensor k_nll_loss_bw(const Tensor& g, const Tensor& x, const Tensor& t, const OptTensor& w, int64_t red,
                   int64_t ignore, const Tensor& total) {
  std::vector<Tensor> ins{g, x, t};
  if (w.has_value() && w->defined()) ins.push_back(*w);
  ins.push_back(total);
  return call1("nll_loss_backward", ins, Attrs().i("reduction", red).i("ignore_index", ignore));
}
// nll_loss2d's own checks, in torch's words: a 4-d input, a 3-d target.
void check_nll2d(const Tensor& x, const Tensor& t) {
  TORCH_CHECK(t.dim() == 3, "only batches of spatial targets supported (3D tensors) but got targets of dimension: ",
              t.dim());
  TORCH_CHECK(x.dim() == 4, "only batches of spatial inputs supported (4D tensors), but got input of dimension: ",
              x.dim());
}
Tensor k_mse_loss(const Tensor& x, const Tensor& t, int64_t red) {
  return call1("mse_loss", {x, t}, Attrs().i("reduction", red));
}
Tensor k_mse_loss_bw(const Tensor& g, const Tensor& x, const Tensor& t, int64_t red) {
  return call1("mse_loss_backward", {g, x, t}, Attrs().i("reduction", red));
}

// --- random ----------------------------------------------------------------------

// Seed and offset as two i64 scalar inputs: one compiled graph serves
// every draw.
std::vector<Tensor> rng_inputs(const std::optional<at::Generator>& gen, int device, uint64_t count) {
  auto [seed, offset] = generator_of(gen, device).take(count);
  at::Tensor host = at::empty({2}, at::TensorOptions().dtype(at::kLong));
  host[0] = static_cast<int64_t>(seed);
  host[1] = static_cast<int64_t>(offset);
  Tensor both = empty({2}, at::kLong, device);
  copy_into(both, host, false);
  return {both.select(0, 0), both.select(0, 1)};
}

Tensor& k_uniform_(Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  if (self.numel() == 0) return self;
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "tpu: uniform_ expects a floating-point tensor, got ",
              self.scalar_type());
  auto keys = rng_inputs(gen, dev(self), self.numel());
  Tensor r = call1("uniform", keys,
                   Attrs().ints("size", self.sizes()).dtype("dtype", self.scalar_type()).f("low", from).f("high", to));
  copy_into(self, r, false);
  return self;
}
Tensor& k_normal_(Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  if (self.numel() == 0) return self;
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "tpu: normal_ expects a floating-point tensor, got ",
              self.scalar_type());
  auto keys = rng_inputs(gen, dev(self), self.numel());
  Tensor r = call1("normal", keys,
                   Attrs().ints("size", self.sizes()).dtype("dtype", self.scalar_type()).f("mean", mean).f("std", std));
  copy_into(self, r, false);
  return self;
}
// normal with a tensor mean or std: standard normal draws of the
// broadcast shape, times std, plus mean (as torch's CPU and CUDA draw
// them). A negative std is torch's error (one read back, as there).
void check_std(const Tensor& std) {
  TORCH_CHECK(!std.is_complex(), "normal expects standard deviation to be non-complex");
  TORCH_CHECK(std.numel() == 0 || at::ge(std.min(), 0).item<bool>(), "normal expects all elements of std >= 0.0");
}
Tensor k_normal_tt(const Tensor& mean, const Tensor& std, std::optional<at::Generator> gen) {
  check_std(std);
  auto shape = at::infer_size(mean.sizes(), std.sizes());
  Tensor out = empty(shape, at::result_type(mean, std), dev(mean));
  k_normal_(out, 0.0, 1.0, gen);
  return out.mul_(std).add_(mean);
}
Tensor k_normal_tf(const Tensor& mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  Tensor out = empty(mean.sizes(), mean.scalar_type(), dev(mean));
  k_normal_(out, 0.0, std, gen);
  return out.add_(mean);
}
Tensor k_normal_ft(double mean, const Tensor& std, std::optional<at::Generator> gen) {
  check_std(std);
  Tensor out = empty(std.sizes(), std.scalar_type(), dev(std));
  k_normal_(out, 0.0, 1.0, gen);
  return out.mul_(std).add_(mean);
}
// torch._standard_gamma (what torch.distributions' Gamma, Chi2, StudentT,
// Beta and Dirichlet sample through), torch.poisson and torch.binomial:
// the op library's samplers, whose elements each use a fixed number of
// counters (the op library's GAMMA_COUNTERS, POISSON_COUNTERS and
// BINOMIAL_COUNTERS; a runtime test pins them).
constexpr uint64_t kGammaCounters = 33;
constexpr uint64_t kPoissonCounters = 96;
constexpr uint64_t kBinomialCounters = 96;
Tensor k_standard_gamma(const Tensor& alpha, std::optional<at::Generator> gen) {
  if (alpha.numel() == 0) return empty(alpha.sizes(), alpha.scalar_type(), dev(alpha));
  auto keys = rng_inputs(gen, dev(alpha), alpha.numel() * kGammaCounters);
  return call1("standard_gamma", {alpha, keys[0], keys[1]});
}
// Dirichlet: gamma draws normalized along the last dim; a share below the
// dtype's smallest normal number is that number, as torch's CPU returns.
Tensor k_sample_dirichlet(const Tensor& alpha, std::optional<at::Generator> gen) {
  Tensor g = k_standard_gamma(alpha, gen);
  if (g.numel() == 0) return g;
  const double tiny = alpha.scalar_type() == at::kDouble ? std::numeric_limits<double>::min()
                                                          : std::numeric_limits<float>::min();
  return (g / g.sum(-1, true)).clamp_min(tiny);
}
Tensor k_poisson(const Tensor& rate, std::optional<at::Generator> gen) {
  if (rate.numel() == 0) return empty(rate.sizes(), rate.scalar_type(), dev(rate));
  TORCH_CHECK(at::ge(rate, 0).all().item<bool>(), "invalid Poisson rate, expected rate to be non-negative");
  auto keys = rng_inputs(gen, dev(rate), rate.numel() * kPoissonCounters);
  return call1("poisson", {rate, keys[0], keys[1]});
}
// As torch's CPU kernel: draws in count's shape and dtype, prob broadcast
// to it; no check of the ranges (a count or prob not above 0 gives 0, a
// prob from 1 gives count).
Tensor k_binomial(const Tensor& count, const Tensor& prob, std::optional<at::Generator> gen) {
  if (count.numel() == 0) return empty(count.sizes(), count.scalar_type(), dev(count));
  auto keys = rng_inputs(gen, dev(count), count.numel() * kBinomialCounters);
  return call1("binomial", {count, prob, keys[0], keys[1]});
}
Tensor& k_bernoulli_f(Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 <= p && p <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", p);
  if (self.numel() == 0) return self;
  auto keys = rng_inputs(gen, dev(self), self.numel());
  Tensor like = self.is_floating_point() ? self : empty(self.sizes(), at::kFloat, dev(self));
  std::vector<Tensor> ins{like};
  ins.insert(ins.end(), keys.begin(), keys.end());
  Tensor r = call1("bernoulli", ins, Attrs().f("p", p));
  copy_into(self, r, false);
  return self;
}
Tensor k_bernoulli_t(const Tensor& p, std::optional<at::Generator> gen) {
  auto keys = rng_inputs(gen, dev(p), p.numel());
  std::vector<Tensor> ins{p};
  ins.insert(ins.end(), keys.begin(), keys.end());
  return call1("bernoulli", ins);
}
// log_sigmoid, stable for either sign: min(x, 0) - log1p(exp(-|x|)). The
// buffer torch's CPU kernel keeps for the backward is not needed here.
std::tuple<Tensor, Tensor> k_log_sigmoid_fwd(const Tensor& x) {
  Tensor out = at::minimum(x, at::zeros_like(x)) - at::log1p(at::exp(-at::abs(x)));
  return {out, empty({0}, x.scalar_type(), dev(x))};
}
Tensor k_log_sigmoid_bw(const Tensor& g, const Tensor& x, const Tensor& /*buffer*/) {
  return g * at::sigmoid(-x);  // d/dx log(sigmoid(x)) = sigmoid(-x)
}

// torch.equal: same shape and every element equal (one read back).
bool k_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  if (a.numel() == 0) return true;
  return at::eq(a, b).all().item<bool>();
}

// linalg_cholesky_ex on the op library's cholesky: info is the order of
// the first leading minor that is not positive-definite (0 when all are),
// as torch reports it; the factor is then unspecified.
std::tuple<Tensor, Tensor> k_cholesky_ex(const Tensor& A, bool upper, bool check_errors) {
  auto r = call("cholesky", {A}, Attrs().b("upper", upper));
  if (check_errors) at::_linalg_check_errors(r[1], "linalg.cholesky", A.dim() == 2);
  return {r[0], r[1]};
}
// cholesky_solve's kernel (torch broadcasts the batches before it) and
// cholesky_inverse: two triangular solves each.
Tensor k_cholesky_solve_helper(const Tensor& B, const Tensor& L, bool upper) {
  return call1("cholesky_solve", {B, L}, Attrs().b("upper", upper));
}
Tensor k_cholesky_inverse(const Tensor& L, bool upper) {
  return call1("cholesky_inverse", {L}, Attrs().b("upper", upper));
}

// Linear systems (the op library's solve.rs): LU with partial pivoting and
// what is built on it, f32 and f64. check_errors raises torch's own error
// for a nonzero info (one read back), as the composites that call these
// with check_errors=false do through _linalg_check_errors.
void check_info(const Tensor& info, const char* api, const Tensor& A) {
  at::_linalg_check_errors(info, api, A.dim() == 2);
}
std::tuple<Tensor, Tensor, Tensor> k_lu_factor_ex(const Tensor& A, bool pivot, bool check_errors) {
  TORCH_CHECK(pivot, "linalg.lu_factor: LU without pivoting is not implemented on tpu");
  auto r = call("lu_factor", {A});
  if (check_errors) check_info(r[2], "torch.linalg.lu_factor_ex", A);
  return {r[0], r[1], r[2]};
}
std::tuple<Tensor, Tensor, Tensor> k_lu_unpack(const Tensor& LU, const Tensor& pivots, bool unpack_data,
                                               bool unpack_pivots) {
  auto r = call("lu_unpack", {LU, pivots});
  // What is not unpacked is an empty tensor, as torch returns it.
  Tensor none = empty({0}, LU.scalar_type(), dev(LU));
  return {unpack_pivots ? r[0] : none, unpack_data ? r[1] : none, unpack_data ? r[2] : none};
}
std::tuple<Tensor, Tensor, Tensor> k_linalg_lu(const Tensor& A, bool pivot) {
  auto [LU, piv, info] = k_lu_factor_ex(A, pivot, false);
  return k_lu_unpack(LU, piv, true, true);
}
Tensor k_lu_solve(const Tensor& LU, const Tensor& pivots, const Tensor& B, bool left, bool adjoint) {
  return call1("lu_solve", {LU, pivots, B}, Attrs().b("left", left).b("adjoint", adjoint));
}
// torch factors Aᵀ of a row-major A (LAPACK wants column-major) for the
// determinants, and the backward formulas of _linalg_det and
// _linalg_slogdet read the factors so (they test A.is_contiguous()
// again): so do we. (_linalg_solve_ex factors A itself.)
bool use_A_T(const Tensor& A) { return A.is_contiguous(); }
std::tuple<Tensor, Tensor, Tensor, Tensor> k_linalg_solve_ex(const Tensor& A, const Tensor& B, bool left,
                                                             bool check_errors) {
  auto r = call("linalg_solve", {A, B}, Attrs().b("left", left));
  if (check_errors) check_info(r[3], "torch.linalg.solve_ex", A);
  return {r[0], r[1], r[2], r[3]};
}
std::tuple<Tensor, Tensor> k_linalg_inv_ex(const Tensor& A, bool check_errors) {
  auto r = call("linalg_inv", {A});
  if (check_errors) check_info(r[1], "torch.linalg.inv_ex", A);
  return {r[0], r[1]};
}
std::tuple<Tensor, Tensor, Tensor> k_linalg_det(const Tensor& A) {
  auto r = call("linalg_det", {use_A_T(A) ? A.mT() : A});
  return {r[0], r[1], r[2]};
}
std::tuple<Tensor, Tensor, Tensor, Tensor> k_linalg_slogdet(const Tensor& A) {
  auto r = call("linalg_slogdet", {use_A_T(A) ? A.mT() : A});
  return {r[0], r[1], r[2], r[3]};
}
// torch.special's Hermite, Laguerre and Legendre polynomials (the op
// library's orthogonal.rs) unroll their recurrence to the largest degree,
// read back when n is on the device and rounded up to a power of two so a
// few graph sizes serve every n; the Chebyshev ones need no degree.
constexpr int64_t kMaxPolynomialDegree = 256;  // the op library's MAX_STEPS

static Tensor polynomial_recurrence(const char* op, const Tensor& x, const Tensor& n) {
  double top = 0.0;
  if (n.numel() > 0) top = at::amax(n).item<double>();
  TORCH_CHECK(std::isnan(top) || top <= static_cast<double>(kMaxPolynomialDegree), "torch.special.", op,
              ": degrees n up to ", kMaxPolynomialDegree, " run on tpu, got ", top);
  int64_t steps = 1;
  while (!std::isnan(top) && static_cast<double>(steps) < std::trunc(top)) steps *= 2;
  return call1(op, {x, n}, Attrs().i("steps", steps));
}

// torch.linalg.matrix_exp (the op library's matrix_exp.rs): the squarings
// the largest 1-norm needs (one read back, as torch's CUDA kernel reads its
// norms), then the Padé approximant squared that many times. Its gradient
// is torch's formula, the exponential of a block matrix, so this again.
Tensor k_linalg_matrix_exp(const Tensor& A) {
  const int64_t s = call1("matrix_exp_squarings", {A}).item<int64_t>();
  return call1("matrix_exp", {A}, Attrs().i("squarings", s));
}
Tensor k_solve_triangular(const Tensor& A, const Tensor& B, bool upper, bool left, bool unitriangular) {
  return call1("solve_triangular", {A, B},
               Attrs().b("upper", upper).b("left", left).b("unitriangular", unitriangular));
}
// Orthogonal factorizations (the op library's qr.rs): Householder QR packed
// as LAPACK's geqrf packs it, its Q (orgqr), products with Q (ormqr),
// torch.linalg.qr's three modes and least squares as LAPACK's gels solves
// them, f32 and f64.
std::tuple<Tensor, Tensor> k_geqrf(const Tensor& A) {
  auto r = call("geqrf", {A});
  return {r[0], r[1]};
}
Tensor k_householder_product(const Tensor& A, const Tensor& tau) {
  return call1("householder_product", {A, tau});
}
Tensor k_ormqr(const Tensor& A, const Tensor& tau, const Tensor& C, bool left, bool transpose) {
  return call1("ormqr", {A, tau, C}, Attrs().b("left", left).b("transpose", transpose));
}
std::tuple<Tensor, Tensor> k_linalg_qr(const Tensor& A, c10::string_view mode) {
  auto r = call("linalg_qr", {A}, Attrs().str("mode", std::string(mode)));
  return {r[0], r[1]};
}
// torch.linalg.lstsq: torch's default driver off the CPU is gels (as on
// CUDA); gelsy, gelsd and gelss are the minimum-norm solution over the
// singular values above rcond times the largest (the op library's
// linalg_lstsq). With gels a rank-deficient A raises torch's error (one
// read back); with gelsd and gelss the residuals are empty unless every A
// has full rank, as torch returns them (one read back where m > n).
std::tuple<Tensor, Tensor, Tensor, Tensor> k_linalg_lstsq(const Tensor& A, const Tensor& B,
                                                          std::optional<double> rcond,
                                                          std::optional<c10::string_view> driver) {
  const std::string d = driver.has_value() ? std::string(*driver) : "gels";
  Attrs attrs = Attrs().str("driver", d);
  if (rcond.has_value()) attrs.f("rcond", *rcond);
  auto r = call("linalg_lstsq", {A, B}, attrs);
  if (d == "gels") at::_linalg_check_errors(r[2], "torch.linalg.lstsq", A.dim() == 2);
  Tensor residuals = r[1];
  if ((d == "gelsd" || d == "gelss") && residuals.numel() > 0 && !(r[3] == A.size(-1)).all().item<bool>())
    residuals = empty({0}, A.scalar_type(), dev(A));
  return {r[0], residuals, r[3], r[4]};
}
// Spectral decompositions (the op library's spectral.rs, Jacobi's method):
// eigenvalues ascending, singular values descending, vectors' signs as the
// rotations leave them (torch's CPU and CUDA differ there too). What torch
// builds on these (eigvalsh, svdvals, pinv, matrix_rank, cond, the 2-norm
// and nuclear norm, lstsq's backward) follows.
std::tuple<Tensor, Tensor> k_linalg_eigh(const Tensor& A, c10::string_view uplo, bool compute_v) {
  TORCH_CHECK(uplo == "L" || uplo == "l" || uplo == "U" || uplo == "u",
              "Expected UPLO argument to be 'L' or 'U', but got ", uplo);
  auto r = call("linalg_eigh", {A}, Attrs().b("upper", uplo == "U" || uplo == "u").b("compute_v", compute_v));
  return {r[0], r[1]};
}
std::tuple<Tensor, Tensor, Tensor> k_linalg_svd(const Tensor& A, bool full_matrices, bool compute_uv,
                                                std::optional<c10::string_view> driver) {
  TORCH_CHECK(!driver.has_value(),
              "torch.linalg.svd: keyword argument `driver=` is only supported on CUDA inputs with cuSOLVER backend.");
  auto r = call("linalg_svd", {A}, Attrs().b("full_matrices", full_matrices).b("compute_uv", compute_uv));
  return {r[0], r[1], r[2]};
}
// The old torch.triangular_solve(B, A): op(A) X = B on the left, with
// op(A) = Aᵀ when `transpose` (the other triangle of Aᵀ is read), and A
// broadcast to the common batch returned beside X.
std::tuple<Tensor, Tensor> k_triangular_solve(const Tensor& B, const Tensor& A, bool upper, bool transpose,
                                              bool unitriangular) {
  TORCH_CHECK(A.dim() >= 2 && B.dim() >= 2, "torch.triangular_solve: A and B must have at least 2 dimensions");
  Tensor op = transpose ? A.mT() : A;
  Tensor X = k_solve_triangular(op, B, transpose ? !upper : upper, true, unitriangular);
  std::vector<int64_t> shape(X.sizes().begin(), X.sizes().end() - 2);
  shape.push_back(A.size(-2));
  shape.push_back(A.size(-1));
  return {X, A.expand(shape).clone(at::MemoryFormat::Contiguous)};
}
// random_: integers uniform in [from, to), drawn as floor(u * (to - from))
// from a double-precision uniform u (exact for ranges up to 2^53).
Tensor& k_random_range(Tensor& self, int64_t from, int64_t to, std::optional<at::Generator> gen) {
  TORCH_CHECK(from < to, "random_ expects 'from' to be less than 'to', but got from=", from, " >= to=", to);
  if (self.numel() == 0) return self;
  const double range = static_cast<double>(to) - static_cast<double>(from);
  Tensor u = empty(self.sizes(), at::kDouble, dev(self));
  k_uniform_(u, 0.0, 1.0, gen);
  Tensor v = at::clamp_max(at::floor(u * range), range - 1.0) + static_cast<double>(from);
  copy_into(self, v.to(self.scalar_type()), false);
  return self;
}
// What random_ draws up to when `to` is not given: 2^digits for floating
// types (every integer there is exact), the type's maximum plus one for
// integers, 2 for bool.
int64_t random_default_to(const Tensor& self) {
  switch (self.scalar_type()) {
    case at::kFloat: return (int64_t{1} << 24) + 1;
    case at::kDouble: return (int64_t{1} << 53) + 1;
    case at::kHalf: return (int64_t{1} << 11) + 1;
    case at::kBFloat16: return (int64_t{1} << 8) + 1;
    case at::kBool: return 2;
    case at::kByte: return 256;
    case at::kChar: return 128;
    case at::kShort: return 32768;
    case at::kInt: return int64_t{1} << 31;
    default: return int64_t{1} << 53;  // int64: the range a double draws exactly
  }
}
Tensor& k_random_from(Tensor& self, int64_t from, std::optional<int64_t> to, std::optional<at::Generator> gen) {
  return k_random_range(self, from, to.has_value() ? *to : random_default_to(self), gen);
}
Tensor& k_random_to(Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  return k_random_range(self, 0, to, gen);
}
Tensor& k_random(Tensor& self, std::optional<at::Generator> gen) {
  return k_random_range(self, 0, random_default_to(self), gen);
}

// exponential_, geometric_, log_normal_ and cauchy_ by transforming
// uniform or normal draws (computed in f64 for double tensors, f32
// otherwise), as torch's kernels do. v = 1 - u is in (0, 1]; exponential's
// log(v) is capped at -eps/2 so no draw is 0 (torch's rule: a 0 would
// divide to inf in Gumbel-max sampling), and geometric's count is at
// least 1.
Tensor uniform_draws(const Tensor& self, std::optional<at::Generator> gen) {
  Tensor u = empty(self.sizes(), self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat, dev(self));
  k_uniform_(u, 0.0, 1.0, gen);
  return u;
}
Tensor& k_exponential_(Tensor& self, double lambd, std::optional<at::Generator> gen) {
  TORCH_CHECK(lambd > 0.0, "exponential_ expects lambda > 0.0, but found lambda=", lambd);
  TORCH_CHECK(self.is_floating_point(), "exponential_ expects a floating-point tensor, got ", self.scalar_type());
  if (self.numel() == 0) return self;
  Tensor u = uniform_draws(self, gen);
  const double half_eps = u.scalar_type() == at::kDouble ? std::numeric_limits<double>::epsilon() / 2
                                                         : std::numeric_limits<float>::epsilon() / 2;
  Tensor log_v = at::clamp_max(at::log1p(-u), -half_eps);
  copy_into(self, log_v * (-1.0 / lambd), false);
  return self;
}
Tensor& k_geometric_(Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 < p && p < 1, "geometric_ expects p to be in (0, 1), but got p=", p);
  if (self.numel() == 0) return self;
  Tensor u = uniform_draws(self, gen);
  Tensor k = at::clamp_min(at::ceil(at::log1p(-u) / std::log1p(-p)), 1.0);
  copy_into(self, k, false);
  return self;
}
Tensor& k_log_normal_(Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std > 0.0, "log_normal_ expects std > 0.0, but found std=", std);
  TORCH_CHECK(self.is_floating_point(), "log_normal_ expects a floating-point tensor, got ", self.scalar_type());
  if (self.numel() == 0) return self;
  Tensor z = empty(self.sizes(), self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat, dev(self));
  k_normal_(z, mean, std, gen);
  copy_into(self, at::exp(z), false);
  return self;
}
Tensor& k_cauchy_(Tensor& self, double median, double sigma, std::optional<at::Generator> gen) {
  TORCH_CHECK(sigma > 0.0, "cauchy_ expects sigma > 0.0, but found sigma=", sigma);
  TORCH_CHECK(self.is_floating_point(), "cauchy_ expects a floating-point tensor, got ", self.scalar_type());
  if (self.numel() == 0) return self;
  Tensor u = uniform_draws(self, gen);
  copy_into(self, at::tan((u - 0.5) * M_PI) * sigma + median, false);
  return self;
}

// multinomial by the Gumbel-max trick: the index of the largest
// log(p) + Gumbel noise is a draw from p; the k largest are k draws without
// replacement (the Gumbel-top-k). With replacement, each draw gets its own
// noise.
Tensor k_multinomial(const Tensor& p, int64_t n, bool replacement, std::optional<at::Generator> gen) {
  TORCH_CHECK(p.dim() == 1 || p.dim() == 2, "multinomial: prob_dist must be 1 or 2 dim, got ", p.dim());
  TORCH_CHECK(at::isFloatingType(p.scalar_type()), "multinomial only supports floating-point dtypes for input, got ",
              p.scalar_type());
  TORCH_CHECK(n > 0, "multinomial: cannot sample n_sample <= 0 samples");
  const int64_t cats = p.size(-1);
  TORCH_CHECK(replacement || n <= cats, "multinomial: cannot sample n_sample > prob_dist.size(-1) samples without ",
              "replacement");
  Tensor probs = p.dim() == 1 ? p.unsqueeze(0) : p;
  Tensor pf = probs.to(at::kFloat);
  // One read back to check the distributions, as torch does on every device.
  Tensor bad = at::stack({(pf < 0).any(), at::logical_not(at::isfinite(pf)).any(), (pf.sum(-1) <= 0).any()}).cpu();
  auto b = bad.accessor<bool, 1>();
  TORCH_CHECK(!b[0], "multinomial: probability tensor contains either `inf`, `nan` or element < 0");
  TORCH_CHECK(!b[1], "multinomial: probability tensor contains either `inf`, `nan` or element < 0");
  TORCH_CHECK(!b[2], "multinomial: invalid multinomial distribution (sum of probabilities <= 0)");
  const int64_t rows = pf.size(0);
  const bool per_draw = replacement && n > 1;
  std::vector<int64_t> noise_shape = per_draw ? std::vector<int64_t>{rows, n, cats} : std::vector<int64_t>{rows, cats};
  Tensor u = empty(noise_shape, at::kFloat, dev(p));
  k_uniform_(u, 0.0, 1.0, gen);
  // p / E with E ~ Exp(1) orders the categories as log(p) + Gumbel does,
  // without log(0) (which debug mode would rightly flag as an Inf).
  Tensor expo = -at::log(at::clamp(u, 1e-10, 1.0 - 1e-7));
  Tensor out;
  if (per_draw) {
    out = at::argmax(pf.unsqueeze(1) / expo, -1);
  } else {
    out = std::get<1>(at::topk(pf / expo, n, -1));
  }
  return p.dim() == 1 ? out.squeeze(0) : out;
}

std::tuple<Tensor, Tensor> k_native_dropout(const Tensor& x, double p, std::optional<bool> train) {
  bool t = train.value_or(true);
  std::vector<Tensor> ins{x};
  if (t && p > 0 && p < 1) {
    auto keys = rng_inputs(std::nullopt, dev(x), x.numel());
    ins.insert(ins.end(), keys.begin(), keys.end());
  } else {
    ins.push_back(scalar_on(Scalar(int64_t{0}), dev(x)).to(at::kLong));
    ins.push_back(scalar_on(Scalar(int64_t{0}), dev(x)).to(at::kLong));
  }
  auto r = call("dropout", ins, Attrs().f("p", p).b("train", t));
  return {r[0], r[1]};
}
Tensor k_native_dropout_bw(const Tensor& g, const Tensor& mask, double scale) {
  return call1("mul", {call1("mul", {g, mask}), S(scale, g)});
}

// --- shapes and indexing ------------------------------------------------------------

Tensor k_cat(const at::ITensorListRef& tensors, int64_t dim) {
  std::vector<Tensor> ins(tensors.begin(), tensors.end());
  TORCH_CHECK(!ins.empty(), "torch.cat(): expected a non-empty list of Tensors");
  return call1("cat", ins, Attrs().i("dim", dim));
}
Tensor k_index_select(const Tensor& x, int64_t dim, const Tensor& idx) {
  return call1("index_select", {x, idx}, Attrs().i("dim", dim));
}
Tensor k_gather(const Tensor& x, int64_t dim, const Tensor& idx, bool sparse_grad) {
  return call1("gather", {x, idx}, Attrs().i("dim", dim));
}
Tensor k_scatter_src(const Tensor& x, int64_t dim, const Tensor& idx, const Tensor& src) {
  return call1("scatter", {x, idx, src}, Attrs().i("dim", dim));
}
Tensor k_scatter_value(const Tensor& x, int64_t dim, const Tensor& idx, const Scalar& v) {
  Tensor src = at::full(idx.sizes(), v, x.options());
  return k_scatter_src(x, dim, idx, src);
}
Tensor k_scatter_add(const Tensor& x, int64_t dim, const Tensor& idx, const Tensor& src) {
  return call1("scatter_add", {x, idx, src}, Attrs().i("dim", dim));
}
Tensor k_tril(const Tensor& x, int64_t diagonal) { return call1("tril", {x}, Attrs().i("diagonal", diagonal)); }
Tensor k_triu(const Tensor& x, int64_t diagonal) { return call1("triu", {x}, Attrs().i("diagonal", diagonal)); }
Tensor k_flip(const Tensor& x, at::IntArrayRef dims) { return call1("flip", {x}, Attrs().ints("dims", dims)); }
// channel_shuffle (ShuffleNet): channels [g, C/g] read as [C/g, g], one
// copy through the op library's transpose.
Tensor k_channel_shuffle(const Tensor& x, int64_t groups) {
  TORCH_CHECK(x.dim() > 2, "channel_shuffle expects input with > 2 dims, but got input with sizes ", x.sizes());
  TORCH_CHECK(groups > 0, "Number of groups to divide channels in must be positive. Value of groups:", groups);
  const int64_t c = x.size(1);
  TORCH_CHECK(c % groups == 0, "Number of channels must be divisible by groups. Got ", c, " channels and ", groups,
              " groups.");
  std::vector<int64_t> split{x.size(0), groups, c / groups};
  for (int64_t d = 2; d < x.dim(); ++d) split.push_back(x.size(d));
  return x.reshape(split).transpose(1, 2).contiguous().view(x.sizes());
}
// angle of a real tensor: pi where negative, NaN where NaN, 0 elsewhere
// (-0 and inf included), in the default float dtype for integers.
Tensor k_angle(const Tensor& x) {
  Tensor f = at::isFloatingType(x.scalar_type()) ? x : x.to(at::typeMetaToScalarType(at::get_default_dtype()));
  return at::where(at::lt(f, 0), Scalar(M_PI), at::where(at::isnan(f), f, at::zeros_like(f)));
}
Tensor k_repeat(const Tensor& x, at::IntArrayRef r) { return call1("repeat", {x}, Attrs().ints("repeats", r)); }
Tensor k_constant_pad_nd(const Tensor& x, at::IntArrayRef pad, const Scalar& v) {
  return call1("pad", {x}, Attrs().ints("pad", pad).str("mode", "constant").f("value", v.toDouble()));
}
std::tuple<Tensor, Tensor> k_sort_stable(const Tensor& x, std::optional<bool> stable, int64_t dim, bool desc) {
  auto r = call("sort", {x}, Attrs().i("dim", dim).b("descending", desc));
  return {r[0], r[1]};
}
std::tuple<Tensor, Tensor> k_sort(const Tensor& x, int64_t dim, bool desc) { return k_sort_stable(x, false, dim, desc); }
std::tuple<Tensor, Tensor> k_topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  auto r = call("topk", {x}, Attrs().i("k", k).i("dim", dim).b("largest", largest));
  return {r[0], r[1]};
}
// max_pool{2,3}d_with_indices and their backward: the runtime's max_pool
// over the last `n` dims (max_pool1d reaches the 2-D op through aten's
// unsqueeze); indices are flat in the input's spatial dims, as aten's.
Attrs pool_attrs(int64_t n, at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding,
                 at::IntArrayRef dilation, bool ceil_mode) {
  return Attrs()
      .i("spatial_dims", n)
      .ints("kernel_size", kernel)
      .ints("stride", stride)
      .ints("padding", padding)
      .ints("dilation", dilation)
      .b("ceil_mode", ceil_mode);
}
template <int64_t N>
std::tuple<Tensor, Tensor> k_max_pool(const Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                                      at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode) {
  auto r = call("max_pool", {x}, pool_attrs(N, kernel, stride, padding, dilation, ceil_mode));
  return {r[0], r[1]};
}
template <int64_t N>
Tensor k_max_pool_bw(const Tensor& grad, const Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                     at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode, const Tensor& indices) {
  return call1("max_pool_backward", {grad, x, indices}, pool_attrs(N, kernel, stride, padding, dilation, ceil_mode));
}
// avg_pool{2,3}d and their backward (avg_pool1d reaches the 2-D op through
// aten's unsqueeze), and _adaptive_avg_pool{2,3}d and their backward
// (adaptive_avg_pool{1,2,3}d reach them, or mean for a 1 x 1 output).
Attrs avg_pool_attrs(int64_t n, at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding,
                     bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor_override) {
  Attrs a = Attrs()
                .i("spatial_dims", n)
                .ints("kernel_size", kernel)
                .ints("stride", stride)
                .ints("padding", padding)
                .b("ceil_mode", ceil_mode)
                .b("count_include_pad", count_include_pad);
  if (divisor_override) a.i("divisor_override", *divisor_override);
  return a;
}
template <int64_t N>
Tensor k_avg_pool(const Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding,
                  bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor_override) {
  return call1("avg_pool", {x}, avg_pool_attrs(N, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override));
}
template <int64_t N>
Tensor k_avg_pool_bw(const Tensor& grad, const Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                     at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                     std::optional<int64_t> divisor_override) {
  return call1("avg_pool_backward", {grad, x},
               avg_pool_attrs(N, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override));
}
Tensor k_adaptive_avg_pool(const Tensor& x, c10::SymIntArrayRef output_size) {
  return call1("adaptive_avg_pool", {x}, Attrs().ints("output_size", C10_AS_INTARRAYREF_SLOW(output_size)));
}
template <int64_t N>
Tensor k_adaptive_avg_pool_bw(const Tensor& grad, const Tensor& x) {
  return call1("adaptive_avg_pool_backward", {grad, x}, Attrs().i("spatial_dims", N));
}
// reflection_pad{1,2,3}d and replication_pad{1,2,3}d (F.pad's "reflect"
// and "replicate") and their backward: the runtime's pad and pad_backward.
template <bool Reflect>
Tensor k_mode_pad(const Tensor& x, at::IntArrayRef padding) {
  return call1("pad", {x}, Attrs().ints("pad", padding).str("mode", Reflect ? "reflect" : "replicate"));
}
template <bool Reflect>
Tensor k_mode_pad_bw(const Tensor& g, const Tensor& x, at::IntArrayRef padding) {
  return call1("pad_backward", {g},
               Attrs().ints("pad", padding).ints("input_size", x.sizes()).str("mode", Reflect ? "reflect" : "replicate"));
}
// upsample_nearest{1,2,3}d, _upsample_nearest_exact{1,2,3}d and
// upsample_{linear1d,bilinear2d,trilinear3d}, and their backward: the
// runtime's upsample ops (the .vec overloads reach them through aten).
// A scale torch was not given goes as 0 (the runtime reads a scale that
// is not positive as none, as torch does).
std::vector<double> upsample_scales(std::initializer_list<std::optional<double>> scales) {
  std::vector<double> v;
  for (const auto& s : scales) v.push_back(s.value_or(0.0));
  return v;
}
Tensor upsample(const char* op, const Tensor& x, at::IntArrayRef out, std::vector<double> scales, bool exact) {
  return call1(op, {x}, Attrs().ints("output_size", out).floats("scales", scales).b("exact", exact));
}
Tensor upsample_bw(const char* op, const Tensor& g, at::IntArrayRef out, at::IntArrayRef in,
                   std::vector<double> scales, bool exact) {
  return call1(op, {g},
               Attrs().ints("output_size", out).ints("input_size", in).floats("scales", scales).b("exact", exact));
}
// The filtered resizes: `op` is upsample_linear, upsample_cubic or
// upsample_antialias (with its `mode`), or their backward.
Tensor filtered_upsample(const char* op, const Tensor& x, at::IntArrayRef out, bool align, std::vector<double> scales,
                         const char* mode = nullptr) {
  Attrs a;
  a.ints("output_size", out).b("align_corners", align).floats("scales", scales);
  if (mode != nullptr) a.str("mode", mode);
  return call1(op, {x}, a);
}
Tensor filtered_upsample_bw(const char* op, const Tensor& g, at::IntArrayRef out, at::IntArrayRef in, bool align,
                            std::vector<double> scales, const char* mode = nullptr) {
  Attrs a;
  a.ints("output_size", out).ints("input_size", in).b("align_corners", align).floats("scales", scales);
  if (mode != nullptr) a.str("mode", mode);
  return call1(op, {g}, a);
}
using OptD = std::optional<double>;
template <bool Exact>
Tensor k_nearest1d(const Tensor& x, at::IntArrayRef o, OptD s) {
  return upsample("upsample_nearest", x, o, upsample_scales({s}), Exact);
}
template <bool Exact>
Tensor k_nearest2d(const Tensor& x, at::IntArrayRef o, OptD sh, OptD sw) {
  return upsample("upsample_nearest", x, o, upsample_scales({sh, sw}), Exact);
}
template <bool Exact>
Tensor k_nearest3d(const Tensor& x, at::IntArrayRef o, OptD sd, OptD sh, OptD sw) {
  return upsample("upsample_nearest", x, o, upsample_scales({sd, sh, sw}), Exact);
}
template <bool Exact>
Tensor k_nearest1d_bw(const Tensor& g, at::IntArrayRef o, at::IntArrayRef i, OptD s) {
  return upsample_bw("upsample_nearest_backward", g, o, i, upsample_scales({s}), Exact);
}
template <bool Exact>
Tensor k_nearest2d_bw(const Tensor& g, at::IntArrayRef o, at::IntArrayRef i, OptD sh, OptD sw) {
  return upsample_bw("upsample_nearest_backward", g, o, i, upsample_scales({sh, sw}), Exact);
}
template <bool Exact>
Tensor k_nearest3d_bw(const Tensor& g, at::IntArrayRef o, at::IntArrayRef i, OptD sd, OptD sh, OptD sw) {
  return upsample_bw("upsample_nearest_backward", g, o, i, upsample_scales({sd, sh, sw}), Exact);
}
Tensor k_linear1d(const Tensor& x, at::IntArrayRef o, bool a, OptD s) {
  return filtered_upsample("upsample_linear", x, o, a, upsample_scales({s}));
}
Tensor k_bilinear2d(const Tensor& x, at::IntArrayRef o, bool a, OptD sh, OptD sw) {
  return filtered_upsample("upsample_linear", x, o, a, upsample_scales({sh, sw}));
}
Tensor k_trilinear3d(const Tensor& x, at::IntArrayRef o, bool a, OptD sd, OptD sh, OptD sw) {
  return filtered_upsample("upsample_linear", x, o, a, upsample_scales({sd, sh, sw}));
}
Tensor k_linear1d_bw(const Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool a, OptD s) {
  return filtered_upsample_bw("upsample_linear_backward", g, o, i, a, upsample_scales({s}));
}
Tensor k_bilinear2d_bw(const Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool a, OptD sh, OptD sw) {
  return filtered_upsample_bw("upsample_linear_backward", g, o, i, a, upsample_scales({sh, sw}));
}
Tensor k_trilinear3d_bw(const Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool a, OptD sd, OptD sh, OptD sw) {
  return filtered_upsample_bw("upsample_linear_backward", g, o, i, a, upsample_scales({sd, sh, sw}));
}
Tensor& k_arange_out(const Scalar& start, const Scalar& end, const Scalar& step, Tensor& out) {
  Tensor r = call("arange", {},
                  Attrs().f("start", start.toDouble()).f("end", end.toDouble()).f("step", step.toDouble())
                      .dtype("dtype", out.scalar_type()))[0];
  return into(out, r);
}

// --- advanced indexing ---------------------------------------------------------
//
// x[i0, i1, ...] with index tensors: the indexed dimensions are moved to the
// front and flattened, the indices become one linear index, and one
// index_select (or the runtime's index_put) does the work. Boolean masks
// become indices through nonzero first (their result's shape depends on
// the data, as for torch on any device).

struct IndexPlan {
  std::vector<int64_t> dims;        // the indexed dimensions of self, in order
  std::vector<int64_t> perm;        // dims first, then the others
  std::vector<int64_t> bshape;      // the broadcast shape of the indices
  std::vector<int64_t> rest;        // sizes of the other dimensions
  Tensor linear;                    // [N] i64 on the device
  int64_t flat = 1;                 // product of the indexed sizes
  bool move = false;                // adjacent indexed dims not at the front

  // [first, rest...]: the indexed dims flattened into `first` elements.
  std::vector<int64_t> flat_shape(int64_t first) const {
    std::vector<int64_t> out{first};
    out.insert(out.end(), rest.begin(), rest.end());
    return out;
  }

  // The indexing result (broadcast dims first) with the broadcast dims
  // moved to where the indexed dims were (`back`), or the reverse.
  Tensor move_broadcast_dims(const Tensor& t, bool back) const {
    if (!move) return t;
    int64_t nb = static_cast<int64_t>(bshape.size());
    std::vector<int64_t> front(nb), at(nb);
    for (int64_t i = 0; i < nb; ++i) {
      front[i] = i;
      at[i] = dims.front() + i;
    }
    return back ? t.movedim(front, at) : t.movedim(at, front);
  }
};

Tensor k_nonzero(const Tensor& x);

IndexPlan plan_index(const Tensor& self, const c10::List<std::optional<Tensor>>& indices) {
  std::vector<Tensor> per_dim;
  for (size_t i = 0; i < indices.size(); ++i) {
    std::optional<Tensor> o = indices.get(i);
    if (!o.has_value() || !o->defined()) {
      per_dim.emplace_back();
      continue;
    }
    Tensor t = *o;
    if (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte) {
      // One index tensor per mask dimension, from nonzero: k_nonzero for a
      // mask on the device, torch's own for one on the CPU.
      Tensor nz = t.device().type() == c10::DeviceType::PrivateUse1 ? k_nonzero(t) : t.to(at::kBool).nonzero();
      for (int64_t d = 0; d < t.dim(); ++d) per_dim.push_back(nz.select(1, d).to(self.device()));
    } else {
      TORCH_CHECK_INDEX(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt,
                        "tensors used as indices must be long, int, byte or bool tensors");
      per_dim.push_back(t.device() == self.device() ? t : t.to(self.device()));
    }
  }
  TORCH_CHECK_INDEX(static_cast<int64_t>(per_dim.size()) <= self.dim(), "too many indices for tensor of dimension ",
                    self.dim(), " (got ", per_dim.size(), ")");
  per_dim.resize(self.dim());
  IndexPlan p;
  std::vector<Tensor> defined;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (per_dim[d].defined()) {
      p.dims.push_back(d);
      defined.push_back(per_dim[d]);
    }
  }
  TORCH_CHECK(!p.dims.empty(), "tpu: index needs at least one index tensor");
  auto b = at::broadcast_tensors(defined);
  p.bshape = b[0].sizes().vec();
  p.perm = p.dims;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (!per_dim[d].defined()) {
      p.perm.push_back(d);
      p.rest.push_back(self.size(d));
    }
  }
  bool adjacent = p.dims.back() - p.dims.front() + 1 == static_cast<int64_t>(p.dims.size());
  p.move = adjacent && p.dims.front() != 0;
  Tensor lin;
  for (int64_t k = static_cast<int64_t>(p.dims.size()) - 1; k >= 0; --k) {
    int64_t size = self.size(p.dims[k]);
    Tensor ik = b[k].to(at::kLong);
    ik = at::where(ik < 0, ik + size, ik);
    Tensor term = p.flat == 1 ? ik : ik * p.flat;
    lin = lin.defined() ? lin + term : term;
    p.flat *= size;
  }
  p.linear = lin.reshape({-1});
  return p;
}

// The indexing result's shape, and the permutation that takes it to
// [broadcast dims, rest...] order.
std::vector<int64_t> result_shape(const IndexPlan& p) {
  std::vector<int64_t> out;
  if (p.move) {
    int64_t first = p.dims.front();
    out.assign(p.rest.begin(), p.rest.begin() + first);
    out.insert(out.end(), p.bshape.begin(), p.bshape.end());
    out.insert(out.end(), p.rest.begin() + first, p.rest.end());
  } else {
    out = p.bshape;
    out.insert(out.end(), p.rest.begin(), p.rest.end());
  }
  return out;
}

Tensor k_index(const Tensor& self, const c10::List<std::optional<Tensor>>& indices) {
  IndexPlan p = plan_index(self, indices);
  Tensor flat = self.permute(p.perm).reshape(p.flat_shape(p.flat));
  Tensor out = k_index_select(flat, 0, p.linear);
  std::vector<int64_t> front = p.bshape;
  front.insert(front.end(), p.rest.begin(), p.rest.end());
  return p.move_broadcast_dims(out.reshape(front), true);
}

Tensor& k_index_put_(Tensor& self, const c10::List<std::optional<Tensor>>& indices, const Tensor& values,
                     bool accumulate, bool unsafe) {
  IndexPlan p = plan_index(self, indices);
  if (p.linear.numel() == 0) return self;
  Tensor v = values.device() == self.device() ? values : values.to(self.device());
  v = p.move_broadcast_dims(v.to(self.scalar_type()).expand(result_shape(p)), false);
  Tensor view = self.permute(p.perm);
  Tensor flat = view.reshape(p.flat_shape(p.flat));
  Tensor r = call1("index_put", {flat, p.linear, v.reshape(p.flat_shape(p.linear.numel()))},
                   Attrs().b("accumulate", accumulate));
  copy_into(view, r.reshape(view.sizes()), false);
  return self;
}

// index_copy: x[..., index[i], ...] = source[..., i, ...] along `dim` (the
// static KV cache's update), as an index_put with the leading dims free.
Tensor& k_index_copy_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& source) {
  dim = at::maybe_wrap_dim(dim, self.dim());
  c10::List<std::optional<Tensor>> idx;
  for (int64_t d = 0; d < dim; ++d) idx.push_back(std::nullopt);
  idx.push_back(index.dim() == 0 ? index.reshape({1}) : index);
  return k_index_put_(self, idx, source, false, false);
}

// index_add and index_reduce: `index` (a vector) broadcast over the
// source's other dims, so that a scatter along `dim` reads it, after
// torch's checks in the op's name; 0-d self and source as one element.
struct AlongDim {
  Tensor self, source, index;
  int64_t dim;
};
AlongDim along_dim(const char* op, const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source) {
  TORCH_CHECK(index.dim() <= 1, op, "(): Index is supposed to be a vector");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt, op,
              "(): Expected dtype int32/int64 for index");
  Tensor self1 = self.dim() == 0 ? self.reshape({1}) : self;
  Tensor src = source.dim() == 0 ? source.reshape({1}) : source;
  dim = at::maybe_wrap_dim(dim, self1.dim());
  TORCH_CHECK(src.dim() == self1.dim(), op, "(): self (", self.dim(), "-d) and source (", source.dim(),
              "-d) must have the same number of dimensions");
  TORCH_CHECK(index.numel() == src.size(dim), op, "(): Number of indices (", index.numel(),
              ") should be equal to source.size(dim) (", src.size(dim), ")");
  std::vector<int64_t> shape(src.dim(), 1);
  shape[dim] = -1;
  return {self1, src, index.reshape(shape).expand(src.sizes()).to(at::kLong), dim};
}
Tensor k_index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source, const Scalar& alpha) {
  AlongDim a = along_dim("index_add_", self, dim, index, source);
  Tensor add = alpha.equal(1) ? a.source : a.source * alpha;
  Tensor r = k_scatter_add(a.self, a.dim, a.index, add.to(self.scalar_type()));
  return self.dim() == 0 ? r.reshape({}) : r;
}

// scatter_reduce: the op library's, which also checks src's dtype and
// the reduction's name.
Tensor k_scatter_reduce(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                        c10::string_view reduce, bool include_self) {
  TORCH_CHECK(index.scalar_type() == at::kLong, "scatter_reduce(): Expected dtype int64 for index");
  return call1("scatter_reduce", {self, index, src},
               Attrs().i("dim", dim).str("reduce", std::string(reduce)).b("include_self", include_self));
}
// index_reduce: a scatter_reduce along `dim` (torch offers no sum here).
Tensor k_index_reduce(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                      c10::string_view reduce, bool include_self) {
  TORCH_CHECK(reduce == "prod" || reduce == "mean" || reduce == "amax" || reduce == "amin",
              "index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got ", reduce, ".");
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "index_reduce_(): self (", self.scalar_type(),
              ") and source (", source.scalar_type(), ") must have the same scalar type");
  AlongDim a = along_dim("index_reduce_", self, dim, index, source);
  Tensor r = k_scatter_reduce(a.self, a.dim, a.index, a.source, reduce, include_self);
  return self.dim() == 0 ? r.reshape({}) : r;
}

// nonzero from device ops: one read back for the count (the result's shape
// depends on the data, on every device); each true element's slot is a
// cumsum, its linear position lands there by scatter_add (the false ones
// all go to one spare slot), and the positions are unravelled per dim.
Tensor k_nonzero(const Tensor& x) {
  const int64_t n = x.numel();
  const int64_t r = x.dim();
  Tensor flat = x.reshape({-1}) != 0;
  const int64_t count = n == 0 ? 0 : flat.sum().item<int64_t>();
  if (count == 0) return empty({0, r}, at::kLong, dev(x));
  Tensor pos = at::cumsum(flat, 0, at::kLong) - 1;
  Tensor slot = at::where(flat, pos, at::full_like(pos, count));
  Tensor lin = at::zeros({count + 1}, x.options().dtype(at::kLong))
                   .scatter_add(0, slot, at::arange(n, x.options().dtype(at::kLong)))
                   .narrow(0, 0, count);
  std::vector<Tensor> cols;
  int64_t stride = n;
  for (int64_t d = 0; d < r; ++d) {
    stride /= x.size(d);
    cols.push_back(at::remainder(at::div(lin, stride, "floor"), x.size(d)));
  }
  return r == 0 ? empty({count, 0}, at::kLong, dev(x)) : at::stack(cols, 1);
}

// tril_indices / triu_indices: the op library computes the coordinates in
// the graph, on the device the factory names.
Tensor k_triangle_indices(const char* op, int64_t row, int64_t col, int64_t offset,
                          std::optional<at::ScalarType> dtype, std::optional<at::Device> device) {
  c10::OptionalDeviceGuard guard(device);
  const at::ScalarType dt = dtype.value_or(at::kLong);
  TORCH_CHECK(dt == at::kLong || dt == at::kInt, "\"", op, "\" not implemented for '", c10::toString(dt), "'");
  return call(op, {}, Attrs().i("row", row).i("col", col).i("offset", offset).dtype("dtype", dt))[0];
}

// repeat_interleave(repeats): the result's length is the sum of the
// repeats; without output_size it is read back once, with their minimum
// (torch refuses negative repeats). With output_size nothing is read, as
// on CUDA.
Tensor k_repeat_interleave(const Tensor& repeats, std::optional<c10::SymInt> output_size) {
  TORCH_CHECK(repeats.dim() == 1, "repeat_interleave only accept 1D vector as repeat");
  TORCH_CHECK(repeats.scalar_type() == at::kLong || repeats.scalar_type() == at::kInt,
              "repeats has to be Long or Int tensor");
  int64_t size = 0;
  if (output_size.has_value()) {
    size = output_size->expect_int();
    TORCH_CHECK(size >= 0, "repeat_interleave: output_size must be non-negative, got ", size);
  } else if (repeats.numel() > 0) {
    Tensor stats = at::stack({repeats.sum().to(at::kLong), repeats.min().to(at::kLong)}).cpu();
    TORCH_CHECK(stats[1].item<int64_t>() >= 0, "repeats can not be negative");
    size = stats[0].item<int64_t>();
  }
  return call1("repeat_interleave", {repeats}, Attrs().i("output_size", size));
}

// take and put_: index_select and index_put on the flattened tensor, with
// negative indices counted from the end (an index out of range is the
// runtime's error, naming it).
Tensor wrap_flat_index(const Tensor& index, int64_t n) {
  Tensor idx = index.reshape({-1});
  return at::where(idx < 0, idx + n, idx);
}
Tensor k_take(const Tensor& self, const Tensor& index) {
  TORCH_CHECK(index.scalar_type() == at::kLong, "take(): Expected a long tensor for index, but got ",
              index.scalar_type());
  TORCH_CHECK(self.numel() > 0 || index.numel() == 0, "take(): tried to take from an empty tensor");
  if (index.numel() == 0) return empty(index.sizes(), self.scalar_type(), dev(self));
  return self.reshape({-1}).index_select(0, wrap_flat_index(index, self.numel())).reshape(index.sizes());
}
Tensor& k_put_(Tensor& self, const Tensor& index, const Tensor& source, bool accumulate) {
  TORCH_CHECK(index.scalar_type() == at::kLong, "put_(): Expected a long tensor for index, but got ",
              index.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "put_(): self and source expected to have the same dtype, ",
              "but got self.dtype = ", self.scalar_type(), " and source.dtype = ", source.scalar_type());
  TORCH_CHECK(index.numel() == source.numel(), "put_(): Expected source and index to have the same number of ",
              "elements, but got source.numel() = ", source.numel(), ", index.numel() = ", index.numel());
  TORCH_CHECK(self.numel() > 0 || index.numel() == 0, "put_(): Tried to put elements into an empty tensor");
  if (index.numel() == 0) return self;
  Tensor flat = self.is_contiguous() ? self.view({-1}) : self.reshape({-1}).clone();
  c10::List<std::optional<Tensor>> idx;
  idx.push_back(wrap_flat_index(index, self.numel()));
  flat.index_put_(idx, source.reshape({-1}), accumulate);
  if (!self.is_contiguous()) self.copy_(flat.view(self.sizes()));
  return self;
}

// bincount: max(x) + 1 bins (minlength if larger), max and min read back
// in one copy (the length depends on the data, on every device).
Tensor k_bincount(const Tensor& x, const OptTensor& weights, int64_t minlength) {
  TORCH_CHECK(x.dim() == 1 && at::isIntegralType(x.scalar_type(), /*includeBool=*/false),
              "bincount only supports 1-d non-negative integral inputs.");
  TORCH_CHECK(minlength >= 0, "minlength should be >= 0");
  const bool weighted = weights.has_value() && weights->defined();
  TORCH_CHECK(!weighted || (weights->dim() == 1 && weights->size(0) == x.size(0)),
              "weights should be 1-d and have the same length as input");
  int64_t length = minlength;
  if (x.numel() > 0) {
    Tensor stats = at::stack({x.max().to(at::kLong), x.min().to(at::kLong)}).cpu();
    TORCH_CHECK(stats[1].item<int64_t>() >= 0, "bincount only supports 1-d non-negative integral inputs.");
    length = std::max(length, stats[0].item<int64_t>() + 1);
  }
  std::vector<Tensor> ins{x};
  if (weighted) ins.push_back(*weights);
  return call1("bincount", ins, Attrs().i("length", length));
}

// histc: equal-width bins over [min, max] (the data's range when both are
// 0), values outside ignored, max itself in the last bin; counts in the
// input's dtype (integers too, as on CUDA: MoE routing counts int32 ids).
Tensor k_histc(const Tensor& x, int64_t bins, const Scalar& min, const Scalar& max) {
  TORCH_CHECK(bins > 0, "torch.histc: bins must be > 0, but got ", bins, " for bins");
  double lo = min.toDouble();
  double hi = max.toDouble();
  TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi), "torch.histc: range of [", lo, ", ", hi, "] is not finite");
  TORCH_CHECK(lo <= hi, "torch.histc: max must be larger than min");
  Tensor xd = x.reshape({-1}).to(at::kDouble);
  if (lo == hi && x.numel() > 0) {
    Tensor mm = at::stack({xd.min(), xd.max()}).cpu();
    lo = mm[0].item<double>();
    hi = mm[1].item<double>();
  }
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  Tensor counts = at::zeros({bins}, x.options());
  if (x.numel() == 0) return counts;
  Tensor keep = at::logical_and(xd >= lo, xd <= hi);
  Tensor bin = at::clamp(at::floor((xd - lo) * (static_cast<double>(bins) / (hi - lo))), 0, bins - 1);
  bin = at::where(keep, bin, at::zeros_like(bin)).to(at::kLong);
  return counts.scatter_add(0, bin, keep.to(x.scalar_type()));
}

// roll: per rolled dimension, the two slices swapped (narrow + cat); with
// no dims, the flattened tensor rolled and reshaped back.
Tensor k_roll(const Tensor& x, at::IntArrayRef shifts, at::IntArrayRef dims) {
  TORCH_CHECK(!shifts.empty(), "`shifts` required");
  if (dims.empty()) {
    TORCH_CHECK(shifts.size() == 1, "shifts and dimensions must align. shifts: ", shifts.size(), ", dims: 0");
    return k_roll(x.reshape({-1}), shifts, {0}).view(x.sizes());
  }
  TORCH_CHECK(shifts.size() == dims.size(), "shifts and dimensions must align. shifts: ", shifts.size(),
              ", dims:", dims.size());
  Tensor r = x;
  for (size_t k = 0; k < dims.size(); ++k) {
    int64_t d = at::maybe_wrap_dim(dims[k], x.dim());
    int64_t n = x.size(d);
    if (n == 0) continue;
    int64_t s = ((shifts[k] % n) + n) % n;
    if (s == 0) continue;
    r = at::cat({r.narrow(d, n - s, s), r.narrow(d, 0, n - s)}, d);
  }
  return r.is_same(x) ? x.clone() : r;
}

// Unique slices along `dim` (torch.unique(dim=) with `sort`, and
// unique_consecutive(dim=)): the slices as the rows of an [n, L] matrix,
// put in lexicographic order by L stable sorts, from the last column to
// the first; a run starts where a row differs from the one before it in
// any column. The inverse is each slice's run; a zero-size input is torch's
// error where a dimension other than `dim` is empty.
std::tuple<Tensor, Tensor, Tensor> unique_slices(const Tensor& x, int64_t dim, bool sort, bool return_counts) {
  dim = at::maybe_wrap_dim(dim, x.dim());
  const int64_t n = x.size(dim);
  if (x.numel() == 0) {
    for (int64_t d = 0; d < x.dim(); ++d) {
      TORCH_CHECK(d == dim || x.size(d) != 0,
                  "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied");
    }
    return {x.clone(), empty({0}, at::kLong, dev(x)), empty({0}, at::kLong, dev(x))};
  }
  Tensor moved = x.movedim(dim, 0);
  Tensor rows = moved.reshape({n, -1});
  Tensor keys = x.scalar_type() == at::kBool ? rows.to(at::kByte) : rows;
  Tensor order = at::arange(n, x.options().dtype(at::kLong));
  if (sort) {
    for (int64_t c = keys.size(1) - 1; c >= 0; --c) {
      Tensor col = keys.select(1, c).index_select(0, order);
      order = order.index_select(0, std::get<1>(at::sort(col, /*stable=*/true, 0, false)));
    }
  }
  Tensor sorted_rows = rows.index_select(0, order);
  Tensor start = at::ones({1}, x.options().dtype(at::kBool));
  if (n > 1) {
    Tensor differs = (sorted_rows.narrow(0, 1, n - 1) != sorted_rows.narrow(0, 0, n - 1)).any(1);
    start = at::cat({start, differs});
  }
  Tensor first = at::nonzero(start).reshape({-1});
  std::vector<int64_t> shape{first.numel()};
  shape.insert(shape.end(), moved.sizes().begin() + 1, moved.sizes().end());
  Tensor values = sorted_rows.index_select(0, first).reshape(shape).movedim(0, dim).contiguous();
  Tensor run = at::cumsum(start, 0, at::kLong) - 1;
  Tensor inverse = sort ? at::zeros_like(run).scatter(0, order, run) : run;
  Tensor counts = empty({0}, at::kLong, dev(x));
  if (return_counts) {
    Tensor ends = at::cat({first.narrow(0, 1, first.numel() - 1), at::full({1}, n, x.options().dtype(at::kLong))});
    counts = ends - first;
  }
  return {values, inverse, counts};
}
std::tuple<Tensor, Tensor, Tensor> k_unique_dim(const Tensor& x, int64_t dim, bool /*sorted*/, bool return_inverse,
                                                bool return_counts) {
  auto [values, inverse, counts] = unique_slices(x, dim, true, return_counts);
  return {values, return_inverse ? inverse : empty({0}, at::kLong, dev(x)), counts};
}
std::tuple<Tensor, Tensor, Tensor> k_unique_dim_consecutive(const Tensor& x, int64_t dim, bool return_inverse,
                                                            bool return_counts) {
  auto [values, inverse, counts] = unique_slices(x, dim, false, return_counts);
  return {values, return_inverse ? inverse : empty({0}, at::kLong, dev(x)), counts};
}

// unique_consecutive over the flattened input: a run starts where an
// element differs from the one before it; values are the run starts, counts
// the distances between them, inverse each element's run number.
std::tuple<Tensor, Tensor, Tensor> k_unique_consecutive(const Tensor& x, bool return_inverse, bool return_counts,
                                                        std::optional<int64_t> dim) {
  if (dim.has_value() && x.dim() > 1) return k_unique_dim_consecutive(x, *dim, return_inverse, return_counts);
  Tensor flat = x.reshape({-1});
  const int64_t n = flat.numel();
  auto long_opts = x.options().dtype(at::kLong);
  if (n == 0) {
    return {empty({0}, x.scalar_type(), dev(x)), empty(return_inverse ? x.sizes() : at::IntArrayRef{0}, at::kLong, dev(x)),
            empty({0}, at::kLong, dev(x))};
  }
  Tensor start = at::cat({at::ones({1}, x.options().dtype(at::kBool)), flat.narrow(0, 1, n - 1) != flat.narrow(0, 0, n - 1)});
  Tensor values = flat.masked_select(start);
  Tensor inverse = return_inverse ? (at::cumsum(start, 0, at::kLong) - 1).view(x.sizes()) : empty({0}, at::kLong, dev(x));
  Tensor counts = empty({0}, at::kLong, dev(x));
  if (return_counts) {
    Tensor first = at::nonzero(start).reshape({-1});
    Tensor ends = at::cat({first.narrow(0, 1, first.numel() - 1), at::full({1}, n, long_opts)});
    counts = ends - first;
  }
  return {values, inverse, counts};
}

// _unique2 (torch.unique without dim): the flattened input sorted, then
// unique_consecutive over it; each element's inverse is its sorted
// position's run, scattered back to where it came from. Always sorted (the
// order of sorted=False is unspecified); NaNs are each their own value,
// as on CPU. Bool sorts as u8.
std::tuple<Tensor, Tensor, Tensor> k_unique2(const Tensor& x, bool sorted, bool return_inverse, bool return_counts) {
  Tensor flat = x.reshape({-1});
  Tensor keys = x.scalar_type() == at::kBool ? flat.to(at::kByte) : flat;
  auto [s, order] = at::sort(keys, /*stable=*/true, 0, false);
  if (x.scalar_type() == at::kBool) s = s.to(at::kBool);
  auto [values, run, counts] = k_unique_consecutive(s, return_inverse, return_counts, std::nullopt);
  Tensor inverse = empty({0}, at::kLong, dev(x));
  if (return_inverse) inverse = at::zeros_like(run).scatter(0, order, run).view(x.sizes());
  return {values, inverse, counts};
}

// index_fill: the positions along dim that index names (negatives
// wrapped) marked in a bool vector by one scatter, then a where with the
// value; an index out of range is the scatter's error.
Tensor k_index_fill(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& value) {
  TORCH_CHECK(index.dim() <= 1, "Index has to be a vector/scalar");
  TORCH_CHECK(index.scalar_type() == at::kLong, "index_fill_(): Expected dtype int64 for index.");
  TORCH_CHECK(value.dim() == 0, "index_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
              value.dim(), " dimension(s).");
  dim = at::maybe_wrap_dim(dim, x.dim());
  const int64_t n = x.dim() == 0 ? 1 : x.size(dim);
  Tensor idx = index.reshape({-1});
  idx = at::where(idx < 0, idx + n, idx);
  Tensor hit = k_scatter_value(at::zeros({n}, x.options().dtype(at::kBool)), 0, idx, true);
  std::vector<int64_t> shape(x.dim(), 1);
  if (x.dim() > 0) shape[dim] = n;
  return k_where(hit.view(shape), value.to(x.device()).to(x.scalar_type()), x);
}

// F.unfold and F.fold: the runtime's im2col and col2im (2-D images).
Attrs block_attrs(at::IntArrayRef kernel, at::IntArrayRef dilation, at::IntArrayRef padding, at::IntArrayRef stride) {
  return Attrs().ints("kernel_size", kernel).ints("dilation", dilation).ints("padding", padding).ints("stride", stride);
}
Tensor k_im2col(const Tensor& x, at::IntArrayRef kernel, at::IntArrayRef dilation, at::IntArrayRef padding,
                at::IntArrayRef stride) {
  return call1("im2col", {x}, block_attrs(kernel, dilation, padding, stride));
}
Tensor k_col2im(const Tensor& x, c10::SymIntArrayRef size, at::IntArrayRef kernel, at::IntArrayRef dilation,
                at::IntArrayRef padding, at::IntArrayRef stride) {
  return call1("col2im", {x},
               block_attrs(kernel, dilation, padding, stride).ints("output_size", C10_AS_INTARRAYREF_SLOW(size)));
}
// adaptive_max_pool{2,3}d (values and flat spatial indices) and backward.
template <int64_t N>
std::tuple<Tensor, Tensor> k_adaptive_max_pool(const Tensor& x, at::IntArrayRef size) {
  TORCH_CHECK(static_cast<int64_t>(size.size()) == N, "adaptive_max_pool", N, "d: internal error: output_size must be ", N,
              "-D, got ", size);
  auto r = call("adaptive_max_pool", {x}, Attrs().ints("output_size", size));
  return {r[0], r[1]};
}
template <int64_t N>
Tensor k_adaptive_max_pool_bw(const Tensor& grad, const Tensor& x, const Tensor& indices) {
  return call1("adaptive_max_pool_backward", {grad, x, indices}, Attrs().i("spatial_dims", N));
}

// F.grid_sample over 2-D images: bilinear and nearest on the op library;
// bicubic on the CPU, counted and switchable as the fallback is.
Attrs grid_attrs(int64_t interpolation, int64_t padding, bool align_corners) {
  return Attrs().i("interpolation_mode", interpolation).i("padding_mode", padding).b("align_corners", align_corners);
}
Tensor k_grid_sampler_2d(const Tensor& x, const Tensor& grid, int64_t interpolation, int64_t padding,
                         bool align_corners) {
  if (interpolation == 2) {
    count_cpu_fallback("grid_sampler_2d (bicubic)");
    return at::grid_sampler_2d(x.cpu(), grid.cpu(), interpolation, padding, align_corners).to(x.device());
  }
  return call1("grid_sampler_2d", {x, grid}, grid_attrs(interpolation, padding, align_corners));
}
std::tuple<Tensor, Tensor> k_grid_sampler_2d_bw(const Tensor& grad, const Tensor& x, const Tensor& grid,
                                                int64_t interpolation, int64_t padding, bool align_corners,
                                                std::array<bool, 2> mask) {
  if (interpolation == 2) {
    count_cpu_fallback("grid_sampler_2d_backward (bicubic)");
    auto [gi, gg] = at::grid_sampler_2d_backward(grad.cpu(), x.cpu(), grid.cpu(), interpolation, padding,
                                                 align_corners, mask);
    return {gi.defined() ? gi.to(x.device()) : gi, gg.defined() ? gg.to(x.device()) : gg};
  }
  auto r = call("grid_sampler_2d_backward", {grad, x, grid}, grid_attrs(interpolation, padding, align_corners));
  return {r[0], r[1]};
}

// kthvalue, median and nanmedian: the runtime's stable sort, one position
// per row (a row's first NaN for median).
std::tuple<Tensor, Tensor> k_kthvalue(const Tensor& x, int64_t k, int64_t dim, bool keepdim) {
  auto r = call("kthvalue", {x}, Attrs().i("k", k).i("dim", dim).b("keepdim", keepdim));
  return {r[0], r[1]};
}
template <bool IgnoreNan>
std::tuple<Tensor, Tensor> k_median_dim(const Tensor& x, int64_t dim, bool keepdim) {
  auto r = call("median", {x}, Attrs().i("dim", dim).b("keepdim", keepdim).b("ignore_nan", IgnoreNan));
  return {r[0], r[1]};
}
// mode: the most frequent value along dim (the smallest of a tie) and
// the index of its last occurrence, from the runtime's stable sort.
std::tuple<Tensor, Tensor> k_mode(const Tensor& x, int64_t dim, bool keepdim) {
  auto r = call("mode", {x}, Attrs().i("dim", dim).b("keepdim", keepdim));
  return {r[0], r[1]};
}
template <bool IgnoreNan>
Tensor k_median(const Tensor& x) {
  return call("median", {x}, Attrs().b("ignore_nan", IgnoreNan))[0];
}
// The results of `f` (a tuple of tensors) written into the out= tensors
// `outs`, in order, as out= forms return them.
template <typename F, typename... Outs>
std::tuple<Outs&...> into_all(F&& f, Outs&... outs) {
  std::apply([&](const auto&... r) { (into(outs, r), ...); }, f());
  return {outs...};
}
template <typename F>
std::tuple<Tensor&, Tensor&> into2(Tensor& v, Tensor& i, F&& f) {
  return into_all(std::forward<F>(f), v, i);
}

// searchsorted and bucketize: the runtime's binary search. Both operands
// compared in at::result_type's dtype (a Scalar value is a wrapped number,
// as torch makes it); a sorter's range is checked with one read back, as
// torch checks it.
Tensor k_searchsorted(const Tensor& seq, const Tensor& v, bool out_int32, bool right,
                      std::optional<c10::string_view> side, const OptTensor& sorter) {
  if (side.has_value()) {
    TORCH_CHECK(*side == "left" || *side == "right",
                "torch.searchsorted(): side can only be 'left' or 'right' but got ", *side);
    TORCH_CHECK(!right || *side == "right", "torch.searchsorted(): side and right can't be set to opposites, got side of ",
                *side, " while right was True");
    right = *side == "right";
  }
  TORCH_CHECK(seq.dim() > 0, "torch.searchsorted(): boundaries tensor should have positive dimension, but got 0 dimension");
  TORCH_CHECK(v.dim() > 0 || seq.dim() == 1,
              "torch.searchsorted(): input value can be a scalar only when boundaries tensor dimension is 1, but we got "
              "boundaries tensor dim(", seq.dim(), ") and input value's dim(", v.dim(), ") numel(", v.numel(), ")");
  const at::ScalarType common = at::result_type(seq, v);
  std::vector<Tensor> ins{seq.to(common), v.to(common)};
  if (sorter.has_value() && sorter->defined()) {
    TORCH_CHECK(sorter->scalar_type() == at::kLong, "torch.searchsorted(): sorter must be a tensor of long dtype but got dtype ",
                sorter->scalar_type());
    TORCH_CHECK(sorter->sizes().equals(seq.sizes()), "torch.searchsorted(): boundary and sorter must have the same size, but "
                "got boundary tensor ", seq.sizes(), " and got sorter tensor ", sorter->sizes());
    if (sorter->numel() > 0) {
      Tensor range = at::stack({sorter->min(), sorter->max()}).cpu();
      TORCH_CHECK(range[0].item<int64_t>() >= 0 && range[1].item<int64_t>() < seq.size(-1),
                  "torch.searchsorted(): sorter index out of range");
    }
    ins.push_back(*sorter);
  }
  return call1("searchsorted", ins, Attrs().b("right", right).b("out_int32", out_int32));
}
Tensor scalar_value(const Scalar& s, const Tensor& like) {
  Tensor t = scalar_on(s, dev(like));
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}
Tensor k_bucketize(const Tensor& v, const Tensor& boundaries, bool out_int32, bool right) {
  TORCH_CHECK(boundaries.dim() == 1, "boundaries tensor must be 1 dimension, but got dim(", boundaries.dim(), ")");
  return k_searchsorted(boundaries, v, out_int32, right, std::nullopt, std::nullopt);
}

// masked_scatter: source's elements in order into the true elements of the
// mask. A source with fewer elements than the mask could select is checked
// against the mask's count with one read back (torch's error).
Tensor k_masked_scatter(const Tensor& self, const Tensor& mask, const Tensor& source) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_scatter_ only supports boolean masks, but got mask with dtype ",
              mask.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(),
              "masked_scatter: expected self and source to have same dtypes but got ", self.scalar_type(), " and ",
              source.scalar_type());
  auto shape = at::infer_size(self.sizes(), mask.sizes());
  if (source.numel() < c10::multiply_integers(shape)) {
    const int64_t count = mask.expand(shape).sum().item<int64_t>();
    TORCH_CHECK(count <= source.numel(), "Number of elements of source < number of ones in mask");
  }
  return call1("masked_scatter", {self, mask, source});
}

// upsample_bicubic2d and the antialiased _upsample_{bilinear,bicubic}2d_aa,
// and their backward: the runtime's upsample_cubic and upsample_antialias.
Tensor k_upsample_bicubic2d(const Tensor& x, at::IntArrayRef o, bool a, OptD sh, OptD sw) {
  return filtered_upsample("upsample_cubic", x, o, a, upsample_scales({sh, sw}));
}
Tensor k_upsample_bicubic2d_bw(const Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool a, OptD sh, OptD sw) {
  return filtered_upsample_bw("upsample_cubic_backward", g, o, i, a, upsample_scales({sh, sw}));
}
template <bool Cubic>
Tensor k_upsample_aa2d(const Tensor& x, at::IntArrayRef o, bool a, OptD sh, OptD sw) {
  return filtered_upsample("upsample_antialias", x, o, a, upsample_scales({sh, sw}), Cubic ? "cubic" : "linear");
}
template <bool Cubic>
Tensor k_upsample_aa2d_bw(const Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool a, OptD sh, OptD sw) {
  return filtered_upsample_bw("upsample_antialias_backward", g, o, i, a, upsample_scales({sh, sw}),
                              Cubic ? "cubic" : "linear");
}

// isin: each element compared with every test element (the test sets in
// models are small: token ids such as eos and pad).
Tensor k_isin(const Tensor& elements, const Tensor& test, bool assume_unique, bool invert) {
  Tensor t = test.device() == elements.device() ? test : test.to(elements.device());
  Tensor hit = call1("any", {call1("eq", {elements.unsqueeze(-1), t.reshape({-1})})}, Attrs().ints("dim", {-1}));
  return invert ? call1("logical_not", {hit}) : hit;
}

// --- convolution ---------------------------------------------------------------
//
// aten::convolution reaches a backend without native convolution through
// convolution_overrideable (forward) and convolution_backward_overrideable;
// both map onto the runtime's convolution ops.

Attrs conv_attrs(at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                 at::IntArrayRef output_padding, int64_t groups) {
  Attrs a;
  a.ints("stride", stride).ints("padding", padding).ints("dilation", dilation).b("transposed", transposed);
  a.ints("output_padding", output_padding).i("groups", groups);
  return a;
}

Tensor k_convolution(const Tensor& x, const Tensor& w, const OptTensor& b, at::IntArrayRef stride,
                     at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                     at::IntArrayRef output_padding, int64_t groups) {
  std::vector<Tensor> ins{x, w};
  if (b.has_value() && b->defined()) ins.push_back(*b);
  return call1("convolution", ins, conv_attrs(stride, padding, dilation, transposed, output_padding, groups));
}

std::tuple<Tensor, Tensor, Tensor> k_convolution_bw(const Tensor& g, const Tensor& x, const Tensor& w,
                                                    at::IntArrayRef stride, at::IntArrayRef padding,
                                                    at::IntArrayRef dilation, bool transposed,
                                                    at::IntArrayRef output_padding, int64_t groups,
                                                    std::array<bool, 3> mask) {
  Attrs a = conv_attrs(stride, padding, dilation, transposed, output_padding, groups);
  a.ints("output_mask", {mask[0], mask[1], mask[2]});
  auto r = call("convolution_backward", {g, x, w}, a);
  return {mask[0] ? r[0] : Tensor(), mask[1] ? r[1] : Tensor(), mask[2] ? r[2] : Tensor()};
}

// --- attention -----------------------------------------------------------------
//
// torch.nn.functional.scaled_dot_product_attention asks _fused_sdp_choice
// which backend runs; for tpu the answer is "overrideable", whose forward
// and backward ops run the runtime's attention (causal, additive or boolean
// mask, dropout, GQA) in one op each, with autograd from torch's formula.

constexpr int64_t kSdpOverrideable = 4;  // at::SDPBackend::overrideable

int64_t sdp_choice(const Tensor&, const Tensor&, const Tensor&, const OptTensor&, double, bool,
                   std::optional<double>, bool) {
  return kSdpOverrideable;
}

}  // namespace

std::atomic<bool>& fused_attention_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("TPURT_FUSED_ATTENTION");
    return v == nullptr || std::string(v) != "0";
  }()};
  return on;
}

bool fused_attention_enabled() { return fused_attention_flag().load(); }
void set_fused_attention_enabled(bool on) { fused_attention_flag().store(on); }

// Which SDPA backend runs: the runtime's attention op (overrideable, the
// default), else torch's math decomposition over the native kernels. The
// op's plain case (f32, no mask, no dropout) is one composite primitive
// with a blocked host kernel that skips the causal half; in the Llama
// training step it is about 10% faster than the decomposition on host
// and on xla.
// Only that plain case goes to the runtime's op: with a mask, dropout or
// half precision the op is its own math decomposition, which has no
// kernel of its own and rounds differently from torch's (one f32 pass
// against fp16 steps: a T5 fp16 eager-vs-sdpa check on xla went past its
// tolerance), and a mask that requires grad (T5's learned position bias)
// would get no gradient from it.
int64_t sdp_choice_stub(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& mask, double p,
                        bool causal, std::optional<double> scale, bool gqa) {
  const bool plain = !(mask.has_value() && mask->defined()) && p == 0.0 && q.scalar_type() == at::kFloat &&
                     k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat;
  return fused_attention_enabled() && plain ? sdp_choice(q, k, v, mask, p, causal, scale, gqa) : 0;
}

namespace {

// Whether k's heads (dimension -3) divide q's: equal, broadcast from one,
// or grouped.
bool heads_divide(const Tensor& q, const Tensor& k) {
  return q.dim() >= 3 && k.dim() >= 3 && k.size(-3) > 0 && q.size(-3) % k.size(-3) == 0;
}

Attrs sdpa_attrs(const Tensor& q, const Tensor& k, double dropout_p, bool is_causal, std::optional<double> scale) {
  Attrs a;
  a.b("is_causal", is_causal).f("dropout_p", dropout_p);
  if (scale.has_value()) a.f("scale", *scale);
  // Grouped heads (more query heads than key/value heads, a multiple);
  // fewer query heads broadcast instead, as in torch's math path.
  if (heads_divide(q, k) && q.size(-3) > k.size(-3)) a.b("enable_gqa", true);
  return a;
}

// A tensor of `sizes` whose strides follow `like`'s order (torch's
// alloc_with_matching_layout and empty_like: the layout the meta functions
// of the attention ops promise, which compiled graphs rely on).
Tensor empty_in_layout_of(const Tensor& like, at::IntArrayRef sizes, at::ScalarType dtype) {
  std::vector<int64_t> order(like.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  std::vector<int64_t> permuted, back(like.dim());
  for (size_t i = 0; i < order.size(); ++i) {
    permuted.push_back(sizes[order[i]]);
    back[order[i]] = static_cast<int64_t>(i);
  }
  return empty(permuted, dtype, dev(like)).permute(back);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, c10::SymInt, c10::SymInt, Tensor, Tensor, Tensor> sdpa_fwd(
    const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& bias, double dropout_p, bool is_causal,
    bool return_debug_mask, std::optional<double> scale) {
  std::vector<Tensor> ins{q, k, v};
  if (bias.has_value() && bias->defined()) ins.push_back(*bias);
  Tensor seed, offset;
  if (dropout_p > 0) {
    auto keys = rng_inputs(std::nullopt, dev(q), static_cast<uint64_t>(q.numel() / q.size(-1) * k.size(-2)));
    seed = keys[0];
    offset = keys[1];
    ins.push_back(seed);
    ins.push_back(offset);
  } else {
    seed = empty({}, at::kLong, dev(q));
    offset = empty({}, at::kLong, dev(q));
  }
  // The output takes the query's layout, as torch's meta function for this
  // op says (a query that is a transposed [B, L, H, E] view gives an output
  // laid out as [B, L, H, Ev]): compiled graphs view it with those strides.
  std::vector<int64_t> out_sizes(q.sizes().begin(), q.sizes().end());
  out_sizes.back() = v.size(-1);
  auto attrs = sdpa_attrs(q, k, dropout_p, is_causal, scale);
  Tensor none;
  const int64_t r = q.dim();
  // No mask, one batch shape, and key/value heads that divide the query's
  // (equal, broadcast from one, or grouped): the result has q's shape.
  const bool plain = !(bias.has_value() && bias->defined()) && r >= 3 && k.dim() == r && v.dim() == r &&
                     q.sizes().slice(0, r - 3) == k.sizes().slice(0, r - 3) &&
                     k.sizes().slice(0, r - 2) == v.sizes().slice(0, r - 2) && heads_divide(q, k);
  if (plain) {
    // The result's shape is the query's (no batch broadcasting): written
    // straight into the output.
    Tensor out = empty_in_layout_of(q, out_sizes, q.scalar_type());
    Tensor lse = empty(q.sizes().slice(0, r - 1), q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat, dev(q));
    call_into("scaled_dot_product_attention", ins, {out, lse}, attrs);
    return {out, lse, none, none, c10::SymInt(q.size(-2)), c10::SymInt(k.size(-2)), seed, offset, none};
  }
  auto res = call("scaled_dot_product_attention", ins, attrs);
  if (!q.is_contiguous() && res[0].sizes() == at::IntArrayRef(out_sizes)) {
    Tensor out = empty_in_layout_of(q, out_sizes, q.scalar_type());
    copy_into(out, res[0], false);
    res[0] = out;
  }
  return {res[0], res[1], none, none, c10::SymInt(q.size(-2)), c10::SymInt(k.size(-2)), seed, offset, none};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> sdpa_bwd(const Tensor& g, const Tensor& q, const Tensor& k,
                                                    const Tensor& v, const Tensor& bias, std::array<bool, 4> mask,
                                                    const Tensor& out, const Tensor& lse, const Tensor&, const Tensor&,
                                                    int64_t, int64_t, double dropout_p, bool is_causal,
                                                    const Tensor& seed, const Tensor& offset,
                                                    std::optional<double> scale) {
  std::vector<Tensor> ins{g, q, k, v, out, lse};
  if (bias.defined()) ins.push_back(bias);
  if (dropout_p > 0) {
    ins.push_back(seed);
    ins.push_back(offset);
  }
  // Gradients in their inputs' layouts (the meta function's empty_like).
  std::vector<Tensor> r;
  for (const Tensor* t : {&q, &k, &v}) r.push_back(empty_in_layout_of(*t, t->sizes(), t->scalar_type()));
  call_into("scaled_dot_product_attention_backward", ins, r, sdpa_attrs(q, k, dropout_p, is_causal, scale));
  // The bias gets no gradient (as torch's fused kernels: masks are inputs).
  return {mask[0] ? r[0] : Tensor(), mask[1] ? r[1] : Tensor(), mask[2] ? r[2] : Tensor(), Tensor()};
}

// --- registration helpers ----------------------------------------------------------------

#define TPU_UNARY(m, aten_name, op)                                                          \
  m.impl(aten_name, [](const Tensor& x) { return call1(op, {x}); });                        \
  m.impl(aten_name "_", [](Tensor& x) -> Tensor& { return inplace(x, call1(op, {x})); }); \
  m.impl(aten_name ".out", [](const Tensor& x, Tensor& out) -> Tensor& { return into(out, call1(op, {x})); })

#define TPU_BINARY(m, aten_name, op)                                                                       \
  m.impl(aten_name ".Tensor", [](const Tensor& a, const Tensor& b) { return call1(op, {a, b}); });        \
  m.impl(aten_name "_.Tensor", [](Tensor& a, const Tensor& b) -> Tensor& { return inplace_binary(a, op, b); });       \
  m.impl(aten_name ".out", [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& {                  \
    return into(out, call1(op, {a, b}));                                                                   \
  });                                                                                                      \
  m.impl(aten_name ".Scalar", [](const Tensor& a, const Scalar& b) { return call1(op, {a, S(b, a)}); }); \
  m.impl(aten_name "_.Scalar", [](Tensor& a, const Scalar& b) -> Tensor& { return inplace_binary(a, op, S(b, a)); })

#define TPU_BINARY_PLAIN(m, aten_name, op)                                                          \
  m.impl(aten_name, [](const Tensor& a, const Tensor& b) { return call1(op, {a, b}); });           \
  m.impl(aten_name "_", [](Tensor& a, const Tensor& b) -> Tensor& { return inplace(a, call1(op, {a, b})); }); \
  m.impl(aten_name ".out", [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& {           \
    return into(out, call1(op, {a, b}));                                                            \
  })

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // Unary math.
  TPU_UNARY(m, "neg", "neg");
  TPU_UNARY(m, "abs", "abs");
  TPU_UNARY(m, "sign", "sign");
  TPU_UNARY(m, "sgn", "sign");  // sgn is sign for the real dtypes tpu has
  TPU_UNARY(m, "exp", "exp");
  TPU_UNARY(m, "expm1", "expm1");
  TPU_UNARY(m, "log", "log");
  TPU_UNARY(m, "log1p", "log1p");
  TPU_UNARY(m, "sqrt", "sqrt");
  TPU_UNARY(m, "rsqrt", "rsqrt");
  TPU_UNARY(m, "tanh", "tanh");
  TPU_UNARY(m, "sigmoid", "sigmoid");
  TPU_UNARY(m, "sin", "sin");
  TPU_UNARY(m, "cos", "cos");
  TPU_UNARY(m, "erf", "erf");
  TPU_UNARY(m, "floor", "floor");
  TPU_UNARY(m, "ceil", "ceil");
  TPU_UNARY(m, "round", "round");
  TPU_UNARY(m, "trunc", "trunc");
  TPU_UNARY(m, "reciprocal", "reciprocal");
  TPU_UNARY(m, "logical_not", "logical_not");
  TPU_UNARY(m, "bitwise_not", "bitwise_not");
  TPU_UNARY(m, "silu", "silu");
  m.impl("relu", [](const Tensor& x) { return call1("relu", {x}); });
  m.impl("relu_", [](Tensor& x) -> Tensor& { return inplace(x, call1("relu", {x})); });
  m.impl("isnan", [](const Tensor& x) { return call1("isnan", {x}); });
  m.impl("isneginf", [](const Tensor& x) {
    return x.is_floating_point() ? call1("eq", {x, S(-std::numeric_limits<double>::infinity(), x)})
                                 : call1("ne", {x, x});
  });
  m.impl("isposinf", [](const Tensor& x) {
    return x.is_floating_point() ? call1("eq", {x, S(std::numeric_limits<double>::infinity(), x)})
                                 : call1("ne", {x, x});
  });
  m.impl("isinf", [](const Tensor& x) {
    return x.is_floating_point() ? call1("eq", {call1("abs", {x}), S(std::numeric_limits<double>::infinity(), x)})
                                 : call1("ne", {x, x});
  });
  m.impl("isfinite", [](const Tensor& x) { return call1("isfinite", {x}); });
  m.impl("gelu", k_gelu);
  m.impl("gelu_", [](Tensor& x, c10::string_view a) -> Tensor& { return inplace(x, k_gelu(x, a)); });
  m.impl("gelu.out", [](const Tensor& x, c10::string_view a, Tensor& out) -> Tensor& { return into(out, k_gelu(x, a)); });

  // Binary math.
  m.impl("add.Tensor", k_add);
  m.impl("add_.Tensor", [](Tensor& a, const Tensor& b, const Scalar& al) -> Tensor& {
    return inplace_add_sub(a, "add", b, al);
  });
  m.impl("add.out", [](const Tensor& a, const Tensor& b, const Scalar& al, Tensor& out) -> Tensor& {
    return into(out, k_add(a, b, al));
  });
  m.impl("add.Scalar", [](const Tensor& a, const Scalar& b, const Scalar& al) { return k_add(a, S(b, a), al); });
  m.impl("add_.Scalar", [](Tensor& a, const Scalar& b, const Scalar& al) -> Tensor& {
    return inplace_add_sub(a, "add", S(b, a), al);
  });
  m.impl("sub.Tensor", k_sub);
  m.impl("sub_.Tensor", [](Tensor& a, const Tensor& b, const Scalar& al) -> Tensor& {
    return inplace_add_sub(a, "sub", b, al);
  });
  m.impl("sub.out", [](const Tensor& a, const Tensor& b, const Scalar& al, Tensor& out) -> Tensor& {
    return into(out, k_sub(a, b, al));
  });
  m.impl("sub.Scalar", [](const Tensor& a, const Scalar& b, const Scalar& al) { return k_sub(a, S(b, a), al); });
  m.impl("sub_.Scalar", [](Tensor& a, const Scalar& b, const Scalar& al) -> Tensor& {
    return inplace(a, k_sub(a, S(b, a), al));
  });
  m.impl("rsub.Tensor", [](const Tensor& a, const Tensor& b, const Scalar& al) { return k_sub(b, a, al); });
  m.impl("rsub.Scalar", [](const Tensor& a, const Scalar& b, const Scalar& al) { return k_sub(S(b, a), a, al); });
  TPU_BINARY(m, "mul", "mul");
  TPU_BINARY(m, "div", "div");
  m.impl("div.Tensor_mode", k_div_mode);
  m.impl("div_.Tensor_mode", [](Tensor& a, const Tensor& b, std::optional<c10::string_view> md) -> Tensor& {
    return inplace(a, k_div_mode(a, b, md));
  });
  m.impl("div.Scalar_mode", [](const Tensor& a, const Scalar& b, std::optional<c10::string_view> md) {
    return k_div_mode(a, S(b, a), md);
  });
  m.impl("floor_divide", [](const Tensor& a, const Tensor& b) { return k_div_mode(a, b, "floor"); });
  m.impl("floor_divide.Scalar", [](const Tensor& a, const Scalar& b) { return k_div_mode(a, S(b, a), "floor"); });
  m.impl("floor_divide_.Tensor", [](Tensor& a, const Tensor& b) -> Tensor& {
    return inplace(a, k_div_mode(a, b, "floor"));
  });
  m.impl("floor_divide_.Scalar", [](Tensor& a, const Scalar& b) -> Tensor& {
    return inplace(a, k_div_mode(a, S(b, a), "floor"));
  });
  m.impl("floor_divide.out", [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& {
    return into(out, k_div_mode(a, b, "floor"));
  });
  // Broadcast, then the boolean index: one read back for the count, as on every device.
  m.impl("masked_select", [](const Tensor& self, const Tensor& mask) {
    TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask");
    auto shape = at::infer_size(self.sizes(), mask.sizes());
    return at::index(self.expand(shape), {std::optional<Tensor>(mask.expand(shape))});
  });
  TPU_BINARY(m, "remainder", "remainder");
  TPU_BINARY(m, "fmod", "fmod");
  TPU_BINARY(m, "eq", "eq");
  TPU_BINARY(m, "ne", "ne");
  TPU_BINARY(m, "lt", "lt");
  TPU_BINARY(m, "le", "le");
  TPU_BINARY(m, "gt", "gt");
  TPU_BINARY(m, "ge", "ge");
  TPU_BINARY(m, "bitwise_and", "bitwise_and");
  TPU_BINARY(m, "bitwise_or", "bitwise_or");
  TPU_BINARY(m, "bitwise_xor", "bitwise_xor");
  TPU_BINARY_PLAIN(m, "maximum", "maximum");
  TPU_BINARY_PLAIN(m, "minimum", "minimum");
  TPU_BINARY_PLAIN(m, "atan2", "atan2");
  TPU_BINARY_PLAIN(m, "logical_and", "logical_and");
  TPU_BINARY_PLAIN(m, "logical_or", "logical_or");
  TPU_BINARY_PLAIN(m, "logical_xor", "logical_xor");
  m.impl("pow.Tensor_Tensor", [](const Tensor& a, const Tensor& b) { return call1("pow", {a, b}); });
  m.impl("pow.Tensor_Scalar", k_pow_scalar);
  m.impl("pow.Scalar", [](const Scalar& a, const Tensor& b) { return call1("pow", {S(a, b), b}); });
  m.impl("pow_.Scalar", [](Tensor& a, const Scalar& b) -> Tensor& { return inplace(a, k_pow_scalar(a, b)); });
  m.impl("pow_.Tensor", [](Tensor& a, const Tensor& b) -> Tensor& { return inplace(a, call1("pow", {a, b})); });
  m.impl("pow.Tensor_Tensor_out", [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& {
    return into(out, call1("pow", {a, b}));
  });
  m.impl("pow.Tensor_Scalar_out", [](const Tensor& a, const Scalar& b, Tensor& out) -> Tensor& {
    return into(out, k_pow_scalar(a, b));
  });
  m.impl("where.self", k_where);
  m.impl("where.self_out", [](const Tensor& c, const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& {
    return into(out, k_where(c, a, b));
  });
  m.impl("masked_fill.Scalar", k_masked_fill_s);
  m.impl("masked_fill_.Scalar", [](Tensor& s, const Tensor& m, const Scalar& v) -> Tensor& {
    return inplace(s, k_masked_fill_s(s, m, v));
  });
  m.impl("masked_fill.Tensor", k_masked_fill_t);
  m.impl("masked_fill_.Tensor", [](Tensor& s, const Tensor& m, const Tensor& v) -> Tensor& {
    return inplace(s, k_masked_fill_t(s, m, v));
  });
  m.impl("clamp", k_clamp);
  m.impl("clamp_", [](Tensor& x, const std::optional<Scalar>& lo, const std::optional<Scalar>& hi) -> Tensor& {
    return inplace(x, k_clamp(x, lo, hi));
  });
  m.impl("clamp.out", [](const Tensor& x, const std::optional<Scalar>& lo, const std::optional<Scalar>& hi,
                         Tensor& out) -> Tensor& { return into(out, k_clamp(x, lo, hi)); });
  m.impl("clamp.Tensor", k_clamp_t);
  m.impl("clamp.Tensor_out", [](const Tensor& x, const OptTensor& lo, const OptTensor& hi, Tensor& out) -> Tensor& {
    return into(out, k_clamp_t(x, lo, hi));
  });
  m.impl("clamp_.Tensor",
         [](Tensor& x, const OptTensor& lo, const OptTensor& hi) -> Tensor& { return inplace(x, k_clamp_t(x, lo, hi)); });
  m.impl("clamp_min.Tensor", [](const Tensor& x, const Tensor& lo) { return k_clamp_t(x, lo, std::nullopt); });
  m.impl("clamp_min.Tensor_out", [](const Tensor& x, const Tensor& lo, Tensor& out) -> Tensor& {
    return into(out, k_clamp_t(x, lo, std::nullopt));
  });
  m.impl("clamp_min_.Tensor",
         [](Tensor& x, const Tensor& lo) -> Tensor& { return inplace(x, k_clamp_t(x, lo, std::nullopt)); });
  m.impl("clamp_max.Tensor", [](const Tensor& x, const Tensor& hi) { return k_clamp_t(x, std::nullopt, hi); });
  m.impl("clamp_max.Tensor_out", [](const Tensor& x, const Tensor& hi, Tensor& out) -> Tensor& {
    return into(out, k_clamp_t(x, std::nullopt, hi));
  });
  m.impl("clamp_max_.Tensor",
         [](Tensor& x, const Tensor& hi) -> Tensor& { return inplace(x, k_clamp_t(x, std::nullopt, hi)); });
  m.impl("aminmax", [](const Tensor& x, std::optional<int64_t> dim, bool keepdim) -> std::tuple<Tensor, Tensor> {
    return k_aminmax(x, dim, keepdim);
  });
  m.impl("aminmax.out", [](const Tensor& x, std::optional<int64_t> dim, bool keepdim, Tensor& mn,
                           Tensor& mx) -> std::tuple<Tensor&, Tensor&> {
    auto [a, b] = k_aminmax(x, dim, keepdim);
    into(mn, a);
    into(mx, b);
    return {mn, mx};
  });
  m.impl("nan_to_num.out", [](const Tensor& x, std::optional<double> nan, std::optional<double> posinf,
                              std::optional<double> neginf, Tensor& out) -> Tensor& {
    Attrs a;
    if (nan.has_value()) a.f("nan", *nan);
    if (posinf.has_value()) a.f("posinf", *posinf);
    if (neginf.has_value()) a.f("neginf", *neginf);
    return into(out, call1("nan_to_num", {x}, a));
  });
  m.impl("eye.out", [](int64_t n, Tensor& out) -> Tensor& { return into(out, k_eye(n, n, out)); });
  m.impl("eye.m_out", [](int64_t n, int64_t m, Tensor& out) -> Tensor& { return into(out, k_eye(n, m, out)); });
  m.impl("clamp_min", [](const Tensor& x, const Scalar& lo) { return k_clamp(x, lo, std::nullopt); });
  m.impl("clamp_min_", [](Tensor& x, const Scalar& lo) -> Tensor& { return inplace(x, k_clamp(x, lo, std::nullopt)); });
  m.impl("clamp_max", [](const Tensor& x, const Scalar& hi) { return k_clamp(x, std::nullopt, hi); });
  m.impl("clamp_max_", [](Tensor& x, const Scalar& hi) -> Tensor& { return inplace(x, k_clamp(x, std::nullopt, hi)); });
  m.impl("lerp.Scalar", k_lerp_s);
  m.impl("lerp_.Scalar", [](Tensor& a, const Tensor& b, const Scalar& w) -> Tensor& { return inplace(a, k_lerp_s(a, b, w)); });
  m.impl("lerp.Tensor", k_lerp_t);
  m.impl("lerp_.Tensor", [](Tensor& a, const Tensor& b, const Tensor& w) -> Tensor& { return inplace(a, k_lerp_t(a, b, w)); });
  m.impl("addcmul", k_addcmul);
  m.impl("addcmul_", [](Tensor& s, const Tensor& a, const Tensor& b, const Scalar& v) -> Tensor& {
    return inplace(s, k_addcmul(s, a, b, v));
  });
  m.impl("addcdiv", k_addcdiv);
  m.impl("addcdiv_", [](Tensor& s, const Tensor& a, const Tensor& b, const Scalar& v) -> Tensor& {
    return inplace(s, k_addcdiv(s, a, b, v));
  });

  // Reductions.
  m.impl("sum.dim_IntList", k_sum_dim);
  m.impl("sum", k_sum_all);
  m.impl("sum.IntList_out", [](const Tensor& x, at::OptionalIntArrayRef d, bool k, std::optional<at::ScalarType> dt,
                               Tensor& out) -> Tensor& { return into(out, k_sum_dim(x, d, k, dt)); });
  m.impl("mean.dim", k_mean_dim);
  m.impl("mean", k_mean_all);
  m.impl("mean.out", [](const Tensor& x, at::OptionalIntArrayRef d, bool k, std::optional<at::ScalarType> dt,
                        Tensor& out) -> Tensor& { return into(out, k_mean_dim(x, d, k, dt)); });
  m.impl("amax", k_amax);
  m.impl("amin", k_amin);
  m.impl("max", k_max_all);
  m.impl("min", k_min_all);
  m.impl("max.dim", k_max_dim);
  m.impl("min.dim", k_min_dim);
  m.impl("argmax", k_argmax);
  m.impl("argmin", k_argmin);
  m.impl("prod.dim_int", k_prod_dim);
  m.impl("prod", k_prod_all);
  m.impl("var.correction", k_var_c);
  m.impl("std.correction", k_std_c);
  m.impl("logsumexp", k_logsumexp);
  m.impl("any.dims", k_any_dims);
  m.impl("any.dim", k_any_dim);
  m.impl("any", k_any_all);
  m.impl("all.dims", k_all_dims);
  m.impl("all.dim", k_all_dim);
  m.impl("all", k_all_all);
  m.impl("cumsum", k_cumsum);
  m.impl("cumsum_", [](Tensor& x, int64_t d, std::optional<at::ScalarType> dt) -> Tensor& {
    return inplace(x, k_cumsum(x, d, dt));
  });
  m.impl("cumsum.out", [](const Tensor& x, int64_t d, std::optional<at::ScalarType> dt, Tensor& out) -> Tensor& {
    return into(out, k_cumsum(x, d, dt));
  });
  m.impl("cumprod", k_cumprod);
  m.impl("linalg_vector_norm", k_vector_norm);
  m.impl("norm.ScalarOpt_dim", [](const Tensor& x, const std::optional<Scalar>& p, at::IntArrayRef d, bool k) {
    return k_norm_dims(x, p, d, k, std::nullopt);
  });
  m.impl("norm.ScalarOpt_dim_dtype", [](const Tensor& x, const std::optional<Scalar>& p, at::IntArrayRef d, bool k,
                                        at::ScalarType dt) { return k_norm_dims(x, p, d, k, dt); });
  m.impl("norm.out", [](const Tensor& x, const std::optional<Scalar>& p, at::IntArrayRef d, bool k,
                        Tensor& out) -> Tensor& { return into(out, k_norm_dims(x, p, d, k, std::nullopt)); });
  m.impl("norm.dtype_out", [](const Tensor& x, const std::optional<Scalar>& p, at::IntArrayRef d, bool k,
                              at::ScalarType dt, Tensor& out) -> Tensor& {
    return into(out, k_norm_dims(x, p, d, k, dt));
  });
  m.impl("norm.Scalar", [](const Tensor& x, const Scalar& p) { return k_norm_all(x, p, std::nullopt); });
  m.impl("norm.Scalar_out", [](const Tensor& x, const Scalar& p, Tensor& out) -> Tensor& {
    return into(out, k_norm_all(x, p, std::nullopt));
  });
  m.impl("norm.ScalarOpt_dtype", [](const Tensor& x, const std::optional<Scalar>& p, at::ScalarType dt) {
    return k_norm_all(x, p, dt);
  });
  m.impl("norm.ScalarOpt_dtype_out", [](const Tensor& x, const std::optional<Scalar>& p, at::ScalarType dt,
                                        Tensor& out) -> Tensor& { return into(out, k_norm_all(x, p, dt)); });
  m.impl("count_nonzero.dim_IntList", k_count_nonzero);
  m.impl("count_nonzero.dim_IntList_out", [](const Tensor& x, at::IntArrayRef d, Tensor& out) -> Tensor& {
    return into(out, k_count_nonzero(x, d));
  });
  m.impl("count_nonzero", [](const Tensor& x, std::optional<int64_t> d) {
    return d.has_value() ? k_count_nonzero(x, {*d}) : k_count_nonzero(x, {});
  });

  // Linear algebra.
  m.impl("mm", k_mm);
  m.impl("mm.out", [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& { return into(out, k_mm(a, b)); });
  m.impl("bmm", k_bmm);
  m.impl("bmm.out", [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& { return into(out, k_bmm(a, b)); });
  m.impl("addmm", k_addmm);
  m.impl("addmm_", [](Tensor& s, const Tensor& a, const Tensor& b, const Scalar& be, const Scalar& al) -> Tensor& {
    return inplace(s, k_addmm(s, a, b, be, al));
  });
  m.impl("addmm.out", [](const Tensor& s, const Tensor& a, const Tensor& b, const Scalar& be, const Scalar& al,
                         Tensor& out) -> Tensor& { return into(out, k_addmm(s, a, b, be, al)); });
  m.impl("baddbmm", k_baddbmm);
  m.impl("baddbmm_", [](Tensor& s, const Tensor& a, const Tensor& b, const Scalar& be, const Scalar& al) -> Tensor& {
    return inplace(s, k_baddbmm(s, a, b, be, al));
  });
  m.impl("dot", k_dot);

  // nn.
  m.impl("_softmax", k_softmax);
  m.impl("_softmax.out", [](const Tensor& x, int64_t d, bool h, Tensor& out) -> Tensor& { return into(out, k_softmax(x, d, h)); });
  m.impl("_log_softmax", k_log_softmax);
  m.impl("_log_softmax.out", [](const Tensor& x, int64_t d, bool h, Tensor& out) -> Tensor& {
    return into(out, k_log_softmax(x, d, h));
  });
  m.impl("_softmax_backward_data", k_softmax_bw);
  m.impl("_log_softmax_backward_data", k_log_softmax_bw);
  m.impl("native_layer_norm", k_layer_norm);
  m.impl("native_batch_norm", k_batch_norm);
  m.impl("_native_batch_norm_legit_no_training", k_batch_norm_no_training);
  m.impl("native_batch_norm_backward", k_batch_norm_bw);
  m.impl("var_mean.correction", k_var_mean);
  m.impl("native_group_norm_backward", k_group_norm_bw);
  m.impl("native_layer_norm_backward", k_layer_norm_bw);
  m.impl("_fused_rms_norm", k_fused_rms_norm);
  m.impl("_fused_rms_norm_backward", k_fused_rms_norm_bw);
  m.impl("gelu_backward", k_gelu_bw);
  m.impl("silu_backward", k_silu_bw);
  m.impl("sigmoid_backward", k_sigmoid_bw);
  m.impl("tanh_backward", k_tanh_bw);
  m.impl("threshold_backward", k_threshold_bw);
  m.impl("embedding", k_embedding);
  m.impl("embedding_dense_backward", k_embedding_dense_bw);
  m.impl("_embedding_bag", k_embedding_bag);
  m.impl("_embedding_bag_forward_only", k_embedding_bag);
  m.impl("_embedding_bag_backward", k_embedding_bag_bw);
  m.impl("_embedding_bag_per_sample_weights_backward", k_embedding_bag_psw_bw);
  m.impl("nll_loss_forward", k_nll_loss_fwd);
  m.impl("nll_loss_backward", k_nll_loss_bw);
  // The spatial forms (cross_entropy on [N, C, H, W]): the op reads any
  // trailing dims, so the same kernels, with torch's 2-d checks first.
  m.impl("nll_loss2d_forward", [](const Tensor& x, const Tensor& t, const OptTensor& w, int64_t red, int64_t ig) {
    check_nll2d(x, t);
    return k_nll_loss_fwd(x, t, w, red, ig);
  });
  m.impl("nll_loss2d_forward.output", [](const Tensor& x, const Tensor& t, const OptTensor& w, int64_t red,
                                         int64_t ig, Tensor& out, Tensor& total) {
    check_nll2d(x, t);
    return into_all([&] { return k_nll_loss_fwd(x, t, w, red, ig); }, out, total);
  });
  m.impl("nll_loss2d_backward", [](const Tensor& g, const Tensor& x, const Tensor& t, const OptTensor& w,
                                   int64_t red, int64_t ig, const Tensor& total) {
    check_nll2d(x, t);
    return k_nll_loss_bw(g, x, t, w, red, ig, total);
  });
  m.impl("nll_loss2d_backward.grad_input", [](const Tensor& g, const Tensor& x, const Tensor& t, const OptTensor& w,
                                              int64_t red, int64_t ig, const Tensor& total, Tensor& out) -> Tensor& {
    check_nll2d(x, t);
    return into(out, k_nll_loss_bw(g, x, t, w, red, ig, total));
  });
  m.impl("mse_loss", k_mse_loss);
  m.impl("mse_loss_backward", k_mse_loss_bw);

  // Random.
  m.impl("uniform_", k_uniform_);
  m.impl("normal_", k_normal_);
  m.impl("normal.Tensor_Tensor", k_normal_tt);
  m.impl("_standard_gamma", k_standard_gamma);
  m.impl("_sample_dirichlet", k_sample_dirichlet);
  m.impl("_standard_gamma_grad", [](const Tensor& alpha, const Tensor& sample) {
    return call1("standard_gamma_grad", {alpha, sample});
  });
  m.impl("poisson", k_poisson);
  m.impl("binomial", k_binomial);
  m.impl("normal.Tensor_float", k_normal_tf);
  m.impl("normal.float_Tensor", k_normal_ft);
  m.impl("normal.Tensor_Tensor_out", [](const Tensor& m, const Tensor& s, std::optional<at::Generator> g,
                                        Tensor& out) -> Tensor& { return into(out, k_normal_tt(m, s, g)); });
  m.impl("normal.Tensor_float_out", [](const Tensor& m, double s, std::optional<at::Generator> g,
                                       Tensor& out) -> Tensor& { return into(out, k_normal_tf(m, s, g)); });
  m.impl("normal.float_Tensor_out", [](double m, const Tensor& s, std::optional<at::Generator> g,
                                       Tensor& out) -> Tensor& { return into(out, k_normal_ft(m, s, g)); });
  m.impl("bernoulli_.float", k_bernoulli_f);
  m.impl("bernoulli", k_bernoulli_t);
  m.impl("randperm.generator_out", [](int64_t n, std::optional<at::Generator> gen, Tensor& out) -> Tensor& {
    TORCH_CHECK(n >= 0, "n must be non-negative, got", n);
    if (n == 0) {
      out.resize_({0});
      return out;
    }
    // Two draws per position (the op library's 48-bit sort keys).
    auto keys = rng_inputs(gen, dev(out), 2 * static_cast<uint64_t>(n));
    return into(out, call1("randperm", keys, Attrs().i("n", n).dtype("dtype", out.scalar_type())));
  });
  m.impl("exponential_", k_exponential_);
  m.impl("geometric_", k_geometric_);
  m.impl("log_normal_", k_log_normal_);
  m.impl("cauchy_", k_cauchy_);
  m.impl("random_.from", k_random_from);
  m.impl("random_.to", k_random_to);
  m.impl("random_", k_random);
  m.impl("multinomial", k_multinomial);
  m.impl("log_sigmoid_forward", k_log_sigmoid_fwd);
  m.impl("log_sigmoid_backward", k_log_sigmoid_bw);
  m.impl("equal", k_equal);
  m.impl("nonzero", k_nonzero);
  m.impl("roll", k_roll);
  m.impl("upsample_bicubic2d", k_upsample_bicubic2d);
  m.impl("upsample_bicubic2d.out", [](const Tensor& x, at::IntArrayRef o, bool ac, OptD sh, OptD sw,
                                      Tensor& out) -> Tensor& { return into(out, k_upsample_bicubic2d(x, o, ac, sh, sw)); });
  m.impl("upsample_bicubic2d_backward", k_upsample_bicubic2d_bw);
  m.impl("upsample_bicubic2d_backward.grad_input",
         [](const Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool ac, OptD sh, OptD sw, Tensor& gi) -> Tensor& {
           return into(gi, k_upsample_bicubic2d_bw(g, o, i, ac, sh, sw));
         });
  m.impl("_upsample_bilinear2d_aa", k_upsample_aa2d<false>);
  m.impl("_upsample_bicubic2d_aa", k_upsample_aa2d<true>);
  m.impl("_upsample_bilinear2d_aa.out", [](const Tensor& x, at::IntArrayRef o, bool ac, OptD sh, OptD sw,
                                           Tensor& out) -> Tensor& { return into(out, k_upsample_aa2d<false>(x, o, ac, sh, sw)); });
  m.impl("_upsample_bicubic2d_aa.out", [](const Tensor& x, at::IntArrayRef o, bool ac, OptD sh, OptD sw,
                                          Tensor& out) -> Tensor& { return into(out, k_upsample_aa2d<true>(x, o, ac, sh, sw)); });
  m.impl("_upsample_bilinear2d_aa_backward", k_upsample_aa2d_bw<false>);
  m.impl("_upsample_bicubic2d_aa_backward", k_upsample_aa2d_bw<true>);
  m.impl("_upsample_bilinear2d_aa_backward.grad_input",
         [](const Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool ac, OptD sh, OptD sw, Tensor& gi) -> Tensor& {
           return into(gi, k_upsample_aa2d_bw<false>(g, o, i, ac, sh, sw));
         });
  m.impl("_upsample_bicubic2d_aa_backward.grad_input",
         [](const Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool ac, OptD sh, OptD sw, Tensor& gi) -> Tensor& {
           return into(gi, k_upsample_aa2d_bw<true>(g, o, i, ac, sh, sw));
         });
  m.impl("unique_consecutive", k_unique_consecutive);
  m.impl("_unique2", k_unique2);
  m.impl("unique_dim", k_unique_dim);
  m.impl("unique_dim_consecutive", k_unique_dim_consecutive);
  m.impl("grid_sampler_2d", k_grid_sampler_2d);
  m.impl("grid_sampler_2d_backward", k_grid_sampler_2d_bw);
  // torch.cdist's direct form (its product form for large p = 2 inputs is
  // _euclidean_dist, composite); the compute mode only chooses between them.
  m.impl("_cdist_forward", [](const Tensor& a, const Tensor& b, double p, std::optional<int64_t> mode) {
    return call1("cdist", {a, b}, Attrs().f("p", p));
  });
  m.impl("_cdist_backward", [](const Tensor& g, const Tensor& a, const Tensor& b, double p, const Tensor& dist) {
    return call1("cdist_backward", {g, a, b, dist}, Attrs().f("p", p));
  });
  m.impl("im2col", k_im2col);
  m.impl("col2im", k_col2im);
  m.impl("adaptive_max_pool2d", k_adaptive_max_pool<2>);
  m.impl("adaptive_max_pool3d", k_adaptive_max_pool<3>);
  m.impl("adaptive_max_pool2d_backward", k_adaptive_max_pool_bw<2>);
  m.impl("adaptive_max_pool3d_backward", k_adaptive_max_pool_bw<3>);
  m.impl("adaptive_max_pool2d.out", [](const Tensor& x, at::IntArrayRef size, Tensor& out, Tensor& idx) {
    return into2(out, idx, [&] { return k_adaptive_max_pool<2>(x, size); });
  });
  m.impl("index_fill.int_Tensor", k_index_fill);
  m.impl("index_fill.int_Scalar", [](const Tensor& x, int64_t d, const Tensor& i, const Scalar& v) {
    return k_index_fill(x, d, i, S(v, x));
  });
  m.impl("index_fill_.int_Tensor", [](Tensor& x, int64_t d, const Tensor& i, const Tensor& v) -> Tensor& {
    return inplace(x, k_index_fill(x, d, i, v));
  });
  m.impl("index_fill_.int_Scalar", [](Tensor& x, int64_t d, const Tensor& i, const Scalar& v) -> Tensor& {
    return inplace(x, k_index_fill(x, d, i, S(v, x)));
  });
  m.impl("kthvalue", k_kthvalue);
  m.impl("kthvalue.values", [](const Tensor& x, int64_t k, int64_t d, bool keep, Tensor& v, Tensor& i) {
    return into2(v, i, [&] { return k_kthvalue(x, k, d, keep); });
  });
  m.impl("median", k_median<false>);
  m.impl("nanmedian", k_median<true>);
  m.impl("mode", k_mode);
  m.impl("mode.values", [](const Tensor& x, int64_t d, bool keep, Tensor& v, Tensor& i) {
    return into2(v, i, [&] { return k_mode(x, d, keep); });
  });
  m.impl("median.dim", k_median_dim<false>);
  m.impl("nanmedian.dim", k_median_dim<true>);
  m.impl("median.dim_values", [](const Tensor& x, int64_t d, bool keep, Tensor& v, Tensor& i) {
    return into2(v, i, [&] { return k_median_dim<false>(x, d, keep); });
  });
  m.impl("nanmedian.dim_values", [](const Tensor& x, int64_t d, bool keep, Tensor& v, Tensor& i) {
    return into2(v, i, [&] { return k_median_dim<true>(x, d, keep); });
  });
  m.impl("searchsorted.Tensor", k_searchsorted);
  m.impl("searchsorted.Scalar", [](const Tensor& seq, const Scalar& v, bool i32, bool right,
                                   std::optional<c10::string_view> side, const OptTensor& sorter) {
    return k_searchsorted(seq, scalar_value(v, seq), i32, right, side, sorter);
  });
  m.impl("searchsorted.Tensor_out", [](const Tensor& seq, const Tensor& v, bool i32, bool right,
                                       std::optional<c10::string_view> side, const OptTensor& sorter,
                                       Tensor& out) -> Tensor& {
    return into(out, k_searchsorted(seq, v, i32, right, side, sorter));
  });
  m.impl("bucketize.Tensor", k_bucketize);
  m.impl("bucketize.Scalar", [](const Scalar& v, const Tensor& b, bool i32, bool right) {
    return k_bucketize(scalar_value(v, b), b, i32, right);
  });
  m.impl("bucketize.Tensor_out", [](const Tensor& v, const Tensor& b, bool i32, bool right, Tensor& out) -> Tensor& {
    return into(out, k_bucketize(v, b, i32, right));
  });
  m.impl("cummax", [](const Tensor& x, int64_t d) -> std::tuple<Tensor, Tensor> {
    auto r = call("cummax", {x}, Attrs().i("dim", d));
    return {r[0], r[1]};
  });
  m.impl("cummin", [](const Tensor& x, int64_t d) -> std::tuple<Tensor, Tensor> {
    auto r = call("cummin", {x}, Attrs().i("dim", d));
    return {r[0], r[1]};
  });
  m.impl("_cummax_helper", [](const Tensor& x, Tensor& v, Tensor& i, int64_t d) {
    auto r = call("cummax", {x}, Attrs().i("dim", d));
    into(v, r[0]);
    into(i, r[1]);
  });
  m.impl("_cummin_helper", [](const Tensor& x, Tensor& v, Tensor& i, int64_t d) {
    auto r = call("cummin", {x}, Attrs().i("dim", d));
    into(v, r[0]);
    into(i, r[1]);
  });
  m.impl("_logcumsumexp", [](const Tensor& x, int64_t d) { return call1("logcumsumexp", {x}, Attrs().i("dim", d)); });
  m.impl("_logcumsumexp.out", [](const Tensor& x, int64_t d, Tensor& out) -> Tensor& {
    return into(out, call1("logcumsumexp", {x}, Attrs().i("dim", d)));
  });
  m.impl("trace", [](const Tensor& x) { return call1("trace", {x}); });
  m.impl("linalg_cross", [](const Tensor& a, const Tensor& b, int64_t d) {
    return call1("linalg_cross", {a, b}, Attrs().i("dim", d));
  });
  m.impl("linalg_cross.out", [](const Tensor& a, const Tensor& b, int64_t d, Tensor& out) -> Tensor& {
    return into(out, call1("linalg_cross", {a, b}, Attrs().i("dim", d)));
  });
  m.impl("masked_scatter", k_masked_scatter);
  m.impl("masked_scatter_", [](Tensor& self, const Tensor& mask, const Tensor& source) -> Tensor& {
    return inplace(self, k_masked_scatter(self, mask, source));
  });
  m.impl("masked_scatter_backward", [](const Tensor& g, const Tensor& mask, c10::SymIntArrayRef sizes) {
    return call1("masked_scatter_backward", {g, mask}, Attrs().ints("sizes", C10_AS_INTARRAYREF_SLOW(sizes)));
  });
  m.impl("tril_indices", [](int64_t row, int64_t col, int64_t offset, std::optional<at::ScalarType> dtype,
                           std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
    return k_triangle_indices("tril_indices", row, col, offset, dtype, device);
  });
  m.impl("triu_indices", [](int64_t row, int64_t col, int64_t offset, std::optional<at::ScalarType> dtype,
                           std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
    return k_triangle_indices("triu_indices", row, col, offset, dtype, device);
  });
  m.impl("tril_indices.out", [](int64_t row, int64_t col, int64_t offset, Tensor& out) -> Tensor& {
    return into(out, k_triangle_indices("tril_indices", row, col, offset, out.scalar_type(), out.device()));
  });
  m.impl("triu_indices.out", [](int64_t row, int64_t col, int64_t offset, Tensor& out) -> Tensor& {
    return into(out, k_triangle_indices("triu_indices", row, col, offset, out.scalar_type(), out.device()));
  });
  m.impl("bincount", k_bincount);
  m.impl("take", k_take);
  m.impl("take.out", [](const Tensor& self, const Tensor& index, Tensor& out) -> Tensor& {
    return into(out, k_take(self, index));
  });
  m.impl("put_", k_put_);
  m.impl("repeat_interleave.Tensor", k_repeat_interleave);
  m.impl("repeat_interleave.Tensor_out",
         [](const Tensor& repeats, std::optional<c10::SymInt> output_size, Tensor& out) -> Tensor& {
           return into(out, k_repeat_interleave(repeats, output_size));
         });
  m.impl("nonzero.out", [](const Tensor& x, Tensor& out) -> Tensor& { return into(out, k_nonzero(x)); });
  m.impl("histc", k_histc);
  m.impl("histc.out", [](const Tensor& x, int64_t b, const Scalar& lo, const Scalar& hi, Tensor& out) -> Tensor& {
    return into(out, k_histc(x, b, lo, hi));
  });
  m.impl("index_add", k_index_add);
  m.impl("index_add_", [](Tensor& x, int64_t d, const Tensor& i, const Tensor& s, const Scalar& a) -> Tensor& {
    return inplace(x, k_index_add(x, d, i, s, a));
  });
  m.impl("index_add.out", [](const Tensor& x, int64_t d, const Tensor& i, const Tensor& s, const Scalar& a,
                             Tensor& out) -> Tensor& { return into(out, k_index_add(x, d, i, s, a)); });
  m.impl("linalg_cholesky_ex", k_cholesky_ex);
  m.impl("linalg_cholesky_ex.L", [](const Tensor& A, bool upper, bool check, Tensor& L, Tensor& info) {
    return into2(L, info, [&] { return k_cholesky_ex(A, upper, check); });
  });
  m.impl("linalg_lu_factor_ex", k_lu_factor_ex);
  m.impl("linalg_lu_factor_ex.out", [](const Tensor& A, bool pivot, bool check, Tensor& LU, Tensor& piv,
                                       Tensor& info) {
    return into_all([&] { return k_lu_factor_ex(A, pivot, check); }, LU, piv, info);
  });
  m.impl("lu_unpack", k_lu_unpack);
  m.impl("lu_unpack.out", [](const Tensor& LU, const Tensor& piv, bool data, bool pivots, Tensor& P, Tensor& L,
                             Tensor& U) { return into_all([&] { return k_lu_unpack(LU, piv, data, pivots); }, P, L, U); });
  m.impl("linalg_lu", k_linalg_lu);
  m.impl("linalg_lu.out", [](const Tensor& A, bool pivot, Tensor& P, Tensor& L, Tensor& U) {
    return into_all([&] { return k_linalg_lu(A, pivot); }, P, L, U);
  });
  m.impl("linalg_lu_solve", k_lu_solve);
  m.impl("linalg_lu_solve.out", [](const Tensor& LU, const Tensor& piv, const Tensor& B, bool left, bool adjoint,
                                   Tensor& out) -> Tensor& { return into(out, k_lu_solve(LU, piv, B, left, adjoint)); });
  m.impl("_linalg_solve_ex", k_linalg_solve_ex);
  m.impl("_linalg_solve_ex.result", [](const Tensor& A, const Tensor& B, bool left, bool check, Tensor& X,
                                        Tensor& LU, Tensor& piv, Tensor& info) {
    return into_all([&] { return k_linalg_solve_ex(A, B, left, check); }, X, LU, piv, info);
  });
  m.impl("linalg_inv_ex", k_linalg_inv_ex);
  m.impl("linalg_inv_ex.inverse", [](const Tensor& A, bool check, Tensor& inv, Tensor& info) {
    return into2(inv, info, [&] { return k_linalg_inv_ex(A, check); });
  });
  m.impl("_linalg_det", k_linalg_det);
  m.impl("_linalg_det.result", [](const Tensor& A, Tensor& det, Tensor& LU, Tensor& piv) {
    return into_all([&] { return k_linalg_det(A); }, det, LU, piv);
  });
  m.impl("_linalg_slogdet", k_linalg_slogdet);
  m.impl("_linalg_slogdet.sign", [](const Tensor& A, Tensor& sign, Tensor& logabsdet, Tensor& LU, Tensor& piv) {
    return into_all([&] { return k_linalg_slogdet(A); }, sign, logabsdet, LU, piv);
  });
  m.impl("linalg_solve_triangular", k_solve_triangular);
  m.impl("linalg_solve_triangular.out",
         [](const Tensor& A, const Tensor& B, bool upper, bool left, bool unit, Tensor& out) -> Tensor& {
           return into(out, k_solve_triangular(A, B, upper, left, unit));
         });
  m.impl("triangular_solve", k_triangular_solve);
  m.impl("triangular_solve.X", [](const Tensor& B, const Tensor& A, bool upper, bool transpose, bool unit,
                                  Tensor& X, Tensor& M) {
    return into2(X, M, [&] { return k_triangular_solve(B, A, upper, transpose, unit); });
  });
  m.impl("geqrf", k_geqrf);
  m.impl("geqrf.a", [](const Tensor& A, Tensor& a, Tensor& tau) {
    return into2(a, tau, [&] { return k_geqrf(A); });
  });
  m.impl("linalg_householder_product", k_householder_product);
  m.impl("linalg_householder_product.out", [](const Tensor& A, const Tensor& tau, Tensor& out) -> Tensor& {
    return into(out, k_householder_product(A, tau));
  });
  m.impl("ormqr", k_ormqr);
  m.impl("ormqr.out", [](const Tensor& A, const Tensor& tau, const Tensor& C, bool left, bool transpose,
                         Tensor& out) -> Tensor& { return into(out, k_ormqr(A, tau, C, left, transpose)); });
  m.impl("linalg_qr", k_linalg_qr);
  m.impl("linalg_qr.out", [](const Tensor& A, c10::string_view mode, Tensor& Q, Tensor& R) {
    return into2(Q, R, [&] { return k_linalg_qr(A, mode); });
  });
  m.impl("linalg_lstsq", k_linalg_lstsq);
  m.impl("linalg_lstsq.out", [](const Tensor& A, const Tensor& B, std::optional<double> rcond,
                                std::optional<c10::string_view> driver, Tensor& X, Tensor& res, Tensor& rank,
                                Tensor& sv) {
    return into_all([&] { return k_linalg_lstsq(A, B, rcond, driver); }, X, res, rank, sv);
  });
  m.impl("_linalg_eigh", k_linalg_eigh);
  m.impl("_linalg_eigh.eigenvalues", [](const Tensor& A, c10::string_view uplo, bool compute_v, Tensor& w,
                                         Tensor& v) { return into2(w, v, [&] { return k_linalg_eigh(A, uplo, compute_v); }); });
  m.impl("_linalg_svd", k_linalg_svd);
  m.impl("_linalg_svd.U", [](const Tensor& A, bool full, bool uv, std::optional<c10::string_view> driver, Tensor& U,
                             Tensor& S, Tensor& Vh) {
    return into_all([&] { return k_linalg_svd(A, full, uv, driver); }, U, S, Vh);
  });
  m.impl("_cholesky_solve_helper", k_cholesky_solve_helper);
  m.impl("linalg_matrix_exp", k_linalg_matrix_exp);
  m.impl("linalg_matrix_exp.out",
         [](const Tensor& A, Tensor& out) -> Tensor& { return into(out, k_linalg_matrix_exp(A)); });
  m.impl("cholesky_inverse", k_cholesky_inverse);
  m.impl("cholesky_inverse.out", [](const Tensor& L, bool upper, Tensor& out) -> Tensor& {
    return into(out, k_cholesky_inverse(L, upper));
  });
  m.impl("native_dropout", k_native_dropout);
  m.impl("native_dropout_backward", k_native_dropout_bw);

  // Shapes and indexing.
  m.impl("cat", k_cat);
  m.impl("cat.out", [](const at::ITensorListRef& ts, int64_t d, Tensor& out) -> Tensor& { return into(out, k_cat(ts, d)); });
  m.impl("index_select", k_index_select);
  m.impl("gather", k_gather);
  m.impl("scatter.src", k_scatter_src);
  m.impl("scatter.value", k_scatter_value);
  m.impl("scatter_.src", [](Tensor& x, int64_t d, const Tensor& i, const Tensor& s) -> Tensor& {
    return inplace(x, k_scatter_src(x, d, i, s));
  });
  m.impl("scatter_.value", [](Tensor& x, int64_t d, const Tensor& i, const Scalar& v) -> Tensor& {
    return inplace(x, k_scatter_value(x, d, i, v));
  });
  m.impl("scatter_add", k_scatter_add);
  m.impl("scatter_reduce.two", k_scatter_reduce);
  m.impl("scatter_reduce_.two", [](Tensor& x, int64_t d, const Tensor& i, const Tensor& s, c10::string_view r,
                                   bool self) -> Tensor& { return inplace(x, k_scatter_reduce(x, d, i, s, r, self)); });
  m.impl("scatter_reduce.two_out", [](const Tensor& x, int64_t d, const Tensor& i, const Tensor& s,
                                      c10::string_view r, bool self, Tensor& out) -> Tensor& {
    return into(out, k_scatter_reduce(x, d, i, s, r, self));
  });
  m.impl("index_reduce", k_index_reduce);
  m.impl("index_reduce_", [](Tensor& x, int64_t d, const Tensor& i, const Tensor& s, c10::string_view r,
                             bool self) -> Tensor& { return inplace(x, k_index_reduce(x, d, i, s, r, self)); });
  m.impl("index_reduce.out", [](const Tensor& x, int64_t d, const Tensor& i, const Tensor& s, c10::string_view r,
                                bool self, Tensor& out) -> Tensor& { return into(out, k_index_reduce(x, d, i, s, r, self)); });
  m.impl("scatter_add_", [](Tensor& x, int64_t d, const Tensor& i, const Tensor& s) -> Tensor& {
    return inplace(x, k_scatter_add(x, d, i, s));
  });
  m.impl("tril", k_tril);
  m.impl("tril_", [](Tensor& x, int64_t d) -> Tensor& { return inplace(x, k_tril(x, d)); });
  m.impl("triu", k_triu);
  m.impl("triu_", [](Tensor& x, int64_t d) -> Tensor& { return inplace(x, k_triu(x, d)); });
  m.impl("flip", k_flip);
  m.impl("channel_shuffle", k_channel_shuffle);
  m.impl("native_channel_shuffle", k_channel_shuffle);
  m.impl("channel_shuffle.out", [](const Tensor& x, int64_t g, Tensor& out) -> Tensor& {
    return into(out, k_channel_shuffle(x, g));
  });
  m.impl("repeat", k_repeat);
  m.impl("constant_pad_nd", k_constant_pad_nd);
  m.impl("sort", k_sort);
  m.impl("sort.stable", k_sort_stable);
  m.impl("topk", k_topk);
  m.impl("max_pool2d_with_indices", k_max_pool<2>);
  m.impl("max_pool2d_with_indices_backward", k_max_pool_bw<2>);
  m.impl("max_pool3d_with_indices", k_max_pool<3>);
  m.impl("max_pool3d_with_indices_backward", k_max_pool_bw<3>);
  for (const char* n : {"reflection_pad1d", "reflection_pad2d", "reflection_pad3d"}) m.impl(n, k_mode_pad<true>);
  for (const char* n : {"replication_pad1d", "replication_pad2d", "replication_pad3d"}) m.impl(n, k_mode_pad<false>);
  for (const char* n : {"reflection_pad1d_backward", "reflection_pad2d_backward", "reflection_pad3d_backward"})
    m.impl(n, k_mode_pad_bw<true>);
  for (const char* n : {"replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward"})
    m.impl(n, k_mode_pad_bw<false>);
  m.impl("upsample_nearest1d", k_nearest1d<false>);
  m.impl("upsample_nearest2d", k_nearest2d<false>);
  m.impl("upsample_nearest3d", k_nearest3d<false>);
  m.impl("_upsample_nearest_exact1d", k_nearest1d<true>);
  m.impl("_upsample_nearest_exact2d", k_nearest2d<true>);
  m.impl("_upsample_nearest_exact3d", k_nearest3d<true>);
  m.impl("upsample_nearest1d_backward", k_nearest1d_bw<false>);
  m.impl("upsample_nearest2d_backward", k_nearest2d_bw<false>);
  m.impl("upsample_nearest3d_backward", k_nearest3d_bw<false>);
  m.impl("_upsample_nearest_exact1d_backward", k_nearest1d_bw<true>);
  m.impl("_upsample_nearest_exact2d_backward", k_nearest2d_bw<true>);
  m.impl("_upsample_nearest_exact3d_backward", k_nearest3d_bw<true>);
  m.impl("upsample_linear1d", k_linear1d);
  m.impl("upsample_bilinear2d", k_bilinear2d);
  m.impl("upsample_trilinear3d", k_trilinear3d);
  m.impl("upsample_linear1d_backward", k_linear1d_bw);
  m.impl("upsample_bilinear2d_backward", k_bilinear2d_bw);
  m.impl("upsample_trilinear3d_backward", k_trilinear3d_bw);
  m.impl("avg_pool2d", k_avg_pool<2>);
  m.impl("avg_pool2d_backward", k_avg_pool_bw<2>);
  m.impl("avg_pool3d", k_avg_pool<3>);
  m.impl("avg_pool3d_backward", k_avg_pool_bw<3>);
  m.impl("_adaptive_avg_pool2d", k_adaptive_avg_pool);
  m.impl("_adaptive_avg_pool2d_backward", k_adaptive_avg_pool_bw<2>);
  m.impl("_adaptive_avg_pool3d", k_adaptive_avg_pool);
  m.impl("_adaptive_avg_pool3d_backward", k_adaptive_avg_pool_bw<3>);
  m.impl("arange.start_out", k_arange_out);
  m.impl("linspace.out", [](const Scalar& start, const Scalar& end, int64_t steps, Tensor& out) -> Tensor& {
    TORCH_CHECK(!start.isComplex() && !end.isComplex() && !out.is_complex(), "tpu: complex linspace is not supported");
    Tensor r = call("linspace", {},
                    Attrs().f("start", start.toDouble()).f("end", end.toDouble()).i("steps", steps)
                        .dtype("dtype", out.scalar_type()))[0];
    return into(out, r);
  });
  m.impl("logspace.out",
         [](const Scalar& start, const Scalar& end, int64_t steps, double base, Tensor& out) -> Tensor& {
           TORCH_CHECK(!start.isComplex() && !end.isComplex() && !out.is_complex(),
                       "tpu: complex logspace is not supported");
           Tensor r = call("logspace", {},
                           Attrs().f("start", start.toDouble()).f("end", end.toDouble()).i("steps", steps)
                               .f("base", base).dtype("dtype", out.scalar_type()))[0];
           return into(out, r);
         });
  m.impl("index.Tensor", k_index);
  m.impl("index.Tensor_out", [](const Tensor& x, const c10::List<std::optional<Tensor>>& i, Tensor& out) -> Tensor& {
    return into(out, k_index(x, i));
  });
  m.impl("_index_put_impl_", k_index_put_);
  m.impl("index_copy_", k_index_copy_);
  m.impl("index_copy", [](const Tensor& x, int64_t d, const Tensor& i, const Tensor& s) {
    Tensor r = call1("copy", {x});
    return k_index_copy_(r, d, i, s);
  });
  m.impl("index_copy.out", [](const Tensor& x, int64_t d, const Tensor& i, const Tensor& s, Tensor& out) -> Tensor& {
    if (!out.is_same(x)) into(out, x);
    return k_index_copy_(out, d, i, s);
  });
  m.impl("isin.Tensor_Tensor", k_isin);
  m.impl("isin.Tensor_Tensor_out", [](const Tensor& e, const Tensor& t, bool u, bool inv, Tensor& out) -> Tensor& {
    return into(out, k_isin(e, t, u, inv));
  });
  m.impl("isin.Tensor_Scalar", [](const Tensor& e, const Scalar& t, bool u, bool inv) {
    return k_isin(e, S(t, e), u, inv);
  });
  m.impl("isin.Scalar_Tensor", [](const Scalar& e, const Tensor& t, bool u, bool inv) {
    return k_isin(S(e, t), t, u, inv);
  });

  // Convolution.
  m.impl("convolution_overrideable", k_convolution);
  m.impl("convolution_backward_overrideable", k_convolution_bw);

  // Attention.
  m.impl("_fused_sdp_choice", sdp_choice);
  m.impl("_scaled_dot_product_fused_attention_overrideable", sdpa_fwd);
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", sdpa_bwd);
}

// --- fused optimizers ----------------------------------------------------------
// torch.optim's fused=True updates (AdamW, Adam, SGD): each parameter's
// update is one launch of the runtime's adamw_step or sgd_step, written into
// the parameter and its state in place (without these, the CPU fallback
// copied every tensor out and back). The step count and the learning rate go
// in as 0-dim inputs, not attributes, so a schedule compiles nothing new.

// AMP's arguments as torch's fused kernels take them: with found_inf set,
// nothing is updated (torch undoes the step count itself); otherwise, with a
// grad_scale, the gradients are unscaled in place first. Reading found_inf
// waits for the work that computed it.
bool update_skipped(at::TensorList grads, const OptTensor& grad_scale, const OptTensor& found_inf) {
  if (found_inf.has_value() && found_inf->defined() && found_inf->item<double>() != 0.0) return true;
  if (grad_scale.has_value() && grad_scale->defined()) {
    for (const Tensor& g : grads) {
      Tensor target = g;
      inplace_binary(target, "div", *grad_scale);
    }
  }
  return false;
}

void check_lists(const char* op, size_t n, std::initializer_list<std::pair<const char*, size_t>> lists) {
  for (const auto& [name, size] : lists) {
    TORCH_CHECK(size == n, "tpu: ", op, ": ", name, " has ", size, " tensors, expected one per parameter (", n, ")");
  }
}

// Adam (`decoupled` false: weight decay added to the gradient) and AdamW.
void fused_adam(const char* op, bool decoupled, at::TensorList params, at::TensorList grads,
                at::TensorList exp_avgs, at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                at::TensorList steps, const Tensor& lr, double beta1, double beta2, double weight_decay,
                double eps, bool amsgrad, bool maximize, const OptTensor& grad_scale, const OptTensor& found_inf) {
  const size_t n = params.size();
  check_lists(op, n, {{"grads", grads.size()}, {"exp_avgs", exp_avgs.size()},
                      {"exp_avg_sqs", exp_avg_sqs.size()}, {"state_steps", steps.size()}});
  if (amsgrad) check_lists(op, n, {{"max_exp_avg_sqs", max_exp_avg_sqs.size()}});
  if (n == 0 || update_skipped(grads, grad_scale, found_inf)) return;
  // Adam's L2 term joins the gradient after maximize's negation, as in
  // torch.optim.Adam; adamw_step then decays nothing and negates nothing.
  const bool l2 = !decoupled && weight_decay != 0.0;
  Attrs a;
  a.f("beta1", beta1).f("beta2", beta2).f("eps", eps).f("weight_decay", decoupled ? weight_decay : 0.0);
  a.b("amsgrad", amsgrad).b("maximize", maximize && !l2);
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = params[i];
    Tensor g = grads[i];
    if (l2) {
      g = call1("add", {maximize ? call1("neg", {g}) : g, call1("mul", {p, S(weight_decay, p)})});
    }
    std::vector<Tensor> ins{p, g, exp_avgs[i], exp_avg_sqs[i]};
    std::vector<Tensor> outs{p, exp_avgs[i], exp_avg_sqs[i]};
    if (amsgrad) {
      ins.push_back(max_exp_avg_sqs[i]);
      outs.push_back(max_exp_avg_sqs[i]);
    }
    ins.push_back(steps[i]);
    ins.push_back(lr);
    call_into("adamw_step", ins, outs, a);
  }
}

// _fused_adamw_ (`Decoupled`) and _fused_adam_, lr a float or a tensor.
constexpr const char* adam_name(bool decoupled) { return decoupled ? "_fused_adamw_" : "_fused_adam_"; }
template <bool Decoupled>
void k_fused_adam(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                  at::TensorList max_exp_avg_sqs, at::TensorList steps, double lr, double beta1, double beta2,
                  double weight_decay, double eps, bool amsgrad, bool maximize, const OptTensor& grad_scale,
                  const OptTensor& found_inf) {
  if (params.empty()) return;
  fused_adam(adam_name(Decoupled), Decoupled, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps,
             S(lr, params[0]), beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf);
}
template <bool Decoupled>
void k_fused_adam_t(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs, at::TensorList steps,
                    const Tensor& lr, double beta1, double beta2, double weight_decay, double eps, bool amsgrad,
                    bool maximize, const OptTensor& grad_scale, const OptTensor& found_inf) {
  fused_adam(adam_name(Decoupled), Decoupled, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr,
             beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf);
}

// SGD: without momentum torch passes no buffers, and sgd_step's second
// result is then an empty tensor.
void fused_sgd(at::TensorList params, at::TensorList grads, at::TensorList buffers, double weight_decay,
               double momentum, const Tensor& lr, double dampening, bool nesterov, bool maximize,
               bool is_first_step, const OptTensor& grad_scale, const OptTensor& found_inf) {
  const size_t n = params.size();
  check_lists("_fused_sgd_", n, {{"grads", grads.size()}});
  if (momentum != 0.0) check_lists("_fused_sgd_", n, {{"momentum_buffer_list", buffers.size()}});
  if (n == 0 || update_skipped(grads, grad_scale, found_inf)) return;
  Attrs a;
  a.f("weight_decay", weight_decay).f("momentum", momentum).f("dampening", dampening);
  a.b("nesterov", nesterov).b("maximize", maximize).b("first_step", is_first_step);
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = params[i];
    if (momentum != 0.0) {
      call_into("sgd_step", {p, grads[i], buffers[i], lr}, {p, buffers[i]}, a);
    } else {
      call_into("sgd_step", {p, grads[i], lr}, {p, at::empty({0}, p.options())}, a);
    }
  }
}

void k_fused_sgd(at::TensorList params, at::TensorList grads, at::TensorList buffers, double weight_decay,
                 double momentum, double lr, double dampening, bool nesterov, bool maximize, bool is_first_step,
                 const OptTensor& grad_scale, const OptTensor& found_inf) {
  if (params.empty()) return;
  fused_sgd(params, grads, buffers, weight_decay, momentum, S(lr, params[0]), dampening, nesterov, maximize,
            is_first_step, grad_scale, found_inf);
}
void k_fused_sgd_t(at::TensorList params, at::TensorList grads, at::TensorList buffers, double weight_decay,
                   double momentum, const Tensor& lr, double dampening, bool nesterov, bool maximize,
                   bool is_first_step, const OptTensor& grad_scale, const OptTensor& found_inf) {
  fused_sgd(params, grads, buffers, weight_decay, momentum, lr, dampening, nesterov, maximize, is_first_step,
            grad_scale, found_inf);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_adamw_", k_fused_adam<true>);
  m.impl("_fused_adamw_.tensor_lr", k_fused_adam_t<true>);
  m.impl("_fused_adam_", k_fused_adam<false>);
  m.impl("_fused_adam_.tensor_lr", k_fused_adam_t<false>);
  m.impl("_fused_sgd_", k_fused_sgd);
  m.impl("_fused_sgd_.tensor_lr", k_fused_sgd_t);
}

// Optimizers on tpu take torch's foreach path by default; these are
// torch's own per-tensor loops, which call the kernels above. In strict
// mode (DEFER_NEVER) each loop runs as one deferred recording, launched
// as one fused program by whatever next observes or uses the stream (any
// strict op, a copy, a synchronize), instead of one launch per tensor per
// op: a foreach op is one op over a list, as a native foreach kernel
// would run it. Debug mode keeps its per-op launches and checks;
// defer-and-fuse records them anyway.
class DeferInStrict {
 public:
  DeferInStrict() {
    uint32_t mode = 0;
    check(tpurt_eager_mode_get(&mode), "eager mode");
    if (mode == 0) {
      check(tpurt_eager_mode_push(2), "push eager mode");
      pushed_ = true;
    }
  }
  ~DeferInStrict() {
    uint32_t popped = 0;
    if (pushed_) tpurt_status_destroy(tpurt_eager_mode_pop(&popped));  // cannot fail: pushed above
  }
  DeferInStrict(const DeferInStrict&) = delete;
  DeferInStrict& operator=(const DeferInStrict&) = delete;

 private:
  bool pushed_ = false;
};

// `Fn` (a foreach kernel) run under DeferInStrict, with Fn's signature.
template <auto Fn>
struct Deferred;
template <typename R, typename... A, R (*Fn)(A...)>
struct Deferred<Fn> {
  static R call(A... args) {
    DeferInStrict defer;
    ScalarUploadScope scalars;  // the list's scalar uploaded once
    return Fn(std::forward<A>(args)...);
  }
};

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_foreach_add_.Scalar", Deferred<&at::native::foreach_tensor_add_scalar_kernel_slow_>::call);
  m.impl("_foreach_add_.List", Deferred<&at::native::foreach_tensor_add_list_kernel_slow_>::call);
  m.impl("_foreach_add.List", Deferred<&at::native::foreach_tensor_add_list_kernel_slow>::call);
  m.impl("_foreach_add.Scalar", Deferred<&at::native::foreach_tensor_add_scalar_kernel_slow>::call);
  m.impl("_foreach_sub_.Scalar", Deferred<&at::native::foreach_tensor_sub_scalar_kernel_slow_>::call);
  m.impl("_foreach_mul_.Scalar", Deferred<&at::native::foreach_tensor_mul_scalar_kernel_slow_>::call);
  m.impl("_foreach_mul_.List", Deferred<&at::native::foreach_tensor_mul_list_kernel_slow_>::call);
  m.impl("_foreach_mul_.Tensor", Deferred<&at::native::foreach_tensor_mul_tensor_kernel_slow_>::call);
  m.impl("_foreach_mul.Scalar", Deferred<&at::native::foreach_tensor_mul_scalar_kernel_slow>::call);
  m.impl("_foreach_mul.List", Deferred<&at::native::foreach_tensor_mul_list_kernel_slow>::call);
  m.impl("_foreach_mul.Tensor", Deferred<&at::native::foreach_tensor_mul_tensor_kernel_slow>::call);
  m.impl("_foreach_div_.Scalar", Deferred<&at::native::foreach_tensor_div_scalar_kernel_slow_>::call);
  m.impl("_foreach_div_.List", Deferred<&at::native::foreach_tensor_div_list_kernel_slow_>::call);
  m.impl("_foreach_div_.ScalarList", Deferred<&at::native::foreach_tensor_div_scalarlist_kernel_slow_>::call);
  m.impl("_foreach_div.List", Deferred<&at::native::foreach_tensor_div_list_kernel_slow>::call);
  m.impl("_foreach_div.ScalarList", Deferred<&at::native::foreach_tensor_div_scalarlist_kernel_slow>::call);
  m.impl("_foreach_lerp_.Scalar", Deferred<&at::native::foreach_tensor_lerp_list_kernel_slow_>::call);
  m.impl("_foreach_lerp_.List", Deferred<&at::native::foreach_tensor_ternary_lerp_slow_>::call);
  m.impl("_foreach_addcmul_.Scalar", Deferred<&at::native::foreach_tensor_addcmul_scalar_slow_>::call);
  m.impl("_foreach_addcmul_.ScalarList", Deferred<&at::native::foreach_tensor_addcmul_scalarlist_slow_>::call);
  m.impl("_foreach_addcmul_.Tensor", Deferred<&at::native::foreach_tensor_addcmul_tensor_slow_>::call);
  m.impl("_foreach_addcdiv_.Scalar", Deferred<&at::native::foreach_tensor_addcdiv_scalar_slow_>::call);
  m.impl("_foreach_addcdiv_.ScalarList", Deferred<&at::native::foreach_tensor_addcdiv_scalarlist_slow_>::call);
  m.impl("_foreach_addcdiv_.Tensor", Deferred<&at::native::foreach_tensor_addcdiv_tensor_slow_>::call);
  m.impl("_foreach_sqrt", Deferred<&at::native::foreach_tensor_sqrt_slow>::call);
  m.impl("_foreach_sqrt_", Deferred<&at::native::foreach_tensor_sqrt_slow_>::call);
  m.impl("_foreach_neg", Deferred<&at::native::foreach_tensor_neg_slow>::call);
  m.impl("_foreach_neg_", Deferred<&at::native::foreach_tensor_neg_slow_>::call);
  m.impl("_foreach_maximum_.Scalar", Deferred<&at::native::foreach_tensor_clamp_min_scalar_kernel_slow_>::call);
  m.impl("_foreach_norm.Scalar", Deferred<&at::native::foreach_tensor_norm_slow>::call);
  m.impl("_foreach_copy_", Deferred<&at::native::foreach_tensor_copy_list_kernel_slow_>::call);
  m.impl("_foreach_zero_", Deferred<&at::native::foreach_tensor_zero_slow_>::call);
  m.impl("_foreach_pow.ScalarAndTensor", Deferred<&at::native::foreach_scalar_pow_list_kernel_slow>::call);
}

// Elementwise math beyond the basics and the activations with their
// backward ops (the op library's math.rs and activation.rs). Their
// Python-number and alias forms (xlogy.Scalar_Other, arcsin, relu6, selu,
// celu, F.silu's friends) are torch's composites over these.
namespace {

Tensor k_logit(const Tensor& x, std::optional<double> eps) {
  Attrs a;
  if (eps.has_value()) a.f("eps", *eps);
  return call1("logit", {x}, a);
}
Tensor k_logit_bw(const Tensor& g, const Tensor& x, std::optional<double> eps) {
  Attrs a;
  if (eps.has_value()) a.f("eps", *eps);
  return call1("logit_backward", {g, x}, a);
}
Tensor k_elu(const Tensor& x, const Scalar& alpha, const Scalar& scale, const Scalar& input_scale) {
  return call1("elu", {x},
               Attrs().f("alpha", alpha.toDouble()).f("scale", scale.toDouble()).f("input_scale", input_scale.toDouble()));
}
Tensor k_elu_bw(const Tensor& g, const Scalar& alpha, const Scalar& scale, const Scalar& input_scale, bool is_result,
                const Tensor& x_or_y) {
  return call1("elu_backward", {g, x_or_y},
               Attrs()
                   .f("alpha", alpha.toDouble())
                   .f("scale", scale.toDouble())
                   .f("input_scale", input_scale.toDouble())
                   .b("is_result", is_result));
}
Tensor k_leaky_relu(const Tensor& x, const Scalar& slope) {
  return call1("leaky_relu", {x}, Attrs().f("negative_slope", slope.toDouble()));
}
Tensor k_leaky_relu_bw(const Tensor& g, const Tensor& x, const Scalar& slope, bool self_is_result) {
  // From the result, the mask is the same: torch refuses a negative slope
  // in place, and a positive one keeps every sign.
  return call1("leaky_relu_backward", {g, x}, Attrs().f("negative_slope", slope.toDouble()));
}
Tensor k_hardtanh(const Tensor& x, const Scalar& lo, const Scalar& hi) {
  return call1("hardtanh", {x}, Attrs().f("min_val", lo.toDouble()).f("max_val", hi.toDouble()));
}
Tensor k_hardtanh_bw(const Tensor& g, const Tensor& x, const Scalar& lo, const Scalar& hi) {
  return call1("hardtanh_backward", {g, x}, Attrs().f("min_val", lo.toDouble()).f("max_val", hi.toDouble()));
}
Tensor k_softplus(const Tensor& x, const Scalar& beta, const Scalar& threshold) {
  return call1("softplus", {x}, Attrs().f("beta", beta.toDouble()).f("threshold", threshold.toDouble()));
}
Tensor k_softplus_bw(const Tensor& g, const Tensor& x, const Scalar& beta, const Scalar& threshold) {
  return call1("softplus_backward", {g, x}, Attrs().f("beta", beta.toDouble()).f("threshold", threshold.toDouble()));
}
Tensor k_threshold(const Tensor& x, const Scalar& th, const Scalar& value) {
  return call1("threshold", {x}, Attrs().f("threshold", th.toDouble()).f("value", value.toDouble()));
}
Tensor k_softshrink(const Tensor& x, const Scalar& l) { return call1("softshrink", {x}, Attrs().f("lambd", l.toDouble())); }
Tensor k_softshrink_bw(const Tensor& g, const Tensor& x, const Scalar& l) {
  return call1("softshrink_backward", {g, x}, Attrs().f("lambd", l.toDouble()));
}
Tensor k_hardshrink(const Tensor& x, const Scalar& l) { return call1("hardshrink", {x}, Attrs().f("lambd", l.toDouble())); }
Tensor k_hardshrink_bw(const Tensor& g, const Tensor& x, const Scalar& l) {
  return call1("hardshrink_backward", {g, x}, Attrs().f("lambd", l.toDouble()));
}
Tensor k_glu(const Tensor& x, int64_t dim) { return call1("glu", {x}, Attrs().i("dim", dim)); }
Tensor k_glu_bw(const Tensor& g, const Tensor& x, int64_t dim) {
  return call1("glu_backward", {g, x}, Attrs().i("dim", dim));
}
Tensor k_bce(const Tensor& x, const Tensor& t, const OptTensor& w, int64_t red) {
  std::vector<Tensor> ins{x, t};
  if (w.has_value() && w->defined()) ins.push_back(*w);
  return call1("binary_cross_entropy", ins, Attrs().i("reduction", red));
}
Tensor k_bce_bw(const Tensor& g, const Tensor& x, const Tensor& t, const OptTensor& w, int64_t red) {
  std::vector<Tensor> ins{g, x, t};
  if (w.has_value() && w->defined()) ins.push_back(*w);
  return call1("binary_cross_entropy_backward", ins, Attrs().i("reduction", red));
}
Tensor k_smooth_l1(const Tensor& x, const Tensor& t, int64_t red, double beta) {
  return call1("smooth_l1_loss", {x, t}, Attrs().i("reduction", red).f("beta", beta));
}
Tensor k_huber(const Tensor& x, const Tensor& t, int64_t red, double delta) {
  return call1("huber_loss", {x, t}, Attrs().i("reduction", red).f("delta", delta));
}
Tensor k_nansum(const Tensor& x, at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dt) {
  return dims_reduce("nansum", x, dim, keepdim, dt);
}
std::tuple<Tensor, Tensor> k_prelu_bw(const Tensor& g, const Tensor& x, const Tensor& w) {
  auto r = call("prelu_backward", {g, x, w});
  return {r[0], r[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  TPU_UNARY(m, "tan", "tan");
  TPU_UNARY(m, "asin", "asin");
  TPU_UNARY(m, "acos", "acos");
  TPU_UNARY(m, "atan", "atan");
  TPU_UNARY(m, "sinh", "sinh");
  TPU_UNARY(m, "cosh", "cosh");
  TPU_UNARY(m, "asinh", "asinh");
  TPU_UNARY(m, "acosh", "acosh");
  TPU_UNARY(m, "atanh", "atanh");
  TPU_UNARY(m, "log2", "log2");
  TPU_UNARY(m, "log10", "log10");
  TPU_UNARY(m, "exp2", "exp2");
  TPU_UNARY(m, "frac", "frac");
  TPU_UNARY(m, "sinc", "sinc");
  TPU_UNARY(m, "erfinv", "erfinv");
  TPU_UNARY(m, "lgamma", "lgamma");
  TPU_UNARY(m, "digamma", "digamma");
  TPU_UNARY(m, "erfc", "erfc");
  TPU_UNARY(m, "i0", "i0");
  m.impl("special_i0e", [](const Tensor& x) { return call1("i0e", {x}); });
  m.impl("special_i0e.out", [](const Tensor& x, Tensor& out) -> Tensor& { return into(out, call1("i0e", {x})); });
  m.impl("special_i1", [](const Tensor& x) { return call1("i1", {x}); });
  m.impl("special_i1.out", [](const Tensor& x, Tensor& out) -> Tensor& { return into(out, call1("i1", {x})); });
  m.impl("special_erfcx", [](const Tensor& x) { return call1("erfcx", {x}); });
  m.impl("special_erfcx.out", [](const Tensor& x, Tensor& out) -> Tensor& { return into(out, call1("erfcx", {x})); });
  m.impl("special_log_ndtr", [](const Tensor& x) { return call1("log_ndtr", {x}); });
  m.impl("special_log_ndtr.out",
         [](const Tensor& x, Tensor& out) -> Tensor& { return into(out, call1("log_ndtr", {x})); });
  m.impl("special_entr", [](const Tensor& x) { return call1("entr", {x}); });
  m.impl("special_entr.out", [](const Tensor& x, Tensor& out) -> Tensor& { return into(out, call1("entr", {x})); });
  m.impl("special_xlog1py", [](const Tensor& a, const Tensor& b) { return call1("xlog1py", {a, b}); });
  m.impl("special_xlog1py.out", [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& {
    return into(out, call1("xlog1py", {a, b}));
  });
  m.impl("gcd", [](const Tensor& a, const Tensor& b) { return call1("gcd", {a, b}); });
  m.impl("gcd_", [](Tensor& a, const Tensor& b) -> Tensor& { return inplace_binary(a, "gcd", b); });
  m.impl("gcd.out", [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& {
    return into(out, call1("gcd", {a, b}));
  });
  m.impl("lcm", [](const Tensor& a, const Tensor& b) { return call1("lcm", {a, b}); });
  m.impl("lcm_", [](Tensor& a, const Tensor& b) -> Tensor& { return inplace_binary(a, "lcm", b); });
  m.impl("lcm.out", [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& {
    return into(out, call1("lcm", {a, b}));
  });
  m.impl("special_ndtri", [](const Tensor& x) { return call1("ndtri", {x}); });
  m.impl("special_ndtri.out", [](const Tensor& x, Tensor& out) -> Tensor& { return into(out, call1("ndtri", {x})); });
  m.impl("special_zeta", [](const Tensor& x, const Tensor& q) { return call1("zeta", {x, q}); });
  m.impl("special_zeta.out", [](const Tensor& x, const Tensor& q, Tensor& out) -> Tensor& {
    return into(out, call1("zeta", {x, q}));
  });
  m.impl("special_i1e", [](const Tensor& x) { return call1("i1e", {x}); });
  m.impl("special_i1e.out", [](const Tensor& x, Tensor& out) -> Tensor& { return into(out, call1("i1e", {x})); });
  // torch.special's Bessel functions (no gradient in torch); the modified
  // I₀ and I₁ are i0 and i1 under other names.
#define TPU_SPECIAL(m, name, op)                                                       \
  m.impl("special_" name, [](const Tensor& x) { return call1(op, {x}); }); \
  m.impl("special_" name ".out", [](const Tensor& x, Tensor& out) -> Tensor& { return into(out, call1(op, {x})); })
  TPU_SPECIAL(m, "bessel_j0", "bessel_j0");
  TPU_SPECIAL(m, "bessel_j1", "bessel_j1");
  TPU_SPECIAL(m, "bessel_y0", "bessel_y0");
  TPU_SPECIAL(m, "bessel_y1", "bessel_y1");
  TPU_SPECIAL(m, "modified_bessel_i0", "i0");
  TPU_SPECIAL(m, "modified_bessel_i1", "i1");
  TPU_SPECIAL(m, "modified_bessel_k0", "modified_bessel_k0");
  TPU_SPECIAL(m, "modified_bessel_k1", "modified_bessel_k1");
  TPU_SPECIAL(m, "scaled_modified_bessel_k0", "scaled_modified_bessel_k0");
  TPU_SPECIAL(m, "scaled_modified_bessel_k1", "scaled_modified_bessel_k1");
  TPU_SPECIAL(m, "spherical_bessel_j0", "spherical_bessel_j0");
#undef TPU_SPECIAL
  // The Scalar x and Scalar n overloads are torch's composites over these.
#define TPU_CHEBYSHEV(m, name)                                                                  \
  m.impl("special_" name, [](const Tensor& x, const Tensor& n) { return call1(name, {x, n}); }); \
  m.impl("special_" name ".out", [](const Tensor& x, const Tensor& n, Tensor& out) -> Tensor& {   \
    return into(out, call1(name, {x, n}));                                                       \
  })
  TPU_CHEBYSHEV(m, "chebyshev_polynomial_t");
  TPU_CHEBYSHEV(m, "chebyshev_polynomial_u");
  TPU_CHEBYSHEV(m, "chebyshev_polynomial_v");
  TPU_CHEBYSHEV(m, "chebyshev_polynomial_w");
  TPU_CHEBYSHEV(m, "shifted_chebyshev_polynomial_t");
  TPU_CHEBYSHEV(m, "shifted_chebyshev_polynomial_u");
  TPU_CHEBYSHEV(m, "shifted_chebyshev_polynomial_v");
  TPU_CHEBYSHEV(m, "shifted_chebyshev_polynomial_w");
#undef TPU_CHEBYSHEV
#define TPU_RECURRENCE(m, name)                                                                               \
  m.impl("special_" name, [](const Tensor& x, const Tensor& n) { return polynomial_recurrence(name, x, n); }); \
  m.impl("special_" name ".out", [](const Tensor& x, const Tensor& n, Tensor& out) -> Tensor& {                 \
    return into(out, polynomial_recurrence(name, x, n));                                                       \
  })
  TPU_RECURRENCE(m, "hermite_polynomial_h");
  TPU_RECURRENCE(m, "hermite_polynomial_he");
  TPU_RECURRENCE(m, "laguerre_polynomial_l");
  TPU_RECURRENCE(m, "legendre_polynomial_p");
#undef TPU_RECURRENCE
  m.impl("polygamma", [](int64_t n, const Tensor& x) { return call1("polygamma", {x}, Attrs().i("n", n)); });
  m.impl("polygamma_", [](Tensor& x, int64_t n) -> Tensor& {
    return inplace(x, call1("polygamma", {x}, Attrs().i("n", n)));
  });
  m.impl("polygamma.out", [](int64_t n, const Tensor& x, Tensor& out) -> Tensor& {
    return into(out, call1("polygamma", {x}, Attrs().i("n", n)));
  });
  m.impl("signbit", [](const Tensor& x) { return call1("signbit", {x}); });
  m.impl("angle", k_angle);
  m.impl("angle.out", [](const Tensor& x, Tensor& out) -> Tensor& { return into(out, k_angle(x)); });
  m.impl("signbit.out", [](const Tensor& x, Tensor& out) -> Tensor& { return into(out, call1("signbit", {x})); });
  m.impl("copysign.Tensor", [](const Tensor& a, const Tensor& b) { return call1("copysign", {a, b}); });
  m.impl("copysign_.Tensor",
         [](Tensor& a, const Tensor& b) -> Tensor& { return inplace(a, call1("copysign", {a, b})); });
  m.impl("copysign.out",
         [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& { return into(out, call1("copysign", {a, b})); });
  m.impl("logit", k_logit);
  m.impl("logit_", [](Tensor& x, std::optional<double> eps) -> Tensor& { return inplace(x, k_logit(x, eps)); });
  m.impl("logit.out", [](const Tensor& x, std::optional<double> eps, Tensor& out) -> Tensor& {
    return into(out, k_logit(x, eps));
  });
  m.impl("logit_backward", k_logit_bw);
  m.impl("logit_backward.grad_input", [](const Tensor& g, const Tensor& x, std::optional<double> eps,
                                         Tensor& out) -> Tensor& { return into(out, k_logit_bw(g, x, eps)); });
  m.impl("xlogy.Tensor", [](const Tensor& a, const Tensor& b) { return call1("xlogy", {a, b}); });
  m.impl("xlogy_.Tensor", [](Tensor& a, const Tensor& b) -> Tensor& { return inplace(a, call1("xlogy", {a, b})); });
  m.impl("xlogy.OutTensor", [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& {
    return into(out, call1("xlogy", {a, b}));
  });
  m.impl("logaddexp", [](const Tensor& a, const Tensor& b) { return call1("logaddexp", {a, b}); });
  m.impl("logaddexp.out",
         [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& { return into(out, call1("logaddexp", {a, b})); });
  m.impl("logaddexp2", [](const Tensor& a, const Tensor& b) { return call1("logaddexp2", {a, b}); });
  m.impl("logaddexp2.out",
         [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& { return into(out, call1("logaddexp2", {a, b})); });
  m.impl("fmax", [](const Tensor& a, const Tensor& b) { return call1("fmax", {a, b}); });
  m.impl("fmax.out",
         [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& { return into(out, call1("fmax", {a, b})); });
  m.impl("fmin", [](const Tensor& a, const Tensor& b) { return call1("fmin", {a, b}); });
  m.impl("fmin.out",
         [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& { return into(out, call1("fmin", {a, b})); });
  TPU_BINARY_PLAIN(m, "hypot", "hypot");
  TPU_BINARY_PLAIN(m, "nextafter", "nextafter");
  m.impl("frexp.Tensor", [](const Tensor& x) -> std::tuple<Tensor, Tensor> {
    auto r = call("frexp", {x});
    return {r[0], r[1]};
  });
  m.impl("frexp.Tensor_out", [](const Tensor& x, Tensor& m, Tensor& e) -> std::tuple<Tensor&, Tensor&> {
    auto r = call("frexp", {x});
    into(m, r[0]);
    into(e, r[1]);
    return {m, e};
  });
  TPU_BINARY_PLAIN(m, "igamma", "igamma");
  TPU_BINARY_PLAIN(m, "igammac", "igammac");
  TPU_BINARY_PLAIN(m, "heaviside", "heaviside");

  m.impl("elu", k_elu);
  m.impl("elu_", [](Tensor& x, const Scalar& al, const Scalar& sc, const Scalar& is) -> Tensor& {
    return inplace(x, k_elu(x, al, sc, is));
  });
  m.impl("elu.out", [](const Tensor& x, const Scalar& al, const Scalar& sc, const Scalar& is, Tensor& out) -> Tensor& {
    return into(out, k_elu(x, al, sc, is));
  });
  m.impl("elu_backward", k_elu_bw);
  m.impl("elu_backward.grad_input", [](const Tensor& g, const Scalar& al, const Scalar& sc, const Scalar& is,
                                       bool is_result, const Tensor& x, Tensor& out) -> Tensor& {
    return into(out, k_elu_bw(g, al, sc, is, is_result, x));
  });
  m.impl("leaky_relu", k_leaky_relu);
  m.impl("leaky_relu_", [](Tensor& x, const Scalar& s) -> Tensor& { return inplace(x, k_leaky_relu(x, s)); });
  m.impl("leaky_relu.out",
         [](const Tensor& x, const Scalar& s, Tensor& out) -> Tensor& { return into(out, k_leaky_relu(x, s)); });
  m.impl("leaky_relu_backward", k_leaky_relu_bw);
  m.impl("leaky_relu_backward.grad_input",
         [](const Tensor& g, const Tensor& x, const Scalar& s, bool r, Tensor& out) -> Tensor& {
           return into(out, k_leaky_relu_bw(g, x, s, r));
         });
  m.impl("hardtanh", k_hardtanh);
  m.impl("hardtanh_",
         [](Tensor& x, const Scalar& lo, const Scalar& hi) -> Tensor& { return inplace(x, k_hardtanh(x, lo, hi)); });
  m.impl("hardtanh.out", [](const Tensor& x, const Scalar& lo, const Scalar& hi, Tensor& out) -> Tensor& {
    return into(out, k_hardtanh(x, lo, hi));
  });
  m.impl("hardtanh_backward", k_hardtanh_bw);
  m.impl("hardtanh_backward.grad_input",
         [](const Tensor& g, const Tensor& x, const Scalar& lo, const Scalar& hi, Tensor& out) -> Tensor& {
           return into(out, k_hardtanh_bw(g, x, lo, hi));
         });
  m.impl("softplus", k_softplus);
  m.impl("softplus.out", [](const Tensor& x, const Scalar& b, const Scalar& t, Tensor& out) -> Tensor& {
    return into(out, k_softplus(x, b, t));
  });
  m.impl("softplus_backward", k_softplus_bw);
  m.impl("softplus_backward.grad_input",
         [](const Tensor& g, const Tensor& x, const Scalar& b, const Scalar& t, Tensor& out) -> Tensor& {
           return into(out, k_softplus_bw(g, x, b, t));
         });
  TPU_UNARY(m, "hardswish", "hardswish");
  m.impl("hardswish_backward", [](const Tensor& g, const Tensor& x) { return call1("hardswish_backward", {g, x}); });
  TPU_UNARY(m, "hardsigmoid", "hardsigmoid");
  m.impl("hardsigmoid_backward",
         [](const Tensor& g, const Tensor& x) { return call1("hardsigmoid_backward", {g, x}); });
  m.impl("hardsigmoid_backward.grad_input", [](const Tensor& g, const Tensor& x, Tensor& out) -> Tensor& {
    return into(out, call1("hardsigmoid_backward", {g, x}));
  });
  TPU_UNARY(m, "mish", "mish");
  m.impl("threshold", k_threshold);
  m.impl("threshold_",
         [](Tensor& x, const Scalar& t, const Scalar& v) -> Tensor& { return inplace(x, k_threshold(x, t, v)); });
  m.impl("threshold.out", [](const Tensor& x, const Scalar& t, const Scalar& v, Tensor& out) -> Tensor& {
    return into(out, k_threshold(x, t, v));
  });
  m.impl("softshrink", k_softshrink);
  m.impl("softshrink.out",
         [](const Tensor& x, const Scalar& l, Tensor& out) -> Tensor& { return into(out, k_softshrink(x, l)); });
  m.impl("softshrink_backward", k_softshrink_bw);
  m.impl("softshrink_backward.grad_input", [](const Tensor& g, const Tensor& x, const Scalar& l, Tensor& out) -> Tensor& {
    return into(out, k_softshrink_bw(g, x, l));
  });
  m.impl("hardshrink", k_hardshrink);
  m.impl("hardshrink.out",
         [](const Tensor& x, const Scalar& l, Tensor& out) -> Tensor& { return into(out, k_hardshrink(x, l)); });
  m.impl("hardshrink_backward", k_hardshrink_bw);
  m.impl("hardshrink_backward.grad_input", [](const Tensor& g, const Tensor& x, const Scalar& l, Tensor& out) -> Tensor& {
    return into(out, k_hardshrink_bw(g, x, l));
  });
  m.impl("glu", k_glu);
  m.impl("glu.out", [](const Tensor& x, int64_t d, Tensor& out) -> Tensor& { return into(out, k_glu(x, d)); });
  m.impl("glu_backward", k_glu_bw);
  m.impl("glu_backward.grad_input", [](const Tensor& g, const Tensor& x, int64_t d, Tensor& out) -> Tensor& {
    return into(out, k_glu_bw(g, x, d));
  });
  m.impl("_prelu_kernel", [](const Tensor& x, const Tensor& w) { return call1("prelu", {x, w}); });
  m.impl("_prelu_kernel_backward", k_prelu_bw);

  m.impl("binary_cross_entropy", k_bce);
  m.impl("binary_cross_entropy.out", [](const Tensor& x, const Tensor& t, const OptTensor& w, int64_t red,
                                        Tensor& out) -> Tensor& { return into(out, k_bce(x, t, w, red)); });
  m.impl("binary_cross_entropy_backward", k_bce_bw);
  m.impl("binary_cross_entropy_backward.grad_input",
         [](const Tensor& g, const Tensor& x, const Tensor& t, const OptTensor& w, int64_t red, Tensor& out) -> Tensor& {
           return into(out, k_bce_bw(g, x, t, w, red));
         });
  m.impl("smooth_l1_loss", k_smooth_l1);
  m.impl("smooth_l1_loss.out", [](const Tensor& x, const Tensor& t, int64_t red, double beta, Tensor& out) -> Tensor& {
    return into(out, k_smooth_l1(x, t, red, beta));
  });
  m.impl("smooth_l1_loss_backward.grad_input", [](const Tensor& g, const Tensor& x, const Tensor& t, int64_t red,
                                                  double beta, Tensor& out) -> Tensor& {
    return into(out, call1("smooth_l1_loss_backward", {g, x, t}, Attrs().i("reduction", red).f("beta", beta)));
  });
  m.impl("huber_loss", k_huber);
  m.impl("huber_loss.out", [](const Tensor& x, const Tensor& t, int64_t red, double delta, Tensor& out) -> Tensor& {
    return into(out, k_huber(x, t, red, delta));
  });
  m.impl("huber_loss_backward.out", [](const Tensor& g, const Tensor& x, const Tensor& t, int64_t red, double delta,
                                       Tensor& out) -> Tensor& {
    return into(out, call1("huber_loss_backward", {g, x, t}, Attrs().i("reduction", red).f("delta", delta)));
  });
  m.impl("nansum", k_nansum);
  m.impl("nansum.out", [](const Tensor& x, at::OptionalIntArrayRef d, bool k, std::optional<at::ScalarType> dt,
                          Tensor& out) -> Tensor& { return into(out, k_nansum(x, d, k, dt)); });
  m.impl("std_mean.correction",
         [](const Tensor& x, at::OptionalIntArrayRef dim, const std::optional<Scalar>& corr, bool keepdim) {
           return std::make_tuple(k_std_c(x, dim, corr, keepdim), call1("mean", {x}, dims_attrs(dim, keepdim)));
         });
}


// --- layers, losses and helpers ---------------------------------------------
// Layers, losses and helpers: nonzero_static, embedding_renorm_, renorm,
// pdist, max_unpool, weight normalization, rrelu and the margin losses on
// the op library's ops; kaiser_window (a dispatch stub) is built here from
// aten ops that each run on a tpu kernel (so it runs natively, with the CPU
// fallback off, on both platforms), and a C frontend does not get it
// through the C ABI.

namespace {

// nonzero_static: the op library's (nonzero's coordinates for the first
// `size` true elements, fill_value past the count; nothing read back).
Tensor k_nonzero_static(const Tensor& x, int64_t size, int64_t fill) {
  return call1("nonzero_static", {x}, Attrs().i("size", size).i("fill_value", fill));
}

// embedding_renorm_ (nn.Embedding's max_norm): the op library's
// embedding_renorm gives the rows `indices` names, those whose norm exceeds
// max_norm scaled to max_norm / (norm + 1e-7); they are written back in
// place (a row named twice is written twice with the same values).
Tensor& k_embedding_renorm_(Tensor& self, const Tensor& indices, double max_norm, double norm_type) {
  TORCH_CHECK(self.dim() == 2, "embedding_renorm_(): expected a 2-D weight, got ", self.dim(), "-D");
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt,
              "embedding_renorm_(): Expected indices to have type int or long");
  if (indices.numel() == 0) return self;
  Tensor rows = call1("embedding_renorm", {self, indices}, Attrs().f("max_norm", max_norm).f("norm_type", norm_type));
  self.index_put_({indices.reshape({-1}).to(at::kLong)}, rows);
  return self;
}

// renorm: the op library's (each slice along `dim` whose p-norm exceeds
// maxnorm scaled to maxnorm / (norm + 1e-7)).
Tensor k_renorm(const Tensor& x, const Scalar& p, int64_t dim, const Scalar& maxnorm) {
  return call1("renorm", {x}, Attrs().f("p", p.toDouble()).i("dim", dim).f("maxnorm", maxnorm.toDouble()));
}

// pdist and its gradient: the op library's (cdist(x, x)'s upper triangle,
// row-major, diagonal excluded).
Tensor k_pdist(const Tensor& x, double p) { return call1("pdist", {x}, Attrs().f("p", p)); }
Tensor k_pdist_bw(const Tensor& g, const Tensor& x, double p, const Tensor& pdist) {
  return call1("pdist_backward", {g, x, pdist}, Attrs().f("p", p));
}

// max_unpool2d and 3d: the op library's max_unpool (each value written at
// its flat position within its plane, zeros elsewhere).
Tensor max_unpool(const Tensor& x, const Tensor& indices, at::IntArrayRef size, int64_t spatial) {
  TORCH_CHECK(static_cast<int64_t>(size.size()) == spatial, "There should be exactly ", spatial,
              " elements (height, width) in output_size, but got ", size.size(), " elements.");
  return call1("max_unpool", {x, indices}, Attrs().ints("output_size", size));
}

// Weight normalization's fused pair (what torch._weight_norm calls for
// dim 0 or the last dim: nn.utils.weight_norm and its parametrization):
// the op library's weight_norm and weight_norm_backward.
std::tuple<Tensor, Tensor> k_weight_norm(const Tensor& v, const Tensor& g, int64_t dim) {
  auto r = call("weight_norm", {v, g}, Attrs().i("dim", dim));
  return {r[0], r[1]};
}
std::tuple<Tensor, Tensor> k_weight_norm_bw(const Tensor& grad_w, const Tensor& v, const Tensor& g,
                                            const Tensor& norms, int64_t dim) {
  auto r = call("weight_norm_backward", {grad_w, v, g, norms}, Attrs().i("dim", dim));
  return {r[0], r[1]};
}

// kaiser_window: torch's factory fills an arange through this dispatch
// stub, which here writes I0(beta sqrt(1 - ((n - a) / a)^2)) / I0(beta),
// a = (N - 1) / 2, on the op library's i0.
void kaiser_window_kernel(at::TensorIteratorBase& iter, const int64_t length, const double beta) {
  Tensor out = iter.tensor(0);
  Tensor n = iter.tensor(1).to(at::kDouble == out.scalar_type() ? at::kDouble : at::kFloat);
  const double a = static_cast<double>(length - 1) / 2.0;
  Tensor r = (n - a) / a;
  Tensor w = at::i0((1 - r * r).clamp_min(0).sqrt() * beta) / at::i0(at::full({}, beta, n.options()));
  copy_into(out, w.to(out.scalar_type()), false);
}

// rrelu (training): the op library's rrelu_with_noise (each element at
// most 0 times a draw from U(lower, upper), that draw kept in `noise`, 1
// for the others, for the backward); in eval, leaky_relu with the mean
// slope.
Tensor k_rrelu_with_noise(const Tensor& x, Tensor& noise, const Scalar& lower, const Scalar& upper, bool training,
                          std::optional<at::Generator> gen) {
  const double lo = lower.toDouble(), hi = upper.toDouble();
  if (!training) return call1("leaky_relu", {x}, Attrs().f("negative_slope", (lo + hi) / 2));
  TORCH_CHECK(lo <= hi, "Lower bound should be less than or equal to the upper bound");
  std::vector<Tensor> ins{x};
  auto keys = rng_inputs(gen, dev(x), x.numel());
  ins.insert(ins.end(), keys.begin(), keys.end());
  auto r = call("rrelu_with_noise", ins, Attrs().f("lower", lo).f("upper", hi));
  noise.resize_(x.sizes());
  copy_into(noise, r[1], false);
  return r[0];
}
Tensor k_rrelu_with_noise_bw(const Tensor& g, const Tensor& x, const Tensor& noise, const Scalar& lower,
                             const Scalar& upper, bool training, bool is_result) {
  const double lo = lower.toDouble(), hi = upper.toDouble();
  if (training && hi - lo > 1e-6) return g * noise;
  return call1("leaky_relu_backward", {g, x}, Attrs().f("negative_slope", (lo + hi) / 2));
}

// multi_margin_loss and multilabel_margin_loss with their backward: the
// op library's (loss.rs).
std::vector<Tensor> with_weight(std::vector<Tensor> xs, const OptTensor& weight) {
  if (weight.has_value() && weight->defined()) xs.push_back(*weight);
  return xs;
}
Tensor k_multi_margin_loss(const Tensor& self, const Tensor& target, const Scalar& p, const Scalar& margin,
                           const OptTensor& weight, int64_t reduction) {
  return call1("multi_margin_loss", with_weight({self, target}, weight),
               Attrs().f("p", p.toDouble()).f("margin", margin.toDouble()).i("reduction", reduction));
}
Tensor k_multi_margin_loss_bw(const Tensor& grad, const Tensor& self, const Tensor& target, const Scalar& p,
                              const Scalar& margin, const OptTensor& weight, int64_t reduction) {
  return call1("multi_margin_loss_backward", with_weight({grad, self, target}, weight),
               Attrs().f("p", p.toDouble()).f("margin", margin.toDouble()).i("reduction", reduction));
}
std::tuple<Tensor, Tensor> k_multilabel_margin_loss(const Tensor& self, const Tensor& target, int64_t reduction) {
  auto r = call("multilabel_margin_loss", {self, target}, Attrs().i("reduction", reduction));
  return {r[0], r[1]};
}
Tensor k_multilabel_margin_loss_bw(const Tensor& grad, const Tensor& self, const Tensor& target, int64_t reduction,
                                   const Tensor& is_target) {
  return call1("multilabel_margin_loss_backward", {grad, self, target, is_target}, Attrs().i("reduction", reduction));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("nonzero_static", k_nonzero_static);
  m.impl("nonzero_static.out", [](const Tensor& x, int64_t size, int64_t fill, Tensor& out) -> Tensor& {
    return into(out, k_nonzero_static(x, size, fill));
  });
  m.impl("embedding_renorm_", k_embedding_renorm_);
  m.impl("_weight_norm_interface", k_weight_norm);
  m.impl("_weight_norm_interface_backward", k_weight_norm_bw);
  m.impl("renorm", k_renorm);
  m.impl("renorm_", [](Tensor& x, const Scalar& p, int64_t d, const Scalar& mx) -> Tensor& {
    return inplace(x, k_renorm(x, p, d, mx));
  });
  m.impl("renorm.out", [](const Tensor& x, const Scalar& p, int64_t d, const Scalar& mx, Tensor& out) -> Tensor& {
    return into(out, k_renorm(x, p, d, mx));
  });
  m.impl("_pdist_forward", k_pdist);
  m.impl("_pdist_backward", k_pdist_bw);
  m.impl("max_unpool2d", [](const Tensor& x, const Tensor& i, at::IntArrayRef size) { return max_unpool(x, i, size, 2); });
  m.impl("max_unpool2d.out", [](const Tensor& x, const Tensor& i, at::IntArrayRef size, Tensor& out) -> Tensor& {
    return into(out, max_unpool(x, i, size, 2));
  });
  m.impl("max_unpool3d", [](const Tensor& x, const Tensor& i, at::IntArrayRef size, at::IntArrayRef, at::IntArrayRef) {
    return max_unpool(x, i, size, 3);
  });
  m.impl("rrelu_with_noise", k_rrelu_with_noise);
  m.impl("rrelu_with_noise_", [](Tensor& x, Tensor& noise, const Scalar& lo, const Scalar& hi, bool training,
                                 std::optional<at::Generator> g) -> Tensor& {
    return inplace(x, k_rrelu_with_noise(x, noise, lo, hi, training, g));
  });
  m.impl("rrelu_with_noise_backward", k_rrelu_with_noise_bw);
  m.impl("multi_margin_loss", k_multi_margin_loss);
  m.impl("multi_margin_loss_backward", k_multi_margin_loss_bw);
  m.impl("multilabel_margin_loss_forward", k_multilabel_margin_loss);
  m.impl("multilabel_margin_loss_backward", k_multilabel_margin_loss_bw);
}

}  // namespace tpurt_torch

// scaled_dot_product_attention asks this dispatch stub (not the aten op)
// which backend runs on a PrivateUse1 device: the overrideable one, whose
// ops are registered above.
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &tpurt_torch::sdp_choice_stub);
// torch.kaiser_window's factory fills its window through this stub.
REGISTER_PRIVATEUSE1_DISPATCH(kaiser_window_stub, &tpurt_torch::kaiser_window_kernel);
}  // namespace at::native
