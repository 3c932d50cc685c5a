# tests/cpu/nvfp4.mk — the CPU reference's helper for tests/cpu/test_nvfp4_numpy.py.
# nvfp4_tool is built by the generic rule for $(B)/tests/cpu/% (one object linked with libmt.a);
# naming it here makes `make test` build it before the Python test runs.
TEST_FIXTURES += $(B)/tests/cpu/nvfp4_tool
