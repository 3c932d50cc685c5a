# lab/lab.mk — `make lab`: every lab/probe_*.cu built into $(B)/lab/ (run them on the device
# machine: tests/gpu/session.sh probe). `make test` builds them too, so that a change to the
# kernels' headers they include cannot leave them broken unnoticed. They link the driver API
# through the toolkit's stub libcuda.so, which needs no driver on the building machine and names
# libcuda.so.1, so that the device machine's driver is the one loaded at run time.
LAB_PROBES := $(patsubst lab/%.cu,$(B)/lab/%,$(wildcard lab/probe_*.cu))
LAB_LIBS := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib64/stubs -Xlinker -rpath=$(CUDA_HOME)/lib64 \
            -lcuda -lcublas -lcudart

$(B)/lab/probe_%: lab/probe_%.cu $(wildcard lab/*.cuh kernels/*.cuh kernels/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -o $@ $< $(LAB_LIBS)

lab: $(LAB_PROBES)

# lab/trace.c: a kernel timeline of any program it is preloaded into (CUPTI, lab only)
$(B)/lab/libtrace.so: lab/trace.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -I$(CUDA_HOME)/include -o $@ $< \
	    -L$(CUDA_HOME)/lib64 -lcupti -Wl,-rpath,$(CUDA_HOME)/lib64

lab: $(B)/lab/libtrace.so
