/* spec.c — the execution spec: text parser, built-ins, canonical form and fingerprint.
 *
 * The parser reads `len` bytes line by line and never past them; a bad line is reported and
 * skipped so that one run lists every error. The built-ins are spec text run through the same
 * parser, so a built-in can never mean something the format cannot say. This file depends on libc
 * only: the fuzz target compiles it alone.
 */
#include "spec/spec.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- knobs ----------------------------------------------------------------------------------- */

/* The canonical order is this order (name excluded). A knob's values are listed in the order of
 * its enum, so a value's index is the enum value. */
enum knob {
  K_NAME,
  K_FORMAT,
  K_ELEMENT,
  K_BLOCK,
  K_BLOCK_SCALE,
  K_ACT_SCALE,
  K_WEIGHT_SCALE,
  K_WEIGHT_BLOCK,
  K_ROUNDING,
  K_ACCUMULATE,
  K_BACKWARD,
  K_WEIGHT_CACHE,
  K_COUNT
};
#define K_FIRST_NVFP4 K_ELEMENT

#define KNOB_MAX_VALUES 3
typedef struct {
  const char *key;
  const char *values[KNOB_MAX_VALUES]; /* NULL-padded; none for `name` (free text) */
} knob_def;

static const knob_def knobs[K_COUNT] = {
    [K_NAME] = {"name", {NULL}},
    [K_FORMAT] = {"format", {"bf16", "nvfp4"}},
    [K_ELEMENT] = {"element", {"e2m1"}},
    [K_BLOCK] = {"block", {"16"}},
    [K_BLOCK_SCALE] = {"block_scale", {"e4m3"}},
    [K_ACT_SCALE] = {"act_scale", {"row", "tensor"}},
    [K_WEIGHT_SCALE] = {"weight_scale", {"row", "tensor"}},
    [K_WEIGHT_BLOCK] = {"weight_block", {"1x16", "16x16"}},
    [K_ROUNDING] = {"rounding", {"rne"}},
    [K_ACCUMULATE] = {"accumulate", {"fp32"}},
    [K_BACKWARD] = {"backward", {"bf16"}},
    [K_WEIGHT_CACHE] = {"weight_cache", {"requantize", "frozen", "frozen-sampled"}},
};

_Static_assert(MT_FORMAT_BF16 == 0 && MT_FORMAT_NVFP4 == 1, "format values follow the enum");
_Static_assert(MT_SCALE_ROW == 0 && MT_SCALE_TENSOR == 1, "scale values follow the enum");
_Static_assert(MT_WBLOCK_1X16 == 0 && MT_WBLOCK_16X16 == 1, "wblock values follow the enum");
_Static_assert(MT_WCACHE_REQUANTIZE == 0 && MT_WCACHE_FROZEN == 1 && MT_WCACHE_FROZEN_SAMPLED == 2,
               "wcache values follow the enum");

static const char *value_name(enum knob k, unsigned v) {
  if (v < KNOB_MAX_VALUES && knobs[k].values[v])
    return knobs[k].values[v];
  return "invalid";
}

const char *mt_format_name(enum mt_format f) { return value_name(K_FORMAT, (unsigned)f); }
const char *mt_scale_name(enum mt_scale s) { return value_name(K_ACT_SCALE, (unsigned)s); }
const char *mt_wblock_name(enum mt_wblock b) { return value_name(K_WEIGHT_BLOCK, (unsigned)b); }
const char *mt_wcache_name(enum mt_wcache c) { return value_name(K_WEIGHT_CACHE, (unsigned)c); }

/* ---- errors ---------------------------------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static void add_error(mt_spec_errors *errs, int line,
                                                            const char *fmt, ...) {
  if (errs->n >= MT_SPEC_MAX_ERRORS) {
    errs->dropped++;
    return;
  }
  mt_spec_error *e = &errs->e[errs->n++];
  e->line = line;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
}

static int has_errors(const mt_spec_errors *errs) { return errs->n + errs->dropped > 0; }

/* Input bytes quoted in a message: at most `max` of them, non-printable ones as '?', so a message
 * stays one printable line whatever the input held. Words get 40 bytes, paths more. */
