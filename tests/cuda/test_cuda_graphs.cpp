// Decode steps as CUDA graphs (docs/cuda.md §Graphs, docs/model.md §Decode plans and graphs):
// - the plan op's CUDA kernel equals the CPU reference op (exact integers);
// - golden fixtures: greedy decode with graphs equals eager (host planner) token for token with
//   bit-identical logits, and equals the golden tokens;
// - a ragged batch of 5 sequences decoded together through graphs gives each the tokens it gets
//   alone (eager); B=3 runs in bucket 4 (padding) bit-identical to the eager plan-op path;
// - graphs are reused (replay counters), replayed steps allocate nothing and make exactly one
//   upload (raw batch state) and one download (logits);
// - a printed micro-bench: decode step time eager vs graph at B=1 and 64 (not asserted).
// Every failure message names the fixture, step, row and first differing value.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../model/model_test_util.h"
#include "cuda_test_util.h"
#include "model/deepseek_v4.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

namespace v4::model {
namespace {

using testing::first_diff;
using testing::random_ids;

using testing::fixture_dirs;
using testing::load_golden;

// Forwards every op to `inner` and counts the host-visible work (alloc/free/upload/download/sync).
// A replayed graph step goes around the op methods (one launch inside `inner`), so the counters
// show exactly what the host does per replayed step.
class CountingOps final : public ops::Ops {
 public:
  explicit CountingOps(ops::Ops* inner) : in_(inner) {}
  struct Counts {
    int64_t allocs = 0, frees = 0, uploads = 0, downloads = 0, syncs = 0, kernels = 0;
  };
  Counts counts() const { return {allocs, frees, uploads, downloads, syncs, kernels}; }
  int64_t allocs = 0, frees = 0, uploads = 0, downloads = 0, syncs = 0, kernels = 0;

  std::string name() const override { return in_->name(); }
  void* alloc(size_t b) override {
    ++allocs;
    return in_->alloc(b);
  }
  void free(void* p) override {
    ++frees;
    in_->free(p);
  }
  void upload(void* d, const void* s, size_t b) override {
    ++uploads;
    in_->upload(d, s, b);
  }
  void download(void* d, const void* s, size_t b) override {
    ++downloads;
    in_->download(d, s, b);
  }
  void synchronize() override {
    ++syncs;
    in_->synchronize();
  }
  void linear(const float* x, int64_t ldx, const float* w, int64_t M, int64_t N, int64_t K,
              float* y, int64_t ldy) override {
    ++kernels;
    in_->linear(x, ldx, w, M, N, K, y, ldy);
  }
  bool supports(ops::WFormat f) const override { return in_->supports(f); }
  void linear_w(const float* x, int64_t ldx, const ops::WeightView& w, int64_t M, float* y,
                int64_t ldy) override {
    ++kernels;
    in_->linear_w(x, ldx, w, M, y, ldy);
  }
  void add(float* y, const float* x, int64_t n) override {
    ++kernels;
    in_->add(y, x, n);
  }
  void gather_rows(const float* s, const int32_t* r, int64_t n, int64_t w, float* d) override {
    ++kernels;
    in_->gather_rows(s, r, n, w, d);
  }
  void store_rows(float* p, const int32_t* r, int64_t n, int64_t w, const float* s) override {
    ++kernels;
    in_->store_rows(p, r, n, w, s);
  }
  void embed(const float* t, const int32_t* ids, int64_t S, int D, int n, float* o) override {
    ++kernels;
    in_->embed(t, ids, S, D, n, o);
  }
  void rms_norm(const float* x, const float* w, int64_t r, int d, float e, float* y) override {
    ++kernels;
    in_->rms_norm(x, w, r, d, e, y);
  }
  void rope(float* x, int64_t r, int nh, int hd, int rd, const int64_t* p, const float* f, float s,
            bool inv) override {
    ++kernels;
    in_->rope(x, r, nh, hd, rd, p, f, s, inv);
  }
  void hc_pre(const ops::HcArgs& a) override {
    ++kernels;
    in_->hc_pre(a);
  }
  void hc_post(float* h, const float* f, const float* p, const float* c, int64_t S, int n,
               int D) override {
    ++kernels;
    in_->hc_post(h, f, p, c, S, n, D);
  }
  void hc_head(const float* h, const float* fn, const float* b, const float* s, int64_t S, int n,
               int D, float re, float he, float* y) override {
    ++kernels;
    in_->hc_head(h, fn, b, s, S, n, D, re, he, y);
  }
  void compress_pool(const ops::CompressArgs& a) override {
    ++kernels;
    in_->compress_pool(a);
  }
  void compress_fused(const ops::CompressFusedArgs& a) override {
    ++kernels;
    in_->compress_fused(a);
  }
  void indexer_topk(const ops::IndexerArgs& a) override {
    ++kernels;
    in_->indexer_topk(a);
  }
  void sparse_attention(const ops::AttentionArgs& a) override {
    ++kernels;
    in_->sparse_attention(a);
  }
  void route(const ops::RouteArgs& a) override {
    ++kernels;
    in_->route(a);
  }
  void moe_experts(const ops::MoeArgs& a) override {
    ++kernels;
    in_->moe_experts(a);
  }
  void build_decode_plan(const ops::DecodePlanArgs& a) override {
    ++kernels;
    in_->build_decode_plan(a);
  }
  bool supports_graphs() const override { return in_->supports_graphs(); }
  std::unique_ptr<ops::Graph> capture(const std::function<void()>& body) override {
    return in_->capture(body);
  }

