// test_run_file.cpp — the run file (.kvs): what is written is what is read back (every field
// of every step; attention exactly in f32, within fp16 rounding in f16), the spool/save path
// the app uses, the attention cap, and bad files — corrupted, truncated, reordered, extended —
// each rejected with one clear error that names the file and the byte offset.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "app/core/replay_source.h"
#include "app/core/run_file.h"
#include "engine/cpu/cpu_backend.h"
#include "tests/util/tiny_model.h"

using namespace kvscope;
using namespace kvscope::app;

namespace {

struct Recorded {
  RunMeta meta;
  std::vector<StepTrace> steps;
};

// Real traces from a tiny model: a few CACHE steps, then NO CACHE ones (the K/V norms of
// every position are in those).
const Recorded& recorded() {
  static const Recorded r = [] {
    Recorded out;
    test::TinyModelSpec spec;
    const std::string path = ::testing::TempDir() + "/kvscope_runfile_tiny.gguf";
    EXPECT_TRUE(test::write_tiny_llama(spec, path).ok());
    auto model = Model::load(path);
    EXPECT_TRUE(model.ok());
    SessionConfig cfg;
    cfg.max_tokens = 12;
    cfg.stop_at_eos = false;
    auto s = Session::create(model.value(), make_cpu_backend(1), cfg);
    EXPECT_TRUE(s.ok());
    Session& session = *s.value();
    // Penalties, so that the candidates' logits before and after them differ.
    SamplerConfig sc;
    sc.penalties.repeat = 1.3f;
    sc.penalties.frequency = 0.5f;
    sc.penalties.presence = 0.25f;
    sc.penalties.last_n = 16;
    sc.penalties.no_repeat_ngram = 3;
    sc.penalties.logit_bias = {{5, -2.5f}, {7, 1.0f}};
    session.set_sampler(sc);
    PromptSpec prompt{"The run file keeps every step: ünïcode too.", false};
    EXPECT_TRUE(session.reset(prompt).ok());
    out.meta.producer = "kvscope test";
    out.meta.model = facts_of(session);
    out.meta.prompt = prompt;
    out.meta.mode = CacheMode::Cache;
    out.meta.sampler = session.sampler();
    out.meta.max_tokens = cfg.max_tokens;
    for (int i = 0; i < 12; ++i) {
      if (i == 6) {
        EXPECT_TRUE(session.set_mode(CacheMode::NoCache).ok());
      }
      auto t = session.step();
      EXPECT_TRUE(t.ok());
      out.steps.push_back(std::move(t.value()));
    }
    return out;
  }();
  return r;
}

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

std::string write_run(const std::string& name, AttnEncoding enc,
                      const std::string& reason = "max_tokens") {
  RunMeta meta = recorded().meta;
  meta.attention = enc;
  auto f = RunFile::create(temp(name), meta);
  EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.error().message);
  for (const StepTrace& t : recorded().steps) EXPECT_TRUE(f.value()->append_step(t).ok());
  EXPECT_TRUE(f.value()->finish(RunEnd{int(recorded().steps.size()), reason}).ok());
  return temp(name);
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
std::string write_bytes(const std::string& name, const std::vector<uint8_t>& b) {
  std::ofstream(temp(name), std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  return temp(name);
}

void expect_same_step(const StepTrace& a, const StepTrace& b, bool exact_attention) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.token_id, b.token_id);
  EXPECT_EQ(a.piece, b.piece);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.emitted, b.emitted);
  EXPECT_EQ(a.pos, b.pos);
  EXPECT_EQ(a.is_prompt, b.is_prompt);
  EXPECT_EQ(a.stop, b.stop);
  EXPECT_EQ(a.mode, b.mode);
  ASSERT_EQ(a.prompt.size(), b.prompt.size());
  for (size_t i = 0; i < a.prompt.size(); ++i) {
    EXPECT_EQ(a.prompt[i].id, b.prompt[i].id);
    EXPECT_EQ(a.prompt[i].text, b.prompt[i].text);
  }
  ASSERT_EQ(a.top.size(), b.top.size());
  for (size_t i = 0; i < a.top.size(); ++i) {
    EXPECT_EQ(a.top[i].id, b.top[i].id);
    EXPECT_EQ(a.top[i].text, b.top[i].text);
    EXPECT_EQ(a.top[i].p, b.top[i].p);
    EXPECT_EQ(a.top[i].logit, b.top[i].logit);
    EXPECT_EQ(a.top[i].raw_logit, b.top[i].raw_logit);
  }
  EXPECT_EQ(a.sampled_rank, b.sampled_rank);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_attn, b.n_attn);
  ASSERT_EQ(a.attention.size(), b.attention.size());
  for (size_t i = 0; i < a.attention.size(); ++i) {
    if (exact_attention)
      ASSERT_EQ(a.attention[i], b.attention[i]) << i;
    else  // fp16: 11 significant bits
      ASSERT_NEAR(a.attention[i], b.attention[i], a.attention[i] * (1.0f / 2048) + 6e-8f) << i;
  }
  EXPECT_EQ(a.kv_first_pos, b.kv_first_pos);
  EXPECT_EQ(a.kv_written, b.kv_written);
  EXPECT_EQ(a.k_norm, b.k_norm);
  EXPECT_EQ(a.v_norm, b.v_norm);
  EXPECT_EQ(a.flops, b.flops);
  EXPECT_EQ(a.flops_total, b.flops_total);
  EXPECT_EQ(a.kv_rows, b.kv_rows);
  EXPECT_EQ(a.kv_rows_total, b.kv_rows_total);
  EXPECT_EQ(a.kv_bytes, b.kv_bytes);
  EXPECT_EQ(a.kv_transient_bytes, b.kv_transient_bytes);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.tokens_processed, b.tokens_processed);
  EXPECT_EQ(a.ms, b.ms);
  EXPECT_EQ(a.device_ms, b.device_ms);
  EXPECT_EQ(a.backend, b.backend);
  ASSERT_EQ(a.kv_layers.size(), b.kv_layers.size());
  for (size_t l = 0; l < a.kv_layers.size(); ++l) {
    EXPECT_EQ(a.kv_layers[l].window, b.kv_layers[l].window);
    EXPECT_EQ(a.kv_layers[l].sink, b.kv_layers[l].sink);
    EXPECT_EQ(a.kv_layers[l].bytes, b.kv_layers[l].bytes);
    EXPECT_EQ(a.kv_layers[l].held, b.kv_layers[l].held);
  }
}

