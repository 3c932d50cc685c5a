/* instr_writer.h — where the instruments' results go (shim/instr.h is what calls them): the pool
 * of result slots of each CUDA context, the background writer thread that turns published slots
 * into records of the statistics file, the aggregates and the summary.
 *
 * A slot is a result block (mt_instr_header + up to MT_IW_ROWS digested rows) in device memory,
 * its twin in mapped pinned host memory and a flag word there. The calling side (shim/instr.c)
 * takes a free slot, enqueues the kernels whose last one copies the block into the host twin and
 * writes the slot's sequence number into its flag, and publishes the slot; the writer thread polls
 * the flags (plain memory reads: it makes no CUDA call at all, so it is safe while another thread
 * captures a graph, and at exit), turns finished blocks into records and frees the slots.
 *
 * One lock (mt_iw_lock) guards the aggregates, the contexts' creation, the writer's work list and
 * the calling side's sampling counters, and is held for a few loads and stores only; slots are
 * claimed with a compare-and-swap.
 */
#ifndef MT_INSTR_WRITER_H
#define MT_INSTR_WRITER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/driver.h"
#include "kernels/instr.h"
#include "spec/spec.h"

#define MT_IW_ROWS 128 /* digested rows kept per call; more are counted as dropped */
/* A slot's block: the header, the rows, then (16 bytes) a captured call's replay count
 * (mt_instr_digest_args.tick), which the host never copies */
#define MT_IW_TICK_OFFSET (sizeof(mt_instr_header) + MT_IW_ROWS * sizeof(mt_instr_row))
#define MT_IW_SLOT_BYTES (MT_IW_TICK_OFFSET + 16)

/* The instruments, as bits of a call's `kinds`. */
enum { MT_IW_SHADOW = 1, MT_IW_PROBE = 2, MT_IW_DIGEST = 4 };

/* Why an instrument did not run for a call (counted per instrument). */
enum mt_iw_skip {
  MT_IW_CAPTURE,
  MT_IW_NO_SLOT,
  MT_IW_BETA,
  MT_IW_ENTRY,
  MT_IW_SCRATCH,
  MT_IW_BUSY,
  MT_IW_ERROR,
  MT_IW_EXIT,
  MT_IW_SKIP_COUNT
};

/* CAPTURED: taken by a call captured in a CUDA graph, whose digesting replays publish into it (its
 * flag a seqlock: kernels/instr.h, mt_instr_finish_args.seq); the writer reads each replay's block
 * it finds whole and keeps the slot for the graph's life, which the shim cannot see end. */
enum mt_iw_state { MT_IW_FREE, MT_IW_TAKEN, MT_IW_FLIGHT, MT_IW_LOST, MT_IW_CAPTURED };

typedef struct mt_iw_context mt_iw_context;

typedef struct {
  _Atomic int state; /* enum mt_iw_state */
  mt_iw_context *ctx;
  uint32_t seq;   /* what mt_instr_finish writes into the flag when this use is done */
  int used;       /* the block has been zeroed (a memset before its first use) */
  uint32_t *flag; /* host address of the flag */
  CUdeviceptr dev, host_dev, flag_dev; /* the block; the host twin and flag, as device addresses */
  unsigned char *host;
  /* what the writer needs to finish the records */
  int kinds, route, m, n, k, xtype, ytype, wtype, biastype, has_bias, probe_rows;
  int shadow_rows;       /* the rows a grouped call's shadow compared (0: the whole output) */
  int grouped, shared_w; /* a grouped call: each row's weight sum is its own (shared_w: one W) */
  float alpha;
  int captured;  /* taken by a captured call (mt_iw_capture) */
  uint32_t seen; /* captured: the flag's value at the last replay read ... */
  int read_any;  /* ... if any: the count starts where the device's left it (kernels/instr.h) */
} mt_iw_slot;

