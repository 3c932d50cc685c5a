/* test_shim_preload.c — the shim preloaded into programs that use (fake) cuBLAS.
 *
 * Runs tests/cpu/fake's app (a battery of calls through every hooked entry point) in both
 * arrangements — linked to cuBLAS directly, and dlopen()ing a library that depends on cuBLAS with
 * RTLD_LOCAL, as PyTorch does — without the shim, inert, and active under the bf16 and nvfp4-row
 * specs, and checks: arguments arrive unchanged (the app checks, exit 0), results are bitwise the
 * same in every run, the statistics file holds the counts and reasons the router must give, and
 * bad settings give their message and change nothing, hostile output paths (a FIFO, a directory, a
 * device, links, long names, a relative path after a chdir) are refused at start or resolved
 * there, and values are echoed escaped and shortened. Each program runs in the temporary folder,
 * under a 60 s alarm (a hang is status 128 + SIGALRM). Needs the fixtures of tests/cpu/shim.mk.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/cpu/preload.h"
#include "tests/harness.h"

extern char **environ;

static char build[PATH_MAX], tmp[PATH_MAX], preload[2 * PATH_MAX];

typedef struct {
  int status; /* exit status, or 128 + signal */
  pid_t pid;
  char err[32768]; /* stderr */
  long out_bytes;  /* bytes written to stdout: must stay 0 */
} run_result;

static int exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* Run argv with the environment of this process minus MINITE_*, LD_PRELOAD and RANK, plus
 * `env` (NULL-terminated "K=V"), and the shim preloaded when `shim` is set. */
static void run(const char *const argv[], const char *const env[], int shim, run_result *r) {
  char errpath[PATH_MAX + 16], outpath[PATH_MAX + 16];
  snprintf(errpath, sizeof errpath, "%s/stderr", tmp);
  snprintf(outpath, sizeof outpath, "%s/stdout", tmp);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    for (char **e = environ; *e;) {
      if (!strncmp(*e, "MINITE_", 7) || !strncmp(*e, "LD_PRELOAD=", 11) ||
          !strncmp(*e, "RANK=", 5) || !strncmp(*e, "FAKE_APP_", 9) ||
          !strncmp(*e, "LOCAL_RANK=", 11) || !strncmp(*e, "WORLD_SIZE=", 11)) {
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(strchr(*e, '=') - *e), *e);
        unsetenv(name);
      } else {
        e++;
      }
    }
    for (int i = 0; env && env[i]; i++)
      putenv((char *)env[i]);
    if (shim)
      setenv("LD_PRELOAD", preload, 1);
    int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    fd = open(outpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    if (chdir(tmp) != 0)
      _exit(126);
    alarm(60); /* kept across execv: a program that hangs ends with SIGALRM */
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r->pid = pid;
  r->status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  char *err = mt_t_read_file(errpath, NULL);
  snprintf(r->err, sizeof r->err, "%s", err ? err : "");
  free(err);
  char *out = mt_t_read_file(outpath, &r->out_bytes);
  free(out);
}

/* --- the two arrangements --------------------------------------------------------------- */

enum arrangement { DIRECT, DLOPEN, DLOPEN12 /* the fakes under the CUDA 12 sonames */ };

static void app(enum arrangement arr, const char *tag, const char *const env[], int shim,
                run_result *r) {
  char exe[PATH_MAX + 64], lib[PATH_MAX + 64], out[PATH_MAX + 64], expect[PATH_MAX + 64];
  snprintf(out, sizeof out, "%s/%s.out", tmp, tag);
  snprintf(expect, sizeof expect, "%s/%s.expect", tmp, tag);
  snprintf(lib, sizeof lib, "%s/tests/cpu/fake/%slibfakeapp.so", build,
           arr == DLOPEN12 ? "cuda12/" : "");
  if (arr == DIRECT) {
    snprintf(exe, sizeof exe, "%s/tests/cpu/fake/app_direct", build);
    const char *argv[] = {exe, out, expect, NULL};
    run(argv, env, shim, r);
  } else {
    snprintf(exe, sizeof exe, "%s/tests/cpu/fake/app_dlopen", build);
    const char *argv[] = {exe, lib, out, expect, NULL};
    run(argv, env, shim, r);
  }
}

static char *baseline;
static long baseline_len;

/* The run's results equal the baseline's, byte for byte. */
static int same_results(const char *tag) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/%s.out", tmp, tag);
  long len;
  char *s = mt_t_read_file(path, &len);
  int same = s && baseline && len == baseline_len && memcmp(s, baseline, (size_t)len) == 0;
  free(s);
  return same;
}

static void tmp_path(char *out, size_t size, const char *name) {
  snprintf(out, size, "%s/%s", tmp, name);
}

/* --- reading the statistics file ---------------------------------------------------------- */

