// The code tables of the table formats (int8_dynamic, nf4, fp4), computed by the same
// functions on the host (tests, vk_quant_table), on the device (each thread block builds
// its shared-memory copy) and at compile time (constexpr), so all hold identical bits. python/vramkit/quant/_formats.py
// computes the same tables with the same double-precision steps; a test compares them.
//
// Encoding a normalized value v picks the nearest table value: the index is the number of
// thresholds (midpoints of neighbouring values, rounded to fp32) strictly below v. Rather than
// a binary search per element, the kernels read a bucket table indexed by v's sign, exponent and
// top mantissa bits; every bucket holds at most one threshold (checked when the table is built),
// so one comparison finishes the search: code = v > bucket.thr ? bucket.hi : bucket.lo.
#pragma once
#include <cstdint>

#include "vramkit/quant.h"

#if defined(__CUDACC__)
#define VKQ_HDC __host__ __device__ constexpr
#else
#define VKQ_HDC constexpr
#endif

// Which table formats' encoders keep packed entries (one 32-bit word, below): 1 (the default) the
// 4-bit formats, 2 the dynamic map too (with the finer buckets its packing needs), 0 none.
// Packed entries halve the shared-memory words a warp's lookups read, for the same instructions:
// on an H100 the 4-bit encoders ran 10 % faster at the base clock (ncu) and level with two-word
// entries at the boost clock; the dynamic map's 10 % faster at the base clock but 3-7 points slower
// at the boost clock (docs/BENCHMARKS.md section 9).
#ifndef VK_QUANT_ENC_PACKED
#define VK_QUANT_ENC_PACKED 1
#endif

