// Decode attention rows of bench_kernels (`--only-attention` → cuda-attention.md): the decode
// kernel (attention_dec.h, bf16 mma.sync, cost-model splits) in variant 2 (default) and 1 (the
// session-5 kernel) vs the previous bf16-mode kernel (attention_mma.h, TF32, f32 pools only,
// attention_auto_splits as CudaOps used it), V4-Flash shapes (64 heads × 512), f32 and bf16
// pools × CSA (128 SWA + min(512, ctx/4) top-k keys) and HCA (128 + ctx/128 keys) × batch 1 / 64
// × context 4K / 128K / 1M, next to the byte floor of the pool's element size.
#ifdef V4_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "bench_timing.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_dec.h"
#include "ops/ops.h"

namespace {

v4::KvDtype a0_dtype(bool b16) { return b16 ? v4::KvDtype::kBf16 : v4::KvDtype::kF32; }

#define AB_CHECK(x)                                                                      \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)
#define AB_OK(x)                                                                         \
  do {                                                                                   \
    v4::Status s_ = (x);                                                                 \
    if (!s_.ok()) {                                                                      \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, s_.to_string().c_str());   \
      std::exit(3);                                                                      \
    }                                                                                    \
  } while (0)

// Median per-launch µs of fn(i) on the default stream (launch i uses input set i % sets:
// consecutive launches touch different memory); v4::bench::time_launches (bench_timing.h).
double median_us(const std::function<void(int)>& fn, int samples = 30, int inner = 10) {
  return v4::bench::time_launches(
             nullptr, [&](int i, cudaStream_t) { fn(i); }, samples, inner, 10)
      .med_us;
}

// The key pools of the attention rows: `rows` rows × 512 of finite, non-constant values (the
// kernels' cost does not depend on them) as f32 (`f32`) and / or the same values rounded to bf16
// (`bf16`); the pool that is not asked for stays nullptr.
struct AttnPools {
  float* f32 = nullptr;
  uint16_t* bf16 = nullptr;
  AttnPools(int64_t rows, int hd, bool want_f32, bool want_bf16) {
    if (want_f32) AB_CHECK(cudaMalloc(&f32, size_t(rows) * hd * sizeof(float)));
    if (want_bf16) AB_CHECK(cudaMalloc(&bf16, size_t(rows) * hd * sizeof(uint16_t)));
    std::vector<float> chunk(size_t(1) << 22);
    std::vector<uint16_t> chunk_b(chunk.size());
    std::mt19937_64 g(99);
    std::normal_distribution<float> d(0.f, 0.3f);
    for (auto& x : chunk) x = d(g);
    for (size_t i = 0; i < chunk.size(); ++i) chunk_b[i] = v4::f32_to_bf16(chunk[i]);
    const size_t total = size_t(rows) * hd;
    for (size_t off = 0; off < total; off += chunk.size()) {
      const size_t cnt = std::min(chunk.size(), total - off);
      if (f32) AB_CHECK(cudaMemcpy(f32 + off, chunk.data(), cnt * 4, cudaMemcpyHostToDevice));
      if (bf16) AB_CHECK(cudaMemcpy(bf16 + off, chunk_b.data(), cnt * 2, cudaMemcpyHostToDevice));
    }
  }
  AttnPools(const AttnPools&) = delete;
  AttnPools& operator=(const AttnPools&) = delete;
  ~AttnPools() {
    cudaFree(f32);
    cudaFree(bf16);
  }
};

// The current device's SM count and H zero sinks (device f32, freed with the object).
struct AttnDevice {
  int n_sms = 0;
  float* sinks = nullptr;
  explicit AttnDevice(int H) {
    int dev = 0;
    AB_CHECK(cudaGetDevice(&dev));
    AB_CHECK(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, dev));
    AB_CHECK(cudaMalloc(&sinks, H * sizeof(float)));
    AB_CHECK(cudaMemset(sinks, 0, H * sizeof(float)));
  }
  AttnDevice(const AttnDevice&) = delete;
  AttnDevice& operator=(const AttnDevice&) = delete;
  ~AttnDevice() { cudaFree(sinks); }
};

