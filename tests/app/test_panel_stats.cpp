// test_panel_stats.cpp — what the Stats panel, the toolbar and the story strip say, read
// back as text from a headless ImGui context (ImGui's log captures every line a panel
// draws), fed by a real controller on a tiny model or by hand-made events:
// - after the cache mode is toggled while paused, both (and the story strip under the view)
//   say the new mode applies from the next step, and after that step all agree on it;
// - the decode rate is the current mode's alone, never an average over both modes;
// - a comparison's run ends saying the comparison finished, not "max_tokens";
// - the toolbar's tooltips hang below it, never over the buttons next to the one hovered.
#include <gtest/gtest.h>
#include <imgui.h>
#include <imgui_internal.h>

#include <memory>
#include <string>
#include <vector>

#include "app/core/stats_view.h"
#include "app/core/timeline.h"
#include "app/ui/ui_events.h"
#include "app/ui/ui_state.h"
#include "controller_test_util.h"
#include "imgui_test_context.h"

using namespace kvscope;
using namespace kvscope::app;
using namespace kvscope::app::testing;

namespace {

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// What one frame showed: every line of text the toolbar, the Stats panel and the story
// strip under the view drew.
struct Shown {
  std::string toolbar, stats, story;
};

class PanelStats : public ::testing::Test {
 protected:
  kvscope::test::HeadlessImGui imgui_{1280, 720};

  // One frame of the toolbar and the Stats panel; `key` (a GLFW key code, 0: none) is down
  // during this frame only.
  Shown frame(UiState& ui, Controller& ctl, const Timeline& tl, int key = 0) {
    return frame(ui, &ctl, ctl.state(), tl, key);
  }
  Shown frame(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl,
              int key = 0) {
    ImGuiIO& io = ImGui::GetIO();
    for (bool& down : io.KeysDown) down = false;
    if (key) io.KeysDown[key] = true;
    Shown out;
    ImGui::NewFrame();
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImVec2(1280, 40));
    ImGui::Begin("##toolbar", nullptr, ImGuiWindowFlags_NoDecoration);
    out.toolbar = logged([&] { panel_toolbar(ui, ctl, cs, tl); });
    ImGui::End();
    ImGui::SetNextWindowPos(ImVec2(900, 40));
    ImGui::SetNextWindowSize(ImVec2(380, 600));
    ImGui::Begin("Stats", nullptr, ImGuiWindowFlags_NoDecoration);
    out.stats = logged([&] { panel_stats(ui, cs, tl); });
    ImGui::End();
    ImGui::SetNextWindowPos(ImVec2(0, 600));
    ImGui::SetNextWindowSize(ImVec2(900, 110));
    ImGui::Begin("##story", nullptr, ImGuiWindowFlags_NoDecoration);
    out.story = logged([&] { panel_story(ui, cs, tl); });
    ImGui::End();
    ImGui::Render();
    return out;
  }

  template <class F>
  static std::string logged(F&& draw) {
    ImGui::LogToBuffer();
    draw();
    std::string text = ImGui::GetCurrentContext()->LogBuffer.c_str();
    ImGui::LogFinish();
    return text;
  }
};

// Applies the controller's events until `pred(timeline)` holds (or 30 s pass).
template <class Pred>
void drain_until(UiState& ui, Controller& ctl, Timeline& tl, Pred pred) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!pred(tl) && seconds_since(t0) < 30)
    for (Event& e : ctl.wait_events(20)) apply_event(ui, ctl, tl, e, seconds_since(t0));
}

// One decode step of `mode` taking `ms` of engine time, done at `done_s`.
Event step_event(int step, CacheMode mode, double ms, double done_s) {
  auto t = std::make_shared<StepTrace>();
  t->step = step;
  t->pos = 4 + step - 1;
  t->token_id = 10 + step;
  t->text = " t";
  if (step == 1)
    for (int i = 0; i < 4; ++i) t->prompt.push_back({i, " p"});
  t->mode = mode;
  t->ms = ms;
  t->seq_len = t->pos + 1;
  t->tokens_processed = step == 1 || mode == CacheMode::NoCache ? t->seq_len - 1 : 1;
  Event e{Event::Kind::Step, 1};
  e.trace = t;
  e.done_s = done_s;
  return e;
}

}  // namespace

