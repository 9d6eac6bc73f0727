// `v4serve serve`: load a checkpoint, start the engine and the OpenAI-compatible HTTP server.
#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <unistd.h>

#include "base/log.h"
#include "base/thread_pool.h"
#include "cli/command.h"
#include "cli/model_args.h"
#include "cli/validators.h"
#include "engine/engine.h"
#include "engine/model_executor.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "text/tokenizer.h"

namespace {

namespace fs = std::filesystem;

// Stop signal delivered to a thread that does not block SIGINT/SIGTERM (one started before
// run_serve, e.g. by a library at load time): the handler records it instead of the default
// action killing the process mid-drain; wait_stop_signal reads it.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int s) { g_stop_signal = s; }

// Waits up to timeout_ms for SIGINT/SIGTERM (blocked: sigtimedwait; or caught by on_stop_signal
// in another thread). Returns the signal number, 0 on timeout.
int wait_stop_signal(const sigset_t& sigs, int timeout_ms) {
  timespec ts{timeout_ms / 1000, long(timeout_ms % 1000) * 1000000L};
  const int s = sigtimedwait(&sigs, nullptr, &ts);
  if (s > 0) return s;
  const int caught = g_stop_signal;
  g_stop_signal = 0;
  return caught;
}

/// Upper bound of the seconds flags (a year): they become int64 milliseconds or chrono durations.
constexpr double kMaxSeconds = 365.0 * 24 * 3600;

struct ServeOptions {
  v4::cli::ModelArgs m;
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string tokenizer;
  std::string api_key;
  bool api_key_given = false;  // --api-key or V4SERVE_API_KEY was set (maybe to "")
  int64_t chunked_prefill_size = 2048;
  int32_t max_running_requests = 256;
  int64_t kv_cache_bytes = int64_t(1) << 30;
  bool kv_cache_bytes_given = false;  // an explicit --kv-cache-bytes wins over --mem-fraction
  double mem_fraction = 0;
  int64_t max_context = 0;
  int64_t prefix_cache_bytes = int64_t(256) << 20;
  bool prefix_cache_bytes_given = false;
  int64_t prefix_snapshot_interval = 0;
  bool disable_prefix_cache = false;
  std::string served_model_name;
  int http_threads = 2;
  int threads = 0;  // CPU op threads (0: V4_NUM_THREADS or all cores)
  int64_t max_body_bytes = 32ll << 20;
  double header_timeout_s = 10.0;
  double idle_timeout_s = 120.0;
  double stats_interval_s = 5.0;
  std::string effort_profile = "preview";
  bool default_thinking = false;
  bool no_access_log = false;
  bool sync_outputs = false;
  double shutdown_timeout_s = 30.0;
};

int run_serve(const ServeOptions& o) {
  // Block the stop signals in every thread started from here on; the main thread waits for them
  // with sigtimedwait. Threads that already exist may not block them: a handler (not the default
  // action) catches those deliveries, so a second signal during the drain cannot kill the process.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  {  // --host before minutes of loading: an IP address (the server binds it as given)
    boost::system::error_code ec;
    boost::asio::ip::make_address(o.host, ec);
    if (ec) {
      V4_LOG_ERROR("bad --host '{}': {} (expected an IPv4 or IPv6 address, e.g. 127.0.0.1 or 0.0.0.0)",
                   o.host, ec.message());
      return 2;
    }
  }
  const bool dummy = o.m.dummy();
  if (o.m.model.empty() || !(fs::is_directory(o.m.model) || (dummy && fs::is_regular_file(o.m.model)))) {
    V4_LOG_ERROR("--model '{}' is not a directory (expected config.json + *.safetensors{})", o.m.model,
                 dummy ? ", or a config.json file with --load-format dummy" : "");
    return 2;
  }
  const std::string model_dir = v4::cli::model_dir_of(o.m.model);
  const std::string tok_path = o.tokenizer.empty() ? (fs::path(model_dir) / "tokenizer.json").string() : o.tokenizer;
  if (o.tokenizer.empty() && !fs::exists(tok_path)) {
    V4_LOG_ERROR("no tokenizer.json in {}: pass --tokenizer FILE", model_dir);
    return 2;
  }
  auto tok = v4::text::Tokenizer::from_file(tok_path);
  if (!tok.ok()) {
    V4_LOG_ERROR("cannot load the tokenizer: {} (pass --tokenizer FILE)", tok.status().message());
    return 2;
  }

