// scripts/dev/kernel_trace/kernel_trace.cpp — a CUDA_INJECTION64_PATH library for machines without
// Nsight Systems: records every kernel's in-stream start and end (CUPTI activity records, the
// timestamps nsys shows) and prints at exit, per kernel name, the launches, the median duration,
// the median idle gap before it (its start minus the end of the previous kernel in its stream),
// the median start-to-start interval from the previous launch of the same name and the median
// time from submission to start; then the last 12 kernels in stream order.  Output to stderr,
// or appended to KVTRACE_OUT=file.  Build and use: scripts/dev/kernel_trace/build.sh.
#include <cupti.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {
struct Rec {
  uint64_t start, end, submitted;
  uint32_t stream;
  std::string name;
};
std::mutex mu;
std::vector<Rec> recs;

void CUPTIAPI buffer_requested(uint8_t** buf, size_t* size, size_t* max_records) {
  *size = 16u << 20;
  *buf = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
    std::string n = k->name != nullptr ? k->name : "?";
    recs.push_back({k->start, k->end, k->submitted, k->streamId, n});
  }
  std::free(buf);
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void report() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(mu);
  const char* path = std::getenv("KVTRACE_OUT");
  FILE* f = path != nullptr ? std::fopen(path, "a") : stderr;
  if (f == nullptr) f = stderr;
  std::sort(recs.begin(), recs.end(), [](const Rec& a, const Rec& b) { return a.start < b.start; });
  struct Acc {
    std::vector<double> dur, gap, s2s, sub2start;
    int n = 0;
  };
  std::map<std::string, Acc> by;
  std::map<uint32_t, const Rec*> last_in_stream;
  std::map<std::string, const Rec*> last_of_name;
  for (const Rec& r : recs) {
    Acc& a = by[r.name];
    ++a.n;
    a.dur.push_back((r.end - r.start) * 1e-3);
    if (auto it = last_in_stream.find(r.stream); it != last_in_stream.end() && r.start >= it->second->end)
      a.gap.push_back((r.start - it->second->end) * 1e-3);
    if (auto it = last_of_name.find(r.name); it != last_of_name.end()) a.s2s.push_back((r.start - it->second->start) * 1e-3);
    if (r.submitted != 0 && r.start > r.submitted) a.sub2start.push_back((r.start - r.submitted) * 1e-3);
    last_in_stream[r.stream] = &r;
    last_of_name[r.name] = &r;
  }
  std::fprintf(f, "[kernel_trace] %zu kernels\n", recs.size());
  for (auto& [name, a] : by) {
    std::string n = name.size() > 90 ? name.substr(0, 90) : name;
    std::fprintf(f, "[kernel_trace] n %5d  dur %9.2f us  gap-before %7.2f us  start-to-start %9.2f us  submitted-to-start %8.2f us  %s\n",
                 a.n, median(a.dur), median(a.gap), median(a.s2s), median(a.sub2start), n.c_str());
  }
  // the last 12 kernels in full (stream order): what happens between consecutive kernels
  const size_t from = recs.size() > 12 ? recs.size() - 12 : 0;
  for (size_t i = from; i < recs.size(); ++i) {
    const Rec& r = recs[i];
    std::fprintf(f, "[kernel_trace]   start %.2f dur %.2f gap %.2f %s\n", (r.start - recs[from].start) * 1e-3,
                 (r.end - r.start) * 1e-3, i > from ? (double(r.start) - double(recs[i - 1].end)) * 1e-3 : 0.0,
                 r.name.substr(0, 60).c_str());
  }
  if (f != stderr) std::fclose(f);
}
}  // namespace

extern "C" int InitializeInjection(void) {
  cuptiActivityEnableLatencyTimestamps(1);
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  std::atexit(report);
  return 1;
}