static long json_int(const char *s, const char *key) {
  char pat[128];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *p = s ? strstr(s, pat) : NULL;
  return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

typedef struct {
  long calls, routed_eligible, unrouted;
  long reasons[16];
} expectation;

static const char *const reason_keys[] = {"backward_dgrad", "backward_wgrad", "dtype",
                                          "compute_type",   "layout",         "epilogue",
                                          "pointer_mode",   "k_alignment",    NULL};
static const char *const reason_names[] = {"backward dgrad", "backward wgrad", "dtype",
                                           "compute type",   "layout",         "epilogue",
                                           "pointer mode",   "k alignment",    NULL};

static void read_expectation(const char *tag, expectation *e) {
  char path[PATH_MAX + 64], entry[128], reason[64];
  snprintf(path, sizeof path, "%s/%s.expect", tmp, tag);
  memset(e, 0, sizeof *e);
  FILE *f = fopen(path, "r");
  if (!f)
    return;
  while (fscanf(f, "%127s %63s", entry, reason) == 2) {
    if (!strcmp(entry, "-"))
      continue;
    e->calls++;
    if (!strcmp(reason, "ROUTED"))
      e->routed_eligible++;
    else if (!strcmp(reason, "unrouted"))
      e->unrouted++;
    for (int i = 0; reason_keys[i]; i++)
      if (!strcmp(reason, reason_keys[i]))
        e->reasons[i]++;
  }
  fclose(f);
}

/* Lines of a stats file: the first and the last, and how many. */
static int stats_lines(const char *path, char **first, char **last) {
  char *s = mt_t_read_file(path, NULL);
  *first = *last = NULL;
  if (!s)
    return 0;
  int n = 0;
  for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n"), n++) {
    if (!*first)
      *first = strdup(line);
    free(*last);
    *last = strdup(line);
  }
  free(s);
  return n;
}

/* Every line parses as JSON (PYTHON, or python3: make test sets it; without one, no). */
static int json_parses(const char *path) {
  const char *py = getenv("PYTHON") ? getenv("PYTHON") : "python3";
  char cmd[2 * PATH_MAX];
  snprintf(cmd, sizeof cmd,
           "%s -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' '%s' 2>/dev/null",
           py, path);
  return system(cmd) == 0;
}

static void check_counts(const char *path, const char *tag, int bf16, int census) {
  expectation e;
  read_expectation(tag, &e);
  char *start, *summary;
  int lines = stats_lines(path, &start, &summary);
  CHECKF(lines == 2, "%s: %d lines", path, lines);
  CHECKF(json_parses(path), "%s is not JSON lines", path);
  CHECK(start && strstr(start, "{\"event\": \"start\""));
  CHECK(start && strstr(start, bf16 ? "\"spec\": \"bf16\"" : "\"spec\": \"nvfp4-row\""));
  CHECK(start && strstr(start, "\"fingerprint\": \"") && strstr(start, "\"version\": "));
  CHECK(summary && strstr(summary, "{\"event\": \"summary\""));
  if (!summary)
    return;
  CHECKF(json_int(summary, "gemm_calls") == e.calls, "%ld calls, expected %ld",
         json_int(summary, "gemm_calls"), e.calls);
  long routed = bf16 ? e.routed_eligible : 0;
  CHECKF(json_int(summary, "routed") == routed, "%ld routed, expected %ld",
         json_int(summary, "routed"), routed);
  CHECKF(json_int(summary, "passthrough") == e.calls - routed, "%ld passed through",
         json_int(summary, "passthrough"));
  CHECKF(mt_t_fallback(summary, "no engine") == (bf16 ? 0 : e.routed_eligible), "no engine %ld",
         mt_t_fallback(summary, "no engine"));
  for (int i = 0; reason_keys[i]; i++)
    CHECKF(mt_t_fallback(summary, reason_names[i]) == e.reasons[i], "%s: %ld, expected %ld",
           reason_names[i], mt_t_fallback(summary, reason_names[i]), e.reasons[i]);
  if (!census) {
    free(start), free(summary);
    return;
  }
  /* GemmEx calls 1, 2 and those failing on compute type, pointer mode and lda share one shape */
  CHECK(strstr(summary, "{\"entry\": \"cublasGemmEx\", \"ops\": \"TN\", \"m\": 64, \"n\": 5, "
                        "\"k\": 32, \"types\": \"bf16*bf16->bf16\", \"role\": \"forward\", "
                        "\"count\": 5}"));
  CHECK(strstr(summary, "{\"entry\": \"cublasLtMatmul\", \"ops\": \"NN\", \"m\": 32, \"n\": 5, "
                        "\"k\": 64, \"types\": \"bf16*bf16->bf16\", \"role\": \"dgrad\", "
                        "\"count\": 1}"));
  /* 64x32 is seen with n = 3, 4, 5, 6, 9; 16x16 and 48x24 with one n each */
  CHECKF(strstr(summary, "\"suggested_routes\": [\"route 64x32\"]"), "%s",
         strstr(summary, "suggested_routes"));
  free(start), free(summary);
}

static const char *const routes_env = "MINITE_ROUTE=64x32,48x24";

/* --- tests ------------------------------------------------------------------------------ */

static void without_shim(void) {
  run_result r;
  app(DIRECT, "base", NULL, 0, &r);
  CHECKF(r.status == 0, "exit %d: %s", r.status, r.err);
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/base.out", tmp);
  baseline = mt_t_read_file(path, &baseline_len);
  CHECK(baseline && baseline_len > 1000);
  app(DLOPEN, "base_dlopen", NULL, 0, &r);
  CHECKF(r.status == 0, "exit %d: %s", r.status, r.err);
  CHECK(same_results("base_dlopen"));
}

