/* fake_cuda.c — a fake libcuda.so.1 for the CPU tests of the engine path of the shim: the driver
 * entry points of kernels/driver.h (MT_DRIVER_FUNCTIONS, under their exported names) over a
 * host-memory "GPU" (device pointers are host pointers, as in the fake cuBLAS): a primary context,
 * an sm_90 H200 (CC 9.0, 132 SMs). It computes nothing. It logs what the engine does (launches with
 * their configuration and by-value argument, allocations, memsets, read-backs, synchronisations)
 * and refuses what the real driver refuses (an unknown function or one the module does not hold,
 * more than 48 KiB of dynamic shared memory without the function's attribute, a memset outside an
 * allocation). Knobs (tests/cpu/fake/fake_cuda.h): capturing streams, no context, a memory limit,
 * a failing launch or module load; and, in the section at the end, more contexts (destroyed,
 * re-created at one address, on other devices), streams of a context, stream-ordered memory,
 * capture modes, failing allocations.
 *
 * A GEMM launch marks its output (FAKE_CUDA_MARK) as the GPU would overwrite it, nothing more.
 */
#include "tests/cpu/fake/fake_cuda.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kernels/gemm_args.h"
#include "kernels/instr.h"
#include "kernels/quant.h"
#include "kernels/wcheck.h"
#include "tests/cpu/fake/fake.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_EVENTS 8192
#define MAX_ALLOCS 1024
#define MAX_MODULES 64 /* five kernel files per context, a few contexts */
#define MAX_FUNCTIONS 128
#define MAX_CAPTURING 16
#define DEFAULT_SMEM (48 * 1024)
#define MAX_SMEM 232448 /* sm_90's opt-in limit per block */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static fake_cuda_event *events;
static int nevents;
static fake_cuda_counts counts;

typedef struct {
  char *p;
  size_t bytes;
  int ctx;                      /* the context it belongs to (contexts section below) */
  unsigned long long buffer_id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused */
} allocation;
static allocation allocs[MAX_ALLOCS];

typedef struct triton_desc triton_desc;
typedef struct {
  const char *image;
  size_t size;
  unsigned long long ctx_id; /* the context it was loaded in */
  triton_desc *tri;          /* a Triton module (the section "Triton modules" at the end) */
} module;
static module modules[MAX_MODULES];
static int nmodules;

typedef struct {
  module *mod;
  char name[48];
  int max_smem;    /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
  int nonportable; /* CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED */
} function;
static function functions[MAX_FUNCTIONS];
static int nfunctions;

static CUstream capturing[MAX_CAPTURING];
static int context_present = 1;
static long long mem_limit = -1;
static char fail_name[48];
static unsigned max_cluster = 16; /* CTAs a cluster the device runs (FAKE_CUDA_MAX_CLUSTER) */
static int fail_in; /* launches of fail_name (or any) until the failing one; 0: none */
static int fail_loads;
static int cc_major = 9, cc_minor = 0;
static unsigned max_map_rank =
    3; /* tensor maps of a higher rank are refused, as by an older driver */

/* Contexts, stream-ordered memory and failure injection: the section at the end of the file. */
static CUcontext current_context(void);
static int current_index(void);
static int current_device(void);
static void device_cc(int dev, int *major, int *minor);
static int foreign_stream(CUstream stream, unsigned long long ctx_id);
static unsigned long long current_id(void);
static int alloc_should_fail(void);
static unsigned long long next_buffer_id(void);
static _Thread_local int thread_relaxed; /* cuThreadExchangeStreamCaptureMode */
static void launch_delay(void);
static size_t reserved_tail;
static size_t triton_image(const char *image, triton_desc **tri);
static void triton_launch(const triton_desc *t, const CUlaunchConfig *c, void **params);
static void moe_dispatch(const mt_moe_dispatch_args *a);

/* The log, aligned as its argument copies must be (mt_large_args holds CUtensorMaps). */
static void events_alloc(void) {
  if (!events && (events = aligned_alloc(_Alignof(fake_cuda_event), MAX_EVENTS * sizeof *events)))
    memset(events, 0, MAX_EVENTS * sizeof *events);
}

static fake_cuda_event *event_new(int kind) {
  events_alloc();
  if (!events || nevents == MAX_EVENTS)
    return NULL;
  fake_cuda_event *e = &events[nevents++];
  memset(e, 0, sizeof *e);
  e->kind = kind;
  return e;
}

static void log_simple(int kind, CUstream stream, uint64_t ptr, size_t bytes, int value,
                       CUresult result) {
  fake_cuda_event *e = event_new(kind);
  if (e) {
    e->stream = stream;
    e->ptr = ptr;
    e->bytes = bytes;
    e->value = value;
    e->result = result;
  }
}

static int any_capturing(void) {
  for (int i = 0; i < MAX_CAPTURING; i++)
    if (capturing[i])
      return 1;
  return 0;
}

static int is_capturing(CUstream s) {
  for (int i = 0; i < MAX_CAPTURING; i++)
    if (capturing[i] && capturing[i] == s)
      return 1;
  return 0;
}

/* Operations that are illegal while a stream captures in global mode (PyTorch's default). */
static void note_capture_violation(void) {
  if (any_capturing() && thread_relaxed)
    counts.relaxed_during_capture++;
  else if (any_capturing())
    counts.during_capture++;
}

static allocation *allocation_of(const void *p, size_t bytes) {
  for (int i = 0; i < MAX_ALLOCS; i++) {
    allocation *a = &allocs[i];
    if (a->p && (const char *)p >= a->p && bytes <= a->bytes &&
        (size_t)((const char *)p - a->p) <= a->bytes - bytes)
      return a;
  }
  return NULL;
}

static void fake_cuda_env_more(void);

static void env_config(void) {
  const char *v = getenv("FAKE_CUDA_MEM_LIMIT");
  if (v && *v)
    mem_limit = strtoll(v, NULL, 0);
  v = getenv("FAKE_CUDA_NO_CONTEXT");
  if (v && *v == '1')
    context_present = 0;
  v = getenv("FAKE_CUDA_CAPTURING");
  for (int n = 0; v && *v && n < MAX_CAPTURING; n++) {
    char *end;
    capturing[n] = (CUstream)(uintptr_t)strtoull(v, &end, 0);
    v = *end == ',' ? end + 1 : NULL;
  }
  v = getenv("FAKE_CUDA_FAIL_LAUNCH");
  if (v && *v) {
    const char *colon = strchr(v, ':');
    if (colon) {
      size_t len =
          (size_t)(colon - v) < sizeof fail_name - 1 ? (size_t)(colon - v) : sizeof fail_name - 1;
      memcpy(fail_name, v, len);
      fail_name[len] = '\0';
      v = colon + 1;
    }
    fail_in = atoi(v);
  }
  v = getenv("FAKE_CUDA_MAX_CLUSTER");
  if (v && *v)
    max_cluster = (unsigned)atoi(v);
  v = getenv("FAKE_CUDA_MAP_RANK");
  if (v && *v)
    max_map_rank = (unsigned)atoi(v);
  fake_cuda_env_more();
  v = getenv("FAKE_CUDA_CC");
  if (v && *v) {
    cc_major = atoi(v);
    cc_minor = strchr(v, '.') ? atoi(strchr(v, '.') + 1) : 0;
  }
}

__attribute__((constructor)) static void fake_cuda_init(void) { env_config(); }

/* --- the fake's own functions (fake_cuda.h) ------------------------------------------------ */

EXPORT int fake_cuda_events(const fake_cuda_event **out) {
  pthread_mutex_lock(&lock);
  events_alloc();
  *out = events;
  int n = nevents;
  pthread_mutex_unlock(&lock);
  return n;
}

