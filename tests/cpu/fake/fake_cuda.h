/* fake_cuda.h — what the fake libcuda.so.1 (tests/cpu/fake/fake_cuda.c) adds to the driver API
 * for the tests: its log of the calls that matter to the engine, and the knobs that provoke the
 * engine's fallbacks. Found by the test with dlsym on the fake's handle.
 *
 * The fake is a host-memory "GPU": device pointers are host pointers, a primary context on an sm_90
 * H200 (more contexts and devices: the knobs below).
 * It computes nothing; a GEMM kernel's launch only marks the elements of its output with
 * FAKE_CUDA_MARK (as the GPU would overwrite them), so that a test sees which elements the engine
 * would have written, and a fallback that recomputes an already overwritten output shows.
 */
#ifndef MT_FAKE_CUDA_H
#define MT_FAKE_CUDA_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define FAKE_CUDA_MARK 0xBEEF   /* 16-bit pattern a GEMM launch writes into its output */
#define FAKE_CUDA_ARGS_MAX 1024 /* bytes of a kernel's by-value argument kept per launch */

enum fake_cuda_kind {
  FAKE_EV_LAUNCH,      /* cuLaunchKernelEx (also failed ones: result != 0) */
  FAKE_EV_ALLOC,       /* cuMemAlloc_v2: ptr, bytes (failed ones: result != 0, ptr 0) */
  FAKE_EV_FREE,        /* cuMemFree_v2: ptr, bytes */
  FAKE_EV_MEMSET,      /* cuMemsetD8Async: ptr, bytes, value, stream */
  FAKE_EV_DTOH,        /* cuMemcpyDtoH(Async): ptr (source), bytes, stream (async only) */
  FAKE_EV_HTOD,        /* cuMemcpyHtoD: ptr (destination), bytes */
  FAKE_EV_SYNC,        /* cuStreamSynchronize: stream */
  FAKE_EV_CTX_SYNC,    /* cuCtxSynchronize */
  FAKE_EV_LOAD,        /* cuModuleLoadData: ptr (the image) */
  FAKE_EV_TMAP,        /* cuTensorMapEncodeTiled: ptr (the base), bytes (rows * row pitch), value
                          (the rank) */
  FAKE_EV_SETATTR,     /* cuFuncSetAttribute: name, value */
  FAKE_EV_RECORD,      /* cuEventRecord: ptr (the event), stream */
  FAKE_EV_HOSTALLOC,   /* cuMemHostAlloc: ptr, bytes */
  FAKE_EV_ALLOC_ASYNC, /* cuMemAllocAsync: ptr, bytes, stream, value 1 when the stream captures */
  FAKE_EV_FREE_ASYNC,  /* cuMemFreeAsync: ptr, bytes, stream, value 1 when the stream captures */
  FAKE_EV_HOSTREG,     /* cuMemHostRegister_v2: ptr, bytes */
  FAKE_EV_WAIT,        /* cuStreamWaitEvent: ptr (the event), stream */
};

typedef struct {
  int kind;      /* enum fake_cuda_kind */
  int result;    /* the CUresult returned */
  char name[48]; /* the kernel (LAUNCH, SETATTR) */
  unsigned grid[3], block[3], smem;
  int pdl;          /* launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 1 */
  unsigned cluster; /* CTAs a cluster (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION; 1 without) */
  int nattrs;
  CUstream stream;
  uint64_t ptr;
  size_t bytes;
  int value;
  size_t args_bytes; /* bytes kept of the kernel's argument struct (by its name) */
  unsigned char args[FAKE_CUDA_ARGS_MAX] __attribute__((aligned(128))); /* as CUtensorMap */
} fake_cuda_event;

typedef struct {
  long allocs, frees, live_allocs, bad_frees;
  size_t live_bytes;
  long module_loads, launches;
  long invalid;        /* calls the real driver would refuse (bad handle, config, pointer) */
  long during_capture; /* allocations, frees, loads, syncs, read-backs while a stream captures */
  long relaxed_during_capture; /* ... of those, made in relaxed capture mode (legal) */
  long stale;                  /* a function or memory of a destroyed (or other) context used */
  long graph_allocs;           /* cuMemAllocAsync on a capturing stream: memory the graph owns */
  long graph_frees;            /* cuMemFreeAsync on a capturing stream */
  long cross_context;          /* a launch on a stream of a context other than the function's */
} fake_cuda_counts;

/* The log so far (events are never removed; the array stays valid until the next driver call). */
typedef int (*fake_cuda_events_fn)(const fake_cuda_event **events);
typedef void (*fake_cuda_counts_fn)(fake_cuda_counts *out);
/* Mark (on = 1) or unmark a stream as capturing a graph. */
typedef void (*fake_cuda_set_capturing_fn)(CUstream stream, int on);
/* 0: cuCtxGetCurrent gives NULL (no current context). */
typedef void (*fake_cuda_set_context_fn)(int present);
/* Live bytes past which cuMemAlloc fails with CUDA_ERROR_OUT_OF_MEMORY; -1: no limit. */
typedef void (*fake_cuda_set_mem_limit_fn)(long long bytes);
/* Fail the nth launch from now (1 = the next) of kernel `name` (NULL: of any kernel). */
typedef void (*fake_cuda_fail_launch_fn)(const char *name, int nth);
/* Fail the next n cuModuleLoadData calls with CUDA_ERROR_INVALID_IMAGE. */
typedef void (*fake_cuda_fail_loads_fn)(int n);
/* 1: [p, p + bytes) lies inside one live allocation. */
typedef int (*fake_cuda_is_device_fn)(const void *p, size_t bytes);

