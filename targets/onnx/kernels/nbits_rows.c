// MatMulNBits (symmetric 8- and 4-bit blocks, no zero points) as an ONNX Runtime custom
// op with the onnx target's own AVX2 kernels (decode on AVX-512 VNNI where the CPU has
// it: nbits_vnni.h), over MatMulNBits's own inputs and attributes (targets/onnx/kernels/
// rewrite.py moves the nodes at build time; the library is compiled into the artifact).
//
// Weights are repacked once, when the kernel is made, four output rows interleaved per
// 32 bytes so each thread reads one sequential stream (MLAS packs its own way too).
// Activations are quantized to int8 per weight block, as MLAS does at accuracy level 4.
// The library's attention op is in rows_attention.c; the API declarations in rows_abi.h.
#include <math.h>
#include <string.h>
#include <sys/mman.h>

#include "rows_abi.h"
#include "nbits_tiles.h"
#include "nbits_vnni.h"

OrtApiTable api;

// ---- Kernels
enum { ROWS_PER_TASK = 32 };
// glu: the output is silu(first half) * second half, a LLaMA MLP's packed gate/up;
// norm: the input is ORT's SkipSimplifiedLayerNormalization of (x, skip, gamma) first,
// x + skip the second output
// vnni: decode on nbits_vnni.h's tile, over its tables (scales, 8-bit weight sums)
typedef struct {
  int64_t K, N, bits, block, glu, norm; float eps; uint8_t* packed;
  int32_t* wsum16; float* wsp; int vnni;
} Kernel;
typedef struct {
  const uint8_t* w; const float* ws; const int8_t* xq; const float* xs; const int32_t* xsum;
  float* y; int64_t M, N, nb, block, bits;
  const float* wst; int64_t npad; const __m256* xs4; const __m256i* xq4;  // M >= MB
  const int32_t* wsum16; const float* wsp; int vnni;
} Job;

static int vnni;  // at registration: vnni_here() (nbits_vnni.h)

__attribute__((target("avx512f,avx512vl,avx512vnni")))
static void one_row_vnni(const Job* j, int64_t m, int64_t n0, int64_t n1) {
  const int64_t nb = j->nb, kp = nb * j->block;
  const int64_t group = (j->bits == 8 ? j->block : j->block / 2) * nb;
  const int8_t* x = j->xq + m * kp;
  const float* xs = j->xs + m * nb;
  const int32_t* xsum = j->xsum ? j->xsum + m * nb : NULL;
  float* y = j->y + m * j->N;
  for (int64_t n = n0; n < n1; n += R) {
    int rows_n = (int)(n1 - n < R ? n1 - n : R);
    const int32_t* wsum16 = j->wsum16 ? j->wsum16 + n * nb : NULL;
    // the recipes' blocks (card.NBITS_BLOCK) as constants: their steps unroll
#define TILE(bits, block)                                                                \
  tile_vnni(j->w + n * group, j->wsp + n * nb, wsum16, x, xs, xsum, y + n, nb, block, bits, \
            rows_n)
    if (j->bits == 8 && j->block == 256) TILE(8, 256);
    else if (j->bits == 4 && j->block == 128) TILE(4, 128);
    else if (j->bits == 8) TILE(8, j->block);
    else TILE(4, j->block);
#undef TILE
  }
}

// decode: activation row m against outputs [n0, n1), the widths' loops apart so tile's
// loops unroll with constant bounds
static void one_row(const Job* j, int64_t m, int64_t n0, int64_t n1) {
  if (j->vnni) {
    one_row_vnni(j, m, n0, n1);
    return;
  }
  const int64_t nb = j->nb, block = j->block, kp = nb * block;
  const int64_t group = (j->bits == 8 ? block : block / 2) * nb;  // bytes of one row
  const int8_t* x = j->xq + m * kp;
  const float* xs = j->xs + m * nb;
  const int32_t* xsum = j->xsum ? j->xsum + m * nb : NULL;
  float* y = j->y + m * j->N;
  int64_t n = n0;
  if (j->bits == 8)
    for (; n + R <= n1; n += R)
      tile(j->w + n * group, j->ws + n * nb, x, xs, xsum, y + n, nb, block, 8, R);
  else
    for (; n + R <= n1; n += R)
      tile(j->w + n * group, j->ws + n * nb, x, xs, xsum, y + n, nb, block, 4, R);
  if (n < n1)
    tile(j->w + n * group, j->ws + n * nb, x, xs, xsum, y + n, nb, block, (int)j->bits,
         (int)(n1 - n));
}

