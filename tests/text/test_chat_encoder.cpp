// ChatEncoder byte-exact against DeepSeek's reference encoder (official fixtures + chat-goldens).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "text/chat_encoder.h"
#include "text/py_json.h"
#include "text_test_paths.h"

using nlohmann::ordered_json;
using v4::text::ChatEncoder;
using v4::text::ChatOptions;
using v4::text::ThinkingMode;

namespace {
const std::string kRef = v4test::ref_dir();

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> lines(const std::string& text) {  // split on \n only (U+2028 stays)
  std::vector<std::string> out;
  size_t s = 0;
  while (s < text.size()) {
    size_t e = text.find('\n', s);
    if (e == std::string::npos) e = text.size();
    if (e > s) out.push_back(text.substr(s, e - s));
    s = e + 1;
  }
  return out;
}
}  // namespace

TEST(ChatEncoder, OfficialFixtures) {
  if (slurp(kRef + "/encoding-goldens/test_input_1.json").empty()) GTEST_SKIP() << "goldens missing";
  for (int i = 1; i <= 4; ++i) {
    ordered_json in = ordered_json::parse(slurp(kRef + "/encoding-goldens/test_input_" + std::to_string(i) + ".json"));
    ordered_json messages = in;
    if (in.is_object()) {
      messages = in["messages"];
      messages[0]["tools"] = in["tools"];
    }
    ChatOptions opt;
    opt.thinking_mode = i == 4 ? ThinkingMode::kChat : ThinkingMode::kThinking;
    auto r = ChatEncoder::render(messages, opt);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().to_string();
    EXPECT_EQ(*r, slurp(kRef + "/encoding-goldens/test_output_" + std::to_string(i) + ".txt")) << "fixture " << i;
  }
}

TEST(ChatEncoder, ChatGoldensByteExact) {
  std::string text = slurp(kRef + "/chat-goldens.jsonl");
  if (text.empty()) GTEST_SKIP() << "goldens missing";
  int prompts = 0, errors = 0;
  for (const std::string& line : lines(text)) {
    ordered_json g = ordered_json::parse(line);
    std::string name = g["name"];
    auto mode = v4::text::parse_thinking_mode(g["thinking_mode"].get<std::string>());
    ChatOptions opt;
    if (mode.ok()) opt.thinking_mode = *mode;
    if (!g["reasoning_effort"].is_null()) opt.reasoning_effort = g["reasoning_effort"].get<std::string>();
    opt.drop_thinking = g["drop_thinking"].get<bool>();
    if (g.contains("prompt")) {
      ASSERT_TRUE(mode.ok()) << name;
      auto r = ChatEncoder::render(g["messages"], opt);
      ASSERT_TRUE(r.ok()) << name << ": " << r.status().to_string();
      EXPECT_EQ(*r, g["prompt"].get<std::string>()) << name;
      ++prompts;
    } else {
      bool rejected = !mode.ok() || !ChatEncoder::render(g["messages"], opt).ok();
      EXPECT_TRUE(rejected) << name << " should be rejected (reference: " << g["error"] << ")";
      ++errors;
    }
  }
  EXPECT_GE(prompts, 60);
  EXPECT_GE(errors, 7);
}

TEST(ChatEncoder, AttachToolsInsertsSystemOrReusesFirst) {
  ordered_json tools = ordered_json::parse(R"([{"type":"function","function":{"name":"f"}}])");
  auto a = ChatEncoder::attach_tools(ordered_json::parse(R"([{"role":"user","content":"x"}])"), tools);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0]["role"], "system");
  EXPECT_EQ(a[0]["content"], "");
  auto b = ChatEncoder::attach_tools(ordered_json::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"x"}])"), tools);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0]["tools"], tools);
  auto c = ChatEncoder::attach_tools(ordered_json::parse(R"([{"role":"user","content":"x"}])"), ordered_json());
  EXPECT_EQ(c.size(), 1u);
}

TEST(ChatEncoder, GenerationPromptOptionAndEffortProfiles) {
  auto msgs = ordered_json::parse(R"([{"role":"user","content":"hi"}])");
  ChatOptions opt;
  opt.add_generation_prompt = false;
  EXPECT_EQ(*ChatEncoder::render(msgs, opt), "<｜begin▁of▁sentence｜><｜User｜>hi");
  ChatOptions o2;
  o2.effort_profile = v4::text::EffortProfile::k0731;
  o2.reasoning_effort = "max";
  auto r = ChatEncoder::render(msgs, o2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->rfind("<｜begin▁of▁sentence｜>Reasoning Effort: Beyond maximum", 0), 0u);
  o2.reasoning_effort = "low";
  EXPECT_EQ(*ChatEncoder::render(msgs, o2), "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>");
  ChatOptions o3;
  o3.reasoning_effort = "low";  // preview rejects low
  EXPECT_FALSE(ChatEncoder::render(msgs, o3).ok());
}

