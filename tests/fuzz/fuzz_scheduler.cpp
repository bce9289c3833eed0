// fuzz_scheduler.cpp — fuzz target for the continuous-batching scheduler (engine/scheduler.h)
// on two tiny models (tests/util/tiny_model.h, built once in memory: a llama, and a gemma3
// whose windowed layers give their blocks back outside the window): the input bytes choose
// the model and the configuration (block size, pool size, token budget, sequence limit,
// context, prefix caching, EOS), the requests (prompt ids and lengths, prefixes shared with earlier
// prompts, arrivals, max tokens, greedy or seeded sampling, some invalid) and when which
// request is cancelled. The scheduler then runs until idle.
//
// Findings (abort): add() accepting a request it should refuse or refusing a valid one, an
// error without a message, a failed step, a pool invariant broken after a step or a cancel
// (Scheduler::check), a step over the token budget or the sequence limit, no progress, a
// block still used once everything is done, and a finished sequence whose tokens differ
// from the same prompt run alone through a Session (a cancelled one: not a prefix of them).
//
// Input layout (missing bytes read as 0):
//   [0] block size (8, 16, 32)  [1] pool blocks  [2] token budget  [3] max sequences
//   [4] flags: bit 0 prefix caching, bit 1 stop at EOS, bit 2 a context of its own, in [5],
//       bit 3 the gemma3
//   [6] number of requests (0 to 8), then per request:
//       length (0: an empty prompt), share (bit 7: start with the previous prompt's first
//       share & 127 tokens), arrival step, max tokens (0: invalid), sampling (bit 0:
//       temperature 0.9 with seed byte >> 1), then `length` token bytes (255: an id
//       outside the vocabulary);
//   the rest, in pairs: cancel request (byte % (requests + 1)) before step (byte % 64) + 1.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "tests/util/tiny_model.h"

namespace {

using namespace kvscope;

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "fuzz_scheduler: %s %s\n", what, detail.c_str());
  std::abort();
}

std::shared_ptr<const Model> load(const std::vector<uint8_t>& bytes) {
  const int fd = memfd_create("fuzz_scheduler.gguf", MFD_CLOEXEC);
  if (fd < 0 || write(fd, bytes.data(), bytes.size()) != ssize_t(bytes.size()))
    fail("cannot write a tiny model");
  auto m = Model::load("/proc/self/fd/" + std::to_string(fd));
  close(fd);
  if (!m.ok()) fail("a tiny model does not load:", m.error().message);
  return std::shared_ptr<const Model>(std::move(*m));
}

// The tiny models, loaded once, both with a 96-position context: a llama of one layer, 32
// wide; the family's gemma3 (local, local, global layers) with a window of 11.
const std::shared_ptr<const Model>& tiny_model(bool windowed) {
  static const std::shared_ptr<const Model> llama = [] {
    test::TinyModelSpec spec;
    spec.n_layer = 1;
    spec.n_embd = 32;
    spec.n_head = 2;
    spec.n_head_kv = 1;
    spec.n_ff = 32;
    spec.n_ctx = 96;
    spec.seed = 3;
    return load(test::tiny_llama(spec).build());
  }();
  static const std::shared_ptr<const Model> gemma = [] {
    test::TinyModelSpec spec = test::tiny_family("gemma3", 5);
    spec.n_ctx = 96;
    spec.window = 11;
    return load(test::tiny_model(spec).build());
  }();
  return windowed ? gemma : llama;
}

Backend& backend() {
  static const std::unique_ptr<Backend> b = make_cpu_backend(1);
  return *b;
}

struct Reader {
  const uint8_t* data;
  size_t size, at = 0;
  uint8_t next() { return at < size ? data[at++] : 0; }
  bool more() const { return at < size; }
};

// The generated tokens of a prompt run alone, memoized across inputs.
const std::vector<int32_t>& solo(bool windowed, const std::vector<int32_t>& prompt, int max_tokens,
                                 int context, bool stop_at_eos, const SamplerConfig& sc) {
  using Key = std::tuple<bool, std::vector<int32_t>, int, int, bool, float, uint64_t>;
  static std::map<Key, std::vector<int32_t>> memo;
  if (memo.size() > 20000) memo.clear();
  Key key{windowed, prompt, max_tokens, context, stop_at_eos, sc.temperature, sc.seed};
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  SessionConfig c;
  c.kv_policy = KvPolicy::Full;
  c.limits.n_ctx = context;
  c.max_tokens = max_tokens;
  c.stop_at_eos = stop_at_eos;
  c.top_candidates = 1;
  auto s = Session::create(tiny_model(windowed), make_cpu_backend(1), c);
  if (!s.ok()) fail("Session::create failed:", s.error().message);
  (*s)->set_sampler(sc);
  if (Status st = (*s)->reset_tokens(prompt); !st.ok()) fail("solo reset failed:", st.message());
  std::vector<int32_t> gen;
  while (!(*s)->done()) {
    auto tr = (*s)->step();
    if (!tr.ok()) fail("solo step failed:", tr.error().message);
    gen.push_back(tr->token_id);
  }
  return memo.emplace(std::move(key), std::move(gen)).first->second;
}

