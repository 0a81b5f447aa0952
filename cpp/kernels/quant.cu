// Block-wise quantization kernels: encode (absmax per block, then one code per element),
// decode, and the double quantization of the absmax values. See vramkit/quant.h.
//
// Work layout: an encoder's thread block takes 4096 elements at a time (a tile; 8192 when
// vk_quant_set_launch says so), with 128 threads for the formats without a table and 512 for
// those of the table formats; a decoder's takes 4 vectors a thread (8 with 8192-element tiles)
// with 128 threads. Each thread holds rows of 16-byte vectors of the values (V = 4 fp32 or 8
// fp16/bf16 elements each; rows = tile / (threads x V)), so every load or store instruction of a
// warp moves 512 contiguous bytes. A quantization block of B elements is
// B/V consecutive vectors: within one warp up to 32 x rows vectors (its absmax from warp shuffles
// and a max over the thread's rows), across warps above that (one shared-memory step).
// The table formats' encoders run a persistent grid (a few blocks per multiprocessor loop over
// the tiles), so that each thread block builds its shared-memory tables once; the other encoders
// and every decoder run a block per tile (a decoder copies its value table, made at compile time). All arithmetic is exact or correctly
// rounded fp32 with no contraction (built with -fmad=false), so results are the same on every
// run, for every launch shape, and equal to the NumPy reference.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cfloat>
#include <cstdint>
#include <string>
#include <type_traits>

#include "quant_tables.cuh"

