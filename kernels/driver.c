/* driver.c — the CUDA driver table (libcuda.so.1 through dlopen), the registry of CUDA contexts,
 * and the kernel modules embedded in the library, loaded once per context and looked up without a
 * driver call.
 *
 * Each context slot (driver.h) holds its modules and an append-only array of function slots
 * published through an atomic count: a reader finds its context's slot by ID and scans the
 * published functions with no lock (a few string compares), then checks that the slot still
 * belongs to that ID (a slot is reused only after its context was destroyed: a reader racing
 * with that is using a destroyed context, and gets a miss, never another context's function). A
 * miss takes the mutex, loads what is missing and publishes one more slot.
 */
#include "kernels/driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/loader.h"
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
    {"quant", mt_fatbin_quant},           {"gemm_small", mt_fatbin_gemm_small},
    {"gemm_large", mt_fatbin_gemm_large}, {"wcheck", mt_fatbin_wcheck},
    {"instr", mt_fatbin_instr},           {"grouped", mt_fatbin_grouped},
};
#define NFILES ((int)(sizeof kernel_files / sizeof kernel_files[0]))

static mt_driver driver_table;
static const mt_driver *driver_loaded;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void driver_load(void) {
  /* The program has loaded libcuda already (there is one per process); NOLOAD finds it without
   * pulling in a second copy from another path. The loader's own dlsym (base/loader.h): the shim
   * answers lookups of hooked names with its own functions (shim/dl.h). */
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib)
    lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib)
    return;
  int missing = 0;
  void *sym_addr;
#define MT_DRIVER_SYM(field, decl, sym)                                                            \
  sym_addr = mt_loader_sym(lib, sym);                                                              \
  memcpy(&driver_table.field, &sym_addr, sizeof sym_addr);                                         \
  missing |= sym_addr == NULL;
  MT_DRIVER_FUNCTIONS(MT_DRIVER_SYM)
#undef MT_DRIVER_SYM
#define MT_DRIVER_OPT(field, decl, sym)                                                            \
  sym_addr = mt_loader_sym(lib, sym);                                                              \
  memcpy(&driver_table.field, &sym_addr, sizeof sym_addr);
  MT_DRIVER_OPTIONAL(MT_DRIVER_OPT)
#undef MT_DRIVER_OPT
  if (!missing)
    driver_loaded = &driver_table;
}

const mt_driver *mt_driver_get(void) {
  pthread_once(&driver_once, driver_load);
  return driver_loaded;
}

int mt_capture_relax(void) {
  const mt_driver *d = mt_driver_get();
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (!d || !d->exchange_capture_mode || d->exchange_capture_mode(&mode) != CUDA_SUCCESS)
    return -1;
  return (int)mode;
}

void mt_capture_restore(int previous) {
  const mt_driver *d = mt_driver_get();
  CUstreamCaptureMode mode = (CUstreamCaptureMode)previous;
  if (previous >= 0 && d && d->exchange_capture_mode)
    d->exchange_capture_mode(&mode);
}

/* --- the context registry ------------------------------------------------------------------ */

#define MAX_FUNCTIONS 256 /* kernels looked up per context: far more than the engine has */
#define MAX_CONFIGURED 64 /* functions whose shared-memory limit was raised, per context */
#define MAX_FITS 32       /* cluster capacities asked of the driver, per context */
#define MAX_NAME 64
#define CANARY_BYTES 256

typedef struct {
  int file;
  char fn[MAX_NAME];
  CUfunction function;
} function_slot;

typedef struct {
  CUfunction function;
  unsigned cluster, threads, smem;
  int clusters; /* 0: none runs (or the driver cannot say) */
} cluster_fit;

typedef struct {
  _Atomic unsigned long long id; /* 0: free */
  CUcontext handle;
  CUdeviceptr canary;            /* 0 until made (never while capturing) */
  unsigned long long canary_buf; /* its buffer ID: unique in the process, gone with the context */
  int loaded;                    /* every kernel file's module is loaded */
  CUmodule modules[NFILES];
  _Atomic int nfunctions; /* slots below it are complete and never change while id holds */
  function_slot functions[MAX_FUNCTIONS];
  _Atomic(CUfunction) configured[MAX_CONFIGURED];
  _Atomic int nfits; /* entries below it are complete and never change while id holds */
  cluster_fit fits[MAX_FITS];
} ctx_slot;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER; /* claims, loads, canaries */
static ctx_slot slots[MT_MAX_CONTEXTS];
static atomic_size_t canary_bytes;

