// CPU forward throughput: prefill and decode tokens/s of a checkpoint on N threads.
// Usage: bench_cpu [--model DIR] [--threads N] [--prompt-tokens P] [--decode-steps D] [--batch B]
// Prints one Markdown table row per configuration (see bench/results/cpu-tiny.md).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <string>

#include "base/thread_pool.h"
#include "model/deepseek_v4.h"
#include "ops/ops.h"

using namespace v4;

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// CPU seconds used by the whole process (all threads): stable on a shared, loaded machine.
static double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

int main(int argc, char** argv) {
  std::string dir = std::string(V4_SOURCE_DIR) + "/models/default";
  int threads = 2, prompt_tokens = 512, decode_steps = 64, batch = 1, reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model")
      dir = argv[i + 1];
    else if (a == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (a == "--prompt-tokens")
      prompt_tokens = std::atoi(argv[i + 1]);
    else if (a == "--decode-steps")
      decode_steps = std::atoi(argv[i + 1]);
    else if (a == "--batch")
      batch = std::atoi(argv[i + 1]);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
  }
  ThreadPool pool(threads);
  auto ops = ops::make_cpu_ops(&pool);
  auto m = model::DeepseekV4::load(dir, ops.get());
  if (!m.ok()) {
    std::fprintf(stderr, "error: %s\n", m.status().message().c_str());
    return 1;
  }
  auto& model = **m;
  const int64_t V = model.config().vocab_size;
  auto kv = model.make_cache(int64_t(256) << 20, batch);
  if (!kv.ok()) {
    std::fprintf(stderr, "error: %s\n", kv.status().message().c_str());
    return 1;
  }
  std::mt19937 g(1);
  std::uniform_int_distribution<int32_t> d(0, int32_t(V) - 1);
  double best_prefill = 1e30, best_decode = 1e30, best_prefill_cpu = 1e30, best_decode_cpu = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<int32_t> seqs;
    model::ForwardBatch pb;
    for (int b = 0; b < batch; ++b) {
      auto s = (*kv)->create_sequence();
      if (!s.ok()) return 1;
      seqs.push_back(*s);
      std::vector<int32_t> p(prompt_tokens);
      for (auto& x : p) x = d(g);
      pb.slices.push_back({*s, 0, p, false});
    }
    double t0 = now_s(), c0 = cpu_s();
    auto out = model.forward(pb, **kv);
    if (!out.ok()) {
      std::fprintf(stderr, "error: %s\n", out.status().message().c_str());
      return 1;
    }
    best_prefill = std::min(best_prefill, now_s() - t0);
    best_prefill_cpu = std::min(best_prefill_cpu, cpu_s() - c0);
    t0 = now_s();
    c0 = cpu_s();
    for (int step = 0; step < decode_steps; ++step) {
      model::ForwardBatch db;
      for (int b = 0; b < batch; ++b)
        db.slices.push_back({seqs[b], prompt_tokens + step, {d(g)}, false});
      auto o = model.forward(db, **kv);
      if (!o.ok()) return 1;
    }
    best_decode = std::min(best_decode, now_s() - t0);
    best_decode_cpu = std::min(best_decode_cpu, cpu_s() - c0);
    for (auto s : seqs) (*kv)->free_sequence(s);
  }
  // Columns: model | threads | batch | prompt tokens | prefill tok/s (wall) | decode tok/s (wall)
  // | decode ms/step (wall) | prefill tok/CPU-s | decode tok/CPU-s
  std::printf("| %s | %d | %d | %d | %.0f | %.1f | %.2f | %.0f | %.1f |\n",
              dir.substr(dir.find_last_of('/') + 1).c_str(), threads, batch, prompt_tokens,
              batch * prompt_tokens / best_prefill, batch * decode_steps / best_decode,
              1e3 * best_decode / decode_steps, batch * prompt_tokens / best_prefill_cpu,
              batch * decode_steps / best_decode_cpu);
  return 0;
}
