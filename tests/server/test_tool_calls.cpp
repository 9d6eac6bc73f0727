// The output-parser path of the chat endpoint: a scripted executor makes the "model" write a
// given text (reasoning, content, a DSML tool call); the server must return reasoning_content,
// content and tool_calls with finish_reason "tool_calls", streaming and not.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <map>

#include "engine/engine.h"
#include "server/http_server.h"
#include "server/openai_api.h"

using namespace v4;
using namespace v4::server;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;

namespace {

constexpr int32_t kEos = 256;
constexpr int64_t kVocab = 257;

std::string byte_char(int b) {
  auto direct = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255); };
  int cp = b;
  if (!direct(b)) {
    int n = 0;
    for (int x = 0; x < b; ++x) n += direct(x) ? 0 : 1;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

text::Tokenizer byte_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  vocab["<｜end▁of▁sentence｜>"] = kEos;
  json tj = {{"added_tokens", json::array({{{"id", kEos}, {"content", "<｜end▁of▁sentence｜>"}, {"special", true},
                                            {"normalized", false}, {"lstrip", false}, {"rstrip", false},
                                            {"single_word", false}}})},
             {"normalizer", nullptr},
             {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
             {"post_processor", nullptr},
             {"decoder", {{"type", "ByteLevel"}}},
             {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  return *text::Tokenizer::from_json_text(tj.dump(), "byte-tokenizer");
}

// Writes `script` (byte tokens) then EOS: the next token continues the longest suffix of the
// sequence that is a prefix of the script (so it works under any batching).
class ScriptExecutor : public engine::Executor {
 public:
  explicit ScriptExecutor(std::vector<int32_t> script) : script_(std::move(script)) {}
  int64_t vocab_size() const override { return kVocab; }
  int64_t max_context() const override { return 4096; }
  std::vector<engine::PoolSpec> pools() const override { return {{"kv", 100000, 1}}; }
  std::vector<int64_t> pages_for(int64_t n) const override { return {n}; }
  std::vector<engine::PoolUsage> pool_usage() const override {
    int64_t used = 0;
    for (auto& [k, v] : seqs_) used += int64_t(v.size());
    return {{"kv", used, 100000}};
  }
  Result<int32_t> create_sequence() override {
    seqs_[next_] = {};
    return next_++;
  }
  void free_sequence(int32_t s) override { seqs_.erase(s); }
  Result<model::ForwardOutput> forward(const model::ForwardBatch& b) override {
    model::ForwardOutput out;
    out.vocab = kVocab;
    out.row_begin.push_back(0);
    for (auto& sl : b.slices) {
      auto& seq = seqs_[sl.seq];
      seq.insert(seq.end(), sl.tokens.begin(), sl.tokens.end());
      int32_t next = kEos;
      for (size_t k = std::min(script_.size(), seq.size());; --k) {
        if (std::equal(script_.begin(), script_.begin() + long(k), seq.end() - long(k))) {
          next = k < script_.size() ? script_[k] : kEos;
          break;
        }
        if (k == 0) break;
      }
      std::vector<float> row(kVocab, 0.0f);
      row[size_t(next)] = 10.0f;
      out.logits.insert(out.logits.end(), row.begin(), row.end());
      out.row_begin.push_back(int64_t(out.row_begin.size()));
    }
    return out;
  }

 private:
  std::vector<int32_t> script_;
  std::map<int32_t, std::vector<int32_t>> seqs_;
  int32_t next_ = 0;
};

struct Harness {
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<OpenAiApi> api;
  std::unique_ptr<HttpServer> server;
  explicit Harness(const std::string& script_text) {
    auto tok = byte_tokenizer();
    std::vector<int32_t> script;
    for (unsigned char c : script_text) script.push_back(c);
    engine::EngineConfig ec;
    ec.eos_token_ids = {kEos};
    ec.stats_interval_s = 0;
    engine = std::move(*engine::Engine::create(std::make_unique<ScriptExecutor>(script), ec));
    api = std::make_unique<OpenAiApi>(engine.get(), tok, ApiConfig{});
    HttpOptions ho;
    ho.port = 0;
    ho.access_log = false;
    server = std::make_unique<HttpServer>(ho, [this](HttpRequest r, std::shared_ptr<ResponseWriter> w) {
      api->handle(std::move(r), std::move(w));
    });
    EXPECT_TRUE(server->start().ok());
  }
  ~Harness() {
    server->stop();
    engine.reset();
  }
  // POST with Connection: close; returns the de-chunked body.
  std::string post(const std::string& path, const std::string& body) {
    net::io_context ioc;
    tcp::socket s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), uint16_t(server->port())));
    std::string req = "POST " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body;
    net::write(s, net::buffer(req));
    std::string all;
    char buf[8192];
    for (;;) {
      boost::system::error_code ec;
      size_t n = s.read_some(net::buffer(buf), ec);
      if (ec) break;
      all.append(buf, n);
    }
    size_t he = all.find("\r\n\r\n");
    std::string head = all.substr(0, he), raw = all.substr(he + 4);
    if (head.find("chunked") == std::string::npos) return raw;
    std::string out;
    size_t p = 0;
    while (p < raw.size()) {
      size_t e = raw.find("\r\n", p);
      size_t n = std::stoul(raw.substr(p, e - p), nullptr, 16);
      if (n == 0) break;
      out += raw.substr(e + 2, n);
      p = e + 2 + n + 2;
    }
    return out;
  }
};

