/* proc.c — host, rank and path templates (proc.h). */
#include "base/proc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char host_name[256];

static void read_host(void) {
  if (gethostname(host_name, sizeof host_name - 1) != 0)
    host_name[0] = '\0';
  host_name[sizeof host_name - 1] = '\0';
  char *dot = strchr(host_name, '.');
  if (dot)
    *dot = '\0';
}

const char *mt_proc_host(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, read_host);
  return host_name;
}

/* A launcher's number: at most 9 decimal digits, nothing else. */
static int is_number(const char *v) {
  return strlen(v) <= 9 && strspn(v, "0123456789") == strlen(v);
}

/* The first of `names` that is set (not empty) decides: its name into *name (when given), and its
 * value when a number, else NULL. */
static const char *first_number_of(const char *const names[], const char **name) {
  for (int i = 0; names[i]; i++) {
    const char *v = getenv(names[i]);
    if (!v || !v[0])
      continue;
    if (name)
      *name = names[i];
    if (!is_number(v))
      return NULL;
    while (v[0] == '0' && v[1]) /* "007" is 7: a JSON number has no leading zero */
      v++;
    return v;
  }
  return NULL;
}

static const char *first_number(const char *const names[]) { return first_number_of(names, NULL); }

/* torchrun (and torch.distributed's other launchers), Open MPI, MPICH/PMI, Slurm's srun. */
static const char *const rank_names[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID",
                                         NULL};
static const char *const local_names[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "MPI_LOCALRANKID", "SLURM_LOCALID", NULL};
static const char *const size_names[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                         "SLURM_NTASKS", NULL};

const char *mt_proc_rank(void) {
  const char *r = first_number(rank_names);
  return r ? r : "0";
}

int mt_proc_local_rank(void) {
  const char *r = first_number(local_names);
  return r ? atoi(r) : -1;
}

int mt_proc_world_size(void) {
  const char *r = first_number(size_names);
  return r ? atoi(r) : -1;
}

const char *mt_proc_ids_invalid(void) {
  const char *const *const lists[] = {rank_names, local_names, size_names};
  for (int i = 0; i < 3; i++) {
    const char *name = NULL;
    if (!first_number_of(lists[i], &name) && name)
      return name;
  }
  return NULL;
}

int mt_proc_path(const char *tmpl, char *out, size_t size) {
  size_t used = 0;
  for (const char *p = tmpl; *p; p++) {
    char piece[300];
    const char *add = piece;
    if (p[0] == '%' && p[1] == 'h') {
      add = mt_proc_host();
      p++;
    } else if (p[0] == '%' && p[1] == 'p') {
      snprintf(piece, sizeof piece, "%ld", (long)getpid());
      p++;
    } else if (p[0] == '%' && p[1] == 'r') {
      add = mt_proc_rank();
      p++;
    } else if (p[0] == '%' && p[1] == '%') {
      strcpy(piece, "%");
      p++;
    } else {
      piece[0] = *p;
      piece[1] = '\0';
    }
    size_t len = strlen(add);
    if (used + len + 1 > size)
      return -1;
    memcpy(out + used, add, len);
    used += len;
  }
  if (used + 1 > size)
    return -1;
  out[used] = '\0';
  return 0;
}

int mt_proc_path_unknown(const char *tmpl, char esc[3]) {
  for (const char *p = tmpl; *p; p++) {
    if (*p != '%')
      continue;
    if (p[1] && strchr("hpr%", p[1])) {
      p++;
      continue;
    }
    esc[0] = '%', esc[1] = p[1], esc[2] = '\0';
    return 1;
  }
  return 0;
}
