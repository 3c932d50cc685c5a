/* spec.h — the execution spec: every numerical choice of the routed GEMMs.
 *
 * A spec is a built-in name (bf16, nvfp4-row, nvfp4-tensor) or a text file. Both sides of an RL
 * run (learner and sampler) load the same spec; its fingerprint, a 64-bit hash of the canonical
 * text, goes into the start and summary records of the statistics so that two logs of different
 * numerics are never compared. The name is a label and is not part of the fingerprint.
 *
 * The text format, one item per line:
 *
 *   # a comment (also after a value: "act_scale = row   # per token")
 *   name         = my-spec          optional label, [A-Za-z0-9._-]{1,63}
 *   format       = nvfp4            nvfp4 | bf16               (required)
 *   element      = e2m1             e2m1                       (nvfp4: required)
 *   block        = 16               16                         (nvfp4: required)
 *   block_scale  = e4m3             e4m3                       (nvfp4: required)
 *   act_scale    = row              row | tensor               (nvfp4: required)
 *   weight_scale = tensor           tensor | row               (nvfp4: required)
 *   weight_block = 1x16             1x16 | 16x16               (nvfp4: required; 16x16 needs
 *                                                               weight_scale = tensor)
 *   rounding     = rne              rne                        (nvfp4: required)
 *   accumulate   = fp32             fp32                       (nvfp4: required)
 *   backward     = bf16             bf16                       (nvfp4: required)
 *   route 1536x2048 2048x768        weight shapes OUTxIN; any number of route lines
 *
 * A "weight_cache = ..." line, a knob of older spec files, is accepted in any spec and ignored
 * (mt_spec_notice says so): the weight cache mode changes no bit, so it is not part of the spec or
 * its fingerprint but MINITE_WEIGHT_CACHE, a per-process setting (base/params.def).
 *
 * With format = bf16 nothing is quantized: routed GEMMs run in cuBLAS BF16 and only the statistics
 * differ from an unrouted run; the nvfp4 knobs must then be absent.
 *
 * Spacing around "=" is free, lines may end in CRLF, a leading UTF-8 byte order mark is skipped;
 * keywords and values are lower case. Each knob is given once, each route listed once. Lines are
 * at most MT_SPEC_LINE_MAX bytes of printable ASCII and tabs (comments may hold UTF-8).
 */
#ifndef MT_SPEC_H
#define MT_SPEC_H

#include <stddef.h>
#include <stdint.h>

#define MT_SPEC_NAME_MAX 64
#define MT_SPEC_MAX_ROUTES 64
#define MT_SPEC_LINE_MAX 1024 /* longer lines are an error, not truncated */
#define MT_SPEC_FILE_MAX (1 << 20)
#define MT_SPEC_CANONICAL_MAX 4096 /* holds the canonical text of any spec (64 routes included) */

enum mt_format { MT_FORMAT_BF16, MT_FORMAT_NVFP4 };
enum mt_scale { MT_SCALE_ROW, MT_SCALE_TENSOR };
enum mt_wblock { MT_WBLOCK_1X16, MT_WBLOCK_16X16 };

typedef struct {
  uint32_t out, in; /* a weight of `out` rows (output channels) by `in` columns (K) */
} mt_route;

typedef struct {
  char name[MT_SPEC_NAME_MAX];
  enum mt_format format;
  /* nvfp4 only; element e2m1, block 16, block_scale e4m3, rounding rne, accumulate fp32 and
   * backward bf16 have one legal value today and are checked by the parser, not stored */
  enum mt_scale act_scale;
  enum mt_scale weight_scale;
  enum mt_wblock weight_block;
  int nroutes;
  mt_route routes[MT_SPEC_MAX_ROUTES]; /* sorted by (out, in), no duplicates */
  int weight_cache_line; /* the text's first weight_cache line, ignored (mt_spec_notice); 0: none */
} mt_spec;

/* One error found while reading a spec: where, and what is wrong in words a user can act on. */
typedef struct {
  int line; /* 1-based; 0 when the error is not on one line (missing knob, unreadable file) */
  char msg[256];
} mt_spec_error;

