"""Gemma (v1) on the test device: transformers' common model tests, our
generation checks, and the decoder checks against the CPU."""

import unittest

from transformers import (
    GemmaConfig,
    GemmaForCausalLM,
    GemmaForSequenceClassification,
    GemmaForTokenClassification,
    GemmaModel,
)

from ...decoder_lm_tester import DecoderModelTest, DecoderModelTester


class GemmaModelTester(DecoderModelTester):
    config_class = GemmaConfig
    base_model_class = GemmaModel
    causal_lm_class = GemmaForCausalLM
    sequence_classification_class = GemmaForSequenceClassification
    token_classification_class = GemmaForTokenClassification
    # Gemma has no question-answering head.

    def __init__(self, parent, **kwargs):
        # Gemma's own activation (tanh-approximated GELU); its config ties
        # the LM head to the embeddings by default.
        kwargs.setdefault("hidden_act", "gelu_pytorch_tanh")
        super().__init__(parent, **kwargs)


class GemmaModelTest(DecoderModelTest, unittest.TestCase):
    model_tester_class = GemmaModelTester
    all_model_classes = GemmaModelTester.all_classes()