// The "consistent mode": paused after three KV CACHE steps, the person presses C.
// The toolbar and Stats both say NO CACHE comes with the next step (Stats still describes
// the KV CACHE step it shows); after one more step both say NO CACHE and nothing is pending.
TEST_F(PanelStats, AModeToggledWhilePausedReadsTheSameInTheToolbarAndStats) {
  auto src = tiny_source(200);
  ASSERT_TRUE(src);
  Controller ctl(std::move(src), test_options());
  UiState ui;
  ui.engine_ready = true;
  ui.mode = CacheMode::Cache;
  Timeline tl;
  ctl.send(CmdReset{kStory, false});
  ctl.send(CmdStep{3});
  drain_until(ui, ctl, tl, [](const Timeline& t) { return t.step_count() >= 3; });
  ASSERT_EQ(tl.step_count(), 3);
  ASSERT_FALSE(ctl.state().playing);

  Shown before = frame(ui, ctl, tl);
  EXPECT_TRUE(has(before.stats, "MODE      KV CACHE")) << before.stats;
  EXPECT_FALSE(has(before.stats, "next step")) << before.stats;
  EXPECT_FALSE(has(before.toolbar, "next step")) << before.toolbar;

  frame(ui, ctl, tl, 'C');  // the cache-mode key
  EXPECT_EQ(ui.mode, CacheMode::NoCache) << "C chose NO CACHE in the toolbar";
  drain_until(ui, ctl, tl, [](const Timeline& t) { return t.mode() == CacheMode::NoCache; });
  ASSERT_EQ(tl.mode(), CacheMode::NoCache) << "the engine took the new mode";
  for (int i = 0; i < 3; ++i) {  // it stays so frame after frame while paused
    Shown paused = frame(ui, ctl, tl);
    EXPECT_TRUE(has(paused.toolbar, "NO CACHE from the next step")) << paused.toolbar;
    EXPECT_TRUE(has(paused.stats, "NO CACHE from the next step")) << paused.stats;
    EXPECT_TRUE(has(paused.story, "NO CACHE from the next step")) << paused.story;
    EXPECT_TRUE(has(paused.stats, "MODE      KV CACHE")) << "the step shown ran with the cache";
  }

  ctl.send(CmdStep{});
  drain_until(ui, ctl, tl, [](const Timeline& t) { return t.step_count() >= 4; });
  ASSERT_EQ(tl.step_count(), 4);
  ASSERT_EQ(tl.last()->mode, CacheMode::NoCache);
  Shown after = frame(ui, ctl, tl);
  EXPECT_TRUE(has(after.stats, "MODE      NO CACHE")) << after.stats;
  EXPECT_TRUE(has(after.stats, "KV_CACHE  0 B held")) << after.stats;
  EXPECT_FALSE(has(after.stats, "next step")) << after.stats;
  EXPECT_FALSE(has(after.toolbar, "next step")) << after.toolbar;
  EXPECT_TRUE(has(after.story, "KV_CACHE 0 B held")) << after.story;
  EXPECT_FALSE(has(after.story, "next step")) << after.story;
  EXPECT_EQ(ui.mode, CacheMode::NoCache);
}

