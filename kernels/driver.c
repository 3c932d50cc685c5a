/* driver.c — the CUDA driver table (libcuda.so.1 through dlopen) and the kernel modules embedded in
 * the library, loaded once per (context, kernel file) and looked up without a driver call.
 *
 * The function cache is an append-only array of slots published through an atomic count: a reader
 * scans the published slots with no lock (a few string compares); a miss takes the mutex, loads what is missing and
 * publishes one more slot. Slots are never removed: a context destroyed and another created at the
 * same address would find stale entries (cudaDeviceReset inside a routed process is not supported).
 */
#include "kernels/driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/engine.h"

/* One fatbin per kernel file (kernels/NAME.cu), embedded by the Makefile through kernels/fatbin.S.
 * Strong references: they are what pulls the fatbin objects out of libmt.a into a test binary. */
extern const char mt_fatbin_quant[];
extern const char mt_fatbin_gemm_small[];
extern const char mt_fatbin_gemm_large[];
extern const char mt_fatbin_wcheck[];
extern const char mt_fatbin_instr[];
extern const char mt_fatbin_grouped[];

static const struct {
  const char *name;
  const char *image;
} kernel_files[] = {
    {"quant", mt_fatbin_quant},   {"gemm_small", mt_fatbin_gemm_small}, {"gemm_large", mt_fatbin_gemm_large},
    {"wcheck", mt_fatbin_wcheck}, {"instr", mt_fatbin_instr},           {"grouped", mt_fatbin_grouped},
};
#define NFILES ((int)(sizeof kernel_files / sizeof kernel_files[0]))

static mt_driver driver_table;
static const mt_driver *driver_loaded;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void driver_load(void) {
  /* The program has loaded libcuda already (there is one per process); NOLOAD finds it without
   * pulling in a second copy from another path. */
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) return;
  int missing = 0;
  void *sym_addr;
#define MT_DRIVER_SYM(field, decl, sym)                                                                                \
  sym_addr = dlsym(lib, sym);                                                                                          \
  memcpy(&driver_table.field, &sym_addr, sizeof sym_addr);                                                             \
  missing |= sym_addr == NULL;
  MT_DRIVER_FUNCTIONS(MT_DRIVER_SYM)
#undef MT_DRIVER_SYM
  if (!missing) driver_loaded = &driver_table;
}

const mt_driver *mt_driver_get(void) {
  pthread_once(&driver_once, driver_load);
  return driver_loaded;
}

/* Far more than a process needs (a few kernels per file, a context per GPU); when full, new
 * lookups fail with MT_ERR_CUDA rather than evict. */
#define MAX_MODULES 64
#define MAX_FUNCTIONS 512

typedef struct {
  CUcontext ctx;
  int file;
  CUmodule module;
} module_slot;

#define MAX_NAME 64

typedef struct {
  CUcontext ctx;
  int file;
  char fn[MAX_NAME];
  CUfunction function;
} function_slot;

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static module_slot modules[MAX_MODULES];
static int nmodules; /* under load_lock */
static function_slot functions[MAX_FUNCTIONS];
static atomic_int nfunctions; /* slots below it are complete and never change */

static int find_function(CUcontext ctx, int file, const char *fn, int n, CUfunction *out) {
  for (int i = 0; i < n; i++) {
    const function_slot *s = &functions[i];
    if (s->ctx == ctx && s->file == file && strcmp(s->fn, fn) == 0) {
      *out = s->function;
      return 1;
    }
  }
  return 0;
}

static int file_index(const char *module) {
  for (int i = 0; i < NFILES; i++)
    if (strcmp(kernel_files[i].name, module) == 0) return i;
  return -1;
}

/* The kernels are sm_90a machine code only: any other device cannot run them. */
static int device_is_sm90(const mt_driver *d) {
  CUdevice dev;
  int major = 0, minor = 0;
  if (d->ctx_get_device(&dev) != CUDA_SUCCESS ||
      d->device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != CUDA_SUCCESS ||
      d->device_get_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) != CUDA_SUCCESS)
    return 0;
  return major == 9 && minor == 0;
}

