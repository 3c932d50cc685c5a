/* launch.c — the driver's kernel loads and launches (see launch.h). */
#include "shim/launch.h"

#include <elf.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "base/log.h"
#include "shim/shim.h"
#include "shim/vllm.h"

#define MT_EXPORT __attribute__((visibility("default")))

/* --- the functions the door decodes ------------------------------------------------------------
 *
 * Open addressing on the CUfunction, lock-free to read: a slot's state is published before its
 * key (release), found by the key (acquire). Slots are written under table_lock and never reused
 * for another key while a launch may read them: a removed slot keeps its state and takes the
 * tombstone key. */
#define SLOTS 1024
#define TOMBSTONE ((uintptr_t)1)

typedef struct {
  _Atomic uintptr_t key;
  CUmodule module;
  mt_vllm_fn *v;
} slot;

static slot table[SLOTS];
static atomic_int recorded; /* functions ever recorded: 0 keeps every launch on the fast path */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

/* Module origins (launch.h), for the functions taken from them. */
#define MODULES 256
static struct {
  CUmodule module;
  enum mt_origin origin;
} origins[MODULES];

static unsigned home(uintptr_t key) {
  return (unsigned)((key >> 4) * 0x9E3779B97F4A7C15ull >> 54) % SLOTS;
}

static mt_vllm_fn *lookup(CUfunction f) {
  const uintptr_t key = (uintptr_t)f;
  for (unsigned i = 0, h = home(key); i < SLOTS; i++) {
    const slot *s = &table[(h + i) % SLOTS];
    const uintptr_t k = atomic_load_explicit(&s->key, memory_order_acquire);
    if (k == key)
      return s->v;
    if (!k)
      return NULL;
  }
  return NULL;
}

/* Under table_lock. */
static enum mt_origin origin_of(CUmodule m) {
  for (int i = 0; i < MODULES; i++)
    if (origins[i].module == m)
      return origins[i].origin;
  return MT_ORIGIN_UNKNOWN;
}

static void record(CUfunction f, CUmodule m) {
  pthread_mutex_lock(&table_lock);
  const uintptr_t key = (uintptr_t)f;
  unsigned h = home(key), i = 0;
  for (; i < SLOTS; i++) {
    const uintptr_t k = atomic_load_explicit(&table[(h + i) % SLOTS].key, memory_order_relaxed);
    if (k == key || !k)
      break;
  }
  slot *s = i < SLOTS ? &table[(h + i) % SLOTS] : NULL;
  if (s && atomic_load_explicit(&s->key, memory_order_relaxed) != key) {
    mt_vllm_fn *v = mt_vllm_fn_new(f, origin_of(m));
    if (v) {
      s->module = m;
      s->v = v;
      atomic_store_explicit(&s->key, key, memory_order_release);
      atomic_fetch_add(&recorded, 1);
    }
  } else if (!s) {
    MT_WARN_ONCE("more than %d fused_moe_kernel functions loaded: the later ones run unchanged",
                 SLOTS);
  }
  pthread_mutex_unlock(&table_lock);
}

/* A Triton image is a cubin: an ELF file, whose section headers end it. */
static size_t elf_size(const void *image) {
  const unsigned char *p = image;
  if (memcmp(p, ELFMAG, SELFMAG) || p[EI_CLASS] != ELFCLASS64)
    return 0;
  Elf64_Ehdr h;
  memcpy(&h, p, sizeof h);
  const uint64_t sections = h.e_shoff + (uint64_t)h.e_shnum * h.e_shentsize;
  const uint64_t segments = h.e_phoff + (uint64_t)h.e_phnum * h.e_phentsize;
  const uint64_t size = sections > segments ? sections : segments;
  return size <= ((uint64_t)1 << 30) ? (size_t)size : 0;
}

static void note_module(CUmodule m, const void *image) {
  const size_t size = image ? elf_size(image) : 0;
  const enum mt_origin o = size ? mt_vllm_origin(image, size) : MT_ORIGIN_UNKNOWN;
  if (o == MT_ORIGIN_UNKNOWN)
    return;
  pthread_mutex_lock(&table_lock);
  int at = -1;
  for (int i = 0; i < MODULES && at < 0; i++)
    if (origins[i].module == m || !origins[i].module)
      at = i;
  if (at >= 0)
    origins[at].module = m, origins[at].origin = o;
  pthread_mutex_unlock(&table_lock);
}

static void forget_module(CUmodule m) {
  pthread_mutex_lock(&table_lock);
  for (int i = 0; i < SLOTS; i++)
    if (table[i].module == m &&
        atomic_load_explicit(&table[i].key, memory_order_relaxed) > TOMBSTONE)
      atomic_store_explicit(&table[i].key, TOMBSTONE, memory_order_release);
  for (int i = 0; i < MODULES; i++)
    if (origins[i].module == m)
      origins[i].module = NULL;
  pthread_mutex_unlock(&table_lock);
}

