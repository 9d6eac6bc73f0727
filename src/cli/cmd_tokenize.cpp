// `v4serve tokenize` and `v4serve detokenize`: the text layer for humans and scripts.
//   tokenize --tokenizer FILE (--text T | --messages FILE.json [--thinking-mode chat|thinking]
//            [--reasoning-effort E] [--tools FILE.json]) -> {"text": <rendered prompt>, "ids": [...]}
//   detokenize --tokenizer FILE --ids 1,2,3 -> {"text": ...}
// FILE may be a tokenizer.json or a model directory. Errors: one line on stderr, exit code 1.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "server/protocol.h"
#include "text/chat_encoder.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace {

using v4::Result;
using v4::text::Tokenizer;

int fail(const std::string& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  return 1;
}

Result<Tokenizer> load_tokenizer(const std::string& path, const std::string& added) {
  auto t = Tokenizer::from_file(path);
  if (!t.ok()) return t.status();
  if (added == "v4") return t->with_added_tokens(Tokenizer::dsv4_added_tokens());
  if (added != "file")
    return v4::make_error(v4::ErrorCode::kInvalidArgument, "--added-tokens must be 'file' or 'v4', got '{}'", added);
  return t;
}

Result<nlohmann::ordered_json> read_json(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return v4::make_error(v4::ErrorCode::kNotFound, "{}: cannot open {}", what, path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::ordered_json::parse(ss.str());
  } catch (const std::exception& e) {
    return v4::make_error(v4::ErrorCode::kInvalidArgument, "{}: {} is not valid JSON: {}", what, path, e.what());
  }
}

struct TokenizeArgs {
  std::string tokenizer, text, messages, tools, thinking_mode = "thinking", effort, added = "file",
      profile = "preview";
  bool have_text = false, add_special = false, no_bos = false;
};

int run_tokenize(const TokenizeArgs& a) {
  auto tok = load_tokenizer(a.tokenizer, a.added);
  if (!tok.ok()) return fail(tok.status().message());
  nlohmann::ordered_json out;
  if (a.have_text == !a.messages.empty()) return fail("give exactly one of --text or --messages");
  if (a.have_text) {
    std::string text = v4::text::utf8_lossy(a.text);
    out["text"] = text;
    out["ids"] = tok->encode(text, a.add_special);
  } else {
    auto m = read_json(a.messages, "--messages");
    if (!m.ok()) return fail(m.status().message());
    nlohmann::ordered_json messages = *m, tools;
    if (messages.is_object()) {  // an OpenAI request body: {"messages": [...], "tools": [...]}
      if (!messages.contains("messages")) return fail("--messages: " + a.messages + ": object has no 'messages' field");
      if (messages.contains("tools")) tools = messages["tools"];
      messages = nlohmann::ordered_json(messages["messages"]);
    }
    if (!messages.is_array()) return fail("--messages: " + a.messages + ": 'messages' must be a JSON array");
    // Content as the chat endpoint takes it (the encoder follows the reference, which renders a
    // missing content as empty): required unless an assistant message has tool_calls, or a tool
    // result.
    for (size_t i = 0; i < messages.size(); ++i)
      if (std::string e = v4::server::chat_message_content_error(
              messages[i], "messages[" + std::to_string(i) + "]");
          !e.empty())
        return fail(a.messages + ": " + e);
    if (!a.tools.empty()) {
      auto t = read_json(a.tools, "--tools");
      if (!t.ok()) return fail(t.status().message());
      if (!t->is_array()) return fail("--tools: " + a.tools + ": must be a JSON array of tools");
      tools = *t;
    }
    v4::text::ChatOptions opt;
    auto mode = v4::text::parse_thinking_mode(a.thinking_mode);
    if (!mode.ok()) return fail("--thinking-mode: " + mode.status().message());
    opt.thinking_mode = *mode;
    if (!a.effort.empty()) opt.reasoning_effort = a.effort;
    if (a.profile == "0731") opt.effort_profile = v4::text::EffortProfile::k0731;
    else if (a.profile != "preview") return fail("--effort-profile must be 'preview' or '0731'");
    opt.add_bos = !a.no_bos;
    auto prompt = v4::text::ChatEncoder::render(v4::text::ChatEncoder::attach_tools(messages, tools), opt);
    if (!prompt.ok()) return fail(a.messages + ": " + prompt.status().message());
    out["text"] = *prompt;
    out["ids"] = tok->encode(*prompt, false);
  }
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
  return 0;
}

struct DetokenizeArgs {
  std::string tokenizer, ids, added = "file";
  bool skip_special = false, raw = false;
};

int run_detokenize(const DetokenizeArgs& a) {
  auto tok = load_tokenizer(a.tokenizer, a.added);
  if (!tok.ok()) return fail(tok.status().message());
  std::vector<v4::text::TokenId> ids;
  std::stringstream ss(a.ids);
  std::string item;
  int k = 0;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    std::string s = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    char* end = nullptr;
    long v = s.empty() ? -1 : std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < 0 || static_cast<size_t>(v) >= tok->vocab_size() || !tok->id_to_token(v))
      return fail("--ids: item " + std::to_string(k) + " '" + s + "' is not a token id of " + a.tokenizer +
                  " (0.." + std::to_string(tok->vocab_size() - 1) + ")");
    ids.push_back(static_cast<v4::text::TokenId>(v));
    ++k;
  }
  std::string text = tok->decode(ids, a.skip_special);
  if (a.raw) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
  } else {
    nlohmann::ordered_json out;
    out["text"] = text;
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

}  // namespace

V4_REGISTER_COMMAND(tokenize, "tokenize", "render chat messages / text to token ids (JSON out)",
                    [](CLI::App& app) {
                      auto a = std::make_shared<TokenizeArgs>();
                      app.add_option("--tokenizer", a->tokenizer, "tokenizer.json or model directory")->required();
                      app.add_option("--text", a->text, "plain text to encode")
                          ->each([a](const std::string&) { a->have_text = true; });
                      app.add_option("--messages", a->messages,
                                     "JSON file: messages array or {\"messages\", \"tools\"} request body");
                      app.add_option("--thinking-mode", a->thinking_mode, "chat or thinking (default thinking)");
                      app.add_option("--reasoning-effort", a->effort, "preview: high|max; 0731: low|high|max");
                      app.add_option("--effort-profile", a->profile, "preview (default) or 0731");
                      app.add_option("--tools", a->tools, "JSON file with the request's tools array");
                      app.add_option("--added-tokens", a->added,
                                     "file (default: the tokenizer.json's table) or v4 (DeepSeek-V4 table)");
                      app.add_flag("--add-special-tokens", a->add_special, "--text: apply the post-processor");
                      app.add_flag("--no-bos", a->no_bos, "--messages: do not prepend BOS");
                      return std::function<int()>([a] { return run_tokenize(*a); });
                    });

V4_REGISTER_COMMAND(detokenize, "detokenize", "decode token ids to text (JSON out)", [](CLI::App& app) {
  auto a = std::make_shared<DetokenizeArgs>();
  app.add_option("--tokenizer", a->tokenizer, "tokenizer.json or model directory")->required();
  app.add_option("--ids", a->ids, "comma-separated ids, e.g. 1,2,3")->required();
  app.add_option("--added-tokens", a->added, "file (default) or v4");
  app.add_flag("--skip-special-tokens", a->skip_special, "drop special tokens (BOS/EOS/...)");
  app.add_flag("--raw", a->raw, "print the text itself instead of JSON");
  return std::function<int()>([a] { return run_detokenize(*a); });
});
