"""The int4 recipes' shared pieces (export/int4.py, export/calibration.py): the scale search, the plan, the
calibration set kept apart from every text fidelity is measured on. No export here: the recipes run end to end in
test_quantize.py / test_litert_quant.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mtpkit.errors import UsageError
from mtpkit.export import calibration, int4


def _rtn(rows: np.ndarray, block: int) -> np.ndarray:
    """int4-rtn's values: the block's absmax / 7 as a float16 scale."""
    blocks = rows.reshape(len(rows), -1, block)
    scale = (np.abs(blocks).max(axis=2) / np.float32(7)).astype(np.float16).astype(np.float32)
    return (np.clip(np.rint(blocks / scale[..., None]), -8, 7) * scale[..., None]).reshape(rows.shape)


def test_searched_scales_never_lose_to_round_to_nearest_and_fit_the_format():
    rng = np.random.default_rng(0)
    rows = rng.standard_t(4, size=(64, 256)).astype(np.float32)  # heavy tails: clipping the extreme can pay
    importance = rng.gamma(0.5, size=256).astype(np.float32)
    for weight in (None, importance):
        codes, scales = int4.encode(rows, 32, weight)
        assert codes.dtype == np.int8 and codes.min() >= -8 and codes.max() <= 7
        assert scales.dtype == np.float16 and (scales > 0).all() and scales.shape == (64, 8)
        w = np.ones(256, np.float32) if weight is None else int4._normalised(weight)
        err = lambda values: float((np.square(values - rows) * w).sum())  # noqa: E731
        searched, rtn = err(int4.decode(codes, scales)), err(_rtn(rows, 32))
        assert searched <= rtn
    assert searched < 0.95 * rtn  # and on heavy-tailed rows, clearly better


def test_rows_are_independent_and_zero_blocks_stay_zero():
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(10, 64)).astype(np.float32)
    rows[3, :32] = 0
    codes, scales = int4.encode(rows, 32)
    part_codes, part_scales = int4.encode(rows[2:7], 32)
    assert (part_codes == codes[2:7]).all() and (part_scales == scales[2:7]).all()
    assert not codes[3, :32].any() and scales[3, 0] > 0  # XNNPACK refuses a zero scale
    with pytest.raises(ValueError, match="not a multiple"):
        int4.encode(rows[:, :48], 32)


def test_onnx_packing_of_searched_codes_reads_back_through_matmulnbits_layout():
    from mtpkit.export.backends.onnx.embedding import dequantize_blockwise
    from mtpkit.export.backends.onnx.stream import _searched

    rng = np.random.default_rng(2)
    w = rng.normal(size=(80, 24)).astype(np.float32)  # [K, N], K not a whole number of blocks: padded
    packed, scales = _searched(w, 32, None)
    assert packed.shape == (24, 3, 16) and scales.shape == (24, 3) and scales.dtype == np.float32
    back = dequantize_blockwise(packed, scales, 4, 32, 80)  # [N, K], zero point 8
    codes, fp16 = int4.encode(np.pad(w.T, ((0, 0), (0, 16))), 32)
    assert np.array_equal(back, int4.decode(codes, fp16)[:, :80])


@pytest.mark.parametrize("name", ["model.model.layers.3.mlp.up_proj.weight.T",
                                  "w:model.model.language_model.layers.3.mlp.up_proj.weight",
                                  "model.language_model.layers.3.mlp.up_proj"])
def test_one_key_for_a_weight_in_onnx_litert_and_pytorch(name):
    assert int4.weight_key(name) == "layers.3.mlp.up_proj"


def test_the_plan_keeps_the_adapters_tensors_at_8_bits_and_rtn_keeps_none():
    from mtpkit.export.models import gemma4_text
    from mtpkit.export.recipes import recipe

    plan = int4.plan(recipe("int4"), gemma4_text.INT4_KEEP_8BIT, {"layers.0.mlp.up_proj": np.ones(4)})
    assert plan.searched and plan.bits("model.lm_head.weight") == 8
    assert plan.bits("w:model.model.language_model.embed_tokens.weight") == 8
    assert plan.bits("model.model.layers.0.self_attn.v_proj.weight.T") == 8
    assert plan.bits("model.model.layers.0.mlp.up_proj.weight.T") == 4
    assert plan.bits("model.model.embed_tokens_per_layer.weight") == 4  # the PLE path follows --ple-quant
    assert plan.importance_of("model.model.layers.0.mlp.up_proj.weight.T") is not None
    rtn = int4.plan(recipe("int4-rtn"), gemma4_text.INT4_KEEP_8BIT, {"layers.0.mlp.up_proj": np.ones(4)})
    assert not rtn.searched and rtn.bits("model.lm_head.weight") == 4 and not rtn.importance
    with pytest.raises(ValueError, match="needs a plan for the target"):
        int4.require_plan(recipe("int4"), None, "target")
    int4.require_plan(recipe("int4-rtn"), None, "target")  # round-to-nearest needs none


def _eval_texts() -> list[str]:
    from mtpkit.export.reference import LONG_TEXT, PROMPTS
    from mtpkit.tiny.demo import heldout_prompts

    return [t for _, t in PROMPTS] + [LONG_TEXT] + [t for _, t in heldout_prompts()]


def test_the_built_in_calibration_shares_no_prompt_with_what_fidelity_is_measured_on():
    """Reference prompts (the export's gate), LONG_TEXT (the long reference prompt), the trained pair's held-out
    prompts (demo, quant report): none is a calibration prompt, inside one, or holds one; no 40-character run of
    calibration text appears in them either."""
    evals = _eval_texts()
    assert len(evals) > 10
    for cal in calibration.BUILT_IN:
        for text in evals:
            assert cal != text and cal not in text and text.strip() not in cal
            runs = {cal[i:i + 40] for i in range(0, max(1, len(cal) - 40), 10)}
            assert not any(run in text for run in runs)


def _word_level_tokenizer(folder, words: list[str]):
    """A word-level tokenizer with <unk>, as some Gemma 4 fine-tunes ship: most text becomes runs of <unk>."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from mtpkit.tiny.make import SPECIAL_TOKENS

    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *words])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.save(str(folder / "tokenizer.json"))
    return tok


