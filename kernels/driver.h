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
#include <stddef.h>
#include <stdint.h>

/* X(field, declared name (typed by cuda.h), exported symbol) */
#define MT_DRIVER_FUNCTIONS(X)                                                                     \
  X(init, cuInit, "cuInit")                                                                        \
  X(get_error_name, cuGetErrorName, "cuGetErrorName")                                              \
  X(ctx_get_current, cuCtxGetCurrent, "cuCtxGetCurrent")                                           \
  X(ctx_get_device, cuCtxGetDevice, "cuCtxGetDevice")                                              \
  X(device_get_attribute, cuDeviceGetAttribute, "cuDeviceGetAttribute")                            \
  X(module_load_data, cuModuleLoadData, "cuModuleLoadData")                                        \
  X(module_get_function, cuModuleGetFunction, "cuModuleGetFunction")                               \
  X(func_set_attribute, cuFuncSetAttribute, "cuFuncSetAttribute")                                  \
  X(launch_kernel_ex, cuLaunchKernelEx, "cuLaunchKernelEx")                                        \
  X(tensor_map_encode_tiled, cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled")                     \
  X(stream_is_capturing, cuStreamIsCapturing, "cuStreamIsCapturing")                               \
  X(mem_alloc, cuMemAlloc, "cuMemAlloc_v2")                                                        \
  X(mem_free, cuMemFree, "cuMemFree_v2")                                                           \
  X(memcpy_htod, cuMemcpyHtoD, "cuMemcpyHtoD_v2")                                                  \
  X(memcpy_dtoh, cuMemcpyDtoH, "cuMemcpyDtoH_v2")                                                  \
  X(memset_d8_async, cuMemsetD8Async, "cuMemsetD8Async")                                           \
  X(memset_d2d32_async, cuMemsetD2D32Async, "cuMemsetD2D32Async")                                  \
  X(ctx_synchronize, cuCtxSynchronize, "cuCtxSynchronize")                                         \
  X(stream_synchronize, cuStreamSynchronize, "cuStreamSynchronize")                                \
  X(memcpy_dtoh_async, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")                                  \
  X(event_create, cuEventCreate, "cuEventCreate")                                                  \
  X(event_record, cuEventRecord, "cuEventRecord")                                                  \
  X(event_query, cuEventQuery, "cuEventQuery")                                                     \
  X(stream_wait_event, cuStreamWaitEvent, "cuStreamWaitEvent")

/* Entry points the engine works without (NULL when the driver lacks them): context IDs (CUDA 12.0),
 * stream-ordered allocation (11.2), pointer attributes, the thread's capture mode, host memory
 * registration (the instruments), a stream's context, a device's PCI address, the clusters of a
 * kernel that fit the device at once (12.0), a kernel's parameter layout (12.4) and the mapped
 * range of an address (the launch door, shim/vllm.c). */
