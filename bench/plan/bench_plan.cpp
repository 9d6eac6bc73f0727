// Host-side cost of one prefill chunk's plan against the context it extends (issue 8: a
// 1,000,000-token request must not pay O(context^2) on the host). For contexts 8K .. 1M it
// fast-forwards one sequence to context − chunk in a KvCache with V4-Flash's layer pattern
// (2 SWA, then CSA ratio 4 / HCA ratio 128 alternating; window 128, page 256) but tiny row widths
// (host planning does not depend on them), reserves the chunk and times
//   - model::plan_on_host (what the CUDA backend uploads for a prefill step), and
//   - KvCache::reserve + commit of the chunk.
// Prints a Markdown table: ms per chunk and ns per token of context. Usage:
//   bench_plan [--chunk 8192] [--reps 5]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cache/pools.h"
#include "model/step_plan.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t chunk = 8192;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--chunk") == 0) chunk = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  v4::cache::CacheSpec spec;
  spec.sliding_window = 128;
  for (int l = 0; l < 8; ++l) {
    v4::cache::LayerCacheSpec s;
    const int ratio = l < 2 ? 0 : (l % 2 == 0 ? 4 : 128);
    s.kind = ratio == 0 ? v4::cache::AttnKind::kSliding
             : ratio == 4 ? v4::cache::AttnKind::kCsa : v4::cache::AttnKind::kHca;
    s.ratio = ratio;
    s.kv_dim = 4;
    s.index_dim = ratio == 4 ? 4 : 0;
    spec.layers.push_back(s);
  }
  const int64_t max_ctx = 1 << 20;
  v4::cache::KvCacheOptions opt;
  opt.page_size = 256;
  opt.n_pages = max_ctx / 256 + 8;
  opt.n_swa_pages = (chunk + 128) / 256 + 8;
  opt.max_seqs = 2;
  auto kv = v4::cache::KvCache::create(spec, opt, [](size_t b) { return std::calloc(1, b); },
                                       [](void* p) { std::free(p); });
  if (!kv.ok()) {
    fmt::print(stderr, "KvCache: {}\n", kv.status().to_string());
    return 1;
  }
  v4::model::PlanShape ps;
  ps.window = 128;
  ps.csa_ratio = 4;
  ps.hca_ratio = 128;
  ps.index_topk = 512;
  fmt::print("| context | chunk | plan_on_host ms (median of {}) | ns / context token | CSA candidate rows | "
             "reserve + commit ms |\n|---:|---:|---:|---:|---:|---:|\n", reps);
  for (int64_t ctx : {int64_t(8192), int64_t(32768), int64_t(131072), int64_t(524288), int64_t(921600),
                      max_ctx}) {
    std::vector<double> t_plan, t_res;
    int64_t cand = 0;
    for (int r = 0; r < reps; ++r) {
      auto seq = (*kv)->create_sequence();
      if (!seq.ok()) return 1;
      if (auto st = (*kv)->fast_forward(*seq, ctx - chunk); !st.ok()) {
        fmt::print(stderr, "fast_forward: {}\n", st.to_string());
        return 1;
      }
      double t0 = now_s();
      if (auto st = (*kv)->reserve(*seq, ctx); !st.ok()) {
        fmt::print(stderr, "reserve: {}\n", st.to_string());
        return 1;
      }
      const double t_reserve = now_s() - t0;
      v4::model::ForwardBatch b;
      b.slices.resize(1);
      b.slices[0].seq = *seq;
      b.slices[0].start_pos = ctx - chunk;
      b.slices[0].tokens.assign(size_t(chunk), 7);
      t0 = now_s();
      auto plan = v4::model::plan_on_host(b, **kv, ps);
      t_plan.push_back(now_s() - t0);
      cand = int64_t(plan.csa.cand.rows.size());
      t0 = now_s();
      (*kv)->commit(*seq, ctx);
      t_res.push_back(t_reserve + now_s() - t0);
      (*kv)->free_sequence(*seq);
    }
    std::sort(t_plan.begin(), t_plan.end());
    std::sort(t_res.begin(), t_res.end());
    const double p = t_plan[t_plan.size() / 2];
    fmt::print("| {} | {} | {:.3f} | {:.2f} | {} | {:.3f} |\n", ctx, chunk, p * 1e3, p * 1e9 / double(ctx), cand,
               t_res[t_res.size() / 2] * 1e3);
  }
  return 0;
}
