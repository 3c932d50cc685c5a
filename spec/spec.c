/* spec.c — the execution spec around its text (spec/parse.c): spec files, the built-ins, names,
 * routes, the canonical form and the fingerprint.
 *
 * The built-ins are spec text run through the same parser, so a built-in can never mean something
 * the format cannot say. Like the parser, this file depends on libc only (base/files.h's
 * mt_file_kind is inline).
 */
#include "spec/spec.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/files.h"
#include "spec/parse.h"

/* ---- names ----------------------------------------------------------------------------------- */

static const char *value_name(enum mt_knob k, unsigned v) {
  if (v < MT_KNOB_MAX_VALUES && mt_spec_knobs[k].values[v])
    return mt_spec_knobs[k].values[v];
  return "invalid";
}

const char *mt_format_name(enum mt_format f) { return value_name(MT_KNOB_FORMAT, (unsigned)f); }
const char *mt_scale_name(enum mt_scale s) { return value_name(MT_KNOB_ACT_SCALE, (unsigned)s); }
const char *mt_wblock_name(enum mt_wblock b) {
  return value_name(MT_KNOB_WEIGHT_BLOCK, (unsigned)b);
}

/* ---- files and names ------------------------------------------------------------------------- */

/* Opened without blocking (a FIFO with no writer would block the open) and refused unless it is
 * a regular file: a FIFO would hang the program, /dev/stdin would eat its input, and /dev/zero
 * would never end. */
static int open_regular(const char *path, mt_spec_errors *errs) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int saved = errno;
    if (saved == ENOENT)
      mt_spec_add_error(errs, 0, "file not found: %s", mt_spec_quote_path(path).s);
    else
      mt_spec_add_error(errs, 0, "cannot open %s: %s", mt_spec_quote_path(path).s, strerror(saved));
    return -1;
  }
  struct stat st = {0};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    mt_spec_add_error(errs, 0,
                      "%s is %s, not a spec file: give the path of a regular file (save a spec "
                      "that comes from a pipe to a file first)",
                      mt_spec_quote_path(path).s, mt_file_kind(st.st_mode));
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
      mt_spec_add_error(errs, 0, "cannot read %s: out of memory", mt_spec_quote_path(path).s);
    else if (failed)
      mt_spec_add_error(errs, 0, "cannot read %s: %s", mt_spec_quote_path(path).s, strerror(saved));
    else
      mt_spec_add_error(errs, 0, "%s is larger than %d bytes: not a spec file",
                        mt_spec_quote_path(path).s, MT_SPEC_FILE_MAX);
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
  mt_spec_reset_errors(errs);
  if (!path || !path[0]) {
    mt_spec_add_error(errs, 0, "no spec file given");
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
  "backward = bf16\n"

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

/* The one error of a bare word that names no built-in and no file: most likely a built-in's name
 * misspelled, so the built-ins are listed. */
static void unknown_name(mt_spec_errors *errs) {
  char names[256];
  size_t used = 0;
  names[0] = '\0';
  for (int i = 0; i < NBUILTINS && used < sizeof names; i++)
    used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                             builtins[i].name);
  mt_spec_reset_errors(errs);
  mt_spec_add_error(errs, 0,
                    "neither a built-in spec (%s) nor a file: give a built-in name or the path of "
                    "a spec file",
                    names);
}

int mt_spec_load(const char *name_or_path, mt_spec *out, mt_spec_errors *errs) {
  mt_spec_errors scratch;
  if (!errs)
    errs = &scratch;
  if (find_builtin(name_or_path)) {
    mt_spec_reset_errors(errs);
    return mt_spec_builtin(name_or_path, out);
  }
  int rc = mt_spec_parse_file(name_or_path, out, errs);
  if (rc && name_or_path && !strchr(name_or_path, '/') && errs->n == 1 && errs->e[0].line == 0 &&
      strncmp(errs->e[0].msg, "file not found", 14) == 0) {
    unknown_name(errs);
    return MT_SPEC_UNKNOWN_NAME;
  }
  return rc;
}

const char *mt_spec_notice(const mt_spec *s, char *text, size_t size) {
  if (!s->weight_cache_line)
    return NULL;
  snprintf(text, size,
           "weight_cache is no part of the spec any more (it changes no bit): it is "
           "MINITE_WEIGHT_CACHE, a per-process setting; this line is ignored");
  return text;
}

const char *mt_spec_route_unusable(const mt_spec *s, const mt_route *r, char *text, size_t size) {
  if (s->format != MT_FORMAT_NVFP4)
    return NULL;
  if (r->in % 16)
    snprintf(text, size, "its in-dimension %u is not a multiple of 16 (the NVFP4 block)",
             (unsigned)r->in);
  else if (s->weight_block == MT_WBLOCK_16X16 && r->out % 16)
    snprintf(text, size,
             "its out-dimension %u is not a multiple of 16 (weight_block = 16x16 tiles it)",
             (unsigned)r->out);
  else
    return NULL;
  return text;
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

static const char *knob_text(const mt_spec *s, enum mt_knob k) {
  switch (k) {
  case MT_KNOB_FORMAT:
    return mt_format_name(s->format);
  case MT_KNOB_ACT_SCALE:
    return mt_scale_name(s->act_scale);
  case MT_KNOB_WEIGHT_SCALE:
    return mt_scale_name(s->weight_scale);
  case MT_KNOB_WEIGHT_BLOCK:
    return mt_wblock_name(s->weight_block);
  default:
    return mt_spec_knobs[k].values[0]; /* one legal value */
  }
}

/* The routes sorted and without duplicates, whatever order the struct holds them in, so that the
 * canonical form of a hand-built spec is canonical too. */
static int sorted_routes(const mt_spec *s, mt_route *routes) {
  int n = 0;
  for (int i = 0; i < s->nroutes && i < MT_SPEC_MAX_ROUTES; i++)
    mt_spec_route_insert(routes, &n, s->routes[i]);
  return n;
}

size_t mt_spec_canonical(const mt_spec *s, char *buf, size_t size) {
  appender a = {buf, buf ? size : 0, 0};
  mt_route routes[MT_SPEC_MAX_ROUTES];
  int last = s->format == MT_FORMAT_BF16 ? MT_KNOB_FORMAT : MT_KNOB_COUNT - 1;
  if (a.size)
    buf[0] = '\0';
  for (int k = MT_KNOB_FORMAT; k <= last; k++)
    append(&a, "%s = %s\n", mt_spec_knobs[k].key, knob_text(s, (enum mt_knob)k));
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
