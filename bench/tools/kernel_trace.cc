// libloom_kernel_trace.so: a per-kernel device-time table for any CUDA program, for machines that
// have CUPTI but no Nsight Systems (the lent H200s). Preload it:
//
//   LOOM_KERNEL_TRACE=trace.md LD_PRELOAD=build-cuda/lib/libloom_kernel_trace.so prog args...
//
// CUPTI's activity API records every kernel's start and end on the device at full speed (no
// serialisation, unlike ncu), graph replays included. At exit the table groups kernels by name,
// separately for kernels launched from CUDA graphs (a decode step's replay) and launched eagerly,
// and reports for each group the device-busy time against the span from its first kernel's start
// to its last kernel's end, so idle gaps between steps show. LOOM_KERNEL_TRACE_ROWS (default 40)
// bounds the rows per group.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

struct KernelRecord {
  uint64_t start = 0, end = 0;
  bool in_graph = false;
  std::string name;
};

std::mutex g_mu;
std::vector<KernelRecord>* g_records = nullptr;  // leaked on purpose: read in the destructor
bool g_enabled = false;
int64_t g_buffers = 0;  // buffers handed back by CUPTI
size_t g_dropped = 0;   // records CUPTI dropped for want of buffer space
void flush_at_exit();

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // Registered once CUDA is initialised, after the runtime's own exit handler, so it runs
  // before the runtime tears the context down (exit handlers run in reverse order).
  static const bool registered = std::atexit(flush_at_exit) == 0;
  (void)registered;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? d : name;
  std::free(d);
  // Template arguments make names unreadable in a table; the call's arguments carry nothing.
  if (const size_t p = out.find('('); p != std::string::npos) out.resize(p);
  if (out.size() > 110) out = out.substr(0, 107) + "...";
  return out;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t* buffer, size_t,
                               size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<KernelRecord> batch;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    batch.push_back({k->start, k->end, k->graphId != 0, demangle(k->name)});
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped);
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  g_records->insert(g_records->end(), batch.begin(), batch.end());
  g_buffers += 1;
  g_dropped += dropped;
}

struct Group {
  int64_t count = 0;
  uint64_t total = 0, max = 0;
};

void write_table(FILE* f, const std::vector<KernelRecord>& all, bool in_graph, size_t rows) {
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  std::map<std::string, Group> groups;
  for (const KernelRecord& r : all) {
    if (r.in_graph != in_graph || r.end < r.start) continue;
    spans.emplace_back(r.start, r.end);
    Group& g = groups[r.name];
    g.count += 1;
    g.total += r.end - r.start;
    g.max = std::max<uint64_t>(g.max, r.end - r.start);
  }
  if (spans.empty()) {
    std::fprintf(f, "\n## %s kernels: none\n", in_graph ? "graph" : "eager");
    return;
  }
  std::sort(spans.begin(), spans.end());
  uint64_t busy = 0, cur_s = spans[0].first, cur_e = spans[0].second;
  for (const auto& [s, e] : spans) {
    if (s > cur_e) {
      busy += cur_e - cur_s;
      cur_s = s;
      cur_e = e;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  busy += cur_e - cur_s;
  uint64_t sum = 0;
  for (const auto& [name, g] : groups) sum += g.total;
  const double span_ms = static_cast<double>(spans.back().second - spans.front().first) / 1e6;
  std::fprintf(f,
               "\n## %s kernels: %zu launches, %.3f ms of kernel time, device busy %.3f ms of a "
               "%.3f ms span (%.1f%%)\n\n",
               in_graph ? "graph" : "eager", spans.size(), static_cast<double>(sum) / 1e6,
               static_cast<double>(busy) / 1e6, span_ms,
               span_ms > 0 ? 100.0 * static_cast<double>(busy) / 1e6 / span_ms : 0.0);
  std::vector<std::pair<std::string, Group>> sorted(groups.begin(), groups.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.total > b.second.total; });
  std::fprintf(
      f,
      "| kernel | launches | total ms | share | mean us | max us |\n|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < sorted.size() && i < rows; ++i) {
    const Group& g = sorted[i].second;
    std::fprintf(f, "| `%s` | %" PRId64 " | %.3f | %.1f%% | %.2f | %.2f |\n",
                 sorted[i].first.c_str(), g.count, static_cast<double>(g.total) / 1e6,
                 100.0 * static_cast<double>(g.total) / static_cast<double>(sum),
                 static_cast<double>(g.total) / 1e3 / static_cast<double>(g.count),
                 static_cast<double>(g.max) / 1e3);
  }
  if (sorted.size() > rows) std::fprintf(f, "| (%zu more) | | | | | |\n", sorted.size() - rows);
}

// The CUDA runtime tears its context down in an exit handler that runs before this library's
// destructor; records still buffered then are flushed here, while the context lives.
void CUPTIAPI on_resource(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void*) {
  if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING)
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

__attribute__((constructor)) void trace_start() {
  g_records = new std::vector<KernelRecord>();
  CUpti_SubscriberHandle subscriber;
  if (cuptiSubscribe(&subscriber, reinterpret_cast<CUpti_CallbackFunc>(on_resource), nullptr) !=
          CUPTI_SUCCESS ||
      cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                          CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) != CUPTI_SUCCESS ||
      cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "loom_kernel_trace: CUPTI refused the kernel activity; no trace\n");
    return;
  }
  // Buffers also come back every 200 ms, so a program killed before its exit handlers loses at
  // most the last fraction of a second.
  cuptiActivityFlushPeriod(200);
  g_enabled = true;
}

bool g_written = false;

void write_report() {
  if (!g_enabled || g_written) return;
  g_written = true;
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("LOOM_KERNEL_TRACE");
  const char* rows_env = std::getenv("LOOM_KERNEL_TRACE_ROWS");
  const size_t rows = rows_env != nullptr ? std::strtoul(rows_env, nullptr, 10) : 40;
  FILE* f = path != nullptr ? std::fopen(path, "w") : stderr;
  if (f == nullptr) f = stderr;
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(f,
               "# Kernel trace (CUPTI activity, device timestamps)\n\n%zu kernel records from %lld "
               "buffers, %zu dropped\n",
               g_records->size(), static_cast<long long>(g_buffers), g_dropped);
  write_table(f, *g_records, /*in_graph=*/true, rows);
  write_table(f, *g_records, /*in_graph=*/false, rows);
  if (f != stderr) std::fclose(f);
}

void flush_at_exit() { write_report(); }

__attribute__((destructor)) void trace_finish() { write_report(); }

}  // namespace
