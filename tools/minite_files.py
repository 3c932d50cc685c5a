"""minite_files.py — what tools/minite-compare and tools/minite-merge share about the statistics
files they read: opening one (regular files only: a FIFO, a device or a directory is refused at
once, never waited on or read without end) and showing a value read from one (control characters
escaped, long values shortened), so that what a file holds can neither hang a tool nor forge or
flood its output. --json output is not shown this way: JSON escapes control characters itself,
and its values stay whole. Standard library only.
"""
import errno
import os
import stat

SHOWN_MAX = 240  # characters of a value in a message, as the shim's log (base/log.h)

# Control characters (C0, DEL and C1) as escapes: \n, \r, \t, else \xHH.
_ESCAPES = {c: ("\\n" if c == 10 else "\\r" if c == 13 else "\\t" if c == 9 else f"\\x{c:02x}")
            for c in list(range(0x20)) + list(range(0x7f, 0xa0))}

_KINDS = ((stat.S_ISFIFO, "a FIFO or pipe"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def shown(value, limit=SHOWN_MAX):
    """value as text for a message or a table: str(value), its head and tail around "..." when it
    is longer than limit, each control character escaped."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = f"{text[:limit // 2]}...{text[-(limit // 3):]} ({len(text)} characters)"
    return text.translate(_ESCAPES)


def open_regular(path):
    """The file at path, opened for reading bytes. Opened without blocking (a FIFO with no writer
    would block the open) and refused unless it is a regular file: OSError, whose strerror says
    what it is, when it is not or cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)),
                        "something other than a regular file")
            raise OSError(errno.EINVAL, f"it is {kind}, not a statistics file: give the path of "
                          "the file the shim wrote (MINITE_STATS)", path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
