// pdl.cuh — programmatic dependent launch (sm_90), for kernels launched by mt_launch with
// `dependent` set (kernels/driver.h): such a kernel may start while the one before it on the
// stream still runs, and must wait before it reads what that one wrote. Both are no-ops for a
// launch without the attribute.
#pragma once

#ifndef MT_CUDA_EMU
// Waits until the grid before this one has completed and its writes are visible.
__device__ static inline void grid_dependency_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// Lets the kernel launched after this one with the attribute start now (its own
// grid_dependency_wait still waits for this grid to finish).
__device__ static inline void allow_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
#else
// tests/cpu/cuda_emu.h runs kernels one after another: each grid has ended before the next starts
__device__ static inline void grid_dependency_wait() {}
__device__ static inline void allow_dependents() {}
#endif
