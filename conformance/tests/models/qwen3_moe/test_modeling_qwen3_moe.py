"""Qwen3-MoE (top-k routed experts) on the test device: transformers'
common model tests, our generation checks, and the decoder checks against
the CPU."""

import unittest

from transformers import (
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3MoeForQuestionAnswering,
    Qwen3MoeForSequenceClassification,
    Qwen3MoeForTokenClassification,
    Qwen3MoeModel,
)

from ...decoder_lm_tester import DecoderModelTest, DecoderModelTester


class Qwen3MoeModelTester(DecoderModelTester):
    config_class = Qwen3MoeConfig
    base_model_class = Qwen3MoeModel
    causal_lm_class = Qwen3MoeForCausalLM
    sequence_classification_class = Qwen3MoeForSequenceClassification
    token_classification_class = Qwen3MoeForTokenClassification
    question_answering_class = Qwen3MoeForQuestionAnswering

    def __init__(self, parent, **kwargs):
        # Four small experts, two per token, every layer sparse; the
        # probabilities of the chosen experts renormalized. The expert width
        # is a multiple of 8 so that torch.nn.functional.grouped_mm, which
        # wants 16-byte strides, takes its fp16/bf16 weights.
        kwargs.setdefault("num_experts", 4)
        kwargs.setdefault("num_experts_per_tok", 2)
        kwargs.setdefault("moe_intermediate_size", 16)
        kwargs.setdefault("decoder_sparse_step", 1)
        kwargs.setdefault("norm_topk_prob", True)
        kwargs.setdefault("router_aux_loss_coef", 0.001)
        super().__init__(parent, **kwargs)


class Qwen3MoeModelTest(DecoderModelTest, unittest.TestCase):
    model_tester_class = Qwen3MoeModelTester
    all_model_classes = Qwen3MoeModelTester.all_classes()
