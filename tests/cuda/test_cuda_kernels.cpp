// GPU kernel tests for the fast-path building blocks (bf16/FP8/MXFP4 GEMM inputs, Lightning TopK,
// bf16 indexer scores, bf16 norm/RoPE/mHC) vs straightforward CPU implementations on fresh random
// inputs, outputs poisoned. Top-k is exact: identical index sets, ties → lower index, NaN lowest.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/mhc.h"
#include "ops/cuda/norm_rope.h"
#include "ops/cuda/quant.h"
#include "ops/cuda/topk.h"

namespace v4::cuda {
namespace {

using testing::Dev;
using testing::rand_int;
using testing::randn;
using testing::rel_err;
using testing::rng;

using bf16 = __nv_bfloat16;

std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = ::v4::f32_to_bf16(v[i]);
  return o;
}
std::vector<float> bf16_round(const std::vector<float>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = ::v4::round_bf16(v[i]);
  return o;
}
std::vector<float> from_bf16_bits(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = ::v4::bf16_to_f32(v[i]);
  return o;
}
bf16* as_bf16(Dev<uint16_t>& d) { return reinterpret_cast<bf16*>(d.p); }

#define CHECK_OK(expr)                                  \
  do {                                                  \
    ::v4::Status _s = (expr);                           \
    ASSERT_TRUE(_s.ok()) << _s.to_string();             \
  } while (0)

// ---- GEMM (cuBLASLt bf16) -------------------------------------------------------------------------

TEST(CudaKernels, GemmBf16) {
  V4_REQUIRE_GPU();
  auto g = Gemm::create();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  struct Shape { int64_t M, N, K; };
  for (Shape s : {Shape{1, 7, 5}, Shape{3, 129, 67}, Shape{1, 1024, 4096}, Shape{64, 4096, 1024},
                  Shape{17, 512, 4096}, Shape{128, 2048, 4096}}) {
    for (OutType ot : {OutType::kF32, OutType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K
                                        << " out=" << (ot == OutType::kF32 ? "f32" : "bf16"));
      auto x = bf16_round(randn(size_t(s.M * s.K))), w = bf16_round(randn(size_t(s.N * s.K), 0.05f));
      std::vector<float> ref(size_t(s.M * s.N));
      for (int64_t i = 0; i < s.M; ++i)
        for (int64_t j = 0; j < s.N; ++j) {
          double acc = 0;
          for (int64_t k = 0; k < s.K; ++k) acc += double(x[i * s.K + k]) * w[j * s.K + k];
          ref[i * s.N + j] = float(acc);
        }
      Dev<uint16_t> dx(to_bf16_bits(x)), dw(to_bf16_bits(w));
      std::vector<float> y;
      if (ot == OutType::kF32) {
        Dev<float> dy(size_t(s.M * s.N));
        dy.poison();
        CHECK_OK((*g)->bf16(as_bf16(dx), as_bf16(dw), dy.p, ot, s.M, s.N, s.K, nullptr));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        y = dy.host();
        EXPECT_LE(rel_err(y, ref), 1e-5);
      } else {
        Dev<uint16_t> dy(size_t(s.M * s.N));
        dy.poison();
        CHECK_OK((*g)->bf16(as_bf16(dx), as_bf16(dw), dy.p, ot, s.M, s.N, s.K, nullptr));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        y = from_bf16_bits(dy.host());
        EXPECT_LE(rel_err(y, ref), 1e-2);
      }
    }
  }
}

// ---- weight formats -------------------------------------------------------------------------------

TEST(CudaKernels, DequantFp8Blocks) {
  V4_REQUIRE_GPU();
  struct Shape { int64_t N, K; };
  for (Shape s : {Shape{512, 4096}, Shape{300, 129}, Shape{1, 1}, Shape{1024, 4096}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " K=" << s.K);
    const int64_t nb = (s.N + 127) / 128, kb = (s.K + 127) / 128;
    std::vector<uint8_t> wq(size_t(s.N * s.K)), sc(size_t(nb * kb));
    for (auto& b : wq) {
      b = uint8_t(rand_int(0, 255));
      if ((b & 0x7f) == 0x7f) b = 0x3c;  // avoid NaN encodings
    }
    for (auto& b : sc) b = uint8_t(rand_int(110, 135));
    Dev<uint8_t> dwq(wq), dsc(sc);
    Dev<uint16_t> dout(size_t(s.N * s.K));
    dout.poison();
    CHECK_OK(dequant_fp8_block_to_bf16(dwq.p, dsc.p, as_bf16(dout), s.N, s.K, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto out = dout.host();
    for (int64_t i = 0; i < s.N; ++i)
      for (int64_t j = 0; j < s.K; ++j) {
        const float ref = ::v4::round_bf16(fp8e4m3_to_f32(wq[i * s.K + j]) * ue8m0_to_f32(sc[(i / 128) * kb + j / 128]));
        ASSERT_EQ(::v4::bf16_to_f32(out[i * s.K + j]), ref) << i << "," << j;
      }
  }
}

TEST(CudaKernels, DequantMxfp4) {
  V4_REQUIRE_GPU();
  struct Shape { int64_t N, K; };
  for (Shape s : {Shape{2048, 4096}, Shape{7, 32}, Shape{33, 96}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " K=" << s.K);
    std::vector<uint8_t> wq(size_t(s.N * s.K / 2)), sc(size_t(s.N * s.K / 32));
    for (auto& b : wq) b = uint8_t(rand_int(0, 255));
    for (auto& b : sc) b = uint8_t(rand_int(115, 130));
    Dev<uint8_t> dwq(wq), dsc(sc);
    Dev<uint16_t> dout(size_t(s.N * s.K));
    dout.poison();
    CHECK_OK(dequant_mxfp4_to_bf16(dwq.p, dsc.p, as_bf16(dout), s.N, s.K, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto out = dout.host();
    for (int64_t i = 0; i < s.N; ++i)
      for (int64_t j = 0; j < s.K; ++j) {
        const uint8_t byte = wq[i * (s.K / 2) + j / 2];
        const float ref = ::v4::round_bf16(fp4e2m1_to_f32(j % 2 ? byte >> 4 : byte & 0xf) *
                                     ue8m0_to_f32(sc[i * (s.K / 32) + j / 32]));
        ASSERT_EQ(::v4::bf16_to_f32(out[i * s.K + j]), ref) << i << "," << j;
      }
  }
  // K not a multiple of 32 is rejected with a message.
  Status st = dequant_mxfp4_to_bf16(nullptr, nullptr, nullptr, 4, 48, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
}

// ---- Lightning TopK -------------------------------------------------------------------------------

// Reference: indices of the k best under (score desc, index asc), NaN lowest, −0 == +0; sorted by
// index ascending (the kernel's output order); −1 padding for short rows.
std::vector<int32_t> ref_topk(const float* s, int n, int k) {
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    const float x = s[a], y = s[b];
    const bool xn = std::isnan(x), yn = std::isnan(y);
    if (xn != yn) return yn;  // non-NaN beats NaN
    if (!xn && x != y) return x > y;
    return a < b;
  };
  const int m = std::min(n, k);
  std::partial_sort(idx.begin(), idx.begin() + m, idx.end(), better);
  std::vector<int32_t> out(idx.begin(), idx.begin() + m);
  std::sort(out.begin(), out.end());
  out.resize(k, -1);
  return out;
}

enum class Dist {
  kNormal, kTies, kSpecial, kAllEqual, kSorted, kRampUp, kRampDown, kOutlier, kLowBits, kPerThread,
  kGroupMax, kGroupMaxTies, kNaNBlock
};

std::vector<float> make_row(int n, Dist d) {
  std::vector<float> v = randn(size_t(n));
  const float inf = std::numeric_limits<float>::infinity();
  switch (d) {
    case Dist::kNormal: break;
    case Dist::kTies:  // ReLU-like: many exact zeros, few distinct values (P19)
      for (auto& x : v) x = x < 0.3f ? 0.f : std::round(x * 4.f) / 4.f;
      break;
    case Dist::kSpecial:
      for (auto& x : v) {
        const int u = rand_int(0, 99);
        if (u < 5) x = std::numeric_limits<float>::quiet_NaN();
        else if (u < 10) x = -inf;
        else if (u < 12) x = inf;
        else if (u < 20) x = u % 2 ? 0.f : -0.f;
      }
      break;
    case Dist::kAllEqual:
      std::fill(v.begin(), v.end(), 1.5f);
      break;
    case Dist::kSorted:
      for (int i = 0; i < n; ++i) v[i] = float(i % 1000) * 0.001f;
      break;
    case Dist::kRampUp:  // the best keys all in the row's last slice (last CTA of a cluster)
      for (int i = 0; i < n; ++i) v[i] = float(i);
      break;
    case Dist::kRampDown:  // ... all in the first slice
      for (int i = 0; i < n; ++i) v[i] = -float(i);
      break;
    case Dist::kOutlier:  // N(0,1) plus a few huge values: hundreds of empty bins between the row
                          // maximum and the k-th key (v5's window walk takes several steps)
      for (int j = 0; j < 3 && n > 0; ++j) v[size_t(rand_int(0, n - 1))] = 1e30f;
      break;
    case Dist::kPerThread:  // v7 × 256 threads, cluster 16 (P keys per thread): in CTA 0 every
                            // thread's first key is huge (256 keys) and its fifth medium (256
                            // more), the rest small: the top 512 need 2 keys of every thread, so a
                            // pre-filter from the thread maximum alone would drop the medium ones
    {
      const int P = ((n + 4095) / 4096 + 3) & ~3;
      for (auto& x : v) x *= 0.1f;
      for (int idx = 0; idx < std::min(n, 256 * P); ++idx) {
        const int rem = idx % (32 * P), j = rem / 128, c = rem % 4;
        if (c == 0 && j == 0) v[size_t(idx)] = 100.f + 0.001f * float(idx);
        else if (c == 0 && j == 1) v[size_t(idx)] = 10.f + 0.001f * float(idx);
      }
      break;
    }
    case Dist::kGroupMax:       // v8 (cluster 16 × 512 threads, P keys per thread): one large key
    case Dist::kGroupMaxTies: { // in every group of 16 threads (half a warp), the rest small. At
                                // 262,144 there are exactly 512 groups, so the 512th key equals
                                // the row-wide bound T (min of the group maxima): keys == T must
                                // pass the pre-filter. Ties: every large key is 100 and every
                                // third group holds a second 100 (tie order by index at T).
      const int P = std::max(4, ((n + 8191) / 8192 + 3) & ~3);  // empty rows: P = 4, not 0
      for (auto& x : v) x *= 0.1f;
      for (int g = 0; g < 2 * (n / (32 * P) + 1); ++g) {
        const int w = g / 2, h = g % 2, j = w % (P / 4), c = (g / 4) % 4;
        const int64_t base = int64_t(w) * 32 * P + int64_t(j * 32 + 16 * h) * 4;
        const float val = d == Dist::kGroupMax ? 100.f + 0.001f * float(g) : 100.f;
        if (base + c < n) v[size_t(base + c)] = val;
        if (d == Dist::kGroupMaxTies && g % 3 == 0 && base + 4 + c < n) v[size_t(base + 4 + c)] = val;
      }
      break;
    }
    case Dist::kNaNBlock:  // the first 2,048 scores NaN (whole groups of NaN: v8 runs unfiltered)
      for (int i = 0; i < std::min(n, 2048); ++i) v[size_t(i)] = std::numeric_limits<float>::quiet_NaN();
      break;
    case Dist::kLowBits:  // ~0.4% of the keys share all bits but the low 8 (3.0 + a few ulps),
                          // the rest small: a threshold bin of ~n/250 keys that only the last
                          // 8-bit digit separates, ~n/64000 ties per value
      for (auto& x : v) {
        if (rand_int(0, 249) == 0) {
          const uint32_t b = 0x40400000u | uint32_t(rand_int(0, 255));
          std::memcpy(&x, &b, 4);
        } else {
          x *= 0.1f;
        }
      }
      break;
  }
  return v;
}

// Returns false (and checks nothing) when `may_be_unsupported` and the variant reports
// kUnsupported (a cluster that cannot be resident on this GPU, or k too large for the variant).
bool run_topk_case(const std::vector<int32_t>& lens, int k, Dist dist, int variant,
                   bool may_be_unsupported = false) {
  const int64_t R = int64_t(lens.size());
  const int max_n = *std::max_element(lens.begin(), lens.end());
  const int64_t ld = (std::max(max_n, 1) + 3) / 4 * 4 + 4 * rand_int(0, 1);
  std::vector<float> scores(size_t(R * ld), 12345.f);  // beyond n: large values that must be ignored
  for (int64_t r = 0; r < R; ++r) {
    auto row = make_row(lens[r], dist);
    std::copy(row.begin(), row.end(), scores.begin() + r * ld);
  }
  Dev<float> ds(scores);
  Dev<int32_t> dn(lens), dout{size_t(R * k)}, dlen{size_t(R)};
  dout.poison();
  dlen.poison();
  const Status st = topk_rows(ds.p, ld, dn.p, R, k, max_n, dout.p, dlen.p, nullptr, variant);
  if (may_be_unsupported && st.code() == ErrorCode::kUnsupported) {
    std::printf("variant %d k=%d: unsupported here (%s)\n", variant, k, st.message().c_str());
    return false;
  }
  EXPECT_TRUE(st.ok()) << st.message();
  if (!st.ok()) return false;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto out = dout.host(), len = dlen.host();
  for (int64_t r = 0; r < R; ++r) {
    auto ref = ref_topk(scores.data() + r * ld, lens[r], k);
    EXPECT_EQ(len[r], std::min(lens[r], k)) << "row " << r;
    for (int i = 0; i < k; ++i) {
      EXPECT_EQ(out[r * k + i], ref[i]) << "row " << r << " (n=" << lens[r] << ") entry " << i;
      if (out[r * k + i] != ref[i]) return true;  // one mismatch per row is enough to report
    }
  }
  return true;
}

TEST(CudaKernels, TopkExactShortRows) {
  V4_REQUIRE_GPU();
  for (int variant : {0, 1, 7, 8, 44, 45}) {
    for (Dist d : {Dist::kNormal, Dist::kTies, Dist::kSpecial, Dist::kAllEqual, Dist::kSorted}) {
      SCOPED_TRACE(::testing::Message() << "variant " << variant << " dist " << int(d));
      run_topk_case({0, 1, 511, 512, 513, 1000, 2049, 8192}, 512, d, variant);
      run_topk_case({5, 3, 40, 37}, 3, d, variant);
      run_topk_case({8000, 7, 100}, 1, d, variant);
    }
  }
}

TEST(CudaKernels, TopkExactLongRowsAllVariants) {
  V4_REQUIRE_GPU();
  // variant -> largest row it takes (see topk.h)
  const std::pair<int, int> variants[] = {
      {0, 262144},  {0, 524288},  {2, 32768},   {3, 262144},  {4, 262144},  {5, 524288},
      {6, 262144},  {8, 32768},   {9, 262144},  {10, 262144}, {12, 131072}, {13, 65536},
      {14, 65536},  {15, 131072}, {16, 262144}, {18, 131072}, {45, 32768}};
  for (auto [variant, cap] : variants) {
    for (Dist d : {Dist::kNormal, Dist::kTies, Dist::kSpecial, Dist::kAllEqual}) {
      SCOPED_TRACE(::testing::Message() << "variant " << variant << " dist " << int(d));
      run_topk_case({cap, cap - rand_int(1, 999), 9000, 513, 100}, 512, d, variant);
    }
  }
}

// v4 (local thresholds + candidate exchange), v3 sized to the row, v3 with coalesced loads: every distribution, several k, rows that leave
// some CTAs of the cluster empty, the best keys concentrated in one CTA, batches of mixed lengths.
TEST(CudaKernels, TopkExactV4Variants) {
  V4_REQUIRE_GPU();
  const std::pair<int, int> variants[] = {{19, 262144}, {20, 262144}, {21, 262144}, {22, 131072},
                                          {23, 131072}, {24, 262144}, {25, 131072}, {26, 262144},
                                          {27, 262144}, {28, 131072}, {29, 65536}, {17, 262144}};
  for (auto [variant, cap] : variants) {
    const bool maybe = variant == 21 || variant == 24 || variant == 17;  // 16-CTA clusters: may not be resident
    for (Dist d : {Dist::kNormal, Dist::kTies, Dist::kSpecial, Dist::kAllEqual, Dist::kSorted,
                   Dist::kRampUp, Dist::kRampDown}) {
      SCOPED_TRACE(::testing::Message() << "variant " << variant << " dist " << int(d));
      if (!run_topk_case({cap, cap - rand_int(1, 999), 9000, 513, 100, 0}, 512, d, variant, maybe))
        break;
      run_topk_case({cap / 2 + 7, std::min(70000, cap), 4096}, 1, d, variant, maybe);
      run_topk_case({cap, 3000, 1025}, 1024, d, variant, true);
      run_topk_case({cap - 3, 40000}, 100, d, variant, maybe);
    }
    SCOPED_TRACE(::testing::Message() << "variant " << variant << " short rows");
    run_topk_case({0, 1, 511, 512, 513, 1000, 2049, 8192}, 512, Dist::kNormal, variant, maybe);
    run_topk_case({5, 3, 40, 37}, 3, Dist::kSpecial, variant, maybe);
    std::vector<int32_t> lens(64);
    for (auto& l : lens) l = rand_int(1, cap);
    run_topk_case(lens, 512, Dist::kNormal, variant, maybe);
  }
}

// v5 (one cluster barrier per pass, windowed histogram reads, candidate broadcast): every
// distribution, k = 1 / 100 / 512 / 1024 (k > 512 disables the pre-filter), rows that leave CTAs
// empty, the best keys in one CTA, threshold bins above and below the candidate capacity (kSorted,
// kRampUp, kAllEqual, kLowBits: later passes, ties; kNormal, kTies: candidates after pass 1),
// wide windows (kOutlier, kSpecial's +inf), batches of mixed lengths.
TEST(CudaKernels, TopkExactV5Variants) {
  V4_REQUIRE_GPU();
  const std::pair<int, int> variants[] = {{30, 524288}, {30, 262144}, {30, 65536}, {31, 262144},
                                          {31, 65536},  {32, 131072}, {33, 262144}};
  for (auto [variant, cap] : variants) {
    const bool maybe = variant == 30 || variant == 33;  // a 16-CTA cluster may not be resident
    for (Dist d : {Dist::kNormal, Dist::kTies, Dist::kSpecial, Dist::kAllEqual, Dist::kSorted,
                   Dist::kRampUp, Dist::kRampDown, Dist::kOutlier, Dist::kLowBits}) {
      SCOPED_TRACE(::testing::Message() << "variant " << variant << " cap " << cap << " dist " << int(d));
      if (!run_topk_case({cap, cap - rand_int(1, 999), 9000, 513, 100, 0}, 512, d, variant, maybe))
        break;
      run_topk_case({cap / 2 + 7, std::min(70000, cap), 4096}, 1, d, variant, maybe);
      run_topk_case({cap, 3000, 1025}, 1024, d, variant, maybe);
      run_topk_case({cap - 3, 40000}, 100, d, variant, maybe);
      run_topk_case({cap, cap / 3}, 2048, d, variant, maybe);
    }
    SCOPED_TRACE(::testing::Message() << "variant " << variant << " short rows");
    run_topk_case({0, 1, 511, 512, 513, 1000, 2049, 8192}, 512, Dist::kNormal, variant, maybe);
    run_topk_case({5, 3, 40, 37}, 3, Dist::kSpecial, variant, maybe);
    std::vector<int32_t> lens(64);
    for (auto& l : lens) l = rand_int(1, cap);
    run_topk_case(lens, 512, Dist::kNormal, variant, maybe);
    run_topk_case(lens, 512, Dist::kLowBits, variant, maybe);
  }
  // the auto choice at batch 1 (v5 above 8K where it can run) on the sizes of the bench
  for (int n : {8193, 65536, 131072, 262144, 524288})
    for (Dist d : {Dist::kNormal, Dist::kTies, Dist::kOutlier}) {
      SCOPED_TRACE(::testing::Message() << "auto n " << n << " dist " << int(d));
      run_topk_case({n}, 512, d, 0);
    }
}

TEST(CudaKernels, TopkV5Batch64At256K) {
  V4_REQUIRE_GPU();
  std::vector<int32_t> lens(64);
  for (auto& l : lens) l = rand_int(200000, 262144);
  lens[0] = 262144;
  for (int variant : {30, 31}) {
    SCOPED_TRACE(::testing::Message() << "variant " << variant);
    if (!run_topk_case(lens, 512, Dist::kNormal, variant, variant == 30)) continue;
    run_topk_case(lens, 1024, Dist::kTies, variant);
  }
}

// Variant 33 (v5 with programmatic dependent launch: each launch lets the next one start early and
// waits for the previous one before touching global memory): back-to-back launches on one stream
// alternating two inputs into the same output; the result must be the last input's top-k.
TEST(CudaKernels, TopkV5PdlBackToBack) {
  V4_REQUIRE_GPU();
  const int n = 262144, k = 512;
  const std::vector<int32_t> lens = {n};
  const auto a = make_row(n, Dist::kNormal), b = make_row(n, Dist::kRampUp);
  Dev<float> da(a), db(b);
  Dev<int32_t> dn(lens), dout{size_t(k)};
  dout.poison();
  for (int it = 0; it < 21; ++it) {
    const Status st = topk_rows(it % 2 ? db.p : da.p, n, dn.p, 1, k, n, dout.p, nullptr, nullptr, 33);
    if (st.code() == ErrorCode::kUnsupported) GTEST_SKIP() << st.message();
    ASSERT_TRUE(st.ok()) << st.message();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dout.host(), ref_topk(a.data(), n, k));  // it = 20 reads a
}

// v6 (v5's protocol over a compacted, index-ordered shared-memory list of the keys ≥ F): the v5
// suite — every distribution, k = 1 / 100 / 512 / 1024 / 2048 (k > 512: no pre-filter, the list
// holds every key), rows that leave CTAs empty, the best keys in one CTA, threshold bins above and
// below the candidate capacity, wide windows, batches of mixed lengths, short rows — plus MTP rows
// (consecutive query rows of one sequence: lengths n, n + 1, n + 2 over the same scores).
TEST(CudaKernels, TopkExactV6Variants) {
  V4_REQUIRE_GPU();
  // v7 (38–42): v6 with the window walk in one warp, 512- (38/39) or 256-thread CTAs (40–42;
  // pre-filter from each thread's second largest key), unguarded keys for whole slices.
  const std::pair<int, int> variants[] = {
      {34, 262144}, {34, 131072}, {34, 65536}, {34, 16384}, {35, 262144}, {36, 131072},
      {36, 65536},  {37, 262144}, {38, 262144}, {38, 131072}, {38, 65536}, {38, 16384},
      {39, 262144}, {40, 262144}, {40, 131072}, {40, 65536}, {40, 16384}, {41, 262144},
      {42, 131072}, {42, 65536}, {42, 16384}, {43, 262144}, {43, 65536}};
  for (auto [variant, cap] : variants) {
    const bool maybe = variant != 36 && variant != 42;  // a 16-CTA cluster may not be resident
    for (Dist d : {Dist::kNormal, Dist::kTies, Dist::kSpecial, Dist::kAllEqual, Dist::kSorted,
                   Dist::kRampUp, Dist::kRampDown, Dist::kOutlier, Dist::kLowBits}) {
      SCOPED_TRACE(::testing::Message() << "variant " << variant << " cap " << cap << " dist " << int(d));
      if (!run_topk_case({cap, cap - rand_int(1, 999), 9000, 513, 100, 0}, 512, d, variant, maybe))
        break;
      run_topk_case({cap / 2 + 7, std::min(70000, cap), 4096}, 1, d, variant, maybe);
      run_topk_case({cap, 3000, 1025}, 1024, d, variant, maybe);
      run_topk_case({cap - 3, 40000}, 100, d, variant, maybe);
      run_topk_case({cap, cap / 3}, 2048, d, variant, maybe);
    }
    SCOPED_TRACE(::testing::Message() << "variant " << variant << " short rows, MTP, batch 64");
    run_topk_case({0, 1, 511, 512, 513, 1000, 2049, 8192}, 512, Dist::kNormal, variant, maybe);
    run_topk_case({5, 3, 40, 37}, 3, Dist::kSpecial, variant, maybe);
    std::vector<int32_t> lens(64);
    for (auto& l : lens) l = rand_int(1, cap);
    run_topk_case(lens, 512, Dist::kNormal, variant, maybe);
    run_topk_case(lens, 512, Dist::kLowBits, variant, maybe);
    run_topk_case(lens, 1024, Dist::kTies, variant, maybe);
    // MTP: the rows of one sequence's draft positions see the same scores, each one key longer
    {
      const int n0 = cap - 2, k = 512;
      const auto row = make_row(cap, Dist::kNormal);
      const int64_t ld = cap;
      std::vector<float> sc(size_t(3 * ld));
      for (int rr = 0; rr < 3; ++rr) std::copy(row.begin(), row.end(), sc.begin() + rr * ld);
      const std::vector<int32_t> mlens = {n0, n0 + 1, n0 + 2};
      Dev<float> ds(sc);
      Dev<int32_t> dn(mlens), dout{size_t(3 * k)};
      dout.poison();
      const Status st = topk_rows(ds.p, ld, dn.p, 3, k, cap, dout.p, nullptr, nullptr, variant);
      if (maybe && st.code() == ErrorCode::kUnsupported) continue;
      ASSERT_TRUE(st.ok()) << st.message();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = dout.host();
      for (int rr = 0; rr < 3; ++rr) {
        const auto want = ref_topk(row.data(), mlens[rr], k);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + rr * k)) << "MTP row " << rr;
      }
    }
  }
}

// v7's pre-filter bound at 256 threads is the minimum over threads of each thread's SECOND largest
// key (valid for k ≤ 512, off above): k around 256 / 512, rows whose last threads hold 0, 1 or 2
// keys (n = 262144 − 1, 65536 + 1, 4096·P + 1..3), distributions where the bound is tight
// (kPerThread: the top 512 are two keys of every thread of CTA 0 — fails with a thread-maximum
// bound, checked in scripts/topk_v7_emulate.py —; ramps: the selected keys are one CTA's slice) or
// ties sit on it.
TEST(CudaKernels, TopkV7PrefilterEdges) {
  V4_REQUIRE_GPU();
  for (int variant : {40, 38}) {
    for (int k : {255, 256, 257, 511, 512, 513}) {
      for (Dist d : {Dist::kPerThread, Dist::kNormal, Dist::kTies, Dist::kRampUp, Dist::kRampDown,
                     Dist::kLowBits, Dist::kAllEqual}) {
        SCOPED_TRACE(::testing::Message() << "variant " << variant << " k " << k << " dist " << int(d));
        if (!run_topk_case({262144, 262143, 65537, 4096 * 5 + 1, 4096 * 7 + 2, 4096 * 9 + 3}, k, d,
                           variant, true))
          break;
      }
    }
  }
}

TEST(CudaKernels, TopkV6Batch64At256K) {
  V4_REQUIRE_GPU();
  std::vector<int32_t> lens(64);
  for (auto& l : lens) l = rand_int(200000, 262144);
  lens[0] = 262144;
  for (int variant : {34, 35, 38, 39, 40, 41}) {
    SCOPED_TRACE(::testing::Message() << "variant " << variant);
    if (!run_topk_case(lens, 512, Dist::kNormal, variant, true)) continue;
    run_topk_case(lens, 1024, Dist::kTies, variant);
    run_topk_case(lens, 512, Dist::kSpecial, variant);
  }
}

// Variants 35 / 39 / 41 / 43 (v6 / v7 × 512 / v7 × 256 threads / v6 unmerged atomics + programmatic
// dependent launch):
// back-to-back launches alternating two inputs into one output (as TopkV5PdlBackToBack); the
// result must be the last input's top-k.
TEST(CudaKernels, TopkV6PdlBackToBack) {
  V4_REQUIRE_GPU();
  const int n = 262144, k = 512;
  const std::vector<int32_t> lens = {n};
  const auto a = make_row(n, Dist::kNormal), b = make_row(n, Dist::kRampUp);
  Dev<float> da(a), db(b);
  const auto want = ref_topk(a.data(), n, k);
  for (int variant : {35, 39, 41, 43}) {
    SCOPED_TRACE(::testing::Message() << "variant " << variant);
    Dev<int32_t> dn(lens), dout{size_t(k)};
    dout.poison();
    bool ran = true;
    for (int it = 0; it < 21 && ran; ++it) {
      const Status st = topk_rows(it % 2 ? db.p : da.p, n, dn.p, 1, k, n, dout.p, nullptr, nullptr, variant);
      if (st.code() == ErrorCode::kUnsupported) {
        std::printf("variant %d: unsupported here (%s)\n", variant, st.message().c_str());
        ran = false;
        break;
      }
      ASSERT_TRUE(st.ok()) << st.message();
    }
    if (!ran) continue;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(dout.host(), want);  // it = 20 reads a
  }
}

// v8 (46: cluster 16, 47: 46 + programmatic dependent launch, 48: cluster 8): v6's protocol with a
// row-wide pre-filter bound from per-group maxima (groups of 1…32 threads, one cluster exchange),
// float compares against the bound and mask-driven compaction. Parametrised over (variant, row
// capacity): the v6 suite (all distributions, k = 1 / 100 / 512 / 1024 / 2048, batches of mixed
// lengths, short rows, MTP rows) plus the v8 bound edges.
class TopkV8 : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(TopkV8, Exact) {
  V4_REQUIRE_GPU();
  const auto [variant, cap] = GetParam();
  const bool maybe = variant != 48;  // a 16-CTA cluster may not be resident
  for (Dist d : {Dist::kNormal, Dist::kTies, Dist::kSpecial, Dist::kAllEqual, Dist::kSorted,
                 Dist::kRampUp, Dist::kRampDown, Dist::kOutlier, Dist::kLowBits, Dist::kPerThread,
                 Dist::kGroupMax, Dist::kGroupMaxTies, Dist::kNaNBlock}) {
    SCOPED_TRACE(::testing::Message() << "variant " << variant << " cap " << cap << " dist " << int(d));
    if (!run_topk_case({cap, cap - rand_int(1, 999), 9000, 513, 100, 0}, 512, d, variant, maybe))
      GTEST_SKIP() << "variant " << variant << " cannot run here";
    run_topk_case({cap / 2 + 7, std::min(70000, cap), 4096}, 1, d, variant);
    run_topk_case({cap, 3000, 1025}, 1024, d, variant);
    run_topk_case({cap - 3, std::min(40000, cap)}, 100, d, variant);
    run_topk_case({cap, cap / 3}, 2048, d, variant);
    for (int k : {255, 256, 257, 511, 513}) run_topk_case({cap, cap - 1, cap / 2 + 1}, k, d, variant);
  }
  SCOPED_TRACE(::testing::Message() << "variant " << variant << " short rows, batch 64, MTP");
  run_topk_case({0, 1, 511, 512, 513, 1000, 2049, 8192}, 512, Dist::kNormal, variant);
  run_topk_case({5, 3, 40, 37}, 3, Dist::kSpecial, variant);
  std::vector<int32_t> lens(64);
  for (auto& l : lens) l = rand_int(1, cap);
  lens[0] = cap;
  run_topk_case(lens, 512, Dist::kNormal, variant);
  run_topk_case(lens, 512, Dist::kLowBits, variant);
  run_topk_case(lens, 512, Dist::kSpecial, variant);
  run_topk_case(lens, 1024, Dist::kTies, variant);
  run_topk_case(lens, 512, Dist::kGroupMaxTies, variant);
  {  // odd row stride: rows 1 and 2 are not 16-byte aligned (scalar loads), the last row short
    const int64_t ld = cap + 1;
    const std::vector<int32_t> lens = {cap, cap - 5, 1000};
    std::vector<float> sc(size_t(3 * ld), 12345.f);
    for (int rr = 0; rr < 3; ++rr) {
      const auto row = make_row(lens[rr], Dist::kSpecial);
      std::copy(row.begin(), row.end(), sc.begin() + rr * ld);
    }
    for (int k : {1, 512, 1024}) {
      Dev<float> ds(sc);
      Dev<int32_t> dn(lens), dout{size_t(3 * k)};
      dout.poison();
      ASSERT_TRUE(topk_rows(ds.p, ld, dn.p, 3, k, cap, dout.p, nullptr, nullptr, variant).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = dout.host();
      for (int rr = 0; rr < 3; ++rr) {
        const auto want = ref_topk(sc.data() + rr * ld, lens[rr], k);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + rr * k))
            << "odd stride row " << rr << " k " << k;
      }
    }
  }
  {  // MTP: one sequence's draft rows see the same scores, each one key longer
    const int n0 = cap - 2, k = 512;
    const auto row = make_row(cap, Dist::kNormal);
    const int64_t ld = cap;
    std::vector<float> sc(size_t(3 * ld));
    for (int rr = 0; rr < 3; ++rr) std::copy(row.begin(), row.end(), sc.begin() + rr * ld);
    const std::vector<int32_t> mlens = {n0, n0 + 1, n0 + 2};
    Dev<float> ds(sc);
    Dev<int32_t> dn(mlens), dout{size_t(3 * k)};
    dout.poison();
    ASSERT_TRUE(topk_rows(ds.p, ld, dn.p, 3, k, cap, dout.p, nullptr, nullptr, variant).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = dout.host();
    for (int rr = 0; rr < 3; ++rr) {
      const auto want = ref_topk(row.data(), mlens[rr], k);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + rr * k)) << "MTP row " << rr;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    CudaKernels, TopkV8,
    ::testing::Values(std::pair<int, int>{46, 262144}, std::pair<int, int>{46, 131072},
                      std::pair<int, int>{46, 65536}, std::pair<int, int>{46, 8192},
                      std::pair<int, int>{47, 262144}, std::pair<int, int>{47, 65536},
                      std::pair<int, int>{48, 131072}, std::pair<int, int>{48, 65536},
                      std::pair<int, int>{48, 8192}),
    [](const ::testing::TestParamInfo<std::pair<int, int>>& i) {
      char name[32];
      std::snprintf(name, sizeof name, "v%d_%d", i.param.first, i.param.second);
      return std::string(name);
    });

// v8 at batch 64 of 200K–262K rows (the rows' last CTAs partly empty: the bound's group counts)
// and back-to-back PDL launches (47) alternating two inputs into one output.
TEST(CudaKernels, TopkV8Batch64At256KAndPdl) {
  V4_REQUIRE_GPU();
  std::vector<int32_t> lens(64);
  for (auto& l : lens) l = rand_int(200000, 262144);
  lens[0] = 262144;
  for (int variant : {46, 47}) {
    SCOPED_TRACE(::testing::Message() << "variant " << variant);
    if (!run_topk_case(lens, 512, Dist::kNormal, variant, true)) continue;
    run_topk_case(lens, 1024, Dist::kTies, variant);
    run_topk_case(lens, 512, Dist::kSpecial, variant);
    run_topk_case(lens, 512, Dist::kGroupMax, variant);
  }
  const int n = 262144, k = 512;
  const std::vector<int32_t> one = {n};
  const auto a = make_row(n, Dist::kNormal), b = make_row(n, Dist::kRampUp);
  Dev<float> da(a), db(b);
  Dev<int32_t> dn(one), dout{size_t(k)};
  dout.poison();
  for (int it = 0; it < 21; ++it) {
    const Status st = topk_rows(it % 2 ? db.p : da.p, n, dn.p, 1, k, n, dout.p, nullptr, nullptr, 47);
    if (st.code() == ErrorCode::kUnsupported) GTEST_SKIP() << st.message();
    ASSERT_TRUE(st.ok()) << st.message();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dout.host(), ref_topk(a.data(), n, k));  // it = 20 reads a
}

// topk_rows_mapped (the indexer's finalize fused into v8's output stage): for every row, the
// output equals the row map's entries of ref_topk's indices, −1 past min(n, k), count min(n, k);
// batch 1 … 15 (mixed lengths, short rows), k = 512 / 1024, plain and PDL, ties and specials,
// with rows of the map at distinct offsets. Batches of 16+ rows and rows ≤ 8,192 or above
// 262,144 are kUnsupported (nothing written).
TEST(CudaKernels, TopkMappedEqualsTopkThenMap) {
  V4_REQUIRE_GPU();
  for (int cap : {262144, 230400, 65536, 9000}) {
    for (int R : {1, 3, 15}) {
      for (Dist d : {Dist::kNormal, Dist::kTies, Dist::kSpecial, Dist::kGroupMaxTies}) {
        if (R == 15 && d != Dist::kNormal) continue;  // host time: one distribution at 15 rows
        for (int k : {512, 1024}) {
          for (bool pdl : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "cap " << cap << " R " << R << " dist " << int(d)
                                              << " k " << k << " pdl " << pdl);
            std::vector<int32_t> lens(static_cast<size_t>(R));
            for (auto& l : lens) l = rand_int(1, cap);
            lens[0] = cap;
            if (R > 2) lens[1] = std::min(k - 1, cap);  // a short row
            const int64_t ld = cap;
            std::vector<float> sc(size_t(R) * ld, 0.f);
            std::vector<int64_t> off(static_cast<size_t>(R));
            std::vector<int32_t> map;
            for (int r = 0; r < R; ++r) {
              const auto row = make_row(lens[r], d);
              std::copy(row.begin(), row.end(), sc.begin() + size_t(r) * ld);
              off[r] = int64_t(map.size()) + 3;  // a gap before each row's entries
              map.resize(map.size() + 3);
              for (int i = 0; i < lens[r]; ++i) map.push_back(rand_int(0, 1 << 30));
            }
            Dev<float> ds(sc);
            Dev<int32_t> dn(lens), dmap(map), dout{size_t(R) * k}, dcnt{size_t(R)};
            Dev<int64_t> doff(off);
            dout.poison();
            dcnt.poison();
            const Status st = topk_rows_mapped(ds.p, ld, dn.p, R, k, cap, dmap.p, doff.p, dout.p,
                                               dcnt.p, nullptr, pdl);
            if (st.code() == ErrorCode::kUnsupported && cap > 8192) {
              GTEST_SKIP() << st.message();  // a 16-CTA cluster cannot be resident here
            }
            ASSERT_TRUE(st.ok()) << st.message();
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const auto out = dout.host(), cnt = dcnt.host();
            for (int r = 0; r < R; ++r) {
              const auto sel = ref_topk(sc.data() + size_t(r) * ld, lens[r], k);
              const int m = std::min(lens[r], k);
              EXPECT_EQ(cnt[r], m) << "row " << r;
              for (int e = 0; e < k; ++e) {
                const int32_t want = e < m ? map[size_t(off[r] + sel[e])] : -1;
                ASSERT_EQ(out[size_t(r) * k + e], want) << "row " << r << " entry " << e;
              }
            }
          }
        }
      }
    }
  }
  // No fused form: 16 rows, rows ≤ 8,192, rows above 262,144; null map.
  Dev<float> ds{size_t(16) * 65536};
  Dev<int32_t> dn{16}, dmap{8192}, dout{size_t(16) * 512};
  Dev<int64_t> doff{16};
  for (auto [R, max_n] : {std::pair<int64_t, int64_t>{16, 8192}, {16, 65536}, {1, 262148}, {1, 8192}})
    EXPECT_EQ(topk_rows_mapped(ds.p, max_n, dn.p, R, 512, max_n, dmap.p, doff.p, dout.p, nullptr,
                               nullptr).code(),
              ErrorCode::kUnsupported)
        << "R " << R << " max_n " << max_n;
  EXPECT_EQ(topk_rows_mapped(ds.p, 8192, dn.p, 1, 512, 8192, nullptr, doff.p, dout.p, nullptr,
                             nullptr).code(),
            ErrorCode::kInvalidArgument);
}

// Variants 44 / 45 (v2 single CTA + programmatic dependent launch, the indexer chain's top-k for
// rows ≤ 8K / 32K): back-to-back launches alternating two inputs into one output, batch 1 and 64
// (as TopkV5PdlBackToBack); the result must be the last input's top-k.
TEST(CudaKernels, TopkV2PdlBackToBack) {
  V4_REQUIRE_GPU();
  const int k = 512;
  for (auto [variant, n] : {std::pair<int, int>{44, 8192}, std::pair<int, int>{45, 32768},
                            std::pair<int, int>{45, 9000}}) {
    for (int R : {1, 64}) {
      SCOPED_TRACE(::testing::Message() << "variant " << variant << " n " << n << " R " << R);
      std::vector<float> a, b;
      for (int r = 0; r < R; ++r) {
        const auto ra = make_row(n, Dist::kNormal), rb = make_row(n, Dist::kRampUp);
        a.insert(a.end(), ra.begin(), ra.end());
        b.insert(b.end(), rb.begin(), rb.end());
      }
      std::vector<int32_t> lens(static_cast<size_t>(R));
      for (auto& l : lens) l = rand_int(1, n);
      lens[0] = n;
      Dev<float> da(a), db(b);
      Dev<int32_t> dn(lens), dout{size_t(R) * k}, dlen{size_t(R)};
      dout.poison();
      dlen.poison();
      for (int it = 0; it < 21; ++it) {
        const Status st = topk_rows(it % 2 ? db.p : da.p, n, dn.p, R, k, n, dout.p, dlen.p, nullptr, variant);
        ASSERT_TRUE(st.ok()) << st.message();
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto out = dout.host(), len = dlen.host();
      for (int r = 0; r < R; ++r) {  // it = 20 reads a
        const auto want = ref_topk(a.data() + size_t(r) * n, lens[r], k);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), out.begin() + size_t(r) * k)) << "row " << r;
        EXPECT_EQ(len[r], std::min(lens[r], k)) << "row " << r;
      }
    }
  }
}

