#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace v4::server {

namespace {
std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
          0.75,  1.0,    2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0};
}
std::vector<double> length_bounds() {
  std::vector<double> b;
  for (double x = 1; x <= 1048576; x *= 4) b.push_back(x);
  return b;
}
std::string fmt_double(double v) {
  if (std::isinf(v)) return "+Inf";
  return fmt::format("{}", v);
}
std::string escape_label(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}
}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i]++;
  sum_ += v;
  count_++;
}

void Histogram::render(const std::string& name, std::string* out) const {
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    *out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, fmt_double(bounds_[i]), cum);
  }
  cum += counts_.back();
  *out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cum);
  *out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
}

Metrics::Metrics()
    : ttft_(latency_bounds()),
      tpot_(latency_bounds()),
      itl_(latency_bounds()),
      e2e_(latency_bounds()),
      prompt_len_(length_bounds()),
      gen_len_(length_bounds()) {}

// The endpoint label takes a fixed set of values (client-chosen paths must not create series).
static std::string endpoint_label(const std::string& path) {
  static const char* kKnown[] = {"/v1/chat/completions", "/v1/completions", "/v1/models",
                                 "/health", "/metrics", "/tokenize", "/detokenize"};
  for (const char* k : kKnown)
    if (path == k) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  requests_[{endpoint_label(endpoint), status}]++;
}

void Metrics::observe_generation(int64_t prompt_tokens, int64_t completion_tokens,
                                 int64_t cached_tokens, double ttft_s, double e2e_s,
                                 const std::string& finish_reason, bool counts_prompt) {
  std::lock_guard<std::mutex> lk(mu_);
  if (counts_prompt) {
    prompt_tokens_ += prompt_tokens;
    cached_tokens_ += cached_tokens;
    prompt_len_.observe(double(prompt_tokens));
  }
  completion_tokens_ += completion_tokens;
  finish_reasons_[finish_reason]++;
  gen_len_.observe(double(completion_tokens));
  if (ttft_s >= 0) ttft_.observe(ttft_s);
  if (e2e_s >= 0) e2e_.observe(e2e_s);
  if (ttft_s >= 0 && completion_tokens > 1) tpot_.observe((e2e_s - ttft_s) / double(completion_tokens - 1));
}

void Metrics::observe_itl(double itl_s) {
  std::lock_guard<std::mutex> lk(mu_);
  itl_.observe(itl_s);
}

