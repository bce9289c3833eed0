// kv_policy.cpp — context limits and eviction rules (see kv_policy.h).
#include "engine/kv_policy.h"

#include <algorithm>

namespace kvscope {

const char* context_policy_name(ContextPolicy p) {
  return p == ContextPolicy::Shift ? "shift" : "stop";
}

bool context_policy_parse(const std::string& name, ContextPolicy* out) {
  for (ContextPolicy p : {ContextPolicy::Stop, ContextPolicy::Shift})
    if (name == context_policy_name(p)) {
      *out = p;
      return true;
    }
  return false;
}

Status kv_limits_check(const KvLimits& lim, int trained_ctx) {
  if (lim.n_ctx != 0 && (lim.n_ctx < 2 || lim.n_ctx > trained_ctx))
    return make_error("ctx: context size ", lim.n_ctx, " is outside [2, ", trained_ctx,
                      "] (the model was trained for ", trained_ctx, " positions)");
  const int ctx = kv_limits_ctx(lim, trained_ctx);
  if (lim.window < 0) return make_error("kv-window: ", lim.window, " is negative (0 = off)");
  if (lim.sink < 0) return make_error("kv-sink: ", lim.sink, " is negative");
  if (lim.window > ctx)
    return make_error("kv-window: window ", lim.window, " is larger than the context (", ctx,
                      "); choose 1..", ctx, " or a larger --ctx");
  if (lim.sink > 0 && lim.window == 0)
    return make_error("kv-sink: ", lim.sink, " sink positions need a window (--kv-window W)");
  if (lim.sink >= ctx)
    return make_error("kv-sink: sink ", lim.sink, " is not below the context (", ctx,
                      "); choose 0..", ctx - 1);
  if (lim.window > 0 && lim.sink + lim.window > ctx)
    return make_error("kv-window: sink ", lim.sink, " + window ", lim.window,
                      " is more than the context holds (", ctx, ")");
  if (lim.n_keep < 0) return make_error("n-keep: ", lim.n_keep, " is negative");
  if (lim.on_full == ContextPolicy::Shift) {
    if (lim.window > 0)
      return make_error(
          "ctx-full: a context shift and a sink + window are two answers to the "
          "same limit; choose one");
    if (lim.n_keep > ctx - 2)
      return make_error("n-keep: keeping ", lim.n_keep, " of a ", ctx,
                        "-position context leaves nothing to shift; choose 0..", ctx - 2);
  } else if (lim.n_keep > 0) {
    return make_error("n-keep: ", lim.n_keep,
                      " only applies to a context shift (--ctx-full shift)");
  }
  return Status::Ok();
}

void kv_limits_apply(const KvLimits& lim, KvCacheConfig& cfg) {
  if (lim.window <= 0) return;
  for (KvLayerRule& r : cfg.layers) {
    // A layer with its own window (Gemma 3's local layers) never saw the first positions
    // beyond it in training, so it gets no sinks: they would add keys it does not expect.
    r.sink = r.window > 0 ? 0 : lim.sink;
    r.window = r.window > 0 ? std::min(r.window, lim.window) : lim.window;
    r.keep = r.window;
  }
}

int kv_shift_discard(int length, int n_keep) {
  return std::max(1, (length - n_keep) / 2);
}

std::string kv_limits_name(const KvLimits& lim, int trained_ctx) {
  std::string s = "ctx " + std::to_string(kv_limits_ctx(lim, trained_ctx));
  if (lim.on_full == ContextPolicy::Shift) s += ", shift keeping " + std::to_string(lim.n_keep);
  if (lim.window > 0)
    s += ", sink " + std::to_string(lim.sink) + " + window " + std::to_string(lim.window);
  return s;
}

}  // namespace kvscope
