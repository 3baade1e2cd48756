/* safetensors.c: the safetensors reader, the conversions to float32 / int64, and the writer.
 *
 * The reader trusts nothing in the file. It checks, in this order: the length field against the
 * file and the 100 MiB cap; the header as UTF-8 and then as strict JSON (json.c, which also refuses
 * duplicate keys, hence duplicate tensor names); that the header is an object; every entry's name,
 * keys, dtype, shape (rank, integer non-negative dims, product and byte size without overflow) and
 * data_offsets (two integers, begin <= end <= data section, end - begin = byte size); __metadata__
 * as an object of strings; and finally that no two tensors' byte ranges overlap.
 *
 * Gaps are allowed: the spec asks writers to cover the data section exactly, but bytes that no
 * tensor claims (alignment padding, trailing bytes) are harmless to a reader, so we accept them.
 * Overlaps are refused, since they would alias two tensors; zero-size tensors own no bytes and
 * overlap nothing.
 *
 * The whole file is read into memory rather than mmap'ed: a file truncated by another process
 * under an mmap would turn a bounds check into a SIGBUS. The image is placed so that the data
 * section starts 64-byte aligned, so tensors at aligned offsets (all of them in files our writer
 * and PyTorch's produce) come out aligned.
 */
#include "safetensors.h"
#include "rt_alloc.h"
#include "json.h"
#include "rt_fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* Caps the JSON values in a header at 8M (about a million tensors, far beyond any real model), so
 * that a hostile 100 MiB header of "[0,0,0,..." costs at most a few hundred MB of parse tree rather
 * than the 1.6 GB its 50M values would. */
#define ST_MAX_JSON_VALUES ((size_t)1 << 23)
#define ST_DATA_ALIGN 64

/* ---- element types ---- */

static const struct {
  const char *name;
  size_t size;
} dtype_table[RT_DTYPE_COUNT] = {
#define RT_DTYPE_ROW(id, name, size) [id] = {name, size},
    RT_DTYPES(RT_DTYPE_ROW)
#undef RT_DTYPE_ROW
};

const char *rt_dtype_name(RtDType dt) { return (unsigned)dt < RT_DTYPE_COUNT ? dtype_table[dt].name : "?"; }

size_t rt_dtype_size(RtDType dt) { return (unsigned)dt < RT_DTYPE_COUNT ? dtype_table[dt].size : 0; }

int rt_dtype_lookup(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < RT_DTYPE_COUNT; i++)
    if (strcmp(dtype_table[i].name, name) == 0) return i;
  return -1;
}

/* ---- messages ---- */

/* Writes `prefix` then the formatted message into err; returns status. */
static int vfail(char *err, size_t errlen, int status, const char *prefix, const char *fmt, va_list ap) {
  if (!err || !errlen) return status;
  int k = snprintf(err, errlen, "%s", prefix);
  if (k >= 0 && (size_t)k < errlen) vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
  return status;
}

static int fail(char *err, size_t errlen, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(err, errlen, status, "", fmt, ap);
  va_end(ap);
  return status;
}

/* A name as it may be shown in a message: control bytes escaped, cut at about 80 bytes. */
static void show(char *out, size_t outlen, const char *s, size_t len) {
  size_t k = 0;
  for (size_t i = 0; i < len && k + 8 < outlen; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c == 0x7f)
      k += (size_t)snprintf(out + k, outlen - k, "\\x%02x", c);
    else
      out[k++] = (char)c;
    if (k >= 80 && i + 1 < len) {
      memcpy(out + k, "...", 3);
      k += 3;
      break;
    }
  }
  out[k] = 0;
}

/* What is wrong with a tensor name, or NULL. The text is valid UTF-8 here (checked before). */
static const char *name_problem(const char *s, size_t len) {
  if (len == 0) return "is empty";
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c == 0x7f) return "contains a control character";
  }
  if (len == 12 && memcmp(s, "__metadata__", 12) == 0) return "is reserved";
  return NULL;
}

