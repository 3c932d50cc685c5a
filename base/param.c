/* param.c — reading MINITE_* variables once, echoing non-defaults, rejecting bad values. */
#include "base/param.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/log.h"
#include "base/proc.h"

const char *mt_param_str(const char *name) {
  const char *v = getenv(name);
  if (!v || !v[0])
    return NULL;
  char shown[MT_LOG_VALUE_MAX + 64];
  MT_INFO("%s set by environment to %s", name, mt_log_value(v, shown, sizeof shown));
  return v;
}

static void choices_text(const char *const choices[], char *buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; choices[i] && used < size; i++)
    used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "", choices[i]);
}

int mt_param_choice(const char *name, const char *const choices[], int def, int *errors) {
  const char *v = getenv(name);
  if (!v || !v[0])
    return def;
  for (int i = 0; choices[i]; i++) {
    if (strcasecmp(v, choices[i]) == 0) {
      if (i != def)
        MT_INFO("%s set by environment to %s", name, choices[i]);
      return i;
    }
  }
  char list[256], shown[MT_LOG_VALUE_MAX + 64];
  choices_text(choices, list, sizeof list);
  MT_WARN("invalid value '%s' for %s: use one of %s; using the default %s",
          mt_log_value(v, shown, sizeof shown), name, list, choices[def]);
  if (errors)
    (*errors)++;
  return def;
}

int mt_param_bool(const char *name, int def, int *errors) {
  static const char *const words[] = {"0", "1", "false", "true", "no", "yes", "off", "on", NULL};
  int i = mt_param_choice(name, words, def, errors);
  return i % 2;
}

/* "N/D" or a decimal, nothing after it; -1 when it is neither or outside [0, 1]. */
static double parse_rate(const char *v) {
  char *end;
  double r = strtod(v, &end);
  if (end == v)
    return -1;
  if (*end == '/') {
    const char *den = end + 1;
    double d = strtod(den, &end);
    if (end == den || !(d > 0))
      return -1;
    r /= d;
  }
  if (*end || !(r >= 0 && r <= 1))
    return -1;
  return r;
}

double mt_param_rate(const char *name, double def, int *errors) {
  const char *v = getenv(name);
  if (!v || !v[0])
    return def;
  double r = parse_rate(v);
  if (r < 0) {
    char shown[MT_LOG_VALUE_MAX + 64];
    MT_WARN("invalid value '%s' for %s: use a rate in [0, 1] as a decimal (0.015625) or a "
            "fraction (1/64), 0 to turn it off; using the default %g",
            mt_log_value(v, shown, sizeof shown), name, def);
    if (errors)
      (*errors)++;
    return def;
  }
  if (r != def)
    MT_INFO("%s set by environment to %s", name, v); /* parsed as a number: short */
  return r;
}

unsigned long long mt_param_count(const char *name, unsigned long long def, unsigned long long min,
                                  unsigned long long max, const char *unit, int *errors) {
  const char *v = getenv(name);
  if (!v || !v[0])
    return def;
  char *end;
  unsigned long long n = strtoull(v, &end, 10);
  if (*end || end == v || v[0] == '-' || n < min || n > max) {
    char shown[MT_LOG_VALUE_MAX + 64];
    MT_WARN("%s=%s is not a number of %s in %llu .. %llu (e.g. %llu); using %llu", name,
            mt_log_value(v, shown, sizeof shown), unit, min, max, def, def);
    if (errors)
      (*errors)++;
    return def;
  }
  if (n != def)
    MT_INFO("%s set by environment to %llu", name, n);
  return n;
}

void mt_param_template_check(const char *name, const char *tmpl) {
  char esc[3], shown[MT_LOG_VALUE_MAX + 64];
  if (mt_proc_path_unknown(tmpl, esc))
    MT_WARN("%s=%s: '%s' is not a known escape (%s): it is kept as written; write %%%% for a "
            "percent sign",
            name, mt_log_value(tmpl, shown, sizeof shown), esc, MT_PROC_ESCAPES);
}

int mt_param_log(void) {
  static int done;
  if (done)
    return 0;
  done = 1;
  int errors = 0;
  /* The level is decided before the file opens, so that a bad file name is reported at the
   * level asked for, and the file before the level is echoed, so that the echo lands in it. */
  int level = mt_param_choice("MINITE_LOG_LEVEL", mt_log_level_names, MT_LOG_WARN, &errors);
  mt_log_set_level(MT_LOG_WARN);
  const char *tmpl = getenv("MINITE_LOG_FILE");
  if (tmpl && tmpl[0] && level != MT_LOG_NONE)
    errors += mt_log_open(tmpl);
  mt_log_set_level(level);
  if (level != MT_LOG_WARN)
    MT_INFO("MINITE_LOG_LEVEL set by environment to %s", mt_log_level_names[level]);
  if (tmpl && tmpl[0]) {
    char shown[MT_LOG_VALUE_MAX + 64];
    MT_INFO("MINITE_LOG_FILE set by environment to %s", mt_log_value(tmpl, shown, sizeof shown));
  }
  if (tmpl && tmpl[0] && level != MT_LOG_NONE)
    mt_param_template_check("MINITE_LOG_FILE", tmpl);
  return errors;
}
