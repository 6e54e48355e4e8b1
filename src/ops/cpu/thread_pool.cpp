#include "ops/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>

#include "kvattn/core/error.h"

namespace kvattn::ops::cpu {
namespace {
thread_local bool t_in_pool = false;
}

ThreadPool& ThreadPool::instance() {
  static ThreadPool pool;
  return pool;
}

ThreadPool::ThreadPool() { start(static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))); }
ThreadPool::~ThreadPool() { stop(); }

void ThreadPool::start(int n) {
  num_threads_ = n;
  quit_ = false;
  for (int i = 1; i < n; ++i) workers_.emplace_back([this] { worker_loop(); });
}

void ThreadPool::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    quit_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void ThreadPool::set_num_threads(int n) {
  KVATTN_CHECK(n >= 1 && n <= 1024, "set_cpu_num_threads: n = {} must be in [1, 1024]", n);
  std::lock_guard<std::mutex> call(call_mu_);
  if (n == num_threads_) return;
  stop();
  start(n);
}

void ThreadPool::run_chunks() {
  for (;;) {
    const int64_t b = next_.fetch_add(grain_);
    if (b >= n_) return;
    const int64_t e = std::min(n_, b + grain_);
    try {
      (*fn_)(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
      next_.store(n_);
    }
  }
}

void ThreadPool::worker_loop() {
  t_in_pool = true;
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return quit_ || generation_ != seen; });
      if (quit_) return;
      seen = generation_;
    }
    run_chunks();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--active_ == 0) cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (t_in_pool || num_threads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    n_ = n;
    grain_ = grain;
    next_.store(0);
    error_ = nullptr;
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  cv_work_.notify_all();
  const bool was = t_in_pool;
  t_in_pool = true;
  run_chunks();
  t_in_pool = was;
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [&] { return active_ == 0; });
    fn_ = nullptr;
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace kvattn::ops::cpu
