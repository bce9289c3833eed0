// test_serve_api.cpp — the pure parts of `kvscope serve` (app/serve): OpenAI request
// checks (each bad field refused with its name as `param`), the error shape, and the stop
// string helpers the engine thread uses to hold back and trim streamed text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "app/serve/serve_api.h"
#include "app/serve/serve_engine.h"

namespace kvscope::serve {
namespace {

ApiLimits limits() {
  ApiLimits l;
  l.model_ids = {"SmolLM2-135M-Instruct.Q4_1", "smollm2-135m"};
  l.context = 100;
  l.max_n = 4;
  return l;
}

std::optional<ApiError> parse(const std::string& body, bool chat = false,
                              ApiRequest* out = nullptr) {
  ApiRequest r;
  return parse_api_request(body, chat, limits(), out ? out : &r);
}

TEST(ServeApi, AGoodCompletionRequestKeepsEveryField) {
  ApiRequest r;
  auto e = parse(R"({"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 7,
      "temperature": 0.5, "top_p": 0.9, "seed": 3, "stop": ["a", "bc"], "n": 2,
      "stream": true, "presence_penalty": 1, "frequency_penalty": -1, "logprobs": 2,
      "logit_bias": {"5": -100}})",
                 false, &r);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.model, "smollm2-135m");
  EXPECT_EQ(r.prompt, "Hi");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_EQ(r.seed, 3u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.logprobs, 2);
  ASSERT_EQ(r.logit_bias.size(), 1u);
  EXPECT_EQ(r.logit_bias[0].first, 5);
  ASSERT_FALSE(parse(R"({"prompt": [1, 2, 3]})", false, &r));
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens, -1) << "absent: chosen on the engine thread";
  ASSERT_FALSE(parse(R"({"messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
      "logprobs": true, "top_logprobs": 3})",
                     true, &r));
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "Hi");
  EXPECT_EQ(r.logprobs, 3);
}

TEST(ServeApi, EachBadFieldIsRefusedByName) {
  struct Case {
    const char* body;
    bool chat;
    int status;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt": "Hi",)", false, 400, ""},
      {R"("just a string")", false, 400, ""},
      {R"({"prompt": "Hi", "model": "gpt-4"})", false, 404, "model"},
      {R"({"prompt": "Hi", "model": 3})", false, 400, "model"},
      {R"({"prompt": ""})", false, 400, "prompt"},
      {R"({"prompt": ["a", "b"]})", false, 400, "prompt"},
      {R"({"prompt": "Hi", "max_tokens": "8"})", false, 400, "max_tokens"},
      {R"({"prompt": "Hi", "max_tokens": 101})", false, 400, "max_tokens"},
      {R"({"prompt": "Hi", "max_tokens": 0})", false, 400, "max_tokens"},
      {R"({"prompt": "Hi", "max_tokens": 1e3})", false, 400, "max_tokens"},
      {R"({"prompt": "Hi", "temperature": 2.5})", false, 400, "temperature"},
      {R"({"prompt": "Hi", "top_p": 0})", false, 400, "top_p"},
      {R"({"prompt": "Hi", "seed": "x"})", false, 400, "seed"},
      {R"({"prompt": "Hi", "stop": ""})", false, 400, "stop"},
      {R"({"prompt": "Hi", "stop": ["a", 1]})", false, 400, "stop"},
      {R"({"prompt": "Hi", "n": 5})", false, 400, "n"},
      {R"({"prompt": "Hi", "stream": 1})", false, 400, "stream"},
      {R"({"prompt": "Hi", "stream_options": {"include_usage": true}})", false, 400,
       "stream_options"},
      {R"({"prompt": "Hi", "frequency_penalty": -2.5})", false, 400, "frequency_penalty"},
      {R"({"prompt": "Hi", "logit_bias": {"x": 1}})", false, 400, "logit_bias"},
      {R"({"prompt": "Hi", "logit_bias": {"5": 101}})", false, 400, "logit_bias"},
      {R"({"prompt": "Hi", "logprobs": 6})", false, 400, "logprobs"},
      {R"({"prompt": "Hi", "echo": true})", false, 400, "echo"},
      {R"({"messages": []})", true, 400, "messages"},
      {R"({"messages": [{"role": "user"}]})", true, 400, "messages[0].content"},
      {R"({"messages": [{"role": "bot", "content": "x"}]})", true, 400, "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": ""}]})", true, 400, "messages"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", true, 400,
       "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 21,
           "logprobs": true})",
       true, 400, "top_logprobs"},
  };
  for (const Case& c : cases) {
    auto e = parse(c.body, c.chat);
    ASSERT_TRUE(e) << "accepted: " << c.body;
    EXPECT_EQ(e->status, c.status) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << ": " << e->message;
    EXPECT_FALSE(e->message.empty());
    // OpenAI's shape: every key present, null where empty.
    auto j = nlohmann::json::parse(error_json(*e));
    ASSERT_TRUE(j.contains("error")) << c.body;
    for (const char* k : {"message", "type", "param", "code"})
      EXPECT_TRUE(j["error"].contains(k)) << k << " in " << j.dump();
    if (*c.param == '\0') {
      EXPECT_TRUE(j["error"]["param"].is_null());
    }
  }
}

TEST(ServeApi, StopStringsAreHeldBackWhileTheyCouldStillMatch) {
  const std::vector<std::string> stops{"\n\n", "END"};
  EXPECT_EQ(stop_holdback("Paris is", stops), 0u);
  EXPECT_EQ(stop_holdback("Paris.\n", stops), 1u);
  EXPECT_EQ(stop_holdback("the EN", stops), 2u);
  EXPECT_EQ(stop_holdback("E", stops), 1u);
  EXPECT_EQ(stop_find("a\n\nb END", 0, stops), 1u);
  EXPECT_EQ(stop_find("a b END", 0, stops), 4u);
  EXPECT_EQ(stop_find("a b END", 5, stops), std::string::npos);
  EXPECT_EQ(stop_find("no stop", 0, stops), std::string::npos);
}

TEST(ServeApi, ResponsesHaveOpenAIsShapes) {
  ApiRequest r;
  r.model = "m";
  r.logprobs = 1;
  TokenLogprob t{"Hi", {'H', 'i'}, -0.5f, {{"Hi", {'H', 'i'}, -0.5f, {}}}};
  auto j = nlohmann::json::parse(
      completion_json(r, "cmpl-1", 7, {ApiChoice{"Hi", "length", {t}}}, ApiUsage{3, 1}));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "Hi");
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"][0], "Hi");
  EXPECT_EQ(j["usage"]["total_tokens"], 4);
  r.chat = true;
  j = nlohmann::json::parse(chunk_json(r, "c", 7, 0, "Hi", nullptr, "", true));
  EXPECT_EQ(j["object"], "chat.completion.chunk");
  EXPECT_EQ(j["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["delta"]["content"], "Hi");
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  j = nlohmann::json::parse(chunk_json(r, "c", 7, 1, "", nullptr, "stop", false));
  EXPECT_TRUE(j["choices"][0]["delta"].empty());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["index"], 1);
  EXPECT_EQ(logprob_token_text("\xe2\x82"), "bytes:\\xe2\\x82");
  EXPECT_EQ(logprob_token_text("\xe2\x82\xac"), "\xe2\x82\xac");
}

}  // namespace
}  // namespace kvscope::serve