def _jsonl(path, *rows) -> object:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_calibration_file_holding_a_reference_prompt_is_refused_with_its_text_quoted(tmp_path):
    from mtpkit.export.reference import PROMPTS
    from mtpkit.tiny.make import build_tokenizer

    build_tokenizer().save(str(tmp_path / "tokenizer.json"))
    code = dict(PROMPTS)["code"]
    good = _jsonl(tmp_path / "good.jsonl", {"text": "something else entirely"}, {"ids": [2, 5, 6, 7]},
                  {"text": "Hi there"})  # "Hi" is a reference prompt, but only equal text counts for short ones
    calibration.check_file(good, tmp_path / "tokenizer.json", 32)
    prompts, record = calibration.load(good, lambda t: [ord(c) for c in t], 2)
    assert record["prompts"] == 3 and record["source"] == str(good) and prompts[1] == [2, 5, 6, 7]
    bad = _jsonl(tmp_path / "bad.jsonl", {"text": "fine"}, {"text": f"intro {code} outro"})
    with pytest.raises(UsageError, match=r"line 2 contains the reference prompt 'def fibonacci\(n\)"):
        calibration.check_file(bad, tmp_path / "tokenizer.json", 32)
    ids = build_tokenizer().encode(code, add_special_tokens=False).ids
    with pytest.raises(UsageError, match="line 1 contains the reference prompt"):  # the same text given as ids
        calibration.check_file(_jsonl(tmp_path / "ids.jsonl", {"ids": [2, 9, *ids, 9]}), tmp_path / "tokenizer.json", 32)
    with pytest.raises(UsageError, match=r"line 1: expected"):
        calibration.load(_jsonl(tmp_path / "broken.jsonl", {"txt": 1}), str, 2)


