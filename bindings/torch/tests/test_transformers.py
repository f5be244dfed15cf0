"""Tiny Transformers models built from configs (no download) on `tpu`:
CPU-equal outputs, a training step that matches CPU, and generate()
giving the CPU's tokens. The CPU fallback is off: native kernels only."""

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")


def llama():
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg)


def gpt2():
    # Dropout off: each device draws from its own generator, so dropout
    # masks differ between CPU and tpu (the RNG tests cover dropout).
    cfg = transformers.GPT2Config(
        vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(cfg)


def bert():
    cfg = transformers.BertConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForMaskedLM(cfg)


MODELS = {"llama": llama, "gpt2": gpt2, "bert": bert}


def pair(name):
    torch.manual_seed(0)
    cpu = MODELS[name]().eval()
    dev = MODELS[name]().eval()
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev.to("tpu")


IDS = torch.randint(1, 96, (2, 12), generator=torch.Generator().manual_seed(5))
MASK = torch.ones(2, 12, dtype=torch.long)
MASK[1, :3] = 0  # left padding on the second row


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_matches_cpu(name, mode, no_fallback):
    cpu, dev = pair(name)
    with torch.no_grad():
        ref = cpu(input_ids=IDS, attention_mask=MASK).logits
        out = dev(input_ids=IDS.to("tpu"), attention_mask=MASK.to("tpu")).logits
    torch.testing.assert_close(out.cpu(), ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_step_with_adamw_matches_cpu(name, no_fallback):
    cpu, dev = pair(name)
    cpu.train()
    dev.train()
    for model, d in ((cpu, "cpu"), (dev, "tpu")):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):
            opt.zero_grad()
            out = model(input_ids=IDS.to(d), attention_mask=MASK.to(d), labels=IDS.to(d))
            out.loss.backward()
            opt.step()
    for (n, a), b in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), atol=1e-4, rtol=1e-4, msg=n)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_generate_gives_the_cpu_tokens(name, no_fallback):
    cpu, dev = pair(name)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    ref = cpu.generate(IDS[:1], **kw)
    out = dev.generate(IDS[:1].to("tpu"), **kw)
    assert torch.equal(out.cpu(), ref)


@pytest.mark.parametrize("fused", [True, False], ids=["runtime_op", "decomposed"])
def test_sdpa_forward_and_backward_match_cpu(fused, mode, no_fallback):
    was = torch.tpu.fused_attention_enabled()
    torch.tpu.set_fused_attention(fused)
    try:
        _check_sdpa(fused)
    finally:
        torch.tpu.set_fused_attention(was)


