// Indexer rows of bench_kernels (`--only-indexer` → cuda-indexer.md): the bf16 indexer scores
// over the paged f32 index-key pool (indexer.h), decode kernel (variant 2) vs the previous WMMA
// kernel (variant 1), alone and followed by Lightning TopK (top-512), and the whole
// Ops::indexer_topk (bf16 mode: scores + topk_rows + finalize) as the decode step issues it;
// then the decode kernel over f32 / bf16 / fp8 key pools ("Key formats"), then the pipelined
// decode kernel (variants 4–7) and the warpgroup-MMA kernel (8 / 9 heads on M, 10–12 keys on M; bf16 keys) next to it over
// bf16 / fp8 keys at batch 1 and 64.
// V4-Flash shapes: nI = 64, dI = 128; n candidates per row ∈ {1K, 32K, 230,400 (900K context),
// 262,144} at batch 1, and 1K / 32K at batch 64 (each row its own candidate list, as distinct
// sequences). Then the chain table (bench_indexer_chain): the whole Ops::indexer_topk over a bf16
// key pool at 1K / 32K / 230,400 / 262,144 × batch 1 / 64, plain launches vs PDL
// (CudaOptions::indexer_pdl), eager and replayed from a CUDA graph.
//
// Inputs are L2-cold: the pool holds ≥ 256 MiB of key rows and every launch uses another set of
// pages (rotating over `rot` disjoint row maps), each list = runs of 64 consecutive pool rows (one
// C4 page) from a random page order. Byte floor = bytes each launch must move / the measured
// copy bandwidth (read + write): keys n·dI·4 + row map n·4 + scores written n·4 per row (scores +
// top-512: + n·4 scores read back + 512·4 written).
#ifdef V4_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "bench_timing.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/fill.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/topk.h"
#include "ops/fill_random.h"
#include "ops/ops.h"

namespace {

#define IB_CHECK(x)                                                                     \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                     \
    }                                                                                   \
  } while (0)
#define IB_OK(x)                                                                        \
  do {                                                                                  \
    v4::Status s_ = (x);                                                                \
    if (!s_.ok()) {                                                                     \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, s_.to_string().c_str());   \
      std::exit(3);                                                                     \
    }                                                                                   \
  } while (0)

// SMs of the current device (grid sizing of the indexer kernels).
int current_device_sms() {
  int n_sms = 132, dev = 0;
  IB_CHECK(cudaGetDevice(&dev));
  IB_CHECK(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, dev));
  return n_sms;
}

// Median per-launch µs of `fn(i, stream)` on `st`: v4::bench::time_launches (bench_timing.h).
double time_on(cudaStream_t st, const std::function<void(int, cudaStream_t)>& fn, int samples,
               int inner = 10, int warmup = 10) {
  return v4::bench::time_launches(st, fn, samples, inner, warmup).med_us;
}

// Device inputs of the decode indexer over a paged key pool: B query rows of nI × dI f32 q and
// nI f32 weights (N(0, 1) from `g`), each row n candidates; `rot` disjoint row maps so that
// consecutive launches read other pages (L2-cold): rot = enough rotations for ≥ 256 MiB of f32
// key rows (2..256). Each list = runs of 64 consecutive pool rows (one C4 page) from a random
// page order. The pool has room for pool_rows f32 rows (the largest key format); its contents
// are written by the caller (fill_random per key format).
struct PagedIndexerInputs {
  int64_t n, B, per, pool_rows;
  int rot, nI, dI;
  void* pool = nullptr;
  float *q = nullptr, *w = nullptr, *scores = nullptr;  // scores: f32 [B, n]
  int32_t *rows = nullptr, *cnt = nullptr;
  int64_t* offs = nullptr;
  PagedIndexerInputs(int64_t n_, int64_t B_, int nI_, int dI_, std::mt19937_64& g)
      : n(n_), B(B_), per(n_ * B_), nI(nI_), dI(dI_) {
    const int64_t min_rows = (int64_t(256) << 20) / (dI * 4);
    rot = int(std::min<int64_t>(256, std::max<int64_t>(2, (min_rows + per - 1) / per)));
    pool_rows = per * rot;
    std::normal_distribution<float> nd;
    IB_CHECK(cudaMalloc(&pool, size_t(pool_rows) * dI * 4));  // the largest format (f32)
    IB_CHECK(cudaMalloc(&q, size_t(B) * nI * dI * 4));
    IB_CHECK(cudaMalloc(&w, size_t(B) * nI * 4));
    IB_CHECK(cudaMalloc(&scores, size_t(B) * n * 4));
    IB_CHECK(cudaMalloc(&rows, size_t(pool_rows) * 4));
    IB_CHECK(cudaMalloc(&offs, size_t(rot) * B * 8));
    IB_CHECK(cudaMalloc(&cnt, size_t(B) * 4));
    std::vector<float> hq(size_t(B) * nI * dI), hw(size_t(B) * nI);
    for (auto& x : hq) x = nd(g);
    for (auto& x : hw) x = nd(g);
    IB_CHECK(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    IB_CHECK(cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> pages(static_cast<size_t>(pool_rows / 64)), hrows(static_cast<size_t>(pool_rows));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), g);
    for (int64_t i = 0; i < pool_rows; ++i) hrows[size_t(i)] = pages[size_t(i / 64)] * 64 + int32_t(i % 64);
    std::vector<int64_t> hoff(size_t(rot) * B);
    for (int64_t i = 0; i < int64_t(hoff.size()); ++i) hoff[size_t(i)] = i * n;
    std::vector<int32_t> hcnt(static_cast<size_t>(B), static_cast<int32_t>(n));
    IB_CHECK(cudaMemcpy(rows, hrows.data(), hrows.size() * 4, cudaMemcpyHostToDevice));
    IB_CHECK(cudaMemcpy(offs, hoff.data(), hoff.size() * 8, cudaMemcpyHostToDevice));
    IB_CHECK(cudaMemcpy(cnt, hcnt.data(), hcnt.size() * 4, cudaMemcpyHostToDevice));
  }
  PagedIndexerInputs(const PagedIndexerInputs&) = delete;
  PagedIndexerInputs& operator=(const PagedIndexerInputs&) = delete;
  ~PagedIndexerInputs() {
    cudaFree(pool); cudaFree(q); cudaFree(w); cudaFree(scores); cudaFree(rows); cudaFree(offs);
    cudaFree(cnt);
  }
  // Fills the pool with keys of `dt` (f32 / bf16 / fp8 kFp8Index) on `st` and waits for it:
  // N(0, 1) values. fp8 rows as a store would write them: codes of N(0, 160) (saturating at
  // ±448: the e4m3 range an amax / 448 scale uses), then each row's f32 scale set to a positive
  // value around 1/160 (uniform in [0.8, 1.2] / 160) by one strided copy — random bytes there
  // made every scale a random float of either sign, so the scores were not a model's.
  void fill_keys(v4::KvDtype dt, cudaStream_t st) {
    const int64_t rb = v4::kv_row_bytes(dt, dI, 0);
    const bool fp8 = dt == v4::KvDtype::kFp8Index;
    const v4::ops::RandomFill kind = dt == v4::KvDtype::kF32    ? v4::ops::RandomFill::kF32Normal
                                     : dt == v4::KvDtype::kBf16 ? v4::ops::RandomFill::kBF16Normal
                                                                : v4::ops::RandomFill::kE4M3Normal;
    const int64_t units = pool_rows * rb / v4::ops::fill::unit_bytes(kind);
    IB_OK(v4::cuda::fill_random(pool, units,
                                v4::ops::fill::make_params(kind, fp8 ? 160.f : 1.f, 12), st));
    if (fp8) {
      std::mt19937_64 g(13);
      std::uniform_real_distribution<float> u(0.8f / 160.f, 1.2f / 160.f);
      std::vector<float> sc(static_cast<size_t>(pool_rows));
      for (auto& x : sc) x = u(g);
      const v4::KvFp8IndexLayout L = v4::kv_fp8_index_layout(dI);
      IB_CHECK(cudaMemcpy2DAsync(static_cast<char*>(pool) + L.scale_off, size_t(rb), sc.data(),
                                 sizeof(float), sizeof(float), size_t(pool_rows),
                                 cudaMemcpyHostToDevice, st));
      IB_CHECK(cudaStreamSynchronize(st));  // before `sc` goes
    }
    IB_CHECK(cudaStreamSynchronize(st));
  }
  // Arguments of launch i (row map i % rot) over keys of `dt`, top-512.
  v4::ops::IndexerArgs args(int i, v4::KvDtype dt) const {
    v4::ops::IndexerArgs a;
    a.q = q;
    a.weights = w;
    a.key_pool = pool;
    a.key_dtype = dt;
    a.cand = {rows, offs + int64_t(i % rot) * B, cnt};
    a.n_rows = B;
    a.n_heads = nI;
    a.head_dim = dI;
    a.topk = 512;
    a.max_count = n;
    return a;
  }
};

