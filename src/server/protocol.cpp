#include "server/protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "base/log.h"
#include "text/py_json.h"

namespace v4::server {

std::string dump_json(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string error_body(const ApiError& e) {
  Json err = Json::object();
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? Json(nullptr) : Json(e.param);
  err["code"] = e.code.empty() ? Json(nullptr) : Json(e.code);
  Json body = Json::object();
  body["error"] = std::move(err);
  return dump_json(body);
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

std::string sse_event(const Json& payload) { return "data: " + dump_json(payload) + "\n\n"; }
std::string sse_done() { return "data: [DONE]\n\n"; }

bool valid_utf8(std::string_view s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + size_t(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + size_t(k)]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += size_t(len);
  }
  return true;
}

namespace {

// SAX handler counting the keys of each open object (a stack of counters); stops the parse at the
// first object past kMaxJsonObjectKeys and names where it is ("body", "body.logit_bias", ...).
struct ObjectKeyCounter {
  struct Frame {
    bool object = false;
    size_t count = 0;  // keys (object) or elements (array) so far
    std::string seg;   // this value's step from its parent: ".key" or "[i]" ("" at the root)
  };
  std::vector<Frame> stack;
  std::string last_key;
  bool too_many = false;
  bool too_many_in_all = false;
  uint64_t comparisons = 0;
  std::string where;

  // Only the step is kept per frame (the full path is built once, on failure: building it per
  // value would cost depth x values).
  std::string child_seg() const {
    if (stack.empty()) return "";
    const Frame& f = stack.back();
    if (f.object) return "." + (last_key.size() > 64 ? last_key.substr(0, 64) + "..." : last_key);
    return "[" + std::to_string(f.count - 1) + "]";
  }
  bool value() {
    if (!stack.empty() && !stack.back().object) ++stack.back().count;
    return true;
  }
  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(nlohmann::json::number_integer_t) { return value(); }
  bool number_unsigned(nlohmann::json::number_unsigned_t) { return value(); }
  bool number_float(nlohmann::json::number_float_t, const std::string&) { return value(); }
  bool string(std::string&) { return value(); }
  bool binary(nlohmann::json::binary_t&) { return value(); }
  bool start_object(size_t) {
    value();
    stack.push_back({true, 0, child_seg()});
    return true;
  }
  bool key(std::string& k) {
    Frame& f = stack.back();
    comparisons += f.count;  // an ordered_json insert compares with every key before it
    if (comparisons > kMaxJsonKeyComparisons) {
      too_many_in_all = true;
      return false;
    }
    if (++f.count > kMaxJsonObjectKeys) {
      too_many = true;
      where = "body";
      for (const Frame& g : stack) where += g.seg;
      return false;
    }
    last_key = k;
    return true;
  }
  bool end_object() {
    stack.pop_back();
    return true;
  }
  bool start_array(size_t) {
    value();
    stack.push_back({false, 0, child_seg()});
    return true;
  }
  bool end_array() {
    stack.pop_back();
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) {
    return false;
  }
};

}  // namespace

Result<Json> parse_json_body(std::string_view body, ApiError* err) {
  if (body.empty()) {
    *err = bad_request("request body is empty; expected a JSON object");
    return Status(ErrorCode::kInvalidArgument, err->message);
  }
  if (!valid_utf8(body)) {
    *err = bad_request("request body is not valid UTF-8");
    return Status(ErrorCode::kInvalidArgument, err->message);
  }
  // Nesting depth outside strings (a malformed body fails in the parser below, with its position).
  {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (char ch : body) {
      if (in_string) {
        if (escaped) escaped = false;
        else if (ch == '\\') escaped = true;
        else if (ch == '"') in_string = false;
      } else if (ch == '"') {
        in_string = true;
      } else if (ch == '[' || ch == '{') {
        if (++depth > kMaxJsonDepth) {
          *err = bad_request(fmt::format("request body nests arrays / objects more than {} levels "
                                         "deep",
                                         kMaxJsonDepth));
          return Status(ErrorCode::kInvalidArgument, err->message);
        }
      } else if (ch == ']' || ch == '}') {
        --depth;
      }
    }
  }
  // Keys per object, by a SAX pass (linear) before the DOM parse (quadratic in one object's keys).
  {
    ObjectKeyCounter counter;
    (void)nlohmann::json::sax_parse(body, &counter, nlohmann::json::input_format_t::json,
                                    /*strict=*/true);
    if (counter.too_many) {
      *err = bad_request(fmt::format("request body has a JSON object of more than {} keys (at "
                                     "{}); the server refuses larger objects",
                                     kMaxJsonObjectKeys, counter.where));
      return Status(ErrorCode::kInvalidArgument, err->message);
    }
    if (counter.too_many_in_all) {
      *err = bad_request(fmt::format("request body has too many keys in its JSON objects in all "
                                     "(objects of thousands of keys; one object may have up to {})",
                                     kMaxJsonObjectKeys));
      return Status(ErrorCode::kInvalidArgument, err->message);
    }
    // A syntax error stops the pass; the DOM parse below reports it with its position.
  }
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Parse again with exceptions for the position in the message.
    std::string what = "malformed JSON";
    try {
      Json again = Json::parse(body);
      (void)again;
    } catch (const std::exception& e) {
      what = e.what();
    }
    // OpenAI-style: no library prefix ("[json.exception.parse_error.101] parse error "); keep where
    // (line / column) and what was wrong.
    if (what.starts_with("[json.exception.")) {
      auto close = what.find("] ");
      if (close != std::string::npos) what.erase(0, close + 2);
    }
    if (what.starts_with("parse error ")) what.erase(0, 12);
    else if (what.starts_with("parse error: ")) what.erase(0, 13);
    *err = bad_request(fmt::format("request body is not valid JSON{}{}",
                                   what.starts_with("at ") ? " " : ": ", what));
    return Status(ErrorCode::kInvalidArgument, err->message);
  }
  if (!j.is_object()) {
    *err = bad_request("request body must be a JSON object");
    return Status(ErrorCode::kInvalidArgument, err->message);
  }
  return j;
}

namespace {

const char* type_name(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

constexpr std::string_view kMaxTokensZeroNote =
    " (0 is allowed only with 'echo': true, to return or score the prompt)";

// Each getter: absent or null -> leave *out unchanged, return true. Wrong type/range -> false.
struct Reader {
  const Json& body;
  ApiError* err;

  const Json* find(const char* key) const {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool fail(std::string msg, const char* key) {
    *err = bad_request(std::move(msg), key);
    return false;
  }
  bool get_bool(const char* key, bool* out) {
    const Json* v = find(key);
    if (!v) return true;
    if (!v->is_boolean()) return fail(fmt::format("'{}' must be a boolean, got {}", key, type_name(*v)), key);
    *out = v->get<bool>();
    return true;
  }
  // JSON integers only: 1.0 or 1e2 is a 400, as on OpenAI ("expected an integer, but got a
  // decimal number"). `shown_lo` / `note`: the range as the message states it (completions'
  // max_tokens allows 0 only with echo) and a remark after it.
  bool get_int(const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out,
               std::optional<int64_t> shown_lo = std::nullopt, std::string_view note = {}) {
    const Json* v = find(key);
    if (!v) return true;
    if (v->is_number_float())
      return fail(fmt::format("'{}' must be an integer, got the decimal number {}", key, v->dump()),
                  key);
    if (!v->is_number_integer()) return fail(fmt::format("'{}' must be an integer, got {}", key, type_name(*v)), key);
    const int64_t slo = shown_lo.value_or(lo);
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
      return range(key, slo, hi, v->dump(), note);
    }
    int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) return range(key, slo, hi, std::to_string(x), note);
    *out = x;
    return true;
  }
  bool range(const char* key, int64_t lo, int64_t hi, const std::string& got, std::string_view note = {}) {
    return fail(fmt::format("'{}' must be in [{}, {}]{}, got {}", key, lo, hi, note, got), key);
  }
  bool get_number(const char* key, double lo, double hi, bool lo_open, std::optional<double>* out) {
    const Json* v = find(key);
    if (!v) return true;
    if (!v->is_number()) return fail(fmt::format("'{}' must be a number, got {}", key, type_name(*v)), key);
    double x = v->get<double>();
    // An open bound is checked in float too: the engine's values are f32, and 5e-324 for
    // top_p / repetition_penalty became 0 there, refused by the engine with param "prompt".
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && (x == lo || float(x) == float(lo)))) {
      return fail(fmt::format("'{}' must be in {}{}, {}], got {}", key, lo_open ? "(" : "[", lo, hi,
                              v->dump()),
                  key);
    }
    *out = x;
    return true;
  }
  bool get_string(const char* key, std::optional<std::string>* out) {
    const Json* v = find(key);
    if (!v) return true;
    if (!v->is_string()) return fail(fmt::format("'{}' must be a string, got {}", key, type_name(*v)), key);
    *out = v->get<std::string>();
    return true;
  }
};

