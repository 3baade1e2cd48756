/* test_safetensors.c: the safetensors reader and writer (runtime/safetensors.c, runtime/json.c).
 *
 * Covers: every parity file loads, with known names, shapes and values; write-then-read round
 * trips for every dtype, scalars and zero-size tensors, metadata and unusual names; conversions to
 * float32 / int64; the writer's own checks and atomic save; a corpus of hostile files built here in
 * C, each with the error text it must produce; truncation at every byte; and seeded random
 * mutations of a valid header (these must fail cleanly or load a self-consistent file).
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

#define ERRLEN 512
#define PARITY XTC_SHARED_DIR "/parity"

/* ---- helpers ---- */

/* A file image: 8-byte length `claimed`, the header text, then data_len bytes of 0x00. */
static unsigned char *image(const char *header, size_t hlen, uint64_t claimed, size_t data_len, size_t *len) {
  *len = 8 + hlen + data_len;
  unsigned char *p = calloc(1, *len ? *len : 1);
  ck_assert_ptr_nonnull(p);
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(claimed >> (8 * i));
  memcpy(p + 8, header, hlen);
  return p;
}

/* Parses header + data; returns the status and leaves the message in err. */
static int parse_header(const char *header, size_t data_len, char *err) {
  size_t len;
  unsigned char *p = image(header, strlen(header), strlen(header), data_len, &len);
  RtStFile *f = NULL;
  int rc = rt_st_parse(p, len, &f, err, ERRLEN);
  rt_st_close(f);
  free(p);
  return rc;
}

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