#define MT_DRIVER_OPTIONAL(X)                                                                      \
  X(ctx_get_id, cuCtxGetId, "cuCtxGetId")                                                          \
  X(mem_alloc_async, cuMemAllocAsync, "cuMemAllocAsync")                                           \
  X(mem_free_async, cuMemFreeAsync, "cuMemFreeAsync")                                              \
  X(pointer_get_attribute, cuPointerGetAttribute, "cuPointerGetAttribute")                         \
  X(exchange_capture_mode, cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode") \
  X(mem_host_register, cuMemHostRegister, "cuMemHostRegister_v2")                                  \
  X(stream_get_ctx, cuStreamGetCtx, "cuStreamGetCtx")                                              \
  X(device_get_pci_bus_id, cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId")                             \
  X(occupancy_max_active_clusters, cuOccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters")   \
  X(func_get_param_info, cuFuncGetParamInfo, "cuFuncGetParamInfo")                                 \
  X(mem_get_address_range, cuMemGetAddressRange_v2, "cuMemGetAddressRange_v2")

typedef struct {
#define MT_DRIVER_FIELD(field, decl, sym) __typeof__(&decl) field;
  MT_DRIVER_FUNCTIONS(MT_DRIVER_FIELD)
  MT_DRIVER_OPTIONAL(MT_DRIVER_FIELD)
#undef MT_DRIVER_FIELD
} mt_driver;

/* The table, or NULL when libcuda.so.1 or one of its required entry points is missing (said once in
 * the log by the caller). Thread-safe; loads once. */
const mt_driver *mt_driver_get(void);

/* --- contexts ------------------------------------------------------------------------------------
 *
 * Every piece of per-context state in the library (modules, scratch, frozen weights, instruments)
 * lives in one of MT_MAX_CONTEXTS slots, keyed by the context's unique ID (cuCtxGetId): an ID is
 * never reused in a process, so a context destroyed and re-created at the same address (a
 * cudaDeviceReset) gets fresh state, never the dead one's modules or memory. A slot is freed when
 * its context is found destroyed: at once when a new context turns up at the same address, and
 * otherwise when a new context finds the slots full (each slot keeps a small allocation whose
 * process-unique buffer ID answers whether its context still exists). Any number of GPUs and
 * contexts per GPU, up to MT_MAX_CONTEXTS alive at once. Without cuCtxGetId (a driver older than
 * CUDA 12) the handle's address is the key. */
#define MT_MAX_CONTEXTS 64

typedef struct {
  int index;             /* the slot: per-context state of other modules lives at this index */
  unsigned long long id; /* the context's unique ID; a module whose state at `index` belongs to
                             another ID drops it (that context is gone) and starts afresh */
  CUcontext handle;
} mt_ctx;

/* The current context and its slot. MT_OK; MT_ERR_NO_DEVICE when no context is current (or it is
 * destroyed); MT_ERR_NOMEM when MT_MAX_CONTEXTS contexts are alive (warned once). */
int mt_ctx_current(mt_ctx *out);

/* The registry's lock held across a fork (shim/fork.h), released in the parent and the child. */
void mt_ctx_fork_lock(void);
void mt_ctx_fork_unlock(void);

/* 1 when `stream` belongs to a context other than the current one: the engine's kernels, scratch
 * and weights are the current context's, and a launch on another context's stream is refused by the
 * driver (cuBLAS requires the handle's device to be current, so a correct program never makes such
 * a call). 0 when the stream is the current context's (the legacy and per-thread default streams
 * always are) or the driver cannot say (no cuStreamGetCtx). */
int mt_stream_foreign(CUstream stream);

/* A key that tells streams apart, for state kept per stream (never passed to the driver): the
 * handle, but for the per-thread default stream, one handle for a stream per thread, a key of the
 * calling thread's own, never another thread's. */
uintptr_t mt_stream_key(CUstream stream);

/* The current context's device: its ordinal (as the process numbers them, after
 * CUDA_VISIBLE_DEVICES) and PCI address ("0000:19:00.0"; "" when unknown), which names the GPU
 * whatever the numbering. -1 (and "") when no context is current. */
int mt_device_current(char *pci, size_t size);

/* 1 when the current context's device can run the kernels (sm_90: they are sm_90a code only). */
int mt_device_sm90(void);

/* Device memory the registry itself holds (a few hundred bytes per context). */
size_t mt_ctx_device_bytes(void);

/* Potentially unsafe driver calls (allocation, free, module load, synchronisation) fail while
 * another thread captures a CUDA graph in global mode (PyTorch's default) and may invalidate that
 * capture: the library brackets its own with these, which put the calling thread in relaxed
 * capture mode and back (nothing when the driver has no cuThreadExchangeStreamCaptureMode). */
int mt_capture_relax(void);
void mt_capture_restore(int previous);

/* The kernel `fn` of module `module` (kernels/<module>.cu) in the current context. The first use in
 * a context loads every kernel file at once, so that a CUDA graph captured after any routed call
 * in that context finds whatever kernel it needs. Returns MT_OK, MT_ERR_CAPTURE when the modules
 * are not yet loaded and `stream` is capturing (loading is not legal then), or another
 * mt_status. */
int mt_kernel_get(const char *module, const char *fn, CUstream stream, CUfunction *out);

/* Launch f with its one by-value argument struct `args` on `stream`: a grid of gx x gy CTAs of
 * bx x by threads with `smem` bytes of dynamic shared memory (the function's limit is raised
 * once, when that is over 48 KB), with programmatic stream serialization when `dependent` is set
 * (the kernel may then start before the previous one ends, and waits with griddepcontrol.wait
 * before reading what that one wrote). MT_OK, or MT_ERR_CUDA. */
int mt_launch(CUfunction f, unsigned gx, unsigned gy, unsigned bx, unsigned by, unsigned smem,
              int dependent, CUstream stream, void *args);

/* The current device's SM count (132, an H200's, when it cannot be read): the kernels' grids. */
int mt_sm_count(void);

/* How many clusters of `cluster` CTAs of f (a kernel without a compile-time cluster size; CTAs of
 * bx x by threads and `smem` bytes of dynamic shared memory) the current device runs at once: asked
 * of the driver once per function, size, shape and context. 0 when none runs or the driver cannot
 * say (a size over 8, non-portable, is then not for this device). */
int mt_cluster_capacity(CUfunction f, unsigned cluster, unsigned bx, unsigned by, unsigned smem);

/* Launch f (as mt_launch) as `clusters` clusters of `cluster` CTAs of bx x by threads, one
 * dimension. A cluster over 8 needs mt_cluster_capacity to have answered for it first. */
int mt_launch_clusters(CUfunction f, unsigned cluster, unsigned clusters, unsigned bx, unsigned by,
                       unsigned smem, int dependent, CUstream stream, void *args);

#endif
