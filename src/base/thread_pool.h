// A fixed pool of worker threads for data-parallel loops on the CPU backend.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace v4 {

/// Fixed-size worker pool. `parallel_for` splits [0, n) into contiguous chunks, runs them on the
/// workers plus the calling thread, and returns when all are done. Not reentrant: a body must not
/// call parallel_for on the same pool (nested calls run serially on the caller).
class ThreadPool {
 public:
  /// Most threads a pool starts (larger requests are capped; the CLI's --threads has the same
  /// bound).
  static constexpr int kMaxThreads = 4096;
  /// `n_threads` total including the caller; 0 = hardware concurrency; capped at kMaxThreads,
  /// and at what the OS grants (a refused thread ends the start-up with a one-line message).
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  /// Calls body(begin, end) over disjoint chunks covering [0, n); chunk >= min_chunk items.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body,
                    int64_t min_chunk = 1);
  /// The process-wide pool (size from V4_NUM_THREADS or hardware concurrency).
  static ThreadPool& global();

 private:
  void worker_loop(int index);
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
  int64_t next_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  bool busy_ = false;
};

}  // namespace v4
