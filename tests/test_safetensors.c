/* test_safetensors.c: the safetensors reader and writer (runtime/safetensors.c, runtime/json.c).
 *
 * Covers: every parity file loads, with known names, shapes and values; write-then-read round
 * trips for every dtype, scalars and zero-size tensors, metadata and unusual names; conversions to
 * float32 / int64; the writer's own checks and atomic save. Hostile files, truncation and random
 * mutations are test_safetensors_hostile's.
 */
#include <check.h>
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "json.h"
#include "safetensors.h"
#include "st_image.h"

#define PARITY XTC_SHARED_DIR "/parity"

/* ---- helpers ---- */


static void expect_shape(const RtStTensor *t, RtDType dt, int rank, const int64_t *shape) {
  ck_assert_ptr_nonnull(t);
  ck_assert_msg(t->dtype == dt, "%s: dtype %s, want %s", t->name, rt_dtype_name(t->dtype), rt_dtype_name(dt));
  ck_assert_int_eq(t->rank, rank);
  for (int i = 0; i < rank; i++) ck_assert_int_eq(t->shape[i], shape[i]);
}

static RtStFile *open_ok(const char *path) {
  char err[ERRLEN];
  RtStFile *f = NULL;
  int rc = rt_st_open(path, &f, err, sizeof err);
  ck_assert_msg(rc == RT_ST_OK, "%s", err);
  return f;
}

/* A scratch directory under the build tree, removed (with its files) by rm_tmpdir. */
static void make_tmpdir(char *dir, size_t n) {
  snprintf(dir, n, "%s/st_test_XXXXXX", XTC_BINARY_DIR);
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static void rm_tmpdir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[1024];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (rmdir(path) != 0) unlink(path);
  }
  closedir(d);
  rmdir(dir);
}


/* ---- dtype table ---- */

