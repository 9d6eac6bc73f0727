// `v4serve tokenize` / `detokenize` end to end (skipped when the binary is not built).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <atomic>
#include <thread>
#include <unistd.h>

#include "text/tokenizer.h"
#include "text_test_paths.h"

namespace {
const std::string kTok = v4test::dsv3_tokenizer_dir();

struct CmdResult {
  int rc;
  std::string out;
};

CmdResult run(const std::string& args) {
  std::string cmd = std::string(V4_BINARY) + " " + args + " 2>&1";
  CmdResult r{-1, ""};
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
    int st = pclose(p);
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  return r;
}

#define REQUIRE_CLI()                                                                   \
  if (!std::filesystem::exists(V4_BINARY) || kTok.empty()) \
  GTEST_SKIP() << "v4serve or tokenizer not available"

// Temp files, removed at exit.
struct TempFiles {
  std::vector<std::filesystem::path> paths;
  ~TempFiles() {
    std::error_code ec;
    for (auto& p : paths) std::filesystem::remove(p, ec);
  }
};
TempFiles g_temp_files;

std::string tmp_file(const std::string& name, const std::string& text) {
  auto p = std::filesystem::temp_directory_path() / ("v4text_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  g_temp_files.paths.push_back(p);
  return p.string();
}
}  // namespace

TEST(CliTokenize, TextAndMessages) {
  REQUIRE_CLI();
  auto r = run("tokenize --tokenizer " + kTok + " --text 'Hello'");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["text"], "Hello");
  EXPECT_EQ(j["ids"], nlohmann::json::array({19923}));

  std::string m = tmp_file("m.json", R"([{"role":"user","content":"hi"}])");
  r = run("tokenize --tokenizer " + kTok + "/tokenizer.json --messages " + m + " --added-tokens v4");
  ASSERT_EQ(r.rc, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["text"], "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>");
  EXPECT_EQ(j["ids"], nlohmann::json::array({0, 128803, 6366, 128804, 128821}));

  std::string tools = tmp_file("t.json", R"([{"type":"function","function":{"name":"ping"}}])");
  r = run("tokenize --tokenizer " + kTok + " --messages " + m + " --thinking-mode chat --tools " + tools);
  ASSERT_EQ(r.rc, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["text"].get<std::string>().find("{\"name\": \"ping\"}"), std::string::npos);
  EXPECT_EQ(j["text"].get<std::string>().substr(j["text"].get<std::string>().size() - 8), "</think>");
}

TEST(CliTokenize, RequestBodyAndOfficialFixture) {
  REQUIRE_CLI();
  // An OpenAI-style body with request-level tools; effort max in thinking mode.
  std::string body = tmp_file("body.json", R"({"messages":[{"role":"user","content":"hi"}],
      "tools":[{"type":"function","function":{"name":"ping","parameters":{"type":"object"}}}]})");
  auto r = run("tokenize --tokenizer " + kTok + " --messages " + body + " --reasoning-effort max --added-tokens v4");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  std::string text = j["text"];
  EXPECT_EQ(text.rfind("<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum", 0), 0u);
  EXPECT_NE(text.find("\n\n\n\n## Tools"), std::string::npos);
  EXPECT_EQ(j["ids"][0], 0);
  EXPECT_EQ(j["ids"].back(), 128821);  // <think>
  // DeepSeek's fixture 1 ({"tools", "messages"}) renders byte-exact through the CLI too.
  std::string ref = v4test::ref_dir() + "/encoding-goldens/";
  if (std::filesystem::exists(ref + "test_input_1.json")) {
    r = run("tokenize --tokenizer " + kTok + " --messages " + ref + "test_input_1.json");
    ASSERT_EQ(r.rc, 0) << r.out;
    std::ifstream f(ref + "test_output_1.txt", std::ios::binary);
    std::string want((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(nlohmann::json::parse(r.out)["text"], want);
  }
}

TEST(CliTokenize, DetokenizeRoundTrip) {
  REQUIRE_CLI();
  auto r = run("detokenize --tokenizer " + kTok + " --ids 19923,223,128803");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["text"], "Hello <｜User｜>");
  r = run("detokenize --tokenizer " + kTok + " --ids 0,19923,1 --skip-special-tokens --raw");
  ASSERT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "Hello\n");
}

