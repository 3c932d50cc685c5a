/* harness.h — the tests' harness, one header for CPU and GPU tests.
 *
 * A test is a `static void name(void)` run by RUN(name). CHECK and CHECKF record a failure and
 * go on (so one run shows every broken assertion of a test); SKIP ends the test as skipped with
 * a reason, never as passed. mt_test_done() prints the program's counts as a line
 * "#mt-counts PASSED FAILED SKIPPED", which tests/run sums into the closing line of `make test`,
 * and returns the exit status. MT_TEST_ONLY="a b" runs only the tests whose names contain one of
 * the words (the others are not counted), as in tests/harness.py.
 */
#ifndef MT_TESTS_HARNESS_H
#define MT_TESTS_HARNESS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MT_TEST_MAX_MESSAGES 8 /* per test; more failures are counted, not printed */

static int mt_t_passed, mt_t_failed, mt_t_skipped;
static int mt_t_cur_failures, mt_t_cur_skipped;

__attribute__((format(printf, 4, 5), unused)) static void
mt_t_fail(const char *file, int line, const char *expr, const char *fmt, ...) {
  if (mt_t_cur_failures++ >= MT_TEST_MAX_MESSAGES)
    return;
  printf("    %s:%d: CHECK(%s) failed", file, line, expr);
  if (fmt[0]) {
    va_list ap;
    va_start(ap, fmt);
    printf(": ");
    vprintf(fmt, ap);
    va_end(ap);
  }
  printf("\n");
}

#define CHECK(cond) CHECKF(cond, "%s", "")
#define CHECKF(cond, ...)                                                                          \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      mt_t_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                                           \
  } while (0)

/* End the current test as skipped; the reason is printed. */
#define SKIP(...)                                                                                  \
  do {                                                                                             \
    mt_t_cur_skipped = 1;                                                                          \
    printf("    skipped: ");                                                                       \
    printf(__VA_ARGS__);                                                                           \
    printf("\n");                                                                                  \
    return;                                                                                        \
  } while (0)

#define RUN(fn) mt_t_run(#fn, fn)

/* MT_TEST_ONLY: space-separated parts of test names; unset or empty, every test. */
__attribute__((unused)) static int mt_t_selected(const char *name) {
  const char *only = getenv("MT_TEST_ONLY");
  if (!only || !*only)
    return 1;
  for (const char *w = only; *w;) {
    size_t n = strcspn(w, " ");
    for (const char *at = name; *at; at++)
      if (!strncmp(at, w, n))
        return 1;
    w += n;
    w += strspn(w, " ");
  }
  return 0;
}

__attribute__((unused)) static void mt_t_run(const char *name, void (*fn)(void)) {
  if (!mt_t_selected(name))
    return;
  mt_t_cur_failures = 0;
  mt_t_cur_skipped = 0;
  fn();
  if (mt_t_cur_failures) {
    mt_t_failed++;
    printf("FAIL %s (%d failed checks)\n", name, mt_t_cur_failures);
  } else if (mt_t_cur_skipped) {
    mt_t_skipped++;
    printf("skip %s\n", name);
  } else {
    mt_t_passed++;
    printf("ok   %s\n", name);
  }
  fflush(stdout);
}

/* What fn(arg) writes to fd 2 (where the library logs without a log file), into out,
 * NUL-terminated. */
__attribute__((unused)) static void mt_t_capture_stderr(void (*fn)(void *), void *arg, char *out,
                                                        size_t size) {
  char path[] = "/tmp/mt_stderr_test.XXXXXX";
  int fd = mkstemp(path), saved = dup(2);
  fflush(stderr);
  dup2(fd, 2);
  fn(arg);
  dup2(saved, 2);
  close(saved);
  ssize_t n = pread(fd, out, size - 1, 0);
  out[n > 0 ? n : 0] = '\0';
  close(fd);
  unlink(path);
}

/* How many times `needle` occurs in s (0 when s is NULL). */
__attribute__((unused)) static int mt_t_count_of(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = s; p && (p = strstr(p, needle)); p++)
    n++;
  return n;
}

__attribute__((unused)) static int mt_test_done(void) {
  printf("#mt-counts %d %d %d\n", mt_t_passed, mt_t_failed, mt_t_skipped);
  fflush(stdout);
  return mt_t_failed ? 1 : 0;
}

#endif