// The chain table of cuda-indexer.md: `Ops::indexer_topk` (decode scores kernel → Lightning TopK
// → finalize) over a bf16 key pool (the served format), plain launches vs programmatic dependent
// launch (CudaOptions::indexer_pdl), eager and replayed from a CUDA graph.
std::string bench_indexer_chain(int reps) {
  using v4::ops::IndexerArgs;
  const int nI = 64, dI = 128, k = 512;
  unsetenv("V4_INDEXER_PDL");  // the options below decide (the env would override both)
  std::unique_ptr<v4::ops::Ops> be[2];  // [0] plain, [1] PDL
  for (int p = 0; p < 2; ++p) {
    v4::ops::CudaOptions co;
    co.precision = v4::ops::Precision::kBf16;
    co.indexer_pdl = p == 1;
    co.indexer_pdl_max_count = int64_t(1) << 40;  // PDL at every size here (the default stops
                                                  // at 65,536 candidates: this table's result)
    co.indexer_pdl_max_rows = int64_t(1) << 40;
    auto made = v4::ops::make_cuda_ops(co);
    IB_OK(made.status());
    be[p] = std::move(made).value();
  }
  cudaStream_t st;
  IB_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::mt19937_64 g(2027);
  const int samples = std::max(5, reps / 4);
  std::ostringstream o;
  o << "\n## Indexer chain: plain launches vs PDL (bf16 key pool)\n\n"
    << "- `Ops::indexer_topk` in bf16 mode (decode scores kernel → `topk_rows` auto → finalize) "
       "over a **bf16** key pool (the served format), every row n candidates of its own list; "
       "plain = `CudaOptions::indexer_pdl` off (`V4_INDEXER_PDL=0`), PDL = on at every size "
       "(every kernel of the chain launched with programmatic stream serialization, the top-k "
       "in its PDL form where the auto choice has one — 44 / 45 for 7 / 8 (rows ≤ 8K / 32K), 43 "
       "for 37 (batch < 16, rows ≤ 262,144) —, else plain; the default applies PDL to calls of "
       "≤ 4 rows and ≤ 65,536 candidates only, `CudaOptions::indexer_pdl_max_rows` / "
       "`indexer_pdl_max_count`)\n"
    << "- each sample = the same `calls` calls back to back (pages rotate from call to call over "
       "≥ 256 MiB of key rows where the shape allows), device span between step markers / "
       "calls; eager = the calls issued one by one (includes any host gap), graph = one CUDA "
       "graph of the calls replayed; median of " << samples << " samples\n\n"
    << "| n | batch | calls | top-k (auto) | eager plain µs | eager PDL µs | PDL − plain µs | "
       "graph plain µs | graph PDL µs | PDL − plain µs |\n"
    << "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n";
  struct Shape { int64_t n; int batch; };
  for (Shape sh : {Shape{1024, 1}, Shape{32768, 1}, Shape{230400, 1}, Shape{262144, 1},
                   Shape{1024, 64}, Shape{32768, 64}, Shape{230400, 64}, Shape{262144, 64}}) {
    const int64_t n = sh.n, B = sh.batch, per = n * B;  // key rows per call
    const int calls = per >= (int64_t(1) << 22) ? 4 : 20;
    // Paged inputs over ≥ 256 MiB of f32-sized rows (every rotation its own pages), bf16 keys.
    PagedIndexerInputs in(n, B, nI, dI, g);
    in.fill_keys(v4::KvDtype::kBf16, st);
    int32_t *out_rows = nullptr, *out_cnt = nullptr;
    IB_CHECK(cudaMalloc(&out_rows, size_t(B) * k * 4));
    IB_CHECK(cudaMalloc(&out_cnt, size_t(B) * 4));
    IB_CHECK(cudaDeviceSynchronize());
    auto args = [&](int i) {
      IndexerArgs a = in.args(i, v4::KvDtype::kBf16);
      a.topk = k;
      a.out_rows = out_rows;
      a.out_count = out_cnt;
      return a;
    };
    double t_eager[2] = {}, t_graph[2] = {-1, -1};
    for (int p = 0; p < 2; ++p) {
      v4::ops::Ops& ops = *be[p];
      auto body = [&] {
        for (int j = 0; j < calls; ++j) ops.indexer_topk(args(j));
      };
      // median device span per call of `run` between step markers (2 untimed samples first)
      auto span = [&](const std::function<void()>& run) {
        std::vector<double> t;
        for (int s = 0; s < samples + 2; ++s) {
          const double before = ops.step_timing().busy_s;
          ops.step_begin(true);
          run();
          ops.step_end();
          if (s >= 2) t.push_back((ops.step_timing().busy_s - before) * 1e6 / calls);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
      };
      t_eager[p] = span(body);  // also the warm-up the capture needs (scratch sized)
      std::unique_ptr<v4::ops::Graph> graph = ops.capture(body);
      if (graph) {
        t_graph[p] = span([&] { graph->replay(); });
      } else {
        std::printf("indexer chain n=%lld batch=%lld %s: capture failed\n", (long long)n,
                    (long long)B, p ? "PDL" : "plain");
      }
      ops.synchronize();
    }
    const char* topk = n <= 8192                          ? "7 → PDL 44"
                       : n <= 32768                       ? "8 → PDL 45"
                       : B < 16 && n <= 262144            ? "37 → PDL 43"
                                                          : "v3 cluster (no PDL form)";
    auto cell = [](double v) {
      char b[32];
      if (v < 0) return std::string("—");
      std::snprintf(b, sizeof b, "%.1f", v);
      return std::string(b);
    };
    auto diff = [](double a, double b) {
      char c[32];
      if (a < 0 || b < 0) return std::string("—");
      std::snprintf(c, sizeof c, "%+.1f", b - a);
      return std::string(c);
    };
    o << "| " << n << " | " << B << " | " << calls << " | " << topk << " | " << cell(t_eager[0])
      << " | " << cell(t_eager[1]) << " | " << diff(t_eager[0], t_eager[1]) << " | "
      << cell(t_graph[0]) << " | " << cell(t_graph[1]) << " | " << diff(t_graph[0], t_graph[1])
      << " |\n";
    std::printf("indexer chain bf16 n=%lld batch=%lld: eager plain %.1f PDL %.1f us; graph plain "
                "%.1f PDL %.1f us\n",
                (long long)n, (long long)B, t_eager[0], t_eager[1], t_graph[0], t_graph[1]);
    cudaFree(out_rows);
    cudaFree(out_cnt);
  }
  cudaStreamDestroy(st);
  return o.str();
}

}  // namespace

