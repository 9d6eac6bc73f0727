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

}  // namespace v4::cuda
