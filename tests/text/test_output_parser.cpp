// OutputParser vs the reference decoder's goldens; every record re-fed split at every byte
// boundary, byte by byte, and in tokenizer-token chunks must give the same result.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "text_test_paths.h"

using v4::text::OutputParser;
using v4::text::OutputParserOptions;
using v4::text::ParsedMessage;
using v4::text::ParserEvent;
using v4::text::ThinkingMode;

namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Golden {
  std::string name, completion;
  ThinkingMode mode;
  bool has_expected;
  nlohmann::json expected;
};

std::vector<Golden> goldens() {
  std::vector<Golden> v;
  std::string text = slurp(v4test::ref_dir() + "/parse-goldens.jsonl");
  size_t s = 0;
  while (s < text.size()) {
    size_t e = text.find('\n', s);
    if (e == std::string::npos) e = text.size();
    if (e > s) {
      auto j = nlohmann::json::parse(text.substr(s, e - s));
      v.push_back({j["name"], j["completion"], j["thinking_mode"] == "thinking" ? ThinkingMode::kThinking : ThinkingMode::kChat,
                   j.contains("expected"), j.value("expected", nlohmann::json())});
    }
    s = e + 1;
  }
  return v;
}

// Feeds `chunks` and folds the events; also checks event well-formedness.
ParsedMessage run_chunks(const std::vector<std::string>& chunks, ThinkingMode mode, bool v41 = false) {
  OutputParserOptions o;
  o.start = mode;
  o.accept_v41_spelling = v41;
  OutputParser p(o);
  ParsedMessage m;
  int open = -1;
  auto check = [&](const std::vector<ParserEvent>& evs) {
    for (auto& e : evs) {
      EXPECT_EQ(v4::text::utf8_lossy(e.text), e.text) << "event text splits a UTF-8 character";
      if (e.kind == ParserEvent::Kind::kToolCallBegin) {
        EXPECT_EQ(open, -1);
        open = e.index;
        EXPECT_FALSE(e.id.empty());
      } else if (e.kind == ParserEvent::Kind::kToolCallArgs) {
        EXPECT_EQ(e.index, open);
      } else if (e.kind == ParserEvent::Kind::kToolCallEnd) {
        EXPECT_EQ(e.index, open);
        open = -1;
      }
    }
    OutputParser::apply(evs, m);
  };
  for (auto& c : chunks) check(p.feed(c));
  check(p.finish());
  EXPECT_EQ(open, -1);
  return m;
}

std::string describe(const ParsedMessage& m) {
  nlohmann::json j;
  j["content"] = m.content;
  j["reasoning_content"] = m.reasoning_content;
  j["tool_calls"] = nlohmann::json::array();
  for (auto& t : m.tool_calls) j["tool_calls"].push_back({{"name", t.name}, {"arguments", t.arguments}});
  return j.dump();
}

void expect_no_markup(const ParsedMessage& m, const std::string& name) {
  for (const char* mk : {"｜DSML｜", "</think>", "<think>", "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>"}) {
    EXPECT_EQ(m.content.find(mk), std::string::npos) << name << " content has " << mk;
    EXPECT_EQ(m.reasoning_content.find(mk), std::string::npos) << name << " reasoning has " << mk;
  }
}

}  // namespace

TEST(OutputParser, WholeOutputEqualsReferenceOnValidGoldens) {
  auto gs = goldens();
  if (gs.empty()) GTEST_SKIP() << "parse goldens missing";
  int n = 0;
  for (auto& g : gs) {
    if (!g.has_expected) continue;
    OutputParserOptions o;
    o.start = g.mode;
    o.drop_tokens.clear();  // the reference keeps template tokens (e.g. <｜User｜>) in content
    ParsedMessage m = OutputParser::parse(g.completion, o);
    EXPECT_EQ(m.content, g.expected["content"].get<std::string>()) << g.name;
    EXPECT_EQ(m.reasoning_content, g.expected["reasoning_content"].get<std::string>()) << g.name;
    ASSERT_EQ(m.tool_calls.size(), g.expected["tool_calls"].size()) << g.name;
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      EXPECT_EQ(m.tool_calls[i].name, g.expected["tool_calls"][i]["function"]["name"].get<std::string>()) << g.name;
      EXPECT_EQ(m.tool_calls[i].arguments, g.expected["tool_calls"][i]["function"]["arguments"].get<std::string>())
          << g.name;
    }
    ++n;
  }
  EXPECT_EQ(n, 20);
}

