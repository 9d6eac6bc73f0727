// text::ChatEncoder — DeepSeek-V4 prompt rendering, byte-exact with DeepSeek's reference
// `encoding_dsv4.py` `encode_messages` (see /work/shared/design/chat-encoding.md §2).
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "text/tokenizer.h"

namespace v4::text {

/// How the prompt ends / whether reasoning is shown: `chat` ends `<｜Assistant｜></think>`,
/// `thinking` ends `<｜Assistant｜><think>`.
enum class ThinkingMode { kChat, kThinking };

/// Parses "chat" / "thinking". Errors: kInvalidArgument naming the value.
Result<ThinkingMode> parse_thinking_mode(std::string_view s);

/// Which reasoning-effort table the checkpoint's encoder has (chat-encoding.md §2.9).
enum class EffortProfile {
  kPreview,  ///< V4 preview (Pro/Flash): accepts none/"high"/"max"; only "max" adds a prefix.
  k0731,     ///< 0731/0813 refresh: "low"(default)/"high"/"max"; high = old max text, max = new text.
};

/// Picks the effort table from a checkpoint directory's own reference encoder
/// (`encoding/encoding_dsv4.py`), as SGLang does (chat-encoding.md §2.9): it defines
/// `REASONING_EFFORT_PROMPTS` -> k0731, `REASONING_EFFORT_MAX` -> kPreview. nullopt when the file
/// is absent or has neither (callers then default to kPreview or a flag).
std::optional<EffortProfile> detect_effort_profile(const std::string& model_dir);

/// Options of one rendering.
struct ChatOptions {
  ThinkingMode thinking_mode = ThinkingMode::kThinking;
  /// nullopt = reference default (preview: nothing; 0731: "low"). Ignored in chat mode.
  std::optional<std::string> reasoning_effort;
  EffortProfile effort_profile = EffortProfile::kPreview;
  /// Reference `drop_thinking` (default true; switched off automatically if any message has tools).
  bool drop_thinking = true;
  /// Prepend `<｜begin▁of▁sentence｜>` (reference `add_default_bos_token`).
  bool add_bos = true;
  /// The reference always ends a prompt whose last message is user/tool with the generation header
  /// `<｜Assistant｜><think>` (or `</think>`); false removes that trailing header.
  bool add_generation_prompt = true;
  /// Deliberate deviation from the reference (off by default = byte-exact): accept a JSON object as
  /// `tool_calls[].function.arguments` and render it like the equivalent JSON string.
  bool accept_object_arguments = false;
};

/// Renders OpenAI-style messages to the DeepSeek-V4 prompt string and tokenizes it.
///
/// `messages` is a JSON array of objects with `role` in system/user/assistant/tool (also the
/// reference's internal developer/latest_reminder), `content` (system/assistant: string or null;
/// user: a string — null or a parts array is rejected like the reference does, so flatten OpenAI
/// content parts before; tool: string, or parts whose text parts are joined with "\n\n"),
/// assistant `reasoning_content`, `tool_calls` (`[{id,type,function:{name,arguments}}]`), `wo_eos`;
/// tool `tool_call_id`; system `tools`, `response_format`; internal `task`. Use
/// `nlohmann::ordered_json` so key order is kept: tool schemas and arguments are re-serialized
/// like Python `json.dumps(ensure_ascii=False)`. docs/text.md lists every rule and deviation.
class ChatEncoder {
 public:
  /// Attaches request-level `tools` the way the reference harness does: into `messages[0]` when it
  /// is a system (or developer) message, else as a new `{"role":"system","content":"","tools":…}` at
  /// index 0. `tools` null/empty returns `messages` unchanged.
  static nlohmann::ordered_json attach_tools(const nlohmann::ordered_json& messages,
                                             const nlohmann::ordered_json& tools);

  /// The prompt string (tools must already be attached, see attach_tools). Errors:
  /// kInvalidArgument naming the message index and field (unknown role, user content null, bad
  /// effort, arguments JSON that is not an object, ...).
  static Result<std::string> render(const nlohmann::ordered_json& messages, const ChatOptions& options);

  /// attach_tools + render + tokenizer.encode (added tokens matched, no extra BOS).
  static Result<std::vector<TokenId>> encode(const Tokenizer& tokenizer,
                                             const nlohmann::ordered_json& messages,
                                             const nlohmann::ordered_json& tools,
                                             const ChatOptions& options);
};

/// What `text` is as the reference's `json.loads` reads it (strict strings, NaN/Infinity
/// accepted) — how ChatEncoder reads a `tool_calls[].function.arguments` string: not JSON (it
/// falls back to the reference's `{"arguments": <raw text>}` rendering), a JSON object (the
/// arguments), or other JSON (the encoder refuses it). Servers refuse all but objects.
/// kTooDeep: nested deeper than the 512 levels the reader follows (treated as kInvalid by the
/// encoder; servers name the limit).
enum class JsonTextKind { kInvalid, kObject, kOther, kTooDeep };
JsonTextKind python_json_kind(std::string_view text);

/// Python `json.dumps(value, ensure_ascii=False)` text of `value` (separators ", " and ": ",
/// floats as Python repr, integral floats keep ".0"). Used for tool schemas and arguments.
std::string python_json_dumps(const nlohmann::ordered_json& value, bool ensure_ascii = false);

}  // namespace v4::text
