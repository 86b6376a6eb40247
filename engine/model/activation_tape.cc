#include "engine/model/activation_tape.h"

#include <algorithm>
#include <utility>

namespace loom {

ActivationTape::ActivationTape(std::vector<std::string> names) : names_(std::move(names)) {}

bool ActivationTape::wants(std::string_view name) const {
  return names_.empty() || std::find(names_.begin(), names_.end(), name) != names_.end();
}

void ActivationTape::keep_in(const Exec& ex, Workspace* memory) {
  exec_ = ex;
  memory_ = memory;
}

void ActivationTape::record(int layer, std::string_view name, const Tensor& value) {
  if (!wants(name)) return;
  Tensor copy;
  if (memory_ != nullptr && value.is_contiguous() && value.device() == memory_->device()) {
    copy = memory_->take(value.shape(), value.dtype());
    copy_async(*exec_, copy.raw(), value.raw(), value.nbytes());
  } else {
    copy = value.clone();
  }
  auto [it, inserted] =
      index_.try_emplace(std::make_pair(layer, std::string(name)), entries_.size());
  if (inserted) {
    entries_.push_back({layer, std::string(name), std::move(copy)});
  } else {
    entries_[it->second].value = std::move(copy);
  }
}

const Tensor* ActivationTape::find(int layer, std::string_view name) const {
  auto it = index_.find(std::make_pair(layer, std::string(name)));
  return it == index_.end() ? nullptr : &entries_[it->second].value;
}

size_t ActivationTape::bytes() const {
  size_t total = 0;
  for (const Entry& e : entries_) total += e.value.nbytes();
  return total;
}

void ActivationTape::clear() {
  entries_.clear();
  index_.clear();
}

}  // namespace loom
