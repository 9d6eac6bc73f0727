// Streaming DeepSeek-V4 output parser: a byte-level state machine. Each state has literal markers;
// text before the leftmost marker is emitted with the state's action, a possible marker prefix at
// the end of the buffer is held back until more text (or finish()) decides it. See docs/text.md.
#include "text/output_parser.h"

#include <algorithm>
#include <cstdio>

#include "text/detokenizer.h"
#include "text/py_json.h"
#include "text/tokenizer.h"

namespace v4::text {

namespace {

constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";

enum class St {
  kReasoning,
  kContent,
  kToolBlock,   // inside <｜DSML｜tool_calls> between invokes
  kToolName,    // after `invoke name="`
  kArgs,        // inside an invoke, between parameters
  kParamName,   // after `parameter name="`
  kValueStr,    // string="true" value
  kValueRaw,    // string="false" value
  kSkipToGt,    // dropping the rest of a closing tag up to '>'
  kAfterBlock,  // after </｜DSML｜tool_calls>
  kFinished,    // after EOS
};

enum class Act {
  kToToolBlock,    // <｜DSML｜ (with optional blank line before) opens a tool block
  kToContent,      // </think>
  kDrop,           // stray marker: dropped
  kFinish,         // EOS
  kStrayCloser,    // </｜DSML｜...> in content: drop up to '>'
  kBeginName,      // <｜DSML｜invoke: the head ` name="…">\n` follows
  kEndName,        // next <｜DSML｜ / </｜DSML｜ after the head (not consumed)
  kBlockCloser,    // </｜DSML｜ in the tool block: end of block
  kParamBegin,     // parameter name="
  kInvokeEnd,      // </｜DSML｜invoke>
  kInvokeEndBlock, // other </｜DSML｜ inside invoke: end invoke and block
  kNameStr,        // " string="true">
  kNameRaw,        // " string="false">
  kNameNoFlag,     // </｜DSML｜parameter while still in the name (no string= attribute)
  kValueEnd,       // </｜DSML｜parameter ending a value
  kGt,             // '>' ending a skipped closer
};

struct Marker {
  std::string_view text;
  Act act;
  bool v41 = false;  // DeepSeek-V4.1 spelling (leading space in tag names); opt-in
};

const std::vector<Marker>& markers(St s) {
  static const std::vector<Marker> reasoning = {
      {"\n\n<｜DSML｜", Act::kToToolBlock}, {"\n<｜DSML｜", Act::kToToolBlock}, {"<｜DSML｜", Act::kToToolBlock},
      {kThinkEnd, Act::kToContent},        {kThinkStart, Act::kDrop},          {kBos, Act::kDrop},
      {kEos, Act::kFinish},                {"｜DSML｜", Act::kDrop}};
  static const std::vector<Marker> content = {
      {"\n\n<｜DSML｜", Act::kToToolBlock}, {"\n<｜DSML｜", Act::kToToolBlock}, {"<｜DSML｜", Act::kToToolBlock},
      {"</｜DSML｜", Act::kStrayCloser},    {kThinkEnd, Act::kDrop},            {kThinkStart, Act::kDrop},
      {kBos, Act::kDrop},                  {kEos, Act::kFinish},               {"｜DSML｜", Act::kDrop}};
  static const std::vector<Marker> tool_block = {
      {"<｜DSML｜invoke", Act::kBeginName}, {"<｜DSML｜ invoke", Act::kBeginName, true},
      {"invoke name=\"", Act::kBeginName},  // opener without its <｜DSML｜ (it opened the block)
      {"</｜DSML｜", Act::kBlockCloser},    {kEos, Act::kFinish}};
  // The invoke head ends where the reference stops reading it.
  static const std::vector<Marker> tool_name = {{"<｜DSML｜parameter", Act::kEndName},
                                                {"<｜DSML｜ parameter", Act::kEndName, true},
                                                {"</｜DSML｜invoke", Act::kEndName},
                                                {"</｜DSML｜ invoke", Act::kEndName, true}};
  // `<｜DSML｜parameter name="` is one marker (the longest match wins) so that the opener's
  // `<｜DSML｜` is not taken for prose (text here is content); the bare form stays for tolerance.
  static const std::vector<Marker> args = {{"<｜DSML｜parameter name=\"", Act::kParamBegin},
                                           {"<｜DSML｜ parameter name=\"", Act::kParamBegin, true},
                                           {"parameter name=\"", Act::kParamBegin},
                                           {"</｜DSML｜invoke>", Act::kInvokeEnd},
                                           {"</｜DSML｜ invoke>", Act::kInvokeEnd, true},
                                           {"</｜DSML｜parameter>", Act::kDrop},  // stray closer
                                           {"</｜DSML｜ parameter>", Act::kDrop, true},
                                           {"</｜DSML｜", Act::kInvokeEndBlock},
                                           {kEos, Act::kFinish}};
  static const std::vector<Marker> param_name = {{"\" string=\"true\">", Act::kNameStr},
                                                 {"\" string=\"false\">", Act::kNameRaw},
                                                 {"</｜DSML｜parameter", Act::kNameNoFlag},
                                                 {"</｜DSML｜ parameter", Act::kNameNoFlag, true}};
  // A value ends only at its closer (as in the reference, which reads up to "/｜DSML｜parameter").
  // Names and values may contain EOS text in the reference; the engine stops at the EOS token
  // anyway, so these states have no EOS marker (finish() closes them).
  static const std::vector<Marker> value = {
      {"</｜DSML｜parameter", Act::kValueEnd},
      {"<\n/｜DSML｜parameter", Act::kValueEnd},  // reference regex `<$` also matches before a final \n
      {"</｜DSML｜ parameter", Act::kValueEnd, true}};
  static const std::vector<Marker> skip = {{">", Act::kGt}, {kEos, Act::kFinish}};
  static const std::vector<Marker> none;
  switch (s) {
    case St::kReasoning: return reasoning;
    case St::kContent: return content;
    case St::kToolBlock: return tool_block;
    case St::kToolName: return tool_name;
    case St::kArgs: return args;
    case St::kParamName: return param_name;
    case St::kValueStr:
    case St::kValueRaw: return value;
    case St::kSkipToGt: return skip;
    case St::kAfterBlock: return content;  // same markers; leading whitespace dropped
    case St::kFinished: return none;
  }
  return none;
}

// JSON string-body escaping (no quotes), Python json.dumps(ensure_ascii=False) style.
void json_escape_into(std::string_view s, std::string& out) {
  std::string q = pyjson::dumps_string(s, false);
  out.append(q, 1, q.size() - 2);
}

/// Template special tokens of DeepSeek V4 / V4.1 (chat-encoding.md §1) that the state machine
/// has no rule for (BOS, EOS, <think>, </think> and ｜DSML｜ have their own markers).
constexpr std::string_view kTemplateTokens[] = {
    "<｜▁pad▁｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>",
    "<｜System｜>", "<|EOT|>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>", "<｜begin▁of▁repo▁name｜>",
    "<｜end▁of▁repo▁name｜>", "<｜begin▁of▁file▁name｜>", "<｜end▁of▁file▁name｜>",
    "<｜begin▁of▁file｜>", "<｜end▁of▁file｜>", "<｜place▁holder▁for▁copy｜>",
    "<｜place▁holder▁for▁pointer▁replace｜>", "<｜begin▁sys｜>", "<｜end▁sys｜>",
    "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>",
    "<｜task｜>", "<｜political｜>", "<｜entity｜>", "<｜title｜>", "<｜safety｜>", "<｜answer｜>",
    "<｜search｜>", "<｜search▁begin｜>", "<｜search▁end｜>", "<｜extracted_url｜>", "<｜read_url｜>",
    "<｜end_of_query｜>", "<｜image｜>", "<｜image2｜>", "<｜table｜>", "<｜/table>｜", "<｜td｜>",
    "<｜/td｜>", "<｜tr｜>", "<｜/tr｜>", "<｜rl_image_pad｜>", "<｜rl_image_start｜>",
    "<｜deepseek_image｜>"};

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

struct OutputParser::State {
  OutputParserOptions opt;
  St st = St::kReasoning;
  St after_gt = St::kArgs;  // state to enter after kSkipToGt
  std::string buf;          // unprocessed input (held-back marker prefix / partial UTF-8)
  std::string name;         // tool name head / parameter name being read
  bool reprocess = false;   // the matched marker is not consumed (re-read in the new state)
  int n_calls = 0;          // tool calls begun
  int n_params = 0;         // parameters in the current call
  bool in_call = false;
  std::vector<ParserEvent> out;
  std::vector<Marker> drops;  // opt.drop_tokens (template special tokens) as kDrop markers
  bool pending_call = false;  // opt.start_tool_name: begin that call with the first events
  bool block_text = false;    // text written in the tool block since the last marker is content
  bool opener_tail = false;   // the rest of a block opener (`tool_calls>`) is still to be skipped