TEST(OutputParser, RejectedGoldensRecoverWithoutMarkup) {
  for (auto& g : goldens()) {
    if (g.has_expected) continue;
    OutputParserOptions o;
    o.start = g.mode;
    ParsedMessage m = OutputParser::parse(g.completion, o);
    expect_no_markup(m, g.name);
    for (auto& t : m.tool_calls) EXPECT_FALSE(t.name.empty()) << g.name;
  }
}

TEST(OutputParser, EverySplitGivesSameResult) {
  for (auto& g : goldens()) {
    std::string want = describe(run_chunks({g.completion}, g.mode));
    const std::string& c = g.completion;
    for (size_t k = 0; k <= c.size(); ++k) {
      std::string got = describe(run_chunks({c.substr(0, k), c.substr(k)}, g.mode));
      ASSERT_EQ(got, want) << g.name << " split at byte " << k;
    }
    std::vector<std::string> bytes;
    for (char ch : c) bytes.emplace_back(1, ch);
    EXPECT_EQ(describe(run_chunks(bytes, g.mode)), want) << g.name << " byte by byte";
    // three-way splits at a stride
    for (size_t a = 0; a < c.size(); a += 7)
      for (size_t b = a; b < c.size(); b += 11)
        ASSERT_EQ(describe(run_chunks({c.substr(0, a), c.substr(a, b - a), c.substr(b)}, g.mode)), want)
            << g.name << " split at " << a << "," << b;
    expect_no_markup(run_chunks(bytes, g.mode), g.name);
  }
}

TEST(OutputParser, TokenChunksThroughDetokenizer) {
  if (v4test::dsv3_tokenizer_dir().empty()) GTEST_SKIP() << "tokenizer missing";
  auto tok = v4::text::Tokenizer::from_file(v4test::dsv3_tokenizer_dir());
  if (!tok.ok()) GTEST_SKIP() << "tokenizer missing";
  auto v4tok = tok->with_added_tokens(v4::text::Tokenizer::dsv4_added_tokens());
  ASSERT_TRUE(v4tok.ok());
  for (auto& g : goldens()) {
    std::string want = describe(run_chunks({g.completion}, g.mode));
    auto ids = v4tok->encode(g.completion);
    v4::text::Detokenizer d(*v4tok);
    std::vector<std::string> chunks;
    for (auto id : ids) chunks.push_back(d.push(id));
    chunks.push_back(d.finish());
    EXPECT_EQ(describe(run_chunks(chunks, g.mode)), want) << g.name;
  }
}

TEST(OutputParser, StreamingEventsShape) {
  OutputParserOptions o;
  o.start = ThinkingMode::kThinking;
  o.id_seed = 42;
  OutputParser p(o);
  std::vector<ParserEvent> all;
  for (std::string_view c : {"Hmm</th", "ink>Hi\n", "\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜param",
                             "eter name=\"x\" string=\"false\">4", "2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"}) {
    auto ev = p.feed(c);
    all.insert(all.end(), ev.begin(), ev.end());
  }
  auto ev = p.finish();
  all.insert(all.end(), ev.begin(), ev.end());
  ASSERT_GE(all.size(), 5u);
  EXPECT_EQ(all[0].kind, ParserEvent::Kind::kReasoningDelta);
  EXPECT_EQ(all[0].text, "Hmm");
  EXPECT_EQ(all[1].kind, ParserEvent::Kind::kContentDelta);
  EXPECT_EQ(all[1].text, "Hi");
  EXPECT_EQ(all[2].kind, ParserEvent::Kind::kToolCallBegin);
  EXPECT_EQ(all[2].name, "f");
  EXPECT_EQ(all[2].index, 0);
  EXPECT_EQ(all[2].id.rfind("call_", 0), 0u);
  std::string args;
  for (auto& e : all)
    if (e.kind == ParserEvent::Kind::kToolCallArgs) args += e.text;
  EXPECT_EQ(args, "{\"x\": 42}");
  EXPECT_EQ(all.back().kind, ParserEvent::Kind::kToolCallEnd);
  EXPECT_EQ(p.tool_call_count(), 1);
}