START_TEST(test_dtype_table) {
  static const char *names[] = {"F32", "F64", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"};
  static const size_t sizes[] = {4, 8, 2, 2, 8, 4, 2, 1, 1, 1};
  ck_assert_int_eq(RT_DTYPE_COUNT, 10);
  for (int i = 0; i < RT_DTYPE_COUNT; i++) {
    ck_assert_str_eq(rt_dtype_name((RtDType)i), names[i]);
    ck_assert_uint_eq(rt_dtype_size((RtDType)i), sizes[i]);
    ck_assert_int_eq(rt_dtype_lookup(names[i]), i);
  }
  ck_assert_int_eq(rt_dtype_lookup("f32"), -1);
  ck_assert_int_eq(rt_dtype_lookup("F8_E4M3"), -1);
  ck_assert_int_eq(rt_dtype_lookup(NULL), -1);
  ck_assert_str_eq(rt_dtype_name((RtDType)99), "?");
  ck_assert_uint_eq(rt_dtype_size((RtDType)-1), 0);
}
END_TEST

/* ---- the JSON parser on its own ---- */

START_TEST(test_json_parser) {
  char err[ERRLEN];
  JsonDoc *doc;
  const char *text =
      "{\"a\": [1, -9223372036854775808, 9223372036854775807, 9223372036854775808, 1e2, 0.5],"
      " \"s\": \"\\u00E9\\u2713\\uD83D\\uDE00\\n\", \"o\": {}, \"n\": null, \"z\": \"a\\u0000b\"}";
  ck_assert_msg(json_parse(text, strlen(text), 0, &doc, err, sizeof err) == 0, "%s", err);
  const JsonValue *root = json_root(doc), *a = json_object_get(root, "a"), *str = json_object_get(root, "s");
  ck_assert(root->kind == JSON_OBJECT && root->len == 5);
  ck_assert(a && a->kind == JSON_ARRAY && a->len == 6);
  ck_assert(a->u.items[0].int_class == JSON_INT_OK && a->u.items[0].ival == 1);
  ck_assert(a->u.items[1].int_class == JSON_INT_OK && a->u.items[1].ival == INT64_MIN);
  ck_assert(a->u.items[2].int_class == JSON_INT_OK && a->u.items[2].ival == INT64_MAX);
  ck_assert(a->u.items[3].int_class == JSON_INT_RANGE);
  ck_assert(a->u.items[4].int_class == JSON_NOT_INT && !strcmp(a->u.items[4].u.str, "1e2"));
  ck_assert(a->u.items[5].int_class == JSON_NOT_INT && a->u.items[5].len == 3);
  ck_assert(str && str->kind == JSON_STRING);
  ck_assert_str_eq(str->u.str, "é✓😀\n");
  ck_assert_uint_eq(str->len, strlen("é✓😀\n"));
  ck_assert(json_object_get(root, "o")->kind == JSON_OBJECT && json_object_get(root, "o")->len == 0);
  ck_assert(json_object_get(root, "n")->kind == JSON_NULL);
  ck_assert_uint_eq(json_object_get(root, "z")->len, 3); /* embedded NUL kept */
  ck_assert_ptr_null(json_object_get(root, "missing"));
  ck_assert_ptr_null(json_object_get(a, "a"));
  json_free(doc);

  /* the cap on the number of values */
  ck_assert_int_ne(json_parse("[1,2,3]", 7, 3, &doc, err, sizeof err), 0);
  ck_assert_ptr_null(doc);
  ck_assert_ptr_nonnull(strstr(err, "more than 3 values"));
  ck_assert_int_eq(json_parse("[1,2,3]", 7, 4, &doc, err, sizeof err), 0);
  json_free(doc);
  ck_assert_int_ne(json_parse("\"\\uD83Dx\"", 9, 0, &doc, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(err, "byte 1: unpaired surrogate"));
  ck_assert_int_ne(json_parse("\"\\uZZZZ\"", 8, 0, &doc, err, sizeof err), 0);
  /* not NUL-terminated: the parser stops at len */
  ck_assert_int_eq(json_parse("[1]]]]", 3, 0, &doc, err, sizeof err), 0);
  json_free(doc);

  size_t bad;
  ck_assert(json_utf8_valid("héllo", strlen("héllo"), NULL));
  ck_assert(!json_utf8_valid("ab\x80", 3, &bad) && bad == 2);
  ck_assert(!json_utf8_valid("\xf0\x9f\x98", 3, &bad) && bad == 0); /* cut 4-byte sequence */
}
END_TEST

/* ---- parity files ---- */

START_TEST(test_parity_every_file_loads) {
  DIR *d = opendir(PARITY);
  ck_assert_msg(d != NULL, "cannot open %s", PARITY);
  static const char *kinds[] = {"weights", "inputs", "expected"};
  int cases = 0, files = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char path[1024];
    struct stat st;
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s/weights.safetensors", PARITY, e->d_name);
    if (stat(path, &st) != 0) continue; /* not a case folder */
    cases++;
    for (int k = 0; k < 3; k++) {
      snprintf(path, sizeof path, "%s/%s/%s.safetensors", PARITY, e->d_name, kinds[k]);
      RtStFile *f = open_ok(path);
      files++;
      ck_assert_msg(rt_st_count(f) > 0, "%s has no tensors", path);
      check_consistent(f);
      const char *commit = rt_st_metadata(f, "x_transformers_commit");
      ck_assert_msg(commit && !strcmp(commit, "75d723ba14103ea9664b6980c3c502b5d2700d13"), "%s", path);
      ck_assert_ptr_nonnull(rt_st_metadata(f, "config"));
      for (int i = 0; i < rt_st_count(f); i++) {
        RtDType dt = rt_st_get(f, i)->dtype;
        ck_assert(dt == RT_F32 || dt == RT_I64 || dt == RT_BOOL);
        if (k != 1) ck_assert_msg(dt == RT_F32, "%s: %s", path, rt_st_get(f, i)->name);
      }
      if (k == 2) {
        const RtStTensor *loss = rt_st_find(f, "loss");
        ck_assert_msg(loss && loss->rank == 0 && loss->dtype == RT_F32, "%s: loss", path);
        ck_assert_ptr_nonnull(rt_st_metadata(f, "loss"));
      }
      rt_st_close(f);
    }
  }
  closedir(d);
  ck_assert_int_ge(cases, 1);
  ck_assert_int_eq(files, 3 * cases);
}
END_TEST

START_TEST(test_parity_known_values) {
  char err[ERRLEN];
  RtStFile *w = open_ok(PARITY "/decoder_plain/weights.safetensors");
  ck_assert_int_eq(rt_st_count(w), 32);
  const RtStTensor *emb = rt_st_find(w, "token_emb.weight");
  expect_shape(emb, RT_F32, 2, (int64_t[]){64, 32});
  ck_assert_ptr_eq(rt_st_get(w, 0), emb); /* file order is state_dict order */
  ck_assert_ptr_null(rt_st_find(w, "token_emb"));
  ck_assert_ptr_null(rt_st_find(w, "__metadata__"));
  float *v = malloc(64 * 32 * sizeof *v);
  ck_assert_int_eq(rt_st_to_f32(emb, v, err, sizeof err), RT_ST_OK);
  ck_assert_float_eq(v[0], 0.04798183962702751f);
  ck_assert_float_eq(v[64 * 32 - 1], -0.42976269125938416f);
  ck_assert_uint_eq((uintptr_t)emb->data % 64, 0); /* data section placed 64-byte aligned */
  free(v);
  rt_st_close(w);

  RtStFile *in = open_ok(PARITY "/decoder_plain/inputs.safetensors");
  ck_assert_int_eq(rt_st_count(in), 2);
  const RtStTensor *tok = rt_st_find(in, "tokens"), *tgt = rt_st_find(in, "targets");
  expect_shape(tok, RT_I64, 2, (int64_t[]){2, 16});
  expect_shape(tgt, RT_I64, 2, (int64_t[]){2, 16});
  int64_t ids[32];
  ck_assert_int_eq(rt_st_to_i64(tok, ids, err, sizeof err), RT_ST_OK);
  ck_assert(ids[0] == 31 && ids[1] == 11 && ids[2] == 17 && ids[3] == 6 && ids[4] == 63);
  for (int i = 0; i < 32; i++) ck_assert(ids[i] >= 0 && ids[i] < 64);
  ck_assert_int_eq(rt_st_to_i64(tgt, ids, err, sizeof err), RT_ST_OK);
  ck_assert(ids[29] == 29 && ids[30] == 51 && ids[31] == -100);
  ck_assert_int_ne(rt_st_to_f32(tok, (float *)ids, err, sizeof err), RT_ST_OK);
  rt_st_close(in);

  RtStFile *ex = open_ok(PARITY "/decoder_plain/expected.safetensors");
  ck_assert_int_eq(rt_st_count(ex), 35);
  expect_shape(rt_st_find(ex, "logits"), RT_F32, 3, (int64_t[]){2, 16, 64});
  float loss;
  ck_assert_int_eq(rt_st_to_f32(rt_st_find(ex, "loss"), &loss, err, sizeof err), RT_ST_OK);
  ck_assert_float_eq_tol(loss, 4.5594997f, 1e-6f);
  ck_assert_ptr_nonnull(rt_st_find(ex, "grad.token_emb.weight"));
  ck_assert_int_eq(rt_st_metadata_count(ex), 3);
  ck_assert_str_eq(rt_st_metadata_key(ex, 0), "x_transformers_commit");
  ck_assert_ptr_null(rt_st_metadata_key(ex, 3));
  ck_assert_ptr_null(rt_st_metadata(ex, "nope"));
  rt_st_close(ex);

  RtStFile *mask = open_ok(PARITY "/encoder_mask/inputs.safetensors");
  const RtStTensor *m = rt_st_find(mask, "mask");
  expect_shape(m, RT_BOOL, 2, (int64_t[]){2, 16});
  int64_t bits[32];
  ck_assert_int_eq(rt_st_to_i64(m, bits, err, sizeof err), RT_ST_OK);
  for (int i = 0; i < 32; i++) ck_assert_int_eq(bits[i], i < 16 || i - 16 < 11);
  rt_st_close(mask);
}
END_TEST

/* ---- round trips ---- */

/* Deterministic bytes for tensor `k` (BOOL gets 0/1). */
static void fill(unsigned char *p, size_t n, RtDType dt, int k) {
  for (size_t i = 0; i < n; i++)
    p[i] =
        dt == RT_BOOL ? (unsigned char)((i + (size_t)k) & 1) : (unsigned char)(i * 37 + (size_t)k * 11 + 5);
}

START_TEST(test_roundtrip_every_dtype) {
  static const struct {
    const char *name;
    int rank;
    int64_t shape[8];
  } shapes[] = {
      {"scalar", 0, {0}},
      {"empty", 1, {0}},
      {"empty3", 3, {3, 0, 2}},
      {"matrix", 2, {2, 3}},
      {"rank8", 8, {1, 2, 1, 2, 1, 1, 2, 1}},
      {"vec", 1, {7}},
  };
  enum { NS = sizeof shapes / sizeof shapes[0] };
  char dir[1024], path[1100], err[ERRLEN];
  make_tmpdir(dir, sizeof dir);
  for (int dt = 0; dt < RT_DTYPE_COUNT; dt++) {
    RtStWriter *w = rt_st_writer_new();
    unsigned char bufs[NS][64 * 8];
    for (int s = 0; s < NS; s++) {
      int64_t n = 1;
      for (int i = 0; i < shapes[s].rank; i++) n *= shapes[s].shape[i];
      fill(bufs[s], (size_t)n * rt_dtype_size((RtDType)dt), (RtDType)dt, s);
      ck_assert_int_eq(rt_st_writer_add(w, shapes[s].name, (RtDType)dt, shapes[s].rank, shapes[s].shape,
                                        n ? bufs[s] : NULL),
                       RT_ST_OK);
    }
    ck_assert_int_eq(rt_st_writer_meta(w, "dtype", rt_dtype_name((RtDType)dt)), RT_ST_OK);
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, rt_dtype_name((RtDType)dt));
    ck_assert_msg(rt_st_writer_save(w, path, err, sizeof err) == RT_ST_OK, "%s", err);
    void *mem;
    size_t memlen;
    ck_assert_int_eq(rt_st_writer_serialize(w, &mem, &memlen, err, sizeof err), RT_ST_OK);
    rt_st_writer_free(w);

    /* the in-memory bytes are the file's bytes */
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    unsigned char *disk = malloc(memlen + 1);
    ck_assert_uint_eq(fread(disk, 1, memlen + 1, fp), memlen);
    fclose(fp);
    ck_assert(memcmp(disk, mem, memlen) == 0);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | disk[i];
    ck_assert_uint_eq((8 + hlen) % 8, 0); /* header padded to 8 bytes */
    free(disk);

    for (int from_mem = 0; from_mem < 2; from_mem++) {
      RtStFile *f = NULL;
      int rc =
          from_mem ? rt_st_parse(mem, memlen, &f, err, sizeof err) : rt_st_open(path, &f, err, sizeof err);
      ck_assert_msg(rc == RT_ST_OK, "%s", err);
      ck_assert_int_eq(rt_st_count(f), NS);
      ck_assert_str_eq(rt_st_metadata(f, "dtype"), rt_dtype_name((RtDType)dt));
      for (int s = 0; s < NS; s++) {
        const RtStTensor *t = rt_st_get(f, s);
        ck_assert_str_eq(t->name, shapes[s].name); /* writer order kept */
        expect_shape(t, (RtDType)dt, shapes[s].rank, shapes[s].shape);
        ck_assert_int_eq(rt_st_numel(t), t->nbytes / rt_dtype_size((RtDType)dt));
        ck_assert(t->nbytes == 0 || memcmp(t->data, bufs[s], t->nbytes) == 0);
      }
      check_consistent(f);
      rt_st_close(f);
    }
    free(mem);
  }
  ck_assert_int_eq(count_entries(dir), RT_DTYPE_COUNT); /* no temporary files left behind */
  rm_tmpdir(dir);
}
END_TEST

