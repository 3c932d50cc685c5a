/* parse.c — the spec text: its knobs, the line parser and the whole-spec checks (mt_spec_parse),
 * and MINITE_ROUTE's list syntax (mt_spec_add_routes).
 *
 * The parser reads `len` bytes line by line and never past them; a bad line is reported and
 * skipped so that one run lists every error. It depends on libc only: the fuzz target compiles
 * spec/ alone.
 */
#include "spec/parse.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- knobs ----------------------------------------------------------------------------------- */

const mt_knob_def mt_spec_knobs[MT_KNOB_COUNT] = {
    [MT_KNOB_NAME] = {"name", {NULL}},
    [MT_KNOB_FORMAT] = {"format", {"bf16", "nvfp4"}},
    [MT_KNOB_ELEMENT] = {"element", {"e2m1"}},
    [MT_KNOB_BLOCK] = {"block", {"16"}},
    [MT_KNOB_BLOCK_SCALE] = {"block_scale", {"e4m3"}},
    [MT_KNOB_ACT_SCALE] = {"act_scale", {"row", "tensor"}},
    [MT_KNOB_WEIGHT_SCALE] = {"weight_scale", {"row", "tensor"}},
    [MT_KNOB_WEIGHT_BLOCK] = {"weight_block", {"1x16", "16x16"}},
    [MT_KNOB_ROUNDING] = {"rounding", {"rne"}},
    [MT_KNOB_ACCUMULATE] = {"accumulate", {"fp32"}},
    [MT_KNOB_BACKWARD] = {"backward", {"bf16"}},
};

_Static_assert(MT_FORMAT_BF16 == 0 && MT_FORMAT_NVFP4 == 1, "format values follow the enum");
_Static_assert(MT_SCALE_ROW == 0 && MT_SCALE_TENSOR == 1, "scale values follow the enum");
_Static_assert(MT_WBLOCK_1X16 == 0 && MT_WBLOCK_16X16 == 1, "wblock values follow the enum");

/* ---- errors ---------------------------------------------------------------------------------- */