// ignore_eos requests generate past EOS: with eos_ends_output = false the EOS text is dropped and
// the text after it stays (content, and reasoning in thinking mode); by default it ends the output.
TEST(OutputParser, EosDroppedWhenGenerationIgnoresIt) {
  OutputParserOptions o;
  o.start = ThinkingMode::kChat;
  EXPECT_EQ(OutputParser::parse("One.<｜end▁of▁sentence｜>Two.", o).content, "One.");
  o.eos_ends_output = false;
  EXPECT_EQ(OutputParser::parse("One.<｜end▁of▁sentence｜>Two.<｜end▁of▁sentence｜>", o).content,
            "One.Two.");
  // Split inside the marker while streaming: same result, the marker never leaks.
  OutputParser p(o);
  std::string content;
  for (std::string_view c : {"One.<｜end▁of", "▁sentence｜>Tw", "o."}) {
    for (const ParserEvent& e : p.feed(c))
      if (e.kind == ParserEvent::Kind::kContentDelta) content += e.text;
  }
  for (const ParserEvent& e : p.finish())
    if (e.kind == ParserEvent::Kind::kContentDelta) content += e.text;
  EXPECT_EQ(content, "One.Two.");
  o.start = ThinkingMode::kThinking;
  const ParsedMessage m = OutputParser::parse("a<｜end▁of▁sentence｜>b</think>c", o);
  EXPECT_EQ(m.reasoning_content, "ab");
  EXPECT_EQ(m.content, "c");
}

TEST(OutputParser, HeldBackTextIsReleasedAtFinish) {
  OutputParserOptions o;
  o.start = ThinkingMode::kChat;
  ParsedMessage m = OutputParser::parse("x = 2 <", o);
  EXPECT_EQ(m.content, "x = 2 <");
  m = OutputParser::parse("a\n\n", o);
  EXPECT_EQ(m.content, "a\n\n");
  m = OutputParser::parse("Sure.\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"g\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", o);
  EXPECT_EQ(m.content, "Sure.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{}");
  // truncated inside a string value: arguments are closed into valid JSON
  m = OutputParser::parse("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"q\" string=\"true\">Bei", o);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"q\": \"Bei\"}");
  EXPECT_TRUE(m.truncated);
}

TEST(OutputParser, V41SpellingAlsoParses) {
  const std::string c =
      "r</think>ok\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"x\" string=\"true\">v"
      "</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"g\">\n<｜DSML｜ parameter name=\"n\" "
      "string=\"false\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>";
  for (size_t k = 0; k <= c.size(); ++k) {
    ParsedMessage m = run_chunks({c.substr(0, k), c.substr(k)}, ThinkingMode::kThinking, /*v41=*/true);
    ASSERT_EQ(m.reasoning_content, "r");
    ASSERT_EQ(m.content, "ok");
    ASSERT_EQ(m.tool_calls.size(), 2u) << k;
    EXPECT_EQ(m.tool_calls[0].name, "f");
    EXPECT_EQ(m.tool_calls[0].arguments, "{\"x\": \"v\"}");
    EXPECT_EQ(m.tool_calls[1].name, "g");
    EXPECT_EQ(m.tool_calls[1].arguments, "{\"n\": 2}");
  }
}

TEST(OutputParser, StrictParserEqualsReferenceIncludingRejections) {
  if (goldens().empty()) GTEST_SKIP() << "parse goldens missing";
  int ok = 0, rejected = 0;
  for (auto& g : goldens()) {
    auto r = OutputParser::parse_strict(g.completion, g.mode);
    if (!g.has_expected) {
      EXPECT_FALSE(r.ok()) << g.name << " should be rejected";
      ++rejected;
      continue;
    }
    ASSERT_TRUE(r.ok()) << g.name << ": " << r.status().to_string();
    EXPECT_EQ(r->content, g.expected["content"].get<std::string>()) << g.name;
    EXPECT_EQ(r->reasoning_content, g.expected["reasoning_content"].get<std::string>()) << g.name;
    ASSERT_EQ(r->tool_calls.size(), g.expected["tool_calls"].size()) << g.name;
    for (size_t i = 0; i < r->tool_calls.size(); ++i) {
      EXPECT_EQ(r->tool_calls[i].name, g.expected["tool_calls"][i]["function"]["name"].get<std::string>()) << g.name;
      EXPECT_EQ(r->tool_calls[i].arguments, g.expected["tool_calls"][i]["function"]["arguments"].get<std::string>())
          << g.name;
    }
    ++ok;
  }
  EXPECT_EQ(ok, 20);
  EXPECT_EQ(rejected, 14);
}