START_TEST(test_roundtrip_metadata_and_names) {
  static const char *keys[] = {"x_transformers_commit", "quote\"back\\slash/", "ctl\n\t\r\x01\x1f",
                               "héllo ✓ 😀", ""};
  static const char *vals[] = {"75d723ba", "", "{\"dim\": 32, \"heads\": [1, 2]}", "\x7f", "empty key"};
  static const char *names[] = {"layers.0.attn.to_q.weight", "é✓😀", "with \"quote\" and \\", "a b/c", "x"};
  char err[ERRLEN];
  RtStWriter *w = rt_st_writer_new();
  for (int i = 0; i < 5; i++) ck_assert_int_eq(rt_st_writer_meta(w, keys[i], vals[i]), RT_ST_OK);
  float x = 1.5f;
  for (int i = 0; i < 5; i++) ck_assert_int_eq(rt_st_writer_add(w, names[i], RT_F32, 0, NULL, &x), RT_ST_OK);
  void *mem;
  size_t len;
  ck_assert_int_eq(rt_st_writer_serialize(w, &mem, &len, err, sizeof err), RT_ST_OK);
  rt_st_writer_free(w);
  RtStFile *f = NULL;
  ck_assert_msg(rt_st_parse(mem, len, &f, err, sizeof err) == RT_ST_OK, "%s", err);
  ck_assert_int_eq(rt_st_metadata_count(f), 5);
  for (int i = 0; i < 5; i++) {
    ck_assert_str_eq(rt_st_metadata_key(f, i), keys[i]);
    ck_assert_str_eq(rt_st_metadata(f, keys[i]), vals[i]);
    const RtStTensor *t = rt_st_get(f, i);
    ck_assert_str_eq(t->name, names[i]);
    ck_assert_ptr_eq(rt_st_find(f, names[i]), t);
    ck_assert_int_eq(t->rank, 0);
    ck_assert_int_eq(rt_st_numel(t), 1);
  }
  rt_st_close(f);
  free(mem);

  /* an empty writer makes a valid empty file */
  w = rt_st_writer_new();
  ck_assert_int_eq(rt_st_writer_serialize(w, &mem, &len, err, sizeof err), RT_ST_OK);
  rt_st_writer_free(w);
  ck_assert_int_eq(rt_st_parse(mem, len, &f, err, sizeof err), RT_ST_OK);
  ck_assert_int_eq(rt_st_count(f), 0);
  ck_assert_int_eq(rt_st_metadata_count(f), 0);
  rt_st_close(f);
  free(mem);
}
END_TEST

