#include "engine/parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/parallel/collective_post.h"
#include "engine/parallel/nccl_sum.h"
#include "kernels/cuda/context.h"

namespace loom {
namespace {

absl::Status nccl_error(ncclResult_t r, const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": NCCL ", ncclGetErrorString(r)));
}

absl::Status cuda_error(cudaError_t e, const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": CUDA ", cudaGetErrorString(e)));
}

void check_device_tensors(const Tensor& send, const Tensor& recv, int device, const char* op) {
  LOOM_CHECK(send.device() == Device::cuda(device) && recv.device() == Device::cuda(device) &&
                 send.is_contiguous() && recv.is_contiguous() && send.ndim() >= 1 &&
                 recv.ndim() >= 1,
             "%s: NCCL rank on cuda:%d takes contiguous tensors on its device (send %s, recv %s)",
             op, device, send.describe(), recv.describe());
}

}  // namespace

absl::StatusOr<std::string> nccl_unique_id() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    return nccl_error(r, "ncclGetUniqueId");
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

class NcclCommunicator;

struct NcclGroup::State {
  std::unique_ptr<TcpGroup> control;  // status, abort relay and liveness across nodes
  absl::Duration timeout;
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;  // comms[i]: local rank i's; each aborted only by its own thread
  std::vector<std::unique_ptr<NcclCommunicator>> ranks;

  void fail(const absl::Status& why) { control->abort(why); }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(NcclGroup::State& g, int local)
      : g_(g), local_(local), device_(g.devices[local]) {
    stream_ = cuda::device_context(device_).stream;
  }

  int rank() const override { return g_.control->first_rank() + local_; }
  int size() const override { return g_.control->size(); }

  absl::Status all_gather(const Tensor& send, const Tensor& recv) override {
    check_device_tensors(send, recv, device_, "all_gather");
    check_all_gather_shapes(send, recv, size());
    return run("all_gather", [&] {
      if (send.nbytes() == 0) return ncclSuccess;  // no rows: nothing travels
      return ncclAllGather(send.raw(), recv.raw(), send.nbytes(), ncclInt8, comm(), stream_);
    });
  }

  absl::Status reduce_scatter(const Tensor& send, const Tensor& recv) override {
    check_device_tensors(send, recv, device_, "reduce_scatter");
    check_reduce_scatter_shapes(send, recv, size());
    const int64_t n = recv.numel();
    const size_t block = static_cast<size_t>(n) * sizeof(float);
    // Every rank's block for this rank, in rank order, then summed in that order.
    Tensor blocks =
        Tensor::empty({size() * std::max<int64_t>(n, 1)}, DType::kF32, Device::cuda(device_));
    absl::Status st = run(
        "reduce_scatter",
        [&] {
          if (block == 0) return ncclSuccess;
          ncclResult_t r = ncclGroupStart();
          for (int q = 0; q < size() && r == ncclSuccess; ++q) {
            r = ncclSend(static_cast<const char*>(send.raw()) + q * block, block, ncclInt8, q,
                         comm(), stream_);
            if (r == ncclSuccess)
              r = ncclRecv(static_cast<char*>(blocks.raw()) + q * block, block, ncclInt8, q, comm(),
                           stream_);
          }
          const ncclResult_t end = ncclGroupEnd();
          return r != ncclSuccess ? r : end;
        },
        [&] {
          return sum_blocks_in_rank_order(blocks.data<float>(), n, size(), recv.data<float>(),
                                          stream_);
        });
    return st;
  }

