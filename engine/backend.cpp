// backend.cpp — the Backend ops' argument checks (one wording per kind of error, the
// same on every backend) and the unfused compositions of the fused ops.
#include "engine/backend.h"

#include <string>
#include <string_view>

#include "engine/gguf.h"

namespace kvscope {
namespace {

// Checks the arguments of one op call in order and keeps the first failure; later
// checks are skipped (they may index what an earlier one found out of range). Messages:
//   "<op>: <arg> is <value>, expected <what> = <n>"   (or "expected <n>" without a what)
//   "<op>: <arg> is <value>, expected >= <what> = <n>"
//   "<op>: <arg> is <value>, expected [<lo>, <hi>)"
//   "<op>: <arg> is <value>, expected a multiple of <what> = <n>"
//   "<op>: <arg> is <value>, expected an even number"
//   "<op>: <arg> is null, expected a pointer"
//   "<op>: <arg> is <type>, expected f32"
//   "<op>: position <p> of layer <l> is not in the cache, expected begin() to have made
//    room for it"
// An argument's name as a tensor or weight name and a field ("x", ".cols"): joined only
// when a message is built, so that a call that passes its checks allocates nothing.
struct Arg {
  std::string_view base, field;
  Arg(const char* b) : base(b) {}  // NOLINT: names are written as literals
  Arg(std::string_view b, std::string_view f = {}) : base(b), field(f) {}
  std::string str() const { return std::string(base) + std::string(field); }
  bool empty() const { return base.empty() && field.empty(); }
};

class Check {
 public:
  explicit Check(const char* op) : op_(op) {}

  Check& eq(Arg arg, int64_t v, Arg what, int64_t expected) {
    if (ok() && v != expected) {
      if (what.empty())
        fail(arg.str(), " is ", v, ", expected ", expected);
      else
        fail(arg.str(), " is ", v, ", expected ", what.str(), " = ", expected);
    }
    return *this;
  }
  Check& at_least(Arg arg, int64_t v, Arg what, int64_t min) {
    if (ok() && v < min) {
      if (what.empty())
        fail(arg.str(), " is ", v, ", expected >= ", min);
      else
        fail(arg.str(), " is ", v, ", expected >= ", what.str(), " = ", min);
    }
    return *this;
  }
  Check& in_range(Arg arg, int64_t v, int64_t lo, int64_t hi) {
    if (ok() && (v < lo || v >= hi))
      fail(arg.str(), " is ", v, ", expected [", lo, ", ", hi, ")");
    return *this;
  }
  Check& multiple_of(Arg arg, int64_t v, Arg what, int64_t m) {
    if (ok() && (m <= 0 || v % m != 0))
      fail(arg.str(), " is ", v, ", expected a multiple of ", what.str(), " = ", m);
    return *this;
  }
  Check& even(Arg arg, int64_t v) {
    if (ok() && v % 2 != 0) fail(arg.str(), " is ", v, ", expected an even number");
    return *this;
  }
  // p (of arg) is not the buffer of `other`.
  Check& apart(Arg arg, const void* p, Arg other, const void* q) {
    if (ok() && p != nullptr && p == q)
      fail(arg.str(), " is ", other.str(), ", expected a separate buffer");
    return *this;
  }
  Check& not_null(Arg arg, const void* p) {
    if (ok() && p == nullptr) fail(arg.str(), " is null, expected a pointer");
    return *this;
  }
  // A tensor with data: at least one row, a positive width, a pointer.
  Check& tensor(std::string_view name, const Tensor& t) {
    at_least({name, ".rows"}, t.rows, "", 1);
    at_least({name, ".cols"}, t.cols, "", 1);
    return not_null({name, ".data"}, t.data);
  }
  Check& same_shape(std::string_view name, const Tensor& t, std::string_view ref_name,
                    const Tensor& ref) {
    eq({name, ".rows"}, t.rows, {ref_name, ".rows"}, ref.rows);
    eq({name, ".cols"}, t.cols, {ref_name, ".cols"}, ref.cols);
    return not_null({name, ".data"}, t.data);
  }
  // A norm or bias weight: an f32 vector of n values.
  Check& vector(std::string_view name, const Weight& w, Arg n_name, int64_t n) {
    eq({name, ".n_in"}, w.n_in, n_name, n);
    eq({name, ".n_out"}, w.n_out, "", 1);
    if (ok() && w.type != GgmlType::F32)
      fail(name, ".type is ", ggml_type_name(w.type), ", expected f32");
    return not_null({name, ".data"}, w.data);
  }
  // w [n_out][n_in] times x [T][n_in] into out [T][n_out].
  Check& product(std::string_view w_name, const Weight& w, std::string_view x_name,
                 const Tensor& x, std::string_view out_name, const Tensor& out) {
    tensor(x_name, x);
    eq({x_name, ".cols"}, x.cols, {w_name, ".n_in"}, w.n_in);
    eq({out_name, ".rows"}, out.rows, {x_name, ".rows"}, x.rows);
    eq({out_name, ".cols"}, out.cols, {w_name, ".n_out"}, w.n_out);
    not_null({out_name, ".data"}, out.data);
    return not_null({w_name, ".data"}, w.data);
  }
  Check& layer(const KvCache& c, int layer) {
    return in_range("layer", layer, 0, c.shape().n_layer);
  }
  // Positions pos0 .. pos0+T-1 of `layer` are held by the cache (begin() made room).
  Check& held(const KvCache& c, int layer, int pos0, int64_t T) {
    if (!ok()) return *this;
    for (int p = pos0; p < pos0 + T; ++p) {
      const int s = c.slot_of(layer, p);
      if (s < 0 || s >= c.n_slots(layer) || c.slot_pos(layer)[size_t(s)] != p) {
        fail("position ", p, " of layer ", layer,
             " is not in the cache, expected begin() to have made room for it");
        break;
      }
    }
    return *this;
  }
  Check& rope(const RopeSpec& r, int head_dim) {
    in_range("rope.n_rot", r.n_rot, 0, int64_t(head_dim) + 1);
    return even("rope.n_rot", r.n_rot);
  }