const char* kScript =
    "I should look it up.</think>Let me check.\n\n<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>";

json request(bool stream) {
  json tools = json::array({{{"type", "function"},
                             {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
  return {{"messages", json::array({{{"role", "user"}, {"content", "weather?"}}})},
          {"tools", tools},
          {"max_tokens", 400},
          {"temperature", 0},
          {"chat_template_kwargs", {{"thinking", true}}},
          {"stream", stream}};
}

}  // namespace

TEST(ToolCalls, NonStreaming) {
  Harness h(kScript);
  json r = json::parse(h.post("/v1/chat/completions", request(false).dump()));
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  auto& c = r["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["reasoning_content"], "I should look it up.");
  EXPECT_EQ(c["message"]["content"], "Let me check.");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  auto& tc = c["message"]["tool_calls"][0];
  EXPECT_EQ(tc["type"], "function");
  EXPECT_EQ(tc["function"]["name"], "get_weather");
  EXPECT_TRUE(tc["id"].is_string());
  EXPECT_EQ(json::parse(tc["function"]["arguments"].get<std::string>()), json::parse(R"({"city":"Paris","days":3})"));
}

TEST(ToolCalls, Streaming) {
  Harness h(kScript);
  std::string body = h.post("/v1/chat/completions", request(true).dump());
  std::string reasoning, content, args, name, id, finish;
  size_t p = 0;
  bool done = false;
  while (true) {
    size_t e = body.find("\n\n", p);
    if (e == std::string::npos) break;
    std::string ev = body.substr(p + 6, e - p - 6);
    p = e + 2;
    if (ev == "[DONE]") {
      done = true;
      continue;
    }
    json c = json::parse(ev);
    for (auto& ch : c["choices"]) {
      auto& d = ch["delta"];
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
      if (d.contains("tool_calls")) {
        for (auto& tc : d["tool_calls"]) {
          EXPECT_EQ(tc["index"], 0);
          if (tc.contains("id")) id = tc["id"];
          if (tc["function"].contains("name")) name = tc["function"]["name"];
          args += tc["function"]["arguments"].get<std::string>();
        }
      }
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(reasoning, "I should look it up.");
  EXPECT_EQ(content, "Let me check.");
  EXPECT_EQ(name, "get_weather");
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(json::parse(args), json::parse(R"({"city":"Paris","days":3})"));
  EXPECT_EQ(finish, "tool_calls");
}

TEST(ToolCalls, StopStringInsideReasoningCutsEverything) {
  Harness h(kScript);
  json req = request(false);
  req["stop"] = "look";
  json r = json::parse(h.post("/v1/chat/completions", req.dump()));
  auto& c = r["choices"][0];
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["message"]["reasoning_content"], "I should ");
  EXPECT_FALSE(c["message"].contains("tool_calls"));
}

namespace {

struct Streamed {
  std::string reasoning, content, args, name, finish;
  int calls = 0;
  bool done = false;
};

Streamed read_stream(const std::string& body) {
  Streamed s;
  size_t p = 0;
  while (true) {
    size_t e = body.find("\n\n", p);
    if (e == std::string::npos) break;
    std::string ev = body.substr(p + 6, e - p - 6);
    p = e + 2;
    if (ev == "[DONE]") {
      s.done = true;
      continue;
    }
    json c = json::parse(ev);
    for (auto& ch : c["choices"]) {
      auto& d = ch["delta"];
      if (d.contains("reasoning_content")) s.reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content") && d["content"].is_string()) s.content += d["content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (auto& tc : d["tool_calls"]) {
          if (tc["function"].contains("name")) {
            s.name = tc["function"]["name"];
            ++s.calls;
          }
          s.args += tc["function"]["arguments"].get<std::string>();
        }
      if (!ch["finish_reason"].is_null()) s.finish = ch["finish_reason"];
    }
  }
  return s;
}

}  // namespace

// A model writing template special tokens (the generation header `<｜Assistant｜>`, `<｜User｜>`)
// by mistake: they never reach content or reasoning_content, streaming or not, and the tool call
// after them still parses.
TEST(ToolCalls, TemplateTokensNeverReachTheUser) {
  Harness h(
      "I should<｜Assistant｜> look it up.</think><｜Assistant｜>Let me<｜User｜> check.\n\n"
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
  json r = json::parse(h.post("/v1/chat/completions", request(false).dump()));
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  auto& m = r["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "I should look it up.");
  EXPECT_EQ(m["content"], "Let me check.");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()), json::parse(R"({"city":"Paris"})"));
  Streamed s = read_stream(h.post("/v1/chat/completions", request(true).dump()));
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.reasoning, "I should look it up.");
  EXPECT_EQ(s.content, "Let me check.");
  EXPECT_EQ(s.name, "get_weather");
  EXPECT_EQ(s.finish, "tool_calls");
  // Chat mode, no tools: plain content with a stray header.
  Harness h2("<｜Assistant｜>Hello<｜User｜> world");
  json req = request(false);
  req.erase("tools");
  req["chat_template_kwargs"]["thinking"] = false;
  json r2 = json::parse(h2.post("/v1/chat/completions", req.dump()));
  EXPECT_EQ(r2["choices"][0]["message"]["content"], "Hello world") << r2.dump();
  req["stream"] = true;
  EXPECT_EQ(read_stream(h2.post("/v1/chat/completions", req.dump())).content, "Hello world");
}

// tool_choice naming a function: the prompt pre-fills `<｜DSML｜tool_calls>` and the invoke of
// that function (after `</think>` in thinking mode), the parser starts inside the call, so the
// "model" only writes parameters and the response is a call to that function.
TEST(ToolCalls, NamedToolChoiceForcesThatCall) {
  const std::string params =
      "<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  Harness h(params);
  for (bool thinking : {true, false}) {
    json req = request(false);
    req["chat_template_kwargs"]["thinking"] = thinking;
    req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
    // The prompt (what /tokenize shows) ends with the pre-filled opener.
    json t = json::parse(h.post("/tokenize", req.dump()));
    ASSERT_TRUE(t.contains("tokens")) << t.dump();
    std::string prompt;
    for (auto& id : t["tokens"]) prompt += char(id.get<int>());
    const std::string tail = std::string(thinking ? "<think></think>" : "</think>") +
                             "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n";
    ASSERT_GE(prompt.size(), tail.size());
    EXPECT_EQ(prompt.substr(prompt.size() - tail.size()), tail) << prompt;

    json r = json::parse(h.post("/v1/chat/completions", req.dump()));
    ASSERT_TRUE(r.contains("choices")) << r.dump();
    auto& c = r["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls") << r.dump();
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r.dump();
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
              json::parse(R"({"city":"Oslo"})"));
    EXPECT_TRUE(c["message"]["content"].is_null() || c["message"]["content"] == "") << r.dump();
    if (c["message"].contains("reasoning_content") && c["message"]["reasoning_content"].is_string()) {
      EXPECT_EQ(c["message"]["reasoning_content"], "");
    }

    req["stream"] = true;
    Streamed s = read_stream(h.post("/v1/chat/completions", req.dump()));
    EXPECT_TRUE(s.done);
    EXPECT_EQ(s.calls, 1);
    EXPECT_EQ(s.name, "get_weather");
    EXPECT_EQ(json::parse(s.args), json::parse(R"({"city":"Oslo"})"));
    EXPECT_EQ(s.content, "");
    EXPECT_EQ(s.finish, "tool_calls");
  }
}

// tool_choice "required": the prompt pre-fills the block opener; the model names the function.
TEST(ToolCalls, RequiredToolChoicePrefillsTheBlock) {
  Harness h(
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
  json req = request(false);
  req["chat_template_kwargs"]["thinking"] = false;
  req["tool_choice"] = "required";
  json t = json::parse(h.post("/tokenize", req.dump()));
  std::string prompt;
  for (auto& id : t["tokens"]) prompt += char(id.get<int>());
  const std::string tail = "</think>\n\n<｜DSML｜tool_calls>\n";
  ASSERT_GE(prompt.size(), tail.size());
  EXPECT_EQ(prompt.substr(prompt.size() - tail.size()), tail);
  json r = json::parse(h.post("/v1/chat/completions", req.dump()));
  auto& c = r["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls") << r.dump();
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r.dump();
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], "{\"days\": 2}");
  // "auto" pre-fills nothing.
  req["tool_choice"] = "auto";
  json ta = json::parse(h.post("/tokenize", req.dump()));
  EXPECT_LT(ta["tokens"].size(), t["tokens"].size());
}

TEST(ToolCalls, ToolChoiceErrors) {
  Harness h("x");
  json req = request(false);
  req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  json r = json::parse(h.post("/v1/chat/completions", req.dump()));
  ASSERT_TRUE(r.contains("error")) << r.dump();
  EXPECT_EQ(r["error"]["param"], "tool_choice");
  // A known function under a type other than "function" is refused too.
  req["tool_choice"] = {{"type", "xyz"}, {"function", {{"name", "get_weather"}}}};
  r = json::parse(h.post("/v1/chat/completions", req.dump()));
  ASSERT_TRUE(r.contains("error")) << r.dump();
  EXPECT_EQ(r["error"]["param"], "tool_choice");
  req.erase("tools");
  for (json choice : {json("required"), json({{"type", "function"}, {"function", {{"name", "get_weather"}}}})}) {
    req["tool_choice"] = choice;
    json e = json::parse(h.post("/v1/chat/completions", req.dump()));
    ASSERT_TRUE(e.contains("error")) << e.dump();
    EXPECT_EQ(e["error"]["param"], "tool_choice") << e.dump();
    EXPECT_EQ(e["error"]["type"], "invalid_request_error") << e.dump();
  }
  // A function that happens to be called "required" is a named choice, not "required".
  json tools = json::array({{{"type", "function"}, {"function", {{"name", "required"}}}}});
  req["tools"] = tools;
  req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "required"}}}};
  req["chat_template_kwargs"]["thinking"] = false;
  json t = json::parse(h.post("/tokenize", req.dump()));
  std::string prompt;
  for (auto& id : t["tokens"]) prompt += char(id.get<int>());
  EXPECT_NE(prompt.find("<｜DSML｜invoke name=\"required\">\n"), std::string::npos);
}

