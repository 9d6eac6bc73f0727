// Streaming DeepSeek-V4 output parser: a byte-level state machine. Each state has literal markers;
// text before the leftmost marker is emitted with the state's action, a possible marker prefix at
// the end of the buffer is held back until more text (or finish()) decides it. See docs/text.md.
#include "text/output_parser.h"

#include <algorithm>
#include <cstdio>

#include "text/detokenizer.h"
#include "text/py_json.h"

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
  kBeginName,      // invoke name="
  kEndName,        // ">
  kBlockCloser,    // </｜DSML｜ in the tool block: end of block
  kParamBegin,     // parameter name="
  kInvokeEnd,      // </｜DSML｜invoke>
  kInvokeEndBlock, // other </｜DSML｜ inside invoke: end invoke and block
  kNameStr,        // " string="true">
  kNameRaw,        // " string="false">
  kNameBare,       // ">  (no string= attribute: treat as string)
  kValueEnd,       // </｜DSML｜ ending a value
  kGt,             // '>' ending a skipped closer
};

struct Marker {
  std::string_view text;
  Act act;
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
      {"invoke name=\"", Act::kBeginName}, {"</｜DSML｜", Act::kBlockCloser}, {kEos, Act::kFinish}};
  static const std::vector<Marker> tool_name = {{"\">", Act::kEndName}, {kEos, Act::kFinish}};
  static const std::vector<Marker> args = {{"parameter name=\"", Act::kParamBegin},
                                           {"</｜DSML｜invoke>", Act::kInvokeEnd},
                                           {"</｜DSML｜parameter>", Act::kDrop},  // stray closer
                                           {"</｜DSML｜", Act::kInvokeEndBlock},
                                           {kEos, Act::kFinish}};
  static const std::vector<Marker> param_name = {{"\" string=\"true\">", Act::kNameStr},
                                                 {"\" string=\"false\">", Act::kNameRaw},
                                                 {"\">", Act::kNameBare},
                                                 {kEos, Act::kFinish}};
  static const std::vector<Marker> value = {{"</｜DSML｜", Act::kValueEnd}, {kEos, Act::kFinish}};
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
  std::string name;         // tool name being read
  int n_calls = 0;          // tool calls begun
  int n_params = 0;         // parameters in the current call
  bool in_call = false;
  std::vector<ParserEvent> out;

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
      case St::kToolName: name.append(t); break;
      case St::kParamName:
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
      default: break;  // tool block / args / skip / finished: dropped
    }
  }

  void act(Act a) {
    switch (a) {
      case Act::kToToolBlock: st = St::kToolBlock; break;
      case Act::kToContent: st = St::kContent; break;
      case Act::kDrop: break;
      case Act::kFinish:
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
        begin_call();
        st = St::kArgs;
        break;
      case Act::kBlockCloser:
        after_gt = St::kAfterBlock;
        st = St::kSkipToGt;
        break;
      case Act::kParamBegin:
        args(n_params == 0 ? "{\"" : ", \"");
        ++n_params;
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
      case Act::kNameBare:
        args("\": \"");
        st = St::kValueStr;
        break;
      case Act::kNameRaw:
        args("\": ");
        st = St::kValueRaw;
        break;
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
      for (size_t p = pos; p < limit; ++p) {
        const Marker* best = nullptr;
        bool partial = false;
        for (const Marker& m : ms) {
          size_t avail = limit - p;
          if (avail >= m.text.size()) {
            if (std::string_view(buf).substr(p, m.text.size()) == m.text &&
                (!best || m.text.size() > best->text.size()))
              best = &m;
          } else if (!final && std::string_view(m.text).substr(0, avail) == std::string_view(buf).substr(p, avail)) {
            partial = true;
          }
        }
        if (partial) {  // might still become a (longer) marker: hold back from p
          text(std::string_view(buf).substr(emit_from, p - emit_from));
          buf.erase(0, p);
          return;
        }
        if (best) {
          text(std::string_view(buf).substr(emit_from, p - emit_from));
          act(best->act);
          pos = p + best->text.size();
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
  s_->st = s_->opt.start_in_tool_block ? St::kToolBlock
           : s_->opt.start == ThinkingMode::kThinking ? St::kReasoning
                                                     : St::kContent;
}
OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;

std::vector<ParserEvent> OutputParser::feed(std::string_view delta) {
  s_->out.clear();
  if (s_->st != St::kFinished) {
    s_->buf.append(delta);
    s_->run(false);
  }
  return std::move(s_->out);
}

std::vector<ParserEvent> OutputParser::finish() {
  s_->out.clear();
  if (s_->st != St::kFinished) {
    // Replace any incomplete UTF-8 at the very end, then flush everything held back.
    s_->buf = utf8_lossy(s_->buf);
    s_->run(true);
    // Close an open tool call so its arguments are a complete JSON object.
    switch (s_->st) {
      case St::kParamName: s_->args("\": null"); break;
      case St::kValueStr: s_->args("\""); break;
      case St::kValueRaw: break;
      case St::kToolName:
        s_->begin_call();
        break;
      default: break;
    }
    s_->end_call();
    s_->st = St::kFinished;
  }
  return std::move(s_->out);
}

int OutputParser::tool_call_count() const { return s_->n_calls; }

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

}  // namespace v4::text
