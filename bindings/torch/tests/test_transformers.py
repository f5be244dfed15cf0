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


def test_sdpa_forward_and_backward_match_cpu(mode, no_fallback):
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
        (dq, dk, dv) = torch.autograd.grad(out.sum(), (qt, kt, vt))
        torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=1e-5, rtol=1e-4)
        for a, b in ((gq, dq), (gk, dk), (gv, dv)):
            torch.testing.assert_close(b.cpu(), a, atol=1e-5, rtol=1e-4)


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
