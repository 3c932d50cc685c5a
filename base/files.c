/* files.c — opening the shim's output files by the rules of files.h. */
#include "base/files.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/proc.h"

/* One refusal: "VAR=TEMPLATE (PATH) " (the path when it differs) and the problem; returns -1. */
__attribute__((format(printf, 4, 5))) static int refuse(const mt_outfile *f, char *why, size_t size,
                                                        const char *fmt, ...) {
  char path[MT_LOG_VALUE_MAX + 64];
  const char *tmpl = strchr(f->shown, '=') + 1;
  int used = strcmp(tmpl, f->path) ? snprintf(why, size, "%s (%s) ", f->shown,
                                              mt_log_value(f->path, path, sizeof path))
                                   : snprintf(why, size, "%s ", f->shown);
  if (used >= 0 && (size_t)used < size) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why + used, size - (size_t)used, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* The template expanded and made absolute (against the directory of the moment: the start). */
static int resolve(mt_outfile *f, const char *tmpl, char *why, size_t size) {
  char expanded[MT_OUT_PATH_MAX], cwd[MT_OUT_PATH_MAX];
  int fits = mt_proc_path(tmpl, expanded, sizeof expanded) == 0;
  if (fits && expanded[0] != '/') {
    if (!getcwd(cwd, sizeof cwd)) {
      snprintf(why, size,
               "%s is a relative path and the current directory cannot be read (%s): give an "
               "absolute path",
               f->shown, strerror(errno));
      return -1;
    }
    fits = (size_t)snprintf(f->path, sizeof f->path, "%s/%s", strcmp(cwd, "/") ? cwd : "",
                            expanded) < sizeof f->path;
  } else if (fits) {
    memcpy(f->path, expanded, strlen(expanded) + 1);
  }
  if (!fits) {
    snprintf(why, size, "%s expands to a path longer than %d bytes: use a shorter path", f->shown,
             MT_OUT_PATH_MAX - 1);
    return -1;
  }
  return 0;
}

/* The file's name, after the last slash of the absolute path. */
static const char *base_name(const mt_outfile *f) { return strrchr(f->path, '/') + 1; }

/* The folder that holds the file, into dir. */
static void dir_of(const mt_outfile *f, char *dir, size_t size) {
  size_t len = (size_t)(base_name(f) - f->path);
  snprintf(dir, size, "%.*s", (int)(len > 1 ? len - 1 : len), f->path);
}

/* The folder exists, is one, and lets this process search it; its mode into *st. */
static int check_dir(const mt_outfile *f, struct stat *st, char *why, size_t size) {
  char dir[MT_OUT_PATH_MAX], buf[MT_LOG_VALUE_MAX + 64];
  dir_of(f, dir, sizeof dir);
  const char *shown = mt_log_value(dir, buf, sizeof buf);
  if (stat(dir, st) != 0) {
    int e = errno;
    if (e == ENOENT)
      return refuse(f, why, size, "is in a directory that does not exist (%s): create it first",
                    shown);
    if (e == ENOTDIR)
      return refuse(f, why, size, "is under %s, a part of which is not a directory: fix the path",
                    shown);
    if (e == ELOOP)
      return refuse(f, why, size,
                    "is under %s, whose symbolic links loop (or are too many): fix "
                    "the path",
                    shown);
    return refuse(f, why, size, "is under %s, which cannot be reached: %s", shown, strerror(e));
  }
  if (!S_ISDIR(st->st_mode))
    return refuse(f, why, size, "is under %s, which is %s, not a directory: fix the path", shown,
                  mt_file_kind(st->st_mode));
  return 0;
}

/* What an existing file at the path must be: a regular file, not a link, and in a directory that
 * every user may write, the effective user's own. */
static int check_file(const mt_outfile *f, const struct stat *dir, const struct stat *st, char *why,
                      size_t size) {
  if (S_ISLNK(st->st_mode))
    return refuse(f, why, size,
                  "is a symbolic link, which the shim never follows at the end of an output path "
                  "(one planted in a shared directory could send its lines anywhere): name the "
                  "file itself");
  if (!S_ISREG(st->st_mode))
    return refuse(f, why, size,
                  "is %s, not a regular file: the shim writes regular files only, so that no "
                  "reader can block the program; name a regular file",
                  mt_file_kind(st->st_mode));
  if ((dir->st_mode & S_IWOTH) && st->st_uid != geteuid())
    return refuse(f, why, size,
                  "belongs to another user (uid %ld) in a directory every user may write: the "
                  "shim appends only to its own files there; remove it or use another path",
                  (long)st->st_uid);
  return 0;
}

/* Why the open itself failed. */
static int open_failed(const mt_outfile *f, int e, char *why, size_t size) {
  if (e == ELOOP)
    return refuse(f, why, size,
                  "became a symbolic link, which the shim never follows at the end of an output "
                  "path: name the file itself");
  if (e == ENXIO)
    return refuse(f, why, size, "became a FIFO: the shim writes regular files only");
  if (e == EACCES || e == EPERM || e == EROFS)
    return refuse(f, why, size, "cannot be written (%s): check its permissions and its directory's",
                  strerror(e));
  return refuse(f, why, size, "cannot be opened: %s", strerror(e));
}

/* Open (creating when asked) by the rules, and check again what was opened. */
static int open_checked(mt_outfile *f, const struct stat *dir, int create, char *why, size_t size) {
  int flags = O_WRONLY | O_APPEND | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW;
  int fd = open(f->path, flags | (create ? O_CREAT : 0), 0644);
  if (fd < 0)
    return open_failed(f, errno, why, size);
  struct stat st;
  if (fstat(fd, &st) != 0 || check_file(f, dir, &st, why, size) != 0) {
    close(fd);
    return -1;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0)
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  f->fd = fd;
  return 0;
}

/* The path as it stands: its folder, then the file, if there is one (*exists). */
static int check_path(mt_outfile *f, struct stat *dir, int *exists, char *why, size_t size) {
  const char *name = base_name(f);
  if (!name[0] || !strcmp(name, ".") || !strcmp(name, ".."))
    return refuse(f, why, size, "names a directory, not a file: add a file name");
  if (strlen(name) > NAME_MAX)
    return refuse(f, why, size, "has a file name longer than %d bytes: use a shorter name",
                  NAME_MAX);
  if (check_dir(f, dir, why, size) != 0)
    return -1;
  struct stat st;
  *exists = lstat(f->path, &st) == 0;
  if (!*exists && errno != ENOENT)
    return refuse(f, why, size, "cannot be examined: %s", strerror(errno));
  return *exists ? check_file(f, dir, &st, why, size) : 0;
}

int mt_out_open(mt_outfile *f, const char *var, const char *tmpl, int create, char *why,
                size_t size) {
  char shown[MT_LOG_VALUE_MAX + 64];
  snprintf(f->shown, sizeof f->shown, "%s=%s", var, mt_log_value(tmpl, shown, sizeof shown));
  f->fd = -1;
  struct stat dir;
  int exists = 0;
  if (resolve(f, tmpl, why, size) != 0 || check_path(f, &dir, &exists, why, size) != 0)
    return -1;
  if (exists || create)
    return open_checked(f, &dir, create, why, size);
  char d[MT_OUT_PATH_MAX];
  dir_of(f, d, sizeof d);
  if (faccessat(AT_FDCWD, d, W_OK | X_OK, AT_EACCESS) != 0)
    return refuse(f, why, size,
                  "is in a directory that takes no new file (%s): make it writable "
                  "or use another one",
                  strerror(errno));
  return 0;
}

int mt_out_create(mt_outfile *f, char *why, size_t size) {
  struct stat dir;
  int exists = 0;
  if (check_path(f, &dir, &exists, why, size) != 0)
    return -1;
  return open_checked(f, &dir, 1, why, size);
}
