/* vramkit block-wise quantization kernels: a C interface (libvramkit_kernels).
 *
 * A buffer of n fp32/fp16/bf16 values is cut into blocks of `block` contiguous elements
 * (a power of two from 32 to 4096; the last block may be shorter). Each block stores its
 * absmax (fp32) and one code per element: 1 byte (int8, int8_dynamic, fp8_e4m3, fp8_e5m2) or
 * 4 bits (nf4, fp4: two codes per byte, the first element in the high nibble).
 * docs/quantization.md gives the exact arithmetic; python/vramkit/quant/_reference.py is the
 * NumPy reference that the GPU results equal bit for bit.
 *
 * Every call is ordered on `stream` (a cudaStream_t; 0 is the legacy default stream), never
 * waits for the device, and returns 0 or a VK_QUANT_E* code with vk_quant_last_error() set.
 */
#ifndef VRAMKIT_QUANT_H
#define VRAMKIT_QUANT_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum vk_quant_format {
  VK_QUANT_INT8 = 0,          /* symmetric int8, code = rint(x * 127 / absmax) */
  VK_QUANT_INT8_DYNAMIC = 1,  /* the signed dynamic 8-bit map (Dettmers 2015), 256 values */
  VK_QUANT_FP8_E4M3 = 2,      /* x * 448 / absmax cast to float8 e4m3fn (round to nearest even) */
  VK_QUANT_FP8_E5M2 = 3,      /* x * 57344 / absmax cast to float8 e5m2 */
  VK_QUANT_NF4 = 4,           /* the 16 NormalFloat levels (QLoRA) */
  VK_QUANT_FP4 = 5            /* E2M1 (the OCP MX element format), x * 6 / absmax */
};
enum vk_quant_dtype { VK_QUANT_F32 = 0, VK_QUANT_F16 = 1, VK_QUANT_BF16 = 2 };
enum vk_quant_error_code { VK_QUANT_OK = 0, VK_QUANT_EINVAL = 1, VK_QUANT_ECUDA = 2 };

/* Group size of the double quantization of the absmax values. */
#define VK_QUANT_SCALE_GROUP 256

/* codes: n bytes (8-bit formats) or n/2 bytes (4-bit: n must be even);
 * absmax: ceil(n / block) floats. */
int vk_quant_encode(int format, int dtype, const void* x, int64_t n, int block, void* codes, float* absmax,
                    int device, void* stream);

/* Double quantization: each group of 256 absmax values keeps (min, step) as two floats in
 * params[2g], params[2g+1] and one byte per value: absmax' = min + q * step. */
int vk_quant_compress_scales(const float* absmax, int64_t nblocks, uint8_t* q8, float* params, int device,
                             void* stream);

/* Writes n values of dtype to out. Scales come from absmax, or (when absmax is NULL) from
 * q8 and params as vk_quant_compress_scales stored them. */
int vk_quant_decode(int format, int dtype, const void* codes, const float* absmax, const uint8_t* q8,
                    const float* params, int64_t n, int block, void* out, int device, void* stream);

/* The device that owns a pointer (device or managed memory), or -1 for host or unknown memory. */
int vk_quant_pointer_device(const void* p);

/* How later launches are shaped, for the whole process (a tuning knob for benchmarks; results do
 * not depend on it): tile = elements an encoder's thread block takes at a time, 0 for the default
 * (4096) or 8192 (which also doubles a decoder's tile: 2048 fp32 or 4096 16-bit elements by
 * default); grid_mode = 0: chosen per kernel (the default), 1: a persistent grid (the resident
 * thread blocks loop over the tiles), 2: one thread block per tile; table = which table the 4-bit encoders read, 0: the
 * default (direct with a persistent grid, buckets with a block per tile), 1: the bucket table,
 * 2: the direct table (indexed by a value's top 11 bits). Returns 0 or VK_QUANT_EINVAL. */
int vk_quant_set_launch(int tile, int grid_mode, int table);

/* A kernel that moves bytes as the codecs do and computes nothing, for benchmarks: vector i reads
 * read_bytes at src + i * read_bytes and writes write_bytes at dst + i * write_bytes; one side
 * moves 16 bytes per vector, the other 2, 4, 8 or 16, in the fastest launch shape a sweep found
 * for that pattern. Its bandwidth is a reference for a codec with the same reads and writes, not a
 * bound (a codec's own shape may do better). 0, VK_QUANT_EINVAL or VK_QUANT_ECUDA. */
int vk_quant_probe_traffic(const void* src, int read_bytes, void* dst, int write_bytes, int64_t vectors, int device,
                           void* stream);

/* At most `blocks` thread blocks in a persistent grid (0, the default: as many as are resident),
 * for tests: a small cap makes every block loop over several tiles. 0 or VK_QUANT_EINVAL. */
int vk_quant_set_max_blocks(int blocks);

/* The message of this thread's last failed call ("" when none). */
const char* vk_quant_last_error(void);

/* The code tables as the host computes them with the device's arithmetic, for tests:
 * what = 0: the decoded value of each code (floats), 1: the sorted encode thresholds (floats),
 * 2: the bucket table (pairs of uint32: threshold bits, low code | high code << 8), 3: the
 * direct table of a 4-bit format (2048 such pairs, entry = a value's bits >> 21), 4 and 5: the
 * bucket and direct tables as the encoders keep them, one packed uint32 an entry.
 * Returns the number of entries (at most cap are written), -1 for a format without that table,
 * -2 when an entry could not hold its range's codes (a table_spec too coarse). */
int vk_quant_table(int format, int what, void* out, int cap);

#ifdef __cplusplus
}
#endif
#endif
