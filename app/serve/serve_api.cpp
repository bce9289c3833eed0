// serve_api.cpp — OpenAI request parsing and response JSON (see serve_api.h).
#include "app/serve/serve_api.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/utf8.h"

namespace kvscope::serve {
namespace {

using nlohmann::json;

// Every dump replaces bytes that are not UTF-8 (a token's partial character) instead of
// throwing.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError bad(std::string param, std::string message) {
  ApiError e;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

// The field `key` of `o` as a number in [lo, hi] (null or absent: untouched).
std::optional<ApiError> get_number(const json& o, const char* key, double lo, double hi,
                                   float* out) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_number())
    return bad(key, std::string("'") + key + "' must be a number, not " + type_name(*it));
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    return bad(key, std::string("'") + key + "' is " + it->dump() + "; it must be in [" +
                        json(lo).dump() + ", " + json(hi).dump() + "]");
  *out = float(v);
  return std::nullopt;
}

std::optional<ApiError> get_int(const json& o, const char* key, int64_t lo, int64_t hi,
                                int64_t* out) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer())
    return bad(key, std::string("'") + key + "' must be an integer, not " + type_name(*it));
  // Unsigned values beyond int64 are out of range too.
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX))
    return bad(key, std::string("'") + key + "' is " + it->dump() + "; it must be in " +
                        std::to_string(lo) + ".." + std::to_string(hi));
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    return bad(key, std::string("'") + key + "' is " + std::to_string(v) + "; it must be in " +
                        std::to_string(lo) + ".." + std::to_string(hi));
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& o, const char* key, bool* out) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean())
    return bad(key, std::string("'") + key + "' must be a boolean, not " + type_name(*it));
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> parse_stop(const json& o, std::vector<std::string>* out) {
  auto it = o.find("stop");
  if (it == o.end() || it->is_null()) return std::nullopt;
  std::vector<std::string> v;
  if (it->is_string()) {
    v.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    if (it->size() > 4)
      return bad("stop", "'stop' has " + std::to_string(it->size()) + " strings; at most 4");
    for (const json& s : *it) {
      if (!s.is_string())
        return bad("stop", std::string("'stop' must hold strings, not ") + type_name(s));
      v.push_back(s.get<std::string>());
    }
  } else {
    return bad("stop", std::string("'stop' must be a string or an array of strings, not ") +
                           type_name(*it));
  }
  for (const std::string& s : v)
    if (s.empty()) return bad("stop", "'stop' holds an empty string");
  *out = std::move(v);
  return std::nullopt;
}

std::optional<ApiError> parse_logit_bias(const json& o, ApiRequest* r) {
  auto it = o.find("logit_bias");
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_object())
    return bad("logit_bias", std::string("'logit_bias' must be an object of token id to bias, "
                                         "not ") +
                                 type_name(*it));
  for (auto& [k, v] : it->items()) {
    char* end = nullptr;
    const long id = std::strtol(k.c_str(), &end, 10);
    if (k.empty() || *end != '\0' || id < 0 || id > INT32_MAX)
      return bad("logit_bias", "'logit_bias' key '" + k + "' is not a token id");
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -100 ||
        v.get<double>() > 100)
      return bad("logit_bias", "'logit_bias' of token " + k + " must be a number in [-100, 100]");
    r->logit_bias.push_back({int32_t(id), v.get<float>()});
  }
  return std::nullopt;
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::optional<ApiError> message_content(const json& m, size_t i, std::string* out) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  auto c = m.find("content");
  if (c == m.end() || c->is_null()) return bad(where, "'" + where + "' is missing");
  if (c->is_string()) {
    *out = c->get<std::string>();
    return std::nullopt;
  }
  if (!c->is_array()) return bad(where, "'" + where + "' must be a string or an array of parts");
  for (const json& part : *c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string())
      return bad(where, "'" + where + "' parts must be {\"type\": \"text\", \"text\": string}");
    *out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> parse_prompt(const json& o, ApiRequest* r) {
  auto it = o.find("prompt");
  if (it == o.end() || it->is_null()) return bad("prompt", "'prompt' is missing");
  if (it->is_array() && it->size() == 1 && (*it)[0].is_string())
    return parse_prompt(json{{"prompt", (*it)[0]}}, r);
  if (it->is_string()) {
    r->prompt = it->get<std::string>();
    if (r->prompt.empty()) return bad("prompt", "'prompt' is empty");
    return std::nullopt;
  }
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
    for (const json& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        return bad("prompt", "'prompt' as token ids must hold non-negative integers");
      r->prompt_ids.push_back(int32_t(t.get<int64_t>()));
    }
    return std::nullopt;
  }
  if (it->is_array() && it->empty()) return bad("prompt", "'prompt' is empty");
  return bad("prompt", std::string("'prompt' must be a string (or one string in an array, or "
                                   "token ids), not ") +
                           type_name(*it) + (it->is_array() ? " of several prompts" : ""));
}

