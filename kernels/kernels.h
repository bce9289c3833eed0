// kernels.h — host entry points of the CUDA kernels (plain C++; no <<< >>> here).
//
// engine/cuda calls only these. Each launches on `stream` through kernels/launch.cuh
// and returns the launch's cudaError_t; shapes are checked by the caller (the backend)
// except where noted. All pointers are device memory. Shape letters: T tokens,
// H heads, Hkv kv heads, D head dim, C width, n_in/n_out matrix sides, N keys.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace kvscope::cuda {

// ggml type ids as stored in GGUF (kernels do not depend on the engine).
enum class QType : int {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
};
// Extra text about the last failure (the emulator's deadlock / fault report); empty on a
// real GPU, where the error code is all there is.
std::string error_detail();

// True when the kernels can dequantize this type.
bool qtype_supported(int type_id);
// Values per block and bytes per block (0 for unsupported types).
int qtype_block_size(int type_id);
int qtype_block_bytes(int type_id);
// True when matmul has a native kernel for the type (no fp32 copy needed).
inline bool matmul_native(QType t) { return t == QType::Q4_1 || t == QType::Q8_0; }

// RoPE of one layer: the first n_rot dims of each head rotate in pairs, adjacent (2i, 2i+1)
// or NeoX (i, i + n_rot/2), by pos * freq_scale * base^(-2i/n_rot).
struct RopeArgs {
  int n_rot = 0;
  int neox = 0;
  float base = 10000.0f;
  float freq_scale = 1.0f;
};
// FFN gate activation: silu(g) = g / (1 + exp(-g)) or tanh-approximated GELU.
enum class GateAct : int { Silu = 0, GeluTanh = 1 };

// A quantized matrix in device memory: n_out rows of n_in values, row_bytes apart.
struct QMatrix {
  const void* data = nullptr;
  QType type = QType::F32;
  int64_t n_in = 0, n_out = 0, row_bytes = 0;
};

// Every entry point takes the stream last (the backend builds a launch and its graph key
// from one argument list: engine/cuda/op_launcher.h).
// out[t][:] = dequantized row ids[t] of table * scale; ids [T] (checked < n_out by the caller).
cudaError_t embed(QMatrix table, const int32_t* ids, int T, float scale, float* out,
                  cudaStream_t s);
// out [n_out][n_in] fp32 = dequantized w (exact).
cudaError_t dequantize_f32(QMatrix w, float* out, cudaStream_t s);
// out[t][i] = x[t][i] * rsqrt(mean(x[t]^2) + eps) * w[i]; x, out [T][C]; out may alias x.
cudaError_t rmsnorm(const float* x, const float* w, int T, int C, float eps, float* out,
                    cudaStream_t s);
// In place on x [T][n_heads*D]: pair rotation (RopeArgs), row t at position pos0 + t.
cudaError_t rope(float* x, int T, int n_heads, int D, RopeArgs r, int pos0, cudaStream_t s);
// out[t][o] = sum_i W[o][i] x[t][i] for native types (Q4_1, Q8_0); x [T][n_in], out [T][n_out].
cudaError_t matmul(QMatrix w, const float* x, int T, float* out, cudaStream_t s);
// Same over an fp32 matrix w32 [n_out][n_in] (a dequantized copy).
cudaError_t matmul_f32(const float* w32, int64_t n_in, int64_t n_out, const float* x, int T,
                       float* out, cudaStream_t s);
// out [T][n_out] = x [T][n_in] · Wᵀ for any type the kernels decode (qtype_supported), read
// in its stored form: tiles of 64 W rows decoded once into shared memory serve 64 rows of
// x (matmul_batched.cu). fp32 activations and accumulation. n_in must be whole blocks of
// the type. For batched decode steps and short prompts (T of about 9..64); any T works.
// With work and counters (sized by the two functions below; counters zero, and left
// zero), a matrix of few 64-row tiles splits its input over several blocks
// (matmul_batched_splits) and the last block of each tile adds the splits' sums in split
// order; without them (nullptr), one block per tile. Either way each output's sum order
// depends only on the matrix's shape, so a row's result does not depend on T or on the
// other rows.
// target_blocks: the blocks a matrix of few tiles is split towards (about that many, from
// the shape and it alone; CudaBackendOptions::batched_target_blocks).
inline constexpr int kBatchedTargetBlocks = 256;
cudaError_t matmul_batched(QMatrix w, const float* x, int T, float* out, float* work,
                           unsigned* counters, int target_blocks, cudaStream_t s);