static void format_shape(char *out, size_t outlen, int rank, const int64_t *shape) {
  size_t k = (size_t)snprintf(out, outlen, "[");
  for (int i = 0; i < rank && k < outlen; i++)
    k += (size_t)snprintf(out + k, outlen - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (k < outlen) snprintf(out + k, outlen - k, "]");
}

/* numel and byte size of a shape, refusing any product beyond INT64_MAX. Dims must be >= 0.
 * Zero dims are skipped in the overflow check on purpose: later code computes strides as products
 * of trailing dims, which must fit even when another dim is 0. */
static int shape_bytes(int rank, const int64_t *shape, size_t elem, int64_t *numel, size_t *nbytes,
                       const char **why) {
  uint64_t prod = 1, nonzero = 1;
  for (int i = 0; i < rank; i++) {
    uint64_t d = (uint64_t)shape[i];
    if (d == 0) {
      prod = 0;
      continue;
    }
    if (nonzero > (uint64_t)INT64_MAX / d) {
      *why = "shape product overflows";
      return -1;
    }
    nonzero *= d;
    prod *= d;
  }
  if (nonzero > (uint64_t)INT64_MAX / elem || nonzero * elem > SIZE_MAX) {
    *why = "byte size overflows";
    return -1;
  }
  *numel = (int64_t)prod;
  *nbytes = (size_t)(prod * elem);
  return 0;
}

/* ---- the file object ---- */

typedef struct {
  char *key, *value;
} Meta;

struct RtStFile {
  unsigned char *buf;       /* owned allocation */
  const unsigned char *img; /* the file's bytes inside buf */
  size_t len;
  RtStTensor *tensors;
  int count;
  int *by_name; /* tensor indices sorted by name, for rt_st_find */
  Meta *meta;
  int nmeta;
};

void rt_st_close(RtStFile *f) {
  if (!f) return;
  for (int i = 0; i < f->count; i++) free(f->tensors[i].name);
  for (int i = 0; i < f->nmeta; i++) {
    free(f->meta[i].key);
    free(f->meta[i].value);
  }
  free(f->tensors);
  free(f->by_name);
  free(f->meta);
  free(f->buf);
  free(f);
}

static uint64_t read_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* Allocates room for a file image of `len` bytes whose data section starts at 8 + hlen, placed so
 * that the data section is ST_DATA_ALIGN-aligned when hlen fits the file. */
static int alloc_image(RtStFile *f, size_t len, uint64_t hlen) {
  if (len > SIZE_MAX - ST_DATA_ALIGN) return -1;
  f->buf = rt_malloc(len + ST_DATA_ALIGN);
  if (!f->buf) return -1;
  size_t pad = 0;
  if (len >= 8 && hlen <= len - 8) {
    size_t mis = (size_t)(((uintptr_t)f->buf + 8 + (size_t)hlen) % ST_DATA_ALIGN);
    pad = mis ? ST_DATA_ALIGN - mis : 0;
  }
  f->img = f->buf + pad;
  f->len = len;
  return 0;
}

static char *dup_bytes(const char *s, size_t n) {
  char *d = rt_malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = 0;
  }
  return d;
}

typedef struct {
  const char *label; /* path or "safetensors" */
  char *err;
  size_t errlen;
} Ctx;

/* "<label>: tensor '<name>': <message>" (the tensor part when name != NULL). */
static int tfail(Ctx *c, int status, const char *name, size_t name_len, const char *fmt, ...) {
  char prefix[4400], shown[128]; /* room for a PATH_MAX path */
  if (name) {
    show(shown, sizeof shown, name, name_len);
    snprintf(prefix, sizeof prefix, "%s: tensor '%s': ", c->label, shown);
  } else {
    snprintf(prefix, sizeof prefix, "%s: ", c->label);
  }
  va_list ap;
  va_start(ap, fmt);
  vfail(c->err, c->errlen, status, prefix, fmt, ap);
  va_end(ap);
  return status;
}

/* Reads one JSON integer that must be >= 0 ("what" names it in messages). */
static int get_count(Ctx *c, const JsonMember *m, const JsonValue *v, const char *what, int64_t *out) {
  if (v->kind != JSON_NUMBER || v->int_class == JSON_NOT_INT)
    return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "%s is not an integer", what);
  if (v->int_class == JSON_INT_RANGE)
    return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "%s (%s) is too large", what, v->u.str);
  if (v->ival < 0)
    return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "%s is negative (%lld)", what, (long long)v->ival);
  *out = v->ival;
  return 0;
}

static int load_metadata(Ctx *c, RtStFile *f, const JsonValue *meta) {
  if (meta->kind == JSON_NULL) return 0; /* the Rust reader accepts null as "no metadata" */
  if (meta->kind != JSON_OBJECT) return tfail(c, RT_ST_EFORMAT, NULL, 0, "__metadata__ is not an object");
  if (meta->len > INT32_MAX) return tfail(c, RT_ST_EFORMAT, NULL, 0, "__metadata__ has too many keys");
  f->meta = rt_calloc(meta->len + 1, sizeof *f->meta);
  if (!f->meta) return tfail(c, RT_ST_ENOMEM, NULL, 0, "out of memory");
  for (size_t i = 0; i < meta->len; i++) {
    const JsonMember *m = &meta->u.members[i];
    char shown[128];
    show(shown, sizeof shown, m->key, m->key_len);
    if (m->value.kind != JSON_STRING)
      return tfail(c, RT_ST_EFORMAT, NULL, 0, "__metadata__ value of '%s' is not a string", shown);
    if (memchr(m->key, 0, m->key_len) || memchr(m->value.u.str, 0, m->value.len))
      return tfail(c, RT_ST_EFORMAT, NULL, 0, "__metadata__ entry '%s' contains a NUL character", shown);
    Meta *slot = &f->meta[f->nmeta++]; /* counted first so that close() frees a half-made pair */
    slot->key = dup_bytes(m->key, m->key_len);
    slot->value = dup_bytes(m->value.u.str, m->value.len);
    if (!slot->key || !slot->value) return tfail(c, RT_ST_ENOMEM, NULL, 0, "out of memory");
  }
  return 0;
}

