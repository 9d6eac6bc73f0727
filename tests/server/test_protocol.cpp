// Request validation / schema conversion, error bodies, SSE framing, stop strings, metrics text.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "server/metrics.h"
#include "server/protocol.h"

using namespace v4::server;

namespace {

ValidationLimits limits() {
  ValidationLimits l;
  l.max_context = 4096;
  l.vocab_size = 1000;
  return l;
}

// Parses `body` as a chat request; returns the error (status 0 when it was accepted).
ApiError chat_err(const std::string& body, GenerateRequest* out = nullptr) {
  ApiError err;
  err.status = 0;
  auto j = parse_json_body(body, &err);
  if (!j.ok()) return err;
  GenerateRequest r;
  if (!parse_chat_request(*j, limits(), &r, &err)) return err;
  if (out) *out = r;
  err.status = 0;
  return err;
}

ApiError completion_err(const std::string& body, GenerateRequest* out = nullptr) {
  ApiError err;
  err.status = 0;
  auto j = parse_json_body(body, &err);
  if (!j.ok()) return err;
  GenerateRequest r;
  if (!parse_completion_request(*j, limits(), &r, &err)) return err;
  if (out) *out = r;
  err.status = 0;
  return err;
}

const char* kMsg = R"("messages":[{"role":"user","content":"hi"}])";

}  // namespace

TEST(Protocol, ChatDefaultsAndConversion) {
  GenerateRequest r;
  ApiError e = chat_err(std::string("{") + kMsg + R"(,"model":"m","max_tokens":7,"temperature":0,
      "top_p":0.5,"top_k":20,"min_p":0.1,"seed":42,"presence_penalty":1.5,"frequency_penalty":-1,
      "stop":["x","yz"],"n":2,"stream":true,"stream_options":{"include_usage":true},
      "logprobs":true,"top_logprobs":3,"ignore_eos":true})", &r);
  ASSERT_EQ(e.status, 0) << e.message;
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.max_tokens.value(), 7);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 20);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_EQ(r.sampling.seed.value(), 42u);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 1.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -1.0f);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.sampling.logprobs);
  EXPECT_EQ(r.sampling.top_logprobs, 3);
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_FALSE(r.thinking);
  ASSERT_EQ(r.messages.size(), 1u);

  GenerateRequest d;
  ASSERT_EQ(chat_err(std::string("{") + kMsg + "}", &d).status, 0);
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_EQ(d.sampling.temperature, 1.0f);
  EXPECT_EQ(d.n, 1);
  EXPECT_FALSE(d.stream);
  EXPECT_TRUE(d.stop.empty());
}

TEST(Protocol, MaxCompletionTokensWinsAndStopString) {
  GenerateRequest r;
  ASSERT_EQ(chat_err(std::string("{") + kMsg + R"(,"max_tokens":5,"max_completion_tokens":9,"stop":"END"})", &r).status, 0);
  EXPECT_EQ(r.max_tokens.value(), 9);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"END"}));
}

TEST(Protocol, ThinkingSwitches) {
  GenerateRequest r;
  ASSERT_EQ(chat_err(std::string("{") + kMsg + R"(,"chat_template_kwargs":{"thinking":true}})", &r).status, 0);
  EXPECT_TRUE(r.thinking);
  ASSERT_EQ(chat_err(std::string("{") + kMsg + R"(,"chat_template_kwargs":{"enable_thinking":true}})", &r).status, 0);
  EXPECT_TRUE(r.thinking);
  ASSERT_EQ(chat_err(std::string("{") + kMsg + R"(,"reasoning_effort":"high"})", &r).status, 0);
  EXPECT_TRUE(r.thinking);
  EXPECT_EQ(r.reasoning_effort.value(), "high");
  ASSERT_EQ(chat_err(std::string("{") + kMsg + R"(,"reasoning_effort":"max","chat_template_kwargs":{"thinking":false}})", &r).status, 0);
  EXPECT_FALSE(r.thinking);
  ASSERT_EQ(chat_err(std::string("{") + kMsg + R"(,"thinking":{"type":"enabled"}})", &r).status, 0);
  EXPECT_TRUE(r.thinking);
  ASSERT_EQ(chat_err(std::string("{") + kMsg + R"(,"reasoning_effort":"none"})", &r).status, 0);
  EXPECT_FALSE(r.thinking);
  EXPECT_EQ(chat_err(std::string("{") + kMsg + R"(,"reasoning_effort":"extreme"})").param, "reasoning_effort");
  EXPECT_EQ(chat_err(std::string("{") + kMsg + R"(,"chat_template_kwargs":{"thinking":"yes"}})").status, 400);
}

TEST(Protocol, ToolsAndToolChoice) {
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])";
  GenerateRequest r;
  ASSERT_EQ(chat_err(std::string("{") + kMsg + "," + tools + R"(,"tool_choice":"auto"})", &r).status, 0);
  EXPECT_EQ(r.tools.size(), 1u);
  ASSERT_EQ(chat_err(std::string("{") + kMsg + "," + tools + R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}}})", &r).status, 0);
  EXPECT_EQ(r.tool_choice, "get_weather");
  EXPECT_EQ(chat_err(std::string("{") + kMsg + "," + tools + R"(,"tool_choice":{"type":"function","function":{"name":"nope"}}})").param, "tool_choice");
  EXPECT_EQ(chat_err(std::string("{") + kMsg + R"(,"tools":[{"type":"function"}]})").param, "tools");
  EXPECT_EQ(chat_err(std::string("{") + kMsg + R"(,"tools":{}})").param, "tools");
  EXPECT_EQ(chat_err(std::string("{") + kMsg + R"(,"tool_choice":"required"})").param, "tool_choice");
  // An assistant tool call + tool result history is accepted (encoded later by ChatEncoder).
  ASSERT_EQ(chat_err(R"({"messages":[{"role":"user","content":"w?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"sunny"}],)" + tools + "}", &r).status, 0);
  EXPECT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"assistant","tool_calls":[{"id":"c1"}]}]})").status, 400);
  // Function names as OpenAI accepts them: 1–64 of a-z A-Z 0-9 _ - (the name is written into the
  // DSML prompt verbatim; a quote would rewrite the invoke tag).
  auto named = [](const std::string& name) {
    return std::string("{") + kMsg + R"(,"tools":[{"type":"function","function":{"name":)" + name +
           "}}]}";
  };
  const std::string long65 = "\"" + std::string(65, 'x') + "\"", long64 = "\"" + std::string(64, 'x') + "\"";
  for (const std::string& bad : std::vector<std::string>{R"("")", R"("a\" evil=\"1")", R"("get weather")",
                                                         R"("a.b")", R"("ünï")", long65}) {
    const ApiError e = chat_err(named(bad));
    EXPECT_EQ(e.status, 400) << bad;
    EXPECT_EQ(e.param, "tools") << bad;
    EXPECT_NE(e.message.find("tools[0].function.name"), std::string::npos) << e.message;
  }
  for (const std::string& ok : std::vector<std::string>{R"("get_weather")", R"("A-1_b")", long64})
    EXPECT_EQ(chat_err(named(ok)).status, 0) << ok;
}