#define QUOTE_WORD 40
#define QUOTE_PATH 160
typedef struct {
  char s[QUOTE_PATH + 4];
} quoted;

static quoted quote_max(const char *p, size_t n, size_t max) {
  quoted q;
  size_t k = n < max ? n : max;
  for (size_t i = 0; i < k; i++)
    q.s[i] = (p[i] >= 0x20 && p[i] < 0x7f) ? p[i] : '?';
  if (n > k)
    memcpy(q.s + k, "...", 3), k += 3;
  q.s[k] = '\0';
  return q;
}

static quoted quote(const char *p, size_t n) { return quote_max(p, n, QUOTE_WORD); }

static quoted quote_path(const char *path) { return quote_max(path, strlen(path), QUOTE_PATH); }

/* "a", "a or b", "a, b or c": the legal values of a knob, for messages. */
static const char *expected_values(enum knob k, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < KNOB_MAX_VALUES && knobs[k].values[i]; i++) {
    int last = i + 1 == KNOB_MAX_VALUES || !knobs[k].values[i + 1];
    const char *sep = i == 0 ? "" : last ? " or " : ", ";
    int w = snprintf(buf + len, size - len, "%s%s", sep, knobs[k].values[i]);
    if (w < 0 || (size_t)w >= size - len)
      break;
    len += (size_t)w;
  }
  return buf;
}

/* ---- small text helpers ---------------------------------------------------------------------- */

static int is_space(char c) { return c == ' ' || c == '\t'; }

static void trim(const char **p, size_t *n) {
  while (*n && is_space(**p))
    (*p)++, (*n)--;
  while (*n && is_space((*p)[*n - 1]))
    (*n)--;
}

static int text_is(const char *p, size_t n, const char *word) {
  return strlen(word) == n && memcmp(p, word, n) == 0;
}

/* Splits off the next token (separated by spaces, tabs, or `sep` when given) of p[0..n). */
static int next_token(const char **p, size_t *n, char sep, const char **tok, size_t *tok_len) {
  while (*n && (is_space(**p) || **p == sep))
    (*p)++, (*n)--;
  if (!*n)
    return 0;
  *tok = *p;
  while (*n && !is_space(**p) && **p != sep)
    (*p)++, (*n)--;
  *tok_len = (size_t)(*p - *tok);
  return 1;
}

/* "OUTxIN": two positive decimal integers below 2^32. */
static int parse_dim(const char *p, size_t n, uint32_t *out) {
  uint64_t v = 0;
  if (!n)
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (p[i] < '0' || p[i] > '9')
      return -1;
    v = v * 10 + (uint64_t)(p[i] - '0');
    if (v > UINT32_MAX)
      return -1;
  }
  if (!v)
    return -1;
  *out = (uint32_t)v;
  return 0;
}

static int parse_shape(const char *p, size_t n, mt_route *r) {
  const char *x = memchr(p, 'x', n);
  if (!x)
    return -1;
  size_t left = (size_t)(x - p);
  if (parse_dim(p, left, &r->out) || parse_dim(x + 1, n - left - 1, &r->in))
    return -1;
  return 0;
}

static int route_cmp(mt_route a, mt_route b) {
  if (a.out != b.out)
    return a.out < b.out ? -1 : 1;
  return a.in < b.in ? -1 : a.in > b.in;
}

/* Inserts r in the sorted route list: 0 added, 1 already there, -1 the list is full. */
static int route_insert(mt_route *routes, int *nroutes, mt_route r) {
  int i = *nroutes;
  for (int k = 0; k < *nroutes; k++)
    if (route_cmp(routes[k], r) == 0)
      return 1;
  if (*nroutes >= MT_SPEC_MAX_ROUTES)
    return -1;
  while (i > 0 && route_cmp(routes[i - 1], r) > 0) {
    routes[i] = routes[i - 1];
    i--;
  }
  routes[i] = r;
  (*nroutes)++;
  return 0;
}

