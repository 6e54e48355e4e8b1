"""kvattn.LLM / kvattn.SamplingParams: vLLM's offline-generation surface over kvattn's engine,
on a generated Qwen3 test model (tests/model/make_test_model.py), checked against the
independent NumPy reference's greedy continuation (tests/model/reference_forward.py --greedy)."""
import json
import os
import subprocess
import sys

import pytest

import kvattn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_TESTS = os.path.join(ROOT, "tests", "model")


def make_model(tmp_path_factory, tokenizer, extra=()):
    d = tmp_path_factory.mktemp("llm") / "qwen3"
    subprocess.run([sys.executable, os.path.join(MODEL_TESTS, "make_test_model.py"), "--arch", "qwen3",
                    "--out", str(d), "--tokenizer", tokenizer, "--std", "0.15", "--seed", "5",
                    "--vocab-size", "512", *extra],
                   check=True, stdout=subprocess.DEVNULL)
    return str(d)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory, "none")


@pytest.fixture(scope="module")
def llm(model_dir):
    # A directory without a tokenizer: token-id prompts (vLLM's skip_tokenizer_init).
    return kvattn.LLM(model_dir, dtype="float32", max_model_len=128, kv_cache_memory="4MiB",
                      skip_tokenizer_init=True)


def test_sampling_params_have_vllms_names_and_defaults():
    p = kvattn.SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.max_tokens) == (1.0, -1, 1.0, 0.0, 16)
    assert (p.repetition_penalty, p.frequency_penalty, p.presence_penalty) == (1.0, 0.0, 0.0)
    assert p.seed is None and p.stop == [] and p.stop_token_ids == [] and not p.ignore_eos
    q = kvattn.SamplingParams(temperature=0.5, top_p=0.9, seed=3, max_tokens=4, stop=["\n"])
    assert (q.temperature, q.top_p, q.seed, q.max_tokens, q.stop) == (0.5, 0.9, 3, 4, ["\n"])
    with pytest.raises(ValueError, match="top_p must be in"):
        kvattn.SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        kvattn.SamplingParams(temperature=-1)
    with pytest.raises(NotImplementedError, match="one completion per prompt"):
        kvattn.SamplingParams(n=2)


def test_greedy_generation_matches_the_numpy_reference(llm, model_dir, tmp_path):
    ids = [3, 17, 42, 99, 7, 250, 31]
    params = kvattn.SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": ids}], params)
    assert len(outs) == 1
    out = outs[0].outputs[0]
    assert outs[0].prompt_token_ids == ids and outs[0].finished
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": [ids]}))
    ref = tmp_path / "greedy.json"
    subprocess.run([sys.executable, os.path.join(MODEL_TESTS, "reference_forward.py"), model_dir, str(prompts),
                    str(ref), "--greedy", "10"], check=True)
    want = json.loads(ref.read_text())
    # Equal until the reference's top-2 margin drops below 2e-3 (f32 against float64).
    for t, (got, exp, margin) in enumerate(zip(out.token_ids, want["tokens"][0], want["margins"][0])):
        if margin < 2e-3:
            break
        assert got == exp, f"token {t}: {got} != {exp} (margin {margin})"
    assert len(out.token_ids) == 10 and out.finish_reason == "length"


def test_batches_seeds_and_logprobs(llm):
    prompts = [{"prompt_token_ids": [5, 9, 2, 77]}, {"prompt_token_ids": list(range(10, 40))},
               {"prompt_token_ids": [400, 401]}]
    greedy = kvattn.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = llm.generate(prompts, greedy)
    assert [o.prompt_token_ids for o in outs] == [p["prompt_token_ids"] for p in prompts]
    assert all(len(o.outputs[0].token_ids) == 6 and o.outputs[0].text == "" for o in outs)
    # The same greedy request alone gives the same tokens as in the batch.
    alone = llm.generate(prompts[1], greedy)[0]
    assert alone.outputs[0].token_ids == outs[1].outputs[0].token_ids
    # Seeded sampling is reproducible and independent of the batch; different seeds differ.
    seeded = kvattn.SamplingParams(temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
    a = llm.generate(prompts[0], seeded)[0].outputs[0].token_ids
    b = llm.generate(prompts, seeded)[0].outputs[0].token_ids
    assert a == b
    other = kvattn.SamplingParams(temperature=1.0, seed=12, max_tokens=12, ignore_eos=True)
    assert llm.generate(prompts[0], other)[0].outputs[0].token_ids != a
    # Per-prompt parameters and logprobs (the sampled token first).
    outs = llm.generate(prompts[:2], [greedy, kvattn.SamplingParams(temperature=0, max_tokens=3, logprobs=2,
                                                                    ignore_eos=True)])
    assert len(outs[1].outputs[0].token_ids) == 3
    lps = outs[1].outputs[0].logprobs
    assert len(lps) == 3 and all(list(d)[0] == t for d, t in zip(lps, outs[1].outputs[0].token_ids))
    assert all(len(d) == 2 and max(d.values()) <= 0 for d in lps)
    assert llm.last_stats["num_generated_tokens"] == 9
    # Stop token ids end a request with finish_reason "stop" and the id as stop_reason.
    stop_at = outs[0].outputs[0].token_ids[2]
    first = outs[0].outputs[0].token_ids.index(stop_at)
    out = llm.generate(prompts[0], kvattn.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                                         stop_token_ids=[stop_at]))[0].outputs[0]
    assert out.token_ids == outs[0].outputs[0].token_ids[:first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at


def test_bad_prompts_are_clear_errors(llm):
    with pytest.raises(ValueError, match="not in the model's vocabulary"):
        llm.generate([{"prompt_token_ids": [1, 2, 10**9]}])
    with pytest.raises(ValueError, match="more than max_model_len 128"):
        llm.generate([{"prompt_token_ids": list(range(1, 200))}])
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        llm.generate(["a", "b", "c"], [kvattn.SamplingParams(), kvattn.SamplingParams()])
    with pytest.raises(ValueError, match="loaded without a tokenizer"):
        llm.generate("text needs a tokenizer")
    with pytest.raises(ValueError, match="stop strings but the model was loaded without a tokenizer"):
        llm.generate([{"prompt_token_ids": [1]}], kvattn.SamplingParams(stop=["x"]))


def test_gpu_memory_utilization_is_range_checked(model_dir):
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"--gpu-memory-utilization .* is outside \(0, 1\]"):
            kvattn.LLM(model_dir, gpu_memory_utilization=bad, skip_tokenizer_init=True)


