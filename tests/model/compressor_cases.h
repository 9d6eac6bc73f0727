// Compressor-step plans for the compress_fused tests (tests/model, tests/cuda) and the kernel
// benchmark (bench/kernels): the same plan shapes the model builds (model/step_plan.cpp for host
// plans, ops/decode_plan_rows.h for device-planned decode rows) over random ring slots and pool
// rows, plus random inputs. No test framework here (the benchmark includes it too).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "ops/decode_plan_rows.h"
#include "ops/ops.h"

namespace v4::testing {

/// One compressor step: shapes, plan (CompressFusedArgs fields) and host inputs.
struct CompressCase {
  int m = 0, c = 1, d = 0, rd = 0;
  int64_t n_fresh = 0;     // S rows of kc / zc
  int64_t ring_total = 0;  // ring rows (slots · c·m)
  int64_t pool_rows = 0;
  std::vector<int32_t> src;        // [n_out, c·m]
  std::vector<int64_t> positions;  // [n_out]
  std::vector<int32_t> dst;        // [n_out]
  std::vector<int32_t> ring_src, ring_dst;
  // inputs
  std::vector<float> kc, zc;            // [n_fresh, c·d]
  std::vector<float> ring_kv, ring_gate;  // [ring_total, c·d] (state before the step)
  std::vector<float> bias;              // [m, c·d]
  std::vector<float> norm;              // [d]
  std::vector<float> inv_freq;          // [rd/2]
  std::vector<float> pool;              // [pool_rows, d] (contents before the step)
  int64_t n_out() const { return int64_t(dst.size()); }
  int64_t n_ring() const { return int64_t(ring_dst.size()); }
  int64_t width() const { return int64_t(c) * d; }
  /// Whether some ring row refreshed by the step is also read as state by one of its windows
  /// (the ordering hazard a fused kernel must respect).
  bool ring_hazard() const {
    std::vector<char> read(size_t(ring_total), 0);
    for (int32_t v : src)
      if (v <= -2) read[size_t(-v - 2)] = 1;
    for (int32_t r : ring_dst)
      if (r >= 0 && read[size_t(r)]) return true;
    return false;
  }
};

/// A prefill-like chunk of one sequence: tokens [s0, s0 + n) of the sequence in ring slot `slot`.
struct CompressSlice {
  int32_t slot = 0;
  int64_t s0 = 0, n = 0;
};

namespace detail {
inline void fill_inputs(CompressCase& k, std::mt19937_64& g) {
  std::normal_distribution<float> nd(0.f, 1.f);
  auto randn = [&](size_t n, float s) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(g) * s;
    return v;
  };
  const size_t w = size_t(k.width());
  k.kc = randn(size_t(k.n_fresh) * w, 1.f);
  k.zc = randn(size_t(k.n_fresh) * w, 1.f);
  k.ring_kv = randn(size_t(k.ring_total) * w, 1.f);
  k.ring_gate = randn(size_t(k.ring_total) * w, 1.f);
  k.bias = randn(size_t(k.m) * w, 0.5f);
  k.norm = randn(size_t(k.d), 0.3f);
  for (auto& x : k.norm) x += 1.f;
  k.inv_freq.resize(size_t(k.rd / 2));
  for (int i = 0; i < k.rd / 2; ++i) k.inv_freq[size_t(i)] = std::pow(10000.f, -2.f * i / k.rd);
  k.pool = randn(size_t(k.pool_rows) * k.d, 1.f);
}
// Distinct pool rows for `n` windows out of pool_rows (random order).
inline std::vector<int32_t> pool_perm(int64_t pool_rows, std::mt19937_64& g) {
  std::vector<int32_t> p(static_cast<size_t>(pool_rows));
  std::iota(p.begin(), p.end(), 0);
  std::shuffle(p.begin(), p.end(), g);
  return p;
}
}  // namespace detail