/* Fills *t from one header entry; data_len is the size of the data section. */
static int load_tensor(Ctx *c, const JsonMember *m, const unsigned char *data, size_t data_len,
                       RtStTensor *t) {
  const char *why = name_problem(m->key, m->key_len);
  if (why) return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "tensor name %s", why);
  const JsonValue *e = &m->value;
  if (e->kind != JSON_OBJECT)
    return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "entry is not a JSON object");
  const JsonValue *dtype = NULL, *shape = NULL, *offsets = NULL;
  for (size_t i = 0; i < e->len; i++) {
    const JsonMember *k = &e->u.members[i];
    if (strcmp(k->key, "dtype") == 0)
      dtype = &k->value;
    else if (strcmp(k->key, "shape") == 0)
      shape = &k->value;
    else if (strcmp(k->key, "data_offsets") == 0)
      offsets = &k->value;
    else {
      char shown[128];
      show(shown, sizeof shown, k->key, k->key_len);
      return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "unexpected key '%s'", shown);
    }
  }
  if (!dtype) return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "missing \"dtype\"");
  if (!shape) return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "missing \"shape\"");
  if (!offsets) return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "missing \"data_offsets\"");

  if (dtype->kind != JSON_STRING) return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "dtype is not a string");
  int dt = memchr(dtype->u.str, 0, dtype->len) ? -1 : rt_dtype_lookup(dtype->u.str);
  if (dt < 0) {
    char shown[128];
    show(shown, sizeof shown, dtype->u.str, dtype->len);
    return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "unknown dtype \"%s\"", shown);
  }
  t->dtype = (RtDType)dt;

  if (shape->kind != JSON_ARRAY) return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "shape is not an array");
  if (shape->len > RT_ST_MAX_RANK)
    return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "rank %zu exceeds the maximum of %d", shape->len,
                 RT_ST_MAX_RANK);
  t->rank = (int)shape->len;
  for (int i = 0; i < t->rank; i++) {
    char what[32];
    snprintf(what, sizeof what, "shape dim %d", i);
    int rc = get_count(c, m, &shape->u.items[i], what, &t->shape[i]);
    if (rc) return rc;
  }
  int64_t numel;
  if (shape_bytes(t->rank, t->shape, rt_dtype_size(t->dtype), &numel, &t->nbytes, &why))
    return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "%s", why);

  if (offsets->kind != JSON_ARRAY || offsets->len != 2)
    return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "data_offsets is not [begin, end]");
  int64_t begin, end;
  int rc = get_count(c, m, &offsets->u.items[0], "data_offsets begin", &begin);
  if (!rc) rc = get_count(c, m, &offsets->u.items[1], "data_offsets end", &end);
  if (rc) return rc;
  if (begin > end)
    return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "data_offsets begin %lld > end %lld", (long long)begin,
                 (long long)end);
  if ((uint64_t)end > data_len)
    return tfail(c, RT_ST_EFORMAT, m->key, m->key_len,
                 "data_offsets end %lld is beyond the data section (%zu bytes)", (long long)end, data_len);
  if ((uint64_t)(end - begin) != t->nbytes) {
    char dims[160];
    format_shape(dims, sizeof dims, t->rank, t->shape);
    return tfail(c, RT_ST_EFORMAT, m->key, m->key_len, "data_offsets span %lld bytes but %s %s needs %zu",
                 (long long)(end - begin), rt_dtype_name(t->dtype), dims, t->nbytes);
  }
  t->data = data + begin;
  return 0;
}

static int cmp_tensor_ptr_by_name(const void *a, const void *b) {
  return strcmp((*(const RtStTensor *const *)a)->name, (*(const RtStTensor *const *)b)->name);
}

