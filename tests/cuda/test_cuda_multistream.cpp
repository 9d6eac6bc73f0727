// Multi-stream branches on the GPU (CudaOptions::multi_stream, ops.h fork / branch / join; issue 7,
// docs/cuda.md §Multi-stream):
// - decode steps with multi_stream on give logits bit-identical to multi_stream off, eagerly
//   (device plan) and replayed as CUDA graphs, in fp32 and bf16 modes, on every fixture; the
//   greedy tokens with multi_stream on still equal the golden tokens (fp32);
// - the branches really ran on side streams (fork counter) and took no scratch slot at decode
//   sizes (no handoff during the decode steps);
// - op level: a fork whose branches write disjoint buffers, joined, then read on the main stream,
//   gives the serial result eagerly and under capture; with the region profile on the backend
//   runs the branches serially (no fork counted).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
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

struct Backend {
  std::unique_ptr<ops::Ops> cuda;
  std::unique_ptr<DeepseekV4> model;
  std::unique_ptr<cache::KvCache> kv;
};

Backend load(const std::string& dir, ops::Precision p, bool multi_stream, bool graphs) {
  unsetenv("V4_MULTI_STREAM");  // the options below decide
  Backend b;
  ops::CudaOptions co;
  co.precision = p;
  co.multi_stream = multi_stream;
  co.multi_stream_max_rows = 0;  // prefill chunks fork on side streams too (more coverage)
  auto o = ops::make_cuda_ops(co);
  EXPECT_TRUE(o.ok()) << o.status().to_string();
  if (!o.ok()) return b;
  b.cuda = std::move(o).value();
  auto model = DeepseekV4::load(dir, b.cuda.get());
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return b;
  b.model = std::move(model).value();
  DeepseekV4::DecodeOptions opt;
  opt.graphs = graphs;
  opt.device_plan = !graphs;
  opt.min_context = 64;
  b.model->set_decode_options(opt);
  auto kv = b.model->make_cache(int64_t(512) << 20, 8);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  if (kv.ok()) b.kv = std::move(kv).value();
  return b;
}

struct Decoded {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logits;  // per decode step [rows, V]
  ops::CudaStreamStats after_prefill, after_decode;
};

// Prefills each prompt alone, then `steps` greedy decode steps of all sequences together.
Decoded run(Backend& b, const std::vector<std::vector<int32_t>>& prompts, int steps) {
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
  d.after_prefill = ops::cuda_stream_stats(b.cuda.get());
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
  d.after_decode = ops::cuda_stream_stats(b.cuda.get());
  for (int32_t s : seqs) b.kv->free_sequence(s);
  return d;
}

void on_off_identical(ops::Precision p) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    auto gold = load_golden(dir);
    ASSERT_TRUE(gold.ok()) << gold.status().to_string();
    for (int graphs = 0; graphs < 2; ++graphs) {
      SCOPED_TRACE(graphs ? "graphs" : "eager plan op");
      Backend off = load(dir, p, false, graphs == 1), on = load(dir, p, true, graphs == 1);
      ASSERT_TRUE(off.kv && on.kv);
      const int64_t V = off.model->config().vocab_size;
      const std::vector<std::vector<int32_t>> prompts = {gold->prompt_ids,
                                                         random_ids(V, 77, 5)};
      const int steps = std::max<int>(20, int(gold->tokens.size()));
      const Decoded a = run(off, prompts, steps), b = run(on, prompts, steps);
      ASSERT_EQ(a.logits.size(), size_t(steps));
      ASSERT_EQ(b.logits.size(), size_t(steps));
      int bad = 0;
      for (int s = 0; s < steps; ++s) {
        const std::string d = first_diff(a.logits[s], b.logits[s], V);
        if (!d.empty() && bad++ < 3)
          ADD_FAILURE() << "decode step " << s << ": multi-stream on vs off differ at " << d;
      }
      EXPECT_EQ(a.tokens, b.tokens);
      if (p == ops::Precision::kFp32) {
        for (size_t i = 0; i < gold->tokens.size() && i < b.tokens[0].size(); ++i) {
          EXPECT_EQ(b.tokens[0][i], gold->tokens[i]) << "multi-stream on vs golden token " << i;
        }
      }
      const auto& c = on.model->config();
      // Eager: one fork per layer and step; graphs: forks are counted while capturing only.
      EXPECT_GE(b.after_prefill.forks, int64_t(prompts.size()) * c.num_hidden_layers);
      if (!graphs) {
        EXPECT_EQ(b.after_decode.forks - b.after_prefill.forks,
                  int64_t(steps) * c.num_hidden_layers);
      } else {
        EXPECT_GT(b.after_decode.forks, b.after_prefill.forks) << "captured with branches";
      }
      // fp32 decode linears take no scratch slot, so no branch waits for another. In bf16 mode
      // the 2-row decode runs dense_mma (scratch slots are one per backend): branches hand
      // slots over (serialized, still bit-identical) — why multi_stream_max_rows defaults to 1.
      if (p == ops::Precision::kFp32) {
        EXPECT_EQ(b.after_decode.scratch_handoffs, b.after_prefill.scratch_handoffs)
            << "a decode branch took a scratch slot (serialized)";
      }
      EXPECT_EQ(a.after_decode.forks, 0) << "multi_stream off forked on side streams";
      if (graphs) {
        EXPECT_GE(on.model->decode_stats().captures, 1);
        EXPECT_EQ(on.model->decode_stats().capture_failures, 0);
        EXPECT_GE(on.model->decode_stats().graph_replays, steps - 2);
      }
      std::printf("[multi-stream] %s %s %s: forks %lld, scratch handoffs %lld (prefill %lld)\n",
                  dir.c_str(), ops::precision_name(p), graphs ? "graphs" : "eager",
                  (long long)b.after_decode.forks, (long long)b.after_decode.scratch_handoffs,
                  (long long)b.after_prefill.scratch_handoffs);
    }
  }
}

