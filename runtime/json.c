/* json.c: the strict JSON parser of json.h.
 *
 * A recursive-descent parser whose recursion is bounded by JSON_MAX_DEPTH. Children of an array or
 * object are collected on a scratch stack while they are parsed and copied into the arena, as one
 * contiguous block, when the container closes; so the tree costs one arena and nothing to free node
 * by node, and an error at any point frees everything with json_free().
 */
#include "json.h"
#include "rt_alloc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena: bump allocation from a list of chunks ---- */

typedef struct Chunk {
  struct Chunk *next;
  size_t size, used;
  _Alignas(16) unsigned char data[];
} Chunk;

struct JsonDoc {
  Chunk *chunks;
  JsonValue root;
};

static void *arena_alloc(JsonDoc *doc, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (n == 0) n = 16;
  Chunk *c = doc->chunks;
  if (!c || c->size - c->used < n) {
    size_t size = n > 65536 ? n : 65536;
    if (size > SIZE_MAX - sizeof(Chunk)) return NULL;
    c = rt_malloc(sizeof(Chunk) + size);
    if (!c) return NULL;
    c->size = size;
    c->used = 0;
    c->next = doc->chunks;
    doc->chunks = c;
  }
  void *p = c->data + c->used;
  c->used += n;
  return p;
}

/* ---- scratch stacks (values of open arrays, members of open objects) ---- */

typedef struct {
  void *data;
  size_t len, cap, elem;
} Stack;

static void *stack_push(Stack *s) {
  if (s->len == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    if (cap > SIZE_MAX / s->elem) return NULL;
    void *d = rt_realloc(s->data, cap * s->elem);
    if (!d) return NULL;
    s->data = d;
    s->cap = cap;
  }
  return (char *)s->data + s->len++ * s->elem;
}

/* ---- parser ---- */

typedef struct {
  const unsigned char *s;
  size_t len, pos;
  int depth;
  size_t nvalues, max_values;
  JsonDoc *doc;
  Stack values;  /* JsonValue */
  Stack members; /* JsonMember */
  char *err;
  size_t errlen;
} Parser;

static int fail_at(Parser *p, size_t pos, const char *fmt, ...) {
  if (p->err && p->errlen) {
    int k = snprintf(p->err, p->errlen, "byte %zu: ", pos);
    if (k >= 0 && (size_t)k < p->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(p->err + k, p->errlen - (size_t)k, fmt, ap);
      va_end(ap);
    }
  }
  return -1;
}

static int fail_nomem(Parser *p) { return fail_at(p, p->pos, "out of memory"); }

/* Length of the UTF-8 sequence at s (at most `avail` bytes), or 0 if it is not valid. */
static size_t utf8_seq(const unsigned char *s, size_t avail) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  size_t n;
  unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0; /* no overlong forms */
    if (c == 0xED) hi = 0x9F; /* no surrogates U+D800..DFFF */
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90; /* no overlong forms */
    if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
  } else
    return 0;
  if (avail < n || s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if ((s[i] & 0xC0) != 0x80) return 0;
  return n;
}

int json_utf8_valid(const char *s, size_t len, size_t *bad) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < len) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    size_t n = utf8_seq(u + i, len - i);
    if (n == 0) {
      if (bad) *bad = i;
      return 0;
    }
    i += n;
  }
  return 1;
}

static void skip_ws(Parser *p) {
  while (p->pos < p->len) {
    unsigned char c = p->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    p->pos++;
  }
}

static int hex4(const unsigned char *s, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned c = s[i], d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return 0;
    v = v * 16 + d;
  }
  *out = v;
  return 1;
}

static size_t put_utf8(unsigned char *o, unsigned cp) {
  if (cp < 0x80) {
    o[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | (cp >> 6));
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | (cp >> 12));
    o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | (cp >> 18));
  o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

/* At an opening quote. The decoded text is never longer than the raw text, so the arena block is
 * sized from a first scan for the closing quote. */
