// The decode tile (one activation row) with AVX-512 VNNI, picked at load where the CPU
// has it (nbits_rows.c: vnni_here); same packed weights and results as nbits_tiles.h's
// tile. One vpdpbusd sums a row's 32 weights where AVX2 takes five instructions (sign,
// sign, maddubs, madd, add).
#pragma once
#include <string.h>

#include "nbits_tiles.h"

// AVX-512 VNNI where this CPU has it, unless EDGE_EXPORTER_ONNX_KERNELS_ISA=avx2 asks
// for the AVX2 tiles (the tests run both here)
static int vnni_here(void) {
  const char* isa = getenv("EDGE_EXPORTER_ONNX_KERNELS_ISA");
  if (isa && strcmp(isa, "avx2") == 0) return 0;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

#define VNNI __attribute__((target("avx512f,avx512vl,avx512vnni"), always_inline))

// vpdpbusd multiplies unsigned by signed bytes: 8-bit activations go in as x + 128
// (x ^ 0x80) against the signed weights, and 128 * (the row's weight sum over the block)
// comes off, 16x a lane's share (tables_vnni: wsum16); 4-bit codes are w + 8, so
// 8 * sum(x) comes off as 4-bit's AVX2 tile takes it. 256-bit vectors: a 512-bit tile
// (two rows a vector) was no faster on 2 threads, where the GEMVs wait on memory.

// rows_n (<= R) outputs of one packed group of R rows for one activation row
static inline VNNI void tile_vnni(
    const uint8_t* restrict wg, const float* restrict wsp, const int32_t* restrict wsum16,
    const int8_t* restrict x, const float* restrict xs, const int32_t* restrict xsum,
    float* restrict y, int64_t nb, int64_t block, int bits, int rows_n) {
  const int64_t blob = bits == 8 ? block : block / 2;
  const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8((char)0xF0);
  const __m256i flip = _mm256_set1_epi8((char)0x80);
  __m256 acc[R];
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* w = wg + b * blob * R;
    const int8_t* xb = x + b * block;
    for (int64_t c = 0; c < blob * R; c += 64)
      _mm_prefetch((const char*)(w + PREFETCH + c), _MM_HINT_T0);
    __m256i v[R], u[R];  // 4 bits: u sums the odd codes, 16x (their nibble unshifted)
    for (int r = 0; r < R; r++) v[r] = u[r] = _mm256_setzero_si256();
    if (bits == 8) {
      for (int64_t k = 0; k < block; k += 32) {
        __m256i xv = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(xb + k)), flip);
        for (int r = 0; r < R; r++)
          v[r] = _mm256_dpbusd_epi32(
              v[r], xv, _mm256_loadu_si256((const __m256i*)(w + k * R + r * 32)));
      }
      for (int r = 0; r < R; r++)
        v[r] = _mm256_sub_epi32(v[r], _mm256_set1_epi32(wsum16[b * R + r]));
    } else {
      for (int64_t k = 0; k < block; k += 64) {
        __m256i xe = _mm256_loadu_si256((const __m256i*)(xb + k));
        __m256i xo = _mm256_loadu_si256((const __m256i*)(xb + k + 32));
        for (int r = 0; r < R; r++) {
          __m256i pv = _mm256_loadu_si256((const __m256i*)(w + k / 2 * R + r * 32));
          v[r] = _mm256_dpbusd_epi32(v[r], _mm256_and_si256(pv, low), xe);
          u[r] = _mm256_dpbusd_epi32(u[r], _mm256_and_si256(pv, high), xo);
        }
      }
      for (int r = 0; r < R; r++)
        v[r] = _mm256_sub_epi32(_mm256_add_epi32(v[r], _mm256_srai_epi32(u[r], 4)),
                                _mm256_set1_epi32(xsum[b]));
    }
    for (int r = 0; r < R; r++)  // the rows past N have scale 0
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v[r]),
                               _mm256_set1_ps(wsp[b * R + r] * xs[b]), acc[r]);
  }
  for (int r = 0; r < rows_n; r++) y[r] = hsum(acc[r]);
}
#undef VNNI

// [group][block][R], padded rows 0: the scales, and 16x each 8-bit row's weight sum by
// block (the packed weights are signed there); nonzero when out of memory
static int tables_vnni(const uint8_t* packed, const float* scales, int64_t N, int64_t nb,
                       int64_t block, int bits, float** wsp, int32_t** wsum16) {
  const int64_t groups = (N + R - 1) / R, blob = bits == 8 ? block : block / 2;
  *wsp = calloc((size_t)(groups * nb * R), sizeof(float));
  *wsum16 = bits == 8 ? calloc((size_t)(groups * nb * R), sizeof(int32_t)) : NULL;
  if (!*wsp || (bits == 8 && !*wsum16)) return 1;
  for (int64_t n = 0; n < N; n++)
    for (int64_t b = 0; b < nb; b++)
      (*wsp)[(n / R * nb + b) * R + n % R] = scales[n * nb + b];
  for (int64_t g = 0; bits == 8 && g < groups; g++)
    for (int64_t b = 0; b < nb; b++) {
      const int8_t* w = (const int8_t*)packed + (g * nb + b) * blob * R;
      for (int64_t i = 0; i < blob * R; i++)
        (*wsum16)[(g * nb + b) * R + i % (32 * R) / 32] += 16 * w[i];
    }
  return 0;
}