static int cmp_tensor_ptr_by_offset(const void *a, const void *b) {
  const RtStTensor *x = *(const RtStTensor *const *)a, *y = *(const RtStTensor *const *)b;
  const unsigned char *px = x->data, *py = y->data;
  if (px != py) return px < py ? -1 : 1;
  return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Builds by_name and checks that no two non-empty byte ranges overlap. */
static int index_tensors(Ctx *c, RtStFile *f, const unsigned char *data) {
  int n = f->count;
  const RtStTensor **ptrs = rt_malloc((size_t)(n ? n : 1) * sizeof *ptrs);
  f->by_name = rt_malloc((size_t)(n ? n : 1) * sizeof *f->by_name);
  if (!ptrs || !f->by_name) {
    free(ptrs);
    return tfail(c, RT_ST_ENOMEM, NULL, 0, "out of memory");
  }
  for (int i = 0; i < n; i++) ptrs[i] = &f->tensors[i];
  qsort(ptrs, (size_t)n, sizeof *ptrs, cmp_tensor_ptr_by_offset);
  const RtStTensor *prev = NULL;
  for (int i = 0; i < n; i++) {
    const RtStTensor *t = ptrs[i];
    if (t->nbytes == 0) continue;
    if (prev && (const unsigned char *)t->data < (const unsigned char *)prev->data + prev->nbytes) {
      size_t pb = (size_t)((const unsigned char *)prev->data - data),
             tb = (size_t)((const unsigned char *)t->data - data);
      char a[128], b[128];
      show(a, sizeof a, prev->name, strlen(prev->name));
      show(b, sizeof b, t->name, strlen(t->name));
      free(ptrs);
      return tfail(c, RT_ST_EFORMAT, NULL, 0, "tensors '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap", a, pb,
                   pb + prev->nbytes, b, tb, tb + t->nbytes);
    }
    prev = t;
  }
  qsort(ptrs, (size_t)n, sizeof *ptrs, cmp_tensor_ptr_by_name);
  for (int i = 0; i < n; i++) f->by_name[i] = (int)(ptrs[i] - f->tensors);
  free(ptrs);
  /* names are unique: json.c refuses duplicate keys */
  return 0;
}

/* Validates f->img[0..len) and builds the tables. */
static int load(Ctx *c, RtStFile *f) {
  const unsigned char *img = f->img;
  size_t len = f->len;
  if (len < 8)
    return tfail(c, RT_ST_EFORMAT, NULL, 0, "file is %zu bytes, shorter than the 8-byte header length", len);
  uint64_t hlen = read_le64(img);
  if (hlen > RT_ST_MAX_HEADER)
    return tfail(c, RT_ST_EFORMAT, NULL, 0, "header length %llu is absurd (limit %llu bytes)",
                 (unsigned long long)hlen, (unsigned long long)RT_ST_MAX_HEADER);
  if (hlen > len - 8)
    return tfail(c, RT_ST_EFORMAT, NULL, 0, "header length %llu runs beyond the end of the file (%zu bytes)",
                 (unsigned long long)hlen, len);
  const char *text = (const char *)img + 8;
  const unsigned char *data = img + 8 + hlen;
  size_t data_len = len - 8 - (size_t)hlen, bad;
  if (!json_utf8_valid(text, (size_t)hlen, &bad))
    return tfail(c, RT_ST_EFORMAT, NULL, 0, "header is not valid UTF-8 (header byte %zu)", bad);

  char jerr[200];
  JsonDoc *doc;
  if (json_parse(text, (size_t)hlen, ST_MAX_JSON_VALUES, &doc, jerr, sizeof jerr))
    return tfail(c, strstr(jerr, "out of memory") ? RT_ST_ENOMEM : RT_ST_EFORMAT, NULL, 0,
                 "header is not valid JSON: header %s", jerr);
  const JsonValue *root = json_root(doc);
  int rc = 0;
  if (root->kind != JSON_OBJECT) {
    rc = tfail(c, RT_ST_EFORMAT, NULL, 0, "header is not a JSON object");
    goto done;
  }
  if (root->len > INT32_MAX) {
    rc = tfail(c, RT_ST_EFORMAT, NULL, 0, "too many tensors");
    goto done;
  }
  f->tensors = rt_calloc(root->len ? root->len : 1, sizeof *f->tensors);
  if (!f->tensors) {
    rc = tfail(c, RT_ST_ENOMEM, NULL, 0, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < root->len && !rc; i++) {
    const JsonMember *m = &root->u.members[i];
    if (m->key_len == 12 && memcmp(m->key, "__metadata__", 12) == 0) {
      rc = load_metadata(c, f, &m->value);
      continue;
    }
    RtStTensor *t = &f->tensors[f->count];
    rc = load_tensor(c, m, data, data_len, t);
    if (rc) break;
    t->name = dup_bytes(m->key, m->key_len);
    if (!t->name) {
      rc = tfail(c, RT_ST_ENOMEM, NULL, 0, "out of memory");
      break;
    }
    f->count++;
  }
  if (!rc) rc = index_tensors(c, f, data);
done:
  json_free(doc);
  return rc;
}

int rt_st_parse(const void *bytes, size_t len, RtStFile **out, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!out) return fail(err, errlen, RT_ST_EINVAL, "rt_st_parse: out is NULL");
  *out = NULL;
  if (!bytes && len) return fail(err, errlen, RT_ST_EINVAL, "rt_st_parse: bytes is NULL");
  Ctx c = {"safetensors", err, errlen};
  RtStFile *f = rt_calloc(1, sizeof *f);
  if (!f || alloc_image(f, len, len >= 8 ? read_le64(bytes) : 0)) {
    rt_st_close(f);
    return fail(err, errlen, RT_ST_ENOMEM, "safetensors: out of memory for %zu bytes", len);
  }
  if (len) memcpy((unsigned char *)f->img, bytes, len);
  int rc = load(&c, f);
  if (rc) {
    rt_st_close(f);
    return rc;
  }
  *out = f;
  return RT_ST_OK;
}

/* Reads exactly n bytes at offset off; 0, or -1 with errno set (0 when the file was shorter). */
static int read_at(int fd, unsigned char *dst, size_t n, off_t off) {
  while (n) {
    ssize_t k = pread(fd, dst, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n, off);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return -1;
    if (k == 0) {
      errno = 0;
      return -1;
    }
    dst += k;
    n -= (size_t)k;
    off += k;
  }
  return 0;
}

int rt_st_open(const char *path, RtStFile **out, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!out) return fail(err, errlen, RT_ST_EINVAL, "rt_st_open: out is NULL");
  *out = NULL;
  if (!path) return fail(err, errlen, RT_ST_EINVAL, "rt_st_open: path is NULL");
  struct stat st; /* a FIFO is refused, not waited on */
  int fd = rt_file_open_read(path, 1, &st, err, errlen);
  if (fd < 0) return RT_ST_EIO;
  if (st.st_size < 0 || (uint64_t)st.st_size > SIZE_MAX - ST_DATA_ALIGN) {
    close(fd);
    return fail(err, errlen, RT_ST_EIO, "%s: file too large", path);
  }
  size_t len = (size_t)st.st_size;
  unsigned char head[8];
  uint64_t hlen = 0;
  if (len >= 8 && read_at(fd, head, 8, 0) == 0) hlen = read_le64(head);
  RtStFile *f = rt_calloc(1, sizeof *f);
  if (!f || alloc_image(f, len, hlen)) {
    rt_st_close(f);
    close(fd);
    return fail(err, errlen, RT_ST_ENOMEM, "%s: out of memory for %zu bytes", path, len);
  }
  if (read_at(fd, (unsigned char *)f->img, len, 0) != 0) {
    int e = errno;
    rt_st_close(f);
    close(fd);
    if (e == 0) return fail(err, errlen, RT_ST_EIO, "%s: file shrank while being read", path);
    return fail(err, errlen, RT_ST_EIO, "%s: read error: %s", path, strerror(e));
  }
  close(fd);
  Ctx c = {path, err, errlen};
  int rc = load(&c, f);
  if (rc) {
    rt_st_close(f);
    return rc;
  }
  *out = f;
  return RT_ST_OK;
}

