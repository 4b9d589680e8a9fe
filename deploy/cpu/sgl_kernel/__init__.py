"""The two bookkeeping ops SGLang's CPU path takes from ``sgl_kernel``, in plain torch.

PyPI's ``sglang-kernel`` ships CUDA libraries only and does not import without
``libcuda.so.1``, yet SGLang 0.5.23 imports ``sgl_kernel`` on its CPU path
(``SGLANG_USE_CPU_ENGINE=1``): ``assign_req_to_token_pool_cpu``
(``srt/mem_cache/allocation.py``) and ``copy_all_layer_kv_cache_cpu``
(``kernels/ops/kvcache/cache_move.py``). This package, placed first on ``PYTHONPATH`` of a CPU
host's server, provides exactly those two with the meaning of SGLang's own triton kernels, and
nothing else: every other name fails loudly, naming itself, so a server that reaches for more
of the kernel (speculative decoding, AMX, quantised GEMMs) stops instead of computing wrongly.

It registers no ``torch.ops.sgl_kernel`` op on purpose: SGLang then sees no AMX
(``srt/utils/common.py`` ``cpu_has_amx_support``) and every layer takes its native-torch path,
as the real CPU kernel build does on a CPU without AMX. Everything else in the server is
SGLang's own code. Used by the real-server test tier and ``./dev real-demo`` (deploy/cpu/README.md).
"""

from __future__ import annotations

import ctypes

import torch

__version__ = "0.0.0+cpu-standin"

#: Imported at module level by SGLang's CPU path but called only with ``--speculative-*``.
_SPECULATIVE = (
    "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu",
    "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu", "rotate_input_ids_cpu",
    "build_draft_decode_metadata_cpu",
)


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new cache locations into its row of ``req_to_token``.

    For request ``r`` (in batch order) with offsets ``s..e``, the next ``e - s`` entries of
    ``out_cache_loc`` go to ``req_to_token[req_pool_indices[r], s:e]``, as SGLang's triton
    ``assign_req_to_token_pool`` does.
    """
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    taken = 0
    for row, s, e in zip(rows, starts, ends, strict=True):
        if not 0 <= s <= e <= pool_len:
            raise ValueError(
                f"assign_req_to_token_pool_cpu: offsets {s}..{e} outside 0..{pool_len}")
        n = e - s
        req_to_token[row, s:e] = out_cache_loc[taken : taken + n].to(req_to_token.dtype)
        taken += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """Copy row ``src_loc[i]`` to row ``tgt_loc[i]`` in every KV buffer.

    ``data_ptrs`` holds each buffer's base address and ``strides`` its row size in bytes, as
    SGLang's ``copy_all_layer_kv_cache_tiled`` reads them.
    """
    pairs = [(t, s) for t, s in zip(tgt_loc.tolist(), src_loc.tolist(), strict=True) if t != s]
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        for tgt, src in pairs:
            ctypes.memmove(base + tgt * stride, base + src * stride, stride)


def _missing(name: str):
    def refuse(*_args, **_kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: the CPU kernel stand-in (deploy/cpu/sgl_kernel) has no such op; "
            "it serves plain decoding only (no --speculative-*). Install SGLang's CPU kernel "
            "build (sgl-kernel/csrc/cpu) for this.")
    refuse.__name__ = name
    return refuse


for _name in _SPECULATIVE:
    globals()[_name] = _missing(_name)


def __getattr__(name: str):
    raise AttributeError(
        f"sgl_kernel.{name}: not provided by the CPU kernel stand-in (deploy/cpu/sgl_kernel), "
        "which has only assign_req_to_token_pool_cpu and copy_all_layer_kv_cache_cpu")
