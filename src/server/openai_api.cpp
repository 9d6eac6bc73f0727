#include "server/openai_api.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cctype>
#include <string_view>
#include <chrono>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>

#include "base/log.h"
#include "text/detokenizer.h"
#include "text/output_parser.h"

namespace v4::server {

using engine::Clock;

namespace {

// A text prompt of /v1/completions or /tokenize as token ids: with `add_special` (the default,
// like vLLM's add_special_tokens) the sequence starts with BOS as the model was trained —
// DeepSeek's tokenizer files add none themselves — unless the text already begins with it; the
// same rule as `v4serve generate --prompt`. Token-id prompts are never changed.
// `added_bos`: set to whether a BOS was put in front (it is then not part of `text`).
std::vector<int32_t> encode_prompt_text(const text::Tokenizer& tok, const std::string& text,
                                        bool add_special, bool* added_bos = nullptr) {
  std::vector<int32_t> ids = tok.encode(text, true);
  if (added_bos) *added_bos = false;
  if (!add_special) return ids;
  const auto bos = tok.bos_id();
  if (bos && (ids.empty() || ids.front() != *bos)) {
    ids.insert(ids.begin(), *bos);
    if (added_bos) *added_bos = true;
  }
  return ids;
}

}  // namespace

namespace {

// Characters (Unicode code points) of UTF-8 text: the unit of completions' text_offset, as in
// vLLM (Python string indices); invalid bytes count as one each.
int64_t u8_chars(std::string_view s) {
  int64_t n = 0;
  for (unsigned char b : s) n += (b & 0xC0u) != 0x80u;
  return n;
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  uint64_t x = salt + 0x9E3779B97F4A7C15ull * (++counter);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return fmt::format("{}{:016x}", prefix, x);
}

int64_t unix_now() { return int64_t(std::time(nullptr)); }

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

ApiError api_error(int status, std::string message, std::string type, std::string code = "",
                   std::string param = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}

ApiError from_status(const Status& s, const std::string& param = "") {
  switch (s.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kCorruptData:
      return api_error(400, s.message(), "invalid_request_error", "", param);
    case ErrorCode::kNotFound:
      return api_error(404, s.message(), "invalid_request_error", "not_found", param);
    case ErrorCode::kUnsupported:
      return api_error(400, s.message(), "invalid_request_error", "unsupported", param);
    case ErrorCode::kResourceExhausted:
      return api_error(503, s.message(), "server_overloaded", "resource_exhausted");
    default:
      return api_error(500, s.message(), "server_error", "internal_error");
  }
}

Json usage_json(int64_t prompt, int64_t completion, int64_t cached) {
  Json u = Json::object();
  u["prompt_tokens"] = prompt;
  u["completion_tokens"] = completion;
  u["total_tokens"] = prompt + completion;
  Json d = Json::object();
  d["cached_tokens"] = cached;
  u["prompt_tokens_details"] = d;
  return u;
}

Json bytes_json(const std::string& b) {
  Json a = Json::array();
  for (unsigned char c : b) a.push_back(int(c));
  return a;
}

}  // namespace

/// A logprob as a JSON number. JSON has no infinities or NaN (the library writes them as null,
/// which OpenAI clients do not expect where a number is documented): −inf (a token with zero
/// probability) and NaN (non-finite logits, e.g. a checkpoint with NaN weights) become −9999.0,
/// vLLM's floor for logprobs; +inf (impossible for a log-probability) becomes 0.
Json logprob_json(float v) {
  if (std::isfinite(v)) return v;
  return v > 0 ? 0.0 : -9999.0;
}

namespace {

}  // namespace

std::string map_reasoning_effort(const std::string& e, text::EffortProfile profile) {
  if (profile == text::EffortProfile::kPreview) {
    if (e == "xhigh" || e == "max") return "max";
    return "high";
  }
  if (e == "minimal" || e == "low") return "low";
  if (e == "medium" || e == "high") return "high";
  return "max";
}

bool check_bearer(const std::string& authorization, const std::string& api_key) {
  // "Bearer <key>": the scheme name is case-insensitive (RFC 9110 §11.1), the key is compared in
  // constant time in the length of the expected value.
  constexpr std::string_view kScheme = "bearer ";
  unsigned diff = authorization.size() != kScheme.size() + api_key.size() ? 1u : 0u;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    const char a = i < authorization.size() ? authorization[i] : 0;
    diff |= unsigned(char(std::tolower(static_cast<unsigned char>(a))) ^ kScheme[i]);
  }
  for (size_t i = 0; i < api_key.size(); ++i) {
    const size_t j = kScheme.size() + i;
    const char a = j < authorization.size() ? authorization[j] : 0;
    diff |= unsigned(a ^ api_key[i]);
  }
  return diff == 0;
}

namespace {

std::string lower_trimmed(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") + 1 - b);
}

// Whether a Transfer-Encoding value has no coding but chunked / identity (absent: true).
bool chunked_only(const std::string& te) {
  size_t p = 0;
  while (p <= te.size()) {
    size_t e = te.find(',', p);
    if (e == std::string::npos) e = te.size();
    std::string t = lower_trimmed(te.substr(p, e - p));
    if (!t.empty() && t != "chunked" && t != "identity") return false;
    p = e + 1;
  }
  return true;
}

}  // namespace

bool json_content_type(const std::string& content_type) {
  std::string t = content_type.substr(0, content_type.find(';'));
  for (auto& c : t) c = char(std::tolower(static_cast<unsigned char>(c)));
  const auto b = t.find_first_not_of(" \t");
  if (b == std::string::npos) return true;  // absent or empty: read as JSON (FastAPI does too)
  t = t.substr(b, t.find_last_not_of(" \t") + 1 - b);
  if (t == "application/json") return true;
  return t.rfind("application/", 0) == 0 && t.size() > 17 && t.compare(t.size() - 5, 5, "+json") == 0;
}

std::optional<std::string> percent_decode(std::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    const int hi = i + 2 < s.size() ? hex(s[i + 1]) : -1;
    const int lo = i + 2 < s.size() ? hex(s[i + 2]) : -1;
    if (hi < 0 || lo < 0) return std::nullopt;
    out += char(hi * 16 + lo);
    i += 2;
  }
  return out;
}

// ------------------------------------------------------------------------------------------------
// One chat/completions request in flight: n choices (x prompts), each an engine request.

struct OpenAiApi::Generation : std::enable_shared_from_this<Generation> {
  struct Choice {
    int index = 0;
    engine::RequestId id = 0;
    bool submitted = false;
    bool finished = false;
    std::optional<text::Detokenizer> detok;
    std::optional<StopMatcher> stop;
    std::optional<text::OutputParser> parser;  // chat only
    text::ParsedMessage msg;                   // chat, non-streaming
    std::string text;                          // completions text (non-streaming)
    int64_t text_len = 0;                      // characters (code points) of text emitted so far
    int64_t echo_chars = 0;                    // characters of echo_text
    Json lp_items = Json::array();             // chat logprobs.content items (non-streaming)
    Json cmp_tokens = Json::array(), cmp_lps = Json::array(), cmp_top = Json::array(),
         cmp_offsets = Json::array();          // completions logprobs (non-streaming)
    int64_t prompt_tokens = 0;
    int64_t completion_tokens = 0;
    int64_t cached_tokens = 0;
    std::string finish_reason;
    std::string error;       // finish_reason "error": what failed
    std::string error_code;  // its error code ("" = internal_error, "generation failed: " prefix)
    std::string visible;     // chat: the first bytes of content the model wrote (error messages)
    Clock::time_point arrival, first_token, last_token;
    bool have_first = false;
    bool role_sent = false;
    std::string echo_text;  // completions echo
    // Completions echo + logprobs: the prompt's ids (scored by the engine's prompt_logprobs,
    // listed before the generated tokens), whether its first id is a BOS the server added (not
    // in echo_text), and the entries built from the first output (non-streaming: prepended in
    // send_final).
    std::vector<int32_t> echo_ids;
    bool echo_added_bos = false;
    // Completions max_tokens 0 (with echo): the engine draws one token, which is not returned.
    bool score_only = false;
    bool echo_lp_done = false;
    Json echo_tokens = Json::array(), echo_lps = Json::array(), echo_top = Json::array(),
         echo_offsets = Json::array();
  };