// prefill: MB activation rows at once (a short last group computed whole, stored in part)
__attribute__((optimize("schedule-insns", "sched-pressure")))  // fewer spills
static void many_rows(const Job* j, int64_t m, int64_t n, int rows_n) {
  const int64_t nb = j->nb, kp = nb * j->block;
  const uint8_t* w = j->w + n * (j->bits == 8 ? j->block : j->block / 2) * nb;
  const __m256* xs4 = j->xs4 + m / MB * nb * 2;
  const __m256i* xq4 = j->xq4 + m / MB * nb * 2;
  float* y = j->y + m * j->N + n;
  // the recipes' blocks (card.NBITS_BLOCK) as constants: their steps unroll
#define TILE_ROWS(bits, block)                                                          \
  tile_rows(w, j->wst + n, j->npad, j->xq + m * kp, xs4, xq4, y, nb, block, j->N, bits, \
            rows_n)
  if (j->bits == 8 && j->block == 256) TILE_ROWS(8, 256);
  else if (j->bits == 4 && j->block == 128) TILE_ROWS(4, 128);
  else if (j->bits == 8) TILE_ROWS(8, j->block);
  else TILE_ROWS(4, j->block);
#undef TILE_ROWS
}

// prefill: MB activation rows per pass over the task's weights; the rest one by one
static void rows(const Job* j, int64_t n0, int64_t n1) {
  int64_t m = 0;
  for (; j->xs4 && m + MB <= j->M; m += MB)
    for (int64_t n = n0; n < n1; n += R) many_rows(j, m, n, (int)(n1 - n < R ? n1 - n : R));
  for (; m < j->M; m++) one_row(j, m, n0, n1);
}

// what tile_rows reads besides the weights: the scales by block, zero past N, and per
// block of MB rows their scales and 4 * code sums laid out as fold's pairs (j->xs4, xq4)
static void prefill_tables(Job* j) {
  const int64_t nb = j->nb, blocks = j->M / MB;
  j->npad = (j->N + R - 1) / R * R;
  float* wst = calloc((size_t)(nb * j->npad), sizeof(float));
  __m256* xs4 = aligned_alloc(32, sizeof(__m256) * (size_t)(blocks * nb * 2));
  __m256i* xq4 = aligned_alloc(32, sizeof(__m256i) * (size_t)(blocks * nb * 2));
  for (int64_t n = 0; n < j->N; n++)
    for (int64_t b = 0; b < nb; b++) wst[b * j->npad + n] = j->ws[n * nb + b];
  for (int64_t i = 0; i < blocks; i++)
    for (int64_t b = 0; b < nb; b++)
      for (int q = 0; q < 2; q++) {
        int64_t m0 = (i * MB + 2 * q) * nb + b, m1 = m0 + nb;
        float a = j->xs[m0], c = j->xs[m1];
        int32_t s = j->xsum ? 4 * j->xsum[m0] : 0, t = j->xsum ? 4 * j->xsum[m1] : 0;
        xs4[(i * nb + b) * 2 + q] = _mm256_setr_ps(a, a, c, c, a, a, c, c);
        xq4[(i * nb + b) * 2 + q] = _mm256_setr_epi32(s, s, t, t, s, s, t, t);
      }
  j->wst = wst;
  j->xs4 = xs4;
  j->xq4 = xq4;
}

static void task(void* data, size_t i) {
  const Job* j = (const Job*)data;
  int64_t n0 = (int64_t)i * ROWS_PER_TASK, n1 = n0 + ROWS_PER_TASK;
  rows(j, n0, n1 < j->N ? n1 : j->N);
}

