#include "kernels/batch_invariance.h"

namespace loom {
namespace {

thread_local bool t_batch_invariant = false;

}  // namespace

bool batch_invariant_numerics() { return t_batch_invariant; }

ScopedBatchInvariance::ScopedBatchInvariance(bool on) : previous_(t_batch_invariant) {
  t_batch_invariant = on;
}

ScopedBatchInvariance::~ScopedBatchInvariance() { t_batch_invariant = previous_; }

}  // namespace loom