/// Host-planned step over `slices` (model/step_plan.cpp build_compress): every window that
/// closes inside a chunk, its c·m source slots (fresh rows of this step or ring rows of earlier
/// tokens), rope position w·m, a distinct pool row; ring rows for the last c·m tokens of each
/// chunk. Slots of different slices must differ.
inline CompressCase prefill_case(int m, int c, int d, int rd,
                                 const std::vector<CompressSlice>& slices, uint64_t seed) {
  std::mt19937_64 g(seed);
  CompressCase k;
  k.m = m, k.c = c, k.d = d, k.rd = rd;
  const int rr = c * m;
  int32_t max_slot = 0;
  for (const auto& sl : slices) max_slot = std::max(max_slot, sl.slot);
  k.ring_total = int64_t(max_slot + 1) * rr;
  int64_t windows = 0;
  for (const auto& sl : slices) windows += (sl.s0 + sl.n) / m - sl.s0 / m;
  k.pool_rows = windows + 7;
  const std::vector<int32_t> perm = detail::pool_perm(k.pool_rows, g);
  int64_t row0 = 0, next = 0;
  for (const auto& sl : slices) {
    const int64_t end = sl.s0 + sl.n;
    auto source = [&](int64_t p) -> int32_t {
      if (p < 0) return -1;
      if (p >= sl.s0) return int32_t(row0 + (p - sl.s0));
      return -(ops::plan::ring_row(sl.slot, rr, p) + 2);
    };
    for (int64_t w = sl.s0 / m; w < end / m; ++w) {
      if (c == 2)
        for (int j = 0; j < m; ++j) k.src.push_back(w == 0 ? -1 : source((w - 1) * m + j));
      for (int j = 0; j < m; ++j) k.src.push_back(source(w * m + j));
      k.positions.push_back(w * m);
      k.dst.push_back(perm[size_t(next++)]);
    }
    for (int64_t p = std::max(sl.s0, end - rr); p < end; ++p) {
      k.ring_src.push_back(int32_t(row0 + (p - sl.s0)));
      k.ring_dst.push_back(ops::plan::ring_row(sl.slot, rr, p));
    }
    row0 += sl.n;
  }
  k.n_fresh = row0;
  detail::fill_inputs(k, g);
  return k;
}

/// Device-planned decode step (ops/decode_plan_rows.h): one entry per batch row b with position
/// pos[b] (−1 = padding) in ring slot b; rows whose window closes get src/dst/position, the others
/// src all −1, dst −1, position 0; every live row refreshes its ring row of pos.
inline CompressCase decode_case(int m, int c, int d, int rd, const std::vector<int64_t>& pos,
                                uint64_t seed) {
  std::mt19937_64 g(seed);
  CompressCase k;
  k.m = m, k.c = c, k.d = d, k.rd = rd;
  const int rr = c * m;
  const int64_t B = int64_t(pos.size());
  k.n_fresh = B;
  k.ring_total = B * rr;
  k.pool_rows = B + 5;
  const std::vector<int32_t> perm = detail::pool_perm(k.pool_rows, g);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = pos[size_t(b)];
    const bool live = p >= 0, closes = live && (p + 1) % m == 0;
    for (int j = 0; j < rr; ++j)
      k.src.push_back(closes ? ops::plan::compress_src(b, p, int32_t(b), m, c, j) : -1);
    k.positions.push_back(closes ? (p / m) * m : 0);
    k.dst.push_back(closes ? perm[size_t(b)] : -1);
    k.ring_src.push_back(int32_t(b));
    k.ring_dst.push_back(live ? ops::plan::ring_row(int32_t(b), rr, p) : -1);
  }
  detail::fill_inputs(k, g);
  return k;
}

/// Decode positions of B rows for decode_case: −1 = padding (1 in 8), a window-closing position
/// (2 in 8), any position below 4000 otherwise; row 0 closes a window with both series.
inline std::vector<int64_t> random_decode_positions(int B, int m, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int64_t> pos(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    const int u = int(g() % 8);
    const int64_t base = int64_t(g() % 4000);
    pos[size_t(b)] = u == 0 ? -1 : u <= 2 ? (base / m + 1) * m - 1 : base;
  }
  pos[0] = 2 * int64_t(m) - 1;
  return pos;
}

/// The cases the device compressor tests run per shape (named): decode B = 1 (one closing row)
/// and B = 64 (random_decode_positions: padding, closing and open rows; one launch), a prefill
/// with the ring hazard (refreshed ring rows read as state: two launches), prefill chunks on
/// window edges (the last two tokens of a window, a single closing token) and, when long_len > 0,
/// one chunk of long_len tokens from position 0. Seeds seed … seed + 4 in that order.
inline std::vector<std::pair<const char*, CompressCase>> standard_cases(int m, int c, int d, int rd,
                                                                      uint64_t seed,
                                                                      int64_t long_len) {
  const int64_t L = 3 * int64_t(c) * m + 5, M = m;
  std::vector<std::pair<const char*, CompressCase>> cases;
  cases.emplace_back("decode B=1", decode_case(m, c, d, rd, {2 * M - 1}, seed));
  cases.emplace_back("decode B=64",
                     decode_case(m, c, d, rd, random_decode_positions(64, m, seed), seed + 1));
  cases.emplace_back("prefill ring hazard",
                     prefill_case(m, c, d, rd, {{0, M + 3, L}, {3, 0, L + M}, {1, 2 * M - 1, L + 1}},
                                  seed + 2));
  cases.emplace_back("prefill window edges",
                     prefill_case(m, c, d, rd, {{0, 0, 5 * M + 3}, {1, 2 * M - 2, 2}, {2, 3 * M - 1, 1}},
                                  seed + 3));
  if (long_len > 0)
    cases.emplace_back("prefill long from 0", prefill_case(m, c, d, rd, {{0, 0, long_len}}, seed + 4));
  return cases;
}