  absl::Status all_to_all(const Tensor& send, std::span<const int64_t> send_counts,
                          const Tensor& recv, std::span<const int64_t> recv_counts) override {
    check_device_tensors(send, recv, device_, "all_to_all");
    check_all_to_all_shapes(send, send_counts, recv, recv_counts, size());
    const int64_t row = collective_row_bytes(send);
    return run("all_to_all", [&] {
      ncclResult_t r = ncclGroupStart();
      int64_t out = 0, in = 0;
      for (int q = 0; q < size() && r == ncclSuccess; ++q) {
        if (send_counts[q] > 0)
          r = ncclSend(static_cast<const char*>(send.raw()) + out * row,
                       static_cast<size_t>(send_counts[q] * row), ncclInt8, q, comm(), stream_);
        if (r == ncclSuccess && recv_counts[q] > 0)
          r = ncclRecv(static_cast<char*>(recv.raw()) + in * row,
                       static_cast<size_t>(recv_counts[q] * row), ncclInt8, q, comm(), stream_);
        out += send_counts[q];
        in += recv_counts[q];
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  void abort(const absl::Status& why) override { g_.fail(why); }
  absl::Status status() const override { return g_.control->status(); }

 private:
  ncclComm_t comm() const { return g_.comms[local_]; }

  // Issues the collective, waits until NCCL has enqueued it (a non-blocking communicator may
  // still be at it when the call returns), enqueues `then` (stream work on its result), and waits
  // for the stream: done, or NCCL's asynchronous error, the group's failure (relayed from any rank
  // of any node), or the timeout; on anything but done, fails the group and aborts this rank's
  // communicator.
  absl::Status run(const char* op, const std::function<ncclResult_t()>& issue,
                   const std::function<cudaError_t()>& then = nullptr) {
    if (absl::Status st = status(); !st.ok()) return st;
    const cuda::DeviceGuard guard(device_);
    const uint64_t seq = seq_++;
    const std::string what = absl::StrCat("rank ", rank(), " ", op, " #", seq);
    const absl::Time deadline = absl::Now() + g_.timeout;
    absl::Status st;
    if (ncclResult_t r = issue(); r != ncclSuccess && r != ncclInProgress) {
      st = nccl_error(r, what);
    } else if (st = wait(what, deadline, /*enqueued_only=*/true); !st.ok()) {
    } else if (cudaError_t e = then ? then() : cudaSuccess; e != cudaSuccess) {
      st = cuda_error(e, what);
    } else {
      st = wait(what, deadline, /*enqueued_only=*/false);
    }
    if (!st.ok()) {
      g_.fail(st);
      abort_comm();
      return status();
    }
    return st;
  }

  // Until NCCL has enqueued the work (`enqueued_only`) or the stream has run it.
  absl::Status wait(const std::string& what, absl::Time deadline, bool enqueued_only) {
    absl::Duration nap = absl::Microseconds(5);
    while (true) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm(), &async);
      if (async != ncclSuccess && async != ncclInProgress) return nccl_error(async, what);
      if (async == ncclSuccess) {
        if (enqueued_only) return absl::OkStatus();
        const cudaError_t e = cudaStreamQuery(stream_);
        if (e == cudaSuccess) return absl::OkStatus();
        if (e != cudaErrorNotReady) return cuda_error(e, what);
      }
      if (absl::Status st = status(); !st.ok()) return st;
      if (absl::Now() >= deadline)
        return absl::DeadlineExceededError(absl::StrCat(
            "expert-parallel group: ", what, " did not complete within ",
            absl::FormatDuration(g_.timeout), " (a rank failed, hung, or is out of lockstep)"));
      absl::SleepFor(nap);
      nap = std::min(nap * 2, absl::Milliseconds(1));
    }
  }

  void abort_comm() {
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(g_.comms[local_]);
    g_.comms[local_] = nullptr;
  }

  NcclGroup::State& g_;
  const int local_, device_;
  cudaStream_t stream_ = nullptr;
  uint64_t seq_ = 0;
  bool aborted_ = false;
};

absl::StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::create(std::unique_ptr<TcpGroup> control,
                                                             const std::string& unique_id,
                                                             const std::vector<int>& devices,
                                                             absl::Duration timeout) {
  if (static_cast<int>(devices.size()) != control->local_size())
    return absl::InvalidArgumentError(absl::StrCat("NcclGroup: ", devices.size(), " devices for ",
                                                   control->local_size(), " local ranks"));
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id))
    return absl::InvalidArgumentError(absl::StrCat("NcclGroup: a unique id of ", unique_id.size(),
                                                   " bytes, NCCL's has ", sizeof(id)));
  std::memcpy(&id, unique_id.data(), sizeof(id));
  auto state = std::make_unique<State>();
  state->control = std::move(control);
  state->timeout = timeout;
  state->devices = devices;
  state->comms.assign(devices.size(), nullptr);
  // Non-blocking initialisation, so that a node that never joins is a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclGroupStart();
  for (size_t i = 0; i < devices.size() && (r == ncclSuccess || r == ncclInProgress); ++i) {
    const cuda::DeviceGuard guard(devices[i]);
    r = ncclCommInitRankConfig(&state->comms[i], state->control->size(), id,
                               state->control->first_rank() + static_cast<int>(i), &config);
  }
  const ncclResult_t end = ncclGroupEnd();
  if (r == ncclSuccess || r == ncclInProgress) r = end;
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status st = r == ncclSuccess || r == ncclInProgress
                        ? absl::OkStatus()
                        : nccl_error(r, "ncclCommInitRankConfig");
  for (size_t i = 0; i < devices.size() && st.ok(); ++i) {
    while (true) {
      ncclResult_t async = ncclInProgress;
      ncclCommGetAsyncError(state->comms[i], &async);
      if (async == ncclSuccess) break;
      if (async != ncclInProgress) {
        st = nccl_error(async,
                        absl::StrCat("initialising NCCL rank ", state->control->first_rank() + i));
      } else if (absl::Status c = state->control->status(); !c.ok()) {
        st = c;
      } else if (absl::Now() >= deadline) {
        st = absl::DeadlineExceededError(
            absl::StrCat("NCCL ranks did not all join within ", absl::FormatDuration(timeout)));
      } else {
        absl::SleepFor(absl::Milliseconds(1));
        continue;
      }
      break;
    }
  }
  if (!st.ok()) {
    state->control->abort(st);
    for (ncclComm_t& c : state->comms)
      if (c != nullptr) ncclCommAbort(c);
    return st;
  }
  for (size_t i = 0; i < devices.size(); ++i)
    state->ranks.push_back(std::make_unique<NcclCommunicator>(*state, static_cast<int>(i)));
  return std::unique_ptr<NcclGroup>(new NcclGroup(std::move(state)));
}

