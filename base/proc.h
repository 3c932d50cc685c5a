/* proc.h — what identifies this process in log lines and file names: the host, the rank, and
 * paths built from a template of them. The bottom of the library: it depends on libc alone. */
#ifndef MT_PROC_H
#define MT_PROC_H

#include <stddef.h>

/* The host name, cut at the first dot ("" when unknown). */
const char *mt_proc_host(void);

/* The process's rank as its launcher says: the first of RANK (torchrun), OMPI_COMM_WORLD_RANK,
 * PMI_RANK, SLURM_PROCID that is set, when it holds a non-negative integer; else "0". */
const char *mt_proc_rank(void);

/* The rank within the host (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
 * SLURM_LOCALID) and the number of ranks (WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE,
 * SLURM_NTASKS), read the same way; -1 when unknown. */
int mt_proc_local_rank(void);
int mt_proc_world_size(void);

/* The first of those launcher variables that decides (the first set of its list) but holds no
 * such number, as its name; NULL when there is none. The value is then taken as unknown: rank 0,
 * local rank and world size -1. */
const char *mt_proc_ids_invalid(void);

/* Expand a path template: %h host name, %p pid, %r rank (mt_proc_rank), %% percent; any other
 * %x is kept as written. Returns 0, or -1 when the result does not fit in `size`. */
int mt_proc_path(const char *tmpl, char *out, size_t size);

/* The first escape of tmpl that mt_proc_path does not know ("%x", or "%" at the end), written
 * into `esc` (3 bytes); returns 1 when there is one (the caller warns: it is kept as written). */
int mt_proc_path_unknown(const char *tmpl, char esc[3]);

/* The text of the known escapes, for messages. */
#define MT_PROC_ESCAPES "%h host, %p pid, %r rank, %% a percent sign"

#endif