void check_pool(const Scheduler& s, const char* when, int step) {
  if (Status st = s.check(); !st.ok())
    fail(when, "step " + std::to_string(step) + ": " + st.message());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in{data, size};
  SchedulerConfig cfg;
  cfg.block_size = 8 << (in.next() % 3);
  cfg.pool_blocks = 1 + in.next() % 32;
  cfg.max_batch_tokens = 1 + in.next() % 64;
  cfg.max_seqs = 1 + in.next() % 8;
  const uint8_t flags = in.next();
  const bool windowed = flags & 8;
  const std::shared_ptr<const Model>& model = tiny_model(windowed);
  const int V = model->config().n_vocab, n_ctx = model->config().n_ctx;
  cfg.prefix_caching = flags & 1;
  cfg.stop_at_eos = flags & 2;
  const uint8_t ctx_byte = in.next();
  cfg.context = flags & 4 ? 2 + ctx_byte % (n_ctx - 1) : 0;  // 2 .. n_ctx
  const int ctx = cfg.context > 0 ? cfg.context : n_ctx;
  auto made = Scheduler::create(model, backend(), cfg);
  if (!made.ok()) fail("Scheduler::create refused a valid configuration:", made.error().message);
  Scheduler& s = **made;
  // The most blocks a request holds at once: all of its positions' in a group of global
  // layers; in a windowed group, what one step's queries see, and the sinks.
  const KvLayerGroups& groups = s.layer_groups();
  const auto blocks_at_most = [&](int positions) {
    int need = 0;
    for (int g = 0; g < groups.count(); ++g) {
      const int W = groups.window[size_t(g)], all = kv_blocks_for(positions, cfg.block_size);
      need += W == 0 ? all
                     : std::min(all, kv_blocks_for(W - 1 + cfg.max_batch_tokens, cfg.block_size) +
                                         1 + kv_blocks_for(groups.sink[size_t(g)], cfg.block_size));
    }
    return need;
  };

  struct Added {
    Request r;
    int id;
  };
  std::vector<Added> added;
  std::vector<int32_t> previous;
  const int n_req = in.next() % 9;
  for (int i = 0; i < n_req; ++i) {
    Request r;
    const int len = in.next() % 64;
    const uint8_t share = in.next();
    r.arrival_step = 1 + in.next() % 32;
    r.max_tokens = in.next() % 24;
    const uint8_t sampling = in.next();
    if (sampling & 1) {
      r.sampler.temperature = 0.9f;
      r.sampler.seed = sampling >> 1;
    }
    if (share & 0x80)
      r.prompt.assign(previous.begin(),
                      previous.begin() +
                          std::min<size_t>({previous.size(), size_t(share & 0x7f), size_t(len)}));
    while (int(r.prompt.size()) < len) {
      const uint8_t b = in.next();
      r.prompt.push_back(b == 255 ? V : b % V);
    }
    if (!r.prompt.empty()) previous = r.prompt;
    // The scheduler's rules, written out independently.
    const bool in_vocab =
        std::all_of(r.prompt.begin(), r.prompt.end(), [&](int32_t t) { return t >= 0 && t < V; });
    const int most = std::min(len + r.max_tokens, ctx);
    const bool valid = len > 0 && in_vocab && len < ctx && r.max_tokens >= 1 &&
                       blocks_at_most(most) <= cfg.pool_blocks;
    auto id = s.add(r);
    if (id.ok() != valid)
      fail(valid ? "add() refused a valid request:" : "add() accepted an invalid request",
           id.ok() ? "" : id.error().message);
    if (!id.ok()) {
      if (id.error().message.empty()) fail("a refusal without a message");
      continue;
    }
    if (*id != int(added.size())) fail("request ids are not consecutive");
    added.push_back({std::move(r), *id});
  }
  std::vector<std::pair<int, int>> cancels;  // (before step, request)
  while (in.more()) {
    const int req = in.next() % (int(added.size()) + 1);
    cancels.push_back({1 + in.next() % 64, req});
  }

  std::vector<bool> cancelled(added.size(), false);
  int step = 0;
  while (!s.idle()) {
    for (const auto& [at, req] : cancels) {
      if (at != step + 1) continue;
      const bool exists = req < int(added.size());
      const SeqState before = exists ? s.state(req) : SeqState::Failed;
      const bool live = exists && (before == SeqState::Pending || before == SeqState::Waiting ||
                                   before == SeqState::Running);
      Status st = s.cancel(req);
      if (st.ok() != live) fail("cancel() answered wrongly for request", std::to_string(req));
      if (live) cancelled[size_t(req)] = true;
      check_pool(s, "after a cancel before", step + 1);
    }
    auto st = s.step();
    if (!st.ok()) fail("a step failed:", st.error().message);
    step = st->step;
    check_pool(s, "after", step);
    int tokens = 0;
    for (const StepRow& row : st->rows) tokens += row.tokens;
    if (tokens != st->batch_tokens || st->batch_tokens > cfg.max_batch_tokens)
      fail("a step over the token budget");
    if (st->running > cfg.max_seqs) fail("more sequences running than max_seqs");
    if (step > 20000) fail("no progress after 20000 steps");
  }
  const KvPoolCounts n = s.pool().counts();
  if (n.used != 0) fail("blocks leaked:", std::to_string(n.used));
  if (n.free + n.cached != n.total) fail("pool counts do not add up");

  int finished = 0;
  for (const Added& a : added) {
    const auto& gen = s.generated(a.id);
    const SeqState state = s.state(a.id);
    const auto& want =
        solo(windowed, a.r.prompt, a.r.max_tokens, ctx, cfg.stop_at_eos, a.r.sampler);
    if (cancelled[size_t(a.id)]) {
      if (state != SeqState::Cancelled) fail("a cancelled request is", seq_state_name(state));
      if (gen.size() > want.size() || !std::equal(gen.begin(), gen.end(), want.begin()))
        fail("a cancelled request's tokens are not the start of its solo run's");
      continue;
    }
    if (state != SeqState::Finished) fail("a request ended", seq_state_name(state));
    ++finished;
    if (gen != want) fail("a finished request's tokens differ from its solo run's");
  }
  if (s.stats().finished != finished) fail("stats().finished disagrees");
  return 0;
}