// Fields common to chat and completions. `min_max_tokens`: 0 for completions (max_tokens 0 scores
// an echoed prompt; parse_completion_request refuses it without echo), else 1.
bool parse_common(const Json& body, const ValidationLimits& lim, GenerateRequest* r, ApiError* err,
                  int64_t min_max_tokens = 1) {
  Reader rd{body, err};
  std::optional<std::string> model;
  if (!rd.get_string("model", &model)) return false;
  r->model = model.value_or("");

  // max_tokens / max_completion_tokens (the newer name wins when both are given).
  // The range is stated as [1, context] on both endpoints, whatever the value (completions also
  // take 0 with echo, said in the message, as for a 0 without echo in parse_completion_request).
  std::optional<int64_t> mt, mct;
  const std::string_view echo_note = min_max_tokens == 0 ? kMaxTokensZeroNote : std::string_view();
  if (!rd.get_int("max_tokens", min_max_tokens, lim.max_context, &mt, 1, echo_note)) {
    err->message += fmt::format(" (the model's context is {} tokens)", lim.max_context);
    return false;
  }
  if (!rd.get_int("max_completion_tokens", min_max_tokens, lim.max_context, &mct, 1, echo_note)) {
    err->message += fmt::format(" (the model's context is {} tokens)", lim.max_context);
    return false;
  }
  r->max_tokens = mct ? mct : mt;

  std::optional<int64_t> n;
  if (!rd.get_int("n", 1, lim.max_n, &n)) return false;
  r->n = int(n.value_or(1));
  if (!rd.get_bool("stream", &r->stream)) return false;
  if (const Json* so = rd.find("stream_options")) {
    if (!so->is_object()) return rd.fail("'stream_options' must be an object", "stream_options");
    Reader srd{*so, err};
    if (!srd.get_bool("include_usage", &r->include_usage)) return false;
    if (!srd.get_bool("continuous_usage_stats", &r->continuous_usage)) return false;
    if (!r->stream) {
      return rd.fail("'stream_options' is only allowed when 'stream' is true", "stream_options");
    }
  }

  auto& s = r->sampling;
  std::optional<double> temperature, top_p, min_p, pp, fp, rp;
  if (!rd.get_number("temperature", 0.0, 2.0, false, &temperature)) return false;
  if (!rd.get_number("top_p", 0.0, 1.0, true, &top_p)) return false;
  if (!rd.get_number("min_p", 0.0, 1.0, false, &min_p)) return false;
  if (!rd.get_number("presence_penalty", -2.0, 2.0, false, &pp)) return false;
  if (!rd.get_number("frequency_penalty", -2.0, 2.0, false, &fp)) return false;
  if (!rd.get_number("repetition_penalty", 0.0, 100.0, true, &rp)) return false;
  std::optional<int64_t> top_k, seed;
  if (!rd.get_int("top_k", -1, int64_t(1) << 30, &top_k)) return false;
  if (!rd.get_int("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &seed)) return false;
  s.temperature = float(temperature.value_or(1.0));
  s.top_p = float(top_p.value_or(1.0));
  s.min_p = float(min_p.value_or(0.0));
  s.presence_penalty = float(pp.value_or(0.0));
  s.frequency_penalty = float(fp.value_or(0.0));
  s.repetition_penalty = float(rp.value_or(1.0));
  s.top_k = int32_t(top_k.value_or(0) < 0 ? 0 : top_k.value_or(0));
  if (seed) s.seed = uint64_t(*seed);
  if (!rd.get_bool("ignore_eos", &s.ignore_eos)) return false;
  if (!rd.get_bool("skip_special_tokens", &r->skip_special_tokens)) return false;
  // vLLM's spaces_between_special_tokens only changes slow (SentencePiece-style) tokenizers'
  // decoding; byte-level BPE decodes the same either way: accepted (a boolean), no effect.
  bool spaces_between_special = true;
  if (!rd.get_bool("spaces_between_special_tokens", &spaces_between_special)) return false;
  if (!rd.get_bool("include_stop_str_in_output", &r->include_stop_str_in_output)) return false;

  if (const Json* st = rd.find("stop")) {
    if (st->is_string()) {
      r->stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (int(st->size()) > lim.max_stop) {
        return rd.fail(fmt::format("'stop' has {} entries; at most {} are allowed", st->size(), lim.max_stop), "stop");
      }
      for (size_t i = 0; i < st->size(); ++i) {
        const Json& x = (*st)[i];
        if (!x.is_string())
          return rd.fail(fmt::format("'stop' must be a string or an array of strings, got {} at "
                                     "stop[{}]",
                                     type_name(x), i),
                         "stop");
        r->stop.push_back(x.get<std::string>());
      }
    } else {
      return rd.fail(fmt::format("'stop' must be a string or an array of strings, got {}", type_name(*st)), "stop");
    }
    for (auto& x : r->stop) {
      if (x.empty()) return rd.fail("'stop' strings must not be empty", "stop");
    }
  }
  if (const Json* st = rd.find("stop_token_ids")) {
    if (!st->is_array()) return rd.fail("'stop_token_ids' must be an array of integers", "stop_token_ids");
    for (auto& x : *st) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
          (lim.vocab_size > 0 && x.get<int64_t>() >= lim.vocab_size)) {
        return rd.fail("'stop_token_ids' must be token ids in the vocabulary", "stop_token_ids");
      }
      s.stop_token_ids.push_back(int32_t(x.get<int64_t>()));
    }
  }
  // logit_bias: {"token id": bias in [-100, 100], ...} (OpenAI); null or {} = none.
  if (const Json* lb = rd.find("logit_bias"); lb && !lb->is_null()) {
    if (!lb->is_object())
      return rd.fail(fmt::format("'logit_bias' must be an object mapping token ids to numbers, "
                                 "got {}", type_name(*lb)),
                     "logit_bias");
    if (int64_t(lb->size()) > lim.max_logit_bias)
      return rd.fail(fmt::format("'logit_bias' has {} entries; at most {} are allowed", lb->size(),
                                 lim.max_logit_bias),
                     "logit_bias");
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& key = it.key();
      int64_t id = -1;
      // Canonical decimal ids only: "065" would alias "65" and add a second bias to it.
      const bool digits = !key.empty() && key.size() <= 10 && (key.size() == 1 || key[0] != '0') &&
                          std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits) id = std::stoll(key);
      if (!digits || id > std::numeric_limits<int32_t>::max() ||
          (lim.vocab_size > 0 && id >= lim.vocab_size))
        return rd.fail(fmt::format("'logit_bias' key '{}' is not a token id in [0, {})", key,
                                   lim.vocab_size),
                       "logit_bias");
      if (!it.value().is_number() || !(it.value().get<double>() >= -100.0 &&
                                       it.value().get<double>() <= 100.0))
        return rd.fail(fmt::format("'logit_bias' value for token {} must be a number in [-100, 100]",
                                   key),
                       "logit_bias");
      s.logit_bias.emplace_back(int32_t(id), float(it.value().get<double>()));
    }
  }
  // best_of (generate best_of, return the n most likely) is not implemented;
  // best_of == n (or absent / null) is the same request and is accepted.
  std::optional<int64_t> best_of;
  if (!rd.get_int("best_of", 1, lim.max_n, &best_of)) return false;
  if (best_of && *best_of != r->n)
    return rd.fail(fmt::format("'best_of' = {} is not supported (only best_of equal to n = {}); "
                               "request n = {} choices and pick among them",
                               *best_of, r->n, *best_of),
                   "best_of");
  // vLLM / SGLang parameters this server does not implement: a 400 naming them when they ask for
  // something (null, false, 0 and empty values are the defaults and pass), never silently ignored.
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                          "structured_outputs", "allowed_token_ids", "bad_words", "min_tokens",
                          "use_beam_search", "regex", "json_schema", "ebnf"}) {
    const Json* v = rd.find(key);
    if (!v || v->is_null() || (v->is_boolean() && !v->get<bool>()) ||
        (v->is_number() && v->get<double>() == 0.0) ||
        ((v->is_array() || v->is_object()) && v->empty()) ||
        (v->is_string() && v->get<std::string>().empty()))
      continue;
    return rd.fail(fmt::format("'{}' is not supported by this server (no constrained decoding, "
                               "beam search or token allow/deny lists)",
                               key),
                   key);
  }
  std::optional<std::string> user;
  if (!rd.get_string("user", &user)) return false;
  r->user = user.value_or("");
  return true;
}

