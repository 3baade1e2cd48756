/* fuzz_safetensors.c: libFuzzer target for the safetensors reader (runtime/safetensors.c). The
 * input is a file image. One that parses is walked through every accessor and conversion, then
 * written back with the writer and parsed again: the second file must hold the same tensors
 * (names, dtypes, shapes, bytes) and metadata, in the same order. A broken promise aborts.
 * Built as a fuzzer with XTC_FUZZ=ON; replayed over corpus/ and regress/ by fuzz_replay.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

static void internal_error(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_safetensors: %s: %s\n", what, detail);
    abort();
}

/* Every conversion the tensor's dtype allows, into exactly-sized buffers. */
static void convert(const RtStTensor *t)
{
    int64_t n = rt_st_numel(t);
    if (n < 0)
        internal_error("a parsed tensor has an invalid shape", t->name);
    if ((uint64_t)n * rt_dtype_size(t->dtype) != t->nbytes)
        internal_error("nbytes does not match the shape", t->name);
    char err[256];
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    int64_t *i = malloc((size_t)(n ? n : 1) * sizeof *i);
    if (f)
        (void)rt_st_to_f32(t, f, err, sizeof err);
    if (i)
        (void)rt_st_to_i64(t, i, err, sizeof err);
    free(f);
    free(i);
}

static void same_tensor(const RtStTensor *a, const RtStTensor *b)
{
    if (!b || strcmp(a->name, b->name) != 0)
        internal_error("round trip lost or reordered a tensor", a->name);
    if (a->dtype != b->dtype || a->rank != b->rank || a->nbytes != b->nbytes ||
        memcmp(a->shape, b->shape, sizeof a->shape) != 0)
        internal_error("round trip changed a tensor's dtype or shape", a->name);
    if (a->nbytes && memcmp(a->data, b->data, a->nbytes) != 0)
        internal_error("round trip changed a tensor's data", a->name);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    RtStFile *f = NULL;
    if (rt_st_parse(data, size, &f, err, sizeof err) != RT_ST_OK) {
        if (f)
            internal_error("a failed parse returned a file", err);
        if (!err[0])
            internal_error("a failed parse gave no message", "");
        return 0;
    }
    int n = rt_st_count(f);
    RtStWriter *w = rt_st_writer_new();
    for (int k = 0; k < n; k++) {
        const RtStTensor *t = rt_st_get(f, k);
        if (!t || rt_st_find(f, t->name) != t)
            internal_error("rt_st_find does not find a tensor by its name", t ? t->name : "(null)");
        convert(t);
        if (w)
            rt_st_writer_add(w, t->name, t->dtype, t->rank, t->shape, t->data);
    }
    if (rt_st_get(f, n) || rt_st_get(f, -1))
        internal_error("rt_st_get answers out of range", "");
    int nmeta = rt_st_metadata_count(f);
    for (int k = 0; k < nmeta; k++) {
        const char *key = rt_st_metadata_key(f, k);
        const char *value = key ? rt_st_metadata(f, key) : NULL;
        if (!value)
            internal_error("a metadata key has no value", key ? key : "(null)");
        if (w)
            rt_st_writer_meta(w, key, value);
    }
    void *bytes = NULL;
    size_t len = 0;
    if (w && rt_st_writer_serialize(w, &bytes, &len, err, sizeof err) == RT_ST_OK) {
        RtStFile *g = NULL;
        if (rt_st_parse(bytes, len, &g, err, sizeof err) != RT_ST_OK)
            internal_error("the writer's output does not parse", err);
        if (rt_st_count(g) != n || rt_st_metadata_count(g) != nmeta)
            internal_error("round trip changed the number of tensors or metadata", "");
        for (int k = 0; k < n; k++)
            same_tensor(rt_st_get(f, k), rt_st_get(g, k));
        for (int k = 0; k < nmeta; k++) {
            const char *key = rt_st_metadata_key(f, k);
            const char *v2 = rt_st_metadata(g, key);
            if (!v2 || strcmp(v2, rt_st_metadata(f, key)) != 0)
                internal_error("round trip changed a metadata value", key);
        }
        rt_st_close(g);
    } else if (w) {
        /* the writer refusing what the reader accepted: the two disagree on validity */
        internal_error("the writer refuses a file the reader accepted", rt_st_writer_error(w));
    }
    free(bytes);
    rt_st_writer_free(w);
    rt_st_close(f);
    return 0;
}
