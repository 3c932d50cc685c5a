/* params.h — the MINITE_* variables of base/params.def: each read once, with a default.
 *
 * mt_params_read reads every one into an mt_params, which the shim fills once at start and hands
 * down, read-only, like the spec. mt_params_start then says what was read, the way NCCL echoes its
 * NCCL_* settings: a value other than the default at INFO ("MINITE_X set by environment to V"; a
 * string, which has no default, whenever it is set), an invalid value as a WARN naming the
 * accepted values (the default is used instead), a path template's unknown escape as a WARN.
 * Invalid values are configuration errors (MINITE_STRICT). `minite env` lists the same from the
 * same table.
 */
#ifndef MT_PARAMS_H
#define MT_PARAMS_H

#include <stddef.h>

#include "base/log.h"

/* The choices of MINITE_WEIGHT_CACHE and MINITE_CAPTURE, NULL-terminated, in enum order: the
 * weight cache's modes (shim/wcache.h) and what a routed call in a graph capture does. */
enum mt_wcache { MT_WCACHE_REQUANTIZE, MT_WCACHE_FROZEN, MT_WCACHE_FROZEN_SAMPLED };
extern const char *const mt_wcache_names[];
enum mt_capture { MT_CAPTURE_OFF, MT_CAPTURE_GRAPH };
extern const char *const mt_capture_names[];
/* The choices of MINITE_WEIGHT_LAYOUT: which layout of its routed weights a program uses where a
 * call's shapes alone cannot tell (shim/router.h). */
enum mt_wlayout { MT_WLAYOUT_AUTO, MT_WLAYOUT_OUT_IN, MT_WLAYOUT_IN_OUT };
extern const char *const mt_wlayout_names[];
/* The choices of MINITE_DIGEST_CALLS: which uncaptured calls the row digests look at
 * (shim/instr.h). */
enum mt_digest_calls { MT_DIGEST_CALLS_SAMPLED, MT_DIGEST_CALLS_ALL };
extern const char *const mt_digest_calls_names[];

enum mt_param_kind {
  MT_PARAM_KIND_STR,
  MT_PARAM_KIND_PATH,
  MT_PARAM_KIND_CHOICE,
  MT_PARAM_KIND_BOOL,
  MT_PARAM_KIND_RATE,
  MT_PARAM_KIND_COUNT
};

/* One id per variable, in the list's order: MT_P_MINITE_SPEC, ... */
enum mt_param_id {
#define MT_PARAM_STR(N, f, u, m) MT_P_##N,
#define MT_PARAM_PATH(N, f, u, m) MT_P_##N,
#define MT_PARAM_CHOICE(N, f, T, names, d, m) MT_P_##N,
#define MT_PARAM_BOOL(N, f, d, m) MT_P_##N,
#define MT_PARAM_RATE(N, f, d, m) MT_P_##N,
#define MT_PARAM_COUNT(N, f, d, lo, hi, unit, m) MT_P_##N,
#include "base/params.def"
  MT_P_NUM
};

/* A variable as the list declares it. */
typedef struct {
  const char *name;
  enum mt_param_kind kind;
  const char *text;            /* STR, PATH: what unset means; RATE: the default */
  const char *const *choices;  /* CHOICE, BOOL: the accepted words */
  unsigned long long def;      /* CHOICE, BOOL: the default's index; COUNT: the default */
  unsigned long long min, max; /* COUNT */
  const char *unit;            /* COUNT */
  const char *meaning;
} mt_param_def;

extern const mt_param_def mt_param_defs[MT_P_NUM];

/* Where a variable's value came from. */
enum mt_param_from {
  MT_FROM_DEFAULT,  /* unset or empty */
  MT_FROM_ENV,      /* set to a valid value (a number or choice: other than the default) */
  MT_FROM_ENV_SAME, /* set to the default's value */
  MT_FROM_INVALID   /* set to an invalid value: the default is used */
};

typedef struct {
#define MT_PARAM_STR(N, f, u, m) const char *f;
#define MT_PARAM_PATH(N, f, u, m) const char *f;
#define MT_PARAM_CHOICE(N, f, T, names, d, m) T f;
#define MT_PARAM_BOOL(N, f, d, m) int f;
#define MT_PARAM_RATE(N, f, d, m) double f;
#define MT_PARAM_COUNT(N, f, d, lo, hi, unit, m) unsigned long long f;
#include "base/params.def"
  unsigned char from[MT_P_NUM]; /* enum mt_param_from */
  const char *given[MT_P_NUM];  /* the environment's text; NULL when unset or empty */
} mt_params;

/* Read every variable of the list from the environment, quietly: nothing is logged. */
void mt_params_read(mt_params *p);

/* Set the log up as MINITE_LOG_LEVEL and MINITE_LOG_FILE say, then log what mt_params_read found
 * (see above). Returns the number of configuration errors: invalid values, and a log file that
 * cannot be written (each already warned about). */
int mt_params_start(const mt_params *p);

/* The value in force as text: a choice's name, a number, a string (shortened as mt_log_value
 * does), or what an unset string means. Returns buf or a constant. */
const char *mt_params_value(const mt_params *p, enum mt_param_id id, char *buf, size_t size);

/* The default as text, as the README's table shows it (without its backquotes). */
const char *mt_params_default(enum mt_param_id id, char *buf, size_t size);

/* Why the environment's value is invalid, in one line naming the accepted values and the default
 * used instead; NULL when it is valid or unset. */
const char *mt_params_problem(const mt_params *p, enum mt_param_id id, char *buf, size_t size);

#endif
