/* cuda_api.h — the cuBLAS and cuBLASLt declarations the shim hooks and calls, from the toolkit's
 * own headers, so that every hook is checked against the real prototype at compile time.
 *
 * Only declarations and types are used: the library never links cuBLAS (docs/design.md, "Finding
 * the real cuBLAS"). cublasLt.h declares one function without a prototype
 * (cublasLtLoggerForceDisable()), which our -Wstrict-prototypes would reject, hence the pragma.
 */
#ifndef MT_CUDA_API_H
#define MT_CUDA_API_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublas_api.h>
#include <cublasLt.h>
#pragma GCC diagnostic pop

#endif
