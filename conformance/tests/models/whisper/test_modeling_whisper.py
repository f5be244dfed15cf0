"""Whisper on the test device: transformers' common model tests, our
generation checks, and checks of our own that compare the device with the CPU.

Two test classes: the encoder-decoder models (WhisperModel,
WhisperForConditionalGeneration), and WhisperForAudioClassification, which
runs the audio encoder alone.

The tiny config keeps Whisper's shapes: input_features are
[batch, num_mel_bins, 2 * max_source_positions] (the second convolution has
stride 2, so the encoder sees max_source_positions frames). Its special
token ids lie inside the tiny vocabulary, and it suppresses no tokens (the
default suppress lists name ids of the real 51865-token vocabulary), so
Whisper's own generate() runs with its defaults: no language or task tokens
(the config is not multilingual), no timestamps, the decoder starting from
decoder_start_token_id alone."""

import unittest

import torch

from transformers import (
    WhisperConfig,
    WhisperForAudioClassification,
    WhisperForConditionalGeneration,
    WhisperModel,
)
from transformers.testing_utils import torch_device

from ...cpu_reference import ATOL, RTOL, assert_training_matches, on as _on, pair as _pair
from ...generation.test_utils import GenerationTesterMixin
from ...seq2seq_cpu_checks import EncoderDecoderCpuChecks
from ...test_configuration_common import ConfigTester
from ...test_modeling_common import ModelTesterMixin, floats_tensor, ids_tensor, random_attention_mask


class WhisperModelTester:
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
        intermediate_size=32,
        hidden_act="gelu",
        dropout=0.1,
        attention_dropout=0.1,
        num_mel_bins=20,
        max_source_positions=30,
        max_target_positions=40,
        classifier_proj_size=8,
        num_labels=3,
        pad_token_id=0,
        bos_token_id=98,
        eos_token_id=98,
        decoder_start_token_id=85,
        encoder_only=False,
    ):
        self.parent = parent
        self.batch_size = batch_size
        # The decoder's length: labels and decoder inputs. The encoder's
        # length is the number of audio frames after the convolutions.
        self.seq_length = seq_length
        self.decoder_seq_length = seq_length
        self.decoder_key_length = seq_length
        self.encoder_seq_length = max_source_positions
        self.key_length = max_source_positions
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
        self.num_mel_bins = num_mel_bins
        self.max_source_positions = max_source_positions
        self.num_frames = 2 * max_source_positions
        self.max_target_positions = max_target_positions
        self.classifier_proj_size = classifier_proj_size
        self.num_labels = num_labels
        self.type_sequence_label_size = num_labels
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.decoder_start_token_id = decoder_start_token_id
        self.encoder_only = encoder_only

    def get_config(self, dropout=None):
        p = self.dropout if dropout is None else dropout
        q = self.attention_dropout if dropout is None else dropout
        return WhisperConfig(
            vocab_size=self.vocab_size,
            num_mel_bins=self.num_mel_bins,
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
            max_source_positions=self.max_source_positions,
            max_target_positions=self.max_target_positions,
            classifier_proj_size=self.classifier_proj_size,
            num_labels=self.num_labels,
            pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            decoder_start_token_id=self.decoder_start_token_id,
            suppress_tokens=None,
            begin_suppress_tokens=None,
            is_encoder_decoder=not self.encoder_only,
            # The common attention/hidden-state tests count the outputs of a
            # forward without a cache; generate() turns it on itself.
            use_cache=False,
        )

    def prepare_config_and_inputs(self):
        """config and a dict of every tensor the checks use (labels included)."""
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 3) + 1  # 1..96
        decoder_input_ids[:, 0] = self.decoder_start_token_id
        t = {
            "input_features": floats_tensor([self.batch_size, self.num_mel_bins, self.num_frames]),
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": random_attention_mask([self.batch_size, self.seq_length]),
        }
        if self.use_labels:
            t["lm_labels"] = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
            t["sequence_labels"] = ids_tensor([self.batch_size], self.num_labels)
        return self.get_config(), t

    def prepare_config_and_inputs_for_common(self):
        config, t = self.prepare_config_and_inputs()
        keys = ["input_features"]
        if not self.encoder_only:
            keys += ["decoder_input_ids", "decoder_attention_mask"]
        return config, {k: t[k] for k in keys}