EXPORT void fake_cuda_counts_get(fake_cuda_counts *out) {
  pthread_mutex_lock(&lock);
  *out = counts;
  pthread_mutex_unlock(&lock);
}

EXPORT void fake_cuda_set_capturing(CUstream stream, int on) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_CAPTURING; i++)
    if (capturing[i] == stream)
      capturing[i] = NULL;
  for (int i = 0; on && i < MAX_CAPTURING; i++)
    if (!capturing[i]) {
      capturing[i] = stream;
      break;
    }
  pthread_mutex_unlock(&lock);
}

EXPORT void fake_cuda_set_context(int present) { context_present = present; }

EXPORT void fake_cuda_set_mem_limit(long long bytes) {
  pthread_mutex_lock(&lock);
  mem_limit = bytes;
  pthread_mutex_unlock(&lock);
}

EXPORT void fake_cuda_fail_launch(const char *name, int nth) {
  pthread_mutex_lock(&lock);
  snprintf(fail_name, sizeof fail_name, "%s", name ? name : "");
  fail_in = nth;
  pthread_mutex_unlock(&lock);
}

EXPORT void fake_cuda_fail_loads(int n) { fail_loads = n; }

/* Guarded host pages ("device" memory the host must not read): PROT_NONE but while a kernel the
 * fake computes runs, as the GPU reads them. */
#define MAX_GUARDED 8
static struct {
  void *p;
  size_t bytes;
} guarded[MAX_GUARDED];
static int nguarded;

static void guards_open(int open) {
  for (int i = 0; i < nguarded; i++)
    mprotect(guarded[i].p, guarded[i].bytes, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

EXPORT void fake_cuda_guard(void *p, size_t bytes, int on) {
  pthread_mutex_lock(&lock);
  int i = 0;
  while (i < nguarded && guarded[i].p != p)
    i++;
  if (on && i == nguarded && nguarded < MAX_GUARDED)
    guarded[nguarded++] = (__typeof__(guarded[0])){p, bytes};
  if (!on && i < nguarded)
    guarded[i] = guarded[--nguarded];
  mprotect(p, bytes, on ? PROT_NONE : PROT_READ | PROT_WRITE);
  pthread_mutex_unlock(&lock);
}

EXPORT int fake_cuda_is_device(const void *p, size_t bytes) {
  pthread_mutex_lock(&lock);
  int in = allocation_of(p, bytes) != NULL;
  pthread_mutex_unlock(&lock);
  return in;
}

/* --- the driver ------------------------------------------------------------------------- */

EXPORT CUresult cuInit(unsigned int flags) {
  (void)flags;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **str) {
  *str = error == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_FAKE";
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) {
  *ctx = context_present ? current_context() : NULL;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev) {
  if (!context_present || current_device() < 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  *dev = current_device();
  return CUDA_SUCCESS;
}

/* Device 0: an H200 (132 SMs); 1: an H100 PCIe (sm_90, 114 SMs); 2: an A100 (sm_80, 108 SMs). */
static const int device_sms[FAKE_CUDA_DEVICES] = {132, 114, 108};

static void device_cc(int dev, int *major, int *minor) {
  *major = dev == 0 ? cc_major : dev == 1 ? 9 : 8;
  *minor = dev == 0 ? cc_minor : 0;
}

EXPORT CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attr, CUdevice dev) {
  if (dev < 0 || dev >= FAKE_CUDA_DEVICES)
    return CUDA_ERROR_INVALID_DEVICE;
  int major, minor;
  device_cc(dev, &major, &minor);
  switch (attr) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
    *value = major;
    break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
    *value = minor;
    break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
    *value = device_sms[dev];
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
    *value = MAX_SMEM;
    break;
  default:
    *value = 0;
  }
  return CUDA_SUCCESS;
}

/* The size of a fatbin from its header (magic, version, header size, payload size). */
static size_t fatbin_size(const char *image) {
  uint32_t magic;
  uint16_t header;
  uint64_t payload;
  memcpy(&magic, image, 4);
  memcpy(&header, image + 6, 2);
  memcpy(&payload, image + 8, 8);
  return magic == 0xBA55ED50u ? header + payload : 0;
}

EXPORT CUresult cuModuleLoadData(CUmodule *out, const void *image) {
  pthread_mutex_lock(&lock);
  note_capture_violation();
  CUresult r = CUDA_SUCCESS;
  int major, minor;
  triton_desc *tri = NULL;
  size_t size = image ? fatbin_size(image) : 0;
  if (image && !size)
    size = triton_image(image, &tri);
  if (fail_loads > 0) {
    fail_loads--;
    r = CUDA_ERROR_INVALID_IMAGE;
  } else if (!size || nmodules == MAX_MODULES) {
    counts.invalid += !size;
    r = CUDA_ERROR_INVALID_IMAGE;
  } else if (device_cc(current_device() < 0 ? 0 : current_device(), &major, &minor),
             major != 9 || minor != 0) {
    r = CUDA_ERROR_NO_BINARY_FOR_GPU;
  } else {
    modules[nmodules] = (module){image, size, current_id(), tri};
    *out = (CUmodule)(void *)&modules[nmodules++];
    counts.module_loads++;
  }
  log_simple(FAKE_EV_LOAD, NULL, (uint64_t)(uintptr_t)image, size, 0, r);
  pthread_mutex_unlock(&lock);
  return r;
}

/* The image holds the kernel's code section (".text.NAME"): the names the host code asks for
 * must be those the .cu files define. */
static int image_has(const module *m, const char *name) {
  char sect[64];
  int len = snprintf(sect, sizeof sect, ".text.%s", name);
  if (len <= 0 || (size_t)len >= sizeof sect)
    return 0;
  return memmem(m->image, m->size, sect, (size_t)len + 1) != NULL;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *out, CUmodule hmod, const char *name) {
  pthread_mutex_lock(&lock);
  module *m = (module *)(void *)hmod;
  CUresult r = CUDA_SUCCESS;
  if (m < modules || m >= modules + nmodules || strlen(name) >= sizeof functions[0].name) {
    counts.invalid++;
    r = CUDA_ERROR_INVALID_HANDLE;
  } else if (!image_has(m, name)) {
    counts.invalid++;
    r = CUDA_ERROR_NOT_FOUND;
  } else {
    function *f = NULL;
    for (int i = 0; i < nfunctions && !f; i++)
      if (functions[i].mod == m && !strcmp(functions[i].name, name))
        f = &functions[i];
    if (!f && nfunctions < MAX_FUNCTIONS) {
      f = &functions[nfunctions++];
      f->mod = m;
      strcpy(f->name, name);
      f->max_smem = DEFAULT_SMEM;
    }
    if (f)
      *out = (CUfunction)(void *)f;
    else
      r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_unlock(&lock);
  return r;
}

static function *function_of(CUfunction f) {
  function *p = (function *)(void *)f;
  return p >= functions && p < functions + nfunctions ? p : NULL;
}

/* The cluster size a launch configuration asks for (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION), 1 when
 * none; 0 when it is not one dimension or does not divide the grid. */
static unsigned cluster_size(const CUlaunchConfig *c) {
  unsigned size = 1;
  for (unsigned i = 0; i < c->numAttrs && c->attrs; i++)
    if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      const CUlaunchAttributeValue *v = &c->attrs[i].value;
      if (v->clusterDim.y != 1 || v->clusterDim.z != 1 || c->gridDimX % v->clusterDim.x)
        return 0;
      size = v->clusterDim.x;
    }
  return size;
}

/* Whether f may be launched in clusters of `size`: over 8 only with the function's non-portable
 * permission, over 16 never (sm_90's limits). */
static int cluster_allowed(const function *f, unsigned size) {
  return size && size <= (f->nonportable ? 16u : 8u);
}

/* The clusters of a kernel the fake device runs at once: two of at most FAKE_CUDA_MAX_CLUSTER CTAs
 * (default 16), whatever the kernel and shape (a small device, so that a refresh covering more
 * slices finds its grid capped); none of more. No event: a query. */
EXPORT CUresult cuOccupancyMaxActiveClusters(int *n, CUfunction hfunc, const CUlaunchConfig *cfg) {
  pthread_mutex_lock(&lock);
  const function *f = function_of(hfunc);
  const unsigned size = cfg ? cluster_size(cfg) : 0;
  const int ok = n && f && cluster_allowed(f, size);
  if (!ok)
    counts.invalid++;
  pthread_mutex_unlock(&lock);
  if (!ok)
    return CUDA_ERROR_INVALID_VALUE;
  *n = size <= max_cluster ? 2 : 0;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attr, int value) {
  pthread_mutex_lock(&lock);
  function *f = function_of(hfunc);
  CUresult r = CUDA_SUCCESS;
  if (!f || (attr == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES &&
             (value < 0 || value > MAX_SMEM))) {
    counts.invalid++;
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (attr == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    f->max_smem = value;
  } else if (attr == CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED) {
    f->nonportable = value; /* a permission, not a launch setting: no event */
    pthread_mutex_unlock(&lock);
    return r;
  }
  fake_cuda_event *e = event_new(FAKE_EV_SETATTR);
  if (e) {
    snprintf(e->name, sizeof e->name, "%s", f ? f->name : "?");
    e->value = value;
    e->result = r;
  }
  pthread_mutex_unlock(&lock);
  return r;
}

/* Bytes of the by-value argument struct of a kernel, by its name (the headers of kernels/); each
 * fits the event's copy (mt_large_args outgrew 512 bytes once, and the copy ran into the next
 * event). */
_Static_assert(sizeof(mt_large_args) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_small_args) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_quant_params) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_refresh_args) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_pack_args) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_dequant_args) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_wcheck_args) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_instr_digest_args) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_instr_shadow_args) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_instr_shadow_rows_args) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_instr_probe_args) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_instr_finish_args) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_instr_offs_args) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_grouped_kargs) <= FAKE_CUDA_ARGS_MAX &&
                   sizeof(mt_seg_ends_args) <= FAKE_CUDA_ARGS_MAX,
               "a kernel argument struct is larger than the fake keeps");
