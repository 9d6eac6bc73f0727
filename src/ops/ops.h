// The op interface the DeepSeek-V4 forward is written against (ARCHITECTURE.md: "one forward,
// two backends"). These are model-level fused ops, not a tensor library: each op is one step of
// dsv4-model.md with its exact math, over a ragged batch of S token rows (prefill chunks and decode
// rows of many sequences mixed). Backends: `cpu/` (fp32 reference, threaded, deterministic and
// batch-invariant: a row's result never depends on which other rows share the call) and `cuda/`.
//
// Conventions
// - All pointers are backend memory (host memory on CPU, device memory on CUDA) obtained through
//   `Ops::alloc` or pools built from it; index arrays (int32/int64) likewise. Host plans are
//   uploaded with `Ops::upload`.
// - Activations are f32, row-major. Weights are f32 on the CPU backend (decoded once at load).
// - Dims are named as in dsv4-model.md: S rows of the step, D hidden, n hc_mult, H heads, hd
//   head_dim, rd rope dims, nI/dI indexer heads/dim, E experts, k experts per token, I expert
//   width.
// - "Row maps": a key set per query is given as `count[t]` entries starting at `offset[t]` in a
//   flat int32 array of physical pool rows (`rows`). Queries of one sequence share one map, so the
//   plan is O(rows of the sequence), not O(S · keys).
// - Ops never fail on valid plans; plans are built by the model and checked there. Sizes are in
//   elements unless a name says `_bytes`.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/copy_segment.h"
#include "base/dtype.h"

namespace v4 {
class ThreadPool;
}

// Small helpers usable from CUDA kernels too.
#if defined(__CUDACC__)
#define V4_HOST_DEVICE __host__ __device__
#else
#define V4_HOST_DEVICE
#endif

