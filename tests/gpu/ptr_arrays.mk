# tests/gpu/ptr_arrays.mk — the C program behind tests/gpu/test_ptr_arrays.py (the pointer-array
# cuBLAS forms through the real cuBLAS, eagerly and in CUDA graphs). It loads libcuda, cuBLAS and
# cuBLASLt with dlopen, so it builds anywhere; it runs on the device machine only.
$(B)/tests/gpu/ptr_arrays_app: tests/gpu/ptr_arrays_app.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< -ldl

TEST_FIXTURES += $(B)/tests/gpu/ptr_arrays_app