  bool ok() const { return status_.ok(); }
  Status status() const { return status_; }

 private:
  template <class... A>
  void fail(const A&... parts) {
    status_ = make_error(op_, ": ", parts...);
  }

  const char* op_;
  Status status_ = Status::Ok();
};

// k, v [T][Hkv*D] of a cache's shape.
void check_kv_rows(Check& c, const KvCache& cache, const Tensor& k, const Tensor& v) {
  const KvShape& s = cache.shape();
  c.tensor("k", k)
      .eq("k.cols", k.cols, "n_head_kv * head_dim", int64_t(s.n_head_kv) * s.head_dim)
      .same_shape("v", v, "k", k);
}

}  // namespace

Expected<Tensor> Backend::scratch(int slot, int64_t rows, int64_t cols) {
  Check c("scratch");
  c.in_range("slot", slot, 0, kMaxScratchSlot + 1).at_least("rows", rows, "", 0).at_least(
      "cols", cols, "", 0);
  if (!c.ok()) return c.status().error();
  return do_scratch(slot, rows, cols);
}

Expected<std::shared_ptr<KvPool>> Backend::create_kv_pool(const KvPoolConfig&) {
  return make_error("paged KV cache: the ", kind(), " backend has no block pool yet (use the cpu backend)");
}

Expected<std::unique_ptr<KvCache>> Backend::create_paged_kv_cache(const KvCacheConfig&,
                                                                  std::shared_ptr<KvPool>) {
  return make_error("paged KV cache: the ", kind(), " backend has no block pool yet (use the cpu backend)");
}

Expected<std::unique_ptr<KvCache>> Backend::create_kv_cache(const KvCacheConfig& config,
                                                            int capacity) {
  Check c("create_kv_cache");
  c.at_least("capacity", capacity, "", 0)
      .at_least("config.shape.n_layer", config.shape.n_layer, "", 1)
      .at_least("config.shape.n_head_kv", config.shape.n_head_kv, "", 1)
      .at_least("config.shape.head_dim", config.shape.head_dim, "", 1)
      .eq("config.layers.size()", int64_t(config.layers.size()), "config.shape.n_layer",
          config.shape.n_layer);
  if (!c.ok()) return c.status().error();
  return do_create_kv_cache(config, capacity);
}

Status Backend::embed(const Weight& tok_embd, const int32_t* ids, float scale, Tensor out) {
  Check c("embed");
  c.tensor("out", out)
      .eq("out.cols", out.cols, "tok_embd.n_in", tok_embd.n_in)
      .not_null("tok_embd.data", tok_embd.data)
      .not_null("ids", ids);
  for (int64_t t = 0; c.ok() && t < out.rows; ++t)
    if (ids[t] < 0 || ids[t] >= tok_embd.n_out) {
      const std::string arg = "ids[" + std::to_string(t) + "]";
      c.in_range(std::string_view(arg), ids[t], 0, tok_embd.n_out);
    }
  KV_TRY(c.status());
  return do_embed(tok_embd, ids, scale, out);
}

Status Backend::rmsnorm(Tensor x, const Weight& w, float eps, Tensor out) {
  Check c("rmsnorm");
  c.tensor("x", x).vector("w", w, "x.cols", x.cols).same_shape("out", out, "x", x);
  KV_TRY(c.status());
  return do_rmsnorm(x, w, eps, out);
}

Status Backend::matmul(const Weight& w, Tensor x, Tensor out) {
  Check c("matmul");
  c.product("w", w, "x", x, "out", out);
  KV_TRY(c.status());
  return do_matmul(w, x, out);
}

Status Backend::add_bias(Tensor x, const Weight& b) {
  Check c("add_bias");
  c.tensor("x", x).vector("b", b, "x.cols", x.cols);
  KV_TRY(c.status());
  return do_add_bias(x, b);
}

Status Backend::rope(Tensor x, int n_heads, int head_dim, const RopeSpec& r, int pos0) {
  Check c("rope");
  c.tensor("x", x)
      .at_least("n_heads", n_heads, "", 1)
      .at_least("head_dim", head_dim, "", 1)
      .eq("x.cols", x.cols, "n_heads * head_dim", int64_t(n_heads) * head_dim)
      .rope(r, head_dim);  // any pos0: negative positions rotate backwards
  KV_TRY(c.status());
  return do_rope(x, n_heads, head_dim, r, pos0);
}

Status Backend::kv_write(KvCache& cache, int layer, Tensor k, Tensor v, int pos0) {
  Check c("kv_write");
  c.layer(cache, layer);
  check_kv_rows(c, cache, k, v);
  c.at_least("pos0", pos0, "", 0).held(cache, layer, pos0, k.rows);
  KV_TRY(c.status());
  return do_kv_write(cache, layer, k, v, pos0);
}

Status Backend::attention(Tensor q, const KvCache& cache, int layer, int pos0, int n_head,
                          float scale, Tensor out, Tensor probs_last) {
  Check c("attention");
  const KvShape& s = cache.shape();
  c.layer(cache, layer)
      .at_least("n_head", n_head, "", 1)
      .multiple_of("n_head", n_head, "n_head_kv", s.n_head_kv)
      .tensor("q", q)
      .eq("q.cols", q.cols, "n_head * head_dim", int64_t(n_head) * s.head_dim)
      .same_shape("out", out, "q", q)
      .at_least("pos0", pos0, "", 0);
  if (probs_last.data)
    c.at_least("probs_last.rows", probs_last.rows, "n_head", n_head)
        .at_least("probs_last.cols", probs_last.cols, "pos0 + q.rows", pos0 + q.rows);
  c.held(cache, layer, pos0, q.rows);
  KV_TRY(c.status());
  return do_attention(q, cache, layer, pos0, n_head, scale, out, probs_last);
}

Status Backend::glu(Tensor gate, Tensor up, FfnAct act, Tensor out) {
  Check c("glu");
  c.tensor("gate", gate).same_shape("up", up, "gate", gate).same_shape("out", out, "gate", gate);
  KV_TRY(c.status());
  return do_glu(gate, up, act, out);
}

Status Backend::add(Tensor x, Tensor y) {
  Check c("add");
  c.tensor("x", x).same_shape("y", y, "x", x);
  KV_TRY(c.status());
  return do_add(x, y);
}

Status Backend::kv_row_norms(const KvCache& cache, int layer, int pos0, int T, Tensor k_norm,
                             Tensor v_norm) {
  Check c("kv_row_norms");
  c.layer(cache, layer)
      .at_least("T", T, "", 1)
      .at_least("pos0", pos0, "", 0)
      .at_least("k_norm.cols", k_norm.cols, "T", T)
      .not_null("k_norm.data", k_norm.data)
      .at_least("v_norm.cols", v_norm.cols, "T", T)
      .not_null("v_norm.data", v_norm.data)
      .held(cache, layer, pos0, T);
  KV_TRY(c.status());
  return do_kv_row_norms(cache, layer, pos0, T, k_norm, v_norm);
}

Status Backend::kv_row_errors(const KvCache& cache, int layer, int pos0, Tensor k, Tensor v,
                              Tensor k_err, Tensor v_err) {
  if (!can_measure_kv_errors())
    return make_error("kv_row_errors: measuring the cache's quantization error is not "
                      "available on ",
                      name());
  Check c("kv_row_errors");
  c.layer(cache, layer);
  check_kv_rows(c, cache, k, v);
  c.at_least("pos0", pos0, "", 0)
      .at_least("k_err.cols", k_err.cols, "k.rows", k.rows)
      .not_null("k_err.data", k_err.data)
      .at_least("v_err.cols", v_err.cols, "k.rows", k.rows)
      .not_null("v_err.data", v_err.data)
      .held(cache, layer, pos0, k.rows);
  KV_TRY(c.status());
  return do_kv_row_errors(cache, layer, pos0, k, v, k_err, v_err);
}

Status Backend::download(Tensor src, float* host) {
  Check c("download");
  c.at_least("src.rows", src.rows, "", 0).at_least("src.cols", src.cols, "", 0);
  if (src.size() > 0) c.not_null("src.data", src.data).not_null("host", host);
  KV_TRY(c.status());
  return do_download(src, host);
}

Status Backend::kv_rerotate(KvCache& cache, int layer, const RopeSpec& r, int first, int delta) {
  Check c("kv_rerotate");
  c.layer(cache, layer).rope(r, cache.shape().head_dim);
  KV_TRY(c.status());
  return do_kv_rerotate(cache, layer, r, first, delta);
}

Status Backend::matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, Tensor x,
                           Tensor q, Tensor k, Tensor v) {
  Check c("matmul_qkv");
  c.product("wq", wq, "x", x, "q", q).product("wk", wk, "x", x, "k", k).product("wv", wv, "x", x,
                                                                                 "v", v);
  KV_TRY(c.status());
  return do_matmul_qkv(wq, wk, wv, x, q, k, v);
}

