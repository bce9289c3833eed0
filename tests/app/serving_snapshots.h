// serving_snapshots.h — what the serving-record tests share: a hand-made serving run whose
// snapshots exercise every field (tiles changing state, references, owners and flashes;
// lanes arriving, growing, forked, preempted, finishing, cancelled, failing; every event
// kind; the waiting queue; the history; the totals), its recording, and a field-by-field
// comparison of two snapshots.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "app/core/serving_record.h"

namespace kvscope::app::test {

// A path in the test's temporary directory, unique to this process.
std::string temp_path(const std::string& name);
std::vector<uint8_t> read_bytes(const std::string& path);
std::string write_bytes(const std::string& name, const std::vector<uint8_t>& b);

// Every field, with gtest expectations. `tol`: attention within it (0: exactly); < 0: the
// replay must have no attention (not stored).
void expect_snapshot_eq(const ServingSnapshot& a, const ServingSnapshot& b, float tol);

// A lane of a 6-token prompt (its last piece half a UTF-8 character).
Lane new_lane(int seq, int request, int arrival);
// Block `block` held by `seq` alone at `logical` in its table, `n_pos` positions filled.
void use_tile(ServingSnapshot& s, int block, int seq, int logical, int n_pos, TileFlash f);
std::vector<float> attention_over(int n, int salt);

// 157 snapshots of a 12-block pool: every field and event kind, a skipped step, an old
// history point rewritten, then one request decoding past two checkpoint intervals.
std::vector<ServingSnapshot> make_serving_run();
ServingMeta serving_test_meta(AttnEncoding enc);
// Records `snaps` into temp_path(name) (gtest expectations on every call); returns the path.
std::string record_serving(const std::string& name, const std::vector<ServingSnapshot>& snaps,
                           AttnEncoding enc);

}  // namespace kvscope::app::test
