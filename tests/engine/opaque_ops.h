// OpaqueOps: a test backend that behaves like a device without a GPU. It runs the CPU backend's
// ops, but its memory (everything `alloc` returns: weights, KV pools, the prefix store, step
// buffers) lives in one arena that is mprotect'ed PROT_NONE whenever no Ops call is running. Any
// host access to backend memory outside an Ops call — a memcpy on a pool row, a pointer
// dereference — faults, and the SIGSEGV handler reports it and aborts the test binary. Its name
// is not "cpu", so the executor treats it like a device backend. It counts copies.
//
// Single-threaded use (the engine's scheduler thread, or the test thread before the engine
// starts); the CPU backend's worker threads only run inside Ops calls.
#pragma once
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "ops/ops.h"

namespace v4::testing {

class OpaqueOps final : public ops::Ops {
 public:
  explicit OpaqueOps(std::unique_ptr<ops::Ops> inner, size_t arena_bytes = size_t(8) << 30)
      : in_(std::move(inner)), cap_(arena_bytes) {
    void* p = mmap(nullptr, cap_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = static_cast<char*>(p);
    install_handler(base_, cap_);
  }
  ~OpaqueOps() override {
    in_.reset();
    install_handler(nullptr, 0);
    munmap(base_, cap_);
  }

  struct Counts {
    int64_t copy_batch_calls = 0, copy_batch_segments = 0, copy_batch_bytes = 0;
    int64_t copy_calls = 0;  // single Ops::copy calls
    int64_t op_calls = 0;
  };
  const Counts& counts() const { return c_; }

  std::string name() const override { return "opaque"; }

  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t sz = (bytes + 255) / 256 * 256;
    auto it = free_.find(sz);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      sizes_[p] = sz;
      return p;
    }
    if (top_ + sz > cap_) throw std::bad_alloc();
    void* p = base_ + top_;
    top_ += sz;
    sizes_[p] = sz;
    if (depth_ > 0) open_range();  // a nested alloc (inside an op) must be usable at once
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    auto it = sizes_.find(p);
    if (it == sizes_.end()) {
      std::fprintf(stderr, "OpaqueOps: free of a pointer not from alloc\n");
      std::abort();
    }
    free_.emplace(it->second, p);
    sizes_.erase(it);
  }
  void upload(void* d, const void* s, size_t b) override {
    Open o(this);
    in_->upload(d, s, b);
  }
  void download(void* d, const void* s, size_t b) override {
    Open o(this);
    in_->download(d, s, b);
  }
  void synchronize() override {
    Open o(this);
    in_->synchronize();
  }
  void linear(const float* x, int64_t ldx, const float* w, int64_t M, int64_t N, int64_t K,
              float* y, int64_t ldy) override {
    Open o(this);
    in_->linear(x, ldx, w, M, N, K, y, ldy);
  }
  bool supports(ops::WFormat f) const override { return in_->supports(f); }
  void linear_w(const float* x, int64_t ldx, const ops::WeightView& w, int64_t M, float* y,
                int64_t ldy) override {
    Open o(this);
    in_->linear_w(x, ldx, w, M, y, ldy);
  }
  void add(float* y, const float* x, int64_t n) override {
    Open o(this);
    in_->add(y, x, n);
  }
  void gather_rows(const float* s, const int32_t* r, int64_t n, int64_t w, float* d) override {
    Open o(this);
    in_->gather_rows(s, r, n, w, d);
  }
  void store_rows(float* p, const int32_t* r, int64_t n, int64_t w, const float* s) override {
    Open o(this);
    in_->store_rows(p, r, n, w, s);
  }
  void store_rows_kv(void* p, KvDtype dt, const int32_t* r, int64_t n, int64_t w,
                     const float* s, int rope_dim) override {
    Open o(this);
    in_->store_rows_kv(p, dt, r, n, w, s, rope_dim);
  }
  bool supports_kv_dtype(KvDtype dt) const override { return in_->supports_kv_dtype(dt); }
  void embed(const float* t, const int32_t* ids, int64_t S, int D, int n, float* out) override {
    Open o(this);
    in_->embed(t, ids, S, D, n, out);
  }
  void rms_norm(const float* x, const float* w, int64_t rows, int dim, float eps,
                float* y) override {
    Open o(this);
    in_->rms_norm(x, w, rows, dim, eps, y);
  }
  void rope(float* x, int64_t rows, int nh, int hd, int rd, const int64_t* pos, const float* f,
            float s, bool inv) override {
    Open o(this);
    in_->rope(x, rows, nh, hd, rd, pos, f, s, inv);
  }
  void hc_pre(const ops::HcArgs& a) override {
    Open o(this);
    in_->hc_pre(a);
  }
  void hc_post(float* h, const float* f, const float* post, const float* comb, int64_t S, int n,
               int D) override {
    Open o(this);
    in_->hc_post(h, f, post, comb, S, n, D);
  }
  void hc_head(const float* h, const float* fn, const float* base, const float* scale, int64_t S,
               int n, int D, float re, float he, float* y) override {
    Open o(this);
    in_->hc_head(h, fn, base, scale, S, n, D, re, he, y);
  }
  void compress_pool(const ops::CompressArgs& a) override {
    Open o(this);
    in_->compress_pool(a);
  }
  void indexer_topk(const ops::IndexerArgs& a) override {
    Open o(this);
    in_->indexer_topk(a);
  }
  void sparse_attention(const ops::AttentionArgs& a) override {
    Open o(this);
    in_->sparse_attention(a);
  }
  void route(const ops::RouteArgs& a) override {
    Open o(this);
    in_->route(a);
  }
  void moe_experts(const ops::MoeArgs& a) override {
    Open o(this);
    in_->moe_experts(a);
  }
  void fill_random(void* dst, int64_t n, ops::RandomFill kind, float scale,
                   uint64_t seed) override {
    Open o(this);
    in_->fill_random(dst, n, kind, scale, seed);
  }
  ops::MemoryInfo memory_info() override { return in_->memory_info(); }
  std::string device_info() override { return "opaque test backend over " + in_->device_info(); }
  void copy(void* dst, const void* src, size_t bytes) override {
    Open o(this);
    ++c_.copy_calls;
    in_->copy(dst, src, bytes);
  }
  // Checks the copy_batch contract (no destination overlaps another segment's source or
  // destination; aborts naming the pair) and executes the list like a device would run it
  // concurrently: every source is read before any destination is written, so a segment that
  // depends on another segment of the same call reads the old bytes.
  void copy_batch(const CopySegment* segs, int64_t n) override {
    Open o(this);
    ++c_.copy_batch_calls;
    c_.copy_batch_segments += n;
    for (int64_t i = 0; i < n; ++i) c_.copy_batch_bytes += int64_t(segs[i].bytes);
    check_disjoint(segs, n);
    std::vector<char> tmp;
    std::vector<size_t> at(size_t(std::max<int64_t>(n, 0)));
    for (int64_t i = 0; i < n; ++i) {
      at[size_t(i)] = tmp.size();
      const char* s = static_cast<const char*>(segs[i].src);
      tmp.insert(tmp.end(), s, s + segs[i].bytes);
    }
    for (int64_t i = n - 1; i >= 0; --i)
      if (segs[i].bytes) std::memcpy(segs[i].dst, tmp.data() + at[size_t(i)], segs[i].bytes);
  }
  void build_decode_plan(const ops::DecodePlanArgs& a) override {
    Open o(this);
    in_->build_decode_plan(a);
  }
  bool sample(const ops::SampleArgs& a) override {
    Open o(this);
    return in_->sample(a);
  }

