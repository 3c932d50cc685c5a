/* instr.h — the mismatch instruments of a routed call: shadow error, invariance probe and row
 * digests, each sampled, none synchronizing the caller's stream (docs/design.md, "The mismatch
 * instruments").
 *
 *   MINITE_SHADOW=rate  every ceil(1/rate)-th routed call of a route (the first included) also
 *                       runs the original BF16 GEMM (the real cuBLAS entry point) into scratch:
 *                       relative L2 and max |diff| of the routed output against it; a
 *                       torch._grouped_mm call, 8 of its rows against their FP32 product
 *   MINITE_PROBE=rate   every ceil(1/rate)-th routed call with M > 1 of a route recomputes up to
 *                       4 rows (first, last, two between) alone (M = 1) and compares bit for bit;
 *                       in a grouped call, over its total rows, each with its own segment's weight
 *   MINITE_DIGEST=rate  output rows whose input row's lead hash (its first 128 elements) is below
 *                       rate * 2^64: a "digest" record; a call of m rows past 96 / rate below
 *                       96 / m * 2^64 (its block keeps 128 rows: the lowest lead hashes, nested)
 *                       (scheme MT_INSTR_SCHEME of tools/minite-compare; hashes in kernels/instr.h)
 *   MINITE_DIGEST_CALLS sampled: an uncaptured call is digested when its route's rows, counted,
 *                       reach a multiple of ceil(1 / rate) within it (every call of that many
 *                       rows; about one in ceil(1 / rate) / m of smaller ones); all: every call
 *   MINITE_INSTR_MB     device scratch for the shadow's output and the probe's rows, per GPU
 * Rates are a number in [0, 1] ("0.015625") or a fraction ("1/64"); 0 turns an instrument off.
 * They need MINITE_STATS (the records go there).
 *
 * After a routed GEMM (shim/exec.c for the engine, shim.c for spec bf16, whose routed calls are
 * cuBLAS's), mt_instr_after enqueues the instruments' kernels on the call's stream into a result
 * slot; the last of them (mt_instr_finish) copies the slot into its mapped pinned host twin and
 * then writes a sequence number into the slot's flag (a call with nothing to report writes the
 * flag alone); one background thread per process polls the flags (plain host reads, no CUDA call:
 * shim/instr_writer.h) and writes the records. Slots are a fixed pool: a call that finds none free
 * is not instrumented and counted as dropped. A call captured in a CUDA graph keeps its slot and
 * digests at one replay in ceil(1 / MINITE_DIGEST_REPLAYS) (none at 0); its probe and shadow,
 * which rerun it from the host, are skipped (`capture`), and so is everything before an
 * uncaptured call has set up the pool. At exit, what completes within 2 s is written; the rest is
 * counted as dropped.
 */
#ifndef MT_INSTR_SHIM_H
#define MT_INSTR_SHIM_H

#include <stddef.h>

#include "base/params.h"
#include "kernels/engine.h"
#include "shim/call.h"
#include "spec/spec.h"

/* Take the settings of MINITE_SHADOW, MINITE_PROBE, MINITE_DIGEST, MINITE_INSTR_MB and
 * MINITE_INSTR_SLOTS; every instrument is off unless MINITE_STATS is set. */
void mt_instr_init(const mt_spec *s, const mt_params *p);

/* 1 when any instrument is on (and the process is not a forked child). */
int mt_instr_enabled(void);

/* Turn every instrument off: the statistics file, where their records go, could not be made
 * (called before any call is instrumented, from the first call's start). */
void mt_instr_off(void);

/* One routed problem, in the engine's terms (y[m][n] = x[m][k] . W[n][k]^T). */
typedef struct {
  const mt_spec *spec;
  const mt_call *call;        /* the problem as cuBLAS saw it (shadow and bf16 probe rerun it) */
  const mt_gemm_args *engine; /* the engine's arguments, or NULL when cuBLAS computed y (bf16) */
  const uint64_t *frozen_sum; /* frozen-sampled: the cache's stored hash of W (its weight sum) */
  const void *w;
  size_t ldw;
  enum mt_dtype wtype;
  int in_out; /* W stored [in][out] (shim/router.h, mt_call_in_out): k rows of n */
  int m, n, k;
  const void *x;
  size_t ldx;
  enum mt_dtype xtype;
  const void *y;
  size_t ldy;
  enum mt_dtype ytype;
  float alpha, beta;
  const void *bias;
  enum mt_dtype biastype;
  int capturing;
  /* A grouped call (shim/exec.c): the grouped engine's arguments (segments, strides, the store,
   * the workspace), NULL for one problem. Then m is the call's total rows, x, y and w their bases
   * (w the BF16 weights, segment s's at w + s * w_stride elements; w_stride 0: one for all). */
  const mt_grouped_args *grouped;
  int64_t w_stride;
} mt_instr_call;

/* An mt_instr_call from a TN problem and its host alpha and beta (engine and frozen_sum NULL). */
void mt_instr_from_call(const mt_spec *s, const mt_call *c, const float *alpha, const float *beta,
                        mt_instr_call *out);

/* Enqueue the sampled instruments of one routed problem (or grouped call) whose output is already
 * enqueued. A grouped call gets the probe and the digests, and the shadow: a strided batch of
 * cuBLAS rerun as it came; torch._grouped_mm, which has no cuBLAS call to rerun, on 8 rows against
 * the product the instruments' kernel forms (kernels/instr.h, mt_instr_shadow_rows). */
void mt_instr_after(const mt_instr_call *ic);

/* Spec bf16: run a routed single-problem call through the real cuBLAS, then its instruments.
 * Returns 1 when it ran the call (result in *status), 0 when the hook must run it itself. */
int mt_instr_bf16(const mt_spec *s, const mt_call *c, cublasStatus_t *status);

/* The instruments' lock held across a fork (shim/fork.h); released in the parent (child 0) and
 * in the child (child 1), which has no writer thread. */
void mt_instr_fork_lock(void);
void mt_instr_fork_unlock(int child);

/* In the child of any fork (shim/fork.h): no instruments there. */
void mt_instr_fork_child(void);

/* Stop the background writer after writing what completes within the time limit (at exit). */
void mt_instr_drain(void);

/* The summary's parts: `emit` receives JSON text, the instruments' object (",\"instruments\":
 * {...}, \"digests\": {...}"), nothing when every instrument is off. */
void mt_instr_summary(void (*emit)(void *ctx, const char *text), void *ctx);

#endif