/* ---- the parser ------------------------------------------------------------------------------ */

typedef struct {
  mt_spec_errors *errs;
  int knob_line[K_COUNT];  /* 0 = not given */
  int knob_value[K_COUNT]; /* index into knobs[k].values; -1 = given with a bad value */
  char name[MT_SPEC_NAME_MAX];
  int nroutes;
  mt_route routes[MT_SPEC_MAX_ROUTES]; /* in the order given */
  int route_line[MT_SPEC_MAX_ROUTES];
  int too_many_routes; /* reported once */
  int content_lines;   /* lines holding anything but spaces and comments */
} parse_state;

static const char known_knobs[] = "name, format, element, block, block_scale, act_scale, "
                                  "weight_scale, weight_block, rounding, accumulate, backward, "
                                  "weight_cache";

/* Levenshtein distance of short words (the caller bounds their lengths by 32). */
static int edit_distance(const char *a, size_t na, const char *b, size_t nb) {
  int row[33];
  for (size_t j = 0; j <= nb; j++)
    row[j] = (int)j;
  for (size_t i = 1; i <= na; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= nb; j++) {
      int up = row[j];
      int best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best)
        best = up + 1;
      if (row[j - 1] + 1 < best)
        best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[nb];
}

static const char *closest_knob(const char *key, size_t n) {
  const char *best = NULL;
  int best_d = 3; /* suggest only near misses */
  if (n > 32)
    return NULL;
  for (int k = 0; k < K_COUNT; k++) {
    int d = edit_distance(key, n, knobs[k].key, strlen(knobs[k].key));
    if (d < best_d)
      best_d = d, best = knobs[k].key;
  }
  return best;
}

static void unknown_knob(parse_state *st, int line, const char *key, size_t n) {
  const char *near = closest_knob(key, n);
  if (text_is(key, n, "route"))
    add_error(st->errs, line, "route is not a knob: write \"route OUTxIN ...\" without \"=\"");
  else if (near)
    add_error(st->errs, line, "unknown knob \"%s\" (did you mean \"%s\"? known: %s)",
              quote(key, n).s, near, known_knobs);
  else
    add_error(st->errs, line, "unknown knob \"%s\" (known: %s)", quote(key, n).s, known_knobs);
}

static int find_knob(const char *key, size_t n) {
  for (int k = 0; k < K_COUNT; k++)
    if (text_is(key, n, knobs[k].key))
      return k;
  return -1;
}

static int valid_name(const char *p, size_t n) {
  if (n < 1 || n >= MT_SPEC_NAME_MAX)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    if (!ok)
      return 0;
  }
  return 1;
}

/* The index of the value among the knob's legal values, or -1 (reported). */
static int knob_value(parse_state *st, int line, enum knob k, const char *v, size_t n) {
  char expect[64];
  if (k == K_NAME) {
    if (valid_name(v, n))
      return 0;
    add_error(st->errs, line, "name: bad value \"%s\" (expected 1 to %d of A-Z a-z 0-9 . _ -)",
              quote(v, n).s, MT_SPEC_NAME_MAX - 1);
    return -1;
  }
  for (int i = 0; i < KNOB_MAX_VALUES && knobs[k].values[i]; i++)
    if (text_is(v, n, knobs[k].values[i]))
      return i;
  expected_values(k, expect, sizeof expect);
  if (!n)
    add_error(st->errs, line, "%s: missing value (expected %s)", knobs[k].key, expect);
  else
    add_error(st->errs, line, "%s: bad value \"%s\" (expected %s)", knobs[k].key, quote(v, n).s,
              expect);
  return -1;
}