namespace vramkit::quant {
namespace {

// Launch shapes (threads per block, elements per tile) and cache hints, chosen from the H200's
// figures (docs/BENCHMARKS.md section 9, "Launch shapes from a traffic sweep"); the -D overrides
// build the other shapes measured there.
#ifndef VK_QUANT_ENC_THREADS_PLAIN
#define VK_QUANT_ENC_THREADS_PLAIN 128  // encoders of the formats without a table
#endif
#ifndef VK_QUANT_ENC_THREADS_TABLE
#define VK_QUANT_ENC_THREADS_TABLE 512  // table formats at their default block size
#endif
#ifndef VK_QUANT_ENC_THREADS_TABLE_OTHER
#define VK_QUANT_ENC_THREADS_TABLE_OTHER 128  // table formats at other block sizes
#endif
#ifndef VK_QUANT_DEC_THREADS
#define VK_QUANT_DEC_THREADS 128
#endif
#ifndef VK_QUANT_DEC_ROWS
#define VK_QUANT_DEC_ROWS 4  // 16-byte vectors of values per decoder thread and tile
#endif
#ifndef VK_QUANT_ENC_LDCS
#define VK_QUANT_ENC_LDCS 0
#endif
#ifndef VK_QUANT_DEC_STCS
#define VK_QUANT_DEC_STCS 1
#endif
#ifndef VK_QUANT_ENC_CONTIG
#define VK_QUANT_ENC_CONTIG 0  // 2, 4 or 8: table formats at their default block, that many consecutive vectors a thread (slower on an H100: docs/BENCHMARKS.md section 9)
#endif
#ifndef VK_QUANT_ENC_CONST_TABLES
#define VK_QUANT_ENC_CONST_TABLES 1  // the encoders' tables made at compile time and copied by each thread block (0: computed by each block; H100: NF4 fp32 encode 89.3 -> 91.1 % of copy, docs/BENCHMARKS.md section 9)
#endif
#ifndef VK_QUANT_ENC_TILES_16BIT
#define VK_QUANT_ENC_TILES_16BIT 1
#endif
#ifndef VK_QUANT_ENC_ONE_RECIP
#define VK_QUANT_ENC_ONE_RECIP 1  // one reciprocal for a thread's rows when they lie in one block (0: one a row)
#endif
constexpr int kThreads = 256;  // the scale compression
constexpr int kDecThreads = VK_QUANT_DEC_THREADS;
constexpr int kTile = 4096;                // encoder tile, elements (blocks of up to 4096 fit in one)
constexpr int kDecRows = VK_QUANT_DEC_ROWS;

__host__ __device__ constexpr bool is_table(int f) { return f == VK_QUANT_INT8_DYNAMIC || f == VK_QUANT_NF4 || f == VK_QUANT_FP4; }
__host__ __device__ constexpr bool is_4bit(int f) { return f == VK_QUANT_NF4 || f == VK_QUANT_FP4; }
// Encoder threads per block (LB: the kernel is made for one block size, 0 when not): 128 for the
// formats without a table (smaller thread blocks with plain loads, a block per tile: 96-104 % of
// copy bandwidth against 86-94 % at 256 threads with streaming loads and 16-bit inputs on a
// persistent grid); for the table formats, whose thread blocks build shared tables and loop over
// tiles, 512 at the default block size and 128 at the others (blocks of 1024 and 4096 span every
// warp of a thread block, and 512 threads wait longer at each barrier: NF4 at 4096, 62 % of copy
// bandwidth against 77 %).
// CONTIG (-DVK_QUANT_ENC_CONTIG=2, 4 or 8; the table formats at their default block size): each
// thread holds that many consecutive vectors of a tile instead of vectors a warp's width apart, so
// that a quantization block spans fewer lanes and each thread finds one absmax, one reciprocal,
// one scale store and one code store for all its rows; the threads are as many as make those rows
// (the default blocks, 64 or 256 elements, hold at least eight vectors). Instructions an element
// in the loop (SASS), default / 2 / 4 / 8 rows: NF4 bf16 16.4 / 12.9 / 12.0 / 10.6, dynamic map
// bf16 22.4 / 17.5 / 16.0 / 14.9, NF4 fp32 21.9 / 15.6 / 12.1 / 10.8. More rows a thread also
// spread a warp's loads over more cache lines. Off until it has been timed and tested on a GPU.
static_assert(VK_QUANT_ENC_CONTIG == 0 || VK_QUANT_ENC_CONTIG == 2 || VK_QUANT_ENC_CONTIG == 4 ||
                  VK_QUANT_ENC_CONTIG == 8,
              "VK_QUANT_ENC_CONTIG: 0, 2, 4 or 8 rows a thread");
template <int F, int LB> constexpr bool enc_contig = is_table(F) && LB != 0 && VK_QUANT_ENC_CONTIG != 0;
template <int F, int LB, typename T> constexpr int enc_threads = !is_table(F) ? VK_QUANT_ENC_THREADS_PLAIN
                                                   : enc_contig<F, LB> ? 4096 / (VK_QUANT_ENC_CONTIG * (16 / static_cast<int>(sizeof(T))))
                                                   : LB != 0  ? VK_QUANT_ENC_THREADS_TABLE
                                                              : VK_QUANT_ENC_THREADS_TABLE_OTHER;
__host__ __device__ constexpr float qmax(int f) {
  return f == VK_QUANT_INT8 ? 127.0f : f == VK_QUANT_FP8_E4M3 ? 448.0f : f == VK_QUANT_FP8_E5M2 ? 57344.0f
                                    : f == VK_QUANT_FP4  ? 6.0f : 1.0f;
}

template <typename T> struct elem { static constexpr int V = 16 / sizeof(T); };

// ---- element conversions from and to the raw bits of a 16-byte vector
template <typename T> __device__ __forceinline__ float bits_to_float(uint32_t w, int half);
template <> __device__ __forceinline__ float bits_to_float<float>(uint32_t w, int) { return __uint_as_float(w); }
template <> __device__ __forceinline__ float bits_to_float<__nv_bfloat16>(uint32_t w, int h) {
  return __uint_as_float(h ? (w & 0xffff0000u) : (w << 16));
}
template <> __device__ __forceinline__ float bits_to_float<__half>(uint32_t w, int h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h ? w >> 16 : w & 0xffffu)));
}
template <typename T> __device__ __forceinline__ float load_one(const T* p);
template <> __device__ __forceinline__ float load_one<float>(const float* p) { return *p; }
template <> __device__ __forceinline__ float load_one<__half>(const __half* p) { return __half2float(*p); }
template <> __device__ __forceinline__ float load_one<__nv_bfloat16>(const __nv_bfloat16* p) { return __bfloat162float(*p); }
template <typename T> __device__ __forceinline__ uint32_t float_to_bits(float v);  // 16-bit types: low half
template <> __device__ __forceinline__ uint32_t float_to_bits<float>(float v) { return __float_as_uint(v); }
template <> __device__ __forceinline__ uint32_t float_to_bits<__half>(float v) { return __half_as_ushort(__float2half_rn(v)); }
template <> __device__ __forceinline__ uint32_t float_to_bits<__nv_bfloat16>(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
template <typename T> __device__ __forceinline__ void store_one(T* p, float v);
template <> __device__ __forceinline__ void store_one<float>(float* p, float v) { *p = v; }
template <> __device__ __forceinline__ void store_one<__half>(__half* p, float v) { *p = __float2half_rn(v); }
template <> __device__ __forceinline__ void store_one<__nv_bfloat16>(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// V elements from element e on, as floats; zeros past n (they never raise an absmax).
template <typename T, bool VEC>
__device__ __forceinline__ void load_vec(const T* __restrict__ x, int64_t e, int64_t n, float* v) {
  constexpr int V = elem<T>::V;
  if (VEC && e + V <= n) {
    const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(x + e));  // read once: evict first
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = bits_to_float<T>(w[j * 4 / V], V == 8 ? (j & 1) : 0);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = e + j < n ? load_one<T>(x + e + j) : 0.0f;
  }
}

// ---- per-element encoders (the NumPy reference mirrors each step)
// rint(v * inv) clamped to [-127, 127], as int8 in the low byte (the bits above are not the
// code's). Clamping first gives the same integer (the bounds are integers), and adding 1.5 * 2^23
// rounds to the nearest integer, ties to even, into the low mantissa bits: no conversion
// instructions (a quarter of the arithmetic rate). A NaN product clamps to -127 either way.
__device__ __forceinline__ uint32_t enc_int8(float v, float inv) {
  const float q = fminf(fmaxf(__fmul_rn(v, inv), -127.0f), 127.0f);
  return __float_as_uint(__fadd_rn(q, 12582912.0f));
}
template <int F>
__device__ __forceinline__ uint32_t enc_fp8x2(float a, float b) {  // a -> low byte, b -> high byte
  unsigned short r;
  if constexpr (F == VK_QUANT_FP8_E4M3)
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  else
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  return r;
}

// bucket_of(s, bits of v) in fewer instructions: the magnitude clamped as a float (two min/max,
// the absolute value for free) into the range whose top bits index the regular buckets, then one
// shift. Equal to bucket_of for every v but signalling NaNs, which a product never is (compared
// over all 2^32 patterns when it was written; the GPU tests compare the codes with the
// reference's, test_gpu_non_finite_values_equal_the_reference those of infinities and NaNs).
__device__ __forceinline__ int bucket_of_float(const table_spec& s, float v) {
  const float lo = __uint_as_float((static_cast<uint32_t>(s.e0) << 23) - 1);  // largest of bucket 0
  const float hi = __uint_as_float((static_cast<uint32_t>(s.e0 + s.octaves) << 23) + (1u << (23 - s.mbits)) - 1);
  const float m = fmaxf(fminf(fabsf(v), hi), lo);  // min first: a NaN goes to the last bucket
  const int t = static_cast<int>(__float_as_uint(m) >> (23 - s.mbits)) - (s.e0 << s.mbits) + 1;
  return static_cast<int>(__float_as_uint(v) >> 31) * s.per_sign() + t;
}

// An encoder's table entry: packed (one word, quant_tables.cuh) for the formats packed_for()
// names, else {threshold bits, low code | high code << 16}.
template <int F> using table_word = std::conditional_t<packed_for(F), uint32_t, uint2>;

// Whether a packed entry's comparison holds (low M bits of v's bits above its T, S = 32 - M): the
// carry out of (u << S) + w, which the compiler makes one shift-and-add with a carry predicate.
template <int S>
__device__ __forceinline__ bool packed_above(uint32_t u, uint32_t w) {
  uint32_t c;
  asm("{\n\t.reg .u32 t;\n\tshl.b32 t, %1, %3;\n\tadd.cc.u32 t, t, %2;\n\taddc.u32 %0, 0, 0;\n\t}"
      : "=r"(c) : "r"(u), "r"(w), "n"(S));
  return c != 0;
}

// The code of a table format from its entry. Two-word entries keep the codes as low code | high
// code << 16 (see build_tables) and the result has the code in the low byte, the bits above it
// left to the packing, which takes only low bytes. Packed entries of a 4-bit format give the code
// in bits 0-3 (HIGH = false) or 4-7 (HIGH: the first element of a pair, its byte's high nibble),
// and the pair's byte is one bitwise select (pair_byte); those of the dynamic map in the low byte.
template <int F, bool HIGH>
__device__ __forceinline__ uint32_t code_from(table_word<F> b, float v) {
  if constexpr (packed_for(F)) {
    constexpr int S = 32 - packed_low_bits(F, F != VK_QUANT_INT8_DYNAMIC), W = packed_code_shift(F);
    static_assert(S >= 2 * W, "a packed entry's two codes fit below its threshold bits");
    const bool above = packed_above<S>(__float_as_uint(v), b);
    if constexpr (W == 4 && HIGH) return above ? b : b << 4;
    else return above ? b >> W : b;
  } else {
    return v > __uint_as_float(b.x) ? b.y >> 16 : b.y;
  }
}
static_assert(packed_low_bits(VK_QUANT_NF4, false) == 21 && packed_low_bits(VK_QUANT_FP4, false) == 21 &&
                  packed_low_bits(VK_QUANT_NF4, true) == 21,
              "the 4-bit formats' bucket and direct tables compare the same low bits");

// A 4-bit pair's byte (byte 0; the bits above it are not the pair's) from its two codes.
template <int F>
__device__ __forceinline__ uint32_t pair_byte(uint32_t first, uint32_t second) {
  if constexpr (packed_for(F)) {
    uint32_t r;  // (first & 0xf0) | (second & 0x0f): one three-input bitwise operation
    asm("lop3.b32 %0, %1, 0xf0, %2, 0xe2;" : "=r"(r) : "r"(first), "r"(second));
    return r;
  } else {
    return (first << 4) + second;  // no carry: the low nibbles are whole codes
  }
}

template <int F, bool HIGH = false>
__device__ __forceinline__ uint32_t enc_table(const table_spec& s, const table_word<F>* bucket, float v) {
  return code_from<F, HIGH>(bucket[bucket_of_float(s, v)], v);
}

// The same code from the direct table of a 4-bit format (index: the value's top 11 bits).
template <int F, bool HIGH = false>
__device__ __forceinline__ uint32_t enc_direct(const table_word<F>* direct, float v) {
  return code_from<F, HIGH>(direct[__float_as_uint(v) >> 21], v);
}

// DIRECT (4-bit formats): the 2048-entry direct table instead of the bucket table.
template <int F, bool DIRECT> struct alignas(16) shared_tables {
  static constexpr int kBuckets = !is_table(F) ? 1 : DIRECT ? kDirectEntries : spec_of(F).buckets();
  table_word<F> bucket[kBuckets];
  float thr[is_table(F) && !VK_QUANT_ENC_CONST_TABLES ? spec_of(F).slots : 1];  // only to build the buckets
};

// A table entry as the shared-memory tables keep it: one packed word, or {threshold bits, low
// code | high code << 16}.
VKQ_HDC void table_entry(int format, bool direct, const float* thr, int b, uint32_t* out) {
  if (packed_for(format)) {
    bool ok = true;
    out[0] = packed_entry(format, direct, thr, b, &ok);
    return;
  }
  uint32_t e[2] = {0, 0};
  const table_spec s = spec_of(format);
  if (direct) {
    make_direct(format, s, thr, b, e);
  } else {
    bool ok = true;
    make_bucket(format, s, thr, b, e, &ok);
  }
  out[0] = e[0];
  out[1] = (e[1] & 0xffu) | ((e[1] >> 8) & 0xffu) << 16;
}

// The same tables made at compile time (VK_QUANT_ENC_CONST_TABLES): each thread block copies its
// format's table into shared memory instead of computing it, as the decoders do with their values.
template <int F, bool DIRECT> struct const_table {
  static constexpr int kBuckets = shared_tables<F, DIRECT>::kBuckets;
  static constexpr int kWords = kBuckets * static_cast<int>(sizeof(table_word<F>) / 4);
  static_assert(kWords % 4 == 0, "copied 16 bytes at a time");
  alignas(16) uint32_t w[kWords];
};
template <int F, bool DIRECT> constexpr const_table<F, DIRECT> make_const_table() {
  constexpr table_spec s = spec_of(F);
  float thr[s.slots] = {};
  for (int k = 0; k < s.slots; ++k) thr[k] = k < s.values - 1 ? threshold(F, k) : u2f(0x7f800000u);
  const_table<F, DIRECT> t{};
  constexpr int words = static_cast<int>(sizeof(table_word<F>) / 4);
  for (int b = 0; b < const_table<F, DIRECT>::kBuckets; ++b) table_entry(F, DIRECT, thr, b, t.w + words * b);
  return t;
}
// Every bucket of a format's bucket table holds at most one threshold (else the one comparison
// per element would not find the nearest value).
template <int F> constexpr bool buckets_hold_one_threshold() {
  constexpr table_spec s = spec_of(F);
  float thr[s.slots] = {};
  for (int k = 0; k < s.slots; ++k) thr[k] = k < s.values - 1 ? threshold(F, k) : u2f(0x7f800000u);
  for (int b = 0; b < s.buckets(); ++b) {
    uint32_t e[2] = {0, 0};
    bool ok = true;
    make_bucket(F, s, thr, b, e, &ok);
    if (!ok) return false;
    if (packed_for(F)) packed_entry(F, false, thr, b, &ok);
    if (!ok) return false;
  }
  if constexpr (is_4bit(F) && packed_for(F)) {
    for (int d = 0; d < kDirectEntries; ++d) {
      bool ok = true;
      packed_entry(F, true, thr, d, &ok);
      if (!ok) return false;
    }
  }
  return true;
}
static_assert(buckets_hold_one_threshold<VK_QUANT_INT8_DYNAMIC>() && buckets_hold_one_threshold<VK_QUANT_NF4>() &&
                  buckets_hold_one_threshold<VK_QUANT_FP4>(),
              "a table_spec too coarse for its table");
#if VK_QUANT_ENC_CONST_TABLES
__device__ const const_table<VK_QUANT_INT8_DYNAMIC, false> kDynamicBuckets = make_const_table<VK_QUANT_INT8_DYNAMIC, false>();
__device__ const const_table<VK_QUANT_NF4, false> kNf4Buckets = make_const_table<VK_QUANT_NF4, false>();
__device__ const const_table<VK_QUANT_FP4, false> kFp4Buckets = make_const_table<VK_QUANT_FP4, false>();
__device__ const const_table<VK_QUANT_NF4, true> kNf4Direct = make_const_table<VK_QUANT_NF4, true>();
__device__ const const_table<VK_QUANT_FP4, true> kFp4Direct = make_const_table<VK_QUANT_FP4, true>();
template <int F, bool DIRECT> __device__ __forceinline__ const uint32_t* const_table_of() {
  if constexpr (F == VK_QUANT_INT8_DYNAMIC) return kDynamicBuckets.w;
  else if constexpr (F == VK_QUANT_NF4) return DIRECT ? kNf4Direct.w : kNf4Buckets.w;
  else return DIRECT ? kFp4Direct.w : kFp4Buckets.w;
}
#endif

template <int F, bool DIRECT>
__device__ void build_tables(shared_tables<F, DIRECT>& t) {
  if constexpr (is_table(F)) {
#if VK_QUANT_ENC_CONST_TABLES
    const uint4* src = reinterpret_cast<const uint4*>(const_table_of<F, DIRECT>());
    uint4* dst = reinterpret_cast<uint4*>(t.bucket);
    for (int i = threadIdx.x; i < const_table<F, DIRECT>::kWords / 4; i += blockDim.x) dst[i] = src[i];
#else
    constexpr table_spec s = spec_of(F);
    for (int k = threadIdx.x; k < s.slots; k += blockDim.x)
      t.thr[k] = k < s.values - 1 ? threshold(F, k) : __uint_as_float(0x7f800000u);
    __syncthreads();
    for (int b = threadIdx.x; b < shared_tables<F, DIRECT>::kBuckets; b += blockDim.x) {
      uint32_t e[2];
      table_entry(F, DIRECT, t.thr, b, e);
      if constexpr (packed_for(F)) t.bucket[b] = e[0];
      else t.bucket[b] = make_uint2(e[0], e[1]);
    }
#endif
    __syncthreads();
  }
}

// The raw bits of one 16-byte vector, and their values as floats.
template <typename T>
__device__ __forceinline__ void unpack_vec(const uint4& raw, float* v) {
  constexpr int V = elem<T>::V;
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = bits_to_float<T>(w[j * 4 / V], V == 8 ? (j & 1) : 0);
}

// One tile held in registers (v: row r of lane l is vector w*32R + 32r + l of the tile, or with
// CONTIG vector (32w + l)R + r): the absmax of each quantization block, then the codes. FULL: every element of the tile is below n
// (no bounds checks, vector stores); VEC: codes is 8-byte aligned (vector stores allowed).
template <int F, typename T, bool VEC, int TILE, bool DIRECT, bool FULL, int NT, bool CONTIG>
__device__ __forceinline__ void encode_tile(float (&v)[TILE / (NT * elem<T>::V)][elem<T>::V], int64_t base,
                                            int64_t n, int log2b, const shared_tables<F, DIRECT>& tables, float* part,
                                            uint8_t* __restrict__ codes, float* __restrict__ absmax) {
  constexpr int V = elem<T>::V, R = TILE / (NT * V), LOG2V = V == 4 ? 2 : 3;
  constexpr table_spec spec = spec_of(F);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int log2g = log2b - LOG2V, G = 1 << log2g;  // vectors per block
  const int width = G < 32 ? G : 32;
  const int rows_per_block = G <= 32 ? 1 : (G >> 5) < R ? (G >> 5) : R;
  float m[R];
  if constexpr (CONTIG) {  // a thread's rows lie in one block, which spans G / R lanes
    static_assert(R <= 8, "a default block (>= 64 elements) holds at least R consecutive vectors");
    float a = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < V; ++j) a = fmaxf(a, fabsf(v[r][j]));
    const int lanes = G / R < 32 ? G / R : 32;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1)
      if (off < lanes) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
#pragma unroll
    for (int r = 0; r < R; ++r) m[r] = a;
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      m[r] = 0.0f;
#pragma unroll
      for (int j = 0; j < V; ++j) m[r] = fmaxf(m[r], fabsf(v[r][j]));
#pragma unroll
      for (int off = 1; off < 32; off <<= 1)  // width is the same for the whole warp
        if (off < width) m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffffu, m[r], off));
    }
  }
  if (!CONTIG && rows_per_block > 1) {  // a block spans rows of this warp
    float g[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      g[r] = m[r];
#pragma unroll
      for (int k = 0; k < R; ++k)
        if ((k ^ r) < rows_per_block) g[r] = fmaxf(g[r], m[k]);  // same aligned group of rows
    }
#pragma unroll
    for (int r = 0; r < R; ++r) m[r] = g[r];
  }
  if (G > 32 * R) {  // a block spans warps (B >= 1024); uniform over the thread block
    __syncthreads();  // the last tile's readers of part are done
    if (lane == 0) part[warp] = m[0];
    __syncthreads();
    const int warps = G / (32 * R), first = warp & ~(warps - 1);
    float a = 0.0f;
    for (int i = 0; i < warps; ++i) a = fmaxf(a, part[first + i]);
#pragma unroll
    for (int r = 0; r < R; ++r) m[r] = a;
  }
  auto reciprocal = [](float a) { return a > 0.0f ? fminf(__fdiv_rn(qmax(F), a), FLT_MAX) : 0.0f; };
  // One reciprocal (an IEEE division) for all of the thread's rows where they lie in one block:
  // with CONTIG, and for blocks of 32 x R vectors and more (1,024 fp32 elements or 2,048 16-bit
  // ones at the default tile); one a row otherwise. CONTIG, whole tiles: the rows' code words are
  // kept for one store.
  constexpr bool JOIN = CONTIG && FULL && VEC;
  float inv_rows[R];  // R == 1: computed in the row's turn, as it always was
  if constexpr (R > 1) {
    if (CONTIG || (VK_QUANT_ENC_ONE_RECIP && G >= 32 * R)) {
      const float one = reciprocal(m[0]);
#pragma unroll
      for (int r = 0; r < R; ++r) inv_rows[r] = one;
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) inv_rows[r] = reciprocal(m[r]);
    }
  }
  uint32_t kept[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int vi = CONTIG ? (warp * 32 + lane) * R + r : warp * 32 * R + r * 32 + lane;
    const int64_t e = base + static_cast<int64_t>(vi) * V;
    if (!FULL && e >= n) continue;
    if ((CONTIG ? r == 0 : true) && (vi & (G - 1)) == 0) absmax[e >> log2b] = m[r];
    const float inv = R > 1 ? inv_rows[r] : reciprocal(m[r]);
    uint32_t c[V];
    if constexpr (F == VK_QUANT_INT8) {
#pragma unroll
      for (int j = 0; j < V; ++j) c[j] = enc_int8(v[r][j], inv);
    } else if constexpr (F == VK_QUANT_FP8_E4M3 || F == VK_QUANT_FP8_E5M2) {
#pragma unroll
      for (int j = 0; j < V; j += 2) {
        const uint32_t p = enc_fp8x2<F>(__fmul_rn(v[r][j], inv), __fmul_rn(v[r][j + 1], inv));
        c[j] = p;  // the low byte is element j's (packing takes low bytes only)
        c[j + 1] = p >> 8;
      }
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float q = __fmul_rn(v[r][j], inv);
        if (is_4bit(F) && j % 2 == 0)  // the first of a pair: its byte's high nibble
          c[j] = DIRECT ? enc_direct<F, true>(tables.bucket, q) : enc_table<F, true>(spec, tables.bucket, q);
        else
          c[j] = DIRECT ? enc_direct<F>(tables.bucket, q) : enc_table<F>(spec, tables.bucket, q);
      }
    }
    const bool whole = VEC && (FULL || e + V <= n);  // !VEC: codes may be unaligned
    // c[j]: element j's code in the low byte (4-bit codes: the low nibble), anything above it;
    // byte permutes gather the low bytes.
    auto low_bytes = [](uint32_t a, uint32_t b, uint32_t c2, uint32_t d) {
      return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c2, d, 0x0040), 0x5410);
    };
    if constexpr (is_4bit(F)) {  // first element in the high nibble
      uint32_t pb[V / 2];  // byte 0: the pair's byte
#pragma unroll
      for (int j = 0; j < V; j += 2) pb[j / 2] = pair_byte<F>(c[j], c[j + 1]);
      uint32_t w;
      if constexpr (V == 4) w = __byte_perm(pb[0], pb[1], 0x0040);
      else w = low_bytes(pb[0], pb[1], pb[2], pb[3]);
      uint8_t* dst = codes + (e >> 1);
      if constexpr (JOIN) {
        kept[r][0] = w;
      } else if (whole) {
        if constexpr (V == 4) *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(w);
        else *reinterpret_cast<uint32_t*>(dst) = w;
      } else {
        for (int j = 0; j < V / 2; ++j)
          if (e + 2 * j < n) dst[j] = static_cast<uint8_t>(w >> (8 * j));
      }
    } else {
      uint32_t w[2] = {0, 0};
#pragma unroll
      for (int k = 0; k < V / 4; ++k) w[k] = low_bytes(c[4 * k], c[4 * k + 1], c[4 * k + 2], c[4 * k + 3]);
      uint8_t* dst = codes + e;
      if constexpr (JOIN) {
        kept[r][0] = w[0];
        kept[r][1] = w[1];
      } else if (whole) {
        if constexpr (V == 4) *reinterpret_cast<uint32_t*>(dst) = w[0];
        else *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
      } else {
        for (int j = 0; j < V; ++j)
          if (e + j < n) dst[j] = static_cast<uint8_t>(w[j >> 2] >> (8 * (j & 3)));
      }
    }
  }
  if constexpr (JOIN) {  // the rows' codes are consecutive: stored together, 8 bytes at a time
    constexpr int CB = is_4bit(F) ? V / 2 : V;  // code bytes a row: 2, 4 or 8
    constexpr int NW = R * CB / 4;              // 32-bit words for all rows
    static_assert(R * CB % 4 == 0 && (NW == 1 || NW % 2 == 0), "whole words, in pairs");
    uint32_t words[NW];
#pragma unroll
    for (int i = 0; i < NW; ++i) {
      if constexpr (CB == 2) words[i] = __byte_perm(kept[2 * i][0], kept[2 * i + 1][0], 0x5410);
      else if constexpr (CB == 4) words[i] = kept[i][0];
      else words[i] = kept[i >> 1][i & 1];
    }
    const int64_t e = base + static_cast<int64_t>((warp * 32 + lane) * R) * V;
    uint8_t* dst = codes + (is_4bit(F) ? e >> 1 : e);  // a multiple of 4 x NW bytes from codes
    if constexpr (NW == 1) {
      *reinterpret_cast<uint32_t*>(dst) = words[0];
    } else {
#pragma unroll
      for (int i = 0; i < NW / 2; ++i) reinterpret_cast<uint2*>(dst)[i] = make_uint2(words[2 * i], words[2 * i + 1]);
    }
  }
}