int matmul_batched_splits(QMatrix w, int target_blocks = kBatchedTargetBlocks);
int64_t matmul_batched_work_floats(QMatrix w, int T, int target_blocks = kBatchedTargetBlocks);
int matmul_batched_counters(QMatrix w, int T, int target_blocks = kBatchedTargetBlocks);
bool matmul_batched_supported(QType t);
// One layer of the KV cache: K and V each [Hkv][n_slots] rows of D values in their element
// type (the values are ggml type ids, as the engine's KvDtype; f32 and f16 rows are D
// values, q8_0 / q4_0 rows D/32 GGUF blocks of 34 / 18 bytes, D a multiple of 32:
// kernels/kv_quant.cuh), and pos [n_slots], the position each
// slot holds (-1: empty). Position p is stored in slot p when p < sink, else in
// sink + (p - sink) % (n_slots - sink) (kernels/kv_layout.cuh). A query at q sees the key
// at position k iff k <= q and (window == 0 or q - k < window or k < sink).
enum class KvElem : int { F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 8 };
struct KvLayer {
  void* k = nullptr;
  void* v = nullptr;
  KvElem k_type = KvElem::F16, v_type = KvElem::F16;
  int n_head_kv = 0, head_dim = 0, n_slots = 0;
  int sink = 0, window = 0;
  int32_t* pos = nullptr;
  // Rows per kv head in k / v: n_slots for a contiguous cache (0 means n_slots); for a
  // paged one (a cache over the engine's block pool, engine/kv_pool.h) the pool's
  // n_blocks * block.
  int stride = 0;
  // Paged only: slot s of the layer is physical row blocks[s / block] * block + s % block
  // (device memory, one entry per logical block); nullptr for a contiguous cache.
  const int32_t* blocks = nullptr;
  int block = 0;
  int block_shift = 0;  // log2(block): the pool's blocks are 8, 16 or 32 positions
};
// One decode row of a batch over several sequences' paged caches of one pool (the
// *_rows kernels): the row's own block table and slot map for the layer (device memory),
// the slots those cover and the row's position. The kernels take the layer's shared
// fields (storage, types, shape, window, block size) from a KvLayer and these per row.
struct KvRowRef {
  const int32_t* blocks = nullptr;
  int32_t* pos = nullptr;
  int n_slots = 0;
  int query = 0;
};
// Stores k, v [T][Hkv*D] at positions pos0 .. pos0+T-1 (their slots) and records those
// positions in kv.pos.
cudaError_t kv_write(KvLayer kv, const float* k, const float* v, int T, int pos0,
                      cudaStream_t s);
// The KV block pool's storage, for its copies: n_bases buffers (a device array of
// pointers: K of layer 0, V of layer 0, K of layer 1, ...), each [Hkv][rows][row bytes of
// its side (0 K, 1 V)]; blocks of `block` rows.
struct KvPoolCopy {
  void* const* bases = nullptr;
  int n_bases = 0, n_head_kv = 0;
  int block = 0, rows = 0;
  int64_t row_bytes[2] = {0, 0};
};
// One move of the context shift in every buffer and kv head: n rows from row src to row
// dst (rows of one head, each inside one block, not overlapping themselves).
struct KvRowMove {
  int dst = 0, src = 0, n = 0;
};
// Copy-on-write: block src's rows onto block dst's, in every buffer and kv head, in one
// launch. cudaErrorInvalidValue for a block outside the buffers, or blocks whose bytes
// are not a multiple of 16.
cudaError_t kv_copy_block(const KvPoolCopy& p, int dst, int src, cudaStream_t s);
// The context shift's row moves (moves: device memory [n_moves]) in every buffer and kv
// head, in one launch, one after another in their order within each buffer and head, as
// separate copies on one stream would run (a later move may read rows an earlier one
// wrote). The moves are not checked here (KvPool::move_rows checks them).
cudaError_t kv_move_rows(const KvPoolCopy& p, const KvRowMove* moves, int n_moves, cudaStream_t s);
// Context shift: every K row of the layer whose slot holds a position >= first rotates
// in place by delta positions (rope() at pos = delta), re-stored in the K type.
cudaError_t kv_rerotate(KvLayer kv, RopeArgs r, int first, int delta, cudaStream_t s);
// k_norm[t], v_norm[t] = L2 norm over all kv heads of the rows of position pos0 + t. With
// pos0_dev non-null the position is read from device memory instead (CUDA graph replay).
cudaError_t kv_row_norms(KvLayer kv, int pos0, const int* pos0_dev, int T, float* k_norm,
                     float* v_norm, cudaStream_t s);
// k_err[t], v_err[t] = ||x - x'|| / ||x|| over all kv heads, x the f32 row k[t] / v[t] just
// stored at position pos0 + t and x' that stored row read back (0 for a zero row).
// pos0_dev as in kv_row_norms.
cudaError_t kv_row_errors(KvLayer kv, const float* k, const float* v, int T, int pos0,
                          const int* pos0_dev, float* k_err, float* v_err, cudaStream_t s);