@pytest.mark.skipif(not kvattn.cuda_available(), reason="no CUDA device, or kvattn built without CUDA")
def test_cuda_bf16_greedy_generation_matches_the_numpy_reference(tmp_path_factory, tmp_path):
    # head_dim 64: the CUDA attention kernels exist for head_dim 64, 128 and 256.
    model_dir = make_model(tmp_path_factory, "none", ("--head-dim", "64"))
    ids = [3, 17, 42, 99, 7, 250, 31]
    llm = kvattn.LLM(model_dir, device="cuda", dtype="bfloat16", max_model_len=128, kv_cache_memory="4MiB",
                     skip_tokenizer_init=True)
    out = llm.generate([{"prompt_token_ids": ids}],
                       kvattn.SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0].outputs[0]
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": [ids], "positions": [[len(ids) - 1]]}))
    ref, exact, rounded = tmp_path / "greedy.json", tmp_path / "exact.bin", tmp_path / "bf16.bin"
    script = os.path.join(MODEL_TESTS, "reference_forward.py")
    subprocess.run([sys.executable, script, model_dir, str(prompts), str(ref), "--greedy", "10"], check=True)
    subprocess.run([sys.executable, script, model_dir, str(prompts), str(exact)], check=True)
    subprocess.run([sys.executable, script, model_dir, str(prompts), str(rounded), "--round", "bf16"], check=True)
    import numpy as np
    # bf16 compute: twice what rounding the reference's activations to bf16 moves its logits.
    deviation = np.abs(np.fromfile(rounded, dtype=np.float64) - np.fromfile(exact, dtype=np.float64)).max()
    bound = 2 * float(deviation) + 1e-3
    want = json.loads(ref.read_text())
    for t, (got, exp, margin) in enumerate(zip(out.token_ids, want["tokens"][0], want["margins"][0])):
        if margin < 2 * bound:
            break
        assert got == exp, f"token {t}: {got} != {exp} (margin {margin}, bound {bound})"
    assert len(out.token_ids) == 10 and out.finish_reason == "length"


def test_text_prompts_and_stop_strings(tmp_path_factory):
    d = make_model(tmp_path_factory, "generate")
    llm = kvattn.LLM(d, dtype="float32", max_model_len=128, kv_cache_memory="4MiB")
    greedy = kvattn.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = ["Hello, world", "The quick brown fox"]
    outs = llm.generate(prompts, greedy)
    assert [o.prompt for o in outs] == prompts
    assert outs[0].prompt_token_ids == llm._llm.encode(prompts[0])
    text = outs[0].outputs[0].text
    assert len(outs[0].outputs[0].token_ids) == 12 and text
    # A stop string taken from the generated text: the text ends right before its first match.
    stop = text[len(text) // 2:len(text) // 2 + 2]
    cut = llm.generate(prompts[0], kvattn.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                         stop=[stop]))[0].outputs[0]
    assert cut.text == text[:text.index(stop)]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.token_ids == outs[0].outputs[0].token_ids[:len(cut.token_ids)]
    # No SamplingParams: vLLM's defaults under generation_config.json's (which sets none here).
    d = llm._llm.default_sampling_params
    assert (d.temperature, d.top_p, d.top_k, d.max_tokens) == (1.0, 1.0, -1, 16)
    out = llm.generate(prompts[0])[0].outputs[0]
    assert 1 <= len(out.token_ids) <= 16