  void start_events() {
    out.clear();
    if (pending_call) {
      pending_call = false;
      name = opt.start_tool_name;
      begin_call();
    }
  }

  void emit(ParserEvent::Kind k, std::string_view text) {
    if (text.empty()) return;
    if (!out.empty() && out.back().kind == k &&
        (k == ParserEvent::Kind::kContentDelta || k == ParserEvent::Kind::kReasoningDelta ||
         k == ParserEvent::Kind::kToolCallArgs)) {
      out.back().text.append(text);
      return;
    }
    ParserEvent e{k, std::string(text), k == ParserEvent::Kind::kToolCallArgs ? n_calls - 1 : -1, "", ""};
    out.push_back(std::move(e));
  }
  void args(std::string_view t) { emit(ParserEvent::Kind::kToolCallArgs, t); }

  void begin_call() {
    char hex[32];
    std::snprintf(hex, sizeof(hex), "%016llx",
                  static_cast<unsigned long long>(splitmix64(opt.id_seed * 1000003ULL + n_calls)));
    ParserEvent e{ParserEvent::Kind::kToolCallBegin, "", n_calls, opt.id_prefix + hex, name};
    out.push_back(std::move(e));
    ++n_calls;
    n_params = 0;
    in_call = true;
    name.clear();
  }
  // The invoke head ` name="f">\n` -> f (reference: ^\s*name="(.*?)">\n$); tolerant of missing parts.
  void finish_name() {
    std::string_view h = name;
    while (!h.empty() && (h.front() == ' ' || h.front() == '\n' || h.front() == '\t' || h.front() == '\r')) h.remove_prefix(1);
    if (h.substr(0, 6) == "name=\"") h.remove_prefix(6);
    while (!h.empty() && (h.back() == ' ' || h.back() == '\n' || h.back() == '\t' || h.back() == '\r')) h.remove_suffix(1);
    if (!h.empty() && h.back() == '>') h.remove_suffix(1);
    if (!h.empty() && h.back() == '"') h.remove_suffix(1);
    name = std::string(h);
  }
  // `{"key": ` or `, "key": ` (key JSON-escaped like the reference's json.dumps(key)).
  void emit_key(const std::string& key) {
    std::string e;
    json_escape_into(key, e);
    args((n_params == 0 ? "{\"" : ", \"") + e + "\": ");
    ++n_params;
  }

