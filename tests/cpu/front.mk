# tests/cpu/front.mk — fixtures of the CPU tests of the grouped front doors: a fake
# libtorch_cuda.so (tests/cpu/fake/fake_torch.c) under the real soname, and a variant lacking an
# accessor under another soname (test_shim_torch.c), each in a folder of its own; the small
# libraries and the program of the dlsym/dlvsym tests (tests/cpu/fake/next_probe.c, next_app.c,
# test_shim_dl.c).

FRONT_FAKE := $(B)/tests/cpu/fake
FRONT_HDRS := tests/cpu/fake/fake.h tests/cpu/fake/fake_torch.h shim/cuda_api.h
# The probes' lookups must be calls from inside their library, never tail calls from its caller.
NEXT_FLAGS := -fno-optimize-sibling-calls

$(FRONT_FAKE)/torch/libtorch_cuda.so: tests/cpu/fake/fake_torch.c $(FRONT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -shared -Wl,-soname,libtorch_cuda.so -o $@ $<

$(FRONT_FAKE)/torch_old/libtorch_cuda_old.so: tests/cpu/fake/fake_torch.c $(FRONT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DFAKE_TORCH_NO_STREAM -shared -Wl,-soname,libtorch_cuda_old.so -o $@ $<

$(FRONT_FAKE)/next/libnext%.so: tests/cpu/fake/next_probe.c tests/cpu/fake/next_probe.map
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(NEXT_FLAGS) -DWHICH=$(subst _,,$*) -shared -Wl,-soname,libnext$*.so \
	    -Wl,--version-script=tests/cpu/fake/next_probe.map -o $@ $< -ldl

# 3 depends on 4 (found next to it through its RPATH)
$(FRONT_FAKE)/next/libnext_3.so: $(FRONT_FAKE)/next/libnext_4.so
$(FRONT_FAKE)/next/libnext_3.so: tests/cpu/fake/next_probe.c tests/cpu/fake/next_probe.map
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(NEXT_FLAGS) -DWHICH=3 -shared -Wl,-soname,libnext_3.so \
	    -Wl,--version-script=tests/cpu/fake/next_probe.map -o $@ $< -ldl \
	    -L$(dir $@) -Wl,--disable-new-dtags -Wl,-rpath,'$$ORIGIN' -Wl,--no-as-needed -l:libnext_4.so

$(FRONT_FAKE)/next/next_app: tests/cpu/fake/next_app.c $(FRONT_FAKE)/next/libnext_1.so \
                             $(FRONT_FAKE)/next/libnext_2.so $(FRONT_FAKE)/next/libnext_3.so
	$(CC) $(CFLAGS) -o $@ $< -L$(dir $@) -Wl,--disable-new-dtags -Wl,-rpath,'$$ORIGIN' \
	    -Wl,--no-as-needed -l:libnext_1.so -l:libnext_2.so -ldl

TEST_FIXTURES += $(FRONT_FAKE)/torch/libtorch_cuda.so $(FRONT_FAKE)/torch_old/libtorch_cuda_old.so \
                 $(FRONT_FAKE)/next/next_app
