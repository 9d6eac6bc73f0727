// Multi-stream branches of the attention (ops.h fork / branch / join, issue 7) checked on the CPU
// with BranchOps, a forwarding double that
// - checks the nesting: fork only when not forked, branch(b) with 0 ≤ b < branches, join after a
//   fork, no alloc/free/upload/download/synchronize/copy_batch between fork and join, every fork
//   joined before the step ends;
// - records, per branch, the byte ranges each op reads and writes (pool rows exactly, from the
//   index arrays, which are host memory on the CPU backend) and reports every pair of ops on
//   different branches where one writes a range the other touches;
// - defers the ops of a fork and runs them at the join branch by branch in REVERSE order (the
//   last branch first), the issue order a concurrent device could pick that differs most from
//   the serial one: a hidden dependency between branches changes the results. branch_wait(b)
//   is the one allowed cross-branch order: ops issued after it on the waiting branch run after
//   branch b's ops issued before it (and may touch what those wrote without a conflict).
// Logits of prefill and decode steps through BranchOps must be bit-identical to the plain CPU
// backend (where fork/join are no-ops), on every fixture (SWA-only, CSA and HCA layers).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "model/deepseek_v4.h"
#include "model_test_util.h"
#include "ops/ops.h"

namespace v4::model {
namespace {

using testing::first_diff;
using testing::random_ids;

class BranchOps final : public ops::Ops {
 public:
  explicit BranchOps(std::unique_ptr<ops::Ops> inner, bool reverse = true)
      : in_(std::move(inner)), reverse_(reverse) {}

  int64_t forks = 0;      // fork/join pairs seen
  int64_t branched = 0;   // ops issued on a branch > 0
  std::vector<std::string> errors;  // nesting violations and conflicts

  bool forked() const { return forked_; }

  std::string name() const override { return in_->name(); }
  void* alloc(size_t b) override {
    host("alloc");
    return in_->alloc(b);
  }
  void free(void* p) override {
    host("free");
    in_->free(p);
  }
  void upload(void* d, const void* s, size_t b) override {
    host("upload");
    in_->upload(d, s, b);
  }
  void download(void* d, const void* s, size_t b) override {
    host("download");
    in_->download(d, s, b);
  }
  void synchronize() override {
    host("synchronize");
    in_->synchronize();
  }
  void copy_batch(const CopySegment* segs, int64_t n) override {
    host("copy_batch");
    in_->copy_batch(segs, n);
  }
  bool supports(ops::WFormat f) const override { return in_->supports(f); }
  void step_end() override {
    if (forked_) err("step_end between fork and join");
    in_->step_end();
  }

  // ---- fork / branch / join ----------------------------------------------------------------
  void fork(int n, int64_t rows = 0) override {
    (void)rows;
    if (forked_) return err("fork while forked");
    if (n < 1) return err(fmt::format("fork({})", n));
    forked_ = true;
    n_ = n;
    cur_ = 0;
    pending_.assign(size_t(n), {});
    acc_.assign(size_t(n), {});
    waits_.clear();
    done_.assign(size_t(n), 0);
    ++forks;
  }
  void branch_wait(int b) override {
    if (!forked_) return err(fmt::format("branch_wait({}) outside a fork", b));
    if (b < 0 || b >= n_) return err(fmt::format("branch_wait({}) of a fork of {}", b, n_));
    if (b != cur_) waits_.push_back({cur_, op_, b, op_});
  }
  void branch(int b) override {
    if (!forked_) return err(fmt::format("branch({}) outside a fork", b));
    if (b < 0 || b >= n_) return err(fmt::format("branch({}) of a fork of {}", b, n_));
    cur_ = b;
  }
  void join() override {
    if (!forked_) return err("join without fork");
    check_conflicts();
    forked_ = false;
    cur_ = 0;
    for (int i = 0; i < n_; ++i) {
      const int b = reverse_ ? n_ - 1 - i : i;
      run_upto(b, INT64_MAX);
    }
    pending_.clear();
    acc_.clear();
    waits_.clear();
  }