// An assistant message's tool_calls[j].function.name follows the tools[i].function.name rule
// (1–64 of a-z A-Z 0-9 _ -): it is written into the DSML prompt verbatim as well, so a quote would
// rewrite the invoke tag. The 400 names the field path.
TEST(Protocol, HistoryToolCallNamesAreValidatedLikeToolNames) {
  auto history_with = [](const std::string& name) {
    return R"({"messages":[{"role":"user","content":"w?"},{"role":"assistant","content":"ok"},
        {"role":"assistant","content":null,"tool_calls":[
          {"id":"c0","type":"function","function":{"name":"f","arguments":"{}"}},
          {"id":"c1","type":"function","function":{"name":)" +
           name + R"(,"arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"c0","content":"sunny"}]})";
  };
  const std::string long65 = "\"" + std::string(65, 'x') + "\"",
                    long64 = "\"" + std::string(64, 'x') + "\"";
  for (const std::string& bad : std::vector<std::string>{
           R"("")", R"("a\" evil=\"1")", R"("get weather")", R"("a.b")", R"("ünï")", long65}) {
    const ApiError e = chat_err(history_with(bad));
    EXPECT_EQ(e.status, 400) << bad;
    EXPECT_EQ(e.type, "invalid_request_error") << bad;
    EXPECT_EQ(e.param, "messages") << bad;
    EXPECT_NE(e.message.find("'messages[2].tool_calls[1].function.name'"), std::string::npos)
        << e.message;
  }
  for (const std::string& ok : std::vector<std::string>{R"("get_weather")", R"("A-1_b")", long64})
    EXPECT_EQ(chat_err(history_with(ok)).status, 0) << ok;
}

