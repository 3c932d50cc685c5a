"""vllm_sources.py — the real MoE kernel files of vLLM and SGLang (fetched by `make vllm-sources`
into build/third_party, never committed) imported without the rest of their packages: every other
module they import is a stub whose attributes are falsy no-ops (a stub called with one function
returns it: a decorator), but for the few names the kernels' launchers use, which are given real
values here (Triton itself, vLLM's device name for its tuned configs, its platform checks).

The kernel file is loaded under its own package path (vllm.model_executor.layers.fused_moe.
fused_moe), from its path inside build/third_party/<project>-<version>/, so that Triton's line table
names it as an installed copy would. Used by tests/gpu/vllm_child.py and bench/bench_moe_vllm.py.
Not a test itself.
"""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THIRD_PARTY = os.path.join(ROOT, os.environ.get("MT_BUILD", "build"), "third_party")
VLLM = "0.33.0"  # the version the launch door's table was checked against
VLLM_OLD = "0.8.5"  # fused_moe_kernel before b_bias: a layout outside the table
SGLANG = "0.5.23"
VLLM_KERNEL = "vllm/model_executor/layers/fused_moe/fused_moe.py"
SGLANG_KERNEL = "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"


class Stub:
    """Any name of a module that is not there: falsy, callable, subscriptable, every attribute
    another stub. Called with one function (a decorator), it returns the function."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return Stub(f"{self._name}()")

    def __getitem__(self, key):
        return Stub(f"{self._name}[]")

    def __bool__(self):
        return False

    def __or__(self, other):  # a type annotation X | None
        return self

    __ror__ = __or__

    def __iter__(self):
        return iter(())

    def __repr__(self):
        return f"<stub {self._name}>"


class StubModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self.__name__}.{attr}")


def device_name():
    import torch
    return torch.cuda.get_device_name().replace(" ", "_")


def real_values(name):
    """Names of a stubbed module that the launchers use: the real thing, not a stub."""
    import triton
    import triton.language as tl
    return {
        "vllm.triton_utils": {"triton": triton, "tl": tl},
        "vllm.utils.platform_utils": {"get_device_name_as_file_name": device_name},
        "vllm.envs": {"VLLM_BATCH_INVARIANT": False, "VLLM_TUNED_CONFIG_FOLDER": None},
        "vllm.model_executor.layers.fused_moe.utils": {
            "resolve_moe_use_td": lambda: False,
            "warn_if_moe_use_td_ineffective": lambda *a, **k: None,
            "enable_swap_ab": lambda *a: False},
        "vllm.utils.math_utils": {"next_power_of_2": lambda n: 1 << (max(n, 1) - 1).bit_length()},
    }.get(name, {})


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stubs for every module under `roots` but the ones loaded from files."""

    def __init__(self, roots):
        self.roots = roots

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots and name not in sys.modules:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = StubModule(spec.name)
        m.__path__ = []
        for k, v in real_values(spec.name).items():
            setattr(m, k, v)
        return m

    def exec_module(self, module):
        pass


def load(project, version, rel, modname):
    """The kernel file `rel` of project-version as module `modname`, its imports stubbed."""
    path = os.path.join(THIRD_PARTY, f"{project}-{version}", rel)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} missing: run `make vllm-sources` on a machine that "
                                "reaches the package registry, and carry build/third_party")
    if not any(isinstance(f, StubFinder) for f in sys.meta_path):
        sys.meta_path.append(StubFinder({"vllm", "sglang", "sgl_kernel"}))
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    spec.loader.exec_module(module)
    return module


def vllm(version=VLLM):
    return load("vllm", version, VLLM_KERNEL, "vllm.model_executor.layers.fused_moe.fused_moe")


def sglang():
    return load("sglang", SGLANG, SGLANG_KERNEL, "sglang.kernels.ops.moe.fused_moe_triton_kernels")


def moe_align(topk_ids, block_m, experts):
    """vLLM's moe_align_block_size (its CUDA op; vllm/_custom_ops), written with torch ops: the
    ids (token * top_k + j) of each expert in id order, padded to whole blocks of block_m with the
    pad id numel; each block's expert; the slots in use. sorted_token_ids has vLLM's length,
    numel + experts * (block_m - 1), cut to numel * block_m when numel < experts."""
    import torch
    flat = topk_ids.flatten().to(torch.int64)
    numel, dev = flat.numel(), flat.device
    counts = torch.bincount(flat, minlength=experts)
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    size = numel + experts * (block_m - 1)
    if numel < experts:
        size = min(numel * block_m, size)
    order = torch.argsort(flat, stable=True)
    rank = torch.arange(numel, device=dev) - (torch.cumsum(counts, 0) - counts)[flat[order]]
    sorted_ids = torch.full((size,), numel, dtype=torch.int32, device=dev)
    sorted_ids[starts[flat[order]] + rank] = order.to(torch.int32)
    blocks = (size + block_m - 1) // block_m
    expert_ids = torch.full((blocks,), -1, dtype=torch.int32, device=dev)
    block_expert = torch.repeat_interleave(torch.arange(experts, device=dev), padded // block_m)
    expert_ids[:block_expert.numel()] = block_expert.to(torch.int32)
    total = torch.tensor([int(padded.sum())], dtype=torch.int32, device=dev)
    return sorted_ids, expert_ids, total


def dispatch(topk_ids, block_m, experts):
    """vLLM's dispatch of topk_ids (tokens x top_k) as fused_experts() picks it: its naive one (one
    (token, expert) pair a block: sorted ids None, each pair's expert, numel * block_m slots) where
    num_tokens * top_k * 4 <= experts, else moe_align_block_size's (moe_align above)."""
    import torch
    if topk_ids.numel() * 4 <= experts:
        return None, topk_ids.view(-1), torch.tensor([topk_ids.numel() * block_m],
                                                     dtype=torch.int32, device=topk_ids.device)
    return moe_align(topk_ids, block_m, experts)


def invoke(fm, a, b, c, topk_w, sorted_ids, expert_ids, padded, mul, top_k, config):
    """One launch of fused_moe_kernel through vLLM's own launcher (fm: vllm()), BF16, unquantized,
    no bias."""
    import triton.language as tl
    fm.invoke_fused_moe_triton_kernel(a, b, c, None, None, topk_w, sorted_ids, expert_ids, padded,
                                      mul, top_k, config, compute_type=tl.bfloat16,
                                      use_fp8_w8a8=False, use_int8_w8a8=False,
                                      use_int8_w8a16=False, use_int4_w4a16=False,
                                      per_channel_quant=False, block_shape=None, B_bias=None)