TEST(CudaMultiStream, DecodeOnEqualsOffFp32) {
  V4_REQUIRE_GPU();
  on_off_identical(ops::Precision::kFp32);
}

TEST(CudaMultiStream, DecodeOnEqualsOffBf16) {
  V4_REQUIRE_GPU();
  on_off_identical(ops::Precision::kBf16);
}

// Op level: branch 1 computes y1 = x·W1ᵀ, branch 2 y2 = x·W2ᵀ, branch 0 y0 = x·W0ᵀ (disjoint
// outputs, shared input); after the join main adds y1 and y2 into y0. Eager and captured results
// must equal the same ops without branches (multi_stream off) bit for bit; the captured graph is
// replayed twice with new inputs in between.
TEST(CudaMultiStream, ForkJoinEagerAndCaptured) {
  V4_REQUIRE_GPU();
  unsetenv("V4_MULTI_STREAM");
  const int64_t M = 4, N = 2048, K = 1024;
  auto x = cuda::testing::randn(size_t(M * K));
  std::vector<std::vector<float>> w;
  for (int i = 0; i < 3; ++i) w.push_back(cuda::testing::randn(size_t(N * K), 0.03f));
  auto result = [&](bool multi, bool capture, int replays) {
    ops::CudaOptions co;
    co.multi_stream = multi;
    auto ob = ops::make_cuda_ops(co);
    EXPECT_TRUE(ob.ok());
    ops::Ops& o = **ob;
    ops::DeviceBuffer<float> dx(&o, M * K), dy0(&o, M * N), dy1(&o, M * N), dy2(&o, M * N);
    std::vector<ops::DeviceBuffer<float>> dw;
    for (int i = 0; i < 3; ++i) {
      dw.emplace_back(&o, N * K);
      o.upload(dw[i].data(), w[i].data(), w[i].size() * 4);
    }
    o.upload(dx.data(), x.data(), x.size() * 4);
    auto body = [&] {
      o.fork(3);
      o.linear(dx.data(), K, dw[0].data(), M, N, K, dy0.data(), N);
      o.branch(1);
      o.linear(dx.data(), K, dw[1].data(), M, N, K, dy1.data(), N);
      o.branch(2);
      o.linear(dx.data(), K, dw[2].data(), M, N, K, dy2.data(), N);
      o.rms_norm(dy2.data(), nullptr, M, int(N), 1e-6f, dy2.data());
      o.join();
      o.add(dy0.data(), dy1.data(), M * N);
      o.add(dy0.data(), dy2.data(), M * N);
    };
    std::vector<float> out(size_t(M * N));
    body();  // eager (also the warm-up a capture needs)
    if (capture) {
      auto g = o.capture(body);
      EXPECT_TRUE(g != nullptr) << "capture with fork/join failed";
      if (g)
        for (int r = 0; r < replays; ++r) {
          // Poison the outputs: the replay must rewrite them.
          std::vector<float> nan(size_t(M * N), std::nanf(""));
          o.upload(dy0.data(), nan.data(), nan.size() * 4);
          o.upload(dy1.data(), nan.data(), nan.size() * 4);
          g->replay();
        }
    }
    o.download(out.data(), dy0.data(), out.size() * 4);
    const auto st = ops::cuda_stream_stats(&o);
    if (multi) {
      EXPECT_GE(st.forks, capture ? 2 : 1);
    } else {
      EXPECT_EQ(st.forks, 0);
    }
    return out;
  };
  const auto ref = result(false, false, 0);
  const auto eager = result(true, false, 0);
  const auto graph = result(true, true, 2);
  EXPECT_EQ(first_diff(ref, eager, N), "");
  EXPECT_EQ(first_diff(ref, graph, N), "");
  for (float v : ref) ASSERT_TRUE(std::isfinite(v));
}