// tools[].function.parameters must be a JSON Schema object, and an assistant tool call's
// arguments string must be JSON (OpenAI sends it JSON-encoded): otherwise a 400 whose message names
// the field path. An arguments object is accepted on purpose (chat-encoding §2.6), and JSON that is
// not an object is left to the encoder, which refuses it naming the field.
TEST(Protocol, ToolSchemasAndCallArgumentsMustBeJson) {
  auto tools_with = [](const std::string& params) {
    return std::string("{") + kMsg +
           R"(,"tools":[{"type":"function","function":{"name":"a","parameters":{}}},)"
           R"({"type":"function","function":{"name":"b","parameters":)" +
           params + "}}]}";
  };
  for (const char* bad : {R"("{\"type\": \"object\"}")", "[]", "5", "true"}) {
    ApiError e = chat_err(tools_with(bad));
    EXPECT_EQ(e.status, 400) << bad;
    EXPECT_EQ(e.type, "invalid_request_error") << bad;
    EXPECT_EQ(e.param, "tools") << bad;
    EXPECT_NE(e.message.find("tools[1].function.parameters"), std::string::npos) << e.message;
  }
  EXPECT_EQ(chat_err(tools_with(R"({"type":"object","properties":{}})")).status, 0);
  EXPECT_EQ(chat_err(tools_with("null")).status, 0);  // null: no parameters
  EXPECT_EQ(chat_err(std::string("{") + kMsg +
                     R"(,"tools":[{"type":"function","function":{"name":"f"}}]})")
                .status,
            0);

  auto history_with = [](const std::string& args) {
    return R"({"messages":[{"role":"user","content":"w?"},{"role":"assistant","content":"ok"},
        {"role":"user","content":"again"},
        {"role":"assistant","content":null,"tool_calls":[
          {"id":"c0","type":"function","function":{"name":"f","arguments":"{}"}},
          {"id":"c1","type":"function","function":{"name":"f","arguments":)" +
           args + R"(}}]},
        {"role":"tool","tool_call_id":"c0","content":"sunny"}]})";
  };
  // Not JSON, JSON that is not an object (as a string or as a value), and non-string scalars.
  for (const char* bad : {R"("{\"city\": \"Paris\"")", R"("city=Paris")", R"("{'a': 1}")",
                          R"("[1,2]")", R"("5")", "5", "true", "[1]"}) {
    ApiError e = chat_err(history_with(bad));
    EXPECT_EQ(e.status, 400) << bad;
    EXPECT_EQ(e.type, "invalid_request_error") << bad;
    EXPECT_EQ(e.param, "messages") << bad;
    EXPECT_NE(e.message.find("messages[3].tool_calls[1].function.arguments"), std::string::npos)
        << e.message;
  }
  // "" (some clients' form of a call without arguments) and null stay accepted, as before.
  for (const char* ok : {R"("{\"city\": \"Paris\", \"days\": 3}")", R"("{}")", R"("")", "null",
                         R"({"city": "Paris"})", R"("{\"x\": NaN}")"}) {
    EXPECT_EQ(chat_err(history_with(ok)).status, 0) << ok;
  }
  // Arguments nested past the reader's 512 levels are refused for that, not as "not valid
  // JSON" (they are valid JSON); 512 levels still pass.
  auto nested = [](int levels) {
    return "\"" + std::string(size_t(levels - 1), '[') + R"({\"a\":1})" +
           std::string(size_t(levels - 1), ']') + "\"";
  };
  ApiError deep = chat_err(history_with(nested(600)));
  EXPECT_EQ(deep.status, 400);
  EXPECT_NE(deep.message.find("nested deeper than 512 levels"), std::string::npos) << deep.message;
  EXPECT_EQ(deep.message.find("not valid JSON"), std::string::npos) << deep.message;
  EXPECT_NE(deep.message.find("messages[3].tool_calls[1].function.arguments"), std::string::npos);
  EXPECT_EQ(chat_err(history_with(nested(1))).status, 0);
}

// A message's optional string fields (name, tool_call_id) with another type, and an empty content
// array, are refused naming the message (they were accepted and rendered as "5" or dropped);
// strings and null stay accepted.
TEST(Protocol, MessageFieldTypes) {
  for (const char* bad : {R"({"messages":[{"role":"user","content":"hi","name":5}]})",
                          R"({"messages":[{"role":"user","content":"hi"},{"role":"tool","content":"x","tool_call_id":5}]})",
                          R"({"messages":[{"role":"user","content":"hi","name":{"a":1}}]})",
                          R"({"messages":[{"role":"user","content":[]}]})"}) {
    const ApiError e = chat_err(bad);
    EXPECT_EQ(e.status, 400) << bad;
    EXPECT_EQ(e.param, "messages") << bad;
    EXPECT_NE(e.message.find("messages["), std::string::npos) << e.message;
  }
  EXPECT_NE(chat_err(R"({"messages":[{"role":"user","content":"hi","name":5}]})").message.find("'messages[0].name' must be a string"),
            std::string::npos);
  for (const char* ok : {R"({"messages":[{"role":"user","content":"hi","name":"alice"}]})",
                         R"({"messages":[{"role":"user","content":"hi","name":null}]})",
                         R"({"messages":[{"role":"user","content":"hi"},{"role":"tool","content":"x","tool_call_id":"c1"}]})"}) {
    EXPECT_EQ(chat_err(ok).status, 0) << ok;
  }
}

TEST(Protocol, MalformedChatRequests) {
  struct Case {
    std::string body;
    std::string param;
  };
  std::vector<Case> cases = {
      {"{not json", ""},
      {"[1,2]", ""},
      {"", ""},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":"hi"})", "messages"},
      {R"({})", "messages"},
      {R"({"messages":[{"content":"x"}]})", "messages"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", "messages"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages"},
      {R"({"messages":[{"role":"user"}]})", "messages"},
      {R"({"messages":[1]})", "messages"},
      {std::string("{") + kMsg + R"(,"max_tokens":-1})", "max_tokens"},
      {std::string("{") + kMsg + R"(,"max_tokens":0})", "max_tokens"},
      {std::string("{") + kMsg + R"(,"max_tokens":1000000000000})", "max_tokens"},
      {std::string("{") + kMsg + R"(,"max_tokens":99999999999999999999})", "max_tokens"},
      {std::string("{") + kMsg + R"(,"max_tokens":"10"})", "max_tokens"},
      {std::string("{") + kMsg + R"(,"max_tokens":1.5})", "max_tokens"},
      {std::string("{") + kMsg + R"(,"max_completion_tokens":-5})", "max_completion_tokens"},
      {std::string("{") + kMsg + R"(,"temperature":"hot"})", "temperature"},
      {std::string("{") + kMsg + R"(,"temperature":3})", "temperature"},
      {std::string("{") + kMsg + R"(,"top_p":0})", "top_p"},
      {std::string("{") + kMsg + R"(,"top_p":1.1})", "top_p"},
      // Positive as doubles but 0 as the engine's f32: refused here, naming the field (the
      // engine refused them with param "prompt").
      {std::string("{") + kMsg + R"(,"top_p":5e-324})", "top_p"},
      {std::string("{") + kMsg + R"(,"repetition_penalty":1e-50})", "repetition_penalty"},
      {std::string("{") + kMsg + R"(,"top_k":-2})", "top_k"},
      {std::string("{") + kMsg + R"(,"min_p":2})", "min_p"},
      {std::string("{") + kMsg + R"(,"presence_penalty":3})", "presence_penalty"},
      {std::string("{") + kMsg + R"(,"frequency_penalty":-2.5})", "frequency_penalty"},
      {std::string("{") + kMsg + R"(,"n":0})", "n"},
      {std::string("{") + kMsg + R"(,"n":1000})", "n"},
      {std::string("{") + kMsg + R"(,"stream":"yes"})", "stream"},
      {std::string("{") + kMsg + R"(,"stream_options":{"include_usage":true}})", "stream_options"},
      {std::string("{") + kMsg + R"(,"stop":5})", "stop"},
      {std::string("{") + kMsg + R"(,"stop":[""]})", "stop"},
      {std::string("{") + kMsg + R"(,"stop":["a",1]})", "stop"},
      {std::string("{") + kMsg + R"(,"logprobs":1})", "logprobs"},
      {std::string("{") + kMsg + R"(,"top_logprobs":3})", "top_logprobs"},
      {std::string("{") + kMsg + R"(,"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {std::string("{") + kMsg + R"(,"seed":"x"})", "seed"},
      {std::string("{") + kMsg + R"(,"model":7})", "model"},
      {std::string("{") + kMsg + R"(,"ignore_eos":1})", "ignore_eos"},
      {std::string("{") + kMsg + R"(,"stop_token_ids":[5000]})", "stop_token_ids"},
  };
  for (auto& c : cases) {
    ApiError e = chat_err(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
    EXPECT_EQ(e.type, "invalid_request_error");
  }
}

TEST(Protocol, InvalidUtf8IsRejected) {
  std::string body = std::string("{\"messages\":[{\"role\":\"user\",\"content\":\"a") + "\xff\xfe" + "\"}]}";
  ApiError e = chat_err(body);
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("UTF-8"), std::string::npos);
  // Overlong encoding and a lone surrogate are invalid too.
  EXPECT_FALSE(valid_utf8("\xc0\xaf"));
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));
  EXPECT_FALSE(valid_utf8("\xe2\x82"));
  EXPECT_TRUE(valid_utf8("h\xc3\xa9llo \xf0\x9f\x98\x80 \xef\xbd\x9c"));
}

