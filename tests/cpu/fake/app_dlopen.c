/* app_dlopen.c — the PyTorch arrangement: this program is not linked to cuBLAS; it dlopen()s
 * libfakeapp.so with RTLD_LOCAL, which brings the fake cuBLAS in as its own dependency, so that
 * cuBLAS is not in the global scope and dlsym(RTLD_NEXT) cannot find it.
 * Usage: app_dlopen LIBFAKEAPP OUT EXPECT. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
  if (argc != 4)
    return 2;
  if (dlopen("libcublas.so.13", RTLD_NOW | RTLD_NOLOAD) ||
      dlopen("libcublas.so.12", RTLD_NOW | RTLD_NOLOAD)) {
    fprintf(stderr, "app_dlopen: cuBLAS is loaded before the app library: wrong arrangement\n");
    return 1;
  }
  void *app = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!app) {
    fprintf(stderr, "app_dlopen: %s\n", dlerror());
    return 1;
  }
  int (*run)(const char *, const char *) =
      (int (*)(const char *, const char *))dlsym(app, "fake_app_run");
  if (!run || dlsym(RTLD_DEFAULT, "fake_cublas_last")) {
    fprintf(stderr, "app_dlopen: fake_app_run missing, or the fake cuBLAS is global\n");
    return 1;
  }
  return run(argv[2], argv[3]) ? 1 : 0;
}