TEST(ChatEncoder, ObjectArgumentsDeviationIsOptIn) {
  auto msgs = ordered_json::parse(R"([{"role":"user","content":"x"},{"role":"assistant","content":"","tool_calls":[
      {"id":"c","type":"function","function":{"name":"f","arguments":{"city":"Oslo","n":1.50}}}]}])");
  ChatOptions opt;
  opt.thinking_mode = ThinkingMode::kChat;
  auto ref = ChatEncoder::render(msgs, opt);
  ASSERT_TRUE(ref.ok());
  EXPECT_NE(ref->find("parameter name=\"arguments\" string=\"false\">{\"city\": \"Oslo\", \"n\": 1.5}"), std::string::npos);
  opt.accept_object_arguments = true;
  auto dev = ChatEncoder::render(msgs, opt);
  ASSERT_TRUE(dev.ok());
  EXPECT_NE(dev->find("parameter name=\"city\" string=\"true\">Oslo<"), std::string::npos);
  EXPECT_NE(dev->find("parameter name=\"n\" string=\"false\">1.5<"), std::string::npos);
}

TEST(PyJson, FloatReprAndLoads) {
  using v4::text::pyjson::float_repr;
  EXPECT_EQ(float_repr(0.1), "0.1");
  EXPECT_EQ(float_repr(100.0), "100.0");
  EXPECT_EQ(float_repr(1e22), "1e+22");
  EXPECT_EQ(float_repr(1e16), "1e+16");
  EXPECT_EQ(float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(float_repr(1e-5), "1e-05");
  EXPECT_EQ(float_repr(0.0001), "0.0001");
  EXPECT_EQ(float_repr(-0.0), "-0.0");
  EXPECT_EQ(float_repr(5e-324), "5e-324");
  EXPECT_EQ(float_repr(2.5e-7), "2.5e-07");
  auto v = v4::text::pyjson::loads(R"( {"a": 1, "b": [1E2, -0, "\u00e9\ud83d\ude00"], "a": 2} )");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v4::text::pyjson::dumps(*v), "{\"a\": 2, \"b\": [100.0, 0, \"é😀\"]}");
  EXPECT_FALSE(v4::text::pyjson::loads("{'a': 1}").has_value());
  EXPECT_FALSE(v4::text::pyjson::loads("01").has_value());
  EXPECT_FALSE(v4::text::pyjson::loads("\"a\nb\"").has_value());  // strict: raw control char
  EXPECT_EQ(v4::text::pyjson::dumps(*v4::text::pyjson::loads("123456789012345678901234567890")),
            "123456789012345678901234567890");
}

// An object of many keys loads in linear time (a key index past 16 keys; a linear search per key
// made 200k keys, e.g. in a tool call's client-written arguments string, take tens of seconds),
// with Python's dict semantics kept: a repeated key keeps its first position and takes the last
// value, below and above the index threshold.
TEST(PyJson, ObjectsOfManyKeysLoadInLinearTime) {
  std::string big = "{";
  for (int i = 0; i < 200000; ++i) big += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  big += ",\"k3\":\"x\",\"k100\":\"y\"}";
  const auto t0 = std::chrono::steady_clock::now();
  auto v = v4::text::pyjson::loads(big);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(v.has_value());
  EXPECT_LT(secs, 30.0);  // linear: < 0.4 s Release, < 8 s ASan; the quadratic forms took 40–100+ s
  ASSERT_EQ(v->obj.size(), 200000u);
  EXPECT_EQ(v->obj[3].first, "k3");
  EXPECT_EQ(v->obj[3].second.s, "x");
  EXPECT_EQ(v->obj[100].first, "k100");
  EXPECT_EQ(v->obj[100].second.s, "y");
  EXPECT_EQ(v->obj[199999].second.int_text, "199999");
  EXPECT_EQ(v4::text::pyjson::dumps(*v4::text::pyjson::loads(
                R"({"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17,"a":0,"q":-1})")),
            R"({"a": 0, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "h": 8, "i": 9, "j": 10, "k": 11, "l": 12, "m": 13, "n": 14, "o": 15, "p": 16, "q": -1})");
}

// Rendering is linear in the number of messages: each message used to search backwards for the
// last user turn, so one user message followed by 100k assistant messages (a 4 MB body) took
// minutes before the context-length check could refuse it.
TEST(ChatEncoder, ManyMessagesRenderInLinearTime) {
  ordered_json msgs = ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  for (int i = 0; i < 100000; ++i) msgs.push_back({{"role", "assistant"}, {"content", "a"}});
  ChatOptions opt;
  opt.thinking_mode = ThinkingMode::kThinking;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = ChatEncoder::render(msgs, opt);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_LT(secs, 30.0);  // linear: < 0.4 s Release, < 8 s ASan; the quadratic forms took 40–100+ s
  EXPECT_GT(r->size(), 100000u);
}

TEST(ChatEncoder, DetectEffortProfileFromCheckpointEncoder) {
  namespace fs = std::filesystem;
  fs::path root = fs::path(::testing::TempDir()) / "v4text_effort";
  fs::create_directories(root / "a" / "encoding");
  fs::create_directories(root / "b" / "encoding");
  fs::create_directories(root / "c");
  std::ofstream(root / "a" / "encoding" / "encoding_dsv4.py") << "REASONING_EFFORT_PROMPTS = {\"high\": ...}\n";
  std::ofstream(root / "b" / "encoding" / "encoding_dsv4.py") << "REASONING_EFFORT_MAX = (\"...\")\n";
  EXPECT_EQ(v4::text::detect_effort_profile((root / "a").string()), v4::text::EffortProfile::k0731);
  EXPECT_EQ(v4::text::detect_effort_profile((root / "b").string()), v4::text::EffortProfile::kPreview);
  EXPECT_FALSE(v4::text::detect_effort_profile((root / "c").string()).has_value());
}