  OpenAiApi* api = nullptr;
  std::shared_ptr<ResponseWriter> w;
  GenerateRequest req;
  bool chat = true;
  /// tool_choice "required" or a named function: a choice that ends by itself (EOS) without a
  /// tool call fails with invalid_model_output (docs/server.md "tool_choice").
  bool require_tool_call = false;
  std::string id;
  int64_t created = 0;
  std::string endpoint;
  std::mutex mu;
  std::vector<Choice> choices;
  bool started = false;  // HTTP response (stream) started; before that, chunks are buffered
  bool failed = false;
  bool done = false;
  bool cancelled = false;
  std::vector<std::string> pending;  // SSE chunks produced before `started`
  std::optional<ApiError> aborted;    // abort_generations: the error this request ended with
  int n_finished = 0;
  Clock::time_point t_arrival = Clock::now();

  explicit Generation(OpenAiApi* owner) : api(owner) { api->active_.fetch_add(1); }
  ~Generation() { api->active_.fetch_sub(1); }

  void emit(std::string chunk) {
    if (!started) {
      pending.push_back(std::move(chunk));
    } else {
      w->write(std::move(chunk));
    }
  }

  Json chunk_base() const {
    Json c = Json::object();
    c["id"] = id;
    c["object"] = chat ? "chat.completion.chunk" : "text_completion";
    c["created"] = created;
    c["model"] = api->cfg_.served_model_name;
    return c;
  }

  // A token's text for logprobs. A token that is not whole UTF-8 on its own (part of a
  // character split over tokens) is written as OpenAI writes it, `bytes:\xe2\x80` (each byte
  // as \xNN), instead of a U+FFFD that would not join to the text.
  std::string token_text(int32_t t) const {
    int32_t ids[1] = {t};
    const std::string bytes = api->tok_.token_bytes(t);
    if (valid_utf8(bytes)) return api->tok_.decode(std::span<const int32_t>(ids, 1), false);
    std::string out = "bytes:";
    for (unsigned char b : bytes) out += fmt::format("\\x{:02x}", b);
    return out;
  }

  // Completions top_logprobs entry: the n likeliest tokens keyed by text (equal texts keep the
  // likelier), plus the chosen token when it is not among them — OpenAI's "up to logprobs + 1
  // elements", so `logprobs: 0` gives the chosen token alone.
  Json completion_top(const engine::TokenLogprobs& lp, int n) const {
    Json top = Json::object();
    for (auto& cand : lp.top) {
      if (int(top.size()) >= n) break;
      std::string key = token_text(cand.token);
      if (!top.contains(key)) top[key] = logprob_json(cand.logprob);
    }
    if (std::string key = token_text(lp.token); !top.contains(key))
      top[key] = logprob_json(lp.logprob);
    return top;
  }

  Json chat_lp_item(const engine::TokenLogprobs& lp) const {
    Json item = Json::object();
    item["token"] = token_text(lp.token);
    item["logprob"] = logprob_json(lp.logprob);
    item["bytes"] = bytes_json(api->tok_.token_bytes(lp.token));
    Json top = Json::array();
    for (auto& c : lp.top) {
      if (int(top.size()) >= req.top_logprobs) break;
      Json t = Json::object();
      t["token"] = token_text(c.token);
      t["logprob"] = logprob_json(c.logprob);
      t["bytes"] = bytes_json(api->tok_.token_bytes(c.token));
      top.push_back(std::move(t));
    }
    item["top_logprobs"] = std::move(top);
    return item;
  }

  // Folds parser events into a streaming delta (chat).
  static void add_events(const std::vector<text::ParserEvent>& evs, Json* delta, Choice& c,
                         bool streaming) {
    std::string content, reasoning;
    Json calls = Json::array();
    for (auto& e : evs) {
      switch (e.kind) {
        case text::ParserEvent::Kind::kContentDelta: content += e.text; break;
        case text::ParserEvent::Kind::kReasoningDelta: reasoning += e.text; break;
        case text::ParserEvent::Kind::kToolCallBegin: {
          Json tc = Json::object();
          tc["index"] = e.index;
          tc["id"] = e.id;
          tc["type"] = "function";
          Json fn = Json::object();
          fn["name"] = e.name;
          fn["arguments"] = "";
          tc["function"] = fn;
          calls.push_back(std::move(tc));
          break;
        }
        case text::ParserEvent::Kind::kToolCallArgs: {
          Json tc = Json::object();
          tc["index"] = e.index;
          Json fn = Json::object();
          fn["arguments"] = e.text;
          tc["function"] = fn;
          calls.push_back(std::move(tc));
          break;
        }
        case text::ParserEvent::Kind::kToolCallEnd: break;
      }
    }
    if (!streaming) {
      text::OutputParser::apply(evs, c.msg);
      return;
    }
    if (!reasoning.empty()) (*delta)["reasoning_content"] = reasoning;
    if (!content.empty()) (*delta)["content"] = content;
    if (!calls.empty()) (*delta)["tool_calls"] = std::move(calls);
  }

  // Completions echo + logprobs: the prompt tokens' entries (OpenAI: the first token has null
  // logprob and top_logprobs; text_offset counts from the start of the echoed text).
  void prompt_logprob_entries(Choice& c, const engine::StepOutput& out, Json* toks, Json* lps,
                              Json* tops, Json* offs) const {
    // Every prompt token's text is in the echoed text (special tokens written in a text prompt
    // too), except a BOS the server added in front of a text prompt: that one is not listed, so
    // the tokens join to the echoed text (the next token's logprob is then given BOS, a number).
    text::DetokenizerOptions dopt;
    dopt.skip_special_tokens = false;
    text::Detokenizer d(api->tok_, dopt);
    const int64_t echo_len = c.echo_chars;
    int64_t at = 0;
    for (size_t i = c.echo_added_bos ? 1 : 0; i < c.echo_ids.size(); ++i) {
      toks->push_back(token_text(c.echo_ids[i]));
      offs->push_back(std::min(at, echo_len));
      at += u8_chars(d.push(c.echo_ids[i]));
      const engine::TokenLogprobs* lp =
          i > 0 && i - 1 < out.prompt_logprobs.size() ? &out.prompt_logprobs[i - 1] : nullptr;
      lps->push_back(lp ? logprob_json(lp->logprob) : Json(nullptr));
      tops->push_back(lp ? completion_top(*lp, req.top_logprobs) : Json(nullptr));
    }
  }