static void inert_changes_nothing_and_writes_nothing(void) {
  char stats[PATH_MAX + 64], log[PATH_MAX + 64], env1[PATH_MAX + 80], env2[PATH_MAX + 80];
  tmp_path(stats, sizeof stats, "inert.jsonl");
  tmp_path(log, sizeof log, "inert.log");
  snprintf(env1, sizeof env1, "MINITE_STATS=%s", stats);
  snprintf(env2, sizeof env2, "MINITE_LOG_FILE=%s", log);
  const char *env[] = {env1, env2, "MINITE_LOG_LEVEL=TRACE", "MINITE_STRICT=1", NULL};
  for (int arr = DIRECT; arr <= DLOPEN; arr++) {
    run_result r;
    app(arr, "inert", env, 1, &r);
    CHECKF(r.status == 0, "exit %d: %s", r.status, r.err);
    CHECKF(r.err[0] == '\0', "stderr: %s", r.err);
    CHECK(r.out_bytes == 0);
    CHECK(same_results("inert"));
    CHECK(!exists(stats) && !exists(log));
  }
}

static void active(enum arrangement arr, int bf16) {
  const char *tag = arr == DIRECT ? (bf16 ? "bf16_direct" : "nvfp4_direct")
                                  : (bf16 ? "bf16_dlopen" : "nvfp4_dlopen");
  char stats[PATH_MAX + 64], env1[PATH_MAX + 80];
  snprintf(stats, sizeof stats, "%s/%s.jsonl", tmp, tag);
  snprintf(env1, sizeof env1, "MINITE_STATS=%s", stats);
  const char *env[] = {env1, bf16 ? "MINITE_SPEC=bf16" : "MINITE_SPEC=nvfp4-row", routes_env, NULL};
  run_result r;
  app(arr, tag, env, 1, &r);
  CHECKF(r.status == 0, "exit %d: %s", r.status, r.err);
  if (bf16) {
    CHECKF(r.err[0] == '\0', "stderr at the default level: %s", r.err);
  } else { /* no libcuda here: one warning that routed calls stay in cuBLAS, and nothing else */
    const char *w = strstr(r.err, "minite WARN no CUDA driver");
    CHECKF(w && !strstr(w + 1, "minite WARN"), "%s: expected one 'no CUDA driver' warning: %s", tag,
           r.err);
  }
  CHECK(r.out_bytes == 0);
  CHECKF(same_results(tag), "%s: results differ from the run without the shim", tag);
  check_counts(stats, tag, bf16, 1);
}

static void active_dlopen_cuda12_nvfp4(void) {
  char stats[PATH_MAX + 64], env1[PATH_MAX + 80];
  tmp_path(stats, sizeof stats, "cuda12.jsonl");
  snprintf(env1, sizeof env1, "MINITE_STATS=%s", stats);
  const char *env[] = {env1, "MINITE_SPEC=nvfp4-row", routes_env, NULL};
  run_result r;
  app(DLOPEN12, "cuda12", env, 1, &r);
  const char *w = strstr(r.err, "minite WARN no CUDA driver"); /* the one warning: no libcuda */
  CHECKF(r.status == 0 && w && !strstr(w + 1, "minite WARN"), "exit %d: %s", r.status, r.err);
  CHECK(same_results("cuda12"));
  check_counts(stats, "cuda12", 0, 1);
}

static void active_direct_nvfp4(void) { active(DIRECT, 0); }
static void active_dlopen_nvfp4(void) { active(DLOPEN, 0); }
static void active_direct_bf16(void) { active(DIRECT, 1); }
static void active_dlopen_bf16(void) { active(DLOPEN, 1); }

/* A bad setting: its message, the shim inert (no stats file), results unchanged, exit 0. */
static void bad_setting(const char *tag, const char *setting, const char *message) {
  char stats[PATH_MAX + 64], env1[PATH_MAX + 80];
  snprintf(stats, sizeof stats, "%s/%s.jsonl", tmp, tag);
  snprintf(env1, sizeof env1, "MINITE_STATS=%s", stats);
  /* the setting under test comes last, so that it overrides the good ones before it */
  const char *env[] = {env1, "MINITE_SPEC=nvfp4-row", routes_env, setting, NULL};
  run_result r;
  app(DIRECT, tag, env, 1, &r);
  CHECKF(r.status == 0, "%s: exit %d", setting, r.status);
  CHECKF(strstr(r.err, message), "%s: no '%s' in: %s", setting, message, r.err);
  CHECKF(strstr(r.err, "inert"), "%s: the shim does not say it is inert: %s", setting, r.err);
  const char *second = strstr(r.err, "minite WARN");
  CHECKF(second && !strstr(second + 1, "minite WARN"), "%s: more than one message: %s", setting,
         r.err);
  CHECKF(same_results(tag), "%s changed results", setting);
  CHECK(r.out_bytes == 0);
  if (strncmp(setting, "MINITE_STATS=", 13))
    CHECKF(!exists(stats), "%s: a stats file was written", setting);
}

static void bad_spec_name(void) {
  bad_setting("bad_spec", "MINITE_SPEC=nvfp5", "MINITE_SPEC=nvfp5: neither a built-in spec");
}

static void bad_spec_file(void) {
  static char setting[2 * PATH_MAX];
  char path[PATH_MAX + 64];
  tmp_path(path, sizeof path, "bad.spec");
  FILE *f = fopen(path, "w");
  fputs("# a spec with a typo\nformat = nvfp5\n", f);
  fclose(f);
  snprintf(setting, sizeof setting, "MINITE_SPEC=%s", path);
  bad_setting("bad_spec_file", setting, "line 2");
}