static size_t args_size(const char *name) {
  if (!strncmp(name, "mt_quant_", 9))
    return sizeof(mt_quant_params);
  if (!strncmp(name, "mt_refresh_", 11))
    return sizeof(mt_refresh_args);
  if (!strcmp(name, "mt_wcheck"))
    return sizeof(mt_wcheck_args);
  if (!strcmp(name, "mt_gemm_pack"))
    return sizeof(mt_pack_args);
  if (!strcmp(name, "mt_dequant_weight"))
    return sizeof(mt_dequant_args);
  if (!strcmp(name, "mt_instr_digest"))
    return sizeof(mt_instr_digest_args);
  if (!strcmp(name, "mt_instr_shadow"))
    return sizeof(mt_instr_shadow_args);
  if (!strcmp(name, "mt_instr_shadow_rows"))
    return sizeof(mt_instr_shadow_rows_args);
  if (!strcmp(name, "mt_instr_probe"))
    return sizeof(mt_instr_probe_args);
  if (!strcmp(name, "mt_instr_finish"))
    return sizeof(mt_instr_finish_args);
  if (!strcmp(name, "mt_instr_offs"))
    return sizeof(mt_instr_offs_args);
  if (!strncmp(name, "mt_gemm_small_", 14))
    return sizeof(mt_small_args);
  if (!strncmp(name, "mt_gemm_large_", 14))
    return sizeof(mt_large_args);
  if (!strncmp(name, "mt_grouped_", 11))
    return sizeof(mt_grouped_kargs);
  if (!strcmp(name, "mt_seg_ends"))
    return sizeof(mt_seg_ends_args);
  if (!strcmp(name, "mt_moe_dispatch"))
    return sizeof(mt_moe_dispatch_args);
  return 0;
}

/* The GEMM's output, as the GPU would overwrite it: y[i][j] for i < m, j < n, row stride ldy. */
static void mark_output(const mt_epilogue_args *e) {
  for (long long i = 0; i < e->m; i++)
    for (long long j = 0; j < e->n; j++)
      ((uint16_t *)e->y)[i * e->ldy + j] = FAKE_CUDA_MARK;
}

/* The grouped GEMM's outputs: each segment's rows (from the offsets, "device" memory the fake can
 * read, or seg_rows each; of a split launch, its part of them) of n columns, in y or in the
 * segment's own matrix (y_ptrs, a "device" array the fake reads as the GPU would). */
static void mark_grouped(const mt_grouped_kargs *a) {
  for (int s = a->seg0; s < a->seg0 + a->nseg; s++) {
    long long start = a->offs ? (s ? a->offs[s - 1] : 0) : 0;
    int first, end;
    mt_grouped_part(a->offs ? (int)(a->offs[s] - start) : a->seg_rows, a->split, a->split_bn,
                    &first, &end);
    uint16_t *y =
        a->y_ptrs ? (uint16_t *)a->y_ptrs[s] : (uint16_t *)a->y + (long long)s * a->stride_y;
    long long row0 = a->y_ptrs ? 0 : start;
    for (long long i = first; i < end; i++) {
      const long long row = a->y_rows ? a->y_rows[start + i] : row0 + i; /* vLLM's dispatch */
      for (long long j = 0; j < a->n; j++)
        y[row * a->ldy + j] = FAKE_CUDA_MARK;
    }
  }
}

/* mt_seg_ends (kernels/grouped.cu): the segment table, as the kernel writes it. */
static void seg_ends(const mt_seg_ends_args *a) {
  int seg = a->seg0, row = a->row0;
  for (int j = 0; j < a->nruns; j++)
    for (int s = 0; s < a->size[j]; s++)
      a->offs[seg++] = (row += a->rows[j]);
}

/* --- the instruments' kernels, on the host (kernels/instr.h's twin) ------------------------- */

/* Publications whose flag write is held back (fake_cuda_hold_events). */
#define MAX_HELD 4096
static struct { uint32_t *flag, seq; } held[MAX_HELD];
static int nheld, hold_events;

static void instr_offs(const mt_instr_offs_args *a) {
  for (int p = 0; p < a->nrows; p++)
    for (int s = 0; s < a->nseg; s++)
      a->out[p * a->nseg + s] = a->offs[s] > a->rows[p];
}