// The cuda-indexer.md body at copy bandwidth `bw` GB/s (read + write).
std::string bench_indexer(double bw, int reps) {
  using v4::ops::IndexerArgs;
  const int nI = 64, dI = 128, k = 512;
  const int n_sms = current_device_sms();
  cudaStream_t st;
  IB_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  v4::ops::CudaOptions co;
  co.precision = v4::ops::Precision::kBf16;
  auto made = v4::ops::make_cuda_ops(co);
  IB_OK(made.status());
  std::unique_ptr<v4::ops::Ops> ops = std::move(made).value();
  std::mt19937_64 g(2026);
  std::normal_distribution<float> nd;

  std::ostringstream o;
  o << "- shapes: nI = 64 heads, dI = 128, f32 key pool, top-512; n = candidates per row (C4 "
       "keys: 230,400 = 900K context); batch rows each have their own candidate list\n"
    << "- inputs L2-cold (≥ 256 MiB of key rows, every launch another page set; lists = runs of "
       "64 consecutive pool rows from a random page order)\n"
    << "- times: median per launch of " << reps << " samples × 10 back-to-back launches on one "
       "stream (host launch cost hidden, as in a decode graph); `Ops::indexer_topk` = device span "
       "per call of 10 eager calls between step markers (3 launches each: scores, topk_rows, "
       "finalize, PDL on — the default; includes any host gap)\n"
    << "- byte floor (per launch): keys n·512 B + row map n·4 B + scores n·4 B written, per row; "
       "+ top-512: scores read back n·4 B; / the copy bandwidth " << int(bw) << " GB/s\n"
    << "- new = decode kernel (`indexer_scores_tc` variant 2, 16-key chunks, the auto choice: keys "
       "straight into mma.sync B registers, one wave over the GPU); old = the WMMA kernel "
       "(variant 1, the previous decode path); last two columns: variant 3 (32-key chunks)\n\n"
    << "| n | batch | scores new µs | scores old µs | floor µs | new / floor | old / floor | "
       "+ top-512 new µs | + top-512 old µs | floor µs | new / floor | Ops::indexer_topk µs | "
       "scores new, 32-key chunks µs | + top-512 µs |\n"
    << "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  struct Shape { int64_t n; int batch; };
  for (Shape sh : {Shape{1024, 1}, Shape{32768, 1}, Shape{230400, 1}, Shape{262144, 1},
                   Shape{1024, 64}, Shape{32768, 64}}) {
    const int64_t n = sh.n, B = sh.batch, per = n * B;  // key rows per launch
    const int64_t min_rows = (int64_t(256) << 20) / (dI * 4);
    const int rot = int(std::min<int64_t>(256, std::max<int64_t>(2, (min_rows + per - 1) / per)));
    const int64_t pool_rows = per * rot;  // every rotation its own pages
    float *pool = nullptr, *q = nullptr, *w = nullptr, *scores = nullptr;
    int32_t *rows = nullptr, *cnt = nullptr, *sel = nullptr, *out_rows = nullptr, *out_cnt = nullptr;
    int64_t* offs = nullptr;
    IB_CHECK(cudaMalloc(&pool, size_t(pool_rows) * dI * 4));
    IB_CHECK(cudaMalloc(&q, size_t(B) * nI * dI * 4));
    IB_CHECK(cudaMalloc(&w, size_t(B) * nI * 4));
    IB_CHECK(cudaMalloc(&scores, size_t(B) * n * 4));
    IB_CHECK(cudaMalloc(&rows, size_t(pool_rows) * 4));
    IB_CHECK(cudaMalloc(&offs, size_t(rot) * B * 8));
    IB_CHECK(cudaMalloc(&cnt, size_t(B) * 4));
    IB_CHECK(cudaMalloc(&sel, size_t(B) * k * 4));
    IB_CHECK(cudaMalloc(&out_rows, size_t(B) * k * 4));
    IB_CHECK(cudaMalloc(&out_cnt, size_t(B) * 4));
    IB_OK(v4::cuda::fill_random(pool, pool_rows * dI,
                                v4::ops::fill::make_params(v4::ops::RandomFill::kF32Normal, 1.f, 11),
                                st));
    {
      std::vector<float> hq(size_t(B) * nI * dI), hw(size_t(B) * nI);
      for (auto& x : hq) x = nd(g);
      for (auto& x : hw) x = nd(g);
      IB_CHECK(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
      IB_CHECK(cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
      std::vector<int32_t> pages(static_cast<size_t>(pool_rows / 64)), hrows(static_cast<size_t>(pool_rows));
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), g);
      for (int64_t i = 0; i < pool_rows; ++i) hrows[size_t(i)] = pages[size_t(i / 64)] * 64 + int32_t(i % 64);
      std::vector<int64_t> hoff(size_t(rot) * B);
      for (int64_t i = 0; i < int64_t(hoff.size()); ++i) hoff[size_t(i)] = i * n;
      std::vector<int32_t> hcnt(static_cast<size_t>(B), static_cast<int32_t>(n));
      IB_CHECK(cudaMemcpy(rows, hrows.data(), hrows.size() * 4, cudaMemcpyHostToDevice));
      IB_CHECK(cudaMemcpy(offs, hoff.data(), hoff.size() * 8, cudaMemcpyHostToDevice));
      IB_CHECK(cudaMemcpy(cnt, hcnt.data(), hcnt.size() * 4, cudaMemcpyHostToDevice));
    }
    IB_CHECK(cudaDeviceSynchronize());
    auto args = [&](int i) {
      IndexerArgs a;
      a.q = q;
      a.weights = w;
      a.key_pool = pool;
      a.cand = {rows, offs + int64_t(i % rot) * B, cnt};
      a.n_rows = B;
      a.n_heads = nI;
      a.head_dim = dI;
      a.topk = k;
      a.max_count = n;
      a.out_rows = out_rows;
      a.out_count = out_cnt;
      return a;
    };
    double t_sc[4] = {}, t_tk[4] = {};
    for (int v : {1, 2, 3}) {
      t_sc[v] = time_on(st, [&](int i, cudaStream_t s) {
        IB_OK(v4::cuda::indexer_scores_tc(args(i), n, scores, n, n_sms, s, v));
      }, reps);
      t_tk[v] = time_on(st, [&](int i, cudaStream_t s) {
        IB_OK(v4::cuda::indexer_scores_tc(args(i), n, scores, n, n_sms, s, v));
        IB_OK(v4::cuda::topk_rows(scores, n, cnt, B, k, n, sel, nullptr, s));
      }, reps);
    }
    // Whole op, eager, device span between step markers.
    double t_op = 0;
    {
      for (int i = 0; i < 5; ++i) ops->indexer_topk(args(i));
      ops->synchronize();
      std::vector<double> t;
      for (int s = 0; s < std::max(5, reps / 4); ++s) {
        const double before = ops->step_timing().busy_s;
        ops->step_begin(true);
        for (int j = 0; j < 10; ++j) ops->indexer_topk(args(s * 10 + j));
        ops->step_end();
        t.push_back((ops->step_timing().busy_s - before) * 1e6 / 10);
      }
      std::sort(t.begin(), t.end());
      t_op = t[t.size() / 2];
    }
    const double f_sc = double(per) * (dI * 4 + 4 + 4) / (bw * 1e9) * 1e6;
    const double f_tk = (double(per) * (dI * 4 + 4 + 4 + 4) + double(B) * k * 4) / (bw * 1e9) * 1e6;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "| %lld | %lld | %.1f | %.1f | %.1f | %.2f× | %.2f× | %.1f | %.1f | %.1f | %.2f× | "
                  "%.1f | %.1f | %.1f |\n",
                  (long long)n, (long long)B, t_sc[2], t_sc[1], f_sc, t_sc[2] / f_sc, t_sc[1] / f_sc,
                  t_tk[2], t_tk[1], f_tk, t_tk[2] / f_tk, t_op, t_sc[3], t_tk[3]);
    o << buf;
    std::printf("indexer n=%lld batch=%lld: scores new %.1f old %.1f (floor %.1f) us; +top-512 new "
                "%.1f old %.1f (floor %.1f) us; Ops::indexer_topk %.1f us\n",
                (long long)n, (long long)B, t_sc[2], t_sc[1], f_sc, t_tk[2], t_tk[1], f_tk, t_op);
    cudaFree(pool); cudaFree(q); cudaFree(w); cudaFree(scores); cudaFree(rows); cudaFree(offs);
    cudaFree(cnt); cudaFree(sel); cudaFree(out_rows); cudaFree(out_cnt);
  }
  // Key formats: the decode kernel (auto choice, variant 0) over f32 / bf16 / fp8 (kFp8Index,
  // 144-byte rows) key pools, same lists and inputs (L2-cold as above). Byte floor: key rows
  // n·row_bytes + row map n·4 + scores n·4, per row.
  o << "\n### Key formats (`--kv-cache-dtype`: f32 / bf16 / fp8 indexer keys)\n\n"
    << "Decode kernel (variant 0 = auto: 2 n-tiles f32, 4 bf16, 4 fp8), scores only; row bytes "
       "512 / 256 / 144 (fp8: 128 e4m3 + f32 scale + 12 bytes padding); floor = (n·row bytes + 8n) per row / "
    << int(bw) << " GB/s.\n\n"
    << "| n | batch | f32 µs | bf16 µs | fp8 µs | f32 / floor | bf16 / floor | fp8 / floor | "
       "fp8 vs bf16 |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (Shape sh : {Shape{32768, 1}, Shape{230400, 1}, Shape{262144, 1}, Shape{32768, 64}}) {
    const int64_t n = sh.n, B = sh.batch, per = n * B;
    PagedIndexerInputs in(n, B, nI, dI, g);
    double t[3] = {}, f[3] = {};
    const v4::KvDtype dts[3] = {v4::KvDtype::kF32, v4::KvDtype::kBf16, v4::KvDtype::kFp8Index};
    for (int fi = 0; fi < 3; ++fi) {
      const int64_t rb = v4::kv_row_bytes(dts[fi], dI, 0);
      in.fill_keys(dts[fi], st);
      t[fi] = time_on(st, [&](int i, cudaStream_t s) {
        IB_OK(v4::cuda::indexer_scores_tc(in.args(i, dts[fi]), n, in.scores, n, n_sms, s, 0));
      }, reps);
      f[fi] = double(per) * double(rb + 8) / (bw * 1e9) * 1e6;
    }
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "| %lld | %lld | %.1f | %.1f | %.1f | %.2f× | %.2f× | %.2f× | %.2f× |\n",
                  (long long)n, (long long)B, t[0], t[1], t[2], t[0] / f[0], t[1] / f[1],
                  t[2] / f[2], t[2] / t[1]);
    o << buf;
    std::printf("indexer keys n=%lld batch=%lld: f32 %.1f bf16 %.1f fp8 %.1f us\n", (long long)n,
                (long long)B, t[0], t[1], t[2]);
  }
  // Pipelined decode kernel (variants 4–7: cp.async ring of S chunk slots per warp) vs the decode
  // kernel (variant 0 = auto), bf16 and fp8 keys, same inputs (L2-cold as above). Batch 64 rows
  // at 230K / 262K keys take ~1–3 ms a launch: a quarter of the samples.
  o << "\n### Pipelined decode kernel (variants 4–12 vs auto; `V4_INDEXER_DEC=N`)\n\n"
    << "Scores only; auto = the decode kernel (4 n-tiles, keys loaded into registers, no "
       "overlap); v4 / v5 / v6 = the pipelined kernel with a per-warp cp.async ring of 3 / 2 / 4 "
       "32-key chunk slots (fp8: exact bit-move e4m3 → bf16 conversion); v7 = v4 with the old "
       "fp8 conversion (bf16: = v4). Bit-identical scores to the decode kernel (fp8 keys: to v3; "
       "fp8 auto = the e4m3 tensor-core kernel, equal up to fp32 rounding) "
       "(`CudaIndexerTc.PipelinedDecodeEqualsDecodeKernelBitwise`). v8 / v9 = the warpgroup-MMA "
       "kernel with heads on M (wgmma.m64n64k16, cp.async ring of 4 / 3 64-key tiles per "
       "128-thread CTA); v10 / v11 / v12 = the same kernel with keys on M (A = the key tile, "
       "B = Q; ring of 4 / 3 / 2 tiles, one barrier a tile); v8–v12 bf16 keys only (fp8 rows: "
       "not run, they would run v3); scores equal up to fp32 rounding, `CudaIndexerWg.*`. "
       "floor = (n·row bytes + 8n) per row / " << int(bw) << " GB/s; ×fl = time / floor.\n\n";
  constexpr int kNv = 10;
  const int vs[kNv] = {0, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  o << "| keys | n | batch |";
  for (int vi = 0; vi < kNv; ++vi) o << (vi == 0 ? " auto" : " v" + std::to_string(vs[vi])) << " µs |";
  o << " floor µs |";
  for (int vi = 0; vi < kNv; ++vi) o << (vi == 0 ? " auto" : " v" + std::to_string(vs[vi])) << " ×fl |";
  o << " best |\n|---|---:|---:|";
  for (int vi = 0; vi < 2 * kNv + 2; ++vi) o << "---:|";
  o << "\n";
  for (Shape sh : {Shape{32768, 1}, Shape{230400, 1}, Shape{262144, 1}, Shape{32768, 64},
                   Shape{230400, 64}, Shape{262144, 64}}) {
    const int64_t n = sh.n, B = sh.batch, per = n * B;
    PagedIndexerInputs in(n, B, nI, dI, g);
    const int samples = B > 1 && n > 32768 ? std::max(5, reps / 4) : reps;
    for (v4::KvDtype dt : {v4::KvDtype::kBf16, v4::KvDtype::kFp8Index}) {
      in.fill_keys(dt, st);
      const int64_t rb = v4::kv_row_bytes(dt, dI, 0);
      const double fl = double(per) * double(rb + 8) / (bw * 1e9) * 1e6;
      double t[kNv] = {};
      int best = 0;
      for (int vi = 0; vi < kNv; ++vi) {
        if (vs[vi] >= 8 && dt != v4::KvDtype::kBf16) continue;  // bf16 keys only
        t[vi] = time_on(st, [&](int i, cudaStream_t s) {
          IB_OK(v4::cuda::indexer_scores_tc(in.args(i, dt), n, in.scores, n, n_sms, s, vs[vi]));
        }, samples);
        if (t[vi] < t[best]) best = vi;
      }
      std::string row = std::string("| ") + v4::kv_dtype_name(dt) + " | " + std::to_string(n) +
                        " | " + std::to_string(B) + " |";
      char buf[64];
      for (int vi = 0; vi < kNv; ++vi) {
        if (t[vi] > 0) std::snprintf(buf, sizeof buf, " %.1f |", t[vi]);
        else std::snprintf(buf, sizeof buf, " — |");
        row += buf;
      }
      std::snprintf(buf, sizeof buf, " %.1f |", fl);
      row += buf;
      for (int vi = 0; vi < kNv; ++vi) {
        if (t[vi] > 0) std::snprintf(buf, sizeof buf, " %.2f× |", t[vi] / fl);
        else std::snprintf(buf, sizeof buf, " — |");
        row += buf;
      }
      row += best == 0 ? std::string(" auto |") : " v" + std::to_string(vs[best]) + " |";
      o << row << "\n";
      std::printf("indexer pipe %s n=%lld batch=%lld:", v4::kv_dtype_name(dt), (long long)n,
                  (long long)B);
      for (int vi = 0; vi < kNv; ++vi)
        if (t[vi] > 0) std::printf(" %s%d %.1f", vi == 0 ? "auto/v" : "v", vs[vi], t[vi]);
      std::printf(" (floor %.1f) us\n", fl);
    }
  }
  cudaStreamDestroy(st);
  ops.reset();
  o << bench_indexer_chain(reps);
  return o.str();
}