// Calls step(current, ahead, t) for this thread block's tiles t below end, the two register sets
// taking turns (the step works on one while it loads the next tile into the other, so that no
// register moves between them); returns the first tile at or past end.
template <typename Set, typename Step>
__device__ __forceinline__ int64_t take_turns(Set (&sets)[2], int64_t tile, int64_t end, Step& step) {
  while (tile < end) {
    step(sets[0], sets[1], tile);
    tile += gridDim.x;
    if (tile >= end) break;
    step(sets[1], sets[0], tile);
    tile += gridDim.x;
  }
  return tile;
}

// VEC: x is 16-byte aligned and codes 8-byte aligned. Whole tiles take the fast path, and a thread
// block that loops over tiles (persistent grid) has the next tile's loads in flight while it
// encodes the current one.
// LB: log2 of the block size when the kernel is made for one (the loops over a block's lanes, rows
// and warps then have constant bounds), 0 when it takes log2b as it comes.
template <int F, typename T, bool VEC, int TILE, bool DIRECT, int LB = 0, int NT = enc_threads<F, LB, T>>
__global__ void __launch_bounds__(NT) encode_kernel(const T* __restrict__ x, int64_t n, int log2b_arg,
                                                          uint8_t* __restrict__ codes, float* __restrict__ absmax) {
  const int log2b = LB != 0 ? LB : log2b_arg;
  static_assert(!DIRECT || is_4bit(F), "direct tables are for the 4-bit formats");
  constexpr int V = elem<T>::V, R = TILE / (NT * V);
  static_assert(R >= 1, "a tile holds at least one vector per thread");
  __shared__ shared_tables<F, DIRECT> tables;
  __shared__ float part[NT / 32];  // one absmax per warp, for blocks that span warps
  build_tables<F>(tables);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t ntiles = (n + TILE - 1) / TILE;
  const int64_t full = VEC ? n / TILE : 0;  // tiles with every element below n
  // Vector index of row r of this thread within a tile.
  constexpr bool CONTIG = enc_contig<F, LB> && TILE == kTile;
  auto offset = [&](int r) {
    return static_cast<int64_t>(CONTIG ? (warp * 32 + lane) * R + r : warp * 32 * R + r * 32 + lane) * V;
  };
  // Whole tiles: two register sets take turns (one being encoded while the other's loads are in
  // flight), so that no register moves between them. Then the last, partial tile.
  uint4 raw[2][R];
  int64_t tile = blockIdx.x;
  auto load = [&](uint4 (&dst)[R], int64_t t) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4* p = reinterpret_cast<const uint4*>(x + t * TILE + offset(r));
      dst[r] = VK_QUANT_ENC_LDCS ? __ldcs(p) : *p;
    }
  };
  auto encode_whole = [&](const uint4 (&src)[R], uint4 (&ahead)[R], int64_t t) {
    float v[R][V];
#pragma unroll
    for (int r = 0; r < R; ++r) unpack_vec<T>(src[r], v[r]);
    if (t + gridDim.x < full) load(ahead, t + gridDim.x);
    encode_tile<F, T, VEC, TILE, DIRECT, true, NT, CONTIG>(v, t * TILE, n, log2b, tables, part, codes, absmax);
  };
  if (tile < full) load(raw[0], tile);
  tile = take_turns(raw, tile, full, encode_whole);
  for (; tile < ntiles; tile += gridDim.x) {
    float v[R][V];
#pragma unroll
    for (int r = 0; r < R; ++r) load_vec<T, VEC>(x, tile * TILE + offset(r), n, v[r]);
    encode_tile<F, T, VEC, TILE, DIRECT, false, NT, CONTIG>(v, tile * TILE, n, log2b, tables, part, codes, absmax);
  }
}

