// The OpenAI API end to end in-process: HttpServer + OpenAiApi + Engine on the engine tests'
// deterministic FakeExecutor (logits are a pure function of the prefix), and a byte-level
// tokenizer of 256 byte tokens + EOS. Greedy outputs are known exactly (fake_greedy).
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <limits>
#include <sstream>
#include <thread>

#include "../engine/fake_executor.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "text/chat_encoder.h"

using namespace v4;
using namespace v4::server;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

constexpr int32_t kEos = 256;
constexpr int64_t kVocab = 257;

// GPT-2 byte -> unicode mapping, as byte-level BPE tokenizer.json files write tokens.
std::string byte_char(int b) {
  int cp;
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
    cp = b;
  } else {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    }
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
  json tj = {
      {"added_tokens", json::array({{{"id", kEos}, {"content", "<｜end▁of▁sentence｜>"}, {"special", true},
                                     {"normalized", false}, {"lstrip", false}, {"rstrip", false},
                                     {"single_word", false}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  auto t = text::Tokenizer::from_json_text(tj.dump(), "byte-tokenizer");
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return *t;
}

struct Response {
  int status = 0;
  std::string head;
  std::string body;  // de-chunked
  json j() const { return json::parse(body); }
};

// One HTTP/1.1 request with Connection: close; returns status, head and body.
// `content_type` empty: no Content-Type header.
Response http(int port, const std::string& method, const std::string& path, const std::string& body,
              const std::string& extra_headers = "",
              const std::string& content_type = "application/json") {
  net::io_context ioc;
  tcp::socket s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), uint16_t(port)));
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra_headers +
                    (content_type.empty() ? std::string() : "Content-Type: " + content_type + "\r\n") +
                    "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  net::write(s, net::buffer(req));
  std::string all;
  char buf[8192];
  for (;;) {
    boost::system::error_code ec;
    size_t n = s.read_some(net::buffer(buf), ec);
    if (ec) break;
    all.append(buf, n);
  }
  Response r;
  size_t he = all.find("\r\n\r\n");
  if (he == std::string::npos) return r;
  r.head = all.substr(0, he);
  r.status = std::stoi(all.substr(9, 3));
  std::string raw = all.substr(he + 4);
  if (r.head.find("Transfer-Encoding: chunked") != std::string::npos) {
    size_t p = 0;
    while (p < raw.size()) {
      size_t e = raw.find("\r\n", p);
      if (e == std::string::npos) break;
      size_t n = std::stoul(raw.substr(p, e - p), nullptr, 16);
      if (n == 0) break;
      r.body += raw.substr(e + 2, n);
      p = e + 2 + n + 2;
    }
  } else {
    r.body = raw;
  }
  return r;
}

// SSE payloads of a stream body ("[DONE]" included as a string).
std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t p = 0;
  while (true) {
    size_t e = body.find("\n\n", p);
    if (e == std::string::npos) break;
    std::string ev = body.substr(p, e - p);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    out.push_back(ev.substr(6));
    p = e + 2;
  }
  EXPECT_EQ(p, body.size()) << "trailing bytes after the last event";
  return out;
}

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override { start(""); }
  void start(const std::string& api_key) {
    engine::testing::FakeConfig fc;
    fc.vocab = kVocab;
    fc.max_context = 512;
    fc.kv_pages = kv_pages_;
    fc.state_pages = 256;
    fc.step_delay_us = step_delay_us_;
    auto exec = std::make_unique<engine::testing::FakeExecutor>(fc);
    engine::EngineConfig ec;
    ec.eos_token_ids = {kEos};
    ec.stats_interval_s = 0;
    ec.chunked_prefill_size = 256;
    auto e = engine::Engine::create(std::move(exec), ec);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(*e);
    tok_ = byte_tokenizer();
    ApiConfig cfg;
    cfg.served_model_name = served_name_;
    cfg.api_key = api_key;
    api_ = std::make_unique<OpenAiApi>(engine_.get(), tok_, cfg);
    HttpOptions ho;
    ho.port = 0;
    ho.access_log = false;
    server_ = std::make_unique<HttpServer>(ho, [this](HttpRequest r, std::shared_ptr<ResponseWriter> w) {
      api_->handle(std::move(r), std::move(w));
    });
    api_->set_connection_counter([this] { return server_->open_connections(); });
    ASSERT_TRUE(server_->start().ok());
    port_ = server_->port();
  }
  void TearDown() override {
    server_->stop();
    engine_.reset();
  }
  std::string greedy_text(const std::vector<int32_t>& prompt, int n) {
    auto toks = engine::testing::fake_greedy(prompt, kVocab, n);
    return tok_.decode(toks, true);
  }
  std::unique_ptr<engine::Engine> engine_;
  text::Tokenizer tok_;
  std::unique_ptr<OpenAiApi> api_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  int64_t step_delay_us_ = 0;  // FakeConfig::step_delay_us (set before start)
  int64_t kv_pages_ = 4096;    // FakeConfig::kv_pages (set before start)
  std::string served_name_ = "tiny";  // ApiConfig::served_model_name (set before start)
};

// KV pools smaller than the context (16 pages × 16 tokens = 256 of the 512-token context): a
// request within the context that the pools can never hold gets 400 context_length_exceeded
// naming the cache limit (param: the prompt when the prompt alone does not fit, else max_tokens),
// not the engine's bare "can never fit"; a request that fits is served, a defaulted max_tokens
// is cut to what fits.
class SmallCacheApiTest : public ApiTest {
 protected:
  void SetUp() override {
    kv_pages_ = 16;
    start("");
  }
};

TEST_F(SmallCacheApiTest, RequestsBeyondTheCacheAreContextLengthErrors) {
  const std::string p300 = json(std::vector<int32_t>(300, 3)).dump();
  auto r = http(port_, "POST", "/v1/completions", R"({"prompt":)" + p300 + "}");
  EXPECT_EQ(r.status, 400) << r.body;
  json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded") << r.body;
  EXPECT_EQ(j["error"]["param"], "prompt") << r.body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("at most 256 tokens"), std::string::npos) << r.body;
  // /v1/models reports the model's context (as SGLang); the limit is in the error above
  EXPECT_EQ(json::parse(http(port_, "GET", "/v1/models", "").body)["data"][0]["max_model_len"], 512);
  r = http(port_, "POST", "/v1/completions", R"({"prompt":[1,2,3],"max_tokens":300})");
  EXPECT_EQ(r.status, 400) << r.body;
  j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded") << r.body;
  EXPECT_EQ(j["error"]["param"], "max_tokens") << r.body;
  r = http(port_, "POST", "/v1/completions", R"({"prompt":[1,2,3],"max_tokens":253,"ignore_eos":true})");
  EXPECT_EQ(r.status, 200) << r.body;
  r = http(port_, "POST", "/v1/completions", R"({"prompt":[1,2,3]})");
  EXPECT_EQ(r.status, 200) << r.body;
}

// Engine steps of 5 ms: requests stay in flight long enough to be aborted.
class SlowApiTest : public ApiTest {
 protected:
  void SetUp() override {
    step_delay_us_ = 5000;
    start("");
  }
};

std::string prompt_json(const std::vector<int32_t>& p) { return json(p).dump(); }

}  // namespace

