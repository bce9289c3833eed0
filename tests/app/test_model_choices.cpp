// test_model_choices.cpp — the model picker's list (app/model_choices.h), on directories
// made by the test: built-in models first, present or not; other .gguf files once each,
// sorted, from the first directory that has them; other files and missing directories
// ignored. And the clean name a model is shown by.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/bootstrap/bootstrap.h"
#include "app/core/model_choices.h"

using namespace kvscope;
using namespace kvscope::app;
namespace fs = std::filesystem;

namespace {

void touch(const fs::path& p) {
  std::ofstream(p) << "x";
}

}  // namespace

TEST(ModelChoices, BuiltinsFirstThenEveryOtherGgufOnceSorted) {
  const fs::path root = fs::path(testing::TempDir()) / "kvscope_model_choices";
  fs::remove_all(root);
  fs::create_directories(root / "a");
  fs::create_directories(root / "b");
  const auto& builtins = builtin_models();
  ASSERT_GE(builtins.size(), 2u);
  touch(root / "b" / builtins[1].file);  // only the second built-in is fetched
  touch(root / "a" / "zeta.gguf");
  touch(root / "a" / "Alpha.GGUF");
  touch(root / "b" / "zeta.gguf");  // the same name again: listed once, from a/
  touch(root / "a" / "notes.txt");
  fs::create_directories(root / "a" / "dir.gguf");  // a directory, not a model

  auto c =
      model_choices({(root / "a").string(), (root / "missing").string(), (root / "b").string()});
  ASSERT_EQ(c.size(), builtins.size() + 2);
  for (size_t i = 0; i < builtins.size(); ++i) {
    EXPECT_TRUE(c[i].builtin);
    EXPECT_EQ(c[i].label, builtins[i].name);
    EXPECT_EQ(c[i].open, builtins[i].name);  // opened by name, as --model takes it
  }
  EXPECT_FALSE(c[0].present);
  EXPECT_TRUE(c[1].present);
  const size_t n = builtins.size();
  EXPECT_EQ(c[n].label, "Alpha.GGUF");
  EXPECT_EQ(c[n].open, (root / "a" / "Alpha.GGUF").string());
  EXPECT_EQ(c[n + 1].label, "zeta.gguf");
  EXPECT_EQ(c[n + 1].open, (root / "a" / "zeta.gguf").string());
  EXPECT_FALSE(c[n].builtin);
  fs::remove_all(root);
}

TEST(ModelChoices, TheRepositoryModelsAreListedAsBuiltins) {
  // assets/models/ holds the built-in models' files (fetched by the test command): they
  // appear as built-in names, not as extra files.
  auto c = model_choices(asset_model_dirs());
  ASSERT_GE(c.size(), builtin_models().size());
  for (const ModelChoice& m : c) {
    if (m.builtin) continue;
    for (const BuiltinModel& b : builtin_models()) EXPECT_NE(m.label, b.file);
  }
}

// The name shown for a model: general.name when the file's name agrees with it, else the
// file's own name without the quantization tag (a training run's name is not a model's).
TEST(ModelChoices, DisplayNameIsCleanAndMatchesTheFile) {
  EXPECT_EQ(
      model_display_name("Smollm2 135M 8k Lc100K Mix1 Ep2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
      "SmolLM2-135M-Instruct");
  EXPECT_EQ(model_display_name("Gemma 3 270m", "gemma-3-270m-q4_k_m.gguf"), "Gemma 3 270m");
  EXPECT_EQ(model_display_name("Qwen2.5 0.5B Instruct", "qwen2.5-0.5b-instruct-q8_0.gguf"),
            "Qwen2.5 0.5B Instruct");
  EXPECT_EQ(model_display_name("", "my-model.F16.GGUF"), "my-model");
  EXPECT_EQ(model_display_name("llama", "tiny-IQ2_XS.gguf"), "tiny");
  EXPECT_EQ(model_display_name("Some Model", ""), "Some Model") << "a recording without a file";
  EXPECT_EQ(model_display_name("Llama 3.2 1B Instruct", "Llama-3.2-1B-Instruct-Q4_K_M.gguf"),
            "Llama 3.2 1B Instruct");
}
