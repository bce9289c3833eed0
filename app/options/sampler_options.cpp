// sampler_options.cpp — the sampler group (see sampler_options.h).
#include "app/options/sampler_options.h"

#include "app/options/options.h"

namespace kvscope::cli {

void add_sampler_options(CLI::App& app, SamplerOptions& o) {
  app.add_option("--temp", o.temp, "Temperature (0 = greedy)")->check(Range(0.0, kMaxTemperature));
  app.add_option("--top-k", o.top_k, "Keep the k most likely tokens (0 = off)")
      ->check(Range(0, kMaxTopK));
  app.add_option("--top-p", o.top_p, "Nucleus sampling mass (1 = off)")->check(Range(0.0, 1.0));
  app.add_option("--min-p", o.min_p, "Drop tokens below min-p x the best (0 = off)")
      ->check(Range(0.0, 1.0));
  app.add_option("--seed", o.seed, "Sampling seed");
}

SamplerConfig to_sampler_config(const SamplerOptions& o) {
  SamplerConfig sc;
  sc.temperature = o.temp;
  sc.top_k = o.top_k;
  sc.top_p = o.top_p;
  sc.min_p = o.min_p;
  sc.seed = o.seed;
  return sc;
}

}  // namespace kvscope::cli
