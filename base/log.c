/* log.c — NCCL-style log lines to stderr or MINITE_LOG_FILE, one write(2) per line. */
#include "base/log.h"

#include <errno.h>
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

/* The message's bytes into out (of `size` > 0), a control character written as an escape (\n,
 * \r, \t, \xHH): a value holding a newline cannot start a line of its own, nor a terminal
 * sequence reach the reader's screen. Returns the length written, the escape of the last byte
 * whole or left out. */
static size_t escape_controls(const char *msg, char *out, size_t size) {
  size_t used = 0;
  for (const unsigned char *p = (const unsigned char *)msg; *p; p++) {
    char esc[8];
    int n = *p >= 0x20 && *p != 0x7f ? (esc[0] = (char)*p, 1)
            : *p == '\n'             ? snprintf(esc, sizeof esc, "\\n")
            : *p == '\r'             ? snprintf(esc, sizeof esc, "\\r")
            : *p == '\t'             ? snprintf(esc, sizeof esc, "\\t")
                                     : snprintf(esc, sizeof esc, "\\x%02x", *p);
    if (used + (size_t)n >= size)
      break;
    memcpy(out + used, esc, (size_t)n);
    used += (size_t)n;
  }
  out[used] = '\0';
  return used;
}

void mt_log_write(enum mt_log_level level, const char *fmt, ...) {
  char msg[8192], line[8192]; /* values in messages are shortened (mt_log_value): a message fits */
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int used = snprintf(line, sizeof line, "%s:%ld:%ld minite %s ", mt_proc_host(), (long)getpid(),
                      (long)syscall(SYS_gettid), mt_log_level_names[level]);
  if (n < 0 || used < 0 || (size_t)used >= sizeof line - 1)
    return;
  used += (int)escape_controls(msg, line + used, sizeof line - 1 - (size_t)used);
  line[used++] = '\n';
  write_line(atomic_load_explicit(&log_fd, memory_order_relaxed), line, (size_t)used);
}

const char *mt_log_level_name(enum mt_log_level level) { return mt_log_level_names[level]; }

void mt_log_set_level(enum mt_log_level level) { atomic_store(&mt_log_level_now, level); }

int mt_log_fd(void) { return atomic_load(&log_fd); }

void mt_log_to(int fd) { atomic_store(&log_fd, fd); }
