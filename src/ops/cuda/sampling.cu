#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Device sampler: see sampling.h for the algorithm and ops.h (SampleArgs) for the contract.
#include "ops/cuda/sampling.h"

#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <cub/util_type.cuh>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>

#include "ops/cuda/device_util.cuh"
#include "ops/sample_math.h"

namespace v4::cuda {
namespace {

using ops::SampleArgs;
using ops::SampleRowParams;

constexpr int kGreedyThreads = 512;
// Greedy over chunks (greedy_split_kernel): rows ≤ 64, ≤ 64 chunks of ≥ 4,096 logits a row;
// scratch: the partials [row][chunk] (u64), then a counter per row.
constexpr int64_t kGreedySplitMaxRows = 64, kGreedyMaxChunks = 64, kGreedyMinChunk = 4096;
constexpr size_t kGreedyCountOffset = size_t(kGreedySplitMaxRows * kGreedyMaxChunks) * 8;
constexpr size_t kGreedyScratchBytes = kGreedyCountOffset + size_t(kGreedySplitMaxRows) * 4;
constexpr int kPrepThreads = 512;
constexpr int kPrepItems = 8;  // compaction tile: 8192 entries
constexpr int kDrawThreads = 512;
constexpr int kDrawItems = 8;  // scan tile: 4096 entries
constexpr int kLogprobThreads = 1024;
constexpr int kHistBits = 11;  // sign, 8 exponent bits, 2 mantissa bits of x
constexpr int kBins = 1 << kHistBits;
constexpr int kMaxTopN = 20;
constexpr int kBinsPerThread = kBins / kPrepThreads;  // bins each prep thread scans
static_assert(kBins % kPrepThreads == 0, "the bin scan splits the bins evenly");

// ---- element helpers
// -----------------------------------------------------------------------------

/// x = logit · fl(1/T) with NaN → −inf (engine/sampler.cpp scale_logits). __fmul_rn: never
/// contracted into an FMA with a later subtraction.
__device__ __forceinline__ float scaled(float logit, float inv_t) {
  const float x = __fmul_rn(logit, inv_t);
  return x != x ? -INFINITY : x;
}

/// Unnormalized probability exp(x − mx) as f32: the f32 difference (as the CPU computes it), then
/// exp in f64 rounded once to f32 (what the CPU's correctly rounded expf gives).
__device__ __forceinline__ float weight(float x, float mx) {
  return float(exp(double(__fsub_rn(x, mx))));
}

/// Inverse of order_key for non-NaN values (−0 comes back as +0).
__device__ __forceinline__ float key_to_float(uint32_t key) {
  const uint32_t u = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  return __uint_as_float(u);
}

/// (order key, id) packed so that a larger value = larger key, then LOWER id. 0 is below every
/// element (ids < 2^31), so it serves as "none".
__device__ __forceinline__ unsigned long long pack(uint32_t key, int64_t i) {
  return (static_cast<unsigned long long>(key) << 32) |
         static_cast<uint32_t>(~static_cast<uint32_t>(i));
}
__device__ __forceinline__ int32_t unpack_id(unsigned long long p) {
  return int32_t(~static_cast<uint32_t>(p));
}

/// Calls f(value, index) for every element of row [V], each once, spread over the block's
/// threads; the aligned body uses float4 loads.
template <typename F>
__device__ __forceinline__ void for_each_in_row(const float* __restrict__ row, int64_t V, F&& f) {
  const int64_t a4 = int64_t((reinterpret_cast<uintptr_t>(row) >> 2) & 3);
  const int64_t head = min(V, (4 - a4) & 3);
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x) f(row[i], i);
  const int64_t n4 = (V - head) >> 2;
  const float4* r4 = reinterpret_cast<const float4*>(row + head);
#pragma unroll 4
  for (int64_t j = threadIdx.x; j < n4; j += blockDim.x) {
    const float4 v = __ldg(r4 + j);
    const int64_t i = head + 4 * j;
    f(v.x, i);
    f(v.y, i + 1);
    f(v.z, i + 2);
    f(v.w, i + 3);
  }
  for (int64_t i = head + 4 * n4 + threadIdx.x; i < V; i += blockDim.x) f(row[i], i);
}

struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};
struct MinOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a < b ? a : b;
  }
};
struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};

