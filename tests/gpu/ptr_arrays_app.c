/* ptr_arrays_app.c — the pointer-array cuBLAS forms through the real cuBLAS under the preloaded
 * shim, for tests/gpu/test_ptr_arrays.py. E experts of OUT x IN (the route), T tokens each, beta
 * 0.5 with C: one cublasGemmStridedBatchedEx of all E problems is the reference; then the same
 * problems through
 *   batched   cublasGemmBatchedEx (device arrays of pointers into copies of W, x and C in the
 *             reverse expert order, so that no address is the strided call's)
 *   grouped   cublasGemmGroupedBatchedEx, two groups (1 problem, then E-1), T rows each
 *   ragged    the same with T1 < T rows in the first group: rows differing by group
 *   lt        cublasLtMatmul with every layout's BATCH_MODE POINTER_ARRAY (C and D apart)
 * each called eagerly, then captured into a CUDA graph (cuStreamBeginCapture) and replayed twice.
 * For each it prints "#info differing_FORM N" (outputs whose bits differ from the reference's:
 * the ragged first problem's rows past T1 must still hold C), "#info differing_graph_FORM N" (the
 * replays'), and from the captured graph "#info grouped_nodes_FORM N" (kernel nodes of the grouped
 * GEMM, mt_grouped_nBN), "#info gemm_nodes_FORM N" (of the per-problem kernels, mt_gemm_*) and
 * "#info other_nodes_FORM N" (kernels that are not the engine's, such as cuBLAS's), "#info
 * status_FORM S" (the eager call's cublasStatus_t) and "#info calls N" (calls made through the
 * cuBLAS entry points). With a second argument "eager", no graphs (a run without the shim, whose
 * cuBLAS calls need not be capturable). Writes the reference's output (raw BF16) to OUT, for the
 * parent to compare with a run without the shim. Exit 0 when it ran (the parent judges the
 * numbers), 2 on a setup error. Loads libcuda, libcublas and libcublasLt with dlopen (RTLD_GLOBAL)
 * and calls the cuBLAS entry points through the global scope, where the shim's hooks come first
 * when it is preloaded.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim/cuda_api.h" /* cuBLAS and cuBLASLt, declarations only */

#define E 4     /* experts: problems of a call */
#define OUT 512 /* the routed weight: OUT x IN */
#define IN 1024
#define T 24 /* tokens a problem */
#define T1 9 /* the ragged call's first problem */
#define NFORMS 4

static const char *const forms[NFORMS] = {"batched", "grouped", "ragged", "lt"};

