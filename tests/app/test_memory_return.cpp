// test_memory_return.cpp — memory comes back: with the real model behind a controller and a
// timeline (as the app holds them), resident memory after Reset, after an interleaved
// comparison (a second session of the model) and Reset, and after switching to the second
// built-in model and back, is within 30 MB of what it was after the first run.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "app/core/timeline.h"
#include "controller_test_util.h"

using namespace kvscope;
using namespace kvscope::app;
using namespace kvscope::app::testing;

namespace {

constexpr uint64_t kSlack = 30ull << 20;
constexpr int kSteps = 40;

double mib(uint64_t b) {
  return double(b) / 1048576.0;
}

// Applies events until `pred(events so far)` holds (or a minute passes).
template <class Pred>
bool drain(Controller& ctl, Timeline& tl, Pred pred) {
  std::vector<Event> seen;
  const auto t0 = std::chrono::steady_clock::now();
  while (seconds_since(t0) < 60) {
    for (Event& e : ctl.wait_events(20)) {
      tl.apply(e);
      seen.push_back(std::move(e));
    }
    if (pred(seen)) return true;
  }
  return false;
}

bool has_kind(const std::vector<Event>& ev, Event::Kind k) {
  for (const Event& e : ev)
    if (e.kind == k) return true;
  return false;
}

// A whole run of the story, played flat out to its token limit.
void run_story(Controller& ctl, Timeline& tl) {
  ctl.send(CmdReset{kStory, true});
  ASSERT_TRUE(drain(ctl, tl, [](auto& ev) { return has_kind(ev, Event::Kind::Finished); }));
}

uint64_t settled_rss() {
  release_free_memory();
  return process_resident_bytes();
}

EngineOptions model(const std::string& path) {
  EngineOptions eo;
  eo.model_path = path;
  eo.backend = "cpu";
  eo.threads = 1;
  eo.max_tokens = kSteps;
  return eo;
}

}  // namespace

TEST(MemoryReturn, ResetAndAModelSwitchAndBackGiveTheMemoryBack) {
  if (kTsan || kAsan) GTEST_SKIP() << "resident memory is not the C library's under sanitizers";
  const std::string second =
      (std::filesystem::path(KVSCOPE_DEFAULT_MODEL).parent_path() / "gemma-3-270m-q4_k_m.gguf")
          .string();
  auto session = default_session(kSteps);
  if (!session || !std::filesystem::exists(second)) GTEST_SKIP() << "built-in models not found";
  Controller ctl(make_session_source(std::move(session)), test_options());
  ctl.send(CmdSpeed{kSpeedMax});
  Timeline tl;
  run_story(ctl, tl);
  const uint64_t before = settled_rss();

  // Reset, a run, Reset again: back where it was.
  run_story(ctl, tl);
  ctl.send(CmdReset{kCode, false});
  ASSERT_TRUE(drain(ctl, tl, [](auto& ev) { return has_kind(ev, Event::Kind::Reset); }));
  const uint64_t after_reset = settled_rss();

  // An interleaved comparison (a second session of the model), then Reset.
  ctl.send(CmdCompare{kStory, kSteps / 2, true});
  ASSERT_TRUE(drain(ctl, tl, [](auto& ev) { return has_kind(ev, Event::Kind::Finished); }));
  ctl.send(CmdReset{kCode, false});
  ASSERT_TRUE(drain(ctl, tl, [](auto& ev) { return has_kind(ev, Event::Kind::Reset); }));
  const uint64_t after_compare = settled_rss();

  // The second model, a run on it, the first model again and a run.
  ctl.send(CmdLoadModel{model(second)});
  ASSERT_TRUE(drain(ctl, tl, [](auto& ev) { return has_kind(ev, Event::Kind::Source); }));
  run_story(ctl, tl);
  const uint64_t on_second = settled_rss();
  ctl.send(CmdLoadModel{model(KVSCOPE_DEFAULT_MODEL)});
  ASSERT_TRUE(drain(ctl, tl, [](auto& ev) { return has_kind(ev, Event::Kind::Source); }));
  run_story(ctl, tl);
  const uint64_t back = settled_rss();
  std::printf(
      "resident: after a run %.1f MiB, after Reset %.1f MiB, after a comparison and Reset "
      "%.1f MiB, on the second model %.1f MiB, back on the first %.1f MiB; peak %.1f MiB\n",
      mib(before), mib(after_reset), mib(after_compare), mib(on_second), mib(back),
      mib(process_peak_resident_bytes()));
  EXPECT_LE(after_reset, before + kSlack) << "Reset left memory behind";
  EXPECT_LE(after_compare, before + kSlack) << "the comparison's second session stayed";
  EXPECT_LE(back, before + kSlack) << "switching model and back left memory behind";
}