// int8 per block, symmetric; 4 bits: each 64 as [evens, odds], and the block's code sum
static void quantize_rows(const float* a, int64_t M, int64_t K, int64_t nb, int64_t block,
                          int bits, int8_t* xq, float* xs, int32_t* xsum) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int32_t q[64];
  for (int64_t m = 0; m < M; m++)
    for (int64_t b = 0; b < nb; b++) {
      const float* src = a + m * K + b * block;
      int64_t len = K - b * block < block ? K - b * block : block, k = 0;
      __m256 top = _mm256_setzero_ps();
      for (; k + 8 <= len; k += 8)
        top = _mm256_max_ps(top, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + k)));
      float lanes[8], amax = 0.f;
      _mm256_storeu_ps(lanes, top);
      for (int l = 0; l < 8; l++) amax = fmaxf(amax, lanes[l]);
      for (; k < len; k++) amax = fmaxf(amax, fabsf(src[k]));
      float inv = amax > 0.f ? 127.f / amax : 0.f;
      int8_t* dst = xq + (m * nb + b) * block;
      int32_t sum = 0;
      for (k = 0; k < block; k += 64) {  // rounded to nearest even, as nearbyintf
        for (int64_t i = 0; i < 64; i++) q[i] = 0;
        int64_t here = len - k < 64 ? (len - k > 0 ? len - k : 0) : 64, i = 0;
        for (; i + 8 <= here; i += 8)
          _mm256_storeu_si256((__m256i*)(q + i), _mm256_cvtps_epi32(
              _mm256_mul_ps(_mm256_loadu_ps(src + k + i), _mm256_set1_ps(inv))));
        for (; i < here; i++) q[i] = (int)nearbyintf(src[k + i] * inv);
        for (i = 0; i < 64; i++) sum += q[i];
        if (bits == 8) {
          for (i = 0; i < 64; i += 32) {
            const __m256i* v = (const __m256i*)(q + i);
            __m256i lo = _mm256_packs_epi32(_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1));
            __m256i hi = _mm256_packs_epi32(_mm256_loadu_si256(v + 2), _mm256_loadu_si256(v + 3));
            _mm256_storeu_si256((__m256i*)(dst + k + i), _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(lo, hi), order));
          }
        } else {
          for (i = 0; i < 64; i++) dst[k + (i % 2) * 32 + i / 2] = (int8_t)q[i];
        }
      }
      xs[m * nb + b] = amax / 127.f;
      if (xsum) xsum[m * nb + b] = sum;
    }
}

// (x + skip) * gamma / rms into a new buffer, x + skip into the second output
static OrtStatus* normalize(const Kernel* kern, OrtKernelContext* ctx, const float* x,
                            int64_t M, const int64_t* dims, size_t rank, float** normed) {
  const OrtValue *skip_v, *gamma_v;
  OrtValue* sum_v;
  void *skip, *gamma, *sum;
  TRY(KernelContext_GetInput(ctx, 1, &skip_v));
  TRY(KernelContext_GetInput(ctx, 2, &gamma_v));
  TRY(KernelContext_GetOutput(ctx, 1, dims, rank, &sum_v));
  TRY(GetTensorMutableData(skip_v, &skip));
  TRY(GetTensorMutableData(gamma_v, &gamma));
  TRY(GetTensorMutableData(sum_v, &sum));
  float* out = malloc(sizeof(float) * (size_t)(M * kern->K));
  for (int64_t m = 0; m < M; m++) {
    const float *xr = x + m * kern->K, *sr = (const float*)skip + m * kern->K;
    float* total = (float*)sum + m * kern->K;
    float squares = 0.f;
    for (int64_t k = 0; k < kern->K; k++) {
      total[k] = xr[k] + sr[k];
      squares += total[k] * total[k];
    }
    float inv = 1.f / sqrtf(squares / (float)kern->K + kern->eps);
    for (int64_t k = 0; k < kern->K; k++)
      out[m * kern->K + k] = total[k] * inv * ((const float*)gamma)[k];
  }
  *normed = out;
  return NULL;
}

