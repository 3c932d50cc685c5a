/* param.h — the MINITE_* environment variables: each read once, with a default.
 *
 * A value other than the default is logged at INFO ("MINITE_X set by environment to V"), the way
 * NCCL echoes its NCCL_* settings (a string, which has no default, whenever it is set); an invalid
 * value is a WARN naming the accepted values, and the default is used. Callers count invalid values
 * as configuration errors (MINITE_STRICT).
 */
#ifndef MT_PARAM_H
#define MT_PARAM_H

#include <stddef.h>

/* The value of `name`, NULL when unset or empty (an empty variable means "not set"). A set value
 * is logged at INFO. */
const char *mt_param_str(const char *name);

/* One of `choices` (NULL-terminated, matched ignoring case); returns its index, or `def` when
 * unset. An invalid value is warned about, adds one to *errors and gives `def`. */
int mt_param_choice(const char *name, const char *const choices[], int def, int *errors);

/* 0 or 1 ("0"/"1", "false"/"true", "no"/"yes", "off"/"on"); otherwise as mt_param_choice. */
int mt_param_bool(const char *name, int def, int *errors);

/* A sampling rate in [0, 1]: a decimal ("0.015625", "1", "0") or a fraction ("1/64"); `def` when
 * unset. A value other than `def` is logged at INFO; an invalid one is warned about (with the
 * accepted forms), adds one to *errors and gives `def`. */
double mt_param_rate(const char *name, double def, int *errors);

/* A whole number in [min, max] (decimal digits only), `def` when unset. A valid value other than
 * `def` is logged at INFO; an invalid one is warned about (naming `unit`, the range and the
 * default), adds one to *errors and gives `def`. */
unsigned long long mt_param_count(const char *name, unsigned long long def, unsigned long long min,
                                  unsigned long long max, const char *unit, int *errors);

/* Warn (once per call) when the path template `tmpl` of variable `name` holds an escape that
 * base/proc.h does not know: it is kept as written, which is rarely what was meant. */
void mt_param_template_check(const char *name, const char *tmpl);

/* Read MINITE_LOG_LEVEL and MINITE_LOG_FILE and set the log up (once; later calls do nothing).
 * Returns the number of configuration errors found (each already warned about). */
int mt_param_log(void);

#endif