static void parse_knob_line(parse_state *st, int line, const char *p, size_t n) {
  const char *eq = memchr(p, '=', n);
  const char *key = p, *val = eq + 1;
  size_t key_len = (size_t)(eq - p), val_len = n - key_len - 1;
  trim(&key, &key_len);
  trim(&val, &val_len);
  if (!key_len) {
    add_error(st->errs, line, "missing knob name before \"=\" (write \"knob = value\")");
    return;
  }
  int k = find_knob(key, key_len);
  if (k < 0) {
    unknown_knob(st, line, key, key_len);
    return;
  }
  if (st->knob_line[k]) {
    add_error(st->errs, line, "knob \"%s\" given twice (first on line %d): keep one", knobs[k].key,
              st->knob_line[k]);
    return;
  }
  st->knob_line[k] = line;
  st->knob_value[k] = knob_value(st, line, (enum knob)k, val, val_len);
  if (k == K_NAME && st->knob_value[k] == 0)
    memcpy(st->name, val, val_len), st->name[val_len] = '\0';
}

static void add_parsed_route(parse_state *st, int line, mt_route r) {
  for (int i = 0; i < st->nroutes; i++) {
    if (route_cmp(st->routes[i], r) == 0) {
      add_error(st->errs, line, "route %ux%u listed twice (first on line %d): keep one", r.out,
                r.in, st->route_line[i]);
      return;
    }
  }
  if (st->nroutes >= MT_SPEC_MAX_ROUTES) {
    if (!st->too_many_routes++)
      add_error(st->errs, line, "too many routes: at most %d (route %ux%u is one more)",
                MT_SPEC_MAX_ROUTES, r.out, r.in);
    return;
  }
  st->route_line[st->nroutes] = line;
  st->routes[st->nroutes++] = r;
}

/* p[0..n) starts with the word "route". */
static void parse_route_line(parse_state *st, int line, const char *p, size_t n) {
  const char *tok;
  size_t tok_len;
  int shapes = 0;
  p += 5, n -= 5;
  while (next_token(&p, &n, '\0', &tok, &tok_len)) {
    mt_route r;
    shapes++;
    if (parse_shape(tok, tok_len, &r))
      add_error(st->errs, line,
                "route \"%s\" is not OUTxIN with positive integers (e.g. route 1536x2048)",
                quote(tok, tok_len).s);
    else
      add_parsed_route(st, line, r);
  }
  if (!shapes)
    add_error(st->errs, line, "route line lists no shape (e.g. route 1536x2048 2048x768)");
}

/* 0 when the line holds only text: printable ASCII and tabs (any byte >= 0x80 in a comment, so
 * UTF-8 comments are fine). A CR before the line's end was already cut off. */
static int check_line_bytes(parse_state *st, int line, const char *p, size_t n) {
  int in_comment = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    in_comment |= c == '#';
    int ok = c == '\t' || (c >= 0x20 && c < 0x7f) || (in_comment && c >= 0x80);
    if (!ok) {
      add_error(st->errs, line, "NUL or non-text byte 0x%02x at column %zu (a spec is plain text)",
                c, i + 1);
      return -1;
    }
  }
  return 0;
}

/* "route" as the first word, not followed by "=" (that is a mistaken knob line). */
static int is_route_line(const char *p, size_t n) {
  if (n < 5 || memcmp(p, "route", 5) != 0 || (n > 5 && !is_space(p[5])))
    return 0;
  p += 5, n -= 5;
  trim(&p, &n);
  return !n || p[0] != '=';
}

static void parse_line(parse_state *st, int line, const char *p, size_t n) {
  if (n > MT_SPEC_LINE_MAX) {
    add_error(st->errs, line,
              "line longer than %d bytes (split it: a spec may hold many route lines)",
              MT_SPEC_LINE_MAX);
    st->content_lines++;
    return;
  }
  if (check_line_bytes(st, line, p, n)) {
    st->content_lines++;
    return;
  }
  const char *hash = memchr(p, '#', n);
  if (hash)
    n = (size_t)(hash - p);
  trim(&p, &n);
  if (!n)
    return;
  st->content_lines++;
  if (is_route_line(p, n))
    parse_route_line(st, line, p, n);
  else if (memchr(p, '=', n))
    parse_knob_line(st, line, p, n);
  else
    add_error(st->errs, line, "expected \"knob = value\" or \"route OUTxIN ...\", found \"%s\"",
              quote(p, n).s);
}

