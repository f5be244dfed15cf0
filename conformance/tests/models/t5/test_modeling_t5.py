"""T5 on the test device: transformers' common model tests, our generation
checks, and checks of our own that compare the device with the CPU.

Two test classes: the encoder-decoder heads (T5Model and the heads that run
the decoder), and the encoder-only ones (T5EncoderModel and the token
classification head, which is built on T5EncoderModel and returns no
encoder_/decoder_ outputs)."""

import unittest

import torch

from transformers import (
    T5Config,
    T5EncoderModel,
    T5ForConditionalGeneration,
    T5ForQuestionAnswering,
    T5ForSequenceClassification,
    T5ForTokenClassification,
    T5Model,
)
from transformers.testing_utils import torch_device

from ...cpu_reference import ATOL, RTOL, assert_training_matches, on as _on, only as _only, pair as _pair
from ...generation.test_utils import GenerationTesterMixin
from ...seq2seq_cpu_checks import Seq2SeqCpuChecks
from ...test_configuration_common import ConfigTester
from ...test_modeling_common import (
    ModelTesterMixin,
    ids_tensor,
    random_attention_mask,
)

class T5ModelTester:
    """A tiny T5: two layers each side, relative attention with few buckets.

    Every encoder row holds ordinary tokens (ids >= 2) and ends with the one
    EOS token the sequence classification head looks for; the decoder rows
    start with the decoder start token (the pad id, as in T5)."""

    def __init__(
        self,
        parent,
        batch_size=3,
        seq_length=7,
        is_training=True,
        use_attention_mask=True,
        use_labels=True,
        vocab_size=99,
        hidden_size=32,
        d_kv=8,
        d_ff=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        dropout_rate=0.1,
        feed_forward_proj="relu",
        num_labels=2,  # the question answering head splits num_labels logits into start and end
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        encoder_only=False,
    ):
        self.parent = parent
        self.batch_size = batch_size
        # Encoder and decoder sequences have the same length: the common
        # tests build labels and decoder masks from one `seq_length`.
        self.seq_length = seq_length
        self.encoder_seq_length = seq_length
        self.decoder_seq_length = seq_length
        self.key_length = seq_length
        self.is_training = is_training
        self.use_attention_mask = use_attention_mask
        self.use_labels = use_labels
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.d_kv = d_kv
        self.d_ff = d_ff
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.relative_attention_num_buckets = relative_attention_num_buckets
        self.relative_attention_max_distance = relative_attention_max_distance
        self.dropout_rate = dropout_rate
        self.feed_forward_proj = feed_forward_proj
        self.num_labels = num_labels
        self.type_sequence_label_size = num_labels
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.decoder_start_token_id = decoder_start_token_id
        self.encoder_only = encoder_only

    def get_config(self, dropout_rate=None):
        return T5Config(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            d_kv=self.d_kv,
            d_ff=self.d_ff,
            num_layers=self.num_hidden_layers,
            num_decoder_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            relative_attention_num_buckets=self.relative_attention_num_buckets,
            relative_attention_max_distance=self.relative_attention_max_distance,
            dropout_rate=self.dropout_rate if dropout_rate is None else dropout_rate,
            feed_forward_proj=self.feed_forward_proj,
            num_labels=self.num_labels,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_id,
            bos_token_id=self.pad_token_id,
            decoder_start_token_id=self.decoder_start_token_id,
            is_encoder_decoder=not self.encoder_only,
            # The common attention/hidden-state tests count the outputs of a
            # forward without a cache; generate() turns it on itself.
            use_cache=False,
        )

    def _encoder_ids(self):
        # ids 2..vocab-1 (neither pad nor EOS), then one EOS at the end
        ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 2) + 2
        ids[:, -1] = self.eos_token_id
        return ids

    def _decoder_ids(self):
        ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 2) + 2
        ids[:, 0] = self.decoder_start_token_id
        return ids

    def prepare_config_and_inputs(self):
        """config and a dict of every tensor the checks use (labels included)."""
        t = {
            "input_ids": self._encoder_ids(),
            "attention_mask": random_attention_mask([self.batch_size, self.seq_length]),
            "decoder_input_ids": self._decoder_ids(),
            "decoder_attention_mask": random_attention_mask([self.batch_size, self.seq_length]),
        }
        if self.use_labels:
            t["lm_labels"] = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
            t["sequence_labels"] = ids_tensor([self.batch_size], self.num_labels)
            t["token_labels"] = ids_tensor([self.batch_size, self.seq_length], self.num_labels)
            t["start_positions"] = ids_tensor([self.batch_size], self.seq_length)
            t["end_positions"] = ids_tensor([self.batch_size], self.seq_length)
        return self.get_config(), t

    def prepare_config_and_inputs_for_common(self):
        config, t = self.prepare_config_and_inputs()
        keys = ["input_ids", "attention_mask"]
        if not self.encoder_only:
            keys += ["decoder_input_ids", "decoder_attention_mask"]
        return config, {k: t[k] for k in keys}