// Ops::branch_wait orders a cross-stream read: branch 0 issues kAdds adds into x (~0.5 ms of
// work), branch 3 waits on branch 0 and adds x into y. Without the wait branch 3's stream is
// ordered only after the fork event and would read a partial x (y < kAdds). Eager and replayed
// from a graph (the event record / wait become a graph edge); a wait on a branch that has issued
// nothing in this fork (2) is a no-op.
TEST(CudaMultiStream, BranchWaitOrdersACrossStreamRead) {
  V4_REQUIRE_GPU();
  unsetenv("V4_MULTI_STREAM");
  const int64_t n = int64_t(1) << 20;
  const int kAdds = 256;
  ops::CudaOptions co;
  co.multi_stream = true;
  auto ob = ops::make_cuda_ops(co);
  ASSERT_TRUE(ob.ok());
  ops::Ops& o = **ob;
  ops::DeviceBuffer<float> dx(&o, n), dy(&o, n), dones(&o, n);
  const std::vector<float> ones(size_t(n), 1.f), zeros(size_t(n), 0.f);
  o.upload(dones.data(), ones.data(), size_t(n) * 4);
  auto reset = [&] {
    o.upload(dx.data(), zeros.data(), size_t(n) * 4);
    o.upload(dy.data(), zeros.data(), size_t(n) * 4);
  };
  auto body = [&] {
    o.fork(4);
    for (int i = 0; i < kAdds; ++i) o.add(dx.data(), dones.data(), n);
    o.branch(3);
    o.branch_wait(2);  // branch 2 issued nothing in this fork
    o.branch_wait(0);
    o.add(dy.data(), dx.data(), n);
    o.join();
  };
  auto check = [&](const char* what) {
    std::vector<float> y(static_cast<size_t>(n));
    o.download(y.data(), dy.data(), size_t(n) * 4);
    int64_t bad = 0;
    for (float v : y) bad += v != float(kAdds);
    EXPECT_EQ(bad, 0) << what << ": y[0] = " << y[0] << ", want " << kAdds;
  };
  reset();
  body();
  check("eager");
  auto g = o.capture(body);
  ASSERT_NE(g, nullptr) << "capture with branch_wait failed";
  for (int r = 0; r < 2; ++r) {
    reset();
    g->replay();
    check("replay");
  }
  EXPECT_GE(ops::cuda_stream_stats(&o).forks, 2);
}

// With the region profile on, the branches run on the main stream (markers time one stream).
TEST(CudaMultiStream, ProfilingRunsBranchesSerially) {
  V4_REQUIRE_GPU();
  unsetenv("V4_MULTI_STREAM");
  ops::CudaOptions co;
  co.multi_stream = true;
  auto ob = ops::make_cuda_ops(co);
  ASSERT_TRUE(ob.ok());
  ops::Ops& o = **ob;
  ASSERT_TRUE(o.set_profiling(true));
  ops::DeviceBuffer<float> a(&o, 256), b(&o, 256);
  o.step_begin(true);
  o.region("r");
  o.fork(2);
  o.add(a.data(), b.data(), 256);
  o.branch(1);
  o.add(b.data(), b.data(), 256);
  o.join();
  o.step_end();
  o.synchronize();
  EXPECT_EQ(ops::cuda_stream_stats(&o).forks, 0);
  ASSERT_TRUE(o.set_profiling(false));
  o.fork(2);
  o.branch(1);
  o.add(b.data(), b.data(), 256);
  o.join();
  o.synchronize();
  EXPECT_EQ(ops::cuda_stream_stats(&o).forks, 1);
}

// Forks of more rows than multi_stream_max_rows run in issue order; at or below it, on side
// streams; rows = 0 (unknown) counts as small.
TEST(CudaMultiStream, ForksAboveTheRowLimitRunSerially) {
  V4_REQUIRE_GPU();
  unsetenv("V4_MULTI_STREAM");
  ops::CudaOptions co;
  co.multi_stream = true;
  co.multi_stream_max_rows = 16;
  auto ob = ops::make_cuda_ops(co);
  ASSERT_TRUE(ob.ok());
  ops::Ops& o = **ob;
  ops::DeviceBuffer<float> a(&o, 256), b(&o, 256);
  int64_t expect = 0;
  for (int64_t rows : {int64_t(0), int64_t(1), int64_t(16), int64_t(17), int64_t(4096)}) {
    o.fork(2, rows);
    o.add(a.data(), a.data(), 256);
    o.branch(1);
    o.add(b.data(), b.data(), 256);
    o.join();
    o.synchronize();
    expect += rows <= 16 ? 1 : 0;
    EXPECT_EQ(ops::cuda_stream_stats(&o).forks, expect) << "rows " << rows;
  }
}

}  // namespace
}  // namespace v4::model
