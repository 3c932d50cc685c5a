/* test_params.c — the MINITE_* environment variables of base/params.def: each type's reading
 * (valid values, the default, invalid values and where each came from), the one-line problem of
 * an invalid value, and what mt_params_start logs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "tests/harness.h"

/* Every variable of the list unset, so that a test sees only what it sets. */
static void clear_env(void) {
  for (int id = 0; id < MT_P_NUM; id++)
    unsetenv(mt_param_defs[id].name);
}

static mt_params read_with(const char *name, const char *value) {
  mt_params p;
  clear_env();
  if (name)
    setenv(name, value, 1);
  mt_params_read(&p);
  return p;
}

static void defaults(void) {
  mt_params p = read_with(NULL, NULL);
  char buf[64], def[64];
  for (int id = 0; id < MT_P_NUM; id++) {
    CHECKF(p.from[id] == MT_FROM_DEFAULT && !p.given[id], "%s", mt_param_defs[id].name);
    CHECKF(
        !strcmp(mt_params_value(&p, id, buf, sizeof buf), mt_params_default(id, def, sizeof def)),
        "%s", mt_param_defs[id].name);
    CHECKF(mt_param_defs[id].meaning && mt_param_defs[id].meaning[0], "%s", mt_param_defs[id].name);
  }
  CHECK(!p.spec && !p.route && !p.role && !p.stats && !p.log_file);
  CHECK(p.log_level == MT_LOG_WARN && p.strict == 0 && p.capture == MT_CAPTURE_GRAPH);
  CHECK(p.weight_cache == 0 && p.cache_mb == 8192 && p.instr_mb == 64 && p.instr_slots == 1024);
  CHECK(p.shadow == 1.0 / 64 && p.probe == 1.0 / 64 && p.digest == 1.0 / 64);
  CHECK(!strcmp(mt_params_default(MT_P_MINITE_SHADOW, buf, sizeof buf), "1/64"));
  CHECK(!strcmp(mt_params_default(MT_P_MINITE_CACHE_MB, buf, sizeof buf), "8192"));
  CHECK(!strcmp(mt_params_default(MT_P_MINITE_LOG_LEVEL, buf, sizeof buf), "WARN"));
  CHECK(!strcmp(mt_params_default(MT_P_MINITE_STRICT, buf, sizeof buf), "0"));
}

static void choices_and_bools(void) {
  char buf[64];
  mt_params p = read_with("MINITE_LOG_LEVEL", "info");
  CHECK(p.log_level == MT_LOG_INFO && p.from[MT_P_MINITE_LOG_LEVEL] == MT_FROM_ENV);
  CHECK(!strcmp(mt_params_value(&p, MT_P_MINITE_LOG_LEVEL, buf, sizeof buf), "INFO"));
  p = read_with("MINITE_LOG_LEVEL", "warn");
  CHECK(p.log_level == MT_LOG_WARN && p.from[MT_P_MINITE_LOG_LEVEL] == MT_FROM_ENV_SAME);
  p = read_with("MINITE_LOG_LEVEL", "LOUD");
  CHECK(p.log_level == MT_LOG_WARN && p.from[MT_P_MINITE_LOG_LEVEL] == MT_FROM_INVALID);
  CHECK(!strcmp(mt_params_value(&p, MT_P_MINITE_LOG_LEVEL, buf, sizeof buf), "WARN"));
  p = read_with("MINITE_CAPTURE", "OFF");
  CHECK(p.capture == MT_CAPTURE_OFF && p.from[MT_P_MINITE_CAPTURE] == MT_FROM_ENV);
  p = read_with("MINITE_WEIGHT_CACHE", "frozen-sampled");
  CHECK(p.weight_cache == 2 && !strcmp(mt_wcache_names[p.weight_cache], "frozen-sampled"));
  p = read_with("MINITE_STRICT", "yes");
  CHECK(p.strict == 1 && p.from[MT_P_MINITE_STRICT] == MT_FROM_ENV);
  CHECK(!strcmp(mt_params_value(&p, MT_P_MINITE_STRICT, buf, sizeof buf), "1"));
  p = read_with("MINITE_STRICT", "off");
  CHECK(p.strict == 0 && p.from[MT_P_MINITE_STRICT] == MT_FROM_ENV_SAME);
  p = read_with("MINITE_STRICT", "2");
  CHECK(p.strict == 0 && p.from[MT_P_MINITE_STRICT] == MT_FROM_INVALID);
}

static void strings(void) {
  char buf[MT_LOG_VALUE_MAX + 64];
  mt_params p = read_with("MINITE_ROLE", "");
  CHECK(!p.role && p.from[MT_P_MINITE_ROLE] == MT_FROM_DEFAULT);
  p = read_with("MINITE_ROLE", "learner");
  CHECK(p.role && !strcmp(p.role, "learner") && p.from[MT_P_MINITE_ROLE] == MT_FROM_ENV);
  CHECK(!strcmp(mt_params_value(&p, MT_P_MINITE_ROLE, buf, sizeof buf), "learner"));
  char longer[1000];
  memset(longer, 'a', sizeof longer - 1);
  longer[sizeof longer - 1] = '\0';
  p = read_with("MINITE_STATS", longer);
  CHECK(strlen(mt_params_value(&p, MT_P_MINITE_STATS, buf, sizeof buf)) < MT_LOG_VALUE_MAX + 48);
}

