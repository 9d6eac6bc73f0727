// Decode plans built by the plan op (Ops::build_decode_plan, docs/model.md §Decode plans and
// graphs) against the host planner (model/step_plan.h plan_on_host, which reads KvCache's own
// addressing functions), and decode through the plan op against decode through the host planner:
// bit-identical logits on every fixture, several sequences of different lengths per batch.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>

#include "cache/pools.h"
#include "model/deepseek_v4.h"
#include "model/step_plan.h"
#include "model_test_util.h"
#include "ops/ops.h"

namespace v4::model {
namespace {

using testing::first_diff;
using testing::random_ids;

// ---- plan op vs host planner on a bare KvCache -------------------------------------------------

struct PlanCase {
  int window, csa_ratio, hca_ratio, page_size, topk;
};

std::unique_ptr<cache::KvCache> bare_cache(const PlanCase& pc, int max_seqs, int64_t pages) {
  cache::CacheSpec spec;
  spec.sliding_window = pc.window;
  spec.layers = {{cache::AttnKind::kSliding, 0, 8, 0},
                 {cache::AttnKind::kCsa, pc.csa_ratio, 8, 4},
                 {cache::AttnKind::kHca, pc.hca_ratio, 8, 0}};
  cache::KvCacheOptions o;
  o.page_size = pc.page_size;
  o.n_pages = pages;
  o.n_swa_pages = pages;
  o.max_seqs = max_seqs;
  auto kv = cache::KvCache::create(
      spec, o, [](size_t b) { return std::calloc(1, b); }, [](void* p) { std::free(p); });
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  return kv.ok() ? std::move(kv).value() : nullptr;
}

// Output arrays of one plan at capacity B, poisoned so an entry the op should write but does not
// shows up.
struct PlanOut {
  static constexpr int32_t kPoison = 0x5a5a5a5a;
  std::vector<int64_t> positions, swa_offset, topk_offset;
  std::vector<int32_t> swa_dst, swa_rows, swa_count;
  struct Rate {
    std::vector<int32_t> src, dst, ring_src, ring_dst, cand_rows, cand_count;
    std::vector<int64_t> positions, cand_offset;
  } rate[2];
  void bind(ops::DecodePlanArgs& a, int64_t B, int W, const int (&ratio)[2],
            const int (&overlap)[2], int64_t ctx, int topk) {
    auto fill32 = [](std::vector<int32_t>& v, int64_t n) { v.assign(size_t(n), kPoison); };
    auto fill64 = [](std::vector<int64_t>& v, int64_t n) { v.assign(size_t(n), kPoison); };
    fill64(positions, B);
    fill64(swa_offset, B);
    fill64(topk_offset, B);
    fill32(swa_dst, B);
    fill32(swa_rows, B * W);
    fill32(swa_count, B);
    a.positions = positions.data();
    a.swa_offset = swa_offset.data();
    a.swa_dst = swa_dst.data();
    a.swa_rows = swa_rows.data();
    a.swa_count = swa_count.data();
    a.topk = topk;
    a.topk_offset = topk_offset.data();
    a.n_rates = 2;
    for (int r = 0; r < 2; ++r) {
      Rate& R = rate[r];
      ops::DecodePlanRate& d = a.rates[r];
      d.ratio = ratio[r];
      d.overlap = overlap[r];
      d.cand_stride = (ctx + ratio[r] - 1) / ratio[r];
      fill32(R.src, B * ratio[r] * overlap[r]);
      fill32(R.dst, B);
      fill32(R.ring_src, B);
      fill32(R.ring_dst, B);
      fill32(R.cand_rows, B * d.cand_stride);
      fill32(R.cand_count, B);
      fill64(R.positions, B);
      fill64(R.cand_offset, B);
      d.src = R.src.data();
      d.dst = R.dst.data();
      d.ring_src = R.ring_src.data();
      d.ring_dst = R.ring_dst.data();
      d.cand_rows = R.cand_rows.data();
      d.cand_count = R.cand_count.data();
      d.positions = R.positions.data();
      d.cand_offset = R.cand_offset.data();
    }
  }
};

// Compares row b of the op's plan with the host planner's maps for slice b (decode: one row per
// slice). Returns "" or what differs.
std::string compare_row(const HostStepPlan& hp, const PlanOut& po, int64_t b, int W,
                        const int64_t (&stride)[2]) {
  auto list = [](const int32_t* p, int64_t n) { return std::vector<int32_t>(p, p + n); };
  if (po.positions[b] != hp.pos[b])
    return fmt::format("position {} vs {}", po.positions[b], hp.pos[b]);
  if (po.swa_dst[b] != hp.swa_dst[b])
    return fmt::format("swa_dst {} vs {}", po.swa_dst[b], hp.swa_dst[b]);
  if (po.swa_count[b] != hp.swa.count[b])
    return fmt::format("swa count {} vs {}", po.swa_count[b], hp.swa.count[b]);
  if (po.swa_offset[b] != b * W) return "swa offset";
  if (list(po.swa_rows.data() + (po.swa_offset[b]), po.swa_count[b]) !=
      list(hp.swa.rows.data() + (hp.swa.offset[b]), hp.swa.count[b]))
    return "swa key rows";
  if (po.topk_offset[b] != hp.topk_offset[b]) return "topk offset";
  const HostCompressPlan* hc[2] = {&hp.csa, &hp.hca};
  for (int r = 0; r < 2; ++r) {
    const HostCompressPlan& h = *hc[r];
    const PlanOut::Rate& R = po.rate[r];
    const int slots = h.ratio * h.overlap;
    const std::string tag = fmt::format("rate {} (m={}): ", r, h.ratio);
    int64_t k = -1;  // the host output of this slice, if its window closes
    for (size_t i = 0; i < h.out_slice.size(); ++i)
      if (h.out_slice[i] == b) k = int64_t(i);
    if (k >= 0) {
      if (R.dst[b] != h.dst[k]) return tag + fmt::format("dst {} vs {}", R.dst[b], h.dst[k]);
      if (R.positions[b] != h.positions[k]) return tag + "closing position";
      if (list(R.src.data() + (b * slots), slots) != list(h.src.data() + (k * slots), slots))
        return tag + "src slots";
    } else {
      if (R.dst[b] != -1)
        return tag + fmt::format("dst {} for a row that does not close", R.dst[b]);
      for (int j = 0; j < slots; ++j)
        if (R.src[b * slots + j] != -1) return tag + "src of a row that does not close";
    }
    // Ring: the host refreshes the last c·m tokens of each slice — for a decode row, its token.
    if (h.ring_dst.size() <= size_t(b) || h.ring_src[b] != b) return tag + "host ring layout";
    if (R.ring_src[b] != b || R.ring_dst[b] != h.ring_dst[b])
      return tag + fmt::format("ring {}→{} vs {}→{}", R.ring_src[b], R.ring_dst[b], h.ring_src[b],
                               h.ring_dst[b]);
    if (R.cand_count[b] != h.cand.count[b])
      return tag + fmt::format("cand count {} vs {}", R.cand_count[b], h.cand.count[b]);
    if (R.cand_offset[b] != b * stride[r]) return tag + "cand offset";
    if (list(R.cand_rows.data() + (R.cand_offset[b]), R.cand_count[b]) !=
        list(h.cand.rows.data() + (h.cand.offset[b]), h.cand.count[b]))
      return tag + "candidate rows";
  }
  return "";
}

std::string check_padding(const PlanOut& po, int64_t b) {
  if (po.swa_count[b] != 0 || po.swa_dst[b] != -1 || po.positions[b] != 0) return "padding swa";
  for (int r = 0; r < 2; ++r) {
    const auto& R = po.rate[r];
    if (R.dst[b] != -1 || R.ring_dst[b] != -1 || R.cand_count[b] != 0) return "padding rate";
  }
  return "";
}

void run_plan_case(const PlanCase& pc, uint32_t seed) {
  SCOPED_TRACE(fmt::format("W={} m={}/{} page={} seed={}", pc.window, pc.csa_ratio, pc.hca_ratio,
                           pc.page_size, seed));
  const int max_seqs = 8;
  auto kv = bare_cache(pc, max_seqs, 400);
  ASSERT_TRUE(kv);
  auto ops = ops::make_cpu_ops();
  const int64_t P = decode_table_pages(*kv, int64_t(1) << 20);
  DecodeStager stager(max_seqs, P);
  // The "device" page tables (host memory on the CPU backend), poisoned: rows are only read after
  // the op copied them from a staged delta.
  std::vector<int32_t> pages(size_t(max_seqs * P), PlanOut::kPoison),
      swa(size_t(max_seqs * P), PlanOut::kPoison);
  PlanShape shape{pc.window, pc.csa_ratio, pc.hca_ratio, pc.topk};
  std::mt19937 g(seed);
  // Sequences of different lengths across page (256/128), window and rate boundaries.
  std::vector<int32_t> seqs;
  const int64_t starts[] = {0, 1, 3, 126, 127, 128, 255, 300};
  for (int64_t len : starts) {
    auto s = kv->create_sequence();
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(kv->reserve(*s, len).ok());
    kv->commit(*s, len);
    seqs.push_back(*s);
  }
  std::set<int64_t> res4, res128;
  int64_t closes = 0, deltas = 0, padded = 0;
  for (int step = 0; step < 420; ++step) {
    // A random subset in random order (ragged membership, buckets 1..8 with padding).
    std::vector<int32_t> order = seqs;
    std::shuffle(order.begin(), order.end(), g);
    const int n = 1 + int(g() % order.size());
    ForwardBatch batch;
    for (int i = 0; i < n; ++i)
      batch.slices.push_back({order[i], kv->length(order[i]), {int32_t(g() % 100)}, false});
    for (auto& sl : batch.slices) ASSERT_TRUE(kv->reserve(sl.seq, sl.start_pos + 1).ok());
    const HostStepPlan hp = plan_on_host(batch, *kv, shape);
    const int64_t B = decode_bucket(n);
    padded += B > n;
    const int64_t ints = stager.stage(batch, *kv, B);
    ASSERT_GT(ints, 0);
    deltas += stager.last_deltas();
    int64_t need = 1;
    for (auto& sl : batch.slices) need = std::max<int64_t>(need, sl.start_pos + 1);
    int64_t ctx = 16;
    while (ctx < need) ctx *= 2;
    ops::DecodePlanArgs a =
        decode_plan_inputs(stager.host(), pages.data(), swa.data(), P, pc.page_size, pc.window, B);
    PlanOut po;
    const int ratio[2] = {pc.csa_ratio, pc.hca_ratio}, overlap[2] = {2, 1};
    po.bind(a, B, pc.window, ratio, overlap, ctx, pc.topk);
    ops->build_decode_plan(a);
    const int64_t stride[2] = {a.rates[0].cand_stride, a.rates[1].cand_stride};
    for (int64_t b = 0; b < B; ++b) {
      const std::string d =
          b < n ? compare_row(hp, po, b, pc.window, stride) : check_padding(po, b);
      ASSERT_EQ(d, "") << "step " << step << " row " << b << " of " << n << " (bucket " << B << ")"
                       << (b < n ? fmt::format(", seq {} pos {}", batch.slices[b].seq,
                                               batch.slices[b].start_pos)
                                 : std::string(", padding"));
    }
    for (auto& sl : batch.slices) {
      res4.insert(sl.start_pos % 4);
      res128.insert(sl.start_pos % 128);
      closes += (sl.start_pos + 1) % pc.hca_ratio == 0;
      kv->commit(sl.seq, sl.start_pos + 1);
    }
    // Now and then a sequence ends and a new one (often the same handle) starts.
    if (step % 97 == 50) {
      const size_t i = g() % seqs.size();
      kv->free_sequence(seqs[i]);
      auto s = kv->create_sequence();
      ASSERT_TRUE(s.ok());
      const int64_t len = int64_t(g() % 600);
      ASSERT_TRUE(kv->reserve(*s, len).ok());
      kv->commit(*s, len);
      seqs[i] = *s;
    }
  }
  // Coverage: every residue mod 4 and mod 128, HCA windows closing, page-table changes, padding.
  EXPECT_EQ(res4.size(), 4u);
  EXPECT_EQ(res128.size(), 128u);
  EXPECT_GT(closes, 3);
  EXPECT_GT(deltas, int64_t(seqs.size()) + 4) << "page rows staged beyond the first sight";
  EXPECT_GT(padded, 20);
}

TEST(DecodePlan, PlanOpMatchesHostPlanner) {
  run_plan_case({128, 4, 128, 256, 96}, 1);
  run_plan_case({8, 4, 16, 128, 4}, 2);
  run_plan_case({16, 4, 32, 256, 6}, 3);
}

TEST(DecodePlan, StagerSendsOnlyChangedPageRows) {
  auto kv = bare_cache({8, 4, 16, 128, 4}, 4, 50);
  ASSERT_TRUE(kv);
  DecodeStager st(4, decode_table_pages(*kv, 4096));
  auto a = *kv->create_sequence();
  auto b = *kv->create_sequence();
  ASSERT_TRUE(kv->reserve(a, 10).ok());
  kv->commit(a, 10);
  ASSERT_TRUE(kv->reserve(b, 127).ok());
  kv->commit(b, 127);
  ForwardBatch batch;
  batch.slices = {{a, 10, {1}, false}, {b, 127, {2}, false}};
  st.stage(batch, *kv, 2);
  EXPECT_EQ(st.last_deltas(), 2);  // first sight
  EXPECT_EQ(st.host()[DecodeStager::kDeltaCount], 2);
  st.stage(batch, *kv, 2);
  EXPECT_EQ(st.last_deltas(), 0);         // nothing changed
  ASSERT_TRUE(kv->reserve(b, 129).ok());  // b crosses into its second page
  const int64_t ints = st.stage(batch, *kv, 4);
  EXPECT_EQ(st.last_deltas(), 1);
  EXPECT_EQ(st.host()[DecodeStager::kDeltaSeq], b);
  EXPECT_EQ(ints, DecodeStager::kDeltaRows + 2 * st.max_pages());
  EXPECT_EQ(st.host()[DecodeStager::kDeltaRows + 1], kv->pages(b)[1]);
  EXPECT_EQ(st.host()[DecodeStager::kSeq + 2], -1);  // padding rows
  EXPECT_EQ(st.host()[DecodeStager::kSeq + 3], -1);
  kv->free_sequence(a);  // same handle again: a new version
  auto a2 = *kv->create_sequence();
  EXPECT_EQ(a2, a);
  batch.slices = {{a2, 0, {1}, false}};
  ASSERT_TRUE(kv->reserve(a2, 1).ok());
  st.stage(batch, *kv, 1);
  EXPECT_EQ(st.last_deltas(), 1);
  st.invalidate();
  st.stage(batch, *kv, 1);
  EXPECT_EQ(st.last_deltas(), 1);
}

TEST(DecodePlan, StepMemoryWorkspaceReplaysEagerOffsets) {
  auto ops = ops::make_cpu_ops();
  auto run = [](StepMemory& m, std::vector<size_t>* offsets, char* base) {
    std::vector<void*> p;
    p.push_back(m.alloc(100));
    auto mk = m.mark();
    p.push_back(m.alloc(1000));
    p.push_back(m.alloc(1));
    m.release(mk);
    p.push_back(m.alloc(5000));
    p.push_back(m.alloc(0));
    if (offsets)
      for (void* q : p) offsets->push_back(q ? size_t(static_cast<char*>(q) - base) : size_t(-1));
  };
  StepMemory eager(ops.get());
  run(eager, nullptr, nullptr);
  EXPECT_EQ(eager.allocations(), 4);
  EXPECT_EQ(eager.peak(), 256 + 5000u);  // 100 → aligned 256; the released blocks are reused
  std::vector<char> region(eager.peak());
  StepMemory ws(region.data(), region.size());
  std::vector<size_t> off;
  run(ws, &off, region.data());
  EXPECT_EQ(off, (std::vector<size_t>{0, 256, 1280, 256, size_t(-1)}));
  EXPECT_EQ(ws.peak(), eager.peak());
  std::vector<char> small(eager.peak() - 1);
  StepMemory tight(small.data(), small.size());
  EXPECT_THROW(run(tight, nullptr, nullptr), std::length_error);
}

// ---- decode through the plan op vs through the host planner, real fixtures
// -----------------------

// CUDA-graph semantics on the CPU backend, for testing the model's graph path without a GPU:
// while capturing, every op call is recorded with its arguments (pointers and scalars, by value)
// instead of run; replay runs the recorded calls in order, so a replay does exactly what a CUDA
// graph does — the captured kernels on fixed addresses, no host code of the model. Like the CUDA
// backend, alloc/free/upload/download/synchronize are refused while capturing (they throw here).
class EmulatedGraphOps final : public ops::Ops {
 public:
  explicit EmulatedGraphOps(std::unique_ptr<ops::Ops> inner) : in_(std::move(inner)) {}
  int64_t replays = 0, uploads = 0, downloads = 0, allocs = 0, host_ops = 0;
  struct Counts {
    int64_t uploads, downloads, allocs, host_ops;
  };
  Counts counts() const { return {uploads, downloads, allocs, host_ops}; }