// tool_choice "required" (or a named function) when the model closes the pre-filled block and
// ends its turn without a call: not a 200 without tool_calls, but OpenAI's "The model produced
// invalid content" 500 (code invalid_model_output, param tool_choice) quoting what it wrote;
// streaming: the last chunk has finish_reason "error", then an error event and [DONE]. A choice
// cut by max_tokens keeps finish_reason "length" (the client asked for the limit), and the
// same output under tool_choice "auto" is a plain answer.
TEST(ToolCalls, RequiredToolChoiceWithoutACallIsAnError) {
  Harness h("</｜DSML｜tool_calls>I will not call anything.");
  json req = request(false);
  req["chat_template_kwargs"]["thinking"] = false;
  req["tool_choice"] = "required";
  const std::string raw = h.post("/v1/chat/completions", req.dump());
  json r = json::parse(raw);
  ASSERT_TRUE(r.contains("error")) << r.dump();
  EXPECT_EQ(r["error"]["type"], "server_error");
  EXPECT_EQ(r["error"]["code"], "invalid_model_output");
  EXPECT_EQ(r["error"]["param"], "tool_choice");
  const std::string msg = r["error"]["message"];
  EXPECT_NE(msg.find("The model produced invalid content"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"required\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("I will not call anything."), std::string::npos) << msg;

  req["stream"] = true;
  const std::string body = h.post("/v1/chat/completions", req.dump());
  Streamed s = read_stream(body.substr(0, body.find("data: {\"error\"")) + "data: [DONE]\n\n");
  EXPECT_EQ(s.finish, "error") << body;
  EXPECT_EQ(s.calls, 0);
  EXPECT_EQ(s.content, "I will not call anything.");
  const size_t ev = body.find("data: {\"error\"");
  ASSERT_NE(ev, std::string::npos) << body;
  json err = json::parse(body.substr(ev + 6, body.find("\n\n", ev) - ev - 6));
  EXPECT_EQ(err["error"]["code"], "invalid_model_output") << err.dump();
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos) << body;

  req["stream"] = false;
  // Bytes that are not UTF-8 in what the model wrote still give a well-formed error body.
  Harness bad("</｜DSML｜tool_calls>bad \xff\xfe bytes");
  json rb = json::parse(bad.post("/v1/chat/completions", req.dump()));
  ASSERT_TRUE(rb.contains("error")) << rb.dump();
  EXPECT_EQ(rb["error"]["code"], "invalid_model_output");

  // Cut by max_tokens: "length", no error.
  req["max_tokens"] = 5;
  json cut = json::parse(h.post("/v1/chat/completions", req.dump()));
  ASSERT_TRUE(cut.contains("choices")) << cut.dump();
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "length");

  // tool_choice "auto": the same kind of answer is fine (nothing pre-filled: plain content).
  Harness plain("No tools needed.");
  json a = request(false);
  a["chat_template_kwargs"]["thinking"] = false;
  a["tool_choice"] = "auto";
  json ra = json::parse(plain.post("/v1/chat/completions", a.dump()));
  ASSERT_TRUE(ra.contains("choices")) << ra.dump();
  EXPECT_EQ(ra["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(ra["choices"][0]["message"]["content"], "No tools needed.");
}

// tool_choice "required" and the model writes prose instead of a call (inside the pre-filled
// block): the text is returned as content, never dropped — cut by max_tokens it is a 200 with
// finish_reason "length" and that content (streaming: the same content deltas); ending its turn
// it is the invalid_model_output 500 quoting the text.
TEST(ToolCalls, RequiredToolChoiceKeepsProseWrittenInsteadOfACall) {
  const std::string prose = "I cannot call a tool for that.";
  Harness h(prose);
  json req = request(false);
  req["chat_template_kwargs"]["thinking"] = false;
  req["tool_choice"] = "required";
  req["max_tokens"] = 12;  // byte tokens: the first 12 bytes
  json r = json::parse(h.post("/v1/chat/completions", req.dump()));
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  auto& c = r["choices"][0];
  EXPECT_EQ(c["finish_reason"], "length") << r.dump();
  EXPECT_EQ(c["message"]["content"], prose.substr(0, 12)) << r.dump();
  EXPECT_FALSE(c["message"].contains("tool_calls")) << r.dump();
  req["stream"] = true;
  Streamed s = read_stream(h.post("/v1/chat/completions", req.dump()));
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.content, prose.substr(0, 12));
  EXPECT_EQ(s.calls, 0);
  EXPECT_EQ(s.finish, "length");
  // Ended by the model: the 500 quotes what it wrote.
  req["stream"] = false;
  req["max_tokens"] = 400;
  json e = json::parse(h.post("/v1/chat/completions", req.dump()));
  ASSERT_TRUE(e.contains("error")) << e.dump();
  EXPECT_EQ(e["error"]["code"], "invalid_model_output");
  EXPECT_NE(e["error"]["message"].get<std::string>().find(prose), std::string::npos) << e.dump();
}

// A named tool_choice cut by max_tokens: the call holds exactly the arguments the model wrote
// (OpenAI's partial arguments on finish_reason "length") — "" before any parameter, not an
// invented "{}"; a value cut mid-way stays unterminated. Streaming gives the same text.
TEST(ToolCalls, NamedToolChoiceCutByLengthKeepsOnlyTheWrittenArguments) {
  const std::string head = "<｜DSML｜parameter name=\"city\" string=\"true\">";
  const std::string params = head + "Oslo</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  Harness h(params);
  json req = request(false);
  req["chat_template_kwargs"]["thinking"] = false;
  req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  struct Case {
    int max_tokens;
    std::string args;
  };
  for (const Case& k : {Case{5, ""}, Case{int(head.size()) + 2, "{\"city\": \"Os"}}) {
    SCOPED_TRACE(k.max_tokens);
    req["stream"] = false;
    req["max_tokens"] = k.max_tokens;
    json r = json::parse(h.post("/v1/chat/completions", req.dump()));
    ASSERT_TRUE(r.contains("choices")) << r.dump();
    auto& c = r["choices"][0];
    EXPECT_EQ(c["finish_reason"], "length") << r.dump();
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r.dump();
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], k.args) << r.dump();
    req["stream"] = true;
    Streamed s = read_stream(h.post("/v1/chat/completions", req.dump()));
    EXPECT_EQ(s.calls, 1);
    EXPECT_EQ(s.args, k.args);
    EXPECT_EQ(s.finish, "length");
  }
  // Not cut: the complete call, as before.
  req["stream"] = false;
  req["max_tokens"] = 400;
  json full = json::parse(h.post("/v1/chat/completions", req.dump()));
  ASSERT_TRUE(full.contains("choices")) << full.dump();
  EXPECT_EQ(full["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"city\": \"Oslo\"}");
}