// Request fields each endpoint reads (parse_common + its own), for unknown_request_fields.
constexpr std::string_view kCommonFields[] = {
    "model", "max_tokens", "max_completion_tokens", "n", "stream", "stream_options",
    "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "top_k", "seed", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "include_stop_str_in_output", "stop", "stop_token_ids",
    "logit_bias", "best_of", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "structured_outputs", "allowed_token_ids", "bad_words", "min_tokens", "use_beam_search",
    "regex", "json_schema", "ebnf", "user", "response_format", "logprobs"};
constexpr std::string_view kChatFields[] = {
    "messages", "continue_final_message", "tools", "tool_choice", "thinking",
    "chat_template_kwargs", "reasoning_effort", "add_generation_prompt", "top_logprobs"};
constexpr std::string_view kCompletionFields[] = {"prompt", "echo", "suffix"};

// Function names as OpenAI accepts them (1–64 of a-z, A-Z, 0-9, '_', '-'): the name goes
// verbatim into the DSML prompt (`invoke name="…"`), so quotes or markup would rewrite it. Used for
// `tools[i].function.name` and for `messages[i].tool_calls[j].function.name` alike.
bool valid_function_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
  });
}

bool parse_token_list(const Json& arr, const ValidationLimits& lim, std::vector<int32_t>* out,
                      ApiError* err, const char* param) {
  for (auto& x : arr) {
    if (!x.is_number_integer()) {
      *err = bad_request(fmt::format("'{}' token ids must be integers", param), param);
      return false;
    }
    int64_t id = x.get<int64_t>();
    if (id < 0 || (lim.vocab_size > 0 && id >= lim.vocab_size)) {
      *err = bad_request(fmt::format("token id {} in '{}' is outside the vocabulary [0, {})", id,
                                     param, lim.vocab_size),
                         param);
      return false;
    }
    out->push_back(int32_t(id));
  }
  return true;
}

}  // namespace