#define MT_SPEC_MAX_ERRORS 16

typedef struct {
  int n;       /* errors recorded (at most MT_SPEC_MAX_ERRORS) */
  int dropped; /* errors found past that */
  mt_spec_error e[MT_SPEC_MAX_ERRORS];
} mt_spec_errors;

/* Parse spec text of `len` bytes (need not be NUL-terminated; more than MT_SPEC_FILE_MAX is one
 * error). Returns 0 and fills *out, or -1 and fills *errs (every error found, not only the first,
 * in line order, line-0 errors last) leaving *out unchanged. Never crashes on any input. errs may
 * be NULL; every function here resets *errs first. */
int mt_spec_parse(const char *text, size_t len, mt_spec *out, mt_spec_errors *errs);

/* Read and parse a file; an unreadable or oversized file, or anything that is not a regular file
 * (a FIFO, /dev/stdin on a pipe, a device, a directory: opened without blocking and refused),
 * is one error with line 0. */
int mt_spec_parse_file(const char *path, mt_spec *out, mt_spec_errors *errs);

/* A built-in by name; -1 when there is none of that name. */
int mt_spec_builtin(const char *name, mt_spec *out);

/* Names of the built-ins, NULL-terminated. */
extern const char *const mt_spec_builtin_names[];

/* A built-in's one-line description, and its spec text; NULL when there is none of that name. */
const char *mt_spec_builtin_about(const char *name);
const char *mt_spec_builtin_text(const char *name);

/* MINITE_SPEC's value: a built-in name, else a file path (a file named like a built-in is read
 * as "./name"). Returns 0, -1 with the errors, or MT_SPEC_UNKNOWN_NAME when a bare word (no '/')
 * names neither a built-in nor a file: its one error says so and lists the built-ins (this is the
 * one place that tells that case from a file's errors). */
#define MT_SPEC_UNKNOWN_NAME (-2)
int mt_spec_load(const char *name_or_path, mt_spec *out, mt_spec_errors *errs);

/* Add routes from MINITE_ROUTE's syntax: "1536x2048,2048x768" (commas and/or spaces). Routes
 * already present are kept once; NULL or an empty list adds nothing. Returns 0, or -1 with one
 * error (line 0) naming the bad item, leaving *s unchanged. */
int mt_spec_add_routes(mt_spec *s, const char *list, mt_spec_errors *errs);

/* Why route r of s can never be taken, or NULL: under nvfp4 the in-dimension (K) must be a
 * multiple of the 16-element block, and under weight_block = 16x16 the out-dimension too, or
 * every call of that weight falls back ("k alignment"). `text` (at least 160 bytes) gets the
 * reason, naming the dimension. The route stays in the spec (it is part of the fingerprint both
 * sides compare); the shim and `minite spec` warn about it. */
const char *mt_spec_route_unusable(const mt_spec *s, const mt_route *r, char *text, size_t size);

/* What the spec's text held that it no longer means, as a warning into `text` (at least 160
 * bytes), or NULL: a weight_cache line (its number: s->weight_cache_line). The shim and `minite
 * spec` say it; the spec is valid. */
const char *mt_spec_notice(const mt_spec *s, char *text, size_t size);

/* 1 when a weight of out x in is routed. */
int mt_spec_routes(const mt_spec *s, uint32_t out, uint32_t in);

/* The canonical text: knobs in a fixed order, "key = value" with single spaces (format = bf16
 * alone for bf16), then "route OUTxIN" one per line sorted by (out, in); no comments, no name;
 * each line ends in "\n". Returns the length written (or needed, snprintf-style: buf may be NULL
 * when size is 0). */
size_t mt_spec_canonical(const mt_spec *s, char *buf, size_t size);

/* FNV-1a 64 of the canonical text. */
uint64_t mt_spec_fingerprint(const mt_spec *s);

/* Names of the enum values as they appear in spec text. */
const char *mt_format_name(enum mt_format);
const char *mt_scale_name(enum mt_scale);
const char *mt_wblock_name(enum mt_wblock);

#endif