/* ---- conversions ---- */

/* One tensor in a fresh in-memory file. */
static RtStFile *one(RtDType dt, int64_t n, const void *data) {
  char err[ERRLEN];
  void *mem;
  size_t len;
  RtStFile *f = NULL;
  RtStWriter *w = rt_st_writer_new();
  ck_assert_int_eq(rt_st_writer_add(w, "t", dt, 1, &n, data), RT_ST_OK);
  ck_assert_int_eq(rt_st_writer_serialize(w, &mem, &len, err, sizeof err), RT_ST_OK);
  rt_st_writer_free(w);
  ck_assert_msg(rt_st_parse(mem, len, &f, err, sizeof err) == RT_ST_OK, "%s", err);
  free(mem);
  return f;
}

START_TEST(test_to_f32) {
  char err[ERRLEN];
  float out[16];
  static const uint16_t f16[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00, 0x7E00, 0x3555, 0x0400};
  static const float f16_want[] = {1.0f,     -2.0f, 65504.0f,        5.9604644775390625e-8f, -0.0f,
                                   INFINITY, NAN,   0.333251953125f, 6.103515625e-5f};
  RtStFile *f = one(RT_F16, 9, f16);
  ck_assert_int_eq(rt_st_to_f32(rt_st_get(f, 0), out, err, sizeof err), RT_ST_OK);
  for (int i = 0; i < 9; i++) {
    if (isnan(f16_want[i]))
      ck_assert(isnan(out[i]));
    else
      ck_assert_msg(out[i] == f16_want[i], "F16 %d: %g", i, out[i]);
  }
  ck_assert(signbit(out[4]));
  rt_st_close(f);

  static const uint16_t bf16[] = {0x3F80, 0xC0A0, 0x7F80, 0x0000};
  f = one(RT_BF16, 4, bf16);
  ck_assert_int_eq(rt_st_to_f32(rt_st_get(f, 0), out, err, sizeof err), RT_ST_OK);
  ck_assert(out[0] == 1.0f && out[1] == -5.0f && isinf(out[2]) && out[3] == 0.0f);
  rt_st_close(f);

  double f64[] = {1.5, -1e-3, 1e30, -INFINITY};
  f = one(RT_F64, 4, f64);
  ck_assert_int_eq(rt_st_to_f32(rt_st_get(f, 0), out, err, sizeof err), RT_ST_OK);
  ck_assert(out[0] == 1.5f && out[1] == (float)-1e-3 && out[2] == 1e30f && isinf(out[3]) && out[3] < 0);
  rt_st_close(f);

  f64[1] = -1e300;
  f = one(RT_F64, 4, f64);
  ck_assert_int_eq(rt_st_to_f32(rt_st_get(f, 0), out, err, sizeof err), RT_ST_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "element 1"));
  ck_assert_ptr_nonnull(strstr(err, "out of float32 range"));
  rt_st_close(f);

  int64_t i64[] = {1};
  f = one(RT_I64, 1, i64);
  ck_assert_int_eq(rt_st_to_f32(rt_st_get(f, 0), out, err, sizeof err), RT_ST_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "is I64, not a floating-point type"));
  ck_assert_ptr_null(strstr(err, "rt_st_")); /* users see these messages: no internal names */
  rt_st_close(f);

  /* a tensor filled by hand whose nbytes disagrees with its shape is refused */
  RtStTensor bad = {.name = "hand", .dtype = RT_F32, .rank = 1, .shape = {4}, .data = out, .nbytes = 12};
  ck_assert_int_eq(rt_st_to_f32(&bad, out, err, sizeof err), RT_ST_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "inconsistent"));
  ck_assert_int_eq(rt_st_to_f32(NULL, out, err, sizeof err), RT_ST_EINVAL);
  bad.nbytes = 16;
  bad.dtype = (RtDType)42;
  ck_assert_int_eq(rt_st_to_f32(&bad, out, err, sizeof err), RT_ST_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "invalid dtype or rank"));
  ck_assert_ptr_null(strstr(err, "rt_st_"));
  ck_assert_int_eq(rt_st_numel(&bad), 4);
  bad.rank = 2;
  bad.shape[1] = INT64_MAX;
  ck_assert_int_eq(rt_st_numel(&bad), -1); /* overflow */
  bad.shape[1] = -1;
  ck_assert_int_eq(rt_st_numel(&bad), -1);
  ck_assert_int_eq(rt_st_numel(NULL), -1);
}
END_TEST

