// test_model_choices.cpp — the model picker's list (app/model_choices.h), on directories
// made by the test: built-in models first, present or not; other .gguf files once each,
// sorted, from the first directory that has them; other files and missing directories
// ignored.
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