static int context_id(const mt_driver *d, CUcontext h, unsigned long long *id) {
  if (!d->ctx_get_id) {
    *id = (unsigned long long)(uintptr_t)h;
    return *id ? 0 : -1;
  }
  return d->ctx_get_id(h, id) == CUDA_SUCCESS && *id ? 0 : -1;
}

static int find_slot(unsigned long long id) {
  for (int i = 0; i < MT_MAX_CONTEXTS; i++)
    if (atomic_load_explicit(&slots[i].id, memory_order_acquire) == id)
      return i;
  return -1;
}

/* Still the context it was made for? Only the canary can tell without touching a handle that may
 * be dangling (calling the driver with a destroyed context is undefined). No canary: assume so. */
static int slot_alive(const mt_driver *d, const ctx_slot *s) {
  unsigned long long buf = 0;
  if (!s->canary || !d->pointer_get_attribute)
    return 1;
  return d->pointer_get_attribute(&buf, CU_POINTER_ATTRIBUTE_BUFFER_ID, s->canary) ==
             CUDA_SUCCESS &&
         buf == s->canary_buf;
}

static void slot_free(ctx_slot *s) {
  if (s->canary)
    atomic_fetch_sub(&canary_bytes, CANARY_BYTES); /* freed with its context */
  atomic_store_explicit(&s->id, 0, memory_order_release);
  atomic_store_explicit(&s->nfunctions, 0, memory_order_relaxed);
  s->handle = NULL;
  s->canary = 0;
  s->loaded = 0;
  memset(s->modules, 0, sizeof s->modules); /* they went with their context */
  for (int i = 0; i < MAX_CONFIGURED; i++)
    atomic_store_explicit(&s->configured[i], NULL, memory_order_relaxed);
  atomic_store_explicit(&s->nfits, 0, memory_order_relaxed);
}

/* Under registry_lock: a free slot for a context not seen before, after forgetting the slots of
 * contexts that are gone. -1 when all are alive. */
static int slot_claim(const mt_driver *d, CUcontext h, unsigned long long id) {
  int free_at = -1;
  for (int i = 0; i < MT_MAX_CONTEXTS; i++) {
    ctx_slot *s = &slots[i];
    unsigned long long sid = atomic_load_explicit(&s->id, memory_order_relaxed);
    /* two live contexts never share an address: the one held here is destroyed */
    if (sid && s->handle == h)
      slot_free(s), sid = 0;
    if (!sid && free_at < 0)
      free_at = i;
  }
  for (int i = 0; i < MT_MAX_CONTEXTS && free_at < 0; i++)
    if (!slot_alive(d, &slots[i]))
      slot_free(&slots[i]), free_at = i;
  if (free_at < 0)
    return -1;
  slots[free_at].handle = h;
  atomic_store_explicit(&slots[free_at].id, id, memory_order_release);
  return free_at;
}

int mt_ctx_current(mt_ctx *out) {
  const mt_driver *d = mt_driver_get();
  CUcontext h = NULL;
  unsigned long long id;
  if (!d || d->ctx_get_current(&h) != CUDA_SUCCESS || !h || context_id(d, h, &id) != 0)
    return MT_ERR_NO_DEVICE;
  int i = find_slot(id);
  if (i < 0) {
    pthread_mutex_lock(&registry_lock);
    if ((i = find_slot(id)) < 0)
      i = slot_claim(d, h, id);
    pthread_mutex_unlock(&registry_lock);
  }
  if (i < 0)
    return MT_ERR_NOMEM;
  *out = (mt_ctx){i, id, h};
  return MT_OK;
}

void mt_ctx_fork_lock(void) { pthread_mutex_lock(&registry_lock); }
void mt_ctx_fork_unlock(void) { pthread_mutex_unlock(&registry_lock); }

/* --- modules and functions ------------------------------------------------------------------ */

static int find_function(ctx_slot *s, unsigned long long id, int file, const char *fn,
                         CUfunction *out) {
  int n = atomic_load_explicit(&s->nfunctions, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    const function_slot *f = &s->functions[i];
    if (f->file == file && strcmp(f->fn, fn) == 0) {
      *out = f->function;
      return atomic_load_explicit(&s->id, memory_order_acquire) == id;
    }
  }
  return 0;
}