/* The start record's fingerprint (16 hex digits) of a statistics file; "" when there is none. */
static void start_fingerprint(const char *path, char out[17]) {
  char *start = NULL, *summary = NULL;
  stats_lines(path, &start, &summary);
  const char *f = start ? strstr(start, "\"fingerprint\": \"") : NULL;
  snprintf(out, 17, "%s", f ? f + 16 : "");
  free(start), free(summary);
}

/* A spec file from when weight_cache was a knob loads, with the fingerprint of the same spec
 * without that line (active_direct_nvfp4's run, the built-in nvfp4-row); the line is said once to
 * be ignored, and the mode stays MINITE_WEIGHT_CACHE's default. */
static void spec_file_weight_cache_line(void) {
  static char setting[2 * PATH_MAX];
  char path[PATH_MAX + 64], stats[PATH_MAX + 64], env1[PATH_MAX + 80];
  tmp_path(path, sizeof path, "old.spec");
  FILE *f = fopen(path, "w");
  fputs("format = nvfp4\nelement = e2m1\nblock = 16\nblock_scale = e4m3\nact_scale = row\n"
        "weight_scale = tensor\nweight_block = 1x16\nrounding = rne\naccumulate = fp32\n"
        "backward = bf16\nweight_cache = frozen\n",
        f);
  fclose(f);
  snprintf(setting, sizeof setting, "MINITE_SPEC=%s", path);
  tmp_path(stats, sizeof stats, "old_spec.jsonl");
  snprintf(env1, sizeof env1, "MINITE_STATS=%s", stats);
  const char *env[] = {env1, setting, routes_env, NULL};
  run_result r;
  app(DIRECT, "old_spec", env, 1, &r);
  CHECKF(r.status == 0, "exit %d: %s", r.status, r.err);
  const char *w = strstr(r.err, ": line 11: weight_cache is no part of the spec");
  CHECKF(w && strstr(w, "MINITE_WEIGHT_CACHE") && !strstr(w + 12, "weight_cache is no part"), "%s",
         r.err);
  CHECK(same_results("old_spec"));
  char fp[17], builtin[PATH_MAX + 64], fp_builtin[17];
  snprintf(builtin, sizeof builtin, "%s/nvfp4_direct.jsonl", tmp);
  start_fingerprint(stats, fp);
  start_fingerprint(builtin, fp_builtin);
  CHECKF(fp[0] && !strcmp(fp, fp_builtin), "%s, nvfp4-row's %s", fp, fp_builtin);
  char *start = NULL, *summary = NULL;
  stats_lines(stats, &start, &summary);
  CHECKF(summary && strstr(summary, "\"weight_cache\": \"requantize\""), "%s", summary);
  free(start), free(summary);
}

static void bad_route(void) { bad_setting("bad_route", "MINITE_ROUTE=64by32", "MINITE_ROUTE"); }

static void bad_stats_path(void) {
  static char setting[2 * PATH_MAX];
  snprintf(setting, sizeof setting, "MINITE_STATS=%s/no/such/dir/s.jsonl", tmp);
  bad_setting("bad_stats", setting, "is in a directory that does not exist");
}

/* --- hostile output paths ------------------------------------------------------------------- */

typedef struct {
  const char *what;   /* made in the temporary folder by make_hostile */
  const char *reason; /* what the refusal says */
} hostile;

static const hostile hostiles[] = {
    {"fifo", "is a FIFO or pipe, not a regular file"},
    {"dir", "is a directory, not a regular file"},
    {"loop", "is a symbolic link"},
    {"dangling", "is a symbolic link"},
    {"link", "is a symbolic link"},
    {"device", "is a character device, not a regular file"},
    {"socket", "is a socket, not a regular file"},
    {"long", "has a file name longer than 255 bytes"},
    {NULL, NULL},
};

/* The thing named `what` at a fresh path of the temporary folder (tag: for whom), into path. */
static void make_hostile(const char *what, const char *tag, char *path, size_t size) {
  char target[PATH_MAX + 420];
  snprintf(path, size, "%s/%s.%s", tmp, tag, what);
  snprintf(target, sizeof target, "%s.target", path);
  unlink(path), unlink(target);
  if (!strcmp(what, "fifo"))
    CHECK(mkfifo(path, 0644) == 0);
  else if (!strcmp(what, "dir"))
    CHECK(mkdir(path, 0755) == 0 || errno == EEXIST);
  else if (!strcmp(what, "loop"))
    CHECK(symlink(path, path) == 0);
  else if (!strcmp(what, "dangling"))
    CHECK(symlink(target, path) == 0);
  else if (!strcmp(what, "link"))
    CHECK(close(open(target, O_WRONLY | O_CREAT, 0644)) == 0 && symlink(target, path) == 0);
  else if (!strcmp(what, "device"))
    snprintf(path, size, "/dev/null");
  else if (!strcmp(what, "socket")) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%.100s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECKF(bind(fd, (struct sockaddr *)&a, sizeof a) == 0, "bind %s", path);
  } else {
    char name[301];
    memset(name, 'n', 300);
    name[300] = '\0';
    snprintf(path, size, "%s/%s", tmp, name);
  }
}

/* Each hostile MINITE_STATS: refused at start with its reason, the shim inert (no hang, no file
 * made through a link); under MINITE_STRICT=1, exit status 2 with the same words. */