  // Weights: the loader logs the totals, "bytes / total, tensors / total" every 5 s and a final
  // line with seconds and GB/s (model::LoadObserver); it refuses up front what cannot fit.
  V4_LOG_INFO("{} {} on {} ...", dummy ? "generating dummy weights for" : "loading", o.m.model,
              o.m.device);
  auto t0 = std::chrono::steady_clock::now();
  v4::engine::ModelExecutorOptions mo;
  mo.kv_budget_bytes = o.kv_cache_bytes;
  mo.mem_fraction = o.kv_cache_bytes_given ? 0.0 : o.mem_fraction;
  if (o.kv_cache_bytes_given && o.mem_fraction > 0)
    V4_LOG_INFO("--kv-cache-bytes {} given: --mem-fraction ignored", o.kv_cache_bytes);
  mo.max_sequences = o.max_running_requests;
  mo.max_chunk_tokens = o.chunked_prefill_size;
  mo.max_context = o.max_context;
  mo.kv_dtype = o.m.kv_dtype();
  mo.index_cache_dtype = o.m.index_cache();
  mo.prefix_cache_bytes = o.disable_prefix_cache ? 0 : o.prefix_cache_bytes;
  mo.prefix_cache_optional = !o.prefix_cache_bytes_given;  // the default budget may not fit
  mo.prefix_snapshot_interval = o.prefix_snapshot_interval;
  // Declared before the model and the engine: destroyed after them.
  std::unique_ptr<v4::ThreadPool> pool;
  if (o.threads > 0) pool = std::make_unique<v4::ThreadPool>(o.threads);
  auto lm = v4::cli::load_model(o.m, pool.get());
  v4::Result<std::unique_ptr<v4::engine::ModelExecutor>> exec =
      lm.ok() ? v4::engine::ModelExecutor::create(std::move(lm->ops), std::move(lm->model), mo)
              : v4::Result<std::unique_ptr<v4::engine::ModelExecutor>>(lm.status());
  if (!exec.ok()) {
    V4_LOG_ERROR("cannot load the model: {}", exec.status().message());
    // as `generate`: 2 for a bad checkpoint / argument, 1 for resources and I/O
    return exec.status().code() == v4::ErrorCode::kInvalidArgument ? 2 : 1;
  }
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto& ex = **exec;
  if (dummy) {
    const auto& w = ex.model().weights();
    std::string by_format;
    double total = double(w.vector_bytes());
    for (const auto& [f, b] : w.bytes_by_format()) {
      by_format += fmt::format("{} {:.2f} GiB, ", f, double(b) / (1 << 30));
      total += double(b);
    }
    V4_LOG_INFO("generated dummy weights ({} layers): {}vectors {:.2f} GiB; {:.2f} GiB in {:.2f}s",
                ex.model().config().num_hidden_layers, by_format, double(w.vector_bytes()) / (1 << 30),
                total / (1 << 30), load_s);
  }
  if (int64_t(tok->vocab_size()) > ex.vocab_size()) {
    V4_LOG_ERROR("the tokenizer has {} tokens but the model only {}: use the checkpoint's own tokenizer",
                 tok->vocab_size(), ex.vocab_size());
    return 2;
  }
  const auto specs = ex.pools();
  V4_LOG_INFO("KV cache element type: {} (--kv-cache-dtype {}); indexer keys {} "
              "(--index-cache-dtype {})",
              v4::kv_dtype_name(o.m.kv_dtype()), o.m.kv_cache_dtype,
              v4::index_key_dtype_name(o.m.index_dtype()), o.m.index_cache_dtype);
  for (auto& p : ex.pool_usage()) {
    const auto spec = std::find_if(specs.begin(), specs.end(),
                                   [&](const auto& q) { return q.name == p.name; });
    V4_LOG_INFO("cache pool {}: {} pages ({} tokens/page, {:.1f} KiB/page, {:.2f} GiB)", p.name,
                p.capacity_pages, spec == specs.end() ? 0 : spec->page_tokens,
                double(p.bytes_per_page) / 1024.0,
                double(p.bytes_per_page * p.capacity_pages) / double(int64_t(1) << 30));
  }