TEST_F(ApiTest, CompletionGreedyMatchesAndUsage) {
  std::vector<int32_t> prompt = {10, 20, 30, 40};
  auto r = http(port_, "POST", "/v1/completions",
                R"({"model":"tiny","prompt":)" + prompt_json(prompt) + R"(,"max_tokens":12,"temperature":0,"ignore_eos":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.j();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["choices"][0]["text"], greedy_text(prompt, 12));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["total_tokens"], 16);
  EXPECT_TRUE(j["usage"]["prompt_tokens_details"]["cached_tokens"].is_number_integer());
}

TEST_F(ApiTest, StreamingEqualsNonStreaming) {
  std::vector<int32_t> prompt = {1, 2, 3};
  std::string body = R"({"prompt":)" + prompt_json(prompt) +
                     R"(,"max_tokens":20,"temperature":0,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}})";
  auto r = http(port_, "POST", "/v1/completions", body);
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.head.find("text/event-stream"), std::string::npos);
  auto ev = sse_payloads(r.body);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < ev.size(); ++i) {
    json c = json::parse(ev[i]);
    EXPECT_EQ(c["object"], "text_completion");
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  json usage = json::parse(ev[ev.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 20);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(text, greedy_text(prompt, 20));
  EXPECT_EQ(finish, "length");
}

TEST_F(ApiTest, StopStringNeverLeaks) {
  std::vector<int32_t> prompt = {7, 7, 7};
  std::string full = greedy_text(prompt, 40);
  // A stop string of two whole characters from the middle of the greedy text.
  size_t pos = full.size() / 2;
  while (pos < full.size() && (static_cast<unsigned char>(full[pos]) & 0xC0) == 0x80) ++pos;
  size_t end = pos;
  for (int chars = 0; chars < 2 && end < full.size(); ++chars) {
    ++end;
    while (end < full.size() && (static_cast<unsigned char>(full[end]) & 0xC0) == 0x80) ++end;
  }
  std::string stop = full.substr(pos, end - pos);
  std::string expect = full.substr(0, full.find(stop));
  for (bool stream : {false, true}) {
    json req = {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true},
                {"stop", json::array({stop, "never-appears"})}, {"stream", stream}};
    auto r = http(port_, "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    std::string text, finish;
    if (stream) {
      for (auto& e : sse_payloads(r.body)) {
        if (e == "[DONE]") continue;
        json c = json::parse(e);
        text += c["choices"][0]["text"].get<std::string>();
        if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
      }
    } else {
      text = r.j()["choices"][0]["text"];
      finish = r.j()["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(text, expect) << "stream=" << stream << " stop='" << stop << "'";
    EXPECT_EQ(finish, "stop");
  }
  engine_->wait_idle();
}

// text_offset (completions logprobs) is where each token's text starts in the choice's text:
// 0 for the first generated token, shifted by the echoed prompt with "echo" (whose own tokens
// are listed first), and the same whether streamed or not.
// Characters (code points) of UTF-8 text: the unit of text_offset.
int64_t u8len(const std::string& s) {
  int64_t n = 0;
  for (unsigned char b : s) n += (b & 0xC0u) != 0x80u;
  return n;
}

// Byte index of character (code point) `chars` of UTF-8 `s` (s.size() past the end).
size_t u8_byte_at(const std::string& s, int64_t chars) {
  int64_t c = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0u) == 0x80u) continue;
    if (c == chars) return i;
    ++c;
  }
  return s.size();
}

TEST_F(ApiTest, CompletionTextOffsetsStartAtEachToken) {
  std::vector<int32_t> prompt = {5, 6};
  auto offsets = [&](bool echo, bool stream, std::string* text) {
    json req = {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true},
                {"logprobs", 1}, {"echo", echo}, {"stream", stream}};
    auto r = http(port_, "POST", "/v1/completions", req.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    std::vector<int64_t> out;
    text->clear();
    if (!stream) {
      json ch = r.j()["choices"][0];
      *text = ch["text"].get<std::string>();
      for (auto& o : ch["logprobs"]["text_offset"]) out.push_back(o.get<int64_t>());
      return out;
    }
    std::istringstream lines(r.body);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("data: ", 0) != 0 || line == "data: [DONE]") continue;
      json ch = json::parse(line.substr(6))["choices"][0];
      *text += ch["text"].get<std::string>();
      if (ch["logprobs"].is_object())
        for (auto& o : ch["logprobs"]["text_offset"]) out.push_back(o.get<int64_t>());
    }
    return out;
  };
  std::string plain, echoed, plain_s, echoed_s;
  const auto o_plain = offsets(false, false, &plain);
  const auto o_echo = offsets(true, false, &echoed);
  const auto o_plain_s = offsets(false, true, &plain_s);
  const auto o_echo_s = offsets(true, true, &echoed_s);
  ASSERT_EQ(o_plain.size(), 6u);
  EXPECT_EQ(o_plain[0], 0);
  for (size_t i = 1; i < o_plain.size(); ++i) {
    EXPECT_GE(o_plain[i], o_plain[i - 1]);
    EXPECT_LE(o_plain[i], u8len(plain));
  }
  ASSERT_GE(echoed.size(), plain.size());
  EXPECT_EQ(echoed.substr(echoed.size() - plain.size()), plain);
  const int64_t echo_len = u8len(echoed) - u8len(plain);  // characters of the echoed prompt
  // With echo the prompt's tokens come first (offsets from 0), then the generated ones.
  ASSERT_EQ(o_echo.size(), prompt.size() + o_plain.size());
  EXPECT_EQ(o_echo[0], 0);
  for (size_t i = 0; i < o_plain.size(); ++i)
    EXPECT_EQ(o_echo[prompt.size() + i], o_plain[i] + echo_len) << i;
  EXPECT_EQ(plain_s, plain);
  EXPECT_EQ(echoed_s, echoed);
  EXPECT_EQ(o_plain_s, o_plain);
  EXPECT_EQ(o_echo_s, o_echo);
  engine_->wait_idle();
}

// text_offset counts characters (code points), as vLLM does (Python string indices), not bytes:
// in "héllo wörld" (byte tokens: é and ö are 2 each) 'w' is character 6 (byte 7), and a
// generated token's offset is the echoed prompt's 11 characters plus what came before it.
TEST_F(ApiTest, TextOffsetsCountCharactersNotBytes) {
  const std::string prompt = "h\xc3\xa9llo w\xc3\xb6rld";  // héllo wörld
  ASSERT_EQ(u8len(prompt), 11);
  json req = {{"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true},
              {"logprobs", 0}, {"echo", true}};
  auto r = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json ch = r.j()["choices"][0];
  const json off = ch["logprobs"]["text_offset"];
  const std::string text = ch["text"].get<std::string>();
  ASSERT_EQ(text.substr(0, prompt.size()), prompt);
  // Prompt tokens (bytes): h é(2) l l o ' ' w ö(2) r l d = 13, then 3 generated.
  ASSERT_EQ(off.size(), 16u) << off;
  EXPECT_EQ(off[0], 0);
  EXPECT_EQ(off[3], 2);   // the first 'l'
  EXPECT_EQ(off[7], 6);   // 'w'
  EXPECT_EQ(off[12], 10); // 'd'
  EXPECT_EQ(off[13], 11); // the first generated token starts after the 11 prompt characters
  for (size_t i = 14; i < off.size(); ++i) {
    EXPECT_GE(off[i].get<int64_t>(), off[i - 1].get<int64_t>());
    EXPECT_LE(off[i].get<int64_t>(), u8len(text));
  }
}

// POST bodies must be declared JSON: application/json with any parameters and any case, or
// application/*+json, or no Content-Type at all; anything else (text/plain, curl -d's
// form-urlencoded) gets an OpenAI-style 415 on every POST endpoint, before generating anything.
TEST_F(ApiTest, PostBodiesMustBeDeclaredJson) {
  const std::string body = R"({"prompt":[5,6],"max_tokens":2,"temperature":0})";
  for (const std::string ct : {"text/plain", "application/x-www-form-urlencoded",
                               "multipart/form-data; boundary=x", "application/jsonx", "json"}) {
    for (const std::string path : {"/v1/completions", "/v1/chat/completions", "/tokenize"}) {
      SCOPED_TRACE(ct + " " + path);
      auto r = http(port_, "POST", path, body, "", ct);
      EXPECT_EQ(r.status, 415) << r.body;
      json j = json::parse(r.body, nullptr, false);
      ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
      EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r.body;
      EXPECT_EQ(j["error"]["code"], "unsupported_media_type") << r.body;
      EXPECT_NE(j["error"]["message"].get<std::string>().find("application/json"), std::string::npos);
      EXPECT_NE(j["error"]["message"].get<std::string>().find(ct), std::string::npos);
    }
  }
  for (const std::string ct : {"application/json", "application/json; charset=utf-8",
                               "Application/JSON;charset=UTF-8", "application/vnd.api+json", ""}) {
    SCOPED_TRACE(ct);
    auto r = http(port_, "POST", "/v1/completions", body, "", ct);
    EXPECT_EQ(r.status, 200) << r.body;
  }
  EXPECT_TRUE(json_content_type(" application/json ;charset=utf-8"));
  EXPECT_FALSE(json_content_type("application/+json"));
  EXPECT_FALSE(json_content_type("text/json"));
  engine_->wait_idle();
}

// Compressed request bodies are not decoded, so they are refused by name instead of being
// parsed as JSON: Content-Encoding gzip → 415 (RFC 9110), a transfer coding other than chunked
// → 501 (RFC 9112). Before, both were ignored: a plain body labelled gzip was served, a real
// gzip body got "not valid UTF-8".
TEST_F(ApiTest, CompressedBodiesAreRefused) {
  const std::string body = R"({"prompt":[5,6],"max_tokens":2,"temperature":0})";
  for (const std::string ce : {"gzip", "deflate", "br", "GZIP ", "x-gzip"}) {
    SCOPED_TRACE(ce);
    auto r = http(port_, "POST", "/v1/completions", body, "Content-Encoding: " + ce + "\r\n");
    EXPECT_EQ(r.status, 415) << r.body;
    json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["code"], "unsupported_media_type");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("Content-Encoding"), std::string::npos);
  }
  for (const std::string ce : {"identity", "", " Identity"}) {
    SCOPED_TRACE(ce);
    auto r = http(port_, "POST", "/v1/completions", body, "Content-Encoding: " + ce + "\r\n");
    EXPECT_EQ(r.status, 200) << r.body;
  }
  // A transfer coding under chunked: the bytes after de-chunking are still gzip.
  {
    std::string chunked = fmt::format("{:x}\r\n{}\r\n0\r\n\r\n", body.size(), body);
    net::io_context ioc;
    tcp::socket s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), uint16_t(port_)));
    const std::string req =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
        "application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunked;
    net::write(s, net::buffer(req));
    std::string all;
    char buf[4096];
    for (;;) {
      boost::system::error_code ec;
      size_t n = s.read_some(net::buffer(buf), ec);
      if (ec) break;
      all.append(buf, n);
    }
    EXPECT_EQ(all.substr(0, 12), "HTTP/1.1 501") << all;
    EXPECT_NE(all.find("Transfer-Encoding"), std::string::npos) << all;
  }
  engine_->wait_idle();
}

