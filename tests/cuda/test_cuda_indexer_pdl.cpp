// The indexer chain with programmatic dependent launch (CudaOptions::indexer_pdl; docs/cuda.md
// §Indexer chain): `Ops::indexer_topk` in bf16 mode (decode scores kernel → Lightning TopK →
// finalize) must give bit-identical rows and counts with PDL on and off — eagerly and replayed
// from CUDA graphs (new inputs between replays), batch 1 and 64, rows of 1K / 64K / 230K keys,
// mixed row lengths, bf16 (served) and f32 key pools. A back-to-back test captures several
// layers' chains in one graph, each fed by a gather kernel right before it (on a side stream of a
// fork in the multi-stream form) and sharing the backend's scores / selection scratch with the
// neighbouring chains, to catch a missing griddepcontrol.wait. Outputs and the chains' inputs are
// poisoned before every run, so a result that is not (re)written fails.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

using cuda::testing::Dev;
using cuda::testing::rand_int;
using cuda::testing::randn;
using cuda::testing::rng;

constexpr int kNI = 64, kDI = 128, kTopk = 512;

// A CUDA backend in bf16 mode with the indexer chain's PDL on or off (the environment overrides
// are cleared so the option decides).
std::unique_ptr<Ops> make_backend(bool pdl, bool multi_stream, int64_t gate_min_count = 0) {
  unsetenv("V4_INDEXER_PDL");
  unsetenv("V4_MULTI_STREAM");
  unsetenv("V4_INDEXER_GATE_MIN_COUNT");
  CudaOptions co;
  co.precision = Precision::kBf16;
  co.indexer_pdl = pdl;
  co.indexer_pdl_max_rows = INT64_MAX;   // PDL at every batch size (the default limits it to 4 rows)
  co.indexer_pdl_max_count = INT64_MAX;  // and every row length (default: ≤ 65,536 candidates)
  co.multi_stream = multi_stream;
  co.multi_stream_max_rows = 0;  // forks of any row count on side streams
  co.indexer_gate_min_count = gate_min_count;
  auto made = make_cuda_ops(co);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  if (!made.ok()) return nullptr;
  return std::move(made).value();
}

// A key pool on the device: bf16 or f32 rows of kDI values (random N(0,1)).
struct Pool {
  KvDtype dtype = KvDtype::kBf16;
  int64_t rows = 0;
  std::unique_ptr<Dev<uint16_t>> bf16;
  std::unique_ptr<Dev<float>> f32;
  const void* ptr() const {
    return dtype == KvDtype::kBf16 ? static_cast<const void*>(bf16->p) : f32->p;
  }
};
std::unique_ptr<Pool> make_pool(KvDtype dtype, int64_t rows) {
  auto p = std::make_unique<Pool>();
  p->dtype = dtype;
  p->rows = rows;
  auto v = randn(size_t(rows * kDI), 1.f);
  if (dtype == KvDtype::kBf16) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
    p->bf16 = std::make_unique<Dev<uint16_t>>(b);
  } else {
    p->f32 = std::make_unique<Dev<float>>(v);
  }
  return p;
}

// One call's inputs on the device: q [S, nI, dI], weights [S, nI], paged candidate lists (runs of
// 64 consecutive pool rows from distinct random pages, so a list's pool rows are distinct).
struct Inputs {
  int64_t S = 0, max_count = 0;
  std::vector<int> counts;
  std::vector<int32_t> rows;
  std::vector<int64_t> offset;
  std::unique_ptr<Dev<float>> q, w;
  std::unique_ptr<Dev<int32_t>> drows, dcount;
  std::unique_ptr<Dev<int64_t>> doffset;
};
std::unique_ptr<Inputs> make_inputs(const std::vector<int>& counts, int64_t pool_rows) {
  auto in = std::make_unique<Inputs>();
  in->S = int64_t(counts.size());
  in->counts = counts;
  in->max_count = std::max(1, *std::max_element(counts.begin(), counts.end()));
  std::vector<int> pages(size_t(pool_rows / 64));
  for (int c : counts) {
    EXPECT_LE(int64_t(c), int64_t(pages.size()) * 64) << "pool too small for the list";
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng());
    in->offset.push_back(int64_t(in->rows.size()));
    for (int s = 0; s < c; ++s) in->rows.push_back(pages[s / 64] * 64 + s % 64);
  }
  if (in->rows.empty()) in->rows.push_back(0);
  in->q = std::make_unique<Dev<float>>(randn(size_t(in->S * kNI * kDI), 1.f));
  in->w = std::make_unique<Dev<float>>(randn(size_t(in->S * kNI), 1.f));
  in->drows = std::make_unique<Dev<int32_t>>(in->rows);
  in->dcount = std::make_unique<Dev<int32_t>>(std::vector<int32_t>(counts.begin(), counts.end()));
  in->doffset = std::make_unique<Dev<int64_t>>(in->offset);
  return in;
}

