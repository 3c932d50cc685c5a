/* nvfp4_tool.c — a thin command-line door into the CPU reference (ref/nvfp4.c) for
 * tests/cpu/test_nvfp4_numpy.py, which compares it with numpy + ml_dtypes. Built by
 * tests/cpu/nvfp4.mk as $(MT_BUILD)/tests/cpu/nvfp4_tool.
 *
 *   nvfp4_tool e2m1 N | e4m3 N | bf16 N | fp16 N | outer N    stdin N float32; stdout N results
 *                                                 (uint8, uint8, uint16, uint16, float32)
 *   nvfp4_tool e4m3dec                                        stdout the 256 E4M3 values (float32)
 *   nvfp4_tool quantize ROWS COLS row|tensor 1x16|16x16       stdin ROWS*COLS float32;
 *                                                             stdout outer, scales, codes
 *   nvfp4_tool gemm M N K AOUTER WOUTER WBLOCK ALPHA BETA HAS_C HAS_BIAS
 *        stdin a (M*K), w (N*K), [c (M*N)], [bias (N)] float32; stdout y (M*N float64)
 *
 * Everything is native-endian binary. Exit status 2 and a message on stderr for bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/nvfp4.h"

static int usage(const char *why) {
  fprintf(stderr, "nvfp4_tool: %s (see the comment at the top of tests/cpu/nvfp4_tool.c)\n", why);
  return 2;
}

/* Read exactly n floats from stdin into a fresh array; NULL when stdin is short. */
static float *read_floats(size_t n) {
  float *v = malloc((n ? n : 1) * sizeof *v);
  if (v && fread(v, sizeof *v, n, stdin) != n) {
    free(v);
    return NULL;
  }
  return v;
}

static int parse_int(const char *s, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*end || v < 0 || v > (1 << 24))
    return -1;
  *out = (int)v;
  return 0;
}

static int parse_outer(const char *s, enum mt_scale *out) {
  if (!strcmp(s, "row"))
    *out = MT_SCALE_ROW;
  else if (!strcmp(s, "tensor"))
    *out = MT_SCALE_TENSOR;
  else
    return -1;
  return 0;
}

static int parse_block(const char *s, enum mt_wblock *out) {
  if (!strcmp(s, "1x16"))
    *out = MT_WBLOCK_1X16;
  else if (!strcmp(s, "16x16"))
    *out = MT_WBLOCK_16X16;
  else
    return -1;
  return 0;
}

static int scalar(const char *cmd, const char *count) {
  int n;
  if (parse_int(count, &n))
    return usage("bad count");
  float *x = read_floats((size_t)n);
  if (!x)
    return usage("stdin shorter than the count says");
  for (int i = 0; i < n; i++) {
    if (!strcmp(cmd, "e2m1") || !strcmp(cmd, "e4m3")) {
      uint8_t v = !strcmp(cmd, "e2m1") ? mt_e2m1_rne_satfinite(x[i]) : mt_e4m3_rne_satfinite(x[i]);
      fwrite(&v, 1, 1, stdout);
    } else if (!strcmp(cmd, "bf16") || !strcmp(cmd, "fp16")) {
      uint16_t v = !strcmp(cmd, "bf16") ? mt_float_to_bf16(x[i]) : mt_float_to_fp16(x[i]);
      fwrite(&v, sizeof v, 1, stdout);
    } else {
      float v = mt_nvfp4_outer_scale(x[i]);
      fwrite(&v, sizeof v, 1, stdout);
    }
  }
  free(x);
  return 0;
}

static void write_quantized(const mt_nvfp4 *q) {
  size_t n_outer = q->outer_kind == MT_SCALE_ROW ? (size_t)q->rows : 1;
  fwrite(q->outer, sizeof(float), n_outer, stdout);
  fwrite(q->scales, 1, (size_t)q->rows * (size_t)q->cols / MT_NVFP4_BLOCK, stdout);
  fwrite(q->codes, 1, (size_t)q->rows * (size_t)q->cols / 2, stdout);
}

