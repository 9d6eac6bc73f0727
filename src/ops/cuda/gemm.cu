#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
#include "ops/cuda/gemm.h"

#include <cublasLt.h>

#include <utility>


namespace v4::cuda {

struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

Result<std::unique_ptr<Gemm>> Gemm::create(size_t workspace_bytes) {
  std::unique_ptr<Gemm> g(new Gemm());
  cublasLtHandle_t h = nullptr;
  V4_CUBLAS_TRY(cublasLtCreate(&h));
  g->handle_ = h;
  if (workspace_bytes) {
    V4_CUDA_TRY(cudaMalloc(&g->workspace_, workspace_bytes));
    g->workspace_bytes_ = workspace_bytes;
  }
  return Result<std::unique_ptr<Gemm>>(std::move(g));
}

Gemm::~Gemm() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

// Row-major Y[M,N] = X[M,K]·W[N,K]ᵀ is column-major Yᵀ[N,M] = (W as col-major [K,N])ᵀ · (X as
// col-major [K,M]): cuBLASLt A = W with op T, B = X with op N, C = D = Y (ld N). ("TN")
// `align`: the smallest alignment (bytes, power of two ≤ 256) of the A, B, C pointers; cuBLASLt
// assumes 256-byte alignment unless told otherwise.
Result<Gemm::Plan*> Gemm::plan(int kind, int64_t M, int64_t N, int64_t K, OutType out,
                               int64_t ldx, int64_t ldw, int64_t ldy, int align, int batch,
                               int64_t sx, int64_t sw, int64_t sy) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_tuple(kind, M, N, K, int(out), ldx, ldw, ldy, align, batch, sx, sw, sy);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  auto p = std::make_unique<Plan>();
  cudaDataType_t ab = kind == 1 ? CUDA_R_32F : CUDA_R_16BF;
  cudaDataType_t cd = out == OutType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  V4_CUBLAS_TRY(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  V4_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  V4_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  V4_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->a, ab, K, N, ldw));
  V4_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->b, ab, K, M, ldx));
  V4_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->c, cd, N, M, ldy));
  if (batch > 1) {
    const int32_t bc = batch;
    for (auto [layout, stride] : {std::pair{p->a, sw}, std::pair{p->b, sx}, std::pair{p->c, sy}}) {
      V4_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                     &bc, sizeof(bc)));
      V4_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }
  cublasLtMatmulPreference_t pref = nullptr;
  V4_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
  // f32 plans (kind 1) run without workspace: the multi-stream branches (wkv, compressor,
  // indexer linears on f32-stored weights) call them concurrently on different streams with no
  // scratch handoff between them, and one shared workspace would race (observed on the H200:
  // CudaMultiStream.DecodeOnEqualsOffBf16 on the f32 fixture).
  size_t ws = kind == 1 ? 0 : workspace_bytes_;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  const uint32_t al = uint32_t(align);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al));
  cublasLtMatmulHeuristicResult_t res{};
  int n_res = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->op,
                                                     p->a, p->b, p->c, p->c, pref, 1, &res, &n_res);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || n_res == 0) {
    return errorf(ErrorCode::kUnsupported,
                      "cuBLASLt has no algorithm for {} GEMM M={} N={} K={} (status {})",
                  kind == 1 ? "f32" : "bf16", M, N, K, int(st));
  }
  p->algo = res.algo;
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
}

Status Gemm::bf16(const __nv_bfloat16* X, const __nv_bfloat16* W, void* Y, OutType out, int64_t M,
                  int64_t N, int64_t K, cudaStream_t stream, float alpha, float beta) {
  return bf16_strided(X, K, W, K, Y, N, out, M, N, K, stream, alpha, beta);
}