std::string chat_message_content_error(const Json& m, const std::string& where) {
  if (!m.is_object()) return "";
  auto role = m.find("role");
  if (role == m.end() || !role->is_string()) return "";
  const std::string& rs = role->get_ref<const std::string&>();
  auto content = m.find("content");
  if (content != m.end() && content->is_array() && content->empty())
    return fmt::format("'{}.content' is an empty array: give at least one part, a string or null",
                       where);
  if (content != m.end() && !content->is_null()) return "";
  const char* got = content == m.end() ? "nothing" : "null";
  // OpenAI requires content on these (null is valid only for an assistant message with
  // tool_calls, or a tool result).
  if (rs == "user" || rs == "system" || rs == "developer")
    return fmt::format(
        "'{}.content' is required for a {} message: a string or an array of text "
        "parts, got {}",
        where, rs, got);
  // As OpenAI: an assistant's content may be null or absent only when it carries tool calls.
  if (auto tc = m.find("tool_calls");
      rs == "assistant" && (tc == m.end() || tc->is_null() || (tc->is_array() && tc->empty())))
    return fmt::format(
        "'{}.content' is required for an assistant message without tool_calls: a "
        "string or an array of text parts, got {}",
        where, got);
  return "";
}

bool parse_chat_request(const Json& body, const ValidationLimits& lim, GenerateRequest* r,
                        ApiError* err) {
  r->kind = GenerateRequest::Kind::kChat;
  if (!parse_common(body, lim, r, err)) return false;
  Reader rd{body, err};

  const Json* msgs = rd.find("messages");
  if (!msgs) return rd.fail("'messages' is required", "messages");
  if (!msgs->is_array()) return rd.fail(fmt::format("'messages' must be an array, got {}", type_name(*msgs)), "messages");
  if (msgs->empty()) return rd.fail("'messages' must contain at least one message", "messages");
  static const char* kRoles[] = {"system", "user", "assistant", "tool", "developer"};
  Json messages = Json::array();
  bool prefix_last = false;  // the final assistant message has "prefix": true
  for (size_t i = 0; i < msgs->size(); ++i) {
    const Json& m = (*msgs)[i];
    std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) return rd.fail(fmt::format("'{}' must be an object", p), "messages");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return rd.fail(fmt::format("'{}.role' must be a string", p), "messages");
    std::string rs = role->get<std::string>();
    if (std::find(std::begin(kRoles), std::end(kRoles), rs) == std::end(kRoles)) {
      return rd.fail(fmt::format("'{}.role' is '{}'; expected one of system, user, assistant, tool, developer", p, rs), "messages");
    }
    // Optional string fields: a wrong type is refused (as OpenAI), not silently rendered.
    for (const char* f : {"name", "tool_call_id"}) {
      if (auto v = m.find(f); v != m.end() && !v->is_null() && !v->is_string())
        return rd.fail(fmt::format("'{}.{}' must be a string, got {}", p, f, type_name(*v)), "messages");
    }
    Json copy = m;
    if (rs == "developer") copy["role"] = "system";  // OpenAI developer == system for this model
    auto content = m.find("content");
    if (std::string e = chat_message_content_error(m, p); !e.empty()) return rd.fail(e, "messages");
    if (content != m.end() && !content->is_null()) {
      if (content->is_array()) {
        for (auto& part : *content) {
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
            return rd.fail(fmt::format("'{}.content' parts must be objects with a 'type'", p), "messages");
          }
          if (part["type"] != "text") {  // image_url, input_audio, file, ...: not silently dropped
            return rd.fail(fmt::format("'{}.content' part type '{}' is not supported: this model takes text parts only",
                                       p, part["type"].get<std::string>()),
                           "messages");
          }
          if (!part.contains("text") || !part["text"].is_string()) {
            return rd.fail(fmt::format("'{}.content' text parts need a string 'text'", p), "messages");
          }
        }
        if (rs != "tool") {
          // The encoder takes strings for these roles: join text parts (OpenAI content parts).
          std::string joined;
          for (auto& part : *content) {
            if (part["type"] == "text") {
              if (!joined.empty()) joined += "\n\n";
              joined += part["text"].get<std::string>();
            }
          }
          copy["content"] = joined;
        }
      } else if (!content->is_string()) {
        return rd.fail(fmt::format("'{}.content' must be a string, an array of parts or null", p), "messages");
      }
    } else if (rs == "tool") {
      copy["content"] = "";
    }
    if (rs == "assistant") {
      if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
        if (!tc->is_array()) return rd.fail(fmt::format("'{}.tool_calls' must be an array", p), "messages");
        for (size_t k = 0; k < tc->size(); ++k) {
          const Json& call = (*tc)[k];
          if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
              !call["function"].contains("name") || !call["function"]["name"].is_string()) {
            return rd.fail(fmt::format("'{}.tool_calls' entries need function.name", p), "messages");
          }
          // The same rule as tools[i].function.name: the encoder writes this name into the DSML
          // prompt verbatim too (`invoke name="…"`).
          if (const std::string& cname = call["function"]["name"].get_ref<const std::string&>();
              !valid_function_name(cname)) {
            return rd.fail(fmt::format("'{}.tool_calls[{}].function.name' {} must be 1 to 64 "
                                       "characters of a-z, A-Z, 0-9, '_' and '-'",
                                       p, k, Json(cname).dump()),
                           "messages");
          }
          // OpenAI sends arguments as a JSON-encoded object; text that is not JSON would be
          // rendered as one raw `arguments` parameter (the reference's fallback, chat-encoding
          // §2.6), other JSON is refused by the encoder (under its own message numbering). An
          // object is accepted on purpose (accept_object_arguments), and so are the empty string
          // that some clients send for a call without arguments (rendered by that fallback, as
          // before) and null / absent.
          const Json& fn = call["function"];
          if (auto a = fn.find("arguments"); a != fn.end() && !a->is_null() && !a->is_object()) {
            const std::string path = fmt::format("{}.tool_calls[{}].function.arguments", p, k);
            if (!a->is_string())
              return rd.fail(fmt::format("'{}' must be a JSON-encoded object string, got {}", path,
                                         type_name(*a)),
                             "messages");
            const std::string& text = a->get_ref<const std::string&>();
            const text::JsonTextKind kind =
                text.empty() ? text::JsonTextKind::kObject : text::python_json_kind(text);
            if (kind == text::JsonTextKind::kTooDeep)
              return rd.fail(fmt::format("'{}' is nested deeper than {} levels", path,
                                         text::pyjson::kMaxLoadsDepth),
                             "messages");
            if (kind == text::JsonTextKind::kInvalid)
              return rd.fail(fmt::format("'{}' is not valid JSON: it must be the JSON-encoded "
                                         "arguments object (e.g. \"{{}}\")",
                                         path),
                             "messages");
            if (kind == text::JsonTextKind::kOther)
              return rd.fail(fmt::format("'{}' must encode a JSON object (e.g. \"{{}}\")", path),
                             "messages");
          }
        }
      } else if (tc != m.end()) {
        copy.erase("tool_calls");
      }
      if (auto rc = m.find("reasoning_content"); rc != m.end() && !rc->is_null() && !rc->is_string()) {
        return rd.fail(fmt::format("'{}.reasoning_content' must be a string", p), "messages");
      }
    }
    // DeepSeek API "chat prefix completion": `"prefix": true` on the final assistant message.
    if (auto pf = m.find("prefix"); pf != m.end()) {
      if (!pf->is_null() && !pf->is_boolean())
        return rd.fail(fmt::format("'{}.prefix' must be a boolean, got {}", p, type_name(*pf)), "messages");
      if (pf->is_boolean() && pf->get<bool>()) {
        if (rs != "assistant")
          return rd.fail(fmt::format("'{}.prefix' is true but the message is a {} message; only the final "
                                     "assistant message can be a prefix", p, rs),
                         "messages");
        if (i + 1 != msgs->size())
          return rd.fail(fmt::format("'{}.prefix' is true but the message is not the last one; only the final "
                                     "assistant message can be a prefix", p),
                         "messages");
        prefix_last = true;
      }
      copy.erase("prefix");
    }
    messages.push_back(std::move(copy));
  }
  r->messages = std::move(messages);

  // vLLM `continue_final_message` (requires add_generation_prompt false; absent counts as false here).
  bool cont = false;
  if (!rd.get_bool("continue_final_message", &cont)) return false;
  if (cont) {
    if (r->messages.back().value("role", "") != "assistant")
      return rd.fail(fmt::format("'continue_final_message' is true but the last message is a {} message, "
                                 "not an assistant message",
                                 r->messages.back().value("role", "")),
                     "continue_final_message");
    if (const Json* agp = rd.find("add_generation_prompt"); agp && agp->is_boolean() && agp->get<bool>())
      return rd.fail("'continue_final_message' and 'add_generation_prompt' cannot both be true",
                     "continue_final_message");
  }
  if (cont || prefix_last) {
    const Json& last = r->messages.back();
    if (auto tc = last.find("tool_calls"); tc != last.end() && !tc->empty())
      return rd.fail(fmt::format("messages[{}] has tool_calls: an assistant message with tool calls cannot "
                                 "be continued ('{}')",
                                 r->messages.size() - 1, cont ? "continue_final_message" : "prefix"),
                     cont ? "continue_final_message" : "messages");
    r->messages.back()["wo_eos"] = true;
    r->continue_final = true;
  }

  if (const Json* tools = rd.find("tools")) {
    if (!tools->is_array()) return rd.fail("'tools' must be an array", "tools");
    std::unordered_map<std::string, size_t> seen_names;
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
          !t["function"].contains("name") || !t["function"]["name"].is_string()) {
        return rd.fail(fmt::format("'tools[{}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", i), "tools");
      }
      if (t.contains("type") && t["type"] != "function") {
        return rd.fail(fmt::format("'tools[{}].type' must be \"function\"", i), "tools");
      }
      // Function names as OpenAI accepts them (valid_function_name).
      const std::string& fname = t["function"]["name"].get_ref<const std::string&>();
      if (!valid_function_name(fname)) {
        return rd.fail(fmt::format("'tools[{}].function.name' {} must be 1 to 64 characters of "
                                   "a-z, A-Z, 0-9, '_' and '-'",
                                   i, Json(fname).dump()),
                       "tools");
      }
      // parameters: a JSON Schema object (absent or null: a function without parameters).
      if (auto pa = t["function"].find("parameters"); pa != t["function"].end() && !pa->is_null() &&
          !pa->is_object()) {
        return rd.fail(fmt::format("'tools[{}].function.parameters' must be a JSON Schema object, got {}",
                                   i, type_name(*pa)),
                       "tools");
      } else if (pa != t["function"].end() && pa->is_object()) {
        // Its `properties` (the parameters the prompt lists) must map names to schemas.
        if (auto pr = pa->find("properties"); pr != pa->end() && !pr->is_null() && !pr->is_object())
          return rd.fail(fmt::format("'tools[{}].function.parameters.properties' must be an "
                                     "object, got {}",
                                     i, type_name(*pr)),
                         "tools");
        else if (pr != pa->end() && pr->is_object())
          // Each property's value is its JSON Schema: an object (or a boolean schema).
          for (auto it = pr->begin(); it != pr->end(); ++it)
            if (!it->is_object() && !it->is_boolean())
              return rd.fail(fmt::format("'tools[{}].function.parameters.properties.{}' must be a "
                                         "JSON Schema object, got {}",
                                         i, it.key(), type_name(*it)),
                             "tools");
      }
      // One function per name: a call names its function, two tools of one name are ambiguous.
      // (A name -> index map: comparing each tool with all before it was quadratic in the number
      // of tools, which a large body makes a DoS.)
      if (auto [it, fresh] = seen_names.emplace(fname, i); !fresh)
        return rd.fail(fmt::format("'tools[{}].function.name' {} duplicates 'tools[{}]': "
                                   "function names must be unique",
                                   i, Json(fname).dump(), it->second),
                       "tools");
    }
    if (!tools->empty()) r->tools = *tools;
  }
  if (const Json* rf = rd.find("response_format"); rf && !rf->is_null()) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      return rd.fail("'response_format' must be an object with a string 'type'", "response_format");
    const std::string type = (*rf)["type"].get<std::string>();
    if (type == "json_schema" &&
        (!rf->contains("json_schema") || !(*rf)["json_schema"].is_object()))
      return rd.fail("'response_format' of type \"json_schema\" needs a 'json_schema' object",
                     "response_format");
    if (type == "json_schema") {
      const Json& js = (*rf)["json_schema"];
      if (auto sc = js.find("schema"); sc != js.end() && !sc->is_null() && !sc->is_object())
        return rd.fail(fmt::format("'response_format.json_schema.schema' must be a JSON Schema "
                                   "object, got {}",
                                   type_name(*sc)),
                       "response_format");
    }
    if (type != "text" && type != "json_object" && type != "json_schema")
      return rd.fail(fmt::format("'response_format.type' is '{}'; expected \"text\", "
                                 "\"json_object\" or \"json_schema\"", type),
                     "response_format");
    if (type != "text") r->response_format = *rf;
  }
  if (const Json* tc = rd.find("tool_choice")) {
    if (tc->is_string()) {
      std::string v = tc->get<std::string>();
      if (v != "auto" && v != "none" && v != "required") {
        return rd.fail("'tool_choice' must be \"auto\", \"none\", \"required\" or a named function", "tool_choice");
      }
      r->tool_choice = v;
    } else if (tc->is_object() && tc->contains("type") &&
               (!(*tc)["type"].is_string() || (*tc)["type"] != "function")) {
      return rd.fail("'tool_choice.type' must be \"function\"", "tool_choice");
    } else if (tc->is_object() && tc->contains("function") && (*tc)["function"].is_object() &&
               (*tc)["function"].contains("name") && (*tc)["function"]["name"].is_string()) {
      r->tool_choice = (*tc)["function"]["name"].get<std::string>();
      r->tool_choice_function = true;
      bool found = false;
      if (!r->tools.is_null()) {
        for (auto& t : r->tools) found = found || t["function"]["name"] == r->tool_choice;
      }
      if (!found) return rd.fail(fmt::format("'tool_choice' names function '{}' which is not in 'tools'", r->tool_choice), "tool_choice");
    } else {
      return rd.fail("'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice");
    }
    if ((r->tool_choice_function || r->tool_choice == "required") && r->tools.is_null()) {
      return rd.fail(fmt::format("'tool_choice' {} requires 'tools'",
                                 r->tool_choice_function ? "naming a function" : "\"required\""),
                     "tool_choice");
    }
  }

  // Thinking switches: chat_template_kwargs {thinking | enable_thinking}, DeepSeek's
  // {"thinking": {"type": "enabled"|"disabled"}}, and reasoning_effort (implies thinking unless
  // "none"). Explicit switches win over reasoning_effort.
  std::optional<bool> thinking;
  if (const Json* th = rd.find("thinking")) {
    if (th->is_boolean()) {
      thinking = th->get<bool>();
    } else if (th->is_object() && th->contains("type") && (*th)["type"].is_string()) {
      std::string t = (*th)["type"].get<std::string>();
      if (t != "enabled" && t != "disabled") return rd.fail("'thinking.type' must be \"enabled\" or \"disabled\"", "thinking");
      thinking = t == "enabled";
    } else {
      return rd.fail("'thinking' must be a boolean or {\"type\": \"enabled\"|\"disabled\"}", "thinking");
    }
  }
  if (const Json* kw = rd.find("chat_template_kwargs")) {
    if (!kw->is_object()) return rd.fail("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (const char* key : {"thinking", "enable_thinking"}) {
      if (kw->contains(key) && !(*kw)[key].is_null()) {
        if (!(*kw)[key].is_boolean()) return rd.fail(fmt::format("'chat_template_kwargs.{}' must be a boolean", key), "chat_template_kwargs");
        thinking = (*kw)[key].get<bool>();
      }
    }
    if (kw->contains("reasoning_effort") && !(*kw)["reasoning_effort"].is_null()) {
      if (!(*kw)["reasoning_effort"].is_string()) return rd.fail("'chat_template_kwargs.reasoning_effort' must be a string", "chat_template_kwargs");
      r->reasoning_effort = (*kw)["reasoning_effort"].get<std::string>();
    }
  }
  std::optional<std::string> effort;
  if (!rd.get_string("reasoning_effort", &effort)) return false;
  if (effort) r->reasoning_effort = effort;
  if (r->reasoning_effort) {
    static const char* kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};
    if (std::find(std::begin(kEfforts), std::end(kEfforts), *r->reasoning_effort) == std::end(kEfforts)) {
      return rd.fail(fmt::format("'reasoning_effort' is '{}'; expected none, minimal, low, medium, high, xhigh or max", *r->reasoning_effort), "reasoning_effort");
    }
    if (*r->reasoning_effort == "none") {
      if (!thinking) thinking = false;
      r->reasoning_effort.reset();
    } else if (!thinking) {
      thinking = true;
    }
  }
  r->thinking = thinking.value_or(false);
  r->thinking_set = thinking.has_value();
  if (!rd.get_bool("add_generation_prompt", &r->add_generation_prompt)) return false;
  // Continuing a final assistant message: no generation header (the encoder adds none after an
  // assistant message anyway).
  if (r->continue_final) r->add_generation_prompt = false;

  // Logprobs (chat): logprobs bool + top_logprobs 0..20.
  bool lp = false;
  if (!rd.get_bool("logprobs", &lp)) return false;
  std::optional<int64_t> tlp;
  if (!rd.get_int("top_logprobs", 0, lim.max_top_logprobs, &tlp)) return false;
  if (tlp && *tlp > 0 && !lp) return rd.fail("'top_logprobs' requires 'logprobs': true", "top_logprobs");
  r->sampling.logprobs = lp;
  r->top_logprobs = int(tlp.value_or(0));
  r->sampling.top_logprobs = r->top_logprobs;
  return true;
}