/* Checks that a loaded file is self-consistent, reading every byte of every tensor. */
static void check_consistent(const RtStFile *f) {
  char err[ERRLEN];
  for (int i = 0; i < rt_st_count(f); i++) {
    const RtStTensor *t = rt_st_get(f, i);
    ck_assert_ptr_nonnull(t);
    ck_assert(t->name && t->name[0]);
    ck_assert_ptr_eq(rt_st_find(f, t->name), t);
    ck_assert(t->rank >= 0 && t->rank <= RT_ST_MAX_RANK);
    int64_t n = rt_st_numel(t);
    ck_assert(n >= 0);
    ck_assert_uint_eq(t->nbytes, (size_t)n * rt_dtype_size(t->dtype));
    void *buf = malloc((size_t)n * 8 + 8);
    ck_assert_ptr_nonnull(buf);
    int is_float = t->dtype == RT_F32 || t->dtype == RT_F64 || t->dtype == RT_F16 || t->dtype == RT_BF16;
    int rc = is_float ? rt_st_to_f32(t, buf, err, sizeof err) : rt_st_to_i64(t, buf, err, sizeof err);
    /* only bytes that are no BOOL (2..255) or an F64 beyond float range may be refused */
    ck_assert_msg(rc == RT_ST_OK || (rc == RT_ST_EINVAL && (t->dtype == RT_BOOL || t->dtype == RT_F64)), "%s",
                  err);
    ck_assert_int_ne(is_float ? rt_st_to_i64(t, buf, err, sizeof err) : rt_st_to_f32(t, buf, err, sizeof err),
                     RT_ST_OK);
    free(buf);
  }
  ck_assert_ptr_null(rt_st_get(f, -1));
  ck_assert_ptr_null(rt_st_get(f, rt_st_count(f)));
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

/* ---- hostile files ---- */

#define T_OK "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"
#define ENTRY(body) "{\"t\":{" body "}}"
#define F32_2(offsets) ENTRY("\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":" offsets)
#define SHAPE(s) ENTRY("\"dtype\":\"F32\",\"shape\":" s ",\"data_offsets\":[0,8]")

static const struct {
  const char *what, *header;
  size_t data_len;
  const char *want;
} bad_headers[] = {
    /* header text */
    {"empty header", "", 8, "unexpected end of input"},
    {"only spaces", "        ", 8, "unexpected end of input"},
    {"invalid UTF-8 byte", "{\"t\xff\":1}", 0, "not valid UTF-8 (header byte 3)"},
    {"overlong UTF-8", "{\"\xc0\xaf\":1}", 0, "not valid UTF-8"},
    {"UTF-8 surrogate", "{\"\xed\xa0\x80\":1}", 0, "not valid UTF-8"},
    {"UTF-8 above U+10FFFF", "{\"\xf4\x90\x80\x80\":1}", 0, "not valid UTF-8"},
    {"cut UTF-8 sequence", "{\"a\":\"\xe2\x82", 0, "not valid UTF-8"},
    {"byte-order mark", "\xef\xbb\xbf{}", 0, "unexpected byte 0xef"},
    {"bare word", "{abc}", 0, "expected a string key"},
    {"single quotes", "{'t':1}", 0, "expected a string key"},
    {"comment", "{/* c */}", 0, "expected a string key"},
    {"trailing comma in object", "{\"__metadata__\":{},}", 0, "expected a string key"},
    {"trailing comma in array", SHAPE("[2,]"), 8, "unexpected character ']'"},
    {"missing colon", "{\"t\" 1}", 0, "expected ':' after a key"},
    {"missing comma", "{\"a\":{} \"b\":{}}", 0, "expected ',' or '}'"},
    {"unclosed object", "{\"t\":{}", 0, "expected ',' or '}'"},
    {"unclosed array", SHAPE("[2"), 8, "expected ',' or ']'"},
    {"data after the value", "{}x", 0, "unexpected data after the JSON value"},
    {"two values", "{} {}", 0, "unexpected data after the JSON value"},
    {"unterminated string", "{\"t", 0, "unterminated string"},
    {"raw newline in string", "{\"a\nb\":1}", 0, "control character 0x0a"},
    {"bad escape", "{\"a\\x\":1}", 0, "invalid escape '\\x'"},
    {"short \\u escape", "{\"a\\u12\":1}", 0, "invalid \\u escape"},
    {"lone high surrogate", "{\"\\ud800\":1}", 0, "unpaired surrogate \\ud800"},
    {"lone low surrogate", "{\"\\udc00x\":1}", 0, "unpaired surrogate \\udc00"},
    {"high + non-low", "{\"\\ud800\\u0041\":1}", 0, "unpaired surrogate"},
    {"leading zero", SHAPE("[02]"), 8, "leading zero"},
    {"plus sign", SHAPE("[+2]"), 8, "unexpected character '+'"},
    {"NaN", SHAPE("[NaN]"), 8, "unexpected character 'N'"},
    {"bare minus", SHAPE("[-]"), 8, "invalid number"},
    {"dot without digits", SHAPE("[2.]"), 8, "digit expected after '.'"},
    {"exponent without digits", SHAPE("[2e]"), 8, "digit expected in exponent"},
    {"truncated literal", "{\"__metadata__\":nul}", 0, "invalid literal"},
    {"header is an array", "[]", 0, "header is not a JSON object"},
    {"header is a string", "\"t\"", 0, "header is not a JSON object"},
    {"header is null", "null", 0, "header is not a JSON object"},
    /* entries */
    {"entry is a number", "{\"t\":1}", 0, "tensor 't': entry is not a JSON object"},
    {"entry is an array", "{\"t\":[]}", 0, "tensor 't': entry is not a JSON object"},
    {"missing dtype", ENTRY("\"shape\":[2],\"data_offsets\":[0,8]"), 8, "tensor 't': missing \"dtype\""},
    {"missing shape", ENTRY("\"dtype\":\"F32\",\"data_offsets\":[0,8]"), 8, "tensor 't': missing \"shape\""},
    {"missing data_offsets", ENTRY("\"dtype\":\"F32\",\"shape\":[2]"), 8, "missing \"data_offsets\""},
    {"unexpected key", ENTRY("\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"foo\":1"), 8,
     "tensor 't': unexpected key 'foo'"},
    {"duplicate key in entry",
     ENTRY("\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]"), 8,
     "duplicate key \"dtype\""},
    {"dtype is a number", ENTRY("\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]"), 8,
     "dtype is not a string"},
    {"unknown dtype", ENTRY("\"dtype\":\"F8\",\"shape\":[2],\"data_offsets\":[0,8]"), 8,
     "unknown dtype \"F8\""},
    {"lowercase dtype", ENTRY("\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]"), 8,
     "unknown dtype \"f32\""},
    {"dtype with NUL", ENTRY("\"dtype\":\"F32\\u0000\",\"shape\":[2],\"data_offsets\":[0,8]"), 8,
     "unknown dtype"},
    /* shapes */
    {"shape is a number", SHAPE("2"), 8, "shape is not an array"},
    {"shape is an object", SHAPE("{}"), 8, "shape is not an array"},
    {"negative dim", SHAPE("[-2]"), 8, "shape dim 0 is negative (-2)"},
    {"fractional dim", SHAPE("[2.0]"), 8, "shape dim 0 is not an integer"},
    {"exponent dim", SHAPE("[2e0]"), 8, "shape dim 0 is not an integer"},
    {"string dim", SHAPE("[2,\"1\"]"), 8, "shape dim 1 is not an integer"},
    {"null dim", SHAPE("[null]"), 8, "shape dim 0 is not an integer"},
    {"dim beyond int64", SHAPE("[99999999999999999999]"), 8,
     "shape dim 0 (99999999999999999999) is too large"},
    {"rank 9", SHAPE("[1,1,1,1,1,1,1,1,2]"), 8, "rank 9 exceeds the maximum of 8"},
    {"shape product overflow", SHAPE("[4294967296,4294967296]"), 8, "shape product overflows"},
    {"overflow beside a zero dim", SHAPE("[0,4294967296,4294967296]"), 8, "shape product overflows"},
    {"byte size overflow", SHAPE("[2305843009213693952]"), 8, "byte size overflows"},
    {"byte size beyond SIZE_MAX", SHAPE("[9223372036854775807]"), 8, "byte size overflows"},
    /* data_offsets */
    {"offsets not an array", F32_2("8"), 8, "data_offsets is not [begin, end]"},
    {"one offset", F32_2("[8]"), 8, "data_offsets is not [begin, end]"},
    {"three offsets", F32_2("[0,8,8]"), 8, "data_offsets is not [begin, end]"},
    {"begin after end", F32_2("[8,0]"), 8, "data_offsets begin 8 > end 0"},
    {"end beyond data", F32_2("[8,16]"), 8, "data_offsets end 16 is beyond the data section (8 bytes)"},
    {"negative begin", F32_2("[-8,0]"), 8, "data_offsets begin is negative (-8)"},
    {"fractional end", F32_2("[0,8.0]"), 8, "data_offsets end is not an integer"},
    {"string offset", F32_2("[\"0\",8]"), 8, "data_offsets begin is not an integer"},
    {"offset beyond int64", F32_2("[0,18446744073709551616]"), 8,
     "data_offsets end (18446744073709551616) is too large"},
    {"huge end", F32_2("[0,9223372036854775807]"), 8, "beyond the data section"},
    {"size mismatch", ENTRY("\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]"), 12,
     "tensor 't': data_offsets span 8 bytes but F32 [3] needs 12"},
    {"scalar with no bytes", ENTRY("\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,0]"), 8,
     "but I64 [] needs 8"},
    {"overlap",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     12, "tensors 'a' [0, 8) and 'b' [4, 12) overlap"},
    {"same range twice",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
     4, "overlap"},
    {"range inside another",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[3,5]}}",
     8, "overlap"},
    /* names */
    {"duplicate tensor names",
     "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     8, "duplicate key \"t\""},
    {"duplicate via escape",
     "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"\\u0074\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     8, "duplicate key \"t\""},
    {"empty name", "{\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "tensor name is empty"},
    {"control char in name", "{\"a\\u0001b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "tensor 'a\\x01b': tensor name contains a control character"},
    {"NUL in name", "{\"a\\u0000\":{}}", 0, "contains a control character"},
    {"DEL in name", "{\"\x7f\":{}}", 0, "contains a control character"},
    {"long name is cut in messages",
     "{\""
     "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789"
     "\":1}",
     0,
     "tensor '01234567890123456789012345678901234567890123456789012345678901234567890123456789...': entry"},
    /* metadata */
    {"metadata is a string", "{\"__metadata__\":\"x\"}", 0, "__metadata__ is not an object"},
    {"metadata is an array", "{\"__metadata__\":[]}", 0, "__metadata__ is not an object"},
    {"metadata value is a number", "{\"__metadata__\":{\"k\":1}}", 0,
     "__metadata__ value of 'k' is not a string"},
    {"metadata value is an object", "{\"__metadata__\":{\"k\":{}}}", 0, "value of 'k' is not a string"},
    {"metadata value is null", "{\"__metadata__\":{\"k\":null}}", 0, "value of 'k' is not a string"},
    {"metadata holding a tensor entry", "{\"__metadata__\":{\"dtype\":\"F32\",\"shape\":[2]}}", 0,
     "value of 'shape' is not a string"},
    {"NUL in metadata value", "{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0, "entry 'k' contains a NUL"},
    {"NUL in metadata key", "{\"__metadata__\":{\"\\u0000\":\"v\"}}", 0, "contains a NUL"},
    {"duplicate metadata key", "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "duplicate key \"k\""},
    {"duplicate __metadata__", "{\"__metadata__\":{},\"__metadata__\":{}}", 0,
     "duplicate key \"__metadata__\""},
};

START_TEST(test_hostile_headers) {
  char err[ERRLEN];
  int i = _i;
  int rc = parse_header(bad_headers[i].header, bad_headers[i].data_len, err);
  ck_assert_msg(rc == RT_ST_EFORMAT, "%s: status %d (%s)", bad_headers[i].what, rc, err);
  ck_assert_msg(strstr(err, bad_headers[i].want) != NULL, "%s: got \"%s\", want \"%s\"", bad_headers[i].what,
                err, bad_headers[i].want);
  ck_assert_msg(strncmp(err, "safetensors: ", 13) == 0, "%s: %s", bad_headers[i].what, err);
}
END_TEST

/* The length field and the file size. */
START_TEST(test_hostile_lengths) {
  char err[ERRLEN];
  unsigned char small[8] = {2, 0, 0, 0, 0, 0, 0, 0};
  RtStFile *f = (RtStFile *)1;
  for (size_t n = 0; n < 8; n++) {
    ck_assert_int_eq(rt_st_parse(small, n, &f, err, sizeof err), RT_ST_EFORMAT);
    ck_assert_ptr_null(f);
    ck_assert_ptr_nonnull(strstr(err, "shorter than the 8-byte header length"));
  }
  ck_assert_int_eq(rt_st_parse(NULL, 0, &f, err, sizeof err), RT_ST_EFORMAT);
  static const struct {
    uint64_t claimed;
    const char *want;
  } cases[] = {
      {1000, "header length 1000 runs beyond the end of the file (10 bytes)"},
      {3, "header length 3 runs beyond the end of the file"},
      {(uint64_t)100 << 20, "runs beyond the end of the file"}, /* at the limit: just too long */
      {((uint64_t)100 << 20) + 1, "is absurd (limit 104857600 bytes)"},
      {(uint64_t)1 << 40, "is absurd"},
      {UINT64_MAX, "header length 18446744073709551615 is absurd"},
      {0, "header is not valid JSON: header byte 0: unexpected end of input"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    size_t len;
    unsigned char *p = image("{}", 2, cases[c].claimed, 0, &len);
    ck_assert_int_eq(rt_st_parse(p, len, &f, err, sizeof err), RT_ST_EFORMAT);
    ck_assert_msg(strstr(err, cases[c].want), "claimed %llu: %s", (unsigned long long)cases[c].claimed, err);
    free(p);
  }
  ck_assert_int_eq(rt_st_parse(small, 8, NULL, err, sizeof err), RT_ST_EINVAL);
  ck_assert_int_eq(rt_st_parse(NULL, 8, &f, err, sizeof err), RT_ST_EINVAL);
  ck_assert_int_eq(rt_st_parse(small, 7, &f, NULL, 0), RT_ST_EFORMAT); /* no message buffer is fine */
}
END_TEST

START_TEST(test_hostile_nesting) {
  char err[ERRLEN];
  for (int deep = 0; deep < 3; deep++) {
    size_t n = deep == 0 ? 65 : deep == 1 ? 100000 : 1000000;
    char *h = malloc(2 * n + 16);
    size_t k = 0;
    if (deep == 1) k += (size_t)sprintf(h, "{\"t\":");
    memset(h + k, '[', n);
    k += n;
    if (deep == 0) {
      memset(h + k, ']', n);
      k += n;
    }
    h[k] = 0;
    ck_assert_int_eq(parse_header(h, 0, err), RT_ST_EFORMAT);
    ck_assert_msg(strstr(err, "nesting depth exceeds 64"), "%s", err);
    free(h);
  }
  /* the deepest nesting allowed (64 levels) parses, and then fails as a shape */
  char h[256] = "{\"t\":{\"dtype\":\"F32\",\"shape\":";
  size_t k = strlen(h);
  memset(h + k, '[', 62);
  memset(h + k + 62, ']', 62);
  strcpy(h + k + 124, ",\"data_offsets\":[0,0]}}");
  ck_assert_int_eq(parse_header(h, 0, err), RT_ST_EFORMAT);
  ck_assert_msg(strstr(err, "shape dim 0 is not an integer"), "%s", err);
}
END_TEST

/* Files that are unusual but valid, with the choices the reader makes about them. */
START_TEST(test_lenient_but_valid) {
  char err[ERRLEN];
  static const struct {
    const char *header;
    size_t data_len;
    int count;
  } cases[] = {
      {"{}", 0, 0},
      {"{}      ", 0, 0},                /* space padding, as writers align the header */
      {" \t\r\n{\n}\n ", 0, 0},          /* any JSON whitespace */
      {"{\"__metadata__\":null}", 0, 0}, /* as the Rust reader */
      {"{\"__metadata__\":{}}", 5, 0},   /* unclaimed bytes are allowed */
      {T_OK, 32, 1},                     /* trailing bytes after the last tensor */
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
       12, 2}, /* a gap, and out of order */
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
       "\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]}}",
       8, 2}, /* empty range inside another */
      {"{\"data_offsets\":{\"data_offsets\":[0,8],\"shape\":[2],\"dtype\":\"F32\"}}", 8,
       1}, /* key order free */
      {"{\"\\u00e9\\ud83d\\ude00\\/\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, 1},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[-0],\"data_offsets\":[0,0]}}", 0, 1}, /* -0 is 0 */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    size_t len;
    unsigned char *p =
        image(cases[c].header, strlen(cases[c].header), strlen(cases[c].header), cases[c].data_len, &len);
    RtStFile *f = NULL;
    ck_assert_msg(rt_st_parse(p, len, &f, err, sizeof err) == RT_ST_OK, "case %zu: %s", c, err);
    ck_assert_int_eq(rt_st_count(f), cases[c].count);
    check_consistent(f);
    if (c == 9) ck_assert_ptr_nonnull(rt_st_find(f, "é😀/"));
    rt_st_close(f);
    free(p);
  }
}
END_TEST

/* ---- truncation and random mutation of a valid file ---- */

static void *valid_file(size_t *len) {
  char err[ERRLEN];
  static const float m[6] = {1, 2, 3, 4, 5, 6};
  static const int64_t s = 42;
  static const uint8_t b[4] = {1, 0, 1, 1};
  RtStWriter *w = rt_st_writer_new();
  ck_assert_int_eq(rt_st_writer_meta(w, "config", "{\"dim\": 32}"), RT_ST_OK);
  ck_assert_int_eq(rt_st_writer_add(w, "layers.0.w", RT_F32, 2, (int64_t[]){2, 3}, m), RT_ST_OK);
  ck_assert_int_eq(rt_st_writer_add(w, "step", RT_I64, 0, NULL, &s), RT_ST_OK);
  ck_assert_int_eq(rt_st_writer_add(w, "mask", RT_BOOL, 1, (int64_t[]){4}, b), RT_ST_OK);
  ck_assert_int_eq(rt_st_writer_add(w, "none", RT_F16, 2, (int64_t[]){0, 3}, NULL), RT_ST_OK);
  void *mem;
  ck_assert_int_eq(rt_st_writer_serialize(w, &mem, len, err, sizeof err), RT_ST_OK);
  rt_st_writer_free(w);
  return mem;
}

START_TEST(test_truncated_at_every_byte) {
  char err[ERRLEN];
  size_t len;
  unsigned char *full = valid_file(&len);
  RtStFile *f = NULL;
  ck_assert_int_eq(rt_st_parse(full, len, &f, err, sizeof err), RT_ST_OK);
  ck_assert_int_eq(rt_st_count(f), 4);
  rt_st_close(f);
  for (size_t n = 0; n < len; n++) {
    unsigned char *cut = malloc(n ? n : 1); /* exactly n bytes, so valgrind sees any overread */
    memcpy(cut, full, n);
    int rc = rt_st_parse(cut, n, &f, err, sizeof err);
    ck_assert_msg(rc == RT_ST_EFORMAT, "prefix of %zu bytes: status %d", n, rc);
    ck_assert_ptr_null(f);
    ck_assert(err[0]);
    free(cut);
  }
  free(full);
}
END_TEST

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

START_TEST(test_random_header_flips) {
  char err[ERRLEN];
  size_t len;
  unsigned char *full = valid_file(&len);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | full[i];
  uint64_t seed = 0x5eed5afe7e45ull;
  int ok = 0, bad = 0;
  unsigned char *p = malloc(len);
  for (int it = 0; it < 4000; it++) {
    memcpy(p, full, len);
    int flips = 1 + (int)(rng_next(&seed) % 4);
    for (int k = 0; k < flips; k++) {
      uint64_t r = rng_next(&seed);
      /* mostly the JSON text, sometimes the length field */
      size_t at = r % 16 == 0 ? (size_t)(r >> 8) % 8 : 8 + (size_t)((r >> 8) % hlen);
      p[at] = (r >> 40) % 2 ? (unsigned char)(r >> 48) : (unsigned char)(p[at] ^ (1u << ((r >> 48) % 8)));
    }
    RtStFile *f = NULL;
    int rc = rt_st_parse(p, len, &f, err, sizeof err);
    if (rc == RT_ST_OK) {
      check_consistent(f);
      ok++;
    } else {
      ck_assert_msg(rc == RT_ST_EFORMAT, "iteration %d: status %d: %s", it, rc, err);
      ck_assert_ptr_null(f);
      ck_assert(err[0]);
      bad++;
    }
    rt_st_close(f);
  }
  free(p);
  free(full);
  ck_assert_int_gt(bad, 3000);
  ck_assert_int_gt(ok, 0);
}
END_TEST

/* Random headers shaped like safetensors headers (entries with random subsets of the keys and
 * near-miss values) reach the validation paths that bit flips rarely do. */
typedef struct {
  char *p;
  size_t len, cap;
  uint64_t seed;
} Gen;

static void put(Gen *g, const char *s) {
  size_t n = strlen(s);
  if (g->len + n < g->cap) memcpy(g->p + g->len, s, n), g->len += n;
}

static const char *pick(Gen *g, const char *const *v, size_t n) { return v[rng_next(&g->seed) % n]; }
#define PICK(g, ...)                                                                                         \
  pick(g, (const char *const[]){__VA_ARGS__}, sizeof((const char *const[]){__VA_ARGS__}) / sizeof(char *))

static void gen_value(Gen *g, int depth) {
  int kind = (int)(rng_next(&g->seed) % (depth > 3 ? 3 : 5));
  if (kind == 0)
    put(g, PICK(g, "0", "1", "8", "-1", "1.5", "1e2", "99999999999999999999"));
  else if (kind == 1)
    put(g, PICK(g, "\"F32\"", "\"x\"", "\"\"", "\"\\u00e9\"", "\"\\u0000\""));
  else if (kind == 2)
    put(g, PICK(g, "null", "true", "false"));
  else {
    int n = (int)(rng_next(&g->seed) % 4);
    put(g, kind == 3 ? "[" : "{");
    for (int i = 0; i < n; i++) {
      if (i) put(g, ",");
      if (kind == 4) put(g, PICK(g, "\"k\":", "\"dtype\":", "\"j\":"));
      gen_value(g, depth + 1);
    }
    put(g, kind == 3 ? "]" : "}");
  }
}

static void gen_entry(Gen *g) {
  int first = 1;
  put(g, "{");
  for (int key = 0; key < 3; key++) {
    if (rng_next(&g->seed) % 10 == 0) continue;
    if (!first) put(g, ",");
    first = 0;
    if (key == 0) {
      put(g, "\"dtype\":");
      if (rng_next(&g->seed) % 8)
        put(g, PICK(g, "\"F32\"", "\"BOOL\"", "\"I64\"", "\"U8\"", "\"F64\"", "\"F16\"", "\"F8\""));
      else
        gen_value(g, 2);
    } else if (key == 1) {
      put(g, "\"shape\":[");
      int n = (int)(rng_next(&g->seed) % 4);
      for (int i = 0; i < n; i++) {
        if (i) put(g, ",");
        put(g, PICK(g, "0", "1", "2", "3", "2", "1", "-1", "1.5", "4294967296"));
      }
      put(g, "]");
    } else {
      put(g, "\"data_offsets\":");
      if (rng_next(&g->seed) % 8 == 0) {
        gen_value(g, 2);
      } else {
        put(g, "[");
        put(g, PICK(g, "0", "0", "4", "8", "12", "-1"));
        put(g, ",");
        put(g, PICK(g, "0", "2", "4", "8", "12", "16", "24"));
        put(g, "]");
      }
    }
  }
  put(g, "}");
}

START_TEST(test_random_structured_headers) {
  char err[ERRLEN], text[4096];
  Gen g = {text, 0, sizeof text, 12345};
  int ok = 0, bad = 0;
  for (int it = 0; it < 4000; it++) {
    g.len = 0;
    put(&g, "{");
    int n = (int)(rng_next(&g.seed) % 4);
    for (int i = 0; i < n; i++) {
      if (i) put(&g, ",");
      put(&g, PICK(&g, "\"a\":", "\"b\":", "\"c\":", "\"a\":", "\"__metadata__\":", "\"\":", "\"\\u0001\":"));
      if (rng_next(&g.seed) % 5)
        gen_entry(&g);
      else
        gen_value(&g, 1);
    }
    put(&g, "}");
    size_t len;
    unsigned char *p = image(text, g.len, g.len, rng_next(&g.seed) % 25, &len);
    RtStFile *f = NULL;
    int rc = rt_st_parse(p, len, &f, err, sizeof err);
    ck_assert_msg(rc == RT_ST_OK || rc == RT_ST_EFORMAT, "status %d for %.*s", rc, (int)g.len, text);
    if (rc == RT_ST_OK) {
      check_consistent(f);
      ok++;
    } else {
      ck_assert(err[0]);
      bad++;
    }
    rt_st_close(f);
    free(p);
  }
  ck_assert_int_gt(ok, 100);
  ck_assert_int_gt(bad, 100);
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
  TCase *hostile = tcase_create("hostile");
  tcase_set_timeout(hostile, 600);
  tcase_add_loop_test(hostile, test_hostile_headers, 0, (int)(sizeof bad_headers / sizeof bad_headers[0]));
  tcase_add_test(hostile, test_hostile_lengths);
  tcase_add_test(hostile, test_hostile_nesting);
  tcase_add_test(hostile, test_lenient_but_valid);
  tcase_add_test(hostile, test_truncated_at_every_byte);
  tcase_add_test(hostile, test_random_header_flips);
  tcase_add_test(hostile, test_random_structured_headers);
  suite_add_tcase(s, hostile);
  return s;
}

int main(void) { return harness_run(safetensors_suite(), NULL); }
