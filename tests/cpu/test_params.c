/* test_params.c — the MINITE_* environment variables of base/params.def: each type's reading
 * (valid values, the default, invalid values and where each came from), the one-line problem of
 * an invalid value, what mt_params_start logs, and the README's table of them (the same names in
 * the same order, with the same defaults). Run from the repository's root, as `make test` does.
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
  CHECK(p.weight_cache == 0 && p.cache_mb == 20480 && p.instr_mb == 64 && p.instr_slots == 1024);
  CHECK(p.shadow == 1.0 / 64 && p.probe == 1.0 / 64 && p.digest == 1.0 / 64);
  CHECK(!strcmp(mt_params_default(MT_P_MINITE_SHADOW, buf, sizeof buf), "1/64"));
  CHECK(!strcmp(mt_params_default(MT_P_MINITE_CACHE_MB, buf, sizeof buf), "20480"));
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
             strstr(why, "using the default 20480"),
         "%s", why);
  p = read_with("MINITE_DIGEST", "often");
  why = mt_params_problem(&p, MT_P_MINITE_DIGEST, buf, sizeof buf);
  CHECKF(why && strstr(why, "a fraction (1/64)") && strstr(why, "using the default 1/64"), "%s",
         why);
}

typedef struct {
  const mt_params *p;
  int errors;
} start_run;

static void start(void *arg) {
  start_run *r = arg;
  r->errors = mt_params_start(r->p);
}

/* What mt_params_start writes to fd 2, and its count of errors. */
static int start_captured(const mt_params *p, char *out, size_t size) {
  start_run r = {p, 0};
  mt_t_capture_stderr(start, &r, out, size);
  mt_log_set_level(MT_LOG_WARN);
  return r.errors;
}

static void start_echoes_and_warns(void) {
  char text[4096];
  mt_params p;
  clear_env();
  setenv("MINITE_LOG_LEVEL", "INFO", 1);
  setenv("MINITE_CAPTURE", "off", 1);
  setenv("MINITE_CACHE_MB", "20480", 1); /* the default: not echoed */
  setenv("MINITE_PROBE", "1/2x", 1);
  setenv("MINITE_ROLE", "sampler", 1);
  setenv("MINITE_STATS", "s.%q.jsonl", 1);
  setenv("MINITE_SHADOW", "", 1); /* empty: unset, the default, said nowhere */
  setenv("RANK", "3x", 1);
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
  CHECKF(strstr(text, " minite WARN RANK=3x is not a whole number of at most 9 digits: ") &&
             strstr(text, "fix or unset RANK\n"),
         "%s", text);
  unsetenv("RANK");
  clear_env();
}

/* ---- the README's table ---------------------------------------------------------------------- */

#define README_ROWS 64

typedef struct {
  char name[64], def[128];
} readme_row;

/* The cell after *p's next '|' into out, trimmed and without backquotes; *p moves past it. */
static int next_cell(const char **p, char *out, size_t size) {
  const char *start = strchr(*p, '|'), *end = start ? strchr(start + 1, '|') : NULL;
  if (!end)
    return 0;
  start += 1 + strspn(start + 1, " ");
  size_t n = 0;
  for (const char *c = start; c < end && n + 1 < size; c++)
    if (*c != '`')
      out[n++] = *c;
  while (n && out[n - 1] == ' ')
    n--;
  out[n] = '\0';
  *p = end;
  return 1;
}

/* The rows of the table `| variable | default | meaning |` under "## Environment variables";
 * -1 when the section or its table is missing. */
static int readme_table(readme_row *rows, int max) {
  FILE *f = fopen("README.md", "r");
  if (!f)
    return -1;
  char line[4096];
  int state = 0, n = 0; /* 0: before the section, 1: in it, 2: in its table */
  while (fgets(line, sizeof line, f) && state < 3) {
    if (state == 0 && !strcmp(line, "## Environment variables\n"))
      state = 1;
    else if (state == 1 && !strncmp(line, "## ", 3))
      state = 3;
    else if (state == 1 && !strcmp(line, "| variable | default | meaning |\n"))
      state = 2;
    else if (state == 2 && line[0] != '|')
      state = 3;
    else if (state == 2 && strncmp(line, "| ---", 5) && n < max) {
      const char *p = line;
      if (next_cell(&p, rows[n].name, sizeof rows[n].name) &&
          next_cell(&p, rows[n].def, sizeof rows[n].def))
        n++;
    }
  }
  fclose(f);
  return state >= 2 ? n : -1;
}

/* README.md's table of environment variables and base/params.def list the same variables in the
 * same order, each with the same default; a row the README lacks, adds or words differently as a
 * default fails here, naming it. */
static void readme_table_is_the_list(void) {
  readme_row rows[README_ROWS];
  int n = readme_table(rows, README_ROWS);
  CHECKF(n >= 0, "README.md: no table \"| variable | default | meaning |\" under \"## Environment "
                 "variables\" (run from the repository's root)");
  if (n < 0)
    return;
  char def[64];
  for (int id = 0; id < MT_P_NUM || id < n; id++) {
    const char *name = id < MT_P_NUM ? mt_param_defs[id].name : "(none)";
    const char *want = id < MT_P_NUM ? mt_params_default(id, def, sizeof def) : "";
    CHECKF(id < n, "README.md lacks %s (default %s)", name, want);
    if (id >= n)
      continue;
    CHECKF(!strcmp(rows[id].name, name), "README row %d is %s, base/params.def has %s", id + 1,
           rows[id].name, name);
    CHECKF(id >= MT_P_NUM || !strcmp(rows[id].def, want),
           "%s: the README's default is '%s', base/params.def's '%s'", rows[id].name, rows[id].def,
           want);
  }
}

int main(void) {
  RUN(defaults);
  RUN(choices_and_bools);
  RUN(strings);
  RUN(counts);
  RUN(rates);
  RUN(problems);
  RUN(start_echoes_and_warns);
  RUN(readme_table_is_the_list);
  return mt_test_done();
}
