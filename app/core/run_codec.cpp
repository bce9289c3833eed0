// run_codec.cpp — record payloads to and from bytes (see run_codec.h, docs/run_file.md).
#include "app/core/run_codec.h"

#include "app/core/record_io.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "engine/quant.h"
#include "engine/utf8.h"

namespace kvscope::app {

const char* attn_encoding_name(AttnEncoding e) {
  switch (e) {
    case AttnEncoding::F32:
      return "f32";
    case AttnEncoding::F16:
      return "f16";
    case AttnEncoding::None:
      return "none";
  }
  return "?";
}

bool RunMeta::operator==(const RunMeta& o) const {
  return producer == o.producer && model == o.model && prompt.text == o.prompt.text &&
         prompt.chat == o.prompt.chat && prompt.special == o.prompt.special && mode == o.mode &&
         sampler.temperature == o.sampler.temperature && sampler.top_k == o.sampler.top_k &&
         sampler.top_p == o.sampler.top_p && sampler.min_p == o.sampler.min_p &&
         sampler.seed == o.sampler.seed && sampler.penalties == o.sampler.penalties &&
         max_tokens == o.max_tokens && attention == o.attention;
}

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

namespace {

using detail::Reader;
using detail::Writer;

constexpr float kHuge = std::numeric_limits<float>::max();

}  // namespace

// ---- META -------------------------------------------------------------------------------

std::vector<uint8_t> encode_meta(const RunMeta& m) {
  Writer w;
  w.str(m.producer);
  detail::put_model_facts(w, m.model);
  w.str(m.prompt.text);
  w.u8(m.prompt.chat);
  w.u8(m.prompt.special);
  w.u8(uint8_t(m.mode));
  w.f32(m.sampler.temperature);
  w.i32(m.sampler.top_k);
  w.f32(m.sampler.top_p);
  w.f32(m.sampler.min_p);
  w.u64(m.sampler.seed);
  w.i32(m.max_tokens);
  w.u8(uint8_t(m.attention));
  // Format version 2: the penalties.
  const PenaltyConfig& pc = m.sampler.penalties;
  w.f32(pc.repeat);
  w.f32(pc.frequency);
  w.f32(pc.presence);
  w.i32(pc.last_n);
  w.i32(pc.no_repeat_ngram);
  w.u32(uint32_t(pc.logit_bias.size()));
  for (const auto& [id, bias] : pc.logit_bias) {
    w.i32(id);
    w.f32(bias);
  }
  return std::move(w.bytes());
}

Expected<RunMeta> decode_meta(const uint8_t* p, size_t n) {
  Reader r(p, n);
  RunMeta m;
  m.producer = r.str("producer", true);
  m.model = detail::get_model_facts(r, 1);
  m.prompt.text = r.str("prompt.text", true);
  m.prompt.chat = r.flag("prompt.chat");
  m.prompt.special = r.flag("prompt.special");
  m.mode = CacheMode(r.u8("mode", 0, 1));
  m.sampler.temperature = r.f32("sampler.temperature", 0.0f, 1e6f);
  m.sampler.top_k = r.i32("sampler.top_k", 0, 1 << 24);
  m.sampler.top_p = r.f32("sampler.top_p", 0.0f, 1.0f);
  m.sampler.min_p = r.f32("sampler.min_p", 0.0f, 1.0f);
  m.sampler.seed = r.u64("sampler.seed");
  m.max_tokens = r.i32("max_tokens", 1, kRunMaxPositions);
  m.attention = AttnEncoding(r.u8("attention", 0, 2));
  if (r.ok() && r.left() > 0) {  // version 2
    PenaltyConfig& pc = m.sampler.penalties;
    pc.repeat = r.f32("penalties.repeat", 0.0f, 10.0f);
    pc.frequency = r.f32("penalties.frequency", -2.0f, 2.0f);
    pc.presence = r.f32("penalties.presence", -2.0f, 2.0f);
    pc.last_n = r.i32("penalties.last_n", -1, kRunMaxPositions);
    pc.no_repeat_ngram = r.i32("penalties.no_repeat_ngram", 0, 64);
    const uint32_t n_bias = r.u32("penalties.logit_bias.count", 0, 1 << 24);
    if (r.fits("penalties.logit_bias", n_bias, 8))
      for (uint32_t i = 0; i < n_bias && r.ok(); ++i) {
        const int32_t id = r.i32("penalties.logit_bias.id", 0, 1 << 24);
        pc.logit_bias.push_back({id, r.f32("penalties.logit_bias.bias", -100.0f, 100.0f)});
      }
  }
  if (Status st = r.finish(); !st.ok()) return st.error();
  return m;
}

// ---- STEP -------------------------------------------------------------------------------

std::vector<uint8_t> encode_step(const StepTrace& t, AttnEncoding enc) {
  Writer w;
  w.i32(t.step);
  w.i32(t.token_id);
  w.str(t.piece);
  w.str(t.text);
  w.str(t.emitted);
  w.i32(t.pos);
  w.u8(t.is_prompt);
  w.u8(uint8_t(t.stop));
  w.u8(uint8_t(t.mode));
  w.u32(uint32_t(t.prompt.size()));
  for (const PromptToken& p : t.prompt) {
    w.i32(p.id);
    w.str(p.text);
  }
  w.u32(uint32_t(t.top.size()));
  for (const Candidate& c : t.top) {
    w.i32(c.id);
    w.str(c.text);
    w.f32(c.p);
    w.f32(c.logit);
  }
  w.i32(t.sampled_rank);
  w.i32(t.n_layer);
  w.i32(t.n_head);
  w.i32(t.n_attn);
  const size_t n_att = size_t(std::max(t.n_layer, 0)) * size_t(std::max(t.n_head, 0)) *
                       size_t(std::max(t.n_attn, 0));
  if (t.attention.size() != n_att || n_att == 0) enc = AttnEncoding::None;
  w.u8(uint8_t(enc));
  if (enc == AttnEncoding::F32) {
    w.put(t.attention.data(), n_att * 4);
  } else if (enc == AttnEncoding::F16) {
    std::vector<uint16_t> h(n_att);
    for (size_t i = 0; i < n_att; ++i) h[i] = fp32_to_fp16(t.attention[i]);
    w.put(h.data(), n_att * 2);
  }
  w.i32(t.kv_first_pos);
  w.i32(t.kv_written);
  w.floats(t.k_norm);
  w.floats(t.v_norm);
  for (uint64_t v :
       {t.flops, t.flops_total, t.kv_rows, t.kv_rows_total, t.kv_bytes, t.kv_transient_bytes})
    w.u64(v);
  w.i32(t.seq_len);
  w.i32(t.tokens_processed);
  w.f64(t.ms);
  w.f64(t.device_ms);
  w.str(t.backend);
  w.u32(uint32_t(t.kv_layers.size()));
  for (const KvLayerState& l : t.kv_layers) {
    w.i32(l.window);
    w.i32(l.sink);
    w.u64(l.bytes);
    w.u32(uint32_t(l.held.size()));
    for (const KvRange& r : l.held) {
      w.i32(r.begin);
      w.i32(r.end);
    }
  }
  // Format version 2: each candidate's logit before the penalties.
  for (const Candidate& c : t.top) w.f32(c.raw_logit);
  return std::move(w.bytes());
}

Expected<StepTrace> decode_step(const uint8_t* p, size_t n) {
  Reader r(p, n);
  StepTrace t;
  t.step = r.i32("step", 1, kRunMaxPositions);
  t.token_id = r.i32("token_id", 0, 1 << 24);
  t.piece = r.str("piece", false);
  t.text = r.str("text", true);
  t.emitted = r.str("emitted", true);
  t.pos = r.i32("pos", 0, kRunMaxPositions);
  t.is_prompt = r.flag("is_prompt");
  t.stop = StopReason(r.u8("stop", 0, int(StopReason::StopToken)));
  t.mode = CacheMode(r.u8("mode", 0, 1));
  const uint32_t n_prompt = r.u32("prompt.count", 0, kRunMaxPositions);
  if (r.fits("prompt", n_prompt, 8)) {  // each entry is at least an id and a length
    t.prompt.resize(n_prompt);
    for (PromptToken& pt : t.prompt) {
      pt.id = r.i32("prompt.id", 0, 1 << 24);
      pt.text = r.str("prompt.text", true);
      if (!r.ok()) break;
    }
  }
  const uint32_t n_top = r.u32("top.count", 0, kRunMaxCandidates);
  if (r.fits("top", n_top, 16)) {
    t.top.resize(n_top);
    for (Candidate& c : t.top) {
      c.id = r.i32("top.id", 0, 1 << 24);
      c.text = r.str("top.text", true);
      c.p = r.f32("top.p", 0.0f, 1.0f);
      c.logit = r.f32("top.logit", -kHuge, kHuge);
      if (!r.ok()) break;
    }
  }
  t.sampled_rank = r.i32("sampled_rank", -1, int64_t(n_top) - 1);
  t.n_layer = r.i32("n_layer", 0, kRunMaxLayers);
  t.n_head = r.i32("n_head", 0, kRunMaxLayers);
  t.n_attn = r.i32("n_attn", 0, kRunMaxPositions);
  const auto enc = AttnEncoding(r.u8("attention.encoding", 0, 2));
  if (r.ok() && enc != AttnEncoding::None) {
    const uint64_t count = uint64_t(t.n_layer) * uint64_t(t.n_head) * uint64_t(t.n_attn);
    r.floats("attention", count, enc, 0.0f, 1.001f, &t.attention);
  }
  t.kv_first_pos = r.i32("kv_first_pos", 0, kRunMaxPositions);
  t.kv_written = r.i32("kv_written", 0, kRunMaxPositions);
  const uint64_t n_norm = uint64_t(t.n_layer) * uint64_t(t.kv_written);
  for (auto [field, out] : {std::pair{"k_norm", &t.k_norm}, std::pair{"v_norm", &t.v_norm}}) {
    const uint32_t count = r.u32(field, 0, std::numeric_limits<uint32_t>::max());
    if (r.ok() && count != 0 && count != n_norm)
      r.fail(field, std::to_string(count) + " values, expected n_layer x kv_written = " +
                        std::to_string(n_norm) + " (or 0)");
    r.floats(field, count, AttnEncoding::F32, 0.0f, kHuge, out);
  }
  t.flops = r.u64("flops");
  t.flops_total = r.u64("flops_total");
  t.kv_rows = r.u64("kv_rows");
  t.kv_rows_total = r.u64("kv_rows_total");
  t.kv_bytes = r.u64("kv_bytes");
  t.kv_transient_bytes = r.u64("kv_transient_bytes");
  t.seq_len = r.i32("seq_len", 1, kRunMaxPositions);
  t.tokens_processed = r.i32("tokens_processed", 0, kRunMaxPositions);
  t.ms = r.f64("ms");
  t.device_ms = r.f64("device_ms", /*allow_negative_one=*/true);
  t.backend = r.str("backend", true);
  const uint32_t n_kvl = r.u32("kv_layers.count", 0, kRunMaxLayers);
  if (r.ok() && n_kvl != 0 && int(n_kvl) != t.n_layer)
    r.fail("kv_layers.count", "value " + std::to_string(n_kvl) + " is neither 0 nor n_layer (" +
                                  std::to_string(t.n_layer) + ")");
  if (r.fits("kv_layers", n_kvl, 20)) {
    t.kv_layers.resize(n_kvl);
    for (KvLayerState& l : t.kv_layers) {
      l.window = r.i32("kv_layers.window", 0, kRunMaxPositions);
      l.sink = r.i32("kv_layers.sink", 0, kRunMaxPositions);
      l.bytes = r.u64("kv_layers.bytes");
      const uint32_t n_held = r.u32("kv_layers.held.count", 0, kRunMaxPositions);
      if (!r.fits("kv_layers.held", n_held, 8)) break;
      l.held.resize(n_held);
      int prev_end = 0;
      for (KvRange& h : l.held) {
        h.begin = r.i32("kv_layers.held.begin", prev_end, t.pos + 1);
        h.end = r.i32("kv_layers.held.end", h.begin, t.pos + 1);
        prev_end = h.end;
      }
      if (!r.ok()) break;
    }
  }
  for (Candidate& c : t.top) c.raw_logit = c.logit;  // version 1: no penalties
  if (r.ok() && r.left() > 0)                         // version 2
    for (Candidate& c : t.top) c.raw_logit = r.f32("top.raw_logit", -kHuge, kHuge);
  if (r.ok() && t.seq_len != t.pos + 1)
    r.fail("seq_len",
           "value " + std::to_string(t.seq_len) + " is not pos + 1 = " + std::to_string(t.pos + 1));
  if (r.ok() && t.n_attn > t.pos + 1)
    r.fail("n_attn", "value " + std::to_string(t.n_attn) +
                         " exceeds the positions before the "
                         "new token (" +
                         std::to_string(t.pos + 1) + ")");
  if (Status st = r.finish(); !st.ok()) return st.error();
  return t;
}

// ---- END --------------------------------------------------------------------------------

std::vector<uint8_t> encode_end(const RunEnd& e) {
  Writer w;
  w.i32(e.steps);
  w.str(e.reason);
  return std::move(w.bytes());
}

Expected<RunEnd> decode_end(const uint8_t* p, size_t n) {
  Reader r(p, n);
  RunEnd e;
  e.steps = r.i32("steps", 0, kRunMaxPositions);
  e.reason = r.str("reason", true);
  if (Status st = r.finish(); !st.ok()) return st.error();
  if (!finish_reason_from_string(e.reason))
    return make_error("field 'reason': unknown reason '", e.reason, "'");
  return e;
}

}  // namespace kvscope::app
