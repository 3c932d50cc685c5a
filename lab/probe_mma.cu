// probe_mma.cu — an experiment that decides the GEMM design (results: lab/NOTES.md, "Exactness of
// the MMA instructions").
//
// Questions: (1) on NVFP4 operands (BF16 values e2m1 * e4m3, blocks of 16 along K), do mma.sync
// m16n8k16, wgmma m64n256k16 (A and B from shared memory, 128B swizzle) and wgmma m64n8k16 (A from
// registers) give bitwise the same FP32 accumulators for the same K order? (2) how long is one step
// of a dependent chain of each (the floor of a no-split-K small-M kernel)?
//
// Build and run on the H200:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o probe probe_mma.cu && ./probe
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <cuda_runtime.h>

#include "lab/probe.cuh"

static const int M = 64, N = 256, K = 2048;

static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
} // exact inputs only
static float bf2f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// e2m1 values and a few e4m3 scales spanning subnormal to large
static float e2m1v(int c) {
  static const float v[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
  return (c & 8 ? -1 : 1) * v[c & 7];
}
static float rand_e4m3(void) {
  int e = rand() % 15 - 6, m = rand() % 8; // normal e4m3: 2^e * (1 + m/8), e in [-6, 8]
  if (rand() % 16 == 0)
    return ldexpf((float)(rand() % 8), -9); // subnormal (or 0)
  return ldexpf(1.0f + m / 8.0f, e);
}

static void fill_nvfp4(std::vector<uint16_t> &x, int rows) {
  for (int r = 0; r < rows; r++)
    for (int b = 0; b < K / 16; b++) {
      float s = rand_e4m3();
      for (int i = 0; i < 16; i++)
        x[(size_t)r * K + b * 16 + i] = f2bf(e2m1v(rand() % 16) * s);
    }
}

__device__ static uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 128B-swizzled K-major tile of `rows` x 64 BF16 (1024-byte aligned): the layout TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B and wgmma reads with layout type 1.
__device__ static uint32_t swz(int r, int k) {
  return r * 128 + ((((k * 2) >> 4) ^ (r & 7)) << 4) + ((k * 2) & 15);
}

__device__ static uint64_t desc128(uint32_t addr) {
  uint64_t d = 0;
  d |= (uint64_t)((addr >> 4) & 0x3FFF);
  d |= (uint64_t)1 << 16;           // leading byte offset (unused for swizzled K-major)
  d |= (uint64_t)(1024 >> 4) << 32; // stride byte offset: 8 rows x 128 B
  d |= (uint64_t)1 << 62;           // 128B swizzle
  return d;
}

#include "../kernels/wgmma.cuh" // mt_wgmma_m64n256k16, the large-M kernel's own wrapper

// (1a) wgmma m64n256k16 SS: one warpgroup, whole K, tiles of 64 K staged through shared memory.
__global__ void __launch_bounds__(128) k_wgmma_ss(const uint16_t *A, const uint16_t *B, float *D) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t *sa = (uint8_t *)(((uintptr_t)smem + 1023) & ~(uintptr_t)1023);
  uint8_t *sb = sa + 64 * 128;
  float d[128];
  for (int i = 0; i < 128; i++)
    d[i] = 0.f;
  int t = threadIdx.x;
  for (int k0 = 0; k0 < K; k0 += 64) {
    for (int i = t; i < 64 * 64; i += 128) {
      int r = i / 64, k = i % 64;
      *(uint16_t *)(sa + swz(r, k)) = A[(size_t)r * K + k0 + k];
    }
    for (int i = t; i < 256 * 64; i += 128) {
      int r = i / 64, k = i % 64;
      *(uint16_t *)(sb + swz(r, k)) = B[(size_t)r * K + k0 + k];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    for (int kk = 0; kk < 4; kk++) {
      uint64_t da = desc128(smem_u32(sa) + kk * 32), db = desc128(smem_u32(sb) + kk * 32);
      mt_wgmma_m64n256k16(d, da, db);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::
                     : "memory");
    __syncthreads();
  }
  int w = t / 32, l = t % 32, g = l / 4, q = l % 4;
  for (int c = 0; c < 32; c++)
    for (int i = 0; i < 4; i++) {
      int r = 16 * w + g + 8 * (i / 2), col = 8 * c + 2 * q + (i & 1);
      D[r * N + col] = d[4 * c + i];
    }
}

// (1b) mma.sync m16n8k16: warp w owns rows 16w..16w+15 and all 256 columns, fragments from global.
__global__ void __launch_bounds__(128) k_mma_sync(const uint16_t *A, const uint16_t *B, float *D) {
  int t = threadIdx.x, w = t / 32, l = t % 32, g = l / 4, q = l % 4;
  int nt = blockIdx.x; // 8-column tile index, 32 tiles
  float d[4] = {0, 0, 0, 0};
  const uint16_t *a0 = A + (size_t)(16 * w + g) * K, *a1 = a0 + 8 * K;
  const uint16_t *b0 = B + (size_t)(8 * nt + g) * K;
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t ra[4], rb[2];
    ra[0] = *(const uint32_t *)(a0 + k0 + 2 * q);
    ra[1] = *(const uint32_t *)(a1 + k0 + 2 * q);
    ra[2] = *(const uint32_t *)(a0 + k0 + 2 * q + 8);
    ra[3] = *(const uint32_t *)(a1 + k0 + 2 * q + 8);
    rb[0] = *(const uint32_t *)(b0 + k0 + 2 * q);
    rb[1] = *(const uint32_t *)(b0 + k0 + 2 * q + 8);
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
  }
  int r = 16 * w + g, col = 8 * nt + 2 * q;
  D[r * N + col] = d[0];
  D[r * N + col + 1] = d[1];
  D[(r + 8) * N + col] = d[2];
  D[(r + 8) * N + col + 1] = d[3];
}