void mt_spec_add_error(mt_spec_errors *errs, int line, const char *fmt, ...) {
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

#define QUOTE_WORD 40 /* bytes of a quoted word (paths: MT_SPEC_MT_SPEC_QUOTE_PATH) */

static mt_spec_quoted quote_max(const char *p, size_t n, size_t max) {
  mt_spec_quoted q;
  size_t k = n < max ? n : max;
  for (size_t i = 0; i < k; i++)
    q.s[i] = (p[i] >= 0x20 && p[i] < 0x7f) ? p[i] : '?';
  if (n > k)
    memcpy(q.s + k, "...", 3), k += 3;
  q.s[k] = '\0';
  return q;
}

static mt_spec_quoted quote(const char *p, size_t n) { return quote_max(p, n, QUOTE_WORD); }

mt_spec_quoted mt_spec_quote_path(const char *path) {
  return quote_max(path, strlen(path), MT_SPEC_QUOTE_PATH);
}

/* "a", "a or b", "a, b or c": the legal values of a knob, for messages. */
static const char *expected_values(enum mt_knob k, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < MT_KNOB_MAX_VALUES && mt_spec_knobs[k].values[i]; i++) {
    int last = i + 1 == MT_KNOB_MAX_VALUES || !mt_spec_knobs[k].values[i + 1];
    const char *sep = i == 0 ? "" : last ? " or " : ", ";
    int w = snprintf(buf + len, size - len, "%s%s", sep, mt_spec_knobs[k].values[i]);
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

int mt_spec_route_insert(mt_route *routes, int *nroutes, mt_route r) {
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
  int knob_line[MT_KNOB_COUNT]; /* 0 = not given */
  int knob_value
      [MT_KNOB_COUNT]; /* index into mt_spec_knobs[k].values; -1 = given with a bad value */
  char name[MT_SPEC_NAME_MAX];
  int nroutes;
  mt_route routes[MT_SPEC_MAX_ROUTES]; /* in the order given */
  int route_line[MT_SPEC_MAX_ROUTES];
  int too_many_routes;   /* reported once */
  int content_lines;     /* lines holding anything but spaces and comments */
  int weight_cache_line; /* the first "weight_cache = ..." line: ignored (spec.h) */
} parse_state;

static const char known_knobs[] = "name, format, element, block, block_scale, act_scale, "
                                  "weight_scale, weight_block, rounding, accumulate, backward";

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
  for (int k = 0; k < MT_KNOB_COUNT; k++) {
    int d = edit_distance(key, n, mt_spec_knobs[k].key, strlen(mt_spec_knobs[k].key));
    if (d < best_d)
      best_d = d, best = mt_spec_knobs[k].key;
  }
  return best;
}

static void unknown_knob(parse_state *st, int line, const char *key, size_t n) {
  const char *near = closest_knob(key, n);
  if (text_is(key, n, "route"))
    mt_spec_add_error(st->errs, line,
                      "route is not a knob: write \"route OUTxIN ...\" without \"=\"");
  else if (near)
    mt_spec_add_error(st->errs, line, "unknown knob \"%s\" (did you mean \"%s\"? known: %s)",
                      quote(key, n).s, near, known_knobs);
  else
    mt_spec_add_error(st->errs, line, "unknown knob \"%s\" (known: %s)", quote(key, n).s,
                      known_knobs);
}

static int find_knob(const char *key, size_t n) {
  for (int k = 0; k < MT_KNOB_COUNT; k++)
    if (text_is(key, n, mt_spec_knobs[k].key))
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
static int knob_value(parse_state *st, int line, enum mt_knob k, const char *v, size_t n) {
  char expect[64];
  if (k == MT_KNOB_NAME) {
    if (valid_name(v, n))
      return 0;
    mt_spec_add_error(st->errs, line,
                      "name: bad value \"%s\" (expected 1 to %d of A-Z a-z 0-9 . _ -)",
                      quote(v, n).s, MT_SPEC_NAME_MAX - 1);
    return -1;
  }
  for (int i = 0; i < MT_KNOB_MAX_VALUES && mt_spec_knobs[k].values[i]; i++)
    if (text_is(v, n, mt_spec_knobs[k].values[i]))
      return i;
  expected_values(k, expect, sizeof expect);
  if (!n)
    mt_spec_add_error(st->errs, line, "%s: missing value (expected %s)", mt_spec_knobs[k].key,
                      expect);
  else
    mt_spec_add_error(st->errs, line, "%s: bad value \"%s\" (expected %s)", mt_spec_knobs[k].key,
                      quote(v, n).s, expect);
  return -1;
}

static void parse_knob_line(parse_state *st, int line, const char *p, size_t n) {
  const char *eq = memchr(p, '=', n);
  const char *key = p, *val = eq + 1;
  size_t key_len = (size_t)(eq - p), val_len = n - key_len - 1;
  trim(&key, &key_len);
  trim(&val, &val_len);
  if (!key_len) {
    mt_spec_add_error(st->errs, line, "missing knob name before \"=\" (write \"knob = value\")");
    return;
  }
  /* The weight cache mode changes no bit: it is MINITE_WEIGHT_CACHE, a per-process setting, and no
   * knob. A spec file from when it was one keeps parsing; its line is ignored rather than taken as
   * the process's default, so that one place sets the mode and `minite env` shows the mode in
   * force. mt_spec_notice says so. */
  if (text_is(key, key_len, "weight_cache")) {
    if (!st->weight_cache_line)
      st->weight_cache_line = line;
    return;
  }
  int k = find_knob(key, key_len);
  if (k < 0) {
    unknown_knob(st, line, key, key_len);
    return;
  }
  if (st->knob_line[k]) {
    mt_spec_add_error(st->errs, line, "knob \"%s\" given twice (first on line %d): keep one",
                      mt_spec_knobs[k].key, st->knob_line[k]);
    return;
  }
  st->knob_line[k] = line;
  st->knob_value[k] = knob_value(st, line, (enum mt_knob)k, val, val_len);
  if (k == MT_KNOB_NAME && st->knob_value[k] == 0)
    memcpy(st->name, val, val_len), st->name[val_len] = '\0';
}

static void add_parsed_route(parse_state *st, int line, mt_route r) {
  for (int i = 0; i < st->nroutes; i++) {
    if (route_cmp(st->routes[i], r) == 0) {
      mt_spec_add_error(st->errs, line, "route %ux%u listed twice (first on line %d): keep one",
                        r.out, r.in, st->route_line[i]);
      return;
    }
  }
  if (st->nroutes >= MT_SPEC_MAX_ROUTES) {
    if (!st->too_many_routes++)
      mt_spec_add_error(st->errs, line, "too many routes: at most %d (route %ux%u is one more)",
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
      mt_spec_add_error(st->errs, line,
                        "route \"%s\" is not OUTxIN with positive integers (e.g. route 1536x2048)",
                        quote(tok, tok_len).s);
    else
      add_parsed_route(st, line, r);
  }
  if (!shapes)
    mt_spec_add_error(st->errs, line, "route line lists no shape (e.g. route 1536x2048 2048x768)");
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
      mt_spec_add_error(st->errs, line,
                        "NUL or non-text byte 0x%02x at column %zu (a spec is plain text)", c,
                        i + 1);
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
    mt_spec_add_error(st->errs, line,
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
    mt_spec_add_error(st->errs, line,
                      "expected \"knob = value\" or \"route OUTxIN ...\", found \"%s\"",
                      quote(p, n).s);
}

/* ---- whole-spec checks ----------------------------------------------------------------------- */

static void missing_knob(parse_state *st, enum mt_knob k) {
  char expect[64];
  if (!mt_spec_knobs[k].values[1]) {
    mt_spec_add_error(st->errs, 0, "missing required knob \"%s\" (add a line \"%s = %s\")",
                      mt_spec_knobs[k].key, mt_spec_knobs[k].key, mt_spec_knobs[k].values[0]);
    return;
  }
  expected_values(k, expect, sizeof expect);
  mt_spec_add_error(st->errs, 0,
                    "missing required knob \"%s\" (add a line \"%s = VALUE\"; values: %s)",
                    mt_spec_knobs[k].key, mt_spec_knobs[k].key, expect);
}

static void check_bf16(parse_state *st) {
  for (int k = MT_KNOB_FIRST_NVFP4; k < MT_KNOB_COUNT; k++)
    if (st->knob_line[k])
      mt_spec_add_error(
          st->errs, st->knob_line[k],
          "%s is an nvfp4 knob but format = bf16 (line %d): remove it or set format = nvfp4",
          mt_spec_knobs[k].key, st->knob_line[MT_KNOB_FORMAT]);
}

static void check_nvfp4(parse_state *st) {
  for (int k = MT_KNOB_FIRST_NVFP4; k < MT_KNOB_COUNT; k++)
    if (!st->knob_line[k])
      missing_knob(st, (enum mt_knob)k);
  if (st->knob_value[MT_KNOB_WEIGHT_BLOCK] == MT_WBLOCK_16X16 &&
      st->knob_value[MT_KNOB_WEIGHT_SCALE] == MT_SCALE_ROW && st->knob_line[MT_KNOB_WEIGHT_BLOCK] &&
      st->knob_line[MT_KNOB_WEIGHT_SCALE])
    mt_spec_add_error(
        st->errs, st->knob_line[MT_KNOB_WEIGHT_BLOCK],
        "weight_block = 16x16 needs weight_scale = tensor (line %d sets row): a 16x16 tile "
        "spans 16 output rows, so they must share one outer scale",
        st->knob_line[MT_KNOB_WEIGHT_SCALE]);
}

static void check_whole(parse_state *st) {
  if (!st->knob_line[MT_KNOB_FORMAT]) {
    if (!st->content_lines)
      mt_spec_add_error(
          st->errs, 0,
          "empty spec: no \"format\" line (write \"format = nvfp4\" and its knobs, or use a "
          "built-in: bf16, nvfp4-row, nvfp4-tensor)");
    else
      missing_knob(st, MT_KNOB_FORMAT);
    return;
  }
  if (st->knob_value[MT_KNOB_FORMAT] == MT_FORMAT_BF16)
    check_bf16(st);
  else if (st->knob_value[MT_KNOB_FORMAT] == MT_FORMAT_NVFP4)
    check_nvfp4(st);
}

static void fill_spec(const parse_state *st, mt_spec *out) {
  memset(out, 0, sizeof *out);
  memcpy(out->name, st->name, sizeof out->name);
  out->format = (enum mt_format)st->knob_value[MT_KNOB_FORMAT];
  if (out->format == MT_FORMAT_NVFP4) {
    out->act_scale = (enum mt_scale)st->knob_value[MT_KNOB_ACT_SCALE];
    out->weight_scale = (enum mt_scale)st->knob_value[MT_KNOB_WEIGHT_SCALE];
    out->weight_block = (enum mt_wblock)st->knob_value[MT_KNOB_WEIGHT_BLOCK];
  }
  out->weight_cache_line = st->weight_cache_line;
  for (int i = 0; i < st->nroutes; i++)
    mt_spec_route_insert(out->routes, &out->nroutes, st->routes[i]);
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

void mt_spec_reset_errors(mt_spec_errors *errs) {
  errs->n = 0;
  errs->dropped = 0;
}

int mt_spec_parse(const char *text, size_t len, mt_spec *out, mt_spec_errors *errs) {
  mt_spec_errors scratch;
  parse_state st;
  if (!errs)
    errs = &scratch;
  mt_spec_reset_errors(errs);
  memset(&st, 0, sizeof st);
  st.errs = errs;
  if (!text)
    len = 0;
  if (len > MT_SPEC_FILE_MAX) { /* also keeps line numbers far from INT_MAX */
    mt_spec_add_error(errs, 0, "spec text of %zu bytes is larger than %d: not a spec", len,
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

/* ---- routes ---------------------------------------------------------------------------------- */

int mt_spec_add_routes(mt_spec *s, const char *list, mt_spec_errors *errs) {
  mt_spec_errors scratch;
  mt_route routes[MT_SPEC_MAX_ROUTES];
  int nroutes = s->nroutes < 0 ? 0 : s->nroutes;
  const char *tok;
  size_t tok_len, n = list ? strlen(list) : 0;
  if (!errs)
    errs = &scratch;
  mt_spec_reset_errors(errs);
  if (nroutes > MT_SPEC_MAX_ROUTES)
    nroutes = MT_SPEC_MAX_ROUTES;
  memcpy(routes, s->routes, (size_t)nroutes * sizeof routes[0]);
  /* Into a copy first: a bad list leaves the spec as it was. */
  while (next_token(&list, &n, ',', &tok, &tok_len)) {
    mt_route r;
    if (parse_shape(tok, tok_len, &r)) {
      mt_spec_add_error(errs, 0,
                        "MINITE_ROUTE: \"%s\" is not OUTxIN with positive integers (e.g. "
                        "MINITE_ROUTE=1536x2048,2048x768)",
                        quote(tok, tok_len).s);
      return -1;
    }
    if (mt_spec_route_insert(routes, &nroutes, r) < 0) {
      mt_spec_add_error(errs, 0, "MINITE_ROUTE: too many routes (at most %d in all)",
                        MT_SPEC_MAX_ROUTES);
      return -1;
    }
  }
  memcpy(s->routes, routes, (size_t)nroutes * sizeof routes[0]);
  s->nroutes = nroutes;
  return 0;
}
