// test_quant.cpp — block formats: hand-built blocks with known values, fp16/bf16
// conversion edge cases, and vec_dot against dequantize_row + a double-precision dot.
// The CPU backend's row kernels on every dispatch path (AVX-512, AVX2, scalar; each where
// the CPU has it): f16 conversions and dequantize_row bit for bit as the reference here,
// dot_f32 / vec_dot to rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/kernels.h"
#include "engine/quant.h"
#include <nlohmann/json.hpp>
#include "tests/util/gguf_writer.h"
#include "tests/util/isa_paths.h"

namespace kvscope {
namespace {

void put16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  std::memcpy(b.data() + at, &v, 2);
}

std::vector<float> deq(GgmlType t, const std::vector<uint8_t>& b, int64_t n) {
  std::vector<float> y(n, -12345.0f);
  dequantize_row(t, b.data(), y.data(), n);
  return y;
}

// fp16 constants used below: 0x3C00 = 1, 0x3800 = 0.5, 0x3400 = 0.25, 0x3000 = 0.125,
// 0xBC00 = -1, 0x4000 = 2.

TEST(Fp16, DecodesNormalsSubnormalsInfNan) {
  EXPECT_EQ(fp16_to_fp32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0xC000), -2.0f);
  EXPECT_EQ(fp16_to_fp32(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0400), std::ldexp(1.0f, -14));            // smallest normal
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));            // smallest subnormal
  EXPECT_EQ(fp16_to_fp32(0x03FF), 1023.0f * std::ldexp(1.0f, -24));  // largest subnormal
  EXPECT_EQ(fp16_to_fp32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::signbit(fp16_to_fp32(0x8000)));
  EXPECT_EQ(fp16_to_fp32(0x8000), 0.0f);
  EXPECT_TRUE(std::isinf(fp16_to_fp32(0x7C00)) && fp16_to_fp32(0x7C00) > 0);
  EXPECT_TRUE(std::isinf(fp16_to_fp32(0xFC00)) && fp16_to_fp32(0xFC00) < 0);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7C01)));
}

TEST(Fp16, EncodesWithRoundToNearestEven) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7BFF);  // below the halfway point to 65536
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);  // halfway, ties to even = infinity
  EXPECT_EQ(fp32_to_fp16(1e9f), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(-INFINITY), 0xFC00);
  // 1 + 2^-11 is halfway between 1 and the next half (1 + 2^-10): ties to even (1.0).
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  // 1 + 3*2^-11 is halfway between 0x3C01 and 0x3C02: ties to even (0x3C02).
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  // Subnormal results: 2^-25 is half the smallest subnormal, ties to even (0).
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(fp32_to_fp16(1.5f * std::ldexp(1.0f, -24)), 0x0002);  // 1.5 ulp -> 2 (even)
  EXPECT_EQ(fp32_to_fp16(3.0f * std::ldexp(1.0f, -24)), 0x0003);
  EXPECT_EQ(fp32_to_fp16(-std::ldexp(1.0f, -14)), 0x8400);
  EXPECT_EQ(fp32_to_fp16(1e-10f), 0x0000);
  const uint16_t nan = fp32_to_fp16(NAN);
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(Bf16, IsTheUpperHalfOfAnF32) {
  EXPECT_EQ(bf16_to_fp32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_fp32(0xC040), -3.0f);
  EXPECT_TRUE(std::isinf(bf16_to_fp32(0x7F80)));
  EXPECT_TRUE(std::isnan(bf16_to_fp32(0x7FC0)));
  std::vector<uint8_t> row(4);
  put16(row, 0, 0x4049);  // 3.140625
  put16(row, 2, 0xBF00);  // -0.5
  const auto y = deq(GgmlType::BF16, row, 2);
  EXPECT_EQ(y[0], 3.140625f);
  EXPECT_EQ(y[1], -0.5f);
}

