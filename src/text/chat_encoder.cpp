// DeepSeek-V4 prompt rendering. Mirrors the data flow of the reference `encode_messages`
// (chat-encoding.md §2): merge tool messages into user turns -> order tool results by call order ->
// (thinking + drop) strip earlier reasoning -> render each message + transition header.
#include "text/chat_encoder.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "text/py_json.h"

namespace v4::text {

using J = nlohmann::ordered_json;

namespace {

constexpr const char* kBos = "<｜begin▁of▁sentence｜>";
constexpr const char* kEos = "<｜end▁of▁sentence｜>";
constexpr const char* kThinkStart = "<think>";
constexpr const char* kThinkEnd = "</think>";
constexpr const char* kDsml = "｜DSML｜";
constexpr const char* kUser = "<｜User｜>";
constexpr const char* kAssistant = "<｜Assistant｜>";
constexpr const char* kLatestReminder = "<｜latest_reminder｜>";

constexpr const char* kEffortMaxPreview =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

constexpr const char* kEffortMax0731 =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n";

std::string tools_block(const std::string& schemas) {
  std::string d = kDsml;
  return "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke "
         "tools by writing a \"<" + d + "tool_calls>\" block like the following:\n\n<" + d + "tool_calls>\n<" +
         d + "invoke name=\"$TOOL_NAME\">\n<" + d +
         "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + d + "parameter>\n...\n</" +
         d + "invoke>\n<" + d + "invoke name=\"$TOOL_NAME2\">\n...\n</" + d + "invoke>\n</" + d +
         "tool_calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other "
         "types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
         "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
         "<think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after "
         "</think> with tool calls or final response.\n\n### Available Tool Schemas\n\n" + schemas +
         "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
}

// Python truthiness of a JSON value.
bool truthy(const J& j) {
  switch (j.type()) {
    case J::value_t::null: return false;
    case J::value_t::boolean: return j.get<bool>();
    case J::value_t::number_integer: return j.get<int64_t>() != 0;
    case J::value_t::number_unsigned: return j.get<uint64_t>() != 0;
    case J::value_t::number_float: return j.get<double>() != 0.0;
    case J::value_t::string: return !j.get_ref<const std::string&>().empty();
    case J::value_t::array:
    case J::value_t::object: return !j.empty();
    default: return false;
  }
}

// msg.get(key) -> null when absent.
const J& get(const J& obj, const char* key) {
  static const J kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

// Python `str.format` of a value that must be text: strings verbatim; null/false-y -> "" where the
// reference writes `x or ""`. Other types are rejected (the reference would print a Python repr).
Result<std::string> text_or_empty(const J& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (!truthy(v)) return std::string();
  return make_error(ErrorCode::kInvalidArgument, "{} must be a string, got {}", where, v.type_name());
}

// Python's str() of a scalar (used where the reference formats a value that may be None).
Result<std::string> py_str(const J& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return std::string("None");
  if (v.is_boolean()) return std::string(v.get<bool>() ? "True" : "False");
  if (v.is_number()) return pyjson::dumps(v);
  return make_error(ErrorCode::kInvalidArgument, "{} must be a string, got {}", where, v.type_name());
}

// Key for matching tool_call ids (Python dict equality on JSON scalars).
std::string id_key(const J& v) { return v.dump(); }

// ---- preprocessing (reference merge_tool_messages / sort_tool_results_by_call_order) -----------
J merge_tool_messages(const J& messages) {
  J merged = J::array();
  for (const J& m : messages) {
    const J& role = get(m, "role");
    if (role == "tool") {
      J block = J::object();
      block["type"] = "tool_result";
      block["tool_use_id"] = m.contains("tool_call_id") ? m["tool_call_id"] : J("");
      block["content"] = m.contains("content") ? m["content"] : J("");
      if (!merged.empty() && get(merged.back(), "role") == "user" && merged.back().contains("content_blocks")) {
        merged.back()["content_blocks"].push_back(block);
      } else {
        J u = J::object();
        u["role"] = "user";
        u["content_blocks"] = J::array({block});
        merged.push_back(u);
      }
    } else if (role == "user") {
      J text_block = J::object();
      text_block["type"] = "text";
      text_block["text"] = m.contains("content") ? m["content"] : J("");
      if (!merged.empty() && get(merged.back(), "role") == "user" && merged.back().contains("content_blocks") &&
          get(merged.back(), "task").is_null()) {
        merged.back()["content_blocks"].push_back(text_block);
      } else {
        J u = J::object();
        u["role"] = "user";
        u["content"] = text_block["text"];
        u["content_blocks"] = J::array({text_block});
        for (const char* k : {"task", "wo_eos", "mask"})
          if (m.is_object() && m.contains(k)) u[k] = m[k];
        merged.push_back(u);
      }
    } else {
      merged.push_back(m);
    }
  }
  return merged;
}

void sort_tool_results(J& messages) {
  std::unordered_map<std::string, int> order;
  for (J& m : messages) {
    const J& role = get(m, "role");
    if (role == "assistant" && truthy(get(m, "tool_calls"))) {
      order.clear();
      int idx = 0;
      for (const J& tc : m["tool_calls"]) {
        J id = get(tc, "id");
        if (!truthy(id)) id = get(get(tc, "function"), "id");
        if (truthy(id)) order[id_key(id)] = idx;
        ++idx;
      }
    } else if (role == "user" && truthy(get(m, "content_blocks"))) {
      J& blocks = m["content_blocks"];
      std::vector<J> tool_blocks;
      for (const J& b : blocks)
        if (get(b, "type") == "tool_result") tool_blocks.push_back(b);
      if (tool_blocks.size() > 1 && !order.empty()) {
        auto key = [&](const J& b) {
          auto it = order.find(id_key(b.contains("tool_use_id") ? b["tool_use_id"] : J("")));
          return it == order.end() ? 0 : it->second;
        };
        std::stable_sort(tool_blocks.begin(), tool_blocks.end(),
                         [&](const J& a, const J& b) { return key(a) < key(b); });
        size_t k = 0;
        for (J& b : blocks)
          if (get(b, "type") == "tool_result") b = tool_blocks[k++];
      }
    }
  }
}

int find_last_user_index(const J& messages) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    const J& r = get(messages[i], "role");
    if (r == "user" || r == "developer") return i;
  }
  return -1;
}

J drop_thinking_messages(const J& messages) {
  int last_user = find_last_user_index(messages);
  J out = J::array();
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const J& m = messages[i];
    const J& role = get(m, "role");
    bool keep = role == "user" || role == "system" || role == "tool" || role == "latest_reminder" ||
                role == "direct_search_results";
    if (keep || i >= last_user) {
      out.push_back(m);
    } else if (role == "assistant") {
      J c = m;
      c.erase("reasoning_content");
      out.push_back(c);
    }
    // developer (and other roles) before the last user turn are dropped
  }
  return out;
}

