// OpenAI-compatible request schemas: JSON body -> typed, validated request (or an OpenAI-style
// error), plus the small framing helpers (errors, SSE) the HTTP layer writes.
// Accepted fields and their ranges are listed in docs/server.md.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "text/chat_encoder.h"

namespace v4::server {

using Json = nlohmann::ordered_json;

/// An OpenAI-style error: HTTP status + `{"error": {"message", "type", "param", "code"}}`.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
};

/// `{"error": {...}}` body of `e`.
std::string error_body(const ApiError& e);
/// 400 invalid_request_error naming `param`.
ApiError bad_request(std::string message, std::string param = "", std::string code = "");

/// One SSE event: `data: <json>\n\n` (invalid UTF-8 in strings replaced by U+FFFD).
std::string sse_event(const Json& payload);
/// The terminating SSE event: `data: [DONE]\n\n`.
std::string sse_done();
/// Compact JSON text with invalid UTF-8 replaced (never throws).
std::string dump_json(const Json& j);

/// A prompt given either as text or as token ids (completions / tokenize).
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> token_ids;  // used when !text
};

/// What the chat or completions endpoint asked for, validated. Sampling values are already in
/// engine units; `max_tokens` is nullopt when the client did not set it (server fills it with the
/// context left after the prompt).
struct GenerateRequest {
  enum class Kind { kChat, kCompletion };
  Kind kind = Kind::kChat;
  std::string model;  // "" = not given
  // chat
  Json messages = Json::array();
  Json tools;          // null or array of {"type": "function", "function": {...}}
  /// null, or the request's response_format object of type "json_object" / "json_schema": the
  /// prompt carries it as DeepSeek V4's response-format block (chat-encoding §2.8); the output is
  /// not grammar-constrained. {"type": "text"} is stored as null.
  Json response_format;
  std::string tool_choice = "auto";  // "auto" | "none" | "required" | function name
  bool tool_choice_function = false;  // tool_choice names a function (tool_choice holds its name)
  bool thinking = false;             // chat_template_kwargs.thinking / enable_thinking / thinking.type
  bool thinking_set = false;         // the request chose (else the server default applies)
  std::optional<std::string> reasoning_effort;
  bool add_generation_prompt = true;
  /// Prefix continuation: `continue_final_message: true` (vLLM) or `"prefix": true` on the final
  /// assistant message (DeepSeek API). That message is rendered without its EOS (`wo_eos`) and the
  /// model continues it; the output parser starts in content (the prompt ends in the content part).
  bool continue_final = false;
  // completions
  std::vector<PromptInput> prompts;  // one choice group per prompt
  bool echo = false;
  std::string suffix;
  // both
  int n = 1;
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  bool continuous_usage = false;      // stream_options.continuous_usage_stats (vLLM)
  std::optional<int64_t> max_tokens;  // max_tokens / max_completion_tokens
  engine::SamplingParams sampling;    // max_tokens filled later
  std::vector<std::string> stop;      // stop strings (text level)
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;    // completions text (chat always parses special markers)
  int top_logprobs = 0;               // with sampling.logprobs
  std::string user;
};

/// How the assistant turn is forced to call a tool (`tool_choice` "required" or a named function):
/// text appended to the chat prompt after the generation header, and where the output parser
/// starts. chat-encoding.md §2.10 / §4.1 (DeepSeek's recipe pre-fills the block opener):
/// - "required": `\n\n<｜DSML｜tool_calls>\n` — the model continues inside a tool-call block and
///   must name a function (the sampler is not constrained: it may still close the block empty);
/// - a named function: that plus `<｜DSML｜invoke name="NAME">\n` — the call to NAME is certain,
///   the model writes its parameters;
/// - in thinking mode the prompt ends with `<think>`: `</think>` is pre-filled first (empty
///   reasoning, as a thinking-mode tool turn with no reasoning is rendered).
/// Empty prefill (no forcing) for "auto" / "none", or when the prompt has no generation header
/// (add_generation_prompt false, or a final assistant message being continued).
struct ForcedToolCall {
  std::string prefill;
  bool start_in_tool_block = false;
  std::string tool_name;  // named function, else empty
};
ForcedToolCall forced_tool_call(const GenerateRequest& r);

/// Limits used by validation.
struct ValidationLimits {
  int64_t max_context = 1 << 20;  // tokens
  int64_t vocab_size = 0;         // for token-id prompts; 0 = unchecked
  int max_n = 128;
  int max_stop = 64;
  int max_top_logprobs = 20;
  int max_logit_bias = 1024;  // logit_bias entries
};

