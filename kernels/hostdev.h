/* hostdev.h — MT_HD: an inline function of a header that both the host code (C) and the kernels
 * (CUDA C++) include, compiled for each side. */
#ifndef MT_HOSTDEV_H
#define MT_HOSTDEV_H

#ifdef __CUDACC__
#define MT_HD __host__ __device__ static inline
#else
#define MT_HD static inline
#endif

#endif