/// Block-wide reduction with a fixed order (warp butterfly, then warps 0..W−1 in order), so the
/// result is deterministic; every thread gets it. All threads must call. smem: [THREADS / 32].
template <int THREADS, typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // earlier readers of smem are done
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = smem[0];
#pragma unroll
  for (int w = 1; w < THREADS / 32; ++w) r = op(r, smem[w]);
  return r;
}

/// Scratch of one chunk of rows (row c of the chunk owns entries [c·V, c·V + V)).
struct SortScratch {
  uint32_t* keys = nullptr;  // prep output / sort input
  int32_t* vals = nullptr;
  const uint32_t* sorted_keys = nullptr;  // sort output (draw input)
  const int32_t* sorted_vals = nullptr;
  int32_t* seg_begin = nullptr;  // [chunk]
  int32_t* seg_end = nullptr;    // [chunk]
  double* row_sum = nullptr;     // [chunk] Σ exp(x − mx) over the whole row
};

__device__ __forceinline__ bool use_top_k(const SampleRowParams& p, int64_t V) {
  return p.top_k > 0 && p.top_k < V;
}
__device__ __forceinline__ bool use_top_p(const SampleRowParams& p) {
  return p.top_p < 1.f;
}

// ---- 1. greedy
// -----------------------------------------------------------------------------------

__global__ void __launch_bounds__(kGreedyThreads) greedy_kernel(SampleArgs a) {
  const int64_t r = blockIdx.x;
  if (!a.all_greedy && a.params[r].temperature != 0.f) return;
  __shared__ unsigned long long red[kGreedyThreads / 32];
  unsigned long long best = 0;
  for_each_in_row(a.logits + r * a.vocab, a.vocab, [&](float v, int64_t i) {
    const unsigned long long p = pack(order_key(v), i);
    best = p > best ? p : best;
  });
  best = block_reduce<kGreedyThreads>(best, MaxOp{}, red);
  if (threadIdx.x == 0) a.out_tokens[r] = unpack_id(best);
}

