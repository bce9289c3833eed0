// bench.cpp — `kvscope bench`: speed of the engine on a model.
//
// For each thread count asked for (default: all hardware threads, then 1):
// nocache: one NO CACHE step at sequence lengths 64, 128, 256, 512 — a forward over the
//          whole sequence into a scratch cache that is then thrown away (best of 3);
// prefill: the 512-token NO CACHE step (llama.cpp's pp512);
// decode:  128 single-token forwards after a prefill of 0 (llama.cpp's tg128), 512 and
//          2,048 tokens (attention over that many more keys).
// memory:  on the CPU, how fast the backend's thread count reads a buffer the size of
//          the weights one decode step reads, pass after pass as decode reads them (the
//          best of many passes after a warm-up one), and with it the floor of decode: a
//          step from an empty cache reads every weight the products use once (the file's
//          weight bytes, less the embedding table when the LM head has its own), so
//          decode runs at most that read speed / those bytes tokens/s; tg128 is reported
//          as a share of that floor. Where the last-level cache holds much of the
//          weights (a server part's few hundred MB), that speed is above the memory's,
//          and so is decode; a read of 512 MiB, past any cache, is printed beside it
//          for the memory itself (weights larger than that are read at that size). And
//          the bound on decode at depth: each step after a prefill of d tokens reads the
//          cache's K/V rows on top of what a step from an empty cache reads; if those
//          bytes come at the floor's read speed, it runs at most t0 / (t0 + extra bytes / bandwidth) of decode
//          from an empty cache (t0: that step's time). Rows still in a cache (a short
//          context's few MB) can beat it; at long contexts it is the limit.
// ceiling: on the CPU, the time of a decode step's products when their weights come from
//          the cores' caches instead (Backend::products_in_cache_ms: each product timed on
//          a part of its weight that fits the L2 caches, scaled to the whole): what the
//          products' instructions allow however fast the memory, and with the floor the
//          bound on decode (the lower of the two), tg128 reported as a share of each.
// --batch 1,4,16,64 measures batched decode instead: for each batch size B, B sequences
// with different 32-token prompts in paged caches on one block pool, then 32 steps that
// each run one token of every sequence through one forward pass (forward_batch) and pick
// each row's greedy token as the scheduler does (kvscope batch): on the device where the
// backend samples there (the logits rows stay on the GPU, their candidates come back),
// else from the logits on the host. It
// prints the aggregate decode tokens/s, the step time, the speed-up over batch 1 and the
// pool's KV bytes against contiguous caches reserving the model's context per sequence.
// The prompt tokens are real text (a short story, repeated) so attention is realistic.
// On the CPU, each batch size's ceiling too: its step's products, B rows each, with every
// weight in cache (as for decode's ceiling below).
// --kv-type / --kv-type-k / --kv-type-v choose the cache's element types (default f16),
// so decode speed can be compared across cache types on one backend.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "app/cli/commands.h"
#include "app/cli/json_writer.h"
#include "app/core/clock.h"
#include "app/options/engine_options.h"
#include "app/options/kv_options.h"
#include "app/options/options.h"
#include "engine/bootstrap/bootstrap.h"
#include "engine/cpu/thread_pool.h"
#include "engine/device_sampling.h"
#include "engine/forward.h"
#include "engine/sampler.h"