template <int F>
__device__ __forceinline__ float dec_value(uint32_t c, const float* lut) {
  if constexpr (F == VK_QUANT_INT8) return static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(c)));
  else if constexpr (F == VK_QUANT_FP8_E4M3 || F == VK_QUANT_FP8_E5M2) {
    unsigned int h2;  // exact: every float8 value is a half value
    const unsigned short in = static_cast<unsigned short>(c);
    if constexpr (F == VK_QUANT_FP8_E4M3) asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
    else asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(in));
    return __half2float(__ushort_as_half(static_cast<unsigned short>(h2 & 0xffffu)));
  } else {
    return lut[c];
  }
}

// What a thread loads for one tile of a decode: its code words and, per vector, the raw scale
// (the absmax, or the 8-bit code and the group's two parameters of a double-quantized absmax).
template <int R> struct decode_loads {
  uint32_t cw[R][2];
  float a[R], p0[R], p1[R];
  uint32_t q[R];
};

// One vector's code bytes (CB of them, CB = 2, 4 or 8) from an aligned address.
template <int CB>
__device__ __forceinline__ void load_code_words(const uint8_t* src, uint32_t (&cw)[2]) {
  if constexpr (CB == 2) cw[0] = __ldcs(reinterpret_cast<const unsigned short*>(src));
  else if constexpr (CB == 4) cw[0] = __ldcs(reinterpret_cast<const unsigned int*>(src));
  else {
    const uint2 t = __ldcs(reinterpret_cast<const uint2*>(src));
    cw[0] = t.x;
    cw[1] = t.y;
  }
}