  v4::engine::EngineConfig ec;
  ec.chunked_prefill_size = o.chunked_prefill_size;
  ec.max_running_requests = o.max_running_requests;
  ec.eos_token_ids = ex.eos_token_ids();
  if (auto e = tok->eos_id(); e && std::find(ec.eos_token_ids.begin(), ec.eos_token_ids.end(), *e) == ec.eos_token_ids.end()) {
    ec.eos_token_ids.push_back(*e);
  }
  ec.stats_interval_s = o.stats_interval_s;
  ec.output_thread = !o.sync_outputs;
  const int64_t ctx = ex.max_context();
  if (o.max_context > ctx)
    V4_LOG_WARN("--context-length {} is above what the model supports: serving {} tokens per sequence",
                o.max_context, ctx);
  auto engine = v4::engine::Engine::create(std::move(exec).value(), ec);
  if (!engine.ok()) {
    V4_LOG_ERROR("cannot start the engine: {}", engine.status().message());
    return 1;
  }

  v4::server::ApiConfig ac;
  ac.served_model_name = o.served_model_name.empty() ? fs::path(model_dir).lexically_normal().filename().string()
                                                     : o.served_model_name;
  if (ac.served_model_name.empty()) ac.served_model_name = fs::path(model_dir).lexically_normal().parent_path().filename().string();
  ac.model_aliases = {o.m.model};
  ac.api_key = o.api_key;
  ac.effort_profile = o.effort_profile == "0731" ? v4::text::EffortProfile::k0731 : v4::text::EffortProfile::kPreview;
  ac.default_thinking = o.default_thinking;
  v4::server::OpenAiApi api(engine->get(), *tok, ac);

  v4::server::HttpOptions ho;
  ho.host = o.host;
  ho.port = o.port;
  ho.n_threads = o.http_threads;
  ho.body_limit_bytes = o.max_body_bytes;
  ho.header_timeout = std::chrono::milliseconds(int64_t(o.header_timeout_s * 1000));
  ho.idle_timeout = std::chrono::milliseconds(int64_t(o.idle_timeout_s * 1000));
  ho.access_log = !o.no_access_log;
  // POST requests (JSON parse, chat template, BPE of bodies up to --max-body-bytes: seconds for
  // tens of MB) are handled on their own threads, so large uploads cannot stall the I/O threads
  // that serve /health, /metrics and every other client's stream; GET / HEAD stay inline.
  // OpenAiApi::handle is thread-safe and the writer hands its bytes to the connection's strand.
  boost::asio::thread_pool workers(size_t(std::max(2, o.http_threads)));
  v4::server::HttpServer server(ho, [&api, &workers](v4::server::HttpRequest r,
                                                     std::shared_ptr<v4::server::ResponseWriter> w) {
    if (r.method != "POST") {
      api.handle(std::move(r), std::move(w));
      return;
    }
    boost::asio::post(workers, [&api, r = std::move(r), w = std::move(w)]() mutable {
      try {
        api.handle(std::move(r), w);
      } catch (const std::exception& e) {
        V4_LOG_ERROR("request handler threw: {}", e.what());
        w->respond(500, "application/json",
                   R"({"error":{"message":"internal error","type":"server_error","param":null,)"
                   R"("code":"internal_error"}})");
      }
    });
  });
  api.set_connection_counter([&server] { return server.open_connections(); });
  auto st = server.start();
  if (!st.ok()) {
    V4_LOG_ERROR("{}", st.message());
    return 1;
  }
  // An empty key (`--api-key "$KEY"` with KEY unset) would otherwise serve without auth silently.
  if (o.api_key_given && o.api_key.empty())
    V4_LOG_WARN("the API key is empty (--api-key '' or V4SERVE_API_KEY=''): no authentication is "
                "required; every client can use the server");
  const int64_t seq_cap = std::min<int64_t>(ctx, (*engine)->max_tokens_limit(1) + 1);
  V4_LOG_INFO("serving '{}' (context {} tokens{}) on http://{}:{}{}", ac.served_model_name, ctx,
              seq_cap < ctx ? fmt::format("; the KV cache holds {} for one sequence", seq_cap) : "",
              o.host, server.port(), o.api_key.empty() ? "" : " (API key required)");
  std::fflush(stdout);

