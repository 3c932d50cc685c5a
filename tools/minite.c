/* minite.c — the command-line tool (build/minite): list, show and check execution specs, and
 * list the environment variables the preloaded library reads.
 *
 *   minite spec list                          the built-ins, one per line with a description
 *   minite spec show NAME|PATH [--route LIST] a spec's canonical text and fingerprint
 *   minite spec check PATH...                 parse spec files; report every error
 *   minite env                                every MINITE_* variable: value and where it came from
 *
 * Results go to stdout, errors to stderr. Exit status: 0 success, 2 bad spec, bad usage or an
 * invalid MINITE_* value.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/params.h"
#include "spec/spec.h"

#define EXIT_BAD 2

static const char usage_text[] =
    "usage: minite spec list\n"
    "       minite spec show NAME|PATH [--route OUTxIN,...]\n"
    "       minite spec check PATH...\n"
    "       minite env\n"
    "\n"
    "  spec list   the built-in specs, one per line with a description\n"
    "  spec show   a built-in (by name) or a spec file: '# name: X', the canonical text,\n"
    "              then 'fingerprint: <16 hex digits>'; --route adds routes as MINITE_ROUTE does\n"
    "  spec check  parse spec files: 'PATH: ok (fingerprint ...)' or one line per error\n"
    "              'PATH:LINE: what is wrong' on stderr, and exit status 2; a spec is read from\n"
    "              a regular file only (a FIFO or /dev/stdin is refused); a route the engine\n"
    "              can never take is a warning on stderr\n"
    "  env         every MINITE_* variable the preloaded library reads, one per line: its name,\n"
    "              its value in this environment, and where that came from (default or\n"
    "              environment); an invalid value is named with the accepted ones, the default\n"
    "              is shown, and the exit status is 2\n"
    "\n"
    "Environment of the preloaded library: MINITE_SPEC=NAME|PATH selects the spec,\n"
    "MINITE_ROUTE=OUTxIN,... adds routes (weight shapes out x in) to it; `minite env` lists\n"
    "the others.\n";

__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "minite: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n%s", usage_text);
  va_end(ap);
  return EXIT_BAD;
}

/* `where` is the path (or name) the errors belong to. */
static void print_errors(const char *where, const mt_spec_errors *errs) {
  for (int i = 0; i < errs->n; i++) {
    if (errs->e[i].line > 0)
      fprintf(stderr, "%s:%d: %s\n", where, errs->e[i].line, errs->e[i].msg);
    else
      fprintf(stderr, "%s: %s\n", where, errs->e[i].msg);
  }
  if (errs->dropped)
    fprintf(stderr, "%s: %d more error%s not shown\n", where, errs->dropped,
            errs->dropped == 1 ? "" : "s");
}

/* Routes the engine can never take (their calls would all fall back), and a line the spec no
 * longer means (mt_spec_notice): warnings, not errors. */
static void warn_spec(const char *where, const mt_spec *s) {
  char why[256];
  if (mt_spec_notice(s, why, sizeof why))
    fprintf(stderr, "%s:%d: warning: %s\n", where, s->weight_cache_line, why);
  for (int i = 0; i < s->nroutes; i++)
    if (mt_spec_route_unusable(s, &s->routes[i], why, sizeof why))
      fprintf(stderr,
              "%s: warning: route %ux%u can never be routed: %s, so every call of that weight "
              "falls back to cuBLAS (reason \"k alignment\"); remove the route\n",
              where, (unsigned)s->routes[i].out, (unsigned)s->routes[i].in, why);
}

static int cmd_list(int argc, char **argv) {
  (void)argv;
  if (argc != 0)
    return usage_error("spec list takes no arguments");
  for (int i = 0; mt_spec_builtin_names[i]; i++)
    printf("%-14s %s\n", mt_spec_builtin_names[i], mt_spec_builtin_about(mt_spec_builtin_names[i]));
  return 0;
}