static struct {
  __typeof__(&cuInit) init;
  __typeof__(&cuDeviceGet) device_get;
  __typeof__(&cuDevicePrimaryCtxRetain) retain;
  __typeof__(&cuCtxSetCurrent) set_current;
  __typeof__(&cuMemAlloc) alloc;
  __typeof__(&cuMemcpyHtoD) htod;
  __typeof__(&cuMemcpyDtoH) dtoh;
  __typeof__(&cuStreamCreate) stream_create;
  __typeof__(&cuStreamSynchronize) sync;
  __typeof__(&cuStreamBeginCapture) begin_capture;
  __typeof__(&cuStreamEndCapture) end_capture;
  CUresult (*instantiate)(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
  __typeof__(&cuGraphLaunch) launch;
  __typeof__(&cuGraphExecDestroy) exec_destroy;
  __typeof__(&cuGraphDestroy) destroy;
  __typeof__(&cuGraphGetNodes) get_nodes;
  __typeof__(&cuGraphNodeGetType) node_type;
  CUresult (*kernel_params)(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v2 *p);
  __typeof__(&cuFuncGetName) func_name;
  __typeof__(&cuKernelGetName) kernel_name;
} d;

static __typeof__(&cublasCreate_v2) blas_create;
static __typeof__(&cublasSetStream_v2) blas_set_stream;
static __typeof__(&cublasGemmStridedBatchedEx) strided_ex;
static __typeof__(&cublasGemmBatchedEx) batched_ex;
static __typeof__(&cublasGemmGroupedBatchedEx) grouped_ex;
static __typeof__(&cublasLtCreate) lt_create;
static __typeof__(&cublasLtMatmulDescCreate) lt_desc_create;
static __typeof__(&cublasLtMatmulDescSetAttribute) lt_desc_set;
static __typeof__(&cublasLtMatrixLayoutCreate) lt_layout_create;
static __typeof__(&cublasLtMatrixLayoutSetAttribute) lt_layout_set;
static __typeof__(&cublasLtMatmul) lt_matmul;

static int load(void) {
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  void *blas = dlopen("libcublas.so.13", RTLD_NOW | RTLD_GLOBAL);
  void *lt = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (!cuda || !blas || !lt)
    return fprintf(stderr, "dlopen: %s\n", dlerror()), -1;
  void *p;
#define SYM(lib, field, name)                                                                      \
  if (!(p = dlsym(lib, name)))                                                                     \
    return fprintf(stderr, "no %s\n", name), -1;                                                   \
  memcpy(&field, &p, sizeof p);
  SYM(cuda, d.init, "cuInit");
  SYM(cuda, d.device_get, "cuDeviceGet");
  SYM(cuda, d.retain, "cuDevicePrimaryCtxRetain");
  SYM(cuda, d.set_current, "cuCtxSetCurrent");
  SYM(cuda, d.alloc, "cuMemAlloc_v2");
  SYM(cuda, d.htod, "cuMemcpyHtoD_v2");
  SYM(cuda, d.dtoh, "cuMemcpyDtoH_v2");
  SYM(cuda, d.stream_create, "cuStreamCreate");
  SYM(cuda, d.sync, "cuStreamSynchronize");
  SYM(cuda, d.begin_capture, "cuStreamBeginCapture_v2");
  SYM(cuda, d.end_capture, "cuStreamEndCapture");
  SYM(cuda, d.instantiate, "cuGraphInstantiateWithFlags");
  SYM(cuda, d.launch, "cuGraphLaunch");
  SYM(cuda, d.exec_destroy, "cuGraphExecDestroy");
  SYM(cuda, d.destroy, "cuGraphDestroy");
  SYM(cuda, d.get_nodes, "cuGraphGetNodes");
  SYM(cuda, d.node_type, "cuGraphNodeGetType");
  SYM(cuda, d.kernel_params, "cuGraphKernelNodeGetParams_v2");
  SYM(cuda, d.func_name, "cuFuncGetName");
  SYM(cuda, d.kernel_name, "cuKernelGetName");
  SYM(blas, blas_create, "cublasCreate_v2");
  SYM(blas, blas_set_stream, "cublasSetStream_v2");
  SYM(RTLD_DEFAULT, strided_ex, "cublasGemmStridedBatchedEx");
  SYM(RTLD_DEFAULT, batched_ex, "cublasGemmBatchedEx");
  SYM(RTLD_DEFAULT, grouped_ex, "cublasGemmGroupedBatchedEx");
  SYM(lt, lt_create, "cublasLtCreate");
  SYM(lt, lt_desc_create, "cublasLtMatmulDescCreate");
  SYM(lt, lt_desc_set, "cublasLtMatmulDescSetAttribute");
  SYM(lt, lt_layout_create, "cublasLtMatrixLayoutCreate");
  SYM(lt, lt_layout_set, "cublasLtMatrixLayoutSetAttribute");
  SYM(RTLD_DEFAULT, lt_matmul, "cublasLtMatmul");
#undef SYM
  return 0;
}

/* BF16 values k/64 in [-1, 1) from an LCG: the same in every run. */
static void fill(uint16_t *p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    float f = (float)((int)(seed >> 25) - 64) / 64.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    p[i] = (uint16_t)(u >> 16);
  }
}

#define WSZ ((size_t)OUT * IN) /* elements of an expert's weight, activations, output */
#define XSZ ((size_t)T * IN)
#define YSZ ((size_t)T * OUT)

static struct {
  CUstream stream;
  cublasHandle_t blas;
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  CUdeviceptr w, x, yref;     /* strided: expert e at e * size */
  CUdeviceptr wr, xr, yp, cp; /* the copies behind the pointers: expert e at (E - 1 - e) * size */
  CUdeviceptr wptr, xptr, yptr, cptr; /* device arrays of E pointers */
  CUdeviceptr ws;
  uint16_t *c0, *ref, *got; /* host: C as it starts, the reference's output, a form's output */
  int calls;
} g;

static const float one = 1.0f, half = 0.5f;

static CUdeviceptr dev_copy(const void *host, size_t bytes) {
  CUdeviceptr p = 0;
  if (d.alloc(&p, bytes) || (host && d.htod(p, host, bytes)))
    return 0;
  return p;
}

/* The experts' data in reverse order: expert e of `src` (host) at (E - 1 - e) * n. */
static CUdeviceptr reversed(const uint16_t *src, size_t n) {
  uint16_t *h = malloc(E * n * 2);
  for (int e = 0; e < E; e++)
    memcpy(h + (size_t)(E - 1 - e) * n, src + (size_t)e * n, n * 2);
  CUdeviceptr p = dev_copy(h, E * n * 2);
  free(h);
  return p;
}

static CUdeviceptr ptr_array(CUdeviceptr base, size_t n) {
  CUdeviceptr h[E];
  for (int e = 0; e < E; e++)
    h[e] = base + (CUdeviceptr)((size_t)(E - 1 - e) * n * 2);
  return dev_copy(h, sizeof h);
}

