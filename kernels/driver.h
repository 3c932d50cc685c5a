/* driver.h — the CUDA driver API, found at run time, and the kernel modules loaded through it.
 *
 * The library links no CUDA runtime: a second cudart inside somebody's PyTorch process would keep
 * its own state, and a preloaded one could interpose the program's own cuda* calls. The driver is
 * shared by everyone in the process, so minite opens libcuda.so.1 (already loaded by the program)
 * with dlopen and calls it through this table. cuda.h is included for its types only.
 */
#ifndef MT_DRIVER_H
#define MT_DRIVER_H

#include <cuda.h>

/* X(field, declared name (typed by cuda.h), exported symbol) */
#define MT_DRIVER_FUNCTIONS(X)                                                                                         \
  X(init, cuInit, "cuInit")                                                                                            \
  X(get_error_name, cuGetErrorName, "cuGetErrorName")                                                                  \
  X(ctx_get_current, cuCtxGetCurrent, "cuCtxGetCurrent")                                                               \
  X(ctx_get_device, cuCtxGetDevice, "cuCtxGetDevice")                                                                  \
  X(device_get_attribute, cuDeviceGetAttribute, "cuDeviceGetAttribute")                                                \
  X(module_load_data, cuModuleLoadData, "cuModuleLoadData")                                                            \
  X(module_get_function, cuModuleGetFunction, "cuModuleGetFunction")                                                   \
  X(func_set_attribute, cuFuncSetAttribute, "cuFuncSetAttribute")                                                      \
  X(launch_kernel_ex, cuLaunchKernelEx, "cuLaunchKernelEx")                                                            \
  X(tensor_map_encode_tiled, cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled")                                         \
  X(stream_is_capturing, cuStreamIsCapturing, "cuStreamIsCapturing")                                                   \
  X(mem_alloc, cuMemAlloc, "cuMemAlloc_v2")                                                                            \
  X(mem_free, cuMemFree, "cuMemFree_v2")                                                                               \
  X(memcpy_htod, cuMemcpyHtoD, "cuMemcpyHtoD_v2")                                                                      \
  X(memcpy_dtoh, cuMemcpyDtoH, "cuMemcpyDtoH_v2")                                                                      \
  X(memset_d8_async, cuMemsetD8Async, "cuMemsetD8Async")                                                               \
  X(memset_d2d32_async, cuMemsetD2D32Async, "cuMemsetD2D32Async")                                                      \
  X(ctx_synchronize, cuCtxSynchronize, "cuCtxSynchronize")                                                             \
  X(stream_synchronize, cuStreamSynchronize, "cuStreamSynchronize")                                                    \
  X(memcpy_dtoh_async, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")

typedef struct {
#define MT_DRIVER_FIELD(field, decl, sym) __typeof__(&decl) field;
  MT_DRIVER_FUNCTIONS(MT_DRIVER_FIELD)
#undef MT_DRIVER_FIELD
} mt_driver;

/* The table, or NULL when libcuda.so.1 or one of its entry points is missing (said once in the
 * log by the caller). Thread-safe; loads once. */
const mt_driver *mt_driver_get(void);

/* The kernel `fn` of module `module` (kernels/<module>.cu) in the current context, loading the
 * module on first use in that context. Returns MT_OK, MT_ERR_CAPTURE when the module is not yet
 * loaded and `stream` is capturing (loading is not legal then), or another mt_status. */
int mt_kernel_get(const char *module, const char *fn, CUstream stream, CUfunction *out);

/* Launch f with its one by-value argument struct `args` on `stream`: a grid of gx x gy CTAs of
 * bx x by threads with `smem` bytes of dynamic shared memory (the function's limit is raised
 * once, when that is over 48 KB), with programmatic stream serialization when `dependent` is set
 * (the kernel may then start before the previous one ends, and waits with griddepcontrol.wait
 * before reading what that one wrote). MT_OK, or MT_ERR_CUDA. */
int mt_launch(CUfunction f, unsigned gx, unsigned gy, unsigned bx, unsigned by, unsigned smem, int dependent,
              CUstream stream, void *args);

/* The current device's SM count (132, an H200's, when it cannot be read): the kernels' grids. */
int mt_sm_count(void);

#endif
