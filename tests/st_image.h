/* st_image.h: what the safetensors suites (test_safetensors, test_safetensors_hostile) share:
 * a file image built from a header text, parsing one, and the self-consistency check of a file
 * that loaded. */
#ifndef XTC_TEST_ST_IMAGE_H
#define XTC_TEST_ST_IMAGE_H

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

#define ERRLEN 512


/* A file image: 8-byte length `claimed`, the header text, then data_len bytes of 0x00. */
static inline unsigned char *image(const char *header, size_t hlen, uint64_t claimed, size_t data_len, size_t *len) {
  *len = 8 + hlen + data_len;
  unsigned char *p = calloc(1, *len ? *len : 1);
  ck_assert_ptr_nonnull(p);
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(claimed >> (8 * i));
  memcpy(p + 8, header, hlen);
  return p;
}

/* Parses header + data; returns the status and leaves the message in err. */
static inline int parse_header(const char *header, size_t data_len, char *err) {
  size_t len;
  unsigned char *p = image(header, strlen(header), strlen(header), data_len, &len);
  RtStFile *f = NULL;
  int rc = rt_st_parse(p, len, &f, err, ERRLEN);
  rt_st_close(f);
  free(p);
  return rc;
}

/* Checks that a loaded file is self-consistent, reading every byte of every tensor. */
static inline void check_consistent(const RtStFile *f) {
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

#endif