def _check_sdpa(fused):
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 4, 6, 8, requires_grad=True) for _ in range(3))
    mask = torch.rand(6, 6) > 0.3
    mask[:, 0] = True
    for kwargs in ({"is_causal": True}, {"attn_mask": mask}, {"attn_mask": mask.float() * -2.0}):
        ref = F.scaled_dot_product_attention(q, k, v, **kwargs)
        (gq, gk, gv) = torch.autograd.grad(ref.sum(), (q, k, v))
        qt, kt, vt = (t.detach().to("tpu").requires_grad_() for t in (q, k, v))
        kw = {n: (m.to("tpu") if torch.is_tensor(m) else m) for n, m in kwargs.items()}
        out = F.scaled_dot_product_attention(qt, kt, vt, **kw)
        # Fused: the runtime's attention ran (one op), not torch's math
        # decomposition; only for the plain case (no mask, f32).
        fused_ran = type(out.grad_fn).__name__ == "ScaledDotProductFusedAttentionOverrideableBackward0"
        assert fused_ran == (fused and "attn_mask" not in kwargs)
        (dq, dk, dv) = torch.autograd.grad(out.sum(), (qt, kt, vt))
        torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=1e-5, rtol=1e-4)
        for a, b in ((gq, dq), (gk, dk), (gv, dv)):
            torch.testing.assert_close(b.cpu(), a, atol=1e-5, rtol=1e-4)
    # A mask that requires grad (T5's position bias) gets its gradient:
    # masks always run torch's math decomposition.
    bias = (torch.randn(4, 6, 6) * 0.5).requires_grad_()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    (gb,) = torch.autograd.grad(ref.sum(), (bias,))
    bt = bias.detach().to("tpu").requires_grad_()
    out = F.scaled_dot_product_attention(q.detach().to("tpu"), k.detach().to("tpu"), v.detach().to("tpu"), attn_mask=bt)
    assert type(out.grad_fn).__name__ != "ScaledDotProductFusedAttentionOverrideableBackward0"
    (db,) = torch.autograd.grad(out.sum(), (bt,))
    torch.testing.assert_close(db.cpu(), gb, atol=1e-5, rtol=1e-4)
    # Heads that broadcast (one query head against four key/value heads,
    # no enable_gqa): the output takes the broadcast shape.
    qb = torch.randn(2, 1, 6, 8)
    kb, vb = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    ref = F.scaled_dot_product_attention(qb, kb, vb)
    out = F.scaled_dot_product_attention(qb.to("tpu"), kb.to("tpu"), vb.to("tpu"))
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-4)
    # The composite's kernel: grouped heads, rows over one block, a query
    # read through a transposed view (as models lay out heads).
    qs = torch.randn(2, 70, 4, 8).transpose(1, 2).requires_grad_()
    ks, vs = (torch.randn(2, 2, 70, 8, requires_grad=True) for _ in range(2))
    for causal in (True, False):
        kw = dict(is_causal=causal, enable_gqa=True)
        ref = F.scaled_dot_product_attention(qs, ks, vs, **kw)
        grads = torch.autograd.grad((ref * ref).sum(), (qs, ks, vs))
        qt, kt, vt = (t.detach().to("tpu").requires_grad_() for t in (qs, ks, vs))
        out = F.scaled_dot_product_attention(qt.transpose(1, 2).transpose(1, 2), kt, vt, **kw)
        got = torch.autograd.grad((out * out).sum(), (qt, kt, vt))
        torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=1e-5, rtol=1e-4)
        for a, b in zip(grads, got):
            torch.testing.assert_close(b.cpu(), a, atol=1e-4, rtol=1e-4)


def test_from_pretrained_with_device_map_tpu(tmp_path, no_fallback):
    torch.manual_seed(0)
    model = llama()
    model.save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path, device_map="tpu")
    assert all(p.device.type == "tpu" for p in loaded.parameters())
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(IDS.to("tpu")).logits.cpu(), model(IDS).logits, atol=2e-5, rtol=1e-4
        )


def _more_models():
    T = transformers
    ids = IDS[:, :10]
    return {
        "t5": (lambda: T.T5ForConditionalGeneration(T.T5Config(
            vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0)),
            {"input_ids": ids, "decoder_input_ids": ids}),
        "bart": (lambda: T.BartForConditionalGeneration(T.BartConfig(
            vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64)), {"input_ids": ids}),
        "vit": (lambda: T.ViTForImageClassification(T.ViTConfig(
            image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64)), {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))}),
        "roberta": (lambda: T.RobertaForMaskedLM(T.RobertaConfig(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)),
            {"input_ids": ids}),
        "mistral": (lambda: T.MistralForCausalLM(T.MistralConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)), {"input_ids": ids}),
        "qwen3": (lambda: T.Qwen3ForCausalLM(T.Qwen3Config(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8)), {"input_ids": ids}),
        "gemma": (lambda: T.GemmaForCausalLM(T.GemmaConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8)), {"input_ids": ids}),
        "whisper": (lambda: T.WhisperForConditionalGeneration(T.WhisperConfig(
            vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
            max_source_positions=32, max_target_positions=64, pad_token_id=1, bos_token_id=2,
            eos_token_id=3, decoder_start_token_id=2)),
            {"input_features": torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(0)),
             "decoder_input_ids": ids}),
    }


@pytest.mark.parametrize("name", ["t5", "bart", "vit", "roberta", "mistral", "qwen3", "gemma", "whisper"])
def test_more_families_forward_natively(name, no_fallback):
    make, inputs = _more_models()[name]
    torch.manual_seed(0)
    cpu = make().eval()
    dev = make().eval()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("tpu")
    with torch.no_grad():
        ref = cpu(**inputs).logits
        out = dev(**{k: v.to("tpu") for k, v in inputs.items()}).logits
    torch.testing.assert_close(out.cpu(), ref, atol=2e-5, rtol=1e-4)
