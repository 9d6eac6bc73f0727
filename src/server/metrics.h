// Server metrics in Prometheus text format (version 0.0.4): counters, fixed-bucket histograms,
// and gauges taken from the engine at scrape time. Names are listed in docs/server.md.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace v4::server {

/// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  /// Appends `name_bucket{le=..}`, `name_sum`, `name_count` lines.
  void render(const std::string& name, std::string* out) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (non-cumulative), last = +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

/// All server-side metrics; thread-safe.
class Metrics {
 public:
  Metrics();
  /// A finished HTTP request on `endpoint` ("/v1/chat/completions", ...) with `status`.
  void count_request(const std::string& endpoint, int status);
  /// A finished generation (one choice): tokens and times in seconds (ttft < 0: no token).
  /// `counts_prompt`: whether this choice counts its prompt (and cached) tokens and the prompt
  /// length histogram — only the first choice of each prompt does, so n > 1 counts each prompt
  /// once per request, as `usage.prompt_tokens` does.
  void observe_generation(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens,
                          double ttft_s, double e2e_s, const std::string& finish_reason,
                          bool counts_prompt = true);
  /// One inter-token latency sample (seconds between two consecutive outputs of a request).
  void observe_itl(double itl_s);
  /// The full Prometheus text, with engine gauges from `stats` and `open_connections`.
  std::string render(const engine::EngineStats& stats, int64_t open_connections,
                     const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::string, int64_t> finish_reasons_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
  Histogram ttft_, tpot_, itl_, e2e_, prompt_len_, gen_len_;
};

}  // namespace v4::server
