/* real.c — the lookup of real functions: RTLD_NEXT, then the already-loaded library; the loader's
 * own dlsym and dlvsym from its symbol table. */
#include "shim/real.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

enum lib { CUBLAS, CUBLASLT, TORCH, LIBC };

static const struct {
  const char *symbol, *display;
  enum lib lib;
} fns[MT_FN_COUNT] = {
#define MT_HOOK(name, lib, params, ...) {#name, #name, lib},
#define MT_REAL(name, lib, ret, params) {#name, #name, lib},
#define MT_HAND(name, symbol, lib, display, ret, params) {#symbol, display, lib},
#include "shim/hooks.def"
#undef MT_HOOK
#undef MT_REAL
#undef MT_HAND
};

/* CUDA 13 first: a process holds one cuBLAS, and when it is 13 the 12 name is never there. */
static const char *const sonames[][3] = {
    [CUBLAS] = {"libcublas.so.13", "libcublas.so.12", NULL},
    [CUBLASLT] = {"libcublasLt.so.13", "libcublasLt.so.12", NULL},
    [TORCH] = {"libtorch_cuda.so", NULL, NULL},
    [LIBC] = {NULL, NULL, NULL},
};

void *_Atomic mt_real_ptr[MT_FN_COUNT];
static atomic_flag missing_warned[MT_FN_COUNT];

const char *mt_fn_name(enum mt_fn id) { return fns[id].display; }

/* --- the loader's own dlsym and dlvsym ------------------------------------------------------
 * Read from the dynamic symbol table of the object that defines dladdr1 (libc.so.6 since glibc
 * 2.34, libdl.so.2 before, which both hold dlsym and dlvsym too), which the shim does not export:
 * no lookup here can reach the shim's own dlsym. All of it is MT_BEFORE_INIT (real.h). */

typedef struct {
  const ElfW(Sym) * sym;
  const char *str;
  const ElfW(Half) * versym; /* NULL: the object has no symbol versions */
  const uint32_t *gnu_hash;
  const ElfW(Word) * sysv_hash;
} dynsyms;

/* glibc relocates these entries of the dynamic section in place on most architectures, not on
 * those whose dynamic section is read-only: an address below the load base is an offset. */
MT_BEFORE_INIT static const void *dyn_addr(const struct link_map *lm, ElfW(Addr) v) {
  return (const void *)(v < lm->l_addr ? lm->l_addr + v : v);
}

MT_BEFORE_INIT static int read_dynamic(const struct link_map *lm, dynsyms *d) {
  *d = (dynsyms){0};
  for (const ElfW(Dyn) *e = lm->l_ld; e && e->d_tag != DT_NULL; e++) {
    if (e->d_tag == DT_SYMTAB)
      d->sym = dyn_addr(lm, e->d_un.d_ptr);
    else if (e->d_tag == DT_STRTAB)
      d->str = dyn_addr(lm, e->d_un.d_ptr);
    else if (e->d_tag == DT_VERSYM)
      d->versym = dyn_addr(lm, e->d_un.d_ptr);
    else if (e->d_tag == DT_GNU_HASH)
      d->gnu_hash = dyn_addr(lm, e->d_un.d_ptr);
    else if (e->d_tag == DT_HASH)
      d->sysv_hash = dyn_addr(lm, e->d_un.d_ptr);
  }
  return d->sym && d->str && (d->gnu_hash || d->sysv_hash) ? 0 : -1;
}

MT_BEFORE_INIT static int same_name(const char *a, const char *b) {
  while (*a && *a == *b)
    a++, b++;
  return *a == *b;
}

/* Symbol i when it is the function `name` defined here (ELF64_ST_TYPE is ELF32_ST_TYPE too).
 * *hidden_ok keeps a non-default version (name@VER rather than name@@VER) in case no default one
 * exists. */
MT_BEFORE_INIT static const void *match(const struct link_map *lm, const dynsyms *d, uint32_t i,
                                        const char *name, const void **hidden_ok) {
  const ElfW(Sym) *s = &d->sym[i];
  if (s->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(s->st_info) != STT_FUNC ||
      !same_name(d->str + s->st_name, name))
    return NULL;
  const void *p = (const void *)(lm->l_addr + s->st_value);
  if (d->versym && (d->versym[i] & 0x8000)) {
    *hidden_ok = p;
    return NULL;
  }
  return p;
}

MT_BEFORE_INIT static uint32_t gnu_hash_of(const char *s) {
  uint32_t h = 5381;
  for (; *s; s++)
    h = h * 33 + (unsigned char)*s;
  return h;
}

MT_BEFORE_INIT static uint32_t sysv_hash_of(const char *s) {
  uint32_t h = 0;
  for (; *s; s++) {
    h = (h << 4) + (unsigned char)*s;
    uint32_t g = h & 0xf0000000u;
    h ^= g >> 24;
    h &= ~g;
  }
  return h;
}

