// The decode tile (one activation row) with AVX-512 VNNI, picked at load where the CPU
// has it (nbits_rows.c: vnni_here); same packed weights and results as nbits_tiles.h's
// tile. A zmm holds two packed rows' 32 bytes, so each vpdpbusd sums 64 weights of two
// rows; AVX2's five instructions per 32 weights (sign, sign, maddubs, madd, add) are one.
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

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"), always_inline))

// vpdpbusd multiplies unsigned by signed bytes: 8-bit activations go in as x + 128
// (x ^ 0x80) against the signed weights, and 128 * (the row's weight sum over the block)
// comes off, 16x a lane's share (tables_vnni: wsum16); 4-bit codes are w + 8, so
// 8 * sum(x) comes off as 4-bit's AVX2 tile takes it.
static inline VNNI __m512i pair_x(const int8_t* x, int flip) {
  __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)x));
  return flip ? _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)) : v;
}

// rows_n (<= R) outputs of one packed group of R rows for one activation row; lanes 0-7
// of acc[h] sum row 2h, lanes 8-15 row 2h + 1
static inline VNNI void tile_vnni(
    const uint8_t* restrict wg, const float* restrict wsp, const int32_t* restrict wsum16,
    const int8_t* restrict x, const float* restrict xs, const int32_t* restrict xsum,
    float* restrict y, int64_t nb, int64_t block, int bits, int rows_n) {
  const int64_t blob = bits == 8 ? block : block / 2;
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8((char)0xF0);
  const __m512i lanes0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i lanes1 = _mm512_add_epi32(lanes0, _mm512_set1_epi32(2));
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* w = wg + b * blob * R;
    const int8_t* xb = x + b * block;
    for (int64_t c = 0; c < blob * R; c += 64)
      _mm_prefetch((const char*)(w + PREFETCH + c), _MM_HINT_T0);
    __m512i v[2][2];  // [row pair][two chains: alternate chunks (8 bits), nibbles (4)]
    for (int h = 0; h < 2; h++) v[h][0] = v[h][1] = _mm512_setzero_si512();
    if (bits == 8) {
      for (int64_t k = 0; k < block; k += 64)
        for (int p = 0; p < 2; p++) {
          __m512i xv = pair_x(xb + k + 32 * p, 1);
          const uint8_t* wk = w + (k + 32 * p) * R;
          for (int h = 0; h < 2; h++)
            v[h][p] = _mm512_dpbusd_epi32(v[h][p], xv, _mm512_loadu_si512(wk + h * 64));
        }
    } else {
      for (int64_t k = 0; k < block; k += 64) {
        __m512i xe = pair_x(xb + k, 0), xo = pair_x(xb + k + 32, 0);
        for (int h = 0; h < 2; h++) {
          __m512i pv = _mm512_loadu_si512(w + k / 2 * R + h * 64);
          v[h][0] = _mm512_dpbusd_epi32(v[h][0], _mm512_and_si512(pv, low), xe);
          v[h][1] = _mm512_dpbusd_epi32(v[h][1], _mm512_and_si512(pv, high), xo);
        }
      }
    }
    // the four rows' scales (0 past N), by the activation's; row 2h + i in lanes 8i..
    __m512 s4 = _mm512_castps128_ps512(_mm_mul_ps(_mm_loadu_ps(wsp + b * R),
                                                  _mm_set1_ps(xs[b])));
    __m512i sums[2];
    if (bits == 8) {
      __m512i four =
          _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)(wsum16 + b * R)));
      sums[0] = _mm512_sub_epi32(_mm512_add_epi32(v[0][0], v[0][1]),
                                 _mm512_permutexvar_epi32(lanes0, four));
      sums[1] = _mm512_sub_epi32(_mm512_add_epi32(v[1][0], v[1][1]),
                                 _mm512_permutexvar_epi32(lanes1, four));
    } else {  // the odd codes went in 16x (their nibble unshifted)
      __m512i off = _mm512_set1_epi32(xsum[b]);
      for (int h = 0; h < 2; h++)
        sums[h] = _mm512_sub_epi32(_mm512_add_epi32(v[h][0], _mm512_srai_epi32(v[h][1], 4)),
                                   off);
    }
    acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[0]),
                             _mm512_permutexvar_ps(lanes0, s4), acc[0]);
    acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[1]),
                             _mm512_permutexvar_ps(lanes1, s4), acc[1]);
  }
  for (int r = 0; r < rows_n; r++) {
    __m512d a = _mm512_castps_pd(acc[r / 2]);
    y[r] = hsum(_mm256_castpd_ps(r % 2 ? _mm512_extractf64x4_pd(a, 1)
                                       : _mm512_castpd512_pd256(a)));
  }
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
