// The MatMulNBits kernels' inner tiles (nbits_rows.c): R packed weight rows against one
// activation row (decode) or against MB rows at once (prefill), each weight load and its
// 4-bit unpacking shared by the MB rows.
#pragma once
#include "rows_abi.h"

enum { R = 4, MB = 4, PREFETCH = 2048 };

// 32 signed weights against 32 int8 activations: |w| * (x signed as w) in vpmaddubsw,
// whose 16-bit pair sums stay under 2 * 128 * 127 (AVX2 has no VNNI)
static inline __m256i dot8(__m256i w, __m256i x) {
  __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
// 64 4-bit codes (low nibble: the even element) against activations laid out [evens,
// odds]; codes are w + 8, so pair sums stay under 2 * 2 * 15 * 127
static inline __m256i dot4(__m256i packed, __m256i xe, __m256i xo) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256i lo = _mm256_and_si256(packed, low);
  __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
  __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// rows_n (<= R) outputs of one packed group of R rows for one activation row
static inline __attribute__((always_inline)) void tile(
    const uint8_t* restrict wg, const float* restrict ws, const int8_t* restrict x,
    const float* restrict xs, const int32_t* restrict xsum, float* restrict y, int64_t nb,
    int64_t block, int bits, int rows_n) {
  const int64_t blob = bits == 8 ? block : block / 2;
  __m256 acc[R];
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    __m256i is[R];
    for (int r = 0; r < R; r++) is[r] = _mm256_setzero_si256();
    const uint8_t* w = wg + b * blob * R;
    const int8_t* xb = x + b * block;
    for (int64_t c = 0; c < blob * R; c += 64)
      _mm_prefetch((const char*)(w + PREFETCH + c), _MM_HINT_T0);
    if (bits == 8) {
      for (int64_t k = 0; k < block; k += 32) {
        __m256i xv = _mm256_loadu_si256((const __m256i*)(xb + k));
        for (int r = 0; r < rows_n; r++)
          is[r] = _mm256_add_epi32(
              is[r], dot8(_mm256_loadu_si256((const __m256i*)(w + k * R + r * 32)), xv));
      }
    } else {
      for (int64_t k = 0; k < block; k += 64) {
        __m256i xe = _mm256_loadu_si256((const __m256i*)(xb + k));
        __m256i xo = _mm256_loadu_si256((const __m256i*)(xb + k + 32));
        for (int r = 0; r < rows_n; r++)
          is[r] = _mm256_add_epi32(is[r], dot4(_mm256_loadu_si256(
              (const __m256i*)(w + k / 2 * R + r * 32)), xe, xo));
      }
    }
    for (int r = 0; r < rows_n; r++) {  // 4 bits: 8 * sum(x) off, a lane's share each
      __m256i v = bits == 4 ? _mm256_sub_epi32(is[r], _mm256_set1_epi32(xsum[b])) : is[r];
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(ws[r * nb + b] * xs[b]),
                               acc[r]);
    }
  }
  for (int r = 0; r < rows_n; r++) y[r] = hsum(acc[r]);
}


