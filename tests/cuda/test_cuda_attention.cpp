// Split-KV sparse attention (src/ops/cuda/attention.h) vs the CPU op, on fresh random inputs:
// V4 shapes (64 heads, hd 512) with CSA-like (128 SWA + 512 top-k) and HCA-like (128 + 8192)
// key lists, odd shapes, −1 rows, rows with no keys, several split counts. Outputs poisoned.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "cuda_test_util.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_dec.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

using cuda::testing::Dev;
using cuda::testing::rand_int;
using cuda::testing::randn;
using cuda::testing::rel_err;

struct Case {
  int64_t S;
  int H, hd, swa, comp;
  int64_t swa_rows, comp_rows;
};

TEST(CudaAttention, SplitKvEqualsCpu) {
  V4_REQUIRE_GPU();
  auto cpu = make_cpu_ops();
  for (Case c : {Case{1, 64, 512, 128, 512, 300, 4000}, Case{2, 64, 512, 128, 8192, 300, 9000},
                 Case{5, 16, 512, 7, 70, 40, 200}, Case{3, 3, 40, 5, 9, 40, 50},
                 Case{4, 4, 32, 8, 0, 40, 1}, Case{37, 64, 512, 128, 512, 5000, 5000}}) {
    SCOPED_TRACE(::testing::Message() << "S=" << c.S << " H=" << c.H << " hd=" << c.hd
                                      << " swa=" << c.swa << " comp=" << c.comp);
    const int64_t S = c.S;
    auto q = randn(size_t(S * c.H * c.hd), 0.3f), sinks = randn(size_t(c.H));
    auto swa_pool = randn(size_t(c.swa_rows * c.hd), 0.3f);
    auto comp_pool = randn(size_t(c.comp_rows * c.hd), 0.3f);
    std::vector<int32_t> swa_r, comp_r, swa_c(S), comp_c(S);
    std::vector<int64_t> swa_o(S), comp_o(S);
    for (int64_t t = 0; t < S; ++t) {
      swa_o[t] = int64_t(swa_r.size());
      // Row 1 of multi-row cases has no keys at all (sink only → output 0).
      const bool empty = S > 2 && t == 1;
      swa_c[t] = empty ? 0 : std::max(1, c.swa - int(t));
      for (int j = 0; j < swa_c[t]; ++j)
        swa_r.push_back(j == 2 ? -1 : rand_int(0, int(c.swa_rows) - 1));
      comp_o[t] = int64_t(comp_r.size());
      comp_c[t] = empty ? 0 : c.comp - int(t % 3);
      comp_c[t] = std::max(0, comp_c[t]);
      for (int j = 0; j < comp_c[t]; ++j)
        comp_r.push_back(j % 17 == 5 ? -1 : rand_int(0, int(c.comp_rows) - 1));
    }
    swa_r.push_back(0);
    comp_r.push_back(0);
    AttentionArgs a;
    a.n_rows = S;
    a.n_heads = c.H;
    a.head_dim = c.hd;
    a.scale = 1.f / std::sqrt(float(c.hd));
    std::vector<float> out_cpu(size_t(S * c.H * c.hd), NAN);
    AttentionArgs ac = a;
    ac.q = q.data();
    ac.sinks = sinks.data();
    ac.swa_pool = swa_pool.data();
    ac.swa = {swa_r.data(), swa_o.data(), swa_c.data()};
    ac.comp_pool = c.comp ? comp_pool.data() : nullptr;
    ac.comp = {comp_r.data(), comp_o.data(), comp_c.data()};
    ac.out = out_cpu.data();
    cpu->sparse_attention(ac);

    Dev<float> dq(q), dsinks(sinks), dswa(swa_pool), dcomp(comp_pool), dout(out_cpu.size());
    Dev<int32_t> dswa_r(swa_r), dswa_c(swa_c), dcomp_r(comp_r), dcomp_c(comp_c);
    Dev<int64_t> dswa_o(swa_o), dcomp_o(comp_o);
    AttentionArgs ag = a;
    ag.q = dq.p;
    ag.sinks = dsinks.p;
    ag.swa_pool = dswa.p;
    ag.swa = {dswa_r.p, dswa_o.p, dswa_c.p};
    ag.comp_pool = c.comp ? dcomp.p : nullptr;
    ag.comp = {dcomp_r.p, dcomp_o.p, dcomp_c.p};
    ag.out = dout.p;
    const int64_t max_keys = c.swa + c.comp;
    for (int splits : {1, 3, 37, cuda::attention_auto_splits(S, c.H, max_keys, 132)}) {
      SCOPED_TRACE(::testing::Message() << "splits=" << splits);
      Dev<float> ws(size_t(std::max<int64_t>(1, cuda::attention_workspace_floats(S, c.H, c.hd, splits))));
      dout.poison();
      ASSERT_TRUE(cuda::sparse_attention_split(ag, splits, ws.p, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_LE(rel_err(dout.host(), out_cpu), 2e-5);
    }
    if (cuda::attention_mma_supported(c.H, c.hd)) {
      for (int splits : {1, 5, cuda::attention_auto_splits(S, c.H, max_keys, 132, 64)}) {
        SCOPED_TRACE(::testing::Message() << "mma splits=" << splits);
        Dev<float> ws(size_t(std::max<int64_t>(1, cuda::attention_workspace_floats(S, c.H, c.hd, splits))));
        dout.poison();
        ASSERT_TRUE(cuda::sparse_attention_mma(ag, splits, ws.p, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const double e = rel_err(dout.host(), out_cpu);
        std::printf("[attention mma] S=%lld H=%d keys<=%lld splits=%d rel err %.2e\n", (long long)S,
                    c.H, (long long)max_keys, splits, e);
        EXPECT_LE(e, 3e-3);  // TF32 q/k/p rounding (10 mantissa bits)
      }
    }
    // Error path: hd above the kernel's limit is refused, not run.
    AttentionArgs big = ag;
    big.head_dim = cuda::kAttnSplitMaxHd + 1;
    EXPECT_FALSE(cuda::sparse_attention_split(big, 1, nullptr, nullptr).ok());
  }
}

// Decode-shaped timings (printed, not asserted): V4-Flash CSA (128 + 512 keys) and HCA at 1M
// context (128 + 8192 keys), 64 heads × 512, batch 1 and 64, against the bytes that must be read.
TEST(CudaAttention, DecodeTimings) {
  V4_REQUIRE_GPU();
  const int H = 64, hd = 512;
  for (int64_t comp : {int64_t(512), int64_t(8192)})
    for (int64_t S : {int64_t(1), int64_t(64)}) {
      const int64_t rows = 1 << 17;  // 256 MiB pool: reads come from HBM, not L2
      Dev<float> pool(static_cast<size_t>(rows * hd)), q(static_cast<size_t>(S * H * hd)), sinks(static_cast<size_t>(H)),
          out(size_t(S * H * hd));
      cudaMemset(pool.p, 0, rows * hd * 4);
      cudaMemset(q.p, 0, S * H * hd * 4);
      cudaMemset(sinks.p, 0, H * 4);
      std::vector<int32_t> r;
      std::vector<int64_t> so(S), co(S);
      std::vector<int32_t> sc(S, 128), cc(S, int32_t(comp));
      for (int64_t t = 0; t < S; ++t) {
        so[t] = int64_t(r.size());
        for (int j = 0; j < 128; ++j) r.push_back(rand_int(0, int(rows) - 1));
        co[t] = int64_t(r.size());
        for (int64_t j = 0; j < comp; ++j) r.push_back(rand_int(0, int(rows) - 1));
      }
      Dev<int32_t> dr(r), dsc(sc), dcc(cc);
      Dev<int64_t> dso(so), dco(co);
      AttentionArgs a;
      a.n_rows = S;
      a.n_heads = H;
      a.head_dim = hd;
      a.scale = 1.f / std::sqrt(float(hd));
      a.q = q.p;
      a.sinks = sinks.p;
      a.swa_pool = pool.p;
      a.swa = {dr.p, dso.p, dsc.p};
      a.comp_pool = pool.p;
      a.comp = {dr.p, dco.p, dcc.p};
      a.out = out.p;
      for (int kernel = 0; kernel < 3; ++kernel) {  // fp32 split, TF32 mma, bf16 decode
      const int splits = kernel == 2 ? cuda::attention_dec_splits(S, H, 128 + comp, 132)
                                     : cuda::attention_auto_splits(S, H, 128 + comp, 132,
                                                                   kernel ? 64 : 16);
      auto run = [&](float* wsp) {
        return kernel == 2 ? cuda::sparse_attention_dec(a, splits, wsp, nullptr)
               : kernel    ? cuda::sparse_attention_mma(a, splits, wsp, nullptr)
                           : cuda::sparse_attention_split(a, splits, wsp, nullptr);
      };
      Dev<float> ws(size_t(std::max<int64_t>(1, cuda::attention_workspace_floats(S, H, hd, splits))));
      for (int i = 0; i < 3; ++i) ASSERT_TRUE(run(ws.p).ok());
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      const int reps = 20;
      cudaEventRecord(e0);
      for (int i = 0; i < reps; ++i) (void)run(ws.p);
      cudaEventRecord(e1);
      ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      const double us = ms * 1000.0 / reps;
      const double bytes = double(S) * (128 + comp) * hd * 4 + 2.0 * S * H * hd * 4;
      std::printf("[attention %s] S=%lld keys=%lld splits=%d: %.1f us, %.0f GB/s of key+q+out bytes\n",
                  kernel == 2 ? "dec-bf16" : kernel ? "mma-tf32" : "fp32", (long long)S, (long long)(128 + comp), splits, us,
                  bytes / (us * 1e3));
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      }
    }
}

}  // namespace
}  // namespace v4::ops
