/* proc.h — what identifies this process in log lines and file names: the host, the rank, and
 * paths built from a template of them. The bottom of the library: it depends on libc alone. */
#ifndef MT_PROC_H
#define MT_PROC_H

#include <stddef.h>

/* The host name, cut at the first dot ("" when unknown). */
const char *mt_proc_host(void);

/* RANK when it holds a non-negative integer, else "0". */
const char *mt_proc_rank(void);

/* Expand a path template: %h host name, %p pid, %r rank (RANK, else 0), %% percent; any other
 * %x is kept as written. Returns 0, or -1 when the result does not fit in `size`. */
int mt_proc_path(const char *tmpl, char *out, size_t size);

/* The first escape of tmpl that mt_proc_path does not know ("%x", or "%" at the end), written
 * into `esc` (3 bytes); returns 1 when there is one (the caller warns: it is kept as written). */
int mt_proc_path_unknown(const char *tmpl, char esc[3]);

/* 1 when a file at `path` can be opened for appending: it exists and is writable, or it does not
 * and its folder takes new files. 0 otherwise, errno set by the check that failed. */
int mt_proc_path_writable(const char *path);

/* The text of the known escapes, for messages. */
#define MT_PROC_ESCAPES "%h host, %p pid, %r rank, %% a percent sign"

#endif
