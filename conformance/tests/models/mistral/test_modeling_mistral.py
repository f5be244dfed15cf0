"""Mistral on the test device: transformers' common model tests, our
generation checks, and the decoder checks against the CPU."""

import unittest

from transformers import (
    MistralConfig,
    MistralForCausalLM,
    MistralForQuestionAnswering,
    MistralForSequenceClassification,
    MistralForTokenClassification,
    MistralModel,
)

from ...decoder_lm_tester import DecoderModelTest, DecoderModelTester


class MistralModelTester(DecoderModelTester):
    config_class = MistralConfig
    base_model_class = MistralModel
    causal_lm_class = MistralForCausalLM
    sequence_classification_class = MistralForSequenceClassification
    token_classification_class = MistralForTokenClassification
    question_answering_class = MistralForQuestionAnswering

    def __init__(self, parent, **kwargs):
        # A window wider than any test sequence: the sliding-window mask is
        # built, but every position still sees its whole prefix.
        kwargs.setdefault("sliding_window", 32)
        super().__init__(parent, **kwargs)


class MistralModelTest(DecoderModelTest, unittest.TestCase):
    model_tester_class = MistralModelTester
    all_model_classes = MistralModelTester.all_classes()
