/* preload.h — what the tests that run programs under the preloaded shim share: reading a file
 * whole, a fallback count of a statistics summary, and the LD_PRELOAD value (build/libminite.so,
 * after the sanitizer runtime that tests/cpu/shim.mk names in preload_first.txt for SAN=1 builds,
 * which must come first). */
#ifndef MT_TESTS_PRELOAD_H
#define MT_TESTS_PRELOAD_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The whole file, NUL-terminated (NULL when it cannot be opened); its length into *len. */
__attribute__((unused)) static char *mt_t_read_file(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  if (fread(s, 1, (size_t)n, f) != (size_t)n)
    n = 0;
  s[n] = '\0';
  fclose(f);
  if (len)
    *len = n;
  return s;
}

/* The count of a reason inside a summary record's "fallbacks" object: 0 when absent, -1 when the
 * record (or the object) is missing. */
__attribute__((unused)) static long mt_t_fallback(const char *summary, const char *reason) {
  const char *f = summary ? strstr(summary, "\"fallbacks\": {") : NULL;
  if (!f)
    return -1;
  const char *end = strchr(f, '}');
  char pat[96];
  snprintf(pat, sizeof pat, "\"%s\": ", reason);
  const char *p = strstr(f, pat);
  return p && p < end ? strtol(p + strlen(pat), NULL, 10) : 0;
}

/* LD_PRELOAD for the library in `build` (an absolute path). */
__attribute__((unused)) static void mt_t_preload_value(const char *build, char *out, size_t size) {
  char path[4200];
  snprintf(path, sizeof path, "%s/tests/cpu/fake/preload_first.txt", build);
  char *first = mt_t_read_file(path, NULL);
  if (first && strchr(first, '\n'))
    *strchr(first, '\n') = '\0';
  snprintf(out, size, "%s%s%s/libminite.so", first && first[0] ? first : "",
           first && first[0] ? " " : "", build);
  free(first);
}

#endif