TEST(TypeTraits, KnowsBlockSizesAndSupport) {
  struct Want {
    GgmlType t;
    uint32_t bs, ts;
  };
  for (Want w :
       {Want{GgmlType::F32, 1, 4}, Want{GgmlType::F16, 1, 2}, Want{GgmlType::BF16, 1, 2},
        Want{GgmlType::Q4_0, 32, 18}, Want{GgmlType::Q4_1, 32, 20}, Want{GgmlType::Q5_0, 32, 22},
        Want{GgmlType::Q5_1, 32, 24}, Want{GgmlType::Q8_0, 32, 34}, Want{GgmlType::Q4_K, 256, 144},
        Want{GgmlType::Q5_K, 256, 176},
        Want{GgmlType::Q6_K, 256, 210}}) {
    const TypeTraits* tt = type_traits(w.t);
    ASSERT_NE(tt, nullptr);
    EXPECT_EQ(tt->block_size, w.bs) << tt->name;
    EXPECT_EQ(tt->type_size, w.ts) << tt->name;
    EXPECT_TRUE(type_supported(w.t)) << tt->name;
  }
  ASSERT_NE(type_traits(GgmlType::Q2_K), nullptr);
  EXPECT_EQ(type_traits(GgmlType::Q2_K)->type_size, 84u);
  EXPECT_FALSE(type_supported(GgmlType::Q2_K));
  EXPECT_FALSE(type_supported(GgmlType::Q8_K));
  EXPECT_EQ(type_traits(4u), nullptr);  // removed from ggml
  EXPECT_EQ(type_traits(1000u), nullptr);
  EXPECT_EQ(ggml_type_name(GgmlType::Q4_1), "Q4_1");
  EXPECT_EQ(ggml_type_name(77u), "type 77");
  EXPECT_EQ(row_bytes(GgmlType::Q4_1, 576), 360u);
  EXPECT_EQ(row_bytes(GgmlType::Q8_0, 576), 612u);
  EXPECT_EQ(row_bytes(GgmlType::Q4_1, 33), 0u);
  EXPECT_EQ(row_bytes(GgmlType::F16, 7), 14u);
}

TEST(Dequantize, Q4_0LowNibbleIsValueJHighNibbleIsValueJPlus16) {
  std::vector<uint8_t> b(18);
  put16(b, 0, 0x3800);  // d = 0.5
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = deq(GgmlType::Q4_0, b, 32);
  // Byte 0 = 0xF0: value 0 = (0-8)*0.5 = -4, value 16 = (15-8)*0.5 = 3.5.
  EXPECT_EQ(y[0], -4.0f);
  EXPECT_EQ(y[16], 3.5f);
  // Value 1 comes from byte 1's low nibble (1), not byte 0's high nibble (15).
  EXPECT_EQ(y[1], -3.5f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f) << j;
    EXPECT_EQ(y[j + 16], (15 - j - 8) * 0.5f) << j;
  }
}

TEST(Dequantize, Q4_1UsesScaleAndMinWithSplitNibbles) {
  std::vector<uint8_t> b(20);
  put16(b, 0, 0x3400);  // d = 0.25
  put16(b, 2, 0xBC00);  // m = -1
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = deq(GgmlType::Q4_1, b, 32);
  EXPECT_EQ(y[0], -1.0f);   // 0*0.25 - 1
  EXPECT_EQ(y[1], -0.75f);  // byte 1 low nibble = 1, not byte 0 high nibble = 15 (2.75)
  EXPECT_EQ(y[16], 2.75f);  // byte 0 high nibble = 15
  EXPECT_EQ(y[31], -1.0f);  // byte 15 high nibble = 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.25f - 1.0f) << j;
    EXPECT_EQ(y[j + 16], (15 - j) * 0.25f - 1.0f) << j;
  }
}

TEST(Dequantize, Q5_0HighBitsComeFromQh) {
  std::vector<uint8_t> b(22);
  put16(b, 0, 0x3C00);  // d = 1
  const uint32_t qh = (1u << 0) | (1u << 5) | (1u << 16) | (1u << 31);
  std::memcpy(b.data() + 2, &qh, 4);
  for (int j = 0; j < 16; ++j) b[6 + j] = 0x53;  // low nibble 3, high nibble 5
  const auto y = deq(GgmlType::Q5_0, b, 32);
  EXPECT_EQ(y[0], 3.0f);    // (3 | 16) - 16
  EXPECT_EQ(y[1], -13.0f);  // 3 - 16
  EXPECT_EQ(y[5], 3.0f);
  EXPECT_EQ(y[16], 5.0f);    // (5 | 16) - 16, bit 16
  EXPECT_EQ(y[17], -11.0f);  // 5 - 16
  EXPECT_EQ(y[31], 5.0f);    // bit 31
  EXPECT_EQ(y[30], -11.0f);
}

