// sampler_options.cpp — the sampler group (see sampler_options.h).
#include "app/options/sampler_options.h"

#include "app/options/options.h"

namespace kvscope::cli {

void add_temperature_option(CLI::App& app, float& temp) {
  app.add_option("--temp", temp, "Temperature (0 = greedy)")->check(Range(0.0, kMaxTemperature));
}

void add_sampler_options(CLI::App& app, SamplerOptions& o) {
  add_temperature_option(app, o.temp);
  app.add_option("--top-k", o.top_k, "Keep the k most likely tokens (0 = off)")
      ->check(Range(0, kMaxTopK));
  app.add_option("--top-p", o.top_p, "Nucleus sampling mass (1 = off)")->check(Range(0.0, 1.0));
  app.add_option("--min-p", o.min_p, "Drop tokens below min-p x the best (0 = off)")
      ->check(Range(0.0, 1.0));
  app.add_option("--seed", o.seed, "Sampling seed");
  app.add_option("--repeat-penalty", o.repeat_penalty,
                 "Divide a positive logit (multiply a negative one) of each token seen in the last "
                 "--repeat-last-n tokens by this (1 = off)")
      ->check(Range(0.1, 10.0));
  app.add_option("--repeat-last-n", o.repeat_last_n,
                 "Tokens the repetition, frequency and presence penalties look back over "
                 "(-1 = the whole sequence)")
      ->check(Range(-1, kMaxTopK));
  app.add_option("--frequency-penalty", o.frequency_penalty,
                 "Subtract this times the token's count in the last --repeat-last-n tokens")
      ->check(Range(-2.0, 2.0));
  app.add_option("--presence-penalty", o.presence_penalty,
                 "Subtract this from each token seen in the last --repeat-last-n tokens")
      ->check(Range(-2.0, 2.0));
  app.add_option("--no-repeat-ngram", o.no_repeat_ngram,
                 "Never repeat an n-gram of this many tokens (0 = off)")
      ->check(Range(0, 64));
  app.add_option("--logit-bias", o.logit_bias,
                 "ID=BIAS: add BIAS (-100..100) to token ID's logit (repeatable)");
}

Expected<SamplerConfig> to_sampler_config(const SamplerOptions& o) {
  SamplerConfig sc;
  sc.temperature = o.temp;
  sc.top_k = o.top_k;
  sc.top_p = o.top_p;
  sc.min_p = o.min_p;
  sc.seed = o.seed;
  PenaltyConfig& p = sc.penalties;
  p.repeat = o.repeat_penalty;
  p.frequency = o.frequency_penalty;
  p.presence = o.presence_penalty;
  p.last_n = o.repeat_last_n;
  p.no_repeat_ngram = o.no_repeat_ngram;
  for (const std::string& s : o.logit_bias) {
    const size_t eq = s.find('=');
    size_t used_id = 0, used_bias = 0;
    long long id = -1;
    float bias = 0;
    bool ok = eq != std::string::npos && eq > 0 && eq + 1 < s.size();
    try {
      if (ok) {
        id = std::stoll(s.substr(0, eq), &used_id);
        bias = std::stof(s.substr(eq + 1), &used_bias);
        ok = used_id == eq && used_bias == s.size() - eq - 1;
      }
    } catch (const std::exception&) {
      ok = false;
    }
    if (!ok || id < 0 || id > kMaxTopK || !(bias >= -100.0f && bias <= 100.0f))
      return make_error("--logit-bias: '", s, "' is not ID=BIAS (a token id and a bias in -100..100)");
    p.logit_bias.push_back({int32_t(id), bias});
  }
  return sc;
}

void add_stop_options(CLI::App& app, StopOptions& o) {
  app.add_option("--stop-id", o.stop_ids, "Stop when this token id is sampled (repeatable)")
      ->check(Range(0, kMaxTopK));
  app.add_option("--min-tokens", o.min_tokens,
                 "Generate at least this many tokens: end and --stop-id tokens are held back until "
                 "then")
      ->check(Range(0, kMaxTopK));
}

}  // namespace kvscope::cli