Status Backend::matmul_glu(const Weight& w_gate, const Weight& w_up, Tensor x, FfnAct act,
                           Tensor out, Tensor up) {
  Check c("matmul_glu");
  c.product("w_gate", w_gate, "x", x, "out", out)
      .eq("w_up.n_in", w_up.n_in, "w_gate.n_in", w_gate.n_in)
      .eq("w_up.n_out", w_up.n_out, "w_gate.n_out", w_gate.n_out)
      .not_null("w_up.data", w_up.data)
      .same_shape("up", up, "out", out);
  KV_TRY(c.status());
  return do_matmul_glu(w_gate, w_up, x, act, out, up);
}

Status Backend::rope_kv_write(Tensor q, Tensor k, Tensor v, KvCache& cache, int layer,
                              int n_head, const RopeSpec& r, int pos0) {
  Check c("rope_kv_write");
  const KvShape& s = cache.shape();
  c.layer(cache, layer)
      .at_least("n_head", n_head, "", 1)
      .tensor("q", q)
      .eq("q.cols", q.cols, "n_head * head_dim", int64_t(n_head) * s.head_dim);
  check_kv_rows(c, cache, k, v);
  c.eq("k.rows", k.rows, "q.rows", q.rows)
      .rope(r, s.head_dim)
      .at_least("pos0", pos0, "", 0)
      .held(cache, layer, pos0, q.rows);
  KV_TRY(c.status());
  return do_rope_kv_write(q, k, v, cache, layer, n_head, r, pos0);
}

