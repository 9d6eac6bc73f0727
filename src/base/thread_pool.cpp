#include "base/thread_pool.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <system_error>

namespace v4 {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  n_threads = std::min(n_threads, kMaxThreads);
  for (int i = 1; i < n_threads; ++i) {
    try {
      workers_.emplace_back([this, i] { worker_loop(i); });
    } catch (const std::system_error& e) {  // the OS refused more threads: run with fewer
      std::fprintf(stderr, "v4serve: thread pool: %zu of %d threads started (%s)\n",
                   workers_.size() + 1, n_threads, e.what());
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    // V4_NUM_THREADS: an integer in [1, kMaxThreads]; anything else is reported and ignored.
    const char* env = std::getenv("V4_NUM_THREADS");
    if (!env || !*env) return 0;
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(env, &end, 10);
    if (errno || *end || v < 1 || v > kMaxThreads) {
      std::fprintf(stderr,
                   "v4serve: V4_NUM_THREADS='%s' ignored (an integer in [1, %d]); using all "
                   "cores\n",
                   env, kMaxThreads);
      return 0;
    }
    return int(v);
  }());
  return pool;
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    for (;;) {
      int64_t b = next_;
      if (b >= n_) break;
      next_ = std::min(n_, b + chunk_);
      int64_t e = next_;
      auto* body = body_;
      lk.unlock();
      (*body)(b, e);
      lk.lock();
    }
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body,
                              int64_t min_chunk) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  int64_t max_chunks = (n + min_chunk - 1) / min_chunk;
  std::unique_lock<std::mutex> lk(mu_);
  if (workers_.empty() || max_chunks <= 1 || busy_) {
    lk.unlock();
    body(0, n);
    return;
  }
  busy_ = true;
  int64_t parts = std::min<int64_t>(max_chunks, int64_t(size()) * 4);
  chunk_ = (n + parts - 1) / parts;
  n_ = n;
  next_ = 0;
  body_ = &body;
  pending_ = int(workers_.size());
  ++generation_;
  cv_.notify_all();
  for (;;) {
    int64_t b = next_;
    if (b >= n_) break;
    next_ = std::min(n_, b + chunk_);
    int64_t e = next_;
    lk.unlock();
    body(b, e);
    lk.lock();
  }
  done_cv_.wait(lk, [&] { return pending_ == 0; });
  body_ = nullptr;
  busy_ = false;
}

}  // namespace v4
