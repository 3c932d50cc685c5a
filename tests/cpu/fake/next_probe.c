/* next_probe.c — small libraries for the CPU tests of the shim's dlsym and dlvsym
 * (tests/cpu/test_shim_dl.c), one source built as four (-DWHICH=1..4, version node FAKE_1):
 * 1 and 2 are the dependencies of next_app.c in that order, so that dlsym(RTLD_NEXT) from 1 finds
 * 2's probe;
 * 3 is loaded RTLD_LOCAL with 4 as its dependency, so that dlsym(RTLD_DEFAULT) from 3 finds 4's
 * fake_local_only only through 3's own scope. Both answers depend on the loader seeing the
 * caller's return address, which the shim's dlsym must leave intact (and which these functions
 * must not give away themselves: tests/cpu/front.mk builds them without sibling calls).
 */
#include <dlfcn.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT int fake_next_probe(void) { return WHICH; }

EXPORT void *fake_next_lookup(void) { return dlsym(RTLD_NEXT, "fake_next_probe"); }

EXPORT void *fake_next_vlookup(void) { return dlvsym(RTLD_NEXT, "fake_next_probe", "FAKE_1"); }

EXPORT void *fake_default_lookup(const char *name) { return dlsym(RTLD_DEFAULT, name); }

#if WHICH == 4
EXPORT int fake_local_only(void) { return 4; }
#endif
