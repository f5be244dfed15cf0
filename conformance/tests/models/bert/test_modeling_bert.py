"""BERT on the test device: transformers' common model tests, our
generation checks for the causal LM head, and checks of every head
against the same model on the CPU.

Two test classes, because the common mixins build every class in
all_model_classes from one shared config:

- BertModelTest: the encoder classes with is_decoder=False (the
  configuration they are meant for);
- BertLMHeadModelTest: BertLMHeadModel alone with is_decoder=True, which
  is what generation needs (a causal mask and a KV cache; with
  is_decoder=False BertModel turns the cache off and attends both ways).
  It is the only generative BERT class, so only it gets
  GenerationTesterMixin (test_generation_tester_mixin_inheritance
  insists that a class with no generative model does not).

The tester and the CPU-parity checks here are shared with RoBERTa (and the
parity checks with ViT and CLIP), which import them from this module.
"""

import copy
import unittest

import torch

from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertLMHeadModel,
    BertModel,
    set_seed,
)
from transformers.testing_utils import torch_device

from ...generation.test_utils import GenerationTesterMixin
from ...test_configuration_common import ConfigTester
from ...test_modeling_common import ModelTesterMixin, floats_tensor, ids_tensor, random_attention_mask

ATOL = 1e-4
RTOL = 1e-4


# --- comparing a device run with a CPU run ---------------------------------------------------


def to_device(inputs, device):
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def assert_tree_close(test, got, want, where="output", atol=ATOL, rtol=RTOL):
    """Every tensor of a (nested) model output from the device against the CPU's."""
    if isinstance(want, torch.Tensor):
        test.assertIsInstance(got, torch.Tensor, where)
        test.assertEqual(got.device.type, torch.device(torch_device).type, f"{where} is not on the test device")
        got = got.detach().cpu()
        want = want.detach()
        test.assertEqual(tuple(got.shape), tuple(want.shape), f"{where}: shape")
        if want.is_floating_point():
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda m: f"{where}: {m}")
        else:
            test.assertTrue(torch.equal(got, want), f"{where}: integer outputs differ")
    elif isinstance(want, dict):  # ModelOutput included
        test.assertEqual(list(got.keys()), list(want.keys()), f"{where}: keys")
        for k in want.keys():
            assert_tree_close(test, got[k], want[k], f"{where}.{k}", atol, rtol)
    elif isinstance(want, (tuple, list)):
        test.assertEqual(len(got), len(want), f"{where}: length")
        for i, (g, w) in enumerate(zip(got, want)):
            assert_tree_close(test, g, w, f"{where}[{i}]", atol, rtol)
    elif want is None:
        test.assertIsNone(got, where)


class CpuParityChecks:
    """Checks of every class in all_model_classes: the device against the
    same weights on the CPU. Mixed into a ModelTesterMixin test class."""

    parity_atol = ATOL
    parity_rtol = RTOL

    def _cpu_and_device(self, model_class, config):
        set_seed(0)
        cpu = model_class(copy.deepcopy(config)).eval()
        dev = copy.deepcopy(cpu).to(torch_device).eval()
        return cpu, dev

    def _parity_inputs(self, model_class):
        """(config, inputs on the CPU) with the labels that class takes."""
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        inputs = self._prepare_for_class(inputs, model_class, return_labels=True)
        return config, to_device(inputs, "cpu")

    def test_outputs_match_cpu(self):
        """Every output (logits, loss, hidden states) of every class, default attention."""
        for model_class in self.all_model_classes:
            config, inputs = self._parity_inputs(model_class)
            cpu, dev = self._cpu_and_device(model_class, config)
            with torch.no_grad():
                want = cpu(**inputs, output_hidden_states=True)
                got = dev(**to_device(inputs, torch_device), output_hidden_states=True)
            assert_tree_close(self, got, want, model_class.__name__, self.parity_atol, self.parity_rtol)

    def test_attentions_match_cpu(self):
        """The attention probabilities of every layer, eager attention."""
        if not self.has_attentions:
            self.skipTest("the model has no attentions")
        for model_class in self.all_model_classes:
            config, inputs = self._parity_inputs(model_class)
            cpu, dev = self._cpu_and_device(model_class, config)
            cpu.set_attn_implementation("eager")
            dev.set_attn_implementation("eager")
            with torch.no_grad():
                want = cpu(**inputs, output_attentions=True)
                got = dev(**to_device(inputs, torch_device), output_attentions=True)
            assert_tree_close(self, got, want, model_class.__name__, self.parity_atol, self.parity_rtol)

    def test_loss_and_grads_match_cpu(self):
        """For each class: its loss (or, for a class that returns none, the mean square of its
        first output), then every parameter's gradient after one backward (eval mode, so
        dropout is off)."""
        for model_class in self.all_model_classes:
            config, inputs = self._parity_inputs(model_class)
            cpu, dev = self._cpu_and_device(model_class, config)
            name = model_class.__name__
            out_cpu = cpu(**inputs)
            out_dev = dev(**to_device(inputs, torch_device))
            loss_cpu, loss_dev = _loss_of(out_cpu), _loss_of(out_dev)
            torch.testing.assert_close(loss_dev.detach().cpu(), loss_cpu.detach(), atol=self.parity_atol,
                                       rtol=self.parity_rtol, msg=lambda m: f"{name} loss: {m}")
            loss_cpu.backward()
            loss_dev.backward()
            for (pname, p_dev), (_, p_cpu) in zip(dev.named_parameters(), cpu.named_parameters()):
                if p_cpu.grad is None:
                    self.assertIsNone(p_dev.grad, f"{name}.{pname}")
                    continue
                self.assertIsNotNone(p_dev.grad, f"{name}.{pname} has no gradient on the device")
                torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, atol=self.parity_atol, rtol=1e-3,
                                           msg=lambda m: f"grad of {name}.{pname}: {m}")


