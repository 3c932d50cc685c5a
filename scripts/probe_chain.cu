// probe_chain.cu — what one k16 step of the small-M GEMM costs, part by part (kernels/NOTES.md,
// "What bounds the misses").
//
// The dependent mma.sync m16n8k16 chain of scripts/probe_mma.cu ran at 24 cycles a step (one warp
// alone, constant register operands), but the small-M kernels spend ~70 cycles a step (v7, and v9
// whose chain warp decodes nothing). Each kernel below isolates one ingredient; all run in a grid
// of G CTAs (1, and 96 like gate_up's n / 16) and record per CTA the cycles and nanoseconds of
// their step loop (clock64, globaltimer), so the host prints cycles a step and the SM clock.
//   const  the chain on constant register operands (probe_mma's)
//   lds    the chain on fresh operands from shared memory, each step's loaded a step ahead
//   lds2   lds with two register sets (lds's SASS reloads the registers the MMA before it reads)
//   busy   lds with 4 more warps on the SM issuing dependent integer work
//   v7     the default kernel's own step loop (small::chunk_steps) over records and activations
//          already in shared memory: decode + loads + MMA, 2 warps a CTA
// (The rows shift, ws, v10 and v10p probed kernels since removed; their numbers are in
// kernels/NOTES.md.)
// And each kernel's time per launch from CUDA events around a graph of 100 launches (median of 5),
// with an empty kernel for the launch floor, at 48 and 128 steps (down's and gate_up's K).
//
// Build and run on the H200 (scripts/gpu_session.sh probe):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. -o build/probe_chain scripts/probe_chain.cu
#include "kernels/gemm_small.cu"

#include "scripts/probe.cuh"

#include <vector>


constexpr int MAXSTEPS = 128, APITCH = 2 * 16 * MAXSTEPS + 16;
constexpr int REC_BYTES = 2 * (MAXSTEPS / 2) * MT_FRAG_REC; // 2 warps' records
constexpr int ABYTES = 8 * APITCH, SMEM = REC_BYTES + ABYTES + MT_SMALL_SLACK;

struct sample {
  long long cycles, ns;
};

__device__ static inline long long gtime() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Shared memory from a global image (records of both warps, then 8 activation rows).
__device__ static void fill(uint8_t *smem, const uint8_t *img) {
  for (int i = threadIdx.x; i < SMEM / 16; i += blockDim.x)
    ((uint4 *)smem)[i] = ((const uint4 *)img)[i];
  __syncthreads();
}

__device__ static void record(sample *out, long long c0, long long t0) {
  long long c1 = clock64(), t1 = gtime();
  if (threadIdx.x == 0)
    out[blockIdx.x] = {c1 - c0, t1 - t0};
}

__device__ static inline void mma(float (&d)[4], uint4 a, uint2 b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b.x), "r"(b.y));
}

__global__ void k_empty(const uint8_t *, sample *, float *, int) {}

__global__ void k_const(const uint8_t *, sample *out, float *sink, int steps) {
  uint4 a = make_uint4(0x3f803f80u + threadIdx.x, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);
  uint2 b = make_uint2(0x3f803f80u, 0x3f803f80u);
  float d[4] = {0, 0, 0, 0};
  long long c0 = clock64(), t0 = gtime();
  for (int i = 0; i < steps; i++)
    mma(d, a, b);
  record(out, c0, t0);
  sink[blockIdx.x * 32 + threadIdx.x % 32] = d[0] + d[1] + d[2] + d[3];
}

// Warp 0: the chain on operands from shared memory (A 16 bytes, B 8 bytes a lane a step, distinct
// for every step), loaded one step ahead as the kernels do. Warps 1.. (when launched) spin on
// dependent integer multiply-adds until warp 0 is done, as decoder warps would share the SM.
__global__ void k_lds(const uint8_t *img, sample *out, float *sink, int steps) {
  extern __shared__ __align__(16) uint8_t smem[];
  fill(smem, img);
  volatile int *done = (volatile int *)(smem + SMEM - 16);
  int lane = threadIdx.x % 32;
  if (threadIdx.x >= 32) {
    uint32_t x = threadIdx.x;
    for (int i = 0; !*done; i++)
#pragma unroll 1
      for (int j = 0; j < 64; j++)
        x = x * 1664525u + 1013904223u;
    sink[gridDim.x * 32 + blockIdx.x * blockDim.x + threadIdx.x] = (float)x;
    return;
  }
  const uint4 *pa = (const uint4 *)smem + lane; // 32 steps' operands, reused
  const uint2 *pb = (const uint2 *)(smem + 32 * 16 * 32) + lane;
  float d[4] = {0, 0, 0, 0};
  uint4 a = pa[0];
  uint2 b = pb[0];
  long long c0 = clock64(), t0 = gtime();
#pragma unroll 1
  for (int i = 1; i <= steps; i++) {
    uint4 an = pa[32 * (i % 32)];
    uint2 bn = pb[32 * (i % 32)];
    mma(d, a, b);
    a = an, b = bn;
  }
  record(out, c0, t0);
  if (lane == 0)
    *done = 1;
  sink[blockIdx.x * 32 + lane] = d[0] + d[1] + d[2] + d[3];
}

