// backend.h — the per-op interface the transformer forward is written against.
//
// The forward pass (engine/forward.cpp) is written once and calls these ops; the CPU
// backend (engine/cpu) and the CUDA backend (engine/cuda) implement them. All tensors
// are fp32 activations in the backend's memory (host memory on the CPU, device memory
// on CUDA); the engine never dereferences a Tensor's pointer itself — it only moves
// data across with upload/download. Weights are the model's quantized views
// (engine/model.h); a backend may keep its own copy (the CUDA backend uploads them once).
//
// Ops are issued in order; a backend may run them asynchronously, but download() returns
// only when the data is on the host. Every op returns a Status: a bad shape or argument
// (checked here, the same for every backend) or a backend error (CUDA failure, out of
// memory) is an Error, never an abort.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/kv_pool.h"
#include "engine/model.h"
#include "common/status.h"

namespace kvscope {

// A row-major [rows][cols] fp32 tensor in backend memory.
struct Tensor {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  Tensor row(int64_t r) const { return Tensor{data + r * cols, 1, cols}; }
  Tensor row_range(int64_t r0, int64_t n) const { return Tensor{data + r0 * cols, n, cols}; }
  int64_t size() const { return rows * cols; }
};

// RoPE of one layer: pairing, rotated dims per head, base and position scale (model.h).
struct RopeSpec {
  RopeStyle style = RopeStyle::Adjacent;
  int n_rot = 0;
  float base = 10000.0f;
  float freq_scale = 1.0f;
};

// Every op of the interface, in declaration order: the public entry points below, each
// a non-virtual wrapper that checks its arguments and then calls the protected do_<op>.
// An op added to Backend adds its name here; the backend-ops test
// (tests/kernels/test_backend_ops.cpp) then fails until it has an entry for the op, and
// does not build while its probe backend misses a new do_<op> (every do_<op> is pure but
// the rows ops', whose default loops over the per-sequence op; the probe overrides them too).
inline constexpr std::array<std::string_view, 23> kBackendOps = {
    "scratch",      "create_kv_cache", "embed",       "rmsnorm",       "matmul",
    "add_bias",     "rope",            "kv_write",    "attention",     "glu",
    "add",          "kv_row_norms",    "kv_row_errors", "download",    "kv_rerotate",
    "matmul_qkv",   "matmul_glu",      "rope_kv_write", "add_rmsnorm",
    "rope_kv_write_rows", "attention_rows", "norm_qkv_kv_write", "norm_ffn",
};

// B decode rows of a batch, one per sequence: row b of the rows ops' tensors is one token
// of caches[b] at position pos[b] (the position its begin() made room for). The caches are
// distinct. Host memory, valid for the call.
struct DecodeRows {
  KvCache* const* caches = nullptr;  // [B]
  const int* pos = nullptr;          // [B]
  int n = 0;                         // B
};

// The residual step that opens each half of a block in the fused ops below:
// x += y' with y' = RMSNorm(y)·y_norm (y_norm null: y' = y; y null: nothing is added),
// then h = RMSNorm(x)·w, all with eps.
struct ResidualNorm {
  Tensor x;                        // [T][C] the residual stream, updated in place
  Tensor y;                        // [T][C] the previous product, or null; may be overwritten
  const Weight* y_norm = nullptr;  // [C] (Gemma's post norms) or null
  const Weight* w = nullptr;       // [C]
  float eps = 0.0f;
  Tensor h;                        // [T][C] receives RMSNorm(x)·w; distinct from x and y
};

// The attention's input half of one layer for norm_qkv_kv_write: the projections of h,
// their biases and per-head norms, RoPE and the store into the cache, the stored rows'
// norms.
struct QkvStore {
  const Weight* wq = nullptr;      // [H*D][C]
  const Weight* wk = nullptr;      // [Hkv*D][C]
  const Weight* wv = nullptr;      // [Hkv*D][C]
  const Weight* bq = nullptr;      // [H*D] or null (then bk, bv null too)
  const Weight* bk = nullptr;      // [Hkv*D]
  const Weight* bv = nullptr;      // [Hkv*D]
  const Weight* q_norm = nullptr;  // [D] per-head RMSNorm of q or null (then k_norm null too)
  const Weight* k_norm = nullptr;  // [D]
  Tensor q, k, v;                  // [T][H*D], [T][Hkv*D], [T][Hkv*D] outputs
  KvCache* cache = nullptr;
  int layer = 0;
  int n_head = 0;                  // H
  RopeSpec rope;
  int pos0 = 0;                    // row t is position pos0 + t (begin() made room)
  Tensor k_row_norm, v_row_norm;   // [1][T] the stored rows' L2 norms, or null
};

// The feed-forward half of one layer for norm_ffn.
struct FfnWeights {
  const Weight* gate = nullptr;    // [F][C]
  const Weight* up = nullptr;      // [F][C]
  const Weight* down = nullptr;    // [C][F]
  FfnAct act = FfnAct::Silu;
};

// What Backend::sample_candidates finds on the device (kernels/sample.h).
struct DeviceCandidates {
  double sum = 0;      // sum of float(exp((l_i - max) / T)) over the row, in double
  double sum_err = 0;  // bound on |sum - the CPU softmax's sum of the same terms|
  float max = 0;       // the largest logit
  int nan = 0;         // NaN logits in the row
  std::vector<int32_t> ids;  // [n] by logit descending, then id ascending
  std::vector<float> logits;  // [n] their logits
};

// The ops check shapes and arguments before a backend sees them: a bad call is an Error
// with the same message on every backend, "<op>: <argument> is <value>, expected
// <expected>" (backend.cpp), and the backends' do_<op> may assume consistent shapes.
class Backend {
 public:
  virtual ~Backend() = default;
  // Short description for the UI and CLI, e.g. "cpu (2 threads, avx512)" or "cuda (NVIDIA H100)".
  virtual std::string name() const = 0;
  // The kind of backend as make_backend names it: "cpu" or "cuda".
  virtual const char* kind() const = 0;
  // CPU threads the ops run on: the CPU backend's pool size (after clamping to the
  // hardware); 0 on the CUDA backend, whose ops run on the GPU. A second backend made with
  // make_backend(kind(), model, threads()) runs like this one.
  virtual int threads() const = 0;
  // Runs fn(begin, end) over a partition of [0, n) on the threads the ops run on (the CPU
  // backend's pool; the CUDA backend's one host thread), between steps: host work of a
  // step, such as drawing each sequence's token. fn must give the same results whichever
  // thread runs a part, and must not throw. Not from inside an op.
  virtual void host_parallel(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n > 0) fn(0, n);
  }

