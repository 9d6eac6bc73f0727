// Accuracy of the KV cache pool formats (--kv-cache-dtype f32 | bf16 | fp8; issue 7): writes a
// Markdown report (bench/results/kv-fp8-accuracy.md on the CPU, kv-fp8-accuracy-cuda.md on the
// GPU) with
//   1. row sizes (bytes a V4 row of 512 = 448 nope + 64 rope, a 128-value indexer key; fp8
//      pools store fp8 indexer keys, 144 bytes);
//   2. sparse attention at V4 shapes (64 heads, hd 512, 128 SWA + 512 compressed keys, 4 query
//      rows) over random rows stored through the backend's store_rows_kv into pools of each
//      format, vs the CPU backend on f32 pools: max |Δ| / max |ref| and ‖Δ‖₂ / ‖ref‖₂ of the
//      output, for plain N(0, 1) rows and for rows with outlier channels (8 channels × 20, as
//      real activations have), q ~ N(0, 1) (logits ~ N(0, 1)) and q ~ N(0, 16) (sharp);
//   3. the tiny real-format fixtures (tests/fixtures/*, with transformers oracle outputs): prefill
//      (logits of every position) + teacher-forced decode of the golden tokens with each pool
//      format: logit error vs the f32-pool run (prefill max, worst decode step), greedy argmax
//      agreement with the oracle and with the f32-pool run.
// Usage: bench_kv_accuracy [--device cpu|cuda] [--precision auto|fp32|bf16] [--out FILE]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "model/backend.h"
#include "model/checkpoint.h"
#include "model/deepseek_v4.h"
#include "ops/ops.h"

namespace v4 {
namespace {

struct Err {
  double max_rel = 0, l2_rel = 0;
};
Err compare(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0, n2 = 0, d2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - ref[i]);
    num = std::max(num, std::isnan(a[i]) ? INFINITY : d);
    den = std::max(den, std::fabs(double(ref[i])));
    n2 += d * d;
    d2 += double(ref[i]) * ref[i];
  }
  return {den > 0 ? num / den : num, d2 > 0 ? std::sqrt(n2 / d2) : std::sqrt(n2)};
}

std::vector<float> randn(size_t n, std::mt19937_64& g, float scale) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