// --only-indexer-prefill (cuda-indexer-prefill.md): the indexer scores of one prefill chunk —
// S rows of one sequence sharing one candidate list with causal counts (row t of a chunk ending at
// the list's end sees count_t = L − ⌊(S − 1 − t) / 4⌋ C4 keys) — prefill warpgroup-MMA kernel
// (variant 27, auto for S > 128) vs the WMMA kernel it replaces (variant 1), bf16 and fp8 keys,
// S ∈ {256, 2048} × L ∈ {32,768 (128K context), 230,400 (900K)}. FLOPs = Σ_t count_t · nI · dI · 2
// (the QK products; ReLU · w and the head sums not counted) over the dense bf16 peak 790 TFLOP/s
// (the constant of the model's prefill FLOP floor, cuda-kernels.md). Keys stay L2-resident (one
// list, as in a chunk); the pool is one run of random pages.
std::string bench_indexer_prefill(int reps) {
  const int nI = 64, dI = 128;
  const int n_sms = current_device_sms();
  cudaStream_t st;
  IB_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::mt19937_64 g(2027);
  std::ostringstream o;
  o << "- shapes: nI = 64 heads, dI = 128; one prefill chunk of S rows of one sequence (one shared "
       "candidate list, causal counts count_t = L − ⌊(S − 1 − t) / 4⌋); L = C4 keys of the "
       "context (32,768 = 128K, 230,400 = 900K)\n"
    << "- new = `indexer_scores_tc` variant 27 (indexer_prefill_wg: 4 rows a CTA sharing 64-key "
       "tiles, wgmma.m64n128k16; fp8 keys: codes converted to bf16 in shared memory, exact; auto "
       "for S > 128 with bf16 keys); e4m3 = variant 28 (fp8 keys: wgmma.m64n128k32 e4m3 on q's codes, no "
       "conversion, fp8 tensor-core accumulation; V4_INDEXER_PREFILL_FP8=e4m3 makes it auto); reg = "
       "variant 29 (fp8 codes converted from registers one tile ahead, the same bits as 27; auto for "
       "S > 128 with fp8 keys since session 18); old = variant 1 "
       "(the WMMA kernel, auto before these)\n"
    << "- times: median of " << std::max(3, reps / 10) << " launches after 1 warm-up; TFLOP/s = "
       "Σ_t count_t · 64 · 128 · 2 / time; % of peak against 790 TFLOP/s (dense bf16)\n\n"
    << "| keys | S rows | L keys | new ms | e4m3 ms | reg ms | old ms | speed-up | new TFLOP/s | "
       "e4m3 TFLOP/s | reg TFLOP/s | old TFLOP/s | new % of peak |\n"
    << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  struct Shape { int64_t S, L; };
  for (v4::KvDtype dt : {v4::KvDtype::kFp8Index, v4::KvDtype::kBf16}) {
    for (Shape sh : {Shape{256, 32768}, Shape{2048, 32768}, Shape{256, 230400}, Shape{2048, 230400}}) {
      const int64_t S = sh.S, L = sh.L;
      const int64_t rb = v4::kv_row_bytes(dt, dI, 0);
      const int64_t pool_rows = (L + 63) / 64 * 64;
      void* pool = nullptr;
      float *q = nullptr, *w = nullptr, *scores = nullptr;
      int32_t *rows = nullptr, *cnt = nullptr;
      int64_t* offs = nullptr;
      IB_CHECK(cudaMalloc(&pool, size_t(pool_rows * rb)));
      IB_CHECK(cudaMalloc(&q, size_t(S * nI * dI) * 4));
      IB_CHECK(cudaMalloc(&w, size_t(S * nI) * 4));
      IB_CHECK(cudaMalloc(&scores, size_t(S * L) * 4));
      IB_CHECK(cudaMalloc(&rows, size_t(pool_rows) * 4));
      IB_CHECK(cudaMalloc(&offs, size_t(S) * 8));
      IB_CHECK(cudaMalloc(&cnt, size_t(S) * 4));
      const v4::ops::RandomFill kind = dt == v4::KvDtype::kBf16 ? v4::ops::RandomFill::kBF16Normal
                                                                : v4::ops::RandomFill::kE4M3Normal;
      IB_OK(v4::cuda::fill_random(pool, pool_rows * rb / v4::ops::fill::unit_bytes(kind),
                                  v4::ops::fill::make_params(kind, 1.f, 21), st));
      IB_OK(v4::cuda::fill_random(q, S * nI * dI,
                                  v4::ops::fill::make_params(v4::ops::RandomFill::kF32Normal, 1.f, 22), st));
      IB_OK(v4::cuda::fill_random(w, S * nI,
                                  v4::ops::fill::make_params(v4::ops::RandomFill::kF32Normal, 1.f, 23), st));
      std::vector<int32_t> pages(static_cast<size_t>(pool_rows / 64)), hrows(static_cast<size_t>(pool_rows)),
          hcnt(static_cast<size_t>(S));
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), g);
      for (int64_t i = 0; i < pool_rows; ++i) hrows[size_t(i)] = pages[size_t(i / 64)] * 64 + int32_t(i % 64);
      double flops = 0;
      for (int64_t t = 0; t < S; ++t) {
        hcnt[size_t(t)] = int32_t(std::max<int64_t>(1, L - (S - 1 - t) / 4));
        flops += double(hcnt[size_t(t)]) * nI * dI * 2;
      }
      std::vector<int64_t> hoff(static_cast<size_t>(S), 0);
      IB_CHECK(cudaMemcpy(rows, hrows.data(), hrows.size() * 4, cudaMemcpyHostToDevice));
      IB_CHECK(cudaMemcpy(offs, hoff.data(), hoff.size() * 8, cudaMemcpyHostToDevice));
      IB_CHECK(cudaMemcpy(cnt, hcnt.data(), hcnt.size() * 4, cudaMemcpyHostToDevice));
      IB_CHECK(cudaStreamSynchronize(st));
      v4::ops::IndexerArgs a;
      a.q = q; a.weights = w; a.key_pool = pool; a.key_dtype = dt;
      a.cand = {rows, offs, cnt};
      a.n_rows = S; a.n_heads = nI; a.head_dim = dI; a.max_count = L;
      const bool fp8 = dt == v4::KvDtype::kFp8Index;
      double ms[4] = {};
      const int variants[4] = {v4::cuda::kIndexerPrefillWgVariant,
                               v4::cuda::kIndexerPrefillWgE4m3Variant, 1,
                               v4::cuda::kIndexerPrefillWgRegVariant};
      for (int k = 0; k < 4; ++k) {
        if ((k == 1 || k == 3) && !fp8) continue;  // bf16 keys: 28 = 29 = 27
        ms[k] = v4::bench::time_launches(st, [&](int, cudaStream_t s) {
                  IB_OK(v4::cuda::indexer_scores_tc(a, L, scores, L, n_sms, s, variants[k]));
                }, std::max(3, reps / 10), 1, 1).med_us / 1e3;
      }
      auto tf = [&](double m) { return flops / (m * 1e-3) / 1e12; };
      char e4m3_ms[32] = "—", e4m3_tf[32] = "—", reg_ms[32] = "—", reg_tf[32] = "—";
      if (fp8) {
        std::snprintf(e4m3_ms, sizeof e4m3_ms, "%.3f", ms[1]);
        std::snprintf(e4m3_tf, sizeof e4m3_tf, "%.0f", tf(ms[1]));
        std::snprintf(reg_ms, sizeof reg_ms, "%.3f", ms[3]);
        std::snprintf(reg_tf, sizeof reg_tf, "%.0f", tf(ms[3]));
      }
      char buf[448];
      std::snprintf(buf, sizeof buf,
                    "| %s | %lld | %lld | %.3f | %s | %s | %.2f | %.1f× | %.0f | %s | %s | %.1f | "
                    "%.0f%% |\n",
                    v4::kv_dtype_name(dt), (long long)S, (long long)L, ms[0], e4m3_ms, reg_ms,
                    ms[2], ms[2] / ms[0], tf(ms[0]), e4m3_tf, reg_tf, tf(ms[2]),
                    100.0 * tf(ms[0]) / 790.0);
      o << buf;
      std::printf("indexer prefill %s S=%lld L=%lld: new %.3f ms (%.0f TFLOP/s), e4m3 %s ms, old "
                  "%.2f ms (%.1f)\n",
                  v4::kv_dtype_name(dt), (long long)S, (long long)L, ms[0], tf(ms[0]), e4m3_ms,
                  ms[2], tf(ms[2]));
      cudaFree(pool); cudaFree(q); cudaFree(w); cudaFree(scores); cudaFree(rows); cudaFree(offs);
      cudaFree(cnt);
    }
  }
  IB_CHECK(cudaStreamDestroy(st));
  return o.str();
}

