/* loader.c — the loader's own dlsym and dlvsym (see loader.h), read from the dynamic symbol table
 * of the object that defines dladdr1 (which holds dlsym and dlvsym too), which the shim does not
 * export: no lookup here can reach the shim's own dlsym. */
#include "base/loader.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

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

/* Neither dladdr1 nor the symbol table is anything a sanitizer intercepts (dlopen would be). */
MT_BEFORE_INIT void *mt_loader_function(const char *name) {
  Dl_info info;
  struct link_map *lm = NULL;
  if (!dladdr1((void *)dladdr1, &info, (void **)&lm, RTLD_DL_LINKMAP))
    return NULL;
  return (void *)elf_lookup(lm, name);
}

/* Never the next dlsym after the library: RTLD_NEXT from here must mean "after this library". */
mt_dlsym_fn mt_loader_dlsym(void) {
  static void *_Atomic own;
  void *p = atomic_load_explicit(&own, memory_order_acquire);
  if (!p && (p = mt_loader_function("dlsym")))
    atomic_store_explicit(&own, p, memory_order_release);
  mt_dlsym_fn f;
  memcpy(&f, &p, sizeof f);
  return f;
}

void *mt_loader_sym(void *handle, const char *name) {
  mt_dlsym_fn sym = mt_loader_dlsym();
  return sym && handle ? sym(handle, name) : NULL;
}