// Device inputs of one decode-attention configuration: S query rows per launch, each with
// n_swa SWA keys then n_comp compressed keys (keys = n_swa + n_comp), `sets` input sets (key
// lists, q, out) so consecutive launches touch different memory. Set r, row t → its keys are
// distinct rows of the pool (consecutive chunks of a fresh permutation of `perm`'s rows, which
// must hold ≥ S · keys rows). q of set r = `q_src` + r · S · H · hd (device f32, ≥ sets · S · H ·
// hd floats).
struct AttnInputs {
  int64_t S, n_swa, n_comp, keys;
  int sets, H, hd;
  size_t qn;  // floats of q (and out) per set: S · H · hd
  int32_t *d_rows = nullptr, *d_sc = nullptr, *d_cc = nullptr;
  int64_t *d_so = nullptr, *d_co = nullptr;
  float *d_q = nullptr, *d_out = nullptr;
  AttnInputs(int64_t S_, int64_t n_swa_, int64_t n_comp_, int sets_, int H_, int hd_,
             std::vector<int32_t>& perm, std::mt19937_64& g, const float* q_src,
             int64_t pool_rows = 0)
      : S(S_), n_swa(n_swa_), n_comp(n_comp_), keys(n_swa_ + n_comp_), sets(sets_), H(H_),
        hd(hd_), qn(size_t(S_) * H_ * hd_) {
    if (S * keys > (pool_rows > 0 ? std::min<int64_t>(pool_rows, int64_t(perm.size()))
                                    : int64_t(perm.size()))) {
      std::fprintf(stderr, "AttnInputs: %lld rows × %lld keys exceed the pool (%zu rows)\n",
                   (long long)S, (long long)keys, perm.size());
      std::exit(2);
    }
    std::vector<int32_t> rows(size_t(sets * S * keys));
    std::vector<int64_t> so(size_t(sets * S)), co(size_t(sets * S));
    std::vector<int32_t> sc(static_cast<size_t>(S), static_cast<int32_t>(n_swa));
    std::vector<int32_t> cc(static_cast<size_t>(S), static_cast<int32_t>(n_comp));
    for (int r = 0; r < sets; ++r) {
      std::iota(perm.begin(), perm.end(), 0);
      // pool_rows > 0: the rows come from the first pool_rows rows only (a smaller pool).
      const auto end = pool_rows > 0 && pool_rows < int64_t(perm.size()) ? perm.begin() + pool_rows
                                                                           : perm.end();
      std::shuffle(perm.begin(), end, g);
      for (int64_t t = 0; t < S; ++t) {
        const int64_t base = (r * S + t) * keys;
        std::copy(perm.begin() + t * keys, perm.begin() + (t + 1) * keys, rows.begin() + base);
        so[size_t(r * S + t)] = base;
        co[size_t(r * S + t)] = base + n_swa;
      }
    }
    AB_CHECK(cudaMalloc(&d_rows, rows.size() * 4));
    AB_CHECK(cudaMalloc(&d_sc, size_t(S) * 4));
    AB_CHECK(cudaMalloc(&d_cc, size_t(S) * 4));
    AB_CHECK(cudaMalloc(&d_so, so.size() * 8));
    AB_CHECK(cudaMalloc(&d_co, co.size() * 8));
    AB_CHECK(cudaMalloc(&d_q, sets * qn * 4));
    AB_CHECK(cudaMalloc(&d_out, sets * qn * 4));
    AB_CHECK(cudaMemcpy(d_rows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
    AB_CHECK(cudaMemcpy(d_sc, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
    AB_CHECK(cudaMemcpy(d_cc, cc.data(), cc.size() * 4, cudaMemcpyHostToDevice));
    AB_CHECK(cudaMemcpy(d_so, so.data(), so.size() * 8, cudaMemcpyHostToDevice));
    AB_CHECK(cudaMemcpy(d_co, co.data(), co.size() * 8, cudaMemcpyHostToDevice));
    AB_CHECK(cudaMemcpy(d_q, q_src, sets * qn * 4, cudaMemcpyDeviceToDevice));
  }
  AttnInputs(const AttnInputs&) = delete;
  AttnInputs& operator=(const AttnInputs&) = delete;
  ~AttnInputs() {
    cudaFree(d_rows);
    cudaFree(d_sc);
    cudaFree(d_cc);
    cudaFree(d_so);
    cudaFree(d_co);
    cudaFree(d_q);
    cudaFree(d_out);
  }
  // Arguments of launch i (input set i % sets) over `pool` (bf16 when b16, else f32).
  v4::ops::AttentionArgs args(int i, const void* pool, bool b16, const float* sinks) const {
    const int r = i % sets;
    v4::ops::AttentionArgs a;
    a.q = d_q + r * qn;
    a.sinks = sinks;
    a.swa_pool = pool;
    a.swa = {d_rows, d_so + r * S, d_sc};
    a.comp_pool = pool;
    a.kv_dtype = a0_dtype(b16);
    a.comp = {d_rows, d_co + r * S, d_cc};
    a.n_rows = S;
    a.n_heads = H;
    a.head_dim = hd;
    a.scale = 1.f / std::sqrt(float(hd));
    a.max_keys = keys;
    a.out = d_out + r * qn;
    return a;
  }
};

}  // namespace

/// The cuda-attention.md body at copy bandwidth `bw` GB/s (read + write).
std::string bench_attention(double bw) {
  const int H = 64, hd = 512, kSets = 16;
  const int64_t kPoolRows = int64_t(1) << 20;  // 2 GiB f32 pool: key reads come from HBM
  const AttnDevice device(H);
  const int n_sms = device.n_sms;
  float* const sinks = device.sinks;
  AttnPools pools(kPoolRows, hd, true, true);  // 2 GiB f32 + the same values as bf16 (1 GiB)
  const float* pool = pools.f32;
  const uint16_t* pool_b = pools.bf16;

  std::ostringstream md;
  md << "Decode sparse attention, V4-Flash shapes (64 heads × 512, K = V), f32 pools (2 GiB) and "
        "bf16 pools (1 GiB, the same values rounded), one query "
        "row per sequence. Keys per row: CSA = 128 SWA + min(512, ctx/4) top-k, HCA = 128 SWA + "
        "ctx/128 compressed; each sequence reads its own random distinct rows of the pool, "
        "and every launch uses another of "
     << kSets
     << " input sets (key lists, q, out): cold, reads come from HBM. Times: median of 30 samples "
        "of 10 back-to-back launches (CUDA events), the combine launch included when split. "
        "Floor = (distinct key rows · 512 · pool element bytes (f32 4, bf16 2) + q + out (f32)) / "
        "measured copy bandwidth. `v2` = attention_dec variant 2 (default: bf16 pools stream "
        "into a 4-deep ring of bf16 tiles, 2 barriers per tile; f32 pools run the v1 body; "
        "combine launched with PDL; bf16 pools with 2–8 splits merge them inside a thread block "
        "cluster, no combine launch) with the split count of its cost model "
        "(`attention_dec_splits(..., kv_bytes)`, as CudaOps runs it); `v2 best` = the fastest "
        "of a sweep of split counts; `v1` = variant 1 (the session-5 kernel, plain combine) "
        "with the same splits; `mma` = the previous bf16-mode kernel (TF32 attention_mma, "
        "attention_auto_splits; f32 pools only); `v3` / `v4` = variants 3 / 4 (issue 7: the v2 "
        "ring kernel with 32 / 16 heads per block, f32 rows loaded and converted by the threads, "
        "combine kernel with PDL) at `attention_dec3_splits` (one wave), `best` = the fastest of "
        "their split sweep; `v5` = variant 5 (16 heads per block, key rows preloaded into "
        "shared memory, key-split QK with Q in registers, 2–16 splits merged inside a thread "
        "block cluster, more through the combine kernel) at `attention_dec5_splits` (with the "
        "largest resident cluster), `best` = the fastest of its split sweep (batch 1 only), "
        "`v5 nocl` = the same splits with V4_ATTN_DEC_CLUSTER=0 (workspace + combine kernel); "
        "`v6` = variant 6 (variant 5 with fewer instructions per tile: ex2 of log2-unit logits, "
        "lazy rescale, register key masks, shuffled issue pointers) with the same columns at "
        "`attention_dec5_splits(..., 6)`, and `v6 @v5` = variant 6 at variant 5's split count "
        "(the direct A/B). "
        "Below the table: fixed-cost probes at batch 1 (every row with 0 "
        "keys: launch, key counts, q-free epilogue, output / partial write and combine only; and "
        "1 tile per split).\n\n"
     << "| pools | kind | batch | context | keys/row | floor µs | v2 µs (splits) | v2/floor | "
        "v2 best µs (splits) | best/floor | v1 µs | v1/floor | mma µs (splits) | mma/floor | "
        "v3 µs (splits) | v3 best (splits) | v4 µs (splits) | v4 best (splits) | "
        "v5 µs (splits) | v5 best (splits) | v5 nocl µs | v6 µs (splits) | v6 best (splits) | "
        "v6 nocl µs | v6 @v5 µs |\n"
     << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        "---:|---:|---:|---:|---:|---:|---:|\n";
  std::ostringstream probes;  // fixed-cost probes (batch 1), printed after the table
  std::mt19937_64 g(12345);
  std::vector<int32_t> perm(static_cast<size_t>(kPoolRows));
  for (const bool b16 : {false, true})
  for (const char* kind : {"CSA", "HCA"})
    for (int64_t S : {int64_t(1), int64_t(64)})
      for (int64_t ctx : {int64_t(4096), int64_t(131072), int64_t(1) << 20}) {
        const bool csa = kind[0] == 'C';
        const int64_t n_comp = csa ? std::min<int64_t>(512, ctx / 4) : ctx / 128;
        const int64_t keys = 128 + n_comp;
        const AttnInputs in(S, 128, n_comp, kSets, H, hd, perm, g, pool);
        const size_t qn = in.qn;
        auto args = [&](int i) {
          return in.args(i, b16 ? static_cast<const void*>(pool_b) : pool, b16, sinks);
        };
        float* ws = nullptr;
        AB_CHECK(cudaMalloc(&ws, size_t(v4::cuda::attention_workspace_floats(S, H, hd, 128)) * 4));
        auto t_dec = [&](int splits, int variant = 2) {
          return median_us([&](int i) {
            AB_OK(v4::cuda::sparse_attention_dec(args(i), splits, ws, nullptr, variant));
          });
        };
        const int dec_splits = v4::cuda::attention_dec_splits(S, H, keys, n_sms, b16 ? 2 : 4);
        const double dec_us = t_dec(dec_splits);
        double best_us = dec_us;
        int best_splits = dec_splits;
        const int64_t tiles = (keys + v4::cuda::kAttnDecTileKeys - 1) / v4::cuda::kAttnDecTileKeys;
        for (int sp : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128}) {
          if (sp > tiles || sp == dec_splits) continue;
          const double us = t_dec(sp);
          std::printf("  sweep %s %s S=%lld keys=%lld splits=%d: %.2f us\n", b16 ? "bf16" : "f32",
                      kind, (long long)S, (long long)keys, sp, us);
          if (us < best_us) best_us = us, best_splits = sp;
        }
        const double v1_us = t_dec(dec_splits, 1);
        // Variants 3 / 4 at their one-wave split count, and a sweep.
        char v34_cell[160];
        {
          double us34[2], best34[2];
          int sp34[2], bsp34[2];
          for (int k = 0; k < 2; ++k) {
            const int variant = 3 + k;
            sp34[k] = v4::cuda::attention_dec3_splits(S, H, keys, n_sms, variant == 3 ? 32 : 16);
            us34[k] = best34[k] = t_dec(sp34[k], variant);
            bsp34[k] = sp34[k];
            for (int sp : {1, 2, 4, 8, 12, 16, 20, 24, 33, 36, 48, 65, 66, 96, 128}) {
              if (sp > tiles || sp == sp34[k]) continue;
              const double us = t_dec(sp, variant);
              std::printf("  sweep v%d %s %s S=%lld keys=%lld splits=%d: %.2f us\n", variant,
                          b16 ? "bf16" : "f32", kind, (long long)S, (long long)keys, sp, us);
              if (us < best34[k]) best34[k] = us, bsp34[k] = sp;
            }
          }
          std::snprintf(v34_cell, sizeof v34_cell, "%.2f (%d) | %.2f (%d) | %.2f (%d) | %.2f (%d)",
                        us34[0], sp34[0], best34[0], bsp34[0], us34[1], sp34[1], best34[1],
                        bsp34[1]);
        }
        // Variants 5 / 6 at their modelled split counts (with the largest resident cluster), a
        // sweep at batch 1 (cheap launches), and the same splits without the cluster merge; v6
        // also at v5's split count.
        char v5_cell[160], v6_cell[200];
        int sp5 = 1;
        for (int variant : {5, 6}) {
          const int mc = v4::cuda::attention_dec5_max_cluster(a0_dtype(b16), variant);
          const int spv = v4::cuda::attention_dec5_splits(S, H, keys, n_sms, mc, variant);
          if (variant == 5) sp5 = spv;
          const double usv = t_dec(spv, variant);
          double bestv = usv;
          int bspv = spv;
          if (S == 1)
            for (int sp : {1, 2, 4, 5, 8, 10, 12, 16, 20, 24, 33, 36, 48, 65}) {
              if (sp > tiles || sp == spv) continue;
              const double us = t_dec(sp, variant);
              std::printf("  sweep v%d %s %s S=%lld keys=%lld splits=%d%s: %.2f us\n", variant,
                          b16 ? "bf16" : "f32", kind, (long long)S, (long long)keys, sp,
                          sp >= 2 && sp <= mc ? " (cluster)" : "", us);
              if (us < bestv) bestv = us, bspv = sp;
            }
          double noclv = usv;  // 1 split: no merge at all
          if (spv > 1) {
            setenv("V4_ATTN_DEC_CLUSTER", "0", 1);
            noclv = t_dec(spv, variant);
            unsetenv("V4_ATTN_DEC_CLUSTER");
          }
          char best_s[48] = "—";
          if (S == 1) std::snprintf(best_s, sizeof best_s, "%.2f (%d)", bestv, bspv);
          if (variant == 5) {
            std::snprintf(v5_cell, sizeof v5_cell, "%.2f (%d) | %s | %.2f", usv, spv, best_s,
                          noclv);
          } else {
            const double at5 = spv == sp5 ? usv : t_dec(sp5, 6);
            std::snprintf(v6_cell, sizeof v6_cell, "%.2f (%d) | %s | %.2f | %.2f", usv, spv,
                          best_s, noclv, at5);
          }
        }
        // Fixed-cost probes, batch 1, once per pool type (the CSA 4K pass): the same launches
        // with every key count 0 (no tile, no q load: launch + counts + epilogue / partials +
        // combine), and v2 / v3 / v4 with one tile per split (keys = 32 · splits).
        if (S == 1 && csa && ctx == 4096) {
          int32_t* d_zero = nullptr;
          AB_CHECK(cudaMalloc(&d_zero, 4));
          AB_CHECK(cudaMemset(d_zero, 0, 4));
          auto t_zero = [&](int splits, int variant) {
            return median_us([&](int i) {
              v4::ops::AttentionArgs a = args(i);
              a.swa.count = d_zero;
              a.comp.count = d_zero;
              AB_OK(v4::cuda::sparse_attention_dec(a, splits, ws, nullptr, variant));
            });
          };
          probes << "- " << (b16 ? "bf16" : "f32") << " pools, batch 1, 0 keys (µs): ";
          for (int variant : {2, 3, 4, 5, 6})
            for (int sp : {1, 2, 8, 16, 20, 65}) {
              if (variant < 5 && sp == 16) continue;  // v5 / v6: the largest cluster
              char cell[64];
              std::snprintf(cell, sizeof cell, "v%d/%d splits %.2f; ", variant, sp,
                            t_zero(sp, variant));
              probes << cell;
            }
          probes << "\n- " << (b16 ? "bf16" : "f32")
                 << " pools, batch 1, CSA 640 keys, forced splits (tiles per split) (µs): ";
          for (int variant : {2, 3, 4, 5, 6})
            for (int sp : {1, 2, 5, 10, 20}) {
              char cell[64];
              std::snprintf(cell, sizeof cell, "v%d/%d (%d) %.2f; ", variant, sp, 20 / sp,
                            t_dec(sp, variant));
              probes << cell;
            }
          probes << "\n";
          cudaFree(d_zero);
        }
        if (b16 && dec_splits >= 2 && dec_splits <= 8) {  // A/B of the cluster merge (log only)
          setenv("V4_ATTN_DEC_CLUSTER", "0", 1);
          const double us = t_dec(dec_splits);
          unsetenv("V4_ATTN_DEC_CLUSTER");
          std::printf("  v2 cluster merge off (combine kernel) %s S=%lld keys=%lld splits=%d: "
                      "%.2f us (on: %.2f)\n",
                      kind, (long long)S, (long long)keys, dec_splits, us, dec_us);
        }
        const int mma_splits = v4::cuda::attention_auto_splits(S, H, keys, n_sms, 64);
        const double mma_us =
            b16 ? 0.0 : median_us([&](int i) {
              AB_OK(v4::cuda::sparse_attention_mma(args(i), mma_splits, ws, nullptr));
            });
        const double bytes = double(S) * keys * hd * (b16 ? 2 : 4) + 2.0 * double(qn) * 4;
        const double floor_us = bytes / (bw * 1e3);
        char mma_cell[96];
        if (b16)
          std::snprintf(mma_cell, sizeof mma_cell, "— | —");
        else
          std::snprintf(mma_cell, sizeof mma_cell, "%.2f (%d) | %.2f×", mma_us, mma_splits,
                        mma_us / floor_us);
        char line[1024];
        std::snprintf(line, sizeof line,
                      "| %s | %s | %lld | %s | %lld | %.2f | %.2f (%d) | %.2f× | %.2f (%d) | "
                      "%.2f× | %.2f | %.2f× | %s | %s | %s | %s |\n",
                      b16 ? "bf16" : "f32", kind, (long long)S,
                      ctx == 4096 ? "4K" : ctx == 131072 ? "128K" : "1M", (long long)keys,
                      floor_us, dec_us, dec_splits, dec_us / floor_us, best_us, best_splits,
                      best_us / floor_us, v1_us, v1_us / floor_us, mma_cell, v34_cell, v5_cell,
                      v6_cell);
        md << line;
        std::printf("%s", line);
        std::fflush(stdout);
        cudaFree(ws);
      }
  md << "\n" << probes.str() << "\n";
  return md.str();
}

/// `bench_kernels --profile-attention` (for ncu): `launches` calls of
/// sparse_attention_dec(variant, splits) at batch 1, 64 heads × 512, one query row with
/// min(keys, 128) SWA keys then the rest as compressed keys, distinct random rows of a 1M-row
/// pool (bf16 when `b16`, else f32; only that pool is allocated), rotating over 8 input sets
/// (key lists, q, out) as in bench_attention, then a device sync. Checks 1 ≤ keys ≤ 1M and
/// 1 ≤ splits ≤ min(tiles, 256) (tiles = ⌈keys / 32⌉); exits with 2 on bad arguments or CUDA
/// errors, 3 on a failed call. Returns 0.
int profile_attention(int variant, int64_t keys, int splits, bool b16, int launches) {
  const int H = 64, hd = 512, kSets = 8;
  const int64_t kPoolRows = int64_t(1) << 20;
  const int64_t tiles = (keys + v4::cuda::kAttnDecTileKeys - 1) / v4::cuda::kAttnDecTileKeys;
  if (keys < 1 || keys > kPoolRows || splits < 1 || splits > tiles || splits > 256 ||
      launches < 1) {
    std::fprintf(stderr, "profile-attention: keys %lld (1..%lld), splits %d (1..min(%lld, 256)), "
                 "launches %d (≥ 1)\n", (long long)keys, (long long)kPoolRows, splits,
                 (long long)tiles, launches);
    std::exit(2);
  }
  const AttnPools pools(kPoolRows, hd, !b16, b16);
  const void* pool = b16 ? static_cast<const void*>(pools.bf16) : pools.f32;
  float* q_src = nullptr;  // kSets query rows of N(0, 0.3) values
  {
    std::vector<float> hq(size_t(kSets) * H * hd);
    std::mt19937_64 gq(5);
    std::normal_distribution<float> d(0.f, 0.3f);
    for (auto& x : hq) x = d(gq);
    AB_CHECK(cudaMalloc(&q_src, hq.size() * 4));
    AB_CHECK(cudaMemcpy(q_src, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
  }
  float* sinks = nullptr;
  AB_CHECK(cudaMalloc(&sinks, H * sizeof(float)));
  AB_CHECK(cudaMemset(sinks, 0, H * sizeof(float)));
  std::mt19937_64 g(12345);
  std::vector<int32_t> perm(static_cast<size_t>(kPoolRows));
  const int64_t n_swa = std::min<int64_t>(keys, 128);
  const AttnInputs in(1, n_swa, keys - n_swa, kSets, H, hd, perm, g, q_src);
  float* ws = nullptr;
  AB_CHECK(cudaMalloc(&ws, size_t(v4::cuda::attention_workspace_floats(1, H, hd, std::max(splits, 128))) * 4));
  AB_CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < launches; ++i)
    AB_OK(v4::cuda::sparse_attention_dec(in.args(i, pool, b16, sinks), splits, ws, nullptr, variant));
  AB_CHECK(cudaDeviceSynchronize());
  std::printf("profile-attention done: variant %d, %lld keys (%lld SWA), %d splits, %s pool, %d "
              "launches\n", variant, (long long)keys, (long long)n_swa, splits, b16 ? "bf16" : "f32",
              launches);
  cudaFree(ws);
  cudaFree(sinks);
  cudaFree(q_src);
  return 0;
}

/// The cuda-attention-wg.md body at copy bandwidth `bw` GB/s: bf16 pools only, the mma.sync
/// kernels (variant 6 at batch 1, variant 2 at batch 64, each at its split model) against
/// the warpgroup-MMA variants (V4_ATTN_WG_VARIANTS, a comma list of 7 … 10, default "7,9": 7 / 9
/// 64-key tiles, 8 / 10 32-key tiles, 9 / 10 swizzled operands) at attention_dec7_splits and at
/// the best of a split sweep (V4_ATTN_WG_SWEEP=0: no sweep), CSA / HCA × batch 1 / 64 × 4K /
/// 128K / 1M. V4_ATTN_WG_DIAG=1 adds, per variant, the time at the model's splits without the
/// key-row copies and without the wgmma instructions (set_attention_dec7_diag 1 / 2).
std::string bench_attention_wg(double bw) {
  const int H = 64, hd = 512, kSets = 16;
  const int64_t kPoolRows = int64_t(1) << 20;  // 1 GiB bf16 pool: key reads come from HBM
  const AttnDevice device(H);
  const int n_sms = device.n_sms;
  float* const sinks = device.sinks;
  AttnPools pools(kPoolRows, hd, false, true);
  const uint16_t* pool_b = pools.bf16;
  // V4_ATTN_WG_POOL_ROWS: the key rows come from the first N pool rows only (default: all 1M
  // rows = 1 GiB; the step's CSA pool of one layer at 1M context is ~256 MiB, its HCA pool 8 MiB);
  // rows of more keys than that hold are left out.
  const char* pr = std::getenv("V4_ATTN_WG_POOL_ROWS");
  const int64_t pool_rows =
      pr && std::atoll(pr) > 0 ? std::min<int64_t>(std::atoll(pr), kPoolRows) : 0;
  std::vector<int> variants;
  {
    const char* ev = std::getenv("V4_ATTN_WG_VARIANTS");
    std::string list = ev && *ev ? ev : "7,9";
    std::stringstream ss(list);
    for (std::string item; std::getline(ss, item, ',');) {
      const int v = std::atoi(item.c_str());
      if (v < 7 || v > 14) {
        std::fprintf(stderr, "V4_ATTN_WG_VARIANTS: '%s' is not a variant in 7 … 14\n",
                     item.c_str());
        std::exit(2);
      }
      variants.push_back(v);
    }
  }
  const char* esw = std::getenv("V4_ATTN_WG_SWEEP");
  const bool sweep = !(esw && std::string(esw) == "0");
  const char* edg = std::getenv("V4_ATTN_WG_DIAG");
  const bool diag = edg && std::string(edg) == "1";
  const char* epf = std::getenv("V4_ATTN_WG_PF_AB");
  const bool pf_ab = epf && std::string(epf) == "1";
  // V4_ATTN_WG_NOCL=1: per variant ≥ 11 a column at the model's splits with
  // V4_ATTN_DEC_CLUSTER=0 (workspace partials + the combine kernel instead of the cluster merge).
  const char* enc = std::getenv("V4_ATTN_WG_NOCL");
  const bool nocl = enc && std::string(enc) == "1";
  std::ostringstream md;
  md << "Decode sparse attention, V4-Flash shapes (64 heads × 512, K = V), bf16 pools (1 GiB";
  if (pool_rows > 0)
    md << "; key rows drawn from its first " << pool_rows << " rows only, "
       << pool_rows * 1024 / (1 << 20)
       << " MiB, V4_ATTN_WG_POOL_ROWS; rows needing more distinct keys are left out";
  md << "), one query row per sequence; keys per row: CSA = 128 SWA + min(512, ctx/4) top-k, HCA = "
        "128 SWA + ctx/128 compressed; each sequence reads its own random distinct pool rows, and "
        "every launch uses another of "
     << kSets
     << " input sets: cold, reads come from HBM. Times: median of 30 samples of 10 back-to-back "
        "launches (CUDA events), the combine launch included when split. Floor = (distinct key "
        "rows · 1024 B + q + out (f32)) / measured copy bandwidth. `mma.sync` = the mma.sync "
        "kernel CudaOps' auto takes for these rows without variant 7 (variant 6 at batch 1 with "
        "attention_dec5_splits(..., 6), variant 2 at batch 64 with attention_dec_splits; since "
        "session 14 auto takes variant 7 for calls of more than 4 rows of more than 4,096 keys); "
        "`v7` / `v8` = the warpgroup-MMA kernel (64 heads per CTA, wgmma QK from shared memory, "
        "P·V m64n256k16 with P in registers) with 64- / 32-key tiles at attention_dec7_splits, "
        "operands in 8 × 16-byte core matrices; `v9` / `v10` = the same with 128-byte-swizzled "
        "operands; `best` = the fastest of a split sweep (splits in parentheses)";
  if (!sweep) md << " (no sweep this run: best = the model's count)";
  if (pf_ab)
    md << "; `v11` / `v12` = warp-specialized (warpgroup 0: QK over all dims + softmax + P·V of "
          "dims 0–255; warpgroup 1: the key-row copies into an mbarrier ring + P·V of dims "
          "256–511) with 64- / 32-key tiles, `v13` the same with 48-key tiles in 3 slots, no L2 prefetch (the default); `pf 1` / `pf 2` = the "
          "same with an L2 prefetch of the rows 1 / 2 tiles beyond the copies "
          "(set_attention_dec11_prefetch)";
  if (nocl)
    md << "; variants 11 … 13 merge 2 … 8 splits inside a thread block cluster (distributed "
          "shared memory, no combine launch), `nocl` = the same splits with "
          "V4_ATTN_DEC_CLUSTER=0 (workspace partials + the combine kernel)";
  if (diag)
    md << "; `no copy` = the same launch without its key-row copies (tiles of zeros), `no MMA` "
          "= without its wgmma instructions (set_attention_dec7_diag 1 / 2: what the pipeline "
          "costs without the loads, and without the tensor work)";
  md << ".\n\n| kind | batch | context | keys/row | floor µs | mma.sync µs (variant, splits) | "
        "mma.sync/floor |";
  std::string sep = "|---|---:|---:|---:|---:|---:|---:|";
  for (int v : variants) {
    md << " v" << v << " µs (splits) | v" << v << " best µs (splits) | v" << v << " best/floor |";
    sep += "---:|---:|---:|";
    if (diag) {
      md << " v" << v << " no copy µs | v" << v << " no MMA µs |";
      sep += "---:|---:|";
    }
    if (pf_ab && v >= 11) {
      md << " v" << v << " pf 1 µs | v" << v << " pf 2 µs |";
      sep += "---:|---:|";
    }
    if (nocl && v >= 11) {
      md << " v" << v << " nocl µs |";
      sep += "---:|";
    }
  }
  md << "\n" << sep << "\n";
  std::mt19937_64 g(12345);
  std::vector<int32_t> perm(static_cast<size_t>(kPoolRows));
  for (const char* kind : {"CSA", "HCA"})
    for (int64_t S : {int64_t(1), int64_t(64)})
      for (int64_t ctx : {int64_t(4096), int64_t(131072), int64_t(1) << 20}) {
        const bool csa = kind[0] == 'C';
        const int64_t n_comp = csa ? std::min<int64_t>(512, ctx / 4) : ctx / 128;
        const int64_t keys = 128 + n_comp;
        if (pool_rows > 0 && S * keys > pool_rows) continue;
        // q: the pool's bytes read as f32 (each float's high half is a bf16 pool value: finite,
        // ~N(0, 0.3)).
        const AttnInputs in(S, 128, n_comp, kSets, H, hd, perm, g,
                            reinterpret_cast<const float*>(pool_b), pool_rows);
        auto args = [&](int i) { return in.args(i, pool_b, true, sinks); };
        float* ws = nullptr;
        AB_CHECK(cudaMalloc(&ws, size_t(v4::cuda::attention_workspace_floats(S, H, hd, 128)) * 4));
        auto t_dec = [&](int splits, int variant) {
          return median_us([&](int i) {
            AB_OK(v4::cuda::sparse_attention_dec(args(i), splits, ws, nullptr, variant));
          });
        };
        const int auto_v = S <= 4 ? 6 : 2;
        const int auto_sp =
            auto_v == 6
                ? v4::cuda::attention_dec5_splits(
                      S, H, keys, n_sms,
                      v4::cuda::attention_dec5_max_cluster(v4::KvDtype::kBf16, 6), 6)
                : v4::cuda::attention_dec_splits(S, H, keys, n_sms, 2);
        const double auto_us = t_dec(auto_sp, auto_v);
        const double bytes = double(S) * keys * hd * 2 + 2.0 * double(in.qn) * 4;
        const double floor_us = bytes / (bw * 1e3);
        std::string cells;
        for (const int variant : variants) {
          const int kt = v4::cuda::attention_dec7_tile_keys(variant);
          const int spm = v4::cuda::attention_dec7_splits(
              S, H, keys, n_sms, kt, v4::cuda::attention_dec11_max_cluster(variant));
          const double us = t_dec(spm, variant);
          double best = us;
          int bsp = spm;
          const int64_t tiles = (keys + kt - 1) / kt;
          for (int sp : {1, 2, 3, 4, 6, 8, 12, 16, 24, 33, 48, 65, 96, 128}) {
            if (!sweep || sp > tiles || sp == spm) continue;
            const double u = t_dec(sp, variant);
            std::printf("  sweep v%d %s S=%lld keys=%lld splits=%d: %.2f us\n", variant, kind,
                        (long long)S, (long long)keys, sp, u);
            if (u < best) best = u, bsp = sp;
          }
          char cell[160];
          std::snprintf(cell, sizeof cell, " %.2f (%d) | %.2f (%d) | %.2f× |", us, spm, best,
                        bsp, best / floor_us);
          cells += cell;
          if (diag) {
            double d_us[2];
            for (int mode = 1; mode <= 2; ++mode) {
              AB_OK(v4::cuda::set_attention_dec7_diag(mode));
              d_us[mode - 1] = t_dec(spm, variant);
              AB_OK(v4::cuda::set_attention_dec7_diag(0));
            }
            std::snprintf(cell, sizeof cell, " %.2f | %.2f |", d_us[0], d_us[1]);
            cells += cell;
          }
          if (pf_ab && variant >= 11) {
            double p_us[2];
            for (int k = 0; k < 2; ++k) {
              AB_OK(v4::cuda::set_attention_dec11_prefetch(k + 1));
              p_us[k] = t_dec(spm, variant);
            }
            AB_OK(v4::cuda::set_attention_dec11_prefetch(0));
            std::snprintf(cell, sizeof cell, " %.2f | %.2f |", p_us[0], p_us[1]);
            cells += cell;
          }
          if (nocl && variant >= 11) {
            setenv("V4_ATTN_DEC_CLUSTER", "0", 1);
            const double n_us = t_dec(spm, variant);
            unsetenv("V4_ATTN_DEC_CLUSTER");
            std::snprintf(cell, sizeof cell, " %.2f |", n_us);
            cells += cell;
          }
        }
        char line[384];
        std::snprintf(line, sizeof line, "| %s | %lld | %s | %lld | %.2f | %.2f (v%d, %d) | %.2f× |",
                      kind, (long long)S, ctx == 4096 ? "4K" : ctx == 131072 ? "128K" : "1M",
                      (long long)keys, floor_us, auto_us, auto_v, auto_sp, auto_us / floor_us);
        md << line << cells << "\n";
        std::printf("%s%s\n", line, cells.c_str());
        std::fflush(stdout);
        cudaFree(ws);
      }
  return md.str();
}

/// The cuda-attention-gather.md body at copy bandwidth `bw` GB/s (bench_kernels
/// --probe-attention-gather): cuda::attention_gather_probe — variant 11's 64-key ring without
/// any math — in every copy mode × 2 / 3 slots × grids of 64, 128 and all SMs, over the random
/// distinct rows of batch 64 × 640 keys (CSA) and batch 64 × 8,320 keys (HCA 1M) drawn from a
/// 1 GiB bf16 pool; each mode's position-weighted hash of the received bytes must equal mode 0's.
std::string bench_attention_gather(double bw) {
  const int hd = 512;
  const int64_t kPoolRows = int64_t(1) << 20;
  const AttnDevice device(64);
  const AttnPools pools(kPoolRows, hd, false, true);
  std::mt19937_64 g(777);
  std::vector<int32_t> perm(static_cast<size_t>(kPoolRows));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g);
  uint32_t* sink = nullptr;
  AB_CHECK(cudaMalloc(&sink, 4));
  const char* mode_name[5] = {"cp.async 16 B (variant 11)", "TMA 2-D 128 B boxes, L2 256 B",
                              "TMA 2-D 128 B boxes, no L2 promotion", "bulk 1 KiB (contiguous)",
                              "TMA 3-D 1 KiB box (contiguous)"};
  std::ostringstream md;
  md << "Variant 11's key-row ring without math (`cuda::attention_gather_probe`): per CTA "
        "(256 threads, one per SM) warpgroup 1 copies 64-key tiles (64 KiB of bf16 rows) into "
        "2 or 3 slots, warpgroup 0 waits for each and frees it. Rows: random distinct rows of a "
        "1 GiB bf16 pool (1M rows × 512), as many as batch 64 reads (CSA: 64 × 640, HCA 1M: 64 × "
        "8,320), launches rotate over disjoint row sets (L2-cold). Modes: cp.async = variant 11's "
        "copies (16 B a lane, into the 128-byte-swizzle operand layout); TMA 2-D = 8 boxes of 64 "
        "dims × 1 row per key row into the same layout (a tensor map over the pool); bulk = one "
        "`cp.async.bulk` of the whole row, contiguous (not an MMA layout: the ceiling of "
        "row-granular async copies); TMA 3-D = one box of the whole row, contiguous. µs = median "
        "of 30 samples of 10 launches; GB/s = row bytes / time; % = of the copy bandwidth. "
        "`hash` = the position-weighted hash of the bytes received equals mode 0's (same values "
        "at the same logical places).\n\n"
     << "| rows | MB | mode | slots | CTAs | µs | GB/s | % of copy | hash |\n"
     << "|---:|---:|---|---:|---:|---:|---:|---:|:---:|\n";
  for (const int64_t n : {int64_t(64) * 640, int64_t(64) * 8320}) {
    const int64_t n_tiles = n / 64;
    const int sets = int(std::max<int64_t>(1, std::min<int64_t>(16, kPoolRows / n)));
    int32_t* rows = nullptr;
    AB_CHECK(cudaMalloc(&rows, size_t(sets) * n * 4));
    AB_CHECK(cudaMemcpy(rows, perm.data(), size_t(sets) * n * 4, cudaMemcpyHostToDevice));
    uint32_t ref = 0;
    for (int mode = 0; mode < 5; ++mode)
      for (int stages : {2, 3})
        for (int ctas : {64, 128, device.n_sms}) {
          AB_CHECK(cudaMemset(sink, 0, 4));
          AB_OK(v4::cuda::attention_gather_probe(pools.bf16, kPoolRows, rows, n_tiles, mode,
                                                 stages, ctas, sink, true, nullptr));
          uint32_t h = 0;
          AB_CHECK(cudaMemcpy(&h, sink, 4, cudaMemcpyDeviceToHost));
          if (mode == 0 && stages == 2 && ctas == 64) ref = h;
          const double us = median_us([&](int i) {
            AB_OK(v4::cuda::attention_gather_probe(pools.bf16, kPoolRows, rows + (i % sets) * n,
                                                   n_tiles, mode, stages, ctas, nullptr, false,
                                                   nullptr));
          });
          const double mb = double(n) * hd * 2 / 1e6;
          char line[320];
          std::snprintf(line, sizeof line, "| %lld | %.1f | %s | %d | %d | %.2f | %.0f | %.1f%% | %s |\n",
                        (long long)n, mb, mode_name[mode], stages, ctas, us, mb * 1e3 / us,
                        100.0 * mb * 1e3 / us / bw, h == ref ? "yes" : "NO");
          md << line;
          std::printf("attention gather %s", line);
          std::fflush(stdout);
        }
    cudaFree(rows);
  }
  cudaFree(sink);
  return md.str();
}
#endif  // V4_HAVE_CUDA
