/* test_fork.c — the shim across fork(2) (shim/fork.h), on the CPU: children forked while other
 * threads of the parent route, log or open files come back. Each scenario runs in a child under
 * the preloaded shim with the fake cuBLAS and the fake libcuda.so.1 of tests/cpu/fake, which
 * forks grandchildren; a hang is a SIGALRM (grandchildren 10 s, scenarios 120 s), a failure.
 *
 *   fork_waits_for_the_engine    a thread routes without pause, each launch taking 500 us in the
 *                                fake driver; in every child, no thread of the parent was inside
 *                                the driver at the fork (the engine gate)
 *   fork_while_threads_log       a thread routes and logs a TRACE line per call while the main
 *                                thread forks 40 times; each child routes (a warning and a TRACE
 *                                line of its own) and comes back; every line of the log is whole.
 *                                Twice: MINITE_LOG_FILE a regular file, and a FIFO with no reader,
 *                                which the start refuses at once (lines on stderr) instead of
 *                                blocking the process at its first line
 *   forks_under_load_come_back   four threads route with every instrument on (the instruments'
 *                                writer thread busy) while the main thread forks 200 times; each
 *                                child makes a call (cuBLAS's bits) and exits; the parent routes on
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/cpu/fake/fake.h"
#include "tests/cpu/fake/fake_cuda.h"
#include "tests/cpu/scenario.h"

#define OUT 256
#define IN 512
#define ROUTES "MINITE_ROUTE=256x512"
#define S1 ((CUstream)(uintptr_t)0x1000)
#define NLOOPERS 4

/* ======================================================================================== */
/* The child.                                                                               */
/* ======================================================================================== */

static fake_cuda_launching_fn launching;
static fake_cuda_fail_alloc_fn fail_alloc;
static cublasHandle_t handle;

static int load_fakes(const char *build) {
  alarm(120); /* the scenario itself: a parent stuck at a fork is a failure too */
  if (mt_t_load_fakes(build, &handle) != 0)
    return -1;
  launching = (fake_cuda_launching_fn)mt_t_sym(mt_t_fakes.cuda, "fake_cuda_launching");
  fail_alloc = (fake_cuda_fail_alloc_fn)mt_t_sym(mt_t_fakes.cuda, "fake_cuda_fail_alloc");
  if (!launching || !fail_alloc)
    return printf("    child: a fake's knob is missing\n"), -1;
  return 0;
}

static mt_t_problem make(uint32_t seed, int tokens) { return mt_t_make(&seed, OUT, IN, tokens); }

static atomic_int stop_looping;

/* Routes without pause on its own stream (arg: the stream's number). */
static void *looper(void *arg) {
  cublasHandle_t h;
  mt_t_fakes.create_handle(&h);
  uintptr_t i = (uintptr_t)arg;
  mt_t_problem p = make(100 + (uint32_t)i, 8 + 4 * (int)i);
  while (!atomic_load(&stop_looping))
    mt_t_routed_on(h, &p, (CUstream)(0x2000 + 0x100 * i));
  mt_t_unmake(&p);
  mt_t_fakes.destroy_handle(h);
  return NULL;
}

static void sleep_ms(int ms) {
  nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL);
}

/* Fork `rounds` children that each run `child` (its exit status) under a 10 s alarm; prints
 * "#info <key> N", the children that did not exit 0, and returns N. */
static int fork_rounds(int rounds, int pause_ms, int (*child)(void), const char *key) {
  int bad = 0;
  for (int round = 0; round < rounds; round++) {
    if (pause_ms)
      sleep_ms(pause_ms);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(10);
      _exit(child());
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) {
      if (bad++ < 3)
        printf("    round %d: child status %#x%s\n", round, status,
               WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM ? " (hung)" : "");
    }
  }
  printf("#info %s %d\n", key, bad);
  return bad;
}

static mt_t_problem child_problem;

static int child_saw_no_launch(void) { return launching() == 0 ? 0 : 3; }

static int child_call(void) { return mt_t_cublas_on(handle, &child_problem, S1) ? 0 : 4; }

/* The same against cuBLAS's bits computed before the fork: no malloc in the child. A sanitizer's
 * allocator may have no fork handlers of its own, so a child that allocates can find its lock
 * held by a parent thread that was routing at the fork. */
static uint16_t *child_want;

static int child_call_no_alloc(void) {
  return mt_t_gemm_on(handle, &child_problem, S1) == CUBLAS_STATUS_SUCCESS &&
                 !memcmp(child_problem.y, child_want,
                         (size_t)child_problem.out * child_problem.tokens * 2)
             ? 0
             : 4;
}

/* The fake driver's launches take 500 us (FAKE_CUDA_LAUNCH_US), so that a thread which routes
 * without pause is inside one most of the time: a fork that did not wait for it would copy it
 * there. */
static void scenario_gate(void) {
  child_problem = make(1, 8);
  CHECK(mt_t_routed_on(handle, &child_problem, S1));
  pthread_t th;
  pthread_create(&th, NULL, looper, (void *)(uintptr_t)0);
  sleep_ms(20);
  int inside = fork_rounds(40, 1, child_saw_no_launch, "inside_at_fork");
  CHECKF(inside == 0, "%d of 40 children copied a thread inside the driver", inside);
  atomic_store(&stop_looping, 1);
  pthread_join(th, NULL);
  CHECK(mt_t_routed_on(handle, &child_problem, S1));
  mt_t_unmake(&child_problem);
}

/* A thread that routes without pause at MINITE_LOG_LEVEL=TRACE writes a log line per call while
 * the main thread forks; each child routes once more (its own warning and TRACE line; it cannot
 * use the parent's CUDA) and exits. The log takes no lock, so no child can inherit one held. */