  // A token id that finishes generation: a stop token id of the request, or EOS (unless
  // ignore_eos).
  bool is_stop_token(int32_t t) const {
    const auto& st = req.sampling.stop_token_ids;
    if (std::find(st.begin(), st.end(), t) != st.end()) return true;
    const auto& eos = api->engine_->config().eos_token_ids;
    return !req.sampling.ignore_eos && std::find(eos.begin(), eos.end(), t) != eos.end();
  }

  // Processes one engine output for choice `ci` (the engine's output thread, under mu).
  // Returns engine ids to cancel (stop string hit).
  void on_output(size_t ci, const engine::StepOutput& out, std::vector<engine::RequestId>* to_cancel) {
    Choice& c = choices[ci];
    if (c.finished || failed) return;
    c.prompt_tokens = out.usage.prompt_tokens;
    c.cached_tokens = out.usage.cached_tokens;
    c.arrival = out.arrival_time;
    if (!out.new_tokens.empty()) {
      if (!c.have_first) {
        c.have_first = true;
        c.first_token = out.first_token_time.time_since_epoch().count() ? out.first_token_time : out.now;
      } else {
        api->metrics_.observe_itl(seconds(out.now - c.last_token));
      }
      c.last_token = out.now;
    }
    const bool streaming = req.stream;
    std::string text_delta;
    Json lp_stream = Json::array();
    Json cmp_tokens = Json::array(), cmp_lps = Json::array(), cmp_top = Json::array(),
         cmp_off = Json::array();
    if (!chat && !c.echo_ids.empty() && !c.echo_lp_done) {
      c.echo_lp_done = true;  // the first output carries the prompt's logprobs
      if (streaming)
        prompt_logprob_entries(c, out, &cmp_tokens, &cmp_lps, &cmp_top, &cmp_off);
      else
        prompt_logprob_entries(c, out, &c.echo_tokens, &c.echo_lps, &c.echo_top, &c.echo_offsets);
    }
    bool stopped = false;
    for (size_t k = 0; !c.score_only && k < out.new_tokens.size(); ++k) {
      int32_t t = out.new_tokens[k];
      // Text before this token: released so far + what the stop matcher holds back.
      // (held_chars: counting held() here was O(longest stop string) per token.)
      const int64_t before = c.text_len + u8_chars(text_delta) + c.stop->held_chars();
      // The token that finished the request (EOS or a stop token id) is not part of the text
      // unless include_stop_str_in_output (completions), as in vLLM: with skip_special_tokens
      // false its text (`<｜end▁of▁sentence｜>`) would otherwise end the output. It still counts
      // and has its logprobs entry. Chat never shows it (the parser ends at EOS anyway; inside a
      // tool-call value the EOS text would have become argument text).
      const bool finishing_token = out.finished && out.finish_reason == engine::FinishReason::kStop &&
                                   k + 1 == out.new_tokens.size() && is_stop_token(t);
      std::string piece = finishing_token && (chat || !req.include_stop_str_in_output)
                              ? std::string()
                              : c.stop->push(c.detok->push(t));
      c.completion_tokens++;
      if (req.sampling.logprobs && k < out.logprobs.size()) {
        const auto& lp = out.logprobs[k];
        if (chat) {
          (streaming ? lp_stream : c.lp_items).push_back(chat_lp_item(lp));
        } else {
          Json top = completion_top(lp, req.top_logprobs);
          auto& toks = streaming ? cmp_tokens : c.cmp_tokens;
          auto& lps = streaming ? cmp_lps : c.cmp_lps;
          auto& tops = streaming ? cmp_top : c.cmp_top;
          auto& offs = streaming ? cmp_off : c.cmp_offsets;
          toks.push_back(token_text(lp.token));
          lps.push_back(logprob_json(lp.logprob));
          tops.push_back(std::move(top));
          // Where this token's text starts in the choice's text (OpenAI's text_offset). A stream
          // counts the echoed prompt here; the whole response adds it when it is assembled.
          offs.push_back(before + (streaming ? c.echo_chars : 0));
        }
      }
      text_delta += piece;
      if (c.stop->stopped()) {
        stopped = true;
        break;
      }
    }
    bool finishing = stopped || out.finished;
    if (!stopped && out.finished) {
      text_delta += c.stop->push(c.detok->finish());
      text_delta += c.stop->flush();
      if (c.stop->stopped()) stopped = true;
    }

    Json delta = Json::object();
    bool cut_in_call = false;  // output cut (max_tokens / stop string) inside a tool call
    if (chat) {
      auto evs = c.parser->feed(text_delta);
      if (finishing) {
        // Cut by max_tokens or by a stop string: a tool call being written keeps the arguments
        // generated so far (nothing invented to close its JSON); finish_reason "length" / "stop"
        // (not "tool_calls") tells the client that the call is incomplete.
        const bool cut = stopped || out.finish_reason == engine::FinishReason::kLength;
        cut_in_call = cut && c.parser->call_open();
        auto tail = c.parser->finish(/*close_open_call=*/!cut);
        evs.insert(evs.end(), tail.begin(), tail.end());
      }
      if (require_tool_call) keep_visible(evs, &c.visible);
      add_events(evs, &delta, c, streaming);
    } else if (!streaming) {
      c.text += text_delta;
    }
    c.text_len += u8_chars(text_delta);

    if (finishing) {
      c.finished = true;
      n_finished++;
      if (stopped) {
        c.finish_reason = "stop";
        // out.id, not c.id: the first output can arrive before submit returned and the handler
        // recorded the id (a stop string in it then cancelled id 0, and the request ran on to
        // max_tokens).
        if (!out.finished) to_cancel->push_back(out.id);
      } else {
        switch (out.finish_reason) {
          case engine::FinishReason::kLength: c.finish_reason = "length"; break;
          case engine::FinishReason::kAbort: c.finish_reason = "abort"; break;
          case engine::FinishReason::kError:
            c.finish_reason = "error";
            c.error = out.error.message();
            break;
          default: c.finish_reason = "stop"; break;
        }
        if (c.score_only && out.finish_reason != engine::FinishReason::kError &&
            out.finish_reason != engine::FinishReason::kAbort)
          c.finish_reason = "length";  // max_tokens 0: nothing generated, as OpenAI reports it
      }
      const bool ended_by_model = !stopped && out.finish_reason == engine::FinishReason::kStop;
      if (chat && c.parser->tool_call_count() > 0 && c.finish_reason == "stop" && !cut_in_call) {
        c.finish_reason = "tool_calls";
      } else if (chat && require_tool_call && ended_by_model && c.parser->tool_call_count() == 0) {
        // The sampler is not constrained: the model closed the forced tool-call block (or never
        // named a function) and ended its turn. OpenAI answers "The model produced invalid
        // content" (500) when it cannot produce the required call; clients (the openai SDKs
        // retry 500s) can retry, with temperature > 0 a retry samples anew.
        c.finish_reason = "error";
        c.error_code = "invalid_model_output";
        c.error = fmt::format(
            "The model produced invalid content: tool_choice {} requires a tool call, but the "
            "model ended its turn without one{}. Retry (with temperature > 0 a retry samples "
            "anew), or use tool_choice \"auto\" and check message.tool_calls.",
            req.tool_choice_function ? "naming '" + req.tool_choice + "'" : "\"required\"",
            c.visible.empty() ? std::string()
                              : fmt::format(" (it wrote: {})",
                                            Json(c.visible).dump(-1, ' ', false,
                                                                 Json::error_handler_t::replace)));
      }
      double ttft = c.have_first ? seconds(c.first_token - c.arrival) : -1.0;
      double e2e = seconds((c.have_first ? c.last_token : out.now) - c.arrival);
      api->metrics_.observe_generation(c.prompt_tokens, c.completion_tokens, c.cached_tokens, ttft,
                                       e2e, c.finish_reason, first_of_prompt(c));
    }

    if (streaming) {
      bool has_lp = !lp_stream.empty() || !cmp_tokens.empty();
      if (chat) {
        bool has_delta = !delta.empty();
        if (!c.role_sent && (has_delta || has_lp || finishing)) {
          // First chunk of a choice carries the role.
          Json first = chunk_base();
          Json ch = Json::object();
          ch["index"] = c.index;
          Json d = Json::object();
          d["role"] = "assistant";
          d["content"] = "";
          ch["delta"] = d;
          ch["logprobs"] = nullptr;
          ch["finish_reason"] = nullptr;
          first["choices"] = Json::array({ch});
          emit(sse_event(first));
          c.role_sent = true;
        }
        if (has_delta || has_lp || finishing) {
          Json chunk = chunk_base();
          Json ch = Json::object();
          ch["index"] = c.index;
          ch["delta"] = delta;
          if (has_lp) {
            Json l = Json::object();
            l["content"] = std::move(lp_stream);
            ch["logprobs"] = std::move(l);
          } else {
            ch["logprobs"] = nullptr;
          }
          ch["finish_reason"] = finishing ? Json(c.finish_reason) : Json(nullptr);
          chunk["choices"] = Json::array({ch});
          if (req.continuous_usage) chunk["usage"] = usage_json(c.prompt_tokens, c.completion_tokens, c.cached_tokens);
          emit(sse_event(chunk));
        }
      } else {
        std::string txt = text_delta;
        if (!c.role_sent) {
          txt = c.echo_text + txt;
          c.role_sent = true;
        }
        if (!txt.empty() || has_lp || finishing) {
          Json chunk = chunk_base();
          Json ch = Json::object();
          ch["index"] = c.index;
          ch["text"] = txt;
          if (has_lp) {
            Json l = Json::object();
            l["tokens"] = std::move(cmp_tokens);
            l["token_logprobs"] = std::move(cmp_lps);
            l["top_logprobs"] = std::move(cmp_top);
            l["text_offset"] = std::move(cmp_off);
            ch["logprobs"] = std::move(l);
          } else {
            ch["logprobs"] = nullptr;
          }
          ch["finish_reason"] = finishing ? Json(c.finish_reason) : Json(nullptr);
          chunk["choices"] = Json::array({ch});
          if (req.continuous_usage) chunk["usage"] = usage_json(c.prompt_tokens, c.completion_tokens, c.cached_tokens);
          emit(sse_event(chunk));
        }
      }
      if (finishing && c.finish_reason == "error") emit(sse_event(Json::parse(error_body(choice_error(c)))));
    }
    if (n_finished == int(choices.size())) finish_all();
  }