 private:
  ops::Ops* in_;
};

struct Mode {
  bool graphs = false;
  bool device_plan = false;
  int64_t min_context = 1024;
  bool count = false;  // wrap the backend in CountingOps
};

struct Backend {
  std::unique_ptr<ops::Ops> cuda;
  std::unique_ptr<CountingOps> counting;
  std::unique_ptr<DeepseekV4> model;
  std::unique_ptr<cache::KvCache> kv;
  CountingOps* counters() { return counting.get(); }
};

Backend load(const std::string& dir, const Mode& m, int max_seqs = 8) {
  Backend b;
  auto o = ops::make_cuda_ops();
  EXPECT_TRUE(o.ok()) << o.status().to_string();
  if (!o.ok()) return b;
  b.cuda = std::move(o).value();
  ops::Ops* use = b.cuda.get();
  if (m.count) {
    b.counting = std::make_unique<CountingOps>(use);
    use = b.counting.get();
  }
  auto model = DeepseekV4::load(dir, use);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return b;
  b.model = std::move(model).value();
  DeepseekV4::DecodeOptions opt;
  opt.graphs = m.graphs;
  opt.device_plan = m.device_plan;
  opt.min_context = m.min_context;
  b.model->set_decode_options(opt);
  auto kv = b.model->make_cache(int64_t(512) << 20, max_seqs);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  if (kv.ok()) b.kv = std::move(kv).value();
  return b;
}

// Runs prompts (each prefilled alone, eager) then `steps` greedy decode steps of all sequences
// together; returns per request the greedy tokens and the logits of every decode step.
struct Decoded {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logits;  // per step: [rows, V] in request order
};
Decoded run_together(Backend& b, const std::vector<std::vector<int32_t>>& prompts, int steps) {
  Decoded d;
  const int64_t V = b.model->config().vocab_size;
  std::vector<int32_t> seqs, last;
  std::vector<int64_t> pos;
  d.tokens.resize(prompts.size());
  for (const auto& p : prompts) {
    auto s = b.kv->create_sequence();
    EXPECT_TRUE(s.ok());
    if (!s.ok()) return d;
    ForwardBatch fb;
    fb.slices.push_back({*s, 0, p, false});
    auto out = b.model->forward(fb, *b.kv);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (!out.ok()) return d;
    seqs.push_back(*s);
    last.push_back(testing::argmax(out->logits.data(), V));
    pos.push_back(int64_t(p.size()));
  }
  for (int step = 0; step < steps; ++step) {
    ForwardBatch fb;
    for (size_t r = 0; r < seqs.size(); ++r) {
      d.tokens[r].push_back(last[r]);
      fb.slices.push_back({seqs[r], pos[r]++, {last[r]}, false});
    }
    auto out = b.model->forward(fb, *b.kv);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (!out.ok()) return d;
    for (size_t r = 0; r < seqs.size(); ++r) last[r] = testing::argmax(&out->logits[r * V], V);
    d.logits.push_back(std::move(out->logits));
  }
  for (int32_t s : seqs) b.kv->free_sequence(s);
  return d;
}

std::string stats_line(const DeepseekV4& m) {
  const auto& s = m.decode_stats();
  std::string r = "captures " + std::to_string(s.captures) + ", failures " +
                  std::to_string(s.capture_failures) + ", replays " +
                  std::to_string(s.graph_replays) + ", eager plan steps " +
                  std::to_string(s.device_plan_steps) + ", host plan steps " +
                  std::to_string(s.host_plan_steps) + ", per graph {";
  for (auto& [k, v] : s.replays)
    r += " (B=" + std::to_string(k.first) + ", ctx=" + std::to_string(k.second) +
         "): " + std::to_string(v);
  return r + " }";
}

// ---- the plan op on the device vs the CPU reference ------------------------------------------

TEST(CudaGraphs, PlanOpMatchesCpuOp) {
  V4_REQUIRE_GPU();
  auto gpu = ops::make_cuda_ops();
  ASSERT_TRUE(gpu.ok());
  auto cpu = ops::make_cpu_ops();
  auto& g = cuda::testing::rng();
  const int rows = 6, ps = 128, W = 128;
  const int64_t B = 8, n_live = 6;
  const int ratio[2] = {4, 128}, overlap[2] = {2, 1};
  const int64_t topk = 16;
  // P = 12: one block per row; P = 400 (51,200 tokens, 12,800 C4 candidates): the candidate
  // lists spread over several blocks per row (build_decode_plan's grid.y > 1).
  for (int trial = 0; trial < 26; ++trial) {
    const int64_t P = trial < 20 ? 12 : 400;
    const int64_t ctx = P * ps;
    SCOPED_TRACE("trial " + std::to_string(trial) + " pages " + std::to_string(P));
    // Raw state: live rows with random positions; random distinct pages; SWA pages below the
    // window freed; three table rows sent as deltas, the others pre-set.
    std::vector<int32_t> staging(size_t(4 * B + 1 + B + B * 2 * P), 0);
    std::vector<int32_t> table(size_t(rows * P)), swa(size_t(rows * P));
    for (auto& v : table) v = int32_t(g() % 1000);
    for (auto& v : swa) v = int32_t(g() % 1000) - 100;  // some −1…−100: "freed"
    const int64_t kSeq = B, kSlot = 2 * B, kPos = 3 * B, kCount = 4 * B, kDSeq = 4 * B + 1,
                  kDRows = 5 * B + 1;
    std::vector<int> perm(rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    for (int64_t b = 0; b < B; ++b) {
      const bool live = b < n_live;
      staging[b] = int32_t(g() % 100);
      staging[kSeq + b] = live ? perm[b] : -1;
      staging[kSlot + b] = int32_t(g() % 16);
      staging[kPos + b] = live ? int32_t(g() % (P * ps)) : 0;
    }
    staging[kCount] = 3;
    for (int r = 0; r < 3; ++r) {
      staging[kDSeq + r] = perm[r];
      for (int64_t i = 0; i < 2 * P; ++i)
        staging[kDRows + r * 2 * P + i] = int32_t(g() % 2000) - 50;
    }
    // Output arrays (poisoned equally on both sides), as one int32 and one int64 arena.
    const int64_t s0 = (ctx + ratio[0] - 1) / ratio[0], s1 = (ctx + ratio[1] - 1) / ratio[1];
    const int64_t n32 = B * (1 + W + 1) + B * (8 + 4 + s0) + B * (128 + 4 + s1);
    const int64_t n64 = B * 3 + B * 2 * 2;
    auto bind = [&](ops::DecodePlanArgs& a, int32_t* o32, int64_t* o64, int32_t* st, int32_t* tb,
                    int32_t* sw) {
      a.n_rows = B;
      a.seq = st + kSeq;
      a.slot = st + kSlot;
      a.pos = st + kPos;
      a.page_table = tb;
      a.swa_table = sw;
      a.max_pages = P;
      a.page_size = ps;
      a.window = W;
      a.delta_count = st + kCount;
      a.delta_seq = st + kDSeq;
      a.delta_rows = st + kDRows;
      a.delta_cap = B;
      a.positions = o64;
      a.swa_offset = o64 + B;
      a.topk_offset = o64 + 2 * B;
      a.topk = int(topk);
      a.swa_dst = o32;
      a.swa_count = o32 + B;
      a.swa_rows = o32 + 2 * B;
      int32_t* p32 = o32 + 2 * B + B * W;
      int64_t* p64 = o64 + 3 * B;
      a.n_rates = 2;
      const int64_t strides[2] = {s0, s1};
      for (int r = 0; r < 2; ++r) {
        auto& R = a.rates[r];
        R.ratio = ratio[r];
        R.overlap = overlap[r];
        R.cand_stride = strides[r];
        R.src = p32;
        p32 += B * ratio[r] * overlap[r];
        R.dst = p32;
        p32 += B;
        R.ring_src = p32;
        p32 += B;
        R.ring_dst = p32;
        p32 += B;
        R.cand_count = p32;
        p32 += B;
        R.cand_rows = p32;
        p32 += B * strides[r];
        R.positions = p64;
        p64 += B;
        R.cand_offset = p64;
        p64 += B;
      }
    };
    std::vector<int32_t> h32(size_t(n32), 0x5a5a5a5a), tb_h = table, sw_h = swa;
    std::vector<int64_t> h64(size_t(n64), 0x5a5a5a5a);
    ops::DecodePlanArgs ca;
    bind(ca, h32.data(), h64.data(), staging.data(), tb_h.data(), sw_h.data());
    (*cpu).build_decode_plan(ca);

    cuda::testing::Dev<int32_t> d32(std::vector<int32_t>(size_t(n32), 0x5a5a5a5a)), dst(staging),
        dtb(table), dsw(swa);
    cuda::testing::Dev<int64_t> d64(std::vector<int64_t>(size_t(n64), 0x5a5a5a5a));
    ops::DecodePlanArgs ga;
    bind(ga, d32.p, d64.p, dst.p, dtb.p, dsw.p);
    (*gpu)->build_decode_plan(ga);
    (*gpu)->synchronize();
    const auto g32 = d32.host(), gtb = dtb.host(), gsw = dsw.host();
    const auto g64 = d64.host();
    for (size_t i = 0; i < h32.size(); ++i) ASSERT_EQ(g32[i], h32[i]) << "int32 output " << i;
    for (size_t i = 0; i < h64.size(); ++i) ASSERT_EQ(g64[i], h64[i]) << "int64 output " << i;
    ASSERT_EQ(gtb, tb_h) << "page table after deltas";
    ASSERT_EQ(gsw, sw_h) << "SWA table after deltas";
  }
}

// ---- golden fixtures: graph decode == eager decode, bit for bit -------------------------------

TEST(CudaGraphs, GoldenGreedyDecodeGraphsEqualEager) {
  V4_REQUIRE_GPU();
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    auto gold = load_golden(dir);
    ASSERT_TRUE(gold.ok()) << gold.status().to_string();
    Backend eager = load(dir, {false, false}), graph = load(dir, {true, false}),
            plan = load(dir, {false, true});
    ASSERT_TRUE(eager.kv && graph.kv && plan.kv);
    const int64_t V = eager.model->config().vocab_size;
    const int steps = std::max<int>(24, int(gold->tokens.size()));
    const auto e = run_together(eager, {gold->prompt_ids}, steps);
    const auto g = run_together(graph, {gold->prompt_ids}, steps);
    const auto p = run_together(plan, {gold->prompt_ids}, steps);
    ASSERT_EQ(e.logits.size(), size_t(steps));
    ASSERT_EQ(g.logits.size(), size_t(steps));
    EXPECT_EQ(g.tokens[0], e.tokens[0]) << "greedy tokens, graphs vs eager";
    for (size_t i = 0; i < gold->tokens.size() && i < e.tokens[0].size(); ++i)
      EXPECT_EQ(e.tokens[0][i], gold->tokens[i]) << "eager vs golden token " << i;
    int bad = 0;
    for (int s = 0; s < steps; ++s) {
      const std::string d = first_diff(g.logits[s], e.logits[s], V);
      const std::string dp = first_diff(g.logits[s], p.logits[s], V);
      if (!d.empty() && bad++ < 3)
        ADD_FAILURE() << "decode step " << s << ": graph vs eager (host plan) logits differ at "
                      << d << "; graph vs eager plan-op path: " << (dp.empty() ? "identical" : dp);
      EXPECT_EQ(dp, "") << "decode step " << s << ": graph vs eager plan-op path (same kernels)";
    }
    const auto& st = graph.model->decode_stats();
    std::printf("[cuda graphs] %s: %d steps, %s\n", dir.c_str(), steps,
                stats_line(*graph.model).c_str());
    EXPECT_GE(st.captures, 1);
    EXPECT_EQ(st.capture_failures, 0);
    EXPECT_GE(st.graph_replays, steps - 2) << "graphs replayed for (almost) every step";
    for (auto& [key, n] : st.replays)
      EXPECT_GT(n, 1) << "graph (B=" << key.first << ", ctx=" << key.second << ") reused";
  }
}

// ---- ragged batch of five through graphs == each alone (eager) -------------------------------

TEST(CudaGraphs, RaggedBatchOfFiveEqualsAlone) {
  V4_REQUIRE_GPU();
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    // Context buckets 96·2^k (min_context 96): the longest row (370 → 394) moves from bucket 384
    // to 768 at step 14, while page crossings (row 250 at position 256) and SWA page frees
    // (W=128: row 370 at length 383) happen during replays of a graph, not at a warm-up.
    Backend alone = load(dir, {false, false}), together = load(dir, {true, false, 96});
    ASSERT_TRUE(alone.kv && together.kv);
    const int64_t V = alone.model->config().vocab_size;
    const int lens[5] = {3, 17, 64, 250, 370};
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 5; ++i) prompts.push_back(random_ids(V, lens[i], 7 + i));
    const int steps = 24;
    const auto t = run_together(together, prompts, steps);
    ASSERT_EQ(t.logits.size(), size_t(steps));
    for (int i = 0; i < 5; ++i) {
      const auto a = run_together(alone, {prompts[i]}, steps);
      EXPECT_EQ(t.tokens[i], a.tokens[0]) << "request " << i << " (prompt " << lens[i] << ")";
      double worst = 0;
      int bitwise = 0;
      for (int s = 0; s < steps && s < int(a.logits.size()); ++s) {
        std::vector<float> row(t.logits[s].begin() + i * V, t.logits[s].begin() + (i + 1) * V);
        worst = std::max(worst, testing::rel_err(row.data(), a.logits[s].data(), size_t(V)));
        bitwise += first_diff(row, a.logits[s], V).empty();
      }
      EXPECT_LE(worst, 1e-4) << "request " << i;
      std::printf(
          "[cuda graphs] %s request %d (prompt %d): tokens equal alone, %d/%d steps "
          "bit-identical, worst rel err %.3g\n",
          dir.c_str(), i, lens[i], bitwise, steps, worst);
    }
    const auto& st = together.model->decode_stats();
    std::printf("[cuda graphs] %s together: %s\n", dir.c_str(),
                stats_line(*together.model).c_str());
    EXPECT_EQ(st.capture_failures, 0);
    EXPECT_EQ(st.captures, 2) << "context buckets 384 and 768";
    EXPECT_EQ(st.graph_replays, steps - 2) << "two warm-ups (one per context bucket)";
    EXPECT_GT(st.page_rows_sent, 5) << "page-table rows staged (first sight + page crossing)";
    int64_t reused = 0;
    for (auto& [key, n] : st.replays) {
      EXPECT_EQ(key.first, 8) << "5 rows run in bucket 8";
      reused += n > 1;
    }
    EXPECT_GE(reused, 1);
  }
}

