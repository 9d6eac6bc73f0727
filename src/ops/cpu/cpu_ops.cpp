// CPU reference backend of ops.h: fp32, threaded with v4::ThreadPool, BLAS for GEMMs.
//
// Determinism and batch invariance: every op computes a row from that row's inputs only, with a
// fixed summation order, so a request's logits do not depend on which other requests share the
// step. GEMMs: on CPUs with AVX2+FMA, `linear` uses the kernel of gemm.cpp whose per-element
// arithmetic is independent of M and of the tiling. Otherwise it goes through cblas_sgemm, whose
// per-element summation order depends on M (measured with OpenBLAS 0.3.21: a row's result changes
// between M=1 and M=4); that path always calls sgemm on fixed blocks of kRowBlock rows
// (zero-padded) and fixed column chunks (which depend only on N), so a row's result depends only
// on x[row], w and N, K. Both paths are deterministic; tests/model checks the invariance.
#include <cblas.h>

#include <algorithm>
#include <stdexcept>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "base/kv_fp8.h"
#include "base/thread_pool.h"
#include "ops/cpu/gemm.h"
#include "ops/fill_random.h"
#include "ops/decode_plan_rows.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

constexpr int64_t kRowBlock = 16;   // rows per sgemm call (fixed: batch invariance)
constexpr int64_t kColChunk = 256;  // output columns per sgemm call (fixed per N)

