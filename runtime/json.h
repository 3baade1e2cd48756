/* json.h: a small, strict JSON (RFC 8259) parser for untrusted text such as safetensors headers.
 *
 * Strict: UTF-8 is validated (no overlong forms, no encoded surrogates), escapes are checked,
 * unpaired \u surrogates are refused, control characters inside strings must be escaped, numbers
 * follow the RFC grammar, duplicate keys in an object are an error, and nothing but whitespace may
 * follow the top-level value. Robust: nesting depth and the number of values are capped, every
 * length is checked, and all memory lives in one arena that json_free() releases at once.
 *
 * Numbers are kept as text; integers (no fraction, no exponent) are also decoded exactly into
 * `ival` when they fit int64_t. There is no float decoding (strtod depends on the C locale); a
 * caller that needs a double can convert `str` itself.
 */
#ifndef XTC_RT_JSON_H
#define XTC_RT_JSON_H

#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 64                /* nested arrays/objects */
#define JSON_MAX_INPUT ((size_t)1 << 30) /* bytes of text */

typedef enum { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonKind;

/* For numbers: whether `ival` holds the exact value. */
typedef enum {
  JSON_INT_OK,    /* an integer that fits int64_t; ival is exact */
  JSON_INT_RANGE, /* an integer outside int64_t */
  JSON_NOT_INT,   /* has a fraction or an exponent (1.0 and 1e2 included) */
} JsonIntClass;

typedef struct JsonValue JsonValue;
typedef struct JsonMember JsonMember;

struct JsonValue {
  JsonKind kind;
  JsonIntClass int_class; /* numbers only */
  size_t len;             /* string: bytes (may hold NUL from \u0000); number: text length;
                             array/object: element count */
  int64_t ival;           /* numbers with int_class == JSON_INT_OK */
  union {
    const char *str;           /* string (decoded UTF-8) or number text; NUL-terminated */
    const JsonValue *items;    /* array */
    const JsonMember *members; /* object, in document order */
  } u;
};

struct JsonMember {
  const char *key; /* decoded UTF-8, NUL-terminated */
  size_t key_len;
  JsonValue value;
};

typedef struct JsonDoc JsonDoc;

/* Parses `len` bytes of `text` (need not be NUL-terminated). `max_values` caps the number of
 * values (0 = no cap beyond what the text length implies). On success *out owns the tree; on error
 * returns nonzero and writes "byte N: reason" into err. */
int json_parse(const char *text, size_t len, size_t max_values, JsonDoc **out, char *err, size_t errlen);
const JsonValue *json_root(const JsonDoc *doc);
void json_free(JsonDoc *doc);

/* The member `key` of an object, or NULL (linear search; objects in headers are small). */
const JsonValue *json_object_get(const JsonValue *obj, const char *key);

/* Whether s[0..len) is valid UTF-8 (RFC 3629). On failure *bad (if non-NULL) is the offset of the
 * first bad byte. */
int json_utf8_valid(const char *s, size_t len, size_t *bad);

#endif