static void hostile_stats_paths(void) {
  for (const hostile *h = hostiles; h->what; h++) {
    static char setting[2 * PATH_MAX];
    char path[PATH_MAX + 400], target[PATH_MAX + 420], tag[64];
    make_hostile(h->what, "stats", path, sizeof path);
    snprintf(setting, sizeof setting, "MINITE_STATS=%s", path);
    snprintf(tag, sizeof tag, "hostile_stats_%s", h->what);
    bad_setting(tag, setting, h->reason);
    snprintf(target, sizeof target, "%s.target", path);
    if (!strcmp(h->what, "dangling"))
      CHECKF(!exists(target), "a file was made through the dangling link %s", path);
    const char *env[] = {"MINITE_STRICT=1", "MINITE_SPEC=bf16", routes_env, setting, NULL};
    run_result r;
    app(DIRECT, tag, env, 1, &r);
    CHECKF(r.status == 2 && strstr(r.err, h->reason) &&
               strstr(r.err, "MINITE_STRICT=1: ending the program with exit status 2"),
           "%s under MINITE_STRICT=1: exit %d: %s", h->what, r.status, r.err);
  }
}

/* Each hostile MINITE_LOG_FILE: one warning at start, with its reason, and the log on stderr
 * (never a hang, even at INFO, which logs from the start); under MINITE_STRICT=1, exit 2. */
static void hostile_log_paths(void) {
  for (const hostile *h = hostiles; h->what; h++) {
    char path[PATH_MAX + 400], log_env[PATH_MAX + 420], stats[PATH_MAX + 80],
        stats_env[PATH_MAX + 100], tag[64];
    make_hostile(h->what, "log", path, sizeof path);
    snprintf(log_env, sizeof log_env, "MINITE_LOG_FILE=%s", path);
    snprintf(tag, sizeof tag, "hostile_log_%s", h->what);
    snprintf(stats, sizeof stats, "%s/%s.jsonl", tmp, tag);
    snprintf(stats_env, sizeof stats_env, "MINITE_STATS=%s", stats);
    const char *env[] = {log_env,    stats_env, "MINITE_LOG_LEVEL=INFO", "MINITE_SPEC=bf16",
                         routes_env, NULL};
    run_result r;
    app(DIRECT, tag, env, 1, &r);
    const char *w = strstr(r.err, " minite WARN ");
    CHECKF(r.status == 0 && w && strstr(w, h->reason) && strstr(w, "; logging to stderr\n") &&
               !strstr(w + 1, " minite WARN ") && strstr(r.err, " minite INFO summary: "),
           "%s: exit %d: %s", h->what, r.status, r.err);
    CHECK(same_results(tag));
    char *first, *last;
    CHECKF(stats_lines(stats, &first, &last) == 2, "%s: the statistics", h->what);
    free(first), free(last);
    const char *strict[] = {log_env, "MINITE_STRICT=1", "MINITE_SPEC=bf16", NULL};
    app(DIRECT, tag, strict, 1, &r);
    CHECKF(r.status == 2 && strstr(r.err, h->reason) && strstr(r.err, "MINITE_STRICT=1: ending"),
           "%s under MINITE_STRICT=1: exit %d: %s", h->what, r.status, r.err);
  }
}

/* A relative MINITE_STATS is made absolute at start: a program that changes its directory before
 * its first GEMM call still writes where it was started. */
static void relative_stats_path_after_chdir(void) {
  char sub[PATH_MAX + 64], there[PATH_MAX + 80], here[PATH_MAX + 80], cd[PATH_MAX + 80];
  snprintf(sub, sizeof sub, "%s/elsewhere", tmp);
  mkdir(sub, 0755);
  snprintf(cd, sizeof cd, "FAKE_APP_CHDIR=%s", sub);
  snprintf(here, sizeof here, "%s/relative.jsonl", tmp);
  snprintf(there, sizeof there, "%s/relative.jsonl", sub);
  const char *env[] = {"MINITE_STATS=relative.jsonl", cd, "MINITE_SPEC=bf16", routes_env, NULL};
  run_result r;
  app(DIRECT, "relative", env, 1, &r);
  CHECKF(r.status == 0 && r.err[0] == '\0', "exit %d: %s", r.status, r.err);
  char *first, *last;
  CHECKF(stats_lines(here, &first, &last) == 2 && !exists(there),
         "the statistics went to %s, not to the directory of the start", there);
  free(first), free(last);
}

/* One path for the log and the statistics: log lines would break the JSON lines. Refused as a bad
 * MINITE_STATS, with the fix. */
static void log_and_stats_one_path(void) {
  static char setting[2 * PATH_MAX];
  char log_env[PATH_MAX + 80];
  snprintf(setting, sizeof setting, "MINITE_STATS=%s/one.file", tmp);
  snprintf(log_env, sizeof log_env, "MINITE_LOG_FILE=%s/one.file", tmp);
  const char *env[] = {log_env, setting, "MINITE_SPEC=bf16", routes_env, NULL};
  run_result r;
  app(DIRECT, "one_file", env, 1, &r);
  char *text = mt_t_read_file(setting + strlen("MINITE_STATS="), NULL);
  CHECKF(r.status == 0 && r.err[0] == '\0' && text && strstr(text, "is the file the log goes to") &&
             strstr(text, "inert") && !strstr(text, "{\"event\""),
         "exit %d: %s; the file: %s", r.status, r.err, text ? text : "none");
  free(text);
  CHECK(same_results("one_file"));
}

