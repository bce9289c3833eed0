// run_file_seeds.cpp — writes the run-file fuzz seeds into the directory given as argv[1]:
// real recordings of a tiny random-weight llama (tests/util/tiny_model.h): three CACHE steps
// with fp16 attention, two NO CACHE steps with fp32 attention, and a run with no steps; and
// a small hand-made serving run (serving.kvs, app/core/serving_record.h: three sequences,
// one forked, one preempted, over six steps). Each is a few KB so mutation runs stay fast.
// The committed corpus tests/fuzz/corpus/run_file/ was written by this program.
#include <cstdio>
#include <filesystem>
#include <string>

#include "app/core/run_file.h"
#include "app/core/serving_record.h"
#include "engine/cpu/cpu_backend.h"
#include "tests/util/tiny_model.h"

namespace {

using namespace kvscope;
using namespace kvscope::app;

int fail(const std::string& m) {
  std::fprintf(stderr, "run_file_seeds: %s\n", m.c_str());
  return 1;
}

// A serving run small enough to mutate quickly that still has every kind of record entry:
// tiles, lanes (new, grown, forked, preempted), the waiting queue, events, history, totals.
Status write_serving_seed(const std::string& path) {
  ServingSnapshot s;
  s.run = 1;
  s.block_size = 4;
  s.n_blocks = 6;
  s.max_batch_tokens = 16;
  s.max_seqs = 3;
  s.context = 32;
  s.n_requests = 2;
  s.tiles.resize(6);
  ServingMeta meta;
  meta.producer = "kvscope run_file_seeds";
  meta.model.file_name = "tiny.gguf";
  meta.attention = AttnEncoding::F16;
  auto rec = ServingRecorder::create(path, meta, s);
  if (!rec.ok()) return rec.error();
  for (int step = 1; step <= 6; ++step) {
    s.step = step;
    s.events.clear();
    for (PoolTile& t : s.tiles) t.flash = TileFlash::None;
    if (step == 1) {
      for (int q = 0; q < 2; ++q) {
        Lane l;
        l.seq = q;
        l.request = q;
        l.prompt_tokens = 3;
        l.ids = {1, 2, 3};
        l.pieces = {"a", "b", "c"};
        s.lanes.push_back(l);
        s.events.push_back({EventKind::Arrive, q, 0, ""});
      }
      s.waiting = {0, 1};
    }
    if (step == 2) {
      Lane f = s.lanes[0];
      f.seq = 2;
      f.sample = 1;
      f.parent = 0;
      s.lanes.push_back(f);
      s.events.push_back({EventKind::Fork, 2, 0, ""});
      s.waiting = {1};
    }
    if (step == 5) {
      s.lanes[1].state = LaneState::Preempted;
      s.lanes[1].computed = 0;
      s.lanes[1].table.clear();
      s.events.push_back({EventKind::Preempt, 1, 4, ""});
    }
    for (Lane& l : s.lanes) {
      if (l.state == LaneState::Preempted) continue;
      l.state = LaneState::Running;
      l.ids.push_back(10 + step);
      l.pieces.push_back(" x");
      l.computed = int(l.ids.size());
      l.attention.assign(size_t(l.computed), 1.0f / float(l.computed));
      const int block = (l.seq * 2 + (l.computed - 1) / 4) % 6;
      if (l.table.empty() || l.table.back() != block) l.table.push_back(block);
      PoolTile& t = s.tiles[size_t(block)];
      t.state = TileState::Used;
      t.refs = 1;
      t.owners = {l.seq};
      t.n_pos = (l.computed - 1) % 4 + 1;
      t.flash = TileFlash::Written;
    }
    ServingPoint p;
    p.step = step;
    p.running = int(s.lanes.size());
    p.ms = 1.5;
    s.history.push_back(p);
    s.totals.steps = step;
    s.done = step == 6;
    if (Status st = rec.value()->append(s); !st.ok()) return st;
  }
  return rec.value()->finish();
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
  if (Status st = write_serving_seed((dir / "serving.kvs").string()); !st.ok())
    return fail(st.message());
  return 0;
}
