/* floatbits.h — an FP32 value's bits and back, for the CPU tests that check numerics bit for
 * bit. */
#ifndef MT_TESTS_FLOATBITS_H
#define MT_TESTS_FLOATBITS_H
#include <stdint.h>
#include <string.h>

static inline uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
#endif