// The raw scale of quantization block blk, into row r of L.
template <int R>
__device__ __forceinline__ void load_scale(decode_loads<R>& L, int r, const float* __restrict__ absmax,
                                           const uint8_t* __restrict__ q8, const float* __restrict__ params,
                                           int64_t blk) {
  if (absmax) {
    L.a[r] = __ldg(absmax + blk);
  } else {
    L.q[r] = __ldg(q8 + blk);
    L.p0[r] = __ldg(params + 2 * (blk >> 8));
    L.p1[r] = __ldg(params + 2 * (blk >> 8) + 1);
  }
}

// WHOLE: every element of the tile is below n and the buffers are aligned (VEC): a row's offsets
// are the thread's plus a constant, in 32 bits, and nothing is checked.
template <int F, typename T, bool VEC, int TILE, int NT, bool WHOLE>
__device__ __forceinline__ void decode_load(decode_loads<TILE / (NT * elem<T>::V)>& L, const uint8_t* __restrict__ codes,
                                            const float* __restrict__ absmax, const uint8_t* __restrict__ q8,
                                            const float* __restrict__ params, int64_t base, int64_t n, int log2b) {
  constexpr int V = elem<T>::V, R = TILE / (NT * V);
  constexpr int CB = is_4bit(F) ? V / 2 : V;  // code bytes per vector
  const int tid = threadIdx.x;
  if constexpr (WHOLE) {
    const uint8_t* src = codes + (is_4bit(F) ? base >> 1 : base) + tid * CB;
    const int64_t blk0 = base >> log2b;
    const int rem = static_cast<int>(base & ((int64_t{1} << log2b) - 1));  // a tile may start inside a block
#pragma unroll
    for (int r = 0; r < R; ++r) {
      L.cw[r][1] = 0;
      load_code_words<CB>(src + r * NT * CB, L.cw[r]);
    }
    // The scales: one branch for the tile, not one predicated pair per row.
    if (absmax) {
#pragma unroll
      for (int r = 0; r < R; ++r) L.a[r] = __ldg(absmax + blk0 + ((rem + (r * NT + tid) * V) >> log2b));
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) load_scale(L, r, nullptr, q8, params, blk0 + ((rem + (r * NT + tid) * V) >> log2b));
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t e = base + static_cast<int64_t>(r * NT + tid) * V;
      L.cw[r][0] = L.cw[r][1] = 0;
      L.a[r] = L.p0[r] = L.p1[r] = 0.0f;
      L.q[r] = 0;
      if (e >= n) continue;
      const uint8_t* src = codes + (is_4bit(F) ? e >> 1 : e);
      if (VEC && e + V <= n) {
        load_code_words<CB>(src, L.cw[r]);
      } else {
        for (int j = 0; j < CB; ++j)
          if ((is_4bit(F) ? e + 2 * j : e + j) < n) L.cw[r][j >> 2] |= static_cast<uint32_t>(src[j]) << (8 * (j & 3));
      }
      load_scale(L, r, absmax, q8, params, e >> log2b);
    }
  }
}

// One tile's values from its loads (WHOLE as in decode_load). The scale is the absmax (or the
// double-quantized one) over the format's largest code value; over 1 it is the absmax itself.
template <int F, typename T, bool VEC, int TILE, int NT, bool WHOLE>
__device__ __forceinline__ void decode_rows(const decode_loads<TILE / (NT * elem<T>::V)>& L, const float* lut, bool dq,
                                            int64_t base, int64_t n, T* __restrict__ out) {
  constexpr int V = elem<T>::V, R = TILE / (NT * V);
  const int tid = threadIdx.x;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t e = base + static_cast<int64_t>(r * NT + tid) * V;
    if (!WHOLE && e >= n) continue;
    const float a = dq ? __fadd_rn(L.p0[r], __fmul_rn(static_cast<float>(L.q[r]), L.p1[r])) : L.a[r];
    float s;
    if constexpr (qmax(F) == 1.0f) s = a;  // a / 1 is a
    else s = __fdiv_rn(a, qmax(F));
    float o[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      uint32_t c;
      if constexpr (is_4bit(F)) {
        const uint32_t byte = (L.cw[r][(j >> 1) >> 2] >> (8 * ((j >> 1) & 3))) & 0xffu;
        c = (j & 1) ? byte & 0xfu : byte >> 4;
      } else {
        c = (L.cw[r][j >> 2] >> (8 * (j & 3))) & 0xffu;
      }
      o[j] = __fmul_rn(dec_value<F>(c, lut), s);
    }
    if (WHOLE || (VEC && e + V <= n)) {
      uint32_t w[4];
      if constexpr (V == 4) {
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = float_to_bits<T>(o[j]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = float_to_bits<T>(o[2 * j]) | (float_to_bits<T>(o[2 * j + 1]) << 16);
      }
      uint4* dst = WHOLE ? reinterpret_cast<uint4*>(out + base + tid * V + r * NT * V) : reinterpret_cast<uint4*>(out + e);
      if constexpr (VK_QUANT_DEC_STCS) __stcs(dst, make_uint4(w[0], w[1], w[2], w[3]));
      else *dst = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      for (int j = 0; j < V; ++j)
        if (e + j < n) store_one<T>(out + e + j, o[j]);
    }
  }
}

// The decoded value of each code (scale 1), computed at compile time by decode_value: a thread
// block copies its format's table into shared memory instead of computing it.
struct value_table {
  float v[256];
};
template <int F> constexpr value_table make_value_table() {
  value_table t{};
  for (int k = 0; k < (F == VK_QUANT_INT8_DYNAMIC ? 256 : 16); ++k) t.v[k] = decode_value(F, static_cast<uint32_t>(k));
  return t;
}
__device__ const value_table kDynamicValues = make_value_table<VK_QUANT_INT8_DYNAMIC>();
__device__ const value_table kNf4Values = make_value_table<VK_QUANT_NF4>();
__device__ const value_table kFp4Values = make_value_table<VK_QUANT_FP4>();
template <int F> __device__ __forceinline__ const float* value_table_of() {
  return F == VK_QUANT_INT8_DYNAMIC ? kDynamicValues.v : F == VK_QUANT_NF4 ? kNf4Values.v : kFp4Values.v;
}

