#include "kvattn/ops/bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <thread>
#include <vector>

#include "kvattn/core/buffer.h"
#include "kvattn/core/error.h"

namespace kvattn::ops::bench {

TimingStats time_kernel(const std::function<void()>& run, const std::function<void()>& sync, int warmup,
                        int min_iters, double min_seconds, int max_iters) {
  using clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) {
    run();
    if (sync) sync();
  }
  std::vector<double> t;
  const auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  const double cpu0 = cpu_now();
  const auto start = clock::now();
  while (static_cast<int>(t.size()) < max_iters &&
         (static_cast<int>(t.size()) < min_iters ||
          std::chrono::duration<double>(clock::now() - start).count() < min_seconds)) {
    const auto t0 = clock::now();
    run();
    if (sync) sync();
    t.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  TimingStats s;
  s.iters = static_cast<int>(t.size());
  s.cpu_mean_s = (cpu_now() - cpu0) / static_cast<double>(t.size());
  std::vector<double> sorted = t;
  std::sort(sorted.begin(), sorted.end());
  s.median_s = sorted[sorted.size() / 2];
  s.min_s = sorted.front();
  double sum = 0;
  for (double x : t) sum += x;
  s.mean_s = sum / static_cast<double>(t.size());
  return s;
}

double measure_cpu_copy_bandwidth(int64_t bytes, int threads) {
  KVATTN_CHECK(bytes > 0 && threads >= 1, "measure_cpu_copy_bandwidth: bytes = {} and threads = {} must be positive",
               bytes, threads);
  auto src = Buffer::allocate(static_cast<size_t>(bytes));
  auto dst = Buffer::allocate(static_cast<size_t>(bytes));
  const int64_t slice = (bytes / threads + 63) / 64 * 64;
  const auto copy_part = [&](int i, bool init) {
    const int64_t b = std::min(bytes, i * slice), e = std::min(bytes, b + slice);
    char* s = static_cast<char*>(src->data()) + b;
    char* d = static_cast<char*>(dst->data()) + b;
    if (init) {  // touch the pages from the thread that will copy them
      std::memset(s, 0x5a, static_cast<size_t>(e - b));
      std::memset(d, 0, static_cast<size_t>(e - b));
    } else {
      std::memcpy(d, s, static_cast<size_t>(e - b));
    }
  };
  const auto run_all = [&](bool init) {
    std::vector<std::thread> ts;
    for (int i = 1; i < threads; ++i) ts.emplace_back(copy_part, i, init);
    copy_part(0, init);
    for (auto& t : ts) t.join();
  };
  run_all(true);
  const TimingStats st = time_kernel([&] { run_all(false); }, {}, 1, 5, 0.3);
  return 2.0 * static_cast<double>(bytes) / st.median_s;
}

}  // namespace kvattn::ops::bench