/* One CUDA context's slots and scratch (the scratch's use belongs to the calling side). */
struct mt_iw_context {
  unsigned long long id; /* the CUDA context (kernels/driver.h mt_ctx); 0: never set up */
  CUdeviceptr mem;       /* nslots blocks, then the scratch; 0: off in this context */
  unsigned char *host;   /* nslots blocks, then nslots flags: registered, mapped host memory */
  CUdeviceptr host_dev;  /* ... its device address */
  size_t host_size;
  pthread_mutex_t scratch_lock; /* the five fields below, and the scratch's contents */
  size_t scratch_bytes;
  uintptr_t scratch_stream; /* last user of the scratch (kernels/driver.h: mt_stream_key) */
  mt_iw_slot *scratch_slot; /* ... whose publication ends that use */
  uint32_t scratch_seq;
  int scratch_used;
  atomic_int next;   /* where the search for a free slot starts */
  mt_iw_slot *slots; /* nslots of them */
};

/* The settings the pool and the summary need (from mt_instr_init). */
typedef struct {
  const mt_spec *spec;
  int nslots;           /* per context: calls whose results may be in flight at once */
  size_t scratch_bytes; /* per context, after the slots' blocks */
  double rates[3];      /* shadow, probe, digest: for the summary */
  double replay_rate;   /* of a captured call's replays, the share that digest */
} mt_iw_config;

void mt_iw_configure(const mt_iw_config *cfg);

/* The lock of the file comment. */
void mt_iw_lock(void);
void mt_iw_unlock(void);

/* A fork: the lock held across it; the child, which has no writer thread, writes nothing. */
void mt_iw_before_fork(void);
void mt_iw_after_fork_parent(void);
void mt_iw_after_fork_child(void);

/* Under the lock. The current context's pool, set up at its first use (never while capturing:
 * the caller checked), or NULL when instruments are off there. */
mt_iw_context *mt_iw_context_get(const mt_driver *d, const mt_instr_driver *e);

/* Under the lock. The current context's pool when it is set up already (nothing is allocated: for
 * a call being captured), else NULL. */
mt_iw_context *mt_iw_context_ready(void);

/* Under the lock. Start the writer thread if it is not running: 1 when it runs, 0 when it was
 * stopped (at exit), -1 when it could not be started (warned: the caller turns instruments off). */
int mt_iw_writer_start(void);

/* Under the lock. 1 once the writer was stopped (at exit): nothing more is instrumented. */
int mt_iw_stopped(void);

/* A free slot of c, claimed for this call (any thread, no lock); NULL when none is free. */
mt_iw_slot *mt_iw_slot_take(mt_iw_context *c);

/* A taken slot, claimed for a call being captured in a CUDA graph: 1, or 0 when captured calls
 * already hold half the pool (the rest stays for uncaptured calls; the caller counts the skip and
 * frees the slot). Its flag is zeroed: no kernel writes it while it is taken. */
int mt_iw_capture(mt_iw_slot *s);

/* A taken slot the call does not publish: free again (FREE), or never to be reused (LOST:
 * enqueued work whose end cannot be known); a captured claim is given up. */
void mt_iw_give_back(mt_iw_slot *s, enum mt_iw_state state);

/* Hand an enqueued slot to the writer (a captured one for good). */
void mt_iw_publish(mt_iw_slot *s);

/* 1 when the slot's current use has been published (its flag, read from host memory). */
int mt_iw_published(const mt_iw_slot *s);

/* The scratch's device address: after the slots' blocks, 256-byte aligned. */
CUdeviceptr mt_iw_scratch(const mt_iw_context *c);

size_t mt_iw_round256(size_t v);

/* Counters: calls that got each of `kinds`; calls of a route that its sampling passed over for
 * `kinds`; calls whose `kinds` were skipped for `why`; a call that found no free slot. */
void mt_iw_count_calls(int kinds);
void mt_iw_count_passed(int kinds);
void mt_iw_count_skips(int kinds, enum mt_iw_skip why);
void mt_iw_count_dropped_call(void);

/* Stop the writer after writing what completes within the time limit (at exit). */
void mt_iw_drain(void);

/* The instruments' part of the summary (shim/instr.h mt_instr_summary). */
void mt_iw_summary(void (*emit)(void *ctx, const char *text), void *ctx);

#endif
