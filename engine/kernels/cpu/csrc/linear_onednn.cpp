// A bf16 linear through oneDNN with its weights packed once: kvloop_cpu::linear_onednn(x, weight, bias) is
// F.linear(x, weight, bias) for a dense bf16 weight, but multiplies through mkldnn::_linear_pointwise over the
// weight reordered into oneDNN's blocked layout (mkldnn::_reorder_linear_weight) the first time the weight is
// seen, not on every call as F.linear's oneDNN path does: faster, the same outputs bit for bit
// (docs/engine_history.md).
//
// The packed copies are kept per weight (keyed by its data pointer, checked against a weak reference to its
// storage, so a weight freed and another allocated at the same address is packed afresh). torch.compile keeps
// this operator in its graph with the weight as an input, as it would F.linear; the packed copy (an MKLDNN
// tensor, which the compiler cannot take as a graph input) stays in here. The weight may also be a key: a
// tensor of its shape with no data of its own (a stride-0 view of one element), whose packed copy
// linear_onednn_register made from the dense weight, which the caller then drops (one copy, not two).

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>

namespace {

struct PackedWeight {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  std::vector<int64_t> sizes;
  at::Tensor packed;
};

std::mutex packed_mutex;
std::unordered_map<const void*, PackedWeight> packed_weights;

bool is_key(const at::Tensor& t) { return t.dim() == 2 && t.stride(0) == 0 && t.stride(1) == 0; }

void check_dense(const at::Tensor& weight) {
  TORCH_CHECK(weight.device().is_cpu() && weight.scalar_type() == at::kBFloat16 && weight.dim() == 2 &&
                  weight.is_contiguous(),
              "the weight must be a contiguous [out, in] bfloat16 CPU matrix");
}

// Packs `weight` and keeps the copy under `key` (the weight itself, or a key standing in for it).
at::Tensor store_packed(const at::Tensor& key, const at::Tensor& weight) {
  static const auto reorder = c10::Dispatcher::singleton()
                                  .findSchemaOrThrow("mkldnn::_reorder_linear_weight", "")
                                  .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
  at::Tensor packed = reorder.call(weight, std::nullopt);
  std::lock_guard<std::mutex> lock(packed_mutex);
  for (auto e = packed_weights.begin(); e != packed_weights.end();)  // drop the copies of freed weights
    e = e->second.storage.expired() ? packed_weights.erase(e) : std::next(e);
  packed_weights.insert_or_assign(key.const_data_ptr(),
                                  PackedWeight{key.storage().getWeakStorageImpl(), key.sizes().vec(), packed});
  return packed;
}

std::optional<at::Tensor> find_packed(const at::Tensor& key) {
  std::lock_guard<std::mutex> lock(packed_mutex);
  auto it = packed_weights.find(key.const_data_ptr());
  if (it == packed_weights.end()) return std::nullopt;
  const auto alive = it->second.storage.lock();
  if (alive.get() != key.storage().unsafeGetStorageImpl() || it->second.sizes != key.sizes().vec()) return std::nullopt;
  return it->second.packed;
}

at::Tensor packed_of(const at::Tensor& weight) {
  if (auto found = find_packed(weight)) return *found;
  TORCH_CHECK(!is_key(weight), "linear_onednn: no packed weights registered for this key");
  check_dense(weight);
  return store_packed(weight, weight);
}

void linear_onednn_register(const at::Tensor& key, const at::Tensor& weight) {
  TORCH_CHECK(is_key(key) && key.sizes() == weight.sizes() && key.scalar_type() == weight.scalar_type(),
              "the key must be a stride-0 view of the weight's shape and dtype");
  check_dense(weight);
  store_packed(key, weight);
}

at::Tensor linear_onednn(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "x and weight must be bfloat16");
  TORCH_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1), "weight must be an [out, in] matrix matching x's "
              "last dim");
  static const auto pointwise =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            c10::string_view, c10::List<std::optional<c10::Scalar>>,
                            std::optional<c10::string_view>)>();
  const at::Tensor xc = x.is_contiguous() ? x : x.contiguous();
  return pointwise.call(xc, packed_of(weight), bias, "none", c10::List<std::optional<c10::Scalar>>(), "");
}

// How many packed copies are held (tests: a freed weight's copy goes).
int64_t linear_onednn_packed() {
  std::lock_guard<std::mutex> lock(packed_mutex);
  int64_t n = 0;
  for (const auto& e : packed_weights) n += !e.second.storage.expired();
  return n;
}

}  // namespace

// A fragment: the namespace itself is declared by paged_decode.cpp's library (either may load first).
TORCH_LIBRARY_FRAGMENT(kvloop_cpu, m) {
  m.def("linear_onednn(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("linear_onednn_packed() -> int", &linear_onednn_packed);
  m.def("linear_onednn_register(Tensor key, Tensor weight) -> ()");
}

TORCH_LIBRARY_IMPL(kvloop_cpu, CPU, m) {
  m.impl("linear_onednn", &linear_onednn);
  m.impl("linear_onednn_register", &linear_onednn_register);
}
