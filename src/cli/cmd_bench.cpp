// `v4serve bench`: decode step time for given batch sizes and prefill tokens/s at given context
// lengths, each next to its floor (docs/bench.md):
// - decode: B sequences brought to L tokens with KvCache::fast_forward (not computed) over pools
//   filled once with random values (so the indexer's top-k sees a real score spread); each timed
//   step decodes one token per sequence through DeepseekV4::forward (plan — host, or device plan
//   + graph replay on CUDA, reported per cell —, every layer, lm_head, greedy device sampling or --sampling logits) followed by
//   Ops::synchronize, timed with steady_clock; median of --steps after --warmup. Byte floor =
//   model::decode_step_bytes / the device-to-device copy bandwidth measured in the same run.
// - prefill: one sequence fast-forwarded to L − chunk, one timed step of `chunk` tokens.
//   FLOP floor = model::prefill_step_flops / a dense peak constant (--peak-tflops).
// A cell that does not fit in the KV pools prints "does not fit (needs X GiB)". A cell frees its
// sequences on every exit (CellSequences), so a cell that failed mid-step (out of device memory)
// leaves the pools whole for the next one.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/thread_pool.h"
#include "cache/pools.h"
#include "cli/command.h"
#include "cli/model_args.h"
#include "cli/validators.h"
#include "engine/model_executor.h"
#include "model/deepseek_v4.h"
#include "model/kv_fill.h"
#include "model/step_cost.h"
#include "ops/ops.h"

namespace {

using namespace v4;

/// Dense bf16 peak used for the prefill FLOP floor on CUDA: a constant, not measured in the run.
/// Source: bench/results/cuda-kernels.md, cuBLASLt bf16 GEMM on the lent H200 measured 790–872
/// TFLOP/s (8192³: 791; 4096³: 872); the lower value is used.
constexpr double kCudaBf16PeakTflops = 790.0;

struct BenchOptions {
  cli::ModelArgs m;
  std::string batches = "1,16,64,256";
  std::string contexts = "4096,131072,1048576";
  int64_t prefill_chunk = 4096;
  int steps = 10, warmup = 3;
  int prefill_steps = 3, prefill_warmup = 1;
  double mem_fraction = 0.9;
  int64_t kv_cache_bytes = 0;  // > 0: wins over --mem-fraction
  std::string out;
  int threads = 0;
  double peak_tflops = -1;  // < 0: kCudaBf16PeakTflops on cuda, none on cpu
  int64_t copy_mib = 0;     // 0: 1024 on cuda, 256 on cpu
  uint64_t seed = 1;
  bool profile = false;  // per-region device time of the timed decode and prefill steps
  /// --multi-stream: modes every cell runs in ("off", "on"; empty = the backend's default, once).
  std::string multi_stream;
  /// --sampling: "device" (default, as `serve`: greedy on the backend when it can sample, only
  /// the B token ids come back) or "logits" (every step downloads B × vocab f32 logits).
  std::string sampling = "device";
};

double gib(double b) {
  return b / double(int64_t(1) << 30);
}

/// "1,16,4K,1M" → {1, 16, 4096, 1048576} (K = 1024, M = 1048576).
Result<std::vector<int64_t>> parse_list(const std::string& s, const char* flag) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    int64_t mult = 1;
    const char last = item.back();
    if (last == 'k' || last == 'K') mult = 1024;
    if (last == 'm' || last == 'M') mult = int64_t(1) << 20;
    if (mult != 1) item.pop_back();
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      // v * mult must fit in int64 (9999999999999999K wrapped to a negative context).
      if (used != item.size() || v <= 0 || v > std::numeric_limits<int64_t>::max() / mult)
        throw std::invalid_argument(item);
      out.push_back(int64_t(v) * mult);
    } catch (const std::exception&) {
      return make_error(ErrorCode::kInvalidArgument,
                        "{} '{}': expected positive integers like 1,16,4K,1M", flag, s);
    }
  }
  if (out.empty()) return make_error(ErrorCode::kInvalidArgument, "{}: empty list", flag);
  return out;
}