/* A bad log level is warned about and the default used; the shim stays active. */
static void bad_log_level(void) {
  char stats[PATH_MAX + 64], env1[PATH_MAX + 80];
  tmp_path(stats, sizeof stats, "bad_level.jsonl");
  snprintf(env1, sizeof env1, "MINITE_STATS=%s", stats);
  const char *env[] = {"MINITE_LOG_LEVEL=LOUD", env1, "MINITE_SPEC=bf16", routes_env, NULL};
  run_result r;
  app(DIRECT, "bad_level", env, 1, &r);
  CHECK(r.status == 0);
  CHECKF(strstr(r.err, "invalid value 'LOUD' for MINITE_LOG_LEVEL: use one of NONE, WARN, INFO, "
                       "TRACE; using the default WARN"),
         "%s", r.err);
  CHECK(same_results("bad_level"));
  char *first, *last;
  CHECK(stats_lines(stats, &first, &last) == 2);
  free(first), free(last);
}

static void strict_exits_2(void) {
  const char *bad[] = {"MINITE_SPEC=nvfp5", "MINITE_ROUTE=1x", "MINITE_LOG_LEVEL=LOUD", NULL};
  for (int i = 0; bad[i]; i++) {
    const char *env[] = {"MINITE_STRICT=1", bad[i], i ? "MINITE_SPEC=bf16" : routes_env, NULL};
    run_result r;
    app(DIRECT, "strict", env, 1, &r);
    CHECKF(r.status == 2, "%s: exit %d", bad[i], r.status);
    CHECKF(strstr(r.err, "MINITE_STRICT=1: ending the program with exit status 2"), "%s", r.err);
  }
  /* at MINITE_LOG_LEVEL=NONE too, the program ends with a word on stderr naming the problem */
  const char *none[] = {"MINITE_STRICT=1", "MINITE_LOG_LEVEL=NONE", "MINITE_SPEC=bf16",
                        "MINITE_SHADOW=2", NULL};
  run_result r;
  app(DIRECT, "strict_none", none, 1, &r);
  CHECKF(r.status == 2 && strstr(r.err, "invalid value '2' for MINITE_SHADOW") &&
             strstr(r.err, "MINITE_STRICT=1: ending the program with exit status 2"),
         "exit %d: %s", r.status, r.err);
  const char *good[] = {"MINITE_STRICT=1", "MINITE_SPEC=bf16", NULL};
  app(DIRECT, "strict_ok", good, 1, &r);
  CHECKF(r.status == 0 && r.err[0] == '\0', "exit %d: %s", r.status, r.err);
}

static void forked_child_writes_nothing(void) {
  char stats[PATH_MAX + 64], env1[PATH_MAX + 80];
  tmp_path(stats, sizeof stats, "fork.jsonl");
  snprintf(env1, sizeof env1, "MINITE_STATS=%s", stats);
  const char *env[] = {env1, "MINITE_SPEC=bf16", routes_env, "FAKE_APP_FORK=1", NULL};
  run_result r;
  app(DIRECT, "fork", env, 1, &r);
  CHECKF(r.status == 0, "exit %d: %s", r.status, r.err);
  char *first, *last;
  int lines = stats_lines(stats, &first, &last);
  CHECKF(lines == 2, "%d lines: the child wrote to its parent's file", lines);
  expectation e;
  read_expectation("fork", &e);
  CHECK(json_int(last, "gemm_calls") == e.calls);
  CHECKF(json_int(last, "pid") == r.pid, "pid %ld, parent %ld", json_int(last, "pid"), (long)r.pid);
  free(first), free(last);
}

/* Threads calling at once: every call counted, every argument intact (the app checks). */
static void threads_count_every_call(void) {
  char stats[PATH_MAX + 64], env1[PATH_MAX + 80];
  tmp_path(stats, sizeof stats, "threads.jsonl");
  snprintf(env1, sizeof env1, "MINITE_STATS=%s", stats);
  const char *env[] = {env1, "MINITE_SPEC=nvfp4-row", routes_env, "FAKE_APP_THREADS=8", NULL};
  for (int arr = DIRECT; arr <= DLOPEN; arr++) {
    run_result r;
    unlink(stats); /* the file is appended to: one run's records each time */
    app(arr, "threads", env, 1, &r);
    CHECKF(r.status == 0, "exit %d: %s", r.status, r.err);
    CHECK(same_results("threads"));
    check_counts(stats, "threads", 0, 0);
  }
  char *first, *last;
  stats_lines(stats, &first, &last);
  CHECKF(last && strstr(last, "\"ops\": \"TN\", \"m\": 64, \"n\": 5, \"k\": 32, \"types\": "
                              "\"bf16*bf16->bf16\", \"role\": \"forward\", \"count\": 4005}"),
         "census: %.300s", last ? strstr(last, "census") : "");
  /* each row says what it is to the routes: the dgrad, the [in, out] forward */
  CHECKF(last &&
             strstr(last, "\"ops\": \"NN\", \"m\": 32, \"n\": 5, \"k\": 64, \"types\": "
                          "\"bf16*bf16->bf16\", \"role\": \"dgrad\"") &&
             strstr(last, "\"ops\": \"NN\", \"m\": 64, \"n\": 5, \"k\": 32, \"types\": "
                          "\"bf16*bf16->bf16\", \"role\": \"forward [in, out]\""),
         "census: %.600s", last ? strstr(last, "census") : "");
  free(first), free(last);
}

