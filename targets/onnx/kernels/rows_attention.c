// GroupQueryAttention's decoder case as a custom op of the onnx target's library
// (targets/onnx/kernels): packed q/k/v rows, the rotary's halves inside, the new rows written into a cache
// that past and present share, batch 1; the cache is read where it lies, never packed.
#include <math.h>
#include <string.h>

#include "rows_abi.h"

typedef struct { int64_t heads, kv_heads; float scale; } Attention;
typedef struct {
  const Attention* a; const float *qkv, *cos, *sin; float *k, *v, *out;
  int64_t S, past, D, slots;
} AttentionJob;

static inline float dot(const float* x, const float* y, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc);
  float total = hsum(acc);
  for (; i < n; i++) total += x[i] * y[i];
  return total;
}
// x's halves rotated by position p's angles (rotate_half, ORT's rotary_interleaved = 0)
static void rotary(const float* x, const float* cos, const float* sin, int64_t D, float* out) {
  int64_t half = D / 2;
  for (int64_t i = 0; i < half; i++) {
    out[i] = x[i] * cos[i] - x[i + half] * sin[i];
    out[i + half] = x[i + half] * cos[i] + x[i] * sin[i];
  }
}
// q against 8 consecutive key rows (D a multiple of 8): one lane each
static inline __m256 dot8rows(const float* q, const float* K, int64_t D) {
  __m256 acc[8];
  for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < D; i += 8) {
    __m256 qv = _mm256_loadu_ps(q + i);
    for (int r = 0; r < 8; r++)
      acc[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(K + r * D + i), acc[r]);
  }
  __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]), h23 = _mm256_hadd_ps(acc[2], acc[3]);
  __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]), h67 = _mm256_hadd_ps(acc[6], acc[7]);
  __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// the weighted sum of V's rows 0..p into out (D floats)
static void weigh(const float* scores, float inv, const float* V, int64_t p, int64_t D,
                  float* out) {
  __m256 acc[8];  // D up to 64 in registers; wider heads take the loop below
  int64_t lanes = D / 8 < 8 ? D / 8 : 8;
  for (int64_t l = 0; l < lanes; l++) acc[l] = _mm256_setzero_ps();
  for (int64_t i = lanes * 8; i < D; i++) out[i] = 0.f;
  for (int64_t t = 0; t <= p; t++) {
    __m256 w = _mm256_set1_ps(scores[t] * inv);
    for (int64_t l = 0; l < lanes; l++)
      acc[l] = _mm256_fmadd_ps(w, _mm256_loadu_ps(V + t * D + l * 8), acc[l]);
    for (int64_t i = lanes * 8; i < D; i++) out[i] += scores[t] * inv * V[t * D + i];
  }
  for (int64_t l = 0; l < lanes; l++) _mm256_storeu_ps(out + l * 8, acc[l]);
}

// scores[0..p] = e^(score - max), returns their sum
static float softmax_numerators(float* scores, int64_t p) {
  float top = -INFINITY, total = 0.f;
  int64_t t = 0;
  for (; t <= p; t++) top = fmaxf(top, scores[t]);
  __m256 sum8 = _mm256_setzero_ps();
  for (t = 0; t + 8 <= p + 1; t += 8) {
    __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(scores + t), _mm256_set1_ps(top)));
    _mm256_storeu_ps(scores + t, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  for (; t <= p; t++) total += scores[t] = expf(scores[t] - top);
  return total + hsum(sum8);
}

// one key/value head and the query heads that read it: each cached row is read from
// memory once for all of them
static void attend_group(void* data, size_t g) {
  const AttentionJob* j = (const AttentionJob*)data;
  const int64_t D = j->D, width = (j->a->heads + 2 * j->a->kv_heads) * D;
  const int64_t G = j->a->heads / j->a->kv_heads, n = j->past + j->S + 8;
  const float* K = j->k + (int64_t)g * j->slots * D;
  const float* V = j->v + (int64_t)g * j->slots * D;
  float* scores = malloc(sizeof(float) * (size_t)(G * n));
  float* q = malloc(sizeof(float) * (size_t)(G * D));
  for (int64_t s = 0; s < j->S; s++) {
    int64_t p = j->past + s, t = 0;
    for (int64_t i = 0; i < G; i++)
      rotary(j->qkv + s * width + ((int64_t)g * G + i) * D, j->cos + p * (D / 2),
             j->sin + p * (D / 2), D, q + i * D);
    if (D % 8 == 0)
      for (; t + 8 <= p + 1; t += 8)
        for (int64_t i = 0; i < G; i++)
          _mm256_storeu_ps(scores + i * n + t, _mm256_mul_ps(
              dot8rows(q + i * D, K + t * D, D), _mm256_set1_ps(j->a->scale)));
    for (; t <= p; t++)
      for (int64_t i = 0; i < G; i++)
        scores[i * n + t] = dot(q + i * D, K + t * D, D) * j->a->scale;
    for (int64_t i = 0; i < G; i++) {
      float total = softmax_numerators(scores + i * n, p);
      weigh(scores + i * n, 1.f / total, V, p, D,
            j->out + s * j->a->heads * D + ((int64_t)g * G + i) * D);
    }
  }
  free(q);
  free(scores);
}