/// Backend memory holding a host vector (freed with the object).
struct Buf {
  ops::Ops* o = nullptr;
  void* p = nullptr;
  Buf(ops::Ops* ops, const void* src, size_t bytes) : o(ops) {
    p = o->alloc(std::max<size_t>(bytes, 16));
    if (src) o->upload(p, src, bytes);
  }
  template <typename T>
  Buf(ops::Ops* ops, const std::vector<T>& v) : Buf(ops, v.data(), v.size() * sizeof(T)) {}
  ~Buf() { o->free(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

const char* name_of(KvDtype d) { return kv_dtype_name(d); }

/// Section 2: one attention case. Returns the table rows (one per format).
std::string attention_case(ops::Ops* dev, ops::Ops* cpu, bool outliers, float q_scale,
                           uint64_t seed) {
  const int S = 4, H = 64, hd = 512, rope = 64, n_swa = 128, n_comp = 512;
  const int swa_rows = 256, comp_rows = 2048;
  std::mt19937_64 g(seed);
  auto swa = randn(size_t(swa_rows) * hd, g, 1.f), comp = randn(size_t(comp_rows) * hd, g, 1.f);
  if (outliers)
    for (auto* pool : {&swa, &comp})
      for (size_t r = 0; r < pool->size() / hd; ++r)
        for (int c : {3, 77, 130, 200, 260, 333, 400, 470}) (*pool)[r * hd + size_t(c)] *= 20.f;
  const auto q = randn(size_t(S) * H * hd, g, q_scale), sinks = randn(size_t(H), g, 1.f);
  std::vector<int32_t> swa_r, comp_r, swa_c, comp_c;
  std::vector<int64_t> swa_o, comp_o;
  std::uniform_int_distribution<int> us(0, swa_rows - 1), uc(0, comp_rows - 1);
  for (int t = 0; t < S; ++t) {
    swa_o.push_back(int64_t(swa_r.size()));
    swa_c.push_back(n_swa);
    for (int j = 0; j < n_swa; ++j) swa_r.push_back(us(g));
    comp_o.push_back(int64_t(comp_r.size()));
    comp_c.push_back(n_comp);
    for (int j = 0; j < n_comp; ++j) comp_r.push_back(uc(g));
  }
  ops::AttentionArgs base;
  base.n_rows = S;
  base.n_heads = H;
  base.head_dim = hd;
  base.rope_dim = rope;
  base.scale = 1.f / std::sqrt(float(hd));
  base.max_keys = n_swa + n_comp;
  // Reference: the CPU backend on f32 pools.
  std::vector<float> ref(size_t(S) * H * hd);
  {
    ops::AttentionArgs a = base;
    a.q = q.data();
    a.sinks = sinks.data();
    a.swa_pool = swa.data();
    a.comp_pool = comp.data();
    a.swa = {swa_r.data(), swa_o.data(), swa_c.data()};
    a.comp = {comp_r.data(), comp_o.data(), comp_c.data()};
    a.out = ref.data();
    cpu->sparse_attention(a);
  }
  std::ostringstream os;
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kBf16, KvDtype::kFp8}) {
    Buf dq(dev, q), dsinks(dev, sinks), dswa_x(dev, swa), dcomp_x(dev, comp);
    Buf dswa_r(dev, swa_r), dswa_o(dev, swa_o), dswa_c(dev, swa_c), dcomp_r(dev, comp_r),
        dcomp_o(dev, comp_o), dcomp_c(dev, comp_c);
    std::vector<int32_t> ident_s(static_cast<size_t>(swa_rows)), ident_c(static_cast<size_t>(comp_rows));
    for (int i = 0; i < swa_rows; ++i) ident_s[size_t(i)] = i;
    for (int i = 0; i < comp_rows; ++i) ident_c[size_t(i)] = i;
    Buf dis(dev, ident_s), dic(dev, ident_c);
    const int64_t rb = kv_row_bytes(dt, hd, rope);
    Buf dswa(dev, nullptr, size_t(swa_rows * rb)), dcomp(dev, nullptr, size_t(comp_rows * rb));
    dev->store_rows_kv(dswa.p, dt, dis.as<int32_t>(), swa_rows, hd, dswa_x.as<float>(), rope);
    dev->store_rows_kv(dcomp.p, dt, dic.as<int32_t>(), comp_rows, hd, dcomp_x.as<float>(), rope);
    Buf dout(dev, nullptr, ref.size() * sizeof(float));
    ops::AttentionArgs a = base;
    a.kv_dtype = dt;
    a.q = dq.as<float>();
    a.sinks = dsinks.as<float>();
    a.swa_pool = dswa.p;
    a.comp_pool = dcomp.p;
    a.swa = {dswa_r.as<int32_t>(), dswa_o.as<int64_t>(), dswa_c.as<int32_t>()};
    a.comp = {dcomp_r.as<int32_t>(), dcomp_o.as<int64_t>(), dcomp_c.as<int32_t>()};
    a.out = dout.as<float>();
    dev->sparse_attention(a);
    dev->synchronize();
    std::vector<float> out(ref.size());
    dev->download(out.data(), dout.p, out.size() * sizeof(float));
    dev->synchronize();
    const Err e = compare(out, ref);
    char line[256];
    std::snprintf(line, sizeof line, "| %s | q×%g | %s | %lld | %.3g | %.3g |\n",
                  outliers ? "N(0,1) + 8 outlier channels ×20" : "N(0,1)", double(q_scale),
                  name_of(dt), (long long)rb, e.max_rel, e.l2_rel);
    os << line;
  }
  return os.str();
}

struct Golden {
  std::vector<int32_t> prompt, tokens;
  std::vector<float> prefill;  // [T, V]
};
Result<Golden> load_golden(const std::string& dir) {
  V4_ASSIGN_OR_RETURN(auto f, model::Checkpoint::open_file(dir + "/golden.safetensors"));
  Golden g;
  const auto* p = f.find("prompt_ids");
  const auto* t = f.find("tokens");
  const auto* l = f.find("prefill_logits");
  if (!p || !t || !l) return make_error(ErrorCode::kNotFound, "golden: missing tensors in {}", dir);
  V4_ASSIGN_OR_RETURN(g.prompt, f.read_i32("prompt_ids", p->shape));
  V4_ASSIGN_OR_RETURN(g.tokens, f.read_i32("tokens", t->shape));
  V4_ASSIGN_OR_RETURN(g.prefill, f.read_f32("prefill_logits", l->shape));
  return g;
}

int32_t argmax(const float* v, int64_t n) { return int32_t(std::max_element(v, v + n) - v); }

/// Section 3: one fixture, every pool format. Returns the table rows.
Result<std::string> fixture_case(const std::string& dir, ops::Ops* dev) {
  V4_ASSIGN_OR_RETURN(auto m, model::DeepseekV4::load(dir, dev));
  V4_ASSIGN_OR_RETURN(auto g, load_golden(dir));
  const int64_t V = m->config().vocab_size, T = int64_t(g.prompt.size());
  const int64_t N = int64_t(g.tokens.size());
  std::vector<float> logits[3];  // T prefill rows, then N − 1 decode rows
  const KvDtype dts[3] = {KvDtype::kF32, KvDtype::kBf16, KvDtype::kFp8};
  for (int i = 0; i < 3; ++i) {
    V4_ASSIGN_OR_RETURN(auto kv, m->make_cache(int64_t(256) << 20, 1, 0, 0, dts[i]));
    V4_ASSIGN_OR_RETURN(const int32_t s, kv->create_sequence());
    model::ForwardBatch b;
    b.slices.push_back({s, 0, g.prompt, true});
    V4_ASSIGN_OR_RETURN(auto out, m->forward(b, *kv));
    logits[i] = out.logits;
    int64_t pos = T;
    for (int64_t j = 1; j < N; ++j) {
      model::ForwardBatch d;
      d.slices.push_back({s, pos++, {g.tokens[size_t(j - 1)]}, false});
      V4_ASSIGN_OR_RETURN(auto o, m->forward(d, *kv));
      logits[i].insert(logits[i].end(), o.logits.begin(), o.logits.end());
    }
  }
  std::ostringstream os;
  const std::string name = std::filesystem::path(dir).filename().string();
  for (int i = 0; i < 3; ++i) {
    double pre = 0, dec = 0;
    int64_t oracle = 0, same_f32 = 0;
    const int64_t rows = T + N - 1;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> a(logits[i].begin() + r * V, logits[i].begin() + (r + 1) * V);
      std::vector<float> f(logits[0].begin() + r * V, logits[0].begin() + (r + 1) * V);
      const double e = compare(a, f).max_rel;
      (r < T ? pre : dec) = std::max(r < T ? pre : dec, e);
      const int32_t am = argmax(a.data(), V);
      same_f32 += am == argmax(f.data(), V);
      // oracle: prefill rows vs the oracle's argmax; row T − 1 + j predicts tokens[j]
      if (r < T) oracle += am == argmax(&g.prefill[size_t(r * V)], V);
      else oracle += am == g.tokens[size_t(r - T + 1)];
    }
    char line[320];
    std::snprintf(line, sizeof line,
                  "| %s | %s | %.3g | %.3g | %lld/%lld (%.1f%%) | %lld/%lld (%.1f%%) |\n",
                  name.c_str(), name_of(dts[i]), pre, dec, (long long)oracle, (long long)rows,
                  100.0 * double(oracle) / double(rows), (long long)same_f32, (long long)rows,
                  100.0 * double(same_f32) / double(rows));
    os << line;
  }
  return os.str();
}

