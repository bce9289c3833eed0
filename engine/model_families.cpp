// model_families.cpp — llama, gemma3 and qwen2 read into one ModelConfig (see
// model_families.h). A family is a row of choices plus, for gemma3, its window layout;
// nothing here runs the model.
#include "engine/model_families.h"

#include <cmath>

#include "engine/printable.h"

namespace kvscope {
namespace {

struct Family {
  const char* arch;
  RopeStyle rope;
  FfnAct act;
  bool embd_scale_sqrt;  // x = embedding * sqrt(C)
  bool qkv_bias, qk_norm, post_norms;
  bool windows;            // has sliding-window layers (attention.sliding_window)
  int default_swa_period;  // without a pattern key: layer l is local unless (l+1) % period == 0
  float default_base_swa;  // RoPE base of local layers without rope.freq_base_swa
};

constexpr Family kFamilies[] = {
    {"llama", RopeStyle::Adjacent, FfnAct::Silu, false, false, false, false, false, 0, 0.0f},
    {"gemma3", RopeStyle::NeoX, FfnAct::GeluTanh, true, false, true, true, true, 6, 10000.0f},
    {"qwen2", RopeStyle::NeoX, FfnAct::Silu, false, true, false, false, false, 0, 0.0f},
};

// Reads an integer hyperparameter and checks it against [lo, hi].
Expected<int> get_dim(const GgufFile& f, const std::string& key, int64_t lo, int64_t hi) {
  auto v = f.get_int(key);
  if (!v.ok()) return v.error();
  if (*v < lo || *v > hi)
    return make_error("model: ", f.path(), ": '", key, "' = ", *v,
                      " is outside the allowed range [", lo, ", ", hi, "]");
  return int(*v);
}

// Reads an optional float in (lo, hi); `out` keeps its value when the key is absent.
Status get_real(const GgufFile& f, const std::string& key, double lo, double hi, float* out) {
  if (!f.find(key)) return Status::Ok();
  auto v = f.get_float(key);
  if (!v.ok()) return v.error();
  if (!(*v > lo && *v < hi))
    return make_error("model: ", f.path(), ": '", key, "' = ", *v, " is outside (", lo, ", ", hi,
                      ")");
  *out = float(*v);
  return Status::Ok();
}

// Which layers of a windowed family are local: <arch>.attention.sliding_window_pattern as
// one bool per layer (true: local) or a period P (every P-th layer global), else the
// family's default period.
Expected<std::vector<bool>> local_layers(const GgufFile& f, const Family& fam, int n_layer) {
  const std::string key = std::string(fam.arch) + ".attention.sliding_window_pattern";
  std::vector<bool> local(static_cast<size_t>(n_layer), false);
  int period = fam.default_swa_period;
  if (const GgufValue* v = f.find(key)) {
    if (v->type == GgufType::ARRAY) {
      auto a = f.get_int_array(key);
      if (!a.ok()) return a.error();
      if (int64_t(a->size()) != n_layer)
        return make_error("model: ", f.path(), ": '", key, "' has ", a->size(), " entries for ",
                          n_layer, " layers");
      for (int l = 0; l < n_layer; ++l) local[size_t(l)] = (*a)[size_t(l)] != 0;
      return local;
    }
    auto p = get_dim(f, key, 1, n_layer + 1);
    if (!p.ok()) return p.error();
    period = *p;
  }
  for (int l = 0; l < n_layer; ++l) local[size_t(l)] = (l + 1) % period != 0;
  return local;
}

}  // namespace

const char* supported_architectures() {
  return "llama, gemma3 and qwen2";
}

const char* rope_style_name(RopeStyle s) {
  return s == RopeStyle::NeoX ? "neox" : "adjacent";
}
const char* ffn_act_name(FfnAct a) {
  return a == FfnAct::GeluTanh ? "gelu_tanh" : "silu";
}

Status read_model_config(const GgufFile& f, ModelConfig& c) {
  const std::string& path = f.path();
  auto arch = f.get_string("general.architecture");
  if (!arch.ok()) return arch.error();
  const Family* fam = nullptr;
  for (const Family& x : kFamilies)
    if (*arch == x.arch) fam = &x;
  if (!fam)
    return make_error("model: ", printable_name(path), ": architecture '", printable_name(*arch),
                      "' is not supported (kvscope runs ", supported_architectures(), " models)");
  c.arch = *arch;
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
  c.n_head_kv = c.n_head;
  if (f.find(a + "attention.head_count_kv"))
    KV_TRY(dim("attention.head_count_kv", 1, c.n_head, &c.n_head_kv));
  if (c.n_head % c.n_head_kv != 0)
    return make_error("model: ", path, ": head_count ", c.n_head,
                      " is not a multiple of head_count_kv ", c.n_head_kv);
  // Head dim: attention.key_length when given (gemma3: 256 with C = 640), else C / H.
  if (f.find(a + "attention.key_length")) {
    KV_TRY(dim("attention.key_length", 1, 4096, &c.head_dim));
    if (f.find(a + "attention.value_length")) {
      int vl = 0;
      KV_TRY(dim("attention.value_length", 1, 4096, &vl));
      if (vl != c.head_dim)
        return make_error("model: ", path, ": attention.value_length ", vl,
                          " differs from attention.key_length ", c.head_dim,
                          " (kvscope needs K and V rows of the same length)");
    }
  } else {
    if (c.n_embd % c.n_head != 0)
      return make_error("model: ", path, ": embedding_length ", c.n_embd,
                        " is not a multiple of head_count ", c.n_head);
    c.head_dim = c.n_embd / c.n_head;
  }
  c.n_rot = c.head_dim;
  if (f.find(a + "rope.dimension_count"))
    KV_TRY(dim("rope.dimension_count", 2, c.head_dim, &c.n_rot));
  if (c.n_rot % 2 != 0)
    return make_error("model: ", path, ": rope.dimension_count ", c.n_rot, " must be even");
  c.rms_eps = 1e-5f;
  KV_TRY(get_real(f, a + "attention.layer_norm_rms_epsilon", 0, 1, &c.rms_eps));
  float base = 10000.0f;
  KV_TRY(get_real(f, a + "rope.freq_base", 1, 1e12, &base));

  // Linear RoPE scaling divides positions by the factor; other kinds are not run.
  float freq_scale = 1.0f;
  if (f.find(a + "rope.scaling.type")) {
    auto type = f.get_string(a + "rope.scaling.type");
    if (!type.ok()) return type.error();
    if (*type == "linear") {
      float factor = 1.0f;
      KV_TRY(get_real(f, a + "rope.scaling.factor", 0, 1e6, &factor));
      freq_scale = 1.0f / factor;
    } else if (*type != "none") {
      return make_error("model: ", path, ": rope.scaling.type '", *type,
                        "' is not supported (none, linear)");
    }
  }
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    if (!f.find(a + key)) continue;
    auto cap = f.get_float(a + key);
    if (!cap.ok()) return cap.error();
    if (*cap != 0)
      return make_error("model: ", path, ": '", a, key, "' = ", *cap,
                        ": logit softcapping is not supported");
  }

