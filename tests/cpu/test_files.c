/* test_files.c — the shim's output files (base/files.h) and secure execution (shim/shim.h).
 *
 *   hostile_paths_refused         a FIFO with no reader, a directory, a device, a socket, links
 *                                 (to a file, dangling, looping), a long name, a missing folder,
 *                                 a trailing slash: each refused with its reason, nothing opened
 *                                 or made, no wait (the program runs under a 60 s alarm)
 *   relative_made_absolute        against the directory of the moment, once
 *   existing_file_appended        opened at once, appended to, never truncated; O_APPEND,
 *                                 FD_CLOEXEC, blocking writes
 *   missing_file_made_later       checked now, made by mt_out_create; a link planted in between
 *                                 is refused and nothing is made through it
 *   foreign_file_in_shared_dir    in a folder every user may write, another user's file is
 *                                 refused; in the user's own folder it is used (needs root to
 *                                 give a file away: skipped otherwise)
 *   secure_start_reads_no_path    mt_shim_start(1): one line, no file, no spec read, inert, no
 *                                 exit under MINITE_STRICT=1; mt_shim_start(0) with the same
 *                                 environment ends the program (the environment is acted on)
 *   setuid_program_is_inert       a set-user-ID copy of this program (owned by nobody, run by
 *                                 root: AT_SECURE) starts the shim inert and writes no file
 *                                 (needs root: skipped otherwise)
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/files.h"
#include "shim/shim.h"
#include "tests/cpu/preload.h"
#include "tests/harness.h"

#define NOBODY 65534

static char tmp[64]; /* "/tmp/mt_files.XXXXXX" */

static int exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static void tmp_path(char *out, size_t size, const char *name) {
  snprintf(out, size, "%s/%s", tmp, name);
}

/* ---- the rules ------------------------------------------------------------------------------ */

