# tests/gpu/kernels.mk — the GPU tests of the engine use the CUDA runtime for allocation and copies
# (the engine itself reaches the GPU only through the driver table).
$(GPU_TESTS): LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart
