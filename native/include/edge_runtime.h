/* The native runtime's C API: load a verified artifact, run it, read its outputs, free.
 *
 * Every function that can fail returns 0 on success or the exit code the CLI uses
 * (2: bad artifact, input or usage; 1: a backend failed while running; 4: a bug), and keeps
 * a message for this thread in edge_last_error() (one paragraph: what, where, what to try)
 * and as one JSON object in edge_last_error_json(). No C++ exception crosses this API.
 * Tensors are dense, row-major, host memory; dtypes are the manifest's names ("float32").
 */
#ifndef EDGE_RUNTIME_H
#define EDGE_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EDGE_MAX_RANK 16

typedef struct edge_program edge_program; /* a loaded artifact */
typedef struct edge_outputs edge_outputs; /* outputs owned by the runtime */

typedef struct edge_tensor {
  const char* name;  /* input or output name (may be NULL for positional inputs) */
  const char* dtype; /* "float32", "int64", ...; for caller output buffers, written by edge_run_into */
  int32_t rank;
  int64_t shape[EDGE_MAX_RANK];
  void* data;    /* input: rank/shape/dtype bytes; output: a buffer of `nbytes` capacity */
  size_t nbytes; /* bytes of data (for caller output buffers: capacity in, size out) */
} edge_tensor;

/* Verifies the artifact (every entry's SHA-256; with public_key_path, the Ed25519 signature
 * against that signing.pub) and loads its partitions. *out is NULL on failure. */
int edge_load(const char* artifact_path, const char* public_key_path, edge_program** out);
void edge_free(edge_program* program);

/* The signature. Dims: size >= 0, or -1 for a dynamic dim (its bounds from edge_*_dim_range). */
size_t edge_num_inputs(const edge_program* program);
size_t edge_num_outputs(const edge_program* program);
const char* edge_input_name(const edge_program* program, size_t index);
const char* edge_input_dtype(const edge_program* program, size_t index);
int32_t edge_input_rank(const edge_program* program, size_t index);
int64_t edge_input_dim(const edge_program* program, size_t index, int32_t axis);
int edge_input_dim_range(const edge_program* program, size_t index, int32_t axis, int64_t* min,
                         int64_t* max);
const char* edge_output_name(const edge_program* program, size_t index);
const char* edge_output_dtype(const edge_program* program, size_t index);
int32_t edge_output_rank(const edge_program* program, size_t index);
int64_t edge_output_dim(const edge_program* program, size_t index, int32_t axis);

/* Runs on `inputs` (matched by name when every name is set, else positional in signature
 * order), checked against the signature first. Outputs are owned by the runtime, in
 * signature order, until edge_outputs_free. */
int edge_run(edge_program* program, const edge_tensor* inputs, size_t num_inputs, edge_outputs** out);
size_t edge_outputs_count(const edge_outputs* outputs);
const edge_tensor* edge_outputs_get(const edge_outputs* outputs, size_t index);
void edge_outputs_free(edge_outputs* outputs);

/* As edge_run, writing into the caller's buffers (outputs[i].data with outputs[i].nbytes of
 * room, in signature order); fails with 2 and writes nothing when one is too small. */
int edge_run_into(edge_program* program, const edge_tensor* inputs, size_t num_inputs,
                  edge_tensor* outputs, size_t num_outputs);

/* Numpy files for inputs and outputs (.npz; a lone .npy names the only input). The
 * output follows a symbolic link and replaces only a regular file (2 otherwise). */
int edge_read_arrays(const char* path, const edge_program* program, edge_outputs** out);
int edge_write_npz(const char* path, const edge_tensor* tensors, size_t count);

/* This thread's last error: one paragraph, its JSON object, and its exit code (0: none). */
const char* edge_last_error(void);
const char* edge_last_error_json(void);
int edge_last_exit_code(void);

#ifdef __cplusplus
}
#endif

#endif /* EDGE_RUNTIME_H */