/// Greedy over chunks (few rows; DeviceSampler::run picks it): block (c, r) takes the max of
/// pack(order_key, id) over logits [c·chunk, min(V, (c + 1)·chunk)) of row r, writes it to
/// part[r·C + c] and counts itself on count[r]; the row's last block (threadfence-reduction
/// pattern) takes the max of the C partials, writes the token and resets count[r] to 0 (graph
/// replays need no memset). A max over the same packed values as greedy_kernel: the same token,
/// bit for bit, whatever the chunking or the order the blocks finish in.
__global__ void __launch_bounds__(kGreedyThreads)
    greedy_split_kernel(SampleArgs a, int64_t chunk, unsigned long long* __restrict__ part,
                        unsigned int* __restrict__ count) {
  const int64_t r = blockIdx.y;
  const int c = int(blockIdx.x), C = int(gridDim.x);
  if (!a.all_greedy && a.params[r].temperature != 0.f) return;  // every block of the row
  __shared__ unsigned long long red[kGreedyThreads / 32];
  __shared__ bool last;
  const int64_t b = int64_t(c) * chunk, n = min(chunk, a.vocab - b);
  unsigned long long best = 0;
  for_each_in_row(a.logits + r * a.vocab + b, n, [&](float v, int64_t i) {
    const unsigned long long p = pack(order_key(v), b + i);
    best = p > best ? p : best;
  });
  best = block_reduce<kGreedyThreads>(best, MaxOp{}, red);
  if (threadIdx.x == 0) {
    part[r * C + c] = best;
    __threadfence();  // the partial before the count that publishes it
    last = atomicAdd(count + r, 1u) == unsigned(C - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  unsigned long long m = 0;
  for (int i = threadIdx.x; i < C; i += kGreedyThreads) {
    const unsigned long long p = __ldcg(part + r * C + i);
    m = p > m ? p : m;
  }
  m = block_reduce<kGreedyThreads>(m, MaxOp{}, red);
  if (threadIdx.x == 0) {
    a.out_tokens[r] = unpack_id(m);
    count[r] = 0u;
  }
}

// ---- 2a. prep: keys of the rows that sort
// ---------------------------------------------------------

__global__ void __launch_bounds__(kPrepThreads)
    prep_kernel(SampleArgs a, int64_t r0, SortScratch s, bool prefilter) {
  using ScanI = cub::BlockScan<int, kPrepThreads>;
  using ScanL = cub::BlockScan<unsigned long long, kPrepThreads>;
  __shared__ unsigned int cnt[kBins];
  __shared__ unsigned long long mass[kBins];
  __shared__ union {
    typename ScanI::TempStorage i;
    typename ScanL::TempStorage l;
  } scan;
  __shared__ float redf[kPrepThreads / 32];
  __shared__ double redd[kPrepThreads / 32];
  __shared__ int redi[kPrepThreads / 32];
  __shared__ unsigned long long cut_count;

  const int64_t c = blockIdx.x, r = r0 + c, V = a.vocab;
  const int32_t base = int32_t(c * V);
  const SampleRowParams p = a.params[r];
  if (threadIdx.x == 0) {
    s.seg_begin[c] = base;
    s.seg_end[c] = base;  // empty segment unless this row sorts
    s.row_sum[c] = 0.0;
  }
  const bool use_k = use_top_k(p, V);
  if (p.temperature == 0.f || !(use_k || use_top_p(p))) return;
  const float inv_t = 1.0f / p.temperature;
  const float* row = a.logits + r * V;
  uint32_t* keys = s.keys + base;
  int32_t* vals = s.vals + base;

  float mx = -INFINITY;
  for_each_in_row(row, V, [&](float l, int64_t) { mx = fmaxf(mx, scaled(l, inv_t)); });
  mx = block_reduce<kPrepThreads>(mx, MaxOp{}, redf);
  const bool finite = isfinite(mx);

  if (prefilter && finite) {
    for (int b = threadIdx.x; b < kBins; b += kPrepThreads) {
      cnt[b] = 0;
      mass[b] = 0;
    }
    __syncthreads();
    double tot = 0;
    for_each_in_row(row, V, [&](float l, int64_t) {
      const float x = scaled(l, inv_t);
      const float w = weight(x, mx);
      tot += w;
      const uint32_t b = order_key(x) >> (32 - kHistBits);
      atomicAdd(&cnt[b], 1u);
      // Fixed point, rounded down (w ≤ 1 → ≤ 2^32): bin masses are exact lower bounds.
      atomicAdd(&mass[b], static_cast<unsigned long long>(w * 4294967296.0f));
    });
    tot = block_reduce<kPrepThreads>(tot, SumOp{}, redd);  // (its barriers complete the histogram)

    // Bin positions from the top: position q is bin kBins−1−q; thread t owns positions
    // t·kBinsPerThread.. . Prefix sums from the top give the count and mass of every upper part.
    // The cut is the highest boundary whose upper part holds ≥ top_k entries (top-k rows: the
    // top-k sum must be taken over all of them), or whose mass surely reaches top_p · total
    // (top-p-only rows; the draw recomputes the cut exactly within it).
    const int t = threadIdx.x;
    unsigned long long bc[kBinsPerThread], bm[kBinsPerThread], sc = 0, sm = 0;
#pragma unroll
    for (int q = 0; q < kBinsPerThread; ++q) {
      const int b = kBins - 1 - (t * kBinsPerThread + q);
      bc[q] = cnt[b];
      bm[q] = mass[b];
      sc += bc[q];
      sm += bm[q];
    }
    unsigned long long C, M;
    ScanL(scan.l).ExclusiveSum(sc, C);
    __syncthreads();
    ScanL(scan.l).ExclusiveSum(sm, M);
    const double target = double(p.top_p) * tot * (1.0 + 1e-9);
    int pos = INT_MAX;
    unsigned long long my_count = 0;
#pragma unroll
    for (int q = 0; q < kBinsPerThread; ++q) {
      C += bc[q];
      M += bm[q];
      const bool holds = use_k ? C >= static_cast<unsigned long long>(p.top_k)
                               : double(M) * (1.0 / 4294967296.0) >= target;
      if (pos == INT_MAX && holds) {
        pos = t * kBinsPerThread + q;
        my_count = C;
      }
    }
    const int my_pos = pos;
    pos = block_reduce<kPrepThreads>(pos, MinOp{}, redi);
    if (pos != INT_MAX) {
      if (my_pos == pos) cut_count = my_count;
      __syncthreads();
      const uint32_t cut = uint32_t(kBins - 1 - pos);
      if (cut_count < static_cast<unsigned long long>(V)) {
        // Ordered compaction of the entries with bin ≥ cut (id order kept: the sort is stable).
        int64_t written = 0;
        for (int64_t t0 = 0; t0 < V; t0 += int64_t(kPrepThreads) * kPrepItems) {
          const int64_t i0 = t0 + int64_t(threadIdx.x) * kPrepItems;
          uint32_t k[kPrepItems];
          unsigned mine = 0;
          int n_mine = 0;
#pragma unroll
          for (int q = 0; q < kPrepItems; ++q) {
            const int64_t i = i0 + q;
            k[q] = 0;
            if (i < V) {
              k[q] = order_key(scaled(row[i], inv_t));
              if ((k[q] >> (32 - kHistBits)) >= cut) {
                mine |= 1u << q;
                ++n_mine;
              }
            }
          }
          int off, total;
          __syncthreads();  // scan storage reuse
          ScanI(scan.i).ExclusiveSum(n_mine, off, total);
          int64_t o = written + off;
#pragma unroll
          for (int q = 0; q < kPrepItems; ++q)
            if (mine & (1u << q)) {
              keys[o] = ~k[q];
              vals[o] = int32_t(i0 + q);
              ++o;
            }
          written += total;
        }
        if (threadIdx.x == 0) {
          s.seg_end[c] = base + int32_t(written);
          s.row_sum[c] = tot;
        }
        return;
      }
    }
  }

  // Full sort: every entry (also rows whose max is not finite: the draw takes the first one).
  double tot = 0;
  for_each_in_row(row, V, [&](float l, int64_t i) {
    const float x = scaled(l, inv_t);
    keys[i] = ~order_key(x);
    vals[i] = int32_t(i);
    if (finite) tot += weight(x, mx);
  });
  tot = block_reduce<kPrepThreads>(tot, SumOp{}, redd);
  if (threadIdx.x == 0) {
    s.seg_end[c] = base + int32_t(V);
    s.row_sum[c] = tot;
  }
}

// ---- 2c. draw
// --------------------------------------------------------------------------------------

struct ScanShared {
  cub::BlockScan<double, kDrawThreads>::TempStorage scan;
  double carry;
  double found_cum;
  unsigned long long found;
  long long red[kDrawThreads / 32];
};

/// Walks w(j) for j < n in order, in tiles of kDrawThreads·kDrawItems (thread t owns items
/// t·kDrawItems.. of a tile), with cum_j = Σ_{i ≤ j} w(i) in f64. The value of cum_j is a fixed
/// function of w(0..j) (block scan over the threads before j's owner, then its items in order),
/// so two walks over prefixes that both contain j agree on it exactly.
/// Returns the first j with pred(cum_j) and sets *cum_at = cum_j; or −1 with *cum_at = cum_{n−1}
/// and *last_kept = the last j whose w_of reported kept (−1 if none).
/// w_of(j, kept&) → f32 weight (0 for entries that are not kept). All threads must call.
template <typename WOf, typename Pred>
__device__ int64_t scan_find(int64_t n, WOf w_of, Pred pred, double* cum_at, int64_t* last_kept,
                             ScanShared& sh) {
  using Scan = cub::BlockScan<double, kDrawThreads>;
  constexpr int64_t kTile = int64_t(kDrawThreads) * kDrawItems;
  __syncthreads();  // earlier readers of sh are done
  if (threadIdx.x == 0) sh.found = ULLONG_MAX;
  double carry = 0;
  long long last = -1;
  for (int64_t t0 = 0; t0 < n; t0 += kTile) {
    const int64_t j0 = t0 + int64_t(threadIdx.x) * kDrawItems;
    double w[kDrawItems];
    double tsum = 0;
#pragma unroll
    for (int q = 0; q < kDrawItems; ++q) {
      const int64_t j = j0 + q;
      w[q] = 0;
      if (j < n) {
        bool kept = false;
        w[q] = double(w_of(j, kept));
        if (kept) last = j;
      }
      tsum += w[q];
    }
    double excl;
    __syncthreads();  // sh.scan reuse; sh.found initialized
    Scan(sh.scan).ExclusiveSum(tsum, excl);
    double c = carry + excl;
    long long found = -1;
    double fc = 0;
    const int64_t tile_last = min(n, t0 + kTile) - 1;
#pragma unroll
    for (int q = 0; q < kDrawItems; ++q) {
      const int64_t j = j0 + q;
      if (j < n) {
        c += w[q];
        if (found < 0 && pred(c)) {
          found = j;
          fc = c;
        }
        if (j == tile_last) sh.carry = c;
      }
    }
    if (found >= 0) atomicMin(&sh.found, static_cast<unsigned long long>(found));
    __syncthreads();
    const unsigned long long f = sh.found;
    if (f != ULLONG_MAX) {  // uniform
      if (found == static_cast<long long>(f)) sh.found_cum = fc;
      __syncthreads();
      *cum_at = sh.found_cum;
      return int64_t(f);
    }
    carry = sh.carry;
  }
  *cum_at = carry;
  *last_kept = block_reduce<kDrawThreads>(last, MaxOp{}, sh.red);
  return -1;
}

__global__ void __launch_bounds__(kDrawThreads)
    draw_kernel(SampleArgs a, int64_t r0, SortScratch s) {
  __shared__ ScanShared sh;
  __shared__ unsigned long long redu[kDrawThreads / 32];
  const int64_t c = blockIdx.x, r = r0 + c, V = a.vocab;
  const SampleRowParams p = a.params[r];
  if (p.temperature == 0.f) return;
  const float inv_t = 1.0f / p.temperature;
  const double u = ops::sample_uniform(p.seed, uint64_t(p.step));
  const bool use_k = use_top_k(p, V), use_p = use_top_p(p), use_min = p.min_p > 0.f;
  const float thr = p.min_p;  // CPU: min_p · pmax, pmax = exp(0) = 1 (the top entry is kept)
  auto never = [](double) { return false; };
  double dummy;
  int64_t last = -1;
  int32_t token;

  if (!use_k && !use_p) {
    // Neither top-k nor top-p: every entry (min-p filtered) in id order, as the CPU walks them.
    const float* row = a.logits + r * V;
    unsigned long long best = 0;
    for_each_in_row(row, V, [&](float l, int64_t i) {
      const unsigned long long q = pack(order_key(scaled(l, inv_t)), i);
      best = q > best ? q : best;
    });
    best = block_reduce<kDrawThreads>(best, MaxOp{}, redu);
    const float mx = key_to_float(uint32_t(best >> 32));
    if (!isfinite(mx)) {
      token = unpack_id(best);
    } else {
      auto w_of = [&](int64_t i, bool& kept) {
        const float w = weight(scaled(row[i], inv_t), mx);
        kept = !use_min || w >= thr;
        return kept ? w : 0.f;
      };
      double total;
      scan_find(V, w_of, never, &total, &last, sh);
      const double tu = u * total;
      const int64_t j = scan_find(
          V, w_of, [tu](double cum) { return tu < cum; }, &dummy, &last, sh);
      token = int32_t(j >= 0 ? j : last);
    }
  } else {
    const uint32_t* K = s.sorted_keys + c * V;
    const int32_t* I = s.sorted_vals + c * V;
    const int64_t n = s.seg_end[c] - s.seg_begin[c];
    const float mx = key_to_float(~K[0]);
    if (!isfinite(mx)) {
      token = I[0];  // = argmax x, lowest id (the row was sorted in full)
    } else {
      const int64_t lim = use_k ? min(int64_t(p.top_k), n) : n;
      auto w_all = [&](int64_t j, bool& kept) {
        kept = true;
        return weight(key_to_float(~K[j]), mx);
      };
      double sum;  // mass the top-p target refers to: the top-k entries, or the whole row
      if (use_k)
        scan_find(lim, w_all, never, &sum, &last, sh);
      else
        sum = s.row_sum[c];
      int64_t L = lim;
      double kept_sum = sum;
      if (use_p) {
        const double target = double(p.top_p) * sum;
        const int64_t j = scan_find(
            lim, w_all, [target](double cum) { return cum >= target; }, &kept_sum, &last, sh);
        L = j >= 0 ? j + 1 : lim;
      }
      auto w_kept = [&](int64_t j, bool& kept) {
        const float w = weight(key_to_float(~K[j]), mx);
        kept = !use_min || w >= thr;
        return kept ? w : 0.f;
      };
      if (use_min) scan_find(L, w_kept, never, &kept_sum, &last, sh);
      const double tu = u * kept_sum;
      const int64_t j = scan_find(
          L, w_kept, [tu](double cum) { return tu < cum; }, &dummy, &last, sh);
      token = I[j >= 0 ? j : (last >= 0 ? last : 0)];
    }
  }
  if (threadIdx.x == 0) a.out_tokens[r] = token;
}

// ---- 3. logprobs
// -----------------------------------------------------------------------------------

__global__ void __launch_bounds__(kLogprobThreads) logprobs_kernel(SampleArgs a) {
  __shared__ float redf[kLogprobThreads / 32];
  __shared__ double redd[kLogprobThreads / 32];
  __shared__ unsigned long long redu[kLogprobThreads / 32];
  const int64_t r = blockIdx.x, V = a.vocab;
  if (a.params && a.params[r].logprobs == 0) return;
  const float* row = a.logits + r * V;
  float mx = -INFINITY;
  for_each_in_row(row, V, [&](float l, int64_t) { mx = fmaxf(mx, l); });  // NaN ignored
  mx = block_reduce<kLogprobThreads>(mx, MaxOp{}, redf);
  double sum = 0;
  for_each_in_row(row, V, [&](float l, int64_t) { sum += exp(double(l) - double(mx)); });
  sum = block_reduce<kLogprobThreads>(sum, SumOp{}, redd);
  const double lse = double(mx) + log(sum);
  if (threadIdx.x == 0) a.out_logprob[r] = float(double(row[a.out_tokens[r]]) - lse);
  // Top-n: round k takes the largest (key, −id) strictly below the previous round's.
  unsigned long long prev = ULLONG_MAX;
  for (int k = 0; k < a.top_n; ++k) {
    unsigned long long best = 0;
    for_each_in_row(row, V, [&](float l, int64_t i) {
      const unsigned long long q = pack(order_key(l), i);
      if (q < prev && q > best) best = q;
    });
    best = block_reduce<kLogprobThreads>(best, MaxOp{}, redu);
    if (threadIdx.x == 0) {
      const int64_t o = r * a.top_n + k;
      if (best == 0) {
        a.out_top_tokens[o] = -1;
        a.out_top_logprobs[o] = NAN;
      } else {
        const int32_t id = unpack_id(best);
        a.out_top_tokens[o] = id;
        a.out_top_logprobs[o] = float(double(row[id]) - lse);
      }
    }
    prev = best;
  }
}

}  // namespace

size_t DeviceSampler::scratch_bytes() const {
  size_t b = arena_.bytes() + temp_.bytes() + greedy_part_.bytes();
  for (const auto& r : retired_) b += r.bytes();
  return b;
}

namespace {
Status no_growth_in_capture(cudaStream_t stream, const char* what) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  V4_CUDA_TRY(cudaStreamIsCapturing(stream, &cs));
  if (cs != cudaStreamCaptureStatusNone)
    return errorf(ErrorCode::kInvalidArgument,
                  "sample: {} must grow during a CUDA graph capture; run this shape once before "
                  "capturing",
                  what);
  return Status::Ok();
}
size_t align256(size_t b) {
  return (b + 255) / 256 * 256;
}
}  // namespace

