# tests/gpu/kernels.mk — the GPU test of the engine uses the CUDA runtime for allocation and copies
# (the engine itself reaches the GPU only through the driver table).
$(B)/tests/gpu/test_kernels: LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart
