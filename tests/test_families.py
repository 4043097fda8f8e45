"""Tracer reach: every model family of the README's 'Supported models' table traces (forward
and training step) and predicts on a tiny config; Whisper and ViT include their encoders;
top-k mixture-of-experts follows the stated routing; unsupported inputs and zero layers are
clear errors."""
import math
import warnings

import numpy as np
import pytest

from nslib.model.moe import expert_tokens
from nslib.model.trace import trace
from nslib.model.step import Step

H, FF, V = 32, 64, 100
DECODER = dict(hidden_size=H, intermediate_size=FF, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=2, vocab_size=V, max_position_embeddings=128)
WHISPER = dict(model_type="whisper", d_model=H, encoder_layers=1, decoder_layers=1,
               encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=FF,
               decoder_ffn_dim=FF, vocab_size=V, num_mel_bins=8, max_source_positions=16,
               max_target_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=1,
               decoder_start_token_id=1, begin_suppress_tokens=None, suppress_tokens=None)
VIT = dict(model_type="vit", hidden_size=H, num_hidden_layers=1, num_attention_heads=2,
           intermediate_size=FF, image_size=32, patch_size=8, num_channels=3)
MIXTRAL = dict(model_type="mixtral", **DECODER, num_local_experts=4, num_experts_per_tok=2)
QWEN2_MOE = dict(model_type="qwen2_moe", **DECODER, num_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=32, shared_expert_intermediate_size=FF)
DEEPSEEK = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                n_shared_experts=1, first_k_dense_replace=0, kv_lora_rank=16,
                qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1)
FAMILIES = {
    "llama": dict(model_type="llama", **DECODER),
    "mistral": dict(model_type="mistral", **DECODER),
    "qwen2": dict(model_type="qwen2", **DECODER),
    "gemma": dict(model_type="gemma", head_dim=16, **DECODER),
    "phi3": dict(model_type="phi3", pad_token_id=0, **DECODER),
    "t5": dict(model_type="t5", d_model=H, d_ff=FF, num_layers=1, num_decoder_layers=1,
               num_heads=2, d_kv=16, vocab_size=V),
    "whisper": WHISPER,
    "vit": VIT,
    "mixtral": MIXTRAL,
    "qwen2_moe": QWEN2_MOE,
    "deepseek_v2": dict(model_type="deepseek_v2", **DECODER, **DEEPSEEK, q_lora_rank=None),
    "deepseek_v3": dict(model_type="deepseek_v3", **DECODER, **DEEPSEEK, q_lora_rank=16),
}
BATCH, SEQ = 2, 16
VIT_SEQ = (32 // 8) ** 2 + 1          # 16 patches + the class token


def _trace(name, mode, **kw):
    seq = VIT_SEQ if name == "vit" else SEQ
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no unmapped aten op, no seq warning
        return trace(FAMILIES[name], Step(BATCH, seq, mode, **kw))


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("mode", ["inf", "train"])
def test_family_traces(name, mode):
    df = _trace(name, mode)
    assert (df["cls"] == "linear").any() and (df["cls"] == "softmax").any()
    assert (df["layer"] >= 0).any()
    assert set(df["phase"]) == ({"fw", "bw"} if mode == "train" else {"fw"})
    assert np.isfinite(df["flops"]).all() and (df["bytes"] > 0).all()


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "gemma", "phi3", "t5",
                                  "whisper", "vit", "mixtral", "qwen2_moe"])
def test_family_predicts(data_dir, name):
    from nslib.model.predict import predict_model
    from nslib.predictors.gpu_range import DatasheetRangeWarning
    seq = VIT_SEQ if name == "vit" else SEQ
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DatasheetRangeWarning)
        frame, summ = predict_model("V100", FAMILIES[name], Step(BATCH, seq, "train"), "roofline")
    assert summ["fw_ms"] > 0 and summ["bw_ms"] > 0 and len(frame) == summ["n_kernels"]
    assert summ["warnings"] == []           # the V100 is a training GPU


def test_whisper_runs_its_encoder_on_audio_features():
    df = _trace("whisper", "inf")
    enc = df[df["module"].str.startswith("model.encoder")]
    dec = df[df["module"].str.startswith("model.decoder")]
    assert len(enc) > 10 and len(dec) > 10
    # conv1 over the 30 s window: 2 * max_source_positions frames, kernel 3 over 8 mel bins
    conv = df[df["aten"].str.contains("convolution")]
    assert conv[["cls", "M", "N", "K"]].values.tolist() == [
        ["linear", BATCH * 32, 8 * 3, H], ["linear", BATCH * 16, H * 3, H]]
    # the encoder's self-attention covers the 16 positions, the decoder's the 16 tokens,
    # the cross-attention is decoder tokens x encoder positions
    soft = df[df["cls"] == "softmax"]
    assert set(soft["H"]) == {16.0}
    assert (enc["cls"] == "softmax").sum() == 1 and (dec["cls"] == "softmax").sum() == 2