/// `bench_kernels --profile-indexer` (for ncu): `launches` calls of
/// `cuda::indexer_scores_tc` (`variant`: 0 = auto, the decode kernel; 4–7 the pipelined decode
/// kernel `indexer_decode_pipe_kernel`; 8 / 9 the warpgroup-MMA kernel `indexer_decode_wg_kernel`,
/// bf16 keys; any of indexer.h) at batch 1 over n candidates
/// of keys of `key_dtype` (f32 / bf16 / fp8 kFp8Index), nI = 64, dI = 128, paged L2-cold lists
/// rotating as in the "Key formats" table (PagedIndexerInputs), then a device sync, then the
/// median µs per launch of the same calls (printed). Exits with 2
/// on n outside [1, 2^22] or CUDA errors, 3 on a failed call. Returns 0.
int profile_indexer(v4::KvDtype key_dtype, int64_t n, int launches, int variant) {
  if (n < 1 || n > (int64_t(1) << 22) || launches < 1 || variant < 0 ||
      variant > v4::cuda::kIndexerScoresMaxVariant) {
    std::fprintf(stderr, "profile-indexer: n %lld (1..4194304), launches %d (≥ 1), variant %d "
                 "(0..%d)\n", (long long)n, launches, variant, v4::cuda::kIndexerScoresMaxVariant);
    std::exit(2);
  }
  const int n_sms = current_device_sms();
  cudaStream_t st;
  IB_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::mt19937_64 g(2026);
  {
    PagedIndexerInputs in(n, 1, 64, 128, g);
    in.fill_keys(key_dtype, st);
    for (int i = 0; i < launches; ++i)
      IB_OK(v4::cuda::indexer_scores_tc(in.args(i, key_dtype), n, in.scores, n, n_sms, st,
                                        variant));
    IB_CHECK(cudaStreamSynchronize(st));
    std::printf("profile-indexer done: %s keys, n %lld, variant %d, %d launches over %d row maps\n",
                v4::kv_dtype_name(key_dtype), (long long)n, variant, launches, in.rot);
    // Then the "Key formats" timing of the same calls (median of 20 samples × 10 launches), so
    // one variant can be timed without the whole --only-indexer table.
    const double us = time_on(st, [&](int i, cudaStream_t s) {
      IB_OK(v4::cuda::indexer_scores_tc(in.args(i, key_dtype), n, in.scores, n, n_sms, s, variant));
    }, 20);
    std::printf("profile-indexer time: %s keys, n %lld, variant %d: %.2f us per launch\n",
                v4::kv_dtype_name(key_dtype), (long long)n, variant, us);
  }
  cudaStreamDestroy(st);
  return 0;
}

