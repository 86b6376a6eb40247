// Contract checks shared by the CPU twins of the varlen ops (kernels/conv.h, kda.h, attention.h,
// and the trainer's packed backward in kda_backward.h and attention_backward.h):
// the step data that says which rows, slots and pages belong to which sequence.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace loom::cpu {

// cu_seqlens: i64 [B + 1], 0 first, `rows` last, non-decreasing. Returns B.
inline int64_t check_cu_seqlens(const char* op, const Tensor& cu_seqlens, int64_t rows) {
  LOOM_CHECK(cu_seqlens.dtype() == DType::kI64 && cu_seqlens.ndim() == 1 &&
                 cu_seqlens.dim(0) >= 1 && cu_seqlens.is_contiguous(),
             "%s: cu_seqlens %s, expected contiguous i64 [B + 1]", op,
             cu_seqlens.describe().c_str());
  const int64_t b = cu_seqlens.dim(0) - 1;
  const int64_t* cu = cu_seqlens.data<int64_t>();
  LOOM_CHECK(cu[0] == 0 && cu[b] == rows, "%s: cu_seqlens runs from %lld to %lld over %lld rows",
             op, static_cast<long long>(cu[0]), static_cast<long long>(cu[b]),
             static_cast<long long>(rows));
  for (int64_t i = 0; i < b; ++i)
    LOOM_CHECK(cu[i] <= cu[i + 1], "%s: cu_seqlens decreases at %lld", op,
               static_cast<long long>(i));
  return b;
}

// Every sequence of a checked cu_seqlens at most max_seqlen rows (the bound a caller gives for
// launch sizes and scratch).
inline void check_max_seqlen(const char* op, const Tensor& cu_seqlens, int64_t max_seqlen) {
  const int64_t* cu = cu_seqlens.data<int64_t>();
  for (int64_t s = 0; s + 1 < cu_seqlens.dim(0); ++s)
    LOOM_CHECK(cu[s + 1] - cu[s] <= max_seqlen,
               "%s: sequence %lld is rows %lld..%lld (max_seqlen %lld)", op,
               static_cast<long long>(s), static_cast<long long>(cu[s]),
               static_cast<long long>(cu[s + 1]), static_cast<long long>(max_seqlen));
}

// state_slots: i32 [B], each in [0, num_slots).
inline void check_state_slots(const char* op, const Tensor& state_slots, int64_t b,
                              int64_t num_slots) {
  LOOM_CHECK(state_slots.dtype() == DType::kI32 && state_slots.ndim() == 1 &&
                 state_slots.dim(0) == b && state_slots.is_contiguous(),
             "%s: state_slots %s for %lld sequences", op, state_slots.describe().c_str(),
             static_cast<long long>(b));
  const int32_t* slots = state_slots.data<int32_t>();
  for (int64_t i = 0; i < b; ++i)
    LOOM_CHECK(slots[i] >= 0 && slots[i] < num_slots,
               "%s: sequence %lld's slot %d outside [0, %lld)", op, static_cast<long long>(i),
               slots[i], static_cast<long long>(num_slots));
}

// past_lens: i64 [B], each >= 0.
inline void check_past_lens(const char* op, const Tensor& past_lens, int64_t b) {
  LOOM_CHECK(past_lens.dtype() == DType::kI64 && past_lens.ndim() == 1 && past_lens.dim(0) == b &&
                 past_lens.is_contiguous(),
             "%s: past_lens %s for %lld sequences", op, past_lens.describe().c_str(),
             static_cast<long long>(b));
  for (int64_t i = 0; i < b; ++i)
    LOOM_CHECK(past_lens.data<int64_t>()[i] >= 0, "%s: sequence %lld's past length %lld", op,
               static_cast<long long>(i), static_cast<long long>(past_lens.data<int64_t>()[i]));
}

}  // namespace loom::cpu