// A named tool_choice and the model writes prose instead of (or before) the parameters: the prose
// is content, never dropped (streaming too); the call keeps the arguments written — {} when the
// model ended its turn without any, {"city": "Oslo"} when it wrote them after the prose.
TEST(ToolCalls, NamedToolChoiceKeepsProseWrittenInsideTheCall) {
  struct Case {
    std::string script, content, args;
  };
  const std::string param =
      "<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  for (const Case& k : {Case{"I cannot check the weather.", "I cannot check the weather.", "{}"},
                        Case{"Checking Oslo.\n" + param, "Checking Oslo.\n", "{\"city\": \"Oslo\"}"}}) {
    SCOPED_TRACE(k.script);
    Harness h(k.script);
    json req = request(false);
    req["chat_template_kwargs"]["thinking"] = false;
    req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
    json r = json::parse(h.post("/v1/chat/completions", req.dump()));
    ASSERT_TRUE(r.contains("choices")) << r.dump();
    auto& c = r["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls") << r.dump();
    EXPECT_EQ(c["message"]["content"], k.content) << r.dump();
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r.dump();
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], k.args) << r.dump();
    req["stream"] = true;
    Streamed s = read_stream(h.post("/v1/chat/completions", req.dump()));
    EXPECT_TRUE(s.done);
    EXPECT_EQ(s.content, k.content);
    EXPECT_EQ(s.calls, 1);
    EXPECT_EQ(s.args, k.args);
    EXPECT_EQ(s.finish, "tool_calls");
  }
}