/* The grid's work and then the last CTA's publication, in one go. */
static void instr_finish(const mt_instr_finish_args *a) {
  mt_instr_header *h = a->hdr;
  if (a->w && h->selected && a->grouped) {
    mt_instr_row *rows = (mt_instr_row *)(h + 1);
    unsigned kept = h->selected < (unsigned)a->cap ? h->selected : (unsigned)a->cap;
    for (unsigned i = 0; i < kept; i++) {
      int first = 1;
      for (unsigned j = 0; j < i; j++)
        first &= a->w_stride && rows[j].seg != rows[i].seg;
      const int64_t seg = a->w_stride ? rows[i].seg : 0;
      if (first && a->frozen_sum)
        rows[i].wsum = a->frozen_sum[seg * a->frozen_stride];
      else if (first)
        rows[i].wsum += mt_instr_weight_sum_of((const uint16_t *)a->w + seg * a->w_stride, a->ldw,
                                               a->n, a->k, a->in_out);
    }
  } else if (a->w && h->selected) {
    if (a->frozen_sum) {
      h->wsum = *a->frozen_sum;
    } else {
      h->wsum += mt_instr_weight_sum_of(a->w, a->ldw, a->n, a->k, a->in_out);
    }
    if (a->bias)
      h->bsum = mt_instr_content_sum(a->bias, (size_t)a->bias_bytes, 0);
  }
  unsigned rows = h->selected < (unsigned)a->cap ? h->selected : (unsigned)a->cap;
  /* nothing to report: the flag alone, marked, or for a captured call's replay nothing; a
   * captured call's flag is a seqlock over the header's replay count (kernels/instr.h) */
  const int empty = a->empty_ok && !h->selected, captured = !a->seq;
  const uint32_t count = h->replays; /* kept across uses */
  if (captured && !empty)
    __atomic_store_n(a->flag, 2 * count + 1, __ATOMIC_RELEASE);
  if (!empty)
    memcpy(a->dst, h, sizeof *h + rows * sizeof(mt_instr_row));
  memset(h, 0, sizeof *h);
  h->replays = count + (captured && !empty);
  if (captured) {
    if (!empty)
      __atomic_store_n(a->flag, 2 * count + 2, __ATOMIC_RELEASE);
    if (a->tick)
      ++*a->tick;
    return;
  }
  const uint32_t seq = empty ? a->seq | MT_INSTR_EMPTY : a->seq;
  if (hold_events && nheld < MAX_HELD) {
    held[nheld].flag = a->flag;
    held[nheld++].seq = seq;
  } else {
    __atomic_store_n(a->flag, seq, __ATOMIC_RELEASE);
  }
}

static void run_instr(const char *name, const void *args) {
  if (!strcmp(name, "mt_instr_digest"))
    mt_instr_digest_host(args);
  else if (!strcmp(name, "mt_instr_shadow"))
    mt_instr_shadow_host(args);
  else if (!strcmp(name, "mt_instr_shadow_rows"))
    mt_instr_shadow_rows_host(args);
  else if (!strcmp(name, "mt_instr_probe"))
    mt_instr_probe_host(args);
  else if (!strcmp(name, "mt_instr_finish"))
    instr_finish(args);
  else if (!strcmp(name, "mt_instr_offs"))
    instr_offs(args);
}

static int launch_config_ok(const CUlaunchConfig *c, const function *f) {
  unsigned threads = c->blockDimX * c->blockDimY * c->blockDimZ, cluster = cluster_size(c);
  return c->gridDimX && c->gridDimY && c->gridDimZ && c->gridDimY <= 65535 &&
         c->gridDimZ <= 65535 && threads && threads <= 1024 &&
         (c->sharedMemBytes <= DEFAULT_SMEM || (int)c->sharedMemBytes <= f->max_smem) &&
         (c->numAttrs == 0 || c->attrs) && cluster_allowed(f, cluster) && cluster <= max_cluster;
}

static int should_fail(const char *name) {
  if (fail_in <= 0 || (fail_name[0] && strcmp(fail_name, name)))
    return 0;
  return --fail_in == 0;
}

/* The launch itself: the exported entry points call it directly, never through the PLT, which the
 * preloaded shim's hook would answer. */
static CUresult launch_ex(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
  launch_delay();
  pthread_mutex_lock(&lock);
  function *fn = function_of(f);
  CUresult r = CUDA_SUCCESS;
  if (!fn || !config || !params || !params[0] || extra || !launch_config_ok(config, fn)) {
    counts.invalid++;
    r = fn ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
  } else if (fn->mod->ctx_id != current_id()) {
    counts.invalid++, counts.stale++; /* a function of a destroyed or another context */
    r = CUDA_ERROR_INVALID_HANDLE;
  } else if (foreign_stream(config->hStream, fn->mod->ctx_id)) {
    counts.invalid++, counts.cross_context++;
    r = CUDA_ERROR_INVALID_HANDLE;
  } else if (should_fail(fn->name)) {
    r = CUDA_ERROR_LAUNCH_FAILED;
  }
  fake_cuda_event *e = event_new(FAKE_EV_LAUNCH);
  if (e && config) {
    snprintf(e->name, sizeof e->name, "%s", fn ? fn->name : "?");
    e->grid[0] = config->gridDimX, e->grid[1] = config->gridDimY, e->grid[2] = config->gridDimZ;
    e->block[0] = config->blockDimX, e->block[1] = config->blockDimY,
    e->block[2] = config->blockDimZ;
    e->smem = config->sharedMemBytes;
    e->stream = config->hStream;
    e->nattrs = (int)config->numAttrs;
    e->cluster = cluster_size(config);
    for (unsigned i = 0; i < config->numAttrs && config->attrs; i++)
      if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION &&
          config->attrs[i].value.programmaticStreamSerializationAllowed)
        e->pdl = 1;
    e->result = r;
    if (fn && params && params[0]) {
      e->args_bytes = args_size(fn->name);
      memcpy(e->args, params[0], e->args_bytes);
    }
  }
  if (r == CUDA_SUCCESS) {
    counts.launches++;
    if (!strncmp(fn->name, "mt_gemm_small_", 14))
      mark_output(&((const mt_small_args *)params[0])->e);
    else if (!strncmp(fn->name, "mt_gemm_large_", 14))
      mark_output(&((const mt_large_args *)params[0])->e);
    else if (!strncmp(fn->name, "mt_grouped_", 11)) {
      guards_open(1);
      mark_grouped((const mt_grouped_kargs *)params[0]);
      guards_open(0);
    } else if (!strcmp(fn->name, "mt_seg_ends"))
      seg_ends((const mt_seg_ends_args *)params[0]);
    else if (!strcmp(fn->name, "mt_moe_dispatch"))
      moe_dispatch((const mt_moe_dispatch_args *)params[0]);
    else if (fn->mod->tri)
      triton_launch(fn->mod->tri, config, params);
    else if (!strncmp(fn->name, "mt_instr_", 9))
      run_instr(fn->name, params[0]);
  }
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                 void **extra) {
  return launch_ex(config, f, params, extra);
}
/* Its address as the library defines it (what dlsym on the library finds; `cuLaunchKernelEx`
 * itself would be the preloaded shim's), for cuGetProcAddress to return as the driver does. */
extern __typeof__(cuLaunchKernelEx) own_launch_kernel_ex
    __attribute__((alias("cuLaunchKernelEx"), visibility("hidden")));