bool parse_completion_request(const Json& body, const ValidationLimits& lim, GenerateRequest* r,
                              ApiError* err) {
  r->kind = GenerateRequest::Kind::kCompletion;
  if (!parse_common(body, lim, r, err, /*min_max_tokens=*/0)) return false;
  Reader rd{body, err};
  const Json* p = rd.find("prompt");
  if (!p) return rd.fail("'prompt' is required", "prompt");
  auto bad = [&] {
    return rd.fail("'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of token ids", "prompt");
  };
  if (p->is_string()) {
    r->prompts.push_back({p->get<std::string>(), {}});
  } else if (p->is_array()) {
    if (p->empty()) return rd.fail("'prompt' must not be empty", "prompt");
    if ((*p)[0].is_number_integer()) {
      PromptInput in;
      if (!parse_token_list(*p, lim, &in.token_ids, err, "prompt")) return false;
      r->prompts.push_back(std::move(in));
    } else {
      const bool strings = (*p)[0].is_string();  // all strings, or all token lists (OpenAI)
      for (auto& x : *p) {
        if (x.is_string() != strings)
          return rd.fail("'prompt' must be an array of strings or an array of token-id arrays, "
                         "not a mix",
                         "prompt");
        if (x.is_string()) {
          r->prompts.push_back({x.get<std::string>(), {}});
        } else if (x.is_array()) {
          PromptInput in;
          if (x.empty()) return rd.fail("'prompt' token lists must not be empty", "prompt");
          if (!parse_token_list(x, lim, &in.token_ids, err, "prompt")) return false;
          r->prompts.push_back(std::move(in));
        } else {
          return bad();
        }
      }
    }
  } else {
    return bad();
  }
  if (int64_t(r->prompts.size()) * r->n > lim.max_n) {
    return rd.fail(fmt::format("{} prompts x n={} exceeds {} choices per request", r->prompts.size(), r->n, lim.max_n), "n");
  }
  if (!rd.get_bool("echo", &r->echo)) return false;
  // response_format constrains the output on vLLM's completions; this server can only instruct a
  // chat prompt (chat-encoding §2.8), so on completions anything but "text" is refused.
  if (const Json* rf = rd.find("response_format"); rf && !rf->is_null() &&
      !(rf->is_object() && rf->contains("type") && (*rf)["type"] == "text"))
    return rd.fail("'response_format' is not supported on /v1/completions (no constrained "
                   "decoding; /v1/chat/completions puts it in the prompt)",
                   "response_format");
  std::optional<std::string> suffix;
  if (!rd.get_string("suffix", &suffix)) return false;
  if (suffix && !suffix->empty()) return rd.fail("'suffix' is not supported by this model", "suffix");
  // Completions logprobs: an integer 0..5 (we allow up to 20): top-n per token. A boolean is the
  // chat API's form and is refused here, as OpenAI does (it is not a count).
  std::optional<int64_t> lp;
  if (const Json* v = rd.find("logprobs"); v && v->is_boolean())
    return rd.fail(fmt::format("'logprobs' must be an integer in [0, {}] on /v1/completions (the "
                               "number of top tokens per position), got boolean; the boolean "
                               "form belongs to /v1/chat/completions",
                               lim.max_top_logprobs),
                   "logprobs");
  if (!rd.get_int("logprobs", 0, lim.max_top_logprobs, &lp)) return false;
  r->sampling.logprobs = lp.has_value();
  r->top_logprobs = int(lp.value_or(0));
  r->sampling.top_logprobs = r->top_logprobs;
  // max_tokens 0 generates nothing: only useful to echo (and score, with logprobs) the prompt.
  if (r->max_tokens && *r->max_tokens == 0 && !r->echo) {
    const char* key = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()
                          ? "max_completion_tokens"
                          : "max_tokens";
    return rd.fail(fmt::format("'{}' must be in [1, {}]{}, got 0 (the model's context is {} tokens)",
                               key, lim.max_context, kMaxTokensZeroNote, lim.max_context),
                   body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()
                       ? "max_completion_tokens"
                       : "max_tokens");
  }
  return true;
}