/* ---- accessors ---- */

int rt_st_count(const RtStFile *f) { return f ? f->count : 0; }

const RtStTensor *rt_st_get(const RtStFile *f, int i) {
  return f && i >= 0 && i < f->count ? &f->tensors[i] : NULL;
}

const RtStTensor *rt_st_find(const RtStFile *f, const char *name) {
  if (!f || !name) return NULL;
  int lo = 0, hi = f->count - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    const RtStTensor *t = &f->tensors[f->by_name[mid]];
    int c = strcmp(name, t->name);
    if (c == 0) return t;
    if (c < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
  return NULL;
}

int64_t rt_st_numel(const RtStTensor *t) {
  if (!t || t->rank < 0 || t->rank > RT_ST_MAX_RANK) return -1;
  for (int i = 0; i < t->rank; i++)
    if (t->shape[i] < 0) return -1;
  int64_t n;
  size_t nbytes;
  const char *why;
  return shape_bytes(t->rank, t->shape, 1, &n, &nbytes, &why) ? -1 : n; /* a tensor filled by hand */
}

const char *rt_st_metadata(const RtStFile *f, const char *key) {
  if (!f || !key) return NULL;
  for (int i = 0; i < f->nmeta; i++)
    if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
  return NULL;
}

int rt_st_metadata_count(const RtStFile *f) { return f ? f->nmeta : 0; }

const char *rt_st_metadata_key(const RtStFile *f, int i) {
  return f && i >= 0 && i < f->nmeta ? f->meta[i].key : NULL;
}

/* ---- conversions ---- */

/* numel of a tensor the caller may have filled by hand; checks it against nbytes. */
static int checked_numel(const RtStTensor *t, const char *fn, size_t *numel, char *err, size_t errlen) {
  if (!t) return fail(err, errlen, RT_ST_EINVAL, "%s: tensor is NULL", fn);
  const char *name = t->name ? t->name : "?";
  if ((unsigned)t->dtype >= RT_DTYPE_COUNT || t->rank < 0 || t->rank > RT_ST_MAX_RANK)
    return fail(err, errlen, RT_ST_EINVAL, "tensor '%s' has an invalid dtype or rank", name);
  for (int i = 0; i < t->rank; i++)
    if (t->shape[i] < 0)
      return fail(err, errlen, RT_ST_EINVAL, "tensor '%s' has a negative dim", name);
  int64_t n;
  size_t nbytes;
  const char *why;
  if (shape_bytes(t->rank, t->shape, rt_dtype_size(t->dtype), &n, &nbytes, &why) || nbytes != t->nbytes ||
      (nbytes && !t->data))
    return fail(err, errlen, RT_ST_EINVAL, "tensor '%s' has inconsistent shape, size or data", name);
  *numel = (size_t)n;
  return 0;
}

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0x1f) { /* inf or NaN: keep the payload */
    uint32_t bits = sign | 0x7f800000u | mant << 13;
    memcpy(&v, &bits, 4);
    return v;
  }
  v = exp ? ldexpf((float)(mant | 0x400), (int)exp - 25) : ldexpf((float)mant, -24);
  return sign ? -v : v;
}

