#include "kernels/cuda/graph.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.h"

namespace loom::cuda {
namespace {

// LOOM_CUDA_PDL_REPORT=1: each capture prints, to stderr, the kernel nodes left with plain edges
// by function (what the next PDL-aware kernel would gain), most frequent first.
bool pdl_report_on() {
  static const bool on = [] {
    const char* v = std::getenv("LOOM_CUDA_PDL_REPORT");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

void report_plain_kernels(const std::vector<std::pair<std::string, bool>>& kernels) {
  std::map<std::string, std::pair<int, int>> by_name;  // plain, programmatic
  for (const auto& [name, programmatic] : kernels) {
    auto& c = by_name[name];
    (programmatic ? c.second : c.first) += 1;
  }
  std::vector<std::pair<int, std::string>> order;
  for (const auto& [name, c] : by_name) order.emplace_back(-c.first, name);
  std::sort(order.begin(), order.end());
  std::fprintf(stderr, "PDL report: %zu kernel nodes\n", kernels.size());
  for (const auto& [neg, name] : order)
    std::fprintf(stderr, "PDL plain %d programmatic %d %s\n", -neg, by_name[name].second,
                 name.c_str());
}

// The single plain kernel -> kernel edge into each PDL-aware kernel node becomes programmatic
// from the predecessor's launch-completion port (pdl.h). Nodes with several predecessors (a side
// stream's join) keep their edges: one programmatic edge would release the node before the
// others' kernels are known to have started. Returns how many edges changed.
size_t make_pdl_edges(cudaGraph_t graph) {
  size_t count = 0;
  LOOM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  LOOM_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  size_t made = 0;
  const bool report = pdl_report_on();
  std::vector<std::pair<std::string, bool>> kernels;  // names, only for report_plain_kernels
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    LOOM_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams params{};
    // Library kernels launched through the driver API may not report a runtime function.
    if (cudaGraphKernelNodeGetParams(node, &params) != cudaSuccess) {
      (void)cudaGetLastError();
      if (report) kernels.emplace_back("(library kernel)", false);
      continue;
    }
    if (report) {
      const char* name = nullptr;
      if (cudaFuncGetName(&name, params.func) != cudaSuccess || name == nullptr) {
        (void)cudaGetLastError();
        name = "(unnamed)";
      }
      kernels.emplace_back(name, false);
    }
    if (!is_pdl_kernel(params.func)) continue;
    size_t deps = 0;
    LOOM_CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &deps));
    if (deps != 1) continue;
    cudaGraphNode_t from = nullptr;
    cudaGraphEdgeData edge{};
    LOOM_CUDA_CHECK(cudaGraphNodeGetDependencies(node, &from, &edge, &deps));
    cudaGraphNodeType from_type;
    LOOM_CUDA_CHECK(cudaGraphNodeGetType(from, &from_type));
    if (from_type != cudaGraphNodeTypeKernel || edge.type != cudaGraphDependencyTypeDefault ||
        edge.from_port != cudaGraphKernelNodePortDefault) {
      continue;
    }
    cudaGraphEdgeData programmatic{};
    programmatic.from_port = cudaGraphKernelNodePortLaunchCompletion;
    programmatic.type = cudaGraphDependencyTypeProgrammatic;
    // A driver that refuses the edge leaves the plain one: slower, never wrong.
    if (cudaGraphRemoveDependencies(graph, &from, &node, &edge, 1) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (cudaGraphAddDependencies(graph, &from, &node, &programmatic, 1) != cudaSuccess) {
      (void)cudaGetLastError();
      LOOM_CUDA_CHECK(cudaGraphAddDependencies(graph, &from, &node, &edge, 1));
      continue;
    }
    if (report) kernels.back().second = true;
    ++made;
  }
  if (report) report_plain_kernels(kernels);
  return made;
}

}  // namespace

absl::StatusOr<CapturedGraph> capture(cudaStream_t stream, absl::FunctionRef<void()> enqueue) {
  LOOM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (end != cudaSuccess) {
    (void)cudaGetLastError();  // the capture's error is not sticky: clear it for later checks
    if (graph != nullptr) cudaGraphDestroy(graph);
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA graph capture failed: ", cudaGetErrorString(end)));
  }
  CapturedGraph out;
  if (pdl_enabled()) out.programmatic_edges = make_pdl_edges(graph);
  LOOM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &out.nodes));
  const cudaError_t inst = cudaGraphInstantiate(&out.exec, graph, 0);
  cudaGraphDestroy(graph);  // the instance keeps what it needs
  if (inst != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA graph instantiation failed: ", cudaGetErrorString(inst)));
  }
  return out;
}

void replay(cudaGraphExec_t exec, cudaStream_t stream) {
  LOOM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
}

void destroy(cudaGraphExec_t exec) {
  if (exec != nullptr) LOOM_CUDA_CHECK(cudaGraphExecDestroy(exec));
}

}  // namespace loom::cuda
