"""RoBERTa on the test device: transformers' common model tests, our
generation checks for the causal LM head, and checks of every head against
the same model on the CPU.

The tester and the test bases are BERT's (tests/models/bert/), with
RoBERTa's classes: the encoder heads in RobertaModelTest (is_decoder=False),
RobertaForCausalLM alone in RobertaForCausalLMTest (is_decoder=True, the
configuration generation needs; it is the only generative class).
"""

import unittest

import torch

from transformers import (
    RobertaConfig,
    RobertaForCausalLM,
    RobertaForMaskedLM,
    RobertaForMultipleChoice,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaModel,
)

from ..bert.test_modeling_bert import BertLikeDecoderTest, BertLikeDecoderTester, BertLikeEncoderTest, BertLikeModelTester


class RobertaClasses:
    config_class = RobertaConfig
    base_model_class = RobertaModel
    masked_lm_class = RobertaForMaskedLM
    causal_lm_class = RobertaForCausalLM
    multiple_choice_class = RobertaForMultipleChoice
    next_sentence_class = None
    pretraining_class = None
    question_answering_class = RobertaForQuestionAnswering
    sequence_classification_class = RobertaForSequenceClassification
    token_classification_class = RobertaForTokenClassification
    # RoBERTa's own default: positions count from pad_token_id + 1 and skip pad tokens.
    pad_token_id = 1


class NoPadInputs:
    """Inputs without pad tokens. RoBERTa numbers positions by counting
    non-pad tokens when it is given ids, and sequentially when it is given
    embeddings; decoding through the cache counts every cached token. A pad
    inside random ids (one in 98 per token) would shift positions between
    these paths, on every device: test_inputs_embeds_matches_input_ids and
    the cache checks would fail at random."""

    def prepare_config_and_inputs(self):
        config, input_ids, *rest = super().prepare_config_and_inputs()
        input_ids = torch.where(input_ids == self.pad_token_id, input_ids + 1, input_ids)
        return (config, input_ids, *rest)


class RobertaModelTester(NoPadInputs, RobertaClasses, BertLikeModelTester):
    pass


class RobertaDecoderTester(NoPadInputs, RobertaClasses, BertLikeDecoderTester):
    pass


class RobertaModelTest(BertLikeEncoderTest, unittest.TestCase):
    model_tester_class = RobertaModelTester
    all_model_classes = RobertaModelTester.encoder_classes()


class RobertaForCausalLMTest(BertLikeDecoderTest, unittest.TestCase):
    model_tester_class = RobertaDecoderTester
    all_model_classes = (RobertaForCausalLM,)
    # RoBERTa derives positions from the pad token, so left padding needs no position ids.
    absolute_positions_count_pads = False

    def _gen_kwargs(self, config, **extra):
        # Never generate the pad token: a generated pad would be skipped by the position count of
        # a forward pass without the cache but counted by one with it (see RobertaDecoderTester).
        kw = super()._gen_kwargs(config, **extra)
        kw.setdefault("suppress_tokens", [config.pad_token_id])
        return kw
