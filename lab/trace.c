/* trace.c — a timeline of every kernel a CUDA program runs, graph replays included, from CUPTI's
 * activity records: build/lab/libtrace.so, preloaded into an unmodified program,
 *
 *   LD_PRELOAD=build/lab/libtrace.so MT_TRACE=timeline.csv build/bench/bench_moe --tokens 1
 *
 * writes one line a kernel, "start_ns,end_ns,stream,graph,node,grid,block,cluster,name", at exit
 * (lab/timeline.py reads it). Where the profiler tools cannot (Nsight Systems makes no report on
 * the device machine), this shows what overlaps what: a kernel's start and end on the GPU's clock,
 * not the host's view of a launch. CUPTI serializes nothing here (concurrent-kernel records), but
 * its records cost a little time at each kernel's start and end: read gaps, not absolute
 * durations of short kernels. Lab only: the product links no CUPTI. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *out;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
  *size = 8u << 20;
  *buf = aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, *size);
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                      size_t valid) {
  (void)ctx, (void)stream, (void)size;
  CUpti_Activity *r = NULL;
  while (out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
      continue;
    const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
    fprintf(out, "%llu,%llu,%u,%u,%llu,%dx%d,%dx%d,%u,%s\n", (unsigned long long)k->start,
            (unsigned long long)k->end, k->streamId, k->graphId, (unsigned long long)k->graphNodeId,
            k->gridX, k->gridY, k->blockX, k->blockY, k->clusterX, k->name ? k->name : "?");
  }
  free(buf);
}

__attribute__((constructor)) static void trace_start(void) {
  const char *path = getenv("MT_TRACE");
  if (!path || !(out = fopen(path, "w"))) {
    fprintf(stderr, "trace: set MT_TRACE to a writable file (no timeline written)\n");
    return;
  }
  fprintf(out, "start_ns,end_ns,stream,graph,node,grid,block,cluster,name\n");
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      /* records delivered while the program runs: at exit the runtime may tear its contexts
       * down before this library's destructor flushes */
      cuptiActivityFlushPeriod(50) != CUPTI_SUCCESS) {
    fprintf(stderr, "trace: CUPTI refused the kernel activity records\n");
    fclose(out);
    out = NULL;
  }
}

__attribute__((destructor)) static void trace_end(void) {
  if (!out)
    return;
  cuptiActivityFlushAll(1);
  fclose(out);
  out = NULL;
}