TEST(Protocol, CompletionPrompts) {
  GenerateRequest r;
  ASSERT_EQ(completion_err(R"({"prompt":"hello","max_tokens":3,"logprobs":2,"echo":true})", &r).status, 0);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text.value(), "hello");
  EXPECT_TRUE(r.sampling.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_TRUE(r.echo);
  ASSERT_EQ(completion_err(R"({"prompt":[1,2,3]})", &r).status, 0);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
  ASSERT_EQ(completion_err(R"({"prompt":["a","b"],"n":2})", &r).status, 0);
  EXPECT_EQ(r.prompts.size(), 2u);
  ASSERT_EQ(completion_err(R"({"prompt":[[1],[2,3]]})", &r).status, 0);
  EXPECT_EQ(r.prompts[1].token_ids, (std::vector<int32_t>{2, 3}));
  ASSERT_EQ(completion_err(R"({"prompt":"x","logprobs":0})", &r).status, 0);
  EXPECT_TRUE(r.sampling.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);

  EXPECT_EQ(completion_err(R"({})").param, "prompt");
  EXPECT_EQ(completion_err(R"({"prompt":5})").param, "prompt");
  EXPECT_EQ(completion_err(R"({"prompt":[]})").param, "prompt");
  EXPECT_EQ(completion_err(R"({"prompt":[1,-2]})").param, "prompt");
  EXPECT_EQ(completion_err(R"({"prompt":[1,5000]})").param, "prompt");
  EXPECT_EQ(completion_err(R"({"prompt":[[1],"x",{}]})").param, "prompt");
  EXPECT_EQ(completion_err(R"({"prompt":"x","logprobs":50})").param, "logprobs");
  EXPECT_EQ(completion_err(R"({"prompt":"x","suffix":"y"})").param, "suffix");
}

