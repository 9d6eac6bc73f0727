#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
#include "ops/cuda/gemm.h"

#include <cublasLt.h>


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
                               int64_t ldx, int64_t ldw, int64_t ldy, int align) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_tuple(kind, M, N, K, int(out), ldx, ldw, ldy, align);
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
  cublasLtMatmulPreference_t pref = nullptr;
  V4_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = workspace_bytes_;
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
                               p->b, &beta, Y, p->c, Y, p->c, &p->algo, workspace_,
                               workspace_bytes_, stream));
  return Status::Ok();
}

}  // namespace v4::cuda
