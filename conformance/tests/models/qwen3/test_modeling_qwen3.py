"""Qwen3 (q/k RMSNorm per head) on the test device: transformers' common
model tests, our generation checks, and the decoder checks against the CPU."""

import unittest

from transformers import (
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3ForQuestionAnswering,
    Qwen3ForSequenceClassification,
    Qwen3ForTokenClassification,
    Qwen3Model,
)

from ...decoder_lm_tester import DecoderModelTest, DecoderModelTester


class Qwen3ModelTester(DecoderModelTester):
    config_class = Qwen3Config
    base_model_class = Qwen3Model
    causal_lm_class = Qwen3ForCausalLM
    sequence_classification_class = Qwen3ForSequenceClassification
    token_classification_class = Qwen3ForTokenClassification
    question_answering_class = Qwen3ForQuestionAnswering


class Qwen3ModelTest(DecoderModelTest, unittest.TestCase):
    model_tester_class = Qwen3ModelTester
    all_model_classes = Qwen3ModelTester.all_classes()