std::vector<std::string> unknown_request_fields(const Json& body, GenerateRequest::Kind kind) {
  std::vector<std::string> out;
  if (!body.is_object()) return out;
  auto in = [](const auto& list, const std::string& k) {
    return std::find(std::begin(list), std::end(list), k) != std::end(list);
  };
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    if (in(kCommonFields, k)) continue;
    if (kind == GenerateRequest::Kind::kChat ? in(kChatFields, k) : in(kCompletionFields, k)) continue;
    out.push_back(k);
  }
  return out;
}

std::shared_ptr<const StopStrings> make_stop_strings(std::vector<std::string> stops) {
  stops.erase(std::remove(stops.begin(), stops.end(), std::string()), stops.end());
  auto out = std::make_shared<StopStrings>();
  out->fail.reserve(stops.size());
  for (const std::string& s : stops) {
    std::vector<uint32_t> f(s.size(), 0);
    uint32_t k = 0;
    for (size_t i = 1; i < s.size(); ++i) {
      while (k > 0 && s[i] != s[k]) k = f[k - 1];
      if (s[i] == s[k]) ++k;
      f[i] = k;
    }
    out->fail.push_back(std::move(f));
  }
  out->strings = std::move(stops);
  return out;
}

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop)
    : StopMatcher(make_stop_strings(std::move(stops)), include_stop) {}