  // A submitted choice ended here (abort, failed submit) rather than by its engine output, which
  // is then ignored: counted as finish_reason "abort", as the engine counts it aborted.
  void observe_abort(Choice& c) {
    c.finish_reason = "abort";
    const double ttft = c.have_first ? seconds(c.first_token - c.arrival) : -1.0;
    const double e2e = c.have_first ? seconds(c.last_token - c.arrival) : -1.0;
    api->metrics_.observe_generation(c.prompt_tokens, c.completion_tokens, c.cached_tokens, ttft,
                                     e2e, c.finish_reason, first_of_prompt(c));
  }

  // The first of a prompt's n choices: the one whose prompt (and cached) tokens /metrics counts,
  // once per prompt as usage does (totals()).
  bool first_of_prompt(const Choice& c) const { return c.index % std::max(1, req.n) == 0; }

  // The first ~200 bytes of content (cut at a UTF-8 boundary), quoted in error messages.
  static void keep_visible(const std::vector<text::ParserEvent>& evs, std::string* out) {
    constexpr size_t kMax = 200;
    for (auto& e : evs) {
      if (out->size() >= kMax) break;
      if (e.kind == text::ParserEvent::Kind::kContentDelta) *out += e.text;
    }
    if (out->size() <= kMax) return;
    size_t cut = kMax;
    while (cut > 0 && (static_cast<unsigned char>((*out)[cut]) & 0xC0) == 0x80) --cut;
    out->resize(cut);
    *out += "…";
  }

  // The 500 a failed choice answers with (non-streaming body, or the streaming `error` event).
  static ApiError choice_error(const Choice& c) {
    if (c.error_code.empty())
      return api_error(500, "generation failed: " + c.error, "server_error", "internal_error");
    return api_error(500, c.error, "server_error", c.error_code, "tool_choice");
  }

  // Prompt tokens are counted once per prompt (OpenAI semantics for n > 1).
  void totals(int64_t* prompt, int64_t* completion, int64_t* cached) const {
    *prompt = *completion = *cached = 0;
    int n = std::max(1, req.n);
    for (size_t i = 0; i < choices.size(); ++i) {
      if (int(i) % n == 0) {
        *prompt += choices[i].prompt_tokens;
        *cached += choices[i].cached_tokens;
      }
      *completion += choices[i].completion_tokens;
    }
  }

  void finish_all() {
    if (done) return;
    done = true;
    int64_t prompt, completion, cached;
    totals(&prompt, &completion, &cached);
    double ttft_ms = -1;
    for (auto& c : choices) {
      if (c.have_first) {
        double t = seconds(c.first_token - c.arrival) * 1000.0;
        ttft_ms = ttft_ms < 0 ? t : std::min(ttft_ms, t);
      }
    }
    w->set_log_info(fmt::format("id={} prompt_tokens={} completion_tokens={} cached_tokens={} ttft={:.1f}ms finish={}",
                                id, prompt, completion, cached, ttft_ms,
                                choices.empty() ? "" : choices[0].finish_reason));
    if (req.stream) {
      // 499 = the client went away before the stream's end. Checked before the last events: a
      // client that closes right after reading [DONE] (curl, most SDKs) got the whole answer.
      const bool gone = w->closed();
      if (req.include_usage) {
        Json chunk = chunk_base();
        chunk["choices"] = Json::array();
        chunk["usage"] = usage_json(prompt, completion, cached);
        emit(sse_event(chunk));
      }
      emit(sse_done());
      if (started) w->end();
      api->metrics_.count_request(endpoint, gone ? 499 : 200);
      return;
    }
    if (!started) return;  // handler thread sends the response once all submits are done
    send_final();
  }

  // OpenAiApi::abort_generations for this request (under mu): ends it now with `e` unless its
  // response is already complete or failed. Engine ids still running go to `to_cancel`; a choice
  // not yet submitted is cancelled by the handler (`cancelled`). Returns whether it ended here.
  bool abort(const ApiError& e, std::vector<engine::RequestId>* to_cancel) {
    if (done || failed) return false;
    done = true;
    cancelled = true;
    aborted = e;
    for (auto& c : choices) {
      if (c.submitted && !c.finished) {
        to_cancel->push_back(c.id);
        observe_abort(c);
      }
      c.finished = true;  // later engine outputs (the cancellations) are ignored
    }
    w->set_log_info(fmt::format("id={} error=\"{}\"", id, e.message.substr(0, 200)));
    api->metrics_.count_request(endpoint, e.status);
    if (req.stream) {
      emit(sse_event(Json::parse(error_body(e))));
      emit(sse_done());
      if (started) w->end();  // else the handler writes `pending` and ends the stream
    } else if (started) {
      w->respond(e.status, "application/json", error_body(e));
    }  // else the handler calls send_final, which answers with `aborted`
    return true;
  }