  c.rope_style = fam->rope;
  c.ffn_act = fam->act;
  c.qkv_bias = fam->qkv_bias;
  c.qk_norm = fam->qk_norm;
  c.post_attn_norm = c.post_ffn_norm = fam->post_norms;
  c.embd_scale = fam->embd_scale_sqrt ? std::sqrt(float(c.n_embd)) : 1.0f;
  // Scores are scaled by 1/sqrt(D). Gemma 3 27B (62 blocks) scales by 1/sqrt(C/H)
  // instead (its query_pre_attn_scalar); an explicit attention.scale wins.
  c.attn_scale = 1.0f / std::sqrt(float(c.head_dim));
  if (c.arch == "gemma3" && c.n_layer == 62)
    c.attn_scale = 1.0f / std::sqrt(float(c.n_embd / c.n_head));
  KV_TRY(get_real(f, a + "attention.scale", 0, 1e6, &c.attn_scale));

  c.layers.assign(size_t(c.n_layer), LayerConfig{0, base, freq_scale});
  if (fam->windows) {
    int window = 0;
    KV_TRY(dim("attention.sliding_window", 1, 1 << 24, &window));
    if (window > c.n_ctx)
      return make_error("model: ", path, ": ", a, "attention.sliding_window ", window,
                        " is larger than the context length ", c.n_ctx);
    float base_swa = fam->default_base_swa;
    KV_TRY(get_real(f, a + "rope.freq_base_swa", 1, 1e12, &base_swa));
    auto local = local_layers(f, *fam, c.n_layer);
    if (!local.ok()) return local.error();
    for (int l = 0; l < c.n_layer; ++l)
      if ((*local)[size_t(l)]) c.layers[size_t(l)] = LayerConfig{window, base_swa, 1.0f};
  }
  return Status::Ok();
}

}  // namespace kvscope