static int lt_setup(void) {
  int32_t ta = CUBLAS_OP_T, count = E;
  uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
  if (lt_create(&g.lt) || lt_desc_create(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
      lt_desc_set(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ||
      lt_layout_create(&g.la, CUDA_R_16BF, IN, OUT, IN) ||
      lt_layout_create(&g.lb, CUDA_R_16BF, IN, T, IN) ||
      lt_layout_create(&g.lc, CUDA_R_16BF, OUT, T, OUT))
    return -1;
  cublasLtMatrixLayout_t all[3] = {g.la, g.lb, g.lc};
  for (int i = 0; i < 3; i++)
    if (lt_layout_set(all[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count) ||
        lt_layout_set(all[i], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode))
      return -1;
  return 0;
}

static int setup(void) {
  CUdevice dev;
  CUcontext ctx;
  if (d.init(0) || d.device_get(&dev, 0) || d.retain(&ctx, dev) || d.set_current(ctx) ||
      d.stream_create(&g.stream, CU_STREAM_NON_BLOCKING) || blas_create(&g.blas) ||
      blas_set_stream(g.blas, (cudaStream_t)g.stream) || lt_setup())
    return -1;
  uint16_t *w = malloc(E * WSZ * 2), *x = malloc(E * XSZ * 2);
  g.c0 = malloc(E * YSZ * 2), g.ref = malloc(E * YSZ * 2), g.got = malloc(E * YSZ * 2);
  fill(w, E * WSZ, 11), fill(x, E * XSZ, 12), fill(g.c0, E * YSZ, 13);
  g.w = dev_copy(w, E * WSZ * 2), g.x = dev_copy(x, E * XSZ * 2);
  g.yref = dev_copy(g.c0, E * YSZ * 2);
  g.wr = reversed(w, WSZ), g.xr = reversed(x, XSZ);
  g.yp = dev_copy(NULL, E * YSZ * 2), g.cp = reversed(g.c0, YSZ);
  g.wptr = ptr_array(g.wr, WSZ), g.xptr = ptr_array(g.xr, XSZ);
  g.yptr = ptr_array(g.yp, YSZ), g.cptr = ptr_array(g.cp, YSZ);
  g.ws = dev_copy(NULL, (size_t)32 << 20);
  free(w), free(x);
  return g.w && g.x && g.yref && g.wr && g.xr && g.yp && g.cp && g.wptr && g.xptr && g.yptr &&
                 g.cptr && g.ws
             ? 0
             : -1;
}

/* The outputs behind the pointers back to C (reversed, as the pointers see them). */
static int reset_outputs(void) {
  uint16_t *h = malloc(E * YSZ * 2);
  for (int e = 0; e < E; e++)
    memcpy(h + (size_t)(E - 1 - e) * YSZ, g.c0 + (size_t)e * YSZ, YSZ * 2);
  int bad = d.htod(g.yp, h, E * YSZ * 2) != 0;
  free(h);
  return bad ? -1 : 0;
}

static cublasStatus_t call_form(int form) {
  g.calls++;
  if (form == 0)
    return batched_ex(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, OUT, T, IN, &one,
                      (const void *const *)g.wptr, CUDA_R_16BF, IN, (const void *const *)g.xptr,
                      CUDA_R_16BF, IN, &half, (void *const *)g.yptr, CUDA_R_16BF, OUT, E,
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (form == 1 || form == 2) {
    cublasOperation_t ta[2] = {CUBLAS_OP_T, CUBLAS_OP_T}, tb[2] = {CUBLAS_OP_N, CUBLAS_OP_N};
    int m[2] = {OUT, OUT}, n[2] = {form == 2 ? T1 : T, T}, k[2] = {IN, IN}, ld[2] = {IN, IN};
    int ldc[2] = {OUT, OUT}, size[2] = {1, E - 1};
    float alpha[2] = {1.0f, 1.0f}, beta[2] = {0.5f, 0.5f};
    return grouped_ex(g.blas, ta, tb, m, n, k, alpha, (const void *const *)g.wptr, CUDA_R_16BF, ld,
                      (const void *const *)g.xptr, CUDA_R_16BF, ld, beta, (void *const *)g.yptr,
                      CUDA_R_16BF, ldc, 2, size, CUBLAS_COMPUTE_32F);
  }
  return lt_matmul(g.lt, g.desc, &one, (const void *)g.wptr, g.la, (const void *)g.xptr, g.lb,
                   &half, (const void *)g.cptr, g.lc, (void *)g.yptr, g.lc, NULL, (void *)g.ws,
                   (size_t)32 << 20, (cudaStream_t)g.stream);
}

/* Outputs of the form (behind the pointers) whose bits differ from the reference's; the ragged
 * call's first problem: its rows past T1 must hold C still. */
static long differing(int form) {
  if (d.sync(g.stream) || d.dtoh(g.got, g.yp, E * YSZ * 2))
    return -1;
  long differ = 0;
  for (int e = 0; e < E; e++) {
    const uint16_t *got = g.got + (size_t)(E - 1 - e) * YSZ, *ref = g.ref + (size_t)e * YSZ,
                   *c = g.c0 + (size_t)e * YSZ;
    for (size_t i = 0; i < YSZ; i++) {
      int computed = !(form == 2 && e == 0 && i >= (size_t)T1 * OUT);
      differ += got[i] != (computed ? ref[i] : c[i]);
    }
  }
  return differ;
}

/* The captured graph's kernel nodes: the grouped GEMM's, the per-problem GEMMs', and others. */
static void count_nodes(CUgraph graph, const char *name) {
  size_t n = 0;
  long grouped = 0, gemm = 0, other = 0;
  d.get_nodes(graph, NULL, &n);
  CUgraphNode *nodes = calloc(n ? n : 1, sizeof *nodes);
  d.get_nodes(graph, nodes, &n);
  for (size_t i = 0; i < n; i++) {
    CUgraphNodeType type;
    CUDA_KERNEL_NODE_PARAMS_v2 p;
    const char *fn = NULL;
    if (d.node_type(nodes[i], &type) || type != CU_GRAPH_NODE_TYPE_KERNEL)
      continue;
    if (d.kernel_params(nodes[i], &p) ||
        (p.func ? d.func_name(&fn, p.func) : !p.kern || d.kernel_name(&fn, p.kern)))
      fn = NULL;
    grouped += fn && !strncmp(fn, "mt_grouped_n", 12);
    gemm += fn && !strncmp(fn, "mt_gemm_", 8);
    other += !fn || strncmp(fn, "mt_", 3);
  }
  free(nodes);
  printf("#info grouped_nodes_%s %ld\n#info gemm_nodes_%s %ld\n#info other_nodes_%s %ld\n", name,
         grouped, name, gemm, name, other);
}

/* The form captured into a graph, replayed twice (the outputs reset before each). */
static int graph_of(int form) {
  CUgraph graph;
  CUgraphExec exec;
  if (reset_outputs() || d.begin_capture(g.stream, CU_STREAM_CAPTURE_MODE_GLOBAL))
    return -1;
  cublasStatus_t st = call_form(form);
  if (d.end_capture(g.stream, &graph) || st != CUBLAS_STATUS_SUCCESS)
    return printf("#info graph_status_%s %d\n", forms[form], (int)st), 0;
  count_nodes(graph, forms[form]);
  if (d.instantiate(&exec, graph, 0))
    return -1;
  long differ = 0;
  for (int rep = 0; rep < 2 && differ >= 0; rep++) {
    long dr;
    if (reset_outputs() || d.launch(exec, g.stream) || (dr = differing(form)) < 0)
      differ = -1;
    else
      differ += dr;
  }
  printf("#info differing_graph_%s %ld\n", forms[form], differ);
  d.exec_destroy(exec);
  d.destroy(graph);
  return differ < 0 ? -1 : 0;
}

int main(int argc, char **argv) {
  if (argc != 2 && !(argc == 3 && !strcmp(argv[2], "eager")))
    return fprintf(stderr, "usage: ptr_arrays_app OUT [eager]\n"), 2;
  const int graphs = argc == 2;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (load() || setup())
    return fprintf(stderr, "setup failed\n"), 2;
  g.calls++;
  cublasStatus_t st = strided_ex(
      g.blas, CUBLAS_OP_T, CUBLAS_OP_N, OUT, T, IN, &one, (const void *)g.w, CUDA_R_16BF, IN,
      (long long)WSZ, (const void *)g.x, CUDA_R_16BF, IN, (long long)XSZ, &half, (void *)g.yref,
      CUDA_R_16BF, OUT, (long long)YSZ, E, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS || d.sync(g.stream) || d.dtoh(g.ref, g.yref, E * YSZ * 2))
    return fprintf(stderr, "the strided reference failed: %d\n", (int)st), 2;
  FILE *out = fopen(argv[1], "wb");
  if (out) {
    fwrite(g.ref, 2, E * YSZ, out);
    fclose(out);
  }
  for (int f = 0; f < NFORMS; f++) {
    if (reset_outputs())
      return 2;
    st = call_form(f);
    printf("#info status_%s %d\n", forms[f], (int)st);
    if (st == CUBLAS_STATUS_SUCCESS)
      printf("#info differing_%s %ld\n", forms[f], differing(f));
    if (st == CUBLAS_STATUS_SUCCESS && graphs && graph_of(f))
      return fprintf(stderr, "graph of %s failed\n", forms[f]), 2;
  }
  printf("#info calls %d\n", g.calls);
  return 0;
}
