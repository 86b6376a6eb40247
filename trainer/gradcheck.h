// Gradient check against a fixture (`loom-trainer gradcheck`): the loss and every parameter's
// gradient of Model::loss_and_gradients on the fixture's prompt 1, against `loss_1` (golden.json)
// and grads.safetensors (torch autograd through the reference implementation in f32;
// fixtures/README.md).
//
// The reference gradients carry the checkpoint's tensor names. They are mapped to canonical names
// by loading grads.safetensors as if it were the checkpoint, through the same family adapter as
// the weights: the adapters only rename, concatenate and reshape, which a gradient follows exactly
// as its weight does.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"

namespace loom {

struct GradcheckTensor {
  std::string name;     // canonical
  double rel_l2 = 0;    // ||grad - ref|| / ||ref||
  double max_abs = 0;   // max |grad - ref|
  double ref_norm = 0;  // ||ref||
};

struct GradcheckReport {
  double loss = 0, ref_loss = 0;
  std::vector<GradcheckTensor> tensors;  // every parameter, in canonical-name order
};

// Runs the check in f32 on `device` (the model, its backward and the gradients live there; the
// comparison reads them back). NotFound without grads.safetensors; errors from loading (a device
// this build or machine lacks is refused by Model::load with a message).
absl::StatusOr<GradcheckReport> gradcheck_fixture(const std::string& fixture_dir,
                                                  Device device = Device::kCpu);

}  // namespace loom
