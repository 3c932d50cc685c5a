/* launch.h — the launch front door: kernel loads and launches through the CUDA driver, for the
 * kernels other programs run their MoE experts with.
 *
 * Sampler servers (vLLM, SGLang) run unquantized MoE on Hopper through a Triton kernel,
 * fused_moe_kernel, which never calls cuBLAS (docs/design.md, "The launch door"). Triton loads a
 * kernel with cuModuleLoadData and cuModuleGetFunction, called through its PLT, and launches every
 * kernel with a cuLaunchKernelEx it looks up with dlopen + dlsym (Triton 3.4 and later;
 * cuLaunchKernel through its PLT before). The shim exports those (hooks.def, MT_DRIVER), answers
 * lookups of them by dlsym and cuGetProcAddress with its own (shim/dl.h), and:
 *   - at a module load, while active, reads the image's line table for its Python sources
 *     (shim/vllm.h, mt_vllm_origin), to tell vLLM's kernels from SGLang's of the same name;
 *   - at cuModuleGetFunction, records each function the door decodes (fused_moe_kernel) in a
 *     table keyed by the CUfunction; cuModuleUnload forgets its module's functions;
 *   - at a launch, looks the function up — one load while no such function was ever recorded,
 *     one probe of the table otherwise — and hands a recorded one to shim/vllm.c, which runs it on
 *     the engine or lets it run. Every other launch goes to the driver as it came.
 * Inert (MINITE_SPEC unset), every hook is a load, a branch and a tail call, and nothing is
 * recorded.
 */
#ifndef MT_LAUNCH_H
#define MT_LAUNCH_H

#include <cuda.h>

#include "shim/real.h"

/* The driver hooks (the MT_DRIVER lines of hooks.def: shim/launch.c, and shim/dl.c for
 * cuGetProcAddress), for shim/dl.c's answers to lookups. cuda.h renames cuGetProcAddress to its
 * _v2 by macro; the driver exports both names, and so does the shim. */
#undef cuGetProcAddress
#define MT_DRIVER(name, ret, params) ret name params;
#include "shim/hooks.def"

#endif