inline float sigmoidf(float x) {
  return 1.f / (1.f + std::exp(-x));
}
inline float siluf(float x) {
  return x / (1.f + std::exp(-x));
}
// torch.nn.functional.softplus(beta=1, threshold=20).
inline float softplusf(float x) {
  return x > 20.f ? x : std::log1p(std::exp(x));
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Row `row` (width `dim`) of a KV pool of element type `dt` as f32: a pointer into the pool for
// kF32, else the row widened into `buf` (dim floats; bf16 → f32 is exact; kFp8 rows,
// kv_fp8_layout(dim, rope_dim), dequantized by kvfp8::dequantize_row; kFp8Index rows,
// kv_fp8_index_layout(dim), by kvfp8::dequantize_index_row).
inline const float* kv_row_f32(const void* pool, KvDtype dt, int64_t row, int64_t dim,
                               float* buf, int rope_dim = 0) {
  if (dt == KvDtype::kF32) return static_cast<const float*>(pool) + row * dim;
  if (dt == KvDtype::kFp8) {
    const KvFp8Layout L = kv_fp8_layout(int(dim), rope_dim);
    kvfp8::dequantize_row(static_cast<const uint8_t*>(pool) + row * L.bytes, L, buf);
    return buf;
  }
  if (dt == KvDtype::kFp8Index) {
    const KvFp8IndexLayout L = kv_fp8_index_layout(int(dim));
    kvfp8::dequantize_index_row(static_cast<const uint8_t*>(pool) + row * L.bytes, L, buf);
    return buf;
  }
  const uint16_t* p = static_cast<const uint16_t*>(pool) + row * dim;
  for (int64_t i = 0; i < dim; ++i) buf[i] = bf16_to_f32(p[i]);
  return buf;
}

class CpuOps final : public Ops {
 public:
  explicit CpuOps(ThreadPool* pool) : pool_(pool ? pool : &ThreadPool::global()) {
    // OpenBLAS threads would split rows/columns nondeterministically with our own pool; we
    // thread over fixed blocks ourselves.
    openblas_set_num_threads(1);
  }
  std::string name() const override { return "cpu"; }

  // Allocation: fresh blocks come from calloc (lazily zeroed pages); freed blocks are kept in a
  // size-keyed free list and handed out again without clearing (ops.h: contents unspecified), so
  // the per-step temporaries of a forward do not page-fault every step.
  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + 63) / 64 * 64;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = free_blocks_.find(rounded);
      if (it != free_blocks_.end()) {
        void* p = it->second;
        free_blocks_.erase(it);
        cached_bytes_ -= rounded;
        sizes_[p] = rounded;
        return p;
      }
    }
    void* p = std::calloc(1, rounded);
    if (!p) throw std::bad_alloc();
    std::lock_guard<std::mutex> lk(mu_);
    sizes_[p] = rounded;
    return p;
  }
  void free(void* ptr) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = sizes_.find(ptr);
    const size_t size = it == sizes_.end() ? 0 : it->second;
    if (it != sizes_.end()) sizes_.erase(it);
    if (size == 0 || cached_bytes_ + size > kMaxCachedBytes) {
      std::free(ptr);
      return;
    }
    free_blocks_.emplace(size, ptr);
    cached_bytes_ += size;
  }
  ~CpuOps() override {
    for (auto& [size, p] : free_blocks_) std::free(p);
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void synchronize() override {}

  void linear(const float* x, int64_t ldx, const float* w, int64_t M, int64_t N, int64_t K,
              float* y, int64_t ldy) override {
    if (M <= 0 || N <= 0) return;
    if (cpu::have_avx2_fma()) {
      // Tasks of 32 rows × 96 columns (any split gives identical results).
      constexpr int64_t kTaskRows = 32, kTaskCols = 96;
      const int64_t rt = (M + kTaskRows - 1) / kTaskRows, ct = (N + kTaskCols - 1) / kTaskCols;
      // Small products run on the caller: waking the pool costs more than they do.
      const int64_t min_tasks = M * N * K < (int64_t(1) << 21) ? rt * ct : 1;
      pool_->parallel_for(
          rt * ct,
          [&](int64_t b, int64_t e) {
            for (int64_t task = b; task < e; ++task) {
              const int64_t r0 = task / ct * kTaskRows, c0 = task % ct * kTaskCols;
              cpu::gemm_rows_avx2(x, ldx, w, r0, std::min(M, r0 + kTaskRows), c0,
                                  std::min(N, c0 + kTaskCols), K, y, ldy);
            }
          },
          min_tasks);
      return;
    }
    const int64_t row_blocks = (M + kRowBlock - 1) / kRowBlock;
    const int64_t col_chunks = (N + kColChunk - 1) / kColChunk;
    pool_->parallel_for(row_blocks * col_chunks, [&](int64_t b, int64_t e) {
      thread_local std::vector<float> xpad, ypad;
      for (int64_t task = b; task < e; ++task) {
        const int64_t rb = task / col_chunks, cc = task % col_chunks;
        const int64_t r0 = rb * kRowBlock, rows = std::min(kRowBlock, M - r0);
        const int64_t c0 = cc * kColChunk, cols = std::min(kColChunk, N - c0);
        if (rows == kRowBlock) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(kRowBlock), int(cols), int(K),
                      1.f, x + r0 * ldx, int(ldx), w + c0 * K, int(K), 0.f, y + r0 * ldy + c0,
                      int(ldy));
        } else {
          xpad.assign(size_t(kRowBlock * K), 0.f);
          ypad.assign(size_t(kRowBlock * cols), 0.f);
          for (int64_t r = 0; r < rows; ++r)
            std::memcpy(&xpad[r * K], x + (r0 + r) * ldx, size_t(K) * sizeof(float));
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(kRowBlock), int(cols), int(K),
                      1.f, xpad.data(), int(K), w + c0 * K, int(K), 0.f, ypad.data(), int(cols));
          for (int64_t r = 0; r < rows; ++r)
            std::memcpy(y + (r0 + r) * ldy + c0, &ypad[r * cols], size_t(cols) * sizeof(float));
        }
      }
    });
  }

  void add(float* y, const float* x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }

  void gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t width,
                   float* dst) override {
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(dst + i * width, src + int64_t(rows[i]) * width, size_t(width) * sizeof(float));
  }

  void store_rows(float* pool, const int32_t* rows, int64_t n, int64_t width,
                  const float* src) override {
    for (int64_t i = 0; i < n; ++i)
      if (rows[i] >= 0)
        std::memcpy(pool + int64_t(rows[i]) * width, src + i * width,
                    size_t(width) * sizeof(float));
  }

  bool supports_kv_dtype(KvDtype) const override { return true; }

  void store_rows_kv(void* pool, KvDtype dtype, const int32_t* rows, int64_t n, int64_t width,
                     const float* src, int rope_dim) override {
    if (dtype == KvDtype::kF32) {
      store_rows(static_cast<float*>(pool), rows, n, width, src);
      return;
    }
    if (dtype == KvDtype::kFp8) {
      if (rope_dim < 0 || rope_dim > width)
        throw std::invalid_argument("store_rows_kv: fp8 rope_dim out of range");
      const KvFp8Layout L = kv_fp8_layout(int(width), rope_dim);
      uint8_t* p = static_cast<uint8_t*>(pool);
      for (int64_t i = 0; i < n; ++i)
        if (rows[i] >= 0) kvfp8::quantize_row(src + i * width, L, p + int64_t(rows[i]) * L.bytes);
      return;
    }
    if (dtype == KvDtype::kFp8Index) {
      if (width <= 0 || width % 16 != 0)
        throw std::invalid_argument("store_rows_kv: fp8 indexer rows need width % 16 == 0");
      const KvFp8IndexLayout L = kv_fp8_index_layout(int(width));
      uint8_t* p = static_cast<uint8_t*>(pool);
      for (int64_t i = 0; i < n; ++i)
        if (rows[i] >= 0)
          kvfp8::quantize_index_row(src + i * width, L, p + int64_t(rows[i]) * L.bytes);
      return;
    }
    uint16_t* p = static_cast<uint16_t*>(pool);
    for (int64_t i = 0; i < n; ++i)
      if (rows[i] >= 0) {
        uint16_t* dst = p + int64_t(rows[i]) * width;
        for (int64_t c = 0; c < width; ++c) dst[c] = f32_to_bf16(src[i * width + c]);
      }
  }

  void embed(const float* table, const int32_t* ids, int64_t S, int D, int n_streams,
             float* out) override {
    for (int64_t t = 0; t < S; ++t)
      for (int s = 0; s < n_streams; ++s)
        std::memcpy(out + (t * n_streams + s) * D, table + int64_t(ids[t]) * D,
                    size_t(D) * sizeof(float));
  }

  void rms_norm(const float* x, const float* weight, int64_t rows, int dim, float eps,
                float* y) override {
    pool_->parallel_for(
        rows,
        [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) {
            const float* xr = x + r * dim;
            float* yr = y + r * dim;
            double ss = 0;
            for (int i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
            const float inv = float(1.0 / std::sqrt(ss / dim + double(eps)));
            if (weight)
              for (int i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv);
            else
              for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv;
          }
        },
        64);
  }

  void rope(float* x, int64_t rows, int n_heads, int head_dim, int rope_dim,
            const int64_t* positions, const float* inv_freq, float attention_scaling,
            bool inverse) override {
    const int half = rope_dim / 2;
    pool_->parallel_for(
        rows,
        [&](int64_t b, int64_t e) {
          std::vector<float> cs(half), sn(half);
          for (int64_t r = b; r < e; ++r) {
            const float pos = float(positions[r]);
            for (int i = 0; i < half; ++i) {
              const float ang = inv_freq[i] * pos;  // fp32 product, as HF (dsv4-model.md P18)
              cs[i] = std::cos(ang) * attention_scaling;
              sn[i] = std::sin(ang) * attention_scaling;
              if (inverse) sn[i] = -sn[i];
            }
            for (int h = 0; h < n_heads; ++h) {
              float* v = x + (r * n_heads + h) * head_dim + (head_dim - rope_dim);
              for (int i = 0; i < half; ++i) {
                const float a = v[2 * i], c = v[2 * i + 1];
                v[2 * i] = a * cs[i] - c * sn[i];
                v[2 * i + 1] = c * cs[i] + a * sn[i];
              }
            }
          }
        },
        32);
  }

  void hc_pre(const HcArgs& a) override {
    const int n = a.n_streams, D = a.hidden;
    const int64_t width = int64_t(n) * D;
    const int n_mix = (2 + n) * n;
    // mix = RMS(flat) · fnᵀ through the batch-invariant GEMM.
    std::vector<float> flat(size_t(a.n_rows * width)), mixes(size_t(a.n_rows * n_mix));
    rms_norm(a.h, nullptr, a.n_rows, int(width), a.rms_eps, flat.data());
    linear(flat.data(), width, a.fn, a.n_rows, n_mix, width, mixes.data(), n_mix);
    pool_->parallel_for(
        a.n_rows,
        [&](int64_t b, int64_t e) {
          std::vector<float> comb(n * n);
          for (int64_t t = b; t < e; ++t) {
            const float* h = a.h + t * width;
            const float* mix = &mixes[t * n_mix];
            float pre[16];
            for (int s = 0; s < n; ++s) {
              pre[s] = sigmoidf(mix[s] * a.scale[0] + a.base[s]) + a.hc_eps;
              a.post[t * n + s] = 2.f * sigmoidf(mix[n + s] * a.scale[1] + a.base[n + s]);
            }
            // comb logits, row j / column k; softmax over k, +eps, then Sinkhorn.
            for (int j = 0; j < n; ++j) {
              float* row = &comb[j * n];
              float mx = -std::numeric_limits<float>::infinity();
              for (int k = 0; k < n; ++k) {
                row[k] = mix[2 * n + j * n + k] * a.scale[2] + a.base[2 * n + j * n + k];
                mx = std::max(mx, row[k]);
              }
              float sum = 0.f;
              for (int k = 0; k < n; ++k) sum += (row[k] = std::exp(row[k] - mx));
              for (int k = 0; k < n; ++k) row[k] = row[k] / sum + a.hc_eps;
            }
            auto col_norm = [&] {
              for (int k = 0; k < n; ++k) {
                float s = 0.f;
                for (int j = 0; j < n; ++j) s += comb[j * n + k];
                for (int j = 0; j < n; ++j) comb[j * n + k] /= (s + a.hc_eps);
              }
            };
            auto row_norm = [&] {
              for (int j = 0; j < n; ++j) {
                float s = 0.f;
                for (int k = 0; k < n; ++k) s += comb[j * n + k];
                for (int k = 0; k < n; ++k) comb[j * n + k] /= (s + a.hc_eps);
              }
            };
            col_norm();
            for (int it = 0; it < a.sinkhorn_iters - 1; ++it) {
              row_norm();
              col_norm();
            }
            std::memcpy(a.comb + t * n * n, comb.data(), sizeof(float) * n * n);
            float* c = a.collapsed + t * D;
            for (int d = 0; d < D; ++d) {
              float s = 0.f;
              for (int st = 0; st < n; ++st) s += pre[st] * h[st * D + d];
              c[d] = s;
            }
          }
        },
        16);
  }

  void hc_post(float* h, const float* f, const float* post, const float* comb, int64_t S, int n,
               int D) override {
    pool_->parallel_for(
        S,
        [&](int64_t b, int64_t e) {
          std::vector<float> old(size_t(n) * D);
          for (int64_t t = b; t < e; ++t) {
            float* ht = h + t * n * D;
            std::memcpy(old.data(), ht, sizeof(float) * n * D);
            const float* cb = comb + t * n * n;
            for (int k = 0; k < n; ++k) {
              const float pk = post[t * n + k];
              for (int d = 0; d < D; ++d) {
                float s = 0.f;
                for (int j = 0; j < n; ++j) s += cb[j * n + k] * old[j * D + d];
                ht[k * D + d] = pk * f[t * D + d] + s;
              }
            }
          }
        },
        16);
  }

  void hc_head(const float* h, const float* fn, const float* base, const float* scale, int64_t S,
               int n, int D, float rms_eps, float hc_eps, float* y) override {
    const int64_t width = int64_t(n) * D;
    std::vector<float> flat(size_t(S * width)), mixes(size_t(S * n));
    rms_norm(h, nullptr, S, int(width), rms_eps, flat.data());
    linear(flat.data(), width, fn, S, n, width, mixes.data(), n);
    for (int64_t t = 0; t < S; ++t) {
      const float* ht = h + t * width;
      float pre[16];
      for (int s = 0; s < n; ++s) pre[s] = sigmoidf(mixes[t * n + s] * scale[0] + base[s]) + hc_eps;
      for (int d = 0; d < D; ++d) {
        float s = 0.f;
        for (int st = 0; st < n; ++st) s += pre[st] * ht[st * D + d];
        y[t * D + d] = s;
      }
    }
  }

  void compress_pool(const CompressArgs& a) override {
    const int m = a.ratio, c = a.overlap, d = a.dim;
    const int n_slots = c * m;
    const int64_t width = int64_t(c) * d;
    pool_->parallel_for(
        a.n_out,
        [&](int64_t b, int64_t e) {
          std::vector<const float*> kv(n_slots), gt(n_slots), bs(n_slots);
          std::vector<float> g(n_slots);
          for (int64_t r = b; r < e; ++r) {
            for (int j = 0; j < n_slots; ++j) {
              const int32_t v = a.src[r * n_slots + j];
              const int ch0 = (c == 2 && j >= m) ? d : 0;  // series b of the overlap compressor
              const int brow = (c == 2 && j >= m) ? j - m : j;
              if (v == -1) {
                kv[j] = nullptr;
                continue;
              }
              const float* kbase =
                  v >= 0 ? a.fresh_kv + int64_t(v) * width : a.state_kv + int64_t(-v - 2) * width;
              const float* gbase = v >= 0 ? a.fresh_gate + int64_t(v) * width
                                          : a.state_gate + int64_t(-v - 2) * width;
              kv[j] = kbase + ch0;
              gt[j] = gbase + ch0;
              bs[j] = a.bias + int64_t(brow) * width + ch0;
            }
            float* out = a.out + r * d;
            for (int ch = 0; ch < d; ++ch) {
              float mx = -std::numeric_limits<float>::infinity();
              for (int j = 0; j < n_slots; ++j)
                if (kv[j]) mx = std::max(mx, g[j] = gt[j][ch] + bs[j][ch]);
              float sum = 0.f;
              for (int j = 0; j < n_slots; ++j)
                if (kv[j]) sum += (g[j] = std::exp(g[j] - mx));
              float acc = 0.f;
              for (int j = 0; j < n_slots; ++j)
                if (kv[j]) acc += kv[j][ch] * (g[j] / sum);
              out[ch] = acc;
            }
          }
        },
        4);
  }

  void indexer_topk(const IndexerArgs& a) override {
    const int nI = a.n_heads, dI = a.head_dim, k = a.topk;
    const float qscale = 1.f / std::sqrt(float(dI));
    const float wscale = 1.f / std::sqrt(float(nI));
    pool_->parallel_for(
        a.n_rows,
        [&](int64_t b, int64_t e) {
          std::vector<float> score;
          std::vector<int32_t> order;
          std::vector<float> w(nI), kbuf(static_cast<size_t>(dI)), qbuf;
          for (int64_t t = b; t < e; ++t) {
            const int32_t n_cand = a.cand.count[t];
            const int32_t* rows = a.cand.rows + a.cand.offset[t];
            const float* q = a.q + t * nI * dI;
            if (a.key_dtype == KvDtype::kFp8Index) {  // fp8 keys: q quantized per head as well
              qbuf.resize(size_t(nI) * dI);
              for (int h = 0; h < nI; ++h)
                kvfp8::index_query_fp8(q + h * dI, dI, qbuf.data() + size_t(h) * dI);
              q = qbuf.data();
            }
            for (int h = 0; h < nI; ++h) w[h] = a.weights[t * nI + h] * wscale;
            score.assign(n_cand, 0.f);
            for (int32_t s = 0; s < n_cand; ++s) {
              const float* key =
                  kv_row_f32(a.key_pool, a.key_dtype, rows[s], dI, kbuf.data());
              float acc = 0.f;
              for (int h = 0; h < nI; ++h) {
                const float v = std::max(0.f, dot(q + h * dI, key, dI)) * qscale;
                acc += v * w[h];
              }
              score[s] = acc;
            }
            const int n_sel = std::min<int32_t>(k, n_cand);
            order.resize(n_cand);
            std::iota(order.begin(), order.end(), 0);
            std::partial_sort(order.begin(), order.begin() + n_sel, order.end(),
                              [&](int32_t x, int32_t y) {
                                if (score[x] != score[y]) return score[x] > score[y];
                                return x < y;
                              });
            std::sort(order.begin(), order.begin() + n_sel);  // output: map position order
            int32_t* out = a.out_rows + t * k;
            for (int i = 0; i < k; ++i) out[i] = i < n_sel ? rows[order[i]] : -1;
            if (a.out_count) a.out_count[t] = n_sel;
          }
        },
        4);
  }

  void sparse_attention(const AttentionArgs& a) override {
    const int H = a.n_heads, hd = a.head_dim;
    pool_->parallel_for(
        a.n_rows * H,
        [&](int64_t b, int64_t e) {
          std::vector<const float*> keys;
          std::vector<std::pair<const void*, int32_t>> key_rows;  // (pool, row)
          std::vector<float> logit, kbuf;
          for (int64_t th = b; th < e; ++th) {
            const int64_t t = th / H;
            const int h = int(th % H);
            key_rows.clear();
            auto collect = [&](const void* pool, const RowMap& map) {
              if (!pool || !map.count) return;
              const int32_t* rows = map.rows + map.offset[t];
              for (int32_t j = 0; j < map.count[t]; ++j)
                if (rows[j] >= 0) key_rows.push_back({pool, rows[j]});
            };
            collect(a.swa_pool, a.swa);
            collect(a.comp_pool, a.comp);
            // f32 pools: pointers into the pool; bf16: rows widened into kbuf (exact).
            keys.resize(key_rows.size());
            if (a.kv_dtype != KvDtype::kF32) kbuf.resize(key_rows.size() * size_t(hd));
            for (size_t j = 0; j < key_rows.size(); ++j)
              keys[j] = kv_row_f32(key_rows[j].first, a.kv_dtype, key_rows[j].second, hd,
                                   kbuf.data() + (a.kv_dtype != KvDtype::kF32 ? j * hd : 0),
                                   a.rope_dim);
            const float* q = a.q + (t * H + h) * hd;
            logit.resize(keys.size());
            float mx = a.sinks[h];
            for (size_t j = 0; j < keys.size(); ++j) {
              logit[j] = dot(q, keys[j], hd) * a.scale;
              mx = std::max(mx, logit[j]);
            }
            float sum = std::exp(a.sinks[h] - mx);
            for (size_t j = 0; j < keys.size(); ++j) sum += (logit[j] = std::exp(logit[j] - mx));
            float* o = a.out + (t * H + h) * hd;
            std::fill(o, o + hd, 0.f);
            for (size_t j = 0; j < keys.size(); ++j) {
              const float p = logit[j] / sum;
              const float* v = keys[j];
              for (int i = 0; i < hd; ++i) o[i] += p * v[i];
            }
          }
        },
        8);
  }

  void route(const RouteArgs& a) override {
    const int E = a.n_experts, k = a.topk;
    pool_->parallel_for(
        a.n_rows,
        [&](int64_t b, int64_t e) {
          std::vector<float> s(E), sel(E);
          std::vector<int32_t> order(E);
          for (int64_t t = b; t < e; ++t) {
            const float* lg = a.logits + t * E;
            switch (a.scoring) {
              case ScoringFunc::kSqrtSoftplus:
                for (int i = 0; i < E; ++i) s[i] = std::sqrt(softplusf(lg[i]));
                break;
              case ScoringFunc::kSigmoid:
                for (int i = 0; i < E; ++i) s[i] = sigmoidf(lg[i]);
                break;
              case ScoringFunc::kSoftmax: {
                float mx = -std::numeric_limits<float>::infinity();
                for (int i = 0; i < E; ++i) mx = std::max(mx, lg[i]);
                float sum = 0.f;
                for (int i = 0; i < E; ++i) sum += (s[i] = std::exp(lg[i] - mx));
                for (int i = 0; i < E; ++i) s[i] /= sum;
                break;
              }
            }
            int32_t* idx = a.out_idx + t * k;
            if (a.tid2eid) {
              for (int j = 0; j < k; ++j) idx[j] = a.tid2eid[int64_t(a.token_ids[t]) * k + j];
            } else {
              for (int i = 0; i < E; ++i) sel[i] = s[i] + (a.bias ? a.bias[i] : 0.f);
              std::iota(order.begin(), order.end(), 0);
              std::partial_sort(order.begin(), order.begin() + k, order.end(),
                                [&](int32_t x, int32_t y) {
                                  if (sel[x] != sel[y]) return sel[x] > sel[y];
                                  return x < y;
                                });
              for (int j = 0; j < k; ++j) idx[j] = order[j];
            }
            float sum = 0.f;
            for (int j = 0; j < k; ++j) sum += s[idx[j]];
            for (int j = 0; j < k; ++j)
              a.out_weight[t * k + j] = s[idx[j]] / (sum + 1e-20f) * a.routed_scaling_factor;
          }
        },
        8);
  }

  void moe_experts(const MoeArgs& a) override {
    if (a.w13.format != WFormat::kF32 || a.w2.format != WFormat::kF32)
      throw std::invalid_argument("moe_experts: the CPU backend reads f32 expert weights only");
    const int64_t S = a.n_rows;
    const int D = a.hidden, I = a.inter, k = a.topk;
    // Bucket (token, slot) pairs by expert, in token order.
    std::vector<std::vector<int64_t>> bucket(a.n_experts);
    for (int64_t t = 0; t < S; ++t)
      for (int j = 0; j < k; ++j) bucket[a.idx[t * k + j]].push_back(t * k + j);
    std::vector<float> per_slot(size_t(S) * k * D, 0.f);
    std::vector<float> xin, gu, act, down;
    for (int ex = 0; ex < a.n_experts; ++ex) {
      const auto& items = bucket[ex];
      if (items.empty()) continue;
      const int64_t n = int64_t(items.size());
      xin.resize(size_t(n) * D);
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(&xin[i * D], a.x + (items[i] / k) * D, sizeof(float) * D);
      gu.resize(size_t(n) * 2 * I);
      linear(xin.data(), D, a.w13.f32_rows(ex), n, 2 * I, D, gu.data(), 2 * I);
      act.resize(size_t(n) * I);
      const float lim = a.swiglu_limit;
      for (int64_t i = 0; i < n; ++i) {
        const float* g = &gu[i * 2 * I];
        const float* u = g + I;
        for (int c = 0; c < I; ++c) {
          float gv = g[c], uv = u[c];
          if (lim > 0.f) {
            gv = std::min(gv, lim);
            uv = std::clamp(uv, -lim, lim);
          }
          act[i * I + c] = siluf(gv) * uv;
        }
      }
      down.resize(size_t(n) * D);
      linear(act.data(), I, a.w2.f32_rows(ex), n, D, I, down.data(), D);
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(&per_slot[items[i] * D], &down[i * D], sizeof(float) * D);
    }
    for (int64_t t = 0; t < S; ++t) {
      float* o = a.out + t * D;
      std::fill(o, o + D, 0.f);
      for (int j = 0; j < k; ++j) {
        const float wj = a.weight[t * k + j];
        const float* v = &per_slot[(t * k + j) * D];
        for (int c = 0; c < D; ++c) o[c] += v[c] * wj;
      }
    }
  }

  // ---- dummy weights, memory and device queries (ops.h) ---------------------------------
  void fill_random(void* dst, int64_t n, RandomFill kind, float scale, uint64_t seed) override {
    if (n <= 0) return;
    const fill::FillParams p = fill::make_params(kind, scale, seed);
    pool_->parallel_for(
        n,
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) fill::fill_one(dst, uint64_t(i), p);
        },
        int64_t(1) << 16);
  }
  MemoryInfo memory_info() override {
    MemoryInfo m;
    std::ifstream in("/proc/meminfo");
    std::string key;
    int64_t kb = 0;
    std::string unit;
    while (in >> key >> kb) {
      std::getline(in, unit);
      if (key == "MemTotal:") m.total_bytes = kb * 1024;
      if (key == "MemAvailable:") m.free_bytes = kb * 1024;
    }
    return m;
  }
  std::string device_info() override {
    std::ifstream in("/proc/cpuinfo");
    std::string line, model = "unknown CPU";
    while (std::getline(in, line))
      if (line.rfind("model name", 0) == 0) {
        const size_t colon = line.find(':');
        if (colon != std::string::npos) model = line.substr(colon + 2);
        break;
      }
    return "CPU: " + model + ", " + std::to_string(std::thread::hardware_concurrency()) +
           " hardware threads, backend pool " + std::to_string(pool_->size()) + " threads";
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    constexpr size_t kChunk = size_t(4) << 20;
    const int64_t chunks = int64_t((bytes + kChunk - 1) / kChunk);
    pool_->parallel_for(chunks, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const size_t off = size_t(c) * kChunk;
        std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off,
                    std::min(kChunk, bytes - off));
      }
    });
  }

  // Serial memcpy's for small lists (the prefix cache's per-step write-back is a few KiB);
  // large lists split over the pool by segment (each segment is copied by one thread).
  void copy_batch(const CopySegment* segs, int64_t n) override {
    if (n <= 0) return;
    size_t total = 0;
    for (int64_t i = 0; i < n; ++i) total += segs[i].bytes;
    auto run = [segs](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        if (segs[i].bytes) std::memcpy(segs[i].dst, segs[i].src, segs[i].bytes);
    };
    if (total < (size_t(4) << 20) || n < 2)
      run(0, n);
    else
      pool_->parallel_for(n, run);
  }

  // Reference of the device-built decode plan: the shared per-row arithmetic, serially.
  void build_decode_plan(const DecodePlanArgs& a) override {
    const int64_t n_delta = a.delta_count ? *a.delta_count : 0;
    if (n_delta < 0 || n_delta > a.delta_cap)
      throw std::invalid_argument("build_decode_plan: delta_count outside [0, delta_cap]");
    for (int64_t r = 0; r < n_delta; ++r) plan::decode_plan_delta(a, r, 0, 1);
    for (int64_t b = 0; b < a.n_rows; ++b) plan::decode_plan_row(a, b, 0, 1);
  }

 private:
  static constexpr size_t kMaxCachedBytes = size_t(512) << 20;
  ThreadPool* pool_;
  std::mutex mu_;
  std::multimap<size_t, void*> free_blocks_;
  std::unordered_map<void*, size_t> sizes_;
  size_t cached_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(ThreadPool* pool) {
  return std::make_unique<CpuOps>(pool);
}

}  // namespace v4::ops