TEST(Dequantize, Q5_1HighBitsScaleAndMin) {
  std::vector<uint8_t> b(24);
  put16(b, 0, 0x3800);  // d = 0.5
  put16(b, 2, 0x4000);  // m = 2
  const uint32_t qh = (1u << 3) | (1u << 20);
  std::memcpy(b.data() + 4, &qh, 4);
  for (int j = 0; j < 16; ++j) b[8 + j] = 0xA1;  // low 1, high 10
  const auto y = deq(GgmlType::Q5_1, b, 32);
  EXPECT_EQ(y[3], 10.5f);   // (1 | 16) = 17 -> 8.5 + 2
  EXPECT_EQ(y[2], 2.5f);    // 1 -> 0.5 + 2
  EXPECT_EQ(y[20], 15.0f);  // (10 | 16) = 26 -> 13 + 2
  EXPECT_EQ(y[21], 7.0f);   // 10 -> 5 + 2
}

TEST(Dequantize, Q8_0SignedBytesTimesScale) {
  std::vector<uint8_t> b(34);
  put16(b, 0, 0x3000);  // d = 0.125
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  b[2 + 31] = 0x80;  // -128
  const auto y = deq(GgmlType::Q8_0, b, 32);
  EXPECT_EQ(y[0], -2.0f);
  EXPECT_EQ(y[16], 0.0f);
  EXPECT_EQ(y[30], 1.75f);
  EXPECT_EQ(y[31], -16.0f);
}

// The K-quant examples' (scale, min) pairs, chosen by hand; k >= 4 use values >= 16 so
// their top two bits live in the top bits of bytes 0..7.
constexpr int kKSc[8] = {1, 2, 3, 4, 37, 50, 63, 20};
constexpr int kKMn[8] = {5, 6, 7, 8, 40, 33, 17, 62};

// A Q4_K (bytes 144) or Q5_K (176: qh[32] before the nibbles) block with those pairs,
// d = 1, dmin = 0.5, and nibble byte i = (i % 16) | ((i * 7) % 16) << 4.
std::vector<uint8_t> k_example(size_t bytes) {
  // Packed by hand: byte k (k<4) = sc[k] | (sc[k+4] >> 4) << 6, byte k+4 = mn[k] |
  // (mn[k+4] >> 4) << 6, byte k+8 = (sc[k+4] & 15) | (mn[k+4] & 15) << 4.
  // e.g. byte 0 = 1 | (37>>4=2)<<6 = 0x81; byte 8 = (37&15=5) | (40&15=8)<<4 = 0x85.
  const uint8_t scales[12] = {0x81, 0xC2, 0xC3, 0x44, 0x85, 0x86,
                              0x47, 0xC8, 0x85, 0x12, 0x1F, 0xE4};
  std::vector<uint8_t> b(bytes);
  put16(b, 0, 0x3C00);  // d = 1
  put16(b, 2, 0x3800);  // dmin = 0.5
  std::memcpy(b.data() + 4, scales, 12);
  const size_t qs = bytes - 128;
  for (int i = 0; i < 128; ++i) b[qs + size_t(i)] = static_cast<uint8_t>((i % 16) | (((i * 7) % 16) << 4));
  return b;
}