  void send_final() {
    if (aborted) {  // (metrics counted in abort)
      w->respond(aborted->status, "application/json", error_body(*aborted));
      return;
    }
    for (auto& c : choices) {
      if (c.finish_reason == "error") {
        ApiError e = choice_error(c);
        api->metrics_.count_request(endpoint, 500);
        w->respond(500, "application/json", error_body(e));
        return;
      }
    }
    int64_t prompt, completion, cached;
    totals(&prompt, &completion, &cached);
    Json body = Json::object();
    body["id"] = id;
    body["object"] = chat ? "chat.completion" : "text_completion";
    body["created"] = created;
    body["model"] = api->cfg_.served_model_name;
    Json arr = Json::array();
    for (auto& c : choices) {
      Json ch = Json::object();
      ch["index"] = c.index;
      if (chat) {
        Json m = Json::object();
        m["role"] = "assistant";
        m["content"] = c.msg.content.empty() && !c.msg.tool_calls.empty() ? Json(nullptr) : Json(c.msg.content);
        m["reasoning_content"] = c.msg.reasoning_content.empty() ? Json(nullptr) : Json(c.msg.reasoning_content);
        if (!c.msg.tool_calls.empty()) {
          Json calls = Json::array();
          for (auto& tc : c.msg.tool_calls) {
            Json j = Json::object();
            j["id"] = tc.id;
            j["type"] = "function";
            Json fn = Json::object();
            fn["name"] = tc.name;
            fn["arguments"] = tc.arguments;
            j["function"] = fn;
            calls.push_back(std::move(j));
          }
          m["tool_calls"] = std::move(calls);
        }
        ch["message"] = std::move(m);
        if (req.sampling.logprobs) {
          Json l = Json::object();
          l["content"] = std::move(c.lp_items);
          ch["logprobs"] = std::move(l);
        } else {
          ch["logprobs"] = nullptr;
        }
      } else {
        ch["text"] = c.echo_text + c.text;
        if (req.sampling.logprobs) {
          Json l = Json::object();
          if (!c.echo_text.empty()) {
            for (auto& o : c.cmp_offsets) o = o.get<int64_t>() + c.echo_chars;
          }
          // Echoed prompt tokens first (their offsets count from the start already).
          auto joined = [](Json& a, Json& b) {
            for (auto& x : b) a.push_back(std::move(x));
            return std::move(a);
          };
          l["tokens"] = joined(c.echo_tokens, c.cmp_tokens);
          l["token_logprobs"] = joined(c.echo_lps, c.cmp_lps);
          l["top_logprobs"] = joined(c.echo_top, c.cmp_top);
          l["text_offset"] = joined(c.echo_offsets, c.cmp_offsets);
          ch["logprobs"] = std::move(l);
        } else {
          ch["logprobs"] = nullptr;
        }
      }
      ch["finish_reason"] = c.finish_reason;
      arr.push_back(std::move(ch));
    }
    body["choices"] = std::move(arr);
    body["usage"] = usage_json(prompt, completion, cached);
    api->metrics_.count_request(endpoint, w->closed() ? 499 : 200);
    w->respond(200, "application/json", dump_json(body));
  }
};

// ------------------------------------------------------------------------------------------------

OpenAiApi::OpenAiApi(engine::Engine* engine, text::Tokenizer tokenizer, ApiConfig config)
    : engine_(engine), tok_(std::move(tokenizer)), cfg_(std::move(config)), started_at_(unix_now()) {
  drop_tokens_ = text::template_special_tokens(&tok_);
  {
    std::vector<int32_t> ids;
    for (const text::AddedToken& t : tok_.added_tokens())
      if (std::find(drop_tokens_.begin(), drop_tokens_.end(), t.content) != drop_tokens_.end())
        ids.push_back(t.id);
    std::sort(ids.begin(), ids.end());
    skip_ids_ = std::make_shared<const std::vector<int32_t>>(std::move(ids));
  }
  limits_.max_context = engine_->max_context();
  limits_.vocab_size = engine_->vocab_size();
  seq_capacity_ = std::min(engine_->max_context(), engine_->max_tokens_limit(1) + 1);
}

OpenAiApi::~OpenAiApi() = default;

void OpenAiApi::set_connection_counter(std::function<int64_t()> fn) { connections_ = std::move(fn); }

int64_t OpenAiApi::abort_generations(const std::string& message) {
  const ApiError e = api_error(503, message, "service_unavailable", "shutting_down");
  std::vector<std::shared_ptr<Generation>> live;
  {
    std::lock_guard<std::mutex> lk(gens_mu_);
    abort_error_ = e;  // requests registering later end at once too
    for (auto& w : gens_)
      if (auto g = w.lock()) live.push_back(std::move(g));
  }
  int64_t n = 0;
  for (auto& g : live) {
    std::vector<engine::RequestId> ids;
    {
      std::lock_guard<std::mutex> lk(g->mu);
      n += g->abort(e, &ids) ? 1 : 0;
    }
    for (auto id : ids) engine_->cancel(id);
  }
  return n;
}

void OpenAiApi::send_error(const HttpRequest& req, ResponseWriter& w, const ApiError& e) {
  metrics_.count_request(req.path, e.status);
  w.set_log_info("error=\"" + e.message.substr(0, 200) + "\"");
  std::vector<std::pair<std::string, std::string>> extra;
  if (e.status == 401) extra.emplace_back("WWW-Authenticate", "Bearer");
  w.respond(e.status, "application/json", error_body(e), std::move(extra));
}

void OpenAiApi::send_json(const HttpRequest& req, ResponseWriter& w, int status, const Json& body) {
  metrics_.count_request(req.path, status);
  w.respond(status, "application/json", dump_json(body));
}

bool OpenAiApi::check_model(const std::string& model, ApiError* err) const {
  if (model.empty() || model == cfg_.served_model_name) return true;
  for (auto& a : cfg_.model_aliases) {
    if (model == a) return true;
  }
  *err = api_error(404, fmt::format("The model '{}' does not exist; this server serves '{}'", model,
                                    cfg_.served_model_name),
                   "invalid_request_error", "model_not_found", "model");
  return false;
}

