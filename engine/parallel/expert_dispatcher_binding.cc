#include "engine/parallel/expert_dispatcher_binding.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/parallel/local_expert_dispatcher.h"

namespace loom {
namespace {
thread_local std::shared_ptr<ExpertDispatcher> bound;  // null: no binding (or a factory)
thread_local ScopedExpertDispatcher::Factory bound_factory;
}  // namespace

ScopedExpertDispatcher::ScopedExpertDispatcher(std::shared_ptr<ExpertDispatcher> dispatcher) {
  LOOM_CHECK(bound == nullptr && !bound_factory,
             "ScopedExpertDispatcher: this thread already has a binding");
  LOOM_CHECK(dispatcher != nullptr, "ScopedExpertDispatcher: null dispatcher");
  bound = std::move(dispatcher);
}

ScopedExpertDispatcher::ScopedExpertDispatcher(Factory factory) {
  LOOM_CHECK(bound == nullptr && !bound_factory,
             "ScopedExpertDispatcher: this thread already has a binding");
  LOOM_CHECK(factory != nullptr, "ScopedExpertDispatcher: null factory");
  bound_factory = std::move(factory);
}

ScopedExpertDispatcher::~ScopedExpertDispatcher() {
  bound.reset();
  bound_factory = nullptr;
}

bool expert_dispatcher_bound() { return bound != nullptr || static_cast<bool>(bound_factory); }

absl::StatusOr<std::shared_ptr<ExpertDispatcher>> expert_dispatcher_for_layer(int64_t num_experts,
                                                                              ExpertRange owned) {
  if (bound_factory) return bound_factory(num_experts, owned);
  if (bound == nullptr) return std::make_shared<LocalExpertDispatcher>(num_experts, owned);
  const ExpertRange r = bound->owned();
  if (r != owned)
    return absl::InvalidArgumentError(
        absl::StrCat("the expert-parallel dispatcher owns experts [", r.begin, ", ", r.end,
                     ") but the weights hold [", owned.begin, ", ", owned.end,
                     "): load the rank's model with Placement::experts = its dispatcher's range"));
  return bound;
}

}  // namespace loom