Status Gemm::bf16_strided(const __nv_bfloat16* X, int64_t ldx, const __nv_bfloat16* W,
                          int64_t ldw, void* Y, int64_t ldy, OutType out, int64_t M, int64_t N,
                          int64_t K, cudaStream_t stream, float alpha, float beta) {
  if (M <= 0 || N <= 0 || K <= 0 || ldx < K || ldw < K || ldy < N)
    return errorf(ErrorCode::kInvalidArgument,
                  "gemm bf16: bad shape M={} N={} K={} (ldx {} ldw {} ldy {})", M, N, K, ldx, ldw,
                  ldy);
  int align = 256;
  for (const void* ptr : {static_cast<const void*>(X), static_cast<const void*>(W),
                          static_cast<const void*>(Y)})
    while (align > 1 && reinterpret_cast<uintptr_t>(ptr) % uintptr_t(align)) align >>= 1;
  V4_ASSIGN_OR_RETURN(Plan * p, plan(0, M, N, K, out, ldx, ldw, ldy, align));
  V4_CUBLAS_TRY(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p->op, &alpha, W, p->a, X,
                               p->b, &beta, Y, p->c, Y, p->c, &p->algo, workspace_,
                               workspace_bytes_, stream));
  return Status::Ok();
}

Status Gemm::bf16_strided_batched(const __nv_bfloat16* X, int64_t ldx, int64_t sx,
                                  const __nv_bfloat16* W, int64_t ldw, int64_t sw, void* Y,
                                  int64_t ldy, int64_t sy, OutType out, int64_t M, int64_t N,
                                  int64_t K, int batch, cudaStream_t stream) {
  if (batch == 1) return bf16_strided(X, ldx, W, ldw, Y, ldy, out, M, N, K, stream);
  if (M <= 0 || N <= 0 || K <= 0 || ldx < K || ldw < K || ldy < N || batch < 1 || sx < 0 ||
      sw < 0 || sy < 0)
    return errorf(ErrorCode::kInvalidArgument,
                  "gemm bf16 batched: bad shape M={} N={} K={} batch={} (ldx {} ldw {} ldy {}, "
                  "strides {} {} {})",
                  M, N, K, batch, ldx, ldw, ldy, sx, sw, sy);
  // Alignment of every batch's pointers: the bases and the stride bytes.
  const size_t ys = out == OutType::kF32 ? 4 : 2;
  int align = 256;
  for (uintptr_t v : {reinterpret_cast<uintptr_t>(X), reinterpret_cast<uintptr_t>(W),
                      reinterpret_cast<uintptr_t>(Y), uintptr_t(sx * 2), uintptr_t(sw * 2),
                      uintptr_t(sy * ys)})
    while (align > 1 && v % uintptr_t(align)) align >>= 1;
  V4_ASSIGN_OR_RETURN(Plan * p, plan(0, M, N, K, out, ldx, ldw, ldy, align, batch, sx, sw, sy));
  const float alpha = 1.f, beta = 0.f;
  V4_CUBLAS_TRY(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p->op, &alpha, W, p->a, X,
                               p->b, &beta, Y, p->c, Y, p->c, &p->algo, workspace_,
                               workspace_bytes_, stream));
  return Status::Ok();
}

Status Gemm::f32_strided(const float* X, int64_t ldx, const float* W, int64_t ldw, float* Y,
                         int64_t ldy, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  if (M <= 0 || N <= 0 || K <= 0 || ldx < K || ldw < K || ldy < N)
    return errorf(ErrorCode::kInvalidArgument,
                  "gemm f32: bad shape M={} N={} K={} (ldx {} ldw {} ldy {})", M, N, K, ldx, ldw,
                  ldy);
  int align = 256;
  for (const void* ptr : {static_cast<const void*>(X), static_cast<const void*>(W),
                          static_cast<const void*>(Y)})
    while (align > 1 && reinterpret_cast<uintptr_t>(ptr) % uintptr_t(align)) align >>= 1;
  V4_ASSIGN_OR_RETURN(Plan * p, plan(1, M, N, K, OutType::kF32, ldx, ldw, ldy, align));
  const float alpha = 1.f, beta = 0.f;
  V4_CUBLAS_TRY(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p->op, &alpha, W, p->a, X,
                               p->b, &beta, Y, p->c, Y, p->c, &p->algo, nullptr, 0, stream));
  return Status::Ok();
}

}  // namespace v4::cuda
