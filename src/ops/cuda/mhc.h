// mHC (manifold-constrained hyper-connections) on the device, docs dsv4-model.md §3 / P12.
// Streams h [S, n, D] (T = float or bf16); coefficients in fp32; n = hc_mult ≤ 4.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace v4::cuda {

/// Parameters of one mHC site (attn_hc / ffn_hc), device pointers, fp32:
/// fn [(2+n)·n, n·D], base [(2+n)·n], scale [3].
struct MhcParams {
  const float* fn = nullptr;
  const float* base = nullptr;
  const float* scale = nullptr;
  int n = 4;               // hc_mult
  int sinkhorn_iters = 20;  // hc_sinkhorn_iters
  float rms_eps = 1e-6f;    // rms_norm_eps (RMS of the flattened n·D vector, no weight)
  float hc_eps = 1e-6f;     // hc_eps
};

/// mHC pre: mix = RMS(h[t] flattened)·fnᵀ; pre = sigmoid(mix[0:n]·scale0 + base) + hc_eps;
/// post = 2·sigmoid(mix[n:2n]·scale1 + base); comb = Sinkhorn(softmax rows of C) (fp32);
/// collapsed[t] = Σ_s pre[s]·h[t, s]. Outputs: collapsed [S, D] (T), post [S, n] f32,
/// comb [S, n, n] f32 (row j, col k). Errors: kInvalidArgument for n ∉ [1, 4] or D < 1.
/// `work` (device, mhc_work_floats(S) floats) selects the split form: the n·D sums of a token are
/// spread over mhc_parts() blocks (a fixed count, so results do not depend on S) — the fast path
/// for decode; nullptr: one block per token.
template <typename T>
Status mhc_pre(const T* h, const MhcParams& p, T* collapsed, float* post, float* comb, int64_t S,
               int64_t D, cudaStream_t stream, float* work = nullptr);

/// Floats of the split form's workspace for S tokens (mhc_pre / mhc_head `work`).
inline int64_t mhc_work_floats(int64_t S) { return S * 32 * 25; }

/// mHC post: h_out[t, k] = post[t, k]·f[t] + Σ_j comb[t, j, k]·h[t, j]  (h_out may alias h).
/// h, h_out [S, n, D]; f [S, D]; post [S, n]; comb [S, n, n].
template <typename T>
Status mhc_post(const T* h, const T* f, const float* post, const float* comb, T* h_out, int64_t S,
                int n, int64_t D, cudaStream_t stream);

/// HyperHead: pre = sigmoid((RMS(flat)·hc_fnᵀ)·hc_scale[0] + hc_base) + hc_eps;
/// y[t] = Σ_s pre[s]·h[t, s]. hc_fn [n, n·D], hc_base [n], hc_scale [1]; y [S, D].
template <typename T>
Status mhc_head(const T* h, const float* hc_fn, const float* hc_base, const float* hc_scale, int n,
                float rms_eps, float hc_eps, T* y, int64_t S, int64_t D, cudaStream_t stream,
                float* work = nullptr);

/// Arguments of the fused mHC kernel (mhc_fused), device pointers, fp32 storage throughout.
/// Pre site (head = false): fn [(2+n)·n, n·D], base [(2+n)·n], scale [3]; outputs collapsed,
/// post [S, n], comb [S, n, n] as mhc_pre. HyperHead (head = true): fn [n, n·D], base [n],
/// scale [1]; post / comb unused. In both: with x set, x = rms_norm(collapsed)·norm_weight
/// (eps norm_eps; norm_weight [D] or nullptr = unweighted). collapsed may be nullptr when x is
/// set (x then holds it before the norm); x may equal collapsed.
struct MhcFusedArgs {
  const float* h = nullptr;  // [S, n, D]
  const float* fn = nullptr;
  const float* base = nullptr;
  const float* scale = nullptr;
  int n = 4;
  int sinkhorn_iters = 20;
  float rms_eps = 1e-6f;  // RMS of the flattened n·D vector (no weight)
  float hc_eps = 1e-6f;
  bool head = false;
  float* collapsed = nullptr;  // [S, D]
  float* post = nullptr;       // [S, n]
  float* comb = nullptr;       // [S, n, n]
  const float* norm_weight = nullptr;  // [D]
  float norm_eps = 1e-6f;
  float* x = nullptr;  // [S, D]
  int64_t S = 0;
  int64_t D = 0;
};

/// Fixed number of chunks of a token's n·D vector in mhc_fused (part of the summation order).
inline constexpr int kMhcFusedParts = 64;
/// Floats of mhc_fused's partial-sum workspace for S tokens.
inline int64_t mhc_fused_work_floats(int64_t S) { return S * kMhcFusedParts * 25; }
/// Ints of mhc_fused's counter array for S tokens (must be all zero before the first call; every
/// call leaves them zero again).
inline int64_t mhc_fused_counters(int64_t S) { return S < 1 ? 1 : S; }

/// mHC pre (or HyperHead) and the following RMSNorm in ONE launch. Grid (kMhcFusedParts, groups
/// of G tokens: ≤ 2, or S / 128 ≤ 16 for S > 256 so that prefill calls read fn ~128 times, not
/// S / 2): each CTA reduces its fixed chunk of the n·D vector for its group's tokens (fn
/// dots and the sum of squares) into `work`; the group's last CTA to finish (device counter,
/// threadfence pattern; it resets the counter) adds the chunks in a fixed order and runs one warp
/// per job: Sinkhorn (post, comb) of one token, or one of two parts of a token's collapsed stream
/// (+ RMSNorm after a block barrier). The
/// summation order depends only on n and D (not on S or the grouping): batch-invariant.
/// work: mhc_fused_work_floats(S) floats; counters: mhc_fused_counters(S) zeroed ints; no two
/// calls sharing them may run concurrently. Errors: kInvalidArgument for n ∉ [1, 4], D < 1,
/// iters < 1 (pre), S > 1,048,560 (65,535 groups of 16) or missing outputs.
Status mhc_fused(const MhcFusedArgs& a, float* work, int* counters, cudaStream_t stream);

/// mHC post after an add: h_out[t, k] = post[t, k]·(f[t] + f_add[t]) + Σ_j comb[t, j, k]·h[t, j]
/// (h_out may alias h; f_add may be nullptr = no add). Shapes as mhc_post; fp32.
Status mhc_post_add(const float* h, const float* f, const float* f_add, const float* post,
                    const float* comb, float* h_out, int64_t S, int n, int64_t D,
                    cudaStream_t stream);

}  // namespace v4::cuda