// Opening `path` fails, with the file's name in the message and `words` in it.
void expect_rejected(const std::string& path, const std::string& words) {
  auto f = RunFile::open(path);
  ASSERT_FALSE(f.ok()) << "a bad run file was accepted: " << path;
  const std::string& m = f.error().message;
  EXPECT_NE(m.find("run file '" + path + "'"), std::string::npos) << m;
  EXPECT_NE(m.find(words), std::string::npos) << "expected '" << words << "' in: " << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << "one line: " << m;
  auto rep = open_replay(path);
  EXPECT_FALSE(rep.ok());
}

}  // namespace

TEST(RunFile, EveryFieldOfEveryStepRoundTrips) {
  for (AttnEncoding enc : {AttnEncoding::F32, AttnEncoding::F16}) {
    SCOPED_TRACE(attn_encoding_name(enc));
    const std::string path =
        write_run(std::string("roundtrip_") + attn_encoding_name(enc) + ".kvs", enc);
    auto f = RunFile::open(path);
    ASSERT_TRUE(f.ok()) << f.error().message;
    RunMeta want = recorded().meta;
    want.attention = enc;
    EXPECT_TRUE(f.value()->meta() == want);
    EXPECT_EQ(f.value()->end().reason, "max_tokens");
    ASSERT_EQ(f.value()->step_offsets().size(), recorded().steps.size());
    for (size_t i = 0; i < recorded().steps.size(); ++i) {
      auto t = f.value()->read_step(f.value()->step_offsets()[i]);
      ASSERT_TRUE(t.ok()) << t.error().message;
      expect_same_step(recorded().steps[i], t.value(), enc == AttnEncoding::F32);
    }
    // NO CACHE steps carry K/V norms for every position; they survive too. CACHE steps say
    // what every layer holds.
    EXPECT_EQ(recorded().steps.back().kv_written, recorded().steps.back().pos);
    EXPECT_EQ(int(recorded().steps.front().kv_layers.size()), recorded().meta.model.n_layer);
    EXPECT_FALSE(recorded().steps.front().kv_layers[0].held.empty());
    // The replay source hands the steps back in order, then says the recording's reason.
    auto rep = open_replay(path);
    ASSERT_TRUE(rep.ok());
    ASSERT_TRUE(rep.value()->reset({}).ok());
    EXPECT_EQ(rep.value()->prompt().text, want.prompt.text);
    for (size_t i = 0; i < recorded().steps.size(); ++i) {
      auto t = rep.value()->step();
      ASSERT_TRUE(t.ok());
      EXPECT_EQ(t->step, int(i) + 1);
    }
    EXPECT_TRUE(rep.value()->done());
    EXPECT_EQ(rep.value()->stop_reason(), FinishReason::MaxTokens);
    EXPECT_FALSE(rep.value()->set_mode(CacheMode(1 - int(rep.value()->mode()))).ok());
  }
}

