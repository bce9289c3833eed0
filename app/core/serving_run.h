// serving_run.h — the Serving view's engine: a workload of requests served by the
// continuous-batching scheduler (engine/scheduler.h) on a worker thread, step by step, and
// what each step did to the pool of KV blocks, as plain data the scene and panels draw.
//
// Everything in a ServingSnapshot comes from the scheduler's own step results and the
// pool's own state after the step (reference counts, the prefix cache, the block tables):
// nothing is simulated. The UI thread never touches the scheduler: it sends commands
// (start, play, pause, step, stop, speed) and takes the newest snapshot once per frame.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "app/core/engine_setup.h"
#include "engine/scheduler.h"

namespace kvscope::app {

// What the run serves: prompts arriving over steps, each sampled the same way.
struct ServingWorkload {
  std::vector<PromptSpec> prompts;  // one request each (in arrival order)
  // A shared system prompt put before every prompt (raw text): makes prefix hits.
  std::string shared_prefix;
  // all | every:N | poisson:RATE (per step, drawn from `seed`), as `kvscope batch --arrival`.
  std::string arrival = "every:2";
  uint64_t seed = 1;
  int max_tokens = 64;
  int n = 1;  // samples per request (parallel sampling: forks of the prompt's blocks)
  // Beam search of every request with `beams` beams (0: none; the sampler does not apply),
  // scored sum log p / length^length_penalty; each beam a lane, forked off the beam it
  // branched from (Lane::parent), pruned ones ended with stop "pruned".
  int beams = 0;
  float length_penalty = 1.0f;
  SamplerConfig sampler;  // temperature 0: greedy
};

// The step each of `n` requests arrives at for an arrival spec (see ServingWorkload), or an
// error naming the spec.
Expected<std::vector<int>> arrival_steps(const std::string& spec, int n, uint64_t seed);

// What a block of the pool is after a step.
enum class TileState : uint8_t {
  Free,    // on the free list
  Used,    // held by one or more sequences (refs > 0)
  Cached,  // refs == 0 but kept in the prefix cache (evicted least recently used first)
};
// What happened to a block in this step (the tile flashes).
enum class TileFlash : uint8_t {
  None,
  Written,    // a position's K/V was written into it
  PrefixHit,  // adopted from the prefix cache by an admitted sequence (no compute)
  Cow,        // a copy-on-write target (a sequence's private copy of a shared block)
  Evicted,    // a cached block reused for new content (its old hash gone)
  Released,   // given back this step (finish, cancel, preemption, window)
};

struct PoolTile {
  TileState state = TileState::Free;
  int refs = 0;              // reference count
  std::vector<int> owners;   // sequences whose block table holds it, lowest id first
  int logical = -1;          // its index in the first owner's table (-1: none)
  int first_pos = 0;         // first position it holds in that table
  int n_pos = 0;             // positions filled (0..block size)
  int hash_hits = 0;         // times the prefix cache handed this block out, whole run
  bool published = false;    // full and in the prefix cache's index
  TileFlash flash = TileFlash::None;
};

enum class LaneState : uint8_t { Waiting, Running, Preempted, Finished, Cancelled, Failed };
const char* lane_state_name(LaneState s);

// One sequence: a lane of tokens in the view.
struct Lane {
  int seq = 0;
  int request = 0;  // index into the workload's prompts
  int sample = 0;   // 0..n-1
  int parent = -1;  // the sequence it was forked from (parallel sampling), -1: none
  LaneState state = LaneState::Waiting;
  int color = 0;    // palette index (the request's; samples of one request share it)
  int prompt_tokens = 0;  // the prompt's length in tokens (the shared prefix included)
  int cached_tokens = 0;  // prompt positions adopted from the prefix cache at admission
  int computed = 0;       // positions whose K/V the sequence holds now (0 when preempted)
  // Every token so far, prompt then generated: the ids and their display text.
  std::vector<int32_t> ids;
  std::vector<std::string> pieces;
  std::vector<int32_t> table;  // block table (the first layer group's) after the step
  int step_tokens = 0;         // tokens it ran through this step's forward
  bool step_prompt = false;    // ... as a prompt chunk (or recomputation)
  int arrival_step = 0;
  int preemptions = 0;
  // Attention of its newest query (mean over the heads of the middle layer), over the
  // positions its forward attended this step: [0, computed) while it runs (a sequence that
  // ended in this step keeps its last query's row, over the positions it held); empty when
  // it sampled nothing this step.
  std::vector<float> attention;
  double ttft_ms = -1;  // arrival to first token (-1: none yet)
  double tokens_per_s = 0;  // generated tokens / time since its first token
  std::string stop;  // finish reason, once ended
  // Speculative decoding: the tokens drafted for it this step (display text) and how many
  // of them the target accepted. The accepted ones are in `ids`/`pieces` now, followed by
  // the target's own next token; the others were rolled back out of the pool (the scene
  // draws them as ghosts falling away). Empty when nothing was drafted this step.
  std::vector<std::string> drafted;
  int accepted = 0;
};

// The whole run's state after one step, per step (plotted over time).
struct ServingPoint {
  int step = 0;
  int running = 0, waiting = 0, finished = 0;
  int used = 0, free = 0, cached = 0;  // blocks
  double slot_utilization = 0;        // held positions / allocated slots, this step
  double contiguous_utilization = 0;  // the same if every running sequence reserved its context
  double fragmentation = 0;           // empty slots in last blocks / allocated slots
  double prefix_hit_rate = 0;         // hit tokens / (hit + prefilled prompt tokens), so far
  int prefill_tokens = 0, decode_tokens = 0;  // this step
  double tokens_per_s = 0;  // tokens through the forward this step / its wall time
  double ms = 0;            // this step's wall time
  int drafted = 0, accepted = 0;  // speculative decoding: tokens drafted / accepted this step
};

struct ServingSnapshot {
  uint64_t run = 0;  // changes with every start
  int step = 0;      // 0: nothing ran yet
  bool done = false;  // every request ended
  bool playing = false;
  std::string error;  // the run stopped on this error
  // The configuration.
  int block_size = 16;
  int n_blocks = 0;
  int max_batch_tokens = 0, max_seqs = 0, context = 0;
  bool prefix_caching = true;
  int n_requests = 0;
  std::vector<PoolTile> tiles;   // [n_blocks]
  std::vector<Lane> lanes;       // the sequences known so far, in id order (ended ones trimmed)
  std::vector<int> waiting;      // ids in queue order (head first)
  std::vector<SchedEvent> events;  // this step's
  std::vector<ServingPoint> history;  // one per step, oldest first
  SchedulerStats totals;