namespace v4::ops {

/// Router activation (config `scoring_func`), dsv4-model.md §8.
enum class ScoringFunc { kSqrtSoftplus, kSoftmax, kSigmoid };

/// Storage format of a weight matrix as the backend reads it (docs/checkpoint-format.md).
/// The CPU backend stores every matrix as kF32 (decoded at load); the CUDA backend keeps the
/// checkpoint's format (FP8 blocks, MXFP4 experts, BF16) so decode reads native bytes.
enum class WFormat : int {
  kF32 = 0,   // f32 values [E, N, K]
  kBF16 = 1,  // bf16 bits [E, N, K]
  kFP8Block = 2,  // e4m3fn bytes [E, N, K]; scale f32 [E, ceil(N/128), ceil(K/128)]
  kMXFP4 = 3,     // packed e2m1 [E, N, K/2] (low nibble = even k); scale ue8m0 bytes [E, N, K/32]
};
/// "f32", "bf16", "fp8-block", "mxfp4".
const char* wformat_name(WFormat f);
/// Bytes of one stored matrix of `n` rows × `k` columns in format `f` (data + scales).
int64_t wformat_bytes(WFormat f, int64_t n, int64_t k);

/// A weight matrix W [N, K] (row n = output channel n), or a stack of `experts` of them.
/// Dequantized values: kFP8Block W[n,k] = e4m3(data[n,k]) · scale[n/128, k/128];
/// kMXFP4 W[n,k] = e2m1(nibble(n,k)) · 2^(scale[n, k/32] − 127). Scales are indexed with the
/// absolute row `row0 + n` of the stored matrix (`rows_total` rows per expert), so a view can
/// select rows [row0, row0 + n) of a larger matrix (wo_a's groups) without copying.
struct WeightView {
  const void* data = nullptr;   // start of the stored matrix (expert 0, row 0)
  const void* scale = nullptr;  // kFP8Block / kMXFP4 only
  WFormat format = WFormat::kF32;
  int64_t n = 0, k = 0;         // rows and columns of the view (per expert)
  int64_t experts = 1;          // E
  int64_t row0 = 0;             // first stored row of the view
  int64_t rows_total = 0;       // stored rows per expert (>= row0 + n)
  /// Rows [r0, r0 + nr) of this view.
  V4_HOST_DEVICE WeightView rows(int64_t r0, int64_t nr) const {
    WeightView v = *this;
    v.row0 = row0 + r0;
    v.n = nr;
    return v;
  }
  /// A plain f32 matrix [n, k] (contiguous).
  static WeightView f32(const float* w, int64_t n, int64_t k) {
    WeightView v;
    v.data = w;
    v.n = n;
    v.k = k;
    v.rows_total = n;
    return v;
  }
  /// f32 pointer to row 0 of the view (kF32 only, expert `e`).
  V4_HOST_DEVICE const float* f32_rows(int64_t e = 0) const {
    return static_cast<const float*>(data) + (e * rows_total + row0) * k;
  }
};

/// A ragged list of physical pool rows per query row (see "Row maps" above).
/// Query t reads rows[offset[t] + j] for j < count[t]; entries < 0 are skipped.
struct RowMap {
  const int32_t* rows = nullptr;
  const int64_t* offset = nullptr;  // [S]
  const int32_t* count = nullptr;   // [S]
};

/// Arguments of `Ops::sparse_attention` (dsv4-model.md §4, "Scores and softmax").
/// For query row t and head h: keys = SWA rows of `swa` ∪ compressed rows of `comp`, one softmax
/// with the per-head sink in the denominator only (unscaled raw logit), K = V (single latent).
///   l_j = (q[t,h] · key_j) · scale;  p_j = exp(l_j) / (Σ exp(l) + exp(sinks[h]));
///   out[t,h] = Σ_j p_j · key_j
struct AttentionArgs {
  const float* q = nullptr;          // [S, H, hd]
  const float* sinks = nullptr;      // [H]
  const void* swa_pool = nullptr;   // [swa pool rows, hd] of kv_dtype (K = V rows, normed + roped)
  RowMap swa;                       // SWA key rows per query (W tokens incl. itself)
  const void* comp_pool = nullptr;  // [comp pool rows, hd] of kv_dtype or nullptr (sliding-only)
  RowMap comp;                       // compressed rows per query (CSA: top-k; HCA: all causal)
  int64_t n_rows = 0;                // S
  int n_heads = 0;                   // H
  int head_dim = 0;                  // hd
  float scale = 0.f;                 // hd^-1/2
  /// Upper bound of swa.count[t] + comp.count[t] over the call, known to the planner (0 =
  /// unknown). Lets a backend split long key lists across thread blocks without reading counts.
  int64_t max_keys = 0;
  /// Element type of both pools (bf16 rows are widened to f32 on read, fp8 rows dequantized
  /// (kvfp8::dequantize_row); math stays f32).
  KvDtype kv_dtype = KvDtype::kF32;
  /// Trailing rope channels of a row: kFp8 rows are kv_fp8_layout(head_dim, rope_dim).
  int rope_dim = 0;
  float* out = nullptr;              // [S, H, hd]
};

/// Arguments of `Ops::compress_pool` (dsv4-model.md §5): one pooled, un-normalized compressed
/// row per output. Each output reads `n_slots` source slots; n_slots = m for the non-overlapping
/// compressor (HCA, overlap=1) and 2m for the overlapping one (CSA / indexer, overlap=2).
/// Slot j of output r is src[r·n_slots + j]:  v >= 0 → fresh row v; v <= -2 → state row
/// (-v - 2); v == -1 → empty (excluded from the softmax, HF's gate −inf / kv 0).
/// overlap=2: slots [0,m) use channels [0,d) and bias row j (series a: previous window),
/// slots [m,2m) use channels [d,2d) and bias row j−m (series b: own window).
/// overlap=1: slot j uses channels [0,d) and bias row j.
///   out[r, ch] = Σ_j softmax_j(gate_j[ch] + bias[..,ch]) · kv_j[ch]   (fp32 softmax per channel)
/// Gates are stored raw (without bias); the op adds the bias of the slot's role.
struct CompressArgs {
  const float* fresh_kv = nullptr;    // [n_fresh, c·d]  this step's Kc = x·W_ckvᵀ
  const float* fresh_gate = nullptr;  // [n_fresh, c·d]  this step's Zc = x·W_cgᵀ
  const float* state_kv = nullptr;    // [state rows, c·d] compressor-state ring rows
  const float* state_gate = nullptr;  // [state rows, c·d]
  const float* bias = nullptr;        // [m, c·d]  position_bias (official `ape`)
  const int32_t* src = nullptr;       // [n_out, n_slots]
  int64_t n_out = 0;
  int ratio = 0;         // m
  int overlap = 1;       // c: 1 (HCA) or 2 (CSA, indexer)
  int dim = 0;           // d
  float* out = nullptr;  // [n_out, d]
};

/// Arguments of `Ops::compress_fused` (dsv4-model.md §5): one compressor step after the two
/// projections — pool the windows that close (as `compress_pool`), RMSNorm them with `norm`,
/// RoPE the trailing `rope_dim` channels at `positions` (as `rope`, one head of width d), store
/// them into `pool` at `dst`, then refresh the compressor-state ring from this step's fresh rows.
///   rows[r]  = rope(rms_norm(compress_pool(src[r])) ⊙ norm, positions[r])   r < n_out
///   pool[dst[r], :] = rows[r]                          (dst[r] < 0: skipped)
///   state_kv[ring_dst[i], :]   = fresh_kv[ring_src[i], :]     i < n_ring (ring_dst[i] < 0: skipped)
///   state_gate[ring_dst[i], :] = fresh_gate[ring_src[i], :]
/// Ordering: every state row the pooling reads is read BEFORE any ring row is written (a ring
/// row refreshed by this call may also be a state slot of one of its windows, e.g. a prefill chunk
/// longer than c·m tokens), i.e. the result equals the sequence above run op after op.
/// All f32; c = overlap, m = ratio, d = dim. `scratch` is used only by the default (composed)
/// implementation: ≥ max(n_out·d, n_ring·c·d) floats of backend memory; nullptr → the default
/// allocates and frees it (not allowed under graph capture). Backends overriding the op with a
/// fused kernel ignore it and neither allocate nor synchronize.
/// CUDA: the plan arrays (src, positions, dst, ring_src, ring_dst), norm and inv_freq must not be
/// written by the kernel issued immediately before the call on the same stream (they are read
/// while that kernel may still be running: programmatic dependent launch); the fresh rows, the
/// state ring and the pool may be (the model's predecessor is the zc projection).
struct CompressFusedArgs {
  const float* fresh_kv = nullptr;    // [n_fresh, c·d]  Kc = x·W_ckvᵀ of this step
  const float* fresh_gate = nullptr;  // [n_fresh, c·d]  Zc = x·W_cgᵀ of this step
  float* state_kv = nullptr;          // [ring rows, c·d] compressor-state ring (read, then updated)
  float* state_gate = nullptr;        // [ring rows, c·d]
  const float* bias = nullptr;        // [m, c·d]  position_bias (`ape`)
  const float* norm = nullptr;        // [d]  compressor RMSNorm weight (nullptr = unweighted)
  float eps = 1e-6f;                  // RMSNorm epsilon
  const int32_t* src = nullptr;       // [n_out, c·m]  slots as CompressArgs::src
  const int64_t* positions = nullptr; // [n_out]  rope position w·m of each window
  const int32_t* dst = nullptr;       // [n_out]  pool row per output, −1 = skip
  int64_t n_out = 0;
  const int32_t* ring_src = nullptr;  // [n_ring]  fresh row to keep as state
  const int32_t* ring_dst = nullptr;  // [n_ring]  ring row it goes to, −1 = skip
  int64_t n_ring = 0;
  int ratio = 0;                      // m
  int overlap = 1;                    // c: 1 (HCA) or 2 (CSA, indexer)
  int dim = 0;                        // d
  int rope_dim = 0;                   // rd: trailing channels rotated (even, ≤ d)
  const float* inv_freq = nullptr;    // [rd/2]
  float attention_scaling = 1.f;
  void* pool = nullptr;               // [pool rows, d] of pool_dtype: compressed (or indexer) pool
  KvDtype pool_dtype = KvDtype::kF32; // rows are converted on store (bf16: round-to-nearest-even;
                                      // fp8: kv_fp8_layout(dim, rope_dim) rows, store_rows_kv;
                                      // kFp8Index: indexer-key rows, kv_fp8_index_layout(dim))
  float* scratch = nullptr;           // default implementation only (see above)
  /// The caller's promise that no ring row refreshed by this call (ring_dst) is a state slot of
  /// any window (src), so the Ordering rule above holds for any interleaving: a backend may then
  /// refresh the ring concurrently with the pooling (CUDA: one launch instead of two). True for
  /// decode steps with one token per sequence (the ring row of position p is the one of p − c·m,
  /// outside p's window); host plans can test it with `compress_ring_disjoint`. A wrong `true`
  /// gives undefined pooled values; `false` is always correct.
  bool ring_disjoint = false;
  /// Launch-shape hint: every output row closes a window (host-planned prefill chunks list only
  /// closing rows; device-planned decode steps have one row per sequence, most with dst = −1).
  /// A backend may then shape its launch for throughput instead of latency (CUDA: 128-thread
  /// CTAs for C128 windows). Results do not depend on it.
  bool rows_close = false;
  /// The pooling part as `compress_pool` arguments, writing to `out`.
  CompressArgs pool_args(float* out) const {
    CompressArgs c;
    c.fresh_kv = fresh_kv;
    c.fresh_gate = fresh_gate;
    c.state_kv = state_kv;
    c.state_gate = state_gate;
    c.bias = bias;
    c.src = src;
    c.n_out = n_out;
    c.ratio = ratio;
    c.overlap = overlap;
    c.dim = dim;
    c.out = out;
    return c;
  }
};

/// Arguments of `Ops::compress_project`: one compressor step INCLUDING its two projections
/// (dsv4-model.md §5): kc = x·W_kvᵀ, zc = x·W_gᵀ for the step's n_fresh rows, then
/// `compress_fused(step)` with step.fresh_kv = kc and step.fresh_gate = zc.
struct CompressProjectArgs {
  const float* x = nullptr;  // [n_fresh, D] layer input rows, row stride ldx (floats)
  int64_t ldx = 0;
  int64_t n_fresh = 0;       // S
  WeightView wkv;            // [c·d, D]
  WeightView wgate;          // [c·d, D]
  float* kc = nullptr;       // [n_fresh, c·d] out (row stride c·d)
  float* zc = nullptr;       // [n_fresh, c·d] out
  CompressFusedArgs step;    // the pooling step; its fresh_kv / fresh_gate are ignored
};

/// Whether no ring row of `ring_dst` [n_ring] (−1 = skipped) is a state slot (v ≤ −2 → row −v−2)
/// of `src` [n_src] (host arrays of a CompressFusedArgs plan), i.e. whether `ring_disjoint` may be
/// set. O((n_src + n_ring)·log n_ring).
inline bool compress_ring_disjoint(const int32_t* src, int64_t n_src, const int32_t* ring_dst,
                                   int64_t n_ring) {
  std::vector<int32_t> w;
  w.reserve(size_t(n_ring));
  for (int64_t i = 0; i < n_ring; ++i)
    if (ring_dst[i] >= 0) w.push_back(ring_dst[i]);
  if (w.empty()) return true;
  std::sort(w.begin(), w.end());
  for (int64_t j = 0; j < n_src; ++j)
    if (src[j] <= -2 && std::binary_search(w.begin(), w.end(), -(src[j] + 2))) return false;
  return true;
}

/// Arguments of `Ops::indexer_topk` (dsv4-model.md §6, lightning indexer).
///   score(t, s) = Σ_h (ReLU(q[t,h] · K[s]) · dI^-1/2) · (w[t,h] · nI^-1/2)
/// over the candidate rows of query t (row map `cand`, logical order = map order), then selects
/// the top min(k, count[t]) candidates. Deterministic selection: higher score first; equal scores
/// → earlier map position (= lower compressed-row index) first. Output rows are the selected
/// candidates' physical pool rows in ascending map position (not score) order — what the top-k
/// kernel emits, so no sort after the selection, and attention gathers pages in order; unused
/// entries are −1.
struct IndexerArgs {
  const float* q = nullptr;         // [S, nI, dI] (roped)
  const float* weights = nullptr;   // [S, nI] raw weights_proj output (op applies nI^-1/2)
  const void* key_pool = nullptr;   // [pool rows, dI] of key_dtype
  KvDtype key_dtype = KvDtype::kF32;  // bf16 keys are widened to f32 on read; kFp8Index rows
                                      // (kv_fp8_index_layout(dI)) read as code value · scale,
                                      // and then q[t,h] is quantized per head too (one e4m3
                                      // block, scale amax / 448, codes of x · (1/scale) —
                                      // a product, ±Inf saturating: kvfp8::index_query_fp8)
  RowMap cand;
  int64_t n_rows = 0;            // S
  int n_heads = 0;               // nI
  int head_dim = 0;              // dI
  int topk = 0;                  // index_topk
  /// Upper bound of cand.count[t] over the call, known to the planner (0 = unknown: the
  /// backend may read the counts back, which a CUDA graph capture cannot do).
  int64_t max_count = 0;
  int32_t* out_rows = nullptr;   // [S, topk]
  int32_t* out_count = nullptr;  // [S] number of valid entries (min(k, count[t]))
  /// Step profile (Ops::region): a backend that runs the scores and the selection as separate
  /// kernels marks this region between them (nullptr: no marker).
  const char* topk_region = nullptr;
  /// Multi-stream steps (Ops::fork): a branch of the current fork whose ops issued after this
  /// call may be made to wait for the scores (not for the selection), so that they overlap the
  /// top-k rather than the scores pass; −1: none. A scheduling hint only (results unchanged);
  /// backends without concurrent branches ignore it (CUDA: CudaOptions::indexer_gate_min_count).
  int after_scores_branch = -1;
};

/// Arguments of `Ops::route` (dsv4-model.md §8).
///   s = score_fn(logits);  idx = top-k(s + bias) (score layers) or tid2eid[token] (hash layers);
///   wgt = s[idx] / (Σ s[idx] + 1e-20) · routed_scaling_factor.
/// Top-k ties: higher value first, equal → lower expert id first.
struct RouteArgs {
  const float* logits = nullptr;       // [S, E]  x · W_gateᵀ
  const float* bias = nullptr;         // [E] e_score_correction_bias (selection only) or nullptr
  const int32_t* tid2eid = nullptr;    // [V, k] hash table or nullptr (score routing)
  const int32_t* token_ids = nullptr;  // [S] (hash routing only)
  int64_t n_rows = 0;                  // S
  int n_experts = 0;                   // E
  int topk = 0;                        // k
  ScoringFunc scoring = ScoringFunc::kSqrtSoftplus;
  float routed_scaling_factor = 1.f;
  int32_t* out_idx = nullptr;   // [S, k]
  float* out_weight = nullptr;  // [S, k]
};

/// Arguments of `Ops::moe_experts` (dsv4-model.md §8):
///   out[t] = Σ_j weight[t,j] · W2_e · (silu(min(W1_e x, limit)) ⊙ clamp(W3_e x, −limit, limit)),
///   e = idx[t,j]; duplicates each count. Summation over j in order j = 0..k−1.
/// Expert weights are fused as in HF: w13[e] rows [0,I) = W1 (gate), rows [I,2I) = W3 (up).
/// The shared expert is this op with E = 1, k = 1, weight 1.
struct MoeArgs {
  const float* x = nullptr;       // [S, D]
  WeightView w13;                 // E experts of [2I, D]
  WeightView w2;                  // E experts of [D, I]
  const int32_t* idx = nullptr;   // [S, k]
  const float* weight = nullptr;  // [S, k]
  int64_t n_rows = 0;
  int hidden = 0;            // D
  int inter = 0;             // I
  int n_experts = 0;         // E
  int topk = 0;              // k
  float swiglu_limit = 0.f;  // <= 0: no clamp
  float* out = nullptr;      // [S, D] (overwritten)
};

/// mHC coefficient arguments (dsv4-model.md §3) for `Ops::hc_pre`.
struct HcArgs {
  const float* h = nullptr;      // [S, n, D] residual streams
  const float* fn = nullptr;     // [(2+n)·n, n·D]
  const float* base = nullptr;   // [(2+n)·n]
  const float* scale = nullptr;  // [3]
  int64_t n_rows = 0;
  int n_streams = 0;  // n
  int hidden = 0;     // D
  float rms_eps = 0.f;
  float hc_eps = 0.f;
  int sinkhorn_iters = 0;
  float* collapsed = nullptr;  // [S, D]  Σ_s pre[s]·h[s]
  float* post = nullptr;       // [S, n]  2·sigmoid(..)
  float* comb = nullptr;       // [S, n, n] Sinkhorn-normalized, comb[j][k]
};

/// One row's parameters of `Ops::sample` (device array [R]; 40 bytes, the same layout on host
/// and device). Same meaning as engine::SamplingParams for a request without penalties.
struct SampleRowParams {
  uint64_t seed = 0;        // the request's seed
  int64_t step = 0;         // index of the token being generated (0 = first)
  float temperature = 0.f;  // 0 = greedy (argmax); > 0 divides the logits
  float top_p = 1.f;        // nucleus mass in (0, 1]; 1 = off
  float min_p = 0.f;        // in [0, 1]; 0 = off
  int32_t top_k = 0;        // <= 0 or >= V = off
  int32_t logprobs = 0;     // non-zero: fill this row's logprob outputs (when given)
  int32_t reserved = 0;
};
static_assert(sizeof(SampleRowParams) == 40, "SampleRowParams layout is shared with the device");

/// Arguments of `Ops::sample`: one token per row of logits, chosen exactly as the CPU sampler
/// (engine/sampler.h, sample_token) does for a request without penalties:
/// temperature == 0 → argmax (lowest id on ties; NaN ignored; an all-NaN row gives 0).
/// Otherwise x = logit / T (as logit · fl(1/T), NaN → −inf) → top-k → top-p (the shortest prefix
/// of the (x desc, id asc) order whose mass reaches top_p · mass) → min-p (keep w ≥ min_p, w =
/// exp(x − max x)) → one draw u = sample_uniform(seed, step) (ops/sample_math.h) walked over
/// the kept tokens in that order (in id order when neither top-k nor top-p is on). A row whose
/// max x is not finite gives the argmax of x. Logprobs are log-softmax of the RAW logits.
/// A row's result depends only on that row (batch-invariant).
struct SampleArgs {
  const float* logits = nullptr;            // [R, V] f32, row stride V
  const SampleRowParams* params = nullptr;  // [R]; may be nullptr when all_greedy
  int64_t n_rows = 0;                       // R
  int64_t vocab = 0;                        // V
  /// Host hint: every row is greedy (temperatures are not read; only the argmax runs).
  bool all_greedy = false;
  int32_t* out_tokens = nullptr;  // [R]
  // Optional raw logprobs, for the rows whose params.logprobs != 0 (every row when params is
  // nullptr); other rows' entries are left untouched. out_logprob == nullptr: none at all.
  float* out_logprob = nullptr;       // [R] logprob of the chosen token
  int32_t top_n = 0;                  // 0..20 most likely raw tokens per row
  int32_t* out_top_tokens = nullptr;  // [R, top_n] descending logit, lower id first on ties
  float* out_top_logprobs = nullptr;  // [R, top_n]; -1 / NaN past the vocabulary
};

// ---- dummy weights, memory and device queries (v4serve bench, --load-format dummy) ----------
/// What `Ops::fill_random` writes; the exact generator is src/ops/fill_random.h (counter-based, so
/// the CPU and CUDA backends give identical bytes for the same seed). "normal" = approximately
/// N(0, scale²) (Irwin–Hall sum of four uniforms, bounded at ±3.46·scale).
enum class RandomFill : int {
  kF32Normal = 0,    // f32 normal · scale
  kF32Constant = 1,  // f32 = scale
  kBF16Normal = 2,   // bf16 bits of normal · scale (round to nearest even)
  kE4M3Normal = 3,   // FP8 e4m3fn bytes of normal · scale (RNE, saturating ±448; no NaN codes)
  kE2M1Packed = 4,   // bytes of two uniformly random FP4 e2m1 codes (all 16 codes)
  kUe8m0 = 5,        // ue8m0 bytes 127 + round(log2(scale)) + {−1, 0, +1} (uniform jitter)
  kI32Uniform = 6,   // int32 uniform in [0, scale) (e.g. a hash-routing table tid2eid)
};
/// Device memory of a backend, in bytes (CPU: MemAvailable / MemTotal of /proc/meminfo).
struct MemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

// ---- decode plans built on the backend, CUDA graphs (docs/cuda.md §Graphs, docs/model.md) ------
/// One compression rate's part of a decode plan (`DecodePlanArgs`); every array has the fixed
/// capacity B (the bucket), row b describes batch row b. A row "closes" window w = pos / m iff
/// (pos + 1) % m == 0; rows that do not close get dst −1 (store_rows skips it), src all −1 (the
/// pooled row is 0) and position 0.
struct DecodePlanRate {
  int ratio = 0;             // m
  int overlap = 1;           // c: 1 (HCA) or 2 (CSA + indexer); ring rows per sequence = c·m
  int64_t cand_stride = 0;   // per-row capacity of cand_rows, ≥ (pos + 1) / m for every row
  int32_t* src = nullptr;          // [B, c·m] CompressArgs::src of the closing window
  int64_t* positions = nullptr;    // [B] rope position w·m of the closing window
  int32_t* dst = nullptr;          // [B] compressed-pool row of the closing window, or −1
  int32_t* ring_src = nullptr;     // [B] = b (the row's fresh kv/gate)
  int32_t* ring_dst = nullptr;     // [B] ring row of pos (slot·c·m + pos % (c·m)), −1 for padding
  int32_t* cand_rows = nullptr;    // [B, cand_stride] compressed rows of entries e < cand_count[b]
  int64_t* cand_offset = nullptr;  // [B] = b·cand_stride
  int32_t* cand_count = nullptr;   // [B] = (pos + 1) / m, 0 for padding
};

/// Arguments of `Ops::build_decode_plan`: a decode step (one new token per sequence) planned on
/// the backend from raw batch state, so the step needs no host planning and a graph can replay it.
/// Phase 1 applies page-table updates: for r < delta_count[0], table row delta_seq[r] becomes
/// delta_rows[r] = [P virtual pages, P SWA pages]. Phase 2 writes, for every row b < B, the maps
/// the host planner builds (model/step_plan.h), at fixed capacity and fixed strides:
///   positions[b] = pos;  swa_dst[b] = SWA row of pos;  SWA keys = rows of positions
///   max(0, pos−W+1)..pos (count min(W, pos+1), stride W);  per rate the pooling plan, ring
///   update and candidate map (DecodePlanRate);  topk_offset[b] = b·topk.
/// Addressing (cache/pools.h): SWA row of p = swa_page[p / ps]·ps + p % ps (−1 if freed);
/// compressed row of entry e = (page[e·m / ps]·ps + e·m % ps) / m; ring row = slot·c·m + p % (c·m).
/// Padding rows (seq < 0): counts 0, dst/swa_dst/ring_dst −1, position 0. Entries past a row's
/// count are not written.
struct DecodePlanArgs {
  int64_t n_rows = 0;              // B
  const int32_t* seq = nullptr;    // [B] page-table row of the row's sequence, −1 = padding
  const int32_t* slot = nullptr;   // [B] compressor-state ring slot
  const int32_t* pos = nullptr;    // [B] position of the row's new token
  int32_t* page_table = nullptr;   // [rows, P] virtual page per logical page (−1 none)
  int32_t* swa_table = nullptr;    // [rows, P] SWA page per logical page (−1 freed)
  int64_t max_pages = 0;           // P
  int page_size = 0;               // ps
  int window = 0;                  // W
  const int32_t* delta_count = nullptr;  // [1] (backend memory: read by the backend)
  const int32_t* delta_seq = nullptr;    // [delta_cap]
  const int32_t* delta_rows = nullptr;   // [delta_cap, 2·P]
  int64_t delta_cap = 0;                 // ≥ delta_count[0]
  int64_t* positions = nullptr;    // [B]
  int32_t* swa_dst = nullptr;      // [B]
  int32_t* swa_rows = nullptr;     // [B, W]
  int64_t* swa_offset = nullptr;   // [B] = b·W
  int32_t* swa_count = nullptr;    // [B]
  int n_rates = 0;                 // ≤ 2
  DecodePlanRate rates[2];
  int topk = 0;                    // index_topk (topk_offset only)
  int64_t* topk_offset = nullptr;  // [B] or nullptr
};

/// A recorded sequence of backend work (`Ops::capture`), replayed with the same arguments and
/// addresses. Replays are queued in order with other backend work (like a launch).
class Graph {
 public:
  virtual ~Graph() = default;
  virtual void replay() = 0;
};

/// GPU time around model steps (Ops::step_begin / step_end), for the overlap of host work with
/// device work (/metrics v4_gpu_*). `idle` = device time between one step's end marker and the
/// next step's begin marker (host scheduling, planning and sampling that the device waits for);
/// `decode_*` counts only gaps between two consecutive decode-only steps. Seconds.
struct StepTiming {
  int64_t steps = 0;
  double busy_s = 0, idle_s = 0;
  int64_t decode_steps = 0;
  double decode_busy_s = 0, decode_idle_s = 0;
  /// Of decode_idle_s: host time the model spent inside forward before those steps' begin
  /// markers (validation, KV reserve, decode staging; Ops::note_host_prep). The rest of the
  /// idle time is outside the model (engine, scheduler, outputs, the previous step's sync).
  double decode_host_prep_s = 0;
  /// Host wall time from the previous step's end marker (after its sync returned) to these
  /// steps' begin markers: the host side of decode_idle_s. decode_idle_s well above it means
  /// device work outside the markers (copies between steps, another stream) delayed the step.
  double decode_host_gap_s = 0;
};

/// Backend interface. One instance per device; not thread-safe (one forward at a time).
class Ops {
 public:
  virtual ~Ops() = default;
  /// "cpu" or "cuda".
  virtual std::string name() const = 0;