  // ---- ops: accesses recorded while forked ---------------------------------------------------
  void linear(const float* x, int64_t ldx, const float* w, int64_t M, int64_t N, int64_t K,
              float* y, int64_t ldy) override {
    if (forked_) {
      rd("linear x", x, ((M - 1) * ldx + K) * 4);
      wr("linear y", y, ((M - 1) * ldy + N) * 4);
    }
    run([=, this] { in_->linear(x, ldx, w, M, N, K, y, ldy); });
  }
  void linear_w(const float* x, int64_t ldx, const ops::WeightView& w, int64_t M, float* y,
                int64_t ldy) override {
    if (forked_) {
      rd("linear_w x", x, ((M - 1) * ldx + w.k) * 4);
      wr("linear_w y", y, ((M - 1) * ldy + w.n) * 4);
    }
    run([=, this] { in_->linear_w(x, ldx, w, M, y, ldy); });
  }
  void linear_w_grouped(const float* x, int64_t ldx, const ops::WeightView& w, int groups,
                        int64_t M, float* y, int64_t ldy) override {
    if (forked_) {
      rd("linear_w_grouped x", x, ((M - 1) * ldx + groups * w.k) * 4);
      wr("linear_w_grouped y", y, ((M - 1) * ldy + w.n) * 4);
    }
    run([=, this] { in_->linear_w_grouped(x, ldx, w, groups, M, y, ldy); });
  }
  void add(float* y, const float* x, int64_t n) override {
    if (forked_) {
      rd("add x", x, n * 4);
      wr("add y", y, n * 4);
    }
    run([=, this] { in_->add(y, x, n); });
  }
  void gather_rows(const float* s, const int32_t* r, int64_t n, int64_t w, float* d) override {
    if (forked_) {
      rd("gather_rows rows", r, n * 4);
      for (int64_t i = 0; i < n; ++i) rd("gather_rows src", s + int64_t(r[i]) * w, w * 4);
      wr("gather_rows dst", d, n * w * 4);
    }
    run([=, this] { in_->gather_rows(s, r, n, w, d); });
  }
  void store_rows(float* p, const int32_t* r, int64_t n, int64_t w, const float* s) override {
    if (forked_) {
      rd("store_rows rows", r, n * 4);
      rd("store_rows src", s, n * w * 4);
      for (int64_t i = 0; i < n; ++i)
        if (r[i] >= 0) wr("store_rows pool row", p + int64_t(r[i]) * w, w * 4);
    }
    run([=, this] { in_->store_rows(p, r, n, w, s); });
  }
  void rms_norm(const float* x, const float* w, int64_t r, int d, float e, float* y) override {
    if (forked_) {
      rd("rms_norm x", x, r * d * 4);
      wr("rms_norm y", y, r * d * 4);
    }
    run([=, this] { in_->rms_norm(x, w, r, d, e, y); });
  }
  void rope(float* x, int64_t r, int nh, int hd, int rd_, const int64_t* p, const float* f,
            float sc, bool inv) override {
    if (forked_) {
      rd("rope positions", p, r * 8);
      wr("rope x", x, r * nh * hd * 4);
    }
    run([=, this] { in_->rope(x, r, nh, hd, rd_, p, f, sc, inv); });
  }
  void compress_fused(const ops::CompressFusedArgs& a) override {
    if (forked_) {
      const int64_t cd = int64_t(a.overlap) * a.dim, slots = int64_t(a.overlap) * a.ratio;
      rd("compress src", a.src, a.n_out * slots * 4);
      rd("compress positions", a.positions, a.n_out * 8);
      rd("compress dst", a.dst, a.n_out * 4);
      rd("compress ring_src", a.ring_src, a.n_ring * 4);
      rd("compress ring_dst", a.ring_dst, a.n_ring * 4);
      for (int64_t r = 0; r < a.n_out; ++r) {
        if (a.dst[r] < 0) continue;
        // The pool row of its dtype (was `void*` arithmetic on dst · dim bytes with dim · 4 bytes
        // long: the right row only for 1-byte rows).
        const int64_t row_bytes = kv_row_bytes(a.pool_dtype, a.dim, a.rope_dim);
        wr("compress pool row", static_cast<const char*>(a.pool) + int64_t(a.dst[r]) * row_bytes,
           row_bytes);
        for (int64_t j = 0; j < slots; ++j) {
          const int32_t v = a.src[r * slots + j];
          if (v >= 0) {
            rd("compress fresh_kv", a.fresh_kv + int64_t(v) * cd, cd * 4);
            rd("compress fresh_gate", a.fresh_gate + int64_t(v) * cd, cd * 4);
          } else if (v <= -2) {
            rd("compress state_kv", a.state_kv + int64_t(-v - 2) * cd, cd * 4);
            rd("compress state_gate", a.state_gate + int64_t(-v - 2) * cd, cd * 4);
          }
        }
      }
      for (int64_t i = 0; i < a.n_ring; ++i) {
        if (a.ring_dst[i] < 0) continue;
        rd("compress ring fresh_kv", a.fresh_kv + int64_t(a.ring_src[i]) * cd, cd * 4);
        rd("compress ring fresh_gate", a.fresh_gate + int64_t(a.ring_src[i]) * cd, cd * 4);
        wr("compress state_kv row", a.state_kv + int64_t(a.ring_dst[i]) * cd, cd * 4);
        wr("compress state_gate row", a.state_gate + int64_t(a.ring_dst[i]) * cd, cd * 4);
      }
      if (a.scratch)
        wr("compress scratch", a.scratch,
           std::max<int64_t>(a.n_out * a.dim, a.n_ring * cd) * 4);
    }
    run([=, this] { in_->compress_fused(a); });
  }