TEST(Dequantize, Q4_KSixBitScalesForLowAndHighPairs) {
  const int* sc = kKSc;
  const int* mn = kKMn;
  const auto y = deq(GgmlType::Q4_K, k_example(144), 256);
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      const int i = 32 * g + l;
      const float lo = static_cast<float>(sc[2 * g] * (i % 16)) - 0.5f * mn[2 * g];
      const float hi = static_cast<float>(sc[2 * g + 1] * ((i * 7) % 16)) - 0.5f * mn[2 * g + 1];
      ASSERT_EQ(y[64 * g + l], lo) << "value " << 64 * g + l;
      ASSERT_EQ(y[64 * g + 32 + l], hi) << "value " << 64 * g + 32 + l;
    }
  }
  // Spot check, sub-block 5 (k >= 4): value 160 = group 2, high nibble of qs[64] =
  // (64*7)%16 = 0, so d*50*0 - 0.5*33 = -16.5.
  EXPECT_EQ(y[160], -16.5f);
  // Value 224 = group 3 high nibble of qs[96] = (96*7)%16 = 0: -0.5*62 = -31.
  EXPECT_EQ(y[224], -31.0f);
  // Value 193 = group 3 low nibble of qs[97] = 1: 63*1 - 0.5*17 = 54.5.
  EXPECT_EQ(y[193], 54.5f);
}

TEST(Dequantize, Q5_KIsQ4_KWithAFifthBitFromQh) {
  // The Q4_K example's scales and nibbles, 32 bytes later (after qh), and fifth bits:
  // value k takes bit k / 32 of qh[k % 32]; qh[l] = l * 37 (mod 256) by hand.
  const int* sc = kKSc;
  const int* mn = kKMn;
  std::vector<uint8_t> b = k_example(176);
  for (int l = 0; l < 32; ++l) b[16 + size_t(l)] = static_cast<uint8_t>(l * 37);
  const auto y = deq(GgmlType::Q5_K, b, 256);
  for (int k = 0; k < 256; ++k) {
    const int s = k / 32, l = k % 32, i = 32 * (k / 64) + l;
    const int nib = s % 2 == 0 ? i % 16 : (i * 7) % 16;
    const int q = nib + 16 * (((l * 37) % 256 >> s) & 1);
    ASSERT_EQ(y[size_t(k)], static_cast<float>(sc[s] * q) - 0.5f * mn[s]) << "value " << k;
  }
  // By hand: value 33 = sub-block 1, l = 1: high nibble of qs[1] = 7, qh[1] = 37 =
  // 0b100101, bit 1 = 0: 2 * 7 - 0.5 * 6 = 11. Value 161 = sub-block 5, l = 1: high nibble
  // of qs[65] = (65*7)%16 = 7, bit 5 of 37 = 1: 50 * 23 - 0.5 * 33 = 1133.5.
  EXPECT_EQ(y[33], 11.0f);
  EXPECT_EQ(y[161], 1133.5f);
}

// Against the gguf Python package (llama.cpp's gguf-py): 16 Q5_K blocks of random bytes
// with plausible scales, dequantized by gguf.quants.dequantize
// (tests/golden/q5_k_dequant.json, made by scripts/make_golden_kquant.sh). The reference
// computes each value as (d·sc)·q − dmin·m in float32, as engine/quant.cpp does: the
// same bits (the file's 9 significant digits round-trip a float32).
TEST(Dequantize, Q5_KEqualsGgufPy) {
  std::ifstream in(std::string(KVSCOPE_SOURCE_DIR) + "/tests/golden/q5_k_dequant.json");
  ASSERT_TRUE(in) << "tests/golden/q5_k_dequant.json";
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["type"], "Q5_K");
  ASSERT_EQ(j["blocks"].size(), 16u);
  ASSERT_EQ(j["values"].size(), 16u);
  int compared = 0, nonzero_high = 0;
  for (size_t i = 0; i < j["blocks"].size(); ++i) {
    const std::string hex = j["blocks"][i];
    ASSERT_EQ(hex.size(), 2u * 176);
    std::vector<uint8_t> b(176);
    for (size_t k = 0; k < b.size(); ++k) b[k] = uint8_t(std::stoi(hex.substr(2 * k, 2), nullptr, 16));
    const auto y = deq(GgmlType::Q5_K, b, 256);
    for (int k = 0; k < 256; ++k) {
      const float want = j["values"][i][size_t(k)];
      ASSERT_EQ(y[size_t(k)], want) << "block " << i << " value " << k;
      ++compared;
    }
    for (int l = 0; l < 32; ++l) nonzero_high += b[16 + size_t(l)] != 0;
  }
  EXPECT_EQ(compared, 16 * 256);
  EXPECT_GT(nonzero_high, 0) << "the fifth bits are exercised";
}

