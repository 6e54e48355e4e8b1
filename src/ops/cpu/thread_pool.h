// src/ops/cpu/thread_pool.h — the small persistent thread pool of the CPU ops.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvattn::ops::cpu {

class ThreadPool {
 public:
  // The process-wide pool (hardware_concurrency threads until set_num_threads).
  static ThreadPool& instance();
  ~ThreadPool();

  void set_num_threads(int n);  // n >= 1 (the caller counts as one)
  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over [0, n) in chunks of `grain`, on the workers and the calling
  // thread; returns when every chunk is done and rethrows the first exception.  Calls made
  // from inside a worker (nested parallelism) run serially on that thread.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  ThreadPool();
  void start(int n);
  void stop();
  void worker_loop();
  void run_chunks();

  int num_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one parallel_for at a time
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  uint64_t generation_ = 0;
  bool quit_ = false;
  int active_ = 0;
  // the current job
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
};

}  // namespace kvattn::ops::cpu