// Completions `logprobs` is a count (OpenAI: integer 0..5, null); a boolean is refused naming the
// field (it used to be taken as 0). Chat keeps the boolean `logprobs` + integer `top_logprobs`.
TEST(Protocol, CompletionLogprobsIsAnIntegerNotABoolean) {
  for (const char* body : {R"({"prompt":"x","logprobs":true})", R"({"prompt":"x","logprobs":false})"}) {
    ApiError e = completion_err(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.type, "invalid_request_error") << body;
    EXPECT_EQ(e.param, "logprobs") << body;
    EXPECT_NE(e.message.find("integer"), std::string::npos) << e.message;
  }
  EXPECT_EQ(completion_err(R"({"prompt":"x","logprobs":"2"})").param, "logprobs");
  EXPECT_EQ(completion_err(R"({"prompt":"x","logprobs":-1})").param, "logprobs");
  EXPECT_EQ(completion_err(R"({"prompt":"x","logprobs":1.5})").param, "logprobs");
  GenerateRequest r;
  ASSERT_EQ(completion_err(R"({"prompt":"x","logprobs":null})", &r).status, 0);
  EXPECT_FALSE(r.sampling.logprobs);
  ASSERT_EQ(completion_err(R"({"prompt":"x","logprobs":5})", &r).status, 0);
  EXPECT_TRUE(r.sampling.logprobs);
  EXPECT_EQ(r.top_logprobs, 5);

  // Chat: logprobs is the boolean, top_logprobs the count.
  ASSERT_EQ(chat_err(std::string("{") + kMsg + R"(,"logprobs":true,"top_logprobs":2})", &r).status, 0);
  EXPECT_TRUE(r.sampling.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  ASSERT_EQ(chat_err(std::string("{") + kMsg + R"(,"logprobs":false})", &r).status, 0);
  EXPECT_FALSE(r.sampling.logprobs);
  ASSERT_EQ(chat_err(std::string("{") + kMsg + R"(,"logprobs":true})", &r).status, 0);
  EXPECT_TRUE(r.sampling.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  EXPECT_EQ(chat_err(std::string("{") + kMsg + R"(,"logprobs":2})").param, "logprobs");
  EXPECT_EQ(chat_err(std::string("{") + kMsg + R"(,"logprobs":true,"top_logprobs":true})").param,
            "top_logprobs");
  EXPECT_EQ(chat_err(std::string("{") + kMsg + R"(,"logprobs":true,"top_logprobs":-1})").param,
            "top_logprobs");
  EXPECT_EQ(chat_err(std::string("{") + kMsg + R"(,"logprobs":false,"top_logprobs":2})").param,
            "top_logprobs");
}

TEST(Protocol, ErrorBodyShape) {
  ApiError e = bad_request("bad \"thing\"", "max_tokens", "some_code");
  auto j = nlohmann::json::parse(error_body(e));
  ASSERT_TRUE(j.contains("error"));
  EXPECT_EQ(j["error"]["message"], "bad \"thing\"");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_EQ(j["error"]["code"], "some_code");
  auto k = nlohmann::json::parse(error_body(bad_request("x")));
  EXPECT_TRUE(k["error"]["param"].is_null());
  EXPECT_TRUE(k["error"]["code"].is_null());
}

TEST(Protocol, SseFraming) {
  Json j = Json::object();
  j["b"] = "line1\nline2";
  j["a"] = 1;
  // One line per event (newlines inside strings are escaped), key order kept, blank-line end.
  EXPECT_EQ(sse_event(j), "data: {\"b\":\"line1\\nline2\",\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  // Invalid UTF-8 inside a string never throws; it is replaced.
  Json bad = Json::object();
  bad["t"] = std::string("x\xff");
  std::string ev = sse_event(bad);
  EXPECT_EQ(ev.rfind("data: ", 0), 0u);
  EXPECT_NE(ev.find("\xef\xbf\xbd"), std::string::npos);
  EXPECT_EQ(ev.substr(ev.size() - 2), "\n\n");
}

TEST(StopMatcher, HoldsBackAcrossChunks) {
  StopMatcher m({"STOP"});
  std::string out;
  out += m.push("hello S");
  EXPECT_EQ(out, "hello ");  // "S" might start STOP
  out += m.push("T");
  EXPECT_EQ(out, "hello ");
  out += m.push("Ox");  // "STOx" is not a stop: released
  EXPECT_EQ(out, "hello STOx");
  out += m.push(" and ST");
  out += m.push("OP tail");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "hello STOx and ");
  EXPECT_EQ(m.matched(), "STOP");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, ByteByByteAndEarliestMatch) {
  const std::string text = "abc<end>def</stop>";
  for (bool include : {false, true}) {
    StopMatcher m({"</stop>", "<end>"}, include);
    std::string out;
    for (char c : text) out += m.push(std::string(1, c));
    out += m.flush();
    EXPECT_TRUE(m.stopped());
    EXPECT_EQ(m.matched(), "<end>");
    EXPECT_EQ(out, include ? "abc<end>" : "abc");
  }
  // No stop: everything comes out, the held tail on flush.
  StopMatcher m({"xyz"});
  std::string out = m.push("abcx");
  EXPECT_EQ(out, "abc");
  out += m.push("y");
  out += m.flush();
  EXPECT_EQ(out, "abcxy");
  EXPECT_FALSE(m.stopped());
  // Overlapping prefixes: "aab" inside "aaab".
  StopMatcher o({"aab"});
  std::string r = o.push("a");
  r += o.push("a");
  r += o.push("a");
  r += o.push("b");
  EXPECT_TRUE(o.stopped());
  EXPECT_EQ(r, "a");
  // Multi-byte stop string split inside a character.
  StopMatcher u({"\xef\xbd\x9c"});
  std::string s = u.push("x\xef");
  s += u.push("\xbd");
  EXPECT_EQ(s, "x");
  s += u.push("\x9cy");
  EXPECT_TRUE(u.stopped());
  EXPECT_EQ(s, "x");
  // held_chars counts characters of the held text, multi-byte ones once.
  StopMatcher h({"\xc3\xa9\xc3\xa9X"});  // "ééX"
  EXPECT_EQ(h.push("a\xc3\xa9\xc3"), "a");
  EXPECT_EQ(h.held_chars(), 2);  // "é" and the lead byte of the next one
  EXPECT_EQ(h.push("\xa9"), "");
  EXPECT_EQ(h.held_chars(), 2);
  EXPECT_EQ(h.push("Y"), "\xc3\xa9\xc3\xa9Y");
  EXPECT_EQ(h.held_chars(), 0);
  // No stop strings: pass-through.
  StopMatcher none({});
  EXPECT_EQ(none.push("abc"), "abc");
}

// The matcher equals a brute-force reference on random texts, stop sets and chunkings: after
// each push, the earliest first occurrence (ties: the longest string) of any stop string in the
// whole text so far ends the output; every released piece is a prefix of the final text.
TEST(StopMatcher, EqualsBruteForceOnRandomInputs) {
  std::mt19937 rng(1234);
  auto rnd = [&](int n) { return int(rng() % uint32_t(n)); };
  for (int iter = 0; iter < 4000; ++iter) {
    const std::string alphabet = iter % 3 == 0 ? "ab" : "abc";
    auto word = [&](int len) {
      std::string w;
      for (int i = 0; i < len; ++i) w += alphabet[size_t(rnd(int(alphabet.size())))];
      return w;
    };
    std::vector<std::string> stops;
    for (int k = 1 + rnd(4); k > 0; --k) stops.push_back(word(1 + rnd(6)));
    const std::string text = word(rnd(40));
    const bool include = rnd(2) == 1;
    // Reference.
    std::string want = text;
    std::string want_match;
    std::vector<size_t> cuts;
    for (size_t p = 0; p < text.size();) {
      size_t n = 1 + size_t(rnd(5));
      cuts.push_back(std::min(text.size(), p + n));
      p += n;
    }
    for (size_t cut : cuts) {
      const std::string sofar = text.substr(0, cut);
      size_t best = std::string::npos;
      std::string bs;
      for (auto& st : stops) {
        size_t q = sofar.find(st);
        if (q != std::string::npos && (q < best || (q == best && st.size() > bs.size()))) {
          best = q;
          bs = st;
        }
      }
      if (best != std::string::npos) {
        want = sofar.substr(0, include ? best + bs.size() : best);
        want_match = bs;
        break;
      }
    }
    StopMatcher m(stops, include);
    std::string got;
    size_t prev = 0;
    for (size_t cut : cuts) {
      got += m.push(std::string_view(text).substr(prev, cut - prev));
      ASSERT_EQ(want.compare(0, got.size(), got), 0) << "released text is not a prefix";
      ASSERT_EQ(m.held_chars(), int64_t(m.held().size()));  // ASCII: one byte a character
      prev = cut;
      if (m.stopped()) break;
    }
    got += m.flush();
    ASSERT_EQ(got, want) << "text " << text << " stops " << ::testing::PrintToString(stops);
    ASSERT_EQ(m.held_chars(), 0);
    ASSERT_EQ(m.matched(), want_match);
    ASSERT_EQ(m.stopped(), !want_match.empty());
  }
}

// A push costs O(delta × stop strings), not O(held text × stop length): a 20,000-`a` stop
// string keeps a long tail held back while 60 others of 5,000-10,000 bytes were searched for in
// it on every pushed byte — these 15,000 pushes took over 120 s (seconds per token in a server
// whose generation logit_bias forces to `a`, on the thread that delivers every request's
// outputs: the whole server froze). Linear now: milliseconds, far under the bound even under ASan.
TEST(StopMatcher, PushIsLinearInTheText) {
  std::vector<std::string> stops = {std::string(20000, 'a') + "b"};
  for (int i = 0; i < 30; ++i) stops.push_back(std::string(10000 + size_t(i), 'a') + "c");
  for (int i = 0; i < 30; ++i) stops.push_back("ab" + std::string(5000, 'a') + std::string(1, char('d' + i % 20)));
  StopMatcher m(stops);
  const auto t0 = std::chrono::steady_clock::now();
  std::string out;
  for (int i = 0; i < 15000; ++i) out += m.push("a");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(out, "");  // everything may still begin the 20,000-`a` stop string
  EXPECT_EQ(m.held().size(), 15000u);
  out += m.push("c");  // completes every "a"*(10000 + i) + "c": the longest starts first
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), std::string(10029, 'a') + "c");
  EXPECT_EQ(out, std::string(15000 - 10029, 'a'));
  EXPECT_LT(s, 10.0) << "15,000 one-byte pushes took " << s << " s";
}

TEST(Metrics, PrometheusText) {
  Metrics m;
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 400);
  m.observe_generation(10, 5, 2, 0.05, 0.25, "stop");
  m.observe_itl(0.02);
  v4::engine::EngineStats st;
  st.running = 3;
  st.waiting = 4;
  st.pools = {{"kv", 10, 100, 4096}, {"state", 1, 8}};
  std::string t = m.render(st, 7, "tiny");
  EXPECT_NE(t.find("v4serve_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_http_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_prompt_tokens_total 10\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_generation_tokens_total 5\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_cached_prompt_tokens_total 2\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_time_to_first_token_seconds_bucket{le=\"0.06\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_time_to_first_token_seconds_bucket{le=\"0.04\"} 0\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_time_to_first_token_seconds_count 1\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_time_per_output_token_seconds_sum 0.05\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_inter_token_latency_seconds_count 1\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_num_requests_running 3\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_num_requests_waiting 4\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_cache_used_pages{pool=\"kv\"} 10\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_cache_usage_ratio{pool=\"kv\"} 0.1\n"), std::string::npos);
  // Bytes only where the page size is known.
  EXPECT_NE(t.find("v4serve_cache_used_bytes{pool=\"kv\"} 40960\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_cache_capacity_bytes{pool=\"kv\"} 409600\n"), std::string::npos);
  EXPECT_EQ(t.find("v4serve_cache_used_bytes{pool=\"state\"}"), std::string::npos);
  EXPECT_NE(t.find("v4serve_open_connections 7\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE v4serve_time_to_first_token_seconds histogram\n"), std::string::npos);
}