  std::string name() const override { return in_->name(); }
  void* alloc(size_t b) override {
    refuse("alloc");
    ++allocs;
    return in_->alloc(b);
  }
  void free(void* p) override {
    refuse("free");
    in_->free(p);
  }
  void upload(void* d, const void* s, size_t b) override {
    refuse("upload");
    ++uploads;
    in_->upload(d, s, b);
  }
  void download(void* d, const void* s, size_t b) override {
    refuse("download");
    ++downloads;
    in_->download(d, s, b);
  }
  void synchronize() override {
    refuse("synchronize");
    in_->synchronize();
  }
  bool supports(ops::WFormat f) const override { return in_->supports(f); }
  void linear(const float* x, int64_t ldx, const float* w, int64_t M, int64_t N, int64_t K,
              float* y, int64_t ldy) override {
    run([=, this] { in_->linear(x, ldx, w, M, N, K, y, ldy); });
  }
  void linear_w(const float* x, int64_t ldx, const ops::WeightView& w, int64_t M, float* y,
                int64_t ldy) override {
    run([=, this] { in_->linear_w(x, ldx, w, M, y, ldy); });
  }
  void add(float* y, const float* x, int64_t n) override {
    run([=, this] { in_->add(y, x, n); });
  }
  void gather_rows(const float* s, const int32_t* r, int64_t n, int64_t w, float* d) override {
    run([=, this] { in_->gather_rows(s, r, n, w, d); });
  }
  void store_rows(float* p, const int32_t* r, int64_t n, int64_t w, const float* s) override {
    run([=, this] { in_->store_rows(p, r, n, w, s); });
  }
  void embed(const float* t, const int32_t* ids, int64_t S, int D, int n, float* o) override {
    run([=, this] { in_->embed(t, ids, S, D, n, o); });
  }
  void rms_norm(const float* x, const float* w, int64_t r, int d, float e, float* y) override {
    run([=, this] { in_->rms_norm(x, w, r, d, e, y); });
  }
  void rope(float* x, int64_t r, int nh, int hd, int rd, const int64_t* p, const float* f, float sc,
            bool inv) override {
    run([=, this] { in_->rope(x, r, nh, hd, rd, p, f, sc, inv); });
  }
  void hc_pre(const ops::HcArgs& a) override {
    run([=, this] { in_->hc_pre(a); });
  }
  void hc_post(float* h, const float* f, const float* p, const float* c, int64_t S, int n,
               int D) override {
    run([=, this] { in_->hc_post(h, f, p, c, S, n, D); });
  }
  void hc_head(const float* h, const float* fn, const float* b, const float* sc, int64_t S, int n,
               int D, float re, float he, float* y) override {
    run([=, this] { in_->hc_head(h, fn, b, sc, S, n, D, re, he, y); });
  }
  void compress_pool(const ops::CompressArgs& a) override {
    run([=, this] { in_->compress_pool(a); });
  }
  void indexer_topk(const ops::IndexerArgs& a) override {
    run([=, this] { in_->indexer_topk(a); });
  }
  void sparse_attention(const ops::AttentionArgs& a) override {
    run([=, this] { in_->sparse_attention(a); });
  }
  void route(const ops::RouteArgs& a) override {
    run([=, this] { in_->route(a); });
  }
  void moe_experts(const ops::MoeArgs& a) override {
    run([=, this] { in_->moe_experts(a); });
  }
  void build_decode_plan(const ops::DecodePlanArgs& a) override {
    run([=, this] { in_->build_decode_plan(a); });
  }
  bool supports_graphs() const override { return true; }
  std::unique_ptr<ops::Graph> capture(const std::function<void()>& body) override {
    auto list = std::make_shared<std::vector<std::function<void()>>>();
    rec_ = list.get();
    try {
      body();
    } catch (...) {
      rec_ = nullptr;
      throw;
    }
    rec_ = nullptr;
    return std::make_unique<Recorded>(this, std::move(list));
  }

