/* log.c — NCCL-style log lines to stderr or MINITE_LOG_FILE, one write(2) per line. */
#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/proc.h"

atomic_int mt_log_level_now = MT_LOG_WARN;
static atomic_int log_fd = 2;  /* stderr until MINITE_LOG_FILE is opened */
static atomic_int log_pending; /* a file is named and not opened yet */
static char log_path[4096];    /* written before log_pending is set */
static char log_tmpl[512];     /* the template as given (shortened), for messages */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

const char *const mt_log_level_names[] = {"NONE", "WARN", "INFO", "TRACE", NULL};

const char *mt_log_value(const char *v, char *buf, size_t size) {
  size_t len = strlen(v);
  if (len <= MT_LOG_VALUE_MAX || size < MT_LOG_VALUE_MAX + 48)
    return v;
  snprintf(buf, size, "%.*s...%s (%zu bytes)", MT_LOG_VALUE_MAX / 2, v,
           v + len - MT_LOG_VALUE_MAX / 3, len);
  return buf;
}

static void write_line(int fd, const char *line, size_t len) {
  ssize_t w;
  do
    w = write(fd, line, len);
  while (w < 0 && errno == EINTR);
}

/* A fork while another thread opens the file (the open may block: a FIFO, a slow file system)
 * must not leave the child's copy of the lock held: the child's first line would wait forever.
 * shim/fork.c holds it across a fork, innermost of the library's locks. */
void mt_log_fork_lock(void) { pthread_mutex_lock(&open_lock); }
void mt_log_fork_unlock(void) { pthread_mutex_unlock(&open_lock); }

/* The first line for the file opens it; a failure is said once on stderr, which keeps the lines. */
static int open_pending(void) {
  pthread_mutex_lock(&open_lock);
  if (atomic_load(&log_pending)) {
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      atomic_store(&log_fd, fd);
    } else {
      char msg[1024];
      int n = snprintf(msg, sizeof msg,
                       "%s:%ld:%ld minite WARN cannot open MINITE_LOG_FILE=%s: %s; check that the "
                       "directory exists and is writable; logging to stderr\n",
                       mt_proc_host(), (long)getpid(), (long)syscall(SYS_gettid), log_tmpl,
                       strerror(errno));
      if (n > 0)
        write_line(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    }
    atomic_store(&log_pending, 0);
  }
  pthread_mutex_unlock(&open_lock);
  return atomic_load(&log_fd);
}

void mt_log_write(enum mt_log_level level, const char *fmt, ...) {
  char line[8192]; /* values in messages are shortened (mt_log_value): a message fits */
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
  int fd = atomic_load(&log_pending) ? open_pending() : atomic_load(&log_fd);
  write_line(fd, line, (size_t)used);
}

const char *mt_log_level_name(enum mt_log_level level) { return mt_log_level_names[level]; }

void mt_log_set_level(enum mt_log_level level) { atomic_store(&mt_log_level_now, level); }

int mt_log_open(const char *tmpl) {
  char shown[MT_LOG_VALUE_MAX + 64];
  snprintf(log_tmpl, sizeof log_tmpl, "%s", mt_log_value(tmpl, shown, sizeof shown));
  if (mt_proc_path(tmpl, log_path, sizeof log_path) != 0) {
    MT_WARN("MINITE_LOG_FILE=%s expands to a path longer than %zu bytes: shorten it; logging to "
            "stderr",
            log_tmpl, sizeof log_path);
    return 1;
  }
  if (!mt_proc_path_writable(log_path)) {
    char p[MT_LOG_VALUE_MAX + 64];
    MT_WARN("cannot write MINITE_LOG_FILE=%s (%s): %s; check that the directory exists and is "
            "writable; logging to stderr",
            log_tmpl, mt_log_value(log_path, p, sizeof p), strerror(errno));
    return 1;
  }
  atomic_store(&log_pending, 1);
  return 0;
}
