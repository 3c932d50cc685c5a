/* test_spec.c — the spec parser, built-ins, MINITE_ROUTE lists, canonical form and fingerprint.
 *
 * Every error class is checked for its words and its line number; random bytes are parsed from
 * exact-size heap buffers so that ASan (make test SAN=1) catches any read past `len`.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spec/spec.h"
#include "tests/harness.h"

/* ---- helpers --------------------------------------------------------------------------------- */

/* The knobs of nvfp4-row, one per line, in the documented order. */
static const char *const base_lines[][2] = {
    {"format", "nvfp4"},      {"element", "e2m1"},  {"block", "16"},
    {"block_scale", "e4m3"},  {"act_scale", "row"}, {"weight_scale", "tensor"},
    {"weight_block", "1x16"}, {"rounding", "rne"},  {"accumulate", "fp32"},
    {"backward", "bf16"},
};
#define NBASE ((int)(sizeof base_lines / sizeof base_lines[0]))

/* nvfp4-row's text with `key` set to `value` (value NULL: the line left out). */
static void base_text(char *buf, size_t size, const char *key, const char *value) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < NBASE; i++) {
    const char *v = base_lines[i][1];
    if (key && strcmp(key, base_lines[i][0]) == 0) {
      if (!value)
        continue;
      v = value;
    }
    len += (size_t)snprintf(buf + len, size - len, "%s = %s\n", base_lines[i][0], v);
  }
}

static int parse(const char *text, mt_spec *s, mt_spec_errors *e) {
  return mt_spec_parse(text, strlen(text), s, e);
}

/* 1 when some error is on `line` and its message holds every word given (NULL-terminated). */
static int has_error_v(const mt_spec_errors *e, int line, const char *const *words) {
  for (int i = 0; i < e->n; i++) {
    int all = e->e[i].line == line;
    for (int w = 0; all && words[w]; w++)
      all = strstr(e->e[i].msg, words[w]) != NULL;
    if (all)
      return 1;
  }
  return 0;
}
#define HAS_ERROR(e, line, ...) has_error_v(e, line, (const char *const[]){__VA_ARGS__, NULL})

static void show_errors(const mt_spec_errors *e) {
  for (int i = 0; i < e->n; i++)
    printf("      line %d: %s\n", e->e[i].line, e->e[i].msg);
}

