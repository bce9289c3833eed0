// gguf_checks.cpp — tensor layout and metadata range checks (see gguf_checks.h).
#include "engine/gguf_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "engine/printable.h"

namespace kvscope {
namespace {

// Inclusive integer range of a well-known key (after the "<arch>." prefix). Per-layer
// arrays (some models vary widths by layer) are checked element by element, with 0
// allowed where a layer may lack the part (no attention, no dense FFN).
struct IntRange {
  const char* suffix;
  int64_t lo, hi;
  const char* why;  // what the range stands for, in the message
  bool array_zero_ok;
};
constexpr int64_t k2p24 = int64_t{1} << 24;
constexpr IntRange kIntRanges[] = {
    {"context_length", 1, k2p24 - 1, "positions below 2^24", false},
    {"block_count", 1, 1024, "layers", false},
    {"embedding_length", 1, 65536, "embedding width", false},
    {"feed_forward_length", 1, 1 << 20, "FFN width", true},
    {"attention.head_count", 1, 1024, "attention heads", true},
    {"attention.head_count_kv", 1, 1024, "KV heads", true},
    {"attention.key_length", 1, 4096, "head dimension", false},
    {"attention.value_length", 1, 4096, "head dimension", false},
    {"rope.dimension_count", 0, 4096, "rotary dimensions", false},
    {"attention.sliding_window", 0, k2p24 - 1, "positions below 2^24", false},
    {"vocab_size", 1, k2p24, "tokens", false},
};

// Range of a well-known floating-point key: lo < v (or lo <= v) and v <= hi, finite.
struct FloatRange {
  const char* suffix;
  double lo, hi;
  bool lo_open, hi_open;
};
constexpr FloatRange kFloatRanges[] = {
    {"attention.layer_norm_rms_epsilon", 0, 1, true, true},
    {"attention.layer_norm_epsilon", 0, 1, true, true},
    {"rope.freq_base", 0, 1e12, true, false},
    {"rope.freq_base_swa", 0, 1e12, true, false},
    {"rope.scaling.factor", 0, 1e6, true, false},
    {"attention.logit_softcapping", 0, 1e6, true, false},
    {"final_logit_softcapping", 0, 1e6, true, false},
};

// Architectures whose q/k/v projections are {C, H*D}, {C, Hkv*D}, {C, Hkv*Dv}.
constexpr std::string_view kHeadLayoutArchs[] = {"llama", "qwen2", "gemma3"};

bool is_unsigned(GgufType t) {
  return t == GgufType::U8 || t == GgufType::U16 || t == GgufType::U32 || t == GgufType::U64;
}
bool is_integer(GgufType t) {
  return is_unsigned(t) || t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 ||
         t == GgufType::I64;
}

// An integer scalar's value (u64 above INT64_MAX saturates: outside every range anyway).
std::optional<int64_t> int_of(const GgufValue& v) {
  if (!is_integer(v.type)) return std::nullopt;
  if (is_unsigned(v.type))
    return v.u > uint64_t(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                               : int64_t(v.u);
  return v.i;
}

std::optional<double> float_of(const GgufValue& v) {
  if (v.type == GgufType::F32 || v.type == GgufType::F64) return v.f;
  if (auto i = int_of(v)) return double(*i);
  return std::nullopt;
}

std::string value_text(const GgufValue& v, int64_t shown) {
  if (v.type == GgufType::U64 && v.u > uint64_t(std::numeric_limits<int64_t>::max()))
    return std::to_string(v.u);
  return std::to_string(shown);
}

std::string number_text(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

Status check_int_key(const GgufValue& v, const IntRange& r, const std::string& key,
                     const std::string& file) {
  auto out_of_range = [&](const std::string& shown, const std::string& where, int64_t lo) {
    return make_error("gguf: ", file, ": metadata key '", printable_name(key), "'", where, " = ",
                      shown, " is outside the sane range ", lo, "..", r.hi, " (", r.why, ")");
  };
  if (auto x = int_of(v)) {
    if (*x < r.lo || *x > r.hi) return out_of_range(value_text(v, *x), "", r.lo);
    return Status::Ok();
  }
  if (v.type == GgufType::ARRAY && is_integer(v.elem_type) && r.array_zero_ok) {
    const bool u64 = v.elem_type == GgufType::U64;
    for (size_t k = 0; k < v.ints.size(); ++k) {
      const int64_t x = v.ints[k];
      if (x < 0 || x > r.hi) {  // a u64 above INT64_MAX reads as negative
        const std::string shown = u64 ? std::to_string(uint64_t(x)) : std::to_string(x);
        std::string at = "[";  // appended, not "[" + ...: GCC 12 warns wrongly there (-Wrestrict)
        at += std::to_string(k);
        at += ']';
        return out_of_range(shown, at, 0);
      }
    }
  }
  return Status::Ok();
}

Status check_float_key(const GgufValue& v, const FloatRange& r, const std::string& key,
                       const std::string& file) {
  auto x = float_of(v);
  if (!x) return Status::Ok();
  const bool ok = std::isfinite(*x) && (r.lo_open ? *x > r.lo : *x >= r.lo) &&
                  (r.hi_open ? *x < r.hi : *x <= r.hi);
  if (ok) return Status::Ok();
  return make_error("gguf: ", file, ": metadata key '", printable_name(key),
                    "' = ", number_text(*x), " is outside the sane range ", r.lo_open ? "(" : "[",
                    number_text(r.lo), ", ", number_text(r.hi), r.hi_open ? ")" : "]");
}

// Rows of a 2-D projection (ne[1]), or nullopt when the tensor is absent or not 2-D.
std::optional<int64_t> rows_of(
    const std::unordered_map<std::string_view, const TensorInfo*>& by_name,
    const std::string& name) {
  auto it = by_name.find(name);
  if (it == by_name.end() || it->second->ne.size() != 2) return std::nullopt;
  return int64_t(it->second->ne[1]);
}

// a: the key prefix "<arch>."; shown_a: the same for messages.
Status check_head_dims(const GgufFile& f, const std::string& a, const std::string& shown_a,
                       const std::string& file) {
  auto scalar = [&](const char* suffix) -> std::optional<int64_t> {
    const GgufValue* v = f.find(a + suffix);
    return v ? int_of(*v) : std::nullopt;
  };
  const auto H = scalar("attention.head_count");
  const auto C = scalar("embedding_length");
  const auto L = scalar("block_count");
  if (!H || !L || *H < 1) return Status::Ok();  // missing or per-layer: the reader reports
  const int64_t Hkv = scalar("attention.head_count_kv").value_or(*H);
  const auto key_length = scalar("attention.key_length");
  const auto value_length = scalar("attention.value_length");
  int64_t Dk;
  std::string dk_source;
  if (key_length) {
    Dk = *key_length;
    dk_source = shown_a + "attention.key_length = " + std::to_string(Dk);
  } else if (C && *C % *H == 0) {
    Dk = *C / *H;
    dk_source = "embedding_length / head_count = " + std::to_string(*C) + " / " +
                std::to_string(*H) + " = " + std::to_string(Dk);
  } else {
    return Status::Ok();  // the reader reports C not divisible by H
  }
  const int64_t Dv = value_length.value_or(Dk);
  const std::string dv_source =
      value_length ? shown_a + "attention.value_length = " + std::to_string(Dv) : dk_source;

  std::unordered_map<std::string_view, const TensorInfo*> by_name;
  for (const TensorInfo& t : f.tensors()) by_name.emplace(t.name, &t);
  for (int64_t l = 0; l < *L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    struct Proj {
      const char* name;
      int64_t heads, dim;
      const char* heads_key;
      const std::string& source;
    };
    const Proj projs[] = {{"attn_q.weight", *H, Dk, "head_count", dk_source},
                          {"attn_k.weight", Hkv, Dk, "head_count_kv", dk_source},
                          {"attn_v.weight", Hkv, Dv, "head_count_kv", dv_source}};
    for (const Proj& pr : projs) {
      const auto rows = rows_of(by_name, p + pr.name);
      if (!rows || *rows == pr.heads * pr.dim) continue;
      return make_error("gguf: ", file, ": the head dimension ", pr.dim, " (", pr.source,
                        ") is not what the shapes say: tensor '", p, pr.name, "' has ", *rows,
                        " rows, expected ", pr.heads_key, " ", pr.heads, " x ", pr.dim, " = ",
                        pr.heads * pr.dim);
    }
  }
  if (auto rot = scalar("rope.dimension_count"); rot && *rot > Dk)
    return make_error("gguf: ", file, ": metadata key '", shown_a, "rope.dimension_count' = ", *rot,
                      " is larger than the head dimension ", Dk, " (", dk_source, ")");
  return Status::Ok();
}

}  // namespace

Status check_tensor_layout(const std::vector<TensorInfo>& tensors, const std::string& file) {
  std::vector<const TensorInfo*> order;
  order.reserve(tensors.size());
  for (const TensorInfo& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorInfo* x, const TensorInfo* y) { return x->offset < y->offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& a = *order[k - 1];
    const TensorInfo& b = *order[k];
    if (a.offset + a.nbytes > b.offset) {  // both ranges are inside the file: no overflow
      return make_error("gguf: ", file, ": tensor '", printable_name(b.name), "' data [", b.offset,
                        ", ", b.offset + b.nbytes, ") overlaps tensor '", printable_name(a.name),
                        "' data [", a.offset, ", ", a.offset + a.nbytes,
                        ") (offsets in the data section; every tensor needs bytes of its own)");
    }
  }
  return Status::Ok();
}

Status check_metadata_ranges(const GgufFile& f, const std::string& file) {
  const GgufValue* arch = f.find("general.architecture");
  if (!arch || arch->type != GgufType::STRING) return Status::Ok();  // the reader reports
  const std::string a = arch->s + ".";
  const std::string shown_a = printable_name(a);
  for (const IntRange& r : kIntRanges) {
    const std::string key = a + r.suffix;
    if (const GgufValue* v = f.find(key)) KV_TRY(check_int_key(*v, r, key, file));
  }
  for (const FloatRange& r : kFloatRanges) {
    const std::string key = a + r.suffix;
    if (const GgufValue* v = f.find(key)) KV_TRY(check_float_key(*v, r, key, file));
  }
  if (std::find(std::begin(kHeadLayoutArchs), std::end(kHeadLayoutArchs), arch->s) !=
      std::end(kHeadLayoutArchs))
    KV_TRY(check_head_dims(f, a, shown_a, file));
  return Status::Ok();
}

}  // namespace kvscope