TEST(CliTokenize, BadInputIsOneLineErrorNamingTheField) {
  REQUIRE_CLI();
  auto one_line = [](const CmdResult& r) { return std::count(r.out.begin(), r.out.end(), '\n') == 1; };
  auto r = run("tokenize --tokenizer /nonexistent --text x");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("/nonexistent"), std::string::npos) << r.out;
  EXPECT_TRUE(one_line(r)) << r.out;
  std::string bad = tmp_file("bad.json", R"([{"role":"user","content":"x"},{"role":"function","content":"y"}])");
  r = run("tokenize --tokenizer " + kTok + " --messages " + bad);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("messages[1].role"), std::string::npos) << r.out;
  EXPECT_TRUE(one_line(r)) << r.out;
  // A role that is not a string is named as such (it was quoted as the string '5').
  std::string num = tmp_file("num.json", R"([{"role":5,"content":"x"}])");
  r = run("tokenize --tokenizer " + kTok + " --messages " + num);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("messages[0].role must be a string, got 5"), std::string::npos) << r.out;
  EXPECT_TRUE(one_line(r)) << r.out;
  std::string broken = tmp_file("broken.json", "[{");
  r = run("tokenize --tokenizer " + kTok + " --messages " + broken);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find(broken), std::string::npos) << r.out;
  r = run("tokenize --tokenizer " + kTok + " --messages " + broken + " --thinking-mode auto");
  EXPECT_NE(r.rc, 0);
  r = run("detokenize --tokenizer " + kTok + " --ids 1,abc");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("--ids"), std::string::npos) << r.out;
  EXPECT_TRUE(one_line(r)) << r.out;
  r = run("detokenize --tokenizer " + kTok + " --ids 99999999");
  EXPECT_NE(r.rc, 0);
}

// --messages takes content as the chat endpoint does (server::chat_message_content_error): a
// message without "content" (and, for an assistant, without tool_calls) is a one-line error naming
// the file and the field — it was rendered as if the content were empty. An assistant message
// with tool_calls and a tool result may leave content out, as on the server.
TEST(CliTokenize, MissingContentIsRefusedLikeTheServer) {
  REQUIRE_CLI();
  auto one_line = [](const CmdResult& r) {
    return std::count(r.out.begin(), r.out.end(), '\n') == 1;
  };
  for (const char* bad :
       {R"([{"role":"system","content":"s"},{"role":"user"}])",
        R"([{"role":"user","content":"x"},{"role":"assistant"}])",
        R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[]}]})",
        R"([{"role":"user","content":"x"},{"role":"system","content":null}])"}) {
    std::string f = tmp_file("nocontent.json", bad);
    auto r = run("tokenize --tokenizer " + kTok + " --messages " + f);
    EXPECT_NE(r.rc, 0) << bad << ": " << r.out;
    EXPECT_NE(r.out.find(f + ": "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("messages[1].content' is required"), std::string::npos) << r.out;
    EXPECT_TRUE(one_line(r)) << r.out;
  }
  std::string ok = tmp_file("toolcalls.json", R"([{"role":"user","content":"w?"},
      {"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"c1"}])");
  auto r = run("tokenize --tokenizer " + kTok + " --messages " + ok);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(nlohmann::json::parse(r.out)["text"].get<std::string>().find("get_weather"),
            std::string::npos);
}

TEST(Tokenizer, ConcurrentEncodeIsDeterministic) {
  if (kTok.empty()) GTEST_SKIP();
  auto t = v4::text::Tokenizer::from_file(kTok);
  ASSERT_TRUE(t.ok());
  std::string text;
  for (int i = 0; i < 200; ++i) text += "Line " + std::to_string(i) + ": the quick brown fox 你好 🦊 <｜User｜>\n";
  auto want = t->encode(text);
  std::vector<std::thread> th;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&] {
      for (int r = 0; r < 5; ++r)
        if (t->encode(text) != want) ++bad;
    });
  for (auto& x : th) x.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(t->decode(want), text);
}
