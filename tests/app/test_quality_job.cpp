// test_quality_job.cpp — the live cache comparison the app runs (quality_job.h), on the
// default model: the reference configuration against itself gives KL 0 and full agreement
// at every step; a q4_0 cache gives KL > 0 and holds fewer bytes than the f16 reference;
// stop() ends a run between two steps; a bad configuration is a clear error, not a crash.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "app/core/quality_job.h"

using namespace kvscope;
using namespace kvscope::app;

namespace {

QualitySpec spec_for(KvTypes types, int steps) {
  QualitySpec s;
  s.candidate.model_path = KVSCOPE_DEFAULT_MODEL;
  s.candidate.backend = "cpu";
  s.candidate.kv_types = types;
  s.prompt = {"The capital of France is", false};
  s.steps = steps;
  return s;
}

class QualityJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL)) GTEST_SKIP() << "default model not found";
  }
};

}  // namespace

TEST_F(QualityJobTest, TheReferenceAgainstItselfIsExact) {
  QualityJob job;
  job.start(spec_for({KvDtype::F16, KvDtype::F16}, 6));
  job.wait();
  QualitySnapshot s = job.snapshot();
  EXPECT_TRUE(s.error.empty()) << s.error;
  EXPECT_FALSE(s.running);
  ASSERT_EQ(s.points.size(), 6u);
  for (const QualityPoint& p : s.points) {
    EXPECT_EQ(p.kl, 0.0);
    EXPECT_TRUE(p.top1_agree);
    EXPECT_EQ(p.cand_bytes, p.ref_bytes);
  }
  EXPECT_EQ(s.agreements, 6);
}

TEST_F(QualityJobTest, AQuantizedCacheCostsKlAndSavesBytes) {
  QualityJob job;
  job.start(spec_for({KvDtype::Q4_0, KvDtype::Q4_0}, 6));
  job.wait();
  QualitySnapshot s = job.snapshot();
  ASSERT_TRUE(s.error.empty()) << s.error;
  ASSERT_EQ(s.points.size(), 6u);
  EXPECT_GT(s.mean_kl, 0.0);
  for (const QualityPoint& p : s.points) {
    // q4_0: 18 bytes per 32 values against f16's 64.
    EXPECT_EQ(p.cand_bytes * 64, p.ref_bytes * 18) << "step " << p.step;
  }
  EXPECT_NE(s.candidate.find("q4_0"), std::string::npos) << s.candidate;
}

TEST_F(QualityJobTest, StopEndsARunBetweenStepsAndBadSettingsAreAnError) {
  QualityJob job;
  job.start(spec_for({KvDtype::F16, KvDtype::F16}, 400));
  for (int i = 0; i < 600 && job.snapshot().points.empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  job.stop();
  job.wait();
  QualitySnapshot s = job.snapshot();
  EXPECT_FALSE(s.running);
  EXPECT_LT(s.points.size(), 400u);

  QualitySpec bad = spec_for({KvDtype::F16, KvDtype::F16}, 4);
  bad.candidate.limits.window = 1 << 22;  // larger than the context
  job.start(bad);
  job.wait();
  s = job.snapshot();
  EXPECT_FALSE(s.error.empty());
  EXPECT_TRUE(s.points.empty());
}
