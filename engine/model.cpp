// model.cpp — reads a llama-architecture model's config and weight views from GGUF.
#include "engine/model.h"

#include <atomic>
#include <filesystem>

#include "engine/printable.h"
#include "engine/quant.h"

namespace kvscope {
namespace {

// Reads an integer hyperparameter and checks it against [lo, hi].
Expected<int> get_dim(const GgufFile& f, const std::string& key, int64_t lo, int64_t hi) {
  auto v = f.get_int(key);
  if (!v.ok()) return v.error();
  if (*v < lo || *v > hi)
    return make_error("model: ", f.path(), ": '", key, "' = ", *v, " is outside the allowed range [",
                      lo, ", ", hi, "]");
  return int(*v);
}

uint64_t next_weight_uid() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

// Finds a tensor and checks its shape {n_in, n_out} (n_out 1 for vectors) and type.
Expected<Weight> get_weight(const GgufFile& f, const std::string& name, int64_t n_in,
                            int64_t n_out) {
  const TensorInfo* t = f.find_tensor(name);
  if (!t) return make_error("model: ", f.path(), ": tensor '", name, "' is missing");
  int64_t got_in = int64_t(t->ne[0]);
  int64_t got_out = t->ne.size() > 1 ? int64_t(t->ne[1]) : 1;
  for (size_t i = 2; i < t->ne.size(); ++i) got_out *= int64_t(t->ne[i]);
  if (got_in != n_in || got_out != n_out)
    return make_error("model: ", f.path(), ": tensor '", name, "' has shape {", got_in, ", ",
                      got_out, "}, expected {", n_in, ", ", n_out, "}");
  if (!type_supported(t->type))
    return make_error("model: ", f.path(), ": tensor '", name, "' has type ",
                      ggml_type_name(t->type),
                      ", which kvscope does not support (supported: F32, F16, BF16, Q8_0, Q4_0, "
                      "Q4_1, Q5_0, Q5_1, Q4_K, Q6_K)");
  if (n_out == 1 && t->type != GgmlType::F32)
    return make_error("model: ", f.path(), ": norm tensor '", name, "' has type ",
                      ggml_type_name(t->type), ", expected F32");
  Weight w;
  w.name = name;
  w.type = t->type;
  w.n_in = n_in;
  w.n_out = n_out;
  w.data = t->data;
  w.row_bytes = row_bytes(t->type, uint64_t(n_in));
  w.uid = next_weight_uid();
  return w;
}

}  // namespace

Expected<std::shared_ptr<Model>> Model::load(const std::string& path) {
  auto file = GgufFile::open(path);
  if (!file.ok()) return file.error();
  std::shared_ptr<Model> m(new Model());
  m->file_ = std::move(file.value());
  const GgufFile& f = *m->file_;
  ModelConfig& c = m->cfg_;

  auto arch = f.get_string("general.architecture");
  if (!arch.ok()) return arch.error();
  c.arch = *arch;
  if (c.arch != "llama")
    return make_error("model: ", printable_name(path), ": architecture '",
                      printable_name(c.arch),
                      "' is not supported (kvscope runs llama-architecture models)");
  auto name = f.get_string("general.name");
  c.name = name.ok() ? *name : std::filesystem::path(path).filename().string();

  const std::string a = c.arch + ".";
  auto dim = [&](const char* key, int64_t lo, int64_t hi, int* out) -> Status {
    auto v = get_dim(f, a + key, lo, hi);
    if (!v.ok()) return v.error();
    *out = *v;
    return Status::Ok();
  };
  KV_TRY(dim("block_count", 1, 1024, &c.n_layer));
  KV_TRY(dim("embedding_length", 1, 65536, &c.n_embd));
  KV_TRY(dim("attention.head_count", 1, 1024, &c.n_head));
  KV_TRY(dim("feed_forward_length", 1, 1 << 20, &c.n_ff));
  KV_TRY(dim("context_length", 1, 1 << 24, &c.n_ctx));
  if (f.find(a + "attention.head_count_kv")) {
    KV_TRY(dim("attention.head_count_kv", 1, c.n_head, &c.n_head_kv));
  } else {
    c.n_head_kv = c.n_head;
  }
  if (c.n_embd % c.n_head != 0)
    return make_error("model: ", path, ": embedding_length ", c.n_embd,
                      " is not a multiple of head_count ", c.n_head);
  if (c.n_head % c.n_head_kv != 0)
    return make_error("model: ", path, ": head_count ", c.n_head,
                      " is not a multiple of head_count_kv ", c.n_head_kv);
  c.head_dim = c.n_embd / c.n_head;
  c.n_rot = c.head_dim;
  if (f.find(a + "rope.dimension_count")) KV_TRY(dim("rope.dimension_count", 2, c.head_dim, &c.n_rot));
  if (c.n_rot % 2 != 0)
    return make_error("model: ", path, ": rope.dimension_count ", c.n_rot, " must be even");
  if (f.find(a + "attention.layer_norm_rms_epsilon")) {
    auto eps = f.get_float(a + "attention.layer_norm_rms_epsilon");
    if (!eps.ok()) return eps.error();
    if (!(*eps > 0 && *eps < 1))
      return make_error("model: ", path, ": layer_norm_rms_epsilon ", *eps, " is outside (0, 1)");
    c.rms_eps = float(*eps);
  }
  if (f.find(a + "rope.freq_base")) {
    auto base = f.get_float(a + "rope.freq_base");
    if (!base.ok()) return base.error();
    if (!(*base > 1 && *base < 1e12))
      return make_error("model: ", path, ": rope.freq_base ", *base, " is outside (1, 1e12)");
    c.rope_base = float(*base);
  }

  const TensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb || emb->ne.size() != 2)
    return make_error("model: ", path, ": tensor 'token_embd.weight' is missing or not 2-D");
  if (emb->ne[1] < 1 || emb->ne[1] > (1u << 24))
    return make_error("model: ", path, ": vocabulary size ", emb->ne[1], " is outside [1, 16777216]");
  c.n_vocab = int(emb->ne[1]);

