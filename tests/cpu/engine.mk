# tests/cpu/engine.mk — fixtures of the CPU tests of the engine path (tests/cpu/test_shim_engine.c):
# a fake libcuda.so.1 (tests/cpu/fake/fake_cuda.c) under the real soname, which the test program
# loads as PyTorch would, so that the preloaded shim finds it by soname. It lives in a directory of
# its own: the fake apps of tests/cpu/shim.mk carry an RPATH to tests/cpu/fake, which dlopen also
# searches, and their tests expect no driver. The fake cuBLAS libraries and preload_first.txt come
# from tests/cpu/shim.mk.

ENGINE_FAKE := $(B)/tests/cpu/fake

$(ENGINE_FAKE)/driver/libcuda.so.1: tests/cpu/fake/fake_cuda.c tests/cpu/fake/fake_cuda.h \
                                    tests/cpu/fake/fake.h kernels/gemm_args.h kernels/quant.h \
                                    kernels/wcheck.h kernels/instr.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -shared -Wl,-soname,libcuda.so.1 -o $@ $< -lpthread -lm

TEST_FIXTURES += $(ENGINE_FAKE)/driver/libcuda.so.1 $(ENGINE_FAKE)/libcublas.so.13 \
                 $(ENGINE_FAKE)/libcublasLt.so.13 $(ENGINE_FAKE)/preload_first.txt
