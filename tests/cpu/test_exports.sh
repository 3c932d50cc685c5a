#!/usr/bin/env bash
# test_exports.sh — libminite.so exports exactly the hooks listed in shim/hooks.def (the names of
# the MT_HOOK and MT_DRIVER lines, the symbols of the MT_HAND lines), nothing else: a stray export
# could interpose on some other library's symbol in the user's process. Also: the library needs no
# cuBLAS, no CUDA runtime and no libtorch (DT_NEEDED).
set -u
lib="${MT_BUILD:-build}/libminite.so"
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; shift; printf '    %s\n' "$@"; fail=$((fail + 1)); }

want=$( (grep -o '^MT_HOOK([A-Za-z0-9_]*' shim/hooks.def | sed 's/^MT_HOOK(//'
         grep -o '^MT_HAND([A-Za-z0-9_]*, *[A-Za-z0-9_]*' shim/hooks.def | sed 's/^.*, *//'
         grep -o '^MT_DRIVER([A-Za-z0-9_]*' shim/hooks.def | sed 's/^MT_DRIVER(//') | sort)
# A sanitizer build adds the runtime's own instrumentation symbols; they are not ours to judge.
have=$(nm -D --defined-only "$lib" | awk '{print $3}' |
       grep -v -E '^(__asan|__ubsan|__odr_asan|__sanitizer|_init$|_fini$)' | sort)
if [ -n "$want" ] && [ "$want" = "$have" ]; then
  ok "exports_are_the_hook_list ($(echo "$want" | wc -l) symbols)"
else
  bad exports_are_the_hook_list \
      "missing: $(comm -23 <(echo "$want") <(echo "$have") | tr '\n' ' ')" \
      "extra:   $(comm -13 <(echo "$want") <(echo "$have") | tr '\n' ' ')"
fi

# Every hook a CUDA 13 toolkit exports is in the list (when the toolkit is here to ask).
real="${CUDA_HOME:-/usr/local/cuda}/lib64/libcublas.so.13"
if [ -e "$real" ]; then
  missing=$(nm -D --defined-only "$real" | awk '{print $3}' | sed 's/@.*//' |
            grep -E '^cublasGemm(Ex|StridedBatchedEx|BatchedEx|GroupedBatchedEx)(_64)?$' |
            sort | comm -23 - <(echo "$want"))
  if [ -z "$missing" ]; then ok "every_cublas13_gemm_ex_entry_is_hooked"
  else bad every_cublas13_gemm_ex_entry_is_hooked "not hooked: $missing"; fi
else
  echo "    skipped: no $real"
  echo "skip every_cublas13_gemm_ex_entry_is_hooked"
  skipped=1
fi

needed=$(readelf -d "$lib" | grep NEEDED |
         grep -o -E 'lib(cublas|cublasLt|cudart|torch|c10)[^]]*' || true)
if [ -z "$needed" ]; then ok "no_cublas_cudart_or_torch_dependency"
else bad no_cublas_cudart_or_torch_dependency "DT_NEEDED: $needed"; fi

# The CPU reference (ref/) is for tests and tools: none of it is linked into the library.
refs=$(nm "$lib" | awk '{print $3}' |
       grep -E '^mt_(ref_|nvfp4_|e2m1_|e4m3_|bf16_to|float_to|fp16_to)' || true)
if [ -z "$refs" ]; then ok "no_reference_code_in_the_library"
else bad no_reference_code_in_the_library "symbols: $(echo "$refs" | tr '\n' ' ')"; fi

# Every kernel file's fatbin is in the driver's module table (a file missing there builds, and
# every launch of its kernels fails at run time).
missing=""
for cu in kernels/*.cu; do
  name=$(basename "$cu" .cu)
  grep -q "{\"$name\", mt_fatbin_$name}" kernels/driver.c || missing="$missing $name"
done
if [ -z "$missing" ]; then ok "every_kernel_file_is_loadable"
else bad every_kernel_file_is_loadable "not in kernels/driver.c's kernel_files:$missing"; fi

echo "#mt-counts $pass $fail ${skipped:-0}"
[ "$fail" -eq 0 ]
