// The ONNX Runtime C API entries and the OrtCustomOp layout the onnx target's kernels use
// (targets/onnx/kernels), declared here by slot, and what their two files share.
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

// ---- The few ONNX Runtime C API entries used, by their slot in OrtApi's function table
// (the table only grows at its end: slots hold from API version 17 on).
typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtShapeInfo OrtShapeInfo;
typedef void* const* OrtApiTable;
typedef struct {
  OrtApiTable (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;
enum { API_VERSION = 17, TYPE_FLOAT = 1, TYPE_UINT8 = 2, TYPE_INT32 = 6, INVALID_ARGUMENT = 2 };
#define SLOT(index, ret, ...) ((ret(*)(__VA_ARGS__))api[index])
extern OrtApiTable api;
#define CreateStatus SLOT(0, OrtStatus*, int, const char*)
#define CreateCustomOpDomain SLOT(26, OrtStatus*, const char*, OrtCustomOpDomain**)
#define CustomOpDomain_Add SLOT(27, OrtStatus*, OrtCustomOpDomain*, const void*)
#define AddCustomOpDomain SLOT(28, OrtStatus*, OrtSessionOptions*, OrtCustomOpDomain*)
#define GetTensorMutableData SLOT(51, OrtStatus*, const OrtValue*, void**)
#define GetDimensionsCount SLOT(61, OrtStatus*, const OrtShapeInfo*, size_t*)
#define GetDimensions SLOT(62, OrtStatus*, const OrtShapeInfo*, int64_t*, size_t)
#define GetTensorTypeAndShape SLOT(65, OrtStatus*, const OrtValue*, OrtShapeInfo**)
#define KernelInfoGetAttribute_float \
  SLOT(85, OrtStatus*, const OrtKernelInfo*, const char*, float*)
#define KernelInfoGetAttribute_int64 \
  SLOT(86, OrtStatus*, const OrtKernelInfo*, const char*, int64_t*)
#define KernelContext_GetInput \
  SLOT(90, OrtStatus*, const OrtKernelContext*, size_t, const OrtValue**)
#define KernelContext_GetOutput \
  SLOT(91, OrtStatus*, OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**)
#define ReleaseTensorTypeAndShapeInfo SLOT(99, void, OrtShapeInfo*)
#define ReleaseStatus SLOT(93, void, OrtStatus*)
#define KernelInfoGetConstantInput_tensor \
  SLOT(249, OrtStatus*, const OrtKernelInfo*, size_t, int*, const OrtValue**)
#define KernelContext_ParallelFor \
  SLOT(274, OrtStatus*, const OrtKernelContext*, void (*)(void*, size_t), size_t, size_t, \
       void*)

// OrtCustomOp, field by field as ONNX Runtime reads it (up to the version set in it)
typedef struct {
  uint32_t version;
  void* (*CreateKernel)(const void*, OrtApiTable, const OrtKernelInfo*);
  const char* (*GetName)(const void*);
  const char* (*GetExecutionProviderType)(const void*);
  int (*GetInputType)(const void*, size_t);
  size_t (*GetInputTypeCount)(const void*);
  int (*GetOutputType)(const void*, size_t);
  size_t (*GetOutputTypeCount)(const void*);
  void (*KernelCompute)(void*, OrtKernelContext*);
  void (*KernelDestroy)(void*);
  int (*GetInputCharacteristic)(const void*, size_t);
  int (*GetOutputCharacteristic)(const void*, size_t);
  int (*GetInputMemoryType)(const void*, size_t);
  int (*GetVariadicInputMinArity)(const void*);
  int (*GetVariadicInputHomogeneity)(const void*);
  int (*GetVariadicOutputMinArity)(const void*);
  int (*GetVariadicOutputHomogeneity)(const void*);
  OrtStatus* (*CreateKernelV2)(const void*, OrtApiTable, const OrtKernelInfo*, void**);
  OrtStatus* (*KernelComputeV2)(void*, OrtKernelContext*);
  void* InferOutputShapeFn;
  int (*GetStartVersion)(const void*);
  int (*GetEndVersion)(const void*);
  void* later[4];  // GetMayInplace ... ReleaseAliasMap: not read at version 17
} CustomOp;

#define TRY(x) do { OrtStatus* _s = (x); if (_s) return _s; } while (0)

static inline float hsum(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_hadd_ps(a, a);
  a = _mm_hadd_ps(a, a);
  return _mm_cvtss_f32(a);
}

// e^x, 8 lanes (x clamped to [-87, 88]): 2^n * a degree-5 polynomial of the remainder
// (~1e-7 relative)
static inline __m256 exp_ps(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
OrtStatus* attention(void* kernel, OrtKernelContext* ctx);
OrtStatus* attention_create(const void* which, OrtApiTable table, const OrtKernelInfo* info,
                            void** out);