// GQA attention of q [T][H*D] (row t at position pos0 + t) over the keys the layer holds
// that are visible to each query (kv.pos and the window rule), scores times `scale`;
// out [T][H*D]. probs_last [H][probs_stride] (may be null) gets the last query's softmax
// row indexed by position: entries [0, pos0+T) written, 0 where the key is not seen.
// Dynamic shared memory holds one score per slot: kv.n_slots <= attention_max_keys().
cudaError_t attention(const float* q, KvLayer kv, int T, int pos0, int n_head, float scale,
                      float* out, float* probs_last, int64_t probs_stride, cudaStream_t s);
int attention_max_keys();
// The same for a CUDA graph replayed at every decode step: pos0 is read from *pos0_dev
// and probability rows are pos0 + T apart starting at row probs_row0 of probs_base, so
// the captured launch is valid for every step until the cache is laid out anew.
cudaError_t attention_dev(const float* q, KvLayer kv, int T, const int* pos0_dev, int n_head,
                          float scale, float* out, float* probs_base, int64_t probs_row0,
                          cudaStream_t s);
// Attention of one query row (T = 1, a decode step) split over the slots in chunks, one
// launch (the last block of each head merges its chunks): for long caches it keeps every
// SM busy. pos0 or, when pos0_dev is non-null,
// *pos0_dev is the query's position; probs (may be null) gets rows [H] of the softmax by
// position, probs_stride apart, or with probs_stride < 0 pos0 + 1 apart from row
// probs_row0 (the graph form). work: attention_decode_work_floats(H, kv) device floats;
// counters: H device unsigned ints, zero (the launch leaves them zero).
// No shared-memory limit on n_slots; head_dim <= 512.
int64_t attention_decode_work_floats(int n_head, KvLayer kv);
cudaError_t attention_decode(const float* q, KvLayer kv, int pos0, const int* pos0_dev,
                             int n_head, float scale, float* out, float* probs,
                             int64_t probs_stride, int64_t probs_row0, float* work,
                             unsigned* counters, cudaStream_t s);
// Decode attention of B rows of different sequences in one split + merge pair: row b of
// q [B][H*D] at position rows[b].query over the keys of rows[b]'s cache (its table and
// slot map; shared fields from kv, which must be paged: kv.block > 0), into row b of
// out [B][H*D]; no probability rows. max_slots >= every rows[b].n_slots sizes the grid;
// work: attention_rows_work_floats(B, H, kv, max_slots) device floats.
int64_t attention_rows_work_floats(int B, int n_head, KvLayer kv, int max_slots);
cudaError_t attention_rows(const float* q, KvLayer kv, const KvRowRef* rows, int B, int max_slots,
                           int n_head, float scale, float* out, float* work, cudaStream_t s);
// --- A decode step's fused layer halves (one token, T = 1). Each block first forms the
// residual step itself (every block the same, in shared memory): x' = x + y' with
// y' = RMSNorm(y)·y_norm (y_norm null: y; y null: x' = x), h = RMSNorm(x')·w; the last
// block to finish (kernels/last_block.cuh, `counter` zero before and after) writes x' to
// x and h to h. Dynamic shared memory 2 C floats: C <= residual_norm_max_width().
struct ResidualArgs {
  float* x = nullptr;             // [C] the residual, updated
  const float* y = nullptr;       // [C] or null
  const float* y_norm = nullptr;  // [C] or null
  const float* w = nullptr;       // [C]
  float* h = nullptr;             // [C] out
  int C = 0;
  float eps = 0.0f;
};
int residual_norm_max_width();
// What follows the q/k/v products before the store: biases (null: none), per-head RMSNorm
// weights [D] of q and k (null: none; eps the residual's), RoPE of H query heads at
// position pos0 (or *pos0_dev), and the stored rows' L2 norms (k_row_norm, v_row_norm: one
// float each, or null).
struct QkvPost {
  const float* bq = nullptr;
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  int H = 0;
  RopeArgs rope;
  int pos0 = 0;
  const int* pos0_dev = nullptr;
  float* k_row_norm = nullptr;
  float* v_row_norm = nullptr;
};
// The residual step, then q, k, v [Hkv*D] = Wq·h, Wk·h, Wv·h (native types, one warp per
// row over every block), then in the last block: QkvPost's biases and norms, RoPE and the
// store of k, v into the cache at the position (as rope_kv_write), the row norms.
cudaError_t norm_qkv_kv_write(ResidualArgs r, QMatrix wq, QMatrix wk, QMatrix wv, QkvPost p,
                              float* q, float* k, float* v, KvLayer kv, unsigned* counter,
                              cudaStream_t s);