  // Scratch memory for activations: slot `slot` (0 .. kMaxScratchSlot) holds at least
  // rows*cols floats (contents not preserved when it grows). The forward uses a fixed set
  // of slots.
  static constexpr int kMaxScratchSlot = 64;
  Expected<Tensor> scratch(int slot, int64_t rows, int64_t cols);
  // A cache laid out for `capacity` positions to start with (it grows as needed).
  Expected<std::unique_ptr<KvCache>> create_kv_cache(const KvCacheConfig& config, int capacity);
  // The shared pool of KV blocks and paged caches over it (engine/kv_pool.h), where the
  // backend has them; an error naming the backend elsewhere. Not ops: the ops above take
  // a paged cache like any other.
  virtual Expected<std::shared_ptr<KvPool>> create_kv_pool(const KvPoolConfig& config);
  virtual Expected<std::unique_ptr<KvCache>> create_paged_kv_cache(const KvCacheConfig& config,
                                                                   std::shared_ptr<KvPool> pool);

  // out[t][:] = row ids[t] of tok_embd (dequantized) * scale. ids are host memory,
  // T = out.rows; they stay valid and unchanged until the forward's next download().
  Status embed(const Weight& tok_embd, const int32_t* ids, float scale, Tensor out);
  // out[t][i] = x[t][i] / sqrt(mean_i(x[t]^2) + eps) * w[i]. out may alias x. (Per-head
  // norms pass x viewed as [T*heads][D].)
  Status rmsnorm(Tensor x, const Weight& w, float eps, Tensor out);
  // out[t][o] = sum_i W[o][i] * x[t][i];  x [T][n_in], out [T][n_out].
  Status matmul(const Weight& w, Tensor x, Tensor out);
  // x[t][i] += b[i]; b is a vector weight [x.cols].
  Status add_bias(Tensor x, const Weight& b);
  // In place on x [T][n_heads*head_dim]: rotates, in every head, the pairs of the first
  // n_rot dims (adjacent (2i, 2i+1) or NeoX (i, i + n_rot/2)) by
  // theta_i = pos * freq_scale * base^(-2i/n_rot), row t at position pos = pos0 + t.
  Status rope(Tensor x, int n_heads, int head_dim, const RopeSpec& rope, int pos0);
  // Stores k, v [T][Hkv*D] (row t is position pos0 + t) into the cache of `layer`, each
  // at slot cache.slot_of(layer, pos0 + t), converted to the cache's K and V types. The
  // cache's begin(pos0, T) has made room and recorded the positions.
  Status kv_write(KvCache& cache, int layer, Tensor k, Tensor v, int pos0);
  // Grouped-query attention of q [T][H*D] (row t at position pos0 + t) over the keys the
  // cache of `layer` holds (its slot -> position map) that cache.rule(layer) makes visible
  // to that query (causal, window, sinks); every visible key must be held. Query head h
  // reads KV head h / (H / Hkv); scores times `scale`; softmax with max subtracted; keys
  // in ascending position order. out [T][H*D]. probs_last [H][pos0+T] receives the last
  // query's softmax row indexed by position (0 for positions it does not see); it may be
  // a null tensor.
  Status attention(Tensor q, const KvCache& cache, int layer, int pos0, int n_head, float scale,
                   Tensor out, Tensor probs_last);
  // Gated activation: out[i] = act(gate[i]) * up[i] with silu(x) = x / (1 + exp(-x)) or
  // gelu_tanh(x) = 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))). out may alias gate.
  Status glu(Tensor gate, Tensor up, FfnAct act, Tensor out);
  // x[i] += y[i].
  Status add(Tensor x, Tensor y);
  // For positions pos0 .. pos0+T-1 of `layer` (just written): k_norm[0][t] = L2 norm of
  // the stored K row (all kv heads), v_norm likewise. k_norm, v_norm are [1][T].
  Status kv_row_norms(const KvCache& cache, int layer, int pos0, int T, Tensor k_norm,
                      Tensor v_norm);
  // Quantization error of the rows just written at positions pos0 .. pos0+k.rows-1 of
  // `layer`: k_err[0][t] = ||k[t] - K'[t]|| / ||k[t]|| with K' the stored K row read back
  // as f32 (all kv heads together; 0 for a zero row), v_err likewise. k, v are the f32 rows
  // [T][Hkv*D] as kv_write received them. Only where can_measure_kv_errors().
  virtual bool can_measure_kv_errors() const { return false; }
  Status kv_row_errors(const KvCache& cache, int layer, int pos0, Tensor k, Tensor v,
                       Tensor k_err, Tensor v_err);
  // Copies src (rows*cols floats) to host memory; returns when the data is there.
  Status download(Tensor src, float* host);
  // Context shift: rotates the stored K rows of every position >= first that `layer`
  // holds by `delta` positions (RoPE with pos = delta, as rope() would at pos0 = delta),
  // re-storing them in the cache's K type. After KvCache::shift(first', n) renumbered the
  // positions after first' by -n, kv_rerotate(first', -n) makes those rows carry their
  // new positions (exact up to rounding: R(p - n)·k = R(-n)·R(p)·k).
  Status kv_rerotate(KvCache& cache, int layer, const RopeSpec& rope, int first, int delta);

