# tests/gpu/vllm.mk — `make vllm-sources` (a machine that reaches the package registry): the real
# MoE kernels of pinned vLLM and SGLang releases for the launch door's GPU test and bench
# (tests/gpu/vllm_fetch.py says which files), extracted into $(B)/third_party; never committed.
# The device machine reaches no registry: carry $(B)/third_party there.
VLLM_SOURCES := $(B)/third_party/.stamp

$(VLLM_SOURCES): tests/gpu/vllm_fetch.py
	python3 tests/gpu/vllm_fetch.py $(B)/third_party
	@touch $@

.PHONY: vllm-sources
vllm-sources: $(VLLM_SOURCES)
