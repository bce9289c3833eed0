// run_file_seeds.cpp — writes the run-file fuzz seeds into the directory given as argv[1]:
// real recordings of a tiny random-weight llama (tests/util/tiny_model.h): three CACHE steps
// with fp16 attention, two NO CACHE steps with fp32 attention, and a run with no steps. Each
// is a few KB so mutation runs stay fast. The committed corpus tests/fuzz/corpus/run_file/
// was written by this program.
#include <cstdio>
#include <filesystem>
#include <string>

#include "app/core/run_file.h"
#include "engine/cpu/cpu_backend.h"
#include "tests/util/tiny_model.h"

namespace {

using namespace kvscope;
using namespace kvscope::app;

int fail(const std::string& m) {
  std::fprintf(stderr, "run_file_seeds: %s\n", m.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return fail("usage: run_file_seeds OUT_DIR");
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  test::TinyModelSpec spec;
  spec.n_layer = 1;
  spec.n_head = 2;
  spec.n_head_kv = 1;
  spec.n_embd = 32;
  spec.n_ff = 32;
  const std::string model_path = (dir / "tiny.gguf.tmp").string();
  if (Status st = test::write_tiny_llama(spec, model_path); !st.ok()) return fail(st.message());
  auto model = Model::load(model_path);
  std::filesystem::remove(model_path);
  if (!model.ok()) return fail(model.error().message);

  struct Seed {
    const char* name;
    CacheMode mode;
    AttnEncoding enc;
    int steps;
  };
  for (Seed seed : {Seed{"cache_f16.kvs", CacheMode::Cache, AttnEncoding::F16, 3},
                    Seed{"nocache_f32.kvs", CacheMode::NoCache, AttnEncoding::F32, 2},
                    Seed{"empty.kvs", CacheMode::Cache, AttnEncoding::F16, 0}}) {
    SessionConfig cfg;
    cfg.mode = seed.mode;
    cfg.max_tokens = 8;
    cfg.stop_at_eos = false;
    auto s = Session::create(model.value(), make_cpu_backend(1), cfg);
    if (!s.ok()) return fail(s.error().message);
    PromptSpec prompt{"Seed: a run.", false};
    if (Status st = s.value()->reset(prompt); !st.ok()) return fail(st.message());
    RunMeta meta;
    meta.producer = "kvscope run_file_seeds";
    meta.model = facts_of(*s.value());
    meta.prompt = prompt;
    meta.mode = seed.mode;
    meta.max_tokens = cfg.max_tokens;
    meta.attention = seed.enc;
    auto f = RunFile::create((dir / seed.name).string(), meta);
    if (!f.ok()) return fail(f.error().message);
    for (int i = 0; i < seed.steps; ++i) {
      auto t = s.value()->step();
      if (!t.ok()) return fail(t.error().message);
      t->ms = 1.5;  // fixed, so the seeds are byte-for-byte reproducible
      if (auto off = f.value()->append_step(t.value()); !off.ok()) return fail(off.error().message);
    }
    if (Status st = f.value()->finish(RunEnd{seed.steps, "max_tokens"}); !st.ok())
      return fail(st.message());
  }
  return 0;
}