static int file_index(const char *module) {
  for (int i = 0; i < NFILES; i++)
    if (strcmp(kernel_files[i].name, module) == 0)
      return i;
  return -1;
}

/* The kernels are sm_90a machine code only: any other device cannot run them. */
static int device_is_sm90(const mt_driver *d) {
  CUdevice dev;
  int major = 0, minor = 0;
  if (d->ctx_get_device(&dev) != CUDA_SUCCESS ||
      d->device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) !=
          CUDA_SUCCESS ||
      d->device_get_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) !=
          CUDA_SUCCESS)
    return 0;
  return major == 9 && minor == 0;
}

/* The slot's liveness canary, made with the modules (a time when allocating is legal). */
static void make_canary(const mt_driver *d, ctx_slot *s) {
  CUdeviceptr p;
  unsigned long long buf = 0;
  if (s->canary || !d->pointer_get_attribute || d->mem_alloc(&p, CANARY_BYTES) != CUDA_SUCCESS)
    return;
  if (d->pointer_get_attribute(&buf, CU_POINTER_ATTRIBUTE_BUFFER_ID, p) != CUDA_SUCCESS) {
    d->mem_free(p);
    return;
  }
  s->canary = p;
  s->canary_buf = buf;
  atomic_fetch_add(&canary_bytes, CANARY_BYTES);
}

size_t mt_ctx_device_bytes(void) { return atomic_load(&canary_bytes); }

/* Under registry_lock: every kernel file of the context, loaded at once. */
static int modules_load(const mt_driver *d, ctx_slot *s, CUstream stream) {
  if (s->loaded)
    return MT_OK;
  /* Loading a module inside a capture is not legal (it may invalidate the capture); an error
   * from the query (the legacy stream beside a global-mode capture) means the same. */
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d->stream_is_capturing(stream, &capture) != CUDA_SUCCESS ||
      capture != CU_STREAM_CAPTURE_STATUS_NONE)
    return MT_ERR_CAPTURE;
  if (!device_is_sm90(d))
    return MT_ERR_NO_DEVICE;
  int relaxed = mt_capture_relax(), st = MT_OK;
  for (int f = 0; f < NFILES && st == MT_OK; f++) {
    if (s->modules[f])
      continue;
    CUresult r = d->module_load_data(&s->modules[f], kernel_files[f].image);
    if (r != CUDA_SUCCESS)
      s->modules[f] = NULL;
    st = r == CUDA_SUCCESS                   ? MT_OK
         : r == CUDA_ERROR_NO_BINARY_FOR_GPU ? MT_ERR_NO_DEVICE
                                             : MT_ERR_CUDA;
  }
  if (st == MT_OK)
    make_canary(d, s);
  mt_capture_restore(relaxed);
  s->loaded = st == MT_OK;
  return st;
}

static int function_load(const mt_driver *d, const mt_ctx *c, int file, const char *fn,
                         CUstream stream, CUfunction *out) {
  ctx_slot *s = &slots[c->index];
  pthread_mutex_lock(&registry_lock);
  int status = MT_OK;
  if (atomic_load_explicit(&s->id, memory_order_relaxed) != c->id) {
    status = MT_ERR_NO_DEVICE; /* the context was destroyed meanwhile */
  } else if (!find_function(s, c->id, file, fn, out)) {
    int n = atomic_load_explicit(&s->nfunctions, memory_order_relaxed);
    status = modules_load(d, s, stream);
    if (status == MT_OK && n == MAX_FUNCTIONS)
      status = MT_ERR_CUDA;
    if (status == MT_OK && d->module_get_function(out, s->modules[file], fn) != CUDA_SUCCESS)
      status = MT_ERR_CUDA;
    if (status == MT_OK) {
      s->functions[n] = (function_slot){.file = file, .function = *out};
      strcpy(s->functions[n].fn, fn);
      atomic_store_explicit(&s->nfunctions, n + 1, memory_order_release);
    }
  }
  pthread_mutex_unlock(&registry_lock);
  return status;
}

/* The modules of a context that was forgotten (found destroyed) are not unloaded: they went with
 * their context. A module load that failed once is retried at the next call. */