static int parse_string(Parser *p, const char **out, size_t *out_len) {
  size_t start = p->pos + 1, end = start;
  while (end < p->len && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
  if (end >= p->len) return fail_at(p, p->pos, "unterminated string");
  unsigned char *o = arena_alloc(p->doc, end - start + 1);
  if (!o) return fail_nomem(p);
  size_t n = 0, i = start;
  while (i < end) {
    unsigned c = p->s[i];
    if (c < 0x20) return fail_at(p, i, "control character 0x%02x in a string must be escaped", c);
    if (c >= 0x80) {
      size_t k = utf8_seq(p->s + i, end - i);
      if (k == 0) return fail_at(p, i, "invalid UTF-8 in a string");
      memcpy(o + n, p->s + i, k);
      n += k;
      i += k;
      continue;
    }
    if (c != '\\') {
      o[n++] = (unsigned char)c;
      i++;
      continue;
    }
    unsigned e = p->s[i + 1]; /* i + 1 < end: the scan above skipped escapes in pairs */
    const char *simple = strchr("\"\\/bfnrt", (int)e);
    if (e && simple) {
      static const char map[] = "\"\\/\b\f\n\r\t";
      o[n++] = (unsigned char)map[simple - "\"\\/bfnrt"];
      i += 2;
      continue;
    }
    if (e != 'u') return fail_at(p, i, "invalid escape '\\%c'", e >= 0x20 && e < 0x7f ? (int)e : '?');
    unsigned cp, lo;
    if (end - i < 6 || !hex4(p->s + i + 2, &cp)) return fail_at(p, i, "invalid \\u escape");
    i += 6;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return fail_at(p, i - 6, "unpaired surrogate \\u%04x", cp);
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (end - i < 6 || p->s[i] != '\\' || p->s[i + 1] != 'u' || !hex4(p->s + i + 2, &lo) || lo < 0xDC00 ||
          lo > 0xDFFF)
        return fail_at(p, i - 6, "unpaired surrogate \\u%04x", cp);
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      i += 6;
    }
    n += put_utf8(o + n, cp); /* at most 4 bytes for 6 or 12 bytes of escape */
  }
  o[n] = 0;
  *out = (const char *)o;
  *out_len = n;
  p->pos = end + 1;
  return 0;
}

static int is_digit(unsigned c) { return c >= '0' && c <= '9'; }

static int parse_number(Parser *p, JsonValue *v) {
  size_t start = p->pos, i = p->pos;
  int neg = 0, integral = 1;
  if (i < p->len && p->s[i] == '-') neg = 1, i++;
  if (i >= p->len || !is_digit(p->s[i])) return fail_at(p, i, "invalid number");
  if (p->s[i] == '0') {
    i++;
    if (i < p->len && is_digit(p->s[i])) return fail_at(p, start, "leading zero in a number");
  } else {
    while (i < p->len && is_digit(p->s[i])) i++;
  }
  if (i < p->len && p->s[i] == '.') {
    integral = 0;
    i++;
    if (i >= p->len || !is_digit(p->s[i])) return fail_at(p, i, "digit expected after '.'");
    while (i < p->len && is_digit(p->s[i])) i++;
  }
  if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
    integral = 0;
    i++;
    if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
    if (i >= p->len || !is_digit(p->s[i])) return fail_at(p, i, "digit expected in exponent");
    while (i < p->len && is_digit(p->s[i])) i++;
  }
  size_t n = i - start;
  char *text = arena_alloc(p->doc, n + 1);
  if (!text) return fail_nomem(p);
  memcpy(text, p->s + start, n);
  text[n] = 0;
  v->kind = JSON_NUMBER;
  v->u.str = text;
  v->len = n;
  v->int_class = JSON_NOT_INT;
  v->ival = 0;
  if (integral) {
    /* magnitude limit: 2^63 - 1, or 2^63 for a negative number */
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, m = 0;
    v->int_class = JSON_INT_OK;
    for (size_t k = start + (size_t)neg; k < i; k++) {
      unsigned d = p->s[k] - '0';
      if (m > (limit - d) / 10) {
        v->int_class = JSON_INT_RANGE;
        break;
      }
      m = m * 10 + d;
    }
    if (v->int_class == JSON_INT_OK)
      v->ival = neg ? (m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m) : (int64_t)m;
  }
  p->pos = i;
  return 0;
}

static int parse_value(Parser *p, JsonValue *v);