TEST(Dequantize, Q6_KBothHalves) {
  std::vector<uint8_t> b(210);
  for (int i = 0; i < 128; ++i) b[i] = static_cast<uint8_t>(i * 37);       // ql
  for (int i = 0; i < 64; ++i) b[128 + i] = static_cast<uint8_t>(i * 91);  // qh
  for (int k = 0; k < 16; ++k) {
    b[192 + k] = static_cast<uint8_t>(static_cast<int8_t>((k + 1) * (k % 2 == 0 ? 1 : -1)));
  }
  put16(b, 208, 0x3800);  // d = 0.5
  const auto y = deq(GgmlType::Q6_K, b, 256);
  // Value 0: ql[0]=0 low 0, qh[0]=0 -> q=-32, sc[0]=1: 0.5*1*-32 = -16.
  EXPECT_EQ(y[0], -16.0f);
  // Value 1: ql[1]=0x25 low 5, qh[1]=0x5B bits 0-1 = 3 -> 53-32 = 21, sc[0]=1: 10.5.
  EXPECT_EQ(y[1], 10.5f);
  // Value 17: l=17 uses sc[1] = -2.
  EXPECT_EQ(y[17], -21.0f);
  EXPECT_EQ(y[40], 12.0f);
  EXPECT_EQ(y[77], -5.0f);
  EXPECT_EQ(y[100], -45.5f);
  EXPECT_EQ(y[127], 124.0f);
  // Value 128 (second half, l=0): ql[64]=0x40 low 0, qh[32]=0x60 bits 0-1 = 0 -> -32,
  // sc[8] = 9: 0.5*9*-32 = -144.
  EXPECT_EQ(y[128], -144.0f);
  EXPECT_EQ(y[150], -70.0f);
  EXPECT_EQ(y[200], 143.0f);
  EXPECT_EQ(y[255], 88.0f);
}

TEST(Dequantize, F16AndF32Rows) {
  std::vector<uint8_t> h(6);
  put16(h, 0, 0x3C00);
  put16(h, 2, 0x0001);
  put16(h, 4, 0xC000);
  const auto y = deq(GgmlType::F16, h, 3);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], std::ldexp(1.0f, -24));
  EXPECT_EQ(y[2], -2.0f);
  std::vector<float> f = {1.5f, -2.25f};
  std::vector<uint8_t> fb(8);
  std::memcpy(fb.data(), f.data(), 8);
  EXPECT_EQ(deq(GgmlType::F32, fb, 2), f);
}

// Random rows whose scale fields hold sane fp16 values.
std::vector<uint8_t> random_row(GgmlType t, int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> vals(n);
  for (float& v : vals) v = u(rng);
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
      return test::quantize_rows(t, vals, n);
    default:
      break;
  }
  const TypeTraits* tt = type_traits(t);
  std::vector<uint8_t> b(row_bytes(t, n));
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  for (int64_t blk = 0; blk < n / tt->block_size; ++blk) {
    uint8_t* p = b.data() + blk * tt->type_size;
    auto scale = [&](size_t at) {
      const uint16_t h = fp32_to_fp16(u(rng) * 0.05f);
      std::memcpy(p + at, &h, 2);
    };
    if (t == GgmlType::Q6_K) {
      scale(208);
    } else {
      scale(0);
      if (t == GgmlType::Q5_1 || t == GgmlType::Q4_K || t == GgmlType::Q5_K) scale(2);
    }
  }
  return b;
}