// The GPU step counters (CUDA backend; here set by hand): the decode idle time and its split into
// the model's host preparation and the rest, and the engine's callback errors.
TEST(Metrics, GpuIdleSplitAndCallbackErrors) {
  Metrics m;
  v4::engine::EngineStats st;
  st.device.decode_steps = 40;
  st.device.decode_idle_s = 0.5;
  st.device.decode_host_prep_s = 0.125;
  st.device.decode_host_gap_s = 0.375;
  st.callback_errors_total = 2;
  st.step_forward_s = 1.5;
  st.step_between_s = 0.25;
  const std::string t = m.render(st, 0, "tiny");
  EXPECT_NE(t.find("v4serve_engine_step_host_seconds_total{phase=\"forward\"} 1.5\n"),
            std::string::npos);
  EXPECT_NE(t.find("v4serve_engine_step_host_seconds_total{phase=\"between\"} 0.25\n"),
            std::string::npos);
  EXPECT_NE(t.find("v4serve_engine_step_host_seconds_total{phase=\"schedule\"} 0\n"),
            std::string::npos);
  EXPECT_NE(t.find("v4serve_gpu_decode_steps_total 40\n"), std::string::npos) << t;
  EXPECT_NE(t.find("v4serve_gpu_decode_idle_seconds_total 0.5\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_gpu_decode_host_prep_seconds_total 0.125\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_gpu_decode_host_gap_seconds_total 0.375\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE v4serve_gpu_decode_host_prep_seconds_total counter\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_engine_callback_errors_total 2\n"), std::string::npos);
}

TEST(Protocol, UserContentPartsAreJoined) {
  GenerateRequest r;
  ApiError e = chat_err(R"({"messages":[{"role":"user","content":[{"type":"text","text":"hello"},
      {"type":"text","text":"world"}]}]})", &r);
  ASSERT_EQ(e.status, 0) << e.message;
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0]["content"], "hello\n\nworld");
}

// Parts this text-only model cannot read are refused by name, not dropped (a 200 that ignored an
// image would answer a different question than the one asked).
TEST(Protocol, NonTextContentPartsAreRefused) {
  GenerateRequest r;
  ApiError e = chat_err(R"({"messages":[{"role":"user","content":[{"type":"text","text":"hi"},
      {"type":"image_url","image_url":{"url":"x"}}]}]})", &r);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "messages");
  EXPECT_NE(e.message.find("image_url"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("messages[0]"), std::string::npos) << e.message;
  e = chat_err(R"({"messages":[{"role":"tool","tool_call_id":"c","content":[{"type":"input_audio"}]}]})", &r);
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("input_audio"), std::string::npos) << e.message;
}