  void end_call() {
    if (!in_call) return;
    args(n_params == 0 ? "{}" : "}");
    out.push_back(ParserEvent{ParserEvent::Kind::kToolCallEnd, "", n_calls - 1, "", ""});
    in_call = false;
  }

  // Unmatched text in the current state.
  void text(std::string_view t) {
    switch (st) {
      case St::kReasoning: emit(ParserEvent::Kind::kReasoningDelta, t); break;
      case St::kContent: emit(ParserEvent::Kind::kContentDelta, t); break;
      case St::kToolName:
      case St::kParamName: name.append(t); break;
      case St::kValueStr: {
        std::string e;
        json_escape_into(t, e);
        args(e);
        break;
      }
      case St::kValueRaw: args(t); break;
      case St::kAfterBlock: {
        size_t k = t.find_first_not_of(" \t\r\n");
        if (k != std::string_view::npos) {
          st = St::kContent;
          emit(ParserEvent::Kind::kContentDelta, t.substr(k));
        }
        break;
      }
      case St::kToolBlock:
      case St::kArgs: {
        // Text between the block's markers that is not an invoke, or between an invoke's
        // parameters that is not a parameter (the model wrote prose where a call or its arguments
        // belong, e.g. after the pre-filled opener of tool_choice "required" or of a named
        // function): content, never dropped. The rest of the opener tag (`tool_calls>` after the
        // `<｜DSML｜` marker) and the separators around invokes / parameters (whitespace) are not
        // content.
        if (opener_tail) {
          const size_t gt = t.find('>');
          if (gt == std::string_view::npos) break;  // still inside the opener tag
          opener_tail = false;
          t.remove_prefix(gt + 1);
        }
        size_t k = block_text ? 0 : t.find_first_not_of(" \t\r\n");
        if (k != std::string_view::npos) {
          block_text = true;
          emit(ParserEvent::Kind::kContentDelta, t.substr(k));
        }
        break;
      }
      default: break;  // skip / finished: dropped
    }
  }

