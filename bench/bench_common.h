/* bench_common.h — what the benchmarks share (DESIGN's method, docs/design.md "How to measure"):
 * random BF16 data from a device pool, and time_calls: a CUDA graph of many calls, timed with CUDA
 * events around whole replays after a warm-up replay, the median of REPLAYS replays divided by the
 * calls per graph. Static functions: each benchmark includes it once. */
#ifndef MT_BENCH_COMMON_H
#define MT_BENCH_COMMON_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define REPLAYS 7
#define POOL_ELEMS ((size_t)64 << 20) /* random BF16 values the buffers are filled from */

static uint16_t *pool;
static cudaStream_t stream;
static FILE *json;
static int json_first = 1;

#define CUDA_OK(call)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "bench: %s: %s (line %d)\n", #call, cudaGetErrorString(e_), __LINE__);       \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static uint64_t rnd(void) {
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 0x2545F4914F6CDD1DULL;
}

/* A BF16 value of random sign, |x| in [2^-3, 2^3): typical activations and weights, no zeros. */
static uint16_t rnd_bf16(void) {
  uint64_t r = rnd();
  uint16_t exp = (uint16_t)(124 + (r >> 8) % 6), man = (uint16_t)(r & 0x7f);
  return (uint16_t)(((r >> 16) & 1) << 15 | exp << 7 | man);
}

/* Fill `elems` BF16 of device memory from the random pool at a random offset, on the bench's
 * stream: it does not wait for the legacy default stream, so work on it must be enqueued on it to
 * be ordered before the kernels that read it (a weight quantized before its fill landed gave
 * garbage once). */
static void fill(void *dst, size_t elems) {
  size_t done = 0;
  while (done < elems) {
    size_t off = rnd() % POOL_ELEMS, len = POOL_ELEMS - off;
    if (len > elems - done)
      len = elems - done;
    CUDA_OK(cudaMemcpyAsync((uint16_t *)dst + done, pool + off, len * 2, cudaMemcpyDeviceToDevice,
                            stream));
    done += len;
  }
}

static void *dmalloc(size_t bytes) {
  void *p = NULL;
  CUDA_OK(cudaMalloc(&p, bytes));
  return p;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* One call of the thing measured, for call number i of a graph. Returns 0 on success. */
typedef int (*call_fn)(void *ctx, int i);

/* Median seconds per call over REPLAYS replays of a graph of `calls` calls; < 0 when a call or
 * the capture failed. */
static double time_calls(call_fn fn, void *ctx, int calls) {
  for (int i = 0; i < 2; i++) /* outside capture first: modules load, cuBLAS picks its kernels */
    if (fn(ctx, i) != 0)
      return -1;
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  int failed = 0;
  for (int i = 0; i < calls && !failed; i++)
    failed = fn(ctx, i) != 0;
  cudaError_t e = cudaStreamEndCapture(stream, &graph);
  if (failed || e != cudaSuccess) {
    fprintf(stderr, "bench: capture failed (%s)\n",
            failed ? "a call failed" : cudaGetErrorString(e));
    if (e == cudaSuccess)
      cudaGraphDestroy(graph);
    cudaGetLastError();
    return -1;
  }
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t ev[REPLAYS + 1];
  for (int i = 0; i <= REPLAYS; i++)
    CUDA_OK(cudaEventCreate(&ev[i]));
  CUDA_OK(cudaGraphLaunch(exec, stream)); /* warm-up */
  for (int r = 0; r < REPLAYS; r++) {
    CUDA_OK(cudaEventRecord(ev[r], stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
  }
  CUDA_OK(cudaEventRecord(ev[REPLAYS], stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  float ms_each[REPLAYS];
  for (int r = 0; r < REPLAYS; r++)
    CUDA_OK(cudaEventElapsedTime(&ms_each[r], ev[r], ev[r + 1]));
  qsort(ms_each, REPLAYS, sizeof ms_each[0], cmp_float);
  for (int i = 0; i <= REPLAYS; i++)
    cudaEventDestroy(ev[i]);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms_each[REPLAYS / 2] * 1e-3 / calls;
}

static void json_row(const char *fmt_fields) {
  fprintf(json, "%s\n    %s", json_first ? "" : ",", fmt_fields);
  json_first = 0;
}

/* The random pool every buffer is filled from. */
static void make_pool(void) {
  uint16_t *h = malloc(POOL_ELEMS * 2);
  for (size_t i = 0; i < POOL_ELEMS; i++)
    h[i] = rnd_bf16();
  pool = dmalloc(POOL_ELEMS * 2);
  CUDA_OK(cudaMemcpy(pool, h, POOL_ELEMS * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize()); /* the pool is read on the bench's stream */
  free(h);
}

/* The device, the stream, cuBLAS on it with a workspace of its own (so that capture never
 * allocates), the random pool and the JSON file `out`. Exits with a message when one is missing. */
static void bench_open(const char *name, const char *out, cublasHandle_t *blas) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    fprintf(stderr, "%s: no GPU\n", name);
    exit(1);
  }
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (cublasCreate(blas) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "%s: cublasCreate failed\n", name);
    exit(1);
  }
  void *blas_ws = dmalloc(64 << 20);
  cublasSetStream(*blas, stream);
  cublasSetWorkspace(*blas, blas_ws, 64 << 20);
  make_pool();
  json = fopen(out, "w");
  if (!json) {
    perror(out);
    exit(1);
  }
}

#endif