NcclGroup::NcclGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}

NcclGroup::~NcclGroup() {
  // A healthy group finalises its communicators; a failed one has aborted them (each rank's own
  // on its thread, and whatever is left here).
  const bool healthy = state_->control->status().ok();
  for (size_t i = 0; i < state_->comms.size(); ++i) {
    ncclComm_t c = state_->comms[i];
    if (c == nullptr) continue;
    const cuda::DeviceGuard guard(state_->devices[i]);
    ncclResult_t async = healthy ? ncclCommFinalize(c) : ncclInternalError;
    // Finalizing waits for the peers' matching finalize (bounded by the timeout); a failed group,
    // or a finalize that does not finish, aborts instead.
    const absl::Time deadline = absl::Now() + state_->timeout;
    while (async == ncclInProgress && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
      ncclCommGetAsyncError(c, &async);
    }
    if (async == ncclSuccess) {
      ncclCommDestroy(c);
    } else {
      ncclCommAbort(c);
    }
  }
}

int NcclGroup::size() const { return state_->control->size(); }
int NcclGroup::local_size() const { return state_->control->local_size(); }
int NcclGroup::first_rank() const { return state_->control->first_rank(); }

Communicator& NcclGroup::local_rank(int i) {
  LOOM_CHECK(i >= 0 && i < local_size(), "local rank %d of %d", i, local_size());
  return *state_->ranks[i];
}

void NcclGroup::abort(const absl::Status& why) { state_->fail(why); }
absl::Status NcclGroup::status() const { return state_->control->status(); }
absl::Status NcclGroup::departed() const { return state_->control->departed(); }

}  // namespace loom
