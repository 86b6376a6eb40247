#include "engine/model/gradients.h"

#include <algorithm>

#include "core/status.h"
#include "kernels/elementwise.h"

namespace loom {

const Tensor& Gradients::get(const std::string& name, const Shape& shape) {
  auto it = grads_.find(name);
  if (it == grads_.end()) {
    Tensor t = Tensor::empty(shape, DType::kF32, device_);
    zero_fill(exec_for(device_), t);
    it = grads_.emplace(name, std::move(t)).first;
  }
  LOOM_CHECK(it->second.shape() == shape, "Gradients: %s is %s, asked for another shape",
             name.c_str(), it->second.describe().c_str());
  return it->second;
}

const Tensor* Gradients::find(std::string_view name) const {
  auto it = grads_.find(name);
  return it == grads_.end() ? nullptr : &it->second;
}

std::vector<std::string> Gradients::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : grads_) out.push_back(name);
  return out;
}

bool Gradients::set_device(Device device) {
  if (device == device_) return true;
  if (!grads_.empty()) return false;
  device_ = device;
  return true;
}

void Gradients::zero() {
  if (flat_.defined() && flat_names_ == grads_.size()) {
    zero_fill(exec_for(device_), flat_);
  } else {
    for (auto& [name, t] : grads_) zero_fill(exec_for(device_), t);
  }
  counts_.clear();
  aux_loss_ = 0.0;
}

const Tensor& Gradients::flatten(int64_t multiple) {
  LOOM_CHECK(multiple >= 1, "Gradients::flatten: multiple %lld", static_cast<long long>(multiple));
  if (flat_.defined() && flat_names_ == grads_.size() && flat_multiple_ == multiple) return flat_;
  int64_t total = 0;
  for (const auto& [name, t] : grads_) total += t.numel();
  total = (total + multiple - 1) / multiple * multiple;
  Tensor block = Tensor::empty({std::max<int64_t>(total, multiple)}, DType::kF32, device_);
  zero_fill(exec_for(device_), block);  // the padding; every gradient is copied over its part
  int64_t at = 0;
  for (auto& [name, t] : grads_) {
    Tensor view = block.slice(0, at, at + t.numel()).reshape(t.shape());
    view.copy_from(t);
    t = std::move(view);
    at += t.numel();
  }
  flat_ = std::move(block);
  flat_names_ = grads_.size();
  flat_multiple_ = multiple;
  return flat_;
}

void Gradients::add_expert_counts(const std::string& bias_name,
                                  const std::vector<int64_t>& counts) {
  std::vector<int64_t>& sum = counts_[bias_name];
  if (sum.empty()) sum.assign(counts.size(), 0);
  LOOM_CHECK(sum.size() == counts.size(), "Gradients: %zu expert counts for %s, had %zu",
             counts.size(), bias_name.c_str(), sum.size());
  for (size_t e = 0; e < counts.size(); ++e) sum[e] += counts[e];
}

}  // namespace loom