static void hostile_paths_refused(void) {
  char fifo[PATH_MAX], dir[PATH_MAX], sock[PATH_MAX], link[PATH_MAX], target[PATH_MAX],
      dangling[PATH_MAX], nowhere[PATH_MAX], loop[PATH_MAX], longname[PATH_MAX + 320],
      missing[PATH_MAX], slash[PATH_MAX];
  tmp_path(fifo, sizeof fifo, "fifo");
  tmp_path(dir, sizeof dir, "dir");
  tmp_path(sock, sizeof sock, "sock");
  tmp_path(link, sizeof link, "link");
  tmp_path(target, sizeof target, "target");
  tmp_path(dangling, sizeof dangling, "dangling");
  tmp_path(nowhere, sizeof nowhere, "nowhere");
  tmp_path(loop, sizeof loop, "loop");
  tmp_path(missing, sizeof missing, "no/such/dir/f");
  tmp_path(slash, sizeof slash, "dir/");
  snprintf(longname, sizeof longname, "%s/%0300d", tmp, 0);
  CHECK(mkfifo(fifo, 0644) == 0 && mkdir(dir, 0755) == 0);
  CHECK(close(open(target, O_WRONLY | O_CREAT, 0644)) == 0 && symlink(target, link) == 0);
  CHECK(symlink(nowhere, dangling) == 0 && symlink(loop, loop) == 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%.100s", sock);
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  CHECK(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
  const struct {
    const char *path, *reason;
  } cases[] = {
      {fifo, "is a FIFO or pipe, not a regular file"},
      {dir, "is a directory, not a regular file"},
      {"/dev/null", "is a character device, not a regular file"},
      {sock, "is a socket, not a regular file"},
      {link, "is a symbolic link, which the shim never follows"},
      {dangling, "is a symbolic link"},
      {loop, "is a symbolic link"},
      {longname, "has a file name longer than 255 bytes"},
      {missing, "is in a directory that does not exist"},
      {slash, "names a directory, not a file"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int create = 0; create < 2; create++) {
      mt_outfile f;
      char why[2048] = "";
      int rc = mt_out_open(&f, "MINITE_STATS", cases[i].path, create, why, sizeof why);
      CHECKF(rc == -1 && f.fd == -1 && strstr(why, cases[i].reason) &&
                 !strncmp(why, "MINITE_STATS=", 13),
             "%s (create %d): %d, %s", cases[i].path, create, rc, why);
    }
  CHECK(!exists(nowhere)); /* nothing made through the dangling link */
  long len = -1;
  free(mt_t_read_file(target, &len));
  CHECK(len == 0);
  close(s);
}

static void relative_made_absolute(void) {
  char cwd[PATH_MAX], want[PATH_MAX + 16], why[2048] = "";
  CHECK(getcwd(cwd, sizeof cwd) != NULL && chdir(tmp) == 0);
  mt_outfile f;
  CHECKF(mt_out_open(&f, "MINITE_LOG_FILE", "rel.%%.log", 0, why, sizeof why) == 0, "%s", why);
  CHECK(chdir(cwd) == 0);
  snprintf(want, sizeof want, "%s/rel.%%.log", tmp);
  CHECKF(!strcmp(f.path, want) && f.fd == -1, "%s, want %s", f.path, want);
  CHECKF(mt_out_create(&f, why, sizeof why) == 0 && exists(want), "%s", why);
  close(f.fd);
}

static void existing_file_appended(void) {
  char path[PATH_MAX + 16], why[2048] = "";
  tmp_path(path, sizeof path, "existing.log");
  int fd = open(path, O_WRONLY | O_CREAT, 0644);
  CHECK(write(fd, "kept\n", 5) == 5);
  close(fd);
  mt_outfile f;
  CHECKF(mt_out_open(&f, "MINITE_STATS", path, 0, why, sizeof why) == 0 && f.fd >= 0, "%s", why);
  int fl = fcntl(f.fd, F_GETFL), fdfl = fcntl(f.fd, F_GETFD);
  CHECKF((fl & O_APPEND) && !(fl & O_NONBLOCK) && (fdfl & FD_CLOEXEC), "flags %#x %#x", fl, fdfl);
  CHECK(write(f.fd, "more\n", 5) == 5);
  close(f.fd);
  char *text = mt_t_read_file(path, NULL);
  CHECKF(text && !strcmp(text, "kept\nmore\n"), "%s", text ? text : "");
  free(text);
}

static void missing_file_made_later(void) {
  char path[PATH_MAX + 16], target[PATH_MAX + 16], why[2048] = "";
  tmp_path(path, sizeof path, "later.jsonl");
  tmp_path(target, sizeof target, "later.target");
  mt_outfile f;
  CHECKF(mt_out_open(&f, "MINITE_STATS", path, 0, why, sizeof why) == 0 && f.fd == -1, "%s", why);
  CHECK(!exists(path));
  CHECKF(mt_out_create(&f, why, sizeof why) == 0 && f.fd >= 0 && exists(path), "%s", why);
  close(f.fd);
  unlink(path);
  /* a link planted between the start's check and the first use */
  CHECK(mt_out_open(&f, "MINITE_STATS", path, 0, why, sizeof why) == 0 && f.fd == -1);
  CHECK(symlink(target, path) == 0);
  CHECKF(mt_out_create(&f, why, sizeof why) == -1 && strstr(why, "is a symbolic link"), "%s", why);
  CHECK(!exists(target));
}

static void foreign_file_in_shared_dir(void) {
  if (geteuid() != 0)
    SKIP("needs root, to give a file to another user");
  char shared[PATH_MAX + 16], own[PATH_MAX + 16], path[PATH_MAX + 32], why[2048] = "";
  tmp_path(shared, sizeof shared, "shared");
  tmp_path(own, sizeof own, "own");
  CHECK(mkdir(shared, 0777) == 0 && chmod(shared, 01777) == 0 && mkdir(own, 0755) == 0);
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s/theirs.jsonl", i ? own : shared);
    CHECK(close(open(path, O_WRONLY | O_CREAT, 0666)) == 0 && chown(path, NOBODY, NOBODY) == 0);
    mt_outfile f;
    int rc = mt_out_open(&f, "MINITE_STATS", path, 0, why, sizeof why);
    if (i == 0)
      CHECKF(rc == -1 && strstr(why, "belongs to another user (uid 65534) in a directory every "
                                     "user may write"),
             "%s", why);
    else
      CHECKF(rc == 0 && f.fd >= 0, "in the user's own folder: %s", why);
    if (rc == 0)
      close(f.fd);
  }
}

/* ---- secure execution ----------------------------------------------------------------------- */

/* The environment of a run that, acted on, would read a bad spec file, open two files and end
 * the program (MINITE_STRICT=1). */
static void hostile_environment(const char *out) {
  char spec[PATH_MAX + 32], stats[PATH_MAX + 32], log[PATH_MAX + 32];
  snprintf(spec, sizeof spec, "%s/bad.spec", tmp);
  snprintf(stats, sizeof stats, "%s/s.jsonl", out);
  snprintf(log, sizeof log, "%s/log", out);
  FILE *f = fopen(spec, "w");
  if (f)
    fputs("format = nvfp5 # secret line\n", f), fclose(f);
  setenv("MINITE_SPEC", spec, 1);
  setenv("MINITE_STATS", stats, 1);
  setenv("MINITE_LOG_FILE", log, 1);
  setenv("MINITE_LOG_LEVEL", "INFO", 1);
  setenv("MINITE_STRICT", "1", 1);
}

/* mt_shim_start(secure) in a child, its stderr into `err`; returns its exit status (3: still
 * active after the start). */
static int start_in_child(int secure, const char *out, char *err, size_t size) {
  char errpath[PATH_MAX + 16];
  snprintf(errpath, sizeof errpath, "%s/start.err", tmp);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    hostile_environment(out);
    int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    int rc = mt_shim_start(secure);
    _exit(rc == 0 && !mt_shim_active() ? 0 : 3);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  char *text = mt_t_read_file(errpath, NULL);
  snprintf(err, size, "%s", text ? text : "");
  free(text);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void secure_start_reads_no_path(void) {
  char out[PATH_MAX + 16], stats[PATH_MAX + 32], log[PATH_MAX + 32], err[8192];
  tmp_path(out, sizeof out, "secure");
  CHECK(mkdir(out, 0777) == 0);
  snprintf(stats, sizeof stats, "%s/s.jsonl", out);
  snprintf(log, sizeof log, "%s/log", out);
  int status = start_in_child(1, out, err, sizeof err);
  CHECKF(status == 0 && mt_t_count_of(err, "\n") == 1 && strstr(err, " minite WARN ") &&
             strstr(err, "secure execution") && strstr(err, "inert"),
         "exit %d: %s", status, err);
  CHECKF(!strstr(err, "secret") && !strstr(err, "nvfp5"), "the spec file was read: %s", err);
  CHECK(!exists(stats) && !exists(log));
  status = start_in_child(0, out, err, sizeof err);
  CHECKF(status == 2 && exists(log), "without secure execution: exit %d: %s", status, err);
}

/* The child of setuid_program_is_inert: the shim started (constructor) in a set-user-ID process.
 * It ends with _exit: a sanitizer's leak check at exit cannot trace a set-user-ID process (and
 * cannot read ASAN_OPTIONS from its environment to be told not to). */
static int secure_child(void) {
  printf("#info at_secure %lu\n#info active %d\n", getauxval(AT_SECURE), mt_shim_active());
  fflush(stdout);
  _exit(0);
}

static void setuid_program_is_inert(void) {
  if (geteuid() != 0)
    SKIP("needs root, to make a set-user-ID copy owned by another user");
  char copy[PATH_MAX + 16], out[PATH_MAX + 16], cmd[4 * PATH_MAX], err[PATH_MAX + 16];
  tmp_path(copy, sizeof copy, "setuid_copy");
  tmp_path(out, sizeof out, "setuid_out");
  tmp_path(err, sizeof err, "setuid.err");
  CHECK(mkdir(out, 0777) == 0 && chmod(out, 0777) == 0 && chmod(tmp, 0755) == 0);
  snprintf(cmd, sizeof cmd, "cp /proc/%ld/exe '%s'", (long)getpid(), copy);
  CHECK(system(cmd) == 0);
  CHECK(chown(copy, NOBODY, NOBODY) == 0 && chmod(copy, 04755) == 0);
  hostile_environment(out);
  setenv("MINITE_SPEC", "bf16", 1); /* a good spec: only secure execution keeps the shim inert */
  setenv("MINITE_STRICT", "0", 1);
  snprintf(cmd, sizeof cmd, "'%s' secure-child 2>'%s'", copy, err);
  FILE *p = popen(cmd, "r");
  char text[1024] = "";
  size_t n = p ? fread(text, 1, sizeof text - 1, p) : 0;
  text[n] = '\0';
  int status = p ? pclose(p) : -1;
  static const char *const set[] = {"MINITE_SPEC", "MINITE_STATS", "MINITE_LOG_FILE",
                                    "MINITE_LOG_LEVEL", "MINITE_STRICT"};
  for (size_t i = 0; i < sizeof set / sizeof set[0]; i++)
    unsetenv(set[i]);
  char *errs = mt_t_read_file(err, NULL);
  if (!strstr(text, "#info at_secure 1")) {
    free(errs);
    SKIP("the copy did not run with AT_SECURE (a nosuid mount?): %s", text);
  }
  CHECKF(status == 0 && strstr(text, "#info active 0"), "status %d: %s", status, text);
  CHECKF(errs && mt_t_count_of(errs, " minite WARN ") == 1 && strstr(errs, "secure execution"),
         "%s", errs ? errs : "");
  char stats[PATH_MAX + 32], log[PATH_MAX + 32];
  snprintf(stats, sizeof stats, "%s/s.jsonl", out);
  snprintf(log, sizeof log, "%s/log", out);
  CHECK(!exists(stats) && !exists(log));
  free(errs);
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "secure-child"))
    return secure_child();
  alarm(60); /* an open that waits on a FIFO's reader is a failure, not a stuck `make test` */
  snprintf(tmp, sizeof tmp, "/tmp/mt_files.XXXXXX");
  if (!mkdtemp(tmp)) {
    printf("mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  RUN(hostile_paths_refused);
  RUN(relative_made_absolute);
  RUN(existing_file_appended);
  RUN(missing_file_made_later);
  RUN(foreign_file_in_shared_dir);
  RUN(secure_start_reads_no_path);
  RUN(setuid_program_is_inert);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (!mt_t_failed && system(cmd) != 0)
    printf("could not remove %s\n", tmp);
  return mt_test_done();
}