START_TEST(test_to_i64) {
  char err[ERRLEN];
  int64_t out[8];
  static const int8_t i8[] = {-128, 127, -1};
  static const uint8_t u8[] = {255, 0};
  static const int16_t i16[] = {-32768, 32767};
  static const int32_t i32[] = {INT32_MIN, INT32_MAX};
  static const int64_t i64[] = {INT64_MIN, INT64_MAX};
  static const uint8_t b[] = {0, 1, 1};
  struct {
    RtDType dt;
    int n;
    const void *data;
    int64_t want[3];
  } cases[] = {
      {RT_I8, 3, i8, {-128, 127, -1}},          {RT_U8, 2, u8, {255, 0}},
      {RT_I16, 2, i16, {-32768, 32767}},        {RT_I32, 2, i32, {INT32_MIN, INT32_MAX}},
      {RT_I64, 2, i64, {INT64_MIN, INT64_MAX}}, {RT_BOOL, 3, b, {0, 1, 1}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    RtStFile *f = one(cases[c].dt, cases[c].n, cases[c].data);
    ck_assert_int_eq(rt_st_to_i64(rt_st_get(f, 0), out, err, sizeof err), RT_ST_OK);
    for (int i = 0; i < cases[c].n; i++) ck_assert_int_eq(out[i], cases[c].want[i]);
    rt_st_close(f);
  }
  static const uint8_t bad_bool[] = {0, 1, 2};
  RtStFile *f = one(RT_BOOL, 3, bad_bool);
  ck_assert_int_eq(rt_st_to_i64(rt_st_get(f, 0), out, err, sizeof err), RT_ST_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "BOOL element 2 has byte value 2"));
  rt_st_close(f);
  float x[1] = {1};
  f = one(RT_F32, 1, x);
  ck_assert_int_eq(rt_st_to_i64(rt_st_get(f, 0), out, err, sizeof err), RT_ST_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "is F32, not an integer type"));
  ck_assert_ptr_null(strstr(err, "rt_st_"));
  rt_st_close(f);
  f = one(RT_F16, 0, NULL); /* zero-size: still the wrong kind */
  ck_assert_int_eq(rt_st_to_i64(rt_st_get(f, 0), out, err, sizeof err), RT_ST_EINVAL);
  ck_assert_int_eq(rt_st_to_f32(rt_st_get(f, 0), NULL, err, sizeof err), RT_ST_OK);
  rt_st_close(f);
}
END_TEST