/* ---- whole-spec checks ----------------------------------------------------------------------- */

static void missing_knob(parse_state *st, enum knob k) {
  char expect[64];
  if (!knobs[k].values[1]) {
    add_error(st->errs, 0, "missing required knob \"%s\" (add a line \"%s = %s\")", knobs[k].key,
              knobs[k].key, knobs[k].values[0]);
    return;
  }
  expected_values(k, expect, sizeof expect);
  add_error(st->errs, 0, "missing required knob \"%s\" (add a line \"%s = VALUE\"; values: %s)",
            knobs[k].key, knobs[k].key, expect);
}

static void check_bf16(parse_state *st) {
  for (int k = K_FIRST_NVFP4; k < K_COUNT; k++)
    if (st->knob_line[k])
      add_error(st->errs, st->knob_line[k],
                "%s is an nvfp4 knob but format = bf16 (line %d): remove it or set format = nvfp4",
                knobs[k].key, st->knob_line[K_FORMAT]);
}

static void check_nvfp4(parse_state *st) {
  for (int k = K_FIRST_NVFP4; k < K_COUNT; k++)
    if (!st->knob_line[k])
      missing_knob(st, (enum knob)k);
  if (st->knob_value[K_WEIGHT_BLOCK] == MT_WBLOCK_16X16 &&
      st->knob_value[K_WEIGHT_SCALE] == MT_SCALE_ROW && st->knob_line[K_WEIGHT_BLOCK] &&
      st->knob_line[K_WEIGHT_SCALE])
    add_error(st->errs, st->knob_line[K_WEIGHT_BLOCK],
              "weight_block = 16x16 needs weight_scale = tensor (line %d sets row): a 16x16 tile "
              "spans 16 output rows, so they must share one outer scale",
              st->knob_line[K_WEIGHT_SCALE]);
}

static void check_whole(parse_state *st) {
  if (!st->knob_line[K_FORMAT]) {
    if (!st->content_lines)
      add_error(st->errs, 0,
                "empty spec: no \"format\" line (write \"format = nvfp4\" and its knobs, or use a "
                "built-in: bf16, nvfp4-row, nvfp4-tensor)");
    else
      missing_knob(st, K_FORMAT);
    return;
  }
  if (st->knob_value[K_FORMAT] == MT_FORMAT_BF16)
    check_bf16(st);
  else if (st->knob_value[K_FORMAT] == MT_FORMAT_NVFP4)
    check_nvfp4(st);
}

static void fill_spec(const parse_state *st, mt_spec *out) {
  memset(out, 0, sizeof *out);
  memcpy(out->name, st->name, sizeof out->name);
  out->format = (enum mt_format)st->knob_value[K_FORMAT];
  if (out->format == MT_FORMAT_NVFP4) {
    out->act_scale = (enum mt_scale)st->knob_value[K_ACT_SCALE];
    out->weight_scale = (enum mt_scale)st->knob_value[K_WEIGHT_SCALE];
    out->weight_block = (enum mt_wblock)st->knob_value[K_WEIGHT_BLOCK];
    out->weight_cache = (enum mt_wcache)st->knob_value[K_WEIGHT_CACHE];
  }
  for (int i = 0; i < st->nroutes; i++)
    route_insert(out->routes, &out->nroutes, st->routes[i]);
}

/* A UTF-8 byte order mark some editors write is not part of the text. */
static size_t skip_bom(const char *text, size_t len) {
  return len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
}

/* Errors in line order, whole-spec ones (line 0) last: those checks run after the lines. */
static void sort_errors(mt_spec_errors *errs) {
  for (int i = 1; i < errs->n; i++) {
    mt_spec_error e = errs->e[i];
    int key = e.line ? e.line : INT_MAX, k = i;
    for (; k > 0; k--) {
      int prev = errs->e[k - 1].line ? errs->e[k - 1].line : INT_MAX;
      if (prev <= key)
        break;
      errs->e[k] = errs->e[k - 1];
    }
    errs->e[k] = e;
  }
}

