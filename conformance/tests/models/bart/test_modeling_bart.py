"""BART on the test device: transformers' common model tests, our generation
checks, and checks of our own that compare the device with the CPU.

Two test classes: the encoder-decoder models (BartModel and its heads), and
BartForCausalLM, BART's decoder alone as a decoder-only language model."""

import unittest

import torch

from transformers import (
    BartConfig,
    BartForCausalLM,
    BartForConditionalGeneration,
    BartForQuestionAnswering,
    BartForSequenceClassification,
    BartModel,
)
from transformers.testing_utils import torch_device

from ...cpu_reference import ATOL, RTOL, assert_training_matches, pair as _pair
from ...generation.test_utils import GenerationTesterMixin
from ...seq2seq_cpu_checks import Seq2SeqCpuChecks
from ...test_configuration_common import ConfigTester
from ...test_modeling_common import (
    ModelTesterMixin,
    ids_tensor,
    random_attention_mask,
)

class BartModelTester:
    """A tiny BART: two layers each side, learned positions.

    The special ids are BART's (bos 0, pad 1, eos 2, decoder start 2). Encoder
    rows hold ordinary tokens (ids >= 3) and end with the one EOS the sequence
    classification head reads; decoder rows start with the decoder start token."""

    def __init__(
        self,
        parent,
        batch_size=3,
        seq_length=7,
        is_training=True,
        use_labels=True,
        vocab_size=99,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=4 * 16,
        hidden_act="gelu",
        dropout=0.1,
        attention_dropout=0.1,
        max_position_embeddings=32,
        num_labels=3,
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        decoder_only=False,
    ):
        self.parent = parent
        self.batch_size = batch_size
        # One length for encoder and decoder: the common tests build labels
        # and decoder masks from `seq_length`.
        self.seq_length = seq_length
        self.encoder_seq_length = seq_length
        self.decoder_seq_length = seq_length
        self.key_length = seq_length
        self.is_training = is_training
        self.use_labels = use_labels
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.max_position_embeddings = max_position_embeddings
        self.num_labels = num_labels
        self.type_sequence_label_size = num_labels
        self.bos_token_id = bos_token_id
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.decoder_start_token_id = decoder_start_token_id
        self.decoder_only = decoder_only

    def get_config(self, dropout=None):
        p = self.dropout if dropout is None else dropout
        q = self.attention_dropout if dropout is None else dropout
        return BartConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=self.intermediate_size,
            decoder_ffn_dim=self.intermediate_size,
            activation_function=self.hidden_act,
            dropout=p,
            attention_dropout=q,
            max_position_embeddings=self.max_position_embeddings,
            num_labels=self.num_labels,
            bos_token_id=self.bos_token_id,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_id,
            decoder_start_token_id=self.decoder_start_token_id,
            forced_eos_token_id=self.eos_token_id,
            is_decoder=self.decoder_only,
            is_encoder_decoder=not self.decoder_only,
            # The common attention/hidden-state tests count the outputs of a
            # forward without a cache; generate() turns it on itself.
            use_cache=False,
        )

    def _tokens(self):
        # ids 3..vocab-1: none of bos, pad, eos
        return ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 3) + 3

    def prepare_config_and_inputs(self):
        """config and a dict of every tensor the checks use (labels included)."""
        input_ids = self._tokens()
        input_ids[:, -1] = self.eos_token_id
        decoder_input_ids = self._tokens()
        decoder_input_ids[:, 0] = self.decoder_start_token_id
        t = {
            "input_ids": input_ids,
            "attention_mask": random_attention_mask([self.batch_size, self.seq_length]),
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": random_attention_mask([self.batch_size, self.seq_length]),
        }
        if self.use_labels:
            t["lm_labels"] = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
            t["sequence_labels"] = ids_tensor([self.batch_size], self.num_labels)
            t["start_positions"] = ids_tensor([self.batch_size], self.seq_length)
            t["end_positions"] = ids_tensor([self.batch_size], self.seq_length)
        return self.get_config(), t

    def prepare_config_and_inputs_for_common(self):
        config, t = self.prepare_config_and_inputs()
        keys = ["input_ids", "attention_mask"]
        if not self.decoder_only:
            keys += ["decoder_input_ids", "decoder_attention_mask"]
        return config, {k: t[k] for k in keys}


class BartModelTest(Seq2SeqCpuChecks, ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    base_model_class = BartModel
    conditional_generation_class = BartForConditionalGeneration
    sequence_classification_class = BartForSequenceClassification
    question_answering_class = BartForQuestionAnswering
    no_dropout = {"dropout": 0.0}
    all_model_classes = (
        BartModel,
        BartForConditionalGeneration,
        BartForSequenceClassification,
        # last: BartForQuestionAnswering sets num_labels = 2 on the config it
        # is given, which a common test shares with the classes after it (and
        # BartConfig saves num_labels=2 as the default it reloads as 3)
        BartForQuestionAnswering,
    )
    is_encoder_decoder = True
    test_pruning = False

    def setUp(self):
        self.model_tester = BartModelTester(self)
        self.config_tester = ConfigTester(self, config_class=BartConfig, d_model=37)

    def test_config(self):
        self.config_tester.run_common_tests()


class BartStandaloneDecoderModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (BartForCausalLM,)
    is_encoder_decoder = False
    test_pruning = False
    # BART's decoder layers always hold cross-attention weights; without an
    # encoder (BartForCausalLM run on its own) they get no gradient.
    test_all_params_have_gradient = False

    def setUp(self):
        self.model_tester = BartModelTester(self, decoder_only=True)
        self.config_tester = ConfigTester(self, config_class=BartConfig, d_model=37)

    def test_config(self):
        self.config_tester.run_common_tests()

    @unittest.skip(
        "BART's decoder numbers its learned positions 0..n-1 whatever the attention mask says and takes "
        "no position_ids, so a left-padded row sees other position embeddings than the same row unpadded"
    )
    def test_left_padding_compatibility(self):
        pass

    # --- ours: the device against the CPU ------------------------------------

    def _tensors(self):
        t = self.model_tester
        _, tensors = t.prepare_config_and_inputs()
        return t.get_config(dropout=0.0), tensors["input_ids"], tensors["attention_mask"]

    def test_decoder_matches_cpu(self):
        t = self.model_tester
        config, ids, mask = self._tensors()
        cpu, dev = _pair(BartForCausalLM, config)
        with torch.no_grad():
            got = dev(input_ids=ids.to(torch_device), attention_mask=mask.to(torch_device)).logits
            want = cpu(input_ids=ids.cpu(), attention_mask=mask.cpu()).logits
        self.assertEqual(got.shape, (t.batch_size, t.seq_length, t.vocab_size))
        keep = mask.cpu().bool()
        torch.testing.assert_close(got.cpu()[keep], want[keep], atol=ATOL, rtol=RTOL)

    def test_causal_lm_loss_and_grads_match_cpu(self):
        """Loss (BartForCausalLM does not shift labels: the targets are the next
        tokens, given here) and every parameter's gradient after one backward."""
        config, ids, mask = self._tensors()
        labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
        assert_training_matches(self, BartForCausalLM, config,
                                {"input_ids": ids, "attention_mask": mask, "labels": labels})