/// `bench_kernels --out DIR --probe-indexer-gather` → DIR/cuda-indexer-gather.md: what bounds the
/// decode scores kernel at batch 1 (docs/cuda.md §Missing). Over bf16 keys, n = 32,768 / 230,400 /
/// 262,144 candidates: `cuda::indexer_gather_probe` (the decode kernel's loads, grid and chunk
/// order without the math) and the decode kernel (variant 0), each over the usual lists (runs of
/// 64 rows from a random page order, PagedIndexerInputs) and over sequential lists (row i of the
/// pool at position i: contiguous memory), L2-cold rotation as in the other tables. If the
/// gather alone takes about the decode kernel's time, the kernel is bound by the memory side
/// (latency / bytes in flight); if the sequential lists are much faster, by the gather pattern
/// (DRAM pages, TLB).
std::string bench_indexer_gather(double bw, int reps) {
  const int n_sms = current_device_sms();
  cudaStream_t st;
  IB_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::mt19937_64 g(2028);
  std::ostringstream o;
  o << "\n## Decode scores kernel vs its loads alone (bf16 keys, batch 1)\n\n"
    << "- gather = `cuda::indexer_gather_probe`: the decode kernel's grid (one wave at its "
       "occupancy), 32-key chunks per warp and 16-byte non-caching loads, candidate rows one chunk "
       "ahead, no math (the loaded words are XORed into one u32 per thread); decode = "
       "`indexer_scores_tc` variant 0 (auto: the decode kernel)\n"
    << "- random = lists of runs of 64 pool rows from a random page order (as every other table); "
       "sequential = row i of the pool at list position i (contiguous)\n"
    << "- floor = n · (256 + 8) bytes / " << int(bw) << " GB/s; median µs per launch, launches "
       "rotate over ≥ 256 MiB of rows (L2-cold)\n\n"
    << "| n | floor µs | gather random µs | gather sequential µs | decode random µs | decode "
       "sequential µs | gather / decode (random) |\n"
    << "|---:|---:|---:|---:|---:|---:|---:|\n";
  for (int64_t n : {int64_t(32768), int64_t(230400), int64_t(262144)}) {
    PagedIndexerInputs in(n, 1, 64, 128, g);
    in.fill_keys(v4::KvDtype::kBf16, st);
    int32_t* seq = nullptr;
    {
      std::vector<int32_t> h(static_cast<size_t>(in.pool_rows));
      std::iota(h.begin(), h.end(), 0);
      IB_CHECK(cudaMalloc(&seq, h.size() * 4));
      IB_CHECK(cudaMemcpy(seq, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    }
    auto args = [&](int i, bool sequential) {
      v4::ops::IndexerArgs a = in.args(i, v4::KvDtype::kBf16);
      if (sequential) a.cand.rows = seq;
      return a;
    };
    const int64_t words = v4::cuda::indexer_gather_probe_sink_words(args(0, false), n, n_sms);
    uint32_t* sink = nullptr;
    IB_CHECK(cudaMalloc(&sink, size_t(words) * 4));
    double t[4] = {};
    for (int k = 0; k < 4; ++k) {
      const bool sequential = k % 2 == 1, gather = k < 2;
      t[k] = time_on(st, [&](int i, cudaStream_t s) {
        if (gather)
          IB_OK(v4::cuda::indexer_gather_probe(args(i, sequential), n, sink, n_sms, s));
        else
          IB_OK(v4::cuda::indexer_scores_tc(args(i, sequential), n, in.scores, n, n_sms, s, 0));
      }, reps);
    }
    const double fl = double(n) * (256 + 8) / (bw * 1e9) * 1e6;
    char buf[256];
    std::snprintf(buf, sizeof buf, "| %lld | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n",
                  (long long)n, fl, t[0], t[1], t[2], t[3], t[0] / t[2]);
    o << buf;
    std::printf("indexer gather n=%lld: gather random %.1f sequential %.1f; decode random %.1f "
                "sequential %.1f (floor %.1f) us\n",
                (long long)n, t[0], t[1], t[2], t[3], fl);
    cudaFree(sink);
    cudaFree(seq);
  }
  // What limits the loads: more CTAs an SM (warps), two chunks in flight per warp, half the
  // bytes of the same rows, and a plain contiguous read of the same bytes.
  o << "\n## Gather probe variants (bf16 keys, batch 1, random lists)\n\n"
    << "- CTAs/SM: 0 = the decode kernel's grid (its occupancy), else that many (capped by the "
       "probe's occupancy); depth = chunks of 32 keys in flight per warp; half = only bytes "
       "0..127 of each 256-byte row\n"
    << "- read = `cuda::read_probe`: a contiguous read of n · 256 bytes by SMs × CTAs/SM blocks "
       "of 256 threads, 4 × 16-byte loads in flight per thread (the achievable time of those "
       "bytes in one kernel)\n"
    << "- probe loads are volatile asm (issued in program order, all before the first use); whole "
       "rows = each load covers two whole 256-byte rows (lanes 0–15, 16–31) instead of the decode "
       "kernel's 8 rows × 64 bytes\n\n"
    << "| n | probe | CTAs/SM | depth | bytes read | µs | GB/s |\n|---:|---|---:|---:|---:|---:|---:|\n";
  for (int64_t n : {int64_t(32768), int64_t(230400)}) {
    PagedIndexerInputs in(n, 1, 64, 128, g);
    in.fill_keys(v4::KvDtype::kBf16, st);
    struct Cfg { int bps, depth; bool half, whole; };
    for (const Cfg c : {Cfg{0, 1, false, false}, Cfg{4, 1, false, false}, Cfg{8, 1, false, false},
                        Cfg{0, 2, false, false}, Cfg{4, 2, false, false}, Cfg{0, 1, true, false},
                        Cfg{8, 1, true, false}, Cfg{2, 1, false, true}, Cfg{4, 1, false, true},
                        Cfg{8, 1, false, true}}) {
      v4::cuda::GatherProbeOptions po;
      po.blocks_per_sm = c.bps;
      po.depth = c.depth;
      po.half_rows = c.half;
      po.whole_rows = c.whole;
      const int64_t words = v4::cuda::indexer_gather_probe_sink_words(in.args(0, v4::KvDtype::kBf16), n, n_sms, po);
      uint32_t* sink = nullptr;
      IB_CHECK(cudaMalloc(&sink, size_t(words) * 4));
      const double us = time_on(st, [&](int i, cudaStream_t s) {
        IB_OK(v4::cuda::indexer_gather_probe(in.args(i, v4::KvDtype::kBf16), n, sink, n_sms, s, po));
      }, reps);
      const double bytes = double(n) * (c.half ? 128 : 256);
      char buf[256];
      std::snprintf(buf, sizeof buf, "| %lld | %s | %d | %d | %.1f MB | %.1f | %.0f |\n",
                    (long long)n, c.whole ? "gather, whole rows" : "gather", c.bps, c.depth,
                    bytes / 1e6, us, bytes / us * 1e-3);
      o << buf;
      std::printf("indexer gather probe n=%lld bps %d depth %d half %d whole %d: %.1f us\n",
                  (long long)n, c.bps, c.depth, int(c.half), int(c.whole), us);
      cudaFree(sink);
    }
    for (int bps : {2, 4, 8}) {
      const int64_t words = v4::cuda::read_probe_sink_words(n_sms, bps);
      uint32_t* sink = nullptr;
      IB_CHECK(cudaMalloc(&sink, size_t(words) * 4));
      const int64_t bytes = n * 256;
      const double us = time_on(st, [&](int i, cudaStream_t s) {
        const char* base = static_cast<const char*>(in.pool) + int64_t(i % in.rot) * in.per * 256;
        IB_OK(v4::cuda::read_probe(base, bytes, sink, n_sms, bps, s));
      }, reps);
      char buf[256];
      std::snprintf(buf, sizeof buf, "| %lld | read | %d | – | %.1f MB | %.1f | %.0f |\n",
                    (long long)n, bps, double(bytes) / 1e6, us, double(bytes) / us * 1e-3);
      o << buf;
      std::printf("read probe n=%lld bps %d: %.1f us\n", (long long)n, bps, us);
      cudaFree(sink);
    }
  }
  cudaStreamDestroy(st);
  return o.str();
}

// --profile-indexer-topk: Lightning TopK (top-512 of one row, topk_rows `variant`) on the scores
// the indexer scores kernel (auto) writes over keys of `key_dtype` — the step's input — against
// the same kernel on N(0, 1) scores, each with the grid sized for `max_n` (the step: the decode
// graph's context bucket, e.g. 262,144 for 900K = 230,400 candidates) and for `n` itself. Rows
// hold n scores at a stride of max_n; launches rotate over the row maps' score copies (cold).
// Prints one "profile-indexer-topk time" line per (scores, sizing).
int profile_indexer_topk(v4::KvDtype key_dtype, int64_t n, int64_t max_n, int variant) {
  if (n < 1 || max_n < n || max_n > v4::cuda::kTopkMaxRow || variant < 0) {
    std::fprintf(stderr, "profile-indexer-topk: 1 <= n %lld <= max_n %lld <= %lld, variant %d\n",
                 (long long)n, (long long)max_n, (long long)v4::cuda::kTopkMaxRow, variant);
    std::exit(2);
  }
  const int n_sms = current_device_sms();
  cudaStream_t st;
  IB_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::mt19937_64 g(2027);
  {
    PagedIndexerInputs in(n, 1, 64, 128, g);
    in.fill_keys(key_dtype, st);
    const int rot = in.rot;
    float *idx_sc = nullptr, *nrm_sc = nullptr;
    int32_t* out = nullptr;
    IB_CHECK(cudaMalloc(&idx_sc, size_t(rot) * max_n * 4));
    IB_CHECK(cudaMalloc(&nrm_sc, size_t(rot) * max_n * 4));
    IB_CHECK(cudaMalloc(&out, 512 * 4));
    for (int r = 0; r < rot; ++r)
      IB_OK(v4::cuda::indexer_scores_tc(in.args(r, key_dtype), max_n, idx_sc + int64_t(r) * max_n,
                                        max_n, n_sms, st, 0));
    std::normal_distribution<float> nd;
    std::vector<float> h(static_cast<size_t>(n));
    for (int r = 0; r < rot; ++r) {
      for (auto& x : h) x = nd(g);
      IB_CHECK(cudaMemcpyAsync(nrm_sc + int64_t(r) * max_n, h.data(), size_t(n) * 4,
                               cudaMemcpyHostToDevice, st));
      IB_CHECK(cudaStreamSynchronize(st));
    }
    IB_CHECK(cudaStreamSynchronize(st));
    for (const bool indexer_scores : {true, false})
      for (const int64_t sized : {max_n, n}) {
        const float* base = indexer_scores ? idx_sc : nrm_sc;
        const double us = time_on(st, [&](int i, cudaStream_t s) {
          IB_OK(v4::cuda::topk_rows(base + int64_t(i % rot) * max_n, max_n, in.cnt, 1, 512, sized,
                                    out, nullptr, s, variant));
        }, 20);
        std::printf("profile-indexer-topk time: %s scores (%s keys), count %lld, grid for %lld, "
                    "variant %d: %.2f us per launch\n",
                    indexer_scores ? "indexer" : "N(0,1)", v4::kv_dtype_name(key_dtype),
                    (long long)n, (long long)sized, variant, us);
      }
    cudaFree(idx_sc);
    cudaFree(nrm_sc);
    cudaFree(out);
  }
  cudaStreamDestroy(st);
  return 0;
}

#endif  // V4_HAVE_CUDA