// MB activation rows against two rows (RH) of a packed group over weights [k0, k1) of a
// block: int32 sums in v; only the 8 sums and the step's row data stay in registers.
// 4 bits: the codes' 16-bit pair sums stay under 4 * 2 * 15 * 127 over 256 weights, so a
// chunk (CHUNK4) adds up in 16 bits and widens once (8 * sum(x), the codes' offset, comes
// off in tile_rows).
enum { RH = 2, CHUNK4 = 256 };
static inline __attribute__((always_inline)) void chunk_rows(
    const uint8_t* restrict w, const int8_t* restrict xb, int64_t kp, int64_t k0,
    int64_t k1, int bits, __m256i v[MB][RH]) {
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
  if (bits == 8) {
    for (int m = 0; m < MB; m++)
      for (int r = 0; r < RH; r++) v[m][r] = _mm256_setzero_si256();
    for (int64_t k = k0; k < k1; k += 32) {
      __m256i mag[RH];
      for (int r = 0; r < RH; r++) {
        mag[r] = _mm256_loadu_si256((const __m256i*)(w + k * R + r * 32));
        mag[r] = _mm256_sign_epi8(mag[r], mag[r]);
      }
      for (int m = 0; m < MB; m++) {
        __m256i xv = _mm256_loadu_si256((const __m256i*)(xb + m * kp + k));
        for (int r = 0; r < RH; r++)  // the weights' signs read again: fewer registers
          v[m][r] = _mm256_add_epi32(v[m][r], _mm256_madd_epi16(_mm256_maddubs_epi16(
              mag[r], _mm256_sign_epi8(xv, _mm256_loadu_si256(
                  (const __m256i*)(w + k * R + r * 32)))), ones));
      }
    }
    return;
  }
  __m256i s16[MB][RH];
  for (int m = 0; m < MB; m++)
    for (int r = 0; r < RH; r++) s16[m][r] = _mm256_setzero_si256();
  for (int64_t k = k0; k < k1; k += 64) {
    __m256i lo[RH], hi[RH];
    for (int r = 0; r < RH; r++) {
      __m256i pv = _mm256_loadu_si256((const __m256i*)(w + k / 2 * R + r * 32));
      lo[r] = _mm256_and_si256(pv, low);
      hi[r] = _mm256_and_si256(_mm256_srli_epi16(pv, 4), low);
    }
    for (int m = 0; m < MB; m++) {
      const __m256i* xm = (const __m256i*)(xb + m * kp + k);
      for (int r = 0; r < RH; r++)
        s16[m][r] = _mm256_add_epi16(s16[m][r], _mm256_add_epi16(
            _mm256_maddubs_epi16(lo[r], _mm256_loadu_si256(xm)),
            _mm256_maddubs_epi16(hi[r], _mm256_loadu_si256(xm + 1))));
    }
  }
  for (int m = 0; m < MB; m++)
    for (int r = 0; r < RH; r++) v[m][r] = _mm256_madd_epi16(s16[m][r], ones);
}

// The 8 sums of MB = 4 activation rows by RH = 2 weight rows as two vectors: lanes j and
// j + 4 of out[q] hold halves of pair (row 2q + j / 2, weight row j % 2)
static inline __attribute__((always_inline)) void fold(__m256i v[MB][RH], __m256i out[2]) {
  for (int q = 0; q < 2; q++)
    out[q] = _mm256_hadd_epi32(_mm256_hadd_epi32(v[2 * q][0], v[2 * q][1]),
                               _mm256_hadd_epi32(v[2 * q + 1][0], v[2 * q + 1][1]));
}

// R outputs of one packed group (rows_n of them stored) for MB activation rows (x: the
// first row's, rows kp apart; y: N apart). wst: the group's scales, blocks npad apart;
// xs4 / xq4: per block the rows' scales and 4 * code sums laid out as fold's pairs
static inline __attribute__((always_inline)) void tile_rows(
    const uint8_t* restrict wg, const float* restrict wst, int64_t npad,
    const int8_t* restrict x, const __m256* restrict xs4, const __m256i* restrict xq4,
    float* restrict y, int64_t nb, int64_t block, int64_t N, int bits, int rows_n) {
  const int64_t blob = bits == 8 ? block : block / 2, kp = nb * block;
  __m256 acc[R / RH][2];
  for (int h = 0; h < R / RH; h++) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* w = wg + b * blob * R;
    for (int64_t c = 0; c < blob * R; c += 64)
      _mm_prefetch((const char*)(w + PREFETCH + c), _MM_HINT_T0);
    const int64_t chunk = bits == 8 ? block : CHUNK4;
    for (int h = 0; h < R / RH; h++)
      for (int64_t k0 = 0; k0 < block; k0 += chunk) {
        __m256i v[MB][RH], f[2];
        chunk_rows(w + h * RH * 32, x + b * block, kp, k0, k0 + chunk < block ? k0 + chunk
                   : block, bits, v);
        fold(v, f);
        // the two weight rows' scales, (w0, w1) in every 64 bits
        __m256 wpair = _mm256_castpd_ps(_mm256_broadcast_sd(
            (const double*)(wst + b * npad + h * RH)));
        for (int q = 0; q < 2; q++) {
          __m256i t = bits == 4 && k0 == 0 ? _mm256_sub_epi32(f[q], xq4[b * 2 + q]) : f[q];
          acc[h][q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t),
                                      _mm256_mul_ps(wpair, xs4[b * 2 + q]), acc[h][q]);
        }
      }
  }
  float out[R / RH][2][8];
  for (int h = 0; h < R / RH; h++)
    for (int q = 0; q < 2; q++) _mm256_storeu_ps(out[h][q], acc[h][q]);
  for (int m = 0; m < MB; m++)
    for (int r = 0; r < rows_n; r++) {
      int h = r / RH, q = m / 2, j = (m % 2) * 2 + r % RH;
      y[m * N + r] = out[h][q][j] + out[h][q][j + 4];
    }
}