TEST(Metrics, EndpointLabelIsBounded) {
  Metrics m;
  m.count_request("/random12345", 404);
  m.count_request("/random999", 404);
  m.count_request("/v1/models/abc", 404);
  m.count_request("/v1/models/xyz", 404);
  m.count_request("/v1/chat/completions", 200);
  v4::engine::EngineStats st;
  std::string t = m.render(st, 0, "tiny");
  EXPECT_EQ(t.find("random"), std::string::npos);
  EXPECT_NE(t.find("v4serve_http_requests_total{endpoint=\"other\",status=\"404\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_http_requests_total{endpoint=\"/v1/models/{id}\",status=\"404\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("v4serve_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1\n"), std::string::npos);
}

// Nesting deeper than kMaxJsonDepth is refused before parsing (recursive copies / dumps of such a
// value overflowed the HTTP thread's stack: a 600 KB body crashed the server); brackets inside
// strings do not count, and a body at the limit parses.
TEST(Protocol, DeeplyNestedBodiesAreRefused) {
  auto nested = [](int depth) {
    std::string s = R"({"messages":[{"role":"user","content":"x"}],"x":)";
    for (int i = 0; i < depth; ++i) s += "[";
    for (int i = 0; i < depth; ++i) s += "]";
    return s + "}";
  };
  ApiError err;
  EXPECT_TRUE(parse_json_body(nested(kMaxJsonDepth - 1), &err).ok()) << err.message;  // + the outer {}
  auto deep = parse_json_body(nested(kMaxJsonDepth), &err);
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(err.status, 400);
  EXPECT_NE(err.message.find("levels"), std::string::npos) << err.message;
  EXPECT_FALSE(parse_json_body(nested(200000), &err).ok());
  // Brackets and escaped quotes inside strings are text.
  const std::string text = R"({"a":"[[[[{{{{\"[[[[", "b":[1]})";
  std::string many = R"({"a":")" + std::string(100000, '[') + R"("})";
  EXPECT_TRUE(parse_json_body(text, &err).ok()) << err.message;
  EXPECT_TRUE(parse_json_body(many, &err).ok()) << err.message;
}


// One JSON object of many keys is refused before the DOM parse (ordered_json inserts by a linear
// search: 120k keys took ~40 s); the message names the limit and where the object is; an object at
// the limit, and many small objects, parse.
TEST(Protocol, ObjectsWithTooManyKeysAreRefused) {
  auto body = [](size_t keys, bool nested) {
    std::string obj = "{";
    for (size_t i = 0; i < keys; ++i) obj += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":1";
    obj += "}";
    if (nested) return R"({"messages":[{"role":"user","content":"x"}],"tools":[1,{"a":)" + obj + "}]}";
    return obj;
  };
  ApiError err;
  EXPECT_TRUE(parse_json_body(body(100, false), &err).ok()) << err.message;
  EXPECT_TRUE(parse_json_body(body(kMaxJsonObjectKeys, true), &err).ok()) << err.message;
  auto t0 = std::chrono::steady_clock::now();
  auto big = parse_json_body(body(120000, false), &err);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(big.ok());
  EXPECT_LT(secs, 30.0);  // linear: < 0.4 s Release, < 8 s ASan; the quadratic forms took 40–100+ s
  EXPECT_EQ(err.status, 400);
  EXPECT_EQ(err.type, "invalid_request_error");
  EXPECT_NE(err.message.find("more than 8192 keys"), std::string::npos) << err.message;
  EXPECT_NE(err.message.find("(at body)"), std::string::npos) << err.message;
  ASSERT_FALSE(parse_json_body(body(kMaxJsonObjectKeys + 1, true), &err).ok());
  EXPECT_NE(err.message.find("(at body.tools[1].a)"), std::string::npos) << err.message;
  // Keys are counted per object, not per body.
  std::string many = R"({"x":[)";
  for (int i = 0; i < 3000; ++i) many += std::string(i ? "," : "") + R"({"a":1,"b":2,"c":3,"d":4})";
  many += "]}";
  EXPECT_TRUE(parse_json_body(many, &err).ok()) << err.message;
  // Many objects just under the cap cost as much in all (500 x 8,191 keys took about a minute):
  // the key comparisons of the whole body are bounded too; two objects at the cap still parse.
  std::string two = "[" + body(kMaxJsonObjectKeys, false) + "," + body(kMaxJsonObjectKeys, false) + "]";
  EXPECT_TRUE(parse_json_body(R"({"x":)" + two + "}", &err).ok()) << err.message;
  std::string fifty = R"({"x":[)";
  for (int i = 0; i < 50; ++i) fifty += (i ? "," : "") + body(kMaxJsonObjectKeys - 1, false);
  fifty += "]}";
  t0 = std::chrono::steady_clock::now();
  ASSERT_FALSE(parse_json_body(fifty, &err).ok());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_EQ(err.status, 400);
  EXPECT_NE(err.message.find("too many keys in its JSON objects in all"), std::string::npos) << err.message;
  // A malformed body still gets the parser's message.
  EXPECT_FALSE(parse_json_body(R"({"a":1,)", &err).ok());
  EXPECT_NE(err.message.find("not valid JSON"), std::string::npos) << err.message;
}

// A malformed body's 400 says where and what, without the JSON library's internals.
TEST(Protocol, MalformedJsonMessageHasNoLibraryPrefix) {
  ApiError err;
  ASSERT_FALSE(parse_json_body(R"({"a":x})", &err).ok());
  EXPECT_EQ(err.status, 400);
  EXPECT_EQ(err.message.find("json.exception"), std::string::npos) << err.message;
  EXPECT_EQ(err.message.find("parse_error"), std::string::npos) << err.message;
  EXPECT_TRUE(err.message.starts_with("request body is not valid JSON at line 1, column 6: "))
      << err.message;
  EXPECT_NE(err.message.find("invalid literal"), std::string::npos) << err.message;
  ASSERT_FALSE(parse_json_body(R"({"a":1,)", &err).ok());
  EXPECT_EQ(err.message.find("json.exception"), std::string::npos) << err.message;
  EXPECT_NE(err.message.find("line 1, column 8"), std::string::npos) << err.message;
}

// Validation as OpenAI does it, with a 400 naming the field: duplicate tool names, tool
// parameters whose `properties` is not an object, a json_schema `schema` that is not an object,
// user / system messages with null content (assistant null content with tool_calls and tool
// null content stay valid); a non-string stop entry says what it got.
TEST(Protocol, StricterOpenAiValidation) {
  struct Case {
    std::string body;
    std::string param;
    std::string says;  // in the message
  };
  const std::string tool = R"({"type":"function","function":{"name":"f"}})";
  const std::vector<Case> cases = {
      {std::string("{") + kMsg + R"(,"tools":[)" + tool + "," + tool + "]}", "tools", "unique"},
      {std::string("{") + kMsg +
           R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":[1]}}}]})",
       "tools", "tools[0].function.parameters.properties"},
      {std::string("{") + kMsg +
           R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":"nope"}}})",
       "response_format", "json_schema.schema"},
      {R"({"messages":[{"role":"user","content":null}]})", "messages", "messages[0].content"},
      {R"({"messages":[{"role":"system","content":null},{"role":"user","content":"hi"}]})",
       "messages", "messages[0].content"},
      {R"({"messages":[{"role":"developer"},{"role":"user","content":"hi"}]})", "messages",
       "messages[0].content"},
      {std::string("{") + kMsg + R"(,"stop":[1,2]})", "stop", "got integer at stop[0]"},
  };
  for (auto& c : cases) {
    ApiError e = chat_err(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_NE(e.message.find(c.says), std::string::npos) << c.body << " -> " << e.message;
  }
  // Still valid.
  for (const std::string ok : {
           std::string(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,)"
                       R"("tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},)"
                       R"({"role":"tool","tool_call_id":"c","content":null}],"tools":[)") + tool + "]}",
           std::string("{") + kMsg +
               R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}},)"
               R"({"type":"function","function":{"name":"g"}}]})",
           std::string("{") + kMsg +
               R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}})",
           std::string("{") + kMsg + R"(,"stop":["a","b","c","d","e"]})",  // vLLM allows > 4
       }) {
    ApiError e = chat_err(ok);
    EXPECT_EQ(e.status, 0) << ok << " -> " << e.message;
  }
}

// Fields an endpoint does not read are listed (for the server's warning), in body order; the
// fields it reads are not, and the request is still accepted.
TEST(Protocol, UnknownFieldsAreListedNotRefused) {
  GenerateRequest r;
  const std::string chat = std::string("{") + kMsg +
                           R"(,"temprature":0.5,"max_tokens":4,"echo":true,"parallel_tool_calls":false,)"
                           R"("skip_special_tokens":false,"spaces_between_special_tokens":true})";
  ASSERT_EQ(chat_err(chat, &r).status, 0);
  auto j = nlohmann::ordered_json::parse(chat);
  EXPECT_EQ(unknown_request_fields(j, GenerateRequest::Kind::kChat),
            (std::vector<std::string>{"temprature", "echo", "parallel_tool_calls"}));
  const std::string cmp =
      R"({"prompt":"x","echo":true,"messages":[],"top_logprobs":2,"logprobs":1,"foo":null})";
  ASSERT_EQ(completion_err(cmp, &r).status, 0);
  EXPECT_EQ(unknown_request_fields(nlohmann::ordered_json::parse(cmp), GenerateRequest::Kind::kCompletion),
            (std::vector<std::string>{"messages", "top_logprobs", "foo"}));
  // spaces_between_special_tokens is accepted as vLLM does, but must be a boolean.
  EXPECT_EQ(completion_err(R"({"prompt":"x","spaces_between_special_tokens":"no"})").param,
            "spaces_between_special_tokens");
}

