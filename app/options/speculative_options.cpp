// speculative_options.cpp — --speculative and --draft-max (see speculative_options.h).
#include "app/options/speculative_options.h"

#include "app/options/options.h"

namespace kvscope::cli {

void add_speculative_options(CLI::App& app, SpeculativeOptions& o, bool draft_model) {
  app.add_option("--speculative", o.spec,
                 draft_model ? "Speculative decoding: ngram (prompt lookup), early-exit:L (the "
                               "model's first L layers) or draft:PATH (a GGUF with the same "
                               "vocabulary)"
                             : "Speculative decoding: ngram (prompt lookup) or early-exit:L (the "
                               "model's first L layers)");
  app.add_option("--draft-max", o.draft_max, "Tokens drafted per verification")
      ->check(Range(1, 15));
}

Expected<SpeculativeConfig> to_speculative_config(const SpeculativeOptions& o) {
  SpeculativeConfig c;
  if (o.spec.empty()) return c;
  auto parsed = speculative_parse(o.spec);
  if (!parsed.ok()) return parsed.error();
  c = *parsed;
  c.draft_max = o.draft_max;
  return c;
}

}  // namespace kvscope::cli