// VEC: out is 16-byte aligned and codes 8-byte aligned (whole tiles then take the fast path). A
// thread block that loops over tiles (persistent grid) has the next tile's loads in flight while
// it decodes the current one.
template <int F, typename T, bool VEC, int TILE, int NT = kDecThreads>
__global__ void __launch_bounds__(NT) decode_kernel(const uint8_t* __restrict__ codes, const float* __restrict__ absmax,
                                                          const uint8_t* __restrict__ q8, const float* __restrict__ params,
                                                          int64_t n, int log2b, T* __restrict__ out) {
  constexpr int V = elem<T>::V, R = TILE / (NT * V);
  static_assert(R >= 1 && R * NT * V == TILE, "a tile is a whole number of vectors per thread");
  __shared__ float lut[F == VK_QUANT_INT8_DYNAMIC ? 256 : 16];
  if constexpr (is_table(F)) {
    for (int k = threadIdx.x; k < (F == VK_QUANT_INT8_DYNAMIC ? 256 : 16); k += blockDim.x) lut[k] = value_table_of<F>()[k];
    __syncthreads();
  }
  const bool dq = absmax == nullptr;
  const int64_t ntiles = (n + TILE - 1) / TILE;
  const int64_t whole = VEC ? n / TILE : 0;  // tiles with every element below n
  int64_t tile = blockIdx.x;
  auto load = [&](decode_loads<R>& L, int64_t t) {
    if (t < whole) decode_load<F, T, VEC, TILE, NT, true>(L, codes, absmax, q8, params, t * TILE, n, log2b);
    else decode_load<F, T, VEC, TILE, NT, false>(L, codes, absmax, q8, params, t * TILE, n, log2b);
  };
  // Two sets of loads take turns (one decoded while the other's are in flight): no copies.
  decode_loads<R> buf[2];
  auto decode_one = [&](const decode_loads<R>& L, decode_loads<R>& ahead, int64_t t) {
    if (t + gridDim.x < ntiles) load(ahead, t + gridDim.x);
    if (t < whole) decode_rows<F, T, VEC, TILE, NT, true>(L, lut, dq, t * TILE, n, out);
    else decode_rows<F, T, VEC, TILE, NT, false>(L, lut, dq, t * TILE, n, out);
  };
  if (tile < ntiles) load(buf[0], tile);
  take_turns(buf, tile, ntiles, decode_one);
}

// One thread block per group of 256 absmax values: min, max, then 8-bit codes of (a - min).
__global__ void __launch_bounds__(kThreads) compress_scales_kernel(const float* __restrict__ absmax, int64_t nblocks,
                                                                   uint8_t* __restrict__ q8, float* __restrict__ params) {
  __shared__ float smin[kThreads / 32], smax[kThreads / 32];
  const int tid = threadIdx.x;
  const int64_t groups = (nblocks + VK_QUANT_SCALE_GROUP - 1) / VK_QUANT_SCALE_GROUP;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t i = g * VK_QUANT_SCALE_GROUP + tid;
    const float nan = __uint_as_float(0x7fc00000u);  // fminf/fmaxf skip it
    const float a = i < nblocks ? absmax[i] : nan;
    float lo = a, hi = a;
    for (int off = 16; off > 0; off >>= 1) {
      lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, off));
      hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, off));
    }
    __syncthreads();  // the last group's readers are done
    if ((tid & 31) == 0) {
      smin[tid >> 5] = lo;
      smax[tid >> 5] = hi;
    }
    __syncthreads();
    lo = smin[0];
    hi = smax[0];
    for (int w = 1; w < kThreads / 32; ++w) {
      lo = fminf(lo, smin[w]);
      hi = fmaxf(hi, smax[w]);
    }
    const float range = __fsub_rn(hi, lo);
    const float inv = range > 0.0f ? fminf(__fdiv_rn(255.0f, range), FLT_MAX) : 0.0f;
    if (i < nblocks) q8[i] = static_cast<uint8_t>(__float2uint_rn(fminf(rintf(__fmul_rn(__fsub_rn(a, lo), inv)), 255.0f)));
    if (tid == 0) {
      params[2 * g] = lo;
      params[2 * g + 1] = __fdiv_rn(range, 255.0f);
    }
  }
}