// ---- B=3 in bucket 4: padding rows change nothing -----------------------------------------------

TEST(CudaGraphs, PaddedBucketThreeInFour) {
  V4_REQUIRE_GPU();
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    Backend eager = load(dir, {false, false}), plan = load(dir, {false, true}),
            graph = load(dir, {true, false});
    ASSERT_TRUE(eager.kv && plan.kv && graph.kv);
    const int64_t V = eager.model->config().vocab_size;
    std::vector<std::vector<int32_t>> prompts;
    const int lens[3] = {5, 33, 97};
    for (int i = 0; i < 3; ++i) prompts.push_back(random_ids(V, lens[i], 40 + i));
    const int steps = 12;
    const auto e = run_together(eager, prompts, steps);
    const auto p = run_together(plan, prompts, steps);
    const auto g = run_together(graph, prompts, steps);
    ASSERT_EQ(g.logits.size(), size_t(steps));
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(g.tokens[i], e.tokens[i]) << "request " << i << ": graph (bucket 4) vs eager B=3";
      EXPECT_EQ(p.tokens[i], e.tokens[i]) << "request " << i << ": plan op (bucket 4) vs eager";
    }
    for (int s = 0; s < steps; ++s) {
      EXPECT_EQ(first_diff(g.logits[s], p.logits[s], V), "")
          << "step " << s << ": graph vs eager plan-op path, same bucket";
      EXPECT_LE(testing::rel_err(g.logits[s].data(), e.logits[s].data(), g.logits[s].size()), 1e-4)
          << "step " << s;
    }
    const auto& st = graph.model->decode_stats();
    EXPECT_EQ(st.capture_failures, 0);
    ASSERT_EQ(st.replays.size(), 1u) << stats_line(*graph.model);
    EXPECT_EQ(st.replays.begin()->first.first, 4);
    EXPECT_EQ(st.replays.begin()->second, steps - 1);  // step 0 warms up and captures
    EXPECT_EQ(plan.model->decode_stats().device_plan_steps, steps);
  }
}

