/* fuzz_spec.c — libFuzzer target of the spec parser (lab/fuzz.mk): any input must parse or fail
 * without a crash or a read past its end (ASan, UBSan), every message must be one printable line,
 * and a spec that parses must survive the round trip canonical -> parse with the same canonical
 * text and fingerprint. Any mismatch aborts, so libFuzzer keeps the input. Seeds:
 * lab/fuzz-seeds/spec.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "spec/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_messages(const mt_spec_errors *errs) {
  if (errs->n < 1 || errs->n > MT_SPEC_MAX_ERRORS || errs->dropped < 0)
    abort();
  for (int i = 0; i < errs->n; i++) {
    const char *msg = errs->e[i].msg;
    size_t len = strnlen(msg, sizeof errs->e[i].msg);
    if (len == 0 || len == sizeof errs->e[i].msg || errs->e[i].line < 0)
      abort();
    for (size_t k = 0; k < len; k++)
      if (msg[k] < 0x20 || msg[k] >= 0x7f)
        abort();
  }
}

static void check_round_trip(const mt_spec *s) {
  static char text[MT_SPEC_CANONICAL_MAX], again[MT_SPEC_CANONICAL_MAX];
  mt_spec back;
  size_t n = mt_spec_canonical(s, text, sizeof text);
  if (n >= sizeof text || mt_spec_parse(text, n, &back, NULL) != 0)
    abort();
  if (mt_spec_canonical(&back, again, sizeof again) != n || memcmp(text, again, n) != 0)
    abort();
  if (mt_spec_fingerprint(&back) != mt_spec_fingerprint(s) || back.nroutes != s->nroutes)
    abort();
  for (int i = 0; i < s->nroutes; i++)
    if (!mt_spec_routes(&back, s->routes[i].out, s->routes[i].in))
      abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mt_spec spec;
  mt_spec_errors errs;
  if (mt_spec_parse((const char *)data, size, &spec, &errs) == 0) {
    if (errs.n != 0)
      abort();
    check_round_trip(&spec);
  } else {
    check_messages(&errs);
  }
  return 0;
}
