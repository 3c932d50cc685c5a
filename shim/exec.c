/* exec.c — the engine seam: no engine is connected yet (issue 5 connects kernels/engine.h). */
#include "shim/exec.h"

enum mt_reason mt_exec_routed(const mt_spec *s, mt_call *c, cublasStatus_t *status) {
  (void)s, (void)c, (void)status;
  return MT_R_NO_ENGINE;
}