namespace kvscope::cli {
namespace {

using app::now_ms;

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

const char* kBenchText =
    "Once upon a time, in a small kingdom by the sea, there lived a clockmaker who could "
    "mend anything but his own heart. Every morning he opened his shop, wound the great "
    "clock in the square, and listened to the town wake up around him. ";

constexpr int kPrefill = 512;              // pp512
constexpr int kDecode = 128;               // tg128
constexpr int kDepths[] = {0, 512, 2048};  // decode after a prefill of this many tokens
constexpr int kNoCache[] = {64, 128, 256, 512};

// The weights whose products one decode step runs: every layer's, then the LM head.
std::vector<const Weight*> decode_product_weights(const Model& m) {
  std::vector<const Weight*> ws;
  for (const LayerWeights& l : m.layers())
    for (const Weight* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      if (w->data) ws.push_back(w);
  ws.push_back(&m.output());
  return ws;
}

struct BenchRun {
  std::string backend;
  KvTypes kv_types;
  bool contiguous = false;  // --kv-layout contiguous
  int threads = 0;
  std::vector<std::pair<int, double>> nocache_ms;  // (seq_len, best ms)
  std::vector<std::pair<int, double>> decode_ms;   // (depth, ms for kDecode tokens)
  std::vector<std::pair<int, double>> kv_mb;       // (depth, mean K/V MB a decode step reads)
  double read_gb_s = 0;       // CPU: read speed of a buffer of weight_mb, 0 off the CPU
  double memory_gb_s = 0;     // CPU: read speed of 512 MiB, past the caches
  double weight_mb = 0;                            // weight bytes one decode step reads
  double products_ms = 0;  // CPU: a decode step's products with their weights in cache, 0 off it
  double prefill_ms() const { return nocache_ms.back().second; }
};

// Measures one backend; tokens holds at least 2048 + 128 ids.
// contiguous: caches of their own (the layout before the pool) instead of paged ones, to
// tell the pool's cost apart on a backend.
Expected<BenchRun> measure(Backend& backend, const Model& m, const std::vector<int32_t>& tokens,
                           KvTypes types, bool contiguous) {
  const KvCacheConfig kv_cfg = kv_cache_config(m, types, KvPolicy::ModelWindow);
  const KvCacheConfig scratch_cfg = kv_config_scratch(kv_cfg);  // NO CACHE's
  // The caches a session uses: paged, over one pool with room for the longest run.
  const KvLayerGroups groups = kv_layer_groups(kv_cfg);
  KvPoolConfig pc{{groups.size, kv_cfg.shape.n_head_kv, kv_cfg.shape.head_dim}, types, 16, 0};
  pc.n_blocks = kv_blocks_for(std::max(std::end(kNoCache)[-1], std::end(kDepths)[-1] + kDecode), 16) *
                groups.count();
  auto pool = backend.create_kv_pool(pc);
  if (!pool.ok()) return pool.error();
  const auto make_cache = [&](const KvCacheConfig& cfg, int capacity) {
    return contiguous ? backend.create_kv_cache(cfg, capacity)
                      : backend.create_paged_kv_cache(cfg, *pool);
  };
  BenchRun run;
  run.backend = backend.name();
  run.kv_types = types;
  run.contiguous = contiguous;
  // NO CACHE steps (also warms up the weights).
  for (int len : kNoCache) {
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      auto cache = make_cache(scratch_cfg, len);
      if (!cache.ok()) return cache.error();
      ForwardOutput out;
      const double t0 = now_ms();
      KV_TRY(forward(backend, m, tokens.data(), len, 0, **cache, out));
      best = std::min(best, now_ms() - t0);
    }
    run.nocache_ms.push_back({len, best});
  }
  for (int depth : kDepths) {
    auto cache = make_cache(kv_cfg, depth + kDecode);
    if (!cache.ok()) return cache.error();
    ForwardOutput out;
    if (depth > 0) KV_TRY(forward(backend, m, tokens.data(), depth, 0, **cache, out));
    const double t0 = now_ms();
    double kv_bytes = 0;  // held before each step's new row: what its attention reads
    for (int g = 0; g < kDecode; ++g) {
      kv_bytes += double((*cache)->bytes_used());
      KV_TRY(forward(backend, m, tokens.data() + depth + g, 1, depth + g, **cache, out));
    }
    run.decode_ms.push_back({depth, now_ms() - t0});
    run.kv_mb.push_back({depth, kv_bytes / kDecode / 1e6});
  }
  return run;
}

struct BatchRun {
  int batch = 0;
  double step_ms = 0;       // mean time of one decode step over the whole batch
  uint64_t pool_bytes = 0;  // KV bytes of the pool's used blocks after the last step
  uint64_t contiguous_bytes = 0;  // a contiguous cache of the full context per sequence
  double products_ms = 0;  // CPU: the step's products with their weights in cache, 0 off it
};
constexpr int kBatchPrompt = 32, kBatchSteps = 32;

// The first index of the largest value, as the greedy sampler picks it.
int32_t argmax_id(const std::vector<float>& v) {
  return argmax_first(v);
}

// Batched decode at each size in `sizes` (see the top).
Expected<std::vector<BatchRun>> measure_batch(Backend& backend, const Model& m,
                                              const std::vector<int32_t>& tokens, KvTypes types,
                                              const std::vector<int>& sizes) {
  const ModelConfig& c = m.config();
  const KvCacheConfig cfg = kv_cache_config(m, types, KvPolicy::Full);
  // A block holds one group of layers (Gemma 3's windowed and global layers form groups
  // of their own: kv_layer_groups).
  const KvLayerGroups groups = kv_layer_groups(cfg);
  std::vector<BatchRun> out;
  for (int B : sizes) {
    const int per_seq = kBatchPrompt + kBatchSteps + 1;  // and the warm-up step
    KvPoolConfig pc{{groups.size, cfg.shape.n_head_kv, cfg.shape.head_dim}, types, 16,
                    groups.count() * B * kv_blocks_for(per_seq, 16)};
    auto pool = backend.create_kv_pool(pc);
    if (!pool.ok()) return pool.error();
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<BatchSeq> seqs;
    std::vector<BatchSeqOutput> res;
    for (int i = 0; i < B; ++i) {
      auto cache = backend.create_paged_kv_cache(cfg, *pool);
      if (!cache.ok()) return cache.error();
      caches.push_back(std::move(*cache));
      // Sequence i reads the text from token 7i on: every prompt differs.
      const size_t at = size_t(7 * i) % (tokens.size() - per_seq);
      KV_TRY(forward_batch(backend, m,
                           {BatchSeq{caches.back().get(), tokens.data() + at, kBatchPrompt}}, res));
    }
    // Greedy, as the scheduler samples it (engine/scheduler.cpp): the candidates the
    // device sampler needs for it, 0 where the logits come to the host. The tokens fed
    // stay the text's, so every batch size runs the same sequences.
    const int dev_n = backend.can_sample_on_device()
                          ? device_sample_candidates_needed(SamplerConfig{}, 0, c.n_vocab)
                          : 0;
    std::vector<DeviceCandidates> dc;
    int64_t picked = 0;  // a sum of the chosen ids, so that the choice is not optimized away
    double t0 = 0;
    for (int g = -1; g < kBatchSteps; ++g) {  // step -1 warms up
      if (g == 0) t0 = now_ms();
      seqs.clear();
      for (int i = 0; i < B; ++i) {
        const size_t at = size_t(7 * i) % (tokens.size() - per_seq);
        BatchSeq s{caches[size_t(i)].get(), tokens.data() + at + caches[size_t(i)]->length(), 1};
        s.logits_on_device = dev_n > 0;
        seqs.push_back(s);
      }
      KV_TRY(forward_batch(backend, m, seqs, res));
      if (dev_n > 0) {  // the rows are consecutive: one LM-head product, one sampler pass
        KV_TRY(backend.sample_candidates_rows(Tensor{res[0].logits_dev.data, B, c.n_vocab}, dev_n,
                                              1.0f, dc));
        for (int i = 0; i < B; ++i) {
          const auto ds = device_sample_resolve(dc[size_t(i)], c.n_vocab, SamplerConfig{}, 0);
          if (ds) {
            picked += ds->kept[0];
          } else {  // not settled by the candidates: the row comes back, as in the scheduler
            res[size_t(i)].logits.resize(size_t(c.n_vocab));
            KV_TRY(backend.download(res[size_t(i)].logits_dev, res[size_t(i)].logits.data()));
            picked += argmax_id(res[size_t(i)].logits);
          }
        }
      } else {
        for (const BatchSeqOutput& o : res) picked += argmax_id(o.logits);
      }
    }
    if (picked < 0) return make_error("bench: a negative token id");
    BatchRun r;
    r.batch = B;
    r.step_ms = (now_ms() - t0) / kBatchSteps;
    r.pool_bytes = uint64_t((*pool)->counts().used) * kv_block_bytes(pc);
    r.contiguous_bytes = uint64_t(B) * uint64_t(std::max(1, c.n_ctx)) * uint64_t(c.n_layer) *
                         kv_position_bytes(cfg.shape, types);
    // The ceiling the products' instructions put on this batch size (bench's top).
    r.products_ms = backend.products_in_cache_ms(decode_product_weights(m), B).value_or(0);
    out.push_back(r);
  }
  return out;
}

// GB/s at which n threads read a buffer of `bytes`, each summing its share in 16 lanes:
// the best of as many passes as read 4 GiB in all (at least 8, at most 64) after a
// warm-up pass, which leaves in the caches what they can hold, as a decode step finds
// the weights the last one read (other programs on the machine only ever make a pass
// slower, so the best is the steadiest figure of what the machine can deliver). The
// buffer is aligned to the 64-byte cache line, as the packed weights are, and each
// thread's share is whole lines: a vector's own storage starts 16 bytes into a line, so
// that every 64-byte load spans two lines, and one Zen 5 thread read such a buffer at
// 30-33 GB/s where it reads an aligned one at 37-39 (two threads: the same 40-52 both
// ways). 0 when the buffer cannot be had.
double memory_read_gb_s(int n, uint64_t bytes) {
  const size_t unit = size_t(16) * size_t(n);  // whole lines for every thread
  const size_t floats = std::max(unit, size_t(bytes / sizeof(float)) / unit * unit);
  std::unique_ptr<float, decltype(&std::free)> mem(
      static_cast<float*>(std::aligned_alloc(64, floats * sizeof(float))), std::free);
  if (!mem) return 0;
  float* const buf = mem.get();
  std::fill(buf, buf + floats, 1.0f);
  std::vector<float> sums(size_t(n) * 16);
  double best = 0;
  const uint64_t total = uint64_t(4) << 30;
  const int passes = int(std::clamp<uint64_t>(total / (floats * sizeof(float)), 8, 64));
  for (int rep = 0; rep <= passes; ++rep) {
    const double t0 = now_ms();
    std::vector<std::thread> threads;
    for (int t = 0; t < n; ++t)
      threads.emplace_back([&, t] {
        const size_t b = floats / size_t(n) * size_t(t) / 16 * 16;
        const size_t e = t + 1 == n ? floats : floats / size_t(n) * size_t(t + 1) / 16 * 16;
        float acc[16] = {};
        for (size_t i = b; i < e; i += 16)
          for (int j = 0; j < 16; ++j) acc[j] += buf[i + size_t(j)];
        std::copy_n(acc, 16, sums.begin() + t * 16);
      });
    for (std::thread& th : threads) th.join();
    if (rep > 0)
      best = std::max(best, double(floats * sizeof(float)) / ((now_ms() - t0) / 1000.0) / 1e9);
  }
  return sums[0] > 0 ? best : 0;  // sums read, so the loads are not optimized away
}

double ms_of(const std::vector<std::pair<int, double>>& v, int key) {
  for (auto& [k, x] : v)
    if (k == key) return x;
  return 0;
}

// At most this fraction of decode after 0 for decode after `depth` (see the top).
double depth_bound(const BenchRun& r, int depth) {
  const double t0 = ms_of(r.decode_ms, 0) / kDecode;
  const double extra_mb = ms_of(r.kv_mb, depth) - ms_of(r.kv_mb, 0);
  return t0 / (t0 + extra_mb / r.read_gb_s);  // MB / (GB/s) = ms
}

double tok_s(int tokens, double ms) { return tokens / (ms / 1000.0); }

// Weight MB one decode step reads: every weight in the file, less the embedding table
// when the LM head is a separate tensor (a step then reads one row of the table).
double decode_weight_mb(const Model& m) {
  uint64_t b = m.weight_bytes();
  const Weight& e = m.tok_embd();
  if (m.output().data != e.data) b -= std::min(b, e.row_bytes * uint64_t(e.n_out));
  return double(b) / 1e6;
}

// The floor of decode at the measured read speed (tokens/s), and tg128's share of it.
double floor_tok_s(const BenchRun& r) {
  return r.read_gb_s * 1e3 / r.weight_mb;
}
double floor_share(const BenchRun& r) {
  return tok_s(kDecode, ms_of(r.decode_ms, 0)) / floor_tok_s(r);
}
// The ceiling the products' instructions put on decode (tokens/s): a step's products with
// every weight in cache; and the bound on decode, the lower of that and the floor.
double ceiling_tok_s(const BenchRun& r) { return 1000.0 / r.products_ms; }
double bound_tok_s(const BenchRun& r) {
  return r.products_ms > 0 ? std::min(floor_tok_s(r), ceiling_tok_s(r)) : floor_tok_s(r);
}

void print_json(const std::string& model, const std::string& cpu, const std::vector<BenchRun>& runs) {
  JsonWriter j;
  j.begin_object();
  j.key("model").value(model);
  j.key("cpu").value(cpu);
  j.key("runs").begin_array();
  for (const BenchRun& r : runs) {
    j.begin_object();
    j.key("backend").value(r.backend);
    j.key("threads").value(r.threads);
    j.key("kv_types").value(kv_types_name(r.kv_types));
    j.key("kv_layout").value(r.contiguous ? "contiguous" : "paged");
    j.key("prefill_tokens").value(kPrefill);
    j.key("prefill_tok_s").value(tok_s(kPrefill, r.prefill_ms()));
    j.key("decode_tokens").value(kDecode);
    j.key("decode_tok_s").begin_object();  // by prefill depth
    for (auto& [depth, ms] : r.decode_ms) j.key(std::to_string(depth)).value(tok_s(kDecode, ms));
    j.end_object();
    j.key("decode_kv_read_mb").begin_object();  // mean K/V bytes a step reads, by depth
    for (auto& [depth, mb] : r.kv_mb) j.key(std::to_string(depth)).value(mb);
    j.end_object();
    if (r.read_gb_s > 0) {
      j.key("memory_read_gb_s").value(r.read_gb_s);  // over a buffer of decode_weight_mb
      j.key("memory_read_512mib_gb_s").value(r.memory_gb_s);  // past the caches
      j.key("decode_weight_mb").value(r.weight_mb);
      j.key("decode_floor_tok_s").value(floor_tok_s(r));  // read speed / weight bytes
      j.key("decode_floor_share").value(floor_share(r));  // tg128 / that floor
      if (r.products_ms > 0) {
        j.key("products_in_cache_ms").value(r.products_ms);  // a step's products, from cache
        j.key("decode_ceiling_tok_s").value(ceiling_tok_s(r));  // 1000 / that
        j.key("decode_ceiling_share").value(tok_s(kDecode, ms_of(r.decode_ms, 0)) /
                                            ceiling_tok_s(r));
      }
      j.key("decode_bound_tok_s").value(bound_tok_s(r));  // min(floor, ceiling)
      j.key("decode_bound_share").value(tok_s(kDecode, ms_of(r.decode_ms, 0)) / bound_tok_s(r));
      j.key("decode_depth_bound").begin_object();  // bound on decode at depth / at 0
      for (auto& [depth, ms] : r.decode_ms)
        if (depth > 0) j.key(std::to_string(depth)).value(depth_bound(r, depth));
      j.end_object();
    }
    j.key("nocache_step_ms").begin_object();
    for (auto& [len, ms] : r.nocache_ms) j.key(std::to_string(len)).value(ms);
    j.end_object();
    j.end_object();
  }
  j.end_array();
  j.end_object();
  std::printf("%s\n", j.str().c_str());
}

void print_text(const std::string& model, const std::string& cpu, const std::vector<BenchRun>& runs) {
  std::printf("model    %s\ncpu      %s\n", model.c_str(), cpu.c_str());
  for (const BenchRun& r : runs) {
    std::printf("backend  %s  (kv %s, %s)\n", r.backend.c_str(), kv_types_name(r.kv_types).c_str(),
                r.contiguous ? "contiguous caches" : "paged");
    std::printf("  prefill  %d tokens: %.1f ms  (%.1f tokens/s)\n", kPrefill, r.prefill_ms(),
                tok_s(kPrefill, r.prefill_ms()));
    for (auto& [depth, ms] : r.decode_ms)
      std::printf("  decode   %d tokens after %4d: %.1f ms  (%.1f tokens/s)\n", kDecode, depth, ms,
                  tok_s(kDecode, ms));
    for (auto& [len, ms] : r.nocache_ms)
      std::printf("  nocache  step at seq_len %4d: %.1f ms\n", len, ms);
    if (r.read_gb_s <= 0) continue;
    std::printf("  memory   %.1f MB read at %.1f GB/s by %d thread%s, again and again (512 MiB, "
                "past the caches: %.1f GB/s)\n",
                r.weight_mb, r.read_gb_s, r.threads, r.threads == 1 ? "" : "s", r.memory_gb_s);
    std::printf(
        "  floor    %.1f MB of weights per step: %.1f tokens/s at that speed; decode after "
        "0 reaches %.0f%% of it\n",
        r.weight_mb, floor_tok_s(r), 100.0 * floor_share(r));
    if (r.products_ms > 0) {
      const double d = tok_s(kDecode, ms_of(r.decode_ms, 0));
      std::printf(
          "  ceiling  the step's products with every weight in cache: %.2f ms, %.1f tokens/s; "
          "decode after 0 reaches %.0f%% of it\n",
          r.products_ms, ceiling_tok_s(r), 100.0 * d / ceiling_tok_s(r));
      std::printf("  bound    decode at most %.1f tokens/s, set by the %s; decode after 0 reaches "
                  "%.0f%% of it\n",
                  bound_tok_s(r),
                  ceiling_tok_s(r) < floor_tok_s(r) ? "products' instructions" : "memory",
                  100.0 * d / bound_tok_s(r));
    }
    const double d0 = ms_of(r.decode_ms, 0);
    for (auto& [depth, ms] : r.decode_ms)
      if (depth > 0)
        std::printf(
            "  depth    after %4d: %.1f MB more K/V per step; %.2fx of decode after 0 "
            "(%.2fx if those bytes come at that read speed)\n",
            depth, ms_of(r.kv_mb, depth) - ms_of(r.kv_mb, 0), d0 / ms, depth_bound(r, depth));
  }
}

double batch_tok_s(const BatchRun& r) { return r.batch / (r.step_ms / 1000.0); }

void print_batch(const std::string& model, const std::string& cpu, bool json,
                 const std::vector<std::pair<std::string, std::vector<BatchRun>>>& runs,
                 const std::vector<int>& threads) {
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.key("model").value(model);
    j.key("cpu").value(cpu);
    j.key("batches").begin_array();
    for (size_t k = 0; k < runs.size(); ++k)
      for (const BatchRun& r : runs[k].second) {
        j.begin_object();
        j.key("backend").value(runs[k].first);
        j.key("threads").value(threads[k]);
        j.key("batch").value(r.batch);
        j.key("decode_tok_s").value(batch_tok_s(r));
        j.key("step_ms").value(r.step_ms);
        j.key("vs_batch_1").value(batch_tok_s(r) / batch_tok_s(runs[k].second.front()));
        j.key("kv_pool_bytes").value(r.pool_bytes);
        j.key("contiguous_kv_bytes").value(r.contiguous_bytes);
        if (r.products_ms > 0) {
          j.key("products_in_cache_ms").value(r.products_ms);
          j.key("ceiling_tok_s").value(r.batch / (r.products_ms / 1000.0));
          j.key("ceiling_share").value(r.products_ms / r.step_ms);  // decode_tok_s / ceiling
        }
        j.end_object();
      }
    j.end_array();
    j.end_object();
    std::printf("%s\n", j.str().c_str());
    return;
  }
  std::printf("model    %s\ncpu      %s\n", model.c_str(), cpu.c_str());
  for (const auto& [backend, rs] : runs) {
    std::printf("backend  %s  (batched decode: %d-token prompts, then %d steps)\n", backend.c_str(),
                kBatchPrompt, kBatchSteps);
    for (const BatchRun& r : rs)
      std::printf("  batch %3d: %8.1f tokens/s  (%.2fx batch %d), step %.1f ms; KV pool %.1f MiB, "
                  "contiguous caches %.1f MiB\n",
                  r.batch, batch_tok_s(r), batch_tok_s(r) / batch_tok_s(rs.front()),
                  rs.front().batch, r.step_ms, double(r.pool_bytes) / 1048576.0,
                  double(r.contiguous_bytes) / 1048576.0);
    for (const BatchRun& r : rs)
      if (r.products_ms > 0)
        std::printf("  ceiling batch %3d: the step's products with every weight in cache %.1f ms, "
                    "%.1f tokens/s; reached %.0f%%\n",
                    r.batch, r.products_ms, r.batch / (r.products_ms / 1000.0),
                    100.0 * r.products_ms / r.step_ms);
  }
}

}  // namespace

