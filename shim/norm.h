/* norm.h — one normaliser per hooked entry point: its arguments into an mt_call.
 *
 * Declared from hooks.def, so a normaliser takes exactly the hook's parameters after the record.
 */
#ifndef MT_NORM_H
#define MT_NORM_H

#include "shim/call.h"

#define MT_NORM_PARAMS(...) (mt_call * call, __VA_ARGS__)
#define MT_HOOK(name, lib, params, ...) void mt_norm_##name MT_NORM_PARAMS params;
#define MT_REAL(name, lib, ret, params)
#include "shim/hooks.def"
#undef MT_HOOK
#undef MT_REAL

#endif
