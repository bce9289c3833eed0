// model.cpp — loads a model: its description (model_families.cpp) and weight views.
#include "engine/model.h"

#include <atomic>
#include <filesystem>

#include "engine/model_families.h"
#include "engine/quant.h"

namespace kvscope {
namespace {

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
                      "Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)");
  if (n_out == 1 && t->type != GgmlType::F32)
    return make_error("model: ", f.path(), ": vector tensor '", name, "' has type ",
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

  KV_TRY(read_model_config(f, c));
  auto name = f.get_string("general.name");
  c.name = name.ok() ? *name : std::filesystem::path(path).filename().string();

  const TensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb || emb->ne.size() != 2)
    return make_error("model: ", path, ": tensor 'token_embd.weight' is missing or not 2-D");
  if (emb->ne[1] < 1 || emb->ne[1] > (1u << 24))
    return make_error("model: ", path, ": vocabulary size ", emb->ne[1], " is outside [1, 16777216]");
  c.n_vocab = int(emb->ne[1]);

  const int C = c.n_embd, D = c.head_dim, Hkv = c.n_head_kv, F = c.n_ff, V = c.n_vocab,
            A = c.attn_width();
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
    KV_TRY(take(&lw.wq, p + "attn_q.weight", C, A));
    KV_TRY(take(&lw.wk, p + "attn_k.weight", C, Hkv * D));
    KV_TRY(take(&lw.wv, p + "attn_v.weight", C, Hkv * D));
    if (c.qkv_bias) {
      KV_TRY(take(&lw.bq, p + "attn_q.bias", A, 1));
      KV_TRY(take(&lw.bk, p + "attn_k.bias", Hkv * D, 1));
      KV_TRY(take(&lw.bv, p + "attn_v.bias", Hkv * D, 1));
    }
    if (c.qk_norm) {
      KV_TRY(take(&lw.q_norm, p + "attn_q_norm.weight", D, 1));
      KV_TRY(take(&lw.k_norm, p + "attn_k_norm.weight", D, 1));
    }
    KV_TRY(take(&lw.wo, p + "attn_output.weight", A, C));
    if (c.post_attn_norm) KV_TRY(take(&lw.post_attn_norm, p + "post_attention_norm.weight", C, 1));
    KV_TRY(take(&lw.ffn_norm, p + "ffn_norm.weight", C, 1));
    KV_TRY(take(&lw.w_gate, p + "ffn_gate.weight", C, F));
    KV_TRY(take(&lw.w_up, p + "ffn_up.weight", C, F));
    KV_TRY(take(&lw.w_down, p + "ffn_down.weight", F, C));
    if (c.post_ffn_norm) KV_TRY(take(&lw.post_ffn_norm, p + "post_ffw_norm.weight", C, 1));
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
