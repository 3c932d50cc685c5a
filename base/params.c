/* params.c — reading the MINITE_* variables of base/params.def once, echoing non-defaults,
 * rejecting bad values: every variable through the same few readers, from the one table. */
#include "base/params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/files.h"
#include "base/log.h"
#include "base/proc.h"

const char *const mt_wcache_names[] = {"requantize", "frozen", "frozen-sampled", NULL};
const char *const mt_capture_names[] = {"off", "graph", NULL};
const char *const mt_wlayout_names[] = {"auto", "out-in", "in-out", NULL};
const char *const mt_digest_calls_names[] = {"sampled", "all", NULL};

/* A boolean's words, false then true: a word's index modulo 2 is its value. */
static const char *const bool_words[] = {"0", "1", "false", "true", "no", "yes", "off", "on", NULL};

const mt_param_def mt_param_defs[MT_P_NUM] = {
#define MT_PARAM_STR(N, f, u, m)                                                                   \
  [MT_P_##N] = {.name = #N, .kind = MT_PARAM_KIND_STR, .text = u, .meaning = m},
#define MT_PARAM_PATH(N, f, u, m)                                                                  \
  [MT_P_##N] = {.name = #N, .kind = MT_PARAM_KIND_PATH, .text = u, .meaning = m},
#define MT_PARAM_CHOICE(N, f, T, names, d, m)                                                      \
  [MT_P_##N] = {.name = #N, .kind = MT_PARAM_KIND_CHOICE, .choices = names, .def = d, .meaning = m},
#define MT_PARAM_BOOL(N, f, d, m)                                                                  \
  [MT_P_##N] = {                                                                                   \
      .name = #N, .kind = MT_PARAM_KIND_BOOL, .choices = bool_words, .def = d, .meaning = m},
#define MT_PARAM_RATE(N, f, d, m)                                                                  \
  [MT_P_##N] = {.name = #N, .kind = MT_PARAM_KIND_RATE, .text = d, .meaning = m},
#define MT_PARAM_COUNT(N, f, d, lo, hi, u, m)                                                      \
  [MT_P_##N] = {.name = #N,                                                                        \
                .kind = MT_PARAM_KIND_COUNT,                                                       \
                .def = d,                                                                          \
                .min = lo,                                                                         \
                .max = hi,                                                                         \
                .unit = u,                                                                         \
                .meaning = m},
#include "base/params.def"
};

/* ---- parsing: a value's text to its value, -1 (or ULLONG_MAX) when it is invalid ------------ */

/* The index of v among the NULL-terminated words, ignoring case; -1 when it is none of them. */
static int word_index(const char *const words[], const char *v) {
  for (int i = 0; words[i]; i++)
    if (strcasecmp(v, words[i]) == 0)
      return i;
  return -1;
}

/* A choice's index, a boolean's 0 or 1; -1 when invalid. */
static int parse_choice(const mt_param_def *d, const char *v) {
  int i = word_index(d->choices, v);
  return i >= 0 && d->kind == MT_PARAM_KIND_BOOL ? i % 2 : i;
}

/* "N/D" or a decimal, nothing after it; -1 when it is neither or outside [0, 1]. */
static double parse_rate(const char *v) {
  char *end;
  double r = strtod(v, &end);
  if (end == v)
    return -1;
  if (*end == '/') {
    const char *den = end + 1;
    double dn = strtod(den, &end);
    if (end == den || !(dn > 0))
      return -1;
    r /= dn;
  }
  if (*end || !(r >= 0 && r <= 1))
    return -1;
  return r;
}

/* Decimal digits alone, in [min, max]; 0 when invalid. */
static int parse_count(const mt_param_def *d, const char *v, unsigned long long *n) {
  char *end;
  *n = strtoull(v, &end, 10);
  return *end == '\0' && end != v && v[0] != '-' && *n >= d->min && *n <= d->max;
}

/* ---- reading --------------------------------------------------------------------------------- */

/* The environment's text of the variable (NULL when unset or empty: an empty variable means "not
 * set"), recorded in p. */
static const char *given(mt_params *p, enum mt_param_id id) {
  const char *v = getenv(mt_param_defs[id].name);
  p->given[id] = v && v[0] ? v : NULL;
  p->from[id] = p->given[id] ? MT_FROM_ENV : MT_FROM_DEFAULT;
  return p->given[id];
}

/* Records whether a set value is valid and whether it is the default's; returns `valid`. */
static int settle(mt_params *p, enum mt_param_id id, int valid, int same) {
  p->from[id] = !valid ? MT_FROM_INVALID : same ? MT_FROM_ENV_SAME : MT_FROM_ENV;
  return valid;
}

static unsigned long long read_choice(mt_params *p, enum mt_param_id id) {
  const mt_param_def *d = &mt_param_defs[id];
  const char *v = given(p, id);
  if (!v)
    return d->def;
  int i = parse_choice(d, v);
  return settle(p, id, i >= 0, (unsigned long long)i == d->def) ? (unsigned long long)i : d->def;
}

static double read_rate(mt_params *p, enum mt_param_id id) {
  double def = parse_rate(mt_param_defs[id].text);
  const char *v = given(p, id);
  if (!v)
    return def;
  double r = parse_rate(v);
  return settle(p, id, r >= 0, r == def) ? r : def;
}

static unsigned long long read_count(mt_params *p, enum mt_param_id id) {
  const mt_param_def *d = &mt_param_defs[id];
  const char *v = given(p, id);
  unsigned long long n = 0;
  if (!v)
    return d->def;
  int valid = parse_count(d, v, &n);
  return settle(p, id, valid, n == d->def) ? n : d->def;
}

void mt_params_read(mt_params *p) {
  memset(p, 0, sizeof *p);
#define MT_PARAM_STR(N, f, u, m) p->f = given(p, MT_P_##N);
#define MT_PARAM_PATH(N, f, u, m) p->f = given(p, MT_P_##N);
#define MT_PARAM_CHOICE(N, f, T, names, d, m) p->f = (T)read_choice(p, MT_P_##N);
#define MT_PARAM_BOOL(N, f, d, m) p->f = (int)read_choice(p, MT_P_##N);
#define MT_PARAM_RATE(N, f, d, m) p->f = read_rate(p, MT_P_##N);
#define MT_PARAM_COUNT(N, f, d, lo, hi, u, m) p->f = read_count(p, MT_P_##N);
#include "base/params.def"
}

/* ---- as text --------------------------------------------------------------------------------- */

const char *mt_params_default(enum mt_param_id id, char *buf, size_t size) {
  const mt_param_def *d = &mt_param_defs[id];
  switch (d->kind) {
  case MT_PARAM_KIND_CHOICE:
  case MT_PARAM_KIND_BOOL:
    return d->choices[d->def];
  case MT_PARAM_KIND_COUNT:
    snprintf(buf, size, "%llu", d->def);
    return buf;
  default:
    return d->text;
  }
}

const char *mt_params_value(const mt_params *p, enum mt_param_id id, char *buf, size_t size) {
  const mt_param_def *d = &mt_param_defs[id];
  const char *v = p->given[id];
  unsigned long long n = 0;
  if (p->from[id] == MT_FROM_DEFAULT || p->from[id] == MT_FROM_INVALID)
    return mt_params_default(id, buf, size);
  switch (d->kind) {
  case MT_PARAM_KIND_CHOICE:
  case MT_PARAM_KIND_BOOL:
    return d->choices[parse_choice(d, v)];
  case MT_PARAM_KIND_COUNT:
    parse_count(d, v, &n);
    snprintf(buf, size, "%llu", n);
    return buf;
  default:
    return mt_log_value(v, buf, size);
  }
}

/* "a, b, c": the accepted words of a choice. */
static void words_text(const char *const words[], char *buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; words[i] && used < size; i++)
    used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "", words[i]);
}

const char *mt_params_problem(const mt_params *p, enum mt_param_id id, char *buf, size_t size) {
  const mt_param_def *d = &mt_param_defs[id];
  char shown[MT_LOG_VALUE_MAX + 64], list[256], def[32];
  if (p->from[id] != MT_FROM_INVALID)
    return NULL;
  const char *v = mt_log_value(p->given[id], shown, sizeof shown);
  if (d->kind == MT_PARAM_KIND_RATE)
    snprintf(list, sizeof list,
             "a rate in [0, 1] as a decimal (0.015625) or a fraction (1/64), 0 to turn it off");
  else if (d->kind == MT_PARAM_KIND_COUNT)
    snprintf(list, sizeof list, "a whole number of %s in %llu .. %llu", d->unit, d->min, d->max);
  else
    words_text(d->choices, list, sizeof list);
  snprintf(buf, size, "invalid value '%s' for %s: use %s%s; using the default %s", v, d->name,
           d->kind == MT_PARAM_KIND_CHOICE || d->kind == MT_PARAM_KIND_BOOL ? "one of " : "", list,
           mt_params_default(id, def, sizeof def));
  return buf;
}

/* ---- start ----------------------------------------------------------------------------------- */

/* The level is decided before the file opens, so that a bad file name is reported at the level
 * asked for (none at NONE, which opens no file); the file is named before anything is echoed, so
 * that the echo lands in it. */
static int start_log(const mt_params *p) {
  static mt_outfile file;
  char why[2048];
  int errors = 0;
  mt_log_set_level(MT_LOG_WARN);
  if (p->log_file && p->log_level != MT_LOG_NONE) {
    if (mt_out_open(&file, "MINITE_LOG_FILE", p->log_file, 1, why, sizeof why) == 0)
      mt_log_to(file.fd);
    else {
      MT_WARN("%s; logging to stderr", why);
      errors++;
    }
  }
  mt_log_set_level(p->log_level);
  return errors;
}

/* A path template's escape that base/proc.h does not know is kept as written, which is rarely
 * what was meant. */
static void check_template(const char *name, const char *tmpl) {
  char esc[3], shown[MT_LOG_VALUE_MAX + 64];
  if (mt_proc_path_unknown(tmpl, esc))
    MT_WARN("%s=%s: '%s' is not a known escape (%s): it is kept as written; write %%%% for a "
            "percent sign",
            name, mt_log_value(tmpl, shown, sizeof shown), esc, MT_PROC_ESCAPES);
}

/* A launcher variable that is no number would silently be rank 0 in every file name and record:
 * ranks sharing it would write one file. */
static void check_launcher(void) {
  const char *name = mt_proc_ids_invalid();
  char shown[MT_LOG_VALUE_MAX + 64];
  if (name)
    MT_WARN("%s=%s is not a whole number of at most 9 digits: the shim takes it as unknown (rank "
            "0 for %%r and the statistics' \"rank\", -1 for local_rank and world_size); fix or "
            "unset %s",
            name, mt_log_value(getenv(name), shown, sizeof shown), name);
}

int mt_params_start(const mt_params *p) {
  int errors = start_log(p);
  char text[MT_LOG_VALUE_MAX + 512];
  for (int id = 0; id < MT_P_NUM; id++) {
    const mt_param_def *d = &mt_param_defs[id];
    if (p->from[id] == MT_FROM_INVALID) {
      MT_WARN("%s", mt_params_problem(p, (enum mt_param_id)id, text, sizeof text));
      errors++;
    } else if (p->from[id] == MT_FROM_ENV)
      MT_INFO("%s set by environment to %s", d->name,
              mt_params_value(p, (enum mt_param_id)id, text, sizeof text));
    if (d->kind == MT_PARAM_KIND_PATH && p->given[id])
      check_template(d->name, p->given[id]);
  }
  check_launcher();
  return errors;
}
