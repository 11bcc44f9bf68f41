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
// comes off, 16x a lane's share (pack keeps it per row and block: Kernel.wsum16); 4-bit
// codes are w + 8, so 8 * sum(x) comes off as 4-bit's AVX2 tile takes it.
static inline VNNI __m512i pair_x(const int8_t* x, int flip) {
  __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)x));
  return flip ? _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)) : v;
}

// rows_n (<= R) outputs of one packed group of R rows for one activation row; lanes 0-7
// of acc[h] sum row 2h, lanes 8-15 row 2h + 1
static inline VNNI void tile_vnni(
    const uint8_t* restrict wg, const float* restrict ws, const int32_t* restrict wsum16,
    const int8_t* restrict x, const float* restrict xs, const int32_t* restrict xsum,
    float* restrict y, int64_t nb, int64_t block, int bits, int rows_n) {
  const int64_t blob = bits == 8 ? block : block / 2;
  const __m512i low = _mm512_set1_epi8(0x0F);
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
          v[h][1] = _mm512_dpbusd_epi32(
              v[h][1], _mm512_and_si512(_mm512_srli_epi16(pv, 4), low), xo);
        }
      }
    }
    __m512i off;
    if (bits == 8) {
      __m512i four =
          _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)(wsum16 + b * R)));
      off = _mm512_permutexvar_epi32(lanes0, four);
      __m512i off1 = _mm512_permutexvar_epi32(lanes1, four);
      v[1][0] = _mm512_sub_epi32(v[1][0], off1);
    } else {
      off = _mm512_set1_epi32(xsum[b]);
      v[1][0] = _mm512_sub_epi32(v[1][0], off);
    }
    v[0][0] = _mm512_sub_epi32(v[0][0], off);
    for (int h = 0; h < 2; h++) {  // the rows past rows_n are padding: scale 0
      float s0 = 2 * h < rows_n ? ws[2 * h * nb + b] * xs[b] : 0.f;
      float s1 = 2 * h + 1 < rows_n ? ws[(2 * h + 1) * nb + b] * xs[b] : 0.f;
      __m512 scale = _mm512_castpd_ps(_mm512_insertf64x4(
          _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(s0))),
          _mm256_castps_pd(_mm256_set1_ps(s1)), 1));
      acc[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(v[h][0], v[h][1])),
                               scale, acc[h]);
    }
  }
  for (int r = 0; r < rows_n; r++) {
    __m512d a = _mm512_castps_pd(acc[r / 2]);
    y[r] = hsum(_mm256_castpd_ps(r % 2 ? _mm512_extractf64x4_pd(a, 1)
                                       : _mm512_castpd512_pd256(a)));
  }
}
#undef VNNI