int run(int argc, char** argv) {
  std::string device = "cpu", precision = "auto", out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--device") device = next();
    else if (a == "--precision") precision = next();
    else if (a == "--out") out_path = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_kv_accuracy [--device cpu|cuda] [--precision auto|fp32|bf16] "
                   "[--out FILE]\n");
      return 2;
    }
  }
  model::BackendOptions bo;
  bo.precision = precision;
  auto dev = model::make_backend(device, nullptr, bo);
  if (!dev.ok()) {
    std::fprintf(stderr, "error: %s\n", dev.status().to_string().c_str());
    return 1;
  }
  auto cpu = ops::make_cpu_ops();
  std::ostringstream md;
  char when[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  md << "# KV cache pool formats: accuracy (issue 7)\n\n"
     << "Produced by `bench_kv_accuracy --device " << device << " --precision " << precision
     << "` on " << when << "; device: " << (*dev)->device_info() << ".\n\n"
     << "fp8 rows (`--kv-cache-dtype fp8`): the 448 nope values as e4m3 with one f32 scale per 64 "
        "(amax / 448, round to nearest even, saturating), the 64 rope values as bf16, 16-byte "
        "aligned (base/kv_fp8.h, docs/cache.md). The fp8 column includes fp8 indexer keys: 128 "
        "e4m3 values (RoPE channels too) + one f32 scale (amax / 448) per row, zero-padded to 144 bytes "
        "(KvDtype::kFp8Index).\n\n"
     << "## Row sizes\n\n| row | f32 | bf16 | fp8 |\n|---|---|---|---|\n"
     << "| attention (SWA / C4 / C128), 512 = 448 + 64 | " << kv_row_bytes(KvDtype::kF32, 512, 64)
     << " | " << kv_row_bytes(KvDtype::kBf16, 512, 64) << " | "
     << kv_row_bytes(KvDtype::kFp8, 512, 64) << " |\n"
     << "| indexer key, 128 | " << kv_row_bytes(KvDtype::kF32, 128, 0) << " | "
     << kv_row_bytes(KvDtype::kBf16, 128, 0) << " | "
     << kv_row_bytes(kv_index_dtype(KvDtype::kFp8), 128, 0) << " (e4m3 + scale) |\n\n";
  md << "## Sparse attention at V4 shapes\n\n"
     << "64 heads, hd 512 (448 nope + 64 rope), 4 query rows × (128 SWA + 512 compressed keys), "
        "rows stored through `store_rows_kv` of the " << device
     << " backend, output vs the CPU backend on f32 pools (f32 on the device = the backend's own "
        "arithmetic error, e.g. bf16 tensor cores).\n\n"
     << "| key rows | q | pools | row bytes | max abs Δ / max abs ref | ‖Δ‖₂ / ‖ref‖₂ |\n"
     << "|---|---|---|---|---|---|\n";
  uint64_t seed = 11;
  for (bool outl : {false, true})
    for (float qs : {1.f, 4.f}) md << attention_case(dev->get(), cpu.get(), outl, qs, seed++);
  md << "\n## Tiny real-format fixtures (transformers oracle)\n\n"
     << "Prefill (every position's logits) + teacher-forced decode of the golden tokens. Logit "
        "error = max abs Δlogit / max abs logit of the same position against the f32-pool run on "
        "the same backend (prefill: worst position; decode: worst step; tests/model/test_kv_*.cpp "
        "normalize over the whole prefill instead, so their prefill numbers are smaller). The random tiny models are chaotic: a changed "
        "key flips near-tied indexer top-k picks, so single logits move a lot "
        "(tests/model/test_kv_bf16.cpp).\n\n"
     << "| fixture | pools | prefill logit err | decode worst | greedy = oracle | greedy = f32 "
        "pools |\n|---|---|---|---|---|---|\n";
  const std::filesystem::path root = std::filesystem::path(V4_SOURCE_DIR) / "tests" / "fixtures";
  std::vector<std::string> dirs;
  for (auto& e : std::filesystem::directory_iterator(root))
    if (e.is_directory() && std::filesystem::exists(e.path() / "golden.safetensors"))
      dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  for (const auto& d : dirs) {
    auto r = fixture_case(d, dev->get());
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", d.c_str(), r.status().to_string().c_str());
      return 1;
    }
    md << *r;
  }
  const std::string text = md.str();
  std::fputs(text.c_str(), stdout);
  if (!out_path.empty()) {
    std::ofstream f(out_path);
    f << text;
    if (!f) {
      std::fprintf(stderr, "error: cannot write %s\n", out_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace v4

int main(int argc, char** argv) { return v4::run(argc, argv); }
