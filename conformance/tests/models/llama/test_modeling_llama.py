"""Llama on the test device: transformers' common model tests, our
generation checks, and the decoder checks against the CPU."""

import unittest

from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForQuestionAnswering,
    LlamaForSequenceClassification,
    LlamaForTokenClassification,
    LlamaModel,
)

from ...decoder_lm_tester import DecoderModelTest, DecoderModelTester


class LlamaModelTester(DecoderModelTester):
    config_class = LlamaConfig
    base_model_class = LlamaModel
    causal_lm_class = LlamaForCausalLM
    sequence_classification_class = LlamaForSequenceClassification
    token_classification_class = LlamaForTokenClassification
    question_answering_class = LlamaForQuestionAnswering


class LlamaModelTest(DecoderModelTest, unittest.TestCase):
    model_tester_class = LlamaModelTester
    all_model_classes = LlamaModelTester.all_classes()
