// quality_job.h — the engine's cache comparison (engine/compare.h) run live for the app:
// a candidate cache configuration against the reference (f16, the model's full context),
// in lockstep on the candidate's own tokens, on a thread of its own.
//
// The UI starts a run, reads snapshot() every frame (KL per step, top-1 agreement, the KV
// bytes each side holds) and may stop it; nothing it calls waits for the engine. The job
// opens its own copy of the model (the controller's session is never touched) and stops
// between two steps. Destruction stops and joins.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "app/core/engine_setup.h"

namespace kvscope::app {

struct QualitySpec {
  EngineOptions candidate;  // model, backend, and the cache under test (kv_types, limits)
  PromptSpec prompt;
  int steps = 64;
};

struct QualityPoint {
  int step = 0;
  double kl = 0;  // KL(reference || candidate) of the next-token distributions, nats
  bool top1_agree = true;
  uint64_t cand_bytes = 0, ref_bytes = 0;  // KV bytes each holds after the step
};

struct QualitySnapshot {
  bool running = false;
  int steps = 0;          // steps asked for
  std::string candidate;  // "kv q8_0, ctx 8192" and the like
  std::string error;      // why it stopped early ("" when it did not)
  std::vector<QualityPoint> points;
  double mean_kl = 0;
  int agreements = 0;
};

class QualityJob {
 public:
  QualityJob() = default;
  ~QualityJob();
  QualityJob(const QualityJob&) = delete;
  QualityJob& operator=(const QualityJob&) = delete;

  // Stops a run in progress, then starts this one.
  void start(QualitySpec spec);
  // Asks the run to stop after its current step (returns at once).
  void stop();
  // Blocks until the run has ended (tests).
  void wait();
  QualitySnapshot snapshot() const;

 private:
  void run(QualitySpec spec);
  void join();

  std::thread worker_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  QualitySnapshot snap_;
};

}  // namespace kvscope::app