  // Ops the model never issues between fork and join (flagged if it does).
  void embed(const float* t, const int32_t* ids, int64_t S, int D, int n, float* o) override {
    unexpected("embed");
    in_->embed(t, ids, S, D, n, o);
  }
  void hc_pre(const ops::HcArgs& a) override {
    unexpected("hc_pre");
    in_->hc_pre(a);
  }
  void hc_post(float* h, const float* f, const float* p, const float* c, int64_t S, int n,
               int D) override {
    unexpected("hc_post");
    in_->hc_post(h, f, p, c, S, n, D);
  }
  void hc_head(const float* h, const float* fn, const float* b, const float* sc, int64_t S, int n,
               int D, float re, float he, float* y) override {
    unexpected("hc_head");
    in_->hc_head(h, fn, b, sc, S, n, D, re, he, y);
  }
  void compress_pool(const ops::CompressArgs& a) override {
    unexpected("compress_pool");
    in_->compress_pool(a);
  }
  void indexer_topk(const ops::IndexerArgs& a) override {
    if (forked_) {
      const int64_t row_bytes = kv_row_bytes(a.key_dtype, a.head_dim, 0);
      rd("indexer q", a.q, a.n_rows * a.n_heads * a.head_dim * 4);
      rd("indexer weights", a.weights, a.n_rows * a.n_heads * 4);
      rd("indexer cand count", a.cand.count, a.n_rows * 4);
      for (int64_t t = 0; t < a.n_rows; ++t) {
        const int32_t* list = a.cand.rows + a.cand.offset[t];
        rd("indexer cand rows", list, int64_t(a.cand.count[t]) * 4);
        for (int32_t s = 0; s < a.cand.count[t]; ++s)
          if (list[s] >= 0)
            rd("indexer key row", static_cast<const char*>(a.key_pool) + list[s] * row_bytes,
               row_bytes);
      }
      wr("indexer out rows", a.out_rows, a.n_rows * a.topk * 4);
      wr("indexer out count", a.out_count, a.n_rows * 4);
    }
    run([=, this] { in_->indexer_topk(a); });
  }
  void sparse_attention(const ops::AttentionArgs& a) override {
    unexpected("sparse_attention");
    in_->sparse_attention(a);
  }
  void route(const ops::RouteArgs& a) override {
    unexpected("route");
    in_->route(a);
  }
  void moe_experts(const ops::MoeArgs& a) override {
    unexpected("moe_experts");
    in_->moe_experts(a);
  }
  void build_decode_plan(const ops::DecodePlanArgs& a) override {
    unexpected("build_decode_plan");
    in_->build_decode_plan(a);
  }
  bool sample(const ops::SampleArgs& a) override {
    unexpected("sample");
    return in_->sample(a);
  }

