#!/usr/bin/env python3
"""vllm_fetch.py — `make vllm-sources` (a machine with the package registry): the real MoE kernel
sources of pinned vLLM and SGLang releases, for the launch door's GPU test and bench, which the
device machine cannot download. No code of those projects enters the repository: the wheels are
fetched from the registry into build/wheels, and only the files the tests need are extracted into
build/third_party/<project>-<version>/, at their paths inside the package (the Triton line table
then names them as in an installed copy, which is how the launch door tells vLLM's kernel from
SGLang's):

  vLLM 0.33.0   vllm/model_executor/layers/fused_moe/fused_moe.py (fused_moe_kernel and its
                launcher, invoke_fused_moe_triton_kernel) and the tuned configs beside it for
                Qwen3-30B-A3B's and DeepSeek-V3's experts (E=128,N=768 and E=256,N=2048)
  vLLM 0.8.5    the same kernel before b_bias joined its parameters: a layout outside the door's
                table, which must pass through unchanged
  SGLang 0.5.23 sglang/kernels/ops/moe/fused_moe_triton_kernels.py: the kernel of the same name

    python3 tests/gpu/vllm_fetch.py OUT_DIR
"""
import os
import subprocess
import sys
import zipfile

RELEASES = [
    ("vllm", "0.33.0", ["vllm/model_executor/layers/fused_moe/fused_moe.py"],
     ["E=128,N=768,device_name=", "E=256,N=2048,device_name="]),
    ("vllm", "0.8.5", ["vllm/model_executor/layers/fused_moe/fused_moe.py"], []),
    ("sglang", "0.5.23", ["sglang/kernels/ops/moe/fused_moe_triton_kernels.py"], []),
]


def wheel(project, version, cache):
    """The release's wheel in cache, downloaded once (pip's own cache is not assumed)."""
    os.makedirs(cache, exist_ok=True)
    have = [f for f in os.listdir(cache)
            if f.startswith(f"{project}-{version}-") and f.endswith(".whl")]
    if not have:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary=:all:", f"{project}=={version}", "-d", cache], check=True)
        have = [f for f in os.listdir(cache)
                if f.startswith(f"{project}-{version}-") and f.endswith(".whl")]
    return os.path.join(cache, have[0])


def extract(project, version, files, configs, out, cache):
    dest = os.path.join(out, f"{project}-{version}")
    with zipfile.ZipFile(wheel(project, version, cache)) as z:
        names = z.namelist()
        config_dir = os.path.dirname(files[0]) + "/configs/"
        want = list(files) + [n for n in names if n.startswith(config_dir) and
                              any(os.path.basename(n).startswith(c) for c in configs) and
                              ",dtype=" not in n and ",block_shape=" not in n]
        for name in want:
            if name not in names:
                sys.exit(f"vllm_fetch.py: {project} {version} has no {name}")
            z.extract(name, dest)
    print(f"{project} {version}: {len(want)} files into {dest}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().split("\n\n")[-1].strip())
    out = sys.argv[1]
    cache = os.path.join(os.path.dirname(os.path.abspath(out)), "wheels")
    for project, version, files, configs in RELEASES:
        extract(project, version, files, configs, out, cache)


if __name__ == "__main__":
    main()
