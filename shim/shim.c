/* shim.c — start-up from the environment, and the path of one active call. */
#include "shim/shim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

#include "shim/devmem.h"
#include "shim/exec.h"
#include "shim/fork.h"
#include "shim/instr.h"
#include "base/log.h"
#include "base/params.h"
#include "shim/router.h"
#include "shim/stats.h"
#include "shim/wcache.h"

atomic_int mt_shim_on;
static mt_spec spec;         /* written once before mt_shim_on is set, read-only afterwards */
static mt_params params;     /* likewise */
static char role_name[1024]; /* longer roles are cut (a character cut in two: U+FFFD) */
static pthread_once_t first_call = PTHREAD_ONCE_INIT;

/* The configuration error that makes the shim inert, said once, with its fix: room for every
 * spec error (MT_SPEC_MAX_ERRORS of mt_spec_error.msg) and the shortened value, so that the fix
 * at its end is never cut. */
static char problem[MT_SPEC_MAX_ERRORS * 300 + 2048];

/* All of a spec's errors in one message: the user fixes them in one go. */
static void spec_problem(const char *what, const char *value, const mt_spec_errors *errs,
                         const char *hint) {
  char shown[MT_LOG_VALUE_MAX + 64];
  size_t used = (size_t)snprintf(problem, sizeof problem, "%s=%s: ", what,
                                 mt_log_value(value, shown, sizeof shown));
  for (int i = 0; i < errs->n && used < sizeof problem; i++) {
    if (errs->e[i].line)
      used += (size_t)snprintf(problem + used, sizeof problem - used, "%sline %d: %s",
                               i ? "; " : "", errs->e[i].line, errs->e[i].msg);
    else
      used += (size_t)snprintf(problem + used, sizeof problem - used, "%s%s", i ? "; " : "",
                               errs->e[i].msg);
  }
  if (errs->dropped && used < sizeof problem)
    used += (size_t)snprintf(problem + used, sizeof problem - used, "; and %d more", errs->dropped);
  if (hint && used < sizeof problem)
    snprintf(problem + used, sizeof problem - used, " (%s)", hint);
}

/* A spec that loads may still hold a line it no longer means (a weight_cache line): said once. */
static void warn_notice(const char *name) {
  char note[256], shown[MT_LOG_VALUE_MAX + 64];
  if (mt_spec_notice(&spec, note, sizeof note))
    MT_WARN("MINITE_SPEC=%s: line %d: %s", mt_log_value(name, shown, sizeof shown),
            spec.weight_cache_line, note);
}

static int load_spec(const char *name) {
  mt_spec_errors errs = {0};
  int rc = mt_spec_load(name, &spec, &errs);
  if (rc == 0) {
    warn_notice(name);
    return 0;
  }
  /* A name that is no built-in and no file: its message says what to set. */
  spec_problem("MINITE_SPEC", name, &errs,
               rc == MT_SPEC_UNKNOWN_NAME ? NULL
                                          : "fix the spec file; `minite spec check FILE` lists "
                                            "every error");
  return -1;
}

static int load_routes(const char *list) {
  if (!list)
    return 0;
  mt_spec_errors errs = {0};
  if (mt_spec_add_routes(&spec, list, &errs) == 0)
    return 0;
  spec_problem("MINITE_ROUTE", list, &errs, NULL); /* the parser's message shows the syntax */
  return -1;
}

/* PyTorch settings that decide which cuBLAS entry points the shim sees (docs/design.md,
 * "Interposition facts measured on the H200"). */
static void info_torch_settings(void) {
  static const char *const names[] = {"TORCH_BLAS_PREFER_CUBLASLT", "DISABLE_ADDMM_CUDA_LT",
                                      "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", NULL};
  for (int i = 0; names[i]; i++) {
    const char *v = getenv(names[i]);
    char shown[MT_LOG_VALUE_MAX + 64];
    if (v)
      MT_INFO("%s=%s", names[i], mt_log_value(v, shown, sizeof shown));
  }
}

static void info_started(const char *role, const char *stats) {
  char routes[MT_SPEC_MAX_ROUTES * 24], role_shown[MT_LOG_VALUE_MAX + 64],
      stats_shown[MT_LOG_VALUE_MAX + 64];
  size_t used = 0;
  routes[0] = '\0';
  for (int i = 0; i < spec.nroutes && used < sizeof routes; i++)
    used += (size_t)snprintf(routes + used, sizeof routes - used, " %ux%u",
                             (unsigned)spec.routes[i].out, (unsigned)spec.routes[i].in);
  MT_INFO("minite %s active: spec %s (%s, fingerprint %016llx), role '%s', routes:%s, "
          "statistics %s",
          MT_VERSION, spec.name, mt_format_name(spec.format),
          (unsigned long long)mt_spec_fingerprint(&spec),
          mt_log_value(role ? role : "", role_shown, sizeof role_shown),
          spec.nroutes ? routes : " none",
          stats ? mt_log_value(stats, stats_shown, sizeof stats_shown) : "off");
  info_torch_settings();
}