// The residual step, then out [C] = Wdown · (act(Wgate·h) ⊙ Wup·h): block b owns the 32
// values F [32b, 32b + 32) of the gate (F a multiple of 32), writes its partial down
// product to partial [F/32][C], and the last block sums the partials in slice order into
// out (which may alias r.y). partial: norm_ffn_work_floats(F, C) device floats.
int64_t norm_ffn_work_floats(int64_t F, int64_t C);
cudaError_t norm_ffn(ResidualArgs r, QMatrix w_gate, QMatrix w_up, QMatrix w_down, GateAct act,
                     float* partial, float* out, unsigned* counter, cudaStream_t s);
// Raises the kernels' dynamic shared memory limits; call once per device.
cudaError_t kernels_init();

// --- Programmatic dependent launch (PDL, sm_90+: kernels/launch.cuh) ---
// While a scope made with on = true lives on the calling thread, every launch carries
// cudaLaunchAttributeProgrammaticStreamSerialization (programmatic_launch() is true);
// scopes nest and restore the previous state. A recorded launch must open its scope
// again when it is replayed or captured (engine/cuda/op_launcher.h does).
namespace detail {
inline thread_local bool t_programmatic_launch = false;
}
class ProgrammaticLaunchScope {
 public:
  explicit ProgrammaticLaunchScope(bool on) : prev_(detail::t_programmatic_launch) {
    detail::t_programmatic_launch = on;
  }
  ~ProgrammaticLaunchScope() { detail::t_programmatic_launch = prev_; }
  ProgrammaticLaunchScope(const ProgrammaticLaunchScope&) = delete;
  ProgrammaticLaunchScope& operator=(const ProgrammaticLaunchScope&) = delete;

 private:
  bool prev_;
};
inline bool programmatic_launch() {
  return detail::t_programmatic_launch;
}
// True when grid_dependency_wait() is the real wait in the code the current device runs:
// that code was compiled for compute_90 or newer (SASS, or PTX the driver compiles). False
// on older devices and when the build's architectures leave compute_90 out: launching with
// the attribute there would race. Always true in the emulator (the wait is recorded).
bool grid_dependency_wait_compiled();
// out[i] = act(gate[i]) * up[i]; out may alias gate.
cudaError_t glu(const float* gate, const float* up, int64_t n, GateAct act, float* out,
                cudaStream_t s);
// x[i] += y[i].
cudaError_t add(float* x, const float* y, int64_t n, cudaStream_t s);
// x[t][i] += b[i] for x [T][n].
cudaError_t add_bias(float* x, const float* b, int T, int64_t n, cudaStream_t s);

// --- Fused decode ops (one launch each where the unfused path takes two to four). ---
// q, k, v [T][n_out of wq / wk / wv] = Wq·x, Wk·x, Wv·x in one grid: the rows of the
// three matrices are numbered one after another, one warp per row. Every matrix must be
// matmul_native and have n_in equal to x's width (checked: cudaErrorInvalidValue).
cudaError_t matmul_qkv(QMatrix wq, QMatrix wk, QMatrix wv, const float* x, int T, float* q,
                       float* k, float* v, cudaStream_t s);
// out [T][F] = act(Wgate·x) * (Wup·x): one warp computes gate row o and up row o and
// writes the product; no gate/up intermediates in memory. Both matrices matmul_native,
// same shape.
cudaError_t matmul_glu(QMatrix w_gate, QMatrix w_up, const float* x, int T,
                               GateAct act, float* out, cudaStream_t s);
// RoPE on q [T][n_head*D] and k [T][Hkv*D] (both in place, exactly as rope()), then the
// rotated k and v [T][Hkv*D] stored into the cache for positions pos0 + t (as kv_write()). When
// pos0_dev is non-null the position of row 0 is read from device memory instead of pos0
// (CUDA graph replay, where the position changes between replays).
cudaError_t rope_kv_write(float* q, float* k, const float* v, int T, int n_head, RopeArgs r,
                          KvLayer kv, int pos0, const int* pos0_dev, cudaStream_t s);
// rope_kv_write for B decode rows of different sequences in one launch: row b of q, k, v
// at position rows[b].query, stored through rows[b]'s block table and slot map (kv: the
// layer's shared fields, paged: kv.block > 0). Bit-identical to rope_kv_write per row.
cudaError_t rope_kv_write_rows(float* q, float* k, const float* v, int B, int n_head, RopeArgs r,
                               KvLayer kv, const KvRowRef* rows, cudaStream_t s);
// x [T][C] += y, then out [T][C] = rmsnorm(x) * w (as add() then rmsnorm(), with the
// same summation order). out must not alias x or y.
cudaError_t add_rmsnorm(float* x, const float* y, const float* w, int T, int C, float eps,
                        float* out, cudaStream_t s);

}  // namespace kvscope::cuda
