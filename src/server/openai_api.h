// The OpenAI-compatible API on top of the engine: routing, auth, /v1/chat/completions,
// /v1/completions, /v1/models, /tokenize, /detokenize, /health, /metrics.
// Every request is validated into a typed GenerateRequest (protocol.h), encoded to tokens
// (text::ChatEncoder / Tokenizer), submitted to the Engine, and its outputs are detokenized,
// cut at stop strings, parsed into reasoning/content/tool_calls and streamed over SSE or
// collected into one JSON response. A client that disconnects has its requests cancelled.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/protocol.h"
#include "text/chat_encoder.h"
#include "text/tokenizer.h"

namespace v4::server {

/// Static configuration of the API.
struct ApiConfig {
  std::string served_model_name = "default";
  std::vector<std::string> model_aliases;  // other names accepted in "model" (e.g. the path)
  std::string api_key;                     // "" = no auth
  text::EffortProfile effort_profile = text::EffortProfile::kPreview;
  bool default_thinking = false;           // thinking mode when the request says nothing
};

/// Request handler for HttpServer. Thread-safe; holds no per-connection state.
class OpenAiApi {
 public:
  /// `engine` must outlive the API.
  OpenAiApi(engine::Engine* engine, text::Tokenizer tokenizer, ApiConfig config);
  ~OpenAiApi();

  /// Dispatches one HTTP request (use as the HttpServer handler).
  void handle(HttpRequest req, std::shared_ptr<ResponseWriter> w);

  /// For /metrics: a function returning the open HTTP connections.
  void set_connection_counter(std::function<int64_t()> fn);

  /// Graceful shutdown: from now on new generation requests get 503 ("shutting_down") and
  /// /health answers 503, while requests already in flight keep streaming to their end.
  void begin_drain() { draining_.store(true); }
  /// Chat/completion requests still in flight (their HTTP responses not yet finished).
  int64_t active_generations() const { return active_.load(); }
  /// Forced shutdown (a second stop signal): ends every chat/completion request still in flight
  /// at once with `message` as an OpenAI-style 503 error (type "service_unavailable", code
  /// "shutting_down"): a stream gets a `data: {"error": {...}}` event, then `data: [DONE]` and its
  /// end; a non-streaming request gets the error as its response. Their engine requests are
  /// cancelled. The bytes are only queued on the connections: let the HTTP server write them
  /// (HttpServer::wait_responses) before stopping it. Returns the number of requests ended.
  int64_t abort_generations(const std::string& message);

  Metrics& metrics() { return metrics_; }
  const ApiConfig& config() const { return cfg_; }

  struct Generation;  // one chat/completions request in flight (openai_api.cpp)

 private:
  void send_error(const HttpRequest& req, ResponseWriter& w, const ApiError& e);
  void send_json(const HttpRequest& req, ResponseWriter& w, int status, const Json& body);
  void handle_models(const HttpRequest& req, ResponseWriter& w);
  void handle_tokenize(const HttpRequest& req, ResponseWriter& w);
  void handle_detokenize(const HttpRequest& req, ResponseWriter& w);
  void handle_generate(const HttpRequest& req, std::shared_ptr<ResponseWriter> w, bool chat);
  bool check_model(const std::string& model, ApiError* err) const;
  /// Encodes a chat request to prompt tokens; false + err on a bad conversation.
  bool encode_chat(const GenerateRequest& r, std::vector<int32_t>* tokens, ApiError* err) const;

  engine::Engine* engine_;
  text::Tokenizer tok_;
  /// Template special tokens dropped from chat content / reasoning (text::template_special_tokens).
  std::vector<std::string> drop_tokens_;
  /// Ids of those tokens (sorted): /v1/completions' `skip_special_tokens` drops them besides the
  /// tokenizer's `special` ones (docs/server.md).
  std::shared_ptr<const std::vector<int32_t>> skip_ids_;
  ApiConfig cfg_;
  /// Unix time the API was created (server start): /v1/models' `created`, stable across requests.
  int64_t started_at_ = 0;
  Metrics metrics_;
  std::function<int64_t()> connections_;
  ValidationLimits limits_;
  /// Tokens one sequence can hold: the model's context, capped by the KV pools' whole capacity.
  /// /v1/models and /tokenize report the context as max_model_len (as SGLang does; the pools are
  /// sized by --mem-fraction and shared), requests beyond this get context_length_exceeded.
  int64_t seq_capacity_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_{0};
  /// Generations in flight (registered once set up; expired entries pruned on insert), and the
  /// error abort_generations ended them with (later ones end with it at once).
  std::mutex gens_mu_;
  std::vector<std::weak_ptr<Generation>> gens_;
  std::optional<ApiError> abort_error_;
};

/// Maps an OpenAI `reasoning_effort` (minimal/low/medium/high/xhigh/max) to the value the
/// checkpoint's encoder accepts for `profile`.
std::string map_reasoning_effort(const std::string& effort, text::EffortProfile profile);

/// A logprob as a JSON number: finite values as they are; −inf (zero probability) and NaN
/// (non-finite logits) as −9999.0 (vLLM's floor), +inf as 0 — never JSON null, which the
/// library would write for a non-finite float.
Json logprob_json(float v);

/// Compares an `Authorization` header with the expected bearer key in constant time.
bool check_bearer(const std::string& authorization, const std::string& api_key);

/// Whether a POST body with this `Content-Type` header value is read as JSON: absent (empty),
/// `application/json` or `application/<anything>+json`, case-insensitive, with any parameters
/// (`; charset=utf-8`). Anything else (text/plain, curl -d's application/x-www-form-urlencoded,
/// multipart/form-data) is answered 415 (docs/server.md "Errors").
bool json_content_type(const std::string& content_type);

/// Decodes the `%XX` escapes of a URL path segment (RFC 3986 §2.1; hex digits of either case),
/// e.g. the `{id}` of `/v1/models/deepseek%2Fv4` -> `deepseek/v4`. Other bytes are kept as they
/// are (`+` stays `+`: it means a space only in form-encoded queries). nullopt when a `%` is not
/// followed by two hex digits (`%zz`, a trailing `%` or `%4`).
std::optional<std::string> percent_decode(std::string_view s);

}  // namespace v4::server