// The candidates' logits before the penalties differ from what the sampler saw somewhere in
// the run (the round trip above would not notice a field that is always equal).
TEST(RunFile, PenaltiesAndTheLogitsBeforeThemAreKept) {
  int differ = 0;
  for (const StepTrace& t : recorded().steps)
    for (const Candidate& c : t.top) differ += c.raw_logit != c.logit;
  EXPECT_GT(differ, 0);
  const std::string path = write_run("penalties.kvs", AttnEncoding::None);
  auto f = RunFile::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f.value()->meta().sampler.penalties, recorded().meta.sampler.penalties);
  EXPECT_EQ(f.value()->meta().sampler.penalties.logit_bias.size(), 2u);
}

// A run file of format version 1 (written by kvscope before the penalties: `kvscope record
// --model SmolLM2-135M-Instruct.Q4_1.gguf --prompt "The tin can" --max-tokens 3`) still
// opens: its steps read back whole, with no penalties and each candidate's logit as the
// one before them.
TEST(RunFile, AVersionOneFileStillOpens) {
  auto f = RunFile::open(std::string(KVSCOPE_SOURCE_DIR) + "/tests/golden/run_v1.kvs");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_FALSE(f.value()->meta().sampler.penalties.active());
  EXPECT_EQ(f.value()->meta().prompt.text, "The tin can");
  EXPECT_EQ(f.value()->end().reason, "max_tokens");
  ASSERT_EQ(f.value()->step_offsets().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    auto t = f.value()->read_step(f.value()->step_offsets()[i]);
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->step, int(i) + 1);
    ASSERT_FALSE(t->top.empty());
    EXPECT_EQ(t->top[size_t(std::max(t->sampled_rank, 0))].id, t->sampled_rank >= 0 ? t->token_id
                                                                                   : t->top[0].id);
    for (const Candidate& c : t->top) EXPECT_EQ(c.raw_logit, c.logit);
  }
}

TEST(RunFile, SpoolIsReadableWhileWrittenAndSaveMakesAWholeFile) {
  RunMeta meta = recorded().meta;
  auto sp = RunFile::create_spool(temp("spool_dir"), meta, 0);
  ASSERT_TRUE(sp.ok()) << sp.error().message;
  std::vector<uint64_t> offs;
  for (const StepTrace& t : recorded().steps) {
    auto off = sp.value()->append_step(t);
    ASSERT_TRUE(off.ok());
    offs.push_back(off.value());
    auto back = sp.value()->read_step(offs.front());  // an older step, read while writing
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(back->step, 1);
  }
  // Nothing named is left in the spool directory (the file is unlinked).
  for (const auto& e : std::filesystem::directory_iterator(temp("spool_dir")))
    ADD_FAILURE() << "left behind: " << e.path();
  const std::string saved = temp("saved_midway.kvs");
  // Writing succeeds whatever END says; a count that disagrees is caught on open.
  ASSERT_TRUE(sp.value()->save_copy(saved, RunEnd{6, "running"}).ok());
  expect_rejected(saved, "END says 6 steps but the file holds 12");
  ASSERT_TRUE(sp.value()->save_copy(saved, RunEnd{12, "stopped"}).ok());
  auto f = RunFile::open(saved);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f.value()->end().reason, "stopped");
  EXPECT_EQ(f.value()->step_offsets(), offs);
  // Saving a finished file again replaces its END.
  ASSERT_TRUE(f.value()->save_copy(temp("resaved.kvs"), RunEnd{12, "eos"}).ok());
  auto g = RunFile::open(temp("resaved.kvs"));
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g.value()->end().reason, "eos");
}