/* A tensor at an odd offset (after a 1-byte BOOL) converts correctly despite misalignment. */
START_TEST(test_unaligned_tensor) {
  char err[ERRLEN];
  const char *h = "{\"b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]}}";
  size_t len;
  unsigned char *p = image(h, strlen(h), strlen(h), 9, &len);
  float v[2] = {3.25f, -7.5f};
  memcpy(p + len - 8, v, 8);
  p[len - 9] = 1;
  RtStFile *f = NULL;
  ck_assert_msg(rt_st_parse(p, len, &f, err, sizeof err) == RT_ST_OK, "%s", err);
  float out[2];
  ck_assert_int_eq(rt_st_to_f32(rt_st_find(f, "f"), out, err, sizeof err), RT_ST_OK);
  ck_assert(out[0] == 3.25f && out[1] == -7.5f);
  rt_st_close(f);
  free(p);
}
END_TEST

/* ---- the writer's checks ---- */

START_TEST(test_writer_errors) {
  static const int64_t big[] = {(int64_t)1 << 40, (int64_t)1 << 40};
  static const int64_t neg[] = {2, -1};
  static const int64_t two[] = {2};
  static const float x[2] = {1, 2};
  struct {
    const char *name;
    int dt, rank;
    const int64_t *shape;
    const void *data;
    const char *want;
  } cases[] = {
      {NULL, RT_F32, 0, NULL, x, "name is NULL"},
      {"", RT_F32, 0, NULL, x, "name is empty"},
      {"a\x01z", RT_F32, 0, NULL, x, "control character"},
      {"tab\there", RT_F32, 0, NULL, x, "control character"},
      {"\xff\xfe", RT_F32, 0, NULL, x, "not valid UTF-8"},
      {"__metadata__", RT_F32, 0, NULL, x, "is reserved"},
      {"d", 99, 0, NULL, x, "invalid dtype"},
      {"d", -1, 0, NULL, x, "invalid dtype"},
      {"r", RT_F32, 9, big, x, "rank 9"},
      {"r", RT_F32, -1, NULL, x, "rank -1"},
      {"s", RT_F32, 1, NULL, x, "shape is NULL"},
      {"n", RT_F32, 2, neg, x, "dim 1 is negative"},
      {"o", RT_F32, 2, big, x, "shape product overflows"},
      {"p", RT_F32, 1, two, NULL, "data is NULL"},
  };
  char err[ERRLEN];
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    RtStWriter *w = rt_st_writer_new();
    ck_assert_str_eq(rt_st_writer_error(w), "");
    int rc = rt_st_writer_add(w, cases[c].name, (RtDType)cases[c].dt, cases[c].rank, cases[c].shape,
                              cases[c].data);
    ck_assert_int_ne(rc, RT_ST_OK);
    ck_assert_msg(strstr(rt_st_writer_error(w), cases[c].want), "case %zu: '%s' lacks '%s'", c,
                  rt_st_writer_error(w), cases[c].want);
    /* sticky: a later valid add succeeds, but serializing reports the first error */
    ck_assert_int_eq(rt_st_writer_add(w, "ok", RT_F32, 1, two, x), RT_ST_OK);
    void *mem = NULL;
    size_t len;
    ck_assert_int_ne(rt_st_writer_serialize(w, &mem, &len, err, sizeof err), RT_ST_OK);
    ck_assert_ptr_null(mem);
    ck_assert_str_eq(err, rt_st_writer_error(w));
    rt_st_writer_free(w);
  }

  RtStWriter *w = rt_st_writer_new();
  ck_assert_int_eq(rt_st_writer_add(w, "a", RT_F32, 1, two, x), RT_ST_OK);
  ck_assert_int_ne(rt_st_writer_add(w, "a", RT_F32, 1, two, x), RT_ST_OK);
  ck_assert_ptr_nonnull(strstr(rt_st_writer_error(w), "tensor 'a': duplicate name"));
  rt_st_writer_free(w);
  w = rt_st_writer_new();
  ck_assert_int_eq(rt_st_writer_meta(w, "k", "v"), RT_ST_OK);
  ck_assert_int_ne(rt_st_writer_meta(w, "k", "w"), RT_ST_OK);
  ck_assert_ptr_nonnull(strstr(rt_st_writer_error(w), "duplicate key"));
  rt_st_writer_free(w);
  w = rt_st_writer_new();
  ck_assert_int_ne(rt_st_writer_meta(w, "k", "\xc0\xaf"), RT_ST_OK);
  ck_assert_ptr_nonnull(strstr(rt_st_writer_error(w), "not valid UTF-8"));
  ck_assert_int_ne(rt_st_writer_meta(w, NULL, "v"), RT_ST_OK);
  rt_st_writer_free(w);
  ck_assert_int_ne(rt_st_writer_add(NULL, "a", RT_F32, 0, NULL, x), RT_ST_OK);
  rt_st_writer_free(NULL);
  rt_st_close(NULL);
}
END_TEST