Status DeviceSampler::reserve(int64_t rows, int64_t vocab, cudaStream_t stream) {
  if (arena_rows_ >= rows && arena_vocab_ == vocab) return Status::Ok();
  V4_RETURN_IF_ERROR(no_growth_in_capture(stream, "the sort scratch"));
  const size_t n = size_t(rows) * size_t(vocab);
  const size_t big = align256(n * 4), small = align256(size_t(rows) * 8);
  DeviceBuffer<unsigned char> fresh;
  V4_RETURN_IF_ERROR(fresh.alloc(4 * big + 3 * small));
  if (arena_.size()) retired_.push_back(std::move(arena_));
  arena_ = std::move(fresh);
  unsigned char* p = arena_.get();
  keys_a_ = reinterpret_cast<uint32_t*>(p);
  keys_b_ = reinterpret_cast<uint32_t*>(p + big);
  vals_a_ = reinterpret_cast<int32_t*>(p + 2 * big);
  vals_b_ = reinterpret_cast<int32_t*>(p + 3 * big);
  seg_begin_ = reinterpret_cast<int32_t*>(p + 4 * big);
  seg_end_ = reinterpret_cast<int32_t*>(p + 4 * big + small);
  row_sum_ = reinterpret_cast<double*>(p + 4 * big + 2 * small);
  arena_rows_ = rows;
  arena_vocab_ = vocab;
  return Status::Ok();
}