 private:
  struct Access {
    const char* what;
    uintptr_t lo, hi;
    bool write;
    int64_t op;  // issue index within the fork
  };
  void err(const std::string& e) { errors.push_back(e); }
  void host(const char* what) {
    if (forked_) err(std::string(what) + " between fork and join");
  }
  void unexpected(const char* what) {
    if (forked_) err(std::string(what) + " issued inside a fork (the model keeps it after join)");
  }
  void touch(const char* what, const void* p, int64_t bytes, bool write) {
    if (!p || bytes <= 0) return;
    const auto lo = reinterpret_cast<uintptr_t>(p);
    acc_[size_t(cur_)].push_back({what, lo, lo + uintptr_t(bytes), write, op_});
  }
  void rd(const char* what, const void* p, int64_t bytes) { touch(what, p, bytes, false); }
  void wr(const char* what, const void* p, int64_t bytes) { touch(what, p, bytes, true); }
  // branch_wait(from) issued on `branch` when the fork's next op index was `at`: ops of `branch`
  // with index ≥ at run after the ops of `from` with index < upto.
  struct Wait {
    int branch;
    int64_t at;
    int from;
    int64_t upto;
  };
  template <typename F>
  void run(F&& f) {
    if (!forked_) return f();
    if (cur_ > 0) ++branched;
    pending_[size_t(cur_)].push_back({op_, std::function<void()>(std::forward<F>(f))});
    ++op_;
  }
  // Runs branch b's deferred ops with issue index < upto (each after the ops its waits need).
  void run_upto(int b, int64_t upto) {
    auto& q = pending_[size_t(b)];
    size_t& next = done_[size_t(b)];
    while (next < q.size() && q[next].first < upto) {
      const int64_t idx = q[next].first;
      for (const Wait& w : waits_)
        if (w.branch == b && w.at <= idx) run_upto(w.from, w.upto);
      auto f = std::move(q[next].second);
      ++next;
      f();
    }
  }
  // Whether access x (branch i) is ordered before access y (branch j) by a branch_wait.
  bool ordered(const Access& x, int i, const Access& y, int j) const {
    for (const Wait& w : waits_)
      if (w.branch == j && w.from == i && x.op < w.upto && y.op >= w.at) return true;
    return false;
  }
  void check_conflicts() {
    for (int i = 0; i < n_; ++i)
      for (int j = i + 1; j < n_; ++j)
        for (const Access& a : acc_[size_t(i)])
          for (const Access& b : acc_[size_t(j)])
            if ((a.write || b.write) && a.lo < b.hi && b.lo < a.hi && !ordered(a, i, b, j) &&
                !ordered(b, j, a, i))
              err(fmt::format("conflict: branch {} {} ({}) and branch {} {} ({}) overlap", i,
                              a.what, a.write ? "write" : "read", j, b.what,
                              b.write ? "write" : "read"));
  }