TEST(CudaKernels, TopkBatch64At256K) {
  V4_REQUIRE_GPU();
  std::vector<int32_t> lens(64);
  for (auto& l : lens) l = rand_int(200000, 262144);
  lens[0] = 262144;
  run_topk_case(lens, 512, Dist::kNormal, 0);
  run_topk_case(lens, 1024, Dist::kTies, 0);  // V4-Pro index_topk
}

TEST(CudaKernels, TopkRejectsBadArguments) {
  V4_REQUIRE_GPU();
  EXPECT_EQ(topk_rows(nullptr, 10, nullptr, 1, 0, 10, nullptr, nullptr, nullptr).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(topk_rows(nullptr, kTopkMaxRow + 1, nullptr, 1, 8, kTopkMaxRow + 1, nullptr, nullptr,
                      nullptr).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(topk_rows(nullptr, 40000, nullptr, 1, 8, 40000, nullptr, nullptr, nullptr, 2).code(),
            ErrorCode::kInvalidArgument);
}

// ---- indexer scores (bf16 inputs) -----------------------------------------------------------------

TEST(CudaKernels, IndexerScoresBf16) {
  V4_REQUIRE_GPU();
  struct Case { int nI, dI; };
  for (Case c : {Case{64, 128}, Case{2, 16}, Case{5, 24}}) {
    SCOPED_TRACE(::testing::Message() << "nI=" << c.nI << " dI=" << c.dI);
    const int64_t R = 3, pool = 5000;
    std::vector<int32_t> n = {4097, 1, 700};
    std::vector<int64_t> begin = {0, 4500, 100};
    auto q = bf16_round(randn(size_t(R * c.nI * c.dI))), keys = bf16_round(randn(size_t(pool * c.dI)));
    auto w = randn(size_t(R * c.nI));
    const float scale = 1.f / std::sqrt(float(c.dI)) / std::sqrt(float(c.nI));
    const int64_t ld = 4100;
    Dev<uint16_t> dq(to_bf16_bits(q)), dk(to_bf16_bits(keys));
    Dev<float> dw(w), ds(size_t(R * ld));
    Dev<int32_t> dn(n);
    Dev<int64_t> db(begin);
    ds.poison();
    CHECK_OK(indexer_scores(as_bf16(dq), dw.p, as_bf16(dk), db.p, dn.p, R, c.nI, c.dI, scale, ds.p,
                            ld, 4097, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto s = ds.host();
    for (int64_t r = 0; r < R; ++r) {
      std::vector<float> ref(n[r]), got(s.begin() + r * ld, s.begin() + r * ld + n[r]);
      for (int j = 0; j < n[r]; ++j) {
        double acc = 0;
        for (int h = 0; h < c.nI; ++h) {
          double d = 0;
          for (int e = 0; e < c.dI; ++e)
            d += double(q[(r * c.nI + h) * c.dI + e]) * keys[(begin[r] + j) * c.dI + e];
          acc += w[r * c.nI + h] * std::max(0.0, d);
        }
        ref[j] = float(acc * scale);
      }
      EXPECT_LE(rel_err(got, ref), 1e-5) << "row " << r;
      if (n[r] < ld) {
        EXPECT_TRUE(std::isnan(s[r * ld + n[r]])) << "wrote past the row's keys";
      }
    }
  }
}

// ---- bf16 RMSNorm / RoPE / mHC (fp32 math, bf16 storage) --------------------------------------------

TEST(CudaKernels, Bf16NormRopeMhc) {
  V4_REQUIRE_GPU();
  const int64_t rows = 6, D = 4096;
  auto x = bf16_round(randn(size_t(rows * D), 2.f));
  auto w = randn(size_t(D));
  std::vector<float> ref(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(x[r * D + i]) * x[r * D + i];
    const double inv = 1.0 / std::sqrt(ss / D + 1e-6);
    for (int64_t i = 0; i < D; ++i) ref[r * D + i] = float(x[r * D + i] * inv * w[i]);
  }
  Dev<uint16_t> dx(to_bf16_bits(x)), dy(x.size());
  Dev<float> dw(w);
  dy.poison();
  CHECK_OK(rmsnorm<bf16>(as_bf16(dx), dw.p, as_bf16(dy), rows, D, 1e-6f, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE(rel_err(from_bf16_bits(dy.host()), ref), 1e-2);

  // RoPE bf16 [rows, 64 heads, 512], trailing 64 dims
  const int H = 64, hd = 512, rd = 64;
  auto q = bf16_round(randn(size_t(rows * H * hd)));
  std::vector<int64_t> pos(rows);
  for (auto& p : pos) p = rand_int(0, 1 << 20);
  std::vector<float> inv(rd / 2);
  for (int i = 0; i < rd / 2; ++i) inv[i] = 1.f / std::pow(10000.f, 2.f * i / rd);
  std::vector<float> qref = q;
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < rd / 2; ++i) {
        const float ang = inv[i] * float(pos[r]);
        float* e = &qref[(r * H + h) * hd + hd - rd + 2 * i];
        const float a = e[0], b = e[1];
        e[0] = a * std::cos(ang) - b * std::sin(ang);
        e[1] = a * std::sin(ang) + b * std::cos(ang);
      }
  Dev<uint16_t> dq(to_bf16_bits(q));
  Dev<float> dinv(inv);
  Dev<int64_t> dpos(pos);
  CHECK_OK(rope_interleaved<bf16>(as_bf16(dq), dpos.p, dinv.p, rows, H, hd, rd, int64_t(H) * hd,
                                  false, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE(rel_err(from_bf16_bits(dq.host()), qref), 1e-2);

  // mHC pre in bf16 storage vs fp32 storage of the same (bf16-representable) inputs
  const int n = 4;
  const int64_t S = 3;
  auto h = bf16_round(randn(size_t(S * n * D)));
  auto fn = randn(size_t((2 + n) * n) * n * D, 1.f / 128.f);
  auto base = randn(size_t((2 + n) * n), 0.5f), scale = randn(3, 0.5f);
  Dev<float> dfn(fn), dbase(base), dscale(scale), dh32(h), dcol32(size_t(S * D)), dpost(size_t(S * n)),
      dcomb(size_t(S * n * n)), dpost2(size_t(S * n)), dcomb2(size_t(S * n * n));
  Dev<uint16_t> dh16(to_bf16_bits(h)), dcol16(size_t(S * D));
  dcol32.poison(); dcol16.poison(); dpost.poison(); dcomb.poison(); dpost2.poison(); dcomb2.poison();
  MhcParams p;
  p.fn = dfn.p; p.base = dbase.p; p.scale = dscale.p; p.n = n;
  CHECK_OK(mhc_pre<float>(dh32.p, p, dcol32.p, dpost.p, dcomb.p, S, D, nullptr));
  CHECK_OK(mhc_pre<bf16>(as_bf16(dh16), p, as_bf16(dcol16), dpost2.p, dcomb2.p, S, D, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE(rel_err(from_bf16_bits(dcol16.host()), dcol32.host()), 1e-2);
  EXPECT_LE(rel_err(dpost2.host(), dpost.host()), 1e-5);
  EXPECT_LE(rel_err(dcomb2.host(), dcomb.host()), 1e-5);
}

}  // namespace
}  // namespace v4::cuda
