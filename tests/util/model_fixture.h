// model_fixture.h — a test suite over one real model file: the model is loaded once per
// suite and shared by its tests, and every test is skipped, saying how to fetch the file,
// when it is absent. A suite derives from ModelTest<DefaultModelFile> or
// ModelTest<GemmaModelFile> and adds its own session helpers on top of session().
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/model.h"
#include "engine/session.h"

namespace kvscope {

// The built-in default model (SmolLM2 135M, llama architecture).
struct DefaultModelFile {
  static std::string path() { return KVSCOPE_DEFAULT_MODEL; }
  static constexpr const char* kAbsent = "default model absent: run scripts/fetch_model.sh";
};

// The built-in Gemma 3 270M.
struct GemmaModelFile {
  static std::string path() {
    return std::string(KVSCOPE_SOURCE_DIR) + "/assets/models/gemma-3-270m-q4_k_m.gguf";
  }
  static constexpr const char* kAbsent =
      "Gemma 3 absent: run scripts/fetch_model.sh gemma3-270m";
};

template <class File>
class ModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(File::path())) return;
    auto m = Model::load(File::path());
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(m.value());
  }
  static void TearDownTestSuite() { model_.reset(); }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << File::kAbsent;
  }

  // A session on the CPU backend (2 threads); null, with the failure recorded, if refused.
  static std::unique_ptr<Session> session(const SessionConfig& c) {
    auto s = Session::create(model_, make_cpu_backend(2), c);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    return s.ok() ? std::move(s.value()) : nullptr;
  }
  // The ids of raw text (no chat template), the failure recorded and none when refused.
  static std::vector<int32_t> tokens(const std::string& text) {
    auto ids = tokenize_prompt(*model_, PromptSpec{text, false, false});
    EXPECT_TRUE(ids.ok()) << (ids.ok() ? "" : ids.error().message);
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }
  // The usual run of these tests: a cache mode, a token budget, EOS not stopping it.
  static SessionConfig config(CacheMode mode, int max_tokens) {
    SessionConfig c;
    c.mode = mode;
    c.max_tokens = max_tokens;
    c.stop_at_eos = false;
    return c;
  }

  static inline std::shared_ptr<Model> model_;
};

}  // namespace kvscope