static int enter(Parser *p) {
  if (++p->depth > JSON_MAX_DEPTH) return fail_at(p, p->pos, "nesting depth exceeds %d", JSON_MAX_DEPTH);
  p->pos++; /* the opening bracket */
  skip_ws(p);
  return 0;
}

static int parse_array(Parser *p, JsonValue *v) {
  size_t mark = p->values.len;
  if (enter(p)) return -1;
  if (p->pos < p->len && p->s[p->pos] == ']') {
    p->pos++;
  } else {
    for (;;) {
      JsonValue item;
      if (parse_value(p, &item)) return -1;
      JsonValue *slot = stack_push(&p->values);
      if (!slot) return fail_nomem(p);
      *slot = item;
      skip_ws(p);
      if (p->pos < p->len && p->s[p->pos] == ',') {
        p->pos++;
        continue;
      }
      if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
        break;
      }
      return fail_at(p, p->pos, "expected ',' or ']' in an array");
    }
  }
  size_t n = p->values.len - mark;
  JsonValue *items = NULL;
  if (n) {
    items = arena_alloc(p->doc, n * sizeof *items); /* n * size cannot overflow: the stack holds it */
    if (!items) return fail_nomem(p);
    memcpy(items, (JsonValue *)p->values.data + mark, n * sizeof *items);
  }
  p->values.len = mark;
  p->depth--;
  memset(v, 0, sizeof *v);
  v->kind = JSON_ARRAY;
  v->len = n;
  v->u.items = items;
  return 0;
}

static int key_cmp(const JsonMember *a, const JsonMember *b) {
  size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
  int c = memcmp(a->key, b->key, n);
  if (c) return c;
  return a->key_len < b->key_len ? -1 : a->key_len > b->key_len;
}

static int member_ptr_cmp(const void *a, const void *b) {
  return key_cmp(*(const JsonMember *const *)a, *(const JsonMember *const *)b);
}

static int fail_duplicate(Parser *p, size_t obj_pos, const JsonMember *m) {
  char shown[64];
  size_t k = 0;
  for (size_t i = 0; i < m->key_len && k + 5 < sizeof shown; i++) {
    unsigned char c = (unsigned char)m->key[i];
    if (c < 0x20 || c == 0x7f)
      k += (size_t)snprintf(shown + k, sizeof shown - k, "\\x%02x", c);
    else
      shown[k++] = (char)c;
  }
  shown[k] = 0;
  return fail_at(p, obj_pos, "duplicate key \"%s\" in the object that starts here", shown);
}

/* Small objects are checked pairwise; large ones through a sorted array of pointers, so that a
 * header with many entries costs n log n, not n^2. */
static int check_duplicates(Parser *p, size_t obj_pos, const JsonMember *m, size_t n) {
  if (n <= 16) {
    for (size_t i = 0; i < n; i++)
      for (size_t j = i + 1; j < n; j++)
        if (key_cmp(&m[i], &m[j]) == 0) return fail_duplicate(p, obj_pos, &m[j]);
    return 0;
  }
  const JsonMember **sorted = rt_malloc(n * sizeof *sorted);
  if (!sorted) return fail_nomem(p);
  for (size_t i = 0; i < n; i++) sorted[i] = &m[i];
  qsort(sorted, n, sizeof *sorted, member_ptr_cmp);
  int rc = 0;
  for (size_t i = 1; i < n && !rc; i++)
    if (key_cmp(sorted[i - 1], sorted[i]) == 0) rc = fail_duplicate(p, obj_pos, sorted[i]);
  free(sorted);
  return rc;
}