def test_vit_runs_its_encoder_on_pixels():
    df = _trace("vit", "inf")
    conv = df[df["aten"].str.contains("convolution")]
    assert conv[["cls", "M", "N", "K"]].values.tolist() == [["linear", BATCH * 16, 3 * 64, H]]
    soft = df[df["cls"] == "softmax"]
    assert soft["H"].tolist() == [VIT_SEQ]
    block = df[df["layer"] == 0]            # the transformer encoder block runs on the patches
    lin = block[block["cls"] == "linear"]
    assert len(lin) == 6 and (lin["M"] == BATCH * VIT_SEQ).all()
    with pytest.warns(UserWarning, match=f"seq=64 is not used.*{VIT_SEQ} tokens|{VIT_SEQ} tokens"):
        trace(VIT, Step(BATCH, 64, "inf"))


def _expert_gemms(df):
    e = df[(df["cls"] == "linear") & df["module"].str.endswith("mlp.experts")]
    return e[["M", "N", "K"]].to_numpy()


def test_moe_balanced_routing_by_hand():
    df = _trace("mixtral", "inf")
    tokens, k, experts = BATCH * SEQ, 2, 4
    per = tokens * k // experts
    # per expert: gate-up (tokens x H @ H x 2FF), down (tokens x FF @ FF x H)
    assert _expert_gemms(df).tolist() == [[per, H, 2 * FF], [per, FF, H]] * experts
    router = df[df["module"].str.endswith("mlp.gate") & (df["cls"] == "linear")]
    assert router[["M", "N", "K"]].values.tolist() == [[tokens, H, experts]]


def test_moe_imbalance_keeps_the_work_and_moves_the_shapes():
    even = _expert_gemms(_trace("mixtral", "inf"))
    skew = _expert_gemms(_trace("mixtral", "inf", imbalance=2.0))
    flops = lambda g: float((g[:, 0] * g[:, 1] * g[:, 2]).sum())  # noqa: E731
    assert flops(even) == flops(skew)
    assert skew[0, 0] == 2 * even[0, 0] and skew[:, 0].max() == BATCH * SEQ


def test_moe_shared_experts_are_traced():
    q = _trace("qwen2_moe", "inf")
    assert q["module"].str.contains("shared_expert").any()
    d = _trace("deepseek_v3", "train")
    assert d["module"].str.contains("shared_experts").any()
    assert (_expert_gemms(d[d["phase"] == "fw"])[:, 0] == BATCH * SEQ * 2 // 4).all()


def test_expert_tokens():
    assert expert_tokens(10, 2, 4) == [5, 5, 5, 5]
    assert expert_tokens(7, 1, 3) == [3, 2, 2]
    assert expert_tokens(32, 2, 4, 2.0) == [32, 11, 11, 10]
    assert expert_tokens(32, 2, 4, 100.0)[0] == 32            # at most every token once
    for f in (1.0, 1.5, 3.0):
        assert sum(expert_tokens(1000, 8, 64, f)) == 8000
    for bad in (0.5, math.nan, math.inf, "2", True):
        with pytest.raises(ValueError, match="imbalance"):
            expert_tokens(10, 2, 4, bad)


@pytest.mark.parametrize("config, match", [
    (dict(FAMILIES["llama"], num_hidden_layers=0), r"LlamaForCausalLM has no transformer layers "
                                                   r"\(num_hidden_layers = 0\)"),
    (dict(FAMILIES["t5"], num_decoder_layers=0), "num_decoder_layers = 0"),
    (dict(model_type="wav2vec2", hidden_size=H, num_hidden_layers=1, num_attention_heads=2,
          intermediate_size=FF, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
          num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, vocab_size=32),
     "Wav2Vec2ForPreTraining takes 'input_values'.*not supported"),
    (dict(VIT, image_size=None), "transformers rejects the .vit. config.*image_size"),
])
def test_unsupported_and_empty_models_are_named_errors(config, match):
    with pytest.raises(ValueError, match=match):
        trace(config, Step(1, 8, "inf"))


def test_bad_imbalance_is_an_error_before_tracing():
    with pytest.raises(ValueError, match="imbalance must be a finite number >= 1"):
        trace(MIXTRAL, Step(1, 8, "inf", imbalance=0.5))


def test_trace_failure_names_architecture_and_module(monkeypatch):
    import transformers.models.mistral.modeling_mistral as mm

    def boom(self, *a, **k):
        raise RuntimeError("something data-dependent")
    monkeypatch.setattr(mm.MistralMLP, "forward", boom)
    with pytest.raises(ValueError, match=r"tracing MistralForCausalLM \(model_type 'mistral'\) "
                                         r"failed in model.layers.0.mlp \(MistralMLP\)"):
        trace(FAMILIES["mistral"], Step(1, 8, "inf"))