static int is_float(RtDType dt) { return dt == RT_F32 || dt == RT_F64 || dt == RT_F16 || dt == RT_BF16; }

int rt_st_to_f32(const RtStTensor *t, float *dst, char *err, size_t errlen) {
  size_t n;
  int rc = checked_numel(t, "rt_st_to_f32", &n, err, errlen);
  if (rc) return rc;
  if (!is_float(t->dtype))
    return fail(err, errlen, RT_ST_EINVAL, "tensor '%s' is %s, not a floating-point type (F32, F64, F16 or BF16)",
                t->name ? t->name : "?", rt_dtype_name(t->dtype));
  if (n && !dst) return fail(err, errlen, RT_ST_EINVAL, "rt_st_to_f32: dst is NULL");
  const unsigned char *src = t->data;
  switch (t->dtype) {
  case RT_F32:
    if (n) memcpy(dst, src, n * 4);
    return RT_ST_OK;
  case RT_F64:
    for (size_t i = 0; i < n; i++) {
      double x;
      memcpy(&x, src + 8 * i, 8);
      if (isfinite(x) && fabs(x) > (double)FLT_MAX)
        return fail(err, errlen, RT_ST_EINVAL, "tensor '%s': element %zu (%g) is out of float32 range",
                    t->name ? t->name : "?", i, x);
      dst[i] = (float)x;
    }
    return RT_ST_OK;
  case RT_F16:
    for (size_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      dst[i] = half_to_float(h);
    }
    return RT_ST_OK;
  case RT_BF16:
    for (size_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      uint32_t bits = (uint32_t)h << 16;
      memcpy(&dst[i], &bits, 4);
    }
    return RT_ST_OK;
  default: return RT_ST_EINVAL; /* refused above */
  }
}

int rt_st_to_i64(const RtStTensor *t, int64_t *dst, char *err, size_t errlen) {
  size_t n;
  int rc = checked_numel(t, "rt_st_to_i64", &n, err, errlen);
  if (rc) return rc;
  if (n && !dst) return fail(err, errlen, RT_ST_EINVAL, "rt_st_to_i64: dst is NULL");
  if (is_float(t->dtype))
    return fail(err, errlen, RT_ST_EINVAL,
                "tensor '%s' is %s, not an integer type (I64, I32, I16, I8, U8 or BOOL)",
                t->name ? t->name : "?", rt_dtype_name(t->dtype));
  const unsigned char *src = t->data;
  for (size_t i = 0; i < n; i++) {
    switch (t->dtype) {
    case RT_I64: memcpy(&dst[i], src + 8 * i, 8); break;
    case RT_I32: {
      int32_t v;
      memcpy(&v, src + 4 * i, 4);
      dst[i] = v;
      break;
    }
    case RT_I16: {
      int16_t v;
      memcpy(&v, src + 2 * i, 2);
      dst[i] = v;
      break;
    }
    case RT_I8: dst[i] = (int8_t)src[i]; break;
    case RT_U8: dst[i] = src[i]; break;
    case RT_BOOL:
      if (src[i] > 1)
        return fail(err, errlen, RT_ST_EINVAL, "tensor '%s': BOOL element %zu has byte value %u (not 0 or 1)",
                    t->name ? t->name : "?", i, src[i]);
      dst[i] = src[i];
      break;
    default: break; /* floats were refused above */
    }
  }
  return RT_ST_OK;
}

/* ---- writer ---- */

typedef struct {
  char *name;
  RtDType dtype;
  int rank;
  int64_t shape[RT_ST_MAX_RANK];
  void *data;
  size_t nbytes;
} Entry;

struct RtStWriter {
  Entry *entries;
  size_t n, cap;
  Meta *meta;
  size_t nmeta, meta_cap;
  int status; /* first error of add / meta (sticky), RT_ST_OK if none */
  char error[256];
};

RtStWriter *rt_st_writer_new(void) { return rt_calloc(1, sizeof(RtStWriter)); }

void rt_st_writer_free(RtStWriter *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n; i++) {
    free(w->entries[i].name);
    free(w->entries[i].data);
  }
  for (size_t i = 0; i < w->nmeta; i++) {
    free(w->meta[i].key);
    free(w->meta[i].value);
  }
  free(w->entries);
  free(w->meta);
  free(w);
}

const char *rt_st_writer_error(const RtStWriter *w) { return w ? w->error : "writer is NULL"; }