// ---- replayed steps: no allocation, one upload, one download --------------------------------

TEST(CudaGraphs, ReplayedStepAllocatesNothing) {
  V4_REQUIRE_GPU();
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    Mode m{true, false};
    m.count = true;
    Backend b = load(dir, m);
    ASSERT_TRUE(b.kv);
    const int64_t V = b.model->config().vocab_size;
    std::vector<int32_t> seqs;
    std::vector<int64_t> pos;
    for (int i = 0; i < 2; ++i) {
      auto s = b.kv->create_sequence();
      ASSERT_TRUE(s.ok());
      ForwardBatch fb;
      fb.slices.push_back({*s, 0, random_ids(V, 10 + 7 * i, 70 + i), false});
      ASSERT_TRUE(b.model->forward(fb, *b.kv).ok());
      seqs.push_back(*s);
      pos.push_back(10 + 7 * i);
    }
    auto step = [&] {
      ForwardBatch fb;
      for (size_t r = 0; r < seqs.size(); ++r) fb.slices.push_back({seqs[r], pos[r]++, {1}, false});
      auto out = b.model->forward(fb, *b.kv);
      EXPECT_TRUE(out.ok()) << out.status().to_string();
    };
    step();  // warm-up + capture
    CountingOps& c = *b.counters();
    for (int i = 0; i < 5; ++i) {
      const CountingOps::Counts before = c.counts();
      const int64_t replays = b.model->decode_stats().graph_replays;
      step();
      ASSERT_EQ(b.model->decode_stats().graph_replays, replays + 1) << stats_line(*b.model);
      EXPECT_EQ(c.allocs - before.allocs, 0) << "replayed step " << i;
      EXPECT_EQ(c.frees - before.frees, 0);
      EXPECT_EQ(c.uploads - before.uploads, 1) << "raw batch state (+ page deltas), one upload";
      EXPECT_EQ(c.downloads - before.downloads, 1) << "logits";
      EXPECT_EQ(c.syncs - before.syncs, 0);
      EXPECT_EQ(c.kernels - before.kernels, 0) << "no op called on the host";
    }
  }
}