/* Under MINITE_LOG_LEVEL=NONE an invalid value was not said: the line that ends the program
 * names it. */
static void first_invalid_value(void) {
  for (int id = 0; id < MT_P_NUM && !problem[0]; id++)
    mt_params_problem(&params, (enum mt_param_id)id, problem, sizeof problem);
}

/* A configuration error: one message, then inert, or exit status 2 under MINITE_STRICT=1, said
 * whatever the log level (at NONE the log is stderr: no file was opened). */
static int refuse(int strict) {
  if (strict) {
    if (params.log_level == MT_LOG_NONE)
      first_invalid_value();
    mt_log_write(MT_LOG_WARN, "%s%sMINITE_STRICT=1: ending the program with exit status 2", problem,
                 problem[0] ? "; " : "a configuration error above; ");
    exit(2);
  }
  MT_WARN("%s; the shim is inert for this run: every GEMM goes to cuBLAS unchanged", problem);
  return -1;
}

/* A set-user-ID, set-group-ID or file-capability program (AT_SECURE): its environment comes from
 * a less privileged user, so no path of it is opened, no file written, and the program not
 * ended. */
static int refuse_secure(void) {
  if (params.log_level != MT_LOG_NONE)
    MT_WARN("this program runs with secure execution (set-user-ID, set-group-ID or file "
            "capabilities): the shim opens no MINITE_* path and writes no file; it is inert: "
            "every GEMM goes to cuBLAS unchanged");
  return 0;
}

int mt_shim_init(void) { return mt_shim_start(getauxval(AT_SECURE) != 0); }

int mt_shim_start(int secure) {
  mt_params_read(&params);
  if (!params.spec)
    return 0; /* inert: nothing opened, allocated or printed */
  if (secure)
    return refuse_secure();
  int soft_errors = mt_params_start(&params);
  mt_fork_start();
  int hard_errors = load_spec(params.spec) != 0;
  if (!hard_errors)
    hard_errors = load_routes(params.route) != 0;
  if (!hard_errors && params.stats)
    hard_errors = mt_stats_open(params.stats, problem, sizeof problem) != 0;
  if (hard_errors || (params.strict && soft_errors))
    return refuse(params.strict);
  mt_devmem_init(&params);
  mt_wcache_init(&params);
  mt_router_init(&params);
  mt_instr_init(&spec, &params);
  snprintf(role_name, sizeof role_name, "%s", params.role ? params.role : "");
  info_started(params.role, params.stats);
  atomic_store_explicit(&mt_shim_on, 1, memory_order_release);
  return 0;
}

/* The summary's parts that other modules own (shim/stats.h: mt_stats_part). */
static void summary_parts(void (*emit)(void *ctx, const char *text), void *ctx) {
  mt_wcache_summary(emit, ctx);
  mt_instr_summary(emit, ctx);
}

void mt_shim_fini(void) {
  if (!atomic_exchange(&mt_shim_on, 0))
    return;
  mt_instr_drain();
  mt_stats_finish(summary_parts);
}

/* One problem's decision; forward calls need the details (pointer mode, Lt layouts) first. */
static enum mt_reason decide(mt_call *c) {
  if (mt_route_is_forward(mt_route_role(&spec, c)))
    mt_norm_details(c);
  return mt_route_decide(&spec, c);
}

/* A grouped call is routed when every group that involves a routed weight is routed; otherwise
 * the first group's fallback reason is the call's. */
static enum mt_reason decide_grouped(mt_call *c) {
  enum mt_reason call_reason = MT_R_UNROUTED;
  int any_unrouted = 0;
  for (int64_t g = 0; g < c->group_count; g++) {
    mt_call one;
    mt_call_group(c, g, &one);
    if (mt_route_is_forward(mt_route_role(&spec, &one)) && !c->details)
      mt_norm_details(c), mt_call_group(c, g, &one);
    enum mt_reason r = mt_route_decide(&spec, &one);
    mt_stats_census(&one);
    if (r == MT_R_UNROUTED)
      any_unrouted = 1;
    else if (call_reason == MT_R_UNROUTED || call_reason == MT_R_ROUTED)
      call_reason = r;
  }
  /* A grouped call mixing routed and unrouted problems is not split: cuBLAS runs all of it. */
  if (call_reason == MT_R_ROUTED && any_unrouted)
    call_reason = MT_R_LAYOUT;
  return call_reason;
}