// Decode speed after a switch is the new mode's alone: 5 KV CACHE steps of 10 ms then 5
// NO CACHE steps of 200 ms read 5 tok/s (not a blend of 100 and 5), with the KV CACHE rate
// kept apart; switching back, the KV CACHE rate is its own again.
TEST_F(PanelStats, DecodeSpeedIsTheCurrentModesAlone) {
  Timeline tl;
  Event reset{Event::Kind::Reset, 1};
  reset.prompt_text = "p";
  tl.apply(reset);
  double t = 0;
  int step = 1;
  tl.apply(step_event(step++, CacheMode::Cache, 50, t += 0.05));
  for (int i = 0; i < 5; ++i) tl.apply(step_event(step++, CacheMode::Cache, 10, t += 0.01));
  EXPECT_NEAR(tl.speed().engine_tok_s, 100.0, 1e-6);
  for (int i = 0; i < 5; ++i) tl.apply(step_event(step++, CacheMode::NoCache, 200, t += 0.2));
  SpeedStats s = tl.speed();
  EXPECT_EQ(s.mode, CacheMode::NoCache);
  EXPECT_NEAR(s.engine_tok_s, 5.0, 1e-6);
  EXPECT_NEAR(s.other_engine_tok_s, 100.0, 1e-6);
  EXPECT_EQ(s.mode_since, 7);
  // Back to the cache: its first step rebuilds the cache (slow); the rate after it is the
  // cache's own.
  tl.apply(step_event(step++, CacheMode::Cache, 300, t += 0.3));
  for (int i = 0; i < 4; ++i) tl.apply(step_event(step++, CacheMode::Cache, 20, t += 0.02));
  s = tl.speed();
  EXPECT_EQ(s.mode, CacheMode::Cache);
  EXPECT_NEAR(s.engine_tok_s, 50.0, 1e-6);
  EXPECT_NEAR(s.other_engine_tok_s, 5.0, 1e-6);

  UiState ui;
  ui.engine_ready = true;
  Shown shown = frame(ui, nullptr, ControllerState{}, tl);
  EXPECT_TRUE(has(shown.stats, "decode    50.0 tok/s")) << shown.stats;
  EXPECT_TRUE(has(shown.stats, "NO CACHE ran 5.0 tok/s")) << shown.stats;
}

// A comparison of 48 steps a mode ends at its step count: the toolbar and Stats say the
// comparison finished, not "max_tokens" (the token limit the person set is 800).
TEST_F(PanelStats, AComparisonEndsSayingTheComparisonFinished) {
  for (ComparePhase phase : {ComparePhase::NoCacheLeg, ComparePhase::Interleaved}) {
    Timeline tl;
    Event reset{Event::Kind::Reset, 1};
    reset.prompt_text = "p";
    reset.compare = phase;
    tl.apply(reset);
    for (int step = 1; step <= 48; ++step)
      tl.apply(step_event(step, CacheMode::Cache, 10, 0.01 * step));
    Event end{Event::Kind::Finished, 1};
    end.reason = FinishReason::MaxTokens;
    tl.apply(end);
    UiState ui;
    ui.engine_ready = true;
    ui.max_tokens = 800;
    ControllerState cs;
    cs.finished = true;
    EXPECT_EQ(finished_text(tl), "comparison finished");
    Shown shown = frame(ui, nullptr, cs, tl);
    EXPECT_TRUE(has(shown.toolbar, "comparison finished, 52 tokens")) << shown.toolbar;
    EXPECT_TRUE(has(shown.stats, "comparison finished")) << shown.stats;
    EXPECT_TRUE(has(shown.story, "comparison finished")) << shown.story;
    EXPECT_FALSE(has(shown.toolbar + shown.stats, "max_tokens")) << shown.toolbar << "\n"
                                                                 << shown.stats;
  }
  // A plain run that reached its token limit still says so.
  Timeline tl;
  Event reset{Event::Kind::Reset, 1};
  tl.apply(reset);
  tl.apply(step_event(1, CacheMode::Cache, 10, 0.01));
  Event end{Event::Kind::Finished, 1};
  end.reason = FinishReason::MaxTokens;
  tl.apply(end);
  EXPECT_EQ(finished_text(tl), "finished (max_tokens)");
}

// Hovering along the whole toolbar: every tooltip that shows opens below the toolbar, so it
// never hides the button next to the one under the pointer, and stays inside the window.
TEST_F(PanelStats, ToolbarTooltipsHangBelowTheToolbar) {
  UiState ui;
  ui.engine_ready = true;
  Timeline tl;
  ControllerState cs;
  int tips = 0;
  for (float x = 4; x < 1280; x += 12) {
    ImGui::GetIO().MousePos = ImVec2(x, 16);
    frame(ui, nullptr, cs, tl);
    frame(ui, nullptr, cs, tl);
    ImGuiWindow* tip = ImGui::FindWindowByName("##Tooltip_00");
    if (!tip || !tip->Active) continue;
    ++tips;
    EXPECT_GE(tip->Pos.y, 40.0f) << "a tooltip over the toolbar at x " << x;
    EXPECT_LE(tip->Pos.x + tip->Size.x, 1280.0f + 0.5f) << "a tooltip past the window at x " << x;
  }
  EXPECT_GE(tips, 10) << "every button explains itself";
}