START_TEST(test_writer_save_atomic) {
  char dir[1024], path[1100], err[ERRLEN];
  make_tmpdir(dir, sizeof dir);
  static const int64_t two[] = {2};
  static const float x[2] = {1, 2}, y[2] = {3, 4};

  /* the target's directory does not exist: a clean I/O error */
  RtStWriter *w = rt_st_writer_new();
  ck_assert_int_eq(rt_st_writer_add(w, "t", RT_F32, 1, two, x), RT_ST_OK);
  snprintf(path, sizeof path, "%s/missing/w.safetensors", dir);
  ck_assert_int_eq(rt_st_writer_save(w, path, err, sizeof err), RT_ST_EIO);
  ck_assert_ptr_nonnull(strstr(err, "cannot create a temporary file"));
  ck_assert_ptr_nonnull(strstr(err, path));

  /* save, then overwrite with different contents */
  snprintf(path, sizeof path, "%s/w.safetensors", dir);
  ck_assert_int_eq(rt_st_writer_save(w, path, err, sizeof err), RT_ST_OK);
  rt_st_writer_free(w);
  w = rt_st_writer_new();
  ck_assert_int_eq(rt_st_writer_add(w, "t", RT_F32, 1, two, y), RT_ST_OK);
  ck_assert_int_eq(rt_st_writer_save(w, path, err, sizeof err), RT_ST_OK);
  RtStFile *f = open_ok(path);
  float out[2];
  ck_assert_int_eq(rt_st_to_f32(rt_st_find(f, "t"), out, err, sizeof err), RT_ST_OK);
  ck_assert(out[0] == 3 && out[1] == 4);
  rt_st_close(f);

  /* the target is a directory: refused, no temporary file is left */
  snprintf(path, sizeof path, "%s/adir", dir);
  ck_assert_int_eq(mkdir(path, 0777), 0);
  ck_assert_int_eq(rt_st_writer_save(w, path, err, sizeof err), RT_ST_EIO);
  ck_assert_ptr_nonnull(strstr(err, "not replaced"));
  ck_assert_int_eq(count_entries(dir), 2); /* w.safetensors and adir: no .tmp left */
  rt_st_writer_free(w);

  /* open errors name the path */
  ck_assert_int_eq(rt_st_open(path, &f, err, sizeof err), RT_ST_EIO);
  ck_assert_ptr_nonnull(strstr(err, "not a regular file"));
  ck_assert_ptr_null(f);
  snprintf(path, sizeof path, "%s/nope.safetensors", dir);
  ck_assert_int_eq(rt_st_open(path, &f, err, sizeof err), RT_ST_EIO);
  ck_assert_ptr_nonnull(strstr(err, "nope.safetensors: cannot open"));
  snprintf(path, sizeof path, "%s/empty.safetensors", dir);
  FILE *fp = fopen(path, "wb");
  fclose(fp);
  ck_assert_int_eq(rt_st_open(path, &f, err, sizeof err), RT_ST_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "empty.safetensors: file is 0 bytes, shorter than"));
  rm_tmpdir(dir);
}
END_TEST