// ---- per-region step profile (Ops::region): eager and replayed steps tile the same regions ------

TEST(CudaGraphs, RegionProfileTilesEagerAndReplayedSteps) {
  V4_REQUIRE_GPU();
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  const std::string dir = dirs.front();
  std::map<std::string, int64_t> calls[2];
  for (int graphs = 0; graphs < 2; ++graphs) {
    SCOPED_TRACE(graphs ? "graph replay" : "eager");
    Backend b = load(dir, {graphs == 1, true});
    ASSERT_TRUE(b.kv);
    ASSERT_TRUE(b.cuda->set_profiling(true));
    const ModelConfig& c = b.model->config();
    auto s = b.kv->create_sequence();
    ASSERT_TRUE(s.ok());
    ForwardBatch pre;
    pre.slices.push_back({*s, 0, random_ids(c.vocab_size, 20, 5), false});
    ASSERT_TRUE(b.model->forward(pre, *b.kv).ok());
    int64_t pos = 20;
    auto step = [&] {
      ForwardBatch fb;
      fb.slices.push_back({*s, pos++, {3}, false});
      auto out = b.model->forward(fb, *b.kv);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
    };
    step();  // eager (and capture)
    b.cuda->reset_region_profile();
    const ops::StepTiming t0 = b.cuda->step_timing();
    const int n = 4;
    const int64_t replays0 = b.model->decode_stats().graph_replays;
    for (int i = 0; i < n; ++i) step();
    if (graphs) {
      ASSERT_EQ(b.model->decode_stats().graph_replays, replays0 + n);
    }
    const ops::StepTiming t1 = b.cuda->step_timing();
    double sum_ms = 0;
    for (const auto& r : b.cuda->region_profile()) {
      calls[graphs][r.name] = r.calls;
      sum_ms += r.ms;
      EXPECT_GE(r.ms, 0.0) << r.name;
    }
    // Every layer enters its q region once per step; embed and head once.
    int per_kind[3] = {0, 0, 0};
    for (int l = 0; l < c.num_hidden_layers; ++l) ++per_kind[int(c.layer_types[l])];
    const char* q_names[3] = {"swa: q (wq_a, q_norm, wq_b, head norm, rope)",
                              "csa: q (wq_a, q_norm)",
                              "hca: q (wq_a, q_norm, wq_b, head norm, rope)"};
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(calls[graphs][q_names[k]], int64_t(per_kind[k]) * n) << q_names[k];
    // CSA layers: the indexer's top-k + finalize region marked inside CudaOps::indexer_topk.
    EXPECT_EQ(calls[graphs]["csa: indexer top-k + finalize"], int64_t(per_kind[1]) * n);
    EXPECT_EQ(calls[graphs]["csa: indexer scores"], int64_t(per_kind[1]) * n);
    EXPECT_EQ(calls[graphs]["embed"], n);
    EXPECT_EQ(calls[graphs]["head (mHC head, norm, lm_head)"], n);
    // Regions tile the step from the first marker: their sum is the busy time (within the
    // resolution of the events).
    const double busy_ms = (t1.busy_s - t0.busy_s) * 1e3;
    EXPECT_GT(sum_ms, 0.0);
    EXPECT_NEAR(sum_ms, busy_ms, 0.02 * busy_ms + 0.05) << "regions vs step busy time";
  }
  EXPECT_EQ(calls[0], calls[1]) << "eager and replayed steps enter the same regions";
}