// A kernel that only moves bytes as the codecs do, for the benchmark's ceilings: vector i reads RB
// bytes at src + i * RB and writes WB bytes at dst + i * WB (16-byte sides streamed as the codecs
// stream theirs), four vectors per thread, one thread block per 1024 vectors.
template <int B> struct word_of;
template <> struct word_of<2> { using type = unsigned short; };
template <> struct word_of<4> { using type = unsigned int; };
template <> struct word_of<8> { using type = uint2; };
template <> struct word_of<16> { using type = uint4; };
template <int B> __device__ __forceinline__ uint32_t fold(const typename word_of<B>::type& w) {
  if constexpr (B == 16) return w.x ^ w.y ^ w.z ^ w.w;
  else if constexpr (B == 8) return w.x ^ w.y;
  else return static_cast<uint32_t>(w);
}
template <int B> __device__ __forceinline__ typename word_of<B>::type spread(uint32_t x) {
  if constexpr (B == 16) return make_uint4(x, x + 1, x + 2, x + 3);
  else if constexpr (B == 8) return make_uint2(x, x + 1);
  else return static_cast<typename word_of<B>::type>(x);
}
// The probe's shape per pattern, the fastest of a sweep on the H200 (threads 128-512, 1-8 vectors
// per thread, cache hints, grids): mostly reads, 512 threads of 2 vectors; mostly writes, 128
// threads of 2 vectors with streaming stores; a copy, 256 threads of one.
template <int RB, int WB> struct traffic_shape {
  static constexpr int threads = RB == WB ? 256 : RB == 16 ? 512 : 128;
  static constexpr int rows = RB == WB ? 1 : 2;
  static constexpr bool stream_stores = RB < WB;
};
template <int RB, int WB, int NT = traffic_shape<RB, WB>::threads>
__global__ void __launch_bounds__(NT) traffic_kernel(const void* __restrict__ src, int64_t vectors, void* __restrict__ dst) {
  using RW = typename word_of<RB>::type;
  using WW = typename word_of<WB>::type;
  constexpr int R = traffic_shape<RB, WB>::rows;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * NT * R + threadIdx.x;
  uint32_t x[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t i = first + r * NT;
    x[r] = 0;
    if (i < vectors) x[r] = fold<RB>(static_cast<const RW*>(src)[i]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t i = first + r * NT;
    if (i >= vectors) continue;
    if constexpr (traffic_shape<RB, WB>::stream_stores) __stcs(static_cast<WW*>(dst) + i, spread<WB>(x[r]));
    else static_cast<WW*>(dst)[i] = spread<WB>(x[r]);
  }
}

// ---- host side
thread_local std::string g_error;

int fail(int code, std::string msg) {
  g_error = std::move(msg);
  return code;
}

int cuda_fail(cudaError_t e, const char* what) {
  return fail(VK_QUANT_ECUDA, std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

int sm_count(int device) {
  static std::atomic<int> cache[64];
  if (device >= 0 && device < 64 && cache[device].load() > 0) return cache[device].load();
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) sms = 132;
  if (device >= 0 && device < 64) cache[device].store(sms);
  return sms;
}

// At most this many thread blocks in a persistent grid (0: no cap). Tests set it so that every
// block loops over several tiles on buffers of a few MiB (vk_quant_set_max_blocks).
std::atomic<int> g_max_blocks{0};

// Persistent grid: as many thread blocks as fit on the device at once, at most one per tile.
template <auto Kernel, int NT>
unsigned grid_for(int64_t work_items, int device) {
  static const int per_sm = [] {
    int b = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, Kernel, NT, 0) == cudaSuccess && b > 0 ? b : 4;
  }();
  int64_t g = static_cast<int64_t>(sm_count(device)) * per_sm;
  const int cap = g_max_blocks.load(std::memory_order_relaxed);
  if (cap > 0 && cap < g) g = cap;
  return static_cast<unsigned>(work_items < g ? (work_items > 0 ? work_items : 1) : g);
}

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

int log2_block(int block) {
  if (block < 32 || block > 4096 || (block & (block - 1)) != 0) return -1;
  int l = 0;
  while ((1 << l) < block) ++l;
  return l;
}

// Runs fn on `device`, then makes the caller's device current again.
template <typename Fn>
int on_device(int device, Fn&& fn) {
  int cur = -1;
  cudaError_t e = cudaGetDevice(&cur);
  if (e != cudaSuccess) return cuda_fail(e, "cudaGetDevice");
  if (cur != device && (e = cudaSetDevice(device)) != cudaSuccess) return cuda_fail(e, "cudaSetDevice");
  const int rc = fn();
  if (cur != device) cudaSetDevice(cur);
  return rc;
}

// Launch shape, process-wide (vk_quant_set_launch): the elements a thread block takes at a time,
// and whether the grid is persistent (as many blocks as are resident, each looping over tiles and
// loading the next while it works on the current one) or one block per tile (the hardware's
// scheduler then balances the last wave).
std::atomic<int> g_tile{kTile};
std::atomic<int> g_grid_mode{0};  // 0 auto (per kernel, below), 1 persistent, 2 a block per tile
// Table of the 4-bit encoders: 0 the default (direct with a persistent grid, where each thread
// block builds it once; buckets with a block per tile), 1 buckets, 2 direct.
std::atomic<int> g_table{0};

// The automatic grid, from the H200's figures (docs/BENCHMARKS.md section 9): a block per tile
// for every decoder (their tables are copied, not computed) and for the encoders of the formats
// without a table; persistent for the table formats' encoders, whose thread blocks build their
// tables once.
template <int F, typename T>
bool tiles_grid(bool encode) {
  const int mode = g_grid_mode.load(std::memory_order_relaxed);
  if (mode != 0) return mode == 2;
  return !encode || (!is_table(F) && (sizeof(T) == 4 || VK_QUANT_ENC_TILES_16BIT));
}

template <auto Kernel, int NT>
unsigned grid_of(int64_t tiles, int device, bool per_tile) {
  if (per_tile) return static_cast<unsigned>(tiles < INT32_MAX ? (tiles > 0 ? tiles : 1) : INT32_MAX);
  return grid_for<Kernel, NT>(tiles, device);
}

template <int F, typename T, bool VEC, int TILE, bool DIRECT = false, int LB = 0>
int launch_encode(const T* x, int64_t n, int log2b, uint8_t* codes, float* absmax, int device, cudaStream_t st) {
  constexpr int NT = enc_threads<F, LB, T>;
  constexpr auto kernel = encode_kernel<F, T, VEC, TILE, DIRECT, LB, NT>;
  kernel<<<grid_of<kernel, NT>((n + TILE - 1) / TILE, device, tiles_grid<F, T>(true)), NT, 0, st>>>(
      x, n, log2b, codes, absmax);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? VK_QUANT_OK : cuda_fail(e, "vk_quant_encode: kernel launch");
}

// The default block size of each format (vramkit.quant's: 256 for the 8-bit formats, 64 for the
// 4-bit ones) has kernels of its own at the default tile.
template <int F> constexpr int kDefaultLog2b = is_4bit(F) ? 6 : 8;
template <int F, typename T, bool DIRECT = false>
int launch_encode_default_tile(const T* x, int64_t n, int log2b, uint8_t* codes, float* absmax, int device, cudaStream_t st) {
  if (log2b == kDefaultLog2b<F>)
    return launch_encode<F, T, true, kTile, DIRECT, kDefaultLog2b<F>>(x, n, log2b, codes, absmax, device, st);
  return launch_encode<F, T, true, kTile, DIRECT>(x, n, log2b, codes, absmax, device, st);
}

template <int F, typename T>
int encode_as(const void* x, int64_t n, int log2b, void* codes, float* absmax, int device, cudaStream_t st) {
  const bool vec = aligned(x, 16) && aligned(codes, 8);
  auto* xp = static_cast<const T*>(x);
  auto* cp = static_cast<uint8_t*>(codes);
  if (!vec) return launch_encode<F, T, false, kTile>(xp, n, log2b, cp, absmax, device, st);
  const bool wide = g_tile.load(std::memory_order_relaxed) == 2 * kTile;
  if constexpr (is_4bit(F)) {
    const int table = g_table.load(std::memory_order_relaxed);
    if (table == 2 || (table == 0 && !tiles_grid<F, T>(true)))
      return wide ? launch_encode<F, T, true, 2 * kTile, true>(xp, n, log2b, cp, absmax, device, st)
                  : launch_encode_default_tile<F, T, true>(xp, n, log2b, cp, absmax, device, st);
  }
  return wide ? launch_encode<F, T, true, 2 * kTile>(xp, n, log2b, cp, absmax, device, st)
              : launch_encode_default_tile<F, T>(xp, n, log2b, cp, absmax, device, st);
}

// The decoder's tile for T: kDecRows vectors a thread (2048 fp32 or 4096 16-bit elements), or
// twice that when 8192-element tiles are asked for (vk_quant_set_launch).
template <typename T, int WIDE> constexpr int dec_tile = kDecThreads * elem<T>::V * kDecRows * WIDE;

template <int F, typename T, bool VEC, int WIDE>
int launch_decode(const uint8_t* codes, const float* absmax, const uint8_t* q8, const float* params, int64_t n,
                  int log2b, T* out, int device, cudaStream_t st) {
  constexpr int TILE = dec_tile<T, WIDE>;
  constexpr auto kernel = decode_kernel<F, T, VEC, TILE, kDecThreads>;
  kernel<<<grid_of<kernel, kDecThreads>((n + TILE - 1) / TILE, device, tiles_grid<F, T>(false)), kDecThreads, 0, st>>>(
      codes, absmax, q8, params, n, log2b, out);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? VK_QUANT_OK : cuda_fail(e, "vk_quant_decode: kernel launch");
}

template <int F, typename T>
int decode_as(const void* codes, const float* absmax, const uint8_t* q8, const float* params, int64_t n, int log2b,
              void* out, int device, cudaStream_t st) {
  const bool vec = aligned(out, 16) && aligned(codes, 8);
  auto* cp = static_cast<const uint8_t*>(codes);
  auto* op = static_cast<T*>(out);
  if (!vec) return launch_decode<F, T, false, 1>(cp, absmax, q8, params, n, log2b, op, device, st);
  if (g_tile.load(std::memory_order_relaxed) == 2 * kTile)
    return launch_decode<F, T, true, 2>(cp, absmax, q8, params, n, log2b, op, device, st);
  return launch_decode<F, T, true, 1>(cp, absmax, q8, params, n, log2b, op, device, st);
}

template <template <int, typename> class Op, typename... A>
int dispatch(int format, int dtype, A... a) {
#define VKQ_CASE(F)                                                                   \
  case F:                                                                             \
    return dtype == VK_QUANT_F32 ? Op<F, float>::run(a...)                            \
         : dtype == VK_QUANT_F16 ? Op<F, __half>::run(a...) : Op<F, __nv_bfloat16>::run(a...);
  switch (format) {
    VKQ_CASE(VK_QUANT_INT8)
    VKQ_CASE(VK_QUANT_INT8_DYNAMIC)
    VKQ_CASE(VK_QUANT_FP8_E4M3)
    VKQ_CASE(VK_QUANT_FP8_E5M2)
    VKQ_CASE(VK_QUANT_NF4)
    VKQ_CASE(VK_QUANT_FP4)
  }
#undef VKQ_CASE
  return fail(VK_QUANT_EINVAL, "unknown format " + std::to_string(format));
}
template <int F, typename T> struct encode_op {
  template <typename... A> static int run(A... a) { return encode_as<F, T>(a...); }
};
template <int F, typename T> struct decode_op {
  template <typename... A> static int run(A... a) { return decode_as<F, T>(a...); }
};

int check_common(int format, int dtype, int64_t n, int block, const char* fn) {
  if (format < VK_QUANT_INT8 || format > VK_QUANT_FP4) return fail(VK_QUANT_EINVAL, std::string(fn) + ": unknown format " + std::to_string(format));
  if (dtype < VK_QUANT_F32 || dtype > VK_QUANT_BF16) return fail(VK_QUANT_EINVAL, std::string(fn) + ": unknown dtype " + std::to_string(dtype));
  if (log2_block(block) < 0)
    return fail(VK_QUANT_EINVAL, std::string(fn) + ": block must be a power of two from 32 to 4096 (got " + std::to_string(block) + ")");
  if (n < 0) return fail(VK_QUANT_EINVAL, std::string(fn) + ": negative element count");
  if (is_4bit(format) && (n & 1)) return fail(VK_QUANT_EINVAL, std::string(fn) + ": 4-bit formats need an even element count (got " + std::to_string(n) + ")");
  return VK_QUANT_OK;
}

}  // namespace
}  // namespace vramkit::quant