/// Parses the body text as JSON (an object). Errors: 400 on bad JSON / invalid UTF-8 / non-object.
/// Bodies nesting arrays / objects deeper than this are refused (400) before parsing: copying,
/// dumping and encoding a JSON value recurse once per level, so a body of a few hundred KiB of
/// `{"a":{"a":...}}` would otherwise overflow an HTTP thread's stack and crash the server.
inline constexpr int kMaxJsonDepth = 512;
/// Bodies with a JSON object of more keys than this are refused (400) before the DOM parse:
/// `ordered_json` inserts a key by a linear search of the object's keys, so one object of n keys
/// costs O(n^2) (120k keys in a 1.8 MB body took ~40 s of an HTTP thread). No field the server
/// reads needs more (`logit_bias` allows 1,024 entries); the count is per object, duplicates
/// included.
inline constexpr size_t kMaxJsonObjectKeys = 8192;
/// And over all objects of a body: the sum of n*(n-1)/2 (the key comparisons of those inserts)
/// at most this (~0.3 s of parsing; two objects at the cap fit): without it, 500 objects of 8,192
/// keys each (a 32 MiB body) would cost as much as one quadratic object, about a minute. Ordinary
/// requests (hundreds of objects of tens of keys) use well under 0.1% of it.
inline constexpr uint64_t kMaxJsonKeyComparisons = uint64_t(1) << 26;
Result<Json> parse_json_body(std::string_view body, ApiError* err);

/// The chat endpoint's rule for a message's `content` (OpenAI's), shared with `v4serve tokenize
/// --messages`: required (a string or a non-empty array of parts) on user, system and developer
/// messages and on an assistant message without tool_calls (absent, null or `[]`); null or absent
/// on an assistant message with tool_calls and on a tool result; an empty parts array is refused
/// on every role. `where` names the message (`messages[1]`). Returns the error message (naming
/// `where.content`), or "" when the message passes or is not an object with a string role (the
/// callers' other checks report those).
std::string chat_message_content_error(const Json& m, const std::string& where);

/// Validates a /v1/chat/completions body. Returns false and fills `err` on a bad request.
bool parse_chat_request(const Json& body, const ValidationLimits& lim, GenerateRequest* out,
                        ApiError* err);
/// Validates a /v1/completions body. Returns false and fills `err` on a bad request.
bool parse_completion_request(const Json& body, const ValidationLimits& lim, GenerateRequest* out,
                              ApiError* err);

/// Top-level fields of a chat (`kind` kChat) or completions body that the endpoint does not read,
/// in body order. They are accepted and ignored, as vLLM does (OpenAI answers 400); the server
/// logs a warning naming them.
std::vector<std::string> unknown_request_fields(const Json& body, GenerateRequest::Kind kind);
/// The names for the log line: control characters (C0, DEL, C1 — ANSI escapes included — and
/// U+2028/U+2029) and `\` written JSON-style (`\n`, `\u001b`), so a client cannot forge log
/// lines or drive a terminal; an empty name as `""`; each name cut at 64 characters (+ "…") and
/// the list at the first 16 names (+ "… and N more"), joined by ", ".
std::string describe_field_names(const std::vector<std::string>& names);

/// A request's stop strings with their KMP failure tables (built once, shared by its choices).
struct StopStrings {
  std::vector<std::string> strings;          // non-empty
  std::vector<std::vector<uint32_t>> fail;   // fail[i][k]: longest proper border of strings[i][0..k]
};
/// Drops empty strings and builds the tables: O(total length).
std::shared_ptr<const StopStrings> make_stop_strings(std::vector<std::string> stops);

/// Text-level stop strings over a stream of text deltas: returns the text that is safe to emit
/// (never any byte of a stop string or past it; a suffix that may start a stop string is held
/// back until it is decided, across any number of deltas). Each stop string is matched by a KMP
/// automaton over the pushed bytes, so a push costs O(delta × stop strings) amortized whatever
/// the strings' lengths and the held-back text (a search of the held text per push was
/// O(held × length) per string: 31 stop strings of ~20,000 `a`s under a 60,000-`a` one, with
/// generation forced to `a` by logit_bias, took seconds per token on the thread that delivers
/// every request's outputs and froze the whole server).
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops, bool include_stop = false);
  /// Shares one list among the n choices of a request (stop strings may total MBs: one copy per
  /// choice turned a 32 MiB body with n = 128 into GBs).
  StopMatcher(std::shared_ptr<const StopStrings> stops, bool include_stop);
  /// Appends `delta`; returns the newly safe text. After a match, `stopped()` is true and the
  /// returned text ends right before the stop string (or after it with include_stop).
  std::string push(std::string_view delta);
  /// End of stream: returns the held-back text (nothing if stopped).
  std::string flush();
  bool stopped() const { return stopped_; }
  /// Text pushed but not released yet (it may begin a stop string).
  const std::string& held() const { return held_; }
  /// Characters (UTF-8 code points; invalid bytes one each) of held(), kept as it changes: the
  /// held text can be as long as the longest stop string, too long to count on every token.
  int64_t held_chars() const { return held_chars_; }
  /// The stop string that matched ("" if none).
  const std::string& matched() const { return matched_; }

 private:
  std::shared_ptr<const StopStrings> stops_list_;
  bool include_stop_;
  std::vector<uint32_t> state_;  // per stop string: bytes of it matched by the end of held_
  std::string held_;
  int64_t held_chars_ = 0;
  bool stopped_ = false;
  std::string matched_;
};

/// True when `s` is valid UTF-8.
bool valid_utf8(std::string_view s);

}  // namespace v4::server