// ---- micro-bench (printed, not asserted)
// ---------------------------------------------------------

TEST(CudaGraphs, DecodeStepTimeEagerVsGraph) {
  V4_REQUIRE_GPU();
  for (const auto& dir : fixture_dirs()) {
    for (int B : {1, 64}) {
      double ms[2] = {0, 0};
      for (int graphs = 0; graphs < 2; ++graphs) {
        Backend b = load(dir, {graphs == 1, false}, 64);
        ASSERT_TRUE(b.kv);
        const int64_t V = b.model->config().vocab_size;
        std::vector<int32_t> seqs;
        std::vector<int64_t> pos;
        ForwardBatch pre;
        for (int i = 0; i < B; ++i) {
          auto s = b.kv->create_sequence();
          ASSERT_TRUE(s.ok());
          pre.slices.push_back({*s, 0, random_ids(V, 16, 300 + i), false});
          seqs.push_back(*s);
          pos.push_back(16);
        }
        ASSERT_TRUE(b.model->forward(pre, *b.kv).ok());
        auto step = [&] {
          ForwardBatch fb;
          for (int r = 0; r < B; ++r) fb.slices.push_back({seqs[r], pos[r]++, {1}, false});
          auto out = b.model->forward(fb, *b.kv);
          EXPECT_TRUE(out.ok());
        };
        for (int i = 0; i < 3; ++i) step();  // warm-up (and capture)
        const int n = 30;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) step();
        ms[graphs] =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count() /
            n;
        if (graphs) {
          EXPECT_GE(b.model->decode_stats().graph_replays, n);
        }
      }
      std::printf("[cuda graphs bench] %s B=%d: decode step eager %.3f ms, graph %.3f ms (%.2fx)\n",
                  dir.c_str(), B, ms[0], ms[1], ms[0] / ms[1]);
    }
  }
}

}  // namespace
}  // namespace v4::model
