// text::OutputParser — turns DeepSeek-V4 model output (text after the generation prompt) into
// OpenAI `reasoning_content`, `content` and `tool_calls`, streaming or whole.
// Format: chat-encoding.md §3; design: a byte-level state machine with hold-back of partial markers
// (after DeepSeek's deepseek-recipe StateMachine, §4.1), tolerant where the strict reference raises.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "text/chat_encoder.h"

namespace v4::text {

class Tokenizer;

/// Template special-token strings that must never reach a user as content or reasoning: the
/// DeepSeek V4 / V4.1 tokens of chat-encoding.md §1 (`<｜User｜>`, `<｜Assistant｜>`, `<｜▁pad▁｜>`,
/// `<|EOT|>`, the legacy tool / FIM / task / search / image tokens, ...) plus, with `tok`, every
/// added token of that tokenizer written `<｜…` or `<|…` (e.g. the 800 placeholders). BOS, EOS,
/// `<think>`, `</think>` and `｜DSML｜` are not listed: the parser has its own rules for them.
std::vector<std::string> template_special_tokens(const Tokenizer* tok = nullptr);

/// One streamed piece of the parsed message.
struct ParserEvent {
  enum class Kind {
    kReasoningDelta,  ///< `text` appended to reasoning_content
    kContentDelta,    ///< `text` appended to content
    kToolCallBegin,   ///< new call: `index` (0-based), `id`, `name` (complete)
    kToolCallArgs,    ///< `text` appended to tool call `index`'s arguments JSON
    kToolCallEnd,     ///< tool call `index` is complete (its arguments are a closed JSON object)
  };
  Kind kind;
  std::string text;
  int index = -1;
  std::string id;
  std::string name;
  bool operator==(const ParserEvent&) const = default;
};

/// One parsed tool call; `arguments` is JSON object text built like the reference:
/// `{"k": "v", "n": 1.50}` — string="true" values JSON-escaped (non-ASCII kept raw),
/// string="false" values copied raw.
struct ParsedToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

/// The whole parsed assistant message.
struct ParsedMessage {
  std::string content;
  std::string reasoning_content;
  std::vector<ParsedToolCall> tool_calls;
  /// True when the output ended (finish) while still inside reasoning or a tool call.
  bool truncated = false;
};

struct OutputParserOptions {
  /// How the prompt ended: kThinking (`<think>`) starts in reasoning, kChat (`</think>`) in content.
  ThinkingMode start = ThinkingMode::kThinking;
  /// Start inside a `<｜DSML｜tool_calls>` block (the prompt pre-filled the opener).
  bool start_in_tool_block = false;
  /// Non-empty: start inside `<｜DSML｜invoke name="start_tool_name">\n` within a tool block (the
  /// prompt pre-filled both openers, tool_choice naming a function); the call's kToolCallBegin
  /// comes with the first feed() / finish(). Implies start_in_tool_block.
  std::string start_tool_name;
  /// Tool call ids are `id_prefix` + a per-parser counter-derived suffix (unique per parser).
  std::string id_prefix = "call_";
  /// Seed mixed into ids (e.g. a request id) so ids differ across requests.
  uint64_t id_seed = 0;
  /// Also accept DeepSeek-V4.1's DSML spelling (`<｜DSML｜ invoke …>`, `</｜DSML｜ parameter>`).
  /// Off by default: for V4 the reference treats those spellings as ordinary value text.
  bool accept_v41_spelling = false;
  /// True: the EOS text (`<｜end▁of▁sentence｜>`) ends the output (text after it is dropped), as
  /// the reference parser. False (requests with `ignore_eos`, whose generation goes on past EOS):
  /// EOS is dropped where it occurs and parsing continues in the same state.
  bool eos_ends_output = true;
  /// Strings dropped wherever they occur in reasoning or content (held back while partial, like
  /// the markers); tool-call names and argument values are left as written.
  std::vector<std::string> drop_tokens = template_special_tokens();
};

/// Streaming parser. Feed decoded text deltas (from a Detokenizer with skip_special_tokens=false);
/// markers split across deltas are held back, never emitted as content. Rules (docs/text.md):
/// reasoning ends at `</think>` (or implicitly at a DSML block); content ends at `<｜end▁of▁sentence｜>`
/// (text after it is dropped) or at `<｜DSML｜` (one preceding `\n\n`, else `\n`, is the separator,
/// not content); stray `</think>`, `<think>`, BOS, `｜DSML｜` and the `drop_tokens` (template special
/// tokens such as `<｜Assistant｜>`) in reasoning and content are dropped. Leading
/// newlines of content and trailing newlines of reasoning are kept (reference behaviour).
/// Equal to the reference parser (`parse_strict`) on all inputs it accepts; the result never
/// depends on how the text is split into deltas. Not thread-safe; one per request.
class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options = {});
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;

  /// Consumes `delta` (any byte split, even inside a UTF-8 character) and returns the new events.
  std::vector<ParserEvent> feed(std::string_view delta);
  /// Ends the stream: releases held-back text and closes an open tool call (its arguments become
  /// a complete JSON object). `close_open_call` false (output cut by a token limit): an open call
  /// is left as written — its arguments are the possibly incomplete JSON generated so far (""
  /// when no parameter was written), as OpenAI returns a call cut by `max_tokens` — and a call
  /// whose name was not finished is not begun.
  std::vector<ParserEvent> finish(bool close_open_call = true);
  /// Number of tool calls begun so far (finish_reason "tool_calls" when > 0).
  int tool_call_count() const;
  /// A tool call is being written (begun and not ended, pre-filled and not yet begun, or its
  /// invoke head is being read): output cut now leaves it incomplete.
  bool call_open() const;

  /// Parses a whole output (feed + finish, events folded into a message).
  static ParsedMessage parse(std::string_view completion, const OutputParserOptions& options = {});

  /// The reference decoder's exact semantics (`parse_message_from_completion_text`, strict):
  /// equal results where it accepts the text, kInvalidArgument with its reason where it raises
  /// (missing </think>, markup in content, malformed DSML, duplicate parameter, text after the
  /// block or EOS...). Tool call ids are left empty. For validation and tests; servers should use
  /// the tolerant streaming parser.
  static Result<ParsedMessage> parse_strict(std::string_view completion, ThinkingMode mode);

  /// Folds events into `msg` (what a non-streaming server does).
  static void apply(const std::vector<ParserEvent>& events, ParsedMessage& msg);

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace v4::text