void OpenAiApi::handle(HttpRequest req, std::shared_ptr<ResponseWriter> w) {
  struct Route {
    const char* path;
    const char* method;
  };
  static const Route kRoutes[] = {
      {"/health", "GET"},         {"/health", "HEAD"},         {"/metrics", "GET"},
      {"/v1/models", "GET"},      {"/v1/chat/completions", "POST"},
      {"/v1/completions", "POST"}, {"/tokenize", "POST"},      {"/detokenize", "POST"},
      {"/v1/tokenize", "POST"},   {"/v1/detokenize", "POST"},  {"/", "GET"},
  };
  std::string path = req.path;
  if (path.size() > 1 && path.back() == '/') path.pop_back();
  bool model_path = path.rfind("/v1/models/", 0) == 0;
  bool known = model_path;
  bool method_ok = model_path && req.method == "GET";
  std::string allow;
  for (auto& r : kRoutes) {
    if (path == r.path) {
      known = true;
      if (req.method == r.method) method_ok = true;
      allow += allow.empty() ? r.method : std::string(", ") + r.method;
    }
  }
  if (!known) {
    send_error(req, *w, api_error(404, fmt::format("no route for {} {}", req.method, req.path),
                                  "invalid_request_error", "not_found"));
    return;
  }
  if (model_path && allow.empty()) allow = "GET";  // /v1/models/{id}: GET only
  if (!method_ok) {
    ApiError e = api_error(405, fmt::format("method {} is not allowed for {}; use {}", req.method,
                                            req.path, allow),
                           "invalid_request_error", "method_not_allowed");
    metrics_.count_request(req.path, 405);
    w->respond(405, "application/json", error_body(e), {{"Allow", allow.empty() ? "GET" : allow}});
    return;
  }
  if (path == "/health" || path == "/") {
    // Draining: report 503 so load balancers stop routing here while running streams finish.
    const int code = draining_.load() ? 503 : 200;
    metrics_.count_request(path, code);
    w->respond(code, "application/json",
               code == 200 ? R"({"status":"ok"})" : R"({"status":"shutting_down"})");
    return;
  }
  if (path == "/metrics") {
    metrics_.count_request(path, 200);
    std::string text = metrics_.render(engine_->stats(), connections_ ? connections_() : 0,
                                       cfg_.served_model_name);
    w->respond(200, "text/plain; version=0.0.4; charset=utf-8", std::move(text));
    return;
  }
  if (!cfg_.api_key.empty() && !check_bearer(req.header("authorization"), cfg_.api_key)) {
    send_error(req, *w, api_error(401, "Incorrect or missing API key; send 'Authorization: Bearer <key>'",
                                  "invalid_request_error", "invalid_api_key"));
    return;
  }
  req.path = path;
  if (req.method == "POST") {
    // Compressed bodies are not decoded: refused (RFC 9110 §15.5.16: 415 for an unsupported
    // content coding; RFC 9112 §6.1: 501 for a transfer coding other than chunked) rather than
    // parsed as if they were plain JSON — a gzip body used to get "invalid UTF-8"/"not JSON".
    const std::string ce = lower_trimmed(req.header("content-encoding"));
    if (!ce.empty() && ce != "identity") {
      return send_error(
          req, *w,
          api_error(415,
                    fmt::format("Unsupported Media Type: Content-Encoding '{}' is not supported; "
                                "send the JSON body uncompressed",
                                req.header("content-encoding").substr(0, 100)),
                    "invalid_request_error", "unsupported_media_type"));
    }
    if (!chunked_only(req.header("transfer-encoding"))) {
      return send_error(
          req, *w,
          api_error(501,
                    fmt::format("Transfer-Encoding '{}' is not supported; only chunked",
                                req.header("transfer-encoding").substr(0, 100)),
                    "invalid_request_error", "not_implemented"));
    }
  }
  if (req.method == "POST" && !json_content_type(req.header("content-type"))) {
    // As vLLM: a body that is not declared JSON is refused, not guessed at. These are also the
    // types a browser may POST cross-origin without a CORS preflight.
    send_error(req, *w,
               api_error(415,
                         fmt::format("Unsupported Media Type: Content-Type '{}' is not allowed; send "
                                     "the JSON body with 'Content-Type: application/json' (curl: "
                                     "-H 'Content-Type: application/json')",
                                     req.header("content-type").substr(0, 100)),
                         "invalid_request_error", "unsupported_media_type"));
    return;
  }
  if (path == "/v1/models" || model_path) {
    handle_models(req, *w);
  } else if (path == "/tokenize" || path == "/v1/tokenize") {
    handle_tokenize(req, *w);
  } else if (path == "/detokenize" || path == "/v1/detokenize") {
    handle_detokenize(req, *w);
  } else {
    handle_generate(req, std::move(w), path == "/v1/chat/completions");
  }
}

void OpenAiApi::handle_models(const HttpRequest& req, ResponseWriter& w) {
  Json m = Json::object();
  m["id"] = cfg_.served_model_name;
  m["object"] = "model";
  m["created"] = started_at_;  // fixed at server start (clients compare / cache it)
  m["owned_by"] = "v4serve";
  m["root"] = cfg_.served_model_name;
  m["max_model_len"] = engine_->max_context();
  if (req.path.rfind("/v1/models/", 0) == 0) {
    // {id} is a path segment: percent-decoded, so ids with '/' (`deepseek%2Fv4`) can be named.
    const std::string raw = req.path.substr(std::string("/v1/models/").size());
    const std::optional<std::string> decoded = percent_decode(raw);
    if (!decoded) {
      send_error(
          req, w,
          api_error(400,
                    fmt::format("the model id '{}' in the path is not valid percent-encoding: "
                                "'%' must be followed by two hex digits",
                                raw.substr(0, 200)),
                    "invalid_request_error", "invalid_model_id"));
      return;
    }
    const std::string& name = *decoded;
    ApiError err;
    if (name.empty() || !check_model(name, &err)) {
      if (name.empty()) err = api_error(404, "model name missing", "invalid_request_error", "model_not_found");
      send_error(req, w, err);
      return;
    }
    send_json(req, w, 200, m);
    return;
  }
  Json body = Json::object();
  body["object"] = "list";
  body["data"] = Json::array({m});
  send_json(req, w, 200, body);
}

bool OpenAiApi::encode_chat(const GenerateRequest& r, std::vector<int32_t>* tokens, ApiError* err) const {
  text::ChatOptions opt;
  // (r.thinking already holds the server default when the request did not choose.)
  opt.thinking_mode = r.thinking ? text::ThinkingMode::kThinking : text::ThinkingMode::kChat;
  opt.effort_profile = cfg_.effort_profile;
  if (r.reasoning_effort) opt.reasoning_effort = map_reasoning_effort(*r.reasoning_effort, cfg_.effort_profile);
  opt.add_generation_prompt = r.add_generation_prompt;
  opt.accept_object_arguments = true;
  Json tools = r.tool_choice == "none" ? Json() : r.tools;
  Json with_format;  // the messages with the request's response_format attached, when it has one
  if (!r.response_format.is_null()) {
    // DeepSeek V4 carries a response format on the system message (chat-encoding §2.8): on the
    // first one (unless it already has its own, non-null), else on a new empty one in front.
    with_format = r.messages;
    if (!with_format.empty() && with_format[0].is_object() &&
        with_format[0].value("role", "") == "system") {
      if (!with_format[0].contains("response_format") || with_format[0]["response_format"].is_null())
        with_format[0]["response_format"] = r.response_format;
    } else {
      with_format.insert(with_format.begin(), Json{{"role", "system"}, {"content", ""},
                                                   {"response_format", r.response_format}});
    }
  }
  auto res = text::ChatEncoder::encode(tok_, r.response_format.is_null() ? r.messages : with_format,
                                       tools, opt);
  if (!res.ok()) {
    *err = bad_request(res.status().message(), "messages");
    return false;
  }
  *tokens = std::move(res.value());
  // tool_choice "required" / a named function: pre-fill the tool-call opener (forced_tool_call).
  const ForcedToolCall forced = forced_tool_call(r);
  if (!forced.prefill.empty()) {
    const auto more = tok_.encode(forced.prefill);
    tokens->insert(tokens->end(), more.begin(), more.end());
  }
  return true;
}