static void scenario_log(void) {
  child_problem = make(3, 8);
  CHECK(mt_t_routed_on(handle, &child_problem, S1));
  child_want = mt_t_cublas_reference(handle, &child_problem);
  pthread_t th;
  pthread_create(&th, NULL, looper, (void *)(uintptr_t)1);
  sleep_ms(20);
  int bad = fork_rounds(40, 1, child_call_no_alloc, "bad_children");
  CHECKF(bad == 0, "%d of 40 children forked while a thread logged did not come back", bad);
  atomic_store(&stop_looping, 1);
  pthread_join(th, NULL);
  printf("#info pid %ld\n", (long)getpid());
  free(child_want);
  mt_t_unmake(&child_problem);
}

static void scenario_stress(void) {
  child_problem = make(4, 8);
  CHECK(mt_t_routed_on(handle, &child_problem, S1));
  pthread_t th[NLOOPERS];
  for (uintptr_t i = 0; i < NLOOPERS; i++)
    pthread_create(&th[i], NULL, looper, (void *)i);
  int bad = fork_rounds(200, 0, child_call, "bad_children");
  CHECKF(bad == 0, "%d of 200 children failed or hung", bad);
  atomic_store(&stop_looping, 1);
  for (int i = 0; i < NLOOPERS; i++)
    pthread_join(th[i], NULL);
  CHECK(mt_t_routed_on(handle, &child_problem, S1));
  mt_t_unmake(&child_problem);
}

static const mt_t_scenario scenarios[] = {
    {"gate", scenario_gate},
    {"log", scenario_log},
    {"stress", scenario_stress},
};

/* ======================================================================================== */
/* The parent.                                                                              */
/* ======================================================================================== */

static void fork_waits_for_the_engine(void) {
  const char *env[] = {"FAKE_CUDA_LAUNCH_US=500", NULL};
  mt_t_child r;
  mt_t_run_child("gate", "gate", env, &r);
  mt_t_check_child("gate", &r);
  CHECKF(mt_t_info(&r, "inside_at_fork") == 0, "inside at a fork: %ld",
         mt_t_info(&r, "inside_at_fork"));
  mt_t_child_free(&r);
}

/* Lines of `text` that are not whole lines of the shim ("host:pid:tid minite LEVEL ..."), and
 * into *others those of another process than `pid`. */
static int broken_lines(const char *text, long pid, int *others) {
  int broken = 0;
  *others = 0;
  for (const char *line = text; line && *line;) {
    const char *nl = strchr(line, '\n'), *colon = strchr(line, ':');
    const char *word = strstr(line, " minite ");
    broken += !nl || !colon || !word || word > nl;
    *others += colon && strtol(colon + 1, NULL, 10) != pid;
    line = nl ? nl + 1 : NULL;
  }
  return broken;
}

static void fork_while_threads_log(void) {
  char fifo[PATH_MAX + 32], file[PATH_MAX + 32], var[2][PATH_MAX + 64];
  snprintf(file, sizeof file, "%s/log.file", mt_t_paths.tmp);
  snprintf(fifo, sizeof fifo, "%s/log.fifo", mt_t_paths.tmp);
  CHECKF(mkfifo(fifo, 0600) == 0, "mkfifo %s", fifo);
  snprintf(var[0], sizeof var[0], "MINITE_LOG_FILE=%s", file);
  snprintf(var[1], sizeof var[1], "MINITE_LOG_FILE=%s", fifo);
  for (int i = 0; i < 2; i++) {
    const char *env[] = {var[i], "MINITE_LOG_LEVEL=TRACE", NULL};
    mt_t_child r;
    mt_t_run_child_with("log", i ? "log_fifo" : "log_file", env, NULL, 60, &r);
    mt_t_check_child("log", &r);
    CHECKF(mt_t_info(&r, "bad_children") == 0, "bad children: %ld", mt_t_info(&r, "bad_children"));
    char *text = i ? NULL : mt_t_read_file(file, NULL);
    const char *lines = i ? r.err : text;
    int others = 0, broken = broken_lines(lines, mt_t_info(&r, "pid"), &others);
    CHECKF(lines && broken == 0 && others >= 40, "%s: %d broken lines, %d of the children: %.300s",
           var[i], broken, others, lines ? lines : "");
    CHECKF(!i || strstr(r.err, "is a FIFO or pipe, not a regular file"), "%.300s",
           r.err ? r.err : "");
    free(text);
    mt_t_child_free(&r);
  }
}

static void forks_under_load_come_back(void) {
  const char *env[] = {"MINITE_SHADOW=1/2", "MINITE_PROBE=1/2", "MINITE_DIGEST=1", NULL};
  mt_t_child r;
  mt_t_run_child("stress", "stress", env, &r);
  mt_t_check_child("stress", &r);
  CHECKF(mt_t_info(&r, "bad_children") == 0, "bad children: %ld", mt_t_info(&r, "bad_children"));
  CHECKF(r.summary && mt_t_json_int_in(r.summary, NULL, "passthrough") == 0 &&
             mt_t_json_int_in(r.summary, "\"shadow\"", "calls") > 0,
         "the parent's summary: %s", r.summary ? r.summary : "none");
  mt_t_child_free(&r);
}

static void tests(void) {
  RUN(fork_waits_for_the_engine);
  RUN(fork_while_threads_log);
  RUN(forks_under_load_come_back);
}

int main(int argc, char **argv) {
  return mt_t_scenario_main(argc, argv, "/tmp/mt_fork.XXXXXX", ROUTES, load_fakes, scenarios,
                            sizeof scenarios / sizeof scenarios[0], tests);
}