Status Backend::add_rmsnorm(Tensor x, Tensor y, const Weight& w, float eps, Tensor out) {
  Check c("add_rmsnorm");
  c.tensor("x", x)
      .same_shape("y", y, "x", x)
      .vector("w", w, "x.cols", x.cols)
      .same_shape("out", out, "x", x);
  KV_TRY(c.status());
  return do_add_rmsnorm(x, y, w, eps, out);
}

namespace {

void check_residual(Check& c, const ResidualNorm& rn) {
  c.tensor("rn.x", rn.x).not_null("rn.w", rn.w);
  if (!c.ok()) return;
  c.vector("rn.w", *rn.w, "rn.x.cols", rn.x.cols);
  if (rn.y.data) c.same_shape("rn.y", rn.y, "rn.x", rn.x);
  if (rn.y_norm) c.vector("rn.y_norm", *rn.y_norm, "rn.x.cols", rn.x.cols);
  c.same_shape("rn.h", rn.h, "rn.x", rn.x)
      .apart("rn.h.data", rn.h.data, "rn.x.data", rn.x.data)
      .apart("rn.h.data", rn.h.data, "rn.y.data", rn.y.data);
}

}  // namespace

Status Backend::norm_qkv_kv_write(const ResidualNorm& rn, const QkvStore& a) {
  Check c("norm_qkv_kv_write");
  check_residual(c, rn);
  c.not_null("a.wq", a.wq).not_null("a.wk", a.wk).not_null("a.wv", a.wv).not_null("a.cache",
                                                                                a.cache);
  KV_TRY(c.status());
  const KvCache& cache = *a.cache;
  const KvShape& s = cache.shape();
  c.product("a.wq", *a.wq, "rn.h", rn.h, "a.q", a.q)
      .product("a.wk", *a.wk, "rn.h", rn.h, "a.k", a.k)
      .product("a.wv", *a.wv, "rn.h", rn.h, "a.v", a.v)
      .layer(cache, a.layer)
      .at_least("a.n_head", a.n_head, "", 1)
      .eq("a.q.cols", a.q.cols, "a.n_head * head_dim", int64_t(a.n_head) * s.head_dim);
  check_kv_rows(c, cache, a.k, a.v);
  if (a.bq || a.bk || a.bv) {
    c.not_null("a.bq", a.bq).not_null("a.bk", a.bk).not_null("a.bv", a.bv);
    if (c.ok())
      c.vector("a.bq", *a.bq, "a.q.cols", a.q.cols)
          .vector("a.bk", *a.bk, "a.k.cols", a.k.cols)
          .vector("a.bv", *a.bv, "a.v.cols", a.v.cols);
  }
  if (a.q_norm || a.k_norm) {
    c.not_null("a.q_norm", a.q_norm).not_null("a.k_norm", a.k_norm);
    if (c.ok())
      c.vector("a.q_norm", *a.q_norm, "head_dim", s.head_dim)
          .vector("a.k_norm", *a.k_norm, "head_dim", s.head_dim);
  }
  if (a.k_row_norm.data || a.v_row_norm.data)
    c.at_least("a.k_row_norm.cols", a.k_row_norm.cols, "rn.x.rows", rn.x.rows)
        .not_null("a.k_row_norm.data", a.k_row_norm.data)
        .at_least("a.v_row_norm.cols", a.v_row_norm.cols, "rn.x.rows", rn.x.rows)
        .not_null("a.v_row_norm.data", a.v_row_norm.data);
  c.rope(a.rope, s.head_dim).at_least("a.pos0", a.pos0, "", 0).held(cache, a.layer, a.pos0,
                                                                     rn.x.rows);
  KV_TRY(c.status());
  return do_norm_qkv_kv_write(rn, a);
}