static OrtStatus* compute(void* op_kernel, OrtKernelContext* ctx) {
  const Kernel* kern = (const Kernel*)op_kernel;
  const OrtValue *a_v, *s_v;
  TRY(KernelContext_GetInput(ctx, 0, &a_v));
  TRY(KernelContext_GetInput(ctx, kern->norm ? 4 : 2, &s_v));
  OrtShapeInfo* info;
  size_t rank;
  int64_t dims[8];
  TRY(GetTensorTypeAndShape(a_v, &info));
  TRY(GetDimensionsCount(info, &rank));
  if (rank < 1 || rank > 8) return CreateStatus(INVALID_ARGUMENT, "NBitsRows: input rank");
  TRY(GetDimensions(info, dims, rank));
  ReleaseTensorTypeAndShapeInfo(info);
  int64_t M = 1;
  for (size_t i = 0; i + 1 < rank; i++) M *= dims[i];
  dims[rank - 1] = kern->glu ? kern->N / 2 : kern->N;
  OrtValue* y_v;
  void *a, *ws, *out;
  TRY(KernelContext_GetOutput(ctx, 0, dims, rank, &y_v));
  TRY(GetTensorMutableData(a_v, &a));
  TRY(GetTensorMutableData(s_v, &ws));
  TRY(GetTensorMutableData(y_v, &out));
  float* y = kern->glu ? malloc(sizeof(float) * (size_t)(M * kern->N)) : out;
  float* normed = NULL;
  if (kern->norm) {
    dims[rank - 1] = kern->K;
    TRY(normalize(kern, ctx, (const float*)a, M, dims, rank, &normed));
    a = normed;
  }
  int64_t nb = (kern->K + kern->block - 1) / kern->block;
  int8_t* xq = malloc((size_t)(M * nb * kern->block));
  float* xs = malloc(sizeof(float) * (size_t)(M * nb));
  int32_t* xsum = kern->bits == 4 ? malloc(sizeof(int32_t) * (size_t)(M * nb)) : NULL;
  quantize_rows(a, M, kern->K, nb, kern->block, (int)kern->bits, xq, xs, xsum);
  Job j = {kern->packed, ws, xq, xs, xsum, y, M, kern->N, nb, kern->block, kern->bits,
           NULL, 0, NULL, NULL, kern->wsum16, kern->wsp, kern->vnni};
  if (M >= MB) prefill_tables(&j);
  size_t tasks = (size_t)((kern->N + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
  OrtStatus* status = KernelContext_ParallelFor(ctx, task, tasks, 0, &j);
  if (kern->glu) {
    int64_t half = kern->N / 2;
    for (int64_t m = 0; m < M; m++) {
      const float *gate = y + m * kern->N, *up = gate + half;
      float* o = (float*)out + m * half;
      int64_t i = 0;
      for (; i + 8 <= half; i += 8) {  // silu(g) * u = g * u / (1 + e^-g)
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 d = _mm256_add_ps(_mm256_set1_ps(1.f),
                                 exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g)));
        _mm256_storeu_ps(o + i, _mm256_div_ps(_mm256_mul_ps(g, _mm256_loadu_ps(up + i)), d));
      }
      for (; i < half; i++) o[i] = gate[i] / (1.f + expf(-gate[i])) * up[i];
    }
    free(y);
  }
  free(xq);
  free(xs);
  free(xsum);
  free((void*)j.wst);
  free((void*)j.xs4);
  free((void*)j.xq4);
  free(normed);
  return status;
}

// the weights, four rows interleaved per 32 bytes (a short last group padded); 8-bit
// codes (w + 128) become signed weights for dot8
static OrtStatus* pack(Kernel* k, const OrtKernelInfo* info) {
  int is_const = 0;
  const OrtValue* b_v = NULL;
  void* src_v;
  TRY(KernelInfoGetConstantInput_tensor(info, k->norm ? 3 : 1, &is_const, &b_v));
  if (!is_const) return CreateStatus(INVALID_ARGUMENT, "NBitsRows: weights not constant");
  TRY(GetTensorMutableData(b_v, &src_v));
  const uint8_t* src = src_v;
  int64_t nb = (k->K + k->block - 1) / k->block, blob = k->bits == 8 ? k->block : k->block / 2;
  const size_t huge = 2 << 20;
  size_t bytes = (size_t)(((k->N + R - 1) / R) * R * nb * blob);
  k->packed = aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
  if (!k->packed) return CreateStatus(INVALID_ARGUMENT, "NBitsRows: out of memory");
  madvise(k->packed, bytes, MADV_HUGEPAGE);  // fewer TLB misses across the stream
  memset(k->packed, k->bits == 8 ? 0x80 : 0x88, bytes);
  for (int64_t n = 0; n < k->N; n++)
    for (int64_t b = 0; b < nb; b++)
      for (int64_t off = 0; off < blob; off += 32)
        memcpy(k->packed + (n / R) * R * nb * blob + b * blob * R + off * R + (n % R) * 32,
               src + (n * nb + b) * blob + off, 32);
  if (k->bits == 8)
    for (size_t i = 0; i < bytes; i++) k->packed[i] ^= 0x80;
  return NULL;
}


// the VNNI tile's tables (nbits_vnni.h) from the scales, a constant input as the weights
// are; where they are not constant, the AVX2 tiles
static OrtStatus* vnni_tables(Kernel* k, const OrtKernelInfo* info) {
  int is_const = 0;
  const OrtValue* s_v = NULL;
  void* scales;
  TRY(KernelInfoGetConstantInput_tensor(info, k->norm ? 4 : 2, &is_const, &s_v));
  if (!is_const) return NULL;
  TRY(GetTensorMutableData(s_v, &scales));
  if (tables_vnni(k->packed, scales, k->N, (k->K + k->block - 1) / k->block, k->block,
                  (int)k->bits, &k->wsp, &k->wsum16))
    return CreateStatus(INVALID_ARGUMENT, "NBitsRows: out of memory");
  k->vnni = 1;
  return NULL;
}