int run_bench(int argc, char** argv) {
  CLI::App app{"Measure prefill, decode and NO CACHE step speed.", "kvscope bench"};
  EngineArgs engine;  // --threads is a list here
  add_engine_options(app, engine, /*threads=*/false);
  KvTypeOptions kv;
  std::vector<int> threads;
  bool json = false;
  add_thread_list_option(app, threads);
  add_kv_type_options(app, kv);
  app.add_flag("--json", json, "Print one JSON object");
  std::string layout = "paged";
  app.add_option("--kv-layout", layout,
                 "paged: caches over one pool of blocks, as sessions use (default); contiguous: "
                 "one cache of its own per run, the layout before the pool")
      ->check(CLI::IsMember({"paged", "contiguous"}));
  std::vector<int> batches;
  app.add_option("--batch", batches,
                 "Measure batched decode at these batch sizes instead (comma-separated)")
      ->delimiter(',')
      ->check(cli::Range(1, 1024));
  if (int rc = parse_options(app, argc, argv); rc >= 0) return rc;
  KvTypes kv_types;
  if (Status st = parse_kv_type_options(kv, &kv_types); !st.ok()) return cli::fail(st.message());
  auto model = load_model(engine.model.empty() ? default_model_path() : engine.model);
  if (!model.ok()) return fail(model.error().message);
  const Model& m = **model;
  auto fail = [](const Error& e) { return cli::fail(e.message); };
  const int hw = hardware_threads();
  if (threads.empty()) {
    threads.push_back(hw);
    if (hw > 1) threads.push_back(1);
  }
  for (int& n : threads)
    if (n == 0) n = hw;  // 0 = all, as every --threads says

  std::vector<int32_t> tokens;
  while (tokens.size() < size_t(kDepths[2] + kDecode)) {
    auto ids = m.tokenizer().encode(kBenchText, false);
    if (!ids.ok() || ids->empty()) return fail(Error{"cannot tokenize the benchmark text"});
    tokens.insert(tokens.end(), ids->begin(), ids->end());
  }
  if (m.config().n_ctx < kDepths[2] + kDecode)
    return fail(make_error("bench needs a context of ", kDepths[2] + kDecode,
                           " tokens; the model has ", m.config().n_ctx));

  if (!batches.empty()) {
    std::sort(batches.begin(), batches.end());
    batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
    std::vector<std::pair<std::string, std::vector<BatchRun>>> runs;
    std::vector<int> used;
    for (int n : threads) {
      std::string note;
      auto be = make_backend(engine.backend, m, n, &note);
      if (!be.ok()) return fail(be.error());
      if (!note.empty()) notice(note);
      auto r = measure_batch(**be, m, tokens, kv_types, batches);
      if (!r.ok()) return fail(r.error());
      runs.push_back({(*be)->name(), std::move(*r)});
      used.push_back(std::min(n, hw));
      if (std::string_view((*be)->kind()) != "cpu") break;
    }
    print_batch(m.config().name, cpu_model_name(), json, runs, used);
    return 0;
  }

  std::vector<BenchRun> runs;
  for (int n : threads) {
    std::string note;
    auto be = make_backend(engine.backend, m, n, &note);
    if (!be.ok()) return fail(be.error());
    if (!note.empty()) notice(note);  // e.g. more threads than the hardware: clamped
    auto run = measure(**be, m, tokens, kv_types, layout == "contiguous");
    if (!run.ok()) return fail(run.error());
    run->threads = std::min(n, hw);
    const bool on_cpu = std::string_view((*be)->kind()) == "cpu";
    if (on_cpu) {
      // Past 512 MiB no cache holds the weights: both reads are of memory, made once.
      const uint64_t past = uint64_t(512) << 20;
      run->weight_mb = decode_weight_mb(m);
      run->memory_gb_s = memory_read_gb_s(run->threads, past);
      const uint64_t bytes = uint64_t(run->weight_mb * 1e6);
      run->read_gb_s = bytes < past ? memory_read_gb_s(run->threads, bytes) : run->memory_gb_s;
      run->products_ms = (*be)->products_in_cache_ms(decode_product_weights(m), 1).value_or(0);
    }
    runs.push_back(std::move(*run));
    if (!on_cpu) break;  // thread counts mean nothing off the CPU
  }
  const std::string cpu = cpu_model_name();
  if (json) {
    print_json(m.config().name, cpu, runs);
  } else {
    print_text(m.config().name, cpu, runs);
  }
  return 0;
}

}  // namespace kvscope::cli