class T5ModelTest(Seq2SeqCpuChecks, ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    base_model_class = T5Model
    conditional_generation_class = T5ForConditionalGeneration
    sequence_classification_class = T5ForSequenceClassification
    question_answering_class = T5ForQuestionAnswering
    no_dropout = {"dropout_rate": 0.0}
    all_model_classes = (
        T5Model,
        T5ForConditionalGeneration,
        T5ForQuestionAnswering,
        # last: the common tests loop over the classes, and a failure in
        # this head (it alone reads the EOS positions) ends the loop
        T5ForSequenceClassification,
    )
    is_encoder_decoder = True
    test_pruning = False
    test_resize_embeddings = True

    def setUp(self):
        self.model_tester = T5ModelTester(self)
        self.config_tester = ConfigTester(self, config_class=T5Config, d_model=37)

    def test_config(self):
        self.config_tester.run_common_tests()

    # --- common tests that do not apply to every T5 head -----------------------

    def test_model_base_model_prefix(self):
        # T5ForConditionalGeneration holds its encoder and decoder itself, not
        # a T5Model under `base_model_prefix` ("transformer"), so its base
        # model is the model: an architectural choice of T5, not a bug.
        self.skipTest("T5ForConditionalGeneration has no separate base model")

    def test_gated_gelu_matches_cpu(self):
        """The T5 v1.1 feed-forward (gated-gelu) on the device against the CPU."""
        _, inputs = self._tensors("input_ids", "attention_mask", "decoder_input_ids")
        config = T5ModelTester(self, feed_forward_proj="gated-gelu").get_config(dropout_rate=0.0)
        self.assertTrue(config.is_gated_act)
        cpu, dev = _pair(T5ForConditionalGeneration, config)
        with torch.no_grad():
            got = dev(**_on(inputs, torch_device)).logits
            want = cpu(**_on(inputs, "cpu")).logits
        torch.testing.assert_close(got.cpu(), want, atol=ATOL, rtol=RTOL)


class T5EncoderOnlyModelTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (T5EncoderModel, T5ForTokenClassification)
    is_encoder_decoder = False
    test_pruning = False

    def setUp(self):
        self.model_tester = T5ModelTester(self, encoder_only=True)
        self.config_tester = ConfigTester(self, config_class=T5Config, d_model=37)

    def test_config(self):
        self.config_tester.run_common_tests()

    # T5EncoderModel is a bare encoder without a loss; the training tests skip
    # the base models they find in MODEL_MAPPING, which names T5Model only.
    def _heads_only(self, test):
        with _only(self, T5ForTokenClassification):
            test()

    def test_training(self):
        self._heads_only(super().test_training)

    def test_training_gradient_checkpointing(self):
        self._heads_only(super().test_training_gradient_checkpointing)

    def test_training_gradient_checkpointing_use_reentrant_false(self):
        self._heads_only(super().test_training_gradient_checkpointing_use_reentrant_false)

    def test_training_gradient_checkpointing_use_reentrant_true(self):
        self._heads_only(super().test_training_gradient_checkpointing_use_reentrant_true)

    # --- ours ----------------------------------------------------------------

    def test_encoder_matches_cpu(self):
        t = self.model_tester
        _, tensors = t.prepare_config_and_inputs()
        config = t.get_config(dropout_rate=0.0)
        inputs = {k: tensors[k] for k in ("input_ids", "attention_mask")}
        cpu, dev = _pair(T5EncoderModel, config)
        with torch.no_grad():
            got = dev(**_on(inputs, torch_device)).last_hidden_state
            want = cpu(**_on(inputs, "cpu")).last_hidden_state
        self.assertEqual(got.shape, (t.batch_size, t.seq_length, t.hidden_size))
        keep = inputs["attention_mask"].cpu().bool()
        torch.testing.assert_close(got.cpu()[keep], want[keep], atol=ATOL, rtol=RTOL)

    def test_token_classification_loss_and_grads_match_cpu(self):
        t = self.model_tester
        _, tensors = t.prepare_config_and_inputs()
        config = t.get_config(dropout_rate=0.0)
        inputs = {"input_ids": tensors["input_ids"], "attention_mask": tensors["attention_mask"],
                  "labels": tensors["token_labels"]}
        assert_training_matches(self, T5ForTokenClassification, config, inputs,
                                (t.batch_size, t.seq_length, t.num_labels))
