/* log.h — the shim's log: NCCL-style lines "host:pid:tid minite LEVEL message".
 *
 * MINITE_LOG_LEVEL = WARN (default) | INFO | TRACE | NONE picks what is written; MINITE_LOG_FILE
 * (a path template: %h host, %p pid, %r rank, %% a percent sign) where, stderr by default. The
 * file is opened at start, by the rules of base/files.h (a regular file, never through a
 * symbolic link at its end, created when it does not exist), for appending, never truncated:
 * processes that share one path (a shell and the program it runs, workers without %p) keep each
 * other's lines. A line is written with one write(2) and no lock, so lines of several threads or
 * processes sharing a file never interleave, and a fork never leaves a child waiting on the log.
 * A control character of a message is written as an escape (\n, \x1b): one message is one line.
 * Nothing is ever written to stdout.
 *
 * The level check is one relaxed atomic load, so a disabled log line costs a load and a branch.
 * Before mt_params_start() (base/params.h) the level is WARN and the destination stderr: the few
 * warnings that can happen while the shim is inert (a real cuBLAS function not found) still reach
 * the user.
 */
#ifndef MT_LOG_H
#define MT_LOG_H

#include <stdatomic.h>
#include <stddef.h>

enum mt_log_level { MT_LOG_NONE = 0, MT_LOG_WARN = 1, MT_LOG_INFO = 2, MT_LOG_TRACE = 3 };

extern atomic_int mt_log_level_now;

/* The level names, in enum order, NULL-terminated (what MINITE_LOG_LEVEL accepts). */
extern const char *const mt_log_level_names[];

void mt_log_set_level(enum mt_log_level level);

/* The descriptor lines go to (2 for stderr): the statistics file must not be the same file. */
int mt_log_fd(void);

/* Send later lines to fd, which stays the caller's: the start's MINITE_LOG_FILE (base/params.c),
 * or a test's. */
void mt_log_to(int fd);

/* A user's value as it goes into a message: itself when it is short, else its head and tail
 * around "...", so that a long value never pushes a message's reason and fix out of its line.
 * Returns v or buf. */
#define MT_LOG_VALUE_MAX 240
const char *mt_log_value(const char *v, char *buf, size_t size);

/* One line at `level`, whatever the level in force (MT_LOG and its kin check it first). */
__attribute__((format(printf, 2, 3))) void mt_log_write(enum mt_log_level level, const char *fmt,
                                                        ...);

#define MT_LOG(level, ...)                                                                         \
  do {                                                                                             \
    if (atomic_load_explicit(&mt_log_level_now, memory_order_relaxed) >= (level))                  \
      mt_log_write((level), __VA_ARGS__);                                                          \
  } while (0)

#define MT_WARN(...) MT_LOG(MT_LOG_WARN, __VA_ARGS__)
#define MT_INFO(...) MT_LOG(MT_LOG_INFO, __VA_ARGS__)
#define MT_TRACE(...) MT_LOG(MT_LOG_TRACE, __VA_ARGS__)

/* A warning written once per call site and process, whatever the thread count: each site names
 * one kind of problem. */
#define MT_WARN_ONCE(...)                                                                          \
  do {                                                                                             \
    static atomic_flag mt_warned_ = ATOMIC_FLAG_INIT;                                              \
    if (!atomic_flag_test_and_set_explicit(&mt_warned_, memory_order_relaxed))                     \
      MT_WARN(__VA_ARGS__);                                                                        \
  } while (0)

#endif
