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

/* `dependent`: the kernel may start before the one before it ends (kernels/pdl.cuh), and waits on
 * the device before it reads what that one wrote, and before it ends: its launch, not its work,
 * overlaps the GEMM, and the stream's order holds for what comes after it. */
static int launch(const char *fn, unsigned grid, void *args, int dependent, mt_stream stream) {
  CUfunction f;
  int st = mt_kernel_get("instr", fn, (CUstream)stream, &f);
  if (st != MT_OK)
    return st;
  return mt_launch(f, grid ? grid : 1, 1, 256, 1, 0, dependent, (CUstream)stream, args);
}

int mt_instr_launch_digest(const mt_instr_digest_args *a, mt_stream stream) {
  mt_instr_digest_args copy = *a;
  return launch("mt_instr_digest", mt_instr_digest_grid(a), &copy, 1, stream);
}

int mt_instr_launch_finish(const mt_instr_finish_args *a, mt_stream stream) {
  mt_instr_finish_args copy = *a;
  return launch("mt_instr_finish", mt_instr_finish_grid(a), &copy, 1, stream);
}

int mt_instr_launch_shadow(const mt_instr_shadow_args *a, mt_stream stream) {
  mt_instr_shadow_args copy = *a;
  return launch("mt_instr_shadow", mt_instr_shadow_grid(a), &copy, 0, stream);
}

int mt_instr_launch_shadow_rows(const mt_instr_shadow_rows_args *a, mt_stream stream) {
  mt_instr_shadow_rows_args copy = *a;
  return launch("mt_instr_shadow_rows", mt_instr_shadow_rows_grid(a), &copy, 0, stream);
}

int mt_instr_launch_probe(const mt_instr_probe_args *a, mt_stream stream) {
  mt_instr_probe_args copy = *a;
  return launch("mt_instr_probe", (unsigned)a->nrows, &copy, 0, stream);
}

int mt_instr_launch_offs(const mt_instr_offs_args *a, mt_stream stream) {
  mt_instr_offs_args copy = *a;
  return launch("mt_instr_offs", (unsigned)a->nrows, &copy, 0, stream);
}