def _loss_of(output):
    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    first = next(v for v in output.values() if isinstance(v, torch.Tensor) and v.is_floating_point())
    return (first.float() ** 2).mean()


# --- the tester ------------------------------------------------------------------------------


class BertLikeModelTester:
    """A tiny BERT-style config and its inputs. RoBERTa subclasses it with its own classes."""

    config_class = BertConfig
    base_model_class = BertModel
    masked_lm_class = BertForMaskedLM
    causal_lm_class = BertLMHeadModel
    multiple_choice_class = BertForMultipleChoice
    next_sentence_class = BertForNextSentencePrediction
    pretraining_class = BertForPreTraining
    question_answering_class = BertForQuestionAnswering
    sequence_classification_class = BertForSequenceClassification
    token_classification_class = BertForTokenClassification
    pad_token_id = 0

    def __init__(
        self,
        parent,
        batch_size=3,
        seq_length=7,
        is_training=True,
        use_input_mask=True,
        use_token_type_ids=True,
        use_labels=True,
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=64,
        type_vocab_size=16,
        num_labels=2,
        num_choices=4,
        is_decoder=False,
        add_cross_attention=False,
    ):
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.use_input_mask = use_input_mask
        self.use_token_type_ids = use_token_type_ids
        self.use_labels = use_labels
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        # The config keeps its default of 2 labels: the question answering head needs exactly 2
        # (start, end) and shares the config with the classification heads.
        self.num_labels = num_labels
        self.type_sequence_label_size = num_labels
        self.num_choices = num_choices
        self.is_decoder = is_decoder
        self.add_cross_attention = add_cross_attention

    @classmethod
    def encoder_classes(cls):
        """The classes meant for is_decoder=False, base model first."""
        return tuple(
            c
            for c in (
                cls.base_model_class,
                cls.masked_lm_class,
                cls.multiple_choice_class,
                cls.next_sentence_class,
                cls.pretraining_class,
                cls.question_answering_class,
                cls.sequence_classification_class,
                cls.token_classification_class,
            )
            if c is not None
        )

    def get_config(self):
        return self.config_class(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            hidden_act=self.hidden_act,
            hidden_dropout_prob=self.hidden_dropout_prob,
            attention_probs_dropout_prob=self.attention_probs_dropout_prob,
            max_position_embeddings=self.max_position_embeddings,
            type_vocab_size=self.type_vocab_size,
            is_decoder=self.is_decoder,
            add_cross_attention=self.add_cross_attention,
            pad_token_id=self.pad_token_id,
            initializer_range=0.02,
        )

    def prepare_config_and_inputs(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        input_mask = random_attention_mask([self.batch_size, self.seq_length]) if self.use_input_mask else None
        token_type_ids = (
            ids_tensor([self.batch_size, self.seq_length], self.type_vocab_size) if self.use_token_type_ids else None
        )
        sequence_labels = token_labels = choice_labels = None
        if self.use_labels:
            sequence_labels = ids_tensor([self.batch_size], self.type_sequence_label_size)
            token_labels = ids_tensor([self.batch_size, self.seq_length], self.num_labels)
            choice_labels = ids_tensor([self.batch_size], self.num_choices)
        return self.get_config(), input_ids, token_type_ids, input_mask, sequence_labels, token_labels, choice_labels

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, token_type_ids, input_mask, *_ = self.prepare_config_and_inputs()
        inputs = {"input_ids": input_ids}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        if input_mask is not None:
            inputs["attention_mask"] = input_mask
        return config, inputs

    def pretraining_labels(self):
        """The labels of BertForPreTraining, which the common mixin's _prepare_for_class does not make."""
        return {
            "labels": torch.zeros((self.batch_size, self.seq_length), dtype=torch.long, device=torch_device),
            "next_sentence_label": torch.zeros(self.batch_size, dtype=torch.long, device=torch_device),
        }


class BertModelTester(BertLikeModelTester):
    pass


class BertLikeDecoderTester(BertLikeModelTester):
    """The same model as a stand-alone causal decoder."""

    def __init__(self, parent, **kwargs):
        kwargs.setdefault("is_decoder", True)
        # No token type ids: generate() from inputs_embeds (GenerationTesterMixin) is given none,
        # so prompts with them would not continue alike.
        kwargs.setdefault("use_token_type_ids", False)
        super().__init__(parent, **kwargs)


# --- the test classes --------------------------------------------------------------------------


class BertLikeEncoderTest(ModelTesterMixin, CpuParityChecks):
    """Base of the encoder test class of a BERT-like family (add
    unittest.TestCase and set model_tester_class and all_model_classes)."""

    model_tester_class = None
    test_pruning = False

    def setUp(self):
        self.model_tester = self.model_tester_class(self)
        self.config_tester = ConfigTester(
            self, config_class=self.model_tester_class.config_class, hidden_size=48, num_attention_heads=4
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs_dict = super()._prepare_for_class(inputs_dict, model_class, return_labels=return_labels)
        pretraining = self.model_tester.pretraining_class
        if return_labels and pretraining is not None and model_class is pretraining:
            inputs_dict.update(self.model_tester.pretraining_labels())
        return inputs_dict

    def test_base_model_matches_cpu_with_padding(self):
        """The base model's last hidden state on the unmasked tokens and its pooled output."""
        t = self.model_tester
        config, input_ids, token_type_ids, mask, *_ = t.prepare_config_and_inputs()
        cpu, dev = self._cpu_and_device(t.base_model_class, config)
        kwargs = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": mask}
        with torch.no_grad():
            got = dev(**to_device(kwargs, torch_device))
            want = cpu(**to_device(kwargs, "cpu"))
        self.assertEqual(got.last_hidden_state.shape, (t.batch_size, t.seq_length, t.hidden_size))
        keep = mask.cpu().bool()
        torch.testing.assert_close(got.last_hidden_state.cpu()[keep], want.last_hidden_state[keep], atol=ATOL,
                                   rtol=RTOL)
        torch.testing.assert_close(got.pooler_output.cpu(), want.pooler_output, atol=ATOL, rtol=RTOL)

    def test_base_model_as_decoder_with_cross_attention_matches_cpu(self):
        """BertModel as a decoder attending to encoder states (cross-attention), against the CPU."""
        t = self.model_tester
        config, input_ids, token_type_ids, mask, *_ = t.prepare_config_and_inputs()
        config.is_decoder = True
        config.add_cross_attention = True
        enc_len = 5
        encoder_hidden_states = floats_tensor([t.batch_size, enc_len, t.hidden_size])
        encoder_mask = random_attention_mask([t.batch_size, enc_len])
        cpu, dev = self._cpu_and_device(t.base_model_class, config)
        kwargs = {
            "input_ids": input_ids,
            "token_type_ids": token_type_ids,
            "attention_mask": mask,
            "encoder_hidden_states": encoder_hidden_states,
            "encoder_attention_mask": encoder_mask,
            "use_cache": False,
        }
        with torch.no_grad():
            got = dev(**to_device(kwargs, torch_device)).last_hidden_state
            want = cpu(**to_device(kwargs, "cpu")).last_hidden_state
        self.assertEqual(got.shape, (t.batch_size, t.seq_length, t.hidden_size))
        torch.testing.assert_close(got.cpu(), want, atol=ATOL, rtol=RTOL)

    def test_training_step_matches_cpu(self):
        """One SGD step on the masked LM head (dropout off) leaves the same weights as on the CPU."""
        t = self.model_tester
        if t.masked_lm_class is None:
            self.skipTest("no masked LM head")
        config, input_ids, token_type_ids, mask, *_ = t.prepare_config_and_inputs()
        config.hidden_dropout_prob = 0.0
        config.attention_probs_dropout_prob = 0.0
        cpu, dev = self._cpu_and_device(t.masked_lm_class, config)
        cpu.train()
        dev.train()
        kwargs = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": mask,
                  "labels": input_ids}
        for model, device in ((cpu, "cpu"), (dev, torch_device)):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            model(**to_device(kwargs, device)).loss.backward()
            opt.step()
        for (name, p_dev), (_, p_cpu) in zip(dev.named_parameters(), cpu.named_parameters()):
            torch.testing.assert_close(p_dev.detach().cpu(), p_cpu.detach(), atol=ATOL, rtol=1e-3,
                                       msg=lambda m: f"{name} after one step: {m}")


class BertLikeDecoderTest(ModelTesterMixin, GenerationTesterMixin, CpuParityChecks):
    """Base of the causal-LM test class of a BERT-like family."""

    model_tester_class = None
    test_pruning = False

    def setUp(self):
        self.model_tester = self.model_tester_class(self)
        self.config_tester = ConfigTester(
            self, config_class=self.model_tester_class.config_class, hidden_size=48, num_attention_heads=4
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_left_padding_compatibility(self):
        """Left padding with position ids that skip the pads: the last logits equal the unpadded
        row's. (BERT's absolute positions otherwise count the pads, so the plain check of the
        generation mixin does not apply; RoBERTa derives its positions from the pad token.)"""
        t = self.model_tester
        config, inputs = self._generation_setup(t.causal_lm_class)
        _, model = self._cpu_and_device(t.causal_lm_class, config)
        ids = inputs["input_ids"].to(torch_device)
        n_pad = 3
        pad = config.pad_token_id
        mask = torch.ones_like(ids)
        padded_ids = torch.cat([torch.full((ids.shape[0], n_pad), pad, dtype=ids.dtype, device=ids.device), ids], 1)
        padded_mask = torch.cat([torch.zeros_like(padded_ids[:, :n_pad]), mask], 1)
        plain_kw = {"input_ids": ids, "attention_mask": mask}
        padded_kw = {"input_ids": padded_ids, "attention_mask": padded_mask}
        if self.absolute_positions_count_pads:
            positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
            plain_kw["position_ids"] = positions
            padded_kw["position_ids"] = torch.cat([torch.zeros_like(positions[:, :n_pad]), positions], 1)
        with torch.no_grad():
            plain = model(**plain_kw).logits[:, -1]
            padded = model(**padded_kw).logits[:, -1]
        torch.testing.assert_close(padded.cpu(), plain.cpu(), atol=ATOL, rtol=RTOL)

    absolute_positions_count_pads = True

    def test_incremental_decoding_matches_full_forward(self):
        """Decoding the last two tokens one at a time through the cache gives the logits of one
        full forward pass, on the device."""
        t = self.model_tester
        config, input_ids, token_type_ids, _, *_ = t.prepare_config_and_inputs()
        config.use_cache = True
        _, model = self._cpu_and_device(t.causal_lm_class, config)
        ids = input_ids.to(torch_device)
        with torch.no_grad():
            full = model(input_ids=ids, use_cache=False).logits
            out = model(input_ids=ids[:, :-2], use_cache=True)
            cache = out.cache
            steps = []
            for i in (2, 1):
                out = model(input_ids=ids[:, -i:ids.shape[1] - i + 1], cache=cache, use_cache=True)
                cache = out.cache
                steps.append(out.logits[:, -1])
        torch.testing.assert_close(torch.stack(steps, 1).cpu(), full[:, -2:].cpu(), atol=ATOL, rtol=RTOL)


class BertModelTest(BertLikeEncoderTest, unittest.TestCase):
    model_tester_class = BertModelTester
    all_model_classes = BertModelTester.encoder_classes()


class BertDecoderTester(BertLikeDecoderTester):
    pass


class BertLMHeadModelTest(BertLikeDecoderTest, unittest.TestCase):
    model_tester_class = BertDecoderTester
    all_model_classes = (BertLMHeadModel,)