/* 1: cuEventQuery answers CUDA_ERROR_NOT_READY for every event, and the instruments' publish
 * kernel copies its block but holds back its flag write (work "in flight" forever); 0: release
 * the held flags, and events are complete once recorded (the default). */
typedef void (*fake_cuda_hold_events_fn)(int on);
/* Replay a capture's instruments: their launches recorded from event `from` on run again. */
typedef void (*fake_cuda_replay_instr_fn)(int from);
/* Fail the next n cuEventRecord and cuStreamWaitEvent calls (CUDA_ERROR_LAUNCH_FAILED). */
typedef void (*fake_cuda_fail_event_ops_fn)(int n);
/* Event queries answered so far, and how many of them came from the thread that recorded the
 * event (the instruments must query from their own thread). */
typedef void (*fake_cuda_event_queries_fn)(long *queries, long *same_thread);

/* Contexts (tests/cpu/test_reliability.c). The fake starts with one context current in every
 * thread (the primary); these make others, all on the one device:
 * create a context and make it current in the calling thread; at_address: at the address of the
 * last destroyed one (as a re-created primary context is), else at a new one. NULL when full. */
typedef CUcontext (*fake_cuda_ctx_create_fn)(int at_address);
/* Destroy a context: its allocations and modules go with it (a later use counts as stale); the
 * threads it is current to see no context. */
typedef void (*fake_cuda_ctx_destroy_fn)(CUcontext ctx);
/* Devices (tests/cpu/test_multi_device.c): 0 is the H200 of the primary context (CC of
 * FAKE_CUDA_CC, 132 SMs), 1 an sm_90 of 114 SMs, 2 an sm_80 of 108 SMs (the kernels do not load
 * there); each has a PCI address 0000:BB:00.0 with BB = 0x19 + 0x10 * device. Create a context on
 * `device` and make it current in the calling thread (NULL when full). */
#define FAKE_CUDA_DEVICES 3
typedef CUcontext (*fake_cuda_ctx_create_on_fn)(int device);
/* Give `stream` to context ctx (cuStreamGetCtx answers it; a launch on it from a function of
 * another context is refused and counted cross_context). Other streams are the current
 * context's. */
typedef void (*fake_cuda_stream_bind_fn)(CUstream stream, CUcontext ctx);
/* cudaDeviceReset: the primary context destroyed and re-created at the same address, current. */
typedef void (*fake_cuda_device_reset_fn)(void);
/* Fail the nth allocation from now (1 = the next) of any kind (cuMemAlloc, cuMemAllocAsync,
 * cuMemHostAlloc, cuMemHostRegister) with CUDA_ERROR_OUT_OF_MEMORY; 0: none. Returns how many
 * allocations were made so far. */
typedef long (*fake_cuda_fail_alloc_fn)(int nth);

/* Guard (on = 1) the whole pages [p, p + bytes) as device memory the host never reads: PROT_NONE
 * (a host read crashes the process), opened only while the fake computes a kernel that reads them
 * on the "GPU" (the grouped GEMM's output pointers); on = 0: readable again. */
typedef void (*fake_cuda_guard_fn)(void *p, size_t bytes, int on);

/* Threads inside a launch's host-side cost (FAKE_CUDA_LAUNCH_US) now: in a forked child, the
 * parent's threads that were inside the driver at the fork. */
typedef int (*fake_cuda_launching_fn)(void);
/* The instruments' kernels (kernels/instr.cu) run on the host through the twin in
 * kernels/instr.h: the fake computes their results so that records can be checked end to end. */

/* Environment read at load: FAKE_CUDA_MEM_LIMIT=bytes, FAKE_CUDA_NO_CONTEXT=1,
 * FAKE_CUDA_CAPTURING=handle,handle (hex or decimal stream handles),
 * FAKE_CUDA_FAIL_LAUNCH=[name:]n, FAKE_CUDA_CC=major.minor (default 9.0), FAKE_CUDA_MAP_RANK=r
 * (tensor maps of a higher rank are refused with CUDA_ERROR_NOT_SUPPORTED; default 3),
 * FAKE_CUDA_FAIL_ALLOC=n (the nth allocation fails), FAKE_CUDA_LAUNCH_US=n (each launch takes n
 * microseconds, outside the fake's lock), FAKE_CUDA_NO_ASYNC=1 (cuMemAllocAsync answers
 * CUDA_ERROR_NOT_SUPPORTED, as on a device without memory pools), FAKE_CUDA_MAX_CLUSTER=n (the
 * largest cluster the device runs; default 16). */

/* A Triton module's image for the fake (fake_cuda.c, "Triton modules"): an ELF file of `size`
 * bytes whose section headers end it, `len` bytes of `text` after its header (the kernels' section
 * names, a source path for the line table, the descriptor of the fake's constants). */
static inline void fake_cuda_elf(char *img, size_t size, const char *text, size_t len) {
  const uint64_t shoff = size - 64;
  const uint16_t shentsize = 64, shnum = 1;
  memset(img, 0, size);
  memcpy(img,
         "\x7f"
         "ELF\x02",
         5);
  memcpy(img + 0x28, &shoff, 8);
  memcpy(img + 0x3a, &shentsize, 2);
  memcpy(img + 0x3c, &shnum, 2);
  memcpy(img + 64, text, len < size - 128 ? len : size - 128);
}

#endif
