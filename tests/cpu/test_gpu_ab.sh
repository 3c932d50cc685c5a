#!/usr/bin/env bash
# test_gpu_ab.sh — lab/gpu_ab.sh's parts that need no GPU: the table it prints from benchmark
# logs (rows as bench_kernels or, with AB_BENCH=moe, bench_moe writes them; per row and variant
# the median of the repeats, the lower of two, in the order given, main first), and "prepare", which
# copies a branch's changed files into ab/NAME (in a scratch git repository).
set -u
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; shift; printf '    %s\n' "$@"; fail=$((fail + 1)); }
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# a bench_kernels table line: name M N K | ours cuBLAS | ratio | quant gemm | TFLOP/s x2 | GB/s x2
line() { echo "$1 $2 1536 2048 | 7.00 5.50 | 0.79 | 2.00 $3 | 14.0 18.0 | 247 1133"; }
{ line qwen3_gate_up 16 5.91; line qwen3_gate_up 4096 35.0
  echo "qwen3_gate_up 16 | - - 7.18 | large 7.18"; } >"$tmp/bench-main-1.log"
{ line qwen3_gate_up 16 5.95; line qwen3_gate_up 4096 35.2; } >"$tmp/bench-main-2.log"
{ line qwen3_gate_up 16 6.31; line qwen3_gate_up 4096 34.9; } >"$tmp/bench-rs-1.log"
{ line qwen3_gate_up 16 6.28; line qwen3_gate_up 4096 35.1; } >"$tmp/bench-rs-2.log"
got=$(OUT=$tmp AB_MAX_M=1024 lab/gpu_ab.sh table rs)
want=$(printf '%-22s %10s %10s\n%-22s %10s %10s' "GEMM us (median)" main rs \
       "qwen3_gate_up 16" 5.91 6.28)
if [ "$got" = "$want" ]; then ok table_medians_per_row_and_variant
else bad table_medians_per_row_and_variant "got:" "$got" "want:" "$want"; fi

got=$(OUT=$tmp AB_MAX_M=4096 AB_REPEATS=1 lab/gpu_ab.sh table rs | tail -n 1)
want=$(printf '%-22s %10s %10s' "qwen3_gate_up 4096" 35.0 34.9)
if [ "$got" = "$want" ]; then ok table_rows_up_to_ab_max_m
else bad table_rows_up_to_ab_max_m "got: $got" "want: $want"; fi

# AB_BENCH=moe: bench_moe's tables (a geometry's header line, then "T | ours cuBLAS ratio | ..."),
# per geometry and T the layer's µs alone, and served and served after a sync where a line has them
moe_log() { # qwen3's us at T = 1 (alone, served, srv sync) and 1024, dsv3's at T = 1
  echo "qwen3: 128 experts, top-8, gate_up 1536x2048, down 2048x768; weights 1208 MB BF16, 340 MB" \
    "in the store"
  echo "gate_up's whole check: frozen 254.9 us (3.16 TB/s of its BF16 bytes), frozen-sampled" \
    "11.51 us"
  echo "     T |    ours us  cuBLAS us   ratio |     TF/s     TF/s |     wGB/s     wGB/s |" \
    " rel L2 | frozen us   sampled    synced | served us  check  srv sync"
  echo "     1 |      $1      47.13    2.91 |      4.7      1.6 |      1312      1602 |  0.1383 |" \
    "    46.41     15.92    440.40 |     $4    38%    $5"
  echo "  1024 |     $2     423.70    1.47 |    267.5    182.5 |      1176      2851 |  0.1402 |" \
    "   392.82     23.03"
  echo "dsv3: 256 experts, top-8, gate_up 4096x7168, down 7168x2048; weights 22549 MB BF16," \
    "6342 MB in the store"
  echo "     1 |      $3     192.32    2.91 |     10.7      3.7 |      2999      3664 |  0.1401 |" \
    "   243.78     21.31"
}
moe_log 16.19 288.98 66.09 25.02 566.52 >"$tmp/bench-main-1.log"
moe_log 16.24 287.86 66.50 25.10 560.10 >"$tmp/bench-main-2.log"
moe_log 16.50 285.25 66.01 24.70 1519.63 >"$tmp/bench-rs-1.log"
moe_log 16.15 297.18 66.20 24.90 1525.00 >"$tmp/bench-rs-2.log"
got=$(OUT=$tmp AB_BENCH=moe lab/gpu_ab.sh table rs)
want=$(printf '%-22s %10s %10s\n' "layer us (median)" main rs "qwen3 1:alone" 16.19 16.15 \
  "qwen3 1:served" 25.02 24.70 "qwen3 1:srvsync" 560.10 1519.63 "qwen3 1024:alone" 287.86 285.25 \
  "dsv3 1:alone" 66.09 66.01)
if [ "$got" = "$want" ]; then ok moe_table_per_geometry_and_tokens
else bad moe_table_per_geometry_and_tokens "got:" "$got" "want:" "$want"; fi

# prepare: a branch off HEAD that changes one file and adds one; ab/NAME holds both, as the branch
# has them
repo=$tmp/repo
mkdir -p "$repo/lab" "$repo/kernels"
cp lab/gpu_ab.sh "$repo/lab/"
(cd "$repo" && git init -q && echo a >kernels/k.cu && echo b >kernels/other.cu &&
  git add -A && git -c user.name=t -c user.email=t@t commit -qm base && git checkout -qb v &&
  echo a2 >kernels/k.cu && echo n >kernels/new.cuh && git add -A &&
  git -c user.name=t -c user.email=t@t commit -qm v && git checkout -q - &&
  lab/gpu_ab.sh prepare x v >/dev/null 2>&1)
if [ "$(cat "$repo/ab/x/kernels/k.cu" 2>/dev/null)" = a2 ] && [ -f "$repo/ab/x/kernels/new.cuh" ] &&
   [ ! -e "$repo/ab/x/kernels/other.cu" ]; then ok prepare_copies_the_branch_files
else bad prepare_copies_the_branch_files \
  "ab/x: $(cd "$repo" && find ab -type f 2>/dev/null | tr '\n' ' ')"; fi

if lab/gpu_ab.sh >/dev/null 2>&1; then bad usage_without_a_command_fails "exit 0"
else ok usage_without_a_command_fails; fi
cd "$root" || exit 1
echo "#mt-counts $pass $fail 0"
[ "$fail" -eq 0 ]
