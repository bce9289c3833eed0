// cli_bench.cpp — `kvscope bench`: speed of the engine on the default model.
//
// prefill: one forward over a 512-token prompt into an empty cache (best of 3).
// decode:  128 single-token forwards from an empty cache (llama.cpp's tg128), and 128
//          more after a 512-token prefill.
// nocache: one NO CACHE step at sequence lengths 64, 128, 256, 512 — a forward over the
//          whole sequence into a scratch cache that is then thrown away (best of 3).
// The prompt tokens are real text (a short story, repeated) so attention is realistic.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "app/cli_common.h"
#include "app/json_writer.h"
#include "engine/forward.h"

namespace kvscope::cli {
namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  return "unknown";
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* kBenchText =
    "Once upon a time, in a small kingdom by the sea, there lived a clockmaker who could "
    "mend anything but his own heart. Every morning he opened his shop, wound the great "
    "clock in the square, and listened to the town wake up around him. ";

}  // namespace

int run_bench(int argc, char** argv) {
  CLI::App app{"Measure prefill, decode and NO CACHE step speed.", "kvscope bench"};
  std::string model_path, backend_name = "auto";
  int threads = 0;
  bool json = false;
  app.add_option("--threads", threads, "CPU threads (0 = all)")->check(CLI::NonNegativeNumber);
  app.add_option("--model", model_path, "Built-in model name (smollm2-135m, the default; gemma3-270m) or GGUF file path");
  app.add_option("--backend", backend_name, "auto, cuda or cpu")->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  app.add_flag("--json", json, "Print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (model_path.empty()) model_path = default_model_path();
  auto model = load_model(model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "kvscope: %s\n", model.error().message.c_str());
    return 1;
  }
  const Model& m = **model;
  std::string notice;
  auto be = make_backend(backend_name, m, threads, &notice);
  if (!be.ok()) {
    std::fprintf(stderr, "kvscope: %s\n", be.error().message.c_str());
    return 1;
  }
  Backend& backend = **be;
  const ModelConfig& c = m.config();
  const KvCacheConfig kv_cfg = kv_cache_config(m, KvTypes{}, KvPolicy::ModelWindow);
  const KvCacheConfig scratch_cfg = kv_config_scratch(kv_cfg);  // NO CACHE's

  std::vector<int32_t> tokens;
  while (tokens.size() < 640) {
    auto ids = m.tokenizer().encode(kBenchText, false);
    if (!ids.ok() || ids->empty()) {
      std::fprintf(stderr, "kvscope: cannot tokenize the benchmark text\n");
      return 1;
    }
    tokens.insert(tokens.end(), ids->begin(), ids->end());
  }
  auto fail = [](const Error& e) {
    std::fprintf(stderr, "kvscope: %s\n", e.message.c_str());
    return 1;
  };

  // NO CACHE steps (also warms up the weights' pages).
  std::vector<std::pair<int, double>> nocache;
  for (int len : {64, 128, 256, 512}) {
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      auto cache = backend.create_kv_cache(scratch_cfg, len);
      if (!cache.ok()) return fail(cache.error());
      ForwardOutput out;
      double t0 = now_ms();
      if (Status s = forward(backend, m, tokens.data(), len, 0, **cache, out); !s.ok())
        return fail(s.error());
      best = std::min(best, now_ms() - t0);
    }
    nocache.push_back({len, best});
  }
  const int P = 512;
  double prefill_ms = nocache.back().second;  // the 512-token NO CACHE step is a prefill
  // Decode, as llama.cpp's tg128: 128 single-token steps starting from an empty cache;
  // then the same after a 512-token prefill (attention over 512..639 keys).
  const int G = 128;
  auto decode_ms_from = [&](int start) -> Expected<double> {
    auto cache = backend.create_kv_cache(kv_cfg, start + G);
    if (!cache.ok()) return cache.error();
    ForwardOutput out;
    if (start > 0) KV_TRY(forward(backend, m, tokens.data(), start, 0, **cache, out));
    const double t0 = now_ms();
    for (int g = 0; g < G; ++g)
      KV_TRY(forward(backend, m, tokens.data() + start + g, 1, start + g, **cache, out));
    return now_ms() - t0;
  };
  auto d0 = decode_ms_from(0);
  if (!d0.ok()) return fail(d0.error());
  auto d512 = decode_ms_from(P);
  if (!d512.ok()) return fail(d512.error());
  const double decode_ms = *d0, decode_512_ms = *d512;
  const double prefill_tok_s = P / (prefill_ms / 1000.0);
  const double decode_tok_s = G / (decode_ms / 1000.0);
  const double decode_512_tok_s = G / (decode_512_ms / 1000.0);
  const std::string cpu = cpu_model_name();

  if (json) {
    JsonWriter j;
    j.begin_object();
    j.key("model").value(c.name);
    j.key("backend").value(backend.name());
    j.key("prefill_tokens").value(P);
    j.key("prefill_tok_s").value(prefill_tok_s);
    j.key("decode_tokens").value(G);
    j.key("decode_tok_s").value(decode_tok_s);
    j.key("decode_after_512_tok_s").value(decode_512_tok_s);
    j.key("nocache_step_ms").begin_object();
    for (auto& [len, ms] : nocache) j.key(std::to_string(len)).value(ms);
    j.end_object();
    j.key("threads").value(threads > 0 ? threads : int(std::thread::hardware_concurrency()));
    j.key("cpu").value(cpu);
    j.end_object();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("model    %s\nbackend  %s\ncpu      %s\n", c.name.c_str(), backend.name().c_str(),
                cpu.c_str());
    std::printf("prefill  %d tokens: %.1f ms  (%.1f tokens/s)\n", P, prefill_ms, prefill_tok_s);
    std::printf("decode   %d tokens from an empty cache: %.1f ms  (%.1f tokens/s)\n", G,
                decode_ms, decode_tok_s);
    std::printf("decode   %d tokens after %d: %.1f ms  (%.1f tokens/s)\n", G, P, decode_512_ms,
                decode_512_tok_s);
    for (auto& [len, ms] : nocache)
      std::printf("nocache  step at seq_len %4d: %.1f ms\n", len, ms);
  }
  return 0;
}

}  // namespace kvscope::cli
