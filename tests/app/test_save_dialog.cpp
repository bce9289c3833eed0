// test_save_dialog.cpp — the save dialog says the size of the file before writing it, and
// writes where it was told (headless ImGui; what it says read back from ui.shown):
// - Save run: after 24 steps of a real controller on a tiny model, the dialog states the
//   size of the run's history, and the file written in the chosen folder has that size
//   (plus the few bytes of its END record);
// - Export stats: the size stated is the CSV file's exact size; a second export under the
//   same name warns that it replaces the file;
// - a folder that does not exist is refused, with the reason said, and nothing is written.
#include <gtest/gtest.h>
#include <imgui.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "app/core/timeline.h"
#include "app/ui/ui_events.h"
#include "app/ui/ui_state.h"
#include "controller_test_util.h"
#include "imgui_test_context.h"

using namespace kvscope;
using namespace kvscope::app;
using namespace kvscope::app::testing;
namespace fs = std::filesystem;

namespace {

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

class SaveDialogTest : public ::testing::Test {
 protected:
  kvscope::test::HeadlessImGui imgui_{1280, 720};
  fs::path dir_;

  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("kvscope_save_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "runs");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Two frames with the dialog (a new window sizes itself on its first frame and draws on
  // the next); returns what the last one said: "what: text" lines of the read-outs it noted.
  std::string frame(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl) {
    std::string text;
    for (int f = 0; f < 2; ++f) {
      ui.shown.clear();
      ImGui::NewFrame();
      panel_save_dialog(ui, ctl, cs, tl);
      ImGui::Render();
    }
    for (const ShownItem& s : ui.shown) text += s.what + ": " + s.text + "\n";
    return text;
  }
};

// One decode step done at `done_s`, as the controller would send it.
Event step_event(int step) {
  auto t = std::make_shared<StepTrace>();
  t->step = step;
  t->pos = 4 + step - 1;
  t->token_id = 10 + step;
  t->text = " t";
  if (step == 1)
    for (int i = 0; i < 4; ++i) t->prompt.push_back({i, " p"});
  t->ms = 5;
  t->seq_len = t->pos + 1;
  t->tokens_processed = step == 1 ? 4 : 1;
  Event e{Event::Kind::Step, 1};
  e.trace = t;
  e.done_s = 0.01 * step;
  return e;
}

}  // namespace

TEST_F(SaveDialogTest, SaveRunStatesTheSizeOfTheFileItWritesInTheChosenFolder) {
  auto src = tiny_source(200);
  ASSERT_TRUE(src);
  Controller ctl(std::move(src), test_options());
  UiState ui;
  ui.engine_ready = true;
  Timeline tl;
  ctl.send(CmdReset{kStory, false});
  const auto t0 = std::chrono::steady_clock::now();
  while (tl.step_count() < 24 && seconds_since(t0) < 30) {
    const int before = tl.step_count();
    ctl.send(CmdStep{});
    while (tl.step_count() == before && seconds_since(t0) < 30)
      for (Event& e : ctl.wait_events(20)) apply_event(ui, ctl, tl, e, seconds_since(t0));
  }
  ASSERT_EQ(tl.step_count(), 24);
  ControllerState cs = ctl.state();
  for (int i = 0; i < 100 && cs.save_bytes == 0; ++i) cs = ctl.state();
  ASSERT_GT(cs.save_bytes, 0u) << "the controller says how large a save would be";

  ui.run_path = (dir_ / "runs" / "story.kvs").string();
  open_save_dialog(ui, SaveKind::Run, tl);
  const std::string shown = frame(ui, &ctl, cs, tl);
  EXPECT_TRUE(has(shown, "Size: " + format_bytes(cs.save_bytes) + " (24 steps")) << shown;
  EXPECT_TRUE(
      has(shown, "save file: " + fs::weakly_canonical(dir_ / "runs" / "story.kvs").string()))
      << shown;
  EXPECT_EQ(save_dialog_bytes(ui, cs), cs.save_bytes);

  ASSERT_TRUE(save_dialog_confirm(ui, &ctl, cs, tl)) << ui.error;
  EXPECT_FALSE(ui.save.open);
  const fs::path written = dir_ / "runs" / "story.kvs";
  bool saved = false;
  while (!saved && seconds_since(t0) < 60)
    for (Event& e : ctl.wait_events(20)) {
      saved |= e.kind == Event::Kind::Saved;
      apply_event(ui, ctl, tl, e, seconds_since(t0));
    }
  ASSERT_TRUE(saved) << ui.error;
  ASSERT_TRUE(fs::exists(written));
  const uint64_t size = fs::file_size(written);
  EXPECT_GE(size, cs.save_bytes);
  EXPECT_LE(size, cs.save_bytes + 4096) << "the file is the size the dialog said";
}

TEST_F(SaveDialogTest, ExportStatsStatesTheExactSizeAndWarnsBeforeReplacing) {
  Timeline tl;
  Event reset{Event::Kind::Reset, 1};
  reset.prompt_text = "p";
  tl.apply(reset);
  for (int step = 1; step <= 30; ++step) tl.apply(step_event(step));
  UiState ui;
  ui.engine_ready = true;
  ui.csv_path = (dir_ / "stats.csv").string();
  ControllerState cs;

  open_save_dialog(ui, SaveKind::Stats, tl);
  std::string shown = frame(ui, nullptr, cs, tl);
  const uint64_t said = save_dialog_bytes(ui, cs);
  EXPECT_GT(said, 0u);
  EXPECT_TRUE(has(shown, "Size: " + format_bytes(said) + " (30 steps")) << shown;
  EXPECT_FALSE(has(shown, "replaces")) << shown;
  ASSERT_TRUE(save_dialog_confirm(ui, nullptr, cs, tl)) << ui.error;
  ASSERT_TRUE(fs::exists(dir_ / "stats.csv"));
  EXPECT_EQ(fs::file_size(dir_ / "stats.csv"), said) << "the size said is the file's";

  open_save_dialog(ui, SaveKind::Stats, tl);
  shown = frame(ui, nullptr, cs, tl);
  EXPECT_TRUE(has(shown, "Save replaces it")) << shown;
}

TEST_F(SaveDialogTest, AFolderThatDoesNotExistIsRefusedAndNothingIsWritten) {
  Timeline tl;
  Event reset{Event::Kind::Reset, 1};
  tl.apply(reset);
  for (int step = 1; step <= 3; ++step) tl.apply(step_event(step));
  UiState ui;
  ui.csv_path = (dir_ / "missing" / "stats.csv").string();
  ControllerState cs;
  open_save_dialog(ui, SaveKind::Stats, tl);
  const std::string shown = frame(ui, nullptr, cs, tl);
  EXPECT_TRUE(has(shown, "does not exist")) << shown;
  EXPECT_FALSE(save_dialog_confirm(ui, nullptr, cs, tl));
  EXPECT_TRUE(has(ui.error, "does not exist")) << ui.error;
  EXPECT_FALSE(fs::exists(dir_ / "missing"));
}
