/* parse.h — what the spec text's parser (spec/parse.c) shares with the rest of spec/: the knob
 * table, the sorted route list, error recording, and the quoting of input in messages. The
 * public API of the spec is spec/spec.h; nothing outside spec/ includes this header.
 */
#ifndef MT_SPEC_PARSE_H
#define MT_SPEC_PARSE_H

#include "spec/spec.h"

/* The canonical order is this order (name excluded). A knob's values are listed in the order of
 * its enum, so a value's index is the enum value. */
enum mt_knob {
  MT_KNOB_NAME,
  MT_KNOB_FORMAT,
  MT_KNOB_ELEMENT,
  MT_KNOB_BLOCK,
  MT_KNOB_BLOCK_SCALE,
  MT_KNOB_ACT_SCALE,
  MT_KNOB_WEIGHT_SCALE,
  MT_KNOB_WEIGHT_BLOCK,
  MT_KNOB_ROUNDING,
  MT_KNOB_ACCUMULATE,
  MT_KNOB_BACKWARD,
  MT_KNOB_COUNT
};
#define MT_KNOB_FIRST_NVFP4 MT_KNOB_ELEMENT

#define MT_KNOB_MAX_VALUES 3
typedef struct {
  const char *key;
  const char *values[MT_KNOB_MAX_VALUES]; /* NULL-padded; none for `name` (free text) */
} mt_knob_def;

extern const mt_knob_def mt_spec_knobs[MT_KNOB_COUNT];

/* Inserts r in the sorted route list: 0 added, 1 already there, -1 the list is full. */
int mt_spec_route_insert(mt_route *routes, int *nroutes, mt_route r);

/* Record an error (past MT_SPEC_MAX_ERRORS only counted), and forget all of them. */
__attribute__((format(printf, 3, 4))) void mt_spec_add_error(mt_spec_errors *errs, int line,
                                                             const char *fmt, ...);
void mt_spec_reset_errors(mt_spec_errors *errs);

/* Input bytes quoted in a message: at most a bounded number of them, non-printable ones as '?',
 * so that a message stays one printable line whatever the input held. Words get 40 bytes, paths
 * MT_SPEC_QUOTE_PATH. */
#define MT_SPEC_QUOTE_PATH 160
typedef struct {
  char s[MT_SPEC_QUOTE_PATH + 4];
} mt_spec_quoted;

mt_spec_quoted mt_spec_quote_path(const char *path);

#endif
