// Prefix-cache benchmark (CPU): TTFT of a request sharing a long prefix with an earlier one vs a
// cold request, throughput of a shared-prefix workload with the cache on vs off, and the cost of
// the ShadowRadix index itself (match + admit + finish per request on a large tree).
//
// "Cache on" is the real binding (PrefixCache: ShadowRadix + KvCache, two tiers): the hit's
// compressed entries, SWA window and compressor snapshot are copied from the tree's store into
// the new sequence, and every step writes its new state back. The shared-page binding (no copy)
// is pending a KvCache hook, see docs/cache.md.
//
// Usage: bench_prefix [--model DIR] [--prefix N] [--suffix N] [--gen N] [--requests N]
// Prints a Markdown report (paste into bench/results/).
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "cache/radix_kv.h"
#include "cache/shadow_radix.h"
#include "model/deepseek_v4.h"
#include "ops/ops.h"

using namespace v4;
using Clock = std::chrono::steady_clock;

namespace {
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Bench {
  std::unique_ptr<ops::Ops> ops;
  std::unique_ptr<model::DeepseekV4> model;
  std::unique_ptr<cache::KvCache> kv;
  int64_t V = 0;

  std::vector<float> forward(int32_t seq, const std::vector<int32_t>& t, int64_t from, int64_t to,
                             int64_t chunk) {
    std::vector<float> last;
    for (int64_t p = from; p < to; p += chunk) {
      const int64_t e = std::min(to, p + chunk);
      model::ForwardBatch b;
      b.slices.push_back({seq, p, std::vector<int32_t>(t.begin() + p, t.begin() + e), false});
      auto out = model->forward(b, *kv);
      if (!out.ok()) {
        fmt::print(stderr, "forward: {}\n", out.status().to_string());
        std::exit(1);
      }
      last = std::move(out->logits);
    }
    return last;
  }
  int64_t decode(int32_t seq, int64_t pos, std::vector<float> last, int n) {
    for (int i = 0; i < n; ++i) {
      const int32_t next = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
      model::ForwardBatch b;
      b.slices.push_back({seq, pos++, {next}, false});
      last = std::move(model->forward(b, *kv)->logits);
    }
    return pos;
  }
};

std::vector<int32_t> rand_tokens(std::mt19937& g, int64_t n, int64_t vocab) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = int32_t(g() % uint64_t(vocab));
  return v;
}
}  // namespace

