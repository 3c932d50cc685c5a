/* norm.h — one normaliser per hooked entry point: its arguments into an mt_call; and a routed call
 * of several problems into one mt_grouped_call.
 *
 * Declared from hooks.def, so a normaliser takes exactly the hook's parameters after the record.
 */
#ifndef MT_NORM_H
#define MT_NORM_H

#include "shim/call.h"
#include "shim/router.h"

#define MT_NORM_PARAMS(...) (mt_call * call, __VA_ARGS__)
#define MT_HOOK(name, lib, params, ...) void mt_norm_##name MT_NORM_PARAMS params;
#include "shim/hooks.def"

/* The grouped record of a routed forward call of several problems (a strided or pointer-array
 * batch, a cublasGemmGroupedBatchedEx, an Lt batch, a torch._grouped_mm call): MT_R_ROUTED, or the
 * reason it has none: "pointer arrays" for a cublasGemmGroupedBatchedEx whose groups differ in
 * more than their rows (weight shape, ops, leading dimensions, alpha, beta) and for an Lt call
 * mixing strided and pointer-array layouts or with a bias epilogue; "layout" for one of no
 * problems. Its details must be read. */
enum mt_reason mt_norm_grouped(const mt_call *c, mt_grouped_call *g);

#endif