/* Parses `text`, expecting failure with an error on `line` holding the words. */
#define EXPECT_ERROR(text, line, ...)                                                              \
  do {                                                                                             \
    mt_spec s_;                                                                                    \
    mt_spec_errors e_;                                                                             \
    CHECKF(parse(text, &s_, &e_) == -1, "parsed: %s", text);                                       \
    int found_ = HAS_ERROR(&e_, line, __VA_ARGS__);                                                \
    CHECKF(found_, "no error on line %d with %s", line, #__VA_ARGS__);                             \
    if (!found_)                                                                                   \
      show_errors(&e_);                                                                            \
  } while (0)

static const char *canonical(const mt_spec *s, char *buf) {
  mt_spec_canonical(s, buf, MT_SPEC_CANONICAL_MAX);
  return buf;
}

static int same_canonical(const mt_spec *a, const mt_spec *b) {
  char x[MT_SPEC_CANONICAL_MAX], y[MT_SPEC_CANONICAL_MAX];
  return strcmp(canonical(a, x), canonical(b, y)) == 0;
}

static int same_fields(const mt_spec *a, const mt_spec *b) {
  int same = a->format == b->format && a->nroutes == b->nroutes;
  if (a->format == MT_FORMAT_NVFP4)
    same = same && a->act_scale == b->act_scale && a->weight_scale == b->weight_scale &&
           a->weight_block == b->weight_block;
  for (int i = 0; same && i < a->nroutes; i++)
    same = a->routes[i].out == b->routes[i].out && a->routes[i].in == b->routes[i].in;
  return same;
}

/* A file holding `len` bytes of `text`; the caller unlinks it. */
static void temp_file(char path[64], const char *text, size_t len) {
  snprintf(path, 64, "/tmp/mt-test-spec-XXXXXX");
  int fd = mkstemp(path);
  if (fd < 0 || write(fd, text, len) != (ssize_t)len)
    printf("    cannot write %s\n", path);
  if (fd >= 0)
    close(fd);
}

/* ---- built-ins ------------------------------------------------------------------------------- */

static void builtins_parse(void) {
  mt_spec s;
  int count = 0;
  for (int i = 0; mt_spec_builtin_names[i]; i++, count++) {
    const char *name = mt_spec_builtin_names[i];
    CHECKF(mt_spec_builtin(name, &s) == 0, "%s", name);
    CHECKF(strcmp(s.name, name) == 0, "%s has name %s", name, s.name);
    CHECKF(s.nroutes == 0, "%s routes %d shapes", name, s.nroutes);
    CHECK(mt_spec_builtin_about(name) && mt_spec_builtin_about(name)[0]);
    CHECK(mt_spec_builtin_text(name) && strstr(mt_spec_builtin_text(name), "format = "));
  }
  CHECK(count == 3);
  CHECK(mt_spec_builtin("nvfp4", &s) == -1);
  CHECK(mt_spec_builtin(NULL, &s) == -1);
  CHECK(mt_spec_builtin_about("nope") == NULL && mt_spec_builtin_text("nope") == NULL);
}

static void builtin_values(void) {
  mt_spec s;
  CHECK(mt_spec_builtin("bf16", &s) == 0 && s.format == MT_FORMAT_BF16);
  CHECK(mt_spec_builtin("nvfp4-row", &s) == 0 && s.format == MT_FORMAT_NVFP4);
  CHECK(s.act_scale == MT_SCALE_ROW && s.weight_scale == MT_SCALE_TENSOR);
  CHECK(s.weight_block == MT_WBLOCK_1X16 && !s.weight_cache_line);
  CHECK(mt_spec_builtin("nvfp4-tensor", &s) == 0 && s.format == MT_FORMAT_NVFP4);
  CHECK(s.act_scale == MT_SCALE_TENSOR && s.weight_scale == MT_SCALE_TENSOR);
  CHECK(s.weight_block == MT_WBLOCK_1X16 && !s.weight_cache_line);
}

/* Logs of different minite versions are compared by fingerprint: a change of the canonical form
 * must be deliberate, so the built-ins' fingerprints are pinned here. */
static void builtin_fingerprints_pinned(void) {
  static const struct {
    const char *name;
    const char *canonical;
  } cases[] = {
      {"bf16", "format = bf16\n"},
      {"nvfp4-row", "format = nvfp4\nelement = e2m1\nblock = 16\nblock_scale = e4m3\n"
                    "act_scale = row\nweight_scale = tensor\nweight_block = 1x16\nrounding = rne\n"
                    "accumulate = fp32\nbackward = bf16\n"},
      {"nvfp4-tensor", "format = nvfp4\nelement = e2m1\nblock = 16\nblock_scale = e4m3\n"
                       "act_scale = tensor\nweight_scale = tensor\nweight_block = 1x16\n"
                       "rounding = rne\naccumulate = fp32\nbackward = bf16\n"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mt_spec s;
    char buf[MT_SPEC_CANONICAL_MAX];
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64, computed here independently */
    for (const char *p = cases[i].canonical; *p; p++)
      h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    CHECK(mt_spec_builtin(cases[i].name, &s) == 0);
    CHECKF(strcmp(canonical(&s, buf), cases[i].canonical) == 0, "%s:\n%s", cases[i].name, buf);
    CHECKF(mt_spec_fingerprint(&s) == h, "%s", cases[i].name);
  }
  mt_spec s;
  mt_spec_builtin("nvfp4-row", &s);
  CHECK(mt_spec_fingerprint(&s) == 0xa83977ce303a44d9ull);
}

/* ---- every knob and value -------------------------------------------------------------------- */

static void every_knob_value(void) {
  static const struct {
    const char *key, *value;
    size_t offset;
    int expect;
  } cases[] = {
      {"act_scale", "row", offsetof(mt_spec, act_scale), MT_SCALE_ROW},
      {"act_scale", "tensor", offsetof(mt_spec, act_scale), MT_SCALE_TENSOR},
      {"weight_scale", "row", offsetof(mt_spec, weight_scale), MT_SCALE_ROW},
      {"weight_scale", "tensor", offsetof(mt_spec, weight_scale), MT_SCALE_TENSOR},
      {"weight_block", "1x16", offsetof(mt_spec, weight_block), MT_WBLOCK_1X16},
      {"weight_block", "16x16", offsetof(mt_spec, weight_block), MT_WBLOCK_16X16},
      {"format", "nvfp4", offsetof(mt_spec, format), MT_FORMAT_NVFP4},
      {"element", "e2m1", 0, -1},
      {"block", "16", 0, -1},
      {"block_scale", "e4m3", 0, -1},
      {"rounding", "rne", 0, -1},
      {"accumulate", "fp32", 0, -1},
      {"backward", "bf16", 0, -1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[1024];
    mt_spec s;
    mt_spec_errors e;
    base_text(text, sizeof text, cases[i].key, cases[i].value);
    CHECKF(parse(text, &s, &e) == 0, "%s = %s", cases[i].key, cases[i].value);
    if (cases[i].expect >= 0) {
      int got;
      memcpy(&got, (const char *)&s + cases[i].offset, sizeof got);
      CHECKF(got == cases[i].expect, "%s = %s gave %d", cases[i].key, cases[i].value, got);
    }
  }
}

static void bf16_and_name(void) {
  mt_spec s;
  mt_spec_errors e;
  CHECK(parse("format = bf16\n", &s, &e) == 0 && s.format == MT_FORMAT_BF16 && !s.name[0]);
  CHECK(parse("name = My.spec_2-b\nformat = bf16\nroute 8x16\n", &s, &e) == 0);
  CHECK(strcmp(s.name, "My.spec_2-b") == 0 && s.nroutes == 1);
  char text[256];
  snprintf(text, sizeof text, "name = %.63s\nformat = bf16\n",
           "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij");
  CHECK(parse(text, &s, &e) == 0 && strlen(s.name) == 63);
  EXPECT_ERROR("name = abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij1234\n"
               "format = bf16\n",
               1, "name", "bad value");
  EXPECT_ERROR("name = a b\nformat = bf16\n", 1, "name", "bad value", "\"a b\"");
}

static void spacing_comments_crlf_bom(void) {
  mt_spec want, s;
  mt_spec_errors e;
  char text[2048];
  mt_spec_builtin("nvfp4-row", &want);
  const char *const variants[] = {
      "format=nvfp4\nelement=e2m1\nblock=16\nblock_scale=e4m3\nact_scale=row\nweight_scale=tensor\n"
      "weight_block=1x16\nrounding=rne\naccumulate=fp32\nbackward=bf16\nweight_cache=requantize",
      "# a spec\r\n\r\n  format \t=\t nvfp4   # the format\r\nelement = e2m1#x\r\nblock = 16\r\n"
      "block_scale = e4m3\r\n\tact_scale = row # per token \xc3\xa9\r\nweight_scale = tensor\r\n"
      "weight_block = 1x16\r\nrounding = rne\r\naccumulate = fp32\r\nbackward = bf16\r\n"
      "weight_cache = requantize\r\n# end\r\n",
      "\xEF\xBB\xBF"
      "weight_cache = requantize\nbackward = bf16\naccumulate = fp32\nrounding = rne\n"
      "weight_block = 1x16\nweight_scale = tensor\nact_scale = row\nblock_scale = e4m3\n"
      "block = 16\nelement = e2m1\nformat = nvfp4\n\n\n",
  };
  for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
    int ok = parse(variants[i], &s, &e) == 0;
    CHECKF(ok, "variant %zu", i);
    if (!ok)
      show_errors(&e);
    CHECKF(same_fields(&s, &want) && mt_spec_fingerprint(&s) == mt_spec_fingerprint(&want),
           "variant %zu", i);
  }
  base_text(text, sizeof text, NULL, NULL);
  strcat(text, "name = other-name\n");
  CHECK(parse(text, &s, &e) == 0 && mt_spec_fingerprint(&s) == mt_spec_fingerprint(&want));
}

/* ---- error classes --------------------------------------------------------------------------- */

static void error_unknown_knob(void) {
  char text[1024];
  base_text(text, sizeof text, NULL, NULL);
  strcat(text, "act_scal = row\n");
  EXPECT_ERROR(text, 11, "unknown knob", "\"act_scal\"", "act_scale", "backward");
  EXPECT_ERROR("format = bf16\nfrobnicate = 1\n", 2, "unknown knob", "\"frobnicate\"", "known:");
  EXPECT_ERROR("format = bf16\nroute = 1x1\n", 2, "route is not a knob", "without");
  EXPECT_ERROR("format = bf16\n = bf16\n", 2, "missing knob name");
  EXPECT_ERROR("format = bf16\nhello world\n", 2, "expected", "knob = value", "hello world");
}

static void error_bad_value(void) {
  char text[1024];
  base_text(text, sizeof text, "act_scale", "rows");
  EXPECT_ERROR(text, 5, "act_scale", "bad value", "\"rows\"", "row or tensor");
  base_text(text, sizeof text, "act_scale", "");
  EXPECT_ERROR(text, 5, "act_scale", "missing value", "row or tensor");
  base_text(text, sizeof text, "element", "e3m2");
  EXPECT_ERROR(text, 2, "element", "bad value", "expected e2m1");
  base_text(text, sizeof text, "block", "32");
  EXPECT_ERROR(text, 3, "block", "bad value", "expected 16");
  base_text(text, sizeof text, "weight_block", "16x1");
  EXPECT_ERROR(text, 7, "weight_block", "1x16 or 16x16");
  base_text(text, sizeof text, "format", "nvfp8");
  EXPECT_ERROR(text, 1, "format", "bad value", "bf16 or nvfp4");
  base_text(text, sizeof text, "act_scale", "row tensor");
  EXPECT_ERROR(text, 5, "act_scale", "bad value", "\"row tensor\"");
}

/* weight_cache is no knob any more (MINITE_WEIGHT_CACHE, a per-process setting): an older spec's
 * line parses, under either format and whatever its value, changes neither the spec nor its
 * canonical text, and is said by mt_spec_notice (its first line). */
static void weight_cache_line_ignored(void) {
  static const char *const values[] = {"requantize", "frozen", "frozen-sampled", "anything"};
  mt_spec want, s;
  mt_spec_errors e;
  char text[1024], note[256], canon[MT_SPEC_CANONICAL_MAX];
  mt_spec_builtin("nvfp4-row", &want);
  CHECK(!mt_spec_notice(&want, note, sizeof note));
  for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
    base_text(text, sizeof text, NULL, NULL);
    snprintf(text + strlen(text), sizeof text - strlen(text),
             "weight_cache = %s\nweight_cache = frozen\n", values[i]);
    CHECKF(parse(text, &s, &e) == 0, "%s", values[i]);
    CHECKF(same_fields(&s, &want) && mt_spec_fingerprint(&s) == mt_spec_fingerprint(&want), "%s",
           values[i]);
    CHECKF(s.weight_cache_line == 11, "%s: line %d", values[i], s.weight_cache_line);
    CHECK(mt_spec_notice(&s, note, sizeof note) && strstr(note, "MINITE_WEIGHT_CACHE") &&
          strstr(note, "ignored"));
  }
  CHECK(parse("format = bf16\nweight_cache = frozen\n", &s, &e) == 0 && s.weight_cache_line == 2);
  CHECK(!strstr(canonical(&s, canon), "weight_cache"));
}

static void error_duplicate_knob(void) {
  char text[1024];
  base_text(text, sizeof text, NULL, NULL);
  strcat(text, "act_scale = row\n");
  EXPECT_ERROR(text, 11, "\"act_scale\"", "given twice", "first on line 5");
  EXPECT_ERROR("format = bf16\n# c\nformat = bf16\n", 3, "\"format\"", "given twice",
               "first on line 1");
}

static void error_missing_knob(void) {
  for (int i = 1; i < NBASE; i++) {
    char text[1024];
    base_text(text, sizeof text, base_lines[i][0], NULL);
    EXPECT_ERROR(text, 0, "missing required knob", base_lines[i][0], "add a line");
  }
  EXPECT_ERROR("act_scale = row\n", 0, "missing required knob \"format\"");
  EXPECT_ERROR("route 8x16\n", 0, "missing required knob \"format\"");
}

static void error_route_syntax(void) {
  static const char *const bad[] = {"1536x",       "x2048",     "0x16",      "16x0",
                                    "12x-3",       "axb",       "1536X2048", "4294967296x1",
                                    "1536x2048x3", "1536*2048", "+5x5",      "1536"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[256], quoted[64];
    snprintf(text, sizeof text, "format = bf16\n\nroute 8x16 %s\n", bad[i]);
    snprintf(quoted, sizeof quoted, "\"%s\"", bad[i]);
    EXPECT_ERROR(text, 3, "route", quoted, "not OUTxIN", "e.g. route 1536x2048");
  }
  mt_spec s;
  mt_spec_errors e;
  CHECK(parse("format = bf16\nroute 4294967295x1 007x8\n", &s, &e) == 0);
  CHECK(s.nroutes == 2 && s.routes[0].out == 7 && s.routes[1].out == 4294967295u);
  EXPECT_ERROR("format = bf16\nroute\n", 2, "no shape");
  EXPECT_ERROR("format = bf16\nroute   # nothing\n", 2, "no shape");
  EXPECT_ERROR("format = bf16\nroutes 8x16\n", 2, "expected");
}

static void error_route_duplicate_and_count(void) {
  EXPECT_ERROR("format = bf16\nroute 1536x2048 2048x768\n\nroute 1536x2048\n", 4,
               "route 1536x2048 listed twice", "first on line 2");
  char text[4096];
  size_t len = (size_t)snprintf(text, sizeof text, "format = bf16\n");
  for (int i = 1; i <= MT_SPEC_MAX_ROUTES; i++)
    len += (size_t)snprintf(text + len, sizeof text - len, "route %dx%d\n", i, 100 - i);
  mt_spec s;
  mt_spec_errors e;
  CHECK(parse(text, &s, &e) == 0 && s.nroutes == MT_SPEC_MAX_ROUTES);
  for (int i = 1; i < s.nroutes; i++)
    CHECK(s.routes[i - 1].out < s.routes[i].out);
  snprintf(text + len, sizeof text - len, "route 7777x7777 8888x8888\n");
  EXPECT_ERROR(text, MT_SPEC_MAX_ROUTES + 2, "too many routes", "64");
  CHECK(parse(text, &s, &e) == -1 && e.n == 1); /* reported once, not once per extra route */
}

static void error_cross_knob(void) {
  char text[1024];
  base_text(text, sizeof text, "weight_block", "16x16");
  mt_spec s;
  mt_spec_errors e;
  CHECK(parse(text, &s, &e) == 0 && s.weight_block == MT_WBLOCK_16X16);
  base_text(text, sizeof text, "weight_scale", "row");
  CHECK(parse(text, &s, &e) == 0 && s.weight_scale == MT_SCALE_ROW);
  strcat(text, "weight_block = 16x16\n");
  char *line7 = strstr(text, "weight_block = 1x16\n");
  memmove(line7, line7 + 20, strlen(line7 + 20) + 1); /* drop the 1x16 line: 16x16 is line 10 */
  EXPECT_ERROR(text, 10, "weight_block = 16x16 needs weight_scale = tensor", "line 6");
  EXPECT_ERROR("format = bf16\nname = x\nact_scale = row\n", 3, "act_scale", "nvfp4 knob",
               "format = bf16", "remove it");
  CHECK(parse("format = bf16\nact_scale = row\nfoo\nbar = 1\n", &s, &e) == -1 && e.n == 3);
  CHECK(e.e[0].line == 2 && e.e[1].line == 3 && e.e[2].line == 4); /* in line order */
  for (int i = 1; i < NBASE; i++) {
    snprintf(text, sizeof text, "format = bf16\n%s = %s\n", base_lines[i][0], base_lines[i][1]);
    EXPECT_ERROR(text, 2, base_lines[i][0], "nvfp4 knob");
  }
}

static void error_empty(void) {
  EXPECT_ERROR("", 0, "empty spec", "format");
  EXPECT_ERROR("\n\n   \n# only a comment\r\n\t\n", 0, "empty spec", "format");
  mt_spec s;
  mt_spec_errors e;
  CHECK(mt_spec_parse(NULL, 0, &s, &e) == -1 && HAS_ERROR(&e, 0, "empty spec"));
  CHECK(mt_spec_parse("format = bf16", 0, &s, &e) == -1 && HAS_ERROR(&e, 0, "empty spec"));
}

static void error_long_line(void) {
  char text[4096];
  size_t len = (size_t)snprintf(text, sizeof text, "format = bf16\n#");
  memset(text + len, 'a', MT_SPEC_LINE_MAX - 1); /* a comment line of exactly the limit */
  len += MT_SPEC_LINE_MAX - 1;
  memcpy(text + len, "\n", 2);
  mt_spec s;
  mt_spec_errors e;
  CHECK(parse(text, &s, &e) == 0);
  memcpy(text + len, "a\n", 3); /* one byte more */
  EXPECT_ERROR(text, 2, "line longer than 1024 bytes");
  memcpy(text + len, "\r\n", 3); /* a CR ending the line is not counted */
  CHECK(parse(text, &s, &e) == 0);
}

static void error_non_text(void) {
  static const char with_nul[] = "format = bf16\nact\0_scale = row\n";
  mt_spec s;
  mt_spec_errors e;
  CHECK(mt_spec_parse(with_nul, sizeof with_nul - 1, &s, &e) == -1);
  CHECK(HAS_ERROR(&e, 2, "non-text byte 0x00", "column 4"));
  EXPECT_ERROR("format = bf16\nroute 8x16\x7f\n", 2, "0x7f", "column 11");
  EXPECT_ERROR("format = bf16\nroute \xc3\xa9\n", 2, "0xc3", "column 7");
  EXPECT_ERROR("format = bf16\nroute 8x16\r5x5\n", 2, "0x0d", "column 11");
}

static void error_count_capped(void) {
  char text[4096];
  size_t len = 0;
  for (int i = 0; i < 40; i++)
    len += (size_t)snprintf(text + len, sizeof text - len, "bad%d = 1\n", i);
  mt_spec s;
  mt_spec_errors e;
  CHECK(parse(text, &s, &e) == -1);
  CHECK(e.n == MT_SPEC_MAX_ERRORS && e.dropped == 40 + 1 - MT_SPEC_MAX_ERRORS);
  CHECK(e.e[0].line == 1 && e.e[MT_SPEC_MAX_ERRORS - 1].line == MT_SPEC_MAX_ERRORS);
}

static void failure_leaves_output(void) {
  mt_spec s;
  mt_spec_builtin("nvfp4-tensor", &s);
  uint64_t before = mt_spec_fingerprint(&s);
  CHECK(parse("format = bf16\nact_scale = row\n", &s, NULL) == -1);
  CHECK(mt_spec_fingerprint(&s) == before && strcmp(s.name, "nvfp4-tensor") == 0);
  CHECK(parse("format = bf16\n", NULL, NULL) == 0);
}

/* ---- files and names ------------------------------------------------------------------------- */

static void files(void) {
  char path[64];
  mt_spec s;
  mt_spec_errors e;
  const char *text = "name = from-file\r\nformat = bf16\r\nroute 2048x768\r\n";
  temp_file(path, text, strlen(text));
  CHECK(mt_spec_parse_file(path, &s, &e) == 0 && strcmp(s.name, "from-file") == 0);
  CHECK(mt_spec_load(path, &s, &e) == 0 && s.nroutes == 1);
  unlink(path);
  CHECK(mt_spec_parse_file(path, &s, &e) == -1 && HAS_ERROR(&e, 0, "file not found", path));
  CHECK(mt_spec_load(path, &s, &e) == -1 && e.n == 1 && HAS_ERROR(&e, 0, "file not found", path));
  CHECK(mt_spec_load("nvfp4-rwo", &s, &e) == MT_SPEC_UNKNOWN_NAME && e.n == 1);
  CHECK(HAS_ERROR(&e, 0, "neither a built-in spec (bf16, nvfp4-row, nvfp4-tensor) nor a file"));
  CHECK(mt_spec_parse_file("/tmp", &s, &e) == -1 &&
        HAS_ERROR(&e, 0, "/tmp is a directory, not a spec file", "regular file"));
  CHECK(mt_spec_parse_file("", &s, &e) == -1 && e.n == 1);
  CHECK(mt_spec_load(NULL, &s, &e) == -1 && e.n == 1);
  CHECK(mt_spec_load("nvfp4-tensor", &s, &e) == 0 && e.n == 0 && s.act_scale == MT_SCALE_TENSOR);
}

static void file_too_large(void) {
  size_t len = MT_SPEC_FILE_MAX + 1;
  char *text = malloc(len), path[64];
  memset(text, '\n', len);
  memcpy(text, "format = bf16", 13);
  temp_file(path, text, len);
  mt_spec s;
  mt_spec_errors e;
  CHECK(mt_spec_parse_file(path, &s, &e) == -1 && HAS_ERROR(&e, 0, "larger than"));
  CHECK(mt_spec_parse(text, len, &s, &e) == -1 && HAS_ERROR(&e, 0, "larger than"));
  CHECK(mt_spec_parse(text, len - 1, &s, &e) == 0); /* the limit itself is fine */
  unlink(path);
  free(text);
}

static void enum_names(void) {
  CHECK(strcmp(mt_format_name(MT_FORMAT_BF16), "bf16") == 0);
  CHECK(strcmp(mt_format_name(MT_FORMAT_NVFP4), "nvfp4") == 0);
  CHECK(strcmp(mt_scale_name(MT_SCALE_ROW), "row") == 0);
  CHECK(strcmp(mt_scale_name(MT_SCALE_TENSOR), "tensor") == 0);
  CHECK(strcmp(mt_wblock_name(MT_WBLOCK_1X16), "1x16") == 0);
  CHECK(strcmp(mt_wblock_name(MT_WBLOCK_16X16), "16x16") == 0);
  CHECK(strcmp(mt_scale_name((enum mt_scale)7), "invalid") == 0);
}

/* ---- MINITE_ROUTE ---------------------------------------------------------------------------- */

static void add_routes(void) {
  mt_spec s, before;
  mt_spec_errors e;
  mt_spec_builtin("nvfp4-row", &s);
  CHECK(mt_spec_add_routes(&s, NULL, &e) == 0 && s.nroutes == 0);
  CHECK(mt_spec_add_routes(&s, "", &e) == 0 && s.nroutes == 0);
  CHECK(mt_spec_add_routes(&s, " ,, ", &e) == 0 && s.nroutes == 0);
  CHECK(mt_spec_add_routes(&s, "2048x768,1536x2048", &e) == 0 && s.nroutes == 2);
  CHECK(s.routes[0].out == 1536 && s.routes[1].out == 2048); /* kept sorted */
  CHECK(mt_spec_add_routes(&s, " 1536x2048 , 2048x768\t4x8 ", &e) == 0 && s.nroutes == 3);
  CHECK(mt_spec_routes(&s, 1536, 2048) && mt_spec_routes(&s, 2048, 768) &&
        mt_spec_routes(&s, 4, 8));
  CHECK(!mt_spec_routes(&s, 2048, 1536) && !mt_spec_routes(&s, 768, 2048));
  before = s;
  CHECK(mt_spec_add_routes(&s, "16x16,1536x,32x32", &e) == -1 && e.n == 1);
  CHECK(HAS_ERROR(&e, 0, "MINITE_ROUTE", "\"1536x\"", "OUTxIN"));
  CHECK(same_fields(&s, &before)); /* a bad list changes nothing */
  char list[2048];
  size_t len = 0;
  for (int i = 1; i <= MT_SPEC_MAX_ROUTES; i++)
    len += (size_t)snprintf(list + len, sizeof list - len, "%dx1,", 100 + i);
  CHECK(mt_spec_add_routes(&s, list, &e) == -1 && HAS_ERROR(&e, 0, "too many routes"));
  CHECK(same_fields(&s, &before));
}

static void add_routes_matches_route_lines(void) {
  mt_spec a, b;
  mt_spec_errors e;
  mt_spec_builtin("bf16", &a);
  mt_spec_add_routes(&a, "1536x2048,2048x768", &e);
  CHECK(parse("name = bf16\nformat = bf16\nroute 2048x768 1536x2048\n", &b, &e) == 0);
  CHECK(same_fields(&a, &b) && mt_spec_fingerprint(&a) == mt_spec_fingerprint(&b));
}

/* ---- canonical form and fingerprint ---------------------------------------------------------- */

/* Every valid knob combination (6 nvfp4 and bf16) times a few route sets. */
#define NVARIANTS (7 * 4)
static void variant(int i, mt_spec *s) {
  static const char *const route_sets[] = {"", "1536x2048", "2048x768", "2048x768,1536x2048"};
  static const struct {
    enum mt_scale scale;
    enum mt_wblock block;
  } weight[3] = {{MT_SCALE_ROW, MT_WBLOCK_1X16},
                 {MT_SCALE_TENSOR, MT_WBLOCK_1X16},
                 {MT_SCALE_TENSOR, MT_WBLOCK_16X16}}; /* 16x16 blocks need a tensor scale */
  int combo = i / 4;
  if (combo == 6) {
    mt_spec_builtin("bf16", s);
  } else {
    mt_spec_builtin("nvfp4-row", s);
    s->act_scale = (combo & 1) ? MT_SCALE_TENSOR : MT_SCALE_ROW;
    s->weight_scale = weight[combo >> 1].scale;
    s->weight_block = weight[combo >> 1].block;
  }
  mt_spec_add_routes(s, route_sets[i % 4], NULL);
}

static void fingerprints_distinct(void) {
  uint64_t fp[NVARIANTS];
  int collisions = 0, variants_differ = 1;
  for (int i = 0; i < NVARIANTS; i++) {
    mt_spec s;
    variant(i, &s);
    fp[i] = mt_spec_fingerprint(&s);
    for (int j = 0; j < i; j++) {
      mt_spec t;
      variant(j, &t);
      variants_differ &= !same_canonical(&s, &t);
      collisions += fp[i] == fp[j];
    }
  }
  CHECKF(variants_differ, "the test's variants are not all distinct");
  CHECK(collisions == 0);
}

static void fingerprint_sensitive_to_each_change(void) {
  mt_spec base, s;
  mt_spec_builtin("nvfp4-row", &base);
  mt_spec_add_routes(&base, "1536x2048,2048x768", NULL);
  uint64_t fp = mt_spec_fingerprint(&base);
  s = base, s.act_scale = MT_SCALE_TENSOR;
  CHECK(mt_spec_fingerprint(&s) != fp);
  s = base, s.weight_scale = MT_SCALE_ROW;
  CHECK(mt_spec_fingerprint(&s) != fp);
  s = base, s.weight_block = MT_WBLOCK_16X16;
  CHECK(mt_spec_fingerprint(&s) != fp);
  s = base, s.format = MT_FORMAT_BF16;
  CHECK(mt_spec_fingerprint(&s) != fp);
  for (int i = 0; i < base.nroutes; i++) { /* remove each route */
    s = base;
    s.routes[i] = s.routes[s.nroutes - 1];
    s.nroutes--;
    CHECK(mt_spec_fingerprint(&s) != fp);
  }
  s = base;
  mt_spec_add_routes(&s, "2048x769", NULL);
  CHECK(mt_spec_fingerprint(&s) != fp);
  s = base, s.routes[0].in++;
  CHECK(mt_spec_fingerprint(&s) != fp);
  s = base, snprintf(s.name, sizeof s.name, "renamed");
  CHECK(mt_spec_fingerprint(&s) == fp);
}

/* A hand-built spec with routes out of order and repeated has the same canonical form. */
static void canonical_of_unsorted_routes(void) {
  mt_spec a, b;
  mt_spec_builtin("bf16", &a);
  b = a;
  mt_spec_add_routes(&a, "8x16,32x4", NULL);
  b.nroutes = 3;
  b.routes[0] = (mt_route){32, 4};
  b.routes[1] = (mt_route){8, 16};
  b.routes[2] = (mt_route){32, 4};
  CHECK(same_canonical(&a, &b) && mt_spec_fingerprint(&a) == mt_spec_fingerprint(&b));
}

static void canonical_round_trip(void) {
  for (int i = 0; i < NVARIANTS; i++) {
    mt_spec s, back;
    mt_spec_errors e;
    char text[MT_SPEC_CANONICAL_MAX], again[MT_SPEC_CANONICAL_MAX];
    variant(i, &s);
    size_t n = mt_spec_canonical(&s, text, sizeof text);
    CHECK(n == strlen(text) && n > 0 && text[n - 1] == '\n');
    CHECKF(mt_spec_parse(text, n, &back, &e) == 0, "variant %d", i);
    CHECKF(same_fields(&s, &back), "variant %d", i);
    CHECK(strcmp(canonical(&back, again), text) == 0);
    CHECK(mt_spec_fingerprint(&back) == mt_spec_fingerprint(&s));
  }
}

static void canonical_snprintf_semantics(void) {
  mt_spec s;
  char full[MT_SPEC_CANONICAL_MAX], small[20];
  mt_spec_builtin("nvfp4-row", &s);
  size_t n = mt_spec_canonical(&s, full, sizeof full);
  CHECK(mt_spec_canonical(&s, NULL, 0) == n);
  CHECK(mt_spec_canonical(&s, small, sizeof small) == n);
  CHECK(strlen(small) == sizeof small - 1 && strncmp(small, full, sizeof small - 1) == 0);
  /* the longest spec fits */
  mt_spec_builtin("nvfp4-row", &s);
  s.nroutes = MT_SPEC_MAX_ROUTES;
  for (int i = 0; i < MT_SPEC_MAX_ROUTES; i++)
    s.routes[i] = (mt_route){4294967295u - (uint32_t)i, 4294967295u};
  CHECK(mt_spec_canonical(&s, NULL, 0) < MT_SPEC_CANONICAL_MAX);
}

/* ---- random input ---------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng_state >> 33);
}

/* A valid spec in random line order, spacing, values, comments and routes. */
static size_t random_valid_spec(char *buf, size_t max) {
  static const char *const spaces[] = {"", " ", "\t", "   "};
  static const char *const ends[] = {"\n", "\r\n", " # note\n", "\t#\n"};
  char lines[NBASE + 4][64];
  int n = 0, bf16 = rng() % 4 == 0;
  for (int i = 0; i < (bf16 ? 1 : NBASE); i++) {
    const char *v = i == 0 && bf16 ? "bf16" : base_lines[i][1];
    if (strcmp(base_lines[i][0], "act_scale") == 0)
      v = rng() % 2 ? v : "tensor";
    snprintf(lines[n++], sizeof lines[0], "%s%s%s=%s%s%s", spaces[rng() % 4], base_lines[i][0],
             spaces[rng() % 4], spaces[rng() % 4], v, ends[rng() % 4]);
  }
  for (int r = rng() % 4; r > 0; r--)
    snprintf(lines[n++], sizeof lines[0], "route %ux%u %ux%u\n", 1 + rng() % 4, 1 + rng() % 4,
             5 + rng() % 4, 1 + rng() % 4);
  size_t len = 0;
  for (int left = n; left > 0; left--) { /* lines in random order */
    int pick = (int)(rng() % (uint32_t)left);
    size_t l = strlen(lines[pick]);
    if (len + l <= max)
      memcpy(buf + len, lines[pick], l), len += l;
    memcpy(lines[pick], lines[left - 1], sizeof lines[0]);
  }
  return len;
}

/* Random bytes, random spec-like words, or a valid spec with one byte changed or not, so that the
 * byte checks, the grammar and the round trip of a good parse are all reached. */
static size_t random_input(char *buf, size_t max) {
  static const char *const words[] = {
      "format", "nvfp4",        "bf16",      "=",         " ",    "\n",     "\r\n",
      "#",      "route",        "1536x2048", "act_scale", "row",  "tensor", "weight_block",
      "16x16",  "weight_scale", "x",         "0",         "name", "\t",     "e2m1"};
  size_t len = rng() % max;
  switch (rng() % 3) {
  case 0:
    for (size_t i = 0; i < len; i++)
      buf[i] = rng() % 4 ? (char)(rng() & 0xff) : "\n =x#"[rng() % 5];
    return len;
  case 1:
    len = random_valid_spec(buf, max);
    if (len && rng() % 2)
      buf[rng() % len] = (char)(rng() & 0xff);
    return len;
  }
  size_t n = 0;
  while (n < len) {
    const char *w = words[rng() % (sizeof words / sizeof words[0])];
    size_t wl = strlen(w);
    if (n + wl > len)
      break;
    memcpy(buf + n, w, wl), n += wl;
  }
  return n;
}

static int message_ok(const mt_spec_error *err, int nlines) {
  size_t len = strnlen(err->msg, sizeof err->msg);
  int ok = len > 0 && len < sizeof err->msg && err->line >= 0 && err->line <= nlines;
  for (size_t i = 0; ok && i < len; i++)
    ok = err->msg[i] >= 0x20 && err->msg[i] < 0x7f;
  return ok;
}

/* 1 when the text parsed. */
static int check_random_result(const char *text, size_t len) {
  mt_spec s, back;
  mt_spec_errors e;
  int nlines = 1;
  for (size_t i = 0; i < len; i++)
    nlines += text[i] == '\n';
  if (mt_spec_parse(text, len, &s, &e) == 0) {
    char canon[MT_SPEC_CANONICAL_MAX];
    size_t n = mt_spec_canonical(&s, canon, sizeof canon);
    CHECK(mt_spec_parse(canon, n, &back, NULL) == 0 && same_fields(&s, &back));
    return 1;
  }
  CHECK(e.n >= 1 && e.n <= MT_SPEC_MAX_ERRORS && e.dropped >= 0);
  for (int i = 0; i < e.n; i++)
    CHECKF(message_ok(&e.e[i], nlines), "line %d: %s", e.e[i].line, e.e[i].msg);
  return 0;
}

static void random_garbage(void) {
  enum { ROUNDS = 4000, MAXLEN = 700 };
  char src[MAXLEN];
  int parsed = 0;
  for (int round = 0; round < ROUNDS; round++) {
    size_t len = random_input(src, MAXLEN);
    char *text = malloc(len ? len : 1); /* exact size: ASan sees any read past len */
    memcpy(text, src, len);
    parsed += check_random_result(text, len);
    free(text);
  }
  CHECKF(parsed > ROUNDS / 10 && parsed < ROUNDS / 2, "%d of %d parsed", parsed, ROUNDS);
}

int main(void) {
  RUN(builtins_parse);
  RUN(builtin_values);
  RUN(builtin_fingerprints_pinned);
  RUN(every_knob_value);
  RUN(bf16_and_name);
  RUN(spacing_comments_crlf_bom);
  RUN(error_unknown_knob);
  RUN(error_bad_value);
  RUN(error_duplicate_knob);
  RUN(weight_cache_line_ignored);
  RUN(error_missing_knob);
  RUN(error_route_syntax);
  RUN(error_route_duplicate_and_count);
  RUN(error_cross_knob);
  RUN(error_empty);
  RUN(error_long_line);
  RUN(error_non_text);
  RUN(error_count_capped);
  RUN(failure_leaves_output);
  RUN(files);
  RUN(file_too_large);
  RUN(enum_names);
  RUN(add_routes);
  RUN(add_routes_matches_route_lines);
  RUN(fingerprints_distinct);
  RUN(fingerprint_sensitive_to_each_change);
  RUN(canonical_of_unsorted_routes);
  RUN(canonical_round_trip);
  RUN(canonical_snprintf_semantics);
  RUN(random_garbage);
  return mt_test_done();
}
