# tests/gpu/reliability.mk — the C program behind tests/gpu/test_reliability.py (threads, forks,
# context resets, two contexts, exhausted memory through the real cuBLAS). It loads libcuda and
# cuBLAS with dlopen, so it builds anywhere; it runs on the device machine only.
$(B)/tests/gpu/reliability_app: tests/gpu/reliability_app.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< -ldl -lpthread

TEST_FIXTURES += $(B)/tests/gpu/reliability_app