  void act(Act a) {
    block_text = false;
    opener_tail = false;
    switch (a) {
      case Act::kToToolBlock:
        st = St::kToolBlock;
        opener_tail = true;
        break;
      case Act::kToContent: st = St::kContent; break;
      case Act::kDrop: break;
      case Act::kFinish:
        if (!opt.eos_ends_output) break;  // ignore_eos: EOS dropped, same state
        end_call();
        st = St::kFinished;
        break;
      case Act::kStrayCloser:
        after_gt = st;
        st = St::kSkipToGt;
        break;
      case Act::kBeginName:
        st = St::kToolName;
        name.clear();
        break;
      case Act::kEndName:
        finish_name();
        begin_call();
        st = St::kArgs;
        reprocess = true;
        break;
      case Act::kBlockCloser:
        after_gt = St::kAfterBlock;
        st = St::kSkipToGt;
        break;
      case Act::kParamBegin:
        name.clear();
        st = St::kParamName;
        break;
      case Act::kInvokeEnd:
        end_call();
        st = St::kToolBlock;
        break;
      case Act::kInvokeEndBlock:
        end_call();
        after_gt = St::kAfterBlock;
        st = St::kSkipToGt;
        break;
      case Act::kNameStr:
        emit_key(name);
        args("\"");
        st = St::kValueStr;
        break;
      case Act::kNameRaw:
        emit_key(name);
        st = St::kValueRaw;
        break;
      case Act::kNameNoFlag: {  // `name="k">v</｜DSML｜parameter`: recover k and v as a string
        size_t gt = name.find("\">");
        std::string key = gt == std::string::npos ? name : name.substr(0, gt);
        std::string val = gt == std::string::npos ? "" : name.substr(gt + 2);
        emit_key(key);
        std::string e;
        json_escape_into(val, e);
        args("\"" + e + "\"");
        after_gt = St::kArgs;
        st = St::kSkipToGt;
        break;
      }
      case Act::kValueEnd:
        if (st == St::kValueStr) args("\"");
        after_gt = St::kArgs;
        st = St::kSkipToGt;
        break;
      case Act::kGt: st = after_gt; break;
    }
  }

