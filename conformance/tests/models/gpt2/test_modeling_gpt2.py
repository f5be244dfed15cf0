"""GPT-2 on the test device: transformers' common model tests, our
generation checks, and the decoder checks against the CPU.

GPT-2 is a decoder-only LM like the others, but its config speaks its own
dialect (n_embd, n_layer, n_head, n_positions, n_inner), it has learned
absolute positions instead of rotary ones, LayerNorm instead of RMSNorm, and
one more head, GPT2DoubleHeadsModel (LM + multiple-choice summary). The
tester keeps DecoderModelTester's attributes, which the mixins read, and
only translates them into a GPT2Config."""

import unittest

import pytest
import torch

from transformers import (
    GPT2Config,
    GPT2DoubleHeadsModel,
    GPT2ForQuestionAnswering,
    GPT2ForSequenceClassification,
    GPT2ForTokenClassification,
    GPT2LMHeadModel,
    GPT2Model,
)
from transformers.testing_utils import torch_device

from ...decoder_lm_tester import DecoderModelTest, DecoderModelTester
from ...test_configuration_common import ConfigTester


class GPT2ModelTester(DecoderModelTester):
    config_class = GPT2Config
    base_model_class = GPT2Model
    causal_lm_class = GPT2LMHeadModel
    sequence_classification_class = GPT2ForSequenceClassification
    token_classification_class = GPT2ForTokenClassification
    question_answering_class = GPT2ForQuestionAnswering
    double_heads_class = GPT2DoubleHeadsModel

    def __init__(self, parent, **kwargs):
        # GPT-2 has no grouped-query attention (every head has its own K/V).
        kwargs.setdefault("num_key_value_heads", kwargs.get("num_attention_heads", 4))
        kwargs.setdefault("hidden_act", "gelu_new")
        super().__init__(parent, **kwargs)

    @classmethod
    def all_classes(cls):
        # The double-heads model last: it sets config.num_labels = 1 on the
        # config it is built from.
        return super().all_classes() + (cls.double_heads_class,)

    def get_config(self):
        return self.config_class(
            vocab_size=self.vocab_size,
            n_embd=self.hidden_size,
            n_layer=self.num_hidden_layers,
            n_head=self.num_attention_heads,
            n_inner=self.intermediate_size,
            activation_function=self.hidden_act,
            n_positions=self.max_position_embeddings,
            # No dropout: the train-mode checks compare the device's loss and
            # gradients with the CPU's, which dropout masks would decorrelate.
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            summary_first_dropout=0.0,
            num_labels=self.num_labels,
            pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            **self.config_extra,
        )


class GPT2ModelTest(DecoderModelTest, unittest.TestCase):
    model_tester_class = GPT2ModelTester
    all_model_classes = GPT2ModelTester.all_classes()

    def setUp(self):
        super().setUp()
        # The JSON round trip checks the keys it was given, so give GPT-2's
        # own (hidden_size etc. are attribute_map aliases, not saved keys).
        self.config_tester = ConfigTester(self, config_class=GPT2Config, n_embd=48, n_head=4)

    # GPT2DoubleHeadsModel's `loss` is the LM loss alone (the multiple-choice
    # loss is `mc_loss`), so the training tests' backward of `loss` leaves
    # the multiple-choice head without a gradient by design, on every
    # device. test_double_heads_matches_cpu checks both losses' gradients.
    test_all_params_have_gradient = False

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs = super()._prepare_for_class(inputs_dict, model_class, return_labels=return_labels)
        if return_labels and model_class is GPT2DoubleHeadsModel:
            # No auto mapping names the double-heads model, so the mixin adds
            # no labels for it: give it the LM labels (its `loss`).
            t = self.model_tester
            inputs["labels"] = torch.zeros((t.batch_size, t.seq_length), dtype=torch.long, device=torch_device)
        return inputs

    def test_double_heads_matches_cpu(self):
        """The LM and multiple-choice logits of GPT2DoubleHeadsModel, on
        (batch, choices, seq) inputs with a chosen summary token, and both
        losses, against the CPU."""
        t = self.model_tester
        config, input_ids, mask, _, _ = t.prepare_config_and_inputs()
        choices = 2
        ids = input_ids.unsqueeze(1).expand(-1, choices, -1).contiguous().cpu()
        ids[:, 1] = ids[:, 1].flip(-1)
        att = mask.unsqueeze(1).expand(-1, choices, -1).contiguous().cpu()
        mc_token_ids = torch.full((t.batch_size, choices), t.seq_length - 1, dtype=torch.long)
        mc_token_ids[:, 0] = t.seq_length - 2
        mc_labels = torch.arange(t.batch_size) % choices
        cpu, dev = self._pair(GPT2DoubleHeadsModel, config)
        kw = {"input_ids": ids, "attention_mask": att, "mc_token_ids": mc_token_ids, "labels": ids,
              "mc_labels": mc_labels}
        with torch.no_grad():
            got = dev(**{k: v.to(torch_device) for k, v in kw.items()})
            want = cpu(**kw)
        self.assertEqual(got.logits.shape, (t.batch_size, choices, t.seq_length, t.vocab_size))
        self.assertEqual(got.mc_logits.shape, (t.batch_size, choices))
        torch.testing.assert_close(got.logits.cpu(), want.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.mc_logits.cpu(), want.mc_logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.loss.cpu(), want.loss, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.mc_loss.cpu(), want.mc_loss, atol=1e-4, rtol=1e-4)

    @pytest.mark.generate
    def test_left_padding_compatibility(self):
        """As the mixin's check, but with position ids counted from the first
        real token, as generate() passes them: GPT-2's positions are absolute
        (learned), so a left-padded row only equals the unpadded one when its
        tokens keep their positions."""
        for model_class in self.all_generative_model_classes:
            config, inputs = self._generation_setup(model_class)
            _, model = self._pair(model_class, config)
            ids = inputs["input_ids"].to(torch_device)
            mask = torch.ones_like(ids)
            pad = config.pad_token_id if config.pad_token_id is not None else 0
            padded_ids = torch.cat([torch.full((ids.shape[0], 3), pad, dtype=ids.dtype, device=ids.device), ids], 1)
            padded_mask = torch.cat([torch.zeros_like(padded_ids[:, :3]), mask], 1)
            positions = (padded_mask.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                plain = model(input_ids=ids, attention_mask=mask).logits[:, -1]
                padded = model(input_ids=padded_ids, attention_mask=padded_mask, position_ids=positions).logits[:, -1]
            torch.testing.assert_close(padded.cpu(), plain.cpu(), atol=1e-4, rtol=1e-4)