// (1c) wgmma m64n8k16 RS: A from registers (the mma.sync fragment per warp), B (8 columns) from
// shared memory, swizzled like (1a); grid of 32 CTAs, one per 8 columns.
__global__ void __launch_bounds__(128)
    k_wgmma_rs(const uint16_t *A, const uint16_t *B, float *D, long long *cycles) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t *sb = (uint8_t *)(((uintptr_t)smem + 1023) & ~(uintptr_t)1023);
  int t = threadIdx.x, w = t / 32, l = t % 32, g = l / 4, q = l % 4, nt = blockIdx.x;
  // all of this CTA's B: 8 rows x K, as K/64 swizzled 8-row tiles of 1024 B
  for (int i = t; i < 8 * K; i += 128) {
    int r = i / K, k = i % K;
    *(uint16_t *)(sb + (k / 64) * 1024 + swz(r, k % 64)) = B[(size_t)(8 * nt + r) * K + k];
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  float d[4] = {0, 0, 0, 0};
  const uint16_t *a0 = A + (size_t)(16 * w + g) * K, *a1 = a0 + 8 * K;
  long long t0 = clock64();
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t ra[4];
    ra[0] = *(const uint32_t *)(a0 + k0 + 2 * q);
    ra[1] = *(const uint32_t *)(a1 + k0 + 2 * q);
    ra[2] = *(const uint32_t *)(a0 + k0 + 2 * q + 8);
    ra[3] = *(const uint32_t *)(a1 + k0 + 2 * q + 8);
    uint64_t db = desc128(smem_u32(sb) + (k0 / 64) * 1024 + (k0 % 64) * 2);
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "l"(db));
  }
  asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  long long t1 = clock64();
  if (t == 0)
    cycles[nt] = t1 - t0;
  int r = 16 * w + g, col = 8 * nt + 2 * q;
  D[r * N + col] = d[0];
  D[r * N + col + 1] = d[1];
  D[(r + 8) * N + col] = d[2];
  D[(r + 8) * N + col + 1] = d[3];
}

// (2) chain latency of mma.sync: one warp, K/16 dependent steps on register operands.
__global__ void k_mma_chain(float *out, long long *cycles) {
  uint32_t a = 0x3f803f80u + threadIdx.x, b = 0x3f803f80u;
  float d[4] = {0, 0, 0, 0};
  long long t0 = clock64();
  for (int i = 0; i < K / 16; i++)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%4,%4,%4}, {%5,%5}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a), "r"(b));
  long long t1 = clock64();
  out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
  if (threadIdx.x == 0)
    *cycles = t1 - t0;
}