// A call cut by a stop string is reported like one cut by max_tokens: finish_reason "stop" (not
// "tool_calls": the call is incomplete) and exactly the arguments written before the stop string
// ("" before any parameter), nothing invented to close the JSON. A stop string after the call
// ended leaves the complete call and "tool_calls".
TEST(ToolCalls, NamedToolChoiceCutByAStopStringKeepsOnlyTheWrittenArguments) {
  const std::string params =
      "<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls> done";
  Harness h(params);
  json req = request(false);
  req["chat_template_kwargs"]["thinking"] = false;
  req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  struct Case {
    std::string stop, args, finish;
  };
  for (const Case& k : {Case{"<｜DSML｜parameter", "", "stop"}, Case{"lo", "{\"city\": \"Os", "stop"},
                        Case{"done", "{\"city\": \"Oslo\"}", "tool_calls"}}) {
    SCOPED_TRACE(k.stop);
    req["stop"] = k.stop;
    req["stream"] = false;
    json r = json::parse(h.post("/v1/chat/completions", req.dump()));
    ASSERT_TRUE(r.contains("choices")) << r.dump();
    auto& c = r["choices"][0];
    EXPECT_EQ(c["finish_reason"], k.finish) << r.dump();
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r.dump();
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], k.args) << r.dump();
    req["stream"] = true;
    Streamed s = read_stream(h.post("/v1/chat/completions", req.dump()));
    EXPECT_EQ(s.calls, 1);
    EXPECT_EQ(s.args, k.args);
    EXPECT_EQ(s.finish, k.finish);
  }
}

