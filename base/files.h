/* files.h — the files the shim writes (MINITE_LOG_FILE, MINITE_STATS), opened the way a library
 * inside somebody else's process must. Depends on libc, base/proc.h (templates) and base/log.h
 * (values shortened in messages).
 *
 * - Resolved once, at start: the template is expanded (base/proc.h) and made absolute, so that a
 *   program that changes its directory later changes nothing.
 * - Regular files only: a FIFO, a device, a socket or a directory is refused with the reason,
 *   before it is opened (lstat) and again after (fstat), in case one was swapped in between.
 * - Opened non-blocking (O_NONBLOCK, cleared once the file is known to be regular) and with
 *   O_NOCTTY: no open waits for a FIFO's reader or takes a terminal.
 * - Never through a symbolic link at the end of the path (O_NOFOLLOW), wherever the file is: a
 *   link planted in a shared directory such as /tmp cannot send the shim's lines into another
 *   file. Links among the directories above it are followed.
 * - In a directory that every user may write (mode o+w, such as /tmp), an existing file is used
 *   only when it belongs to the process's effective user.
 * - Checked with the effective user's rights, the ones the open uses. Appended to, never
 *   truncated; created with mode 0644 (less the umask) when it does not exist.
 *
 * Every refusal is one line: "VAR=TEMPLATE (PATH): the problem; the fix", the values shortened
 * (base/log.h mt_log_value); the caller adds what happens instead.
 */
#ifndef MT_FILES_H
#define MT_FILES_H

#include <stddef.h>
#include <sys/stat.h>

#define MT_OUT_PATH_MAX 4096

typedef struct {
  char path[MT_OUT_PATH_MAX]; /* absolute */
  char shown[512];            /* "VAR=TEMPLATE", shortened, for messages */
  int fd;                     /* -1 until opened */
} mt_outfile;

/* Expand `tmpl`, the value of the variable `var`, into f->path, absolute, and check it by the
 * rules above. With `create`, open it, creating it when it does not exist. Without, open it only
 * when it exists; when it does not, check that its directory takes new files and leave f->fd at
 * -1 (mt_out_create makes it). Returns 0, or -1 with the problem and its fix in `why`. */
int mt_out_open(mt_outfile *f, const char *var, const char *tmpl, int create, char *why,
                size_t size);

/* Create the file that mt_out_open left to be made (another process sharing the path may have
 * made it meanwhile: it is then opened), by the same rules. 0, or -1 with `why`. */
int mt_out_create(mt_outfile *f, char *why, size_t size);

/* What a file of this mode is, for a refusal ("a FIFO or pipe", "a directory", ...). Inline, so
 * that spec/spec.c, which links nothing of base/, refuses its spec files in the same words. */
static inline const char *mt_file_kind(mode_t mode) {
  return S_ISFIFO(mode)   ? "a FIFO or pipe"
         : S_ISDIR(mode)  ? "a directory"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
         : S_ISSOCK(mode) ? "a socket"
         : S_ISLNK(mode)  ? "a symbolic link"
                          : "something other than a regular file";
}

#endif