// vec_dot must equal dequantize_row followed by a plain dot. Tolerance: 1e-5 relative to
// sum |w_i x_i| (float accumulation order differs), plus 1e-6 absolute.
TEST(VecDot, MatchesDequantizeThenDotForEveryType) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (GgmlType t :
       {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
        GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K,
        GgmlType::Q6_K}) {
    const int64_t bs = type_traits(t)->block_size;
    std::vector<int64_t> lengths = bs == 1    ? std::vector<int64_t>{1, 7, 33, 100, 576, 1536}
                                   : bs == 32 ? std::vector<int64_t>{32, 64, 96, 576, 1536, 4096}
                                              : std::vector<int64_t>{256, 512, 1536};
    for (int64_t n : lengths) {
      for (int rep = 0; rep < 3; ++rep) {
        const auto row = random_row(t, n, rng);
        std::vector<float> x(n), w(n);
        for (float& v : x) v = u(rng);
        dequantize_row(t, row.data(), w.data(), n);
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) {
          ref += static_cast<double>(w[i]) * x[i];
          mag += std::fabs(static_cast<double>(w[i]) * x[i]);
        }
        const float got = vec_dot(t, row.data(), x.data(), n);
        ASSERT_NEAR(got, ref, 1e-5 * mag + 1e-6) << ggml_type_name(t) << " n=" << n;
      }
    }
  }
}

TEST(VecDot, WorksOnUnalignedRows) {
  std::mt19937 rng(7);
  const int64_t n = 576;
  for (GgmlType t : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F16}) {
    const auto row = random_row(t, n, rng);
    std::vector<uint8_t> shifted(row.size() + 1);
    std::memcpy(shifted.data() + 1, row.data(), row.size());
    std::vector<float> x(n + 1);
    for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    const float a = vec_dot(t, row.data(), x.data() + 1, n);
    const float b = vec_dot(t, shifted.data() + 1, x.data() + 1, n);
    EXPECT_EQ(a, b) << ggml_type_name(t);
  }
}

using cpu::Isa;

using test::bits;

// The row kernels of one SIMD path, run once per path (".../scalar", ".../avx2",
// ".../avx512"); a path this CPU lacks is reported as skipped (tests/util/isa_paths.h).
class RowKernels : public test::IsaPathTest {};
KVSCOPE_TEST_EVERY_ISA(RowKernels);

TEST_P(RowKernels, F16ConversionsEqualTheReference) {
  const Isa isa = this->isa();
  // Every binary16 value, in a row whose length leaves a tail on every path.
  std::vector<uint8_t> halves(2 * 65537);
  for (uint32_t h = 0; h < 65537; ++h) put16(halves, 2 * h, uint16_t(h * 40503u));
  // fp32 values: random bit patterns, and values around every rounding boundary and range
  // edge of binary16 (ties, subnormals, overflow, inf, NaN with payloads).
  std::mt19937 rng(5);
  std::vector<float> floats;
  for (int i = 0; i < 50001; ++i) {
    uint32_t b = rng();
    float f;
    std::memcpy(&f, &b, 4);
    floats.push_back(f);
  }
  for (uint32_t h = 0; h < 0x7c00; h += 7) {
    const float a = fp16_to_fp32(uint16_t(h)), b = fp16_to_fp32(uint16_t(h + 1));
    for (float f : {a, (a + b) / 2, std::nextafter((a + b) / 2, 0.0f), -(a + b) / 2})
      floats.push_back(f);
  }
  for (float f : {65504.0f, 65519.99f, 65520.0f, 1e9f, -1e9f, INFINITY, -INFINITY, NAN, -NAN, 0.0f,
                  -0.0f, 1e-40f, -1e-40f, 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f})
    floats.push_back(f);
  uint32_t nan_payload = 0x7fa01234u;
  float f;
  std::memcpy(&f, &nan_payload, 4);
  floats.push_back(f);
  const int64_t nh = int64_t(halves.size() / 2), nf = int64_t(floats.size());

  SCOPED_TRACE(cpu::isa_name(isa));
  const cpu::IsaKernels& k = cpu::kernels(isa);
  std::vector<float> got(static_cast<size_t>(nh));
  k.f16_to_f32(halves.data(), got.data(), nh);
  for (int64_t i = 0; i < nh; ++i) {
    uint16_t h;
    std::memcpy(&h, halves.data() + 2 * i, 2);
    ASSERT_EQ(bits(got[size_t(i)]), bits(fp16_to_fp32(h))) << "half " << h;
  }
  std::vector<uint8_t> enc(2 * static_cast<size_t>(nf));
  k.f32_to_f16(floats.data(), enc.data(), nf);
  for (int64_t i = 0; i < nf; ++i) {
    uint16_t h;
    std::memcpy(&h, enc.data() + 2 * i, 2);
    ASSERT_EQ(h, fp32_to_fp16(floats[size_t(i)]))
        << "value " << floats[size_t(i)] << " bits " << bits(floats[size_t(i)]);
  }
}