// The token that ends generation (EOS here) is not part of the text, as in vLLM: completions with
// skip_special_tokens false used to end in `<｜end▁of▁sentence｜>`; include_stop_str_in_output
// keeps it. Streaming the same. It is still counted and has its logprobs entry. In chat, EOS right
// after a tool-call value used to become part of the argument text.
TEST(ToolCalls, TheFinishingEosIsNotPartOfTheText) {
  Harness h("Hello");
  json req = {{"prompt", "x"}, {"max_tokens", 50}, {"temperature", 0}, {"skip_special_tokens", false},
              {"logprobs", 0}};
  const std::string eos = "<｜end▁of▁sentence｜>";
  for (bool include : {false, true}) {
    SCOPED_TRACE(include);
    req["include_stop_str_in_output"] = include;
    req["stream"] = false;
    json r = json::parse(h.post("/v1/completions", req.dump()));
    ASSERT_TRUE(r.contains("choices")) << r.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(r["choices"][0]["text"], include ? "Hello" + eos : "Hello") << r.dump();
    EXPECT_EQ(r["usage"]["completion_tokens"], 6) << r.dump();
    EXPECT_EQ(r["choices"][0]["logprobs"]["tokens"].size(), 6u) << r.dump();
    req["stream"] = true;
    std::string body = h.post("/v1/completions", req.dump());
    std::string text;
    for (size_t p = 0; (p = body.find("data: {", p)) != std::string::npos; ++p) {
      json ev = json::parse(body.substr(p + 6, body.find("\n\n", p) - p - 6));
      for (auto& ch : ev["choices"]) text += ch["text"].get<std::string>();
    }
    EXPECT_EQ(text, include ? "Hello" + eos : "Hello");
  }
  Harness h2("<｜DSML｜parameter name=\"city\" string=\"true\">Oslo");
  json chat = request(false);
  chat["chat_template_kwargs"]["thinking"] = false;
  chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  json r = json::parse(h2.post("/v1/chat/completions", chat.dump()));
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Oslo\"}")
      << r.dump();
}