// Output buffers of one call.
struct Outs {
  Dev<int32_t> rows, count;
  explicit Outs(int64_t S) : rows(size_t(S * kTopk)), count(size_t(S)) {}
  void poison() {
    rows.poison();
    count.poison();
  }
};

IndexerArgs args_for(const Inputs& in, const Pool& pool, const float* q, const float* w,
                     Outs& out) {
  IndexerArgs a;
  a.q = q;
  a.weights = w;
  a.key_pool = pool.ptr();
  a.key_dtype = pool.dtype;
  a.cand = {in.drows->p, in.doffset->p, in.dcount->p};
  a.n_rows = in.S;
  a.n_heads = kNI;
  a.head_dim = kDI;
  a.topk = kTopk;
  a.max_count = in.max_count;
  a.out_rows = out.rows.p;
  a.out_count = out.count.p;
  return a;
}

struct Result {
  std::vector<int32_t> rows, count;
};
Result fetch(Outs& out) { return {out.rows.host(), out.count.host()}; }

// Index of the first differing entry of two results ("" when equal), for failure messages.
std::string first_diff(const Result& a, const Result& b) {
  if (a.count != b.count) return "counts differ";
  for (size_t i = 0; i < a.rows.size() && i < b.rows.size(); ++i)
    if (a.rows[i] != b.rows[i])
      return "row " + std::to_string(i / kTopk) + " entry " + std::to_string(i % kTopk) + ": " +
             std::to_string(a.rows[i]) + " vs " + std::to_string(b.rows[i]);
  return a.rows.size() == b.rows.size() ? "" : "sizes differ";
}

// The result is well-formed: count = min(n, k), the first count entries are distinct candidates
// of the row's list, the rest −1 (poisoned outputs that were never written fail here).
void expect_valid(const Inputs& in, const Result& r, int64_t pool_rows) {
  ASSERT_EQ(r.count.size(), size_t(in.S));
  std::vector<int> mark(size_t(pool_rows), -1);
  for (int64_t t = 0; t < in.S; ++t) {
    const int n = in.counts[t], n_sel = std::min(n, kTopk);
    ASSERT_EQ(r.count[t], n_sel) << "row " << t;
    for (int s = 0; s < n; ++s) mark[size_t(in.rows[size_t(in.offset[t] + s)])] = int(t);
    for (int i = 0; i < kTopk; ++i) {
      const int32_t v = r.rows[size_t(t * kTopk + i)];
      if (i >= n_sel) {
        ASSERT_EQ(v, -1) << "row " << t << " pad " << i;
        continue;
      }
      ASSERT_TRUE(v >= 0 && v < pool_rows) << "row " << t << " entry " << i << ": " << v;
      ASSERT_EQ(mark[size_t(v)], int(t)) << "row " << t << " entry " << i << ": not a candidate "
                                         << "or a duplicate";
      mark[size_t(v)] = -2;  // a second pick of the same row fails the check above
    }
  }
}

// Eager run of one call on `o`.
Result run_eager(Ops& o, const IndexerArgs& a, Outs& out) {
  out.poison();
  o.indexer_topk(a);
  o.synchronize();
  return fetch(out);
}