/* Read rows x cols floats and quantize them into q; -1 on a bad shape or short input. */
static int read_quantized(mt_nvfp4 *q, int rows, int cols, enum mt_scale outer,
                          enum mt_wblock block) {
  if (mt_nvfp4_alloc(q, rows, cols, outer, block))
    return -1;
  float *x = read_floats((size_t)rows * (size_t)cols);
  if (!x) {
    mt_nvfp4_free(q);
    return -1;
  }
  mt_ref_quantize(x, (size_t)cols, q);
  free(x);
  return 0;
}

static int quantize(char **arg) {
  int rows, cols;
  enum mt_scale outer;
  enum mt_wblock block;
  if (parse_int(arg[0], &rows) || parse_int(arg[1], &cols) || parse_outer(arg[2], &outer) ||
      parse_block(arg[3], &block))
    return usage("quantize ROWS COLS row|tensor 1x16|16x16");
  mt_nvfp4 q;
  if (read_quantized(&q, rows, cols, outer, block))
    return usage("bad shape or short stdin");
  write_quantized(&q);
  mt_nvfp4_free(&q);
  return 0;
}

static int gemm(char **arg) {
  int m, n, k, has_c, has_bias;
  enum mt_scale a_outer, w_outer;
  enum mt_wblock w_block;
  if (parse_int(arg[0], &m) || parse_int(arg[1], &n) || parse_int(arg[2], &k) ||
      parse_outer(arg[3], &a_outer) || parse_outer(arg[4], &w_outer) ||
      parse_block(arg[5], &w_block) || parse_int(arg[8], &has_c) || parse_int(arg[9], &has_bias))
    return usage("gemm M N K AOUTER WOUTER WBLOCK ALPHA BETA HAS_C HAS_BIAS");
  float alpha = strtof(arg[6], NULL), beta = strtof(arg[7], NULL);
  mt_nvfp4 a, w;
  if (read_quantized(&a, m, k, a_outer, MT_WBLOCK_1X16))
    return usage("bad shape of a or short stdin");
  if (read_quantized(&w, n, k, w_outer, w_block)) {
    mt_nvfp4_free(&a);
    return usage("bad shape of w or short stdin");
  }
  float *c = has_c ? read_floats((size_t)m * (size_t)n) : NULL;
  float *bias = has_bias ? read_floats((size_t)n) : NULL;
  double *y = malloc((size_t)m * (size_t)n * sizeof *y);
  int rc = 0;
  if ((has_c && !c) || (has_bias && !bias) || !y) {
    rc = usage("short stdin for c or bias");
  } else {
    mt_ref_gemm(&a, &w, alpha, beta, c, (size_t)n, bias, y, (size_t)n);
    fwrite(y, sizeof *y, (size_t)m * (size_t)n, stdout);
  }
  free(c);
  free(bias);
  free(y);
  mt_nvfp4_free(&a);
  mt_nvfp4_free(&w);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2)
    return usage("no command");
  const char *cmd = argv[1];
  if (!strcmp(cmd, "e4m3dec") && argc == 2) {
    for (int v = 0; v < 256; v++) {
      float f = mt_e4m3_to_float((uint8_t)v);
      fwrite(&f, sizeof f, 1, stdout);
    }
    return 0;
  }
  if ((!strcmp(cmd, "e2m1") || !strcmp(cmd, "e4m3") || !strcmp(cmd, "bf16") ||
       !strcmp(cmd, "fp16") || !strcmp(cmd, "outer")) &&
      argc == 3)
    return scalar(cmd, argv[2]);
  if (!strcmp(cmd, "quantize") && argc == 6)
    return quantize(argv + 2);
  if (!strcmp(cmd, "gemm") && argc == 12)
    return gemm(argv + 2);
  return usage("unknown command or wrong number of arguments");
}