namespace vramkit::quant {

VKQ_HDC bool packed_for(int format) {
  return VK_QUANT_ENC_PACKED == 2 ? format == VK_QUANT_INT8_DYNAMIC || format == VK_QUANT_NF4 || format == VK_QUANT_FP4
                                  : VK_QUANT_ENC_PACKED == 1 && (format == VK_QUANT_NF4 || format == VK_QUANT_FP4);
}

struct table_spec {
  int values;    // K: sorted distinct values (and K-1 thresholds)
  int slots;     // thresholds padded with +inf to a power of two minus one, plus a sentinel
  int e0;        // biased exponent of the lowest regular octave; smaller magnitudes share bucket 0
  int octaves;   // regular octaves; magnitudes >= 2^(e0 + octaves - 127) share the last bucket
  int mbits;     // top mantissa bits that split an octave
  VKQ_HDC int per_sign() const { return (octaves << mbits) + 2; }
  VKQ_HDC int buckets() const { return 2 * per_sign(); }
};

// dynamic map: |v| <= 1, smallest threshold ~2.7e-7; nf4: |v| <= 1; fp4: |v| <= 6. The 4-bit
// formats' regular buckets split an octave by 2 mantissa bits, which leaves the 21 low bits that
// packed entries compare (below); the dynamic map's packed entries need 7 bits (16 low bits for
// ~T, 16 for its two 8-bit codes) and a bucket 0 with no threshold (below 2^-22).
VKQ_HDC table_spec spec_of(int format) {
  switch (format) {
    case VK_QUANT_INT8_DYNAMIC:  // 7 mantissa bits from 2^-22 up when packed, 6 from 2^-20 up otherwise
      return VK_QUANT_ENC_PACKED == 2 ? table_spec{256, 256, 105, 22, 7} : table_spec{256, 256, 107, 20, 6};
    case VK_QUANT_NF4: return {16, 16, 122, 5, 2};
    default: return {15, 16, 125, 5, 2};  // VK_QUANT_FP4
  }
}
constexpr int kMaxBuckets = 2 * ((22 << 7) + 2);  // the dynamic map's packed spec: 5636

// Bit casts usable in constant expressions (the encoders' tables are made at compile time too).
VKQ_HDC uint32_t f2u(float f) { return __builtin_bit_cast(uint32_t, f); }
VKQ_HDC float u2f(uint32_t u) { return __builtin_bit_cast(float, u); }

// Positive half of the signed dynamic map, ascending: decade i (0..6) holds 2^i values, the
// midpoints of 2^i equal steps over [0.1, 1] scaled by 10^(i-6).
// (Switches, not arrays: a local array would live in local memory on the device, and every
// thread block builds its tables with these. The value functions are constexpr: the decoders'
// tables are computed once, at compile time, by the same steps.)
VKQ_HDC double decade_scale(int i) {
  switch (i) {
    case 0: return 1e-6;
    case 1: return 1e-5;
    case 2: return 1e-4;
    case 3: return 1e-3;
    case 4: return 1e-2;
    case 5: return 1e-1;
    default: return 1.0;
  }
}

VKQ_HDC float dynamic_positive(int p) {  // p = 0..126
  int i = 0;
  while ((2 << i) <= p + 1) ++i;  // i = floor(log2(p + 1))
  const int j = p + 1 - (1 << i);
  const double v = (0.1 + 0.9 * static_cast<double>(2 * j + 1) / static_cast<double>(2 << i)) * decade_scale(i);
  return static_cast<float>(v);
}

VKQ_HDC float nf4_value(int k) {
  // NormalFloat4 (QLoRA, as bitsandbytes lists it): normal quantiles scaled to [-1, 1].
  double v = 1.0;
  switch (k) {
    case 0: v = -1.0; break;
    case 1: v = -0.6961928009986877; break;
    case 2: v = -0.5250730514526367; break;
    case 3: v = -0.39491748809814453; break;
    case 4: v = -0.28444138169288635; break;
    case 5: v = -0.18477343022823334; break;
    case 6: v = -0.09105003625154495; break;
    case 7: v = 0.0; break;
    case 8: v = 0.07958029955625534; break;
    case 9: v = 0.16093020141124725; break;
    case 10: v = 0.24611230194568634; break;
    case 11: v = 0.33791524171829224; break;
    case 12: v = 0.44070982933044434; break;
    case 13: v = 0.5626170039176941; break;
    case 14: v = 0.7229568362236023; break;
    default: v = 1.0; break;
  }
  return static_cast<float>(v);
}

VKQ_HDC float e2m1_magnitude(int c) {  // E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6
  c &= 7;
  return c < 4 ? 0.5f * static_cast<float>(c) : c == 4 ? 2.0f : c == 5 ? 3.0f : c == 6 ? 4.0f : 6.0f;
}

// The k-th smallest value of the format's table.
VKQ_HDC float sorted_value(int format, int k) {
  if (format == VK_QUANT_INT8_DYNAMIC) {
    if (k < 127) return -dynamic_positive(126 - k);
    if (k == 127) return 0.0f;
    if (k == 255) return 1.0f;
    return dynamic_positive(k - 128);
  }
  if (format == VK_QUANT_NF4) return nf4_value(k);
  return k < 7 ? -e2m1_magnitude(7 - k) : e2m1_magnitude(k - 7);
}

// The stored code of the k-th smallest value.
VKQ_HDC uint32_t code_of(int format, int k) {
  if (format != VK_QUANT_FP4) return static_cast<uint32_t>(k);
  return k < 7 ? 8u | static_cast<uint32_t>(7 - k) : static_cast<uint32_t>(k - 7);
}

// The value a code decodes to (scale 1).
VKQ_HDC float decode_value(int format, uint32_t code) {
  if (format == VK_QUANT_FP4) return (code & 8u) ? -e2m1_magnitude(static_cast<int>(code)) : e2m1_magnitude(static_cast<int>(code));
  return sorted_value(format, static_cast<int>(code));
}

VKQ_HDC float threshold(int format, int k) {  // between sorted values k and k+1
  const double a = sorted_value(format, k), b = sorted_value(format, k + 1);
  return static_cast<float>((a + b) * 0.5);
}

// Number of thr[0 .. slots-2] strictly below v (thr sorted, padded with +inf).
VKQ_HDC int count_below(const float* thr, int slots, float v) {
  int pos = 0;
  for (int step = slots >> 1; step > 0; step >>= 1)
    if (thr[pos + step - 1] < v) pos += step;
  return pos;
}

// Bucket of a normalized value's bits: sign, then the magnitude's octave and top mantissa bits.
VKQ_HDC int bucket_of(const table_spec& s, uint32_t bits) {
  const int mag = static_cast<int>((bits & 0x7fffffffu) >> (23 - s.mbits)) - (s.e0 << s.mbits);
  const int top = s.octaves << s.mbits;
  const int t = (mag < -1 ? -1 : (mag > top ? top : mag)) + 1;
  return static_cast<int>(bits >> 31) * s.per_sign() + t;
}

// Entry b of the bucket table: {threshold bits, low code | high code << 8}; ok = false when
// the bucket would hold more than one threshold (a table_spec too coarse for its table).
VKQ_HDC void make_bucket(int format, const table_spec& s, const float* thr, int b, uint32_t* out, bool* ok) {
  const int sign = b >= s.per_sign();
  const int t = b - sign * s.per_sign();
  const int top = s.octaves << s.mbits;
  uint32_t lo_bits = 0, hi_bits = 0;  // magnitude range of the bucket, inclusive
  if (t == 0) {
    lo_bits = 0;
    hi_bits = (static_cast<uint32_t>(s.e0) << 23) - 1;
  } else if (t <= top) {
    lo_bits = static_cast<uint32_t>((s.e0 << s.mbits) + t - 1) << (23 - s.mbits);
    hi_bits = lo_bits + (1u << (23 - s.mbits)) - 1;
  } else {
    lo_bits = static_cast<uint32_t>(s.e0 + s.octaves) << 23;
    hi_bits = 0x7f800000u;
  }
  const float vmin = sign ? -u2f(hi_bits) : u2f(lo_bits);
  const float vmax = sign ? -u2f(lo_bits) : u2f(hi_bits);
  const int lo = count_below(thr, s.slots, vmin), hi = count_below(thr, s.slots, vmax);
  *ok = hi - lo <= 1;
  const int last = s.values - 1;
  out[0] = f2u(thr[lo]);  // +inf padding when lo == last: never below v
  out[1] = code_of(format, lo) | (code_of(format, lo < last ? lo + 1 : last) << 8);
}

// The 4-bit formats also have a direct table: entry d (0..2047) serves every value whose top 11
// bits (sign, exponent, two mantissa bits) are d, so the index is one shift. Its buckets are the
// bucket table's (same mantissa bits) or parts of its first and last ones, so each still holds at
// most one threshold. Infinities and NaNs (exponent 255) get what +-inf gets: the last code for
// +inf and +NaN, the first for -inf and -NaN.
constexpr int kDirectEntries = 2048;
VKQ_HDC void make_direct(int format, const table_spec& s, const float* thr, int d, uint32_t* out) {
  const int sign = d >> 10;
  uint32_t lo_bits = static_cast<uint32_t>(d & 1023) << 21, hi_bits = lo_bits + (1u << 21) - 1;
  if (lo_bits >= 0x7f800000u) lo_bits = hi_bits = 0x7f800000u;
  const float vmin = sign ? -u2f(hi_bits) : u2f(lo_bits);
  const int lo = count_below(thr, s.slots, vmin);
  const int last = s.values - 1;
  out[0] = f2u(thr[lo]);
  out[1] = code_of(format, lo) | (code_of(format, lo < last ? lo + 1 : last) << 8);
}

// Packed entries: the encoders' shared-memory tables keep an entry in one 32-bit word instead of
// two, so that a warp's 32 lookups are one shared-memory wavefront, not two, and fall on half as
// many bank pairs (fewer conflicts). The values a regular entry serves share every bit above
// their low M (sign, exponent, top mantissa bits; M = 21 for the direct table and the 4-bit
// bucket tables, 16 for the dynamic map's), and a threshold in that range shares them too, so
// the comparison with it is one on the low M bits. The word holds ~T in its top M bits and two
// codes below them: the one taken when low(v) > T at bit W (4 or 8), the other at bit 0. The
// device finds low(v) > T as the carry out of (bits(v) << (32 - M)) + word (one instruction).
// For a negative range the order of the low bits is that of the magnitudes (v > thr when
// low(v) < low(thr)), so T and the codes' places are set to match. Ranges with no threshold (and
// bucket 0, the last bucket and the direct table's infinities and NaNs, whose values do not
// share their high bits) hold one code twice with ~T = 0, so that the carry never comes.
// ok = false when such a range would need a comparison (the table would be wrong).
VKQ_HDC int packed_low_bits(int format, bool direct) { return direct ? 21 : 23 - spec_of(format).mbits; }
VKQ_HDC int packed_code_shift(int format) { return format == VK_QUANT_INT8_DYNAMIC ? 8 : 4; }
VKQ_HDC uint32_t packed_entry(int format, bool direct, const float* thr, int b, bool* ok) {
  const table_spec s = spec_of(format);
  uint32_t e[2] = {0, 0};
  int sign = 0;
  bool regular = true;
  uint32_t lo_bits = 0, hi_bits = 0;  // magnitude range served, inclusive (+inf also takes NaNs)
  *ok = true;
  if (direct) {
    make_direct(format, s, thr, b, e);
    sign = b >> 10;
    lo_bits = static_cast<uint32_t>(b & 1023) << 21;
    hi_bits = lo_bits + (1u << 21) - 1;
    if (lo_bits >= 0x7f800000u) {
      regular = false;
      lo_bits = hi_bits = 0x7f800000u;
    }
  } else {
    make_bucket(format, s, thr, b, e, ok);
    sign = b >= s.per_sign();
    const int t = b - sign * s.per_sign(), top = s.octaves << s.mbits;
    if (t == 0) {
      regular = false;
      hi_bits = (static_cast<uint32_t>(s.e0) << 23) - 1;
    } else if (t <= top) {
      lo_bits = static_cast<uint32_t>((s.e0 << s.mbits) + t - 1) << (23 - s.mbits);
      hi_bits = lo_bits + (1u << (23 - s.mbits)) - 1;
    } else {
      regular = false;
      lo_bits = static_cast<uint32_t>(s.e0 + s.octaves) << 23;
      hi_bits = 0x7f800000u;
    }
  }
  const int M = packed_low_bits(format, direct), W = packed_code_shift(format);
  if (32 - M < 2 * W) *ok = false;  // the two codes would not fit below ~T (the dynamic map's 6-bit spec)
  const uint32_t mask = (1u << M) - 1, th = e[0], lo = e[1] & 0xffu, hi = (e[1] >> 8) & 0xffu;
  const uint32_t sbit = sign ? 0x80000000u : 0u;
  const float thf = u2f(th);
  const uint32_t c_first = u2f(sbit | lo_bits) > thf ? hi : lo, c_last = u2f(sbit | hi_bits) > thf ? hi : lo;
  if (!regular || (th & ~mask) != ((sbit | lo_bits) & ~mask)) {  // one code for the whole range
    if (c_first != c_last || (hi_bits == 0x7f800000u && c_last != lo)) *ok = false;  // NaNs take lo
    return (c_first << W) | c_first;
  }
  const uint32_t tl = th & mask;
  if (!sign) return ((~tl & mask) << (32 - M)) | (hi << W) | lo;
  if (tl == 0) return (lo << W) | lo;  // low(v) < 0 never: v <= thr throughout
  return ((~(tl - 1) & mask) << (32 - M)) | (lo << W) | hi;
}

}  // namespace vramkit::quant
