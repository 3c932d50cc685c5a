/* next_app.c — the program of the RTLD_NEXT and RTLD_DEFAULT checks of tests/cpu/test_shim_dl.c:
 * linked to libnext_1.so and libnext_2.so in that order (the initial scope, where RTLD_NEXT from 1
 * finds 2), it also dlopens libnext_3.so with RTLD_LOCAL (whose dependency 4 only 3's own lookups
 * see). Usage: next_app DIR (the folder of the libraries). Prints what differs from the loader's
 * own answers; exit 0 when nothing does.
 */
#include <dlfcn.h>
#include <stdio.h>

void *fake_next_lookup(void);
void *fake_next_vlookup(void);

int main(int argc, char **argv) {
  if (argc != 2)
    return 2;
  int bad = 0;
  int (*next)(void) = (int (*)(void))fake_next_lookup();
  if (!next || next() != 2)
    bad++, printf("dlsym(RTLD_NEXT) from library 1 gave %s\n", next ? "1's probe" : "nothing");
  int (*vnext)(void) = (int (*)(void))fake_next_vlookup();
  if (!vnext || vnext() != 2)
    bad++, printf("dlvsym(RTLD_NEXT) from library 1 gave %s\n", vnext ? "1's probe" : "nothing");
  char path[4200];
  snprintf(path, sizeof path, "%s/libnext_3.so", argv[1]);
  void *lib3 = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  void *(*lookup)(const char *) =
      lib3 ? (void *(*)(const char *))dlsym(lib3, "fake_default_lookup") : NULL;
  int (*mine)(void) = lookup ? (int (*)(void))lookup("fake_local_only") : NULL;
  if (!mine || mine() != 4)
    bad++, printf("dlsym(RTLD_DEFAULT) from a local library missed its own dependency\n");
  if (dlsym(RTLD_DEFAULT, "fake_local_only"))
    bad++, printf("dlsym(RTLD_DEFAULT) from the program found a local library's symbol\n");
  return bad ? 1 : 0;
}