// Property: wherever the strict reference decoder accepts a text, the tolerant streaming parser
// gives the same content, reasoning and tool calls; and on every variant (accepted or not) the
// result does not depend on how the text is chunked. Inputs: the goldens with random edits made of
// format fragments (deterministic seed). (No "no markup" check here: dropping a stray marker can
// splice marker-looking text out of fragments, e.g. "<｜e<think>nd▁of▁sentence｜>".)
TEST(OutputParser, TolerantEqualsStrictWhereverStrictAccepts) {
  if (goldens().empty()) GTEST_SKIP() << "parse goldens missing";
  const std::vector<std::string> frags = {"\n", "\n\n", "<", ">", "\"", " ", "x", "é", "</think>", "<think>",
                                          "｜DSML｜", "<｜DSML｜tool_calls>\n", "</｜DSML｜tool_calls>",
                                          "<｜DSML｜invoke name=\"f\">\n", "</｜DSML｜invoke>\n",
                                          "<｜DSML｜parameter name=\"k\" string=\"true\">", "</｜DSML｜parameter>\n",
                                          " string=\"false\">", "<｜end▁of▁sentence｜>", "<\n", "/｜DSML｜parameter",
                                          "\">\n", "name=\"", "\t", "<｜DSML｜", "</｜DSML｜", "<｜begin▁of▁sentence｜>"};
  uint64_t rng = std::getenv("V4_FUZZ_SEED") ? std::strtoull(std::getenv("V4_FUZZ_SEED"), nullptr, 10) : 12345;
  const int per_golden = std::getenv("V4_FUZZ_N") ? std::atoi(std::getenv("V4_FUZZ_N")) : 600;
  auto next = [&] {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<size_t>(rng >> 33);
  };
  int accepted = 0, total = 0;
  for (auto& g : goldens()) {
    for (int v = 0; v < per_golden; ++v) {
      std::string c = g.completion;
      int edits = 1 + static_cast<int>(next() % 3);
      for (int e = 0; e < edits; ++e) {
        size_t pos = next() % (c.size() + 1);
        while (pos < c.size() && (static_cast<unsigned char>(c[pos]) & 0xC0) == 0x80) ++pos;  // char boundary
        if (next() % 3 == 0 && pos < c.size()) {
          size_t len = 1 + next() % 8;
          size_t end = std::min(c.size(), pos + len);
          while (end < c.size() && (static_cast<unsigned char>(c[end]) & 0xC0) == 0x80) ++end;
          c.erase(pos, end - pos);
        } else {
          c.insert(pos, frags[next() % frags.size()]);
        }
      }
      ++total;
      auto strict = OutputParser::parse_strict(c, g.mode);
      OutputParserOptions o;
      o.start = g.mode;
      ParsedMessage tol = OutputParser::parse(c, o);
      // Split invariance holds for malformed text too.
      size_t k = next() % (c.size() + 1);
      ASSERT_EQ(describe(run_chunks({c.substr(0, k), c.substr(k)}, g.mode)), describe(tol))
          << g.name << " variant split at " << k << ": " << nlohmann::json(c).dump();
      if (v % 10 == 0) {
        std::vector<std::string> bytes;
        for (char ch : c) bytes.emplace_back(1, ch);
        ASSERT_EQ(describe(run_chunks(bytes, g.mode)), describe(tol)) << nlohmann::json(c).dump();
      }
      if (!strict.ok()) continue;
      ++accepted;
      o.drop_tokens.clear();  // reference semantics: template tokens stay in content
      ASSERT_EQ(describe(OutputParser::parse(c, o)), describe(*strict))
          << g.name << " variant: " << nlohmann::json(c).dump();
    }
  }
  EXPECT_GT(accepted, total / 40) << "of " << total;
  std::printf("strict accepted %d of %d variants\n", accepted, total);
}

// Template special tokens (`<｜Assistant｜>`, `<｜User｜>`, ...) a model writes by mistake never
// reach content or reasoning — at any chunking — while tool calls still parse and argument values
// keep what the model wrote.
TEST(OutputParser, TemplateSpecialTokensAreDroppedFromContentAndReasoning) {
  const std::string c =
      "Let<｜Assistant｜> me<｜User｜> think<｜▁pad▁｜></think><｜Assistant｜>Hello<|EOT|> world"
      "<｜latest_reminder｜>!\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
      "<｜DSML｜parameter name=\"k\" string=\"true\">a<｜User｜>b</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>after<｜Assistant｜>";
  OutputParserOptions o;
  o.start = ThinkingMode::kThinking;
  ParsedMessage m = OutputParser::parse(c, o);
  EXPECT_EQ(m.reasoning_content, "Let me think");
  EXPECT_EQ(m.content, "Hello world!after");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "f");
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"k\": \"a<｜User｜>b\"}");
  const std::string want = describe(m);
  std::vector<std::string> bytes;
  for (char ch : c) bytes.emplace_back(1, ch);
  EXPECT_EQ(describe(run_chunks(bytes, ThinkingMode::kThinking)), want);
  for (size_t k = 0; k <= c.size(); ++k)
    ASSERT_EQ(describe(run_chunks({c.substr(0, k), c.substr(k)}, ThinkingMode::kThinking)), want) << k;
  // Chat mode: the stray generation header right at the start of the output.
  o.start = ThinkingMode::kChat;
  EXPECT_EQ(OutputParser::parse("<｜Assistant｜>Hi<｜User｜>", o).content, "Hi");
  // A partial token at the very end is released at finish (it is not a token).
  EXPECT_EQ(OutputParser::parse("Hi <｜Assist", o).content, "Hi <｜Assist");
  // An empty list keeps them (what the reference decoder does).
  o.drop_tokens.clear();
  EXPECT_EQ(OutputParser::parse("<｜Assistant｜>Hi", o).content, "<｜Assistant｜>Hi");
}