def test_runs_of_unknown_ids_never_match_a_reference_prompt(tmp_path):
    """On a word-level tokenizer the reference prompts are mostly <unk>: a calibration file of <unk> runs, or of
    other text that maps to <unk>, is not a reference prompt; the reference's own words still are."""
    tok = _word_level_tokenizer(tmp_path, ["the", "lazy", "dog", "river", "bends"])
    unk = tok.token_to_id("<unk>")
    fine = _jsonl(tmp_path / "fine.jsonl", {"ids": [2] + [unk] * 40}, {"text": "A quick brown cat naps by the river."},
                  {"ids": [2, *tok.encode("jumps over the lazy dog and the river bends", add_special_tokens=False).ids]})
    calibration.check_file(fine, tmp_path / "tokenizer.json", 32)
    prose = "The quick brown fox jumps over the lazy dog. "
    with pytest.raises(UsageError, match="contains the reference prompt 'The quick brown fox"):
        calibration.check_file(_jsonl(tmp_path / "bad.jsonl", {"text": "so: " + prose}), tmp_path / "tokenizer.json", 32)


def test_the_built_in_set_is_windowed_spread_and_outnumbers_the_widest_compensated_input():
    """The built-in text is cut into windows (not at MAX_TOKENS), taken round-robin over its documents up to
    BUILT_IN_TOKENS: on a byte-level tokenizer every document's first window is in, and the tokens are more than
    E4B's 2560 gate / up input channels (Gemma's tokenizer: every window, tools/calibration_tokens.py), so the
    default --quant int4 compensates at every published shape."""
    encode = lambda text: list(text.encode())  # noqa: E731
    prompts, record = calibration.load(None, encode, 2)
    assert record["tokens"] == sum(len(p) for p in prompts)
    assert 2560 < calibration.BUILT_IN_TOKENS <= record["tokens"] < calibration.BUILT_IN_TOKENS + calibration.MAX_TOKENS
    assert all(p[0] == 2 and 1 < len(p) <= calibration.MAX_TOKENS for p in prompts)
    firsts = [[2, *encode(t)][:calibration.MAX_TOKENS] for t in calibration.BUILT_IN]
    assert prompts[:len(firsts)] == firsts and len(calibration.BUILT_IN) >= 40
    coarse = lambda text: encode(text)[::4]  # noqa: E731  # a tokenizer with long tokens: all of the text
    every = [w for t in calibration.BUILT_IN for w in calibration.windows([2, *coarse(t)], 2)]
    assert calibration.load(None, coarse, 2)[1]["tokens"] == sum(map(len, every)) < calibration.BUILT_IN_TOKENS
    assert calibration.windows([2, *range(10, 10 + 2 * calibration.MAX_TOKENS - 1)], 2)[-1][0] == 2
    assert calibration.windows([7, 8, 9], 2) == [[7, 8, 9]]


def test_calibration_is_refused_without_int4_and_when_missing(tmp_path):
    from mtpkit.export.config import ExportConfig

    file = tmp_path / "cal.jsonl"
    file.write_text('{"text": "x y"}\n')
    with pytest.raises(UsageError, match="--calibration is read by --quant int4 / mobile only"):
        ExportConfig(target="t", drafter="d", out=tmp_path / "o", quant="int8", calibration=file)
    with pytest.raises(UsageError, match="--calibration is read by --quant int4 / mobile only"):  # a drafter-only int4 too
        ExportConfig(target="t", drafter="d", out=tmp_path / "o", quant="int8", drafter_quant="int4", calibration=file)
    with pytest.raises(UsageError, match="no such file"):
        ExportConfig(target="t", drafter="d", out=tmp_path / "o", quant="int4", calibration=tmp_path / "none.jsonl")
    assert ExportConfig(target="t", drafter="d", out=tmp_path / "o", quant="int4", calibration=file).calibration == file