// A token that is part of a UTF-8 character (here every byte is a token: "é" is 0xC3 0xA9) is
// listed in logprobs as OpenAI lists it, "bytes:\xc3" (the byte as \xNN text), not as U+FFFD;
// whole-character tokens are their text. Completions (tokens and top_logprobs keys, streaming
// or not) and chat (token; its bytes field has the raw bytes).
TEST(ToolCalls, PartialUtf8TokensAreListedAsBytes) {
  Harness h("aé");
  const std::vector<std::string> want = {"a", "bytes:\\xc3", "bytes:\\xa9"};
  json req = {{"prompt", "x"}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", 0}};
  json r = json::parse(h.post("/v1/completions", req.dump()));
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], "aé");
  EXPECT_EQ(r["choices"][0]["logprobs"]["tokens"], json(want)) << r.dump();
  EXPECT_TRUE(r["choices"][0]["logprobs"]["top_logprobs"][1].contains("bytes:\\xc3")) << r.dump();
  req["stream"] = true;
  std::string body = h.post("/v1/completions", req.dump());
  std::vector<std::string> toks;
  for (size_t p = 0; (p = body.find("data: {", p)) != std::string::npos; ++p) {
    json ev = json::parse(body.substr(p + 6, body.find("\n\n", p) - p - 6));
    for (auto& ch : ev["choices"])
      if (ch.contains("logprobs") && ch["logprobs"].is_object())
        for (auto& t : ch["logprobs"]["tokens"]) toks.push_back(t);
  }
  EXPECT_EQ(toks, want);
  json chat = request(false);
  chat.erase("tools");
  chat["chat_template_kwargs"]["thinking"] = false;
  chat["logprobs"] = true;
  chat["max_tokens"] = 3;
  json c = json::parse(h.post("/v1/chat/completions", chat.dump()));
  ASSERT_TRUE(c.contains("choices")) << c.dump();
  auto& items = c["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(items.size(), 3u) << c.dump();
  EXPECT_EQ(items[1]["token"], "bytes:\\xc3");
  EXPECT_EQ(items[1]["bytes"], json::array({0xc3}));
}