void OpenAiApi::handle_tokenize(const HttpRequest& req, ResponseWriter& w) {
  ApiError err;
  auto body = parse_json_body(req.body, &err);
  if (!body.ok()) return send_error(req, w, err);
  const Json& b = *body;
  if (b.contains("model") && !b["model"].is_null()) {
    if (!b["model"].is_string()) return send_error(req, w, bad_request("'model' must be a string", "model"));
    if (!check_model(b["model"].get<std::string>(), &err)) return send_error(req, w, err);
  }
  std::vector<int32_t> tokens;
  if (b.contains("messages")) {
    GenerateRequest r;
    ValidationLimits lim = limits_;
    if (!parse_chat_request(b, lim, &r, &err)) return send_error(req, w, err);
    if (!r.thinking_set) r.thinking = cfg_.default_thinking;
    if (!encode_chat(r, &tokens, &err)) return send_error(req, w, err);
  } else if (b.contains("prompt") && b["prompt"].is_string()) {
    bool add_special = true;
    if (b.contains("add_special_tokens")) {
      if (!b["add_special_tokens"].is_boolean()) return send_error(req, w, bad_request("'add_special_tokens' must be a boolean", "add_special_tokens"));
      add_special = b["add_special_tokens"].get<bool>();
    }
    tokens = encode_prompt_text(tok_, b["prompt"].get<std::string>(), add_special);
  } else {
    return send_error(req, w, bad_request("expected 'prompt' (a string) or 'messages' (an array)", "prompt"));
  }
  bool token_strs = false;
  if (b.contains("return_token_strs") && !b["return_token_strs"].is_null()) {
    if (!b["return_token_strs"].is_boolean())
      return send_error(req, w, bad_request("'return_token_strs' must be a boolean", "return_token_strs"));
    token_strs = b["return_token_strs"].get<bool>();
  }
  Json out = Json::object();
  out["count"] = tokens.size();
  out["max_model_len"] = engine_->max_context();
  out["tokens"] = tokens;
  if (token_strs) {
    Json strs = Json::array();
    for (auto t : tokens) {
      auto s = tok_.id_to_token(t);
      strs.push_back(s ? Json(*s) : Json(nullptr));
    }
    out["token_strs"] = std::move(strs);
  } else {
    out["token_strs"] = nullptr;
  }
  send_json(req, w, 200, out);
}

void OpenAiApi::handle_detokenize(const HttpRequest& req, ResponseWriter& w) {
  ApiError err;
  auto body = parse_json_body(req.body, &err);
  if (!body.ok()) return send_error(req, w, err);
  const Json& b = *body;
  if (b.contains("model") && !b["model"].is_null()) {
    if (!b["model"].is_string()) return send_error(req, w, bad_request("'model' must be a string", "model"));
    if (!check_model(b["model"].get<std::string>(), &err)) return send_error(req, w, err);
  }
  if (!b.contains("tokens") || !b["tokens"].is_array()) {
    return send_error(req, w, bad_request("'tokens' must be an array of token ids", "tokens"));
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < b["tokens"].size(); ++i) {
    const Json& x = b["tokens"][i];
    if (!x.is_number_integer())
      return send_error(req, w, bad_request(fmt::format("'tokens[{}]' must be an integer token id, got {}", i, x.dump()), "tokens"));
    if (x.get<int64_t>() < 0 || x.get<int64_t>() >= engine_->vocab_size())
      return send_error(req, w, bad_request(fmt::format("'tokens[{}]' = {} is not a token id in [0, {})", i, x.dump(), engine_->vocab_size()), "tokens"));
    ids.push_back(int32_t(x.get<int64_t>()));
  }
  Json out = Json::object();
  out["prompt"] = tok_.decode(ids, false);
  send_json(req, w, 200, out);
}