def test_importance_is_the_mean_square_input_of_each_layer_linear():
    import torch

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up_proj = torch.nn.Linear(3, 2, bias=False)

        def forward(self, x):
            return self.up_proj(x)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 3)
            self.layers = torch.nn.ModuleList([Layer()])
            self.head = torch.nn.Linear(2, 10)  # outside the layers: no key, no importance

        def forward(self, ids):
            return self.head(self.layers[0](self.embed(ids)))

    model = Model()
    got = calibration.importance(model, [[1, 2, 3], [4]])
    x = model.embed(torch.tensor([1, 2, 3, 4])).detach().double()
    assert list(got) == ["layers.0.up_proj"]
    assert np.allclose(got["layers.0.up_proj"], x.square().mean(0).numpy(), rtol=1e-5)
    full = calibration.importance(model, [[1, 2, 3], [4]], full=("up_proj",))["layers.0.up_proj"]
    assert full.shape == (3, 3) and np.allclose(full, (x.T @ x / 4).numpy(), rtol=1e-5)  # the whole mean x x^T
    thin = calibration.without_thin_moments({"a": full, "b": np.ones(3, np.float32)}, tokens=2)
    assert np.allclose(thin["a"], np.diagonal(full)) and thin["b"] is not None  # 2 tokens < 3 channels: diagonal
    assert calibration.without_thin_moments({"a": full}, tokens=4)["a"].shape == (3, 3)


@pytest.mark.parametrize("variant", ["e2b_gemma4_centroid", "e4b_text_dense_kv_eq"])
def test_batched_calibration_gives_each_windows_own_moments(tiny_checkpoints, variant):
    """Right-padded windows of unequal length, several per forward pass, against one window per pass: padding
    leaks into no real position, pad rows are dropped, the shared-input moments are reused correctly."""
    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.models import target_adapter

    adapter = target_adapter(source := resolve(str(tiny_checkpoints(variant)[0]), "target"))
    model = adapter.load(source)
    rng = np.random.default_rng(0)
    prompts = [[2, *rng.integers(3, 200, size=n).tolist()] for n in (40, 7, 63, 1, 25)]
    one = calibration.importance(model, prompts, adapter.INT4_COMPENSATE, batch=1)
    batched = calibration.importance(model, prompts, adapter.INT4_COMPENSATE, batch=3)
    assert set(one) == set(batched) and any(m.ndim == 2 for m in one.values())
    for key, m in one.items():
        assert np.allclose(batched[key], m, rtol=1e-4, atol=1e-6 * np.abs(m).max()), key
    q, o = (one[f"layers.0.self_attn.{w}_proj"] for w in "qo")
    assert np.array_equal(q, one["layers.0.self_attn.k_proj"]) and not np.allclose(q, o[:len(q)])