StopMatcher::StopMatcher(std::shared_ptr<const StopStrings> stops, bool include_stop)
    : stops_list_(std::move(stops)), include_stop_(include_stop),
      state_(stops_list_->strings.size(), 0) {}

namespace {
int64_t utf8_chars(std::string_view s) {
  int64_t n = 0;
  for (unsigned char b : s) n += (b & 0xC0u) != 0x80u;
  return n;
}
}  // namespace

std::string StopMatcher::push(std::string_view delta) {
  if (stopped_) return {};
  const std::vector<std::string>& stops = stops_list_->strings;
  if (stops.empty()) return std::string(delta);
  const size_t base = held_.size();
  held_.append(delta);
  held_chars_ += utf8_chars(delta);
  // Earliest complete match wins (ties: the longest stop string). Nothing completed before this
  // push, so a string's earliest occurrence is its first completion within `delta`; its start
  // is inside held_, which keeps every byte an automaton has matched (hold below).
  size_t best = std::string::npos;
  size_t best_i = 0;
  for (size_t i = 0; i < stops.size(); ++i) {
    const std::string& s = stops[i];
    const std::vector<uint32_t>& f = stops_list_->fail[i];
    uint32_t q = state_[i];
    for (size_t j = base; j < held_.size(); ++j) {
      const char c = held_[j];
      while (q > 0 && s[q] != c) q = f[q - 1];
      if (s[q] == c) ++q;
      if (q == s.size()) {
        const size_t start = j + 1 - s.size();
        if (start < best || (start == best && s.size() > stops[best_i].size())) {
          best = start;
          best_i = i;
        }
        break;
      }
    }
    state_[i] = q;
  }
  if (best != std::string::npos) {
    stopped_ = true;
    matched_ = stops[best_i];
    std::string out = held_.substr(0, include_stop_ ? best + matched_.size() : best);
    held_.clear();
    held_chars_ = 0;
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string: the largest
  // automaton state.
  size_t hold = 0;
  for (uint32_t q : state_) hold = std::max<size_t>(hold, q);
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  held_chars_ -= utf8_chars(out);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  std::string out = std::move(held_);
  held_.clear();
  held_chars_ = 0;
  return out;
}

ForcedToolCall forced_tool_call(const GenerateRequest& r) {
  ForcedToolCall f;
  if (r.kind != GenerateRequest::Kind::kChat || r.tools.is_null()) return f;
  if (!r.tool_choice_function && r.tool_choice != "required") return f;
  if (!r.add_generation_prompt) return f;
  if (r.messages.is_array() && !r.messages.empty() && r.messages.back().is_object() &&
      r.messages.back().value("role", "") == "assistant")
    return f;  // continuing a final assistant message: no generation header to fill after
  if (r.thinking) f.prefill = "</think>";
  f.prefill += "\n\n<｜DSML｜tool_calls>\n";
  f.start_in_tool_block = true;
  if (r.tool_choice_function) {
    f.tool_name = r.tool_choice;
    f.prefill += "<｜DSML｜invoke name=\"" + r.tool_choice + "\">\n";
  }
  return f;
}

std::string describe_field_names(const std::vector<std::string>& names) {
  constexpr size_t kMaxNames = 16, kMaxChars = 64;
  std::string out;
  for (size_t i = 0; i < names.size() && i < kMaxNames; ++i) {
    if (i) out += ", ";
    const std::string& n = names[i];
    if (n.empty()) {
      out += "\"\"";
      continue;
    }
    out += log_escape(n, kMaxChars);
  }
  if (names.size() > kMaxNames) out += fmt::format(", … and {} more", names.size() - kMaxNames);
  return out;
}

}  // namespace v4::server