static int wfail(RtStWriter *w, int status, const char *fmt, ...) {
  char msg[sizeof w->error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (w->status == RT_ST_OK) {
    w->status = status;
    memcpy(w->error, msg, sizeof msg);
  }
  return status;
}

/* Grows an array of `elem`-byte items to hold one more. */
static int grow(void **arr, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return 0;
  size_t c = *cap ? *cap * 2 : 16;
  if (c > SIZE_MAX / elem) return -1;
  void *p = rt_realloc(*arr, c * elem);
  if (!p) return -1;
  *arr = p;
  *cap = c;
  return 0;
}

int rt_st_writer_add(RtStWriter *w, const char *name, RtDType dt, int rank, const int64_t *shape,
                     const void *data) {
  if (!w) return RT_ST_EINVAL;
  if (!name) return wfail(w, RT_ST_EINVAL, "rt_st_writer_add: name is NULL");
  char shown[128];
  size_t len = strlen(name);
  show(shown, sizeof shown, name, len);
  const char *why = json_utf8_valid(name, len, NULL) ? name_problem(name, len) : "is not valid UTF-8";
  if (why) return wfail(w, RT_ST_EINVAL, "tensor '%s': name %s", shown, why);
  if ((unsigned)dt >= RT_DTYPE_COUNT)
    return wfail(w, RT_ST_EINVAL, "tensor '%s': invalid dtype %d", shown, (int)dt);
  if (rank < 0 || rank > RT_ST_MAX_RANK)
    return wfail(w, RT_ST_EINVAL, "tensor '%s': rank %d is outside 0..%d", shown, rank, RT_ST_MAX_RANK);
  if (rank && !shape) return wfail(w, RT_ST_EINVAL, "tensor '%s': shape is NULL", shown);
  for (int i = 0; i < rank; i++)
    if (shape[i] < 0) return wfail(w, RT_ST_EINVAL, "tensor '%s': shape dim %d is negative", shown, i);
  Entry e = {.dtype = dt, .rank = rank};
  for (int i = 0; i < rank; i++) e.shape[i] = shape[i];
  int64_t numel;
  if (shape_bytes(rank, e.shape, rt_dtype_size(dt), &numel, &e.nbytes, &why))
    return wfail(w, RT_ST_EINVAL, "tensor '%s': %s", shown, why);
  if (e.nbytes && !data) return wfail(w, RT_ST_EINVAL, "tensor '%s': data is NULL", shown);
  for (size_t i = 0; i < w->n; i++)
    if (strcmp(w->entries[i].name, name) == 0)
      return wfail(w, RT_ST_EINVAL, "tensor '%s': duplicate name", shown);
  if (grow((void **)&w->entries, &w->cap, w->n, sizeof *w->entries))
    return wfail(w, RT_ST_ENOMEM, "out of memory");
  e.name = dup_bytes(name, len);
  e.data = e.nbytes ? rt_malloc(e.nbytes) : NULL;
  if (!e.name || (e.nbytes && !e.data)) {
    free(e.name);
    free(e.data);
    return wfail(w, RT_ST_ENOMEM, "tensor '%s': out of memory for %zu bytes", shown, e.nbytes);
  }
  if (e.nbytes) memcpy(e.data, data, e.nbytes);
  w->entries[w->n++] = e;
  return RT_ST_OK;
}

int rt_st_writer_meta(RtStWriter *w, const char *key, const char *value) {
  if (!w) return RT_ST_EINVAL;
  if (!key || !value) return wfail(w, RT_ST_EINVAL, "rt_st_writer_meta: key or value is NULL");
  char shown[128];
  show(shown, sizeof shown, key, strlen(key));
  if (!json_utf8_valid(key, strlen(key), NULL) || !json_utf8_valid(value, strlen(value), NULL))
    return wfail(w, RT_ST_EINVAL, "metadata '%s': not valid UTF-8", shown);
  for (size_t i = 0; i < w->nmeta; i++)
    if (strcmp(w->meta[i].key, key) == 0)
      return wfail(w, RT_ST_EINVAL, "metadata '%s': duplicate key", shown);
  if (grow((void **)&w->meta, &w->meta_cap, w->nmeta, sizeof *w->meta))
    return wfail(w, RT_ST_ENOMEM, "out of memory");
  Meta m = {dup_bytes(key, strlen(key)), dup_bytes(value, strlen(value))};
  if (!m.key || !m.value) {
    free(m.key);
    free(m.value);
    return wfail(w, RT_ST_ENOMEM, "out of memory");
  }
  w->meta[w->nmeta++] = m;
  return RT_ST_OK;
}

/* A growing text buffer for the header; `oom` records any failed growth. */
typedef struct {
  char *p;
  size_t len, cap;
  int oom;
} Buf;

static void buf_add(Buf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (n > SIZE_MAX - b->len - 1) {
    b->oom = 1;
    return;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap = cap > SIZE_MAX / 2 ? b->len + n + 1 : cap * 2;
    char *p = rt_realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void buf_str(Buf *b, const char *s) { buf_add(b, s, strlen(s)); }

/* s as a JSON string: quotes, backslashes and control characters escaped; UTF-8 kept as is. */
static void buf_json_string(Buf *b, const char *s) {
  buf_add(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    char esc[8];
    if (c == '"' || c == '\\') {
      esc[0] = '\\';
      esc[1] = (char)c;
      buf_add(b, esc, 2);
    } else if (c < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", c);
      buf_add(b, esc, 6);
    } else {
      buf_add(b, (const char *)&c, 1);
    }
  }
  buf_add(b, "\"", 1);
}

/* The 8-byte length and the padded JSON header, in one buffer; *data_total is the data size. */
static int build_header(RtStWriter *w, Buf *b, size_t *data_total, char *err, size_t errlen) {
  if (!w) return fail(err, errlen, RT_ST_EINVAL, "writer is NULL");
  if (w->status) return fail(err, errlen, w->status, "%s", w->error);
  buf_add(b, "\0\0\0\0\0\0\0\0", 8);
  buf_str(b, "{");
  if (w->nmeta) {
    buf_str(b, "\"__metadata__\":{");
    for (size_t i = 0; i < w->nmeta; i++) {
      if (i) buf_str(b, ",");
      buf_json_string(b, w->meta[i].key);
      buf_str(b, ":");
      buf_json_string(b, w->meta[i].value);
    }
    buf_str(b, "}");
  }
  size_t off = 0;
  for (size_t i = 0; i < w->n; i++) {
    const Entry *e = &w->entries[i];
    char num[64];
    if (i || w->nmeta) buf_str(b, ",");
    buf_json_string(b, e->name);
    buf_str(b, ":{\"dtype\":\"");
    buf_str(b, rt_dtype_name(e->dtype));
    buf_str(b, "\",\"shape\":[");
    for (int d = 0; d < e->rank; d++) {
      snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)e->shape[d]);
      buf_str(b, num);
    }
    if (e->nbytes > SIZE_MAX - off || off + e->nbytes > (uint64_t)INT64_MAX) {
      free(b->p);
      return fail(err, errlen, RT_ST_EINVAL, "tensors total more than the largest possible file");
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%zu,%zu]}", off, off + e->nbytes);
    buf_str(b, num);
    off += e->nbytes;
  }
  buf_str(b, "}");
  while (!b->oom && b->len % 8) buf_str(b, " "); /* the data section starts 8-byte aligned */
  if (b->oom) {
    free(b->p);
    return fail(err, errlen, RT_ST_ENOMEM, "out of memory for the header");
  }
  uint64_t hlen = b->len - 8;
  if (hlen > RT_ST_MAX_HEADER || off > SIZE_MAX - b->len) {
    free(b->p);
    return fail(err, errlen, RT_ST_EINVAL, "header of %llu bytes exceeds the %llu-byte limit",
                (unsigned long long)hlen, (unsigned long long)RT_ST_MAX_HEADER);
  }
  for (int i = 0; i < 8; i++) b->p[i] = (char)(hlen >> (8 * i) & 0xff);
  *data_total = off;
  return RT_ST_OK;
}