  int sig = 0;
  while ((sig = wait_stop_signal(sigs, 200)) == 0) {
  }
  // Graceful shutdown: refuse new requests (503), let running streams finish for up to
  // --shutdown-timeout seconds (a second signal ends the wait), then close everything.
  api.begin_drain();
  V4_LOG_INFO("signal {}: draining {} in-flight request(s) (up to {:.0f}s; signal again to stop now)",
              sig, api.active_generations(), o.shutdown_timeout_s);
  int forced = 0;  // the second signal, if one came
  {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(int64_t(o.shutdown_timeout_s * 1000));
    // A generation that ended may still have bytes queued for a client that reads slowly: the
    // drain also waits for every dispatched response to be written (HttpServer::stop drops what
    // is still queued), within the same deadline.
    while ((api.active_generations() > 0 || server.pending_responses() > 0) &&
           std::chrono::steady_clock::now() < deadline)
      if ((forced = wait_stop_signal(sigs, 20)) != 0) break;
  }
  if (forced) {
    // Stop now, but tell every client: each open stream gets an OpenAI-style error event
    // (code "shutting_down") + [DONE], each pending non-streaming request a 503; the I/O threads
    // get up to kForcedFlush to write them (a client that does not read is cut without it).
    constexpr auto kForcedFlush = std::chrono::milliseconds(2000);
    const int64_t n = api.abort_generations(fmt::format(
        "the server was stopped (signal {} during the shutdown drain) before this response ended",
        forced));
    const bool flushed = server.wait_responses(kForcedFlush);
    V4_LOG_WARN("signal {} again: stopping now; {} request(s) ended with a shutting_down error{}",
                forced, n,
                flushed ? "" : fmt::format(" ({} response(s) could not be written within {} ms)",
                                           server.pending_responses(), kForcedFlush.count()));
  } else if (api.active_generations() > 0) {
    // The drain timed out: the requests still running end the same way, with a shutting_down
    // error event + [DONE] (streams) or a 503 (non-streaming), not a silently cut connection.
    constexpr auto kFlush = std::chrono::milliseconds(2000);
    const int64_t n = api.abort_generations(fmt::format(
        "the server shut down: this response did not end within the --shutdown-timeout drain "
        "of {:g} s",
        o.shutdown_timeout_s));
    const bool flushed = server.wait_responses(kFlush);
    V4_LOG_WARN("drain timed out after {:g}s: {} request(s) ended with a shutting_down error{}",
                o.shutdown_timeout_s, n,
                flushed ? "" : fmt::format(" ({} response(s) could not be written within {} ms)",
                                           server.pending_responses(), kFlush.count()));
  } else if (server.pending_responses() > 0) {
    // Every generation ended, but some clients have not read all of their response yet.
    V4_LOG_WARN("drain timed out after {:g}s: {} finished response(s) not completely read by their "
                "client; their connections are closed",
                o.shutdown_timeout_s, server.pending_responses());
  }
  // Logged once the engine has stopped, so no periodic status line follows it.
  const int64_t in_flight = api.active_generations();
  server.stop();
  workers.join();  // handlers still running finish (their connections are closed) before the engine goes
  engine->reset();
  V4_LOG_INFO("shutting down: stopped ({} request(s) were still in flight)", in_flight);
  // A forced stop exits like a process ended by that signal would report it (130 for SIGINT,
  // 143 for SIGTERM); the drain that finished or timed out exits 0.
  return forced ? 128 + forced : 0;
}

}  // namespace