int mt_kernel_get(const char *module, const char *fn, CUstream stream, CUfunction *out) {
  const mt_driver *d = mt_driver_get();
  if (!d)
    return MT_ERR_NO_DRIVER;
  mt_ctx c;
  int st = mt_ctx_current(&c);
  if (st != MT_OK)
    return st;
  int file = file_index(module);
  if (file < 0 || strlen(fn) >= MAX_NAME)
    return MT_ERR_CUDA;
  if (find_function(&slots[c.index], c.id, file, fn, out))
    return MT_OK;
  return function_load(d, &c, file, fn, stream, out);
}

/* Raising a function's shared-memory limit is a driver call: done once per function (a function
 * belongs to one context, so each GPU's copy gets its own). Lookups are lock-free. */
static int allow_smem(const mt_driver *d, CUfunction f, unsigned smem) {
  mt_ctx c;
  if (mt_ctx_current(&c) != MT_OK)
    return MT_ERR_CUDA;
  ctx_slot *s = &slots[c.index];
  for (int i = 0; i < MAX_CONFIGURED; i++) {
    CUfunction g = atomic_load_explicit(&s->configured[i], memory_order_acquire);
    if (g == f)
      return MT_OK;
    if (!g)
      break;
  }
  if (d->func_set_attribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem) !=
      CUDA_SUCCESS)
    return MT_ERR_CUDA;
  pthread_mutex_lock(&registry_lock);
  for (int i = 0; i < MAX_CONFIGURED; i++) {
    CUfunction g = atomic_load_explicit(&s->configured[i], memory_order_relaxed);
    if (g == f)
      break;
    if (!g) {
      atomic_store_explicit(&s->configured[i], f, memory_order_release);
      break;
    }
  }
  pthread_mutex_unlock(&registry_lock);
  return MT_OK;
}

/* A launch of gx x gy CTAs of bx x by threads and `smem` bytes on `stream`, with the attributes
 * attr[0 .. nattr-1]. */
static CUlaunchConfig launch_config(unsigned gx, unsigned gy, unsigned bx, unsigned by,
                                    unsigned smem, CUstream stream, CUlaunchAttribute *attr,
                                    unsigned nattr) {
  CUlaunchConfig cfg = {0};
  cfg.gridDimX = gx;
  cfg.gridDimY = gy;
  cfg.gridDimZ = 1;
  cfg.blockDimX = bx;
  cfg.blockDimY = by;
  cfg.blockDimZ = 1;
  cfg.sharedMemBytes = smem;
  cfg.hStream = stream;
  cfg.attrs = nattr ? attr : NULL;
  cfg.numAttrs = nattr;
  return cfg;
}

static CUlaunchAttribute cluster_attr(unsigned cluster) {
  CUlaunchAttribute attr;
  memset(&attr, 0, sizeof attr);
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim.x = cluster;
  attr.value.clusterDim.y = attr.value.clusterDim.z = 1;
  return attr;
}

/* f's one by-value argument struct `args`, launched as cfg says. */
static int launch(CUfunction f, const CUlaunchConfig *cfg, void *args) {
  const mt_driver *d = mt_driver_get();
  if (!d)
    return MT_ERR_NO_DRIVER;
  if (cfg->sharedMemBytes > 48 * 1024 && allow_smem(d, f, cfg->sharedMemBytes) != MT_OK)
    return MT_ERR_CUDA;
  void *params[] = {args};
  return d->launch_kernel_ex(cfg, f, params, NULL) == CUDA_SUCCESS ? MT_OK : MT_ERR_CUDA;
}

static CUlaunchAttribute dependent_attr(void) {
  CUlaunchAttribute attr;
  memset(&attr, 0, sizeof attr);
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  return attr;
}

int mt_launch(CUfunction f, unsigned gx, unsigned gy, unsigned bx, unsigned by, unsigned smem,
              int dependent, CUstream stream, void *args) {
  CUlaunchAttribute attr = dependent_attr();
  const CUlaunchConfig cfg = launch_config(gx, gy, bx, by, smem, stream, &attr, dependent ? 1 : 0);
  return launch(f, &cfg, args);
}