std::string Metrics::render(const engine::EngineStats& st, int64_t open_connections,
                            const std::string& model_name) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string o;
  auto head = [&](const char* name, const char* type, const char* help) {
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  head("v4serve_http_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  for (auto& [k, v] : requests_) {
    o += fmt::format("v4serve_http_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n",
                     escape_label(k.first), k.second, v);
  }
  head("v4serve_request_success_total", "counter",
       "Finished generations (choices; one engine request each), by finish reason. "
       "finish_reason=\"abort\": cancelled before its end (client gone, shutdown, a failed "
       "submit of the request), the same requests as v4serve_engine_requests_aborted_total "
       "(rarely not: a stop-string finish racing a client disconnect can count as \"stop\" here "
       "and as aborted in the engine).");
  for (auto& [k, v] : finish_reasons_) {
    o += fmt::format("v4serve_request_success_total{{finish_reason=\"{}\"}} {}\n", escape_label(k), v);
  }
  head("v4serve_prompt_tokens_total", "counter", "Prompt tokens of finished generations.");
  o += fmt::format("v4serve_prompt_tokens_total {}\n", prompt_tokens_);
  head("v4serve_generation_tokens_total", "counter", "Generated tokens of finished generations.");
  o += fmt::format("v4serve_generation_tokens_total {}\n", completion_tokens_);
  head("v4serve_cached_prompt_tokens_total", "counter", "Prompt tokens served from the prefix cache.");
  o += fmt::format("v4serve_cached_prompt_tokens_total {}\n", cached_tokens_);

  head("v4serve_time_to_first_token_seconds", "histogram", "Time from arrival to first token.");
  ttft_.render("v4serve_time_to_first_token_seconds", &o);
  head("v4serve_time_per_output_token_seconds", "histogram", "Mean time per output token after the first, per request.");
  tpot_.render("v4serve_time_per_output_token_seconds", &o);
  head("v4serve_inter_token_latency_seconds", "histogram", "Time between consecutive outputs of a request.");
  itl_.render("v4serve_inter_token_latency_seconds", &o);
  head("v4serve_e2e_request_latency_seconds", "histogram", "Time from arrival to the last token.");
  e2e_.render("v4serve_e2e_request_latency_seconds", &o);
  head("v4serve_request_prompt_tokens", "histogram", "Prompt length per request.");
  prompt_len_.render("v4serve_request_prompt_tokens", &o);
  head("v4serve_request_generation_tokens", "histogram", "Generated length per request.");
  gen_len_.render("v4serve_request_generation_tokens", &o);

  head("v4serve_num_requests_running", "gauge", "Requests in the running batch.");
  o += fmt::format("v4serve_num_requests_running {}\n", st.running);
  head("v4serve_num_requests_waiting", "gauge", "Requests waiting (queued or preempted).");
  o += fmt::format("v4serve_num_requests_waiting {}\n", st.waiting);
  head("v4serve_open_connections", "gauge", "Open HTTP connections.");
  o += fmt::format("v4serve_open_connections {}\n", open_connections);
  head("v4serve_engine_prompt_tokens_total", "counter", "Prompt tokens computed by the engine (recomputes included).");
  o += fmt::format("v4serve_engine_prompt_tokens_total {}\n", st.prompt_tokens_total);
  head("v4serve_engine_generation_tokens_total", "counter", "Tokens sampled by the engine.");
  o += fmt::format("v4serve_engine_generation_tokens_total {}\n", st.generation_tokens_total);
  head("v4serve_engine_requests_finished_total", "counter",
       "Requests the engine finished (EOS, stop token or stop string, length, error).");
  o += fmt::format("v4serve_engine_requests_finished_total {}\n", st.requests_finished_total);
  head("v4serve_engine_requests_aborted_total", "counter",
       "Requests cancelled before their end (client gone, shutdown); a stop-string finish is "
       "counted as finished (rarely, when the client disconnects as the stop string matches, the "
       "disconnect's cancel lands first and it counts here while the API counted \"stop\").");
  o += fmt::format("v4serve_engine_requests_aborted_total {}\n", st.requests_aborted_total);
  head("v4serve_engine_requests_rejected_total", "counter", "Requests refused at submit.");
  o += fmt::format("v4serve_engine_requests_rejected_total {}\n", st.requests_rejected_total);
  head("v4serve_engine_callback_errors_total", "counter",
       "Output callbacks that threw (their requests were aborted).");
  o += fmt::format("v4serve_engine_callback_errors_total {}\n", st.callback_errors_total);
  head("v4serve_engine_preemptions_total", "counter", "Preemptions (recompute) under memory pressure.");
  o += fmt::format("v4serve_engine_preemptions_total {}\n", st.preemptions_total);
  head("v4serve_engine_steps_total", "counter", "Engine steps run.");
  o += fmt::format("v4serve_engine_steps_total {}\n", st.steps_total);
  head("v4serve_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.");
  o += fmt::format("v4serve_prefix_cache_queries_total {}\n", st.prefix_query_tokens_total);
  head("v4serve_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.");
  o += fmt::format("v4serve_prefix_cache_hits_total {}\n", st.prefix_hit_tokens_total);
  head("v4serve_prompt_throughput_tokens_per_second", "gauge", "Prompt tokens/s over the last stats interval.");
  o += fmt::format("v4serve_prompt_throughput_tokens_per_second {}\n", st.prompt_tokens_per_s);
  head("v4serve_generation_throughput_tokens_per_second", "gauge", "Generated tokens/s over the last stats interval.");
  o += fmt::format("v4serve_generation_throughput_tokens_per_second {}\n", st.generation_tokens_per_s);

  head("v4serve_engine_step_host_seconds_total", "counter",
       "Scheduler-thread wall time per step phase: schedule, batch (building it), forward "
       "(Executor::forward: model host work + device step + readback), post (sampling, stop "
       "checks, outputs), between (the engine loop from one step's end to the next's start).");
  for (const auto& [phase, v] : {std::pair<const char*, double>{"schedule", st.step_schedule_s},
                                 {"batch", st.step_batch_s},
                                 {"forward", st.step_forward_s},
                                 {"post", st.step_post_s},
                                 {"between", st.step_between_s}})
    o += fmt::format("v4serve_engine_step_host_seconds_total{{phase=\"{}\"}} {}\n", phase, v);
  head("v4serve_gpu_steps_total", "counter", "Model steps timed on the device (CUDA events).");
  o += fmt::format("v4serve_gpu_steps_total {}\n", st.device.steps);
  head("v4serve_gpu_busy_seconds_total", "counter", "Device time inside model steps.");
  o += fmt::format("v4serve_gpu_busy_seconds_total {}\n", st.device.busy_s);
  head("v4serve_gpu_idle_seconds_total", "counter", "Device time between one step's end and the next step's start.");
  o += fmt::format("v4serve_gpu_idle_seconds_total {}\n", st.device.idle_s);
  head("v4serve_gpu_decode_steps_total", "counter", "Decode-only steps that followed a decode-only step.");
  o += fmt::format("v4serve_gpu_decode_steps_total {}\n", st.device.decode_steps);
  head("v4serve_gpu_decode_busy_seconds_total", "counter", "Device time inside those decode steps.");
  o += fmt::format("v4serve_gpu_decode_busy_seconds_total {}\n", st.device.decode_busy_s);
  head("v4serve_gpu_decode_idle_seconds_total", "counter", "Device idle time before those decode steps.");
  o += fmt::format("v4serve_gpu_decode_idle_seconds_total {}\n", st.device.decode_idle_s);
  head("v4serve_gpu_decode_host_prep_seconds_total", "counter",
       "Of that idle time: the model's host work inside forward before each decode step "
       "(validation, KV reserve, staging); the rest is the engine's.");
  o += fmt::format("v4serve_gpu_decode_host_prep_seconds_total {}\n", st.device.decode_host_prep_s);
  head("v4serve_gpu_decode_host_gap_seconds_total", "counter",
       "Host wall time from the previous step's end (its sync returned) to those decode steps' "
       "start: the host side of the idle time; idle well above it means device work between steps.");
  o += fmt::format("v4serve_gpu_decode_host_gap_seconds_total {}\n", st.device.decode_host_gap_s);
  head("v4serve_cache_used_pages", "gauge", "Pages in use per cache pool.");
  for (auto& p : st.pools) o += fmt::format("v4serve_cache_used_pages{{pool=\"{}\"}} {}\n", escape_label(p.name), p.used_pages);
  head("v4serve_cache_capacity_pages", "gauge", "Total pages per cache pool.");
  for (auto& p : st.pools) o += fmt::format("v4serve_cache_capacity_pages{{pool=\"{}\"}} {}\n", escape_label(p.name), p.capacity_pages);
  // Bytes (pages x backend bytes per page), so a long request's memory per pool can be read off
  // /metrics; only for pools whose page size is known.
  head("v4serve_cache_used_bytes", "gauge", "Backend memory of the pages in use per cache pool.");
  for (auto& p : st.pools)
    if (p.bytes_per_page > 0)
      o += fmt::format("v4serve_cache_used_bytes{{pool=\"{}\"}} {}\n", escape_label(p.name), p.used_pages * p.bytes_per_page);
  head("v4serve_cache_capacity_bytes", "gauge", "Backend memory of each cache pool.");
  for (auto& p : st.pools)
    if (p.bytes_per_page > 0)
      o += fmt::format("v4serve_cache_capacity_bytes{{pool=\"{}\"}} {}\n", escape_label(p.name), p.capacity_pages * p.bytes_per_page);
  head("v4serve_cache_usage_ratio", "gauge", "Fraction of each cache pool in use (0..1).");
  for (auto& p : st.pools) {
    double r = p.capacity_pages > 0 ? double(p.used_pages) / double(p.capacity_pages) : 0.0;
    o += fmt::format("v4serve_cache_usage_ratio{{pool=\"{}\"}} {}\n", escape_label(p.name), r);
  }
  head("v4serve_model_info", "gauge", "The served model name.");
  o += fmt::format("v4serve_model_info{{model_name=\"{}\"}} 1\n", escape_label(model_name));
  return o;
}

}  // namespace v4::server