TEST(RunFile, PastTheCapStepsAreKeptWithoutAttention) {
  RunMeta meta = recorded().meta;
  auto f = RunFile::create(temp("capped.kvs"), meta, /*attention_cap=*/6000);
  ASSERT_TRUE(f.ok());
  for (const StepTrace& t : recorded().steps) ASSERT_TRUE(f.value()->append_step(t).ok());
  EXPECT_TRUE(f.value()->attention_dropped());
  ASSERT_TRUE(f.value()->finish(RunEnd{12, "max_tokens"}).ok());
  auto g = RunFile::open(temp("capped.kvs"));
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto first = g.value()->read_step(g.value()->step_offsets().front());
  auto last = g.value()->read_step(g.value()->step_offsets().back());
  ASSERT_TRUE(first.ok() && last.ok());
  EXPECT_FALSE(first->attention.empty());
  EXPECT_TRUE(last->attention.empty());
  EXPECT_EQ(last->flops, recorded().steps.back().flops) << "the rest of the step is kept";
}

TEST(RunFile, CorruptedFilesAreRejectedWithTheOffset) {
  const std::string good = write_run("good.kvs", AttnEncoding::F16);
  const std::vector<uint8_t> bytes = read_bytes(good);
  auto f = RunFile::open(good);
  ASSERT_TRUE(f.ok());
  const uint64_t step3 = f.value()->step_offsets()[2];

  auto patched = [&](size_t at, uint8_t x) {
    std::vector<uint8_t> b = bytes;
    b[at] ^= x;
    return write_bytes("bad.kvs", b);
  };
  expect_rejected(patched(0, 0x20), "not a kvscope run file");
  expect_rejected(patched(8, 0x01), "format version 3 is not supported");
  expect_rejected(patched(8, 0x02), "format version 0 is not supported");
  expect_rejected(patched(12, 0x01), "header flags");
  expect_rejected(patched(16, 0x01), "unknown record tag");
  expect_rejected(patched(40, 0x10), "checksum mismatch");  // inside META
  expect_rejected(patched(size_t(step3) + 30, 0x04), "record at byte " + std::to_string(step3));
  expect_rejected(patched(size_t(step3) + 30, 0x04), "checksum mismatch");
  expect_rejected(patched(size_t(step3) + 5, 0x40), "runs past the end of the file");
  expect_rejected(patched(bytes.size() - 1, 0x01), "checksum mismatch");  // END's CRC

  // Trailing bytes after END, an empty file, not a run file at all.
  std::vector<uint8_t> more = bytes;
  more.push_back(0);
  expect_rejected(write_bytes("bad.kvs", more), "1 bytes after the END record");
  expect_rejected(write_bytes("bad.kvs", {}), "not a kvscope run file");
  expect_rejected(write_bytes("bad.kvs", {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}),
                  "bad magic");
}

TEST(RunFile, TruncatedFilesAreRejected) {
  const std::string good = write_run("good_trunc.kvs", AttnEncoding::F16);
  const std::vector<uint8_t> bytes = read_bytes(good);
  auto f = RunFile::open(good);
  ASSERT_TRUE(f.ok());
  // At every record boundary and inside records: the END record is missing or cut.
  std::vector<size_t> cuts = {8, 16, 20, 60};
  for (uint64_t o : f.value()->step_offsets()) {
    cuts.push_back(size_t(o));
    cuts.push_back(size_t(o) + 7);
    cuts.push_back(size_t(o) + 100);
  }
  cuts.push_back(bytes.size() - 1);
  cuts.push_back(bytes.size() - 12);
  for (size_t n : cuts) {
    SCOPED_TRACE("cut at " + std::to_string(n));
    std::vector<uint8_t> b(bytes.begin(), bytes.begin() + std::ptrdiff_t(n));
    const std::string path = write_bytes("trunc.kvs", b);
    auto g = RunFile::open(path);
    ASSERT_FALSE(g.ok());
    const std::string& m = g.error().message;
    EXPECT_TRUE(m.find("truncated") != std::string::npos ||
                m.find("not a kvscope run file") != std::string::npos)
        << m;
  }
  // Cut exactly after a step: it says how far the file got.
  std::vector<uint8_t> b(bytes.begin(),
                         bytes.begin() + std::ptrdiff_t(f.value()->step_offsets()[5]));
  expect_rejected(write_bytes("trunc.kvs", b), "ends after step 5");
}