  const int C = c.n_embd, D = c.head_dim, H = c.n_head, Hkv = c.n_head_kv, F = c.n_ff,
            V = c.n_vocab;
  auto take = [&](Weight* dst, const std::string& tname, int64_t n_in, int64_t n_out) -> Status {
    auto w = get_weight(f, tname, n_in, n_out);
    if (!w.ok()) return w.error();
    *dst = std::move(w.value());
    return Status::Ok();
  };
  KV_TRY(take(&m->tok_embd_, "token_embd.weight", C, V));
  KV_TRY(take(&m->output_norm_, "output_norm.weight", C, 1));
  if (f.find_tensor("output.weight")) {
    KV_TRY(take(&m->output_, "output.weight", C, V));
  } else {
    m->output_ = m->tok_embd_;
    c.tied_output = true;
  }
  m->layers_.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& lw = m->layers_[size_t(l)];
    KV_TRY(take(&lw.attn_norm, p + "attn_norm.weight", C, 1));
    KV_TRY(take(&lw.wq, p + "attn_q.weight", C, H * D));
    KV_TRY(take(&lw.wk, p + "attn_k.weight", C, Hkv * D));
    KV_TRY(take(&lw.wv, p + "attn_v.weight", C, Hkv * D));
    KV_TRY(take(&lw.wo, p + "attn_output.weight", H * D, C));
    KV_TRY(take(&lw.ffn_norm, p + "ffn_norm.weight", C, 1));
    KV_TRY(take(&lw.w_gate, p + "ffn_gate.weight", C, F));
    KV_TRY(take(&lw.w_up, p + "ffn_up.weight", C, F));
    KV_TRY(take(&lw.w_down, p + "ffn_down.weight", F, C));
  }

  auto tok = Tokenizer::from_gguf(f);
  if (!tok.ok()) return tok.error();
  m->tok_ = std::move(tok.value());
  if (m->tok_->n_vocab() != V)
    return make_error("model: ", path, ": tokenizer has ", m->tok_->n_vocab(),
                      " tokens but token_embd has ", V, " rows");
  return m;
}

uint64_t Model::block_macs_per_token() const {
  uint64_t macs = 0;
  for (const LayerWeights& lw : layers_)
    for (const Weight* w : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down})
      macs += uint64_t(w->n_in) * uint64_t(w->n_out);
  return macs;
}

uint64_t Model::weight_bytes() const {
  uint64_t b = 0;
  for (const TensorInfo& t : file_->tensors()) b += t.nbytes;
  return b;
}

}  // namespace kvscope