/* --- the hooks -------------------------------------------------------------------------------- */

MT_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  mt_fn_cuModuleLoadData real = MT_REAL_FN(cuModuleLoadData);
  if (!real)
    return mt_real_driver_missing(MT_FN_cuModuleLoadData);
  const CUresult r = real(module, image);
  if (r == CUDA_SUCCESS && mt_shim_active())
    note_module(*module, image);
  return r;
}

MT_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
  mt_fn_cuModuleGetFunction real = MT_REAL_FN(cuModuleGetFunction);
  if (!real)
    return mt_real_driver_missing(MT_FN_cuModuleGetFunction);
  const CUresult r = real(hfunc, hmod, name);
  if (r == CUDA_SUCCESS && mt_shim_active() && name && mt_vllm_named(name))
    record(*hfunc, hmod);
  return r;
}

MT_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  mt_fn_cuModuleUnload real = MT_REAL_FN(cuModuleUnload);
  if (!real)
    return mt_real_driver_missing(MT_FN_cuModuleUnload);
  if (atomic_load_explicit(&recorded, memory_order_relaxed))
    forget_module(hmod);
  return real(hmod);
}

/* A recorded function's launch: 1 when the engine ran it. ptsz: the per-thread default stream is
 * the one a NULL stream means. */
static int door(CUfunction f, const CUlaunchConfig *config, void **params, void **extra, int ptsz) {
  mt_vllm_fn *v = lookup(f);
  if (!v || !mt_shim_active())
    return 0;
  mt_launch_args l = {.f = f, .config = *config, .params = params, .extra = extra};
  if (ptsz && !l.config.hStream)
    l.config.hStream = CU_STREAM_PER_THREAD;
  return mt_vllm_launch(v, &l);
}

static CUlaunchConfig config_of(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                unsigned bz, unsigned smem, CUstream stream) {
  return (CUlaunchConfig){.gridDimX = gx,
                          .gridDimY = gy,
                          .gridDimZ = gz,
                          .blockDimX = bx,
                          .blockDimY = by,
                          .blockDimZ = bz,
                          .sharedMemBytes = smem,
                          .hStream = stream};
}

/* The launch hooks: the fast path loads the real function and the count of recorded functions;
 * the rest lives in functions of its own, so that the common case holds no call but the real
 * one. */
#define LAUNCH_EX(name, ptsz)                                                                      \
  __attribute__((noinline)) static CUresult slow_##name(                                           \
      const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {                   \
    mt_fn_##name real = MT_REAL_FN(name);                                                          \
    if (!real)                                                                                     \
      return mt_real_driver_missing(MT_FN_##name);                                                 \
    if (config && door(f, config, params, extra, ptsz))                                            \
      return CUDA_SUCCESS;                                                                         \
    return real(config, f, params, extra);                                                         \
  }                                                                                                \
  MT_EXPORT CUresult name(const CUlaunchConfig *config, CUfunction f, void **params,               \
                          void **extra) {                                                          \
    mt_fn_##name real = MT_REAL_KNOWN(name);                                                       \
    if (__builtin_expect(real && !atomic_load_explicit(&recorded, memory_order_relaxed), 1))       \
      return real(config, f, params, extra);                                                       \
    return slow_##name(config, f, params, extra);                                                  \
  }
LAUNCH_EX(cuLaunchKernelEx, 0)
LAUNCH_EX(cuLaunchKernelEx_ptsz, 1)

#define LAUNCH(name, ptsz)                                                                         \
  __attribute__((noinline)) static CUresult slow_##name(                                           \
      CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,  \
      unsigned smem, CUstream s, void **params, void **extra) {                                    \
    mt_fn_##name real = MT_REAL_FN(name);                                                          \
    if (!real)                                                                                     \
      return mt_real_driver_missing(MT_FN_##name);                                                 \
    const CUlaunchConfig config = config_of(gx, gy, gz, bx, by, bz, smem, s);                      \
    if (door(f, &config, params, extra, ptsz))                                                     \
      return CUDA_SUCCESS;                                                                         \
    return real(f, gx, gy, gz, bx, by, bz, smem, s, params, extra);                                \
  }                                                                                                \
  MT_EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,        \
                          unsigned by, unsigned bz, unsigned smem, CUstream s, void **params,      \
                          void **extra) {                                                          \
    mt_fn_##name real = MT_REAL_KNOWN(name);                                                       \
    if (__builtin_expect(real && !atomic_load_explicit(&recorded, memory_order_relaxed), 1))       \
      return real(f, gx, gy, gz, bx, by, bz, smem, s, params, extra);                              \
    return slow_##name(f, gx, gy, gz, bx, by, bz, smem, s, params, extra);                         \
  }
LAUNCH(cuLaunchKernel, 0)
LAUNCH(cuLaunchKernel_ptsz, 1)
