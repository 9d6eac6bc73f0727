// Backend-independent parts of ops.h: weight formats and the default `linear_w`.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/fill_random.h"
#include "ops/ops.h"

namespace v4::ops {

const char* wformat_name(WFormat f) {
  switch (f) {
    case WFormat::kF32:
      return "f32";
    case WFormat::kBF16:
      return "bf16";
    case WFormat::kFP8Block:
      return "fp8-block";
    case WFormat::kMXFP4:
      return "mxfp4";
  }
  return "?";
}

int64_t wformat_bytes(WFormat f, int64_t n, int64_t k) {
  switch (f) {
    case WFormat::kF32:
      return n * k * 4;
    case WFormat::kBF16:
      return n * k * 2;
    case WFormat::kFP8Block:
      return n * k + ((n + 127) / 128) * ((k + 127) / 128) * 4;
    case WFormat::kMXFP4:
      return n * (k / 2) + n * (k / 32);
  }
  return 0;
}

void Ops::linear_w(const float* x, int64_t ldx, const WeightView& w, int64_t M, float* y,
                   int64_t ldy) {
  if (w.format != WFormat::kF32)
    throw std::invalid_argument(std::string("linear_w: backend '") + name() +
                                "' does not read weights stored as " + wformat_name(w.format));
  linear(x, ldx, w.f32_rows(), M, w.n, w.k, y, ldy);
}

void Ops::linear_w_grouped(const float* x, int64_t ldx, const WeightView& w, int groups,
                           int64_t M, float* y, int64_t ldy) {
  if (groups < 1 || w.n % groups)
    throw std::invalid_argument("linear_w_grouped: " + std::to_string(w.n) +
                                " rows do not split into " + std::to_string(groups) + " groups");
  const int64_t n = w.n / groups;
  for (int g = 0; g < groups; ++g)
    linear_w(x + int64_t(g) * w.k, ldx, w.rows(int64_t(g) * n, n), M, y + int64_t(g) * n, ldy);
}

void Ops::fill_random(void* dst, int64_t n, RandomFill kind, float scale, uint64_t seed) {
  if (n <= 0) return;
  const fill::FillParams p = fill::make_params(kind, scale, seed);
  std::vector<uint8_t> host(size_t(n) * size_t(fill::unit_bytes(kind)));
  for (int64_t i = 0; i < n; ++i) fill::fill_one(host.data(), uint64_t(i), p);
  upload(dst, host.data(), host.size());
}

void Ops::store_rows_kv(void* pool, KvDtype dtype, const int32_t* rows, int64_t n, int64_t width,
                        const float* src, int /*rope_dim*/) {
  if (dtype != KvDtype::kF32)
    throw std::invalid_argument("store_rows_kv: backend " + name() + " has no " +
                                kv_dtype_name(dtype) + " KV pools");
  store_rows(static_cast<float*>(pool), rows, n, width, src);
}

void Ops::rms_norm_rope(float* x, const float* weight, int64_t rows, int n_heads, int head_dim,
                        float eps, int rope_dim, const int64_t* positions, const float* inv_freq,
                        float attention_scaling) {
  rms_norm(x, weight, rows * n_heads, head_dim, eps, x);
  rope(x, rows, n_heads, head_dim, rope_dim, positions, inv_freq, attention_scaling, false);
}

void Ops::hc_pre_norm(const HcArgs& a, const float* norm_weight, float norm_eps, float* x) {
  hc_pre(a);
  rms_norm(a.collapsed, norm_weight, a.n_rows, a.hidden, norm_eps, x);
}

void Ops::hc_post_add(float* h, float* f, const float* f_add, const float* post,
                      const float* comb, int64_t S, int n_streams, int D) {
  add(f, f_add, S * D);
  hc_post(h, f, post, comb, S, n_streams, D);
}

void Ops::hc_head_norm(const float* h, const float* fn, const float* base, const float* scale,
                       int64_t S, int n_streams, int D, float rms_eps, float hc_eps,
                       const float* norm_weight, float norm_eps, float* y) {
  hc_head(h, fn, base, scale, S, n_streams, D, rms_eps, hc_eps, y);
  rms_norm(y, norm_weight, S, D, norm_eps, y);
}

void Ops::compress_project(const CompressProjectArgs& a) {
  const int64_t cd = int64_t(a.step.overlap) * a.step.dim;
  linear_w(a.x, a.ldx, a.wkv, a.n_fresh, a.kc, cd);
  linear_w(a.x, a.ldx, a.wgate, a.n_fresh, a.zc, cd);
  CompressFusedArgs s = a.step;
  s.fresh_kv = a.kc;
  s.fresh_gate = a.zc;
  compress_fused(s);
}

void Ops::compress_fused(const CompressFusedArgs& a) {
  const int64_t cd = int64_t(a.overlap) * a.dim;
  const int64_t need = std::max<int64_t>(a.n_out * a.dim, a.n_ring * cd);
  if (need <= 0) return;
  DeviceBuffer<float> own;
  float* tmp = a.scratch;
  if (!tmp) {
    own = DeviceBuffer<float>(this, need);
    tmp = own.data();
  }
  if (a.n_out > 0) {
    compress_pool(a.pool_args(tmp));
    rms_norm(tmp, a.norm, a.n_out, a.dim, a.eps, tmp);
    if (a.rope_dim > 0)
      rope(tmp, a.n_out, 1, a.dim, a.rope_dim, a.positions, a.inv_freq, a.attention_scaling,
           false);
    store_rows_kv(a.pool, a.pool_dtype, a.dst, a.n_out, a.dim, tmp, a.rope_dim);
  }
  if (a.n_ring > 0) {  // after the pooling: it may read ring rows refreshed here
    gather_rows(a.fresh_kv, a.ring_src, a.n_ring, cd, tmp);
    store_rows(a.state_kv, a.ring_dst, a.n_ring, cd, tmp);
    gather_rows(a.fresh_gate, a.ring_src, a.n_ring, cd, tmp);
    store_rows(a.state_gate, a.ring_dst, a.n_ring, cd, tmp);
  }
}

MemoryInfo Ops::memory_info() {
  return {};
}

std::string Ops::device_info() {
  return name();
}

void Ops::copy(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  std::vector<uint8_t> host(bytes);
  download(host.data(), src, bytes);
  upload(dst, host.data(), bytes);
}

void Ops::copy_batch(const CopySegment* segs, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (segs[i].bytes) copy(segs[i].dst, segs[i].src, segs[i].bytes);
}

}  // namespace v4::ops