V4_REGISTER_COMMAND(serve, "serve", "serve the OpenAI-compatible HTTP API", [](CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  app.add_option("--model", o->m.model,
                 "checkpoint directory (config.json, *.safetensors, tokenizer.json); with --load-format dummy "
                 "also a config.json file")
      ->required();
  app.add_option("--host", o->host, "address to bind (default 127.0.0.1)");
  app.add_option("--port", o->port, "port (default 30000; 0 = any free port)")
      ->check(v4::cli::int_range(0, 65535));
  app.add_option("--tokenizer", o->tokenizer, "tokenizer.json overriding the checkpoint's");
  app.add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY' on /v1/* and /tokenize")
      ->each([o](const std::string&) { o->api_key_given = true; });
  app.add_option("--chunked-prefill-size", o->chunked_prefill_size, "max tokens per engine step")
      ->check(v4::cli::int_at_least(1));
  app.add_option("--max-running-requests", o->max_running_requests, "max sequences in a batch")
      ->check(v4::cli::int_at_least(1, INT32_MAX));
  app.add_option("--kv-cache-bytes", o->kv_cache_bytes, "bytes for all KV cache pools (default 1 GiB; wins over --mem-fraction)")
      ->check(v4::cli::int_at_least(1))
      ->each([o](const std::string&) { o->kv_cache_bytes_given = true; });
  app.add_option("--mem-fraction", o->mem_fraction,
                 "size the KV pools from device memory: fraction x total - memory in use after the weights - "
                 "workspace reserve (docs/bench.md)")
      ->check(v4::cli::number_range(0.0, 1.0));
  app.add_option("--context-length", o->max_context, "max tokens per sequence (0 = config.json)")
      ->check(v4::cli::int_at_least(0));
  app.add_option("--prefix-cache-bytes", o->prefix_cache_bytes,
                 "bytes for the prefix cache store, device memory on cuda (default 256 MiB, dropped with a "
                 "warning if too small for the model; 0 = no prefix caching)")
      ->check(v4::cli::int_at_least(0))
      ->each([o](const std::string&) { o->prefix_cache_bytes_given = true; });
  app.add_flag("--disable-prefix-cache", o->disable_prefix_cache, "turn prefix caching (ShadowRadix) off");
  app.add_option("--prefix-snapshot-interval", o->prefix_snapshot_interval,
                 "also keep prefix-cache boundaries every N prompt tokens, so a request sharing part of an "
                 "earlier prompt resumes at the last multiple instead of recomputing it once more (each point "
                 "ends a prefill step; default 0 = branch points and prompt ends only)")
      ->check(v4::cli::int_at_least(0));
  app.add_option("--served-model-name", o->served_model_name, "name in /v1/models (default: model dir name)");
  app.add_option("--http-threads", o->http_threads, "I/O threads of the HTTP server")
      ->check(v4::cli::int_range(1, 1024));
  app.add_option("--threads", o->threads,
                 "CPU threads of the model's ops (0: V4_NUM_THREADS or all cores)")
      ->check(v4::cli::int_range(0, 4096));
  app.add_option("--device", o->m.device, "op backend: cpu (default) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  v4::cli::add_model_options(app, &o->m);
  app.add_option("--max-body-bytes", o->max_body_bytes, "request body limit (413 beyond)")
      ->check(v4::cli::int_at_least(1));
  app.add_option("--header-timeout", o->header_timeout_s, "seconds a new connection has to send its request head")
      ->check(v4::cli::number_at_least(0.0, /*open_lo=*/true, kMaxSeconds));
  app.add_option("--idle-timeout", o->idle_timeout_s, "seconds a keep-alive connection may idle")
      ->check(v4::cli::number_at_least(0.0, /*open_lo=*/true, kMaxSeconds));
  app.add_option("--stats-interval", o->stats_interval_s, "seconds between status lines (0 = off)")
      ->check(v4::cli::number_at_least(0.0, /*open_lo=*/false, kMaxSeconds));
  app.add_option("--reasoning-effort-profile", o->effort_profile, "preview or 0731 (encoder effort table)")
      ->check(CLI::IsMember({"preview", "0731"}));
  app.add_flag("--default-thinking", o->default_thinking, "thinking mode when a request does not choose");
  app.add_flag("--no-access-log", o->no_access_log, "do not log one line per request");
  app.add_flag("--sync-outputs", o->sync_outputs,
               "run the output callbacks (detokenize, stop strings, SSE chunks) on the scheduler "
               "thread between steps instead of on the engine's output thread (A/B of the GPU "
               "idle time between steps)");
  app.add_option("--shutdown-timeout", o->shutdown_timeout_s,
                 "seconds SIGTERM/SIGINT waits for running requests to finish (default 30)")
      ->check(v4::cli::number_at_least(0.0, /*open_lo=*/false, kMaxSeconds));
  if (const char* k = std::getenv("V4SERVE_API_KEY")) {
    o->api_key = k;
    o->api_key_given = true;
  }
  return std::function<int()>([o] { return run_serve(*o); });
});