  // Sequence `seq`'s lane, or null (never seen, or trimmed): a binary search by id.
  const Lane* lane(int seq) const;
};

struct ServingConfig {
  SchedulerConfig scheduler;  // attention is switched on by the run
  ServingWorkload workload;
  // Non-empty: every snapshot of the run is recorded into this serving run file
  // (serving_record.h), finished when the run is done, restarted or dropped.
  std::string record_path;
};

// Runs one serving workload at a time on its own worker thread and engine.
class ServingRun {
 public:
  // `engine` names the model and backend (opened when start() first needs them; the KV
  // types come from the scheduler configuration).
  explicit ServingRun(EngineOptions engine);
  ~ServingRun();  // stops the worker; returns within one step's time
  ServingRun(const ServingRun&) = delete;
  ServingRun& operator=(const ServingRun&) = delete;

  // Starts a new run (the current one is dropped): opens the engine if needed, tokenizes the
  // workload, queues its requests. Errors (no model, bad prompt, a request that cannot fit)
  // arrive in the snapshot's `error`, the previous snapshot otherwise kept.
  void start(ServingConfig cfg, bool play);
  void play();
  void pause();
  void step();                 // one step while paused
  void set_speed(float steps_per_s);  // <= 0: as fast as the engine goes
  // The newest snapshot (never null; step 0 before anything ran). Cheap: shared.
  std::shared_ptr<const ServingSnapshot> snapshot() const;
  // Blocks until the snapshot's step reaches `step`, the run is done or stopped on an error,
  // or `timeout_s` passes (tests, the headless capture). Runs steps even while paused.
  void wait_until(int step, double timeout_s = 600);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvscope::app