/* Under load_lock. */
static int module_get(const mt_driver *d, CUcontext ctx, int file, CUstream stream, CUmodule *out) {
  for (int i = 0; i < nmodules; i++)
    if (modules[i].ctx == ctx && modules[i].file == file) {
      *out = modules[i].module;
      return MT_OK;
    }
  /* Loading a module inside a capture is not legal (it may invalidate the capture); an error
   * from the query (the legacy stream beside a global-mode capture) means the same. */
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d->stream_is_capturing(stream, &capture) != CUDA_SUCCESS || capture != CU_STREAM_CAPTURE_STATUS_NONE)
    return MT_ERR_CAPTURE;
  if (!device_is_sm90(d)) return MT_ERR_NO_DEVICE;
  if (nmodules == MAX_MODULES) return MT_ERR_CUDA;
  CUmodule m;
  CUresult r = d->module_load_data(&m, kernel_files[file].image);
  if (r == CUDA_ERROR_NO_BINARY_FOR_GPU) return MT_ERR_NO_DEVICE;
  if (r != CUDA_SUCCESS) return MT_ERR_CUDA;
  modules[nmodules++] = (module_slot){ctx, file, m};
  *out = m;
  return MT_OK;
}

static int function_load(const mt_driver *d, CUcontext ctx, int file, const char *fn, CUstream stream,
                         CUfunction *out) {
  pthread_mutex_lock(&load_lock);
  int n = atomic_load_explicit(&nfunctions, memory_order_relaxed);
  int status = MT_OK;
  if (!find_function(ctx, file, fn, n, out)) {
    CUmodule m;
    status = module_get(d, ctx, file, stream, &m);
    if (status == MT_OK && n == MAX_FUNCTIONS) status = MT_ERR_CUDA;
    if (status == MT_OK && d->module_get_function(out, m, fn) != CUDA_SUCCESS) status = MT_ERR_CUDA;
    if (status == MT_OK) {
      functions[n] = (function_slot){.ctx = ctx, .file = file, .function = *out};
      strcpy(functions[n].fn, fn);
      atomic_store_explicit(&nfunctions, n + 1, memory_order_release);
    }
  }
  pthread_mutex_unlock(&load_lock);
  return status;
}

int mt_kernel_get(const char *module, const char *fn, CUstream stream, CUfunction *out) {
  const mt_driver *d = mt_driver_get();
  if (!d) return MT_ERR_NO_DRIVER;
  CUcontext ctx = NULL;
  if (d->ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx) return MT_ERR_NO_DEVICE;
  int file = file_index(module);
  if (file < 0 || strlen(fn) >= MAX_NAME) return MT_ERR_CUDA;
  int n = atomic_load_explicit(&nfunctions, memory_order_acquire);
  if (find_function(ctx, file, fn, n, out)) return MT_OK;
  return function_load(d, ctx, file, fn, stream, out);
}

/* Raising a function's shared-memory limit is a driver call: done once per function (a function
 * belongs to one context, so each GPU's copy gets its own). */
#define MAX_CONFIGURED 64
static CUfunction configured[MAX_CONFIGURED];
static pthread_mutex_t configured_lock = PTHREAD_MUTEX_INITIALIZER;

static int allow_smem(const mt_driver *d, CUfunction f, unsigned smem) {
  int st = MT_OK;
  pthread_mutex_lock(&configured_lock);
  int i = 0;
  while (i < MAX_CONFIGURED && configured[i] && configured[i] != f) i++;
  if (i == MAX_CONFIGURED || configured[i] != f) {
    if (d->func_set_attribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem) != CUDA_SUCCESS)
      st = MT_ERR_CUDA;
    else if (i < MAX_CONFIGURED)
      configured[i] = f;
  }
  pthread_mutex_unlock(&configured_lock);
  return st;
}

int mt_launch(CUfunction f, unsigned gx, unsigned gy, unsigned bx, unsigned by, unsigned smem, int dependent,
              CUstream stream, void *args) {
  const mt_driver *d = mt_driver_get();
  if (!d) return MT_ERR_NO_DRIVER;
  if (smem > 48 * 1024 && allow_smem(d, f, smem) != MT_OK) return MT_ERR_CUDA;
  CUlaunchAttribute attr;
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig cfg = {0};
  cfg.gridDimX = gx;
  cfg.gridDimY = gy;
  cfg.gridDimZ = 1;
  cfg.blockDimX = bx;
  cfg.blockDimY = by;
  cfg.blockDimZ = 1;
  cfg.sharedMemBytes = smem;
  cfg.hStream = stream;
  cfg.attrs = dependent ? &attr : NULL;
  cfg.numAttrs = dependent ? 1 : 0;
  void *params[] = {args};
  return d->launch_kernel_ex(&cfg, f, params, NULL) == CUDA_SUCCESS ? MT_OK : MT_ERR_CUDA;
}

int mt_sm_count(void) {
  const mt_driver *d = mt_driver_get();
  CUdevice dev;
  int n = 0;
  if (!d || d->ctx_get_device(&dev) != CUDA_SUCCESS ||
      d->device_get_attribute(&n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS || n <= 0)
    return 132;
  return n;
}
