/* instr.c — launchers of the instruments' kernels (kernels/instr.cu) and the few driver entry
 * points only the instruments use (mapped pinned host memory), found in the process's
 * libcuda.so.1 as kernels/driver.c finds its own. */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "base/loader.h"
#include "kernels/driver.h"
#include "kernels/engine.h"
#include "kernels/instr.h"

static mt_instr_driver table;
static const mt_instr_driver *loaded;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
  if (!mt_driver_get())
    return;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib)
    return;
  static const char *const names[] = {"cuMemHostAlloc", "cuMemHostGetDevicePointer_v2",
                                      "cuMemFreeHost"};
  void *syms[sizeof names / sizeof names[0]];
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!(syms[i] = mt_loader_sym(lib, names[i])))
      return;
  memcpy(&table.mem_host_alloc, &syms[0], sizeof syms[0]);
  memcpy(&table.mem_host_get_device_pointer, &syms[1], sizeof syms[1]);
  memcpy(&table.mem_free_host, &syms[2], sizeof syms[2]);
  loaded = &table;
}

const mt_instr_driver *mt_instr_driver_get(void) {
  pthread_once(&once, load);
  return loaded;
}

static int launch(const char *fn, unsigned grid, void *args, mt_stream stream) {
  CUfunction f;
  int st = mt_kernel_get("instr", fn, (CUstream)stream, &f);
  if (st != MT_OK)
    return st;
  return mt_launch(f, grid ? grid : 1, 1, 256, 1, 0, 0, (CUstream)stream, args);
}

static unsigned min_u(unsigned a, unsigned b) { return a < b ? a : b; }

int mt_instr_launch_digest(const mt_instr_digest_args *a, mt_stream stream) {
  mt_instr_digest_args copy = *a;
  return launch("mt_instr_digest", (unsigned)((a->m + 7) / 8), &copy, stream);
}

/* A CTA for each block of 256 sampled lines (a line a thread; a grouped call's for each of the
 * weights its digested rows may name), at most 264 (as kernels/wcheck.c); one where nothing is
 * read (a frozen-sampled weight's sums are stored; no digest: only the publication). */
int mt_instr_launch_finish(const mt_instr_finish_args *a, mt_stream stream) {
  mt_instr_finish_args copy = *a;
  unsigned grid = 1;
  if (a->w && !a->frozen_sum) {
    const uint64_t blocks = mt_whash_items(mt_whash_lines(a->n, a->k), MT_SAMPLE_STEP) / 256 + 1;
    const uint64_t units = a->grouped ? blocks * (uint64_t)a->cap : blocks;
    grid = units < 264 ? (unsigned)units : 264;
  }
  return launch("mt_instr_finish", grid, &copy, stream);
}

int mt_instr_launch_shadow(const mt_instr_shadow_args *a, mt_stream stream) {
  mt_instr_shadow_args copy = *a;
  unsigned blocks = (unsigned)((int64_t)a->m * a->n / 1024 + 1);
  return launch("mt_instr_shadow", min_u(264, blocks), &copy, stream);
}

int mt_instr_launch_probe(const mt_instr_probe_args *a, mt_stream stream) {
  mt_instr_probe_args copy = *a;
  return launch("mt_instr_probe", (unsigned)a->nrows, &copy, stream);
}

int mt_instr_launch_offs(const mt_instr_offs_args *a, mt_stream stream) {
  mt_instr_offs_args copy = *a;
  return launch("mt_instr_offs", (unsigned)a->nrows, &copy, stream);
}
