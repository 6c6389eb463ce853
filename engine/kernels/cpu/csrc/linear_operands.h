// What both linear kernels (linear_bf16w.cpp through linear_tiles.h, linear_int8w.cpp) do with their operands
// before their own loops: contiguous views, fp32 scale and bias, the output, and the answer when there is no
// work (M == 0, or K == 0: the bias per row, or zeros).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kvloop::linear_operands {

struct Operands {
  at::Tensor x, w, scale, bias, y;  // scale and bias undefined when absent
  bool done;                        // no work: y already holds the answer
};

// x: [M, K] fp32; packed: the kernel's weight layout; scale: [n] or undefined; bias: [n] or None.
inline Operands prepare(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, int64_t n,
                        const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(!scale.defined() || scale.numel() == n, "scale must have n elements");
  Operands o{x.contiguous(), packed.contiguous(), scale.defined() ? scale.to(at::kFloat).contiguous() : at::Tensor(),
             at::Tensor(), at::Tensor(), false};
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "bias must have n elements");
    o.bias = bias->to(at::kFloat).contiguous();
  }
  const int64_t M = x.size(0), K = x.size(1);
  o.y = at::empty({M, n}, x.options());
  if (M == 0 || K == 0) {
    o.done = true;
    if (M != 0) o.y = o.bias.defined() ? o.bias.expand({M, n}).clone() : o.y.zero_();
  }
  return o;
}

}  // namespace kvloop::linear_operands