OrtStatus* attention(void* kernel, OrtKernelContext* ctx) {
  const Attention* a = (const Attention*)kernel;
  const OrtValue *q_v, *pk_v, *pv_v, *total_v, *cos_v, *sin_v;
  TRY(KernelContext_GetInput(ctx, 0, &q_v));
  TRY(KernelContext_GetInput(ctx, 3, &pk_v));
  TRY(KernelContext_GetInput(ctx, 4, &pv_v));
  TRY(KernelContext_GetInput(ctx, 6, &total_v));
  TRY(KernelContext_GetInput(ctx, 7, &cos_v));
  TRY(KernelContext_GetInput(ctx, 8, &sin_v));
  OrtShapeInfo* info;
  int64_t qd[3], cd[4];
  size_t rank;
  TRY(GetTensorTypeAndShape(q_v, &info));
  TRY(GetDimensionsCount(info, &rank));
  if (rank != 3) return CreateStatus(INVALID_ARGUMENT, "RowsAttention: query rank");
  TRY(GetDimensions(info, qd, 3));
  ReleaseTensorTypeAndShapeInfo(info);
  TRY(GetTensorTypeAndShape(pk_v, &info));
  TRY(GetDimensions(info, cd, 4));
  ReleaseTensorTypeAndShapeInfo(info);
  void *qkv, *pk, *pv, *total, *cos, *sin, *out, *k, *v;
  TRY(GetTensorMutableData(q_v, &qkv));
  TRY(GetTensorMutableData(pk_v, &pk));
  TRY(GetTensorMutableData(pv_v, &pv));
  TRY(GetTensorMutableData(total_v, &total));
  TRY(GetTensorMutableData(cos_v, &cos));
  TRY(GetTensorMutableData(sin_v, &sin));
  const int64_t S = qd[1], D = cd[3], slots = cd[2];
  const int64_t past = *(const int32_t*)total - S;
  int64_t od[3] = {1, S, a->heads * D};
  OrtValue *o_v, *k_v, *v_v;
  TRY(KernelContext_GetOutput(ctx, 0, od, 3, &o_v));
  TRY(KernelContext_GetOutput(ctx, 1, cd, 4, &k_v));
  TRY(KernelContext_GetOutput(ctx, 2, cd, 4, &v_v));
  TRY(GetTensorMutableData(o_v, &out));
  TRY(GetTensorMutableData(k_v, &k));
  TRY(GetTensorMutableData(v_v, &v));
  if (qd[0] != 1 || past < 0 || past + S > slots || qd[2] != (a->heads + 2 * a->kv_heads) * D)
    return CreateStatus(INVALID_ARGUMENT, "RowsAttention: batch 1 within the cache only");
  size_t cache = sizeof(float) * (size_t)(cd[1] * slots * D);
  if (k != pk) memcpy(k, pk, cache);  // present not bound onto past: start from it
  if (v != pv) memcpy(v, pv, cache);
  const int64_t width = (a->heads + 2 * a->kv_heads) * D;
  for (int64_t s = 0; s < S; s++)  // the new rows, rotated keys, into their slots
    for (int64_t h = 0; h < a->kv_heads; h++) {
      const float* row = (const float*)qkv + s * width + (a->heads + h) * D;
      int64_t p = past + s, at = (h * slots + p) * D;
      rotary(row, (const float*)cos + p * (D / 2), (const float*)sin + p * (D / 2), D,
             (float*)k + at);
      memcpy((float*)v + at, row + a->kv_heads * D, sizeof(float) * (size_t)D);
    }
  Attention scaled = *a;
  if (scaled.scale == 0.f) scaled.scale = 1.f / sqrtf((float)D);
  AttentionJob j = {&scaled, qkv, cos, sin, k, v, out, S, past, D, slots};
  return KernelContext_ParallelFor(ctx, attend_group, (size_t)a->kv_heads, 0, &j);
}

OrtStatus* attention_create(const void* which, OrtApiTable table, const OrtKernelInfo* info,
                            void** out) {
  (void)which;
  (void)table;
  Attention* a = calloc(1, sizeof(Attention));
  TRY(KernelInfoGetAttribute_int64(info, "num_heads", &a->heads));
  TRY(KernelInfoGetAttribute_int64(info, "kv_num_heads", &a->kv_heads));
  OrtStatus* unset = KernelInfoGetAttribute_float(info, "scale", &a->scale);
  if (unset) {  // ORT's default, 1 / sqrt(head size), once the size is known
    ReleaseStatus(unset);
    a->scale = 0.f;
  }
  *out = a;
  return NULL;
}
