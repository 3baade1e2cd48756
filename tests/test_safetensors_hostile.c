/* test_safetensors_hostile.c: the safetensors reader (runtime/safetensors.c, runtime/json.c) on
 * files built to break it: a corpus of hostile headers built here in C, each with the error text
 * it must produce, lengths and nesting past the limits, lenient but valid forms, truncation at
 * every byte, and seeded random mutations of a valid header (these must fail cleanly or load a
 * self-consistent file). The API on valid files is test_safetensors'. */
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
#include "st_image.h"

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

static Suite *safetensors_hostile_suite(void) {
  Suite *s = suite_create("safetensors_hostile");
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

int main(void) { return harness_run(safetensors_hostile_suite(), NULL); }
