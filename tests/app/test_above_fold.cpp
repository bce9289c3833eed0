// test_above_fold.cpp — the story is above the fold: at 1024x640, 1280x720 and 1920x1080, a
// capture of the whole app after 40 steps of the real model shows COMPUTE, KV_CACHE,
// SEQ_LEN, the last generated words and the step's top candidate without scrolling or
// opening anything. Located by the rectangles the UI reports for those texts (ui.shown):
// each lies inside the window and inside the visible part of what it was drawn in, and
// says what the run did (the newest token, the step's likeliest candidate, its numbers).
// Looking at an older step, its numbers show and its word is outlined in sight.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "app/core/engine_setup.h"
#include "app/core/stats_view.h"
#include "app/scene/scene_builder.h"
#include "app/ui/app_capture.h"
#include "gl_test_context.h"

using namespace kvscope;
using namespace kvscope::app;

namespace {

const PromptSpec kPrompt{"Once upon a time, in a kingdom far away, there lived", false};

bool inside(const UiRect& r, const UiRect& outer) {
  const float e = 0.5f;  // rounding of pixel-aligned rectangles
  return r.x >= outer.x - e && r.y >= outer.y - e && r.right() <= outer.right() + e &&
         r.bottom() <= outer.bottom() + e;
}

const ShownItem* find(const UiState& ui, const std::string& what) {
  for (const ShownItem& s : ui.shown)
    if (s.what == what) return &s;
  return nullptr;
}

}  // namespace

TEST(AboveFold, TheStatsTheLastWordsAndTheTopCandidateAreOnScreenAtEverySize) {
  if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL)) GTEST_SKIP() << "default model not found";
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  EngineOptions eo;
  eo.model_path = KVSCOPE_DEFAULT_MODEL;
  eo.backend = "cpu";
  auto eng = open_engine(eo);
  ASSERT_TRUE(eng.ok()) << eng.error().message;
  Timeline tl;
  ASSERT_TRUE(run_steps(*eng.value().session, kPrompt, 40, &tl).ok());
  ASSERT_EQ(tl.steps().size(), 40u);
  const StepTrace* last = tl.last();
  ASSERT_TRUE(last && !last->top.empty());
  const std::string newest = display_text(tl.tokens().back().text);
  const std::string top_word = display_text(last->top.front().text);

  for (auto [W, H] : {std::pair{1024, 640}, std::pair{1280, 720}, std::pair{1920, 1080}}) {
    const std::string size = std::to_string(W) + "x" + std::to_string(H);
    UiState ui;
    ui.prompts = {{"narrative", kPrompt}};
    ui.facts = model_facts(eng.value());
    ui.view.layer = ui.facts.n_layer / 2;
    AppShot shot;
    shot.width = W;
    shot.height = H;
    auto res = capture_app(*r, ui, tl, shot);
    ASSERT_TRUE(res.ok()) << res.error().message;
    const UiRect window{0, 0, float(W), float(H)};

    auto check = [&](const char* what, const std::string& says) {
      const ShownItem* s = find(ui, what);
      ASSERT_NE(s, nullptr) << size << ": " << what << " was not drawn";
      EXPECT_TRUE(inside(s->rect, window)) << size << ": " << what << " outside the window";
      EXPECT_TRUE(inside(s->rect, s->clip))
          << size << ": " << what << " '" << s->text << "' at " << s->rect.x << "," << s->rect.y
          << " " << s->rect.w << "x" << s->rect.h << " is clipped or scrolled away (visible "
          << s->clip.x << "," << s->clip.y << " " << s->clip.w << "x" << s->clip.h << ")";
      EXPECT_GT(s->rect.w, 0.0f) << size << ": " << what;
      EXPECT_NE(s->text.find(says), std::string::npos)
          << size << ": " << what << " says '" << s->text << "', not '" << says << "'";
      // Not under the 3D view or another region: inside the story strip.
      EXPECT_TRUE(inside(s->rect, res.value().layout.story)) << size << ": " << what;
    };
    check("COMPUTE", "FLOP");
    check("KV_CACHE",
          format_bytes(make_stats_view(tl, 0, false, ui.facts.kv_bytes_per_token).kv_bytes));
    check("SEQ_LEN", "SEQ_LEN " + std::to_string(last->seq_len));
    check("last words", newest);
    check("top candidate", top_word);
    // Looking at step 5 through History: the strip's numbers are step 5's, and the word it
    // wrote is outlined in sight in the transcript.
    tl.scrub_to(5);
    UiState ui20 = ui;
    ui20.transcript = TranscriptCache{};
    auto res20 = capture_app(*r, ui20, tl, shot);
    ASSERT_TRUE(res20.ok()) << res20.error().message;
    const ShownItem* word = find(ui20, "viewed word");
    ASSERT_NE(word, nullptr) << size << ": step 5's word is not drawn";
    EXPECT_TRUE(inside(word->rect, word->clip)) << size << ": step 5's word is scrolled away";
    EXPECT_EQ(word->text, display_text(tl.steps()[4]->text)) << size;
    const ShownItem* seq = find(ui20, "SEQ_LEN");
    ASSERT_NE(seq, nullptr);
    EXPECT_EQ(seq->text, "SEQ_LEN " + std::to_string(tl.steps()[4]->seq_len)) << size;
    tl.follow_live();
    // The last words end with the newest token.
    if (const ShownItem* s = find(ui, "last words")) {
      EXPECT_EQ(s->text.substr(s->text.size() - std::min(s->text.size(), newest.size())), newest)
          << size;
    }
  }
}