/* Targets that are not plain files: a symlink is written through (and stays a symlink), an
 * existing file keeps its mode, /dev/null is written in place, a FIFO nobody reads is refused
 * and one given to read is refused without blocking; temporary files that a dead writer of the
 * same target left are removed, a live one's kept (rt_fileio.c). */
START_TEST(test_writer_save_targets) {
  char dir[1024], path[1100], link[1100], other[1200], err[ERRLEN];
  make_tmpdir(dir, sizeof dir);
  static const int64_t two[] = {2};
  static const float x[2] = {1, 2};
  RtStWriter *w = rt_st_writer_new();
  ck_assert_int_eq(rt_st_writer_add(w, "t", RT_F32, 1, two, x), RT_ST_OK);
  snprintf(path, sizeof path, "%s/w.safetensors", dir);
  snprintf(link, sizeof link, "%s/link.safetensors", dir);
  ck_assert_int_eq(rt_st_writer_save(w, path, err, sizeof err), RT_ST_OK);
  ck_assert_int_eq(chmod(path, 0640), 0);
  ck_assert_int_eq(symlink("w.safetensors", link), 0);
  ck_assert_int_eq(rt_st_writer_save(w, link, err, sizeof err), RT_ST_OK);
  struct stat st;
  ck_assert_int_eq(lstat(link, &st), 0);
  ck_assert(S_ISLNK(st.st_mode));
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_int_eq(st.st_mode & 07777, 0640);
  RtStFile *f = open_ok(path);
  rt_st_close(f);
  /* a dead writer's temporary file goes, a live one's stays */
  pid_t child = fork();
  if (child == 0) _exit(0);
  ck_assert_int_gt(child, 0);
  waitpid(child, NULL, 0);
  snprintf(other, sizeof other, "%s/.w.safetensors.xtc-tmp.%ld.00000001", dir, (long)child);
  FILE *fp = fopen(other, "wb");
  ck_assert_ptr_nonnull(fp);
  fclose(fp);
  char live[1200];
  snprintf(live, sizeof live, "%s/.w.safetensors.xtc-tmp.%ld.00000001", dir, (long)getppid());
  fp = fopen(live, "wb");
  ck_assert_ptr_nonnull(fp);
  fclose(fp);
  ck_assert_int_eq(rt_st_writer_save(w, path, err, sizeof err), RT_ST_OK);
  ck_assert_int_ne(access(other, F_OK), 0);
  ck_assert_int_eq(access(live, F_OK), 0);
  unlink(live);
  /* FIFOs: refused to read and, with no reader, to write; neither blocks */
  snprintf(other, sizeof other, "%s/fifo", dir);
  ck_assert_int_eq(mkfifo(other, 0600), 0);
  ck_assert_int_eq(rt_st_open(other, &f, err, sizeof err), RT_ST_EIO);
  ck_assert_ptr_nonnull(strstr(err, "not a regular file"));
  ck_assert_int_eq(rt_st_writer_save(w, other, err, sizeof err), RT_ST_EIO);
  ck_assert_ptr_nonnull(strstr(err, "a FIFO that nobody reads"));
  unlink(other);
  /* a private null device where one can be made (as root a regression would otherwise replace
   * the machine's /dev/null), else /dev/null itself, which a user cannot replace */
  snprintf(other, sizeof other, "%s/null", dir);
  const char *dev = mknod(other, S_IFCHR | 0666, makedev(1, 3)) == 0 ? other : "/dev/null";
  if (access(dev, W_OK) == 0) {
    ck_assert_int_eq(rt_st_writer_save(w, dev, err, sizeof err), RT_ST_OK);
    ck_assert_int_eq(stat(dev, &st), 0);
    ck_assert(S_ISCHR(st.st_mode));
  } else {
    fprintf(stderr, "test_writer_save_targets: %s is not writable here, its case skipped\n", dev);
  }
  unlink(other);
  rt_st_writer_free(w);
  rm_tmpdir(dir);
}
END_TEST

static Suite *safetensors_suite(void) {
  Suite *s = suite_create("safetensors");
  TCase *tc = tcase_create("api");
  tcase_add_test(tc, test_dtype_table);
  tcase_add_test(tc, test_json_parser);
  tcase_add_test(tc, test_parity_every_file_loads);
  tcase_add_test(tc, test_parity_known_values);
  tcase_add_test(tc, test_roundtrip_every_dtype);
  tcase_add_test(tc, test_roundtrip_metadata_and_names);
  tcase_add_test(tc, test_to_f32);
  tcase_add_test(tc, test_to_i64);
  tcase_add_test(tc, test_unaligned_tensor);
  tcase_add_test(tc, test_writer_errors);
  tcase_add_test(tc, test_writer_save_atomic);
  tcase_add_test(tc, test_writer_save_targets);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return harness_run(safetensors_suite(), NULL); }