static void log_file_and_templates(void) {
  char env1[PATH_MAX + 80], env2[PATH_MAX + 80], host[256];
  snprintf(env1, sizeof env1, "MINITE_LOG_FILE=%s/log.%%h.%%p.%%r.%%%%", tmp);
  snprintf(env2, sizeof env2, "MINITE_STATS=%s/stats.%%r.%%p", tmp);
  const char *env[] = {env1,       env2,     "MINITE_LOG_LEVEL=TRACE", "MINITE_SPEC=nvfp4-row",
                       routes_env, "RANK=3", "MINITE_ROLE=learner",    NULL};
  run_result r;
  app(DLOPEN, "logfile", env, 1, &r);
  CHECKF(r.status == 0 && r.err[0] == '\0', "exit %d, stderr: %s", r.status, r.err);
  gethostname(host, sizeof host);
  host[sizeof host - 1] = '\0';
  if (strchr(host, '.'))
    *strchr(host, '.') = '\0';
  char log[PATH_MAX + 600], stats[PATH_MAX + 64], prefix[400];
  snprintf(log, sizeof log, "%s/log.%s.%ld.3.%%", tmp, host, (long)r.pid);
  snprintf(stats, sizeof stats, "%s/stats.3.%ld", tmp, (long)r.pid);
  snprintf(prefix, sizeof prefix, "%s:%ld:", host, (long)r.pid);
  char *text = mt_t_read_file(log, NULL);
  CHECKF(text, "no log file %s", log);
  if (text) {
    CHECKF(!strncmp(text, prefix, strlen(prefix)), "line format: %.80s", text);
    CHECK(strstr(text, " minite INFO MINITE_SPEC set by environment to nvfp4-row\n"));
    CHECK(strstr(text, " minite INFO minite ") && strstr(text, " active: spec nvfp4-row"));
    CHECK(strstr(text, " minite TRACE cublasGemmEx NN m=32 n=5 k=64: backward dgrad\n"));
    CHECK(strstr(text, " minite INFO summary: 39 GEMM calls, 0 routed, 39 passed through"));
  }
  free(text);
  char *first, *last;
  CHECK(stats_lines(stats, &first, &last) == 2);
  CHECK(first && strstr(first, "\"rank\": 3, \"local_rank\": -1, \"world_size\": -1, ") &&
        strstr(first, "\"role\": \"learner\""));
  free(first), free(last);
}

/* A process that never calls cuBLAS (a shell, a compiler, a launcher under the same LD_PRELOAD)
 * writes no file and says nothing, even with a spec that would warn. */
static void no_gemm_no_file(void) {
  char stats[PATH_MAX + 64], env1[PATH_MAX + 80], exe[PATH_MAX + 64];
  tmp_path(stats, sizeof stats, "nogemm.jsonl");
  snprintf(env1, sizeof env1, "MINITE_STATS=%s", stats);
  snprintf(exe, sizeof exe, "%s/tests/cpu/fake/app_dlopen", build);
  const char *argv[] = {exe, NULL}; /* usage error: exits 2 before loading anything */
  const char *env[] = {env1, "MINITE_SPEC=nvfp4-row", NULL};
  run_result r;
  run(argv, env, 1, &r);
  CHECK(r.status == 2);
  CHECKF(r.err[0] == '\0', "%s", r.err);
  CHECK(!exists(stats));
}

/* An empty variable is an unset one: no warning, the default. */
static void empty_values_are_unset(void) {
  char stats[PATH_MAX + 64], env1[PATH_MAX + 80];
  tmp_path(stats, sizeof stats, "empty.jsonl");
  snprintf(env1, sizeof env1, "MINITE_STATS=%s", stats);
  const char *env[] = {env1,
                       "MINITE_SPEC=bf16",
                       routes_env,
                       "MINITE_SHADOW=",
                       "MINITE_PROBE=",
                       "MINITE_DIGEST=",
                       "MINITE_LOG_FILE=",
                       "MINITE_LOG_LEVEL=",
                       "MINITE_STRICT=1",
                       NULL};
  run_result r;
  app(DIRECT, "empty", env, 1, &r);
  CHECKF(r.status == 0 && r.err[0] == '\0', "exit %d: %s", r.status, r.err);
  char *first, *last;
  CHECK(stats_lines(stats, &first, &last) == 2);
  free(first), free(last);
}

/* A launcher variable that is no number is warned about, naming it, and read as rank 0. */
static void invalid_rank_warned(void) {
  char stats[PATH_MAX + 64], env1[PATH_MAX + 80];
  tmp_path(stats, sizeof stats, "rank.jsonl");
  snprintf(env1, sizeof env1, "MINITE_STATS=%s", stats);
  const char *env[] = {env1, "MINITE_SPEC=bf16", routes_env, "RANK=three", NULL};
  run_result r;
  app(DIRECT, "rank", env, 1, &r);
  const char *w = strstr(r.err, " minite WARN RANK=three is not a whole number");
  CHECKF(r.status == 0 && w && strstr(w, "fix or unset RANK") && !strstr(w + 1, " minite WARN"),
         "exit %d: %s", r.status, r.err);
  char *first, *last;
  CHECK(stats_lines(stats, &first, &last) == 2 && strstr(first, "\"rank\": 0,"));
  free(first), free(last);
}