MT_BEFORE_INIT static const void *elf_lookup(const struct link_map *lm, const char *name) {
  dynsyms d;
  if (!lm || read_dynamic(lm, &d) != 0)
    return NULL;
  const void *hidden = NULL, *p = NULL;
  if (d.gnu_hash) {
    uint32_t nbuckets = d.gnu_hash[0], first = d.gnu_hash[1], bloom = d.gnu_hash[2];
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(d.gnu_hash + 4) + bloom);
    const uint32_t *chain = buckets + nbuckets, h = gnu_hash_of(name);
    uint32_t i = nbuckets ? buckets[h % nbuckets] : 0;
    for (; i >= first && i != 0 && !p; i++) {
      uint32_t c = chain[i - first];
      if ((c | 1) == (h | 1))
        p = match(lm, &d, i, name, &hidden);
      if (c & 1)
        break;
    }
  } else {
    ElfW(Word) nbuckets = d.sysv_hash[0];
    const ElfW(Word) *buckets = d.sysv_hash + 2, *chain = buckets + nbuckets;
    for (ElfW(Word) i = nbuckets ? buckets[sysv_hash_of(name) % nbuckets] : 0; i && !p;
         i = chain[i])
      p = match(lm, &d, i, name, &hidden);
  }
  return p ? p : hidden;
}

/* The loader's own function `name`: in the object that defines dladdr1. Neither dladdr1 nor the
 * symbol table is anything a sanitizer intercepts (dlopen would be). */
MT_BEFORE_INIT static void *loader_function(const char *name) {
  Dl_info info;
  struct link_map *lm = NULL;
  if (!dladdr1((void *)dladdr1, &info, (void **)&lm, RTLD_DL_LINKMAP))
    return NULL;
  return (void *)elf_lookup(lm, name);
}

/* dlsym and dlvsym for the hooks to forward to: the next definition after this library (another
 * interposer preloaded after it keeps seeing the calls), else the loader's own. */
MT_BEFORE_INIT void *mt_real_loader(enum mt_fn id) {
  void *p = atomic_load_explicit(&mt_real_ptr[id], memory_order_acquire);
  if (p)
    return p;
  mt_fn_dlsym sym = (mt_fn_dlsym)loader_function("dlsym");
  const char *name = id == MT_FN_dlsym ? "dlsym" : "dlvsym";
  void *own = id == MT_FN_dlsym ? (void *)sym : loader_function(name);
  void *next = sym ? sym(RTLD_NEXT, name) : NULL;
  p = next ? next : own;
  if (p)
    atomic_store_explicit(&mt_real_ptr[id], p, memory_order_release);
  return p;
}

/* The loader's own dlsym, for the shim's own lookups (never the next one: RTLD_NEXT from here must
 * mean "after this library"). */
static mt_fn_dlsym own_dlsym(void) {
  static void *_Atomic own;
  void *p = atomic_load_explicit(&own, memory_order_acquire);
  if (!p && (p = loader_function("dlsym")))
    atomic_store_explicit(&own, p, memory_order_release);
  return (mt_fn_dlsym)p;
}

/* --- everything else ------------------------------------------------------------------------ */

void *mt_real_find(enum mt_fn id) {
  void *p = NULL;
  if (fns[id].lib == LIBC) {
    p = mt_real_loader(id);
  } else {
    mt_fn_dlsym sym = own_dlsym();
    p = sym ? sym(RTLD_NEXT, fns[id].symbol) : NULL;
    for (int i = 0; sym && !p && sonames[fns[id].lib][i]; i++) {
      /* The handle is kept open on purpose: it pins the library, so the cached pointer cannot
       * outlive the code it points to if the program dlcloses its own handle. */
      void *h = dlopen(sonames[fns[id].lib][i], RTLD_NOW | RTLD_NOLOAD);
      if (h)
        p = sym(h, fns[id].symbol);
    }
  }
  /* Racing threads find the same address, so a plain store is enough. */
  if (p)
    atomic_store_explicit(&mt_real_ptr[id], p, memory_order_release);
  return p;
}

void *mt_real_adopt(enum mt_fn id, void *p) {
  void *cur = mt_real(id);
  if (!cur && !atomic_compare_exchange_strong(&mt_real_ptr[id], &cur, p))
    return cur; /* another thread adopted first: cur holds its choice */
  return cur ? cur : p;
}

/* The object holding `addr`, opened again without loading anything (kept open: it pins it). */
static void *object_of(const void *addr) {
  Dl_info info;
  if (!addr || !dladdr(addr, &info) || !info.dli_fname)
    return NULL;
  return dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
}

void *mt_real_beside(const void *fn, const char *name) {
  mt_fn_dlsym sym = own_dlsym();
  void *h = object_of(fn);
  return sym && h ? sym(h, name) : NULL;
}

void *mt_real_near(enum mt_fn id, const void *addr) {
  void *p = mt_real_beside(addr, fns[id].symbol);
  return p ? mt_real_adopt(id, p) : NULL;
}

cublasStatus_t mt_real_missing(enum mt_fn id) {
  if (!atomic_flag_test_and_set(&missing_warned[id]))
    MT_WARN("cannot find the real %s: it is neither next in the symbol search order nor in an "
            "already loaded %s or %s; returning CUBLAS_STATUS_NOT_INITIALIZED. Load cuBLAS "
            "before calling it, or remove libminite.so from LD_PRELOAD",
            fns[id].symbol, sonames[fns[id].lib][0], sonames[fns[id].lib][1]);
  return CUBLAS_STATUS_NOT_INITIALIZED;
}
