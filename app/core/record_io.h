// record_io.h — the little-endian byte writer and the bounds-checked reader that the run
// file's record payloads (run_codec.cpp, serving_record.cpp) are made of.
//
// The Reader never trusts a length from its bytes: every count is checked against what is
// left before anything is allocated, every value against its allowed range, and the first
// error sticks (later reads return defaults), naming the field, its payload byte offset, the
// value and the range.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "app/core/run_codec.h"
#include "common/status.h"
#include "engine/quant.h"
#include "engine/utf8.h"

namespace kvscope::app::detail {

// ---- writing ---------------------------------------------------------------------------

class Writer {
 public:
  void u8(uint8_t v) { b_.push_back(v); }
  void u32(uint32_t v) { put(&v, 4); }
  void i32(int32_t v) { put(&v, 4); }
  void u64(uint64_t v) { put(&v, 8); }
  void f32(float v) { put(&v, 4); }
  void f64(double v) { put(&v, 8); }
  void str(const std::string& s) {
    u32(uint32_t(s.size()));
    put(s.data(), s.size());
  }
  void floats(const std::vector<float>& v) {
    u32(uint32_t(v.size()));
    put(v.data(), v.size() * 4);
  }
  void put(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b_.insert(b_.end(), c, c + n);
  }
  std::vector<uint8_t>& bytes() { return b_; }

 private:
  std::vector<uint8_t> b_;  // little-endian hosts only (x86-64, aarch64)
};

// ---- reading: a bounds-checked cursor whose first error sticks ---------------------------

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool ok() const { return err_.empty(); }
  size_t left() const { return n_ - at_; }