int rt_st_writer_serialize(RtStWriter *w, void **out, size_t *len, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!out || !len) return fail(err, errlen, RT_ST_EINVAL, "rt_st_writer_serialize: out or len is NULL");
  *out = NULL;
  *len = 0;
  Buf b = {0};
  size_t total;
  int rc = build_header(w, &b, &total, err, errlen);
  if (rc) return rc;
  char *p = rt_realloc(b.p, b.len + total + 1);
  if (!p) {
    free(b.p);
    return fail(err, errlen, RT_ST_ENOMEM, "out of memory for %zu bytes", b.len + total);
  }
  size_t k = b.len;
  for (size_t i = 0; i < w->n; i++) {
    if (w->entries[i].nbytes) memcpy(p + k, w->entries[i].data, w->entries[i].nbytes);
    k += w->entries[i].nbytes;
  }
  *out = p;
  *len = k;
  return RT_ST_OK;
}

int rt_st_writer_save(RtStWriter *w, const char *path, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!path) return fail(err, errlen, RT_ST_EINVAL, "rt_st_writer_save: path is NULL");
  Buf b = {0};
  size_t total;
  int rc = build_header(w, &b, &total, err, errlen);
  if (rc) return rc;
  /* the target is replaced atomically, through symlinks and keeping its mode (rt_fileio.c) */
  RtWFile out;
  if (rt_wfile_open(&out, path, err, errlen) != 0) {
    free(b.p);
    return RT_ST_EIO;
  }
  int ok = rt_wfile_write(&out, b.p, b.len) == 0;
  for (size_t i = 0; ok && i < w->n; i++) ok = rt_wfile_write(&out, w->entries[i].data, w->entries[i].nbytes) == 0;
  if (!ok) {
    rc = fail(err, errlen, RT_ST_EIO, "%s: write failed: %s", path, strerror(errno));
    rt_wfile_abort(&out);
  } else if (rt_wfile_commit(&out, err, errlen) != 0) {
    rc = RT_ST_EIO;
  }
  free(b.p);
  return rc;
}