  // ---- memory -------------------------------------------------------------------------------
  /// Allocates `bytes` of backend memory; contents unspecified (callers write before reading).
  /// Never returns nullptr for bytes > 0 (throws std::bad_alloc on exhaustion; callers size pools
  /// from a budget first).
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* ptr) = 0;
  /// Host → backend and backend → host copies (synchronous).
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  /// Waits for all queued work.
  virtual void synchronize() = 0;

  // ---- dense -------------------------------------------------------------------------------
  /// y[i, :] = x[i, :] · wᵀ for i < M.  x [M, K] (row stride ldx), w [N, K] (contiguous),
  /// y [M, N] (row stride ldy). Row i's result depends only on x[i] and w (batch-invariant).
  virtual void linear(const float* x, int64_t ldx, const float* w, int64_t M, int64_t N, int64_t K,
                      float* y, int64_t ldy) = 0;
  /// Whether `linear_w` / `moe_experts` accept weights stored as `f` (kF32 always).
  virtual bool supports(WFormat f) const { return f == WFormat::kF32; }
  /// y[i, :] = x[i, :] · Wᵀ for i < M with W = w (one matrix, w.experts ignored: expert 0),
  /// dequantized as WeightView says; x [M, w.k] (stride ldx), y [M, w.n] (stride ldy).
  /// Default: kF32 views through `linear`; other formats need a backend that supports them.
  virtual void linear_w(const float* x, int64_t ldx, const WeightView& w, int64_t M, float* y,
                        int64_t ldy);
  /// Grouped linear (the o-projection's wo_a, dsv4-model.md §4): with n = w.n / groups and
  /// K = w.k, for g < groups: y[:, g·n, (g+1)·n) = x[:, g·K, (g+1)·K) · W_gᵀ where W_g = rows
  /// [g·n, (g+1)·n) of w. x [M, ldx ≥ groups·K], y [M, ldy ≥ groups·n]; w.n % groups == 0.
  /// Default: one linear_w per group (a backend may run all groups in one launch).
  virtual void linear_w_grouped(const float* x, int64_t ldx, const WeightView& w, int groups,
                                int64_t M, float* y, int64_t ldy);
  /// y = x + y elementwise over n values.
  virtual void add(float* y, const float* x, int64_t n) = 0;
  /// dst[i, :] = src[rows[i], :] for i < n (width values per row).
  virtual void gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t width,
                           float* dst) = 0;
  /// pool[rows[i], :] = src[i, :] for i < n with rows[i] >= 0 (scatter into a cache pool).
  virtual void store_rows(float* pool, const int32_t* rows, int64_t n, int64_t width,
                          const float* src) = 0;
  /// store_rows into a KV pool of element type `dtype` (pool [pool rows, width] of dtype, src
  /// [n, width] f32): kF32 copies, kBf16 rounds to nearest even (f32_to_bf16), kFp8 writes
  /// kv_fp8_layout(width, rope_dim) rows (kvfp8::quantize_row, base/kv_fp8.h: e4m3 nope +
  /// per-64 f32 scales + bf16 rope; `rope_dim` = trailing rope channels, kFp8 only), kFp8Index
  /// writes kv_fp8_index_layout(width) rows (kvfp8::quantize_index_row: width e4m3 codes + one
  /// f32 scale; width % 16 == 0). Default: kF32 through store_rows; other dtypes throw std::invalid_argument (backends with such
  /// pools override it).
  virtual void store_rows_kv(void* pool, KvDtype dtype, const int32_t* rows, int64_t n,
                             int64_t width, const float* src, int rope_dim = 0);
  /// Whether KV pools of `dtype` work on this backend end to end (store_rows_kv,
  /// compress_fused, indexer_topk, sparse_attention). Default: kF32 only.
  virtual bool supports_kv_dtype(KvDtype dtype) const { return dtype == KvDtype::kF32; }

  // ---- model steps -------------------------------------------------------------------------
  /// out[t, s, :] = table[ids[t], :] for every stream s < n.  table [V, D], out [S, n, D].
  virtual void embed(const float* table, const int32_t* ids, int64_t S, int D, int n_streams,
                     float* out) = 0;
  /// y[r] = weight ⊙ x[r] / sqrt(mean(x[r]²) + eps) (weight nullptr → unweighted), fp32.
  /// x, y [rows, dim]; y may equal x.
  virtual void rms_norm(const float* x, const float* weight, int64_t rows, int dim, float eps,
                        float* y) = 0;
  /// Interleaved RoPE in place on the trailing `rope_dim` channels of each head
  /// (dsv4-model.md §4 "RoPE"): pair (2i, 2i+1) rotated by φ = fp32(inv_freq[i]·pos[r]),
  /// cos/sin multiplied by `attention_scaling`; `inverse` rotates by −φ.
  /// x [rows, n_heads, head_dim], positions [rows] (int64), inv_freq [rope_dim/2].
  virtual void rope(float* x, int64_t rows, int n_heads, int head_dim, int rope_dim,
                    const int64_t* positions, const float* inv_freq, float attention_scaling,
                    bool inverse) = 0;
  /// Per-head RMSNorm then RoPE, in place on x [rows, n_heads, head_dim]: every head vector
  /// x[r, h] = rms_norm(x[r, h], weight, eps) (weight [head_dim], nullptr = unweighted), then
  /// rope(x, rows, n_heads, head_dim, rope_dim, positions, inv_freq, attention_scaling, false).
  /// Default: rms_norm over rows·n_heads rows + rope; the CUDA backend runs one kernel.
  virtual void rms_norm_rope(float* x, const float* weight, int64_t rows, int n_heads,
                             int head_dim, float eps, int rope_dim, const int64_t* positions,
                             const float* inv_freq, float attention_scaling);
  /// mHC pre: coefficients (pre, post, comb with Sinkhorn) and the collapsed input.
  virtual void hc_pre(const HcArgs& a) = 0;
  /// mHC post: h[t, k] = post[t, k]·f[t] + Σ_j comb[t, j, k]·h[t, j]  (in place on h [S, n, D]).
  virtual void hc_post(float* h, const float* f, const float* post, const float* comb, int64_t S,
                       int n_streams, int D) = 0;
  /// HyperHead: y[t] = Σ_s (sigmoid((RMS(flat)·fnᵀ)[s]·scale + base[s]) + hc_eps)·h[t, s].
  /// fn [n, n·D], base [n], scale [1], y [S, D].
  virtual void hc_head(const float* h, const float* fn, const float* base, const float* scale,
                       int64_t S, int n_streams, int D, float rms_eps, float hc_eps, float* y) = 0;
  /// mHC pre followed by the RMSNorm of the collapsed stream (the layer's attn_norm / ffn_norm):
  /// hc_pre(a), then x = rms_norm(a.collapsed, norm_weight, norm_eps). norm_weight [D] (nullptr:
  /// unweighted), x [S, D] (may equal a.collapsed). Default: those two ops; the CUDA backend runs
  /// one kernel (docs/cuda.md §mHC).
  virtual void hc_pre_norm(const HcArgs& a, const float* norm_weight, float norm_eps, float* x);
  /// mHC post after an add: f += f_add, then hc_post(h, f, ...). f [S, D] is scratch (its content
  /// afterwards is unspecified: the default leaves the sum there, the CUDA kernel leaves f as it
  /// was). Default: add + hc_post; the CUDA backend runs one kernel.
  virtual void hc_post_add(float* h, float* f, const float* f_add, const float* post,
                           const float* comb, int64_t S, int n_streams, int D);
  /// HyperHead followed by the final RMSNorm: hc_head(..., y), then y = rms_norm(y, norm_weight,
  /// norm_eps). Default: those two ops; the CUDA backend runs one kernel.
  virtual void hc_head_norm(const float* h, const float* fn, const float* base, const float* scale,
                            int64_t S, int n_streams, int D, float rms_eps, float hc_eps,
                            const float* norm_weight, float norm_eps, float* y);
  virtual void compress_pool(const CompressArgs& a) = 0;
  /// One compressor step after the projections (CompressFusedArgs): pool, norm, rope, store,
  /// ring refresh. Default: composed of compress_pool, rms_norm, rope, store_rows and
  /// gather_rows/store_rows (the reference); the CUDA backend runs two kernels (FlashCompressor,
  /// docs/cuda.md).
  virtual void compress_fused(const CompressFusedArgs& a);
  /// One compressor step with its projections (CompressProjectArgs). Default: linear_w (kc),
  /// linear_w (zc), compress_fused. CUDA bf16 mode, decode-sized steps with bf16 weights and
  /// ring_disjoint: one projection kernel that also refreshes the ring, then the pooling kernel
  /// (docs/cuda.md §"FlashCompressor with its projections"); x is then rounded to bf16.
  virtual void compress_project(const CompressProjectArgs& a);
  virtual void indexer_topk(const IndexerArgs& a) = 0;
  virtual void sparse_attention(const AttentionArgs& a) = 0;
  virtual void route(const RouteArgs& a) = 0;
  /// Markers around one model step's device work: `step_begin` right before its first device
  /// operation (after host planning), `step_end` after its last result reached the host.
  /// Backends without timers ignore them (CPU).
  virtual void step_begin(bool decode_only) { (void)decode_only; }
  /// The model's host time (seconds) inside forward before the coming step_begin, reported right
  /// before it (StepTiming::decode_host_prep_s). Backends without timers ignore it.
  virtual void note_host_prep(double seconds) { (void)seconds; }
  virtual void step_end() {}
  /// Totals since creation (all zero on backends without timers). Thread-safe.
  virtual StepTiming step_timing() const { return {}; }
  /// Names the device work issued from now until the next `region` call or `step_end` (an
  /// NVTX-style range without a pop), for the per-region step profile. `name` must outlive the
  /// backend (a string literal). Ignored unless profiling is on; works inside graph capture (the
  /// marker becomes part of the graph and is timed on every replay).
  virtual void region(const char* name) { (void)name; }
  /// Turns the per-region profile on or off (off by default; on costs one event per region).
  /// Returns false on backends without device timers (CPU).
  virtual bool set_profiling(bool on) {
    (void)on;
    return false;
  }
  /// Device time per region name summed over profiled steps since the last reset. `calls` counts
  /// region entries (a name entered once per layer counts once per layer), `ms` is milliseconds
  /// between its marker and the next marker (or the step's end), so regions tile the step from
  /// its first marker. Work between `step_begin` and the first marker is "(before first region)".
  struct RegionTime {
    std::string name;
    int64_t calls = 0;
    double ms = 0;
  };
  virtual std::vector<RegionTime> region_profile() const { return {}; }
  virtual void reset_region_profile() {}
  /// Starts (on = true) or stops the span an external profiler records when it is told to wait
  /// for one (Nsight Compute `--profile-from-start off`; CUDA: cudaProfilerStart / Stop). Lets a
  /// bench profile one chosen step instead of the weight generation and warm-up before it.
  /// Default: nothing (the CPU backend has no such profiler).
  virtual void profiler_range(bool on) { (void)on; }
  virtual void moe_experts(const MoeArgs& a) = 0;

  // ---- dummy weights, memory and device queries ------------------------------------------
  /// Writes `n` stored units of `kind` (f32 / bf16 / int32 values, or bytes for the 8-bit kinds;
  /// kE2M1Packed: n bytes = 2n codes) to backend memory `dst`, generated on the backend from
  /// (seed, unit index) only (fill_random.h). Default: generated on the host and uploaded.
  virtual void fill_random(void* dst, int64_t n, RandomFill kind, float scale, uint64_t seed);
  /// Free and total device memory (bytes). Default: {0, 0} (unknown).
  virtual MemoryInfo memory_info();
  /// One line naming the device: GPU name, driver and CUDA runtime versions / CPU model and
  /// threads. Default: name().
  virtual std::string device_info();
  /// Backend-to-backend copy of `bytes` (stream-ordered; call synchronize() to wait).
  /// Default: through a host buffer.
  virtual void copy(void* dst, const void* src, size_t bytes);
  /// Batched backend-to-backend copy: every segment segs[i] (i < n; `segs` is a HOST array,
  /// dst/src backend memory) copies segs[i].bytes from src to dst. Stream-ordered like `copy`: it
  /// runs after all earlier backend work and before all later work, with no host synchronization
  /// (the segment list is read or staged before the call returns, so the caller may reuse it at
  /// once). Segments run concurrently: no segment's destination may overlap another segment's
  /// source or destination (a dependent copy goes into a later call). Zero-byte segments and
  /// n == 0 are allowed. Not inside `capture`. The CUDA backend uploads the list once and copies
  /// all segments with one kernel (16-byte moves where dst, src and bytes allow); the CPU backend
  /// memcpy's them. Default: `copy` per segment.
  virtual void copy_batch(const CopySegment* segs, int64_t n);

  // ---- concurrency: fork / join of independent op chains (docs/cuda.md §Multi-stream) ------
  /// Splits the work issued from now on into `branches` ≥ 1 independent chains until `join`.
  /// Branch 0 is the main chain (selected after fork); `branch(b)` selects chain b for the ops
  /// issued next. Ordering: every op of a branch runs after all work issued before the fork and
  /// after the earlier ops of the same branch; ops of different branches are unordered (a device
  /// backend may run them concurrently); `join` orders all branches' work before everything
  /// issued after it and selects branch 0 again.
  /// Contract for the caller:
  /// - ops on different branches must not touch the same buffer unless all of them only read it
  ///   (shared inputs such as the layer input x are fine; a pool row written in one branch may
  ///   not be read in another before the join);
  /// - no alloc/free, upload/download, synchronize or copy_batch between fork and join (buffers
  ///   a branch uses are allocated before the fork and released after the join: a release
  ///   inside a branch would let a later allocation reuse memory another branch still uses);
  /// - no nesting: fork while forked is an error, and every fork is joined before the step (or
  ///   the `capture` body) ends. Inside `capture` the branches become parallel graph nodes.
  /// Scratch memory a backend keeps internally (CUDA scratch slots, cuBLASLt workspace) is the
  /// backend's business: it orders branches that share it (see cuda_ops.h multi_stream).
  /// Default (CPU, doubles, a backend with multi-stream off): everything runs in issue order;
  /// fork/branch/join are no-ops, so results are identical with or without them.
  /// `rows`: the query rows of the step (0 = unknown); a backend may run forks of many rows in
  /// issue order (CUDA: CudaOptions::multi_stream_max_rows), where the branches' kernels already
  /// fill the device and concurrency only adds contention.
  virtual void fork(int branches, int64_t rows = 0) {
    (void)branches;
    (void)rows;
  }
  /// Selects branch `b` (0 ≤ b < the fork's branch count) for the ops issued next.
  virtual void branch(int b) { (void)b; }
  /// Orders the ops issued next on the current branch after every op issued so far on branch
  /// `b` (0 ≤ b < the fork's branch count; a no-op for the current branch itself and in issue
  /// order). Ops issued on `b` later stay unordered with them. Lets one branch consume what
  /// another produced early (the indexer top-k on the indexer-compressor branch reads the
  /// indexer q and weights of branch 0) while the producer branch goes on.
  virtual void branch_wait(int b) { (void)b; }
  /// Ends the fork (see `fork`).
  virtual void join() {}
  /// Turns running branches concurrently on or off at run time (graphs captured before keep the
  /// mode they were captured in). Returns false on backends without concurrency (CPU).
  virtual bool set_multi_stream(bool on) {
    (void)on;
    return false;
  }

  // ---- decode plans and graphs ------------------------------------------------------------
  /// Writes a decode step's plan from raw batch state (DecodePlanArgs); on a device backend it
  /// is two kernels with no host work, so graphs can capture it.
  virtual void build_decode_plan(const DecodePlanArgs& a) = 0;
  /// Whether `capture` can return graphs.
  virtual bool supports_graphs() const { return false; }
  /// Records (does not run) the backend work `body` issues as a replayable graph; nullptr where
  /// unsupported or when capture failed (the reason is logged). `body` must issue only kernels:
  /// no alloc/free, upload/download or synchronize, and every kernel it calls must already have
  /// run once with the same shapes (first-call scratch growth). Exceptions from `body` end the
  /// capture and propagate.
  virtual std::unique_ptr<Graph> capture(const std::function<void()>& body) { return nullptr; }

  // ---- sampling ------------------------------------------------------------------------------
  /// Chooses one token per row on the backend (SampleArgs). Returns false when the backend does
  /// not sample (the default: the caller downloads logits and samples on the host); a call with
  /// n_rows == 0 is a capability query that does nothing. Asynchronous like every op.
  virtual bool sample(const SampleArgs& a) { return false; }
};

/// RAII owner of backend memory holding `n` values of T.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Ops* ops, int64_t n) : ops_(ops), n_(n) {
    if (n > 0) ptr_ = static_cast<T*>(ops->alloc(size_t(n) * sizeof(T)));
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = o.ops_;
      ptr_ = o.ptr_;
      n_ = o.n_;
      o.ptr_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void reset() {
    if (ptr_) ops_->free(ptr_);
    ptr_ = nullptr;
    n_ = 0;
  }
  T* data() const { return ptr_; }
  int64_t size() const { return n_; }

 private:
  Ops* ops_ = nullptr;
  T* ptr_ = nullptr;
  int64_t n_ = 0;
};

/// The CPU reference backend (src/ops/cpu). `pool` = threads to use (nullptr → global pool).
std::unique_ptr<Ops> make_cpu_ops(ThreadPool* pool = nullptr);

}  // namespace v4::ops