// ---- tool calls -----------------------------------------------------------------------------
Result<std::string> encode_arguments_to_dsml(const J& arguments, const std::string& where,
                                             bool accept_object) {
  const std::string d = kDsml;
  auto param = [&](const std::string& k, bool is_str, const std::string& v) {
    return "<" + d + "parameter name=\"" + k + "\" string=\"" + (is_str ? "true" : "false") + "\">" + v + "</" +
           d + "parameter>";
  };
  std::vector<std::string> parts;
  std::optional<pyjson::Value> parsed;
  if (arguments.is_string()) {
    parsed = pyjson::loads(arguments.get_ref<const std::string&>());
  } else if (accept_object && arguments.is_object()) {
    parsed = pyjson::loads(arguments.dump());
  }
  if (!parsed) {
    // Reference fallback: {"arguments": <the raw value>}.
    if (arguments.is_string()) parts.push_back(param("arguments", true, arguments.get<std::string>()));
    else parts.push_back(param("arguments", false, pyjson::dumps(arguments)));
  } else {
    if (parsed->kind != pyjson::Value::Kind::kObj)
      return make_error(ErrorCode::kInvalidArgument, "{}.arguments must be a JSON object, got JSON {}", where,
                        parsed->kind == pyjson::Value::Kind::kStr ? "string" :
                        parsed->kind == pyjson::Value::Kind::kNull ? "null" :
                        parsed->kind == pyjson::Value::Kind::kArr ? "array" : "scalar");
    for (auto& [k, v] : parsed->obj) {
      bool is_str = v.kind == pyjson::Value::Kind::kStr;
      parts.push_back(param(k, is_str, is_str ? v.s : pyjson::dumps(v)));
    }
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "\n" : "") + parts[i];
  return out;
}