TEST(RunFile, OutOfOrderStepsAndBadFieldsAreRejectedEvenWithGoodChecksums) {
  RunMeta meta = recorded().meta;
  {  // step 2 missing
    auto f = RunFile::create(temp("order.kvs"), meta);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f.value()->append_step(recorded().steps[0]).ok());
    ASSERT_TRUE(f.value()->append_step(recorded().steps[2]).ok());
    ASSERT_TRUE(f.value()->finish(RunEnd{2, "stopped"}).ok());
    expect_rejected(temp("order.kvs"), "is step 3, expected step 2");
  }
  {  // a probability outside [0, 1], with a correct checksum
    StepTrace t = recorded().steps[0];
    t.top[0].p = 1.5f;
    auto f = RunFile::create(temp("field.kvs"), meta);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f.value()->append_step(t).ok());
    ASSERT_TRUE(f.value()->finish(RunEnd{1, "stopped"}).ok());
    expect_rejected(temp("field.kvs"), "field 'top.p'");
  }
  {  // a layer count that disagrees with META
    StepTrace t = recorded().steps[0];
    t.n_layer += 1;
    t.attention.clear();
    t.k_norm.clear();
    t.v_norm.clear();
    t.kv_layers.clear();
    auto f = RunFile::create(temp("layers.kvs"), meta);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f.value()->append_step(t).ok());
    ASSERT_TRUE(f.value()->finish(RunEnd{1, "stopped"}).ok());
    expect_rejected(temp("layers.kvs"), "but META says");
  }
  EXPECT_FALSE(RunFile::open(temp("no_such_file.kvs")).ok());
}

// Random damage with checksums ignored reaches the payload decoders: they must refuse or
// accept cleanly, never crash or allocate absurdly (the fuzz target does this at length).
TEST(RunFile, DecodersSurviveRandomDamage) {
  const std::vector<uint8_t> bytes = read_bytes(write_run("fuzzish.kvs", AttnEncoding::F16));
  std::mt19937 rng(7);
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> b = bytes;
    for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k) b[rng() % b.size()] = uint8_t(rng());
    BufferSource src(b.data(), b.size());
    auto idx = index_run(src, "mutant", /*verify_crc=*/false);
    if (!idx.ok()) continue;
    ++accepted;
    for (uint64_t o : idx->steps) EXPECT_TRUE(read_step_record(src, o, "mutant", false).ok());
  }
  EXPECT_LT(accepted, 3000);
}

// The END record keeps the reason as the name run files have always held ("eos",
// "max_tokens", "stop_string", "context_full", "stopped", "error", "running"): each reason
// writes its name and reads back as itself; a name no reason has is refused.
TEST(RunFile, EndReasonsAreStoredByTheirNames) {
  const std::pair<FinishReason, std::string> names[] = {{FinishReason::Running, "running"},
                                                        {FinishReason::Eos, "eos"},
                                                        {FinishReason::MaxTokens, "max_tokens"},
                                                        {FinishReason::StopString, "stop_string"},
                                                        {FinishReason::ContextFull, "context_full"},
                                                        {FinishReason::Stopped, "stopped"},
                                                        {FinishReason::Error, "error"}};
  for (const auto& [reason, name] : names) {
    const std::vector<uint8_t> b = encode_end(RunEnd{7, to_string(reason)});
    ASSERT_EQ(b.size(), 8 + name.size()) << name;
    EXPECT_EQ(std::string(b.begin() + 8, b.end()), name);
    auto e = decode_end(b.data(), b.size());
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(e->steps, 7);
    EXPECT_EQ(e->reason, name);
    EXPECT_EQ(finish_reason_from_string(e->reason), reason);
  }
  std::vector<uint8_t> b = encode_end(RunEnd{7, "eos"});
  b.back() = 'x';  // "eox"
  auto bad = decode_end(b.data(), b.size());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("unknown reason 'eox'"), std::string::npos)
      << bad.error().message;
}
