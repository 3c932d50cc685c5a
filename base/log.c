/* log.c — NCCL-style log lines to stderr or MINITE_LOG_FILE, one write(2) per line. */
#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/proc.h"

atomic_int mt_log_level_now = MT_LOG_WARN;
static atomic_int log_fd = 2; /* stderr until MINITE_LOG_FILE is opened */

const char *const mt_log_level_names[] = {"NONE", "WARN", "INFO", "TRACE", NULL};

void mt_log_write(enum mt_log_level level, const char *fmt, ...) {
  char line[2048]; /* a spec error can be long; longer lines are cut */
  int used = snprintf(line, sizeof line, "%s:%ld:%ld minite %s ", mt_proc_host(), (long)getpid(),
                      (long)syscall(SYS_gettid), mt_log_level_names[level]);
  if (used < 0 || (size_t)used >= sizeof line)
    return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line + used, sizeof line - (size_t)used, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  used = (size_t)(used + n) >= sizeof line - 1 ? (int)sizeof line - 2 : used + n;
  line[used++] = '\n';
  ssize_t w;
  do
    w = write(atomic_load(&log_fd), line, (size_t)used);
  while (w < 0 && errno == EINTR);
}

const char *mt_log_level_name(enum mt_log_level level) { return mt_log_level_names[level]; }

void mt_log_set_level(enum mt_log_level level) { atomic_store(&mt_log_level_now, level); }

int mt_log_open(const char *tmpl) {
  char path[4096];
  if (mt_proc_path(tmpl, path, sizeof path) != 0) {
    MT_WARN("MINITE_LOG_FILE=%s expands to a path longer than %zu bytes: shorten it; logging to "
            "stderr",
            tmpl, sizeof path);
    return 1;
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    MT_WARN("cannot open MINITE_LOG_FILE=%s (%s): %s; check the directory exists and is "
            "writable; logging to stderr",
            tmpl, path, strerror(errno));
    return 1;
  }
  atomic_store(&log_fd, fd);
  return 0;
}

void mt_log_close(void) {
  int fd = atomic_exchange(&log_fd, 2);
  if (fd != 2)
    close(fd);
}
