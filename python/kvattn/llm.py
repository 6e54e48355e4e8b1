"""Offline generation with vLLM's surface: ``LLM(model_dir).generate(prompts, SamplingParams(...))``.

The engine is kvattn's C++ one (``kvattn::model::LLM``): its scheduler (continuous batching,
chunked prefill, preemption) drives the model runner, whose attention goes through kvattn's
backend.  Results are ``RequestOutput`` objects: ``out.outputs[0].text``,
``out.outputs[0].token_ids``, ``out.outputs[0].finish_reason`` as in vLLM.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

from . import _kvattn

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]

SamplingParams = _kvattn.SamplingParams
RequestOutput = _kvattn.RequestOutput
CompletionOutput = _kvattn.CompletionOutput

PromptType = Union[str, dict]


def _memory(value: Union[int, str, None]) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    return _kvattn.parse_memory_size(value)


class LLM:
    """vLLM's ``LLM`` for a Hugging Face model directory.

    Keyword arguments use vLLM's engine-argument names: ``dtype`` ("auto", "float32",
    "bfloat16", "float16"), ``kv_cache_dtype``, ``max_model_len``, ``max_num_seqs``,
    ``max_num_batched_tokens``, ``gpu_memory_utilization``, ``seed``, ``block_size``,
    ``logprobs_mode`` and ``skip_tokenizer_init`` (token-id prompts only, no text); kvattn
    adds ``device`` ("cpu", "cuda:N"), ``kv_cache_memory`` (bytes or "64MiB") and ``layout``
    (the KV cache layout).  On CPU the compute is float32; on CUDA ``dtype="auto"`` is the
    checkpoint's torch_dtype (float32 checkpoints in bfloat16) and the KV cache gets
    ``gpu_memory_utilization`` of the device's memory minus what is in use before loading, the
    weights and a profiling step's activations, unless ``kv_cache_memory`` is given.
    """

    def __init__(self, model: str, *, device: str = "cpu", dtype: str = "auto",
                 kv_cache_dtype: str = "auto", layout: str = "auto",
                 kv_cache_memory: Union[int, str, None] = None,
                 gpu_memory_utilization: float = 0.9, max_model_len: int | None = None,
                 block_size: int = 16, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, seed: int = 0,
                 logprobs_mode: str = "raw_logprobs", skip_tokenizer_init: bool = False) -> None:
        self._llm = _kvattn._LLM(
            str(model), device=device, dtype=dtype, kv_cache_dtype=kv_cache_dtype, layout=layout,
            kv_cache_memory=_memory(kv_cache_memory),
            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len or 0,
            block_size=block_size, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, seed=seed, logprobs_mode=logprobs_mode,
            skip_tokenizer_init=skip_tokenizer_init)

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """One ``RequestOutput`` per prompt, in order.  A prompt is a string or a dict with
        ``"prompt_token_ids"`` (vLLM's TokensPrompt) or ``"prompt"``."""
        del use_tqdm  # accepted for vLLM compatibility; nothing is printed
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:  # vLLM: the model's generation_config.json defaults
            sampling_params = self._llm.default_sampling_params
        params = [sampling_params] if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        if len(params) not in (1, len(prompts)):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts; "
                             "pass one, or one per prompt")
        if all(isinstance(p, str) for p in prompts):
            return self._llm.generate(prompts, params)
        ids: list[list[int]] = []
        for i, p in enumerate(prompts):
            ids.append(self._token_ids(i, p))
        return self._llm.generate_tokens(ids, params)

    def _token_ids(self, i: int, p: Any) -> list[int]:
        if isinstance(p, str):
            return self._llm.encode(p)
        if isinstance(p, dict) and "prompt_token_ids" in p:
            return [int(t) for t in p["prompt_token_ids"]]
        if isinstance(p, dict) and "prompt" in p:
            return self._llm.encode(str(p["prompt"]))
        raise ValueError(f"prompt {i} must be a string or a dict with 'prompt' or 'prompt_token_ids', "
                         f"got {type(p).__name__}")

    @property
    def last_stats(self) -> dict:
        """Totals of the last generate(): steps, tokens, preemptions, KV blocks, time."""
        return self._llm.last_stats
