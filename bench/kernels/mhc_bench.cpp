// mHC rows of bench_kernels (`--only-mhc` → cuda-mhc.md, or part of the full run): the decode
// sites of a V4-Flash layer (n = 4, D = 4096, 20 Sinkhorn iterations) at batch 1, 7 and 64:
//   pre + norm  old: mhc_pre split form (partial + finish kernels) + rmsnorm = 3 launches
//               new: mhc_fused (coefficients, collapse, RMSNorm) = 1 launch
//   post + add  old: mhc_post alone (the separate add launch before it is not timed here: this
//               file is host code) = 1 of 2; new: mhc_post_add (add included) = 1
//   head + norm old: mhc_head split form + rmsnorm = 3; new: mhc_fused(head) = 1
// Each time is per call inside a CUDA graph of `inner` dependent calls (what a replayed decode
// step pays, launch gaps included), median of the replays. "cold": every call of the graph reads
// its own copy of fn (48 copies = 72 MiB > the 50 MiB L2), as in a decode step where the layer's
// weights are not in L2; "warm": one fn. Byte floor = bytes each call must move / the measured
// copy bandwidth (fn + h + outputs for pre/head; h read + write, f, f_add for post).
#ifdef V4_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ops/cuda/mhc.h"
#include "ops/cuda/norm_rope.h"

namespace {

#define MB_CHECK(x)                                                                     \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                     \
    }                                                                                   \
  } while (0)
#define MB_OK(x)                                                                        \
  do {                                                                                  \
    v4::Status s_ = (x);                                                                \
    if (!s_.ok()) {                                                                     \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, s_.to_string().c_str());  \
      std::exit(3);                                                                     \
    }                                                                                   \
  } while (0)

// Median per-call µs of `call(j, stream)` for j = 0..inner-1 captured into one graph.
double graph_us(const std::function<void(int, cudaStream_t)>& call, int inner, int replays = 30) {
  cudaStream_t st;
  MB_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MB_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int j = 0; j < inner; ++j) call(j, st);
  MB_CHECK(cudaStreamEndCapture(st, &graph));
  MB_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) MB_CHECK(cudaGraphLaunch(exec, st));
  MB_CHECK(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  MB_CHECK(cudaEventCreate(&a));
  MB_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < replays; ++i) {
    MB_CHECK(cudaEventRecord(a, st));
    MB_CHECK(cudaGraphLaunch(exec, st));
    MB_CHECK(cudaEventRecord(b, st));
    MB_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    MB_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0 / inner);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename T>
T* dev_alloc(size_t n) {
  T* p = nullptr;
  MB_CHECK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

void upload_randn(float* d, size_t n, std::mt19937_64& g, float scale) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> h(n);
  for (auto& v : h) v = nd(g);
  MB_CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
}

}  // namespace