Status Backend::norm_ffn(const ResidualNorm& rn, const FfnWeights& w, Tensor gate, Tensor up,
                         Tensor out) {
  Check c("norm_ffn");
  check_residual(c, rn);
  c.not_null("w.gate", w.gate).not_null("w.up", w.up).not_null("w.down", w.down);
  KV_TRY(c.status());
  c.product("w.gate", *w.gate, "rn.h", rn.h, "gate", gate)
      .eq("w.up.n_in", w.up->n_in, "w.gate.n_in", w.gate->n_in)
      .eq("w.up.n_out", w.up->n_out, "w.gate.n_out", w.gate->n_out)
      .not_null("w.up.data", w.up->data)
      .same_shape("up", up, "gate", gate)
      .product("w.down", *w.down, "gate", gate, "out", out)
      .eq("out.cols", out.cols, "rn.x.cols", rn.x.cols);
  KV_TRY(c.status());
  return do_norm_ffn(rn, w, gate, up, out);
}

namespace {

// Whether `layer` of `c` holds position p (what Check::held verifies).
bool holds(const KvCache& c, int layer, int p) {
  const int s = c.slot_of(layer, p);
  return s >= 0 && s < c.n_slots(layer) && c.slot_pos(layer)[size_t(s)] == p;
}

// The rows of a rows op: B = q.rows non-null, distinct caches of one shape, each row's
// position held in `layer`. A row's argument names are built only for a row that fails
// (a passing call allocates nothing).
void check_rows(Check& c, const DecodeRows& rows, int layer, int64_t q_rows) {
  c.at_least("rows.n", rows.n, "", 1)
      .eq("rows.n", rows.n, "q.rows", q_rows)
      .not_null("rows.caches", rows.caches)
      .not_null("rows.pos", rows.pos);
  if (!c.ok()) return;
  const KvShape s0 = rows.caches[0] ? rows.caches[0]->shape() : KvShape{};
  for (int b = 0; b < rows.n && c.ok(); ++b) {
    const KvCache* cache = rows.caches[b];
    const int p = rows.pos[b];
    int dup = -1;
    for (int j = 0; j < b && dup < 0; ++j)
      if (rows.caches[j] == cache) dup = j;
    if (cache && cache->shape().n_layer == s0.n_layer && cache->shape().n_head_kv == s0.n_head_kv &&
        cache->shape().head_dim == s0.head_dim && layer >= 0 && layer < s0.n_layer && p >= 0 &&
        holds(*cache, layer, p) && dup < 0)
      continue;
    const std::string cb = "rows.caches[" + std::to_string(b) + "]";
    const std::string pb = "rows.pos[" + std::to_string(b) + "]";
    c.not_null(std::string_view(cb), cache);
    if (!c.ok()) break;
    c.eq({cb, "->shape().n_layer"}, cache->shape().n_layer, "rows.caches[0]->shape().n_layer",
         s0.n_layer)
        .eq({cb, "->shape().n_head_kv"}, cache->shape().n_head_kv,
            "rows.caches[0]->shape().n_head_kv", s0.n_head_kv)
        .eq({cb, "->shape().head_dim"}, cache->shape().head_dim, "rows.caches[0]->shape().head_dim",
            s0.head_dim)
        .layer(*cache, layer)
        .at_least(std::string_view(pb), p, "", 0)
        .held(*cache, layer, p, 1);
    if (dup >= 0) c.eq(std::string_view(cb), b, "the row of the same cache", dup);
  }
}

}  // namespace