// A wrong method on /v1/models/{id} names the allowed one (the message said "use " and nothing).
TEST_F(ApiTest, ModelRouteWrongMethodNamesGet) {
  auto r = http(port_, "DELETE", "/v1/models/whatever", "");
  EXPECT_EQ(r.status, 405) << r.body;
  EXPECT_NE(r.head.find("Allow: GET"), std::string::npos) << r.head;
  json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("use GET"), std::string::npos) << r.body;
}

// Completions echo + logprobs list the prompt tokens first (OpenAI): the first with null
// token_logprobs / top_logprobs, each later one scored by the model at the position before it
// (the fake's logits), text_offset from the start of the echoed text; the generated tokens
// follow unchanged, streamed or not.
TEST_F(ApiTest, EchoWithLogprobsScoresThePromptTokens) {
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  const json req = {{"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true},
                    {"logprobs", 2}, {"echo", true}};
  auto r = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json ch = r.j()["choices"][0];
  const json lp = ch["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), prompt.size() + 3) << lp;
  ASSERT_EQ(lp["token_logprobs"].size(), prompt.size() + 3) << lp;
  ASSERT_EQ(lp["top_logprobs"].size(), prompt.size() + 3) << lp;
  ASSERT_EQ(lp["text_offset"].size(), prompt.size() + 3) << lp;
  EXPECT_TRUE(lp["token_logprobs"][0].is_null()) << lp;
  EXPECT_TRUE(lp["top_logprobs"][0].is_null()) << lp;
  uint64_t h = 0;
  std::vector<float> row(static_cast<size_t>(kVocab));
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    SCOPED_TRACE(i);
    h = engine::testing::fake_extend(h, prompt[i]);
    engine::testing::fake_logits(h, kVocab, row.data());
    double mx = *std::max_element(row.begin(), row.end()), sum = 0;
    for (float v : row) sum += std::exp(double(v) - mx);
    const double want = double(row[size_t(prompt[i + 1])]) - mx - std::log(sum);
    ASSERT_TRUE(lp["token_logprobs"][i + 1].is_number()) << lp;
    EXPECT_NEAR(lp["token_logprobs"][i + 1].get<double>(), want, 1e-5);
    EXPECT_GE(lp["top_logprobs"][i + 1].size(), 1u);
    EXPECT_EQ(lp["tokens"][i + 1], tok_.decode(std::vector<int32_t>{prompt[i + 1]}, false));
  }
  const std::string echo = tok_.decode(prompt, false);
  EXPECT_EQ(ch["text"].get<std::string>().substr(0, echo.size()), echo);
  int64_t at = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), at) << i;
    at += u8len(tok_.decode(std::vector<int32_t>{prompt[i]}, false));
  }
  EXPECT_EQ(lp["text_offset"][prompt.size()].get<int64_t>(), u8len(echo));
  // The generated tokens as without echo.
  json plain_req = req;
  plain_req["echo"] = false;
  auto p = http(port_, "POST", "/v1/completions", plain_req.dump());
  ASSERT_EQ(p.status, 200) << p.body;
  const json plp = p.j()["choices"][0]["logprobs"];
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(lp["tokens"][prompt.size() + k], plp["tokens"][k]);
    EXPECT_EQ(lp["token_logprobs"][prompt.size() + k], plp["token_logprobs"][k]);
  }
  // Streamed: the same entries, the prompt's in the first chunk.
  json sreq = req;
  sreq["stream"] = true;
  auto s = http(port_, "POST", "/v1/completions", sreq.dump());
  ASSERT_EQ(s.status, 200) << s.body;
  json toks = json::array(), lps = json::array(), offs = json::array();
  bool first = true;
  for (const auto& e : sse_payloads(s.body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"][0];
    if (!c["logprobs"].is_object()) continue;
    if (first) {
      EXPECT_GE(c["logprobs"]["tokens"].size(), prompt.size()) << e;
    }
    first = false;
    for (auto& x : c["logprobs"]["tokens"]) toks.push_back(x);
    for (auto& x : c["logprobs"]["token_logprobs"]) lps.push_back(x);
    for (auto& x : c["logprobs"]["text_offset"]) offs.push_back(x);
  }
  EXPECT_EQ(toks, lp["tokens"]);
  EXPECT_EQ(lps, lp["token_logprobs"]);
  EXPECT_EQ(offs, lp["text_offset"]);
  engine_->wait_idle();
}

// A special token written in a text prompt is part of the echoed text: the text_offset of every
// later prompt token counts its characters (only a BOS the server adds is not in the text).
TEST_F(ApiTest, EchoWithLogprobsOffsetsCountSpecialTokensInTheText) {
  const std::string eos = "<｜end▁of▁sentence｜>";
  const std::string prompt = "ab" + eos + "cd";
  const json req = {{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}, {"ignore_eos", true},
                    {"logprobs", 1}, {"echo", true}};
  auto r = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json ch = r.j()["choices"][0];
  const json lp = ch["logprobs"];
  const std::string text = ch["text"].get<std::string>();
  ASSERT_EQ(text.substr(0, prompt.size()), prompt);
  ASSERT_EQ(lp["tokens"].size(), 5u + 2u) << lp;
  int64_t prev = -1;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    SCOPED_TRACE(i);
    const std::string t = lp["tokens"][i].get<std::string>();
    const int64_t off = lp["text_offset"][i].get<int64_t>();
    EXPECT_GE(off, prev) << lp;
    prev = off;
    if (i < 5) {
      EXPECT_EQ(text.substr(u8_byte_at(text, off), t.size()), t) << lp;
    }
  }
  EXPECT_EQ(lp["text_offset"][3].get<int64_t>(), 2 + u8len(eos)) << lp;
  EXPECT_EQ(lp["text_offset"][5].get<int64_t>(), u8len(prompt)) << lp;
  engine_->wait_idle();
}

