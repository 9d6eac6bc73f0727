// CPU speed of the whole DeepSeek-V4 forward (src/model, CPU ops) on one checkpoint:
//   prefill: one forward over a P-token prompt (logits of the last position only), tokens/s;
//   decode:  B sequences, each prefilled with the same P-token prompt, then N greedy steps with B
//            decode rows per forward (one ragged ForwardBatch per step), generated tokens/s.
// Threads: the process-wide pool (V4_NUM_THREADS, else all cores).
// Reported per phase: best-of-reps wall time (tokens/s) and the process CPU time of that run
// (CPU-ms per token, all threads summed), which is less sensitive to other load on the machine.
//
//   bench_cpu_model --model models/default [--prompt-len 512] [--decode 64] [--batch 1,8] [--reps 3]
//
// The prompt is the held-out text's token ids (tests/data/model/heldout_ids.json), repeated, each
// id taken modulo the model's vocabulary (speed does not depend on the ids).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "model/deepseek_v4.h"
#include "ops/ops.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "error: %s\n", m.c_str());
  std::exit(1);
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string it;
  while (std::getline(ss, it, ',')) v.push_back(std::stoi(it));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace v4;
  std::string model_dir = std::string(V4_SOURCE_DIR) + "/models/default";
  int prompt_len = 512, n_decode = 64, reps = 3;
  std::vector<int> batches{1, 8};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value for " + a);
      return argv[++i];
    };
    if (a == "--model") model_dir = next();
    else if (a == "--prompt-len") prompt_len = std::stoi(next());
    else if (a == "--decode") n_decode = std::stoi(next());
    else if (a == "--batch") batches = parse_list(next());
    else if (a == "--reps") reps = std::stoi(next());
    else die("unknown argument " + a);
  }

  auto ops = ops::make_cpu_ops();
  auto mr = model::DeepseekV4::load(model_dir, ops.get());
  if (!mr.ok()) die(mr.status().to_string());
  auto& m = *mr.value();
  const int64_t V = m.config().vocab_size;

  std::ifstream f(std::string(V4_SOURCE_DIR) + "/tests/data/model/heldout_ids.json");
  const auto j = nlohmann::json::parse(f);
  std::vector<int32_t> src;
  for (const auto& x : j.at("input_ids")) src.push_back(x.get<int32_t>());
  std::vector<int32_t> prompt;
  for (int i = 0; i < prompt_len; ++i) prompt.push_back(int32_t(src[size_t(i) % src.size()] % V));

  const int max_b = *std::max_element(batches.begin(), batches.end());
  const int64_t budget = int64_t(512) << 20;
  std::printf("model %s: hidden %d, layers %d, vocab %lld, routed experts %d; threads %d\n",
              model_dir.c_str(), m.config().hidden_size, m.config().num_hidden_layers, (long long)V,
              m.config().n_routed_experts, ThreadPool::global().size());

  // Prefill: best of `reps` (fresh cache each time; the first run also warms up).
  double best_prefill = 1e30, best_prefill_cpu = 0;
  for (int r = 0; r < reps + 1; ++r) {
    auto kv = m.make_cache(budget, 1);
    if (!kv.ok()) die(kv.status().to_string());
    auto seq = (*kv)->create_sequence();
    if (!seq.ok()) die(seq.status().to_string());
    model::ForwardBatch b;
    b.slices.push_back({*seq, 0, prompt, false});
    const double t0 = now_s(), c0 = cpu_s();
    auto out = m.forward(b, **kv);
    const double dt = now_s() - t0, dc = cpu_s() - c0;
    if (!out.ok()) die(out.status().to_string());
    if (r > 0 && dt < best_prefill) best_prefill = dt, best_prefill_cpu = dc;
  }
  std::printf("prefill %d tokens: %.4f s, %.1f tok/s, %.3f CPU-ms/token (best of %d)\n", prompt_len,
              best_prefill, prompt_len / best_prefill, 1e3 * best_prefill_cpu / prompt_len, reps);

  for (int B : batches) {
    double best = 1e30, best_cpu = 0;
    for (int r = 0; r < reps; ++r) {
      auto kv = m.make_cache(budget, std::max(max_b, 1));
      if (!kv.ok()) die(kv.status().to_string());
      std::vector<int32_t> seqs;
      std::vector<int32_t> last(B);
      for (int s = 0; s < B; ++s) {
        auto seq = (*kv)->create_sequence();
        if (!seq.ok()) die(seq.status().to_string());
        seqs.push_back(*seq);
        model::ForwardBatch b;
        b.slices.push_back({*seq, 0, prompt, false});
        auto out = m.forward(b, **kv);
        if (!out.ok()) die(out.status().to_string());
        last[s] = int32_t(std::max_element(out->logits.begin(), out->logits.end()) - out->logits.begin());
      }
      const double t0 = now_s(), c0 = cpu_s();
      for (int step = 0; step < n_decode; ++step) {
        model::ForwardBatch d;
        for (int s = 0; s < B; ++s) d.slices.push_back({seqs[s], int64_t(prompt_len + step), {last[s]}, false});
        auto out = m.forward(d, **kv);
        if (!out.ok()) die(out.status().to_string());
        for (int s = 0; s < B; ++s) {
          const float* row = out->logits.data() + out->row_begin[s] * V;
          last[s] = int32_t(std::max_element(row, row + V) - row);
        }
      }
      const double dt = now_s() - t0, dc = cpu_s() - c0;
      if (dt < best) best = dt, best_cpu = dc;
    }
    std::printf("decode batch %d: %d steps after a %d-token prompt: %.4f s, %.1f tok/s (%.2f ms/step), "
                "%.3f CPU-ms/token (best of %d)\n",
                B, n_decode, prompt_len, best, B * n_decode / best, 1e3 * best / n_decode,
                1e3 * best_cpu / (B * n_decode), reps);
  }
  return 0;
}