TEST_P(RowKernels, DequantizeRowEqualsTheReferenceBitForBit) {
  const Isa isa = this->isa();
  std::mt19937 rng(321);
  for (GgmlType t :
       {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
        GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K,
        GgmlType::Q6_K}) {
    const int64_t bs = type_traits(t)->block_size;
    // One block (37 values of a float type: a tail on every path), and several.
    for (int64_t n : {bs == 1 ? int64_t(37) : bs, bs == 1 ? int64_t(261) : 8 * bs}) {
      const auto row = random_row(t, n, rng);
      std::vector<float> want(static_cast<size_t>(n));
      dequantize_row(t, row.data(), want.data(), n);
      std::vector<float> got(static_cast<size_t>(n), -1.0f);
      cpu::kernels(isa).dequantize_row(t, row.data(), got.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(bits(got[size_t(i)]), bits(want[size_t(i)]))
            << cpu::isa_name(isa) << " " << ggml_type_name(t) << " n=" << n << " value " << i;
    }
  }
}

TEST_P(RowKernels, DotsMatchDequantizeThenDot) {
  const Isa isa = this->isa();
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  const cpu::IsaKernels& k = cpu::kernels(isa);
  for (GgmlType t :
       {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
        GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K,
        GgmlType::Q6_K}) {
    const int64_t bs = type_traits(t)->block_size;
    const std::vector<int64_t> lengths = bs == 1    ? std::vector<int64_t>{1, 7, 33, 100, 1536}
                                         : bs == 32 ? std::vector<int64_t>{32, 96, 1536}
                                                    : std::vector<int64_t>{256, 1536};
    for (int64_t n : lengths) {
      const auto row = random_row(t, n, rng);
      // x one float past an aligned start: the kernels need no alignment.
      std::vector<float> xs(size_t(n) + 1), w(static_cast<size_t>(n));
      for (float& v : xs) v = u(rng);
      const float* x = xs.data() + 1;
      dequantize_row(t, row.data(), w.data(), n);
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        ref += static_cast<double>(w[size_t(i)]) * x[i];
        mag += std::fabs(static_cast<double>(w[size_t(i)]) * x[i]);
      }
      const std::string what =
          std::string(cpu::isa_name(isa)) + " " + ggml_type_name(t) + " n=" + std::to_string(n);
      EXPECT_NEAR(k.vec_dot(t, row.data(), x, n), ref, 1e-5 * mag + 1e-6) << what;
      EXPECT_NEAR(k.dot_f32(w.data(), x, n), ref, 1e-5 * mag + 1e-6) << what;
    }
  }
}

TEST(Quantizers, RoundTripWithinHalfAStep) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> v(256);
  for (float& x : v) x = u(rng);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1}) {
    const auto q = test::quantize_rows(t, v, 128);
    ASSERT_EQ(q.size(), row_bytes(t, 256));
    std::vector<float> back(256);
    dequantize_row(t, q.data(), back.data(), 256);
    // Step: Q8_0 amax/127, Q4_0 amax/8, Q4_1 range/15; range <= 6, amax <= 3.
    const float step = t == GgmlType::Q8_0   ? 3.0f / 127
                       : t == GgmlType::Q4_0 ? 3.0f / 8
                                             : 6.0f / 15;
    for (int i = 0; i < 256; ++i) {
      // Q4_0 cannot represent +8 steps: the clamped extreme may be one step off.
      const float tol = t == GgmlType::Q4_0 ? step * 1.01f : step * 0.51f + 1e-3f;
      ASSERT_NEAR(back[i], v[i], tol) << ggml_type_name(t) << " value " << i;
    }
  }
}

}  // namespace
}  // namespace kvscope