 private:
  class Recorded final : public ops::Graph {
   public:
    Recorded(EmulatedGraphOps* o, std::shared_ptr<std::vector<std::function<void()>>> l)
        : o_(o), l_(std::move(l)) {}
    void replay() override {
      ++o_->replays;
      for (auto& f : *l_) f();
    }

   private:
    EmulatedGraphOps* o_;
    std::shared_ptr<std::vector<std::function<void()>>> l_;
  };
  void refuse(const char* what) {
    if (rec_) throw std::logic_error(std::string(what) + " during graph capture");
  }
  template <typename F>
  void run(F&& f) {
    if (rec_) {
      rec_->push_back(std::forward<F>(f));
    } else {
      ++host_ops;
      f();
    }
  }
  std::unique_ptr<ops::Ops> in_;
  std::vector<std::function<void()>>* rec_ = nullptr;
};

struct Env {
  std::unique_ptr<ops::Ops> ops;
  EmulatedGraphOps* emu = nullptr;  // when the backend emulates graphs
  std::unique_ptr<DeepseekV4> model;
  std::unique_ptr<cache::KvCache> kv;
};

enum class Path { kHostPlan, kDevicePlan, kEmulatedGraphs };

Env make_env(const std::string& dir, Path path) {
  Env e;
  e.ops = ops::make_cpu_ops();
  if (path == Path::kEmulatedGraphs) {
    auto emu = std::make_unique<EmulatedGraphOps>(std::move(e.ops));
    e.emu = emu.get();
    e.ops = std::move(emu);
  }
  auto m = DeepseekV4::load(dir, e.ops.get());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return e;
  e.model = std::move(m).value();
  DeepseekV4::DecodeOptions o;
  o.device_plan = path == Path::kDevicePlan;
  o.graphs = path == Path::kEmulatedGraphs;
  o.min_context = 16;  // small context buckets: the steps below cross several
  e.model->set_decode_options(o);
  auto kv = e.model->make_cache(int64_t(128) << 20, 8);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  if (kv.ok()) e.kv = std::move(kv).value();
  return e;
}

// Five sequences of different lengths (windows 8/16/128, rates 4..128, pages of 256), each
// prefilled alone, then 30 steps in ragged batches of 3–5 rows (buckets 4 and 8 with padding,
// rotating order; step 11 also carries a prefill chunk, a mixed batch), run on `ref` (host
// planner) and `dev`: logits must be bit-identical at every step. Returns the number of
// decode-only batches `dev` ran (including the 1-token prompt).
int run_scenario(Env& ref, Env& dev, int steps) {
  const int64_t V = ref.model->config().vocab_size;
  const int lens[] = {1, 7, 40, 130, 253};
  std::vector<int32_t> sr, sd, last;
  std::vector<int64_t> pos;
  int decode_batches = 1;  // the 1-token prompt is a decode row
  for (int i = 0; i < 5; ++i) {
    const auto prompt = random_ids(V, lens[i], 100 + i);
    sr.push_back(*ref.kv->create_sequence());
    sd.push_back(*dev.kv->create_sequence());
    ForwardBatch br, bd;
    br.slices.push_back({sr[i], 0, prompt, false});
    bd.slices.push_back({sd[i], 0, prompt, false});
    auto orf = ref.model->forward(br, *ref.kv);
    auto od = dev.model->forward(bd, *dev.kv);
    EXPECT_TRUE(orf.ok() && od.ok());
    if (!orf.ok() || !od.ok()) return -1;
    EXPECT_EQ(first_diff(orf->logits, od->logits, V), "") << "prefill " << i;
    last.push_back(testing::argmax(orf->logits.data(), V));
    pos.push_back(lens[i]);
  }
  for (int step = 0; step < steps; ++step) {
    ForwardBatch br, bd;
    std::vector<int> who;
    for (int k = 0; k < 5; ++k) {
      const int i = (k + step) % 5;
      if (step % 3 != 0 && (i + step) % 4 == 0) continue;  // every 3rd step: all five
      who.push_back(i);
    }
    const bool mixed = step == 11;
    for (int i : who) {
      std::vector<int32_t> toks = {last[i]};
      if (mixed && i == who[0]) toks = random_ids(V, 5, 900 + step);
      br.slices.push_back({sr[i], pos[i], toks, false});
      bd.slices.push_back({sd[i], pos[i], toks, false});
    }
    auto orf = ref.model->forward(br, *ref.kv);
    auto od = dev.model->forward(bd, *dev.kv);
    EXPECT_TRUE(orf.ok()) << orf.status().to_string();
    EXPECT_TRUE(od.ok()) << od.status().to_string();
    if (!orf.ok() || !od.ok()) return -1;
    const std::string d = first_diff(orf->logits, od->logits, V);
    EXPECT_EQ(d, "") << "step " << step << " (" << who.size() << " rows" << (mixed ? ", mixed" : "")
                     << ")";
    if (!d.empty()) return -1;
    for (size_t r = 0; r < who.size(); ++r) {
      const int i = who[r];
      pos[i] += int64_t(br.slices[r].tokens.size());
      last[i] = testing::argmax(&orf->logits[size_t(r) * V], V);
    }
    decode_batches += !mixed;
  }
  return decode_batches;
}

TEST(DecodePlan, DevicePlanDecodeBitIdenticalToHostPlan) {
  const auto dirs = testing::fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    Env host = make_env(dir, Path::kHostPlan), dev = make_env(dir, Path::kDevicePlan);
    ASSERT_TRUE(host.kv && dev.kv);
    const int decode_batches = run_scenario(host, dev, 30);
    ASSERT_GT(decode_batches, 0);
    const auto& st = dev.model->decode_stats();
    EXPECT_EQ(st.device_plan_steps, decode_batches) << "every decode-only batch took the plan op";
    EXPECT_EQ(st.host_plan_steps, 5);  // 4 prompts of > 1 token + the mixed step
    EXPECT_EQ(st.graph_replays, 0);    // the CPU backend has no graphs
    EXPECT_GT(st.page_rows_sent, 5);
    EXPECT_EQ(host.model->decode_stats().device_plan_steps, 0);
  }
}

// The whole graph path (warm-up, capture into a workspace, replay of the recorded ops with new
// raw state) on the CPU through EmulatedGraphOps: bit-identical to the host planner, graphs
// reused, and a replayed step does one upload, one download and nothing else on the host.
TEST(DecodePlan, EmulatedGraphDecodeBitIdenticalToHostPlan) {
  const auto dirs = testing::fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    Env host = make_env(dir, Path::kHostPlan), gr = make_env(dir, Path::kEmulatedGraphs);
    ASSERT_TRUE(host.kv && gr.kv && gr.emu);
    const int decode_batches = run_scenario(host, gr, 40);
    ASSERT_GT(decode_batches, 0);
    const auto& st = gr.model->decode_stats();
    EXPECT_EQ(st.capture_failures, 0);
    EXPECT_EQ(st.device_plan_steps + st.graph_replays, decode_batches);
    EXPECT_EQ(st.captures, st.device_plan_steps) << "one warm-up per graph";
    EXPECT_EQ(gr.emu->replays, st.graph_replays);
    EXPECT_GE(st.captures, 3) << "buckets 4 and 8 × several context buckets";
    int64_t reused = 0;
    for (auto& [key, n] : st.replays) reused += n > 1;
    EXPECT_GE(reused, 2);
    std::string line;
    for (auto& [key, n] : st.replays)
      line += fmt::format(" (B={}, ctx={}): {}", key.first, key.second, n);
    std::printf("[emulated graphs] %s: %lld captures, %lld replays:%s\n", dir.c_str(),
                (long long)st.captures, (long long)st.graph_replays, line.c_str());

    // A replayed step: exactly one upload (raw state + page rows) and one download (logits).
    auto seq = *gr.kv->create_sequence();
    const int64_t V = gr.model->config().vocab_size;
    ForwardBatch b;
    b.slices.push_back({seq, 0, random_ids(V, 9, 5), false});
    ASSERT_TRUE(gr.model->forward(b, *gr.kv).ok());
    for (int i = 0; i < 4; ++i) {
      b.slices = {{seq, 9 + i, {int32_t(i)}, false}};
      const auto before = gr.emu->counts();
      const int64_t replays = gr.model->decode_stats().graph_replays;
      ASSERT_TRUE(gr.model->forward(b, *gr.kv).ok());
      if (i == 0) continue;  // bucket 1 warms up and captures
      EXPECT_EQ(gr.model->decode_stats().graph_replays, replays + 1);
      EXPECT_EQ(gr.emu->allocs - before.allocs, 0) << "step " << i;
      EXPECT_EQ(gr.emu->uploads - before.uploads, 1);
      EXPECT_EQ(gr.emu->downloads - before.downloads, 1);
      EXPECT_EQ(gr.emu->host_ops - before.host_ops, 0) << "no op ran outside the graph";
    }
    // Graphs switched off: the captured graphs are not replayed any more.
    gr.model->set_decode_graphs(false);
    const auto before = gr.model->decode_stats();
    b.slices = {{seq, 13, {7}, false}};
    ASSERT_TRUE(gr.model->forward(b, *gr.kv).ok());
    EXPECT_EQ(gr.model->decode_stats().graph_replays, before.graph_replays);
    EXPECT_EQ(gr.model->decode_stats().host_plan_steps, before.host_plan_steps + 1);
  }
}

// Graphs requested on a backend without them: the option is ignored (host planner), results equal.
TEST(DecodePlan, GraphsOnCpuFallBackToHostPlanner) {
  const auto dirs = testing::fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  Env e = make_env(dirs[0], Path::kHostPlan);
  ASSERT_TRUE(e.kv);
  EXPECT_FALSE(e.ops->supports_graphs());
  EXPECT_EQ(e.ops->capture([] {}), nullptr);
  e.model->set_decode_graphs(true);
  auto s = *e.kv->create_sequence();
  ForwardBatch b;
  b.slices.push_back({s, 0, {1, 2, 3}, false});
  ASSERT_TRUE(e.model->forward(b, *e.kv).ok());
  b.slices = {{s, 3, {4}, false}};
  ASSERT_TRUE(e.model->forward(b, *e.kv).ok());
  EXPECT_EQ(e.model->decode_stats().host_plan_steps, 2);
  EXPECT_EQ(e.model->decode_stats().device_plan_steps, 0);
}

}  // namespace
}  // namespace v4::model