/// The step in double precision straight from dsv4-model.md §5 (independent of the ops): the
/// pool and ring contents after it. Windows read the state BEFORE the ring refresh.
inline void reference_step(const CompressCase& k, float eps, float scaling, std::vector<float>* pool,
                           std::vector<float>* ring_kv, std::vector<float>* ring_gate) {
  const int m = k.m, c = k.c, d = k.d, ns = c * m, rd = k.rd;
  const int64_t w = k.width();
  *pool = k.pool;
  std::vector<double> x(size_t(d), 0.0);
  for (int64_t r = 0; r < k.n_out(); ++r) {
    if (k.dst[size_t(r)] < 0) continue;
    for (int ch = 0; ch < d; ++ch) {
      double mx = -INFINITY, sum = 0, acc = 0;
      std::vector<double> gv(static_cast<size_t>(ns)), kv(static_cast<size_t>(ns));
      std::vector<char> use(size_t(ns), 0);
      for (int j = 0; j < ns; ++j) {
        const int32_t v = k.src[size_t(r * ns + j)];
        if (v == -1) continue;
        const int ch0 = (c == 2 && j >= m) ? d : 0, brow = (c == 2 && j >= m) ? j - m : j;
        const bool fresh = v >= 0;
        const int64_t row = fresh ? v : -v - 2;
        const float* G = (fresh ? k.zc.data() : k.ring_gate.data()) + row * w;
        const float* K = (fresh ? k.kc.data() : k.ring_kv.data()) + row * w;
        gv[size_t(j)] = double(G[ch0 + ch]) + k.bias[size_t(brow * w + ch0 + ch)];
        kv[size_t(j)] = K[ch0 + ch];
        use[size_t(j)] = 1;
        mx = std::max(mx, gv[size_t(j)]);
      }
      for (int j = 0; j < ns; ++j)
        if (use[size_t(j)]) sum += std::exp(gv[size_t(j)] - mx);
      for (int j = 0; j < ns; ++j)
        if (use[size_t(j)]) acc += kv[size_t(j)] * std::exp(gv[size_t(j)] - mx) / sum;
      x[size_t(ch)] = acc;
    }
    double ss = 0;
    for (int ch = 0; ch < d; ++ch) ss += x[size_t(ch)] * x[size_t(ch)];
    const double inv = 1.0 / std::sqrt(ss / d + eps);
    for (int ch = 0; ch < d; ++ch) x[size_t(ch)] *= inv * k.norm[size_t(ch)];
    const float posf = float(k.positions[size_t(r)]);
    for (int i = 0; i < rd / 2; ++i) {
      const double ang = double(k.inv_freq[size_t(i)] * posf);  // fp32 product (P18)
      const double cs = std::cos(ang) * scaling, sn = std::sin(ang) * scaling;
      double& a = x[size_t(d - rd + 2 * i)];
      double& b = x[size_t(d - rd + 2 * i + 1)];
      const double a0 = a, b0 = b;
      a = a0 * cs - b0 * sn;
      b = a0 * sn + b0 * cs;
    }
    for (int ch = 0; ch < d; ++ch)
      (*pool)[size_t(int64_t(k.dst[size_t(r)]) * d + ch)] = float(x[size_t(ch)]);
  }
  *ring_kv = k.ring_kv;
  *ring_gate = k.ring_gate;
  for (int64_t i = 0; i < k.n_ring(); ++i) {
    const int32_t to = k.ring_dst[size_t(i)], from = k.ring_src[size_t(i)];
    if (to < 0) continue;
    std::copy_n(k.kc.data() + from * w, w, ring_kv->data() + int64_t(to) * w);
    std::copy_n(k.zc.data() + from * w, w, ring_gate->data() + int64_t(to) * w);
  }
}

/// compress_fused arguments over the host vectors of `k`: inputs from `k`, the state ring and
/// pool from the caller's copies (the op updates them), `scratch` as CompressFusedArgs::scratch
/// (nullptr allowed).
inline ops::CompressFusedArgs host_args(CompressCase& k, float* pool, float* ring_kv,
                                        float* ring_gate, float* scratch, float eps,
                                        float attention_scaling) {
  ops::CompressFusedArgs a;
  a.fresh_kv = k.kc.data();
  a.fresh_gate = k.zc.data();
  a.state_kv = ring_kv;
  a.state_gate = ring_gate;
  a.bias = k.bias.data();
  a.norm = k.norm.data();
  a.eps = eps;
  a.src = k.src.data();
  a.positions = k.positions.data();
  a.dst = k.dst.data();
  a.n_out = k.n_out();
  a.ring_src = k.ring_src.data();
  a.ring_dst = k.ring_dst.data();
  a.n_ring = k.n_ring();
  a.ratio = k.m;
  a.overlap = k.c;
  a.dim = k.d;
  a.rope_dim = k.rd;
  a.inv_freq = k.inv_freq.data();
  a.attention_scaling = attention_scaling;
  a.pool = pool;
  a.scratch = scratch;
  return a;
}

}  // namespace v4::testing