// the four ops, by glu + 2 * norm
static CustomOp ops[4];
static const char* const NAMES[4] = {"MatMulNBits", "MatMulNBitsGLU", "MatMulNBitsNorm",
                                     "MatMulNBitsNormGLU"};
static int variant(const void* which) { return (int)((const CustomOp*)which - ops); }

static OrtStatus* create(const void* which, OrtApiTable table, const OrtKernelInfo* info,
                         void** out) {
  (void)table;
  Kernel* k = calloc(1, sizeof(Kernel));
  k->glu = variant(which) & 1;
  k->norm = variant(which) >> 1;
  if (k->norm) {
    float eps;
    TRY(KernelInfoGetAttribute_float(info, "epsilon", &eps));
    k->eps = eps;
  }
  TRY(KernelInfoGetAttribute_int64(info, "K", &k->K));
  TRY(KernelInfoGetAttribute_int64(info, "N", &k->N));
  TRY(KernelInfoGetAttribute_int64(info, "bits", &k->bits));
  TRY(KernelInfoGetAttribute_int64(info, "block_size", &k->block));
  if ((k->bits != 8 && k->bits != 4) || k->block % 64)
    return CreateStatus(INVALID_ARGUMENT, "NBitsRows: 8 or 4 bits in blocks of 64n");
  TRY(pack(k, info));
  if (vnni) TRY(vnni_tables(k, info));
  *out = k;
  return NULL;
}
static void destroy(void* k) {
  free(((Kernel*)k)->packed);
  free(((Kernel*)k)->wsum16);
  free(((Kernel*)k)->wsp);
  free(k);
}
static const char* name(const void* which) { return NAMES[variant(which)]; }
static const char* provider(const void* op) { (void)op; return "CPUExecutionProvider"; }
static int in_type(const void* which, size_t i) {
  return i == (variant(which) >> 1 ? 3u : 1u) ? TYPE_UINT8 : TYPE_FLOAT;
}
static size_t inputs(const void* which) { return variant(which) >> 1 ? 5 : 3; }
static size_t outputs(const void* which) { return variant(which) >> 1 ? 2 : 1; }
static int out_type(const void* op, size_t i) { (void)op; (void)i; return TYPE_FLOAT; }
static int zero_at(const void* op, size_t i) { (void)op; (void)i; return 0; }
static int one(const void* op) { (void)op; return 1; }
static int zero(const void* op) { (void)op; return 0; }
static int last_version(const void* op) { (void)op; return 1 << 30; }

static const char* attention_name(const void* op) { (void)op; return "GroupQueryAttention"; }
static int attention_in_type(const void* op, size_t i) {
  (void)op;
  return i == 5 || i == 6 ? TYPE_INT32 : TYPE_FLOAT;
}
static size_t nine(const void* op) { (void)op; return 9; }
static size_t three(const void* op) { (void)op; return 3; }
static int optional_kv(const void* op, size_t i) { (void)op; return i == 1 || i == 2; }
static CustomOp attention_op;

OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  api = base->GetApi(API_VERSION);
  vnni = vnni_here();
  CustomOp op = {.version = API_VERSION, .GetName = name,
                  .GetExecutionProviderType = provider, .GetInputType = in_type,
                  .GetInputTypeCount = inputs, .GetOutputType = out_type,
                  .GetOutputTypeCount = outputs, .KernelDestroy = destroy,
                  .GetInputCharacteristic = zero_at, .GetOutputCharacteristic = zero_at,
                  .GetInputMemoryType = zero_at, .GetVariadicInputMinArity = one,
                  .GetVariadicInputHomogeneity = zero, .GetVariadicOutputMinArity = one,
                  .GetVariadicOutputHomogeneity = zero, .CreateKernelV2 = create,
                  .KernelComputeV2 = compute, .GetStartVersion = one,
                  .GetEndVersion = last_version};
  OrtCustomOpDomain* domain;
  TRY(CreateCustomOpDomain("edge_exporter.cpu", &domain));
  for (int i = 0; i < 4; i++) {
    ops[i] = op;
    TRY(CustomOpDomain_Add(domain, &ops[i]));
  }
  attention_op = op;
  attention_op.GetName = attention_name;
  attention_op.GetInputType = attention_in_type;
  attention_op.GetInputTypeCount = nine;
  attention_op.GetOutputTypeCount = three;
  attention_op.GetInputCharacteristic = optional_kv;
  attention_op.KernelDestroy = free;
  attention_op.CreateKernelV2 = attention_create;
  attention_op.KernelComputeV2 = attention;
  TRY(CustomOpDomain_Add(domain, &attention_op));
  return AddCustomOpDomain(options, domain);
}
