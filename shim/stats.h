/* stats.h — counters, the census of GEMM shapes, and the JSON lines written to MINITE_STATS.
 *
 * The file (a path template, see base/proc.h) is resolved and checked when the shim starts, by the
 * rules of base/files.h, and opened then when it exists; one that does not is created at the first
 * GEMM call, by the same rules. The first GEMM call writes a "start" record (pid, host, rank,
 * local_rank, world_size: base/proc.h; device and pci_bus: the device current at that call,
 * kernels/driver.h mt_device_current; role, spec, fingerprint, repeated in the summary); a
 * "summary" record follows at exit: calls, routed, passed through, fallbacks by reason, the census
 * and the suggested routes. A process that never calls cuBLAS creates no file: in a job preloaded
 * as a whole, shells, compilers and launcher processes leave nothing behind. Counters are atomics;
 * the census is a fixed-size table under one mutex (bounded: shapes past its size are counted as
 * census_overflow). A forked child writes nothing: the file is its parent's.
 *
 * Census rows: entry (the hook's name: "cublasGemmStridedBatchedEx", "torch grouped_mm", ...), ops,
 * m, n, k in cuBLAS's terms (call.h), types, "batch" (problems per call, shown when not 1: the
 * batch count, or the groups of a torch._grouped_mm, whose ragged dimension is given as the total
 * over its groups) and the count of calls.
 *
 * Suggested routes: a TN shape with A and B both BF16 or both FP16 (the layout of F.linear) whose
 * weight m x k was seen with at least MT_SUGGEST_DISTINCT_N different token counts n (experts get
 * a different number of tokens at every step; a dense layer sees one n per batch shape), or in
 * at least MT_SUGGEST_CALLS calls, or as the weights of a torch._grouped_mm forward or of vLLM's
 * fused_moe_kernel (stacks of experts by construction). Printed as spec lines, "route MxK", most
 * calls first.
 */
#ifndef MT_STATS_H
#define MT_STATS_H

#include <stddef.h>

#include "shim/call.h"
#include "shim/router.h"
#include "spec/spec.h"

#define MT_CENSUS_SIZE 4096 /* distinct (entry, ops, m, n, k, types) kept */
#define MT_SHAPES_SIZE 1024 /* distinct TN and NN weight shapes tracked for suggestions */
#define MT_SUGGEST_DISTINCT_N 3
#define MT_SUGGEST_CALLS 1000
#define MT_SUGGEST_MAX 64

/* Resolve and check the file's template, and open the file when it exists (at start); 0, or -1
 * with the problem and its fix in `why` (the statistics file is also refused when it is the
 * log's). */
int mt_stats_open(const char *tmpl, char *why, size_t size);

/* Write the start record (at the first GEMM call; once), creating the file first when it did not
 * exist at start. 0, or -1 when it could not be created (warned once): no statistics then, and
 * the caller turns the instruments, whose records would have nowhere to go, off. */
int mt_stats_start(const mt_spec *s, const char *role, const char *version);

/* Count one call with the decision taken for it. */
void mt_stats_count(enum mt_reason reason);

/* Add one problem to the census (a grouped call adds one per group). */
void mt_stats_census(const mt_call *one);

/* Append complete JSON lines to the file (thread-safe: the instruments' writer thread calls it);
 * nothing when there is no file, after the summary, or in a forked child. */
void mt_stats_append(const char *lines, size_t len);

/* The census and file locks held across a fork (shim/fork.h), released in the parent and the
 * child. */
void mt_stats_fork_lock(void);
void mt_stats_fork_unlock(void);

/* A part of the summary record that another module writes: it passes JSON text to `emit`,
 * starting with ", " (e.g. ", \"engine\": {...}"). */
typedef void (*mt_stats_part)(void (*emit)(void *ctx, const char *text), void *ctx);

/* Write the summary record, with what `parts` adds (may be NULL), and close the file (no-op in a
 * forked child or without a file), and log the counts at INFO. */
void mt_stats_finish(mt_stats_part parts);

/* For tests: the counters so far. */
typedef struct {
  unsigned long long gemm_calls, routed, passthrough, fallbacks[MT_R_COUNT];
} mt_stats_counts;
void mt_stats_get(mt_stats_counts *out);

/* For tests: the suggested routes so far, as "MxK" into routes[]; returns how many. */
int mt_stats_suggest(mt_route *routes, int max);

/* For tests: forget everything counted (the file stays as it is). */
void mt_stats_reset(void);

#endif
