"""Shape buckets under torch.compile(backend="tpu"): a graph with dynamic
dimensions runs padded to its buckets, with CPU-equal results, and the
sizes of a bucket share its programs."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tpurt.compiler  # noqa: F401
from tpurt import buckets


def _misses() -> int:
    """Programs not found in memory: compiled, or loaded from the disk
    cache that an earlier run may have filled."""
    s = torch.tpu.compile_cache_stats()
    return s["misses"] + s["disk_hits"]


def _twins(make):
    """A model on CPU and the same model (same weights) on tpu."""
    ref = make()
    dev = make().to("tpu")
    dev.load_state_dict(ref.state_dict())
    return ref, dev


def _assert_same_grads(ref, dev):
    for (name, p), q in zip(ref.named_parameters(), dev.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-6, rtol=1e-5, msg=name)
    ref.zero_grad()
    dev.zero_grad()


@pytest.fixture(autouse=True)
def _fresh():
    torch.tpu.compile_cache_clear(memory=True, disk=False)
    torch._dynamo.reset()
    buckets.reset_stats()
    torch.tpu.set_shape_buckets("pow2")
    yield
    torch.tpu.set_shape_buckets("pow2")
    torch._dynamo.reset()


class _Block(nn.Module):
    """Embedding, layer norm, causal attention, GELU MLP, cross-entropy and
    a mean over the sequence: the ops of a language model's training step.
    The logits come back too, outside the loss: autograd gives them a zero
    gradient of their shape, which must not be a program per length."""

    def __init__(self, d=16, vocab=32, heads=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab)
        self.heads = heads

    def forward(self, ids, labels):
        x = self.emb(ids)
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, -1)
        q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, d)
        x = x + self.o(a)
        x = x + self.mlp(x)
        logits = self.head(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        return loss, logits.mean(dim=1), logits


def test_training_step_with_dynamic_lengths_equals_cpu_and_a_bucket_compiles_once(no_fallback):
    torch.manual_seed(0)
    ref, dev = _twins(_Block)
    step = torch.compile(dev, backend="tpu", dynamic=True)
    misses = {}
    for n in [5, 6, 7, 12, 13, 16, 3]:
        ids = torch.randint(0, 32, (2, n))
        labels = torch.randint(0, 32, (2, n))
        labels[0, 1] = -100  # an ignored target among the valid ones
        before = _misses()
        loss, mean, logits = step(ids.to("tpu"), labels.to("tpu"))
        loss.backward()
        torch.tpu.synchronize()
        misses[n] = _misses() - before
        rloss, rmean, rlogits = ref(ids, labels)
        rloss.backward()
        assert logits.shape == (2, n, 32)
        torch.testing.assert_close(loss.cpu(), rloss.detach(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(mean.cpu(), rmean.detach(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(logits.cpu(), rlogits.detach(), atol=1e-6, rtol=1e-5)
        _assert_same_grads(ref, dev)
    # 5, 6 and 7 share bucket 8; 12, 13 and 16 bucket 16; 3 is back in 8.
    assert misses[5] > 0 and misses[12] > 0
    assert misses[6] == misses[7] == misses[13] == misses[16] == misses[3] == 0, misses
    assert buckets.stats()["bucketed"] >= 2 and buckets.stats()["exact"] == 0, buckets.stats()


def _attention_layer():
    torch.manual_seed(1)
    w = torch.randn(24, 8).to("tpu")

    def layer(x):
        h = F.layer_norm(x, (8,))
        q, k, v = F.linear(h, w).view(1, x.shape[1], 3, 2, 4).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (x + a.transpose(1, 2).reshape(x.shape)).mean(dim=1)

    return layer


def test_lengths_1_to_2048_cost_at_most_12_buckets_of_programs():
    layer = _attention_layer()
    compiled = torch.compile(layer, backend="tpu", dynamic=True)
    total = 0
    per_bucket = None
    for n in range(1, 2049):
        x = torch.randn(1, n, 8)
        before = _misses()
        y = compiled(x.to("tpu")).cpu()
        got = _misses() - before
        total += got
        if n == 9:  # the first length of bucket 16: one bucket's programs
            per_bucket = got
        if n in (1, 2, 9, 100, 1000, 2048):
            torch.testing.assert_close(y, layer(x.to("tpu")).cpu(), atol=1e-5, rtol=1e-5)
    assert per_bucket and per_bucket > 0
    # 1 (a graph of its own: dynamo specializes size 1) and 9 buckets, 8 to 2048.
    assert total <= 12 * per_bucket, (total, per_bucket)


def test_exact_policy_records_every_length_and_a_user_list_buckets_by_it():
    layer = _attention_layer()
    compiled = torch.compile(layer, backend="tpu", dynamic=True)
    torch.tpu.set_shape_buckets(None)
    compiled(torch.randn(1, 20, 8).to("tpu")).cpu()
    compiled(torch.randn(1, 21, 8).to("tpu")).cpu()
    before = _misses()
    x = torch.randn(1, 22, 8)
    torch.testing.assert_close(compiled(x.to("tpu")).cpu(), layer(x.to("tpu")).cpu(), atol=1e-5, rtol=1e-5)
    assert _misses() > before  # a new length is a new program
    torch.tpu.set_shape_buckets([24, 40])
    assert torch.tpu.shape_bucket(22) == 24 and torch.tpu.shape_bucket(41) == 80
    compiled(torch.randn(1, 23, 8).to("tpu")).cpu()
    before = _misses()
    for n in (17, 22, 24):
        x = torch.randn(1, n, 8)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), layer(x.to("tpu")).cpu(), atol=1e-5, rtol=1e-5)
    # the references above ran eagerly; only the compiled calls share bucket 24
    assert buckets.stats()["exact"] == 0


def test_graph_without_a_rule_runs_exactly_and_says_why():
    def last_token(x, w):
        # x[:, -1] counts from the end of the padded axis: no rule pads it.
        return F.linear(x, w)[:, -1].sort(dim=-1).values

    w = torch.randn(8, 8)
    compiled = torch.compile(last_token, backend="tpu", dynamic=True)
    for n in (3, 5, 6):
        x = torch.randn(2, n, 8)
        torch.testing.assert_close(compiled(x.to("tpu"), w.to("tpu")).cpu(), last_token(x, w), atol=1e-5, rtol=1e-5)
    s = buckets.stats()
    assert s["exact"] >= 1 and s["bucketed"] == 0, s
    assert any("select" in r for r in s["reasons"]), s


def test_mean_and_softmax_over_the_padded_axis_and_a_size_as_a_value():
    def f(x):
        p = torch.softmax(x, dim=1)
        return p.amax(dim=1), x.mean(dim=1), x.sum(dim=1) / x.shape[1], torch.logsumexp(x, dim=1)

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 6, 7, 3):
        x = torch.randn(2, n, 4) * 3
        for got, want in zip(compiled(x.to("tpu")), f(x)):
            torch.testing.assert_close(got.cpu(), want, atol=1e-6, rtol=1e-5)
    assert buckets.stats()["bucketed"] >= 1 and buckets.stats()["exact"] == 0, buckets.stats()


def test_set_shape_buckets_rejects_bad_policies():
    for bad in ("pow3", 0, [], [8, 0], [8, "x"], True):
        with pytest.raises(ValueError):
            torch.tpu.set_shape_buckets(bad)
    with pytest.raises(ValueError):
        torch.tpu.shape_bucket(-1)
    torch.tpu.set_shape_buckets(100)
    assert torch.tpu.shape_bucket(3) == 128 and torch.tpu.shape_bucket(129) == 256
    torch.tpu.set_shape_buckets("pow2")
    assert [torch.tpu.shape_bucket(n) for n in (0, 1, 8, 9, 2048)] == [0, 8, 8, 16, 2048]


def test_transformers_llama_training_step_with_dynamic_lengths(no_fallback):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    ref, dev = _twins(lambda: transformers.LlamaForCausalLM(cfg))
    step = torch.compile(dev, backend="tpu", dynamic=True)
    misses = {}
    for n in (5, 6, 7, 12, 13):
        ids = torch.randint(0, 64, (2, n))
        before = _misses()
        out = step(input_ids=ids.to("tpu"), labels=ids.to("tpu"))
        out.loss.backward()
        torch.tpu.synchronize()
        misses[n] = _misses() - before
        want = ref(input_ids=ids, labels=ids)
        want.loss.backward()
        torch.testing.assert_close(out.loss.cpu(), want.loss.detach(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(out.logits.cpu(), want.logits.detach(), atol=1e-5, rtol=1e-5)
        _assert_same_grads(ref, dev)
    assert misses[6] == misses[7] == misses[13] == 0, misses
    assert buckets.stats()["bucketed"] >= 2 and buckets.stats()["exact"] == 0, buckets.stats()


def test_non_causal_attention_and_half_precision_means_over_dynamic_lengths(no_fallback):
    def f(q, k, v):
        a = F.scaled_dot_product_attention(q, k, v)  # every key attends: padded keys must not
        return a, a.to(torch.bfloat16).mean(dim=2), torch.softmax(q.to(torch.bfloat16), dim=2)

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 6, 7, 11):
        q, k, v = (torch.randn(2, 2, n, 8) for _ in range(3))
        got = compiled(q.to("tpu"), k.to("tpu"), v.to("tpu"))
        want = f(q, k, v)
        torch.testing.assert_close(got[0].cpu(), want[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[1].cpu(), want[1], atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(got[2].cpu(), want[2], atol=1e-2, rtol=1e-2)
    s = buckets.stats()
    assert s["bucketed"] >= 1 and s["exact"] == 0, s


def test_backward_without_a_rule_takes_the_padded_forward_tensors_cut():
    # cumsum pads (a prefix sum); its backward flips the padded axis, which
    # has no rule: that backward runs as traced, on the forward's saved
    # tensors cut back to their sizes.
    def f(x, w):
        return (torch.cumsum(x, 1) * w).sum()

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    w = torch.randn(1, 1, 4)
    for n in (5, 6, 7):
        x = torch.randn(2, n, 4, requires_grad=True)
        xt = x.detach().to("tpu").requires_grad_()
        y = compiled(xt, w.to("tpu"))
        y.backward()
        want = f(x, w)
        want.backward()
        torch.testing.assert_close(y.cpu(), want.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(xt.grad.cpu(), x.grad, atol=1e-6, rtol=1e-6)
    s = buckets.stats()
    assert s["bucketed"] == 1 and s["exact"] == 1 and "aten.flip.default on a padded axis" in s["reasons"], s


def test_transformers_bert_with_a_padding_mask_and_dynamic_lengths(no_fallback):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ref, dev = _twins(lambda: transformers.BertForSequenceClassification(cfg).eval())
    step = torch.compile(dev, backend="tpu", dynamic=True)
    misses = {}
    for n in (5, 6, 7, 12, 13):
        ids = torch.randint(0, 64, (2, n))
        mask = torch.ones(2, n, dtype=torch.long)
        mask[1, -2:] = 0
        labels = torch.tensor([0, 1])
        before = _misses()
        out = step(input_ids=ids.to("tpu"), attention_mask=mask.to("tpu"), labels=labels.to("tpu"))
        out.loss.backward()
        torch.tpu.synchronize()
        misses[n] = _misses() - before
        want = ref(input_ids=ids, attention_mask=mask, labels=labels)
        want.loss.backward()
        torch.testing.assert_close(out.logits.cpu(), want.logits.detach(), atol=1e-5, rtol=1e-5)
        _assert_same_grads(ref, dev)
    assert misses[6] == misses[7] == misses[13] == 0, misses
    assert buckets.stats()["exact"] == 0, buckets.stats()


def test_slice_of_the_last_n_of_an_axis_of_n_is_the_whole_padded_axis():
    def f(x):
        return x[:, -x.shape[1] :].softmax(dim=1)

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 6, 7):
        x = torch.randn(2, n, 3)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), f(x), atol=1e-6, rtol=1e-5)
    assert buckets.stats() == {"bucketed": 1, "exact": 0, "reasons": {}}


def test_an_int_argument_pads_where_it_is_a_size_and_keeps_its_value_elsewhere():
    # dynamo makes k symbolic too: the slice's end is a size (padded and
    # masked like any), the product and the sum take k's own value.
    def f(x, k):
        return (x[:, :k] * k).sum(dim=1), x.mean(dim=1) + k

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n, k in ((5, 3), (6, 2), (7, 5), (12, 9)):
        x = torch.randn(2, n, 3)
        for got, want in zip(compiled(x.to("tpu"), k), f(x, k)):
            torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
    assert buckets.stats()["exact"] == 0, buckets.stats()