TEST(OutputParser, TemplateSpecialTokensIncludeTheTokenizersMarkup) {
  auto builtin = v4::text::template_special_tokens();
  auto has = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  EXPECT_TRUE(has(builtin, "<｜Assistant｜>"));
  EXPECT_TRUE(has(builtin, "<｜User｜>"));
  EXPECT_FALSE(has(builtin, "<｜end▁of▁sentence｜>"));  // has its own rule (end of content)
  EXPECT_FALSE(has(builtin, "<think>"));
  if (v4test::dsv3_tokenizer_dir().empty()) GTEST_SKIP() << "tokenizer missing";
  auto tok = v4::text::Tokenizer::from_file(v4test::dsv3_tokenizer_dir());
  if (!tok.ok()) GTEST_SKIP() << "tokenizer missing";
  auto v4tok = tok->with_added_tokens(v4::text::Tokenizer::dsv4_added_tokens());
  ASSERT_TRUE(v4tok.ok());
  auto all = v4::text::template_special_tokens(&*v4tok);
  EXPECT_TRUE(has(all, "<｜place▁holder▁no▁5｜>"));
  EXPECT_FALSE(has(all, "<｜begin▁of▁sentence｜>"));
  EXPECT_FALSE(has(all, "｜DSML｜"));
  OutputParserOptions o;
  o.start = ThinkingMode::kChat;
  o.drop_tokens = all;
  EXPECT_EQ(OutputParser::parse("a<｜place▁holder▁no▁5｜>b", o).content, "ab");
}

// Prose written inside an invoke, between its parameters (where the reference raises), is content
// (prose right after the invoke head is read as part of the head, as the reference reads it)
// — never dropped — at any split; the parameters around it still parse, and the `<｜DSML｜` of a
// parameter opener is not taken for prose. Also when the parser starts inside a pre-filled call
// (tool_choice naming a function): prose instead of parameters is content, the call closes as {}.
TEST(OutputParser, ProseInsideAnInvokeIsContent) {
  const std::string c =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
      "<｜DSML｜parameter name=\"x\" string=\"true\">v</｜DSML｜parameter>\nLet me think.\n"
      "<｜DSML｜parameter name=\"y\" string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
  for (size_t k = 0; k <= c.size(); ++k) {
    ParsedMessage m = run_chunks({c.substr(0, k), c.substr(k)}, ThinkingMode::kChat);
    ASSERT_EQ(m.content, "Let me think.\n") << k;
    ASSERT_EQ(m.tool_calls.size(), 1u) << k;
    EXPECT_EQ(m.tool_calls[0].arguments, "{\"x\": \"v\", \"y\": 2}") << k;
  }
  OutputParserOptions o;
  o.start = ThinkingMode::kChat;
  o.start_in_tool_block = true;
  o.start_tool_name = "get_weather";
  const std::string prose = "I cannot look that up.<｜end▁of▁sentence｜>";
  for (size_t k = 0; k <= prose.size(); ++k) {
    OutputParser p(o);
    ParsedMessage m;
    OutputParser::apply(p.feed(prose.substr(0, k)), m);
    OutputParser::apply(p.feed(prose.substr(k)), m);
    OutputParser::apply(p.finish(), m);
    ASSERT_EQ(m.content, "I cannot look that up.") << k;
    ASSERT_EQ(m.tool_calls.size(), 1u);
    EXPECT_EQ(m.tool_calls[0].name, "get_weather");
    EXPECT_EQ(m.tool_calls[0].arguments, "{}");
  }
}