Status Backend::rope_kv_write_rows(Tensor q, Tensor k, Tensor v, const DecodeRows& rows, int layer,
                                   int n_head, const RopeSpec& r) {
  Check c("rope_kv_write_rows");
  c.tensor("q", q);
  check_rows(c, rows, layer, q.rows);
  if (!c.ok()) return c.status();
  const KvCache& c0 = *rows.caches[0];
  const KvShape& s = c0.shape();
  c.at_least("n_head", n_head, "", 1)
      .eq("q.cols", q.cols, "n_head * head_dim", int64_t(n_head) * s.head_dim);
  check_kv_rows(c, c0, k, v);
  c.eq("k.rows", k.rows, "q.rows", q.rows).rope(r, s.head_dim);
  KV_TRY(c.status());
  return do_rope_kv_write_rows(q, k, v, rows, layer, n_head, r);
}

Status Backend::attention_rows(Tensor q, const DecodeRows& rows, int layer, int n_head, float scale,
                               Tensor out) {
  Check c("attention_rows");
  c.tensor("q", q);
  check_rows(c, rows, layer, q.rows);
  if (!c.ok()) return c.status();
  const KvShape& s = rows.caches[0]->shape();
  c.at_least("n_head", n_head, "", 1)
      .multiple_of("n_head", n_head, "n_head_kv", s.n_head_kv)
      .eq("q.cols", q.cols, "n_head * head_dim", int64_t(n_head) * s.head_dim)
      .same_shape("out", out, "q", q);
  KV_TRY(c.status());
  return do_attention_rows(q, rows, layer, n_head, scale, out);
}

Status Backend::do_rope_kv_write_rows(Tensor q, Tensor k, Tensor v, const DecodeRows& rows,
                                      int layer, int n_head, const RopeSpec& r) {
  for (int b = 0; b < rows.n; ++b)
    KV_TRY(rope_kv_write(q.row(b), k.row(b), v.row(b), *rows.caches[b], layer, n_head, r,
                         rows.pos[b]));
  return Status::Ok();
}

Status Backend::do_attention_rows(Tensor q, const DecodeRows& rows, int layer, int n_head,
                                  float scale, Tensor out) {
  for (int b = 0; b < rows.n; ++b)
    KV_TRY(attention(q.row(b), *rows.caches[b], layer, rows.pos[b], n_head, scale, out.row(b),
                     Tensor{}));
  return Status::Ok();
}