static void reset_errors(mt_spec_errors *errs) {
  errs->n = 0;
  errs->dropped = 0;
}

int mt_spec_parse(const char *text, size_t len, mt_spec *out, mt_spec_errors *errs) {
  mt_spec_errors scratch;
  parse_state st;
  if (!errs)
    errs = &scratch;
  reset_errors(errs);
  memset(&st, 0, sizeof st);
  st.errs = errs;
  if (!text)
    len = 0;
  if (len > MT_SPEC_FILE_MAX) { /* also keeps line numbers far from INT_MAX */
    add_error(errs, 0, "spec text of %zu bytes is larger than %d: not a spec", len,
              MT_SPEC_FILE_MAX);
    return -1;
  }
  size_t pos = len ? skip_bom(text, len) : 0;
  for (int line = 1; pos < len; line++) {
    const char *p = text + pos;
    const char *nl = memchr(p, '\n', len - pos);
    size_t n = nl ? (size_t)(nl - p) : len - pos;
    pos += n + (nl != NULL);
    if (n && p[n - 1] == '\r')
      n--;
    parse_line(&st, line, p, n);
  }
  check_whole(&st);
  sort_errors(errs);
  if (has_errors(errs))
    return -1;
  if (out)
    fill_spec(&st, out);
  return 0;
}

/* ---- files and names ------------------------------------------------------------------------- */

/* The file's kind, for a refusal: a spec is read from a regular file only. */
static const char *kind_of(mode_t mode) {
  return S_ISFIFO(mode)   ? "a FIFO or pipe"
         : S_ISDIR(mode)  ? "a directory"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
         : S_ISSOCK(mode) ? "a socket"
                          : "something other than a regular file";
}

/* Opened without blocking (a FIFO with no writer would block the open) and refused unless it is
 * a regular file: a FIFO would hang the program, /dev/stdin would eat its input, and /dev/zero
 * would never end. */
static int open_regular(const char *path, mt_spec_errors *errs) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int saved = errno;
    if (saved == ENOENT)
      add_error(errs, 0, "file not found: %s", quote_path(path).s);
    else
      add_error(errs, 0, "cannot open %s: %s", quote_path(path).s, strerror(saved));
    return -1;
  }
  struct stat st = {0};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    add_error(errs, 0,
              "%s is %s, not a spec file: give the path of a regular file (save a spec "
              "that comes from a pipe to a file first)",
              quote_path(path).s, kind_of(st.st_mode));
    close(fd);
    return -1;
  }
  return fd;
}