EXPORT CUresult cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank,
                                       void *base, const cuuint64_t *dims,
                                       const cuuint64_t *strides, const cuuint32_t *box,
                                       const cuuint32_t *elem_strides,
                                       CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                       CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill fill) {
  (void)type, (void)elem_strides, (void)interleave, (void)swizzle, (void)l2, (void)fill;
  pthread_mutex_lock(&lock);
  CUresult r = CUDA_SUCCESS;
  /* rank 2: rows of dims[0] elements, strides[0] bytes apart; rank 3 only as the engine makes it,
   * each row split into dims[2] blocks of dims[0] BF16 (strides[1] bytes apart), a box two deep */
  int split =
      rank == 3 && strides[1] == dims[0] * 2 && strides[0] == strides[1] * dims[2] && box[2] == 2;
  if (((uintptr_t)map & 63) || ((uintptr_t)base & 15) || (rank != 2 && !split) || strides[0] % 16) {
    counts.invalid++;
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (rank > max_map_rank) {
    r = CUDA_ERROR_NOT_SUPPORTED;
  } else {
    memset(map, 0, sizeof *map);
    memcpy(map, &base, sizeof base); /* so that a test can tell the maps apart */
  }
  log_simple(FAKE_EV_TMAP, NULL, (uint64_t)(uintptr_t)base,
             r == CUDA_SUCCESS ? dims[1] * strides[0] : 0, (int)rank, r);
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status) {
  pthread_mutex_lock(&lock);
  *status = is_capturing(stream) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc(CUdeviceptr *out, size_t bytes) {
  pthread_mutex_lock(&lock);
  note_capture_violation();
  CUresult r = CUDA_SUCCESS;
  allocation *slot = NULL;
  for (int i = 0; i < MAX_ALLOCS && !slot; i++)
    if (!allocs[i].p)
      slot = &allocs[i];
  char *p = NULL;
  if (!bytes) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (!slot ||
             (mem_limit >= 0 && counts.live_bytes + bytes > (unsigned long long)mem_limit) ||
             alloc_should_fail() || !(p = aligned_alloc(256, (bytes + 255) / 256 * 256))) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    memset(p, 0xA5, bytes); /* cuMemAlloc leaves memory undefined: a pattern, not zeros */
    *slot = (allocation){p, bytes, current_index(), next_buffer_id()};
    *out = (CUdeviceptr)(uintptr_t)p;
    counts.allocs++;
    counts.live_allocs++;
    counts.live_bytes += bytes;
  }
  log_simple(FAKE_EV_ALLOC, NULL, (uint64_t)(uintptr_t)p, bytes, 0, r);
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuMemFree(CUdeviceptr ptr) {
  pthread_mutex_lock(&lock);
  note_capture_violation();
  CUresult r = CUDA_SUCCESS;
  size_t bytes = 0;
  allocation *a = NULL;
  for (int i = 0; i < MAX_ALLOCS && !a; i++)
    if (allocs[i].p && (CUdeviceptr)(uintptr_t)allocs[i].p == ptr)
      a = &allocs[i];
  if (!a) {
    counts.bad_frees++;
    r = CUDA_ERROR_INVALID_VALUE;
  } else {
    bytes = a->bytes;
    free(a->p);
    *a = (allocation){0};
    counts.frees++;
    counts.live_allocs--;
    counts.live_bytes -= bytes;
  }
  log_simple(FAKE_EV_FREE, NULL, ptr, bytes, 0, r);
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream) {
  pthread_mutex_lock(&lock);
  CUresult r = CUDA_SUCCESS;
  allocation *a = allocation_of((void *)(uintptr_t)dst, n);
  if (!a) {
    counts.invalid++;
    r = CUDA_ERROR_INVALID_VALUE;
  } else {
    counts.stale += a->ctx != current_index(); /* memory of another context */
    memset((void *)(uintptr_t)dst, value, n);
  }
  log_simple(FAKE_EV_MEMSET, stream, dst, n, value, r);
  pthread_mutex_unlock(&lock);
  return r;
}

/* The 2-D form the quantizer uses to zero one word in each of many slices: every row checked. */
EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch, unsigned int value, size_t width,
                                   size_t height, CUstream stream) {
  pthread_mutex_lock(&lock);
  CUresult r = CUDA_SUCCESS;
  for (size_t h = 0; h < height && r == CUDA_SUCCESS; h++)
    if (!allocation_of((void *)(uintptr_t)(dst + h * pitch), width * 4)) {
      counts.invalid++;
      r = CUDA_ERROR_INVALID_VALUE;
    }
  for (size_t h = 0; h < height && r == CUDA_SUCCESS; h++)
    for (size_t i = 0; i < width; i++)
      memcpy((void *)(uintptr_t)(dst + h * pitch + 4 * i), &value, 4);
  log_simple(FAKE_EV_MEMSET, stream, dst, width * 4 * height, (int)value, r);
  pthread_mutex_unlock(&lock);
  return r;
}

/* Read-backs: the source is the program's "device" memory (host memory here, allocated by the
 * program, not through this driver), so it is not checked against the allocations. */
EXPORT CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream stream) {
  pthread_mutex_lock(&lock);
  CUresult r = CUDA_SUCCESS;
  if (is_capturing(stream)) {
    counts.during_capture++;
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  } else {
    memcpy(dst, (const void *)(uintptr_t)src, n);
  }
  log_simple(FAKE_EV_DTOH, stream, src, n, 0, r);
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
  pthread_mutex_lock(&lock);
  note_capture_violation();
  memcpy(dst, (const void *)(uintptr_t)src, n);
  log_simple(FAKE_EV_DTOH, NULL, src, n, 0, CUDA_SUCCESS);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
  pthread_mutex_lock(&lock);
  note_capture_violation();
  memcpy((void *)(uintptr_t)dst, src, n);
  log_simple(FAKE_EV_HTOD, NULL, dst, n, 0, CUDA_SUCCESS);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream stream) {
  pthread_mutex_lock(&lock);
  CUresult r = CUDA_SUCCESS;
  if (is_capturing(stream)) {
    counts.during_capture++;
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  log_simple(FAKE_EV_SYNC, stream, 0, 0, 0, r);
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuCtxSynchronize(void) {
  pthread_mutex_lock(&lock);
  note_capture_violation();
  log_simple(FAKE_EV_CTX_SYNC, NULL, 0, 0, 0, CUDA_SUCCESS);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* --- events and pinned memory (the instruments) --------------------------------------------- */

typedef struct {
  int live, recorded;
  pthread_t recorder;
} fake_event;

#define MAX_FAKE_EVENTS 4096
static fake_event cu_events[MAX_FAKE_EVENTS];
static long event_queries, event_queries_same_thread;

EXPORT void fake_cuda_hold_events(int on) {
  pthread_mutex_lock(&lock);
  hold_events = on;
  for (int i = 0; !on && i < nheld; i++)
    __atomic_store_n(held[i].flag, held[i].seq, __ATOMIC_RELEASE);
  if (!on)
    nheld = 0;
  pthread_mutex_unlock(&lock);
}

/* A CUDA graph's replay, as far as the instruments go: their launches recorded from event `from`
 * on (those a capture made) run again, in order, from their recorded arguments. */
EXPORT void fake_cuda_replay_instr(int from) {
  pthread_mutex_lock(&lock);
  for (int i = from; i < nevents; i++)
    if (events[i].kind == FAKE_EV_LAUNCH && events[i].result == CUDA_SUCCESS &&
        !strncmp(events[i].name, "mt_instr_", 9))
      run_instr(events[i].name, events[i].args);
  pthread_mutex_unlock(&lock);
}

EXPORT void fake_cuda_event_queries(long *queries, long *same_thread) {
  pthread_mutex_lock(&lock);
  *queries = event_queries;
  *same_thread = event_queries_same_thread;
  pthread_mutex_unlock(&lock);
}

static fake_event *fake_event_of(CUevent ev) {
  fake_event *e = (fake_event *)(void *)ev;
  return e >= cu_events && e < cu_events + MAX_FAKE_EVENTS && e->live ? e : NULL;
}

EXPORT CUresult cuEventCreate(CUevent *out, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&lock);
  note_capture_violation();
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  for (int i = 0; i < MAX_FAKE_EVENTS; i++)
    if (!cu_events[i].live) {
      cu_events[i] = (fake_event){.live = 1};
      *out = (CUevent)(void *)&cu_events[i];
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuEventDestroy_v2(CUevent ev) {
  pthread_mutex_lock(&lock);
  fake_event *e = fake_event_of(ev);
  if (e)
    e->live = 0;
  else
    counts.invalid++;
  pthread_mutex_unlock(&lock);
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static int fail_event_ops;

EXPORT void fake_cuda_fail_event_ops(int n) {
  pthread_mutex_lock(&lock);
  fail_event_ops = n;
  pthread_mutex_unlock(&lock);
}

EXPORT CUresult cuEventRecord(CUevent ev, CUstream stream) {
  pthread_mutex_lock(&lock);
  fake_event *e = fake_event_of(ev);
  CUresult r = CUDA_SUCCESS;
  if (!e) {
    counts.invalid++;
    r = CUDA_ERROR_INVALID_HANDLE;
  } else if (fail_event_ops > 0) {
    fail_event_ops--;
    r = CUDA_ERROR_LAUNCH_FAILED;
  } else {
    e->recorded = 1;
    e->recorder = pthread_self();
  }
  log_simple(FAKE_EV_RECORD, stream, (uint64_t)(uintptr_t)ev, 0, 0, r);
  pthread_mutex_unlock(&lock);
  return r;
}

/* A wait on a capturing stream would join the capture to work outside it: the engine never asks
 * for one (counted invalid). */
EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent ev, unsigned int flags) {
  pthread_mutex_lock(&lock);
  CUresult r = CUDA_SUCCESS;
  if (!fake_event_of(ev) || flags || is_capturing(stream)) {
    counts.invalid++;
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (fail_event_ops > 0) {
    fail_event_ops--;
    r = CUDA_ERROR_LAUNCH_FAILED;
  }
  log_simple(FAKE_EV_WAIT, stream, (uint64_t)(uintptr_t)ev, 0, 0, r);
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuEventQuery(CUevent ev) {
  pthread_mutex_lock(&lock);
  fake_event *e = fake_event_of(ev);
  CUresult r = CUDA_SUCCESS;
  if (!e) {
    counts.invalid++;
    r = CUDA_ERROR_INVALID_HANDLE;
  } else {
    event_queries++;
    if (e->recorded && pthread_equal(e->recorder, pthread_self()))
      event_queries_same_thread++;
    if (hold_events)
      r = CUDA_ERROR_NOT_READY;
  }
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuMemHostAlloc(void **out, size_t bytes, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&lock);
  note_capture_violation();
  void *p = bytes && !alloc_should_fail() ? aligned_alloc(256, (bytes + 255) / 256 * 256) : NULL;
  if (p)
    *out = p;
  log_simple(FAKE_EV_HOSTALLOC, NULL, (uint64_t)(uintptr_t)p, bytes, 0,
             p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
  pthread_mutex_unlock(&lock);
  return p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Mapped pinned memory: under UVA its device address is its host address. */
EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *out, void *p, unsigned int flags) {
  (void)flags;
  *out = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *p) {
  free(p);
  return CUDA_SUCCESS;
}

/* --- contexts, stream-ordered memory, capture modes, failure injection ----------------------
 * (tests/cpu/test_reliability.c). Context handles are the addresses of the slots below; slot 0 is
 * the primary context, current in every thread until another is made current. A destroyed
 * context's allocations leave the table (their bytes are kept, so that a stale use reads memory
 * that still exists and is counted rather than crashing the test) and its modules' functions
 * refuse to launch. */

#define MAX_CONTEXTS 8

typedef struct {
  int live;
  unsigned long long id;
  int device;
} fake_context;

static fake_context contexts[MAX_CONTEXTS] = {{1, 1, 0}};
static unsigned long long last_context_id = 1, last_buffer_id;
static int last_destroyed = -1;
static _Thread_local int thread_context; /* the slot current in this thread; -1: none */
static int fail_alloc_in, no_async, launch_us;
static long allocs_made;

/* FAKE_CUDA_RESERVED: bytes each allocation's reservation has past its mapping (reserved_tail). */
static void fake_cuda_env_more(void) {
  const char *v = getenv("FAKE_CUDA_RESERVED");
  if (v && *v)
    reserved_tail = (size_t)atol(v);
  v = getenv("FAKE_CUDA_FAIL_ALLOC");
  if (v && *v)
    fail_alloc_in = atoi(v);
  v = getenv("FAKE_CUDA_LAUNCH_US");
  if (v && *v)
    launch_us = atoi(v);
  v = getenv("FAKE_CUDA_NO_ASYNC");
  no_async = v && *v == '1';
}

/* A launch's host-side cost (FAKE_CUDA_LAUNCH_US), outside the fake's lock, as a driver's is
 * outside any lock of the caller's: threads that launch at once overlap it. */
static atomic_int launching; /* threads inside launch_delay: "inside the driver" */

static void launch_delay(void) {
  atomic_fetch_add(&launching, 1);
  if (launch_us > 0)
    nanosleep(&(struct timespec){launch_us / 1000000, (launch_us % 1000000) * 1000L}, NULL);
  atomic_fetch_sub(&launching, 1);
}

static CUcontext current_context(void) {
  return thread_context >= 0 ? (CUcontext)(void *)&contexts[thread_context] : NULL;
}

static int current_index(void) { return thread_context; }

static int current_device(void) {
  return thread_context >= 0 ? contexts[thread_context].device : -1;
}

static unsigned long long current_id(void) {
  return thread_context >= 0 && contexts[thread_context].live ? contexts[thread_context].id : 0;
}

static unsigned long long next_buffer_id(void) { return ++last_buffer_id; }

/* Under lock. */
static int alloc_should_fail(void) {
  allocs_made++;
  return fail_alloc_in > 0 && --fail_alloc_in == 0;
}

static int context_index(CUcontext ctx) {
  fake_context *c = (fake_context *)(void *)ctx;
  return c >= contexts && c < contexts + MAX_CONTEXTS ? (int)(c - contexts) : -1;
}

/* Under lock: a context's allocations go with it. */
static void drop_allocations(int ctx) {
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (allocs[i].p && allocs[i].ctx == ctx) {
      counts.live_allocs--;
      counts.live_bytes -= allocs[i].bytes;
      allocs[i] = (allocation){0};
    }
}

static CUcontext ctx_create(int at_address, int device) {
  pthread_mutex_lock(&lock);
  int i = at_address && last_destroyed >= 0 && !contexts[last_destroyed].live ? last_destroyed : -1;
  for (int j = 1; j < MAX_CONTEXTS && i < 0; j++)
    if (!contexts[j].live && !contexts[j].id)
      i = j;
  if (i >= 0) {
    contexts[i] = (fake_context){1, ++last_context_id, device};
    thread_context = i;
  }
  pthread_mutex_unlock(&lock);
  return i >= 0 ? (CUcontext)(void *)&contexts[i] : NULL;
}

EXPORT CUcontext fake_cuda_ctx_create(int at_address) { return ctx_create(at_address, 0); }

EXPORT CUcontext fake_cuda_ctx_create_on(int device) {
  return device >= 0 && device < FAKE_CUDA_DEVICES ? ctx_create(0, device) : NULL;
}

/* Streams given a context; any other stream (the default ones too) is the current context's. */
#define MAX_BOUND 16
static struct {
  CUstream stream;
  int ctx;
} bound[MAX_BOUND];

EXPORT void fake_cuda_stream_bind(CUstream stream, CUcontext ctx) {
  pthread_mutex_lock(&lock);
  int i = 0;
  while (i < MAX_BOUND && bound[i].stream && bound[i].stream != stream)
    i++;
  if (i < MAX_BOUND)
    bound[i].stream = stream, bound[i].ctx = context_index(ctx);
  pthread_mutex_unlock(&lock);
}

/* Under lock: the context slot of a stream. */
static int stream_context(CUstream stream) {
  for (int i = 0; i < MAX_BOUND && bound[i].stream; i++)
    if (stream && bound[i].stream == stream)
      return bound[i].ctx;
  return thread_context;
}

/* Under lock: the stream is another context's than the one of ID ctx_id. */
static int foreign_stream(CUstream stream, unsigned long long ctx_id) {
  int c = stream_context(stream);
  return c < 0 || contexts[c].id != ctx_id;
}

EXPORT CUresult cuStreamGetCtx(CUstream stream, CUcontext *out) {
  pthread_mutex_lock(&lock);
  int c = stream_context(stream);
  pthread_mutex_unlock(&lock);
  if (c < 0 || !contexts[c].live)
    return CUDA_ERROR_INVALID_CONTEXT;
  *out = (CUcontext)(void *)&contexts[c];
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetPCIBusId(char *out, int len, CUdevice dev) {
  if (dev < 0 || dev >= FAKE_CUDA_DEVICES || len < 13)
    return CUDA_ERROR_INVALID_VALUE;
  snprintf(out, (size_t)len, "0000:%02X:00.0", 0x19 + 0x10 * dev);
  return CUDA_SUCCESS;
}

EXPORT void fake_cuda_ctx_destroy(CUcontext ctx) {
  pthread_mutex_lock(&lock);
  int i = context_index(ctx);
  if (i >= 0 && contexts[i].live) {
    contexts[i].live = 0;
    drop_allocations(i);
    last_destroyed = i;
    if (thread_context == i)
      thread_context = -1;
  } else {
    counts.invalid++;
  }
  pthread_mutex_unlock(&lock);
}

EXPORT void fake_cuda_device_reset(void) {
  pthread_mutex_lock(&lock);
  drop_allocations(0);
  contexts[0] = (fake_context){1, ++last_context_id, 0};
  thread_context = 0;
  pthread_mutex_unlock(&lock);
}

EXPORT int fake_cuda_launching(void) { return atomic_load(&launching); }

EXPORT long fake_cuda_fail_alloc(int nth) {
  pthread_mutex_lock(&lock);
  fail_alloc_in = nth;
  long made = allocs_made;
  pthread_mutex_unlock(&lock);
  return made;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  int i = ctx ? context_index(ctx) : -1;
  if (ctx && i < 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  thread_context = i;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id) {
  pthread_mutex_lock(&lock);
  int i = ctx ? context_index(ctx) : thread_context;
  CUresult r = CUDA_SUCCESS;
  if (i < 0)
    r = CUDA_ERROR_INVALID_CONTEXT;
  else if (!contexts[i].live)
    r = CUDA_ERROR_CONTEXT_IS_DESTROYED;
  else
    *id = contexts[i].id;
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr) {
  pthread_mutex_lock(&lock);
  allocation *a = allocation_of((const void *)(uintptr_t)ptr, 1);
  CUresult r = CUDA_SUCCESS;
  if (attr != CU_POINTER_ATTRIBUTE_BUFFER_ID && attr != CU_POINTER_ATTRIBUTE_RANGE_START_ADDR &&
      attr != CU_POINTER_ATTRIBUTE_RANGE_SIZE)
    r = CUDA_ERROR_NOT_SUPPORTED;
  else if (!a)
    r = CUDA_ERROR_INVALID_VALUE;
  else if (attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
    *(CUdeviceptr *)data = (CUdeviceptr)(uintptr_t)a->p;
  else if (attr == CU_POINTER_ATTRIBUTE_RANGE_SIZE)
    *(size_t *)data = a->bytes + reserved_tail;
  else
    *(unsigned long long *)data = a->buffer_id;
  pthread_mutex_unlock(&lock);
  return r;
}

/* An allocation's mapped range (the reservation's, unless FAKE_CUDA_RESERVED makes the reservation
 * larger than what is mapped, as PyTorch's expandable segments do). */
EXPORT CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  pthread_mutex_lock(&lock);
  allocation *a = allocation_of((const void *)(uintptr_t)ptr, 1);
  if (a) {
    if (base)
      *base = (CUdeviceptr)(uintptr_t)a->p;
    if (size)
      *size = a->bytes;
  }
  pthread_mutex_unlock(&lock);
  return a ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  CUstreamCaptureMode previous =
      thread_relaxed ? CU_STREAM_CAPTURE_MODE_RELAXED : CU_STREAM_CAPTURE_MODE_GLOBAL;
  thread_relaxed = *mode == CU_STREAM_CAPTURE_MODE_RELAXED;
  *mode = previous;
  return CUDA_SUCCESS;
}

/* On a capturing stream the memory is the graph's: it stays valid for the graph's replays (the
 * free in the capture does not release it) and is not counted in live_bytes. */
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *out, size_t bytes, CUstream stream) {
  pthread_mutex_lock(&lock);
  int graph = is_capturing(stream);
  allocation *slot = NULL;
  for (int i = 0; i < MAX_ALLOCS && !slot; i++)
    if (!allocs[i].p)
      slot = &allocs[i];
  char *p = NULL;
  CUresult r = CUDA_SUCCESS;
  if (no_async)
    r = CUDA_ERROR_NOT_SUPPORTED;
  else if (!bytes)
    r = CUDA_ERROR_INVALID_VALUE;
  else if (!slot || alloc_should_fail() || !(p = aligned_alloc(256, (bytes + 255) / 256 * 256)))
    r = CUDA_ERROR_OUT_OF_MEMORY;
  if (r == CUDA_SUCCESS) {
    *slot = (allocation){p, bytes, current_index(), next_buffer_id()};
    *out = (CUdeviceptr)(uintptr_t)p;
    counts.allocs++;
    counts.live_allocs++;
    counts.graph_allocs += graph;
    if (!graph)
      counts.live_bytes += bytes;
  }
  log_simple(FAKE_EV_ALLOC_ASYNC, stream, (uint64_t)(uintptr_t)p, bytes, graph, r);
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) {
  pthread_mutex_lock(&lock);
  int graph = is_capturing(stream);
  allocation *a = NULL;
  for (int i = 0; i < MAX_ALLOCS && !a; i++)
    if (allocs[i].p && (CUdeviceptr)(uintptr_t)allocs[i].p == ptr)
      a = &allocs[i];
  CUresult r = CUDA_SUCCESS;
  size_t bytes = a ? a->bytes : 0;
  if (!a) {
    counts.bad_frees++;
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (graph) {
    counts.graph_frees++; /* the graph keeps it for its replays */
  } else {
    free(a->p);
    *a = (allocation){0};
    counts.frees++;
    counts.live_allocs--;
    counts.live_bytes -= bytes;
  }
  log_simple(FAKE_EV_FREE_ASYNC, stream, ptr, bytes, graph, r);
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&lock);
  note_capture_violation();
  CUresult r = !p || !bytes          ? CUDA_ERROR_INVALID_VALUE
               : alloc_should_fail() ? CUDA_ERROR_OUT_OF_MEMORY
                                     : CUDA_SUCCESS;
  log_simple(FAKE_EV_HOSTREG, NULL, (uint64_t)(uintptr_t)p, bytes, 0, r);
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuMemHostUnregister(void *p) { return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

/* ---- Triton modules ------------------------------------------------------------------------
 *
 * A Triton module's image is a cubin: an ELF file. The fake takes an ELF image whose bytes hold
 * ".text.NAME" for each kernel and one descriptor, "fake-triton: roles=R ints=N scratch=N bm=N
 * bn=N gm=N top_k=N mul=N fp16=N scramble=N", which stands for what Triton compiles into the
 * code: the pointer parameters' roles in order (a, b, c, w router weights, s sorted token ids, e
 * expert ids, p slots in use), the integer and scratch parameters, and the constants of vLLM's
 * fused_moe_kernel (BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M, top_k, MUL_ROUTED_WEIGHT, FP16
 * elements). A launch runs that kernel's arithmetic on the host (FP32 sums in K order, one
 * rounding), as vLLM's source does: programs grouped by GROUP_SIZE_M, blocks past the slots in use
 * skipped, ids past num_valid_tokens masked, blocks of expert -1 writing zeros. scramble=1 is a
 * kernel of the same name and layout that writes each row one row further down. */
struct triton_desc {
  char roles[8];
  int nints, scratch, bm, bn, gm, top_k, mul, fp16, scramble;
};

static int desc_int(const char *d, const char *key) {
  const char *p = strstr(d, key);
  return p ? atoi(p + strlen(key)) : 0;
}

static size_t triton_image(const char *image, triton_desc **tri) {
  if (memcmp(image,
             "\x7f"
             "ELF",
             4))
    return 0;
  uint64_t shoff;
  uint16_t shentsize, shnum;
  memcpy(&shoff, image + 0x28, 8);
  memcpy(&shentsize, image + 0x3a, 2);
  memcpy(&shnum, image + 0x3c, 2);
  size_t size = (size_t)(shoff + (uint64_t)shentsize * shnum);
  const char *d = memmem(image, size, "fake-triton:", 12);
  if (d && (*tri = calloc(1, sizeof **tri))) {
    const char *r = strstr(d, "roles=");
    for (int i = 0; r && i < 7 && r[6 + i] >= 'a' && r[6 + i] <= 'z'; i++)
      (*tri)->roles[i] = r[6 + i];
    (*tri)->nints = desc_int(d, "ints="), (*tri)->scratch = desc_int(d, "scratch=");
    (*tri)->bm = desc_int(d, "bm="), (*tri)->bn = desc_int(d, "bn="),
    (*tri)->gm = desc_int(d, "gm=");
    (*tri)->top_k = desc_int(d, "top_k="), (*tri)->mul = desc_int(d, "mul=");
    (*tri)->fp16 = desc_int(d, "fp16="), (*tri)->scramble = desc_int(d, "scramble=");
  }
  return size;
}

static const void *role_arg(const triton_desc *t, void **params, char role) {
  const char *at = strchr(t->roles, role);
  return at ? *(void *const *)params[at - t->roles] : NULL;
}

static float elem_of(uint16_t h, int fp16) {
  return fp16 ? fake_f16_to_float(h) : fake_bf16_to_float(h);
}

/* One output row's block of columns of vLLM's fused_moe_kernel. */
static void triton_row(const triton_desc *t, const int32_t *in, void **params, long tok, int e,
                       int pid_n) {
  const uint16_t *a = role_arg(t, params, 'a'), *b = role_arg(t, params, 'b');
  uint16_t *c = (uint16_t *)role_arg(t, params, 'c');
  const float *w = role_arg(t, params, 'w');
  const int n = in[0], k = in[1];
  const long am = in[4], be = in[5], bn = in[6], cm = in[7];
  for (int j = 0; j < t->bn; j++) {
    const int col = pid_n * t->bn + j;
    if (col >= n)
      continue;
    float acc = 0.0f;
    for (int kk = 0; e != -1 && kk < k; kk++)
      acc += elem_of(a[tok / t->top_k * am + kk], t->fp16) *
             elem_of(b[e * be + (long)(col % n) * bn + kk], t->fp16);
    if (t->mul && e != -1)
      acc *= w[tok];
    c[(tok + t->scramble) * cm + col] = t->fp16 ? fake_float_to_f16(acc) : fake_float_to_bf16(acc);
  }
}

static void triton_launch(const triton_desc *t, const CUlaunchConfig *cfg, void **params) {
  const int np = (int)strlen(t->roles);
  int32_t in[16] = {0};
  if (t->nints != 15)
    return; /* a layout the fake computes nothing for */
  for (int i = 0; i < t->nints; i++)
    memcpy(&in[i], params[np + i], 4);
  const int32_t *sorted = role_arg(t, params, 's'), *experts = role_arg(t, params, 'e');
  const int32_t *padded = role_arg(t, params, 'p');
  const long num_pid_m = (in[2] + t->bm - 1) / t->bm, num_pid_n = (in[0] + t->bn - 1) / t->bn,
             valid = in[3];
  for (long pid = 0; pid < (long)cfg->gridDimX; pid++) {
    const long in_group = t->gm * num_pid_n, first = pid / in_group * t->gm;
    const long size = num_pid_m - first < t->gm ? num_pid_m - first : t->gm;
    if (size <= 0)
      continue;
    const long pid_m = first + pid % in_group % size, pid_n = pid % in_group / size;
    if (pid_m * t->bm >= *padded)
      continue;
    for (int i = 0; i < t->bm; i++) {
      const long tok = sorted ? sorted[pid_m * t->bm + i] : i == 0 ? pid_m : valid;
      if (tok < valid)
        triton_row(t, in, params, tok, experts[pid_m], (int)pid_n);
    }
  }
}

EXPORT CUresult cuFuncGetParamInfo(CUfunction f, size_t index, size_t *offset, size_t *size) {
  pthread_mutex_lock(&lock);
  function *fn = function_of(f);
  const triton_desc *t = fn ? fn->mod->tri : NULL;
  const size_t np = t ? strlen(t->roles) : 0,
               n = t ? np + (size_t)t->nints + (size_t)t->scratch : 0;
  CUresult r = t && index < n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    size_t at = 0;
    for (size_t i = 0; i <= index; i++) {
      const size_t sz = i < np || i >= np + (size_t)t->nints ? 8 : 4;
      at = (at + sz - 1) / sz * sz;
      if (i == index)
        *offset = at, *size = sz;
      at += sz;
    }
  }
  pthread_mutex_unlock(&lock);
  return r;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned smem, CUstream stream,
                               void **params, void **extra) {
  const CUlaunchConfig c = {.gridDimX = gx,
                            .gridDimY = gy,
                            .gridDimZ = gz,
                            .blockDimX = bx,
                            .blockDimY = by,
                            .blockDimZ = bz,
                            .sharedMemBytes = smem,
                            .hStream = stream};
  return launch_ex(&c, f, params, extra);
}

/* The fake's own launch, for a test to run a kernel past the shim's hook. */
EXPORT CUresult fake_cuda_launch_ex(const CUlaunchConfig *config, CUfunction f, void **params,
                                    void **extra) {
  return launch_ex(config, f, params, extra);
}

EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  return hmod ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* cuGetProcAddress_v2 (cuda.h's macro names it), for the symbols the tests ask for. */
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status) {
  (void)version, (void)flags;
  void *p = !strcmp(symbol, "cuLaunchKernelEx") ? (void *)own_launch_kernel_ex : NULL;
  if (status)
    *status = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  *pfn = p;
  return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* mt_moe_dispatch (kernels/grouped.cu) on the host: the same lists, each segment's rows in slot
 * order (the GPU's order within a segment is any). */
static void moe_dispatch(const mt_moe_dispatch_args *a) {
  const long padded = *a->post_padded;
  const long run = padded > 0 ? (padded + a->block_m - 1) / a->block_m : 0;
  const long blocks = run < a->blocks ? run : a->blocks,
             slots = a->sorted ? blocks * a->block_m : blocks;
  int *next = calloc((size_t)a->nseg + 1, sizeof *next);
  for (int pass = 0; pass < 2; pass++) {
    for (long s = 0; s < slots; s++) {
      const int id = a->sorted ? a->sorted[s] : (int)s,
                e = a->experts[a->sorted ? s / a->block_m : s];
      if (id < 0 || id >= a->valid)
        continue;
      if (e >= 0 && e < a->nseg && pass == 0) {
        next[e + 1]++;
      } else if (e >= 0 && e < a->nseg) {
        const int r = next[e]++;
        a->src[r] = id / a->top_k, a->dst[r] = id;
        if (a->w)
          a->w[r] = a->weights[id];
      } else if (e == -1 && pass == 1) {
        memset((uint16_t *)a->y + (long long)id * a->ldy, 0, (size_t)a->n * 2);
      }
    }
    if (pass == 0)
      for (int e = 0; e < a->nseg; e++)
        next[e + 1] += next[e], a->offs[e] = next[e + 1];
  }
  const int total = a->nseg ? a->offs[a->nseg - 1] : 0;
  for (int r = total; r < a->valid; r++)
    a->src[r] = total ? a->src[0] : 0, a->dst[r] = -1;
  free(next);
}