using namespace vramkit::quant;

extern "C" int vk_quant_encode(int format, int dtype, const void* x, int64_t n, int block, void* codes, float* absmax,
                               int device, void* stream) {
  if (int rc = check_common(format, dtype, n, block, "vk_quant_encode")) return rc;
  if (n == 0) return VK_QUANT_OK;
  if (!x || !codes || !absmax) return fail(VK_QUANT_EINVAL, "vk_quant_encode: null pointer");
  return on_device(device, [&] {
    return dispatch<encode_op>(format, dtype, x, n, log2_block(block), codes, absmax, device, static_cast<cudaStream_t>(stream));
  });
}

extern "C" int vk_quant_decode(int format, int dtype, const void* codes, const float* absmax, const uint8_t* q8,
                               const float* params, int64_t n, int block, void* out, int device, void* stream) {
  if (int rc = check_common(format, dtype, n, block, "vk_quant_decode")) return rc;
  if (n == 0) return VK_QUANT_OK;
  if (!codes || !out || (!absmax && (!q8 || !params))) return fail(VK_QUANT_EINVAL, "vk_quant_decode: null pointer");
  return on_device(device, [&] {
    return dispatch<decode_op>(format, dtype, codes, absmax, q8, params, n, log2_block(block), out, device,
                               static_cast<cudaStream_t>(stream));
  });
}

extern "C" int vk_quant_compress_scales(const float* absmax, int64_t nblocks, uint8_t* q8, float* params, int device,
                                        void* stream) {
  if (nblocks < 0) return fail(VK_QUANT_EINVAL, "vk_quant_compress_scales: negative block count");
  if (nblocks == 0) return VK_QUANT_OK;
  if (!absmax || !q8 || !params) return fail(VK_QUANT_EINVAL, "vk_quant_compress_scales: null pointer");
  return on_device(device, [&] {
    const int64_t groups = (nblocks + VK_QUANT_SCALE_GROUP - 1) / VK_QUANT_SCALE_GROUP;
    const unsigned grid = static_cast<unsigned>(groups < (1 << 20) ? groups : (1 << 20));
    compress_scales_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(absmax, nblocks, q8, params);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? VK_QUANT_OK : cuda_fail(e, "vk_quant_compress_scales: kernel launch");
  });
}

extern "C" int vk_quant_probe_traffic(const void* src, int read_bytes, void* dst, int write_bytes, int64_t vectors,
                                      int device, void* stream) {
  auto ok = [](int b) { return b == 2 || b == 4 || b == 8 || b == 16; };
  if (!ok(read_bytes) || !ok(write_bytes) || (read_bytes != 16 && write_bytes != 16))
    return fail(VK_QUANT_EINVAL, "vk_quant_probe_traffic: one side moves 16 bytes per vector, the other 2, 4, 8 or 16 (got " +
                                     std::to_string(read_bytes) + " and " + std::to_string(write_bytes) + ")");
  if (vectors < 0) return fail(VK_QUANT_EINVAL, "vk_quant_probe_traffic: negative vector count");
  if (vectors == 0) return VK_QUANT_OK;
  if (!src || !dst) return fail(VK_QUANT_EINVAL, "vk_quant_probe_traffic: null pointer");
  if (!aligned(src, read_bytes) || !aligned(dst, write_bytes)) return fail(VK_QUANT_EINVAL, "vk_quant_probe_traffic: unaligned pointer");
  return on_device(device, [&] {
    if (vectors > static_cast<int64_t>(INT32_MAX) * 256)  // at least 256 vectors a thread block
      return fail(VK_QUANT_EINVAL, "vk_quant_probe_traffic: too many vectors");
    auto st = static_cast<cudaStream_t>(stream);
    auto launch = [&](auto kernel, int threads, int rows) {
      const int64_t per_block = static_cast<int64_t>(threads) * rows;
      kernel<<<static_cast<unsigned>((vectors + per_block - 1) / per_block), threads, 0, st>>>(src, vectors, dst);
    };
#define VKQ_TRAFFIC(R, W)                   \
  if (read_bytes == R && write_bytes == W) \
    launch(traffic_kernel<R, W>, traffic_shape<R, W>::threads, traffic_shape<R, W>::rows);
    VKQ_TRAFFIC(16, 16) VKQ_TRAFFIC(16, 8) VKQ_TRAFFIC(16, 4) VKQ_TRAFFIC(16, 2)
    VKQ_TRAFFIC(8, 16) VKQ_TRAFFIC(4, 16) VKQ_TRAFFIC(2, 16)
#undef VKQ_TRAFFIC
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? VK_QUANT_OK : cuda_fail(e, "vk_quant_probe_traffic: kernel launch");
  });
}

extern "C" int vk_quant_set_launch(int tile, int grid_mode, int table) {
  if (tile != 0 && tile != kTile && tile != 2 * kTile)
    return fail(VK_QUANT_EINVAL, "vk_quant_set_launch: tile must be 0 (default), " + std::to_string(kTile) + " or " +
                                     std::to_string(2 * kTile) + " (got " + std::to_string(tile) + ")");
  if (grid_mode < 0 || grid_mode > 2)
    return fail(VK_QUANT_EINVAL,
                "vk_quant_set_launch: grid_mode must be 0 (per kernel), 1 (persistent) or 2 (a block per tile), not " +
                    std::to_string(grid_mode));
  if (table < 0 || table > 2)
    return fail(VK_QUANT_EINVAL, "vk_quant_set_launch: table must be 0 (default), 1 (buckets) or 2 (direct), not " +
                                     std::to_string(table));
  g_tile.store(tile == 0 ? kTile : tile);
  g_grid_mode.store(grid_mode);
  g_table.store(table);
  return VK_QUANT_OK;
}

extern "C" int vk_quant_set_max_blocks(int blocks) {
  if (blocks < 0) return fail(VK_QUANT_EINVAL, "vk_quant_set_max_blocks: blocks must be 0 (no cap) or more, not " +
                                                    std::to_string(blocks));
  g_max_blocks.store(blocks);
  return VK_QUANT_OK;
}

extern "C" const char* vk_quant_last_error(void) { return g_error.c_str(); }

extern "C" int vk_quant_pointer_device(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // leave no sticky error for the next launch check
    return -1;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

extern "C" int vk_quant_table(int format, int what, void* out, int cap) {
  if (!is_table(format) || what < 0 || what > 5 || ((what == 3 || what == 5) && !is_4bit(format))) return -1;
  const table_spec s = spec_of(format);
  float thr[256];
  for (int k = 0; k < s.slots; ++k) thr[k] = k < s.values - 1 ? threshold(format, k) : u2f(0x7f800000u);
  if (what == 0) {
    const int count = format == VK_QUANT_INT8_DYNAMIC ? 256 : 16;
    for (int c = 0; c < count && c < cap; ++c) static_cast<float*>(out)[c] = decode_value(format, static_cast<uint32_t>(c));
    return count;
  }
  if (what == 1) {
    for (int k = 0; k < s.values - 1 && k < cap; ++k) static_cast<float*>(out)[k] = thr[k];
    return s.values - 1;
  }
  if (what == 3) {
    for (int d = 0; d < kDirectEntries && d < cap; ++d) make_direct(format, s, thr, d, static_cast<uint32_t*>(out) + 2 * d);
    return kDirectEntries;
  }
  if (what >= 4) {
    const bool direct = what == 5;
    const int count = direct ? kDirectEntries : s.buckets();
    bool all_ok = true;
    for (int b = 0; b < count; ++b) {
      bool ok = true;
      const uint32_t w = packed_entry(format, direct, thr, b, &ok);
      if (b < cap) static_cast<uint32_t*>(out)[b] = w;
      all_ok = all_ok && ok;
    }
    return all_ok ? count : -2;
  }
  bool all_ok = true;
  for (int b = 0; b < s.buckets() && b < cap; ++b) {
    bool ok;
    make_bucket(format, s, thr, b, static_cast<uint32_t*>(out) + 2 * b, &ok);
    all_ok = all_ok && ok;
  }
  return all_ok ? s.buckets() : -2;
}