// OpenAI's prompt scoring: echo + logprobs with max_tokens 0 returns the prompt's entries and
// nothing generated (finish_reason "length", completion_tokens 0), streaming or not; max_tokens
// 0 without echo (or on chat) stays a 400.
TEST_F(ApiTest, EchoWithMaxTokensZeroScoresThePromptOnly) {
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  const json req = {{"prompt", prompt}, {"max_tokens", 0}, {"temperature", 0}, {"logprobs", 2},
                    {"echo", true}};
  auto r = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json ch = r.j()["choices"][0];
  EXPECT_EQ(ch["text"], tok_.decode(prompt, false));
  EXPECT_EQ(ch["finish_reason"], "length");
  EXPECT_EQ(r.j()["usage"]["completion_tokens"], 0);
  EXPECT_EQ(r.j()["usage"]["prompt_tokens"], 4);
  const json lp = ch["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), prompt.size()) << lp;
  ASSERT_EQ(lp["token_logprobs"].size(), prompt.size()) << lp;
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  // The same prompt entries as with a generated token.
  json one = req;
  one["max_tokens"] = 1;
  auto r1 = http(port_, "POST", "/v1/completions", one.dump());
  ASSERT_EQ(r1.status, 200) << r1.body;
  const json lp1 = r1.j()["choices"][0]["logprobs"];
  for (size_t i = 0; i < prompt.size(); ++i) {
    EXPECT_EQ(lp["tokens"][i], lp1["tokens"][i]) << i;
    EXPECT_EQ(lp["token_logprobs"][i], lp1["token_logprobs"][i]) << i;
    EXPECT_EQ(lp["text_offset"][i], lp1["text_offset"][i]) << i;
  }
  json sreq = req;
  sreq["stream"] = true;
  auto s = http(port_, "POST", "/v1/completions", sreq.dump());
  ASSERT_EQ(s.status, 200) << s.body;
  std::string text;
  json lps = json::array();
  std::string finish;
  for (const auto& e : sse_payloads(s.body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"][0];
    text += c["text"].get<std::string>();
    if (c["logprobs"].is_object())
      for (auto& x : c["logprobs"]["token_logprobs"]) lps.push_back(x);
    if (c["finish_reason"].is_string()) finish = c["finish_reason"];
  }
  EXPECT_EQ(text, tok_.decode(prompt, false));
  EXPECT_EQ(lps, lp["token_logprobs"]);
  EXPECT_EQ(finish, "length");
  json no_echo = req;
  no_echo["echo"] = false;
  auto e1 = http(port_, "POST", "/v1/completions", no_echo.dump());
  EXPECT_EQ(e1.status, 400) << e1.body;
  EXPECT_EQ(e1.j()["error"]["param"], "max_tokens") << e1.body;
  const json chat = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                     {"max_tokens", 0}};
  auto e2 = http(port_, "POST", "/v1/chat/completions", chat.dump());
  EXPECT_EQ(e2.status, 400) << e2.body;
  engine_->wait_idle();
}

TEST_F(ApiTest, LogprobsBothFormats) {
  std::vector<int32_t> prompt = {5, 6};
  json req = {{"prompt", prompt}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 3}};
  auto r = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json lp = r.j()["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  ASSERT_EQ(lp["top_logprobs"].size(), 5u);
  ASSERT_EQ(lp["text_offset"].size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    // (a dict keyed by token text: distinct tokens with equal text collapse)
    EXPECT_GE(lp["top_logprobs"][i].size(), 1u);
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);
    // Greedy: the sampled token has the highest logprob.
    double best = -1e9;
    for (auto& [k, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(best, lp["token_logprobs"][i].get<double>(), 1e-5);
  }
  json creq = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 4},
               {"temperature", 0}, {"ignore_eos", true}, {"logprobs", true}, {"top_logprobs", 2}};
  auto c = http(port_, "POST", "/v1/chat/completions", creq.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  json content = c.j()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  for (auto& item : content) {
    EXPECT_TRUE(item["token"].is_string());
    EXPECT_LE(item["logprob"].get<double>(), 0.0);
    EXPECT_TRUE(item["bytes"].is_array());
    EXPECT_EQ(item["top_logprobs"].size(), 2u);
  }
  // Completions `logprobs: 0` (OpenAI: "up to logprobs + 1 elements"): each top_logprobs entry is
  // the chosen token alone, with its own logprob; sampled (T = 1) tokens outside the top n are
  // added to the n.
  for (int n : {0, 1}) {
    SCOPED_TRACE(n);
    json zreq = {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", n == 0 ? 0.0 : 1.0},
                 {"seed", 7},        {"ignore_eos", true}, {"logprobs", n}};
    auto z = http(port_, "POST", "/v1/completions", zreq.dump());
    ASSERT_EQ(z.status, 200) << z.body;
    json zl = z.j()["choices"][0]["logprobs"];
    ASSERT_EQ(zl["top_logprobs"].size(), 6u) << zl;
    for (size_t i = 0; i < 6; ++i) {
      const json& top = zl["top_logprobs"][i];
      ASSERT_TRUE(top.is_object()) << zl;
      EXPECT_GE(top.size(), 1u);
      EXPECT_LE(top.size(), size_t(n) + 1);
      const std::string tok = zl["tokens"][i].get<std::string>();
      ASSERT_TRUE(top.contains(tok)) << top;
      EXPECT_NEAR(top[tok].get<double>(), zl["token_logprobs"][i].get<double>(), 1e-6);
      if (n == 0) {
        EXPECT_EQ(top.size(), 1u);
      }
    }
  }
}

// logit_bias (OpenAI: token id → bias in [-100, 100], added to the logits before sampling):
// +100 on one token makes greedy decoding emit only it; -100 on the first greedy token moves the
// first choice elsewhere; the raw-logit logprobs are unchanged by it.
TEST_F(ApiTest, LogitBiasSteersGreedyTokens) {
  const std::vector<int32_t> prompt = {10, 20, 30, 40};
  const auto greedy = engine::testing::fake_greedy(prompt, kVocab, 6);
  json req = {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}};
  req["logit_bias"] = {{"65", 100}};
  auto r = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["choices"][0]["text"], tok_.decode(std::vector<int32_t>(6, 65), true));
  // -100 on the greedy token: the first token is the argmax of the rest of the fake logits row.
  uint64_t h = 0;
  for (int32_t t : prompt) h = engine::testing::fake_extend(h, t);
  std::vector<float> row(static_cast<size_t>(kVocab));
  engine::testing::fake_logits(h, kVocab, row.data());
  row[size_t(greedy[0])] -= 100.0f;
  const int32_t second = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
  ASSERT_NE(second, greedy[0]);
  req["logit_bias"] = {{std::to_string(greedy[0]), -100}};
  req["max_tokens"] = 1;
  req["logprobs"] = 1;
  auto r2 = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(r2.j()["choices"][0]["text"], tok_.decode(std::vector<int32_t>{second}, true));
  req.erase("logprobs");
  req["logit_bias"] = json::object();  // {} = none
  auto r3 = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r3.status, 200) << r3.body;
  EXPECT_EQ(r3.j()["choices"][0]["text"], tok_.decode(std::vector<int32_t>{greedy[0]}, true));
  // Streaming draws the same tokens.
  req["logit_bias"] = {{"66", 100}};
  req["max_tokens"] = 3;
  req["stream"] = true;
  auto s = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(s.status, 200) << s.body;
  std::string text;
  for (const auto& e : sse_payloads(s.body))
    if (e != "[DONE]") text += json::parse(e)["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, tok_.decode(std::vector<int32_t>{66, 66, 66}, true));
}

// Text a stop string holds back (a possible start of it) still counts in text_offset: "AAAAAA"
// has offsets 0 … 5 with or without stop "AB" (each 'A' is held until the next one shows it is
// not followed by 'B'), streaming or not.
TEST_F(ApiTest, TextOffsetsCountTextHeldBackByStopStrings) {
  for (bool stream : {false, true})
    for (bool with_stop : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "stream=" << stream << " stop=" << with_stop);
      json req = {{"prompt", std::vector<int32_t>{10, 20}}, {"max_tokens", 6}, {"temperature", 0},
                  {"ignore_eos", true}, {"logprobs", 0}, {"stream", stream}};
      req["logit_bias"] = {{"65", 100}};
      if (with_stop) req["stop"] = "AB";
      auto r = http(port_, "POST", "/v1/completions", req.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      std::vector<int64_t> off;
      std::string text;
      if (!stream) {
        const json body = r.j();
        text = body["choices"][0]["text"];
        for (auto& o : body["choices"][0]["logprobs"]["text_offset"]) off.push_back(o);
      } else {
        for (const auto& e : sse_payloads(r.body)) {
          if (e == "[DONE]") continue;
          const json c = json::parse(e)["choices"][0];
          text += c["text"].get<std::string>();
          if (c["logprobs"].is_object())
            for (auto& o : c["logprobs"]["text_offset"]) off.push_back(o);
        }
      }
      EXPECT_EQ(text, "AAAAAA");
      EXPECT_EQ(off, (std::vector<int64_t>{0, 1, 2, 3, 4, 5})) << r.body;
    }
}

// Parameters this server does not implement are refused with a 400 naming them, not ignored:
// best_of other than n, malformed logit_bias, an unknown response_format type; and a prompt list
// mixing strings with token-id arrays (outside OpenAI's schema).
TEST_F(ApiTest, UnsupportedOrMalformedSamplingParametersAreRefused) {
  auto post = [&](const json& extra, const char* path = "/v1/completions") {
    json req = {{"prompt", "abc"}, {"max_tokens", 2}};
    if (std::string(path) != "/v1/completions")
      req = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 2}};
    for (auto& [k, v] : extra.items()) req[k] = v;
    return http(port_, "POST", path, req.dump());
  };
  auto expect_400 = [&](const Response& r, const std::string& param) {
    EXPECT_EQ(r.status, 400) << r.body;
    if (r.status == 400) {
      EXPECT_EQ(r.j()["error"]["param"], param) << r.body;
    }
  };
  expect_400(post({{"best_of", 3}}), "best_of");
  expect_400(post({{"best_of", 0}}), "best_of");
  EXPECT_EQ(post({{"best_of", 2}, {"n", 2}}).status, 200);
  expect_400(post({{"prompt", json::array({json::array({1, 2}), "a"})}}), "prompt");
  expect_400(post({{"prompt", json::array({"a", json::array({1, 2})})}}), "prompt");
  EXPECT_EQ(post({{"prompt", json::array({json::array({1, 2}), json::array({3})})}}).status, 200);
  EXPECT_EQ(post({{"best_of", nullptr}}).status, 200);
  expect_400(post({{"logit_bias", json::array({1, 2})}}), "logit_bias");
  expect_400(post({{"logit_bias", {{"abc", 1}}}}), "logit_bias");
  expect_400(post({{"logit_bias", {{"-1", 1}}}}), "logit_bias");
  expect_400(post({{"logit_bias", {{std::to_string(kVocab), 1}}}}), "logit_bias");
  expect_400(post({{"logit_bias", {{"5", 100.5}}}}), "logit_bias");
  expect_400(post({{"logit_bias", {{"5", "x"}}}}), "logit_bias");
  expect_400(post({{"logit_bias", {{"65", 100}, {"065", -100}}}}), "logit_bias");  // alias of 65
  expect_400(post({{"logit_bias", {{"4294967296", 1}}}}), "logit_bias");
  EXPECT_EQ(post({{"logit_bias", {{"0", 1}, {"65", 1e2}}}}).status, 200);
  expect_400(post({{"response_format", {{"type", "json_object"}}}}), "response_format");
  EXPECT_EQ(post({{"response_format", {{"type", "text"}}}}).status, 200);
  for (const char* k : {"guided_json", "guided_regex", "guided_choice", "structured_outputs"})
    expect_400(post({{k, k == std::string("guided_choice") ? json::array({"a", "b"}) : json("x")}}), k);
  expect_400(post({{"min_tokens", 5}}), "min_tokens");
  expect_400(post({{"use_beam_search", true}}), "use_beam_search");
  EXPECT_EQ(post({{"min_tokens", 0}, {"use_beam_search", false}, {"guided_json", nullptr}}).status, 200);
  EXPECT_EQ(post({{"logit_bias", nullptr}}).status, 200);
  const char* chat = "/v1/chat/completions";
  expect_400(post({{"response_format", {{"type", "xml"}}}}, chat), "response_format");
  expect_400(post({{"response_format", "json"}}, chat), "response_format");
  expect_400(post({{"response_format", {{"type", "json_schema"}}}}, chat), "response_format");
  EXPECT_EQ(post({{"response_format", {{"type", "text"}}}}, chat).status, 200);
  expect_400(post({{"logit_bias", {{"5", -101}}}}, chat), "logit_bias");
  expect_400(post({{"best_of", 2}}, chat), "best_of");
  expect_400(post({{"guided_json", {{"type", "object"}}}}, chat), "guided_json");
}