Result<std::string> render_tools(const J& tools, const std::string& where) {
  std::string schemas;
  size_t i = 0;
  for (const J& t : tools) {
    if (!t.is_object() || !t.contains("function"))
      return make_error(ErrorCode::kInvalidArgument, "{}.tools[{}] has no 'function'", where, i);
    if (i) schemas += "\n";
    schemas += pyjson::dumps(t["function"]);
    ++i;
  }
  return tools_block(schemas);
}

struct Ctx {
  ThinkingMode mode;
  bool drop;
  const ChatOptions* opt;
  int last_user = -1;  // find_last_user_index(msgs), once per render (per message it was O(n^2))
};

Result<std::string> render_message(int index, const J& msgs, const Ctx& cx) {
  const J& msg = msgs[index];
  const std::string where = fmt::format("messages[{}]", index);
  if (!msg.is_object()) return make_error(ErrorCode::kInvalidArgument, "{} is not an object", where);
  std::string prompt;
  const int last_user = cx.last_user;
  const J& role = get(msg, "role");
  const J& content = get(msg, "content");
  const J& tools = get(msg, "tools");
  const J& response_format = get(msg, "response_format");
  const J& tool_calls = get(msg, "tool_calls");
  const J& reasoning = get(msg, "reasoning_content");
  const bool wo_eos = truthy(get(msg, "wo_eos"));
  const bool thinking = cx.mode == ThinkingMode::kThinking;

  // Reasoning effort (validated per rendered message, like the reference).
  const auto& eff = cx.opt->reasoning_effort;
  if (cx.opt->effort_profile == EffortProfile::kPreview) {
    if (eff && *eff != "max" && *eff != "high")
      return make_error(ErrorCode::kInvalidArgument, "invalid reasoning_effort '{}' (V4 preview accepts high, max)",
                        *eff);
    if (index == 0 && thinking && eff && *eff == "max") prompt += kEffortMaxPreview;
  } else {
    if (eff && *eff != "low" && *eff != "high" && *eff != "max")
      return make_error(ErrorCode::kInvalidArgument, "invalid reasoning_effort '{}' (0731 accepts low, high, max)",
                        *eff);
    if (index == 0 && thinking && eff && *eff == "high") prompt += kEffortMaxPreview;
    if (index == 0 && thinking && eff && *eff == "max") prompt += kEffortMax0731;
  }

  auto append_tools_and_format = [&](std::string& out) -> Status {
    if (truthy(tools)) {
      if (!tools.is_array()) return make_error(ErrorCode::kInvalidArgument, "{}.tools must be an array", where);
      V4_ASSIGN_OR_RETURN(std::string tb, render_tools(tools, where));
      out += "\n\n";
      out += tb;
    }
    if (truthy(response_format))
      out += "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
             pyjson::dumps(response_format);
    return Status::Ok();
  };

  if (role == "system") {
    V4_ASSIGN_OR_RETURN(std::string c, text_or_empty(content, where + ".content"));
    prompt += c;
    V4_RETURN_IF_ERROR(append_tools_and_format(prompt));
  } else if (role == "developer") {
    if (!truthy(content)) return make_error(ErrorCode::kInvalidArgument, "{}.content (developer) is empty", where);
    V4_ASSIGN_OR_RETURN(std::string c, text_or_empty(content, where + ".content"));
    std::string dev = std::string(kUser) + c;
    V4_RETURN_IF_ERROR(append_tools_and_format(dev));
    prompt += dev;
  } else if (role == "user") {
    prompt += kUser;
    const J& blocks = get(msg, "content_blocks");
    if (truthy(blocks)) {
      std::vector<std::string> parts;
      for (const J& b : blocks) {
        const J& type = get(b, "type");
        if (type == "text") {
          const J& t = b.contains("text") ? b["text"] : J("");
          if (!t.is_string())
            return make_error(ErrorCode::kInvalidArgument, "{}.content must be a string, got {}", where, t.type_name());
          parts.push_back(t.get<std::string>());
        } else if (type == "tool_result") {
          const J& tc = b.contains("content") ? b["content"] : J("");
          std::string text;
          if (tc.is_array()) {
            std::vector<std::string> tp;
            for (const J& p : tc) {
              if (get(p, "type") == "text") {
                const J& pt = get(p, "text");
                V4_ASSIGN_OR_RETURN(std::string s, py_str(p.contains("text") ? pt : J(""), where + " tool content part"));
                tp.push_back(s);
              } else {
                V4_ASSIGN_OR_RETURN(std::string ty, py_str(get(p, "type"), where + " tool content part type"));
                tp.push_back("[Unsupported " + ty + "]");
              }
            }
            for (size_t i = 0; i < tp.size(); ++i) text += (i ? "\n\n" : "") + tp[i];
          } else {
            V4_ASSIGN_OR_RETURN(text, py_str(tc, where + " tool content"));
          }
          parts.push_back("<tool_result>" + text + "</tool_result>");
        } else {
          V4_ASSIGN_OR_RETURN(std::string ty, py_str(type, where + " block type"));
          parts.push_back("[Unsupported " + ty + "]");
        }
      }
      for (size_t i = 0; i < parts.size(); ++i) prompt += (i ? "\n\n" : "") + parts[i];
    } else {
      V4_ASSIGN_OR_RETURN(std::string c, text_or_empty(content, where + ".content"));
      prompt += c;
    }
  } else if (role == "latest_reminder") {
    V4_ASSIGN_OR_RETURN(std::string c, py_str(content, where + ".content"));
    prompt += std::string(kLatestReminder) + c;
  } else if (role == "assistant") {
    std::string tc_content;
    if (truthy(tool_calls)) {
      if (!tool_calls.is_array())
        return make_error(ErrorCode::kInvalidArgument, "{}.tool_calls must be an array", where);
      std::vector<std::string> list;
      int i = 0;
      for (const J& tc : tool_calls) {
        std::string w = fmt::format("{}.tool_calls[{}].function", where, i++);
        const J& fn = get(tc, "function");
        if (!fn.is_object() || !fn.contains("name") || !fn.contains("arguments"))
          return make_error(ErrorCode::kInvalidArgument, "{} needs 'name' and 'arguments'", w);
        V4_ASSIGN_OR_RETURN(std::string name, py_str(fn["name"], w + ".name"));
        V4_ASSIGN_OR_RETURN(std::string args, encode_arguments_to_dsml(fn["arguments"], w, cx.opt->accept_object_arguments));
        list.push_back("<" + std::string(kDsml) + "invoke name=\"" + name + "\">\n" + args + "\n</" + kDsml + "invoke>");
      }
      std::string joined;
      for (size_t k = 0; k < list.size(); ++k) joined += (k ? "\n" : "") + list[k];
      tc_content = "\n\n<" + std::string(kDsml) + "tool_calls>\n" + joined + "\n</" + kDsml + "tool_calls>";
    }
    V4_ASSIGN_OR_RETURN(std::string summary, text_or_empty(content, where + ".content"));
    V4_ASSIGN_OR_RETURN(std::string rc, text_or_empty(reasoning, where + ".reasoning_content"));
    bool prev_has_task = index >= 1 && !get(msgs[index - 1], "task").is_null();
    std::string thinking_part;
    if (thinking && !prev_has_task && (!cx.drop || index > last_user)) thinking_part = rc + kThinkEnd;
    prompt += thinking_part + summary + tc_content;
    if (!wo_eos) prompt += kEos;
  } else {
    if (!role.is_string())
      return make_error(ErrorCode::kInvalidArgument, "{}.role must be a string, got {}", where,
                        role.is_null() ? std::string("null") : role.dump());
    return make_error(ErrorCode::kInvalidArgument,
                      "{}.role '{}' is not supported (system, user, assistant, tool; the server "
                      "also takes developer, as system)",
                      where, role.get<std::string>());
  }

  // Transition: only when the next message is an assistant/latest_reminder turn, or at the end.
  if (index + 1 < static_cast<int>(msgs.size())) {
    const J& next = get(msgs[index + 1], "role");
    if (next != "assistant" && next != "latest_reminder") return prompt;
  }
  const J& task = get(msg, "task");
  if (!task.is_null()) {
    static const std::pair<const char*, const char*> kTasks[] = {
        {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
        {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"},   {"read_url", "<｜read_url｜>"}};
    const char* tok = nullptr;
    for (auto& [n, t] : kTasks)
      if (task == n) tok = t;
    if (!tok) return make_error(ErrorCode::kInvalidArgument, "{}.task '{}' is not a valid task", where, task.dump());
    if (task != "action") {
      prompt += tok;
    } else {
      prompt += kAssistant;
      prompt += thinking ? kThinkStart : kThinkEnd;
      prompt += tok;
    }
  } else if (role == "user" || role == "developer") {
    prompt += kAssistant;
    if (!cx.drop && thinking) prompt += kThinkStart;
    else if (cx.drop && thinking && index >= last_user) prompt += kThinkStart;
    else prompt += kThinkEnd;
  }
  return prompt;
}

}  // namespace

Result<ThinkingMode> parse_thinking_mode(std::string_view s) {
  if (s == "chat") return ThinkingMode::kChat;
  if (s == "thinking") return ThinkingMode::kThinking;
  return make_error(ErrorCode::kInvalidArgument, "invalid thinking_mode '{}' (chat or thinking)", s);
}

std::optional<EffortProfile> detect_effort_profile(const std::string& model_dir) {
  std::ifstream f(std::filesystem::path(model_dir) / "encoding" / "encoding_dsv4.py", std::ios::binary);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string src = ss.str();
  if (src.find("REASONING_EFFORT_PROMPTS") != std::string::npos) return EffortProfile::k0731;
  if (src.find("REASONING_EFFORT_MAX") != std::string::npos) return EffortProfile::kPreview;
  return std::nullopt;
}

JsonTextKind python_json_kind(std::string_view text) {
  bool too_deep = false;
  const auto v = pyjson::loads(text, &too_deep);
  if (!v) return too_deep ? JsonTextKind::kTooDeep : JsonTextKind::kInvalid;
  return v->kind == pyjson::Value::Kind::kObj ? JsonTextKind::kObject : JsonTextKind::kOther;
}

std::string python_json_dumps(const nlohmann::ordered_json& value, bool ensure_ascii) {
  return pyjson::dumps(value, ensure_ascii);
}

J ChatEncoder::attach_tools(const J& messages, const J& tools) {
  if (!truthy(tools)) return messages;
  J out = messages.is_array() ? messages : J::array();
  if (!out.empty() && out[0].is_object() && (get(out[0], "role") == "system" || get(out[0], "role") == "developer")) {
    out[0]["tools"] = tools;
  } else {
    J sys = J::object();
    sys["role"] = "system";
    sys["content"] = "";
    sys["tools"] = tools;
    out.insert(out.begin(), sys);
  }
  return out;
}

Result<std::string> ChatEncoder::render(const J& messages_in, const ChatOptions& opt) {
  if (!messages_in.is_array()) return make_error(ErrorCode::kInvalidArgument, "messages must be a JSON array");
  for (size_t i = 0; i < messages_in.size(); ++i)
    if (!messages_in[i].is_object())
      return make_error(ErrorCode::kInvalidArgument, "messages[{}] is not an object", i);
  J msgs = merge_tool_messages(messages_in);
  sort_tool_results(msgs);
  bool drop = opt.drop_thinking;
  for (const J& m : msgs)
    if (truthy(get(m, "tools"))) drop = false;
  if (opt.thinking_mode == ThinkingMode::kThinking && drop) msgs = drop_thinking_messages(msgs);
  std::string prompt = opt.add_bos ? kBos : "";
  Ctx cx{opt.thinking_mode, drop, &opt, find_last_user_index(msgs)};
  for (int i = 0; i < static_cast<int>(msgs.size()); ++i) {
    V4_ASSIGN_OR_RETURN(std::string part, render_message(i, msgs, cx));
    prompt += part;
  }
  if (!opt.add_generation_prompt && !msgs.empty()) {
    const J& r = get(msgs.back(), "role");
    if (r == "user" || r == "developer") {
      for (const char* tail : {"<｜Assistant｜><think>", "<｜Assistant｜></think>"}) {
        std::string t = tail;
        if (prompt.size() >= t.size() && prompt.compare(prompt.size() - t.size(), t.size(), t) == 0) {
          prompt.resize(prompt.size() - t.size());
          break;
        }
      }
    }
  }
  return prompt;
}

Result<std::vector<TokenId>> ChatEncoder::encode(const Tokenizer& tokenizer, const J& messages, const J& tools,
                                                 const ChatOptions& options) {
  V4_ASSIGN_OR_RETURN(std::string prompt, render(attach_tools(messages, tools), options));
  return tokenizer.encode(prompt, false);
}

}  // namespace v4::text