/* A value with control characters cannot forge a log line or reach a terminal raw, and a long one
 * is shortened in the start line: every line of stderr is the shim's, whole. */
static void values_escaped_and_shortened_in_log(void) {
  static char role[120 * 1024]; /* a variable may hold at most 128 KiB */
  const char *forged = "MINITE_ROLE=x\nhost:1:1 minite WARN forged\x1b[31m";
  memset(role, 'r', sizeof role - 1);
  memcpy(role, "MINITE_ROLE=", 12);
  const char *const roles[] = {forged, role};
  for (int i = 0; i < 2; i++) {
    const char *env[] = {roles[i], "MINITE_LOG_LEVEL=INFO", "MINITE_SPEC=bf16", NULL};
    run_result r;
    app(DIRECT, "roles", env, 1, &r);
    CHECKF(r.status == 0, "exit %d", r.status);
    int lines = 0, foreign = 0;
    for (const char *line = r.err; *line; line = strchr(line, '\n') + 1, lines++) {
      foreign +=
          !strstr(line, " minite ") || strstr(line, " minite ") - line > 200 || !strchr(line, '\n');
      if (!strchr(line, '\n'))
        break;
    }
    CHECKF(lines >= 3 && !foreign && !strchr(r.err, '\x1b'), "%d lines, %d not the shim's: %.600s",
           lines, foreign, r.err);
    const char *start = strstr(r.err, " active: spec bf16");
    const char *end = start ? strchr(start, '\n') : NULL;
    CHECKF(end && end - start < 1000, "the start line: %.600s", start ? start : r.err);
    CHECKF(i ? strstr(r.err, " bytes)") != NULL
             : strstr(r.err, "role 'x\\nhost:1:1 minite WARN forged\\x1b[31m'") != NULL,
           "%.600s", r.err);
  }
}

static void nvfp4_without_routes_warns(void) {
  const char *env[] = {"MINITE_SPEC=nvfp4-row", NULL};
  run_result r;
  app(DIRECT, "noroutes", env, 1, &r);
  CHECK(r.status == 0);
  CHECKF(strstr(r.err, "routes no GEMM") && strstr(r.err, "MINITE_SPEC=bf16"), "%s", r.err);
  CHECK(same_results("noroutes"));
}

/* The start record lists every route of the spec, the longest a route can be included: 64 routes
 * of ten-digit dimensions overflowed its buffer once (AddressSanitizer caught it). */
static void start_record_of_64_long_routes(void) {
  char stats[PATH_MAX + 64], env1[PATH_MAX + 80], routes[64 * 24 + 32];
  tmp_path(stats, sizeof stats, "longroutes.jsonl");
  snprintf(env1, sizeof env1, "MINITE_STATS=%s", stats);
  size_t used = (size_t)snprintf(routes, sizeof routes, "MINITE_ROUTE=");
  for (unsigned i = 0; i < 64; i++)
    used += (size_t)snprintf(routes + used, sizeof routes - used, "%s%ux%u", i ? "," : "",
                             4000000000u + i * 16, 4000000000u + i * 16);
  const char *env[] = {env1, routes, "MINITE_SPEC=nvfp4-row", NULL};
  run_result r;
  app(DIRECT, "longroutes", env, 1, &r);
  CHECK(r.status == 0);
  char *start = NULL, *summary = NULL;
  stats_lines(stats, &start, &summary);
  CHECKF(json_parses(stats), "%s is not JSON lines", stats);
  CHECKF(start && strstr(start, "\"4000001008x4000001008\"], \"version\": "), "%s", start);
  free(start), free(summary);
}

int main(void) {
  const char *b = getenv("MT_BUILD") ? getenv("MT_BUILD") : "build";
  if (!realpath(b, build)) {
    printf("no build directory %s\n", b);
    return 1;
  }
  mt_t_preload_value(build, preload, sizeof preload);
  snprintf(tmp, sizeof tmp, "/tmp/mt_shim_preload.XXXXXX");
  if (!mkdtemp(tmp)) {
    printf("mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  RUN(without_shim);
  RUN(inert_changes_nothing_and_writes_nothing);
  RUN(active_direct_nvfp4);
  RUN(active_dlopen_nvfp4);
  RUN(active_direct_bf16);
  RUN(active_dlopen_bf16);
  RUN(active_dlopen_cuda12_nvfp4);
  RUN(bad_spec_name);
  RUN(bad_spec_file);
  RUN(spec_file_weight_cache_line);
  RUN(bad_route);
  RUN(bad_stats_path);
  RUN(hostile_stats_paths);
  RUN(hostile_log_paths);
  RUN(relative_stats_path_after_chdir);
  RUN(log_and_stats_one_path);
  RUN(bad_log_level);
  RUN(strict_exits_2);
  RUN(forked_child_writes_nothing);
  RUN(threads_count_every_call);
  RUN(log_file_and_templates);
  RUN(no_gemm_no_file);
  RUN(empty_values_are_unset);
  RUN(invalid_rank_warned);
  RUN(values_escaped_and_shortened_in_log);
  RUN(nvfp4_without_routes_warns);
  RUN(start_record_of_64_long_routes);
  free(baseline);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (!mt_t_failed && system(cmd) != 0)
    printf("could not remove %s\n", tmp);
  return mt_test_done();
}