static int parse_object(Parser *p, JsonValue *v) {
  size_t mark = p->members.len, obj_pos = p->pos;
  if (enter(p)) return -1;
  if (p->pos < p->len && p->s[p->pos] == '}') {
    p->pos++;
  } else {
    for (;;) {
      JsonMember m;
      if (p->pos >= p->len || p->s[p->pos] != '"') return fail_at(p, p->pos, "expected a string key");
      if (parse_string(p, &m.key, &m.key_len)) return -1;
      skip_ws(p);
      if (p->pos >= p->len || p->s[p->pos] != ':') return fail_at(p, p->pos, "expected ':' after a key");
      p->pos++;
      if (parse_value(p, &m.value)) return -1;
      JsonMember *slot = stack_push(&p->members);
      if (!slot) return fail_nomem(p);
      *slot = m;
      skip_ws(p);
      if (p->pos < p->len && p->s[p->pos] == ',') {
        p->pos++;
        skip_ws(p);
        continue;
      }
      if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
        break;
      }
      return fail_at(p, p->pos, "expected ',' or '}' in an object");
    }
  }
  size_t n = p->members.len - mark;
  JsonMember *members = NULL;
  if (n) {
    members = arena_alloc(p->doc, n * sizeof *members);
    if (!members) return fail_nomem(p);
    memcpy(members, (JsonMember *)p->members.data + mark, n * sizeof *members);
    if (check_duplicates(p, obj_pos, members, n)) return -1;
  }
  p->members.len = mark;
  p->depth--;
  memset(v, 0, sizeof *v);
  v->kind = JSON_OBJECT;
  v->len = n;
  v->u.members = members;
  return 0;
}

static int parse_literal(Parser *p, const char *word, JsonKind kind, JsonValue *v) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
    return fail_at(p, p->pos, "invalid literal (expected '%s')", word);
  p->pos += n;
  memset(v, 0, sizeof *v);
  v->kind = kind;
  return 0;
}

static int parse_value(Parser *p, JsonValue *v) {
  skip_ws(p);
  if (p->pos >= p->len) return fail_at(p, p->pos, "unexpected end of input");
  if (p->max_values && ++p->nvalues > p->max_values)
    return fail_at(p, p->pos, "more than %zu values", p->max_values);
  unsigned c = p->s[p->pos];
  switch (c) {
  case '{': return parse_object(p, v);
  case '[': return parse_array(p, v);
  case 't': return parse_literal(p, "true", JSON_TRUE, v);
  case 'f': return parse_literal(p, "false", JSON_FALSE, v);
  case 'n': return parse_literal(p, "null", JSON_NULL, v);
  case '"':
    memset(v, 0, sizeof *v);
    v->kind = JSON_STRING;
    return parse_string(p, &v->u.str, &v->len);
  default:
    if (c == '-' || is_digit(c)) return parse_number(p, v);
    if (c >= 0x20 && c < 0x7f) return fail_at(p, p->pos, "unexpected character '%c'", (int)c);
    return fail_at(p, p->pos, "unexpected byte 0x%02x", c);
  }
}

int json_parse(const char *text, size_t len, size_t max_values, JsonDoc **out, char *err, size_t errlen) {
  *out = NULL;
  Parser p = {
      .s = (const unsigned char *)text, .len = len, .max_values = max_values, .err = err, .errlen = errlen};
  if (err && errlen) err[0] = 0;
  if (len > JSON_MAX_INPUT) return fail_at(&p, 0, "text of %zu bytes is too long", len);
  if (!text && len) return fail_at(&p, 0, "no text");
  p.values.elem = sizeof(JsonValue);
  p.members.elem = sizeof(JsonMember);
  p.doc = rt_calloc(1, sizeof *p.doc);
  if (!p.doc) return fail_nomem(&p);
  int rc = parse_value(&p, &p.doc->root);
  if (!rc) {
    skip_ws(&p);
    if (p.pos != p.len) rc = fail_at(&p, p.pos, "unexpected data after the JSON value");
  }
  free(p.values.data);
  free(p.members.data);
  if (rc) {
    json_free(p.doc);
    return -1;
  }
  *out = p.doc;
  return 0;
}

const JsonValue *json_root(const JsonDoc *doc) { return doc ? &doc->root : NULL; }

void json_free(JsonDoc *doc) {
  if (!doc) return;
  Chunk *c = doc->chunks;
  while (c) {
    Chunk *next = c->next;
    free(c);
    c = next;
  }
  free(doc);
}

const JsonValue *json_object_get(const JsonValue *obj, const char *key) {
  if (!obj || obj->kind != JSON_OBJECT || !key) return NULL;
  size_t n = strlen(key);
  for (size_t i = 0; i < obj->len; i++) {
    const JsonMember *m = &obj->u.members[i];
    if (m->key_len == n && memcmp(m->key, key, n) == 0) return &m->value;
  }
  return NULL;
}