  // --- Fused ops. A backend fuses them where that saves launches or memory traffic (the
  // CUDA decode step) and otherwise runs the unfused_<op> composition of the basic ops
  // below. Results must equal the composition within the backend's tolerance.

  // q, k, v = Wq·x, Wk·x, Wv·x (one pass over x).
  Status matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, Tensor x, Tensor q,
                    Tensor k, Tensor v);
  // out = act(Wgate·x) ⊙ (Wup·x); `up` is scratch of the same shape as out.
  Status matmul_glu(const Weight& w_gate, const Weight& w_up, Tensor x, FfnAct act, Tensor out,
                    Tensor up);
  // RoPE on q and k, then k and v stored into the cache at positions pos0 .. (kv_write).
  Status rope_kv_write(Tensor q, Tensor k, Tensor v, KvCache& cache, int layer, int n_head,
                       const RopeSpec& rope_spec, int pos0);
  // x += y, then out = RMSNorm(x)·w.
  Status add_rmsnorm(Tensor x, Tensor y, const Weight& w, float eps, Tensor out);
  // A layer's way in to attention: the residual step rn (ResidualNorm), q, k, v = Wq·h,
  // Wk·h, Wv·h (+ biases), per-head RMSNorm of q and k (eps = rn.eps), then rope_kv_write
  // (q and k end rotated) and, when a.k_row_norm is given, kv_row_norms of the rows
  // stored. On CUDA one launch per decode step (the last block to finish the products
  // does the rest).
  Status norm_qkv_kv_write(const ResidualNorm& rn, const QkvStore& a);
  // A layer's feed-forward half: the residual step rn, gate = act(Wgate·h) ⊙ (Wup·h),
  // out = Wdown·gate. `gate`, `up` [T][F] are scratch; out [T][C] may alias rn.y. On CUDA
  // one launch per decode step (blocks own slices of F; the last one sums their partial
  // down products in slice order).
  Status norm_ffn(const ResidualNorm& rn, const FfnWeights& w, Tensor gate, Tensor up,
                  Tensor out);
  // The residual step rn alone, through the ops above (rmsnorm, add_rmsnorm): not an op of
  // its own. The fused ops' fallbacks and the forward's separate path both take it.
  Status residual_norm(const ResidualNorm& rn);
  // norm_qkv_kv_write's half before RoPE, through the ops above: the residual step, the
  // q/k/v products, the biases and the per-head q/k norms (head_dim = a.q.cols / n_head;
  // a.cache, layer, rope, pos0 and the row norms are not used). The fused op's fallback
  // and the forward's separate path (several sequences, or K/V errors asked) both take it.
  Status norm_qkv(const ResidualNorm& rn, const QkvStore& a);

  // --- Decode rows of several sequences at once (a batched decode step): the results of
  // the per-sequence op on each row, in one launch (or one split + merge pair) where the
  // backend can (CUDA, paged caches of one pool); by default the per-sequence op per row.
  // rope_kv_write for row b of q [B][H*D], k, v [B][Hkv*D] into rows.caches[b] at pos[b].
  Status rope_kv_write_rows(Tensor q, Tensor k, Tensor v, const DecodeRows& rows, int layer,
                            int n_head, const RopeSpec& rope_spec);
  // attention (no probability rows) of row b of q [B][H*D] over rows.caches[b] at pos[b]
  // into row b of out [B][H*D].
  Status attention_rows(Tensor q, const DecodeRows& rows, int layer, int n_head, float scale,
                        Tensor out);

  // --- Not ops (no argument checks, no entry in kBackendOps): sampling where the logits
  // live (engine/device_sampling.h) and copies that do not wait.
  // Whether sample_candidates works here (the CUDA backend); the CPU backend's logits are
  // on the host already.
  virtual bool can_sample_on_device() const { return false; }
  // For the logits row [1][V] (backend memory, e.g. ForwardOutput::logits_dev): the n best
  // candidates by (logit descending, id ascending), the max and the softmax sum after
  // `temperature` with its error bound (DeviceCandidates), and a copy of the row that
  // sampled_row() reads until the next call. Only the candidates cross to the host.
  virtual Status sample_candidates(Tensor logits_row, int n, float temperature,
                                   DeviceCandidates& out);
  // The row the last sample_candidates was given, copied to host [V].
  virtual Status sampled_row(float* host);
  // sample_candidates for each row of `rows` [R][V] (backend memory, e.g. a batched step's
  // consecutive logits rows), into out[0 .. R): the same results row by row, in one pass
  // where the backend can (CUDA: three launches and one copy for every row). No row copy:
  // sampled_row() is not changed.
  virtual Status sample_candidates_rows(Tensor rows, int n, float temperature,
                                        std::vector<DeviceCandidates>& out);
  // Starts copying src to `host` and returns; the copy is complete (and `host` written)
  // only after download_wait(). By default a download() that waits.
  virtual Status download_async(Tensor src, float* host) { return download(src, host); }
  virtual Status download_wait() { return Status::Ok(); }

  // Not an op: the time (ms) that the products of `weights` with x of `rows` rows (1: a
  // decode step; B: a batched step of B sequences) take one after another when every
  // weight's bytes come from the cores' caches, not from memory: each product is timed on
  // its first groups of output rows, as many as fit half of every
  // thread's L2 cache, best of several passes, and scaled to the whole weight by its
  // groups. The same instructions run per byte from memory, so decode can go no faster
  // than this allows however fast the memory is: with the memory floor (kvscope bench),
  // it bounds a step from below. nullopt where the backend has no such measure (CUDA) or a
  // weight cannot be packed.
  virtual std::optional<double> products_in_cache_ms(const std::vector<const Weight*>& weights,
                                                     int rows) {
    (void)weights;
    (void)rows;
    return std::nullopt;
  }

  // Step timing: the device time between begin_step and end_step, where the backend
  // can measure it (CUDA events); nullopt on the CPU (the session uses wall time).
  virtual void begin_step() {}
  virtual std::optional<double> end_step() { return std::nullopt; }

 protected:
  // The ops proper, called with arguments the public wrappers have checked.
  virtual Expected<Tensor> do_scratch(int slot, int64_t rows, int64_t cols) = 0;
  virtual Expected<std::unique_ptr<KvCache>> do_create_kv_cache(const KvCacheConfig& config,
                                                                int capacity) = 0;
  virtual Status do_embed(const Weight& tok_embd, const int32_t* ids, float scale,
                          Tensor out) = 0;
  virtual Status do_rmsnorm(Tensor x, const Weight& w, float eps, Tensor out) = 0;
  virtual Status do_matmul(const Weight& w, Tensor x, Tensor out) = 0;
  virtual Status do_add_bias(Tensor x, const Weight& b) = 0;
  virtual Status do_rope(Tensor x, int n_heads, int head_dim, const RopeSpec& rope,
                         int pos0) = 0;
  virtual Status do_kv_write(KvCache& cache, int layer, Tensor k, Tensor v, int pos0) = 0;
  virtual Status do_attention(Tensor q, const KvCache& cache, int layer, int pos0, int n_head,
                              float scale, Tensor out, Tensor probs_last) = 0;
  virtual Status do_glu(Tensor gate, Tensor up, FfnAct act, Tensor out) = 0;
  virtual Status do_add(Tensor x, Tensor y) = 0;
  virtual Status do_kv_row_norms(const KvCache& cache, int layer, int pos0, int T,
                                 Tensor k_norm, Tensor v_norm) = 0;
  // Called only where can_measure_kv_errors().
  virtual Status do_kv_row_errors(const KvCache& cache, int layer, int pos0, Tensor k, Tensor v,
                                  Tensor k_err, Tensor v_err) = 0;
  virtual Status do_download(Tensor src, float* host) = 0;
  virtual Status do_kv_rerotate(KvCache& cache, int layer, const RopeSpec& rope, int first,
                                int delta) = 0;
  virtual Status do_matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, Tensor x,
                               Tensor q, Tensor k, Tensor v) = 0;
  virtual Status do_matmul_glu(const Weight& w_gate, const Weight& w_up, Tensor x, FfnAct act,
                               Tensor out, Tensor up) = 0;
  virtual Status do_rope_kv_write(Tensor q, Tensor k, Tensor v, KvCache& cache, int layer,
                                  int n_head, const RopeSpec& rope_spec, int pos0) = 0;
  virtual Status do_add_rmsnorm(Tensor x, Tensor y, const Weight& w, float eps,
                                Tensor out) = 0;
  virtual Status do_norm_qkv_kv_write(const ResidualNorm& rn, const QkvStore& a) = 0;
  virtual Status do_norm_ffn(const ResidualNorm& rn, const FfnWeights& w, Tensor gate, Tensor up,
                             Tensor out) = 0;
  // Not pure: by default each row through the per-sequence op (bit-identical to it).
  virtual Status do_rope_kv_write_rows(Tensor q, Tensor k, Tensor v, const DecodeRows& rows,
                                       int layer, int n_head, const RopeSpec& rope_spec);
  virtual Status do_attention_rows(Tensor q, const DecodeRows& rows, int layer, int n_head,
                                   float scale, Tensor out);

  // The fused ops as sequences of the basic ops, for backends (or shapes) without a
  // fused version.
  Status unfused_matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, Tensor x,
                            Tensor q, Tensor k, Tensor v);
  Status unfused_matmul_glu(const Weight& w_gate, const Weight& w_up, Tensor x, FfnAct act,
                            Tensor out, Tensor up);
  Status unfused_rope_kv_write(Tensor q, Tensor k, Tensor v, KvCache& cache, int layer,
                               int n_head, const RopeSpec& rope_spec, int pos0);
  Status unfused_add_rmsnorm(Tensor x, Tensor y, const Weight& w, float eps, Tensor out);
  Status unfused_norm_qkv_kv_write(const ResidualNorm& rn, const QkvStore& a);
  Status unfused_norm_ffn(const ResidualNorm& rn, const FfnWeights& w, Tensor gate, Tensor up,
                          Tensor out);
};

}  // namespace kvscope