std::optional<ApiError> parse_messages(const json& o, ApiRequest* r) {
  auto it = o.find("messages");
  if (it == o.end() || it->is_null()) return bad("messages", "'messages' is missing");
  if (!it->is_array())
    return bad("messages", std::string("'messages' must be an array, not ") + type_name(*it));
  if (it->empty()) return bad("messages", "'messages' is empty");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad(where, "'" + where + "' must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      return bad(where + ".role", "'" + where + ".role' must be a string");
    const std::string rn = role->get<std::string>();
    if (rn != "system" && rn != "user" && rn != "assistant" && rn != "developer")
      return bad(where + ".role",
                 "'" + where + ".role' is '" + rn + "'; one of system, developer, user, assistant");
    ChatMessage cm;
    cm.role = rn == "developer" ? "system" : rn;
    if (auto e = message_content(m, i, &cm.content)) return e;
    r->messages.push_back(std::move(cm));
  }
  bool any = false;
  for (const ChatMessage& m : r->messages) any = any || !m.content.empty();
  if (!any) return bad("messages", "every message is empty");
  return std::nullopt;
}

}  // namespace

std::string error_json(const ApiError& e) {
  json j = {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  return dump(j);
}

namespace {

std::optional<ApiError> parse_model(const json& o, const ApiLimits& limits, ApiRequest* r) {
  r->model = limits.model_ids.empty() ? "" : limits.model_ids.front();
  auto it = o.find("model");
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_string())
    return bad("model", std::string("'model' must be a string, not ") + type_name(*it));
  const std::string m = it->get<std::string>();
  for (const std::string& id : limits.model_ids)
    if (id == m) {
      r->model = m;
      return std::nullopt;
    }
  ApiError e = bad("model", "The model '" + m + "' does not exist; this server has '" + r->model +
                                "' (GET /v1/models)");
  e.status = 404;
  e.code = "model_not_found";
  return e;
}

// max_tokens, temperature, top_p, seed, stop, n and the penalties.
std::optional<ApiError> parse_sampling(const json& o, const ApiLimits& limits, ApiRequest* r) {
  const int64_t ctx = std::max(1, limits.context);
  const char* max_key =
      r->chat && o.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  int64_t v = -1;
  if (auto e = get_int(o, max_key, 1, ctx, &v)) {
    if (e->message.find("must be in") != std::string::npos)
      e->message += " (the context holds " + std::to_string(ctx) + " positions, prompt included)";
    return e;
  }
  r->max_tokens = int(v);
  if (auto e = get_number(o, "temperature", 0, 2, &r->temperature)) return e;
  if (auto e = get_number(o, "top_p", 0, 1, &r->top_p)) return e;
  if (r->top_p <= 0) return bad("top_p", "'top_p' must be greater than 0");
  if (auto it = o.find("seed"); it != o.end() && !it->is_null()) {
    if (!it->is_number_integer())
      return bad("seed", std::string("'seed' must be an integer, not ") + type_name(*it));
    r->seed = it->is_number_unsigned() ? it->get<uint64_t>() : uint64_t(it->get<int64_t>());
  }
  if (auto e = parse_stop(o, &r->stop)) return e;
  v = 1;
  if (auto e = get_int(o, "n", 1, limits.max_n, &v)) return e;
  r->n = int(v);
  if (auto e = get_number(o, "presence_penalty", -2, 2, &r->presence_penalty)) return e;
  if (auto e = get_number(o, "frequency_penalty", -2, 2, &r->frequency_penalty)) return e;
  if (auto e = get_number(o, "repetition_penalty", 0.01, 10, &r->repetition_penalty)) return e;
  return parse_logit_bias(o, r);
}

// stream, stream_options, logprobs / top_logprobs, and the fields refused as unsupported.
std::optional<ApiError> parse_output(const json& o, ApiRequest* r) {
  if (auto e = get_bool(o, "stream", &r->stream)) return e;
  if (auto it = o.find("stream_options"); it != o.end() && !it->is_null()) {
    if (!it->is_object()) return bad("stream_options", "'stream_options' must be an object");
    if (!r->stream) return bad("stream_options", "'stream_options' needs 'stream': true");
    if (auto e = get_bool(*it, "include_usage", &r->include_usage)) return e;
  }
  int64_t v = 0;
  if (r->chat) {
    bool lp = false;
    if (auto e = get_bool(o, "logprobs", &lp)) return e;
    if (auto e = get_int(o, "top_logprobs", 0, 20, &v)) return e;
    if (v > 0 && !lp) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->logprobs = lp ? int(v) : -1;
  } else {
    v = -1;
    if (auto e = get_int(o, "logprobs", 0, 5, &v)) return e;
    r->logprobs = int(v);
    bool echo = false;
    if (auto e = get_bool(o, "echo", &echo)) return e;
    if (echo) return bad("echo", "'echo' is not supported");
    if (auto it = o.find("best_of"); it != o.end() && !it->is_null() && *it != json(r->n))
      return bad("best_of", "'best_of' is not supported");
    if (auto it = o.find("suffix"); it != o.end() && !it->is_null())
      return bad("suffix", "'suffix' is not supported");
  }
  if (auto it = o.find("tools");
      it != o.end() && !it->is_null() && !(it->is_array() && it->empty()))
    return bad("tools", "'tools' is not supported");
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_api_request(const std::string& body, bool chat,
                                          const ApiLimits& limits, ApiRequest* out) {
  json o;
  try {
    o = json::parse(body);
  } catch (const json::parse_error& e) {
    return bad("", std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!o.is_object())
    return bad("", std::string("the request body must be a JSON object, not ") + type_name(o));
  ApiRequest r;
  r.chat = chat;
  if (auto e = parse_model(o, limits, &r)) return e;
  if (auto e = chat ? parse_messages(o, &r) : parse_prompt(o, &r)) return e;
  if (auto e = parse_sampling(o, limits, &r)) return e;
  if (auto e = parse_output(o, &r)) return e;
  *out = std::move(r);
  return std::nullopt;
}

namespace {

json logprobs_json(const ApiRequest& req, const std::vector<TokenLogprob>& lps,
                   size_t text_offset) {
  if (req.chat) {
    json content = json::array();
    for (const TokenLogprob& t : lps) {
      json top = json::array();
      for (const TokenLogprob& c : t.top)
        top.push_back({{"token", c.token}, {"logprob", c.logprob}, {"bytes", c.bytes}});
      content.push_back(
          {{"token", t.token}, {"logprob", t.logprob}, {"bytes", t.bytes}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_lp = json::array(), top = json::array(),
       offsets = json::array();
  size_t off = text_offset;
  for (const TokenLogprob& t : lps) {
    tokens.push_back(t.token);
    token_lp.push_back(t.logprob);
    json m = json::object();
    for (const TokenLogprob& c : t.top) m[c.token] = c.logprob;
    top.push_back(req.logprobs > 0 ? m : json(nullptr));
    offsets.push_back(off);
    off += t.bytes.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_lp},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

json usage_json(const ApiUsage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace

std::string completion_json(const ApiRequest& req, const std::string& id, int64_t created,
                            const std::vector<ApiChoice>& choices, const ApiUsage& usage) {
  json cs = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ApiChoice& c = choices[i];
    json lp = req.logprobs >= 0 ? logprobs_json(req, c.logprobs, 0) : json(nullptr);
    if (req.chat)
      cs.push_back({{"index", i},
                    {"message", {{"role", "assistant"}, {"content", c.text}}},
                    {"logprobs", lp},
                    {"finish_reason", c.finish_reason}});
    else
      cs.push_back(
          {{"index", i}, {"text", c.text}, {"logprobs", lp}, {"finish_reason", c.finish_reason}});
  }
  json j = {{"id", id},
            {"object", req.chat ? "chat.completion" : "text_completion"},
            {"created", created},
            {"model", req.model},
            {"system_fingerprint", nullptr},
            {"choices", cs},
            {"usage", usage_json(usage)}};
  return dump(j);
}

std::string chunk_json(const ApiRequest& req, const std::string& id, int64_t created, int index,
                       const std::string& text, const std::vector<TokenLogprob>* logprobs,
                       const std::string& finish_reason, bool first) {
  json lp = req.logprobs >= 0 && logprobs && !logprobs->empty() ? logprobs_json(req, *logprobs, 0)
                                                                : json(nullptr);
  json fr = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  json c;
  if (req.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish_reason.empty())) delta["content"] = text;
    c = {{"index", index}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", fr}};
  } else {
    c = {{"index", index}, {"text", text}, {"logprobs", lp}, {"finish_reason", fr}};
  }
  json j = {{"id", id},
            {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", req.model},
            {"system_fingerprint", nullptr},
            {"choices", json::array({c})}};
  return dump(j);
}

std::string usage_chunk_json(const ApiRequest& req, const std::string& id, int64_t created,
                             const ApiUsage& usage) {
  json j = {{"id", id},
            {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", req.model},
            {"choices", json::array()},
            {"usage", usage_json(usage)}};
  return dump(j);
}

std::string models_json(const std::vector<std::string>& ids, int64_t created) {
  json data = json::array();
  for (const std::string& id : ids)
    data.push_back(
        {{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "kvscope"}});
  return dump({{"object", "list"}, {"data", data}});
}

std::string logprob_token_text(const std::string& bytes) {
  if (utf8_valid(bytes)) return bytes;
  static const char* hex = "0123456789abcdef";
  std::string s = "bytes:";
  for (unsigned char c : bytes) {
    s += "\\x";
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

}  // namespace kvscope::serve
