#include "engine/model/gradients.h"

#include "core/status.h"

namespace loom {

const Tensor& Gradients::get(const std::string& name, const Shape& shape) {
  auto it = grads_.find(name);
  if (it == grads_.end()) it = grads_.emplace(name, Tensor::zeros(shape)).first;
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

void Gradients::zero() {
  for (auto& [name, t] : grads_) t.fill(0.0f);
}

}  // namespace loom
