// kv_policy.h — what a session's KV cache does about limited context and memory.
//
// KvLimits is the user's choice (CLI --ctx, --ctx-full, --n-keep, --kv-sink, --kv-window;
// the app offers the same):
//   n_ctx    the context size: the most positions a sequence may use (0: the model's
//            trained context);
//   on_full  when the sequence reaches n_ctx: Stop (StopReason::ContextFull), or Shift
//            (llama.cpp's context shift): keep positions [0, n_keep), drop the oldest half
//            of the rest, move the survivors down by the number dropped and re-rotate
//            their K rows by that delta (RoPE is a rotation, so this is exact up to
//            rounding — and to the requantization of a q8_0 / q4_0 K row);
//   sink, window  StreamingLLM's attention sinks: every layer keeps its first `sink`
//            positions and the last `window`, evicting the rest every step (a layer with
//            its own window, e.g. Gemma 3's local layers, keeps no sinks: it never saw
//            the first positions past its window in training). Positions keep
//            their values (they are not re-numbered inside the cache as StreamingLLM
//            does), so a run still ends at n_ctx; what the window bounds is memory.
// NO CACHE applies the same rules: sink + window as the attention mask of its scratch
// cache, shifts by replaying them on the scratch cache at the same points (session.cpp).
#pragma once

#include <string>

#include "engine/kv_cache.h"
#include "common/status.h"

namespace kvscope {

enum class ContextPolicy { Stop, Shift };
const char* context_policy_name(ContextPolicy p);  // "stop", "shift"
bool context_policy_parse(const std::string& name, ContextPolicy* out);

struct KvLimits {
  int n_ctx = 0;
  ContextPolicy on_full = ContextPolicy::Stop;
  int n_keep = 0;  // Shift: positions kept at the start
  int sink = 0;    // with window > 0
  int window = 0;  // 0: off
};

// Checks the limits against the model's trained context: one clear error naming the
// setting, its value and the allowed range (context outside [2, trained], window larger
// than the context, sink >= context, sink without window, n_keep with no room to shift,
// shift together with a window).
Status kv_limits_check(const KvLimits& lim, int trained_ctx);
// The context size in effect.
inline int kv_limits_ctx(const KvLimits& lim, int trained_ctx) {
  return lim.n_ctx > 0 ? lim.n_ctx : trained_ctx;
}
// Applies sink + window to every layer's rule: the window becomes the smaller of the
// layer's own and `window`, the first `sink` positions stay visible and held (in layers
// without a window of their own), and the layer keeps the last `window` positions (a ring).
void kv_limits_apply(const KvLimits& lim, KvCacheConfig& cfg);
// Positions a shift drops from a full cache of `length` positions: half of those after
// n_keep (at least 1).
int kv_shift_discard(int length, int n_keep);
// "ctx 8192", "ctx 512, shift keeping 4", "ctx 8192, sink 4 + window 256".
std::string kv_limits_name(const KvLimits& lim, int trained_ctx);

}  // namespace kvscope