static int compare(const char *name, const float *x, const float *ref, int n) {
  int diff = 0;
  for (int i = 0; i < n; i++) {
    uint32_t a, b;
    memcpy(&a, &x[i], 4);
    memcpy(&b, &ref[i], 4);
    if (a != b) {
      if (diff < 3)
        printf("  %s differs at %d: %.9g vs %.9g\n", name, i, x[i], ref[i]);
      diff++;
    }
  }
  printf("%-28s %d of %d accumulators differ bitwise from mma.sync\n", name, diff, n);
  return diff;
}

int main() {
  srand(1234);
  std::vector<uint16_t> hA((size_t)M * K), hB((size_t)N * K);
  fill_nvfp4(hA, M);
  fill_nvfp4(hB, N);
  // double reference and the FP32-accumulation bound (K/16 roundings of exact block sums)
  std::vector<double> ref(M * N), abss(M * N);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0, a = 0;
      for (int k = 0; k < K; k++) {
        double p = (double)bf2f(hA[(size_t)i * K + k]) * bf2f(hB[(size_t)j * K + k]);
        s += p;
        a += fabs(p);
      }
      ref[i * N + j] = s;
      abss[i * N + j] = a;
    }
  uint16_t *dA, *dB;
  float *dD;
  long long *dcy;
  CK(cudaMalloc(&dA, hA.size() * 2));
  CK(cudaMalloc(&dB, hB.size() * 2));
  CK(cudaMalloc(&dD, M * N * 4 * 3));
  CK(cudaMalloc(&dcy, 64 * 8));
  CK(cudaMemcpy(dA, hA.data(), hA.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dB, hB.data(), hB.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(dD, 0xff, M * N * 4 * 3));
  CK(cudaFuncSetAttribute(k_wgmma_ss, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          1024 + 320 * 128));
  k_mma_sync<<<32, 128>>>(dA, dB, dD);
  k_wgmma_ss<<<1, 128, 1024 + 320 * 128>>>(dA, dB, dD + M * N);
  CK(cudaFuncSetAttribute(k_wgmma_rs, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          1024 + 8 * K * 2));
  k_wgmma_rs<<<32, 128, 1024 + 8 * K * 2>>>(dA, dB, dD + 2 * M * N, dcy);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> hD(3 * M * N);
  long long cy[64];
  CK(cudaMemcpy(hD.data(), dD, hD.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(cy, dcy, 32 * 8, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int i = 0; i < M * N; i++) {
    double bound = (K / 16 + 1) * ldexp(1.0, -23) * abss[i], e = fabs(hD[i] - ref[i]);
    if (!(e <= bound)) {
      printf("  mma.sync out of bound at %d: %.9g vs %.9g\n", i, hD[i], ref[i]);
      break;
    }
    if (bound > 0 && e / bound > worst)
      worst = e / bound;
  }
  printf("mma.sync vs double reference: worst error / bound = %.3f\n", worst);
  compare("wgmma m64n256k16 SS", &hD[M * N], &hD[0], M * N);
  compare("wgmma m64n8k16 RS", &hD[2 * M * N], &hD[0], M * N);
  printf(
      "wgmma m64n8k16 RS chain: %lld cycles for %d steps (%.1f per step, incl. global A loads)\n",
      cy[0], K / 16, (double)cy[0] / (K / 16));
  float *dout;
  CK(cudaMalloc(&dout, 128 * 4));
  k_mma_chain<<<1, 32>>>(dout, dcy);
  CK(cudaDeviceSynchronize());
  k_mma_chain<<<1, 32>>>(dout, dcy);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(cy, dcy, 8, cudaMemcpyDeviceToHost));
  printf("mma.sync m16n8k16 chain: %lld cycles for %d steps (%.1f per step)\n", cy[0], K / 16,
         (double)cy[0] / (K / 16));
  return 0;
}
