// probe_order.cu — what the order of a kept weight's calls costs (shim/wcache.c: every routed call
// on a kept weight records the weight's event on its stream after its launches, and a call on
// another stream first waits for it).
//
// Host: ns per cuEventRecord of a timing-free event on a stream, per cuStreamWaitEvent on another
// stream, and per launch of an empty kernel for scale (medians of 9 rounds of 20,000 calls, the
// stream drained between rounds). GPU: a chain of 2,000 short kernels (each ~2 µs, letting the
// next start at once and waiting for the one before: griddepcontrol) launched with programmatic
// dependent launch, as the engine's are, with and without an event recorded between each two:
// whether the record keeps the next kernel's launch from overlapping the one before it (CUDA
// events around the chain, medians of 5). A call pays the record once, and the wait only when its
// stream is not the weight's last.
//
// Run on the device machine: build/lab/probe_order (make lab). Nothing to check: it measures.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <vector>

#define CK(x)                                                                                      \
  do {                                                                                             \
    if ((x) != 0) {                                                                                \
      std::printf("%s failed at line %d\n", #x, __LINE__);                                         \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

__global__ void empty() {}

// Lets the next kernel start at once, waits for the one before it to end (as the engine's kernels
// do before they read what it wrote), then spins ~ns on the global timer (one thread a CTA).
__global__ void spin(unsigned ns) {
  asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  while (t - t0 < ns);
}

static double now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

enum { CALLS = 20000, ROUNDS = 9, CHAIN = 2000, REPEATS = 5 };

// Host ns per call of `what` (0 record, 1 wait on s2 for the event recorded on s1, 2 empty launch).
static double host_ns(int what, CUevent ev, cudaStream_t s1, cudaStream_t s2) {
  std::vector<double> rounds;
  for (int r = 0; r < ROUNDS; r++) {
    cuEventRecord(ev, (CUstream)s1);
    double t0 = now_ns();
    for (int i = 0; i < CALLS; i++) {
      if (what == 0)
        cuEventRecord(ev, (CUstream)s1);
      if (what == 1)
        cuStreamWaitEvent((CUstream)s2, ev, 0);
      if (what == 2)
        empty<<<1, 32, 0, s1>>>();
    }
    rounds.push_back((now_ns() - t0) / CALLS);
    cudaDeviceSynchronize();
  }
  return median(rounds);
}

// GPU µs of the chain, with or without a record between each two kernels.
static double chain_us(bool records, CUevent ev, cudaStream_t s) {
  cudaLaunchAttribute pdl = {};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1), cfg.blockDim = dim3(32), cfg.stream = s, cfg.attrs = &pdl,
  cfg.numAttrs = 1;
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  std::vector<double> runs;
  for (int r = 0; r < REPEATS; r++) {
    cudaEventRecord(a, s);
    for (int i = 0; i < CHAIN; i++) {
      cudaLaunchKernelEx(&cfg, spin, 2000u);
      if (records)
        cuEventRecord(ev, (CUstream)s);
    }
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    runs.push_back(ms * 1e3);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  return median(runs);
}

int main() {
  CK(cudaFree(0));
  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CUevent ev;
  CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  empty<<<1, 32, 0, s1>>>();
  CK(cudaDeviceSynchronize());
  std::printf("host ns a call: cuEventRecord %.0f, cuStreamWaitEvent %.0f, empty launch %.0f\n",
              host_ns(0, ev, s1, s2), host_ns(1, ev, s1, s2), host_ns(2, ev, s1, s2));
  chain_us(false, ev, s1); // warm-up
  const double plain = chain_us(false, ev, s1), recorded = chain_us(true, ev, s1);
  std::printf("chain of %d PDL kernels of ~2 us: %.0f us, with a record between each two: %.0f us "
              "(%+.2f us a kernel)\n",
              CHAIN, plain, recorded, (recorded - plain) / CHAIN);
  CK(cudaGetLastError());
  return 0;
}
