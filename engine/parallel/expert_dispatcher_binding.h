// How a rank's model gets its expert-parallel dispatcher: bound to the loading thread for the
// duration of Model::load. Each MoE layer asks for its dispatcher once, when it is built
// (engine/model/ffn.cc); with no binding on the thread it gets a LocalExpertDispatcher of the
// placement's experts, as always. A binding is per thread because a rank is one thread (thread
// ranks load their models concurrently), and scoped so that it cannot leak into a later load.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/parallel/expert_dispatcher.h"

namespace loom {

class ScopedExpertDispatcher {
 public:
  // While this lives, MoE layers built on this thread dispatch through `dispatcher` (shared by
  // all of them; it must keep no state between calls). Bindings do not nest.
  explicit ScopedExpertDispatcher(std::shared_ptr<ExpertDispatcher> dispatcher);
  // While this lives, each MoE layer built on this thread gets factory(num_experts, owned), called
  // once per layer in build order (a dispatcher per layer: ExpertLoadBalancer's placements are
  // per layer). The factory's error fails the load.
  using Factory =
      std::function<absl::StatusOr<std::shared_ptr<ExpertDispatcher>>(int64_t, ExpertRange)>;
  explicit ScopedExpertDispatcher(Factory factory);
  ScopedExpertDispatcher(const ScopedExpertDispatcher&) = delete;
  ScopedExpertDispatcher& operator=(const ScopedExpertDispatcher&) = delete;
  ~ScopedExpertDispatcher();
};

// Whether this thread has a binding (a dispatcher or a factory).
bool expert_dispatcher_bound();

// The dispatcher of an MoE layer of `num_experts` whose weights hold experts `owned`: the
// thread's bound one (or its bound factory's), or a new LocalExpertDispatcher. InvalidArgument when
// the bound dispatcher owns other experts than the weights (the model was loaded with another
// Placement::experts).
absl::StatusOr<std::shared_ptr<ExpertDispatcher>> expert_dispatcher_for_layer(int64_t num_experts,
                                                                              ExpertRange owned);

}  // namespace loom