int main(int argc, char** argv) {
  std::string dir = std::string(V4_SOURCE_DIR) + "/models/default";
  if (!std::filesystem::exists(dir + "/config.json"))
    dir = std::string(V4_SOURCE_DIR) + "/tests/fixtures/tiny-real-rates";
  int64_t prefix = 2048, suffix = 64, chunk = 512;
  int gen = 16, requests = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") dir = argv[i + 1];
    else if (a == "--prefix") prefix = std::stoll(argv[i + 1]);
    else if (a == "--suffix") suffix = std::stoll(argv[i + 1]);
    else if (a == "--gen") gen = std::stoi(argv[i + 1]);
    else if (a == "--requests") requests = std::stoi(argv[i + 1]);
    else if (a == "--chunk") chunk = std::stoll(argv[i + 1]);
  }
  Bench b;
  b.ops = ops::make_cpu_ops();
  auto m = model::DeepseekV4::load(dir, b.ops.get());
  if (!m.ok()) {
    fmt::print(stderr, "{}\n", m.status().to_string());
    return 1;
  }
  b.model = std::move(m).value();
  b.V = b.model->config().vocab_size;
  b.kv = std::move(b.model->make_cache(int64_t(1) << 30, 8).value());
  std::mt19937 g(1);
  const auto shared = rand_tokens(g, prefix, b.V);

  fmt::print("## Prefix cache, CPU\n\nmodel `{}`, shared prefix {} tokens, suffix {}, {} generated, "
             "prefill chunk {}\n\n",
             std::filesystem::path(dir).filename().string(), prefix, suffix, gen, chunk);

  // ---- TTFT: cold vs hit ------------------------------------------------------------------
  auto prompt = shared;
  auto sfx = rand_tokens(g, suffix, b.V);
  prompt.insert(prompt.end(), sfx.begin(), sfx.end());
  const int64_t T = int64_t(prompt.size());
  double cold_ms = 1e30, hit_ms = 1e30, copy_ms = 1e30;
  auto pcfg = cache::PrefixCache::config_for_budget(*b.kv, int64_t(256) << 20);
  if (!pcfg.ok()) {
    fmt::print(stderr, "{}\n", pcfg.status().to_string());
    return 1;
  }
  auto pc = std::move(cache::PrefixCache::create(*b.kv, *pcfg).value());
  // Cache-on request driver: chunks end at snapshot points, write-back after each step.
  auto run_cached = [&](const std::vector<int32_t>& p, int n_gen, double* admit_ms) {
    auto t0 = Clock::now();
    auto h = pc->admit(*b.kv, p);
    if (!h.ok()) std::exit(1);
    if (admit_ms) *admit_ms = ms_since(t0);
    int64_t pos = h->cached_tokens;
    std::vector<float> last;
    while (pos < int64_t(p.size())) {
      int64_t n = std::min<int64_t>(chunk, int64_t(p.size()) - pos);
      for (int64_t q : h->snapshot_points)
        if (q > pos && q < pos + n) n = q - pos;
      last = b.forward(h->kv_seq, p, pos, pos + n, n);
      (void)pc->on_step(*b.kv, h->kv_seq, std::span<const int32_t>(p.data() + pos, size_t(n)));
      pos += n;
    }
    for (int i = 0; i < n_gen; ++i) {
      const int32_t next = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
      model::ForwardBatch fb;
      fb.slices.push_back({h->kv_seq, pos++, {next}, false});
      last = std::move(b.model->forward(fb, *b.kv)->logits);
      (void)pc->on_step(*b.kv, h->kv_seq, std::span<const int32_t>(&next, 1));
    }
    (void)pc->finish(*b.kv, h->kv_seq, true);
    return last;
  };
  std::vector<float> cold_last, hit_last;
  {  // The earlier request that shares the prefix (and leaves a boundary at its prompt end).
    auto first = shared;
    auto other = rand_tokens(g, suffix, b.V);
    first.insert(first.end(), other.begin(), other.end());
    run_cached(first, 1, nullptr);
    // A second one branches at the end of the shared prefix: that point becomes a boundary.
    auto second = shared;
    auto other2 = rand_tokens(g, suffix, b.V);
    second.insert(second.end(), other2.begin(), other2.end());
    run_cached(second, 1, nullptr);
  }
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    auto s = *b.kv->create_sequence();
    cold_last = b.forward(s, prompt, 0, T, chunk);
    cold_ms = std::min(cold_ms, ms_since(t0));
    b.kv->free_sequence(s);

    t0 = Clock::now();
    double adm = 0;
    hit_last = run_cached(prompt, 0, &adm);
    copy_ms = std::min(copy_ms, adm);
    hit_ms = std::min(hit_ms, ms_since(t0));
  }
  const bool same = cold_last.size() == hit_last.size() &&
                    std::memcmp(cold_last.data(), hit_last.data(),
                                cold_last.size() * sizeof(float)) == 0;
  fmt::print("| TTFT ({} prompt tokens) | ms |\n|---|---|\n| cold prefill | {:.1f} |\n"
             "| hit at {} (admit incl. copy {:.2f} ms + {} new tokens) | {:.1f} |\n"
             "| speed-up | {:.1f}x |\n| last-position logits bit-identical | {} |\n\n",
             T, cold_ms, prefix, copy_ms, T - prefix, hit_ms, cold_ms / hit_ms,
             same ? "yes" : "NO");
  fmt::print("{}\n\n", pc->explain());

  // ---- throughput: N requests = shared prefix + own suffix + gen tokens --------------------
  std::vector<std::vector<int32_t>> prompts;
  for (int r = 0; r < requests; ++r) {
    auto p = shared;
    auto s = rand_tokens(g, suffix, b.V);
    p.insert(p.end(), s.begin(), s.end());
    prompts.push_back(std::move(p));
  }
  int64_t tokens = 0;
  auto t0 = Clock::now();
  for (const auto& p : prompts) {
    auto s = *b.kv->create_sequence();
    auto last = b.forward(s, p, 0, int64_t(p.size()), chunk);
    b.decode(s, int64_t(p.size()), last, gen);
    tokens += int64_t(p.size()) + gen;
    b.kv->free_sequence(s);
  }
  const double off_ms = ms_since(t0);
  t0 = Clock::now();
  for (const auto& p : prompts) run_cached(p, gen, nullptr);
  const double on_ms = ms_since(t0);
  fmt::print("| shared-prefix workload ({} requests, one at a time) | wall ms | tokens/s |\n"
             "|---|---|---|\n| cache off | {:.0f} | {:.0f} |\n| cache on (hit at {}) | {:.0f} | "
             "{:.0f} |\n| hit tokens / prompt tokens (whole run) | {} / {} |\n\n",
             requests, off_ms, double(tokens) / off_ms * 1e3, prefix, on_ms,
             double(tokens) / on_ms * 1e3, pc->radix().stats().hit_tokens,
             pc->radix().stats().query_tokens);

  // ---- the index alone ---------------------------------------------------------------------
  cache::ShadowRadixConfig c;
  c.page_tokens = 256;
  c.swa_page_tokens = 64;
  c.window_tokens = 128;
  c.n_pages = 20000;
  c.n_swa_pages = 20000;
  c.n_snapshots = 4096;
  auto idx = std::move(cache::ShadowRadix::create(c).value());
  std::vector<int32_t> sys = rand_tokens(g, 4000, 50000);
  const int n_req = 2000;
  t0 = Clock::now();
  int64_t hit_tok = 0;
  for (int r = 0; r < n_req; ++r) {
    auto p = sys;
    p.resize(size_t(1000 + (r % 7) * 400));
    auto s = rand_tokens(g, 200, 50000);
    p.insert(p.end(), s.begin(), s.end());
    auto plan = idx->admit(p, int64_t(p.size()) - 1);
    if (!plan.ok()) continue;
    hit_tok += plan->cached_tokens;
    const int32_t id = plan->seq;
    int64_t len = plan->cached_tokens;
    std::vector<int64_t> pts = plan->snapshot_points;
    size_t pi = 0;
    while (len < int64_t(p.size())) {
      int64_t n = std::min<int64_t>(512, int64_t(p.size()) - len);
      while (pi < pts.size() && pts[pi] <= len) ++pi;
      if (pi < pts.size()) n = std::min(n, pts[pi] - len);
      (void)idx->reserve(id, n);
      (void)idx->commit(id, std::span<const int32_t>(p.data() + len, size_t(n)));
      len += n;
      if (pi < pts.size() && pts[pi] == len) (void)idx->begin_snapshot(id);
    }
    (void)idx->begin_snapshot(id);
    (void)idx->finish(id, true);
  }
  const double idx_ms = ms_since(t0);
  auto st = idx->stats();
  fmt::print("| ShadowRadix index only ({} requests of 1.2K-3.8K tokens, shared 4K system prefix) "
             "| value |\n|---|---|\n| per request (admit + reserve/commit per 512 + snapshots + "
             "finish) | {:.1f} us |\n| hit tokens / prompt tokens | {} / {} |\n| tree nodes, "
             "resumable | {}, {} |\n",
             n_req, idx_ms * 1e3 / n_req, hit_tok, st.query_tokens, st.nodes, st.resumable);

  // ---- the index at 1M tokens: one 1,048,576-token sequence, then a 900K-token branch -------
  cache::ShadowRadixConfig big;
  big.page_tokens = 256;
  big.swa_page_tokens = 64;
  big.window_tokens = 128;
  big.n_pages = 2 * 4096 + 64;
  big.n_swa_pages = 2048;
  big.n_snapshots = 64;
  auto bigr = std::move(cache::ShadowRadix::create(big).value());
  auto long_seq = rand_tokens(g, int64_t(1) << 20, 100000);
  auto run_index = [&](const std::vector<int32_t>& p, double* admit_ms, double* steps_ms,
                       double* finish_ms) {
    auto t0 = Clock::now();
    auto plan = bigr->admit(p, int64_t(p.size()) - 1);
    *admit_ms = ms_since(t0);
    t0 = Clock::now();
    int64_t len = plan->cached_tokens;
    size_t pi = 0;
    const auto& pts = plan->snapshot_points;
    while (len < int64_t(p.size())) {
      int64_t n = std::min<int64_t>(8192, int64_t(p.size()) - len);
      while (pi < pts.size() && pts[pi] <= len) ++pi;
      if (pi < pts.size()) n = std::min(n, pts[pi] - len);
      (void)bigr->reserve(plan->seq, n);
      (void)bigr->commit(plan->seq, std::span<const int32_t>(p.data() + len, size_t(n)));
      len += n;
      if (pi < pts.size() && pts[pi] == len) (void)bigr->begin_snapshot(plan->seq);
    }
    (void)bigr->begin_snapshot(plan->seq);
    *steps_ms = ms_since(t0);
    t0 = Clock::now();
    (void)bigr->finish(plan->seq, true);
    *finish_ms = ms_since(t0);
    return plan->cached_tokens;
  };
  double a1, s1, f1, a2, s2, f2, a3, s3, f3;
  run_index(long_seq, &a1, &s1, &f1);
  auto br1 = std::vector<int32_t>(long_seq.begin(), long_seq.begin() + 900000);
  auto br2 = br1;
  for (int i = 0; i < 1000; ++i) br1.push_back(i), br2.push_back(100000 + i);
  run_index(br1, &a2, &s2, &f2);  // recomputes 900K, leaves the branch point
  const int64_t hit = run_index(br2, &a3, &s3, &f3);
  t0 = Clock::now();
  Status inv = bigr->check_invariants();
  const double chk = ms_since(t0);
  fmt::print("\n| ShadowRadix index at 1M tokens (8K-token steps) | admit ms | steps ms | finish ms |\n"
             "|---|---|---|---|\n| 1,048,576 tokens cold | {:.2f} | {:.1f} | {:.1f} |\n"
             "| 901,000 tokens, branch at 900,000 (recomputed, adopted) | {:.2f} | {:.1f} | {:.1f} |\n"
             "| 901,000 tokens, hit at {} | {:.2f} | {:.1f} | {:.1f} |\n"
             "| full invariant check afterwards | {:.1f} ms ({}) | | |\n",
             a1, s1, f1, a2, s2, f2, hit, a3, s3, f3, chk, inv.ok() ? "ok" : inv.message());
  return same ? 0 : 2;
}
