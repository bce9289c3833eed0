// serving_build.h — turns the scheduler's steps into ServingSnapshots (serving_run.h): the
// pool's tiles with what each step did to them, one lane per sequence, the per-step history.
//
// Used by ServingRun's worker only (one thread): it reads the Scheduler (its pool, states,
// stats) right after each step() and keeps what the snapshots need across steps (each
// lane's last block table, the previous step's tiles, the prefix cache's hit counts).
//
// Tile flashes, one per block and step, derived from the step's events and rows and from
// the previous step's tiles against the pool now (the first rule that applies wins):
//   - the block is not referenced now (Free or Cached): Released when it was referenced
//     before the step or written in it (a sequence that finished or was preempted gave it
//     back), else None;
//   - Cow: a sequence with a Cow event this step holds it at a logical index where its
//     table held another block before the step (its private copy of a shared block);
//   - Evicted: Cached before the step, Used now and not adopted from the prefix cache
//     (allocate() took it off the LRU list for new content);
//   - Written: a row's positions pos0 .. pos0 + tokens - 1 fall in it (through the table);
//   - PrefixHit: among the first hit / block_size blocks of a sequence's table whose
//     PrefixHit event (hit tokens) is in this step.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <vector>

#include "app/core/serving_run.h"

namespace kvscope::app {

// One request as it was queued: the scheduler's first sequence id (samples follow it),
// its prompt tokens (the shared prefix's first) and its arrival step.
struct ServingRequest {
  int first_seq = 0;
  int n = 1;
  int arrival_step = 1;
  std::vector<int32_t> prompt;
};

class ServingBuilder {
 public:
  using Clock = std::chrono::steady_clock;
  ServingBuilder(const Scheduler& sched, const ServingConfig& cfg, uint64_t run,
                 std::vector<ServingRequest> requests);

  // A request queued after the builder was made (a server's clients): its lanes.
  void add_request(ServingRequest q);
  // The snapshot before the first step: the configuration, every tile free, no lanes.
  std::shared_ptr<ServingSnapshot> initial() const;
  // The snapshot after `st` (the scheduler's step that began at t0 and returned at t1).
  std::shared_ptr<ServingSnapshot> after_step(const BatchStep& st, Clock::time_point t0,
                                              Clock::time_point t1);
  // The snapshot after sequences ended between steps (a server cancels a request whose
  // client went away): still the last step, with the lanes' states and the pool as they are
  // now (the blocks given back flash Released, the last history point's counts updated) and
  // `events` as its events: Cancel, or Finish (its detail the stop reason) for a sequence
  // the server ended as finished by cancelling it.
  std::shared_ptr<ServingSnapshot> after_change(std::vector<SchedEvent> events);

 private:
  struct LaneRec {
    Lane lane;               // attention: this step's only
    bool known = false;      // arrived (or forked): shown
    bool preempted = false;  // preempted and not run since
    bool first_token = false;
    // Ended between steps by its server as finished (a stop string) where the scheduler
    // only knows it cancelled: shown Finished.
    bool finished_outside = false;
    // Every layer group's table (group 0 is lane.table) for a model whose windows split
    // the layers (engine/kv_cache.h); empty for one group. -1: a block given back.
    std::vector<std::vector<int32_t>> groups;
    std::vector<const std::vector<int32_t>*> tables() const;
    int generated = 0;
    Clock::time_point arrived, first_at;
    bool ended = false;    // finished, cancelled or failed (noted once)
    bool retired = false;  // ended long ago: no longer in the snapshots, its tokens freed
  };
  void header(ServingSnapshot& s) const;
  void apply_events(const BatchStep& st, Clock::time_point t0, std::vector<char>& cow_seq,
                    std::vector<std::pair<int, int>>& hits);
  void apply_row(const StepRow& r, bool cow_event, Clock::time_point t1, std::vector<char>& written,
                 std::vector<char>& cow);
  void update_states();  // the lanes' states from the scheduler's (ended ones hold nothing)
  void build_tiles(ServingSnapshot& s, const std::vector<char>& written,
                   const std::vector<char>& adopted, const std::vector<char>& cow);
  ServingPoint point(const BatchStep& st) const;

  const Scheduler& sched_;
  ServingConfig cfg_;
  uint64_t run_ = 0;
  std::vector<ServingRequest> requests_;
  std::vector<LaneRec> lanes_;  // by sequence id
  std::vector<PoolTile> prev_;  // the previous snapshot's tiles (empty before step 1)
  std::vector<int> hash_hits_;  // per block, the whole run
  std::vector<ServingPoint> history_;
  std::deque<int> ended_;  // ended sequences still in the snapshots, oldest first
};

// A long run (a server's) stays bounded: the snapshots keep the newest kServingKeptEnded
// ended sequences (older ones leave the lanes and their tokens are freed) and the newest
// kServingKeptSteps history points.
inline constexpr size_t kServingKeptEnded = 48;
inline constexpr size_t kServingKeptSteps = 4096;

}  // namespace kvscope::app
