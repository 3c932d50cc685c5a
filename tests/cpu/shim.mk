# tests/cpu/shim.mk — fixtures of the shim's CPU tests: fake libcublas.so.13 / libcublasLt.so.13
# (real sonames, version nodes named like the real ones), the fake app in both arrangements
# (linked directly; dlopen()ed with RTLD_LOCAL through libfakeapp.so), and the name of the ASan
# runtime that must come first in LD_PRELOAD when the preloaded library is built with ASan.

FAKE := $(B)/tests/cpu/fake
# DT_RPATH (not RUNPATH): it wins over LD_LIBRARY_PATH, so a machine whose LD_LIBRARY_PATH holds
# the real cuBLAS still loads the fakes.
FAKE_LDFLAGS := -L$(FAKE) -Wl,--disable-new-dtags -Wl,-rpath,'$$ORIGIN'
FAKE_HDRS := tests/cpu/fake/fake.h shim/cuda_api.h

$(FAKE)/libcublas.so.13: tests/cpu/fake/fake_cublas.c tests/cpu/fake/libcublas.map $(FAKE_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -shared -Wl,-soname,libcublas.so.13 \
	    -Wl,--version-script=tests/cpu/fake/libcublas.map -o $@ $<

$(FAKE)/libcublasLt.so.13: tests/cpu/fake/fake_cublasLt.c tests/cpu/fake/libcublasLt.map \
                           $(FAKE_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -shared -Wl,-soname,libcublasLt.so.13 \
	    -Wl,--version-script=tests/cpu/fake/libcublasLt.map -o $@ $<

FAKE_LIBS := $(FAKE)/libcublas.so.13 $(FAKE)/libcublasLt.so.13

$(FAKE)/libfakeapp.so: tests/cpu/fake/fake_app.c $(FAKE_LIBS) $(FAKE_HDRS)
	$(CC) $(CFLAGS) -pthread -shared -o $@ $< $(FAKE_LDFLAGS) -l:libcublas.so.13 -l:libcublasLt.so.13

$(FAKE)/app_direct: tests/cpu/fake/app_direct.c tests/cpu/fake/fake_app.c $(FAKE_LIBS) $(FAKE_HDRS)
	$(CC) $(CFLAGS) -pthread -o $@ tests/cpu/fake/app_direct.c tests/cpu/fake/fake_app.c \
	    $(FAKE_LDFLAGS) -l:libcublas.so.13 -l:libcublasLt.so.13

# The same fakes under the CUDA 12 sonames and version nodes, for the lookup's second choice.
$(FAKE)/cuda12/%.map:
	@mkdir -p $(dir $@)
	printf '%s {\n  global: cublas*; fake_*;\n  local: *;\n};\n' $*.so.12 > $@

$(FAKE)/cuda12/libcublas.so.12: tests/cpu/fake/fake_cublas.c $(FAKE)/cuda12/libcublas.map \
                                $(FAKE_HDRS)
	$(CC) $(CFLAGS) -shared -Wl,-soname,libcublas.so.12 \
	    -Wl,--version-script=$(FAKE)/cuda12/libcublas.map -o $@ $<

$(FAKE)/cuda12/libcublasLt.so.12: tests/cpu/fake/fake_cublasLt.c \
                                  $(FAKE)/cuda12/libcublasLt.map $(FAKE_HDRS)
	$(CC) $(CFLAGS) -shared -Wl,-soname,libcublasLt.so.12 \
	    -Wl,--version-script=$(FAKE)/cuda12/libcublasLt.map -o $@ $<

$(FAKE)/cuda12/libfakeapp.so: tests/cpu/fake/fake_app.c $(FAKE)/cuda12/libcublas.so.12 \
                              $(FAKE)/cuda12/libcublasLt.so.12 $(FAKE_HDRS)
	$(CC) $(CFLAGS) -pthread -shared -o $@ $< -L$(FAKE)/cuda12 -Wl,--disable-new-dtags \
	    -Wl,-rpath,'$$ORIGIN' -l:libcublas.so.12 -l:libcublasLt.so.12

$(FAKE)/app_dlopen: tests/cpu/fake/app_dlopen.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< -ldl

$(FAKE)/preload_first.txt: FORCE_SHIM_FIXTURE
	@mkdir -p $(dir $@)
	@if [ "$(SAN)" = 1 ]; then $(CC) -print-file-name=libasan.so; else echo; fi > $@.tmp
	@cmp -s $@.tmp $@ || mv $@.tmp $@; rm -f $@.tmp

.PHONY: FORCE_SHIM_FIXTURE
TEST_FIXTURES += $(FAKE)/libfakeapp.so $(FAKE)/app_direct $(FAKE)/app_dlopen \
                 $(FAKE)/preload_first.txt $(FAKE)/cuda12/libfakeapp.so
