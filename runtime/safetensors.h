/* safetensors.h: reading and writing .safetensors files (weights, inputs, outputs).
 *
 * Format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N, N
 * bytes of UTF-8 JSON {"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets":
 * [begin, end]}, ...}, then the data section; offsets are relative to its first byte and data is
 * little-endian, row-major.
 *
 * Every function that can fail returns RT_ST_OK (0) or an RtStStatus and, where it takes one,
 * writes a one-line message into the caller's buffer `err` (NULL or errlen 0: no message). No
 * global state: files and writers are independent objects, safe to use from several threads as
 * long as one object is not used by two threads at once (reading a file concurrently is fine).
 * This host must be little-endian (checked at compile time).
 */
#ifndef XTC_RT_SAFETENSORS_H
#define XTC_RT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* ---- element types: one table, from which the enum, names and sizes come ---- */

#define RT_DTYPES(X) \
  X(RT_F32, "F32", 4) \
  X(RT_F64, "F64", 8) \
  X(RT_F16, "F16", 2) \
  X(RT_BF16, "BF16", 2) \
  X(RT_I64, "I64", 8) \
  X(RT_I32, "I32", 4) \
  X(RT_I16, "I16", 2) \
  X(RT_I8, "I8", 1) \
  X(RT_U8, "U8", 1) \
  X(RT_BOOL, "BOOL", 1) /* one byte, 0 or 1 */

typedef enum {
#define RT_DTYPE_ENUM(id, name, size) id,
  RT_DTYPES(RT_DTYPE_ENUM)
#undef RT_DTYPE_ENUM
  RT_DTYPE_COUNT
} RtDType;

const char *rt_dtype_name(RtDType dt); /* "F32", ...; "?" for an invalid value */
size_t rt_dtype_size(RtDType dt);      /* bytes per element; 0 for an invalid value */
int rt_dtype_lookup(const char *name); /* the RtDType named `name` exactly, or -1 */

/* ---- status ---- */

typedef enum {
  RT_ST_OK = 0,
  RT_ST_EIO,     /* the file could not be opened, read or written (message has strerror) */
  RT_ST_EFORMAT, /* the bytes are not a valid safetensors file */
  RT_ST_ENOMEM,  /* out of memory */
  RT_ST_EINVAL,  /* a bad argument: NULL, wrong dtype for a conversion, invalid name or shape */
} RtStStatus;

#define RT_ST_MAX_RANK 8
#define RT_ST_MAX_HEADER ((uint64_t)100 << 20) /* bytes (100 MiB); larger headers are refused */

/* ---- reading ---- */

typedef struct {
  char *name; /* UTF-8, no control characters, non-empty */
  RtDType dtype;
  int rank;                      /* 0 for a scalar (shape []) */
  int64_t shape[RT_ST_MAX_RANK]; /* shape[i] >= 0 for i < rank; the rest 0 */
  const void *data;              /* nbytes bytes inside the file; NOT necessarily aligned for the
                                    dtype (use memcpy, or rt_st_to_f32 / rt_st_to_i64) */
  size_t nbytes;                 /* = numel * rt_dtype_size(dtype), may be 0 */
} RtStTensor;

typedef struct RtStFile RtStFile;

/* Reads the whole file into memory and validates it. Tensors keep the header's order. */
int rt_st_open(const char *path, RtStFile **out, char *err, size_t errlen);
/* The same from `len` bytes in memory (copied; the caller keeps `bytes`). */
int rt_st_parse(const void *bytes, size_t len, RtStFile **out, char *err, size_t errlen);
void rt_st_close(RtStFile *f); /* NULL is fine */

int rt_st_count(const RtStFile *f);
const RtStTensor *rt_st_get(const RtStFile *f, int i);             /* NULL when out of range */
const RtStTensor *rt_st_find(const RtStFile *f, const char *name); /* NULL when absent */
int64_t rt_st_numel(const RtStTensor *t); /* product of the shape; -1 for an invalid shape */

/* __metadata__: string values by key (NULL if absent), and in file order. */
const char *rt_st_metadata(const RtStFile *f, const char *key);
int rt_st_metadata_count(const RtStFile *f);
const char *rt_st_metadata_key(const RtStFile *f, int i); /* NULL when out of range */

/* Conversions into a caller buffer of rt_st_numel(t) elements. to_f32 reads F32, F64, F16 and
 * BF16 (a finite F64 beyond float range is an error); to_i64 reads I64, I32, I16, I8, U8 and BOOL
 * (a BOOL byte other than 0 or 1 is an error). Other dtypes are refused with RT_ST_EINVAL. */
int rt_st_to_f32(const RtStTensor *t, float *dst, char *err, size_t errlen);
int rt_st_to_i64(const RtStTensor *t, int64_t *dst, char *err, size_t errlen);

/* ---- writing ---- */

typedef struct RtStWriter RtStWriter;

RtStWriter *rt_st_writer_new(void); /* NULL when out of memory */
/* Adds a tensor (data is copied; it may be NULL when the tensor has no elements). Names must be
 * non-empty UTF-8 without control characters, unique, and not "__metadata__". */
int rt_st_writer_add(RtStWriter *w, const char *name, RtDType dt, int rank, const int64_t *shape,
                     const void *data);
/* Adds a __metadata__ pair; keys must be unique, both strings UTF-8. */
int rt_st_writer_meta(RtStWriter *w, const char *key, const char *value);
/* Errors of add and meta are sticky: they make save and serialize fail too, so a caller may check
 * once at the end. This is the first such error, or "" when there was none. */
const char *rt_st_writer_error(const RtStWriter *w);
/* Writes the file atomically: a temporary file in the same directory, fsync, rename over `path`,
 * fsync of the directory. The header is padded with spaces to a multiple of 8 bytes. */
int rt_st_writer_save(RtStWriter *w, const char *path, char *err, size_t errlen);
/* The same bytes into a malloc'ed buffer (*out, *len; the caller frees it). */
int rt_st_writer_serialize(RtStWriter *w, void **out, size_t *len, char *err, size_t errlen);
void rt_st_writer_free(RtStWriter *w); /* NULL is fine */

#endif