static void counts(void) {
  static const struct {
    const char *value;
    unsigned long long want;
    int from;
  } cases[] = {{"64", 64, MT_FROM_ENV},       {"1", 1, MT_FROM_ENV},
               {"65536", 65536, MT_FROM_ENV}, {"1024", 1024, MT_FROM_ENV_SAME},
               {"0", 1024, MT_FROM_INVALID},  {"65537", 1024, MT_FROM_INVALID},
               {"-1", 1024, MT_FROM_INVALID}, {"12x", 1024, MT_FROM_INVALID},
               {"x", 1024, MT_FROM_INVALID},  {"18446744073709551617", 1024, MT_FROM_INVALID}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mt_params p = read_with("MINITE_INSTR_SLOTS", cases[i].value);
    CHECKF(p.instr_slots == cases[i].want && p.from[MT_P_MINITE_INSTR_SLOTS] == cases[i].from,
           "%s: %llu (from %d)", cases[i].value, p.instr_slots, p.from[MT_P_MINITE_INSTR_SLOTS]);
  }
}

static void rates(void) {
  static const struct {
    const char *value;
    double want;
    int from;
  } cases[] = {{"0.25", 0.25, MT_FROM_ENV},
               {"1", 1, MT_FROM_ENV},
               {"0", 0, MT_FROM_ENV},
               {"0/5", 0, MT_FROM_ENV},
               {"1/64", 1.0 / 64, MT_FROM_ENV_SAME},
               {"0.015625", 1.0 / 64, MT_FROM_ENV_SAME},
               {"abc", 1.0 / 64, MT_FROM_INVALID},
               {"2", 1.0 / 64, MT_FROM_INVALID},
               {"-0.1", 1.0 / 64, MT_FROM_INVALID},
               {"1/0", 1.0 / 64, MT_FROM_INVALID},
               {"0.5x", 1.0 / 64, MT_FROM_INVALID},
               {"1/64/2", 1.0 / 64, MT_FROM_INVALID},
               {"nan", 1.0 / 64, MT_FROM_INVALID}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mt_params p = read_with("MINITE_PROBE", cases[i].value);
    CHECKF(p.probe == cases[i].want && p.from[MT_P_MINITE_PROBE] == cases[i].from,
           "%s: %g (from %d)", cases[i].value, p.probe, p.from[MT_P_MINITE_PROBE]);
  }
}

static void problems(void) {
  char buf[512];
  mt_params p = read_with("MINITE_LOG_LEVEL", "LOUD");
  const char *why = mt_params_problem(&p, MT_P_MINITE_LOG_LEVEL, buf, sizeof buf);
  CHECKF(why && !strcmp(why, "invalid value 'LOUD' for MINITE_LOG_LEVEL: use one of NONE, WARN, "
                             "INFO, TRACE; using the default WARN"),
         "%s", why);
  CHECK(!mt_params_problem(&p, MT_P_MINITE_SHADOW, buf, sizeof buf));
  p = read_with("MINITE_CACHE_MB", "lots");
  why = mt_params_problem(&p, MT_P_MINITE_CACHE_MB, buf, sizeof buf);
  CHECKF(why && strstr(why, "'lots' for MINITE_CACHE_MB: use a whole number of MiB in 0 .. ") &&
             strstr(why, "using the default 8192"),
         "%s", why);
  p = read_with("MINITE_DIGEST", "often");
  why = mt_params_problem(&p, MT_P_MINITE_DIGEST, buf, sizeof buf);
  CHECKF(why && strstr(why, "a fraction (1/64)") && strstr(why, "using the default 1/64"), "%s",
         why);
}

/* What mt_params_start writes to fd 2, and its count of errors. */
static int start_captured(const mt_params *p, char *out, size_t size) {
  char path[] = "/tmp/mt_params_test.XXXXXX";
  int fd = mkstemp(path), saved = dup(2);
  dup2(fd, 2);
  int errors = mt_params_start(p);
  dup2(saved, 2);
  close(saved);
  ssize_t n = pread(fd, out, size - 1, 0);
  out[n > 0 ? n : 0] = '\0';
  close(fd);
  unlink(path);
  mt_log_set_level(MT_LOG_WARN);
  return errors;
}

static void start_echoes_and_warns(void) {
  char text[4096];
  mt_params p;
  clear_env();
  setenv("MINITE_LOG_LEVEL", "INFO", 1);
  setenv("MINITE_CAPTURE", "off", 1);
  setenv("MINITE_CACHE_MB", "8192", 1); /* the default: not echoed */
  setenv("MINITE_PROBE", "1/2x", 1);
  setenv("MINITE_ROLE", "sampler", 1);
  setenv("MINITE_STATS", "s.%q.jsonl", 1);
  mt_params_read(&p);
  int errors = start_captured(&p, text, sizeof text);
  CHECKF(errors == 1, "%d errors", errors);
  CHECK(strstr(text, " minite INFO MINITE_LOG_LEVEL set by environment to INFO\n"));
  CHECK(strstr(text, " minite INFO MINITE_CAPTURE set by environment to off\n"));
  CHECK(strstr(text, " minite INFO MINITE_ROLE set by environment to sampler\n"));
  CHECK(!strstr(text, "MINITE_CACHE_MB"));
  CHECK(strstr(text, " minite WARN invalid value '1/2x' for MINITE_PROBE: "));
  CHECK(strstr(text, " minite WARN MINITE_STATS=s.%q.jsonl: '%q' is not a known escape"));
  CHECKF(!strstr(text, "MINITE_SHADOW"), "%s", text);
  clear_env();
}

int main(void) {
  RUN(defaults);
  RUN(choices_and_bools);
  RUN(strings);
  RUN(counts);
  RUN(rates);
  RUN(problems);
  RUN(start_echoes_and_warns);
  return mt_test_done();
}