// Uploads fresh random q and weights into the call's buffers (the graphs read the same pointers).
void new_q(Inputs& in) {
  const auto q = randn(size_t(in.S * kNI * kDI), 1.f), w = randn(size_t(in.S * kNI), 1.f);
  ASSERT_EQ(cudaMemcpy(in.q->p, q.data(), q.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(in.w->p, w.data(), w.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

std::vector<int> mixed_counts(int S, int max_count) {
  std::vector<int> c(static_cast<size_t>(S));
  for (int& v : c) v = rand_int(1, max_count);
  c[0] = max_count;
  // short rows around k and an empty one (their top-k is the whole list or nothing)
  const int specials[] = {0, 1, kTopk - 1, kTopk, kTopk + 1};
  for (int i = 0; i < 5 && 1 + i < S; ++i) c[size_t(1 + i)] = std::min(specials[i], max_count);
  std::shuffle(c.begin() + 1, c.end(), rng());
  return c;
}

// PDL on vs off, eager and replayed from graphs (two replays with new q / weights between).
TEST(CudaIndexerPdl, OnEqualsOffEagerAndGraph) {
  V4_REQUIRE_GPU();
  auto on = make_backend(true, false), off = make_backend(false, false);
  ASSERT_TRUE(on && off);
  const int64_t bf16_rows = 262144, f32_rows = 65536;
  auto pool_bf16 = make_pool(KvDtype::kBf16, bf16_rows);
  auto pool_f32 = make_pool(KvDtype::kF32, f32_rows);
  struct Case { std::vector<int> counts; bool f32; };
  const std::vector<Case> cases = {
      {{1024}, false},        {{65536}, false},          {{230400}, false},
      {{262144}, false},      {{150001}, false},         {{700}, false},
      {{20000}, false},       {{8192}, false},           {mixed_counts(64, 32768), false},
      {mixed_counts(64, 1024), false}, {mixed_counts(64, 65536), false},
      {mixed_counts(64, 230400), false}, {mixed_counts(7, 100000), false},
      {{65536}, true},        {mixed_counts(64, 1024), true}};
  for (const Case& c : cases) {
    const Pool& pool = c.f32 ? *pool_f32 : *pool_bf16;
    auto in = make_inputs(c.counts, pool.rows);
    SCOPED_TRACE(::testing::Message() << "S=" << in->S << " max_count=" << in->max_count
                                      << (c.f32 ? " f32 keys" : " bf16 keys"));
    Outs out_on(in->S), out_off(in->S);
    const IndexerArgs a_on = args_for(*in, pool, in->q->p, in->w->p, out_on);
    const IndexerArgs a_off = args_for(*in, pool, in->q->p, in->w->p, out_off);
    // eager (also the warm-up the captures need: scratch sized, no growth inside capture)
    const Result ref = run_eager(*off, a_off, out_off);
    expect_valid(*in, ref, pool.rows);
    const Result got = run_eager(*on, a_on, out_on);
    EXPECT_EQ(first_diff(ref, got), "") << "eager PDL on vs off";
    // graphs
    auto g_on = on->capture([&] { on->indexer_topk(a_on); });
    auto g_off = off->capture([&] { off->indexer_topk(a_off); });
    ASSERT_TRUE(g_on != nullptr) << "capture with PDL failed";
    ASSERT_TRUE(g_off != nullptr);
    for (int rep = 0; rep < 2; ++rep) {
      SCOPED_TRACE(::testing::Message() << "replay " << rep);
      Result want = ref;
      if (rep == 1) {
        new_q(*in);
        want = run_eager(*off, a_off, out_off);
        expect_valid(*in, want, pool.rows);
      }
      out_on.poison();
      g_on->replay();
      on->synchronize();
      EXPECT_EQ(first_diff(want, fetch(out_on)), "") << "graph PDL on vs eager off";
      out_off.poison();
      g_off->replay();
      off->synchronize();
      EXPECT_EQ(first_diff(want, fetch(out_off)), "") << "graph PDL off vs eager off";
    }
  }
}

// Several layers' chains back to back in one graph: layer i's q and weights are written by gather
// kernels right before its chain (q on a side stream of a fork when multi-stream: the chain's
// first kernel follows a join), every chain reuses the backend's scores / selection scratch of the
// previous one, and the layers differ in batch and row length. q / weights / outputs are poisoned
// before every replay and the sources change between replays; each layer must equal its eager
// PDL-off result alone.
TEST(CudaIndexerPdl, BackToBackLayersInOneGraph) {
  V4_REQUIRE_GPU();
  const int64_t pool_rows = 262144;
  auto pool = make_pool(KvDtype::kBf16, pool_rows);
  const std::vector<std::vector<int>> layer_counts = {
      {230400}, {1024}, {65536}, mixed_counts(64, 2048), {262144}, {150001}, mixed_counts(3, 40000)};
  const size_t L = layer_counts.size();
  std::vector<std::unique_ptr<Inputs>> src;  // q / weights sources (the gathers' inputs)
  std::vector<std::unique_ptr<Dev<float>>> q, w;  // what the gathers write, the chains read
  std::vector<std::unique_ptr<Dev<int32_t>>> ident;
  for (const auto& c : layer_counts) {
    src.push_back(make_inputs(c, pool_rows));
    const int64_t S = src.back()->S;
    q.push_back(std::make_unique<Dev<float>>(size_t(S * kNI * kDI)));
    w.push_back(std::make_unique<Dev<float>>(size_t(S * kNI)));
    std::vector<int32_t> id(static_cast<size_t>(S));
    std::iota(id.begin(), id.end(), 0);
    ident.push_back(std::make_unique<Dev<int32_t>>(id));
  }
  auto ref = make_backend(false, false);
  ASSERT_TRUE(ref);
  auto refs = [&] {  // each layer alone, eager, PDL off, straight from the sources
    std::vector<Result> r;
    for (size_t i = 0; i < L; ++i) {
      Outs out(src[i]->S);
      r.push_back(run_eager(*ref, args_for(*src[i], *pool, src[i]->q->p, src[i]->w->p, out), out));
      expect_valid(*src[i], r.back(), pool_rows);
    }
    return r;
  };
  std::vector<Result> want = refs();
  for (bool multi : {false, true}) {
    for (bool pdl : {true, false}) {
      SCOPED_TRACE(::testing::Message() << (multi ? "multi-stream" : "one stream") << " PDL "
                                        << (pdl ? "on" : "off"));
      auto o = make_backend(pdl, multi);
      ASSERT_TRUE(o);
      std::vector<std::unique_ptr<Outs>> outs;
      for (size_t i = 0; i < L; ++i) outs.push_back(std::make_unique<Outs>(src[i]->S));
      auto body = [&] {
        for (size_t i = 0; i < L; ++i) {
          const int64_t S = src[i]->S;
          o->fork(2, S);
          o->branch(1);
          o->gather_rows(src[i]->q->p, ident[i]->p, S, kNI * kDI, q[i]->p);
          o->branch(0);
          o->gather_rows(src[i]->w->p, ident[i]->p, S, kNI, w[i]->p);
          o->join();
          o->indexer_topk(args_for(*src[i], *pool, q[i]->p, w[i]->p, *outs[i]));
        }
      };
      auto poison_all = [&] {
        for (size_t i = 0; i < L; ++i) {
          q[i]->poison();
          w[i]->poison();
          outs[i]->poison();
        }
      };
      poison_all();
      body();  // eager (the warm-up)
      o->synchronize();
      for (size_t i = 0; i < L; ++i)
        EXPECT_EQ(first_diff(want[i], fetch(*outs[i])), "") << "eager, layer " << i;
      auto g = o->capture(body);
      ASSERT_TRUE(g != nullptr) << "capture failed";
      for (int rep = 0; rep < 3; ++rep) {
        SCOPED_TRACE(::testing::Message() << "replay " << rep);
        if (rep > 0) {
          for (auto& s : src) new_q(*s);
          want = refs();
        }
        poison_all();
        g->replay();
        o->synchronize();
        for (size_t i = 0; i < L; ++i)
          EXPECT_EQ(first_diff(want[i], fetch(*outs[i])), "") << "layer " << i;
      }
      // Many replays back to back without a host sync in between (graph launches overlap the
      // host; the last one's results must stand).
      for (int rep = 0; rep < 8; ++rep) g->replay();
      o->synchronize();
      for (size_t i = 0; i < L; ++i)
        EXPECT_EQ(first_diff(want[i], fetch(*outs[i])), "") << "8 replays, layer " << i;
    }
  }
}

// The gate (CudaOptions::indexer_gate_min_count, IndexerArgs::after_scores_branch): the chain
// runs on branch 1 of a fork and branch 0's next op (a gather standing in for the model's q tail)
// is made to wait for the scores kernel. Eagerly and replayed from a graph (new q / weights
// between replays, 8 replays back to back), PDL on and off, the chain's rows and the gather's
// output must equal the ungated one-stream results.
TEST(CudaIndexerPdl, GateKeepsResultsEagerAndGraph) {
  V4_REQUIRE_GPU();
  const int64_t pool_rows = 262144;
  auto pool = make_pool(KvDtype::kBf16, pool_rows);
  auto ref = make_backend(false, false);
  ASSERT_TRUE(ref);
  for (const auto& counts : {std::vector<int>{230400}, mixed_counts(3, 40000), std::vector<int>{1024}}) {
    auto in = make_inputs(counts, pool_rows);
    const int64_t S = in->S;
    std::vector<int32_t> id(static_cast<size_t>(S));
    std::iota(id.begin(), id.end(), 0);
    Dev<int32_t> ident(id);
    Dev<float> side_out{size_t(S * kNI)};
    for (bool pdl : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "S=" << S << " max_count=" << in->max_count << " PDL "
                                        << (pdl ? "on" : "off"));
      auto o = make_backend(pdl, true, 1);
      ASSERT_TRUE(o);
      Outs out(S), out_ref(S);
      IndexerArgs a = args_for(*in, *pool, in->q->p, in->w->p, out);
      a.after_scores_branch = 0;
      // The chain on branch 1 of a fork of `branches`, the stand-in q tail on branch 0.
      auto body_with = [&](const IndexerArgs& args, int branches) {
        o->fork(branches, S);
        o->branch(1);
        o->indexer_topk(args);
        o->branch(0);
        o->gather_rows(in->w->p, ident.p, S, kNI, side_out.p);
        o->join();
      };
      auto body = [&] { body_with(a, 2); };
      auto check = [&](const char* what) {
        const Result want = run_eager(*ref, args_for(*in, *pool, in->q->p, in->w->p, out_ref), out_ref);
        expect_valid(*in, want, pool_rows);
        EXPECT_EQ(first_diff(want, fetch(out)), "") << what;
        std::vector<float> w(size_t(S * kNI));
        ASSERT_EQ(cudaMemcpy(w.data(), in->w->p, w.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(side_out.host(), w) << what << ": the gated branch's op";
      };
      out.poison();
      side_out.poison();
      body();  // eager (the warm-up)
      o->synchronize();
      check("eager");
      auto g = o->capture(body);
      ASSERT_TRUE(g != nullptr) << "capture failed";
      for (int rep = 0; rep < 2; ++rep) {
        new_q(*in);
        out.poison();
        side_out.poison();
        g->replay();
        o->synchronize();
        check("replay");
      }
      for (int rep = 0; rep < 8; ++rep) g->replay();
      o->synchronize();
      check("8 replays");
      // A hint naming a branch of the fork that never runs work: no wait is inserted (its stream
      // never joined the fork), and the capture still closes.
      IndexerArgs a2 = a;
      a2.after_scores_branch = 2;
      auto g2 = o->capture([&] { body_with(a2, 3); });
      ASSERT_TRUE(g2 != nullptr) << "capture with an unused hinted branch failed";
      new_q(*in);
      out.poison();
      side_out.poison();
      g2->replay();
      o->synchronize();
      check("unused hinted branch");
    }
  }
}

}  // namespace
}  // namespace v4::ops