 private:
  // Opens the arena for the duration of one Ops call (nested calls: the outermost one).
  struct Open {
    OpaqueOps* o;
    explicit Open(OpaqueOps* ops) : o(ops) {
      ++o->c_.op_calls;
      if (o->depth_++ == 0) o->open_range();
    }
    ~Open() {
      if (--o->depth_ == 0) o->close_range();
    }
  };
  static void check_disjoint(const CopySegment* segs, int64_t n) {
    struct Iv {
      uintptr_t lo, hi;
      int64_t i;
    };
    std::vector<Iv> dst, src;
    for (int64_t i = 0; i < n; ++i) {
      if (!segs[i].bytes) continue;
      const auto d = reinterpret_cast<uintptr_t>(segs[i].dst);
      const auto s = reinterpret_cast<uintptr_t>(segs[i].src);
      dst.push_back({d, d + segs[i].bytes, i});
      src.push_back({s, s + segs[i].bytes, i});
    }
    auto by_lo = [](const Iv& a, const Iv& b) { return a.lo < b.lo; };
    std::sort(dst.begin(), dst.end(), by_lo);
    std::sort(src.begin(), src.end(), by_lo);
    auto fail = [&](const char* what, int64_t a, int64_t b) {
      std::fprintf(stderr,
                   "OpaqueOps::copy_batch: segment %lld's destination overlaps segment "
                   "%lld's %s (copy_batch segments run concurrently)\n",
                   (long long)a, (long long)b, what);
      std::abort();
    };
    for (size_t k = 1; k < dst.size(); ++k)
      if (dst[k].lo < dst[k - 1].hi) fail("destination", dst[k].i, dst[k - 1].i);
    // For each destination: any source starting before its end and ending after its start.
    std::vector<std::pair<uintptr_t, int64_t>> max_hi(src.size());  // prefix max of src.hi
    for (size_t k = 0; k < src.size(); ++k)
      max_hi[k] = (k && max_hi[k - 1].first >= src[k].hi) ? max_hi[k - 1]
                                                          : std::make_pair(src[k].hi, src[k].i);
    for (const Iv& d : dst) {
      const auto it = std::lower_bound(src.begin(), src.end(), Iv{d.hi, 0, 0}, by_lo);
      if (it == src.begin()) continue;
      const auto& m = max_hi[size_t(it - src.begin()) - 1];
      if (m.first > d.lo) fail("source", d.i, m.second);
    }
  }
  size_t used_pages() const {
    const size_t pg = size_t(sysconf(_SC_PAGESIZE));
    return (top_ + pg - 1) / pg * pg;
  }
  void open_range() {
    if (top_ && mprotect(base_, used_pages(), PROT_READ | PROT_WRITE) != 0) std::abort();
  }
  void close_range() {
    if (top_ && mprotect(base_, used_pages(), PROT_NONE) != 0) std::abort();
  }

  // SIGSEGV inside the arena: host code touched backend memory outside an Ops call.
  static inline char* g_base = nullptr;
  static inline size_t g_cap = 0;
  static void on_segv(int sig, siginfo_t* info, void*) {
    const char* a = static_cast<const char*>(info->si_addr);
    if (g_base && a >= g_base && a < g_base + g_cap) {
      static const char msg[] =
          "OpaqueOps: host code touched backend memory outside an Ops call (e.g. a memcpy on a "
          "pool or prefix-store row); on a GPU this would read device pointers on the host\n";
      (void)!write(2, msg, sizeof(msg) - 1);
      std::abort();
    }
    signal(sig, SIG_DFL);  // not ours: let it crash normally
  }
  static void install_handler(char* base, size_t cap) {
    g_base = base;
    g_cap = cap;
    if (!base) return;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = &on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, nullptr);
  }

  std::unique_ptr<ops::Ops> in_;
  char* base_ = nullptr;
  size_t cap_ = 0, top_ = 0;
  int depth_ = 0;
  std::multimap<size_t, void*> free_;
  std::map<void*, size_t> sizes_;
  Counts c_;
};

}  // namespace v4::testing