Status DeviceSampler::reserve_temp(size_t bytes, cudaStream_t stream) {
  if (temp_.size() >= bytes) return Status::Ok();
  V4_RETURN_IF_ERROR(no_growth_in_capture(stream, "the sort's temporary storage"));
  DeviceBuffer<unsigned char> fresh;
  V4_RETURN_IF_ERROR(fresh.alloc(align256(bytes)));
  if (temp_.size()) retired_.push_back(std::move(temp_));
  temp_ = std::move(fresh);
  return Status::Ok();
}

Status DeviceSampler::run(const ops::SampleArgs& a, cudaStream_t stream) {
  const int64_t R = a.n_rows, V = a.vocab;
  if (R <= 0) return Status::Ok();
  if (V < 1 || V >= (int64_t(1) << 31))
    return errorf(ErrorCode::kInvalidArgument, "sample: vocab {} outside [1, 2^31)", V);
  if (!a.logits || !a.out_tokens)
    return errorf(ErrorCode::kInvalidArgument, "sample: logits and out_tokens are required");
  if (!a.all_greedy && !a.params)
    return errorf(ErrorCode::kInvalidArgument, "sample: params are required unless all_greedy");
  if (a.out_logprob) {
    if (a.top_n < 0 || a.top_n > kMaxTopN)
      return errorf(ErrorCode::kInvalidArgument, "sample: top_n {} outside [0, {}]", a.top_n,
                    kMaxTopN);
    if (a.top_n > 0 && (!a.out_top_tokens || !a.out_top_logprobs))
      return errorf(ErrorCode::kInvalidArgument,
                    "sample: top_n {} needs out_top_tokens and out_top_logprobs", a.top_n);
  }

  // Greedy: one block per row, or, for few rows of a large vocabulary, chunks of ≥ 4,096 logits
  // per block so that about two blocks per SM run (one block took 22.8 µs for a 129,280-entry
  // row at batch 1 on the H200, bench/results/ncu-decode-kernels-s27.md).
  int64_t chunks = 1, chunk = V;
  static const bool split_on = [] {  // V4_GREEDY_SPLIT=0: one block per row always (A/B)
    const char* e = std::getenv("V4_GREEDY_SPLIT");
    return !(e && e[0] == '0');
  }();
  if (split_on && R <= kGreedySplitMaxRows && V >= 2 * kGreedyMinChunk) {
    if (n_sms_ == 0) {
      int dev = 0, n = 0;
      V4_CUDA_TRY(cudaGetDevice(&dev));
      V4_CUDA_TRY(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
      n_sms_ = std::max(1, n);
    }
    const int64_t want = std::min<int64_t>({kGreedyMaxChunks, V / kGreedyMinChunk,
                                            std::max<int64_t>(1, 2 * n_sms_ / R)});
    if (want >= 2) {
      cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
      V4_CUDA_TRY(cudaStreamIsCapturing(stream, &cs));
      if (!greedy_part_.size() && cs == cudaStreamCaptureStatusNone) {
        // Allocated once, outside any capture (a capture before the first call keeps one block
        // per row: the same tokens).
        DeviceBuffer<unsigned char> b;
        V4_RETURN_IF_ERROR(b.alloc(kGreedyScratchBytes));
        V4_CUDA_TRY(cudaMemsetAsync(b.get(), 0, kGreedyScratchBytes, stream));
        V4_CUDA_TRY(cudaStreamSynchronize(stream));
        greedy_part_ = std::move(b);
      }
      if (greedy_part_.size()) {
        chunk = (V + want - 1) / want;
        chunk = (chunk + 3) / 4 * 4;  // chunk starts keep the row's float4 alignment
        chunks = (V + chunk - 1) / chunk;
      }
    }
  }
  if (chunks > 1) {
    auto* part = reinterpret_cast<unsigned long long*>(greedy_part_.get());
    auto* count = reinterpret_cast<unsigned int*>(greedy_part_.get() + kGreedyCountOffset);
    greedy_split_kernel<<<dim3(unsigned(chunks), unsigned(R)), kGreedyThreads, 0, stream>>>(
        a, chunk, part, count);
    V4_CUDA_CHECK_LAUNCH("sample greedy_split_kernel");
  } else {
    greedy_kernel<<<unsigned(R), kGreedyThreads, 0, stream>>>(a);
    V4_CUDA_CHECK_LAUNCH("sample greedy_kernel");
  }

  if (!a.all_greedy) {
    // Rows per chunk: the scratch bound, and chunk offsets (c · V) must fit int32 for CUB.
    const int64_t cap = std::max<int64_t>(1, std::min(chunk_rows_, ((int64_t(1) << 31) - 1) / V));
    const int64_t C = std::min(R, cap);
    V4_RETURN_IF_ERROR(reserve(cap, V, stream));  // the whole chunk at once: no regrowth
    for (int64_t r0 = 0; r0 < R; r0 += C) {
      const int64_t rows = std::min(C, R - r0);
      SortScratch s;
      s.keys = keys_a_;
      s.vals = vals_a_;
      s.seg_begin = seg_begin_;
      s.seg_end = seg_end_;
      s.row_sum = row_sum_;
      prep_kernel<<<unsigned(rows), kPrepThreads, 0, stream>>>(a, r0, s, prefilter_);
      V4_CUDA_CHECK_LAUNCH("sample prep_kernel");

      cub::DoubleBuffer<uint32_t> dk(keys_a_, keys_b_);
      cub::DoubleBuffer<int32_t> dv(vals_a_, vals_b_);
      size_t temp_bytes = 0;
      V4_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortPairs(nullptr, temp_bytes, dk, dv,
                                                           int(rows * V), int(rows), seg_begin_,
                                                           seg_end_, 0, 32, stream));
      V4_RETURN_IF_ERROR(reserve_temp(std::max<size_t>(temp_bytes, 1), stream));
      cub::DoubleBuffer<uint32_t> sk(keys_a_, keys_b_);
      cub::DoubleBuffer<int32_t> sv(vals_a_, vals_b_);
      size_t have = temp_.bytes();
      V4_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortPairs(temp_.get(), have, sk, sv, int(rows * V),
                                                           int(rows), seg_begin_, seg_end_, 0, 32,
                                                           stream));
      s.sorted_keys = sk.Current();
      s.sorted_vals = sv.Current();
      draw_kernel<<<unsigned(rows), kDrawThreads, 0, stream>>>(a, r0, s);
      V4_CUDA_CHECK_LAUNCH("sample draw_kernel");
    }
  }

  if (a.out_logprob) {
    logprobs_kernel<<<unsigned(R), kLogprobThreads, 0, stream>>>(a);
    V4_CUDA_CHECK_LAUNCH("sample logprobs_kernel");
  }
  return Status::Ok();
}

}  // namespace v4::cuda
