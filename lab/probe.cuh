// probe.cuh — what the experiments in lab/probe_*.cu share: the CUDA status check, medians, the
// time per launch of a CUDA graph of many launches (lab/NOTES.md, "Measurement method and noise"),
// and device buffers of BF16 values that do not matter for time.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);              \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// µs a launch: `launches` calls of enqueue(stream, i) captured in one graph, replayed once to warm
// up, then timed by CUDA events around 5 replays; the median.
template <class F> static double graph_us_per_launch(int launches, F enqueue) {
  cudaStream_t st;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaEvent_t e0, e1;
  CK(cudaStreamCreate(&st));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < launches; i++)
    enqueue(st, i);
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, st));
  std::vector<double> us;
  for (int r = 0; r < 5; r++) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(exec, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(ms * 1e3 / launches);
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaStreamDestroy(st));
  return median(us);
}

// count BF16 values in [0.5, 2) (no NaN, no zero), from one random block of 1M repeated: the values
// do not matter for time.
static inline uint16_t *random_bf16(size_t count) {
  static std::vector<uint16_t> h;
  if (h.empty())
    for (int i = 0; i < 1 << 20; i++)
      h.push_back((uint16_t)(0x3f00 + rand() % 0x100));
  uint16_t *d;
  CK(cudaMalloc(&d, count * 2));
  for (size_t at = 0; at < count; at += h.size())
    CK(cudaMemcpy(d + at, h.data(), std::min(h.size(), count - at) * 2, cudaMemcpyHostToDevice));
  return d;
}
