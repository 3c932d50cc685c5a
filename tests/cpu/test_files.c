/* test_files.c — the shim's output files (base/files.h).
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
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/files.h"
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

int main(void) {
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
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (!mt_t_failed && system(cmd) != 0)
    printf("could not remove %s\n", tmp);
  return mt_test_done();
}