class WhisperModelTest(EncoderDecoderCpuChecks, ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (WhisperModel, WhisperForConditionalGeneration)
    # The cached decoding and the LM head's training step (EncoderDecoderCpuChecks),
    # with a spectrogram for the encoder.
    base_model_class = WhisperModel
    conditional_generation_class = WhisperForConditionalGeneration
    no_dropout = {"dropout": 0.0}
    encoder_inputs = ("input_features",)
    is_encoder_decoder = True
    test_pruning = False
    # The common resize test writes new token ids into inputs["input_ids"];
    # Whisper's main input is input_features (the decoder's token embeddings
    # are resized by the same code as BART's, which runs it).
    test_resize_embeddings = False

    def setUp(self):
        self.model_tester = WhisperModelTester(self)
        self.config_tester = ConfigTester(self, config_class=WhisperConfig, d_model=37)

    def test_config(self):
        self.config_tester.run_common_tests()

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs = super()._prepare_for_class(inputs_dict, model_class, return_labels=return_labels)
        # The common helper builds language-model labels for the text heads it
        # knows; WhisperForConditionalGeneration (speech-to-text) is not one.
        if return_labels and model_class is WhisperForConditionalGeneration:
            t = self.model_tester
            inputs["labels"] = torch.zeros((t.batch_size, t.seq_length), dtype=torch.long, device=torch_device)
        return inputs

    # --- ours: the device against the CPU ------------------------------------

    def test_model_matches_cpu(self):
        """WhisperModel: the encoder's output and the decoder's, where attended."""
        t = self.model_tester
        config, inputs = self._tensors("input_features", "decoder_input_ids", "decoder_attention_mask")
        cpu, dev = _pair(WhisperModel, config)
        with torch.no_grad():
            got = dev(**_on(inputs, torch_device))
            want = cpu(**_on(inputs, "cpu"))
        self.assertEqual(got.last_hidden_state.device.type, torch.device(torch_device).type)
        self.assertEqual(got.encoder_last_hidden_state.shape,
                         (t.batch_size, t.max_source_positions, t.hidden_size))
        self.assertEqual(got.last_hidden_state.shape, (t.batch_size, t.seq_length, t.hidden_size))
        torch.testing.assert_close(got.encoder_last_hidden_state.cpu(), want.encoder_last_hidden_state,
                                   atol=ATOL, rtol=RTOL)
        keep = inputs["decoder_attention_mask"].cpu().bool()
        torch.testing.assert_close(got.last_hidden_state.cpu()[keep], want.last_hidden_state[keep],
                                   atol=ATOL, rtol=RTOL)


class WhisperEncoderOnlyModelTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (WhisperForAudioClassification,)
    is_encoder_decoder = False
    test_pruning = False
    # No token embeddings: the input is a spectrogram.
    test_resize_embeddings = False

    def setUp(self):
        self.model_tester = WhisperModelTester(self, encoder_only=True)
        self.config_tester = ConfigTester(self, config_class=WhisperConfig, d_model=37)

    def test_config(self):
        self.config_tester.run_common_tests()

    @unittest.skip(
        "WhisperForAudioClassification has no token embeddings: its input embedding is the encoder's first "
        "convolution over the spectrogram, not an nn.Embedding"
    )
    def test_model_get_set_embeddings(self):
        pass

    # --- ours: the device against the CPU ------------------------------------

    def _check_classifier(self, config):
        t = self.model_tester
        _, tensors = t.prepare_config_and_inputs()
        inputs = {"input_features": tensors["input_features"], "labels": tensors["sequence_labels"]}
        assert_training_matches(self, WhisperForAudioClassification, config, inputs, (t.batch_size, t.num_labels))

    def test_audio_classification_loss_and_grads_match_cpu(self):
        self._check_classifier(self.model_tester.get_config(dropout=0.0))

    def test_audio_classification_weighted_layer_sum_matches_cpu(self):
        """The head that mixes every encoder layer's output with softmax weights."""
        config = self.model_tester.get_config(dropout=0.0)
        config.use_weighted_layer_sum = True
        self._check_classifier(config)