std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  for (char c : all) out += c == '\0' ? ' ' : c;
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::string shell(const char* cmd) {
  std::string out;
  if (FILE* p = popen(cmd, "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

/// V4_COMMIT, else `git rev-parse` in the working directory or, failing that, in the --model
/// directory (models/configs and tests/fixtures live in the repository).
std::string commit_id(const std::string& model_dir) {
  if (const char* c = std::getenv("V4_COMMIT")) return c;
  for (const std::string& dir : {std::string("."), model_dir}) {
    const std::string q = "'" + dir + "'";
    std::string id = shell(("git -C " + q + " rev-parse --short HEAD 2>/dev/null").c_str());
    if (id.empty()) continue;
    if (!shell(("git -C " + q + " status --porcelain --untracked-files=no 2>/dev/null | head -1")
                   .c_str())
             .empty())
      id += " + uncommitted changes";
    return id;
  }
  return "unknown (set V4_COMMIT)";
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string num(double v) {
  if (v >= 1000) return fmt::format("{:.0f}", v);
  if (v >= 100) return fmt::format("{:.1f}", v);
  if (v >= 10) return fmt::format("{:.2f}", v);
  return fmt::format("{:.3g}", v);
}

/// Page size the model would choose (DeepseekV4::make_cache): the smallest multiple of 128
/// >= 256 that every compression rate divides.
int page_size_for(const cache::CacheSpec& spec) {
  for (int p = 256;; p += 128) {
    bool ok = true;
    for (const auto& l : spec.layers) ok &= l.ratio == 0 || p % l.ratio == 0;
    if (ok) return p;
  }
}

/// D2D copy bandwidth (read + write bytes per second), median of 10 copies after 2 warm-ups.
double measure_copy_bandwidth(ops::Ops& o, int64_t bytes, double* per_copy_ms) {
  void* a = o.alloc(size_t(bytes));
  void* b = o.alloc(size_t(bytes));
  o.fill_random(a, bytes, ops::RandomFill::kE2M1Packed, 1.f, 17);  // never time zeros
  o.synchronize();
  std::vector<double> t;
  for (int i = 0; i < 12; ++i) {
    const double t0 = now_s();
    o.copy(b, a, size_t(bytes));
    o.synchronize();
    if (i >= 2) t.push_back(now_s() - t0);
  }
  o.free(a);
  o.free(b);
  const double s = median(t);
  *per_copy_ms = s * 1e3;
  return 2.0 * double(bytes) / s;
}

struct Row {
  std::string phase;
  int64_t context = 0, batch = 0, tokens = 0;
  bool ok = false;
  std::string why;  // when !ok
  double ms = 0, ms_min = 0, ms_max = 0, tok_s = 0;
  double floor_amount = 0;  // decode: bytes; prefill: FLOPs
  double floor_ms = 0;      // 0: no floor
  std::string path;         // how the timed steps ran (decode fast path counters)
  std::vector<ops::Ops::RegionTime> profile;  // --profile: summed over the timed steps
};

std::string row_md(const Row& r) {
  if (!r.ok)
    return fmt::format("| {} | {} | {} | {} | {} | | | | | | |", r.phase, r.context, r.batch,
                       r.tokens, r.why);
  const std::string amount = r.phase == "decode" ? num(r.floor_amount / 1e9) + " GB"
                                                 : num(r.floor_amount / 1e9) + " GFLOP";
  return fmt::format("| {} | {} | {} | {} | {} | {}–{} | {} | {} | {} | {} | {} |", r.phase,
                     r.context, r.batch, r.tokens, num(r.ms), num(r.ms_min), num(r.ms_max),
                     num(r.tok_s), amount, r.floor_ms > 0 ? num(r.floor_ms) : "—",
                     r.floor_ms > 0 ? num(r.ms / r.floor_ms) + "×" : "—", r.path);
}

/// How `steps` decode steps ran, from the model's decode counters before and after.
std::string path_of(const model::DeepseekV4::DecodeStats& a,
                    const model::DeepseekV4::DecodeStats& b, int steps) {
  const int64_t g = b.graph_replays - a.graph_replays,
                d = b.device_plan_steps - a.device_plan_steps;
  const int64_t h = b.host_plan_steps - a.host_plan_steps;
  if (g == steps) return "graph replay";
  if (d == steps) return "device plan";
  if (h == steps) return "host plan";
  return fmt::format("mixed: {} graph, {} device plan, {} host plan", g, d, h);
}

/// The sequences one bench cell created in `kv`, freed when the cell ends on any path — a step
/// that threw (device out of memory) included — so the next cell finds every state slot and page
/// free. Not copyable.
class CellSequences {
 public:
  explicit CellSequences(cache::KvCache& kv) : kv_(kv) {}
  ~CellSequences() { release(); }
  CellSequences(const CellSequences&) = delete;
  CellSequences& operator=(const CellSequences&) = delete;
  /// A new empty sequence (KvCache::create_sequence), owned until release().
  Result<int32_t> create() {
    auto s = kv_.create_sequence();
    if (s.ok()) ids_.push_back(*s);
    return s;
  }
  /// Frees every owned sequence now (KvCache::free_sequence; it only returns pages to free lists).
  void release() {
    for (int32_t s : ids_) kv_.free_sequence(s);
    ids_.clear();
  }
  /// The owned sequence ids in creation order.
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  cache::KvCache& kv_;
  std::vector<int32_t> ids_;
};

/// Test hook: V4_BENCH_FAIL_CELL=N makes the N-th cell that runs (1-based, in report order,
/// cells that do not fit excluded) throw std::bad_alloc from its first step, after its sequences
/// were created — the path of a cell whose step runs out of device memory. 0 / unset: none.
int fail_cell_from_env() {
  const char* e = std::getenv("V4_BENCH_FAIL_CELL");
  return e ? std::atoi(e) : 0;
}

/// V4_BENCH_PROFILER: the phases ("prefill", "decode", or both, comma-separated) whose first
/// timed step of every cell runs inside Ops::profiler_range, for `ncu --profile-from-start off`
/// (scripts/device/issue7_run.sh stage pfkern). Unset: none.
bool profiler_phase_from_env(const char* phase) {
  const char* e = std::getenv("V4_BENCH_PROFILER");
  if (!e) return false;
  const std::string v = std::string(",") + e + ",";
  return v.find(std::string(",") + phase + ",") != std::string::npos;
}

class Bench {
 public:
  Bench(const BenchOptions& o, cli::LoadedModel& lm) : o_(o), ops_(*lm.ops), model_(*lm.model) {}

  /// `batches`, `contexts`: the parsed --batch / --context lists (run_bench checks them before
  /// the weights load).
  int run(std::vector<int64_t> batches, std::vector<int64_t> contexts) {
    batches_ = std::move(batches);
    contexts_ = std::move(contexts);
    const bool cuda = ops_.name() == "cuda";
    // (run_bench refused --profile on a backend without timers before loading the weights.)
    profiling_supported_ = ops_.set_profiling(o_.profile);
    if (o_.profile && !profiling_supported_) {
      std::fprintf(stderr, "error: --profile: the %s backend has no device timers\n",
                   ops_.name().c_str());
      return 2;
    }
    peak_tflops_ = o_.peak_tflops >= 0 ? o_.peak_tflops : (cuda ? kCudaBf16PeakTflops : 0.0);

    // 1. Copy bandwidth of this device, this run.
    const int64_t copy_bytes = (o_.copy_mib > 0 ? o_.copy_mib : (cuda ? 1024 : 256)) << 20;
    double copy_ms = 0;
    try {
      bw_ = measure_copy_bandwidth(ops_, copy_bytes, &copy_ms);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr,
                   "error: cannot allocate 2 × %lld MiB for the copy-bandwidth measurement\n",
                   (long long)(copy_bytes >> 20));
      return 1;
    }
    bw_line_ = fmt::format("{:.0f} GB/s (read + write) from copies of {} MiB, median {:.3f} ms",
                           bw_ / 1e9, copy_bytes >> 20, copy_ms);
    V4_LOG_INFO("copy bandwidth {}", bw_line_);

    // 2. Pools: allocated once, sized from the budget and the largest cell that fits.
    if (int rc = make_pools(); rc != 0) return rc;

    // 3. Cells (each once per --multi-stream mode).
    std::vector<int> modes = {-1};  // -1: the backend's default
    if (!o_.multi_stream.empty()) {
      modes.clear();
      std::stringstream ss(o_.multi_stream);
      std::string item;
      while (std::getline(ss, item, ','))
        if (item == "on" || item == "off") modes.push_back(item == "on" ? 1 : 0);
    }
    for (int64_t L : contexts_) {
      for (int64_t B : batches_)
        for (int m : modes) {
          if (!set_mode(m)) return 2;
          emit(decode_cell(L, B));
        }
      for (int m : modes) {
        if (!set_mode(m)) return 2;
        emit(prefill_cell(L));
      }
      if (fatal_) break;
    }
    write_markdown();
    return fatal_ ? 1 : 0;
  }

 private:
  // --multi-stream mode m (−1: leave the backend as it is). Decode graphs captured in the other
  // mode are dropped, so the next decode steps capture again in this one.
  bool set_mode(int m) {
    if (m < 0 || m == mode_) return true;
    if (!ops_.set_multi_stream(m == 1)) {
      std::fprintf(stderr, "error: --multi-stream: the %s backend has no streams to overlap\n",
                   ops_.name().c_str());
      return false;
    }
    model_.reset_decode_graphs();
    mode_ = m;
    return true;
  }
  std::string mode_suffix() const {
    return mode_ < 0 ? "" : mode_ == 1 ? ", multi-stream on" : ", multi-stream off";
  }
  int64_t steps_total() const { return o_.warmup + o_.steps; }
  /// Context a decode cell runs at: L, or max_position_embeddings − (warm-up + steps) when the
  /// steps would pass the model's last position (so "1M" decodes with ~1M tokens cached).
  int64_t decode_context(int64_t L) const {
    return std::min(L, model_.config().max_position_embeddings - steps_total());
  }
  int64_t chunk_for(int64_t L) const { return std::min(o_.prefill_chunk, L); }

  // Pages one decode cell needs: per sequence the virtual pages of L + steps tokens, SWA pages
  // for window + steps, one state slot.
  int64_t decode_vpages(int64_t L) const { return (L + steps_total() + P_ - 1) / P_; }
  int64_t decode_swa_per_seq() const {
    return (spec_.sliding_window - 1 + steps_total() + P_ - 1) / P_ + 1;
  }
  int64_t prefill_vpages(int64_t L) const { return (L + P_ - 1) / P_; }
  int64_t prefill_swa(int64_t L) const {
    return (chunk_for(L) + spec_.sliding_window - 1 + P_ - 1) / P_ + 1;
  }
  double decode_need_bytes(int64_t L, int64_t B) const {
    return double(B) *
           (double(decode_vpages(L)) * vpage_b_ + double(decode_swa_per_seq()) * swa_b_ + state_b_);
  }
  double prefill_need_bytes(int64_t L) const {
    return double(prefill_vpages(L)) * vpage_b_ + double(prefill_swa(L)) * swa_b_ + state_b_;
  }

  /// Whether --index-cache-dtype gives the indexer keys another type than --kv-cache-dtype's
  /// own rule (fp8 keys next to f32 / bf16 KV pools).
  bool index_keys_differ() const { return spec_.index_dtype() != kv_index_dtype(spec_.kv_dtype); }
  /// "fp8 indexer keys (--index-cache-dtype), " for the pools line when index_keys_differ().
  std::string index_keys_note() const {
    return index_keys_differ()
               ? fmt::format("{} indexer keys (--index-cache-dtype), ",
                             index_cache_dtype_name(spec_.index_cache_dtype))
               : std::string();
  }

  int make_pools() {
    const model::ModelConfig& c = model_.config();
    spec_ = model_.cache_spec(o_.m.kv_dtype(), o_.m.index_cache());
    if (spec_.kv_dtype != KvDtype::kF32 && !ops_.supports_kv_dtype(spec_.kv_dtype)) {
      std::fprintf(stderr, "error: the %s backend has no %s KV cache pools\n",
                   ops_.name().c_str(), kv_dtype_name(spec_.kv_dtype));
      return 1;
    }
    if (spec_.index_cache_dtype == IndexCacheDtype::kFp8 &&
        !ops_.supports_kv_dtype(KvDtype::kFp8)) {
      std::fprintf(stderr, "error: the %s backend has no fp8 indexer-key pools\n",
                   ops_.name().c_str());
      return 1;
    }
    P_ = page_size_for(spec_);
    vpage_b_ = double(cache::KvCache::virtual_page_bytes(spec_, P_));
    swa_b_ = double(cache::KvCache::swa_page_bytes(spec_, P_));
    state_b_ = double(cache::KvCache::state_slot_bytes(spec_));
    const int64_t Bmax = *std::max_element(batches_.begin(), batches_.end());
    const int64_t Lmax = *std::max_element(contexts_.begin(), contexts_.end());
    int64_t budget = o_.kv_cache_bytes;
    if (budget > 0) {
      budget_line_ =
          fmt::format("KV budget {:.2f} GiB (--kv-cache-bytes {})", gib(double(budget)), budget);
    } else {
      const int64_t reserve = engine::workspace_reserve_bytes(
          c, std::max(o_.prefill_chunk, Bmax), std::min<int64_t>(Lmax, c.max_position_embeddings));
      auto b = engine::kv_budget_from_mem_fraction(ops_, o_.mem_fraction, reserve, &budget_line_);
      if (!b.ok()) {
        std::fprintf(stderr, "error: %s\n", b.status().message().c_str());
        return 1;
      }
      budget = *b;
    }
    V4_LOG_INFO("KV budget: {}", budget_line_);
    // Cells that fit the budget decide the pool sizes (no larger than needed).
    int64_t max_seqs = 1, n_swa = 1, n_pages = 1;
    for (int64_t L : contexts_) {
      if (L > c.max_position_embeddings) continue;
      if (prefill_need_bytes(L) <= double(budget)) {
        n_pages = std::max(n_pages, prefill_vpages(L));
        n_swa = std::max(n_swa, prefill_swa(L));
      }
      const int64_t Ld = decode_context(L);
      for (int64_t B : batches_)
        if (Ld > 0 && decode_need_bytes(Ld, B) <= double(budget)) {
          max_seqs = std::max(max_seqs, B);
          n_pages = std::max(n_pages, B * decode_vpages(Ld));
          n_swa = std::max(n_swa, B * decode_swa_per_seq());
        }
    }
    // The pools hold any one fitting cell; shrink toward the budget if the maxima together do not.
    while (double(n_pages) * vpage_b_ + double(n_swa) * swa_b_ + double(max_seqs) * state_b_ >
               double(budget) &&
           n_pages > 1)
      n_pages = std::max<int64_t>(1, n_pages * 7 / 8);
    cache::KvCacheOptions opt{P_, n_pages, n_swa, int(max_seqs)};
    pools_line_ = fmt::format(
        "page {} tokens; {} virtual pages ({:.2f} GiB: C4 KV, indexer keys, C128 KV), {} SWA pages "
        "({:.2f} GiB), {} compressor-state slots ({:.2f} GiB); {} KV values (--kv-cache-dtype), "
        "{}f32 compressor state",
        P_, n_pages, gib(n_pages * vpage_b_), n_swa, gib(n_swa * swa_b_), max_seqs,
        gib(max_seqs * state_b_), kv_dtype_name(spec_.kv_dtype), index_keys_note());
    V4_LOG_INFO("KV pools: {}", pools_line_);
    ops::Ops* o = &ops_;
    try {
      auto kv = cache::KvCache::create(
          spec_, opt, [o](size_t b) { return o->alloc(b); }, [o](void* p) { o->free(p); });
      if (!kv.ok()) {
        std::fprintf(stderr, "error: %s\n", kv.status().message().c_str());
        return 1;
      }
      kv_ = std::move(kv).value();
      model::fill_kv_pools_random(ops_, *kv_, o_.seed);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "error: cannot allocate the KV pools (%s)\n", pools_line_.c_str());
      return 1;
    }
    return 0;
  }

  Row not_fit(Row r, double need_bytes) {
    r.ok = false;
    // MiB below 1 GiB: small budgets (--kv-cache-bytes) would print "0.00 GiB".
    r.why = gib(need_bytes) >= 1.0
                ? fmt::format("does not fit (needs {:.2f} GiB of KV pools)", gib(need_bytes))
                : fmt::format("does not fit (needs {:.2f} MiB of KV pools)", need_bytes / 1048576.0);
    return r;
  }

  // Runs `step` warmup + steps times; fills ms / spread. Returns false (and r.why) on error.
  template <typename Step>
  bool time_steps(Row& r, int warmup, int steps, Step&& step) {
    std::vector<double> t;
    for (int i = 0; i < warmup + steps; ++i) {
      double dt = 0;
      Status st = step(i, &dt);
      if (!st.ok()) {
        r.ok = false;
        r.why = st.code() == ErrorCode::kResourceExhausted ? "does not fit (" + st.message() + ")"
                                                           : "error: " + st.message();
        return false;
      }
      if (i >= warmup) t.push_back(dt * 1e3);
    }
    r.ok = true;
    r.ms = median(t);
    r.ms_min = *std::min_element(t.begin(), t.end());
    r.ms_max = *std::max_element(t.begin(), t.end());
    return true;
  }

  // Wraps a cell: device out-of-memory becomes "does not fit", a CUDA error ends the run.
  template <typename F>
  Row guarded(Row r, F&& f) {
    try {
      return f(r);
    } catch (const std::bad_alloc&) {
      r.ok = false;
      r.why = "does not fit (device memory ran out during the step)";
    } catch (const std::exception& e) {
      r.ok = false;
      r.why = std::string("error: ") + e.what();
      fatal_ = true;
    }
    return r;
  }

  Row decode_cell(int64_t L_asked, int64_t B) {
    const model::ModelConfig& c = model_.config();
    Row r;
    r.phase = "decode";
    r.context = L_asked;
    r.batch = B;
    r.tokens = B;
    if (L_asked > c.max_position_embeddings || decode_context(L_asked) < 1) {
      r.why = fmt::format("exceeds max_position_embeddings {}", c.max_position_embeddings);
      return r;
    }
    const int64_t L = decode_context(L_asked);
    r.context = L;
    if (L != L_asked) clamped_ = true;
    const auto& ko = kv_->options();
    if (B > ko.max_seqs || B * decode_vpages(L) > ko.n_pages ||
        B * decode_swa_per_seq() > ko.n_swa_pages)
      return not_fit(r, decode_need_bytes(L, B));
    return guarded(r, [&](Row r) {
      const bool inject = ++cells_run_ == fail_cell_;  // V4_BENCH_FAIL_CELL
      CellSequences seqs(*kv_);  // freed on every exit, a throwing step included
      Status st = Status::Ok();
      for (int64_t b = 0; b < B && st.ok(); ++b) {
        auto s = seqs.create();
        if (!s.ok()) {
          st = s.status();
          break;
        }
        st = kv_->fast_forward(*s, L);
      }
      if (st.ok()) {
        const int64_t V = c.vocab_size;
        model::DeepseekV4::DecodeStats st0;
        time_steps(r, o_.warmup, o_.steps, [&](int i, double* dt) -> Status {
          if (i == o_.warmup) {
            st0 = model_.decode_stats();
            ops_.reset_region_profile();
          }
          model::ForwardBatch batch;
          for (int64_t b = 0; b < B; ++b) {
            batch.slices.push_back({seqs.ids()[size_t(b)], L + i,
                                    {int32_t((b * 7919 + i * 104729 + 13) % V)}, false});
            if (o_.sampling == "device") batch.slices.back().sample = model::DeviceSampling{};
          }
          if (inject) throw std::bad_alloc();
          const bool prof = i == o_.warmup && profile_decode_;
          if (prof) ops_.profiler_range(true);
          const double t0 = now_s();
          auto out = model_.forward(batch, *kv_);
          ops_.synchronize();
          *dt = now_s() - t0;
          if (prof) ops_.profiler_range(false);
          return out.ok() ? Status::Ok() : out.status();
        });
        r.path = path_of(st0, model_.decode_stats(), o_.steps) + mode_suffix();
        if (o_.profile) r.profile = ops_.region_profile();
      } else {
        r.why = "does not fit (" + st.message() + ")";
      }
      seqs.release();
      if (r.ok) {
        r.tok_s = double(B) / (r.ms / 1e3);
        const auto bytes =
            model::decode_step_bytes(c, model_.weights(), B, L, kv_->kv_dtype(),
                                     kv_->spec().index_cache_dtype);
        r.floor_amount = bytes.total();
        r.floor_ms = bytes.total() / bw_ * 1e3;
      }
      return r;
    });
  }

  Row prefill_cell(int64_t L) {
    const model::ModelConfig& c = model_.config();
    const int64_t chunk = chunk_for(L);
    Row r;
    r.phase = "prefill";
    r.context = L;
    r.batch = 1;
    r.tokens = chunk;
    if (L > c.max_position_embeddings) {
      r.why = fmt::format("exceeds max_position_embeddings {}", c.max_position_embeddings);
      return r;
    }
    const auto& ko = kv_->options();
    if (prefill_vpages(L) > ko.n_pages || prefill_swa(L) > ko.n_swa_pages)
      return not_fit(r, prefill_need_bytes(L));
    return guarded(r, [&](Row r) {
      const bool inject = ++cells_run_ == fail_cell_;  // V4_BENCH_FAIL_CELL
      const int64_t V = c.vocab_size;
      std::vector<int32_t> ids(static_cast<size_t>(chunk));
      for (int64_t i = 0; i < chunk; ++i) ids[size_t(i)] = int32_t((i * 7919 + 7) % V);
      time_steps(r, o_.prefill_warmup, o_.prefill_steps, [&](int i, double* dt) -> Status {
        if (i == o_.prefill_warmup) ops_.reset_region_profile();  // time the timed steps only
        CellSequences seq(*kv_);  // freed on every exit, a throwing step included
        V4_ASSIGN_OR_RETURN(int32_t s, seq.create());
        Status st = kv_->fast_forward(s, L - chunk);
        if (st.ok()) {
          model::ForwardBatch batch;
          batch.slices.push_back({s, L - chunk, ids, false});
          if (inject) throw std::bad_alloc();
          const bool prof = i == o_.prefill_warmup && profile_prefill_;
          if (prof) ops_.profiler_range(true);
          const double t0 = now_s();
          auto out = model_.forward(batch, *kv_);
          ops_.synchronize();
          *dt = now_s() - t0;
          if (prof) ops_.profiler_range(false);
          if (!out.ok()) st = out.status();
        }
        seq.release();
        return st;
      });
      r.path = "host plan" + mode_suffix();
      if (o_.profile) r.profile = ops_.region_profile();
      if (r.ok) {
        r.tok_s = double(chunk) / (r.ms / 1e3);
        const auto f = model::prefill_step_flops(c, L - chunk, chunk);
        r.floor_amount = f.total();
        r.floor_ms = peak_tflops_ > 0 ? f.total() / (peak_tflops_ * 1e12) * 1e3 : 0;
      }
      return r;
    });
  }

  void emit(const Row& r) {
    rows_.push_back(r);
    std::printf("%s\n", row_md(r).c_str());
    std::fflush(stdout);
  }

  void write_markdown() {
    const model::ModelConfig& c = model_.config();
    const model::Weights& w = model_.weights();
    std::string md;
    md += fmt::format("# v4serve bench: {} ({} layers{})\n\n", o_.m.model, c.num_hidden_layers,
                      o_.m.num_layers > 0 ? ", cut with --num-layers" : "");
    md += fmt::format("- device: {}\n", ops_.device_info());
    md += fmt::format("- commit: {}\n", commit_id(cli::model_dir_of(o_.m.model)));
    md += fmt::format("- command: `{}`\n", command_line());
    md += fmt::format("- date: {}\n", utc_now());
    md += fmt::format("- backend: {}, precision {}, KV cache {}{}\n", ops_.name(), o_.m.precision,
                      kv_dtype_name(spec_.kv_dtype),
                      index_keys_differ()
                          ? fmt::format(" (indexer keys {})",
                                        index_cache_dtype_name(spec_.index_cache_dtype))
                          : std::string());
    if (!o_.multi_stream.empty())
      md += fmt::format("- multi-stream (--multi-stream {}): each cell once per mode, named in "
                        "its path column\n",
                        o_.multi_stream);
    std::string wb;
    double total = double(w.vector_bytes());
    for (const auto& [f, b] : w.bytes_by_format()) {
      wb += fmt::format("{} {:.3f} GiB, ", f, gib(double(b)));
      total += double(b);
    }
    md += fmt::format(
        "- weights ({}): matrices {}f32/i32 vectors (embedding, norms, mHC, router, tables) {:.3f} "
        "GiB; total {:.3f} GiB\n",
        o_.m.dummy() ? "--load-format dummy" : "checkpoint", wb, gib(double(w.vector_bytes())),
        gib(total));
    md += fmt::format("- {}\n", budget_line_);
    md += fmt::format(
        "- KV pools (allocated once, filled with random values; fp8 rows quantized from N(0, 1) "
        "rows, so their scales are real): {}\n",
        pools_line_);
    md += fmt::format("- measured copy bandwidth: {}\n", bw_line_);
    if (o_.m.dummy()) md += fmt::format("- note: {}\n", cli::kDummyRoutingNote);
    md += o_.profile
              ? std::string("- per-region profile (--profile): tables after the results, one per "
                            "decode and prefill cell that ran\n")
              : fmt::format("- per-region profile: not taken ({})\n",
                            profiling_supported_
                                ? "add --profile for per-region device time of decode and "
                                  "prefill steps"
                                : "the " + ops_.name() +
                                      " backend has no device timers; --profile needs --device "
                                      "cuda");
    md += fmt::format(
        "- decode: B sequences brought to `context` tokens by KvCache::fast_forward (not "
        "computed); "
        "a step decodes 1 token per sequence (plan — on the host, or on the device with graph "
        "replay: column `path` —, all layers, lm_head, {}); median (and "
        "min–max) of {} steps after {} warm-up, synchronize + "
        "steady_clock. Byte floor = bytes the step must read (all non-expert matrices, expected "
        "distinct routed experts E·(1 − (1 − k/E)^B) per MoE layer, lm_head, the KV rows the "
        "queries read, model::decode_step_bytes) / measured copy bandwidth.\n",
        o_.sampling == "device"
            ? "greedy sampling on the backend as `serve` does, B token ids downloaded "
              "(--sampling device; a backend that cannot sample returns logits)"
            : fmt::format("logits download of B × {} f32 (--sampling logits)", c.vocab_size),
        o_.steps, o_.warmup);
    if (clamped_)
      md += fmt::format(
          "- decode cells whose warm-up + steps would pass max_position_embeddings ({}) start at "
          "{} − {} tokens; the context column shows the context used.\n",
          c.max_position_embeddings, c.max_position_embeddings, steps_total());
    md += fmt::format(
        "- prefill: one sequence fast-forwarded to context − chunk, one step of `chunk` tokens; "
        "median of {} after {} warm-up. FLOP floor = model::prefill_step_flops (2 · active "
        "parameters · tokens + attention + indexer) / {}.\n\n",
        o_.prefill_steps, o_.prefill_warmup,
        peak_tflops_ > 0
            ? fmt::format("a constant dense bf16 peak of {:.0f} TFLOP/s ({})", peak_tflops_,
                          o_.peak_tflops >= 0
                              ? "--peak-tflops"
                              : "not measured in this run: bench/results/cuda-kernels.md measured "
                                "cuBLASLt bf16 GEMM at 790–872 TFLOP/s on the H200")
            : std::string("no peak given (--peak-tflops): no FLOP floor"));
    md +=
        "| phase | context | batch | tokens/step | ms/step (median) | min–max ms | tok/s | "
        "floor amount | floor ms | time/floor | path |\n";
    md += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    for (const Row& r : rows_)
      if (r.phase == "decode") md += row_md(r) + "\n";
    for (const Row& r : rows_)
      if (r.phase == "prefill") md += row_md(r) + "\n";
    for (const Row& r : rows_) {
      if (!o_.profile || !r.ok) continue;
      if (!r.profile.empty()) {
        md += profile_md(r);
      } else {  // profiling on but no marker came back (a backend that records none)
        md += fmt::format("\n## {} step profile: batch {}, context {}\n\nNo region markers were "
                          "recorded by the {} backend for this cell.\n",
                          r.phase == "decode" ? "Decode" : "Prefill", r.batch, r.context,
                          ops_.name());
      }
    }
    std::printf("\n%s", md.c_str());
    if (!o_.out.empty()) {
      std::ofstream f(o_.out);
      f << md;
      if (!f) std::fprintf(stderr, "error: cannot write %s\n", o_.out.c_str());
    }
  }

  // --profile: a timed step split into the model's regions (ops.h Ops::region), device time
  // from CUDA events between consecutive region markers, per step. Decode cells: the decode path
  // (events inside the graph when replayed); prefill cells: the host-plan path, launched eagerly.
  std::string profile_md(const Row& r) const {
    std::vector<ops::Ops::RegionTime> p = r.profile;
    std::sort(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
    double total = 0;
    for (const auto& t : p) total += t.ms;
    const bool decode = r.phase == "decode";
    const int n_steps = decode ? o_.steps : o_.prefill_steps;
    const double steps = double(n_steps);
    std::string md =
        decode
            ? fmt::format(
                  "\n## Decode step profile: batch {}, context {}\n\n"
                  "Device time per step between region markers (CUDA events recorded in the "
                  "step, inside the graph when replayed), summed over the layers of each kind; "
                  "{} steps. Sum of regions {:.3f} ms/step vs {:.3f} ms/step wall (the difference "
                  "is host time outside the device step: plan staging, synchronize).\n\n",
                  r.batch, r.context, n_steps, total / steps, r.ms)
            : fmt::format(
                  "\n## Prefill step profile: {} tokens at context {}\n\n"
                  "Device time per step between region markers (CUDA events recorded in the "
                  "step; the prefill path plans on the host and launches eagerly, so a region "
                  "also holds any device idle time while the host issues its kernels), summed "
                  "over the layers of each kind; {} steps. Sum of regions {:.3f} ms/step vs "
                  "{:.3f} ms/step wall{}.\n\n",
                  r.tokens, r.context, n_steps, total / steps, r.ms,
                  r.floor_ms > 0 ? fmt::format(" and a FLOP floor of {} ms", num(r.floor_ms))
                                 : std::string());
    md += "| region | entries/step | µs/step | µs/entry | share |\n|---|---:|---:|---:|---:|\n";
    for (const auto& t : p)
      md += fmt::format("| {} | {:.0f} | {} | {} | {:.1f}% |\n", t.name, double(t.calls) / steps,
                        num(t.ms * 1e3 / steps), num(t.ms * 1e3 / double(std::max<int64_t>(1, t.calls))),
                        total > 0 ? 100.0 * t.ms / total : 0.0);
    return md;
  }

  const BenchOptions& o_;
  ops::Ops& ops_;
  model::DeepseekV4& model_;
  std::vector<int64_t> batches_, contexts_;
  double bw_ = 0, peak_tflops_ = 0;
  std::string bw_line_, budget_line_, pools_line_;
  cache::CacheSpec spec_;
  int P_ = 256;
  double vpage_b_ = 0, swa_b_ = 0, state_b_ = 0;
  std::unique_ptr<cache::KvCache> kv_;
  std::vector<Row> rows_;
  bool fatal_ = false;
  bool clamped_ = false;  // a decode cell ran below its asked context (max_position_embeddings)
  bool profiling_supported_ = false;  // the backend has device timers (Ops::set_profiling)
  int mode_ = -1;                     // current --multi-stream mode (−1: backend default)
  int cells_run_ = 0;                 // cells that reached their steps (V4_BENCH_FAIL_CELL)
  const int fail_cell_ = fail_cell_from_env();
  const bool profile_prefill_ = profiler_phase_from_env("prefill");
  const bool profile_decode_ = profiler_phase_from_env("decode");
};

int run_bench(const BenchOptions& o) {
  std::unique_ptr<ThreadPool> pool;
  if (o.threads > 0) pool = std::make_unique<ThreadPool>(o.threads);
  const double t0 = now_s();
  // The lists first: a typo in --batch / --context is reported before the weights load (minutes
  // on a large model).
  auto bs = parse_list(o.batches, "--batch");
  auto ls = parse_list(o.contexts, "--context");
  if (!bs.ok() || !ls.ok()) {
    std::fprintf(stderr, "error: %s\n", (!bs.ok() ? bs.status() : ls.status()).message().c_str());
    return 2;
  }
  // Then the backend: --profile is refused on one without device timers before the weights
  // load (minutes on a large model).
  auto backend = cli::make_model_backend(o.m, pool.get());
  if (!backend.ok()) {
    std::fprintf(stderr, "error: %s\n", backend.status().message().c_str());
    return backend.status().code() == ErrorCode::kInvalidArgument ? 2 : 1;
  }
  if (o.profile && !(*backend)->set_profiling(true)) {
    std::fprintf(stderr,
                 "error: --profile: the %s backend has no device timers (per-region profiles "
                 "need --device cuda)\n",
                 (*backend)->name().c_str());
    return 2;
  }
  auto lm = cli::load_model(o.m, std::move(backend).value());
  if (!lm.ok()) {
    std::fprintf(stderr, "error: %s\n", lm.status().message().c_str());
    return lm.status().code() == ErrorCode::kInvalidArgument ? 2 : 1;
  }
  V4_LOG_INFO("model ready in {:.2f} s on {}", now_s() - t0, lm->ops->device_info());
  int rc = 0;
  {
    Bench b(o, *lm);
    rc = b.run(std::move(bs).value(), std::move(ls).value());
  }  // pools freed before the model and the backend
  return rc;
}

}  // namespace

V4_REGISTER_COMMAND(
    bench, "bench",
    "time decode steps (per batch size) and prefill steps (per context length) next to their "
    "byte / FLOP floors",
    [](CLI::App& app) {
      auto o = std::make_shared<BenchOptions>();
      app.add_option("--model", o->m.model,
                     "checkpoint directory; with --load-format dummy also a config.json file")
          ->required();
      app.add_option("--device", o->m.device, "op backend: cpu (default) or cuda")
          ->check(CLI::IsMember({"cpu", "cuda"}));
      v4::cli::add_model_options(app, &o->m);
      app.add_option("--batch", o->batches, "decode batch sizes (default 1,16,64,256)");
      app.add_option("--context", o->contexts,
                     "context lengths, K/M suffixes allowed (default 4096,131072,1048576)");
      app.add_option("--prefill-chunk", o->prefill_chunk,
                     "tokens of the timed prefill step (default 4096)")
          ->check(v4::cli::int_at_least(1));
      app.add_option("--steps", o->steps, "timed decode steps per cell (default 10)")
          ->check(v4::cli::int_at_least(1, INT32_MAX));
      app.add_option("--warmup", o->warmup, "untimed decode steps first (default 3)")
          ->check(v4::cli::int_at_least(0, INT32_MAX));
      app.add_option("--prefill-steps", o->prefill_steps,
                     "timed prefill steps per context (default 3)")
          ->check(v4::cli::int_at_least(1, INT32_MAX));
      app.add_option("--prefill-warmup", o->prefill_warmup,
                     "untimed prefill steps first (default 1)")
          ->check(v4::cli::int_at_least(0, INT32_MAX));
      app.add_option("--mem-fraction", o->mem_fraction,
                     "KV budget = fraction x total - in use after the weights - workspace reserve "
                     "(default 0.9)")
          ->check(v4::cli::number_range(0.0, 1.0, /*open_lo=*/true));
      app.add_option("--kv-cache-bytes", o->kv_cache_bytes,
                     "KV budget in bytes (wins over --mem-fraction)")
          ->check(v4::cli::int_at_least(0));
      app.add_option("--peak-tflops", o->peak_tflops,
                     "dense peak for the prefill FLOP floor (default: 790 on cuda, none on cpu)")
          ->check(v4::cli::number_at_least(0.0));
      app.add_option("--copy-mib", o->copy_mib,
                     "MiB per copy of the bandwidth measurement (default 0: 1024 on cuda, 256 on cpu)")
          ->check(v4::cli::int_at_least(0, int64_t(1) << 20));
      app.add_option("--threads", o->threads,
                     "CPU threads (default 0: V4_NUM_THREADS or all cores)")
          ->check(v4::cli::int_range(0, 4096));
      app.add_option("--seed", o->seed, "seed of the random KV pool contents")
          ->check(v4::cli::int_at_least(0));
      app.add_option("--out", o->out, "write the Markdown report to this file");
      app.add_option("--sampling", o->sampling,
                     "decode steps end with greedy sampling on the backend (device, as serve) or "
                     "download every logits row (logits)")
          ->check(CLI::IsMember({"device", "logits"}));
      app.add_option("--multi-stream", o->multi_stream,
                     "run every cell in these multi-stream modes, e.g. off,on (cuda only; "
                     "default: the backend's, V4_MULTI_STREAM)")
          ->check([](const std::string& v) -> std::string {
            std::stringstream ss(v);
            std::string item;
            int n = 0;
            while (std::getline(ss, item, ',')) {
              if (item != "on" && item != "off") return "expected a list of on/off, e.g. off,on";
              ++n;
            }
            return n ? "" : "expected a list of on/off, e.g. off,on";
          });
      app.add_flag("--profile", o->profile,
                   "per-region device time of the timed decode and prefill steps (CUDA events; cuda only)");
      return std::function<int()>([o] { return run_bench(*o); });
    });