Status Backend::unfused_matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv,
                                   Tensor x, Tensor q, Tensor k, Tensor v) {
  KV_TRY(matmul(wq, x, q));
  KV_TRY(matmul(wk, x, k));
  return matmul(wv, x, v);
}

Status Backend::unfused_matmul_glu(const Weight& w_gate, const Weight& w_up, Tensor x,
                                   FfnAct act, Tensor out, Tensor up) {
  KV_TRY(matmul(w_gate, x, out));
  KV_TRY(matmul(w_up, x, up));
  return glu(out, up, act, out);
}

Status Backend::unfused_rope_kv_write(Tensor q, Tensor k, Tensor v, KvCache& cache, int layer,
                                      int n_head, const RopeSpec& r, int pos0) {
  const int D = cache.shape().head_dim;
  KV_TRY(rope(q, n_head, D, r, pos0));
  KV_TRY(rope(k, cache.shape().n_head_kv, D, r, pos0));
  return kv_write(cache, layer, k, v, pos0);
}

Status Backend::unfused_add_rmsnorm(Tensor x, Tensor y, const Weight& w, float eps, Tensor out) {
  KV_TRY(add(x, y));
  return rmsnorm(x, w, eps, out);
}

Status Backend::residual_norm(const ResidualNorm& rn) {
  if (!rn.y.data) return rmsnorm(rn.x, *rn.w, rn.eps, rn.h);
  if (rn.y_norm) KV_TRY(rmsnorm(rn.y, *rn.y_norm, rn.eps, rn.y));
  return add_rmsnorm(rn.x, rn.y, *rn.w, rn.eps, rn.h);
}

Status Backend::norm_qkv(const ResidualNorm& rn, const QkvStore& a) {
  KV_TRY(residual_norm(rn));
  KV_TRY(matmul_qkv(*a.wq, *a.wk, *a.wv, rn.h, a.q, a.k, a.v));
  if (a.bq) {
    KV_TRY(add_bias(a.q, *a.bq));
    KV_TRY(add_bias(a.k, *a.bk));
    KV_TRY(add_bias(a.v, *a.bv));
  }
  if (!a.q_norm) return Status::Ok();
  if (a.n_head <= 0 || a.q.cols % a.n_head != 0)
    return make_error("norm_qkv: q has ", a.q.cols, " columns, not a multiple of ", a.n_head,
                      " heads");
  const int64_t T = rn.x.rows, D = a.q.cols / a.n_head;
  if (a.k.cols % D != 0)
    return make_error("norm_qkv: k has ", a.k.cols, " columns, not a multiple of head_dim ", D);
  // each head's D values, viewed as rows of [T*heads][D]
  const Tensor qh{a.q.data, T * a.n_head, D}, kh{a.k.data, T * (a.k.cols / D), D};
  KV_TRY(rmsnorm(qh, *a.q_norm, rn.eps, qh));
  return rmsnorm(kh, *a.k_norm, rn.eps, kh);
}

Status Backend::unfused_norm_qkv_kv_write(const ResidualNorm& rn, const QkvStore& a) {
  KV_TRY(norm_qkv(rn, a));
  KV_TRY(rope_kv_write(a.q, a.k, a.v, *a.cache, a.layer, a.n_head, a.rope, a.pos0));
  if (!a.k_row_norm.data) return Status::Ok();
  return kv_row_norms(*a.cache, a.layer, a.pos0, int(rn.x.rows), a.k_row_norm, a.v_row_norm);
}

Status Backend::unfused_norm_ffn(const ResidualNorm& rn, const FfnWeights& w, Tensor gate,
                                 Tensor up, Tensor out) {
  KV_TRY(residual_norm(rn));
  KV_TRY(matmul_glu(*w.gate, *w.up, rn.h, w.act, gate, up));
  return matmul(*w.down, gate, out);
}

}  // namespace kvscope

namespace kvscope {

Status Backend::sample_candidates(Tensor, int, float, DeviceCandidates&) {
  return make_error("sample_candidates: the ", kind(), " backend does not sample on the device");
}

Status Backend::sample_candidates_rows(Tensor, int, float, std::vector<DeviceCandidates>&) {
  return make_error("sample_candidates_rows: the ", kind(),
                    " backend does not sample on the device");
}

Status Backend::sampled_row(float*) {
  return make_error("sampled_row: the ", kind(), " backend does not sample on the device");
}

}  // namespace kvscope