int mt_stream_foreign(CUstream stream) {
  const mt_driver *d = mt_driver_get();
  CUcontext mine = NULL, its = NULL;
  if (!d || !d->stream_get_ctx || d->ctx_get_current(&mine) != CUDA_SUCCESS || !mine)
    return 0;
  return d->stream_get_ctx(stream, &its) == CUDA_SUCCESS && its && its != mine;
}

/* A thread's key is a number never given to another thread (an address of its own would come back
 * with the next thread glibc gives the same stack), with its low bits set: a handle is a pointer,
 * 8-aligned, or a small constant (the legacy and per-thread default streams). */
uintptr_t mt_stream_key(CUstream stream) {
  static atomic_uintptr_t threads;
  static _Thread_local uintptr_t mine;
  if (stream != CU_STREAM_PER_THREAD)
    return (uintptr_t)stream;
  if (!mine)
    mine = (atomic_fetch_add(&threads, 1) + 1) << 4 | 0x7;
  return mine;
}

int mt_device_sm90(void) {
  const mt_driver *d = mt_driver_get();
  return d && device_is_sm90(d);
}

int mt_device_current(char *pci, size_t size) {
  const mt_driver *d = mt_driver_get();
  CUcontext h = NULL;
  CUdevice dev;
  if (size)
    pci[0] = '\0';
  if (!d || d->ctx_get_current(&h) != CUDA_SUCCESS || !h || d->ctx_get_device(&dev) != CUDA_SUCCESS)
    return -1;
  if (size > 1 && d->device_get_pci_bus_id &&
      d->device_get_pci_bus_id(pci, (int)size, dev) != CUDA_SUCCESS)
    pci[0] = '\0';
  return (int)dev;
}

int mt_sm_count(void) {
  const mt_driver *d = mt_driver_get();
  CUdevice dev;
  int n = 0;
  if (!d || d->ctx_get_device(&dev) != CUDA_SUCCESS ||
      d->device_get_attribute(&n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
      n <= 0)
    return 132;
  return n;
}

static int find_fit(ctx_slot *s, CUfunction f, unsigned cluster, unsigned threads, unsigned smem) {
  const int n = atomic_load_explicit(&s->nfits, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    const cluster_fit *t = &s->fits[i];
    if (t->function == f && t->cluster == cluster && t->threads == threads && t->smem == smem)
      return t->clusters;
  }
  return -1;
}

/* The answer is kept in the context's slot (lookups lock-free): the driver is asked once per
 * function, cluster size and shape. A cluster of more than 8 (non-portable) needs the function's
 * permission first, which stays with the function for its later launches. */
int mt_cluster_capacity(CUfunction f, unsigned cluster, unsigned bx, unsigned by, unsigned smem) {
  const mt_driver *d = mt_driver_get();
  mt_ctx c;
  if (!d || !d->occupancy_max_active_clusters || mt_ctx_current(&c) != MT_OK)
    return 0;
  ctx_slot *s = &slots[c.index];
  int clusters = find_fit(s, f, cluster, bx * by, smem);
  if (clusters >= 0)
    return clusters;
  CUlaunchAttribute attr = cluster_attr(cluster);
  const CUlaunchConfig cfg = launch_config(cluster, 1, bx, by, smem, NULL, &attr, 1);
  if ((cluster > 8 && d->func_set_attribute(f, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                                            1) != CUDA_SUCCESS) ||
      d->occupancy_max_active_clusters(&clusters, f, &cfg) != CUDA_SUCCESS || clusters < 0)
    clusters = 0;
  pthread_mutex_lock(&registry_lock);
  const int n = atomic_load_explicit(&s->nfits, memory_order_relaxed);
  if (n < MAX_FITS && find_fit(s, f, cluster, bx * by, smem) < 0) {
    s->fits[n] = (cluster_fit){f, cluster, bx * by, smem, clusters};
    atomic_store_explicit(&s->nfits, n + 1, memory_order_release);
  }
  pthread_mutex_unlock(&registry_lock);
  return clusters;
}

int mt_launch_clusters(CUfunction f, unsigned cluster, unsigned clusters, unsigned bx, unsigned by,
                       unsigned smem, int dependent, CUstream stream, void *args) {
  CUlaunchAttribute attr[2] = {cluster_attr(cluster), dependent_attr()};
  const CUlaunchConfig cfg =
      launch_config(cluster * clusters, 1, bx, by, smem, stream, attr, dependent ? 2 : 1);
  return launch(f, &cfg, args);
}