static void print_spec(const mt_spec *s) {
  char text[MT_SPEC_CANONICAL_MAX];
  mt_spec_canonical(s, text, sizeof text);
  printf("# name: %s\n%sfingerprint: %016" PRIx64 "\n", s->name[0] ? s->name : "(none)", text,
         mt_spec_fingerprint(s));
}

static int cmd_show(int argc, char **argv) {
  mt_spec spec;
  mt_spec_errors errs;
  const char *routes = NULL;
  if (argc == 3 && strcmp(argv[1], "--route") == 0)
    routes = argv[2];
  else if (argc != 1)
    return usage_error("spec show takes one NAME or PATH (and optionally --route LIST)");
  if (mt_spec_load(argv[0], &spec, &errs)) {
    print_errors(argv[0], &errs);
    return EXIT_BAD;
  }
  if (routes && mt_spec_add_routes(&spec, routes, &errs)) {
    print_errors("--route", &errs);
    return EXIT_BAD;
  }
  warn_spec(argv[0], &spec);
  print_spec(&spec);
  return 0;
}

static int cmd_check(int argc, char **argv) {
  int status = 0;
  if (argc < 1)
    return usage_error("spec check needs a PATH");
  for (int i = 0; i < argc; i++) {
    mt_spec spec;
    mt_spec_errors errs;
    if (mt_spec_parse_file(argv[i], &spec, &errs)) {
      print_errors(argv[i], &errs);
      status = EXIT_BAD;
    } else {
      warn_spec(argv[i], &spec);
      printf("%s: ok (fingerprint %016" PRIx64 ")\n", argv[i], mt_spec_fingerprint(&spec));
    }
  }
  return status;
}

static int cmd_spec(int argc, char **argv) {
  static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
  } commands[] = {{"list", cmd_list}, {"show", cmd_show}, {"check", cmd_check}};
  if (argc < 1)
    return usage_error("spec needs a command: list, show or check");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(argv[0], commands[i].name) == 0)
      return commands[i].run(argc - 1, argv + 1);
  return usage_error("unknown spec command \"%s\" (known: list, show, check)", argv[0]);
}

/* The value column is as wide as the longest value, within reason. */
static int value_width(const mt_params *p) {
  char buf[MT_LOG_VALUE_MAX + 64];
  size_t width = 5;
  for (int id = 0; id < MT_P_NUM; id++) {
    size_t n = strlen(mt_params_value(p, (enum mt_param_id)id, buf, sizeof buf));
    if (n > width && n <= 40)
      width = n;
  }
  return (int)width;
}

static int cmd_env(int argc, char **argv) {
  (void)argv;
  if (argc != 0)
    return usage_error("env takes no arguments");
  mt_params p;
  mt_params_read(&p);
  int width = value_width(&p), status = 0;
  char value[MT_LOG_VALUE_MAX + 64], why[MT_LOG_VALUE_MAX + 512];
  printf("%-20s %-*s %s\n", "variable", width, "value", "from");
  for (int id = 0; id < MT_P_NUM; id++) {
    const char *problem = mt_params_problem(&p, (enum mt_param_id)id, why, sizeof why);
    printf("%-20s %-*s %s%s%s\n", mt_param_defs[id].name, width,
           mt_params_value(&p, (enum mt_param_id)id, value, sizeof value),
           p.from[id] == MT_FROM_DEFAULT || problem ? "default" : "environment",
           problem ? ": " : "", problem ? problem : "");
    if (problem)
      status = EXIT_BAD;
  }
  return status;
}

int main(int argc, char **argv) {
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
                    strcmp(argv[1], "help") == 0)) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (argc < 2)
    return usage_error("no command given");
  if (strcmp(argv[1], "spec") == 0)
    return cmd_spec(argc - 2, argv + 2);
  if (strcmp(argv[1], "env") == 0)
    return cmd_env(argc - 2, argv + 2);
  return usage_error("unknown command \"%s\" (known: spec, env)", argv[1]);
}