// response_format json_object / json_schema reaches the prompt as DeepSeek V4's response-format
// block on the system message (chat-encoding §2.8): the prompt is exactly the encoder's output
// for the messages with it attached — to the existing system message, or to a new empty one.
TEST_F(ApiTest, ResponseFormatReachesThePrompt) {
  text::ChatOptions opt;
  opt.thinking_mode = text::ThinkingMode::kChat;
  const json rf = {{"type", "json_object"}};
  for (bool with_system : {true, false}) {
    SCOPED_TRACE(with_system ? "system message" : "no system message");
    json msgs = json::array({{{"role", "user"}, {"content", "hello"}}});
    if (with_system) msgs.insert(msgs.begin(), json{{"role", "system"}, {"content", "be brief"}});
    json want = msgs;
    if (with_system) {
      msgs[0]["response_format"] = nullptr;  // a null per-message format does not block the request's
      want[0]["response_format"] = rf;
    }
    else
      want.insert(want.begin(), json{{"role", "system"}, {"content", ""}, {"response_format", rf}});
    auto enc = text::ChatEncoder::encode(tok_, nlohmann::ordered_json::parse(want.dump()), nullptr, opt);
    auto plain = text::ChatEncoder::encode(tok_, nlohmann::ordered_json::parse(msgs.dump()), nullptr, opt);
    ASSERT_TRUE(enc.ok() && plain.ok());
    ASSERT_GT(enc->size(), plain->size());
    json req = {{"messages", msgs}, {"max_tokens", 1}, {"temperature", 0}, {"response_format", rf}};
    auto r = http(port_, "POST", "/v1/chat/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j()["usage"]["prompt_tokens"], int64_t(enc->size()));
    req["response_format"] = {{"type", "text"}};
    auto t = http(port_, "POST", "/v1/chat/completions", req.dump());
    ASSERT_EQ(t.status, 200) << t.body;
    EXPECT_EQ(t.j()["usage"]["prompt_tokens"], int64_t(plain->size()));
  }
}

TEST_F(ApiTest, ChatNonStreamAndStream) {
  json msgs = json::array({{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hello"}}});
  nlohmann::ordered_json om = nlohmann::ordered_json::parse(msgs.dump());
  text::ChatOptions opt;
  opt.thinking_mode = text::ThinkingMode::kChat;
  auto enc = text::ChatEncoder::encode(tok_, om, nullptr, opt);
  ASSERT_TRUE(enc.ok());
  json req = {{"model", "tiny"}, {"messages", msgs}, {"max_tokens", 10}, {"temperature", 0}, {"ignore_eos", true}};
  auto r = http(port_, "POST", "/v1/chat/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.j();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["usage"]["prompt_tokens"], int64_t(enc->size()));
  EXPECT_EQ(j["usage"]["completion_tokens"], 10);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  std::string content = j["choices"][0]["message"]["content"].is_string() ? j["choices"][0]["message"]["content"].get<std::string>() : "";

  req["stream"] = true;
  auto s = http(port_, "POST", "/v1/chat/completions", req.dump());
  ASSERT_EQ(s.status, 200);
  auto ev = sse_payloads(s.body);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
  json first = json::parse(ev[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string streamed;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    json c = json::parse(ev[i]);
    auto& d = c["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) streamed += d["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, content);
  EXPECT_EQ(json::parse(ev[ev.size() - 2])["choices"][0]["finish_reason"], "length");
}

TEST_F(ApiTest, NChoicesAndModels) {
  json req = {{"prompt", "abc"}, {"max_tokens", 3}, {"n", 3}, {"temperature", 1.0}, {"seed", 1}, {"ignore_eos", true}};
  auto r = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.j();
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(j["choices"][i]["index"], i);
  EXPECT_EQ(j["usage"]["completion_tokens"], 9);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);

  auto m = http(port_, "GET", "/v1/models", "");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.j()["data"][0]["id"], "tiny");
  EXPECT_EQ(http(port_, "GET", "/health", "").status, 200);
  auto met = http(port_, "GET", "/metrics", "");
  ASSERT_EQ(met.status, 200);
  EXPECT_NE(met.body.find("v4serve_cache_used_pages{pool=\"kv\"}"), std::string::npos);
  EXPECT_NE(met.body.find("v4serve_time_to_first_token_seconds_count"), std::string::npos);
}

// /v1/models' `created` is the server's start time: the same on every request (clients cache
// and compare it), never the time of the request.
TEST_F(ApiTest, ModelCreatedIsFixedAtStart) {
  const int64_t before = int64_t(std::time(nullptr));
  auto a = http(port_, "GET", "/v1/models", "");
  ASSERT_EQ(a.status, 200) << a.body;
  std::this_thread::sleep_for(1100ms);  // the next request is in a later second
  auto b = http(port_, "GET", "/v1/models/tiny", "");
  ASSERT_EQ(b.status, 200) << b.body;
  const int64_t created = a.j()["data"][0]["created"].get<int64_t>();
  EXPECT_EQ(b.j()["created"].get<int64_t>(), created);
  EXPECT_LE(created, before);  // set when the API was made (SetUp), not per request
}

// The {id} of /v1/models/{id} is a percent-encoded path segment: `%2F` names an id with a '/'
// (it got 404 model_not_found), any escape decodes (either hex case), and a '%' not followed by
// two hex digits is a 400 naming the problem (never a crash: the server answers afterwards).
class SlashModelIdApiTest : public ApiTest {
 protected:
  void SetUp() override {
    served_name_ = "deepseek/v4";
    start("");
  }
};

TEST_F(SlashModelIdApiTest, ModelIdIsPercentDecoded) {
  for (const char* path : {"/v1/models/deepseek%2Fv4", "/v1/models/deepseek%2fv4",
                           "/v1/models/%64eepseek%2Fv%34", "/v1/models/deepseek/v4"}) {
    auto r = http(port_, "GET", path, "");
    ASSERT_EQ(r.status, 200) << path << ": " << r.body;
    EXPECT_EQ(r.j()["id"], "deepseek/v4") << path;
  }
  for (const char* path : {"/v1/models/deepseek%2Fv5", "/v1/models/deepseek%252Fv4"}) {
    auto r = http(port_, "GET", path, "");
    EXPECT_EQ(r.status, 404) << path << ": " << r.body;
    EXPECT_EQ(r.j()["error"]["code"], "model_not_found") << path;
  }
  for (const char* path :
       {"/v1/models/%zz", "/v1/models/deepseek%2", "/v1/models/deepseek%", "/v1/models/%g0v4"}) {
    auto r = http(port_, "GET", path, "");
    EXPECT_EQ(r.status, 400) << path << ": " << r.body;
    json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << path << ": " << r.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << path;
    EXPECT_NE(j["error"]["message"].get<std::string>().find("percent-encoding"), std::string::npos)
        << r.body;
  }
  EXPECT_EQ(http(port_, "GET", "/health", "").status, 200);
}

TEST(PercentDecode, EscapesAndInvalidForms) {
  EXPECT_EQ(percent_decode("deepseek%2Fv4"), "deepseek/v4");
  EXPECT_EQ(percent_decode("a%2fb%41%00c"), std::string("a/bA\0c", 6));
  EXPECT_EQ(percent_decode("a+b c"), "a+b c");
  EXPECT_EQ(percent_decode(""), "");
  for (const char* bad : {"%", "%4", "a%zz", "%g1", "x%2", "%%41"})
    EXPECT_EQ(percent_decode(bad), std::nullopt) << bad;
}

TEST_F(ApiTest, TokenizeDetokenize) {
  auto t = http(port_, "POST", "/tokenize", R"({"prompt":"hi!"})");
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(t.j()["tokens"], json::array({'h', 'i', '!'}));
  EXPECT_EQ(t.j()["count"], 3);
  EXPECT_EQ(t.j()["max_model_len"], 512);
  auto d = http(port_, "POST", "/detokenize", R"({"tokens":[104,105]})");
  ASSERT_EQ(d.status, 200);
  EXPECT_EQ(d.j()["prompt"], "hi");
  auto c = http(port_, "POST", "/tokenize", R"({"messages":[{"role":"user","content":"x"}]})");
  ASSERT_EQ(c.status, 200);
  EXPECT_GT(c.j()["count"].get<int>(), 3);
  EXPECT_EQ(http(port_, "POST", "/detokenize", R"({"tokens":[100000]})").status, 400);
  // The message names the entry and says what is wrong with it.
  auto f = http(port_, "POST", "/detokenize", R"({"tokens":[104,1.5]})");
  EXPECT_EQ(f.status, 400);
  EXPECT_NE(f.body.find("'tokens[1]' must be an integer token id, got 1.5"), std::string::npos) << f.body;
  auto o = http(port_, "POST", "/detokenize", R"({"tokens":[-3]})");
  EXPECT_EQ(o.status, 400);
  EXPECT_NE(o.body.find("'tokens[0]' = -3 is not a token id"), std::string::npos) << o.body;
}

// A field of the wrong JSON type is a 400 naming it, never the handler's 500 "internal error"
// (nlohmann's value() / get() throw on a type mismatch).
TEST_F(ApiTest, WrongTypedFieldsAre400NotInternalErrors) {
  struct Case {
    std::string path, body, param;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", R"({"prompt":"x","max_tokens":2,"response_format":{"type":5}})", "response_format"},
      {"/v1/completions", R"({"prompt":"x","max_tokens":2,"response_format":{"type":null}})", "response_format"},
      {"/v1/completions", R"({"prompt":"x","max_tokens":2,"response_format":{}})", "response_format"},
      {"/tokenize", R"({"prompt":"x","return_token_strs":"yes"})", "return_token_strs"},
      {"/tokenize", R"({"prompt":"x","return_token_strs":1})", "return_token_strs"},
  };
  for (auto& c : cases) {
    auto r = http(port_, "POST", c.path, c.body);
    EXPECT_EQ(r.status, 400) << c.body << " -> " << r.body;
    if (r.status == 400) {
      EXPECT_EQ(r.j()["error"]["param"], c.param) << r.body;
    }
  }
  EXPECT_EQ(http(port_, "POST", "/v1/completions",
                 R"({"prompt":"x","max_tokens":2,"response_format":{"type":"text"}})").status, 200);
  auto t = http(port_, "POST", "/tokenize", R"({"prompt":"hi","return_token_strs":true})");
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(t.j()["token_strs"].size(), 2u);
  EXPECT_TRUE(http(port_, "POST", "/tokenize", R"({"prompt":"hi","return_token_strs":null})").j()["token_strs"].is_null());
}

// A small body nesting 100,000 levels (here in a tool's parameters) is a 400, and the server keeps
// serving: it used to overflow the HTTP thread's stack and crash the process.
TEST_F(ApiTest, DeeplyNestedJsonIsRefusedNotACrash) {
  std::string nested;
  for (int i = 0; i < 100000; ++i) nested += R"({"a":)";
  nested += "1" + std::string(100000, '}');
  const std::string body =
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"tools":[{"type":"function","function":{"name":"f","parameters":)" +
      nested + "}}]}";
  for (const char* path : {"/v1/chat/completions", "/tokenize"}) {
    auto r = http(port_, "POST", path, body);
    EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
    EXPECT_EQ(r.j()["error"]["type"], "invalid_request_error") << r.body.substr(0, 300);
  }
  EXPECT_EQ(http(port_, "GET", "/health", "").status, 200);
}

// context_length_exceeded names the field to shorten: the prompt when it alone leaves no room,
// max_tokens when the prompt fits (it said "prompt" / "messages" for both).
TEST_F(ApiTest, ContextLengthErrorNamesTheFieldToShorten) {
  const std::string long_prompt = json(std::vector<int32_t>(600, 3)).dump();
  auto param_of = [&](const std::string& path, const std::string& body) {
    const auto r = http(port_, "POST", path, body);
    EXPECT_EQ(r.status, 400) << r.body;
    const json j = json::parse(r.body, nullptr, false);
    EXPECT_EQ(j["error"]["code"], "context_length_exceeded") << r.body;
    return j["error"]["param"].is_string() ? j["error"]["param"].get<std::string>() : "";
  };
  EXPECT_EQ(param_of("/v1/completions", R"({"prompt":)" + long_prompt + "}"), "prompt");
  EXPECT_EQ(param_of("/v1/completions", R"({"prompt":[1,2],"max_tokens":511})"), "max_tokens");
  EXPECT_EQ(param_of("/v1/chat/completions",
                     R"({"messages":[{"role":"user","content":"x"}],"max_tokens":511})"),
            "max_tokens");
  // A prompt that fills the context alone is named as such also with max_tokens 0 (echo scoring):
  // the message said "you requested 512 tokens (512 in the prompt, 0 for the completion)", which
  // reads as within the 512-token limit.
  const std::string p512 = json(std::vector<int32_t>(512, 3)).dump();
  const auto r = http(port_, "POST", "/v1/completions",
                      R"({"prompt":)" + p512 + R"(,"max_tokens":0,"echo":true,"logprobs":1})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("the prompt has 512 tokens, leaving no room for the completion"),
            std::string::npos)
      << r.body;
}

TEST_F(ApiTest, ErrorsAreOpenAiShaped) {
  struct Case {
    std::string method, path, body;
    int status;
    std::string code;
  };
  std::string long_prompt = json(std::vector<int32_t>(600, 3)).dump();
  std::vector<Case> cases = {
      {"POST", "/v1/chat/completions", "{bad", 400, ""},
      {"POST", "/v1/chat/completions", R"({"messages":[]})", 400, ""},
      {"POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-3})", 400, ""},
      {"POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":500000})", 400, ""},
      {"POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"model":"gpt-9"})", 404, "model_not_found"},
      {"POST", "/v1/completions", R"({"prompt":)" + long_prompt + "}", 400, "context_length_exceeded"},
      {"POST", "/v1/completions", R"({"prompt":[1,2],"max_tokens":511})", 400, "context_length_exceeded"},
      {"POST", "/v1/completions", std::string("{\"prompt\":\"a\xff\"}"), 400, ""},
      {"GET", "/v1/nothing", "", 404, "not_found"},
      {"GET", "/v1/chat/completions", "", 405, "method_not_allowed"},
      {"DELETE", "/v1/models", "", 405, "method_not_allowed"},
  };
  for (auto& c : cases) {
    auto r = http(port_, c.method, c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.path << " " << c.body << " -> " << r.body;
    json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"].contains("type"));
    EXPECT_TRUE(j["error"].contains("param"));
    EXPECT_TRUE(j["error"].contains("code"));
    if (!c.code.empty()) {
      EXPECT_EQ(j["error"]["code"], c.code) << r.body;
    }
  }
  // Still serving.
  EXPECT_EQ(http(port_, "POST", "/v1/completions", R"({"prompt":[1],"max_tokens":2})").status, 200);
}

TEST_F(ApiTest, ApiKey) {
  TearDown();
  start("sekret");
  const std::string body = R"({"prompt":[1],"max_tokens":1})";
  EXPECT_EQ(http(port_, "POST", "/v1/completions", body).status, 401);
  EXPECT_EQ(http(port_, "POST", "/v1/completions", body, "Authorization: Bearer wrong\r\n").status, 401);
  EXPECT_EQ(http(port_, "POST", "/v1/completions", body, "Authorization: Bearer sekret\r\n").status, 200);
  // The scheme name is case-insensitive (RFC 9110); the key is not.
  EXPECT_EQ(http(port_, "POST", "/v1/completions", body, "Authorization: bearer sekret\r\n").status, 200);
  EXPECT_EQ(http(port_, "POST", "/v1/completions", body, "Authorization: BEARER sekret\r\n").status, 200);
  EXPECT_EQ(http(port_, "POST", "/v1/completions", body, "Authorization: Bearer SEKRET\r\n").status, 401);
  EXPECT_EQ(http(port_, "POST", "/v1/completions", body, "Authorization: Bearer sekret2\r\n").status, 401);
  EXPECT_EQ(http(port_, "POST", "/v1/completions", body, "Authorization: Basic sekret\r\n").status, 401);
  EXPECT_EQ(http(port_, "GET", "/health", "").status, 200);
}

TEST_F(ApiTest, ConcurrentStreamsGreedyAndCancelHalf) {
  const int n = 64;
  const int max_tokens = 48;
  std::vector<std::string> got(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      std::vector<int32_t> prompt = {int32_t(i % 250), int32_t((i * 7) % 250), 3};
      json req = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}, {"stream", true}};
      std::string body = req.dump();
      net::io_context ioc;
      tcp::socket s(ioc);
      s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), uint16_t(port_)));
      std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\n\r\n" + body;
      net::write(s, net::buffer(head));
      std::string all;
      char buf[4096];
      const bool cancel = i % 2 == 1;
      for (;;) {
        boost::system::error_code ec;
        size_t k = s.read_some(net::buffer(buf), ec);
        if (ec) break;
        all.append(buf, k);
        // Odd clients hang up after a few events.
        if (cancel && std::count(all.begin(), all.end(), '\n') > 12) {
          s.close();
          return;
        }
      }
      got[size_t(i)] = all;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; i += 2) {
    std::vector<int32_t> prompt = {int32_t(i % 250), int32_t((i * 7) % 250), 3};
    const std::string& all = got[size_t(i)];
    size_t he = all.find("\r\n\r\n");
    ASSERT_NE(he, std::string::npos);
    // De-chunk and collect text.
    std::string raw = all.substr(he + 4), body;
    size_t p = 0;
    while (p < raw.size()) {
      size_t e = raw.find("\r\n", p);
      size_t k = std::stoul(raw.substr(p, e - p), nullptr, 16);
      if (k == 0) break;
      body += raw.substr(e + 2, k);
      p = e + 2 + k + 2;
    }
    std::string text;
    for (auto& e : sse_payloads(body)) {
      if (e == "[DONE]") continue;
      text += json::parse(e)["choices"][0]["text"].get<std::string>();
    }
    EXPECT_EQ(text, greedy_text(prompt, max_tokens)) << "client " << i;
  }
  // All cancelled requests are gone and their pages freed.
  engine_->wait_idle();
  auto st = engine_->stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  for (auto& p : st.pools) EXPECT_EQ(p.used_pages, 0) << p.name;
}

// A forced stop (`serve`'s second signal): OpenAiApi::abort_generations ends an open stream with an
// OpenAI-style error event (code shutting_down) + [DONE] + the chunked terminator, answers a pending
// non-streaming request with that error as a 503, and ends a request arriving afterwards the same
// way; HttpServer::wait_responses sees every response written.
TEST_F(SlowApiTest, AbortGenerationsEndsOpenRequestsWithAnError) {
  Response streamed, blocking;
  std::thread a([&] {
    streamed = http(port_, "POST", "/v1/completions",
                    R"({"prompt":[1,2,3],"max_tokens":400,"temperature":0,"ignore_eos":true,"stream":true})");
  });
  std::thread b([&] {
    blocking = http(port_, "POST", "/v1/completions",
                    R"({"prompt":[4,5,6],"max_tokens":400,"temperature":0,"ignore_eos":true})");
  });
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (api_->active_generations() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(api_->active_generations(), 2);
  std::this_thread::sleep_for(100ms);  // some tokens streamed (400 steps take 2 s)
  EXPECT_EQ(api_->abort_generations("stopped by the test"), 2);
  EXPECT_TRUE(server_->wait_responses(5000ms));
  EXPECT_EQ(server_->pending_responses(), 0);
  a.join();
  b.join();

  ASSERT_EQ(streamed.status, 200) << streamed.body;
  const auto ev = sse_payloads(streamed.body);
  ASSERT_GE(ev.size(), 3u) << streamed.body;
  EXPECT_EQ(ev.back(), "[DONE]");
  const json err = json::parse(ev[ev.size() - 2]);
  EXPECT_EQ(err["error"]["code"], "shutting_down") << err;
  EXPECT_EQ(err["error"]["type"], "service_unavailable") << err;
  EXPECT_EQ(err["error"]["message"], "stopped by the test") << err;
  int text_chunks = 0;
  for (size_t i = 0; i + 2 < ev.size(); ++i) {
    const json c = json::parse(ev[i]);
    EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null()) << c;  // cut, not finished
    text_chunks += !c["choices"][0]["text"].get<std::string>().empty();
  }
  EXPECT_GT(text_chunks, 0) << streamed.body;

  EXPECT_EQ(blocking.status, 503) << blocking.body;
  EXPECT_EQ(blocking.j()["error"]["code"], "shutting_down") << blocking.body;

  // A request arriving after the abort ends at once with the same error.
  const auto late = http(port_, "POST", "/v1/completions",
                         R"({"prompt":[7],"max_tokens":400,"stream":true})");
  ASSERT_EQ(late.status, 200) << late.body;
  const auto lev = sse_payloads(late.body);
  ASSERT_EQ(lev.size(), 2u) << late.body;
  EXPECT_EQ(json::parse(lev[0])["error"]["code"], "shutting_down");
  EXPECT_EQ(lev[1], "[DONE]");
  engine_->wait_idle();
  for (auto& p : engine_->stats().pools) EXPECT_EQ(p.used_pages, 0) << p.name;
}

// Prefix continuation: `continue_final_message: true` (vLLM) or `"prefix": true` on the final
// assistant message (DeepSeek API) renders that message without its EOS (wo_eos) and the model
// continues it; the continuation comes back as content (in thinking mode too: the encoder renders
// the message `{reasoning}</think>{content}`, so the prompt ends in the content part).
TEST_F(ApiTest, PrefixContinuationRendersTheFinalAssistantMessageWithoutEos) {
  for (bool thinking : {false, true}) {
    for (int how = 0; how < 3; ++how) {  // 0: neither flag, 1: continue_final_message, 2: prefix
      SCOPED_TRACE(std::string(thinking ? "thinking" : "chat") + " how=" + std::to_string(how));
      json msgs = json::array({{{"role", "user"}, {"content", "Say hello world"}},
                               {{"role", "assistant"}, {"content", "Hello wor"}}});
      json req = {{"messages", msgs}, {"chat_template_kwargs", {{"thinking", thinking}}}};
      if (how == 1) req["continue_final_message"] = true;
      if (how == 2) req["messages"][1]["prefix"] = true;
      if (how == 1 && thinking) req["add_generation_prompt"] = false;  // vLLM's spelling passes too
      text::ChatOptions opt;
      opt.thinking_mode = thinking ? text::ThinkingMode::kThinking : text::ThinkingMode::kChat;
      json want = msgs;
      if (how != 0) want[1]["wo_eos"] = true;
      auto enc = text::ChatEncoder::encode(tok_, nlohmann::ordered_json::parse(want.dump()), nullptr, opt);
      ASSERT_TRUE(enc.ok());
      auto t = http(port_, "POST", "/tokenize", req.dump());
      ASSERT_EQ(t.status, 200) << t.body;
      std::vector<int32_t> toks = t.j()["tokens"].get<std::vector<int32_t>>();
      EXPECT_EQ(toks, *enc);
      ASSERT_FALSE(toks.empty());
      if (how == 0) {
        EXPECT_EQ(toks.back(), kEos);  // unchanged without either flag
        continue;
      }
      EXPECT_NE(toks.back(), kEos);
      const std::string text = tok_.decode(toks, false);
      EXPECT_EQ(text.substr(text.size() - 9), "Hello wor") << text;
      if (thinking) {
        EXPECT_NE(text.find("</think>Hello wor"), std::string::npos) << text;
      }

      json creq = req;
      creq["max_tokens"] = 6;
      creq["temperature"] = 0;
      creq["ignore_eos"] = true;
      auto r = http(port_, "POST", "/v1/chat/completions", creq.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      json j = r.j();
      EXPECT_EQ(j["usage"]["prompt_tokens"], int64_t(enc->size()));
      EXPECT_EQ(j["usage"]["completion_tokens"], 6);
      const json& m = j["choices"][0]["message"];
      // Only the continuation, parsed as content (no reasoning even in thinking mode).
      EXPECT_TRUE(!m.contains("reasoning_content") || m["reasoning_content"].is_null()) << r.body;
      ASSERT_TRUE(m["content"].is_string()) << r.body;
      EXPECT_EQ(m["content"].get<std::string>(), greedy_text(*enc, 6)) << r.body;
    }
  }
}

TEST_F(ApiTest, PrefixContinuationErrorsNameTheField) {
  const json user = {{"role", "user"}, {"content", "hi"}};
  const json asst = {{"role", "assistant"}, {"content", "Hel"}};
  json pre = asst;
  pre["prefix"] = true;
  json tc = asst;
  tc["tool_calls"] = json::array({{{"id", "c1"}, {"type", "function"},
                                   {"function", {{"name", "f"}, {"arguments", "{}"}}}}});
  struct Case {
    json body;
    std::string param, needle;
  };
  const std::vector<Case> cases = {
      // continue_final_message with a last message that is not an assistant message
      {{{"messages", {user}}, {"continue_final_message", true}}, "continue_final_message", "continue_final_message"},
      // continue_final_message with an explicit add_generation_prompt: true (vLLM's rule)
      {{{"messages", {user, asst}}, {"continue_final_message", true}, {"add_generation_prompt", true}},
       "continue_final_message", "add_generation_prompt"},
      // non-boolean values
      {{{"messages", {user, asst}}, {"continue_final_message", "yes"}}, "continue_final_message", "continue_final_message"},
      {{{"messages", {user, asst}}, {"continue_final_message", 1}}, "continue_final_message", "continue_final_message"},
      {{{"messages", {user, json{{"role", "assistant"}, {"content", "Hel"}, {"prefix", "true"}}}}}, "messages",
       "messages[1].prefix"},
      // prefix on a message that is not the last / not an assistant message
      {{{"messages", {user, pre, user}}}, "messages", "messages[1].prefix"},
      {{{"messages", {json{{"role", "user"}, {"content", "hi"}, {"prefix", true}}}}}, "messages", "messages[0].prefix"},
      // an assistant message with tool calls cannot be continued
      {{{"messages", {user, tc}}, {"continue_final_message", true}}, "continue_final_message", "tool_calls"},
  };
  for (const auto& c : cases) {
    for (const char* path : {"/v1/chat/completions", "/tokenize"}) {
      SCOPED_TRACE(std::string(path) + " " + c.body.dump());
      auto r = http(port_, "POST", path, c.body.dump());
      ASSERT_EQ(r.status, 400) << r.body;
      json e = r.j()["error"];
      EXPECT_EQ(e["param"], c.param) << r.body;
      EXPECT_NE(e["message"].get<std::string>().find(c.needle), std::string::npos) << r.body;
    }
  }
  // false / null flags change nothing
  for (const json& body : {json{{"messages", {user, asst}}, {"continue_final_message", false}},
                           json{{"messages", {user, asst}}, {"continue_final_message", nullptr}},
                           json{{"messages", {user, json{{"role", "assistant"}, {"content", "Hel"}, {"prefix", false}}}}}}) {
    auto t = http(port_, "POST", "/tokenize", body.dump());
    ASSERT_EQ(t.status, 200) << t.body;
    EXPECT_EQ(t.j()["tokens"].back(), kEos) << body.dump();
  }
}

// Logprobs are always JSON numbers: −inf (zero probability) and NaN (non-finite logits, e.g. NaN
// weights) as −9999.0, +inf as 0 — the JSON library alone writes them as null.
TEST(LogprobJson, NonFiniteValuesBecomeNumbers) {
  EXPECT_EQ(logprob_json(-0.25f).dump(), "-0.25");
  EXPECT_EQ(logprob_json(0.f).get<double>(), 0.0);
  EXPECT_EQ(logprob_json(-std::numeric_limits<float>::infinity()).get<double>(), -9999.0);
  EXPECT_EQ(logprob_json(std::numeric_limits<float>::quiet_NaN()).get<double>(), -9999.0);
  EXPECT_EQ(logprob_json(std::numeric_limits<float>::infinity()).get<double>(), 0.0);
  for (float v : {-std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    EXPECT_EQ(logprob_json(v).dump().find("null"), std::string::npos);
}

namespace {
// A counter's value in Prometheus text (0 when absent).
double metric(const std::string& text, const std::string& name) {
  size_t p = 0;
  while ((p = text.find(name + " ", p)) != std::string::npos) {
    if (p == 0 || text[p - 1] == '\n') return std::stod(text.substr(p + name.size() + 1));
    p += name.size();
  }
  return 0;
}
}  // namespace

// /metrics counts each prompt once per request, as usage.prompt_tokens does: n = 3 moves
// v4serve_prompt_tokens_total by the prompt's length and the prompt-length histogram by one
// observation per prompt (it used to count the prompt once per choice).
TEST_F(ApiTest, PromptTokenMetricsCountEachPromptOnce) {
  auto before = http(port_, "GET", "/metrics", "").body;
  json req = {{"prompt", {10, 20, 30, 40, 50}}, {"max_tokens", 3}, {"temperature", 0.8},
              {"ignore_eos", true}, {"n", 3}};
  auto r = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j()["choices"].size(), 3u);
  const int64_t usage_prompt = r.j()["usage"]["prompt_tokens"];
  EXPECT_EQ(usage_prompt, 5);
  auto after = http(port_, "GET", "/metrics", "").body;
  EXPECT_EQ(metric(after, "v4serve_prompt_tokens_total") - metric(before, "v4serve_prompt_tokens_total"),
            usage_prompt) << after;
  EXPECT_EQ(metric(after, "v4serve_request_prompt_tokens_sum") -
                metric(before, "v4serve_request_prompt_tokens_sum"), usage_prompt) << after;
  EXPECT_EQ(metric(after, "v4serve_request_prompt_tokens_count") -
                metric(before, "v4serve_request_prompt_tokens_count"), 1) << after;
  EXPECT_EQ(metric(after, "v4serve_generation_tokens_total") -
                metric(before, "v4serve_generation_tokens_total"), 9) << after;
  // Two prompts, n = 2: each prompt once.
  before = after;
  req = {{"prompt", json::array({json::array({1, 2, 3}), json::array({4, 5, 6, 7})})},
         {"max_tokens", 2}, {"temperature", 0.8}, {"ignore_eos", true}, {"n", 2}};
  r = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["usage"]["prompt_tokens"], 7);
  after = http(port_, "GET", "/metrics", "").body;
  EXPECT_EQ(metric(after, "v4serve_prompt_tokens_total") - metric(before, "v4serve_prompt_tokens_total"), 7)
      << after;
  EXPECT_EQ(metric(after, "v4serve_request_prompt_tokens_count") -
                metric(before, "v4serve_request_prompt_tokens_count"), 2) << after;
}

// /metrics: the engine's aborted counter and the choices finished with "abort" count the same
// requests. A stop-string finish (the server cancels the engine request) is a finished request
// with finish_reason "stop", not an abort; n = 4 streams whose client hangs up are 4 aborts on
// both counters.
TEST_F(SlowApiTest, AbortCountersAgree) {
  // Stop strings: both (greedy, equal) choices stop at an ASCII letter of the fake's output.
  std::vector<int32_t> prompt;
  std::string stop;
  for (int32_t a = 1; a < 200 && stop.empty(); ++a) {
    prompt = {a, 8, 9};
    const std::string text = greedy_text(prompt, 4);
    for (size_t i = 1; i < text.size() && stop.empty(); ++i)
      if (std::isalpha(static_cast<unsigned char>(text[i]))) stop = text.substr(i, 1);
  }
  ASSERT_FALSE(stop.empty());
  json req = {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true},
              {"n", 2}, {"stop", json::array({stop})}};
  auto r = http(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j()["choices"][0]["finish_reason"], "stop") << r.body;
  // Streams of n = 4 whose client hangs up after the first events.
  for (int k = 0; k < 3; ++k) {
    json sreq = {{"prompt", prompt}, {"max_tokens", 300}, {"temperature", 0}, {"ignore_eos", true},
                 {"n", 4}, {"stream", true}};
    const std::string body = sreq.dump();
    net::io_context ioc;
    tcp::socket s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), uint16_t(port_)));
    net::write(s, net::buffer("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body));
    std::string all;
    char buf[4096];
    while (std::count(all.begin(), all.end(), '\n') < 12) {
      boost::system::error_code ec;
      size_t n = s.read_some(net::buffer(buf), ec);
      if (ec) break;
      all.append(buf, n);
    }
    s.close();
  }
  // Wait until every choice is accounted for.
  std::string m;
  for (int i = 0; i < 400; ++i) {
    m = http(port_, "GET", "/metrics", "").body;
    if (metric(m, "v4serve_request_success_total{finish_reason=\"abort\"}") >= 12) break;
    std::this_thread::sleep_for(10ms);
  }
  engine_->wait_idle();
  m = http(port_, "GET", "/metrics", "").body;
  EXPECT_EQ(metric(m, "v4serve_request_success_total{finish_reason=\"abort\"}"), 12) << m;
  EXPECT_EQ(metric(m, "v4serve_engine_requests_aborted_total"), 12) << m;
  EXPECT_EQ(metric(m, "v4serve_request_success_total{finish_reason=\"stop\"}"), 2) << m;
  EXPECT_EQ(metric(m, "v4serve_engine_requests_finished_total"), 2) << m;
}
