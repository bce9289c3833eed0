// serve_api.h — the OpenAI-compatible request and response shapes of `kvscope serve`.
//
// parse_api_request() turns a POST body for /v1/completions or /v1/chat/completions into
// an ApiRequest, checking every field it knows (type and range) and refusing the first bad
// one with an ApiError in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
// What needs the model (tokenizing, the prompt against the context) is checked later, on
// the engine thread (serve_engine.h). The response builders write the JSON the API
// returns: a whole completion, a streamed chunk, an error. Pure functions of their
// arguments: no engine calls, safe on any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat_format.h"

namespace kvscope::serve {

// A 4xx/5xx answer in OpenAI's error shape.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the field at fault ("" = null)
  std::string code;   // "" = null
};
std::string error_json(const ApiError& e);

// What the server lets a request ask for (from the command line).
struct ApiLimits {
  std::vector<std::string> model_ids;  // names the "model" field may give (first: reported)
  int context = 0;                     // positions one sequence may hold
  int max_n = 1;                       // samples per request
};

struct ApiRequest {
  bool chat = false;
  std::string model;                  // the id answered with
  std::string prompt;                 // completions: the text (when prompt_ids is empty)
  std::vector<int32_t> prompt_ids;    // completions: a prompt given as token ids
  std::vector<ChatMessage> messages;  // chat
  int max_tokens = -1;                // -1: completions 16, chat up to the context
  float temperature = 1.0f;
  float top_p = 1.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // up to 4, each non-empty
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  float presence_penalty = 0, frequency_penalty = 0, repetition_penalty = 1;
  std::vector<std::pair<int32_t, float>> logit_bias;
  int logprobs = -1;  // -1: none; else the number of top tokens (completions 0..5, chat 0..20)
};

// Parses and checks a request body (valid UTF-8 already); `chat` for /v1/chat/completions.
std::optional<ApiError> parse_api_request(const std::string& body, bool chat,
                                          const ApiLimits& limits, ApiRequest* out);

// One generated token's log-probability, for the logprobs fields.
struct TokenLogprob {
  std::string token;  // its text ("bytes:\xNN..." style escape when not whole UTF-8)
  std::vector<uint8_t> bytes;
  float logprob = 0;
  std::vector<TokenLogprob> top;  // the most likely tokens (their own `top` empty)
};

// A choice of a whole (non-streamed) answer.
struct ApiChoice {
  std::string text;
  std::string finish_reason;  // "stop" | "length"
  std::vector<TokenLogprob> logprobs;
};

struct ApiUsage {
  int prompt_tokens = 0, completion_tokens = 0;
};

// The non-streamed answer: object "text_completion" or "chat.completion".
std::string completion_json(const ApiRequest& req, const std::string& id, int64_t created,
                            const std::vector<ApiChoice>& choices, const ApiUsage& usage);
// One streamed chunk (without the "data: " framing) of choice `index`: new text and its
// tokens' log-probabilities, and/or the finish reason ("" = not finished). Chat chunks
// carry `delta`; `first` adds the assistant role to it.
std::string chunk_json(const ApiRequest& req, const std::string& id, int64_t created, int index,
                       const std::string& text, const std::vector<TokenLogprob>* logprobs,
                       const std::string& finish_reason, bool first);
// The streamed usage chunk (stream_options.include_usage): empty choices and the usage.
std::string usage_chunk_json(const ApiRequest& req, const std::string& id, int64_t created,
                             const ApiUsage& usage);
// GET /v1/models.
std::string models_json(const std::vector<std::string>& ids, int64_t created);

// The token text for a logprobs entry: the bytes when they are whole UTF-8, else
// "bytes:\xNN..." as OpenAI writes partial characters.
std::string logprob_token_text(const std::string& bytes);

}  // namespace kvscope::serve