def _correlated_inputs(rng, tokens: int, width: int) -> np.ndarray:
    """Activations with strongly correlated channels, as a decoder's hidden states have."""
    mix = rng.normal(size=(width // 4, width)).astype(np.float32)
    return (rng.normal(size=(tokens, width // 4)) @ mix + 0.1 * rng.normal(size=(tokens, width))).astype(np.float32)


def test_compensated_codes_lower_the_layers_output_error_and_fit_the_format():
    rng = np.random.default_rng(3)
    x = _correlated_inputs(rng, 512, 128)
    moment = x.T @ x / len(x)
    rows = rng.normal(size=(48, 128)).astype(np.float32)
    codes, scales = int4.encode(rows, 32, moment)
    assert codes.dtype == np.int8 and codes.min() >= -8 and codes.max() <= 7
    assert scales.dtype == np.float16 and (scales > 0).all() and scales.shape == (48, 4)
    output_err = lambda values: float(np.square((values - rows) @ x.T).mean())  # noqa: E731
    diagonal = int4.decode(*int4.encode(rows, 32, np.diagonal(moment).copy()))
    assert output_err(int4.decode(codes, scales)) < 0.7 * output_err(diagonal)
    assert int4.label(4, 32, moment) == "int4/b32/gptq" and int4.label(4, 32, np.diagonal(moment)) == "int4/b32"


def _plain_gptq(rows, block, moment, bits=4):
    """GPTQ one column at a time, every error sent to all later columns at once: the lazy batch's reference."""
    lo, hi = int4.code_range(bits)
    grid = int4.SCALE_GRID if bits == 4 else int4.TWO_BIT_GRID
    weight = int4._normalised(np.diagonal(moment).copy()).reshape(1, -1, block)
    factor, w = int4._inverse_factor(moment.astype(np.float64)), rows.astype(np.float32).copy()
    codes, scales = np.empty(w.shape, np.int8), []
    for b, g in enumerate(range(0, w.shape[1], block)):
        scale = int4.best_scales(w[:, g:g + block].reshape(len(w), 1, block), weight[:, b:b + 1], grid, lo, hi)[:, 0]
        scales.append(scale)
        for j in range(g, g + block):
            codes[:, j] = np.clip(np.rint(w[:, j] / scale), lo, hi)
            w[:, j + 1:] -= np.outer((w[:, j] - codes[:, j] * scale) / factor[j, j], factor[j, j + 1:])
    return codes, np.stack(scales, 1)


@pytest.mark.parametrize("width,block,bits", [(320, 320, 4), (320, 320, 2), (256, 32, 4)])
def test_lazy_batched_compensation_is_column_by_column_gptq(width, block, bits):
    """One scale per channel (block = width) runs in batches of int4.LAZY columns, the last one short here (320 =
    128 + 128 + 64); float sums in another order may flip a rare rounding tie, nothing more."""
    rng = np.random.default_rng(5)
    x = _correlated_inputs(rng, 4 * width, width)
    moment = x.T @ x / len(x)
    rows = rng.normal(size=(40, width)).astype(np.float32)
    codes, scales = int4.encode(rows, block, moment, bits=bits)
    want_codes, want_scales = _plain_gptq(rows, block, moment, bits)
    assert np.mean(codes == want_codes) > 0.999
    assert np.allclose(scales.astype(np.float32), want_scales, rtol=1e-3)


def test_compensation_is_per_row_and_without_correlation_it_is_the_diagonal_search():
    rng = np.random.default_rng(4)
    rows = rng.standard_t(4, size=(20, 64)).astype(np.float32)
    moment = _correlated_inputs(rng, 256, 64)
    moment = moment.T @ moment / len(moment)
    whole = int4.encode(rows, 32, moment)
    for part in (slice(0, 7), slice(7, 20)):  # the LiteRT graft encodes a slice of rows at a time
        codes, scales = int4.encode(rows[part], 32, moment)
        assert np.array_equal(codes, whole[0][part]) and np.array_equal(scales, whole[1][part])
    diagonal = rng.gamma(0.5, size=64).astype(np.float32) + 0.1  # no correlation: nothing to compensate
    compensated, searched = int4.encode(rows, 32, np.diag(diagonal)), int4.encode(rows, 32, diagonal)
    assert np.array_equal(compensated[0], searched[0]) and np.array_equal(compensated[1], searched[1])


def test_the_tiny_pairs_held_out_text_is_not_calibration_text():
    """tools/heldout_text.py's windows (quant-report --heldout) share no 40-character run with the built-in set."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("heldout_text", Path(__file__).parents[1] / "tools/heldout_text.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    texts = module.windows(64, 900)
    assert len(texts) == 64 and len(set(texts)) == 64 and all(len(t) > 500 for t in texts)
    for cal in calibration.BUILT_IN:
        runs = {cal[i:i + 40] for i in range(0, max(1, len(cal) - 40), 10)}
        assert not any(run in text for run in runs for text in texts)


def test_calibration_tokens_tool_counts_the_built_in_set_against_the_published_widths(tool, tmp_path, capsys):
    from mtpkit.tiny.make import build_tokenizer

    build_tokenizer().save(str(tmp_path / "tokenizer.json"))
    assert tool("calibration_tokens").main([str(tmp_path / "tokenizer.json")]) == 0
    out = capsys.readouterr().out
    assert f"{len(calibration.BUILT_IN)} documents" in out and "E4B: gate / up read 2560 channels: compensated yes" in out
