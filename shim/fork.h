/* fork.h — the shim across fork(2).
 *
 * CUDA does not survive a fork: a forked child of a process whose engine ran routes nothing
 * (shim/devmem.h mt_devmem_forked). What the shim makes sure of is that the child never waits
 * for a thread it does not have, in the shim or in the driver:
 *
 * - The engine gate: a routed call is inside the gate while it makes the driver calls of the
 *   engine and the instruments (mt_fork_enter .. mt_fork_leave). fork() waits, in a prepare
 *   handler, until no other thread is inside (at most MT_FORK_WAIT_S seconds: a fork is delayed,
 *   never stopped), and routed calls wait at the gate while a fork is under way. The child is
 *   therefore never a copy of a moment when a thread of the shim was inside the driver and held
 *   one of its locks.
 * - Every library lock a thread may hold at a fork and a child may take is held by the forking
 *   thread across the fork, taken in one global order (the order the code nests them, outermost
 *   first): the statistics' census and file locks, the instruments' lock, the driver's context
 *   registry. The log (base/log.h) and the torch API lookup (shim/torch.c) take none. The child
 *   releases them and resets what has no thread or no CUDA behind it any more (the instruments'
 *   writer, the instruments, the engine of a process whose engine ran).
 *
 * This file registers every fork handler of the library; the modules give it their steps
 * (mt_*_fork_lock, _unlock, _child). There are two registrations. mt_fork_start, at the shim's
 * start (before the program initializes CUDA), resets a child's instruments and engine, so that a
 * fork before the first call is covered too. mt_fork_register, at the first call the shim sees
 * (after the program has initialized CUDA), holds the gate and the locks: prepare handlers run in
 * reverse order of registration, so the shim's wait for its own threads comes before anything the
 * driver's own handlers may take.
 */
#ifndef MT_FORK_H
#define MT_FORK_H

#define MT_FORK_WAIT_S 2.0

/* Register the handlers of the start, and those of the first call (each once per process; any
 * thread, any number of times). */
void mt_fork_start(void);
void mt_fork_register(void);

/* Enter and leave the engine gate (may wait while a fork is under way). */
void mt_fork_enter(void);
void mt_fork_leave(void);

#endif