  bool take(void* dst, size_t k, const char* field) {
    if (!ok()) return false;
    if (k > left()) {
      fail(field, "needs " + std::to_string(k) + " bytes but the record has " +
                      std::to_string(left()) + " left");
      return false;
    }
    if (k > 0) std::memcpy(dst, p_ + at_, k);
    at_ += k;
    return true;
  }
  int64_t integer(const char* field, int width, bool is_signed, int64_t lo, int64_t hi) {
    int64_t v = 0;
    if (width == 1) {
      uint8_t x = 0;
      take(&x, 1, field);
      v = x;
    } else if (width == 4 && is_signed) {
      int32_t x = 0;
      take(&x, 4, field);
      v = x;
    } else if (width == 4) {
      uint32_t x = 0;
      take(&x, 4, field);
      v = x;
    }
    if (ok() && (v < lo || v > hi))
      fail(field, "value " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
    return ok() ? v : lo;
  }
  int32_t i32(const char* f, int64_t lo, int64_t hi) {
    return int32_t(integer(f, 4, true, lo, hi));
  }
  uint32_t u32(const char* f, int64_t lo, int64_t hi) {
    return uint32_t(integer(f, 4, false, lo, hi));
  }
  uint8_t u8(const char* f, int lo, int hi) { return uint8_t(integer(f, 1, false, lo, hi)); }
  bool flag(const char* f) { return u8(f, 0, 1) != 0; }
  uint64_t u64(const char* f) {
    uint64_t v = 0;
    take(&v, 8, f);
    return v;
  }
  double f64(const char* f, bool allow_negative_one = false) {
    double v = 0;
    take(&v, 8, f);
    if (ok() && !(std::isfinite(v) && (v >= 0 || (allow_negative_one && v == -1.0))))
      fail(f, "value " + std::to_string(v) + " is not a finite number >= 0");
    return v;
  }
  // Any finite value (statistics whose sign the format does not constrain).
  double f64_finite(const char* f) {
    double v = 0;
    take(&v, 8, f);
    if (ok() && !std::isfinite(v)) fail(f, "value " + std::to_string(v) + " is not finite");
    return v;
  }
  float f32(const char* f, float lo, float hi) {
    float v = 0;
    take(&v, 4, f);
    if (ok() && !(std::isfinite(v) && v >= lo && v <= hi))
      fail(f, "value " + std::to_string(v) + " is not a finite number in [" + std::to_string(lo) +
                  ", " + std::to_string(hi) + "]");
    return v;
  }
  std::string str(const char* f, bool utf8) {
    uint32_t len = u32(f, 0, int64_t(kRunMaxString));
    if (ok() && len > left()) {
      fail(f, "string of " + std::to_string(len) + " bytes but the record has " +
                  std::to_string(left()) + " left");
      return {};
    }
    std::string s(len, '\0');
    take(s.data(), len, f);
    size_t bad = 0;
    if (ok() && utf8 && !utf8_valid(s, &bad))
      fail(f, "invalid UTF-8 at byte " + std::to_string(bad) + " of the string");
    return ok() ? s : std::string();
  }
  // `count` values of `bytes_each` must fit in what is left (checked before allocating).
  bool fits(const char* f, uint64_t count, uint64_t bytes_each) {
    if (!ok()) return false;
    if (count > left() / bytes_each) {
      fail(f, std::to_string(count) + " values of " + std::to_string(bytes_each) +
                  " bytes do not fit in the " + std::to_string(left()) + " bytes left");
      return false;
    }
    return true;
  }
  void floats(const char* f, uint64_t count, AttnEncoding enc, float lo, float hi,
              std::vector<float>* out) {
    const uint64_t each = enc == AttnEncoding::F16 ? 2 : 4;
    if (!fits(f, count, each)) return;
    out->resize(size_t(count));
    if (enc == AttnEncoding::F16) {
      for (uint64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, p_ + at_ + 2 * i, 2);
        (*out)[size_t(i)] = fp16_to_fp32(h);
      }
    } else {
      if (count > 0) std::memcpy(out->data(), p_ + at_, size_t(count) * 4);  // data() may be null
    }
    at_ += size_t(count * each);
    for (uint64_t i = 0; i < count; ++i) {
      float v = (*out)[size_t(i)];
      if (!(std::isfinite(v) && v >= lo && v <= hi)) {
        fail(f, "value " + std::to_string(i) + " (" + std::to_string(v) +
                    ") is not a finite number in [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
        out->clear();
        return;
      }
    }
  }
  void fail(const char* field, const std::string& msg) {
    if (err_.empty())
      err_ =
          std::string("field '") + field + "' (payload byte " + std::to_string(at_) + "): " + msg;
  }
  Error error() const { return Error{err_}; }
  // The payload must end exactly after its last field.
  Status finish() {
    if (ok() && left() != 0) fail("(end)", std::to_string(left()) + " unexpected trailing bytes");
    if (!ok()) return error();
    return Status::Ok();
  }

 private:
  const uint8_t* p_;
  size_t n_, at_ = 0;
  std::string err_;
};

// ---- the model's facts, the same in a run file's META and a serving run file's SRVM ------

inline void put_model_facts(Writer& w, const ModelFacts& f) {
  for (const std::string* s : {&f.name, &f.arch, &f.backend, &f.kv_dtype, &f.file_name}) w.str(*s);
  w.u64(f.file_bytes);
  w.u64(f.fingerprint);
  for (int v : {f.n_layer, f.n_head, f.n_head_kv, f.head_dim, f.n_embd, f.n_vocab, f.n_ctx})
    w.i32(v);
  w.u64(f.block_macs_per_token);
  w.u64(f.kv_bytes_per_token);
}

// `least`: the smallest shape number allowed (1 in a run file, 0 — not known — in a serving
// run file).
inline ModelFacts get_model_facts(Reader& r, int least) {
  ModelFacts f;
  f.name = r.str("model.name", true);
  f.arch = r.str("model.arch", true);
  f.backend = r.str("model.backend", true);
  f.kv_dtype = r.str("model.kv_dtype", true);
  for (KvDtype d : {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0})
    for (KvDtype e : {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0})
      if (kv_types_name(KvTypes{d, e}) == f.kv_dtype) f.kv_types = KvTypes{d, e};
  f.file_name = r.str("model.file_name", true);
  f.file_bytes = r.u64("model.file_bytes");
  f.fingerprint = r.u64("model.fingerprint");
  f.n_layer = r.i32("model.n_layer", least, kRunMaxLayers);
  f.n_head = r.i32("model.n_head", least, kRunMaxLayers);
  f.n_head_kv = r.i32("model.n_head_kv", least, kRunMaxLayers);
  f.head_dim = r.i32("model.head_dim", least, 1 << 16);
  f.n_embd = r.i32("model.n_embd", least, 1 << 20);
  f.n_vocab = r.i32("model.n_vocab", least, 1 << 24);
  f.n_ctx = r.i32("model.n_ctx", least, kRunMaxPositions);
  f.block_macs_per_token = r.u64("model.block_macs_per_token");
  f.kv_bytes_per_token = r.u64("model.kv_bytes_per_token");
  return f;
}

}  // namespace kvscope::app::detail