// The unknown-field warning cannot be used to forge log lines or drive a terminal: control
// characters (newline, ESC, C1 CSI, U+2028) and backslashes are escaped JSON-style, an empty name
// is shown as "", long names are cut at 64 characters and the list at 16 names.
TEST(Protocol, UnknownFieldNamesAreEscapedForTheLog) {
  EXPECT_EQ(describe_field_names({"temprature", "frobnicate"}), "temprature, frobnicate");
  const std::string forged = "x\n2026-01-01 [error] FAKE\x1b[31mred\t\\\xc2\x9b\xe2\x80\xa8é";
  const std::string d = describe_field_names({forged, ""});
  EXPECT_EQ(d, "x\\n2026-01-01 [error] FAKE\\u001b[31mred\\t\\\\\\u009b\\u2028é, \"\"");
  for (char c : d) EXPECT_TRUE(static_cast<unsigned char>(c) >= 0x20) << d;
  const std::string longname(100, 'a');
  EXPECT_EQ(describe_field_names({longname}), std::string(64, 'a') + "…");
  // Multi-byte characters count as one and are never split.
  std::string wide;
  for (int i = 0; i < 70; ++i) wide += "é";
  std::string wide64;
  for (int i = 0; i < 64; ++i) wide64 += "é";
  EXPECT_EQ(describe_field_names({wide}), wide64 + "…");
  std::vector<std::string> many;
  for (int i = 0; i < 20; ++i) many.push_back("f" + std::to_string(i));
  const std::string m = describe_field_names(many);
  EXPECT_NE(m.find("f15, … and 4 more"), std::string::npos) << m;
  EXPECT_EQ(m.find("f16"), std::string::npos) << m;
}

// Gaps a tester found, refused as OpenAI does with a 400 naming the field: an assistant message
// without content and without tool_calls; a tool property whose schema is not an object (or a
// boolean schema); integers given as decimal numbers (1.0, 1e2: OpenAI accepts JSON integers
// only). max_tokens messages state one range, [1, context], whatever the bad value.
TEST(Protocol, ValidationGapsAreRefused) {
  struct Case {
    std::string body, param, says;
  };
  const std::string user = R"({"role":"user","content":"hi"})";
  const std::vector<Case> cases = {
      {R"({"messages":[)" + user + R"(,{"role":"assistant","content":null},)" + user + "]}", "messages",
       "'messages[1].content' is required for an assistant message without tool_calls"},
      {R"({"messages":[)" + user + R"(,{"role":"assistant"},)" + user + "]}", "messages", "got nothing"},
      {R"({"messages":[)" + user + R"(,{"role":"assistant","content":null,"tool_calls":[]},)" + user + "]}",
       "messages", "without tool_calls"},
      {std::string("{") + kMsg +
           R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":5}}}}]})",
       "tools", "'tools[0].function.parameters.properties.x' must be a JSON Schema object, got integer"},
      {std::string("{") + kMsg + R"(,"max_tokens":1.0})", "max_tokens", "must be an integer, got the decimal number 1.0"},
      {std::string("{") + kMsg + R"(,"n":1e2})", "n", "must be an integer"},
      {std::string("{") + kMsg + R"(,"seed":3.0})", "seed", "must be an integer"},
      {std::string("{") + kMsg + R"(,"max_tokens":-1})", "max_tokens", "must be in [1, 4096], got -1"},
      {std::string("{") + kMsg + R"(,"max_tokens":0})", "max_tokens", "must be in [1, 4096], got 0"},
  };
  for (auto& c : cases) {
    ApiError e = chat_err(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << c.body << " -> " << e.message;
  }
  // Completions: -1 and 0 (without echo) state the same range and the echo exception.
  ApiError neg = completion_err(R"({"prompt":"x","max_tokens":-1})");
  ApiError zero = completion_err(R"({"prompt":"x","max_tokens":0})");
  EXPECT_EQ(neg.param, "max_tokens");
  EXPECT_EQ(zero.param, "max_tokens");
  const std::string range = "'max_tokens' must be in [1, 4096] (0 is allowed only with 'echo': true";
  EXPECT_EQ(neg.message.rfind(range, 0), 0u) << neg.message;
  EXPECT_EQ(zero.message.rfind(range, 0), 0u) << zero.message;
  EXPECT_EQ(completion_err(R"({"prompt":"x","max_tokens":2.0})").param, "max_tokens");
  EXPECT_EQ(completion_err(R"({"prompt":"x","logprobs":1.0})").param, "logprobs");
  // Still valid: boolean property schemas, an assistant message with content "" or tool calls.
  for (const std::string ok : {
           std::string("{") + kMsg +
               R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"string"},"y":true}}}}]})",
           R"({"messages":[)" + user + R"(,{"role":"assistant","content":""},)" + user + "]}",
           std::string(R"({"messages":[)") + user + R"(,{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},)"
               R"({"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"type":"function","function":{"name":"f"}}]})",
           std::string("{") + kMsg + R"(,"max_tokens":5,"n":2})",
       }) {
    ApiError e = chat_err(ok);
    EXPECT_EQ(e.status, 0) << ok << " -> " << e.message;
  }
}

// Many tools are checked in linear time (duplicate names by a map: comparing each tool with all
// before it took ~10 s for 100k tools); the duplicate is still named with its first occurrence.
TEST(Protocol, ManyToolsAreCheckedInLinearTime) {
  std::string body = std::string("{") + kMsg + R"(,"tools":[)";
  for (int i = 0; i < 100000; ++i)
    body += R"({"type":"function","function":{"name":"f)" + std::to_string(i) + R"("}},)";
  body += R"({"type":"function","function":{"name":"f7"}}]})";
  const auto t0 = std::chrono::steady_clock::now();
  ApiError e = chat_err(body);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(e.param, "tools");
  EXPECT_NE(e.message.find("'tools[100000].function.name' \"f7\" duplicates 'tools[7]'"), std::string::npos)
      << e.message;
  EXPECT_LT(secs, 30.0);  // linear: < 0.4 s Release, < 8 s ASan; the quadratic forms took 40–100+ s
}