static int read_file(const char *path, char **text, size_t *len, mt_spec_errors *errs) {
  int fd = open_regular(path, errs);
  if (fd < 0)
    return -1;
  char *buf = malloc(MT_SPEC_FILE_MAX + 1);
  size_t n = 0;
  int failed = !buf, saved = 0;
  while (buf && n < MT_SPEC_FILE_MAX + 1) {
    ssize_t got = read(fd, buf + n, MT_SPEC_FILE_MAX + 1 - n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      failed = 1, saved = errno;
    if (got <= 0)
      break;
    n += (size_t)got;
  }
  close(fd);
  if (failed || n > MT_SPEC_FILE_MAX) {
    if (!buf)
      add_error(errs, 0, "cannot read %s: out of memory", quote_path(path).s);
    else if (failed)
      add_error(errs, 0, "cannot read %s: %s", quote_path(path).s, strerror(saved));
    else
      add_error(errs, 0, "%s is larger than %d bytes: not a spec file", quote_path(path).s,
                MT_SPEC_FILE_MAX);
    free(buf);
    return -1;
  }
  *text = buf;
  *len = n;
  return 0;
}

int mt_spec_parse_file(const char *path, mt_spec *out, mt_spec_errors *errs) {
  mt_spec_errors scratch;
  char *text;
  size_t len;
  if (!errs)
    errs = &scratch;
  reset_errors(errs);
  if (!path || !path[0]) {
    add_error(errs, 0, "no spec file given");
    return -1;
  }
  if (read_file(path, &text, &len, errs))
    return -1;
  int rc = mt_spec_parse(text, len, out, errs);
  free(text);
  return rc;
}

/* ---- built-ins ------------------------------------------------------------------------------- */

#define NVFP4_COMMON                                                                               \
  "format = nvfp4\n"                                                                               \
  "element = e2m1\n"                                                                               \
  "block = 16\n"                                                                                   \
  "block_scale = e4m3\n"                                                                           \
  "weight_scale = tensor\n"                                                                        \
  "weight_block = 1x16\n"                                                                          \
  "rounding = rne\n"                                                                               \
  "accumulate = fp32\n"                                                                            \
  "backward = bf16\n"                                                                              \
  "weight_cache = requantize\n"

typedef struct {
  const char *name, *about, *text;
} builtin_def;

static const builtin_def builtins[] = {
    {"bf16", "BF16 baseline: cuBLAS numerics, statistics only",
     "name = bf16\n"
     "format = bf16\n"},
    {"nvfp4-row", "NVFP4 W4A4, one activation scale per token row (batch invariant)",
     "name = nvfp4-row\n" NVFP4_COMMON "act_scale = row\n"},
    {"nvfp4-tensor", "NVFP4 W4A4, one activation scale per call (couples tokens: the naive recipe)",
     "name = nvfp4-tensor\n" NVFP4_COMMON "act_scale = tensor\n"},
};
#define NBUILTINS ((int)(sizeof builtins / sizeof builtins[0]))

const char *const mt_spec_builtin_names[] = {"bf16", "nvfp4-row", "nvfp4-tensor", NULL};

static const builtin_def *find_builtin(const char *name) {
  for (int i = 0; name && i < NBUILTINS; i++)
    if (strcmp(builtins[i].name, name) == 0)
      return &builtins[i];
  return NULL;
}

int mt_spec_builtin(const char *name, mt_spec *out) {
  const builtin_def *b = find_builtin(name);
  if (!b)
    return -1;
  return mt_spec_parse(b->text, strlen(b->text), out, NULL);
}

const char *mt_spec_builtin_about(const char *name) {
  const builtin_def *b = find_builtin(name);
  return b ? b->about : NULL;
}

const char *mt_spec_builtin_text(const char *name) {
  const builtin_def *b = find_builtin(name);
  return b ? b->text : NULL;
}

int mt_spec_load(const char *name_or_path, mt_spec *out, mt_spec_errors *errs) {
  mt_spec_errors scratch;
  if (!errs)
    errs = &scratch;
  if (find_builtin(name_or_path)) {
    reset_errors(errs);
    return mt_spec_builtin(name_or_path, out);
  }
  int rc = mt_spec_parse_file(name_or_path, out, errs);
  /* A bare word that is no file was most likely meant as a built-in name. */
  if (rc && name_or_path && !strchr(name_or_path, '/') && errs->n == 1 && errs->e[0].line == 0 &&
      strncmp(errs->e[0].msg, "file not found", 14) == 0)
    snprintf(errs->e[0].msg, sizeof errs->e[0].msg,
             "file not found: %s (and no built-in of that name: bf16, nvfp4-row, nvfp4-tensor)",
             quote_path(name_or_path).s);
  return rc;
}

/* ---- routes ---------------------------------------------------------------------------------- */

int mt_spec_add_routes(mt_spec *s, const char *list, mt_spec_errors *errs) {
  mt_spec_errors scratch;
  mt_route routes[MT_SPEC_MAX_ROUTES];
  int nroutes = s->nroutes < 0 ? 0 : s->nroutes;
  const char *tok;
  size_t tok_len, n = list ? strlen(list) : 0;
  if (!errs)
    errs = &scratch;
  reset_errors(errs);
  if (nroutes > MT_SPEC_MAX_ROUTES)
    nroutes = MT_SPEC_MAX_ROUTES;
  memcpy(routes, s->routes, (size_t)nroutes * sizeof routes[0]);
  /* Into a copy first: a bad list leaves the spec as it was. */
  while (next_token(&list, &n, ',', &tok, &tok_len)) {
    mt_route r;
    if (parse_shape(tok, tok_len, &r)) {
      add_error(errs, 0,
                "MINITE_ROUTE: \"%s\" is not OUTxIN with positive integers (e.g. "
                "MINITE_ROUTE=1536x2048,2048x768)",
                quote(tok, tok_len).s);
      return -1;
    }
    if (route_insert(routes, &nroutes, r) < 0) {
      add_error(errs, 0, "MINITE_ROUTE: too many routes (at most %d in all)", MT_SPEC_MAX_ROUTES);
      return -1;
    }
  }
  memcpy(s->routes, routes, (size_t)nroutes * sizeof routes[0]);
  s->nroutes = nroutes;
  return 0;
}

int mt_spec_route_unusable(const mt_spec *s, const mt_route *r) {
  return s->format == MT_FORMAT_NVFP4 && r->in % 16 != 0;
}

int mt_spec_routes(const mt_spec *s, uint32_t out, uint32_t in) {
  for (int i = 0; i < s->nroutes && i < MT_SPEC_MAX_ROUTES; i++)
    if (s->routes[i].out == out && s->routes[i].in == in)
      return 1;
  return 0;
}

/* ---- canonical form and fingerprint ---------------------------------------------------------- */

typedef struct {
  char *buf;
  size_t size, len;
} appender;

__attribute__((format(printf, 2, 3))) static void append(appender *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int w = a->len < a->size ? vsnprintf(a->buf + a->len, a->size - a->len, fmt, ap)
                           : vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (w > 0)
    a->len += (size_t)w;
}

static const char *knob_text(const mt_spec *s, enum knob k) {
  switch (k) {
  case K_FORMAT:
    return mt_format_name(s->format);
  case K_ACT_SCALE:
    return mt_scale_name(s->act_scale);
  case K_WEIGHT_SCALE:
    return mt_scale_name(s->weight_scale);
  case K_WEIGHT_BLOCK:
    return mt_wblock_name(s->weight_block);
  case K_WEIGHT_CACHE:
    return mt_wcache_name(s->weight_cache);
  default:
    return knobs[k].values[0]; /* one legal value */
  }
}

/* The routes sorted and without duplicates, whatever order the struct holds them in, so that the
 * canonical form of a hand-built spec is canonical too. */
static int sorted_routes(const mt_spec *s, mt_route *routes) {
  int n = 0;
  for (int i = 0; i < s->nroutes && i < MT_SPEC_MAX_ROUTES; i++)
    route_insert(routes, &n, s->routes[i]);
  return n;
}

size_t mt_spec_canonical(const mt_spec *s, char *buf, size_t size) {
  appender a = {buf, buf ? size : 0, 0};
  mt_route routes[MT_SPEC_MAX_ROUTES];
  int last = s->format == MT_FORMAT_BF16 ? K_FORMAT : K_COUNT - 1;
  if (a.size)
    buf[0] = '\0';
  for (int k = K_FORMAT; k <= last; k++)
    append(&a, "%s = %s\n", knobs[k].key, knob_text(s, (enum knob)k));
  int n = sorted_routes(s, routes);
  for (int i = 0; i < n; i++)
    append(&a, "route %ux%u\n", routes[i].out, routes[i].in);
  return a.len;
}

uint64_t mt_spec_fingerprint(const mt_spec *s) {
  char buf[MT_SPEC_CANONICAL_MAX];
  size_t n = mt_spec_canonical(s, buf, sizeof buf);
  uint64_t h = 0xcbf29ce484222325ull;
  if (n >= sizeof buf)
    n = sizeof buf - 1; /* cannot happen: MT_SPEC_CANONICAL_MAX holds the longest spec */
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)buf[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
