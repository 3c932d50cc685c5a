/* fuzz_env.c — libFuzzer target of what the shim reads from the environment and writes as JSON
 * (lab/fuzz.mk): the first input byte picks a parser, the rest is the value.
 *
 *   MINITE_* values through base/params.c (every variable of base/params.def): each result is the
 *   default or in range, and every message is formatted and written (to /dev/null);
 *   path templates through base/proc.c: the expansion fits its buffer and is NUL-terminated, an
 *   unknown escape is found exactly when the template holds one;
 *   MINITE_ROUTE lists through mt_spec_add_routes: a refusal leaves the spec as it was and says
 *   why in one printable line, an acceptance keeps the routes sorted and unique;
 *   JSON strings (base/json.c) into buffers of every size: always a closed literal, valid UTF-8,
 *   no raw control character, nothing past the buffer.
 * Any violation aborts, so libFuzzer keeps the input.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/log.h"
#include "base/params.h"
#include "base/proc.h"
#include "spec/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  mt_log_to(open("/dev/null", O_WRONLY)); /* messages are formatted and written, out of the way */
  mt_log_set_level(MT_LOG_TRACE);
  return 0;
}

/* Every MINITE_* variable set to v: each value the default or in range, and every message
 * formatted and written. */
static void params(const char *v) {
  mt_params p;
  char buf[MT_LOG_VALUE_MAX + 512];
  for (int id = 0; id < MT_P_NUM; id++)
    setenv(mt_param_defs[id].name, v, 1);
  mt_params_read(&p);
  if (!(p.shadow >= 0 && p.shadow <= 1) || p.cache_mb > (1ull << 30) || p.instr_slots < 1 ||
      p.instr_slots > 65536)
    abort();
  if (p.log_level > MT_LOG_TRACE || p.capture > MT_CAPTURE_GRAPH ||
      p.weight_cache > MT_WCACHE_FROZEN_SAMPLED || p.strict > 1)
    abort();
  if (!p.spec != !v[0])
    abort();
  for (int id = 0; id < MT_P_NUM; id++) {
    if (strlen(mt_params_value(&p, id, buf, sizeof buf)) >= sizeof buf)
      abort();
    if (!mt_params_problem(&p, id, buf, sizeof buf) != (p.from[id] != MT_FROM_INVALID))
      abort();
  }
  unsetenv("MINITE_LOG_FILE"); /* the log stays on /dev/null */
  mt_params_read(&p);
  mt_params_start(&p);
  mt_log_set_level(MT_LOG_TRACE);
}

static void templates(const char *v) {
  char out[64], big[8192], esc[3];
  size_t sizes[] = {1, 2, 7, sizeof out};
  for (int i = 0; i < 4; i++)
    if (mt_proc_path(v, out, sizes[i]) == 0 && strnlen(out, sizes[i]) == sizes[i])
      abort();
  int unknown = 0;
  for (const char *p = v; *p; p++) {
    if (*p != '%')
      continue;
    if (!p[1] || !strchr("hpr%", p[1])) {
      unknown = 1;
      break;
    }
    p++;
  }
  if (mt_proc_path_unknown(v, esc) != unknown || (unknown && esc[0] != '%'))
    abort();
  if (mt_proc_path(v, big, sizeof big) == 0 && strlen(big) >= sizeof big)
    abort();
  char shown[MT_LOG_VALUE_MAX + 64];
  if (strlen(mt_log_value(v, shown, sizeof shown)) > MT_LOG_VALUE_MAX + 63 &&
      strlen(v) > MT_LOG_VALUE_MAX)
    abort();
}

static void routes(const char *v) {
  mt_spec s, before;
  mt_spec_errors errs;
  mt_spec_builtin("nvfp4-row", &s);
  mt_spec_add_routes(&s, "1536x2048", NULL);
  before = s;
  if (mt_spec_add_routes(&s, v, &errs) != 0) {
    if (memcmp(&s, &before, sizeof s) || errs.n != 1)
      abort();
    for (const char *m = errs.e[0].msg; *m; m++)
      if (*m < 0x20 || *m >= 0x7f)
        abort();
    return;
  }
  if (s.nroutes < before.nroutes || s.nroutes > MT_SPEC_MAX_ROUTES)
    abort();
  for (int i = 1; i < s.nroutes; i++) {
    const mt_route *a = &s.routes[i - 1], *b = &s.routes[i];
    if (a->out > b->out || (a->out == b->out && a->in >= b->in))
      abort();
  }
  char why[160];
  for (int i = 0; i < s.nroutes; i++)
    (void)mt_spec_route_unusable(&s, &s.routes[i], why, sizeof why);
}

/* A closed literal of valid UTF-8 with escapes well formed and no raw control character. */
static void check_json(const char *out, size_t len, size_t size) {
  if (len + 1 > size || strlen(out) != len || len < 2 || out[0] != '"' || out[len - 1] != '"')
    abort();
  for (size_t i = 1; i + 1 < len;) {
    unsigned char ch = (unsigned char)out[i];
    if (ch < 0x20 || ch == '"')
      abort();
    if (ch == '\\') {
      if (out[i + 1] == 'u') {
        for (int k = 2; k < 6; k++)
          if (!strchr("0123456789abcdef", out[i + k]) || i + k + 1 >= len)
            abort();
        i += 6;
      } else if (out[i + 1] == '"' || out[i + 1] == '\\') {
        i += 2;
      } else {
        abort();
      }
      continue;
    }
    size_t n = mt_utf8_seq((const unsigned char *)out + i, len - 1 - i);
    if (!n)
      abort();
    i += n;
  }
}

static void json(const char *v) {
  static char out[16384];
  size_t sizes[] = {3, 4, 5, 9, 17, 64, sizeof out};
  for (int i = 0; i < 7; i++) {
    memset(out, 0x5a, sizeof out);
    size_t len = mt_json_string(out, sizes[i], v);
    check_json(out, len, sizes[i]);
    if (sizes[i] < sizeof out && (unsigned char)out[sizes[i]] != 0x5a)
      abort(); /* written past the buffer */
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 8192)
    return 0;
  char *v = malloc(size);
  memcpy(v, data + 1, size - 1);
  v[size - 1] = '\0'; /* an environment value ends at its first NUL */
  switch (data[0] % 4) {
  case 0:
    params(v);
    break;
  case 1:
    templates(v);
    break;
  case 2:
    routes(v);
    break;
  default:
    json(v);
  }
  free(v);
  return 0;
}