/* Routes the engine can never take, one warning each; they stay in the spec (its fingerprint is
 * what the other side compares), and their calls fall back with the reason "k alignment". */
static void warn_unusable_routes(void) {
  char why[160];
  for (int i = 0; i < spec.nroutes; i++)
    if (mt_spec_route_unusable(&spec, &spec.routes[i], why, sizeof why))
      MT_WARN("route %ux%u can never be routed: %s, so every call of that weight falls back to "
              "cuBLAS (reason \"k alignment\"); remove it from the spec or MINITE_ROUTE",
              (unsigned)spec.routes[i].out, (unsigned)spec.routes[i].in, why);
}

/* What only a process that uses cuBLAS should do or say: the statistics file and its start
 * record, the warnings about a spec that routes nothing or routes what it never can. */
static void start_on_first_call(void) {
  mt_fork_register();
  if (spec.format == MT_FORMAT_NVFP4 && spec.nroutes == 0)
    MT_WARN("spec %s routes no GEMM: add route lines to the spec or set MINITE_ROUTE. To find a "
            "model's expert shapes, run it once with MINITE_SPEC=bf16 MINITE_STATS=stats.jsonl "
            "and read suggested_routes in the summary record",
            spec.name);
  warn_unusable_routes();
  if (mt_stats_start(&spec, role_name, MT_VERSION) != 0)
    mt_instr_off(); /* their records would have nowhere to go */
}

/* The first call that fits both a forward of an [in][out] weight and PyTorch's dgrad, said once
 * under MINITE_WEIGHT_LAYOUT=auto (at INFO: a PyTorch learner with a square route sees it at every
 * backward, and the census marks every such call): how it was read and how to read it otherwise. */
static void say_ambiguous(const mt_call *c) {
  static atomic_int said;
  /* said first: every later call of the program returns here, before the routes are searched */
  if (params.weight_layout != MT_WLAYOUT_AUTO ||
      atomic_load_explicit(&said, memory_order_relaxed) || !mt_route_ambiguous(&spec, c) ||
      atomic_exchange(&said, 1))
    return;
  MT_INFO(
      "a cuBLAS NN GEMM with m=%lld k=%lld fits both PyTorch's dgrad of route %lldx%lld and a "
      "forward y = x @ W of route %lldx%lld stored [in, out] (JAX's and Flax's Dense kernels): "
      "it is read as the dgrad and runs in cuBLAS. If the program stores its weights [in, out], "
      "set MINITE_WEIGHT_LAYOUT=in-out to route such calls (out-in says the dgrad reading is "
      "meant); the census marks them \"ambiguous\"",
      (long long)c->m, (long long)c->k, (long long)c->k, (long long)c->m, (long long)c->m,
      (long long)c->k);
}

void mt_shim_unread(enum mt_reason r) {
  pthread_once(&first_call, start_on_first_call);
  mt_stats_count(r);
}

int mt_shim_begin(mt_call *c, cublasStatus_t *status) {
  pthread_once(&first_call, start_on_first_call);
  enum mt_reason r;
  if (c->group_count > 0) {
    r = decide_grouped(c);
  } else {
    r = decide(c);
    mt_stats_census(c);
  }
  if (c->group_count == 0)
    say_ambiguous(c);
  int ran = 0;
  if (r == MT_R_ROUTED && spec.format != MT_FORMAT_BF16) {
    mt_fork_enter();
    r = mt_exec_routed(&spec, c, status);
    mt_fork_leave();
    ran = r == MT_R_ROUTED;
  } else if (r == MT_R_ROUTED && c->group_count == 0 && mt_instr_enabled()) {
    mt_fork_enter();
    ran = mt_instr_bf16(&spec, c, status); /* bf16: cuBLAS runs it, then the instruments */
    mt_fork_leave();
  }
  mt_stats_count(r);
  if (r != MT_R_UNROUTED)
    MT_TRACE("%s %c%c m=%lld n=%lld k=%lld: %s", mt_fn_name(c->entry), c->transa ? 'T' : 'N',
             c->transb ? 'T' : 'N', (long long)c->m, (long long)c->n, (long long)c->k,
             mt_reason_name(r));
  return ran;
}

__attribute__((constructor)) static void shim_constructor(void) { mt_shim_init(); }

__attribute__((destructor)) static void shim_destructor(void) { mt_shim_fini(); }