// lds with the loads two steps ahead in two register sets, so that no load overwrites operands an
// MMA in flight still has to read (lds's SASS reuses one set: each load waits for the MMA before it).
__global__ void k_lds2(const uint8_t *img, sample *out, float *sink, int steps) {
  extern __shared__ __align__(16) uint8_t smem[];
  fill(smem, img);
  int lane = threadIdx.x % 32;
  const uint4 *pa = (const uint4 *)smem + lane;
  const uint2 *pb = (const uint2 *)(smem + 32 * 16 * 32) + lane;
  float d[4] = {0, 0, 0, 0};
  uint4 a0 = pa[0], a1 = pa[32];
  uint2 b0 = pb[0], b1 = pb[32];
  long long c0 = clock64(), t0 = gtime();
#pragma unroll 1
  for (int i = 2; i <= steps; i += 2) {
    mma(d, a0, b0);
    a0 = pa[32 * (i % 32)], b0 = pb[32 * (i % 32)];
    mma(d, a1, b1);
    a1 = pa[32 * ((i + 1) % 32)], b1 = pb[32 * ((i + 1) % 32)];
  }
  record(out, c0, t0);
  sink[blockIdx.x * 32 + lane] = d[0] + d[1] + d[2] + d[3];
}


// The default small-M kernel's step loop on data already in shared memory.
__global__ void k_steps(const uint8_t *img, sample *out, float *sink, int steps) {
  extern __shared__ __align__(16) uint8_t smem[];
  fill(smem, img);
  int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  float d[1][4] = {{0, 0, 0, 0}};
  long long c0 = clock64(), t0 = gtime();
  small::chunk_steps<8>(d, smem + w * (REC_BYTES / 2), smem + REC_BYTES + g * APITCH + q * 4, APITCH, steps,
                               lane);
  record(out, c0, t0);
  sink[blockIdx.x * 64 + threadIdx.x] = d[0][0] + d[0][1] + d[0][2] + d[0][3];
}

typedef void (*kernel_fn)(const uint8_t *, sample *, float *, int);

struct probe {
  const char *name;
  kernel_fn fn;
  int threads;
};

// A BF16 in [0.5, 2) or a scale-like power of two: finite, normal operands everywhere.
static uint16_t rand_bf16(void) { return (uint16_t)(0x3f00 + rand() % 0x100); }

static std::vector<uint8_t> make_image(void) {
  std::vector<uint8_t> img(SMEM, 0);
  for (int i = 0; i + 1 < REC_BYTES + ABYTES; i += 2) {
    uint16_t v = rand_bf16();
    img[i] = (uint8_t)v, img[i + 1] = (uint8_t)(v >> 8);
  }
  // record layout (gemm_args.h): 128 bytes of code words, then 8 rows' scale words (BF16 pairs)
  for (int r = 0; r < REC_BYTES / MT_FRAG_REC; r++)
    for (int i = 0; i < 128; i++)
      img[r * MT_FRAG_REC + i] = (uint8_t)rand();
  return img;
}

// Cycles a step and the clock, from one launch's per-CTA samples.
static void in_kernel(const probe &p, int grid, int steps, const uint8_t *img, sample *dout, float *sink) {
  p.fn<<<grid, p.threads, SMEM>>>(img, dout, sink, steps);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<sample> s(grid);
  CK(cudaMemcpy(s.data(), dout, grid * sizeof(sample), cudaMemcpyDeviceToHost));
  std::vector<double> cyc, ghz;
  for (auto &x : s)
    cyc.push_back((double)x.cycles / steps), ghz.push_back(x.ns ? (double)x.cycles / x.ns : 0);
  printf("%-6s grid %3d steps %3d: %6.1f cycles a step (median over CTAs, max %6.1f), %.2f GHz\n", p.name, grid,
         steps, median(cyc), *std::max_element(cyc.begin(), cyc.end()), median(ghz));
}

// Time per launch in a graph of 100 launches, median of 5 replays.
static void per_launch(const probe &p, int grid, int steps, const uint8_t *img, sample *dout, float *sink) {
  double us = graph_us_per_launch(100, [&](cudaStream_t st, int) {
    p.fn<<<grid, p.threads, SMEM, st>>>(img, dout, sink, steps);
  });
  printf("%-6s grid %3d steps %3d: %6.2f us a launch (graph of 100, median of 5)\n", p.name, grid, steps, us);
}

int main() {
  srand(7);
  probe probes[] = {{"empty", k_empty, 64}, {"const", k_const, 32}, {"lds", k_lds, 32},
                    {"lds2", k_lds2, 32},    {"busy", k_lds, 160},  {"v7", k_steps, 64}};
  std::vector<uint8_t> h = make_image();
  uint8_t *img;
  sample *dout;
  float *sink;
  CK(cudaMalloc(&img, SMEM));
  CK(cudaMalloc(&dout, 1024 * sizeof(sample)));
  CK(cudaMalloc(&sink, 1 << 20));
  CK(cudaMemcpy(img, h.data(), SMEM, cudaMemcpyHostToDevice));
  for (auto &p : probes)
    CK(cudaFuncSetAttribute(p.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  for (auto &p : probes) {
    if (p.fn == k_empty)
      continue;
    for (int grid : {1, 96})
      in_kernel(p, grid, MAXSTEPS, img, dout, sink);
  }
  for (auto &p : probes)
    for (int steps : {48, 128})
      per_launch(p, 96, steps, img, dout, sink);
  return 0;
}
