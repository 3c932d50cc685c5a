/* log.h — the shim's log: NCCL-style lines "host:pid:tid minite LEVEL message".
 *
 * MINITE_LOG_LEVEL = WARN (default) | INFO | TRACE | NONE picks what is written; MINITE_LOG_FILE
 * (a path template: %h host, %p pid, %r rank from RANK, %% a percent sign) where, stderr by
 * default. The file is opened for appending when the first line is written to it, never
 * truncated: processes that share one path (a shell and the program it runs, workers without
 * %p) keep each other's lines, and a process that logs nothing creates no file. Each line is
 * written with one write(2), so lines of several threads or processes sharing a file never
 * interleave. Nothing is ever written to stdout.
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

/* Send later lines to the file that the path template names (base/proc.h), opened for appending
 * at the first line. Returns 0, or 1 after warning that its directory cannot be written or the
 * path is too long (lines then stay on stderr). A file that cannot be opened at the first line
 * is warned about then, on stderr, where that line and the later ones go. */
int mt_log_open(const char *tmpl);

/* The lock of the file's opening, held across a fork (shim/fork.h), released in the parent and the
 * child. */
void mt_log_fork_lock(void);
void mt_log_fork_unlock(void);

/* A user's value as it goes into a message: itself when it is short, else its head and tail
 * around "...", so that a long value never pushes a message's reason and fix out of its line.
 * Returns v or buf. */
#define MT_LOG_VALUE_MAX 240
const char *mt_log_value(const char *v, char *buf, size_t size);

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