  // Processes buf[0..limit); with final=false, a possible marker prefix at the end is held back.
  void run(bool final) {
    size_t limit = final ? buf.size() : utf8_complete_prefix(buf);
    size_t pos = 0;
    while (pos < limit && st != St::kFinished) {
      const auto& ms = markers(st);
      size_t emit_from = pos;
      bool done = false;
      const bool text_state = st == St::kReasoning || st == St::kContent || st == St::kAfterBlock ||
                              st == St::kToolBlock || st == St::kArgs;
      for (size_t p = pos; p < limit; ++p) {
        const Marker* best = nullptr;
        bool partial = false;
        auto try_markers = [&](const std::vector<Marker>& list) {
          for (const Marker& m : list) {
            if (m.text.empty() || m.text[0] != buf[p]) continue;
            if (m.v41 && !opt.accept_v41_spelling) continue;
            size_t avail = limit - p;
            if (avail >= m.text.size()) {
              if (std::string_view(buf).substr(p, m.text.size()) == m.text &&
                  (!best || m.text.size() > best->text.size()))
                best = &m;
            } else if (!final && std::string_view(m.text).substr(0, avail) == std::string_view(buf).substr(p, avail)) {
              partial = true;
            }
          }
        };
        try_markers(ms);
        if (text_state) try_markers(drops);
        if (partial) {  // might still become a (longer) marker: hold back from p
          text(std::string_view(buf).substr(emit_from, p - emit_from));
          buf.erase(0, p);
          return;
        }
        if (best) {
          text(std::string_view(buf).substr(emit_from, p - emit_from));
          reprocess = false;
          act(best->act);
          pos = reprocess ? p : p + best->text.size();
          done = true;
          break;
        }
      }
      if (!done) {
        text(std::string_view(buf).substr(emit_from, limit - emit_from));
        pos = limit;
      }
    }
    if (st == St::kFinished) {
      buf.clear();
      return;
    }
    buf.erase(0, pos);
  }
};

OutputParser::OutputParser(OutputParserOptions options) : s_(std::make_unique<State>()) {
  s_->opt = std::move(options);
  for (const std::string& t : s_->opt.drop_tokens)
    if (!t.empty()) s_->drops.push_back(Marker{t, Act::kDrop});
  s_->pending_call = !s_->opt.start_tool_name.empty();
  s_->st = s_->pending_call               ? St::kArgs
           : s_->opt.start_in_tool_block ? St::kToolBlock
           : s_->opt.start == ThinkingMode::kThinking ? St::kReasoning
                                                     : St::kContent;
}
OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;

std::vector<ParserEvent> OutputParser::feed(std::string_view delta) {
  s_->start_events();
  if (s_->st != St::kFinished) {
    s_->buf.append(delta);
    s_->run(false);
  }
  return std::move(s_->out);
}

std::vector<ParserEvent> OutputParser::finish(bool close_open_call) {
  s_->start_events();
  if (s_->st != St::kFinished) {
    // Replace any incomplete UTF-8 at the very end, then flush everything held back.
    s_->buf = utf8_lossy(s_->buf);
    s_->run(true);
    if (!close_open_call) {
      // Cut output (max_tokens): an open call keeps exactly the arguments written so far (no
      // closing quote / brace invented); a call whose name was not finished is not begun.
      s_->in_call = false;
      s_->st = St::kFinished;
      return std::move(s_->out);
    }
    // Close an open tool call so its arguments are a complete JSON object.
    switch (s_->st) {
      case St::kParamName:
        s_->emit_key(s_->name);
        s_->args("null");
        break;
      case St::kValueStr: s_->args("\""); break;
      case St::kValueRaw: break;
      case St::kToolName:
        s_->finish_name();
        s_->begin_call();
        break;
      default: break;
    }
    s_->end_call();
    s_->st = St::kFinished;
  }
  return std::move(s_->out);
}

int OutputParser::tool_call_count() const { return s_->n_calls + (s_->pending_call ? 1 : 0); }

bool OutputParser::call_open() const {
  return s_->st != St::kFinished && (s_->in_call || s_->pending_call || s_->st == St::kToolName);
}

std::vector<std::string> template_special_tokens(const Tokenizer* tok) {
  std::vector<std::string> out(std::begin(kTemplateTokens), std::end(kTemplateTokens));
  if (tok)
    for (const AddedToken& t : tok->added_tokens()) {
      const std::string& c = t.content;
      const bool markup = c.rfind("<｜", 0) == 0 || c.rfind("<|", 0) == 0;
      const bool own_rule = c == kEos || c == kBos;
      if (markup && !own_rule && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    }
  return out;
}

void OutputParser::apply(const std::vector<ParserEvent>& events, ParsedMessage& msg) {
  for (const ParserEvent& e : events) {
    switch (e.kind) {
      case ParserEvent::Kind::kReasoningDelta: msg.reasoning_content += e.text; break;
      case ParserEvent::Kind::kContentDelta: msg.content += e.text; break;
      case ParserEvent::Kind::kToolCallBegin: msg.tool_calls.push_back({e.id, e.name, ""}); break;
      case ParserEvent::Kind::kToolCallArgs:
        if (e.index >= 0 && e.index < static_cast<int>(msg.tool_calls.size())) msg.tool_calls[e.index].arguments += e.text;
        break;
      case ParserEvent::Kind::kToolCallEnd: break;
    }
  }
}

ParsedMessage OutputParser::parse(std::string_view completion, const OutputParserOptions& options) {
  OutputParser p(options);
  ParsedMessage msg;
  apply(p.feed(completion), msg);
  St before = p.s_->st;
  bool in_call = p.s_->in_call;
  apply(p.finish(), msg);
  msg.truncated = before == St::kReasoning || in_call || before == St::kToolName;
  return msg;
}

// ---- strict reference decoder --------------------------------------------------------------
namespace {

// Reads from `i` up to the earliest of `stops`; returns the text before it and sets `stop`
// (empty when none was found: the rest of the text is returned and i = size).
std::string_view read_until(std::string_view t, size_t& i, std::initializer_list<std::string_view> stops,
                            std::string_view& stop) {
  size_t best = std::string_view::npos;
  stop = {};
  for (auto s : stops) {
    size_t p = t.find(s, i);
    if (p != std::string_view::npos && p < best) {
      best = p;
      stop = s;
    }
  }
  std::string_view out;
  if (best == std::string_view::npos) {
    out = t.substr(i);
    i = t.size();
  } else {
    out = t.substr(i, best - i);
    i = best + stop.size();
  }
  return out;
}

// Python `re` `X$` (no MULTILINE): X at the very end, or just before a final '\n'.
bool ends_with_dollar(std::string_view s, std::string_view x, size_t& cut) {
  if (s.size() >= x.size() && s.substr(s.size() - x.size()) == x) {
    cut = s.size() - x.size();
    return true;
  }
  if (s.size() >= x.size() + 1 && s.back() == '\n' && s.substr(s.size() - 1 - x.size(), x.size()) == x) {
    cut = s.size() - 1 - x.size();
    return true;
  }
  return false;
}

bool py_space(std::string_view s, size_t& i) {  // consumes one Unicode whitespace char (Python \s)
  static const char* ws[] = {" ", "\t", "\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x1f", "\u0085", "\u00a0",
                             "\u1680", "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005", "\u2006",
                             "\u2007", "\u2008", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};
  for (const char* w : ws) {
    std::string_view x(w);
    if (s.substr(i, x.size()) == x) {
      i += x.size();
      return true;
    }
  }
  return false;
}

Status strict_error(std::string msg) { return Status(ErrorCode::kInvalidArgument, std::move(msg)); }

}  // namespace

Result<ParsedMessage> OutputParser::parse_strict(std::string_view t, ThinkingMode mode) {
  const std::string d = "｜DSML｜";
  const std::string block_start = "\n\n<" + d + "tool_calls";
  const std::string block_end = "</" + d + "tool_calls>";
  const std::string invoke = "<" + d + "invoke", invoke_end = "</" + d + "invoke";
  const std::string param = "<" + d + "parameter", param_end = "/" + d + "parameter";
  ParsedMessage msg;
  size_t i = 0;
  std::string_view stop;
  if (mode == ThinkingMode::kThinking) {
    msg.reasoning_content = std::string(read_until(t, i, {kThinkEnd, block_start}, stop));
    if (stop != kThinkEnd) return strict_error("invalid thinking format: missing </think>");
  }
  msg.content = std::string(read_until(t, i, {kEos, block_start}, stop));
  if (stop == block_start) {
    while (i < t.size()) {
      std::string_view gap = read_until(t, i, {invoke, block_end}, stop);
      if (gap != ">\n") return strict_error("tool call format error: expected '>\\n' but got '" + std::string(gap) + "'");
      if (stop == block_end) break;
      if (stop.empty()) return strict_error("missing special token in tool calls");
      std::string_view head = read_until(t, i, {param, invoke_end}, stop);
      size_t k = 0, cut = 0;
      while (py_space(head, k)) {
      }
      if (head.substr(k, 6) != "name=\"" || !ends_with_dollar(head, "\">\n", cut) || cut < k + 6)
        return strict_error("tool name format error: '" + std::string(head) + "'");
      ParsedToolCall call;
      call.name = std::string(head.substr(k + 6, cut - k - 6));
      std::vector<std::string> keys;
      std::string args = "{";
      while (stop == param) {
        std::string_view pc = read_until(t, i, {param_end}, stop);
        // ^ name="(.*?)" string="(true|false)">(.*?)<$  (DOTALL)
        size_t vcut = 0;
        bool ok = pc.substr(0, 7) == " name=\"" && ends_with_dollar(pc, "<", vcut);
        std::string name, value, flag;
        if (ok) {
          ok = false;
          for (size_t p = 7; p < pc.size(); ++p) {
            for (std::string_view f : {std::string_view("\" string=\"true\">"), std::string_view("\" string=\"false\">")}) {
              if (pc.substr(p, f.size()) == f && p + f.size() <= vcut) {
                name = std::string(pc.substr(7, p - 7));
                flag = f.find("true") != std::string_view::npos ? "true" : "false";
                value = std::string(pc.substr(p + f.size(), vcut - p - f.size()));
                ok = true;
                break;
              }
            }
            if (ok) break;
          }
        }
        if (!ok) return strict_error("parameter format error: '" + std::string(pc) + "'");
        if (std::find(keys.begin(), keys.end(), name) != keys.end())
          return strict_error("duplicate parameter name: '" + name + "'");
        keys.push_back(name);
        args += (keys.size() > 1 ? ", " : "") + pyjson::dumps_string(name) + ": " +
                (flag == "true" ? pyjson::dumps_string(value) : value);
        std::string_view after = read_until(t, i, {param, invoke_end}, stop);
        if (after != ">\n")
          return strict_error("parameter format error: expected '>\\n' but got '" + std::string(after) + "'");
      }
      call.arguments = args + "}";
      msg.tool_calls.push_back(std::move(call));
    }
    std::string_view tail = read_until(t, i, {kEos}, stop);
    if (!tail.empty()) return strict_error("unexpected content after tool calls");
  } else if (stop != kEos) {
    return strict_error("invalid format: missing EOS token");
  }
  if (i != t.size() || !(stop == kEos || stop.empty())) return strict_error("unexpected content at end");
  for (std::string_view sp : {kBos, kEos, kThinkStart, kThinkEnd, std::string_view("｜DSML｜")})
    if (msg.content.find(sp) != std::string::npos || msg.reasoning_content.find(sp) != std::string::npos)
      return strict_error("unexpected special token '" + std::string(sp) + "' in content");
  return msg;
}

}  // namespace v4::text
