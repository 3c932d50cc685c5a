/* fork.c — the library's fork handlers, the only ones it registers, and the engine gate (see
 * fork.h). */
#include "shim/fork.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "base/log.h"
#include "kernels/driver.h"
#include "shim/instr.h"
#include "shim/stats.h"
#include "shim/devmem.h"

#define GATE_POLL_NS 50000

static atomic_int inside;  /* threads inside the gate */
static atomic_int forking; /* a fork waits for them, or is under way */
/* This thread is inside (a fork from inside a driver call). Initial-exec: the library is
 * preloaded (see hooks.c). */
static _Thread_local int mine __attribute__((tls_model("initial-exec")));
static pthread_once_t started = PTHREAD_ONCE_INIT, registered = PTHREAD_ONCE_INIT;

static void pause_briefly(void) { nanosleep(&(struct timespec){0, GATE_POLL_NS}, NULL); }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void mt_fork_enter(void) {
  for (;;) {
    atomic_fetch_add(&inside, 1);
    if (!atomic_load(&forking))
      break;
    atomic_fetch_sub(&inside, 1);
    while (atomic_load(&forking))
      pause_briefly();
  }
  mine = 1;
}

void mt_fork_leave(void) {
  mine = 0;
  atomic_fetch_sub(&inside, 1);
}

/* Both atomics are sequentially consistent: a thread entering sees `forking`, or the fork sees
 * the thread in `inside`. */
static void wait_for_gate(void) {
  atomic_store(&forking, 1);
  double deadline = now_s() + MT_FORK_WAIT_S;
  while (atomic_load(&inside) > mine && now_s() < deadline)
    pause_briefly();
}

static void prepare(void) {
  wait_for_gate();
  mt_stats_fork_lock();
  mt_instr_fork_lock();
  mt_ctx_fork_lock();
}

static void parent(void) {
  mt_ctx_fork_unlock();
  mt_instr_fork_unlock(0);
  mt_stats_fork_unlock();
  atomic_store(&forking, 0);
}

/* The child has this thread alone: nothing is inside the gate but this thread, if it was. */
static void child(void) {
  mt_ctx_fork_unlock();
  mt_instr_fork_unlock(1);
  mt_stats_fork_unlock();
  atomic_store(&inside, mine);
  atomic_store(&forking, 0);
}

static void register_handlers(void) { pthread_atfork(prepare, parent, child); }

void mt_fork_register(void) { pthread_once(&registered, register_handlers); }

/* From the start: what a child of any fork gives up. */
static void start_child(void) {
  mt_devmem_fork_child();
  mt_instr_fork_child();
}

static void register_start(void) { pthread_atfork(NULL, NULL, start_child); }

void mt_fork_start(void) { pthread_once(&started, register_start); }