void OpenAiApi::handle_generate(const HttpRequest& hreq, std::shared_ptr<ResponseWriter> w, bool chat) {
  if (draining_.load())
    return send_error(hreq, *w,
                      api_error(503, "the server is shutting down; retry on another replica",
                                "service_unavailable", "shutting_down"));
  ApiError err;
  auto body = parse_json_body(hreq.body, &err);
  if (!body.ok()) return send_error(hreq, *w, err);
  auto gen = std::make_shared<Generation>(this);
  gen->w = w;
  gen->chat = chat;
  gen->endpoint = hreq.path;
  gen->id = random_id(chat ? "chatcmpl-" : "cmpl-");
  gen->created = unix_now();
  GenerateRequest& r = gen->req;
  bool ok = chat ? parse_chat_request(*body, limits_, &r, &err)
                 : parse_completion_request(*body, limits_, &r, &err);
  if (!ok) return send_error(hreq, *w, err);
  if (!check_model(r.model, &err)) return send_error(hreq, *w, err);
  // Fields this endpoint does not read are ignored, as vLLM does (clients send extras); one
  // warning per request names them so a misspelt parameter does not go unnoticed.
  if (auto unknown = unknown_request_fields(*body, r.kind); !unknown.empty())
    V4_LOG_WARN("{} {}: ignoring unknown request field(s): {}", hreq.path, gen->id,
                describe_field_names(unknown));  // escaped: the names are the client's text
  if (chat && !r.thinking_set) r.thinking = cfg_.default_thinking;
  gen->require_tool_call =
      chat && !r.tools.is_null() && (r.tool_choice_function || r.tool_choice == "required");

  // Prompts -> token ids.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo;
  std::vector<bool> echo_added_bos;
  if (chat) {
    std::vector<int32_t> t;
    if (!encode_chat(r, &t, &err)) return send_error(hreq, *w, err);
    prompts.push_back(std::move(t));
    echo.emplace_back();
  } else {
    for (auto& p : r.prompts) {
      if (p.text) {
        bool added = false;
        prompts.push_back(encode_prompt_text(tok_, *p.text, true, &added));
        echo.push_back(r.echo ? *p.text : std::string());
        echo_added_bos.push_back(added);
      } else {
        echo_added_bos.push_back(false);
        prompts.push_back(p.token_ids);
        echo.push_back(r.echo ? tok_.decode(p.token_ids, false) : std::string());
      }
    }
  }
  const int64_t ctx = engine_->max_context();
  int64_t longest = 0;
  for (auto& p : prompts) {
    if (p.empty()) return send_error(hreq, *w, bad_request("the prompt is empty after tokenization", chat ? "messages" : "prompt"));
    longest = std::max<int64_t>(longest, int64_t(p.size()));
  }
  if (longest >= ctx || (r.max_tokens && longest + *r.max_tokens > ctx)) {
    // A prompt that fills the context alone is named as such, whatever max_tokens says (with
    // max_tokens 0 the "requested" total would equal the limit and read as allowed).
    std::string msg = r.max_tokens && longest < ctx
        ? fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the prompt, {} for the completion). Please reduce the length of the prompt or of max_tokens.",
                      ctx, longest + *r.max_tokens, longest, *r.max_tokens)
        : fmt::format("This model's maximum context length is {} tokens. However, the prompt has {} tokens, leaving no room for the completion.",
                      ctx, longest);
    // The field to shorten: the prompt when it alone leaves no room, else max_tokens (as the
    // KV-cache form below).
    return send_error(hreq, *w, api_error(400, msg, "invalid_request_error", "context_length_exceeded",
                                          longest >= ctx ? (chat ? "messages" : "prompt") : "max_tokens"));
  }
  // Within the model's context but beyond what the KV pools hold for one sequence (the pools are
  // sized by --mem-fraction, not by the context): the same error code, naming the cache limit.
  if (const int64_t room = engine_->max_tokens_limit(longest); room == 0 || (r.max_tokens && *r.max_tokens > room)) {
    const int64_t cap = seq_capacity_;  // < ctx here
    std::string msg = r.max_tokens && room > 0
        ? fmt::format("This server's KV cache holds at most {} tokens for one sequence (the model's maximum context length is {}). However, you requested {} tokens ({} in the prompt, {} for the completion). Please reduce the length of the prompt or of max_tokens.",
                      cap, ctx, longest + *r.max_tokens, longest, *r.max_tokens)
        : fmt::format("This server's KV cache holds at most {} tokens for one sequence (the model's maximum context length is {}). However, the prompt has {} tokens, leaving no room for the completion.",
                      cap, ctx, longest);
    return send_error(hreq, *w, api_error(400, msg, "invalid_request_error", "context_length_exceeded",
                                          room == 0 ? (chat ? "messages" : "prompt") : "max_tokens"));
  }

  // Choices. One stop list for all of them (it may be MBs; parse_common refused empty strings).
  const auto stops = make_stop_strings(r.stop);
  const int n = r.n;
  gen->choices.resize(prompts.size() * size_t(n));
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    for (int j = 0; j < n; ++j) {
      auto& c = gen->choices[pi * size_t(n) + size_t(j)];
      c.index = int(pi) * n + j;
      text::DetokenizerOptions dopt;
      // Completions: skip_special_tokens (default true) drops the tokenizer's special tokens
      // (BOS/EOS/pad) and the template control tokens chat never shows (`<｜User｜>`, ...);
      // `<think>`, `</think>` and `｜DSML｜` stay (they delimit reasoning and tool calls in the
      // raw text). Chat parses the raw text: its parser drops markup itself.
      dopt.skip_special_tokens = chat ? false : r.skip_special_tokens;
      if (!chat) dopt.skip_ids = skip_ids_;
      c.detok.emplace(tok_, dopt);
      c.stop.emplace(stops, r.include_stop_str_in_output);
      if (chat) {
        text::OutputParserOptions popt;
        // A continued assistant message ends in its content part (thinking mode renders
        // `{reasoning}</think>{content}`), so the continuation is content.
        popt.start = r.thinking && !r.continue_final ? text::ThinkingMode::kThinking : text::ThinkingMode::kChat;
        popt.id_seed = std::hash<std::string>{}(gen->id) + uint64_t(c.index);
        popt.drop_tokens = drop_tokens_;
        popt.eos_ends_output = !r.sampling.ignore_eos;  // ignore_eos: the text goes on past EOS
        const ForcedToolCall forced = forced_tool_call(r);
        popt.start_in_tool_block = forced.start_in_tool_block;
        popt.start_tool_name = forced.tool_name;
        c.parser.emplace(popt);
      }
      c.echo_text = echo[pi];
      c.echo_chars = u8_chars(c.echo_text);
      if (!chat && r.echo && r.sampling.logprobs) {
        c.echo_ids = prompts[pi];
        c.echo_added_bos = echo_added_bos[pi];
      }
      c.score_only = !chat && r.max_tokens && *r.max_tokens == 0;
      c.prompt_tokens = int64_t(prompts[pi].size());
    }
  }

  // Streaming responses start before the first submit would produce output; nothing is written
  // until all submits succeeded (chunks are buffered under the lock meanwhile).
  std::weak_ptr<Generation> weak = gen;
  engine::Engine* eng = engine_;
  w->on_close([weak, eng] {
    auto g = weak.lock();
    if (!g) return;
    std::vector<engine::RequestId> ids;
    {
      std::lock_guard<std::mutex> lk(g->mu);
      g->cancelled = true;
      for (auto& c : g->choices) {
        if (c.submitted && !c.finished) ids.push_back(c.id);
      }
    }
    for (auto id : ids) eng->cancel(id);
  });

  Status submit_error;
  {
    std::unique_lock<std::mutex> lk(gen->mu);
    // Visible to abort_generations from here on (set up; it takes gen->mu). A request that gets
    // here after abort_generations ran is ended at once the same way.
    {
      std::lock_guard<std::mutex> g(gens_mu_);
      std::erase_if(gens_, [](const std::weak_ptr<Generation>& x) { return x.expired(); });
      gens_.push_back(gen);
      std::vector<engine::RequestId> none;  // nothing submitted yet
      if (abort_error_) gen->abort(*abort_error_, &none);
    }
    for (size_t ci = 0; ci < gen->choices.size(); ++ci) {
      if (gen->aborted) break;  // abort_generations: submit nothing more
      size_t pi = ci / size_t(n);
      engine::Request er;
      er.prompt_tokens = prompts[pi];
      er.sampling = r.sampling;
      // echo + logprobs: the engine scores the prompt tokens too (computed in full, no cache hit).
      if (!chat && r.echo && r.sampling.logprobs) er.sampling.prompt_logprobs = r.top_logprobs;
      if (r.sampling.seed && ci % size_t(n) != 0) er.sampling.seed = *r.sampling.seed + ci % size_t(n);
      er.tag = gen->id;
      // A defaulted max_tokens is the most the engine can ever run for this prompt (context and
      // every pool's capacity).
      er.sampling.max_tokens = r.max_tokens ? *r.max_tokens : engine_->max_tokens_limit(int64_t(prompts[pi].size()));
      // max_tokens 0 (completions with echo): the engine draws one token the response leaves out.
      if (gen->choices[ci].score_only) er.sampling.max_tokens = 1;
      auto cb = [gen, ci](const engine::StepOutput& out) {
        std::vector<engine::RequestId> to_cancel;
        {
          std::lock_guard<std::mutex> g(gen->mu);
          gen->on_output(ci, out, &to_cancel);
        }
        // Stop strings: the output is complete, the engine counts it as finished (kStop).
        for (auto id : to_cancel) gen->api->engine_->cancel(id, engine::FinishReason::kStop);
      };
      // The callback can run before submit returns; it takes gen->mu, so release it meanwhile.
      lk.unlock();
      Result<engine::RequestId> res =
          er.sampling.max_tokens > 0
              ? engine_->submit(er, cb)
              : Result<engine::RequestId>(make_error(ErrorCode::kInvalidArgument,
                                                     "the prompt ({} tokens) does not fit in the KV cache with room for one more token",
                                                     prompts[pi].size()));
      lk.lock();
      if (!res.ok()) {
        submit_error = res.status();
        break;
      }
      gen->choices[ci].id = *res;
      gen->choices[ci].submitted = true;
      if (gen->cancelled) {
        lk.unlock();
        engine_->cancel(*res);
        lk.lock();
      }
    }
    if (!submit_error.ok()) {
      gen->failed = true;
      std::vector<engine::RequestId> ids;
      for (auto& c : gen->choices) {
        if (c.submitted) ids.push_back(c.id);
        if (c.submitted && !c.finished) gen->observe_abort(c);
      }
      lk.unlock();
      for (auto id : ids) engine_->cancel(id);
      return send_error(hreq, *w, from_status(submit_error, chat ? "messages" : "prompt"));
    }
    // Start the response now.
    gen->started = true;
    if (r.stream) {
      w->start_stream(200, "text/event-stream; charset=utf-8");
      for (auto& c : gen->pending) w->write(std::move(c));
      gen->pending.clear();
      if (gen->done) w->end();
    } else if (gen->done) {
      gen->send_final();
    }
  }
}

}  // namespace v4::server