std::string bench_mhc(double bw) {
  using namespace v4::cuda;
  const int n = 4, iters = 20;
  const int64_t D = 4096, nD = n * D, Smax = 64;
  const int nmix = (2 + n) * n;
  const int kCopies = 48;  // distinct fn copies for the cold rows (72 MiB of pre fn)
  std::mt19937_64 g(7);
  float* fn = dev_alloc<float>(size_t(kCopies) * nmix * nD);
  for (int i = 0; i < kCopies; ++i) upload_randn(fn + size_t(i) * nmix * nD, size_t(nmix) * nD, g, 0.01f);
  float* hfn = dev_alloc<float>(size_t(kCopies) * n * nD);
  for (int i = 0; i < kCopies; ++i) upload_randn(hfn + size_t(i) * n * nD, size_t(n) * nD, g, 0.01f);
  float* base = dev_alloc<float>(nmix);
  float* scale = dev_alloc<float>(3);
  float* w = dev_alloc<float>(D);
  upload_randn(base, nmix, g, 0.5f);
  upload_randn(scale, 3, g, 0.7f);
  upload_randn(w, D, g, 1.f);
  float* h = dev_alloc<float>(size_t(Smax) * nD);
  upload_randn(h, size_t(Smax) * nD, g, 1.f);
  float* h2 = dev_alloc<float>(size_t(Smax) * nD);
  MB_CHECK(cudaMemcpy(h2, h, size_t(Smax) * nD * 4, cudaMemcpyDeviceToDevice));
  float* col = dev_alloc<float>(size_t(Smax) * D);
  float* x = dev_alloc<float>(size_t(Smax) * D);
  float* f = dev_alloc<float>(size_t(Smax) * D);
  float* fa = dev_alloc<float>(size_t(Smax) * D);
  upload_randn(f, size_t(Smax) * D, g, 1.f);
  upload_randn(fa, size_t(Smax) * D, g, 1.f);
  float* post = dev_alloc<float>(size_t(Smax) * n);
  float* comb = dev_alloc<float>(size_t(Smax) * n * n);
  MB_CHECK(cudaMemset(post, 0, size_t(Smax) * n * 4));
  MB_CHECK(cudaMemset(comb, 0, size_t(Smax) * n * n * 4));
  const int64_t wfl = std::max(mhc_work_floats(Smax), mhc_fused_work_floats(Smax));
  float* work = dev_alloc<float>(size_t(wfl));
  int* counters = dev_alloc<int>(size_t(mhc_fused_counters(Smax)));
  MB_CHECK(cudaMemset(counters, 0, size_t(mhc_fused_counters(Smax)) * sizeof(int)));

  std::ostringstream o;
  o << "V4-Flash mHC sites: n = 4 streams, D = 4096, 20 Sinkhorn iterations, fp32 activations. "
       "µs per call inside a CUDA graph of dependent calls (launch gaps included), median of 30 "
       "replays; cold = each call reads its own fn copy (weights not in L2), warm = one fn. "
       "Floor = bytes / "
    << int(bw) << " GB/s.\n\n";
  o << "| site | batch | launches old → new | old cold µs | new cold µs | old warm µs | new warm µs "
       "| floor µs | new cold / floor |\n|---|---:|---|---:|---:|---:|---:|---:|---:|\n";
  char buf[512];
  for (int64_t S : {int64_t(1), int64_t(7), int64_t(64)}) {
    // ---- pre + norm ----
    auto pre_old = [&](int j, cudaStream_t st, bool cold) {
      MhcParams p;
      p.fn = fn + (cold ? size_t(j % kCopies) * nmix * nD : 0);
      p.base = base;
      p.scale = scale;
      p.n = n;
      p.sinkhorn_iters = iters;
      MB_OK(mhc_pre<float>(h, p, col, post, comb, S, D, st, work));
      MB_OK(rmsnorm<float>(col, w, x, S, D, 1e-6f, st));
    };
    auto pre_new = [&](int j, cudaStream_t st, bool cold) {
      MhcFusedArgs a;
      a.h = h;
      a.fn = fn + (cold ? size_t(j % kCopies) * nmix * nD : 0);
      a.base = base;
      a.scale = scale;
      a.n = n;
      a.sinkhorn_iters = iters;
      a.collapsed = col;
      a.post = post;
      a.comb = comb;
      a.norm_weight = w;
      a.x = x;
      a.S = S;
      a.D = D;
      MB_OK(mhc_fused(a, work, counters, st));
    };
    const double pre_bytes = double(nmix) * nD * 4 + double(S) * nD * 4 + double(S) * D * 4 * 2 +
                             double(D) * 4 + double(S) * (n + n * n) * 4;
    {
      const double oc = graph_us([&](int j, cudaStream_t st) { pre_old(j, st, true); }, kCopies);
      const double nc = graph_us([&](int j, cudaStream_t st) { pre_new(j, st, true); }, kCopies);
      const double ow = graph_us([&](int j, cudaStream_t st) { pre_old(j, st, false); }, kCopies);
      const double nw = graph_us([&](int j, cudaStream_t st) { pre_new(j, st, false); }, kCopies);
      const double fl = pre_bytes / (bw * 1e9) * 1e6;
      std::snprintf(buf, sizeof buf, "| mHC pre + norm | %lld | 3 → 1 | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f× |\n",
                    (long long)S, oc, nc, ow, nw, fl, nc / fl);
      o << buf;
      std::printf("%s", buf);
    }
    // ---- head + norm ----
    auto head_old = [&](int j, cudaStream_t st, bool cold) {
      const float* fnp = hfn + (cold ? size_t(j % kCopies) * n * nD : 0);
      MB_OK(mhc_head<float>(h, fnp, base, scale, n, 1e-6f, 1e-6f, col, S, D, st, work));
      MB_OK(rmsnorm<float>(col, w, col, S, D, 1e-6f, st));
    };
    auto head_new = [&](int j, cudaStream_t st, bool cold) {
      MhcFusedArgs a;
      a.h = h;
      a.fn = hfn + (cold ? size_t(j % kCopies) * n * nD : 0);
      a.base = base;
      a.scale = scale;
      a.n = n;
      a.head = true;
      a.norm_weight = w;
      a.x = col;
      a.S = S;
      a.D = D;
      MB_OK(mhc_fused(a, work, counters, st));
    };
    const double head_bytes =
        double(n) * nD * 4 + double(S) * nD * 4 + double(S) * D * 4 + double(D) * 4;
    {
      const double oc = graph_us([&](int j, cudaStream_t st) { head_old(j, st, true); }, kCopies);
      const double nc = graph_us([&](int j, cudaStream_t st) { head_new(j, st, true); }, kCopies);
      const double ow = graph_us([&](int j, cudaStream_t st) { head_old(j, st, false); }, kCopies);
      const double nw = graph_us([&](int j, cudaStream_t st) { head_new(j, st, false); }, kCopies);
      const double fl = head_bytes / (bw * 1e9) * 1e6;
      std::snprintf(buf, sizeof buf, "| mHC head + norm | %lld | 3 → 1 | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f× |\n",
                    (long long)S, oc, nc, ow, nw, fl, nc / fl);
      o << buf;
      std::printf("%s", buf);
    }
    // ---- post (+ add) ----: h2 is updated in place every call (values drift; timing only).
    auto post_old = [&](int, cudaStream_t st) {  // without the separate add launch it needed
      MB_OK(mhc_post<float>(h2, f, post, comb, h2, S, n, D, st));
    };
    auto post_new = [&](int, cudaStream_t st) {
      MB_OK(mhc_post_add(h2, f, fa, post, comb, h2, S, n, D, st));
    };
    {
      const double ou = graph_us(post_old, kCopies);
      const double nu = graph_us(post_new, kCopies);
      const double fl =
          (double(S) * nD * 4 * 2 + double(S) * D * 4 * 2 + double(S) * (n + n * n) * 4) /
          (bw * 1e9) * 1e6;
      std::snprintf(buf, sizeof buf, "| mHC post (+ add: new only) | %lld | 2 → 1 | %.2f | %.2f | – | – | %.2f | %.1f× |\n",
                    (long long)S, ou, nu, fl, nu / fl);
      o << buf;
      std::printf("%s", buf);
    }
  }
  o << "\nOld = the kernels the backend ran before the fused ones (mhc_pre / mhc_head split form "
       "with 32 chunks per token + rmsnorm; mhc_post, timed without the add launch that preceded it). New = mhc_fused (one launch: "
       "64 chunk CTAs per group of ≤ 8 tokens, the group's last CTA finishes) and mhc_post_add. "
       "Post rows have no cold/warm split (no weights).\n";
  for (void* p : {(void*)fn, (void*)hfn, (void*)base, (void*)scale, (void*)w, (void*)h, (void*)h2,
                  (void*)col, (void*)x, (void*)f, (void*)fa, (void*)post, (void*)comb,
                  (void*)work, (void*)counters})
    cudaFree(p);
  return o.str();
}
#endif