  std::unique_ptr<ops::Ops> in_;
  bool reverse_;
  bool forked_ = false;
  int n_ = 0, cur_ = 0;
  int64_t op_ = 0;
  std::vector<std::vector<std::pair<int64_t, std::function<void()>>>> pending_;  // (issue index, op)
  std::vector<size_t> done_;  // per branch: deferred ops already run at the join
  std::vector<std::vector<Access>> acc_;
  std::vector<Wait> waits_;
};

struct Run {
  std::unique_ptr<ops::Ops> ops;
  BranchOps* br = nullptr;
  std::unique_ptr<DeepseekV4> model;
  std::unique_ptr<cache::KvCache> kv;
};

Run make_run(const std::string& dir, bool branch_ops, bool device_plan) {
  Run r;
  r.ops = ops::make_cpu_ops();
  if (branch_ops) {
    auto b = std::make_unique<BranchOps>(std::move(r.ops));
    r.br = b.get();
    r.ops = std::move(b);
  }
  auto m = DeepseekV4::load(dir, r.ops.get());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return r;
  r.model = std::move(m).value();
  DeepseekV4::DecodeOptions o;
  o.device_plan = device_plan;
  o.min_context = 16;
  r.model->set_decode_options(o);
  auto kv = r.model->make_cache(int64_t(128) << 20, 4);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  if (kv.ok()) r.kv = std::move(kv).value();
  return r;
}

// Two sequences (prompts of 37 and 150 tokens, so compressed rows and rings are in use), then
// `steps` decode steps of both together; every step's logits compared bit for bit.
void compare(const std::string& dir, bool device_plan) {
  Run ref = make_run(dir, false, device_plan), dev = make_run(dir, true, device_plan);
  ASSERT_TRUE(ref.model && ref.kv && dev.model && dev.kv);
  const int64_t V = ref.model->config().vocab_size;
  const int lens[] = {37, 150};
  std::vector<int32_t> sr, sd, last;
  std::vector<int64_t> pos;
  for (int i = 0; i < 2; ++i) {
    const auto prompt = random_ids(V, lens[i], 7 + i);
    sr.push_back(*ref.kv->create_sequence());
    sd.push_back(*dev.kv->create_sequence());
    ForwardBatch a, b;
    a.slices.push_back({sr[i], 0, prompt, false});
    b.slices.push_back({sd[i], 0, prompt, false});
    auto oa = ref.model->forward(a, *ref.kv);
    auto ob = dev.model->forward(b, *dev.kv);
    ASSERT_TRUE(oa.ok() && ob.ok());
    EXPECT_EQ(first_diff(oa->logits, ob->logits, V), "") << dir << " prefill " << i;
    last.push_back(testing::argmax(oa->logits.data(), V));
    pos.push_back(lens[i]);
  }
  for (int step = 0; step < 12; ++step) {
    ForwardBatch a, b;
    for (int i = 0; i < 2; ++i) {
      a.slices.push_back({sr[i], pos[i], {last[i]}, false});
      b.slices.push_back({sd[i], pos[i], {last[i]}, false});
    }
    auto oa = ref.model->forward(a, *ref.kv);
    auto ob = dev.model->forward(b, *dev.kv);
    ASSERT_TRUE(oa.ok() && ob.ok());
    ASSERT_EQ(first_diff(oa->logits, ob->logits, V), "") << dir << " decode step " << step;
    for (int i = 0; i < 2; ++i) {
      last[i] = testing::argmax(oa->logits.data() + int64_t(i) * V, V);
      ++pos[i];
    }
  }
  const ModelConfig& c = ref.model->config();
  const int64_t steps = 2 + 12;
  EXPECT_EQ(dev.br->forks, steps * c.num_hidden_layers) << dir << ": one fork per layer and step";
  EXPECT_GT(dev.br->branched, 0) << dir;
  EXPECT_FALSE(dev.br->forked()) << dir;
  for (const std::string& e : dev.br->errors) ADD_FAILURE() << dir << ": " << e;
  if (device_plan) {
    EXPECT_GT(dev.model->decode_stats().device_plan_steps, 0) << dir;
  }
}

TEST(MultiStream, BranchesReorderedGiveIdenticalLogitsHostPlan) {
  for (const std::string& dir : testing::fixture_dirs()) compare(dir, false);
}

TEST(MultiStream, BranchesReorderedGiveIdenticalLogitsDevicePlan) {
  for (const std::string& dir : testing::fixture_dirs()) compare(dir, true);
}

// The double itself: it reports a cross-branch write/read overlap and bad nesting, and running
// branches in reverse order really changes a dependent chain (so the logits test can fail).
TEST(MultiStream, DoubleDetectsConflictsNestingAndReorders) {
  BranchOps o(ops::make_cpu_ops());
  float* buf = static_cast<float*>(o.alloc(8 * sizeof(float)));
  float* out = static_cast<float*>(o.alloc(8 * sizeof(float)));
  const float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1}, twos[8] = {2, 2, 2, 2, 2, 2, 2, 2};
  o.upload(buf, ones, sizeof ones);
  o.upload(out, ones, sizeof ones);
  float* tw = static_cast<float*>(o.alloc(8 * sizeof(float)));
  o.upload(tw, twos, sizeof twos);
  o.fork(2);
  o.add(buf, tw, 8);  // branch 0 writes buf (1 + 2 = 3)
  o.branch(1);
  o.add(out, buf, 4);  // branch 1 reads buf: a dependency the branches do not express
  o.join();
  ASSERT_EQ(o.errors.size(), 1u);
  EXPECT_NE(o.errors[0].find("conflict"), std::string::npos) << o.errors[0];
  float r[8];
  o.download(r, out, sizeof r);
  EXPECT_EQ(r[0], 2.f) << "branch 1 ran first (reverse order): it saw buf = 1, not 3";
  o.errors.clear();
  o.branch(0);
  o.join();
  o.fork(2);
  o.fork(2);
  o.branch(2);
  o.upload(buf, ones, sizeof ones);
  o.join();
  EXPECT_EQ(o.errors.size(), 5u);  // branch outside, join without fork, nested fork, branch 2, upload
  o.free(buf);
  o.free(out);
  o.free(tw);
}

// branch_wait: branch 1 reads what branch 0 wrote before the wait — ordered, no conflict, and the
// reverse-order replay runs branch 0's earlier op first; branch 0 writing the same buffer again
// after the wait is still a conflict (the wait orders only what was issued before it), and so is
// a read issued on branch 1 before the wait.
TEST(MultiStream, DoubleOrdersBranchWait) {
  BranchOps o(ops::make_cpu_ops());
  float* a = static_cast<float*>(o.alloc(8 * sizeof(float)));
  float* out = static_cast<float*>(o.alloc(8 * sizeof(float)));
  float* tw = static_cast<float*>(o.alloc(8 * sizeof(float)));
  const float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1}, twos[8] = {2, 2, 2, 2, 2, 2, 2, 2};
  auto reset = [&] {
    o.upload(a, ones, sizeof ones);
    o.upload(out, ones, sizeof ones);
    o.upload(tw, twos, sizeof twos);
  };
  float r[8];
  // 1. Ordered: no conflict, branch 1 sees a = 3.
  reset();
  o.fork(2);
  o.add(a, tw, 8);  // branch 0: a = 3
  o.branch(1);
  o.branch_wait(0);
  o.add(out, a, 8);  // branch 1: out = 1 + 3
  o.join();
  EXPECT_TRUE(o.errors.empty()) << (o.errors.empty() ? "" : o.errors[0]);
  o.download(r, out, sizeof r);
  EXPECT_EQ(r[0], 4.f) << "branch 1's read ran before branch 0's write";
  // 2. Branch 0 writes a again after the wait: one conflict (that write vs branch 1's read).
  o.errors.clear();
  reset();
  o.fork(2);
  o.add(a, tw, 8);
  o.branch(1);
  o.branch_wait(0);
  o.add(out, a, 8);
  o.branch(0);
  o.add(a, tw, 8);
  o.join();
  ASSERT_EQ(o.errors.size(), 1u);
  EXPECT_NE(o.errors[0].find("conflict"), std::string::npos) << o.errors[0];
  // 3. A read on branch 1 issued before the wait: a conflict too.
  o.errors.clear();
  reset();
  o.fork(2);
  o.add(a, tw, 8);
  o.branch(1);
  o.add(out, a, 8);
  o.branch_wait(0);
  o.join();
  ASSERT_EQ(o.errors.size(), 1u);
  EXPECT_NE(o.errors[0].find("conflict"), std::string::npos) << o.errors[0];
  // 4. A wait outside a fork and on a branch the fork does not have: errors.
  o.errors.clear();
  o.branch_wait(0);
  o.fork(2);
  o.branch_wait(2);
  o.join();
  EXPECT_EQ(o.errors.size(), 2u);
  o.free(a);
  o.free(out);
  o.free(tw);
}

}  // namespace
}  // namespace v4::model
